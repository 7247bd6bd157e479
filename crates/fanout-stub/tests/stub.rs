//! End-to-end tests of the stub: routing, templated bodies, errors, counters, and the detection
//! of clients that go away (HTTP/1.1 close and HTTP/2 stream reset).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use fanout_stub::{Behaviour, Latency, StubServer};
use fanout_testkit::{Resp, start_stubs, wait_until};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request for a stub, with the `x-h: hello` header the templated routes echo.
fn request(method: Method, path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    let mut req = fanout_testkit::h1::request(method, path, body);
    req.headers_mut()
        .insert("x-h", http::HeaderValue::from_static("hello"));
    req
}

/// One HTTP/1.1 request on a fresh connection.
async fn h1(addr: SocketAddr, req: Request<Full<Bytes>>) -> Resp {
    fanout_testkit::h1::exchange(addr, req).await
}

async fn get(addr: SocketAddr, path: &str) -> Resp {
    h1(addr, request(Method::GET, path, Bytes::new())).await
}

const BASIC: &str = r#"
services:
  api:
    listen: 127.0.0.1:0
    routes:
      - path: /items/{id}
        method: POST
        body: |
          {id: $request.params.id, q: $request.query.q, name: $request.body.name,
           m: $request.method, h: $request.headers["x-h"], path: $request.path}
      - path: /items/{id}
        method: DELETE
        status: 204
      - path: /echo
        method: "*"
        body: '$request.body'
      - path: /search
        status: 201
        headers: { x-a: "1", content-type: application/vnd.test+json }
        body: '{items: [range(3) | {id: ., q: $request.query.text}]}'
      - path: /files/{*rest}
        body: '$request.params.rest'
      - path: /boom
        body: 'error("boom")'
      - path: /plain
"#;

#[tokio::test]
async fn templated_body_from_params_query_and_json_body() {
    let s = start_stubs(BASIC).await;
    let addr = s.addr("api").expect("api");
    let r = h1(
        addr,
        request(Method::POST, "/items/42?q=a&q=b%20c", r#"{"name":"x"}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(
        r.json(),
        json!({"id": "42", "q": ["a", "b c"], "name": "x", "m": "POST", "h": "hello", "path": "/items/42"})
    );

    let r = get(addr, "/search?text=phone").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.headers["x-a"], "1");
    assert_eq!(r.headers["content-type"], "application/vnd.test+json");
    assert_eq!(
        r.json(),
        json!({"items": [{"id": 0, "q": "phone"}, {"id": 1, "q": "phone"}, {"id": 2, "q": "phone"}]})
    );

    let r = get(addr, "/files/a/b/c.txt").await;
    assert_eq!(r.json(), json!("a/b/c.txt"));
    // captured segments are percent-decoded, like the gateway's; `$request.path` is as sent
    let r = h1(addr, request(Method::POST, "/items/a%20b%2Fc", "{}")).await;
    assert_eq!(r.json()["id"], json!("a b/c"));
    assert_eq!(r.json()["path"], json!("/items/a%20b%2Fc"));
    let r = get(addr, "/files/%ZZ").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    // No body expression answers null; the status comes from the config.
    let r = h1(addr, request(Method::DELETE, "/items/1", Bytes::new())).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = get(addr, "/plain").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), Value::Null);
}

#[tokio::test]
async fn non_json_body_is_a_string_and_any_method_matches() {
    let s = start_stubs(BASIC).await;
    let addr = s.addr("api").expect("api");
    let r = h1(addr, request(Method::PUT, "/echo", "not json {")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), json!("not json {"));
    let r = h1(addr, request(Method::PATCH, "/echo", r#"[1, 2]"#)).await;
    assert_eq!(r.json(), json!([1, 2]));
    let r = get(addr, "/echo").await;
    assert_eq!(r.json(), Value::Null);
    let stats = s.stats("api").expect("stats");
    assert_eq!(stats.routes["* /echo"].completed, 3);
}

#[tokio::test]
async fn not_found_method_not_allowed_and_eval_error() {
    let s = start_stubs(BASIC).await;
    let addr = s.addr("api").expect("api");
    let r = get(addr, "/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("/nope"))
    );

    let r = get(addr, "/items/1").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "POST, DELETE");
    assert!(r.json()["error"].is_string());

    let r = get(addr, "/boom").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("boom")),
        "{:?}",
        r.json()
    );
    // Unmatched requests are not counted on any route; the failed evaluation is a completion.
    let stats = s.stats("api").expect("stats");
    assert_eq!(stats.routes["GET /boom"].completed, 1);
    assert_eq!(stats.routes["POST /items/{id}"].requests, 0);
}

#[tokio::test]
async fn body_over_one_mib_is_413() {
    let s = start_stubs(BASIC).await;
    let addr = s.addr("api").expect("api");
    let big = vec![b'x'; fanout_stub::MAX_BODY_BYTES + 1];
    let r = h1(addr, request(Method::POST, "/echo", big)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);

    // Without content-length (chunked), the limit applies while reading.
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let conn = tokio::spawn(conn);
    let body = Chunked(vec![Bytes::from(vec![b'y'; 600 * 1024]); 3]);
    let req = Request::builder()
        .method(Method::POST)
        .uri("/echo")
        .header("host", "stub")
        .body(body)
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    conn.abort();
}

/// A body of several chunks without a known length (sent chunked).
struct Chunked(Vec<Bytes>);

impl hyper::body::Body for Chunked {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let next = if self.0.is_empty() {
            None
        } else {
            Some(Ok(hyper::body::Frame::data(self.0.remove(0))))
        };
        std::task::Poll::Ready(next)
    }
}

const SLOW: &str = r#"
services:
  slow:
    listen: 127.0.0.1:0
    routes:
      - path: /slow
        latency: 30s
        body: '"late"'
      - path: /overlap
        latency: 300ms
        body: '"ok"'
      - path: /uniform
        latency: {uniform: {min: 1ms, max: 20ms}}
        body: '"u"'
"#;

fn slow_route(s: &StubServer) -> fanout_stub::RouteStats {
    s.stats("slow").expect("slow stats").routes["GET /slow"]
}

fn open_conns(s: &StubServer) -> u64 {
    s.stats("slow").expect("slow stats").connections_open
}

/// Write a raw HTTP/1.1 request for the 30 s route, wait until the handler runs, then let
/// `go_away` end the client side. The stub must count the request as aborted long before the
/// latency would have elapsed (the wait is bounded by 10 s; the route sleeps 30 s).
async fn h1_raw_abort(extra_header: &str, go_away: impl AsyncFnOnce(TcpStream)) {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET /slow HTTP/1.1\r\nhost: stub\r\n{extra_header}\r\n");
    sock.write_all(req.as_bytes()).await.expect("write");
    wait_until("handler running", || slow_route(&s).in_flight == 1).await;
    assert_eq!(open_conns(&s), 1);
    go_away(sock).await;
    wait_until("abort counted", || {
        let r = slow_route(&s);
        r.aborted == 1 && r.in_flight == 0
    })
    .await;
    wait_until("connection closed", || open_conns(&s) == 0).await;
    let r = slow_route(&s);
    assert_eq!((r.requests, r.completed, r.max_in_flight), (1, 0, 1));
}

#[tokio::test]
async fn h1_client_closing_the_socket_aborts_the_handler() {
    h1_raw_abort("", async |sock| drop(sock)).await;
}

#[tokio::test]
async fn h1_connection_close_request_is_aborted_too() {
    h1_raw_abort("connection: close\r\n", async |sock| drop(sock)).await;
}

#[tokio::test]
async fn h1_client_half_close_aborts_the_handler() {
    // Shutting down only the write side is a client going away as well (half-close is off).
    h1_raw_abort("", async |mut sock| {
        sock.shutdown().await.expect("shutdown");
        let mut buf = Vec::new();
        // The stub closes its side: reading ends without a response.
        let n = sock.read_to_end(&mut buf).await.unwrap_or(0);
        assert_eq!(
            n,
            0,
            "no response expected: {:?}",
            String::from_utf8_lossy(&buf)
        );
    })
    .await;
}

#[tokio::test]
async fn h1_hyper_client_timeout_aborts_the_handler() {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let conn = tokio::spawn(conn);
    let res = tokio::time::timeout(
        Duration::from_millis(100),
        send.send_request(request(Method::GET, "/slow", Bytes::new())),
    )
    .await;
    assert!(
        res.is_err(),
        "the 30 s route cannot answer within the timeout"
    );
    // Only the response future was dropped: hyper's HTTP/1 client closes the connection by
    // itself (a half-sent exchange cannot be reused), and the stub sees the EOF.
    wait_until("abort counted", || {
        let r = slow_route(&s);
        r.aborted == 1 && r.in_flight == 0
    })
    .await;
    wait_until("connection closed", || open_conns(&s) == 0).await;
    wait_until("client connection task ended", || conn.is_finished()).await;
    assert_eq!(slow_route(&s).completed, 0);
}

#[tokio::test]
async fn pooled_legacy_client_timeout_aborts_the_handler() {
    // The gateway's kind of client: hyper-util's pooled client over HTTP/1.1. Dropping the
    // response future must close that connection (not return it to the pool half-used).
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = Request::builder()
        .uri(format!("http://{addr}/slow"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let res = tokio::time::timeout(Duration::from_millis(100), client.request(req)).await;
    assert!(
        res.is_err(),
        "the 30 s route cannot answer within the timeout"
    );
    wait_until("abort counted", || {
        let r = slow_route(&s);
        r.aborted == 1 && r.in_flight == 0
    })
    .await;
    wait_until("connection closed", || open_conns(&s) == 0).await;

    // The client still works afterwards (on a new connection).
    let req = Request::builder()
        .uri(format!("http://{addr}/uniform"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = client.request(req).await.expect("answer");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(s.stats("slow").expect("stats").connections_total, 2);
}

async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    send
}

fn h2_request(path: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .uri(format!("http://stub{path}"))
        .body(Full::new(Bytes::new()))
        .expect("request")
}

#[tokio::test]
async fn h2c_stream_reset_aborts_the_handler_and_keeps_the_connection() {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    let mut send = h2_client(addr).await;

    let ok = send
        .send_request(h2_request("/uniform"))
        .await
        .expect("h2 answer");
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.version(), http::Version::HTTP_2);
    // Read the body: a response still held keeps its stream (and the connection) open.
    ok.into_body().collect().await.expect("body");

    let res = tokio::time::timeout(
        Duration::from_millis(100),
        send.send_request(h2_request("/slow")),
    )
    .await;
    assert!(
        res.is_err(),
        "the 30 s route cannot answer within the timeout"
    );
    // Dropping the response future resets the stream (RST_STREAM CANCEL).
    wait_until("abort counted", || {
        let r = slow_route(&s);
        r.aborted == 1 && r.in_flight == 0
    })
    .await;
    assert_eq!(
        open_conns(&s),
        1,
        "a stream reset must not close the connection"
    );

    // The connection still serves requests.
    let again = send
        .send_request(h2_request("/uniform"))
        .await
        .expect("h2 answer");
    let body = again.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], br#""u""#);

    drop(send);
    wait_until("connection closed", || open_conns(&s) == 0).await;
    let stats = s.stats("slow").expect("stats");
    assert_eq!(stats.connections_total, 1);
    assert_eq!(stats.routes["GET /uniform"].completed, 2);
    assert_eq!(slow_route(&s).completed, 0);
}

#[tokio::test]
async fn overlapping_requests_raise_max_in_flight() {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    let (a, b) = tokio::join!(get(addr, "/overlap"), get(addr, "/overlap"));
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    let stats = s.stats("slow").expect("stats");
    let r = stats.routes["GET /overlap"];
    assert_eq!(
        (r.requests, r.completed, r.in_flight, r.aborted),
        (2, 2, 0, 0)
    );
    assert_eq!(r.max_in_flight, 2);
    assert_eq!(stats.connections_total, 2);
}

#[tokio::test]
async fn h2c_multiplexes_concurrent_streams_on_one_connection() {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    let send = h2_client(addr).await;
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let mut send = send.clone();
        tasks.push(tokio::spawn(async move {
            send.send_request(h2_request("/overlap"))
                .await
                .map(|r| r.status())
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("task").expect("answer"), StatusCode::OK);
    }
    let stats = s.stats("slow").expect("stats");
    assert_eq!(stats.connections_total, 1);
    assert_eq!(stats.routes["GET /overlap"].completed, 5);
    assert!(stats.routes["GET /overlap"].max_in_flight >= 2);
}

#[tokio::test]
async fn uniform_latency_route_answers() {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    for _ in 0..5 {
        let r = get(addr, "/uniform").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json(), json!("u"));
    }
    assert_eq!(
        s.stats("slow").expect("stats").routes["GET /uniform"].completed,
        5
    );
}

#[tokio::test]
async fn admin_endpoints_report_and_reset() {
    let s = start_stubs(BASIC).await;
    let addr = s.addr("api").expect("api");
    get(addr, "/plain").await;
    get(addr, "/plain").await;
    let r = get(addr, "/__stub/stats").await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert_eq!(v["routes"]["GET /plain"]["requests"], 2);
    assert_eq!(v["routes"]["GET /plain"]["completed"], 2);
    assert_eq!(v["connections_total"], 3);
    assert_eq!(
        v["connections_open"], 1,
        "the stats request's own connection"
    );
    let parsed: fanout_stub::ServiceStats = serde_json::from_value(v).expect("ServiceStats");
    assert_eq!(parsed.routes.len(), 7);

    assert_eq!(
        get(addr, "/__stub/reset").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        get(addr, "/__stub/nope").await.status,
        StatusCode::NOT_FOUND
    );
    let r = h1(addr, request(Method::POST, "/__stub/reset", Bytes::new())).await;
    assert_eq!(r.status, StatusCode::OK);
    let stats = s.stats("api").expect("stats");
    assert_eq!(
        stats.routes["GET /plain"],
        fanout_stub::RouteStats::default()
    );

    get(addr, "/plain").await;
    s.reset_stats();
    let stats = s.stats("api").expect("stats");
    assert_eq!(stats.routes["GET /plain"].requests, 0);
    assert_eq!(stats.connections_total, 0);
}

const TWO: &str = r#"
services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /x
        body: '"a"'
  b:
    listen: "${B_ADDR:-127.0.0.1:0}"
    routes:
      - path: /x
        body: '"b"'
"#;

#[tokio::test]
async fn several_services_listen_separately() {
    let s = start_stubs(TWO).await;
    let services = s.services();
    assert_eq!(
        services.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_ne!(services[0].1, services[1].1);
    for (name, addr) in &services {
        assert_eq!(get(*addr, "/x").await.json(), json!(name));
    }
    assert!(s.addr("c").is_none());
    assert!(s.stats("c").is_none());
}

#[tokio::test]
async fn behaviour_can_be_replaced_while_running() {
    let s = start_stubs(TWO).await;
    let addr = s.addr("a").expect("a");
    let current = s.behaviour("a", "GET /x").expect("route");
    assert_eq!(current.latency, Latency::None);
    let replaced = Behaviour {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: Some(fanout_expr_compile(r#"{down: true}"#)),
        ..(*current).clone()
    };
    assert!(s.set_behaviour("a", "GET /x", replaced));
    assert!(!s.set_behaviour("a", "GET /nope", (*current).clone()));
    let r = get(addr, "/x").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.json(), json!({"down": true}));
}

fn fanout_expr_compile(src: &str) -> fanout_expr::Expr {
    fanout_expr::Expr::compile(src, &["request"]).expect("expression compiles")
}

#[tokio::test]
async fn shutdown_closes_connections_and_stops_accepting() {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    sock.write_all(b"GET /slow HTTP/1.1\r\nhost: stub\r\n\r\n")
        .await
        .expect("write");
    wait_until("handler running", || slow_route(&s).in_flight == 1).await;
    s.shutdown().await;
    let mut buf = Vec::new();
    let n = sock.read_to_end(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "connection closed without a response");
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
}

#[tokio::test]
async fn dropping_the_server_stops_accepting() {
    let s = start_stubs(SLOW).await;
    let addr = s.addr("slow").expect("slow");
    drop(s);
    let mut refused = false;
    for _ in 0..2000 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        refused,
        "the listener should close after the server is dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_multi_thread_runtime() {
    let s = start_stubs(BASIC).await;
    let addr = s.addr("api").expect("api");
    let tasks: Vec<_> = (0..8)
        .map(|i| tokio::spawn(async move { get(addr, &format!("/files/{i}")).await.json() }))
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.expect("task"), json!(i.to_string()));
    }
}

const EVENTS: &str = r#"
services:
  ev:
    listen: 127.0.0.1:0
    routes:
      - path: /twice
        sse:
          repeat: 2
          events:
            - {data: "x", event: e}
            - {comment: "just a comment", delay: 5ms}
            - {data: "", id: own}
      - path: /held
        headers: { cache-control: "no-store" }
        sse:
          then: hold
          events: [{data: '{"n": 1}'}]
"#;

#[tokio::test]
async fn event_streams_send_their_events_repeat_them_and_can_be_held_open() {
    let s = start_stubs(EVENTS).await;
    let addr = s.addr("ev").expect("ev");
    let r = get(addr, "/twice").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let once = "event: e\ndata: x\n\n: just a comment\n\nid: own\ndata: \n\n";
    assert_eq!(r.text(), format!("{once}{once}"));
    let stats = |key: &str| s.stats("ev").unwrap().routes[key];
    assert_eq!(stats("GET /twice").streams_open, 0);
    assert_eq!(stats("GET /twice").streams_left, 0);

    // Held open after its event, until the client leaves.
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let resp = send
        .send_request(fanout_testkit::h1::request(
            Method::GET,
            "/held",
            Bytes::new(),
        ))
        .await
        .unwrap();
    assert_eq!(resp.headers()["cache-control"], "no-store");
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "data: {\"n\": 1}\n\n");
    assert_eq!(stats("GET /held").streams_open, 1);
    drop(body);
    conn.abort();
    wait_until("the held stream left", || {
        stats("GET /held").streams_left == 1 && stats("GET /held").streams_open == 0
    })
    .await;
}
