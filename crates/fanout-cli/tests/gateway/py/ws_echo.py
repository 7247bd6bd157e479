"""A WebSocket echo server on Python `websockets` (the independent backend of
tests/gateway/ws_python.rs and scripts/ws-idle-memory).

usage: python ws_echo.py [MAX_SIZE]

Listens on 127.0.0.1 (a free port), prints {"port": N} on a line, then echoes every message as it
came (text as text, binary as binary) and, as each connection ends, prints
{"closed": CODE, "reason": REASON} with the close frame it received (CODE null without one).
No pings of its own (an idle connection stays silent); messages up to MAX_SIZE bytes (default
4 MiB). Runs until killed.
"""

import asyncio
import json
import sys

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed


def say(obj):
    print(json.dumps(obj), flush=True)


async def echo(ws):
    try:
        async for message in ws:
            await ws.send(message)
    except ConnectionClosed:
        pass
    rcvd = ws.protocol.close_rcvd
    say({"closed": rcvd.code if rcvd else None, "reason": rcvd.reason if rcvd else None})


async def main():
    max_size = int(sys.argv[1]) if len(sys.argv) > 1 else 4 << 20
    async with serve(
        echo,
        "127.0.0.1",
        0,
        ping_interval=None,
        max_size=max_size,
        close_timeout=5,
        backlog=4096,
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        say({"port": port})
        await server.serve_forever()


asyncio.run(main())
