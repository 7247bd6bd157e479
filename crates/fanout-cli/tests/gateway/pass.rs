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
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
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

/// `n` bytes of the pattern in frames of `frame` bytes, the sender yielding between them (so
/// each is on the wire before the next is made).
fn trickle(n: u64, frame: u64) -> Body {
    let data = futures_util::stream::unfold(0u64, move |at| async move {
        if at >= n {
            return None;
        }
        tokio::task::yield_now().await;
        let end = (at + frame).min(n);
        Some((
            Ok::<_, BoxError>(Frame::data(Bytes::from(pattern_bytes(at, end)))),
            end,
        ))
    });
    UnsyncBoxBody::new(StreamBody::new(data))
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

/// The backend's HTTP/1 connection goes back to the pool after each answer — one with a
/// `Content-Length` (which the gateway's server stops polling once it has written that many
/// bytes) as well as a chunked one — so requests one after the other reuse it instead of
/// opening a connection each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_with_or_without_a_length_give_the_backends_connection_back() {
    let raw = RawBackend::start().await;
    let (gw, _s) = start(&raw, "").await;
    let c = http_client(false);
    for query in ["", "?chunked"] {
        let before = raw.connections();
        for _ in 0..10 {
            let url = format!("http://{}/up/download/1024{query}", gw.addr);
            let r = exchange(&c, request(Method::GET, &url, &[], full(""))).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.bytes, 1024);
            assert!(r.complete);
        }
        let opened = raw.connections() - before;
        // One per core's pool at most (each core keeps its own pool, and a request may be
        // served on either), not one per request.
        assert!(
            opened <= 2,
            "{query:?}: {opened} backend connections for 10 requests one after the other"
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
        (
            "/files/42/a/b%20c?x=1&y=%2F&z",
            "/v1/files/42/a/b%20c?x=1&y=%2F&z",
        ),
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
        request(
            Method::GET,
            &at("/files/42/a/%2e%2e/secret"),
            &[],
            full(Bytes::new()),
        ),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "bad_path");
    assert_eq!(raw.seen().len(), before, "never sent");
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 exchange written and read by hand on a new connection: `head` (ending in a blank
/// line), then the answer's bytes until the connection closes (the request says
/// `Connection: close` when it wants the end to be that).
async fn by_hand(addr: std::net::SocketAddr, head: &str) -> String {
    tokio::time::timeout(LIMIT, async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .expect("the gateway answers within the limit")
}

/// The header lines of a raw HTTP/1.1 answer, lowercased names.
fn head_lines(raw: &str) -> Vec<(String, String)> {
    raw.split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_fields_are_removed_both_ways_and_forwarding_fields_added() {
    let raw = RawBackend::start().await;
    let (gw, _s) = start(&raw, "").await;
    let answer = by_hand(
        gw.addr,
        "GET /up/hop HTTP/1.1\r\nHost: shop.example\r\nConnection: close, X-Client-Hop\r\n\
         X-Client-Hop: secret\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n\
         TE: trailers, gzip\r\nUpgrade: websocket\r\nX-Forwarded-For: 203.0.113.9\r\n\
         X-Forwarded-Host: spoofed.example\r\nX-Kept: yes\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let got = head_lines(&answer);
    let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        !names.contains(&"x-backend-hop"),
        "named in Connection: {answer}"
    );
    assert!(!names.contains(&"keep-alive"), "{answer}");
    assert!(
        got.contains(&("x-end-to-end".into(), "1".into())),
        "{answer}"
    );
    assert!(
        got.contains(&("via".into(), "1.1 fanout".into())),
        "{answer}"
    );
    assert!(answer.ends_with("hop"), "{answer}");

    let seen = raw.seen();
    let h = &seen.last().unwrap().headers;
    for gone in [
        "connection",
        "x-client-hop",
        "keep-alive",
        "proxy-connection",
        "upgrade",
    ] {
        assert!(!h.contains_key(gone), "{gone} reached the backend: {h:?}");
    }
    assert_eq!(h["te"], "trailers", "TE keeps `trailers` alone");
    assert_eq!(h["x-kept"], "yes");
    // The peer (127.0.0.1) is not a trusted proxy (10.0.0.0/8): its forwarding fields are
    // replaced, not extended.
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], "shop.example");
    assert_eq!(h["via"], "1.1 fanout");
    assert_eq!(
        h["host"],
        raw.addr.to_string().as_str(),
        "the backend's own host"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_forwarding_fields_are_extended_and_claims_never_come_from_the_client() {
    let raw = RawBackend::start().await;
    let s = stubs(STUBS).await;
    let cfg = format!(
        r#"
server:
  trusted_proxies: ["127.0.0.1"]
backends:
  raw: {{ url: "{}" }}
routes:
  - path: /p/{{*rest}}
    pass:
      backend: raw
      path: "/{{rest}}"
      preserve_host: true
      forwarded: {{ forwarded: true }}
      claims: {{ x-user: sub }}
"#,
        raw.url()
    );
    let gw = gateway_with(&cfg, &s, &[]).await;
    let c = http_client(false);
    let r = exchange(
        &c,
        request(
            Method::GET,
            &format!("http://{}/p/x", gw.addr),
            &[
                ("host", "shop.example"),
                ("x-forwarded-for", "203.0.113.9"),
                ("x-forwarded-proto", "https"),
                ("forwarded", "for=203.0.113.9;proto=https"),
                ("x-user", "admin"),
            ],
            full(Bytes::new()),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    let seen = raw.seen();
    let h = &seen.last().unwrap().headers;
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "https", "the trusted proxy's");
    assert_eq!(
        h["forwarded"],
        "for=203.0.113.9;proto=https, for=127.0.0.1;proto=http;host=\"shop.example\""
    );
    assert_eq!(h["host"], "shop.example", "preserve_host");
    assert!(
        !h.contains_key("x-user"),
        "a claim header the client sent is removed (no auth: no claim)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_ranges_and_trailers_are_carried() {
    let raw = RawBackend::start().await;
    let (gw, _s) = start(&raw, "").await;
    let at = |p: &str| format!("http://{}{p}", gw.addr);
    let c = http_client(false);

    let r = exchange(
        &c,
        request(
            Method::HEAD,
            &at("/up/download/5000"),
            &[],
            full(Bytes::new()),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("5000"));
    assert_eq!(r.bytes, 0);
    assert_eq!(raw.seen().last().unwrap().method, Method::HEAD);

    let r = exchange(
        &c,
        request(
            Method::GET,
            &at("/up/range"),
            &[("range", "bytes=10-19")],
            full(Bytes::new()),
        ),
    )
    .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 10-19/1000"));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.body, pattern_bytes(10, 20));

    // Trailers: HTTP/2 both ways, and HTTP/1.1 chunked when the client says `TE: trailers`.
    for (h2, path) in [(true, "/h2/trailers"), (false, "/up/trailers")] {
        let r = exchange(
            &http_client(h2),
            request(
                Method::GET,
                &at(path),
                &[("te", "trailers")],
                full(Bytes::new()),
            ),
        )
        .await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body, b"abc", "{path}");
        let t = r.trailers.unwrap_or_else(|| panic!("{path}: no trailers"));
        assert_eq!(t["x-checksum"], "42", "{path}");
    }
    // A request's trailers reach the backend (declared in `Trailer`, as HTTP/1.1 chunked needs),
    // over HTTP/1.1 and h2 both ways.
    for (h2, path) in [
        (true, "/up/upload"),
        (false, "/up/upload"),
        (true, "/h2/upload"),
    ] {
        let mut t = HeaderMap::new();
        t.insert("x-sum", "7".parse().unwrap());
        let method = if path.starts_with("/h2") {
            Method::GET
        } else {
            Method::POST
        };
        let r = exchange(
            &http_client(h2),
            request(
                method,
                &at(path),
                &[("trailer", "x-sum")],
                generated(1000, Some(t)),
            ),
        )
        .await;
        assert_eq!(r.status, 200, "{path} h2: {h2}");
        let seen = raw.seen();
        let last = seen.last().unwrap();
        assert_eq!(last.sha256, pattern_sha256(1000), "{path} h2: {h2}");
        assert_eq!(
            last.trailers
                .as_ref()
                .and_then(|t| t.get("x-sum"))
                .map(|v| v.to_str().unwrap()),
            Some("7"),
            "{path} h2: {h2}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_is_answered_only_after_the_edge_stages_let_the_request_through() {
    let raw = RawBackend::start().await;
    let extra = r#"
rate_limits:
  once:
    rate: 1/min
    burst: 1
  - path: /denied/{*rest}
    method: POST
    stages: { ip_filter: { allow: [10.0.0.0/8] } }
    pass: { backend: raw, path: "/{rest}" }
  - path: /limited/{*rest}
    method: POST
    rate_limit: [once]
    pass: { backend: raw, path: "/{rest}" }
"#;
    // (`rate_limits` must be top level: split the extra text at the routes.)
    let (top, routes) = extra.split_once("  - path").unwrap();
    let cfg = yaml(&raw, &format!("  - path{routes}")).replacen(
        "routes:",
        &format!("{}\nroutes:", top.trim()),
        1,
    );
    let s = stubs(STUBS).await;
    let gw = gateway_with(&cfg, &s, &[]).await;

    let head = |path: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\
             Connection: close\r\n\r\n"
        )
    };
    // Refused by ip_filter: a final answer, no `100 Continue`, the body never asked for.
    let answer = by_hand(gw.addr, &head("/denied/upload")).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(answer.contains("ip_denied"), "{answer}");
    // A rate limit: the first goes through (with 100 Continue), the second is refused first.
    let through = tokio::time::timeout(LIMIT, async {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(head("/limited/upload").as_bytes())
            .await
            .unwrap();
        let mut first = [0u8; 25];
        s.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
        s.write_all(b"hello").await.unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
        String::from_utf8_lossy(&rest).into_owned()
    })
    .await
    .unwrap();
    assert!(through.starts_with("HTTP/1.1 200"), "{through}");
    assert!(through.contains(&sha256_hex(b"hello")), "{through}");
    let answer = by_hand(gw.addr, &head("/limited/upload")).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert_eq!(
        raw.seen().len(),
        1,
        "only the request let through reached the backend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backends_stack_retries_only_idempotent_requests_whose_body_was_untouched() {
    let raw = RawBackend::start().await;
    let s = stubs(STUBS).await;
    let cfg = format!(
        r#"
backends:
  flaky:
    urls: ["http://127.0.0.1:{dead}", "{live}"]
    balance: {{ strategy: round_robin }}
    outlier: {{ enabled: false }}
    retry: {{ attempts: 2 }}
routes:
  - path: /r/{{*rest}}
    method: POST
    pass: {{ backend: flaky, path: "/{{rest}}" }}
  - path: /r/{{*rest}}
    method: PUT
    pass: {{ backend: flaky, path: "/{{rest}}" }}
  - path: /r/{{*rest}}
    pass: {{ backend: flaky, path: "/{{rest}}" }}
"#,
        dead = dead_port(),
        live = raw.url()
    );
    let gw = gateway_with(&cfg, &s, &[]).await;
    let c = http_client(false);
    let at = |p: &str| format!("http://{}{p}", gw.addr);
    let mut statuses = Vec::new();
    for m in [Method::GET, Method::PUT, Method::POST] {
        for _ in 0..4 {
            let r = exchange(&c, request(m.clone(), &at("/r/upload"), &[], full("body"))).await;
            if r.status != 200 {
                assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
                assert_eq!(r.json()["error"]["code"], "backend_unavailable");
            }
            statuses.push((m.clone(), r.status.as_u16()));
        }
    }
    let failed = |m: Method| {
        statuses
            .iter()
            .filter(|(x, s)| *x == m && *s != 200)
            .count()
    };
    // An unreachable address never got the body: GET and PUT (idempotent) go to the other one.
    assert_eq!(failed(Method::GET), 0, "{statuses:?}");
    assert_eq!(failed(Method::PUT), 0, "{statuses:?}");
    // POST may not be sent twice: every other one (round robin) fails.
    assert_eq!(failed(Method::POST), 2, "{statuses:?}");
    assert_eq!(raw.seen().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_and_the_idle_timeout_end_an_exchange_before_or_after_its_head() {
    let raw = RawBackend::start().await;
    let extra = r#"
  - path: /idle/{*rest}
    pass: { backend: raw, path: "/{rest}", idle_timeout: 300ms, timeout: 1m }
  - path: /whole/{*rest}
    pass: { backend: raw, path: "/{rest}", idle_timeout: 10s, timeout: 1s }
"#;
    let (gw, _s) = start(&raw, extra).await;
    let c = http_client(false);
    let at = |p: &str| format!("http://{}{p}", gw.addr);
    let get = |p: &str| request(Method::GET, &at(p), &[], full(Bytes::new()));
    // No head within the idle time: an error answer.
    let r = exchange(&c, get("/idle/never")).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.json()["error"]["code"], "backend_timeout");
    // A head, then silence: the body is cut, never ended.
    let r = exchange(&c, get("/idle/stall")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"12345");
    assert!(!r.complete, "a cut answer is not a complete one");
    // Bytes keep coming, but the whole exchange has its end.
    let r = exchange(&c, get("/whole/drip")).await;
    assert_eq!(r.status, 200);
    assert!(!r.complete);
    assert!(r.bytes > 0);
    let metrics = get_metrics(&gw).await;
    for line in [
        r#"fanout_pass_cut_total{route="/idle/{*rest}",method="GET",reason="idle_timeout"} 2"#,
        r#"fanout_pass_cut_total{route="/whole/{*rest}",method="GET",reason="timeout"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

async fn get_metrics(gw: &fanout::RunningGateway) -> String {
    let admin = gw.admin_addr.unwrap();
    get(&format!("http://{admin}/metrics")).await.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_routes_limit_is_refused_by_its_length_or_cut_when_it_crosses_it() {
    let raw = RawBackend::start().await;
    let (gw, _s) = start(&raw, "").await;
    let c = http_client(false);
    let url = format!("http://{}/up/upload", gw.addr);
    // PUT's limit is 1000 bytes: a length over it is refused before any byte is read.
    let r = exchange(
        &c,
        request(
            Method::PUT,
            &url,
            &[("content-length", "5000")],
            generated(5000, None),
        ),
    )
    .await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "body_too_large");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("pass.max_body_bytes"),
        "{}",
        r.json()
    );
    assert_eq!(raw.seen().len(), 0, "never sent");
    // Without a length, the stream is cut where it crosses the limit: the backend sees an
    // aborted upload, the client a 413.
    let r = exchange(&c, request(Method::PUT, &url, &[], trickle(5000, 250))).await;
    assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "body_too_large");
    wait_until("the backend saw the upload end", || raw.seen().len() == 1).await;
    let seen = raw.seen();
    assert!(!seen[0].complete, "the backend saw an aborted upload");
    assert!(
        seen[0].bytes <= 1000,
        "no byte past the limit: {}",
        seen[0].bytes
    );
    // Within the limit, the same route passes it.
    let r = exchange(&c, request(Method::PUT, &url, &[], generated(1000, None))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["sha256"], pattern_sha256(1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_is_a_502_and_a_broken_answer_an_aborted_body() {
    let raw = RawBackend::start().await;
    let extra = r#"
  - path: /dead/{*rest}
    pass: { backend: dead }
"#;
    let cfg = yaml(&raw, extra).replacen(
        "backends:\n",
        &format!(
            "backends:\n  dead: {{ url: \"http://127.0.0.1:{}\" }}\n",
            dead_port()
        ),
        1,
    );
    let s = stubs(STUBS).await;
    let gw = gateway_with(&cfg, &s, &[]).await;
    let c = http_client(false);
    let r = exchange(
        &c,
        request(
            Method::GET,
            &format!("http://{}/dead/x", gw.addr),
            &[("x-request-id", "pass-dead-1")],
            full(Bytes::new()),
        ),
    )
    .await;
    assert_eq!(r.status, 502);
    let e = &r.json()["error"];
    assert_eq!(e["code"], "backend_unavailable");
    assert_eq!(e["request_id"], "pass-dead-1");
    assert!(
        !r.json().to_string().contains("127.0.0.1"),
        "no address shown"
    );
    // After the head: the client sees the body break off, not a complete answer.
    for h2 in [false, true] {
        let r = exchange(
            &http_client(h2),
            request(
                Method::GET,
                &format!("http://{}/up/abort", gw.addr),
                &[],
                full(Bytes::new()),
            ),
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(!r.complete, "h2: {h2}");
        assert!(r.bytes <= 10, "h2: {h2}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_never_touches_a_streamed_answer_and_the_route_counts_its_bytes() {
    let raw = RawBackend::start().await;
    let s = stubs(STUBS).await;
    let cfg = yaml(&raw, "").replacen(
        "routes:",
        "compression: { response: { enabled: true, min_bytes: 10 } }\n\
         defaults: { cors: { origins: [https://app.example.com] } }\nroutes:",
        1,
    );
    let gw = gateway_with(&cfg, &s, &[]).await;
    let html = "<p>compressible, compressible, compressible</p>\n".repeat(200);
    let r = exchange(
        &http_client(false),
        request(
            Method::POST,
            &format!("http://{}/up/echo", gw.addr),
            &[
                ("content-type", "text/html"),
                ("accept-encoding", "gzip, br"),
                ("origin", "https://app.example.com"),
                ("x-request-id", "pass-cors-1"),
            ],
            full(html.clone()),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.body, html.as_bytes(), "as the backend sent it");
    // The arrival phase and the request id apply as on any route.
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(r.header("x-request-id"), Some("pass-cors-1"));
    let n = html.len();
    let metrics = get_metrics(&gw).await;
    for line in [
        format!(
            r#"fanout_pass_bytes_total{{route="/up/{{*rest}}",method="POST",direction="in"}} {n}"#
        ),
        format!(
            r#"fanout_pass_bytes_total{{route="/up/{{*rest}}",method="POST",direction="out"}} {n}"#
        ),
        r#"fanout_requests_total{route="/up/{*rest}",method="POST",status_class="2xx"} 1"#
            .to_string(),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mib_each_way_stream_through_with_the_gateways_memory_bounded() {
    const N: u64 = 64 << 20;
    let raw = RawBackend::start().await;
    let cfg = format!(
        r#"
backends:
  raw: {{ url: "{}" }}
routes:
  - path: /big/{{*rest}}
    method: POST
    pass: {{ backend: raw, path: "/{{rest}}", max_body_bytes: 1000000000 }}
  - path: /big/{{*rest}}
    pass: {{ backend: raw, path: "/{{rest}}" }}
"#,
        raw.url()
    );
    let p = ServeProcess::launch("pass-big", &cfg).start().await;
    let at = |path: &str| format!("http://{}{path}", p.addr());
    let c = http_client(false);
    // Warm up both ways (connections, pools, the allocator's first pages).
    let r = exchange(
        &c,
        request(
            Method::POST,
            &at("/big/upload"),
            &[],
            generated(4 << 20, None),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = exchange(
        &c,
        request(
            Method::GET,
            &at("/big/download/4194304"),
            &[],
            full(Bytes::new()),
        ),
    )
    .await;
    assert_eq!(r.sha256, pattern_sha256(4 << 20));
    let before = p.peak_rss_kib();

    let r = exchange(
        &c,
        request(
            Method::POST,
            &at("/big/upload"),
            &[("content-length", &N.to_string())],
            generated(N, None),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["sha256"],
        pattern_sha256(N),
        "the backend got every byte"
    );
    let r = exchange(
        &c,
        request(
            Method::GET,
            &at(&format!("/big/download/{N}")),
            &[],
            full(Bytes::new()),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.complete);
    assert_eq!(r.sha256, pattern_sha256(N), "the client got every byte");

    // The gateway held a few frames at a time, never the body: its peak resident memory grew by
    // less than a quarter of one body (a gateway that buffered either would grow by 64 MiB).
    let after = p.peak_rss_kib();
    let grown = after.saturating_sub(before);
    eprintln!("peak RSS {before} → {after} KiB (+{grown} KiB) for 64 MiB each way");
    assert!(grown < 16 << 10, "peak RSS grew by {grown} KiB");
    let metrics = get(&format!("http://{}/metrics", p.admin_addr()))
        .await
        .text();
    for (d, n) in [("in", N + (4 << 20)), ("out", N + (4 << 20))] {
        let m = if d == "in" { "POST" } else { "GET" };
        let line = format!(
            r#"fanout_pass_bytes_total{{route="/big/{{*rest}}",method="{m}",direction="{d}"}} {n}"#
        );
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_decides_on_the_head_and_verified_claims_become_headers() {
    use fanout_testkit::jwt::{self, EsKey};
    const ISS: &str = "https://idp.example";
    let raw = RawBackend::start().await;
    let key = EsKey::generate("k1");
    let extra = r#"
  - path: /me/{*rest}
    method: POST
    auth: { provider: corp }
    pass: { backend: raw, path: "/{rest}", claims: { x-user: sub, x-issuer: iss } }
"#;
    let cfg = yaml(&raw, extra).replacen(
        "routes:",
        &format!(
            "auth:\n  providers:\n    corp: {{issuer: \"{ISS}\", keys: '{}', algorithms: [ES256]}}\nroutes:",
            jwt::jwks(&[&key])
        ),
        1,
    );
    let s = stubs(STUBS).await;
    let gw = gateway_with(&cfg, &s, &[]).await;
    let c = http_client(false);
    let url = format!("http://{}/me/upload", gw.addr);
    // No token: refused on the head; the body never reaches the backend.
    let r = exchange(
        &c,
        request(
            Method::POST,
            &url,
            &[("x-user", "mallory")],
            generated(100_000, None),
        ),
    )
    .await;
    assert_eq!(r.status, 401);
    assert!(r.header("www-authenticate").is_some());
    assert!(raw.seen().is_empty(), "never sent");
    // A valid token: the claims go as the configured headers, the client's own replaced.
    let token = key.sign(&jwt::claims(ISS, "orders", "alice"));
    let bearer = format!("Bearer {token}");
    let r = exchange(
        &c,
        request(
            Method::POST,
            &url,
            &[("authorization", &bearer), ("x-user", "mallory")],
            generated(100_000, None),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["sha256"], pattern_sha256(100_000));
    let seen = raw.seen();
    let h = &seen.last().unwrap().headers;
    let users: Vec<_> = h.get_all("x-user").iter().collect();
    assert_eq!(users, ["alice"]);
    assert_eq!(h["x-issuer"], ISS);
}

/// The config errors of `yaml` (loading must fail), as text.
fn load_errors(yaml: &str) -> String {
    match fanout::load_gateway("f.yaml", yaml, &|_: &str| None) {
        Ok(_) => panic!("the config loaded:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_pass_route_is_checked_at_load() {
    let base = |route: &str| {
        format!(
            r#"
backends:
  files: {{ url: "http://127.0.0.1:1" }}
  db: {{ url: "postgres://u@127.0.0.1:1/db", protocol: postgres }}
routes:
{route}
"#
        )
    };
    for (route, says) in [
        (
            "  - path: /a\n    pass: { backend: files }\n    respond: { body: '1' }",
            "a `pass` route has no `respond`",
        ),
        (
            "  - path: /a\n    pass: { backend: files }\n    flow: { x: { value: '1' } }",
            "a `pass` route has no `flow`",
        ),
        (
            "  - path: /a\n    pass: { backend: file }",
            "unknown backend `file` in `pass.backend`",
        ),
        (
            "  - path: /a\n    pass: { backend: db }",
            "needs an HTTP one",
        ),
        (
            "  - path: /a/{*rest}\n    pass: { backend: files, path: '/v1/{tail}' }",
            "does not capture",
        ),
        (
            "  - path: /a\n    pass: { backend: files, idle_timeout: 5m }",
            "exceeds server.connections.send_timeout",
        ),
        ("  - path: /a", "a route needs `respond` (or `pass`)"),
    ] {
        let e = load_errors(&base(route));
        assert!(e.contains(says), "{route}\n→ {e}");
        assert!(e.contains("f.yaml:"), "at a place: {e}");
    }
    assert!(load_errors(&base("  - path: /a\n    pass: { backend: file }")).contains("files"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulkhead_holds_its_slot_until_the_answers_last_byte_and_the_breaker_judges_heads() {
    let raw = RawBackend::start().await;
    let s = stubs(STUBS).await;
    let cfg = format!(
        r#"
backends:
  one: {{ url: "{url}", max_concurrency: 1 }}
  fragile:
    url: "{url}"
    breaker: {{ consecutive_failures: 2, open_for: 1h }}
routes:
  - path: /one/{{*rest}}
    pass: {{ backend: one, path: "/{{rest}}" }}
  - path: /fragile/{{*rest}}
    pass: {{ backend: fragile, path: "/{{rest}}" }}
"#,
        url = raw.url()
    );
    let gw = gateway_with(&cfg, &s, &[]).await;
    let c = http_client(false);
    let at = |p: &str| format!("http://{}{p}", gw.addr);
    let get = |p: &str| request(Method::GET, &at(p), &[], full(Bytes::new()));
    // An answer whose body is still coming holds the backend's one slot.
    let held = tokio::time::timeout(LIMIT, c.request(get("/one/stall")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.status(), 200);
    let r = exchange(&c, get("/one/x")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "backend_rejected");
    // The client leaves: the slot is free again.
    drop(held);
    let c2 = c.clone();
    wait_until_async("the slot to be given back", move || {
        let c = c2.clone();
        let url = format!("http://{}/one/x", gw.addr);
        async move {
            let r = exchange(&c, request(Method::GET, &url, &[], full(Bytes::new()))).await;
            r.status == 200
        }
    })
    .await;
    // Two 5xx heads open the breaker: the third request never reaches the backend.
    for _ in 0..2 {
        assert_eq!(exchange(&c, get("/fragile/status/500")).await.status, 500);
    }
    let before = raw.seen().len();
    let r = exchange(&c, get("/fragile/status/500")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "backend_rejected");
    assert_eq!(raw.seen().len(), before);
}

#[test]
fn explain_says_where_a_pass_route_forwards_and_its_limits() {
    let dir = TempDir::new("pass-explain");
    let file = dir.write(
        "fanout.yaml",
        r#"
backends:
  files: { url: "http://127.0.0.1:1" }
routes:
  - path: /files/{*rest}
    method: PUT
    pass: { backend: files, path: "/v1/{rest}", max_body_bytes: 5000000000, timeout: 30m }
"#,
    );
    for format in ["text", "mermaid"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["explain", "--format", format, "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        for part in [
            "pass-through to backend `files`",
            "`/v1/{rest}`",
            "timeout 30m",
            "idle_timeout 30s",
            "5000000000 bytes",
        ] {
            assert!(text.contains(part), "{format}: {part} in\n{text}");
        }
        assert!(
            !text.contains("deadline"),
            "{format}: no flow deadline:\n{text}"
        );
    }
}
