"""A WebSocket client on Python `websockets` (the independent client of
tests/gateway/ws_python.rs and scripts/ws-idle-memory). Every wait is bounded; each mode prints
its result as one JSON line (and exits 1 on a wrong echo).

usage:
  python ws_client.py echo URI COUNT LIMIT
      COUNT messages on one WebSocket, text (some characters multi-byte) and binary, of varied
      sizes: empty, small, up to exactly LIMIT bytes, as one frame or fragmented; each echo
      checked exact and in order (sent pipelined, at most 64 unanswered).
  python ws_client.py over URI frame|message SIZE FRAGMENT
      one message of SIZE bytes, as one frame or in FRAGMENT-byte frames; then the close the
      peer sends: {"close": CODE, "reason": REASON}.
  python ws_client.py hold URI
      one WebSocket, one message echoed, then {"ready": true}; then waits (60 s at most) for the
      peer's close: {"close": CODE, "reason": REASON}.
  python ws_client.py idle URI N CONCURRENCY [WARM]
      WARM WebSockets opened first, then {"warm": WARM} and a wait for a line on stdin (a
      measurement's baseline); then N more (CONCURRENCY handshakes at once), one message echoed
      on each, then {"open": WARM+N}; idle until a line on stdin, then a message on each checked
      again: {"echoed": K, "of": WARM+N}; then all closed: {"closed": WARM+N}.
"""

import asyncio
import json
import random
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

LIMIT = 60  # seconds: any one wait


def say(obj):
    print(json.dumps(obj), flush=True)


def opener(uri, max_size=4 << 20):
    return connect(
        uri,
        ping_interval=None,
        open_timeout=LIMIT,
        close_timeout=10,
        max_size=max_size,
        proxy=None,
    )


def text_of(rng, n):
    """A str of exactly n UTF-8 bytes, some of its characters multi-byte."""
    parts, left = [], n
    while left > 0:
        c = rng.choice("aé€😀") if left >= 4 else "a"
        b = len(c.encode())
        if b <= left:
            parts.append(c)
            left -= b
    return "".join(parts)


def messages(count, limit):
    """(payload, fragment size or None) in a fixed order: every size class, both kinds."""
    rng = random.Random(71)
    out = []
    for i in range(count):
        kind = i % 2  # 0 text, 1 binary
        r = i % 100
        if r in (0, 1):
            size, frag = 0, None
        elif r in (2, 3):
            size, frag = limit, None  # exactly the limit, one frame
        elif r in (4, 5):
            size, frag = limit, rng.randint(1024, limit // 2)  # exactly the limit, fragmented
        elif r < 12:
            size, frag = rng.randint(limit - 64, limit), None  # just under it
        elif r < 16:
            size = rng.randint(limit // 2, limit)
            frag = rng.randint(max(1, size // 64), size)
        else:
            size, frag = rng.randint(1, 512), None
        payload = text_of(rng, size) if kind == 0 else rng.randbytes(size)
        out.append((payload, frag))
    return out


def fragments(payload, frag):
    if frag is None:
        return payload
    if isinstance(payload, str):
        # split on characters: each fragment at most `frag` bytes
        pieces, cur, cur_b = [], [], 0
        for c in payload:
            b = len(c.encode())
            if cur_b + b > frag:
                pieces.append("".join(cur))
                cur, cur_b = [], 0
            cur.append(c)
            cur_b += b
        pieces.append("".join(cur))
        return pieces
    return [payload[i : i + frag] for i in range(0, len(payload), frag)]


async def echo(uri, count, limit):
    msgs = messages(count, limit)
    window = asyncio.Semaphore(64)
    stats = {"sent": 0, "exact": 0, "text": 0, "binary": 0, "empty": 0, "fragmented": 0,
             "largest_frame": 0, "largest_message": 0}
    async with opener(uri, limit) as ws:

        async def send_all():
            for payload, frag in msgs:
                await window.acquire()
                await ws.send(fragments(payload, frag))
                stats["sent"] += 1

        sender = asyncio.create_task(send_all())
        for i, (payload, frag) in enumerate(msgs):
            async with asyncio.timeout(LIMIT):
                got = await ws.recv()
            window.release()
            if type(got) is not type(payload) or got != payload:
                sender.cancel()
                say({"mismatch": i, "sent_len": len(payload), "got_len": len(got),
                     "sent_type": type(payload).__name__, "got_type": type(got).__name__})
                sys.exit(1)
            stats["exact"] += 1
            stats["text" if isinstance(payload, str) else "binary"] += 1
            n = len(payload.encode()) if isinstance(payload, str) else len(payload)
            stats["empty"] += n == 0
            if frag is None:
                stats["largest_frame"] = max(stats["largest_frame"], n)
            else:
                stats["fragmented"] += 1
            stats["largest_message"] = max(stats["largest_message"], n)
        await sender
    say(stats)


async def closed_by_peer(ws):
    """Reads until the peer's close; its (code, reason)."""
    try:
        async with asyncio.timeout(LIMIT):
            while True:
                await ws.recv()
    except ConnectionClosed as e:
        return (e.rcvd.code, e.rcvd.reason) if e.rcvd else (None, None)


async def over(uri, how, size, frag):
    async with opener(uri) as ws:
        payload = random.Random(9).randbytes(size)
        try:
            async with asyncio.timeout(LIMIT):
                if how == "frame":
                    await ws.send(payload)
                else:
                    await ws.send(fragments(payload, frag))
        except ConnectionClosed:
            pass
        code, reason = await closed_by_peer(ws)
    say({"close": code, "reason": reason})


async def hold(uri):
    async with opener(uri) as ws:
        async with asyncio.timeout(LIMIT):
            await ws.send("hi")
            assert await ws.recv() == "hi"
        say({"ready": True})
        code, reason = await closed_by_peer(ws)
    say({"close": code, "reason": reason})


async def idle(uri, n, concurrency, warm):
    gate = asyncio.Semaphore(concurrency)
    socks = []

    async def one(i):
        async with gate:
            ws = await opener(uri)
            async with asyncio.timeout(LIMIT):
                await ws.send(f"open {i}")
                got = await ws.recv()
            if got != f"open {i}":
                raise RuntimeError(f"socket {i}: echo {got!r}")
            socks.append((i, ws))

    async def line():
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    if warm:
        await asyncio.gather(*(one(i) for i in range(warm)))
        say({"warm": len(socks)})
        await line()
    await asyncio.gather(*(one(i) for i in range(warm, warm + n)))
    say({"open": len(socks)})
    await line()

    async def check(i, ws):
        async with gate:
            async with asyncio.timeout(LIMIT):
                await ws.send(b"still %d" % i)
                return await ws.recv() == b"still %d" % i

    ok = await asyncio.gather(*(check(i, ws) for i, ws in socks), return_exceptions=True)
    say({"echoed": sum(1 for r in ok if r is True), "of": len(socks)})

    async def close(ws):
        async with gate:
            await ws.close()

    await asyncio.gather(*(close(ws) for _, ws in socks), return_exceptions=True)
    say({"closed": len(socks)})


def main():
    mode, uri, *rest = sys.argv[1:]
    if mode == "echo":
        asyncio.run(echo(uri, int(rest[0]), int(rest[1])))
    elif mode == "over":
        asyncio.run(over(uri, rest[0], int(rest[1]), int(rest[2])))
    elif mode == "hold":
        asyncio.run(hold(uri))
    elif mode == "idle":
        asyncio.run(idle(uri, int(rest[0]), int(rest[1]), int(rest[2]) if len(rest) > 2 else 0))
    else:
        sys.exit(f"unknown mode {mode}")


main()
