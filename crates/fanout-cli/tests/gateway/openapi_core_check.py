"""Each recorded exchange of an example's cases checked against the example's exported OpenAPI
document with openapi-core (tests/gateway/openapi.rs, tier 2).

argv: DOCUMENT.json EXCHANGES.json. An exchange is {case, method, path (with its query), headers,
body (text or null), status, answer_headers, answer_body (text)}. For each one:
  - the answer must validate (`validate_response`: its status, content type, headers and body);
  - the request must validate (`validate_request`), unless the gateway refused it with a 4xx
    (a request the document calls invalid must not be answered 2xx, 3xx or 5xx).
Prints one line per exchange and a last line `N checked, M failed`; exits 1 when any failed.
"""

import json
import sys
from urllib.parse import parse_qsl, unquote, urlsplit

from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict


class Request:
    """openapi_core.protocols.Request over a recorded request."""

    def __init__(self, ex, server):
        # The gateway ran on a port of its own; the request is read as if sent to the
        # document's first server (the config's listener), with that server's base path.
        url = urlsplit(ex["path"])
        base = urlsplit(server)
        self.host_url = f"{base.scheme}://{base.netloc}"
        self.path = base.path.rstrip("/") + unquote(url.path)
        self.method = ex["method"].lower()
        headers = Headers(list(ex["headers"].items()))
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(parse_qsl(url.query, keep_blank_values=True)),
            header=headers,
            cookie=ImmutableMultiDict(),
        )
        body = ex["body"]
        self.body = None if body is None else body.encode()
        self.content_type = headers.get("content-type", "")


class Response:
    """openapi_core.protocols.Response over a recorded answer."""

    def __init__(self, ex):
        self.status_code = ex["status"]
        self.headers = Headers(list(ex["answer_headers"].items()))
        self.content_type = self.headers.get("content-type", "")
        self.data = ex["answer_body"].encode()


def first_line(e):
    text = f"{type(e).__name__}: {e}"
    cause = getattr(e, "__cause__", None)
    if cause is not None:
        text += f" ({type(cause).__name__}: {cause})"
    for sub in getattr(cause, "schema_errors", None) or getattr(e, "schema_errors", None) or []:
        text += f" [{'/'.join(str(p) for p in sub.absolute_path)}: {sub.message}]"
    return text.replace("\n", " ")[:600]


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    server = (doc.get("servers") or [{"url": "http://127.0.0.1"}])[0]["url"]
    # GraphQL over HTTP's media type is JSON (its `+json` suffix); openapi-core knows only
    # `application/json` by name.
    config = Config(extra_media_type_deserializers={
        "application/graphql-response+json": lambda b: json.loads(b),
    })
    spec = OpenAPI.from_dict(doc, config=config)
    with open(sys.argv[2]) as f:
        exchanges = json.load(f)
    failed = 0
    for ex in exchanges:
        req, resp = Request(ex, server), Response(ex)
        problems = []
        try:
            spec.validate_response(req, resp)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            problems.append(f"answer {ex['status']}: {first_line(e)}")
        try:
            spec.validate_request(req)
            request_ok = "valid"
        except Exception as e:  # noqa: BLE001
            request_ok = f"invalid ({first_line(e)})"
            if not 400 <= ex["status"] < 500:
                problems.append(
                    f"the request is {request_ok} by the document, yet answered {ex['status']}"
                )
        label = f"{ex['case']}: {ex['method']} {ex['path']} -> {ex['status']}"
        if problems:
            failed += 1
            print(f"FAIL {label}: " + "; ".join(problems))
        else:
            print(f"ok   {label} (request {request_ok.split(' ')[0]})")
    print(f"{len(exchanges)} checked, {failed} failed")
    sys.exit(1 if failed else 0)


main()
