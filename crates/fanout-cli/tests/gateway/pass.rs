//! Pass-through routes (docs/config.md#pass-through-routes): a request forwarded to one backend
//! and its answer streamed back as it is — the exact bytes both ways whatever the content type,
//! large bodies with the gateway's memory bounded, hop-by-hop fields removed and forwarding
//! fields added, paths rewritten, `HEAD`, ranges and trailers carried, `Expect: 100-continue`
//! decided by the edge stages before the body is asked for, the backend's stack (retries only
//! for an untouched body), both timeouts, the body limit, errors before and after the answer's
//! head, compression that never touches a streamed answer, and the route's counters.
//!
//! The backend is `fanout_testkit::raw::RawBackend` (bodies hashed as they arrive, generated as
//! they go); the clients are hyper's, with every wait bounded.

use crate::support::{ServeProcess, gateway_with};
use bytes::Bytes;
use fanout_testkit::raw::{RawBackend, pattern_bytes, pattern_sha256, sha256_hex};
use fanout_testkit::*;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Every exchange of a test ends within this (a hung exchange fails the test, it measures
/// nothing).
const LIMIT: Duration = Duration::from_secs(120);

/// A stub the gateway harness wants (the raw backend is the one the routes use).
const STUBS: &str = r#"
services:
  unused:
    listen: "127.0.0.1:0"
    routes:
      - path: /
        body: '{}'
"#;

/// What a client saw of one exchange: the head, the body's hash and length, its trailers, and
/// whether it ended cleanly (false: it broke off).
#[derive(Debug)]
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
    sha256: String,
    bytes: u64,
    trailers: Option<HeaderMap>,
    complete: bool,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body))
        })
    }
}

fn http_client(h2: bool) -> Client<HttpConnector, Body> {
    let mut b = Client::builder(TokioExecutor::new());
    if h2 {
        b.http2_only(true);
    }
    b.build(HttpConnector::new())
}

fn full(b: impl Into<Bytes>) -> Body {
    UnsyncBoxBody::new(Full::new(b.into()).map_err(|e| match e {}))
}

/// `n` bytes of the pattern, a chunk of 64 KiB at a time (never held whole), with trailers
/// after them when given.
fn generated(n: u64, trailers: Option<HeaderMap>) -> Body {
    const CHUNK: u64 = 64 << 10;
    let data = futures_util::stream::unfold(0u64, move |at| async move {
        if at >= n {
            return None;
        }
        let end = (at + CHUNK).min(n);
        Some((
            Ok::<_, BoxError>(Frame::data(Bytes::from(pattern_bytes(at, end)))),
            end,
        ))
    });
    use futures_util::StreamExt;
    let tail = futures_util::stream::iter(trailers.map(|t| Ok(Frame::trailers(t))));
    UnsyncBoxBody::new(StreamBody::new(data.chain(tail)))
}

/// One exchange: send `req`, read the answer to its end (hashing it; keeping at most 1 MiB of
/// it), all within [`LIMIT`].
async fn exchange(c: &Client<HttpConnector, Body>, req: Request<Body>) -> Got {
    tokio::time::timeout(LIMIT, async {
        let resp = c.request(req).await.expect("an answer");
        let (parts, mut body) = resp.into_parts();
        let mut kept = Vec::new();
        let mut h = Sha256::new();
        let mut bytes = 0u64;
        let mut trailers = None;
        let mut complete = true;
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => match f.into_data() {
                    Ok(d) => {
                        h.update(&d);
                        bytes += d.len() as u64;
                        if kept.len() < (1 << 20) {
                            kept.extend_from_slice(&d);
                        }
                    }
                    Err(f) => trailers = f.into_trailers().ok(),
                },
                Err(_) => {
                    complete = false;
                    break;
                }
            }
        }
        let sha256: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Got {
            status: parts.status,
            headers: parts.headers,
            body: kept,
            sha256,
            bytes,
            trailers,
            complete,
        }
    })
    .await
    .expect("the exchange ends within its limit")
}

fn request(method: Method, url: &str, headers: &[(&str, &str)], body: Body) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body).unwrap()
}

fn yaml(raw: &RawBackend, extra: &str) -> String {
    format!(
        r#"
server:
  trusted_proxies: ["10.0.0.0/8"]
backends:
  raw: {{ url: "{url}" }}
  raw2: {{ url: "{url}", protocol: http2 }}
routes:
  - path: /up/{{*rest}}
    method: POST
    pass: {{ backend: raw, path: "/{{rest}}", max_body_bytes: 100000000 }}
  - path: /up/{{*rest}}
    method: PUT
    pass: {{ backend: raw, path: "/{{rest}}", max_body_bytes: 1000 }}
  - path: /up/{{*rest}}
    pass: {{ backend: raw, path: "/{{rest}}" }}
  - path: /up/{{*rest}}
    method: HEAD
    pass: {{ backend: raw, path: "/{{rest}}" }}
  - path: /h2/{{*rest}}
    pass: {{ backend: raw2, path: "/{{rest}}" }}
  - path: /files/{{id}}/{{*rest}}
    pass: {{ backend: raw, path: "/v1/files/{{id}}/{{rest}}" }}
  - path: /as-is/{{*rest}}
    pass: {{ backend: raw }}
{extra}
"#,
        url = raw.url()
    )
}

async fn start(raw: &RawBackend, extra: &str) -> (fanout::RunningGateway, fanout_stub::StubServer) {
    let s = stubs(STUBS).await;
    let gw = gateway_with(&yaml(raw, extra), &s, &[]).await;
    (gw, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_pass_byte_for_byte_both_ways_whatever_their_type() {
    let raw = RawBackend::start().await;
    let (gw, _s) = start(&raw, "").await;
    let c = http_client(false);
    let at = |p: &str| format!("http://{}{p}", gw.addr);

    // A binary upload (bytes that are not UTF-8, `application/octet-stream`), with its length.
    let n = 300_001;
    let r = exchange(
        &c,
        request(
            Method::POST,
            &at("/up/upload"),
            &[
                ("content-type", "application/octet-stream"),
                ("content-length", &n.to_string()),
            ],
            generated(n, None),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["sha256"], pattern_sha256(n));
    assert_eq!(r.json()["bytes"], n);
    let seen = raw.seen();
    let last = seen.last().unwrap();
    assert_eq!(last.uri, "/upload", "the prefix is stripped");
    assert_eq!(last.headers["content-length"], n.to_string().as_str());
    assert_eq!(last.headers["content-type"], "application/octet-stream");

    // Without a length (chunked), and a form body signed over its exact bytes (invalid UTF-8).
    let form: &'static [u8] = b"a=1&b=%FF\xff\xfe&c=\r\n";
    let r = exchange(
        &c,
        request(
            Method::POST,
            &at("/up/echo"),
            &[("content-type", "application/x-www-form-urlencoded")],
            UnsyncBoxBody::new(StreamBody::new(futures_util::stream::iter([
                Ok::<_, BoxError>(Frame::data(Bytes::from_static(&form[..5]))),
                Ok(Frame::data(Bytes::from_static(&form[5..]))),
            ]))),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, form, "echoed byte for byte");
    assert_eq!(
        r.header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(raw.seen().last().unwrap().sha256, sha256_hex(form));

    // HTML, echoed.
    let html = "<!doctype html><p>caf\u{e9} &amp; cr\u{e8}me</p>\n".repeat(100);
    let r = exchange(
        &c,
        request(
            Method::POST,
            &at("/up/echo"),
            &[("content-type", "text/html; charset=utf-8")],
            full(html.clone()),
        ),
    )
    .await;
    assert_eq!(r.body, html.as_bytes());
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));

    // Downloads, with a length and without; over HTTP/1.1 and h2 both ways.
    for (h2, path) in [
        (false, "/up/download/1000003"),
        (false, "/up/download/1000003?chunked"),
        (true, "/up/download/1000003"),
        (false, "/h2/download/1000003?chunked"),
    ] {
        let r = exchange(
            &http_client(h2),
            request(Method::GET, &at(path), &[], full(Bytes::new())),
        )
        .await;
        assert_eq!(r.status, 200, "{path}");
        assert!(r.complete, "{path}");
        assert_eq!(r.bytes, 1_000_003, "{path}");
        assert_eq!(r.sha256, pattern_sha256(1_000_003), "{path}");
        assert_eq!(
            r.header("content-length").is_some(),
            !path.contains("chunked"),
            "{path}: the length is announced exactly when the backend did"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_rewritten_or_kept_and_the_query_goes_as_it_came() {
    let raw = RawBackend::start().await;
    let (gw, _s) = start(&raw, "").await;
    let c = http_client(false);
    let at = |p: &str| format!("http://{}{p}", gw.addr);
    for (path, sent) in [
        ("/files/42/a/b%20c?x=1&y=%2F&z", "/v1/files/42/a/b%20c?x=1&y=%2F&z"),
        ("/as-is/deep/path?q=%C3%A9", "/as-is/deep/path?q=%C3%A9"),
        ("/up/x", "/x"),
    ] {
        let r = exchange(&c, request(Method::GET, &at(path), &[], full(Bytes::new()))).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(raw.seen().last().unwrap().uri, sent, "{path}");
    }
    // A parameter that would climb out of the prefix is refused.
    let before = raw.seen().len();
    let r = exchange(
        &c,
        request(Method::GET, &at("/files/42/a/%2e%2e/secret"), &[], full(Bytes::new())),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "bad_path");
    assert_eq!(raw.seen().len(), before, "never sent");
}
