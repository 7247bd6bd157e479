//! Faults and latency models end to end, on real sockets: what a client sees for each fault
//! kind, how often probabilistic faults fire, and the counters the stub keeps about them.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use fanout_stub::StubServer;
use fanout_testkit::h1::{self, get, request};
use fanout_testkit::{start_stubs, wait_until};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::io::ErrorKind;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FAULTS: &str = r#"
services:
  f:
    listen: 127.0.0.1:0
    routes:
      - path: /reset
        body: '"never sent"'
        faults: [{reset: {}, p: 1}]
      - path: /hang
        faults: [{hang: {}, p: 1}]
      - path: /slow
        body: '"abcdefghijklmnopqrstuvwxyz"'
        faults: [{slow_body: {chunks: 5, duration: 500ms}, p: 1}]
      - path: /slow-tiny
        faults: [{slow_body: {chunks: 6, duration: 600ms}}]
      - path: /malformed
        status: 201
        body: '{items: [range(5) | {id: .}]}'
        faults: [{malformed: {}, p: 1}]
      - path: /close
        body: '{items: [range(5) | {id: .}]}'
        faults: [{close_after_headers: {}, p: 1}]
      - path: /status
        body: '"fine"'
        faults: [{status: 503, p: 1, body: '{down: true, path: $request.path}'}]
      - path: /status-default
        faults: [{status: 429}]
      - path: /half
        body: '"ok"'
        faults: [{status: 503, p: 0.5}]
      - path: /never
        body: '"ok"'
        faults: [{reset: {}, p: 0}, {hang: {}, p: 0}]
      - path: /delayed
        latency: 5ms
        body: '"late"'
      - path: /stalled
        latency: {stall: {every: 100ms, duration: 50ms, base: 1ms}}
        body: '"s"'
      - path: /models
        latency:
          mixture:
            - {p: 0.5, latency: {normal: {mean: 2ms, sd: 1ms}}}
            - {p: 0.5, latency: {lognormal: {median: 2ms, sigma: 0.5}}}
        body: '"m"'
"#;

fn route(s: &StubServer, key: &str) -> fanout_stub::RouteStats {
    s.stats("f").expect("stats").routes[key]
}

/// Whether `e` or one of its sources is an I/O error of kind `ConnectionReset`.
fn is_reset(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == ErrorKind::ConnectionReset
        {
            return true;
        }
        cur = err.source();
    }
    false
}

#[tokio::test]
async fn reset_fault_sends_a_tcp_rst() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    sock.write_all(b"GET /reset HTTP/1.1\r\nhost: stub\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    let res = sock.read(&mut buf).await;
    match res {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
        Ok(n) => panic!(
            "expected a reset, read {n} bytes: {:?}",
            String::from_utf8_lossy(&buf[..n])
        ),
    }
    let r = route(&s, "GET /reset");
    assert_eq!(r.faults.reset, 1);
    assert_eq!((r.requests, r.completed, r.in_flight), (1, 1, 0));
    wait_until("connection closed", || {
        s.stats("f").expect("stats").connections_open == 0
    })
    .await;
}

#[tokio::test]
async fn reset_fault_is_a_reset_for_hyper_clients_too() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    let mut conn = h1::conn(addr).await;
    let err = conn
        .send_request(request(Method::GET, "/reset", Bytes::new()))
        .await
        .expect_err("reset");
    assert!(is_reset(&err), "not a reset: {err:?}");

    // HTTP/2: the whole connection is reset, not just the stream.
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("http://stub/reset")
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("request");
    let err = send.send_request(req).await.expect_err("reset");
    let conn_result = conn.await.expect("connection task");
    let conn_err = conn_result.expect_err("the h2 connection fails");
    assert!(
        is_reset(&conn_err) || is_reset(&err),
        "not a reset: {err:?} / {conn_err:?}"
    );
    assert_eq!(route(&s, "GET /reset").faults.reset, 2);
}

#[tokio::test]
async fn hang_fault_never_answers_and_counts_the_abort() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    let mut conn = h1::conn(addr).await;
    let res = tokio::time::timeout(
        Duration::from_millis(200),
        conn.send_request(request(Method::GET, "/hang", Bytes::new())),
    )
    .await;
    assert!(res.is_err(), "a hanging route must not answer");
    drop(conn);
    wait_until("abort counted", || {
        let r = route(&s, "GET /hang");
        r.aborted == 1 && r.in_flight == 0
    })
    .await;
    let r = route(&s, "GET /hang");
    assert_eq!((r.requests, r.completed, r.faults.hang), (1, 0, 1));
}

/// Receive a response body frame by frame; (frames with data, the bytes).
async fn frames(addr: std::net::SocketAddr, path: &str) -> (http::HeaderMap, usize, Vec<u8>) {
    let mut conn = h1::conn(addr).await;
    let resp = conn
        .send_request(request(Method::GET, path, Bytes::new()))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let (parts, mut body) = resp.into_parts();
    let (mut n, mut bytes) = (0, Vec::new());
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("frame");
        if let Some(data) = frame.data_ref() {
            n += 1;
            bytes.extend_from_slice(data);
        }
    }
    (parts.headers, n, bytes)
}

#[tokio::test]
async fn slow_body_fault_dribbles_the_body_in_chunks() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    // Pieces 100 ms apart: the client reads each before the next is sent.
    let (headers, n, bytes) = frames(addr, "/slow").await;
    assert!(n >= 5, "expected at least 5 separate data frames, got {n}");
    assert_eq!(headers["content-length"], bytes.len().to_string().as_str());
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("the whole body arrives");
    assert_eq!(v, "abcdefghijklmnopqrstuvwxyz");

    // A body shorter than the number of chunks is padded with spaces; still valid JSON.
    let (_, n, bytes) = frames(addr, "/slow-tiny").await;
    assert!(n >= 6, "expected at least 6 data frames, got {n}");
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("valid JSON");
    assert_eq!(v, serde_json::Value::Null);

    assert_eq!(route(&s, "GET /slow").faults.slow_body, 1);
    assert_eq!(route(&s, "GET /slow").completed, 1);
}

#[tokio::test]
async fn malformed_fault_answers_200_with_invalid_json() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    let r = get(addr, "/malformed").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "application/json");
    assert!(
        serde_json::from_slice::<serde_json::Value>(&r.body).is_err(),
        "body parsed: {:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert!(r.body.starts_with(b"{\"items\":["), "a truncated body");
    assert_eq!(route(&s, "GET /malformed").faults.malformed, 1);
}

#[tokio::test]
async fn close_after_headers_fault_fails_the_body_read() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    let mut conn = h1::conn(addr).await;
    let resp = conn
        .send_request(request(Method::GET, "/close", Bytes::new()))
        .await
        .expect("the status line and headers arrive");
    assert_eq!(resp.status(), StatusCode::OK);
    let len: usize = resp.headers()["content-length"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number");
    assert!(len > 0);
    let body = resp.into_body().collect().await;
    assert!(body.is_err(), "the body read must fail");

    // HTTP/2: the stream is reset after the headers.
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("http://stub/close")
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("request");
    let resp = send.send_request(req).await.expect("headers");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.into_body().collect().await.is_err());
    assert_eq!(route(&s, "GET /close").faults.close_after_headers, 2);
}

#[tokio::test]
async fn status_fault_with_p_1_always_answers_its_status() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    for _ in 0..3 {
        let r = get(addr, "/status").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            r.json(),
            serde_json::json!({"down": true, "path": "/status"})
        );
    }
    let r = get(addr, "/status-default").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.json(),
        serde_json::json!({"error": "injected fault", "status": 429})
    );
    let st = route(&s, "GET /status");
    assert_eq!((st.faults.status, st.completed), (3, 3));
}

#[tokio::test]
async fn probability_half_fires_about_half_the_time() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    let mut conn = h1::conn(addr).await;
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..400 {
        let resp = conn
            .send_request(request(Method::GET, "/half", Bytes::new()))
            .await
            .expect("response");
        let status = resp.status();
        resp.into_body().collect().await.expect("body");
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => failed += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert!((100..300).contains(&failed), "503 × {failed}, 200 × {ok}");
    assert_eq!(route(&s, "GET /half").faults.status, failed);

    // p = 0 never fires.
    for _ in 0..20 {
        assert_eq!(get(addr, "/never").await.status, StatusCode::OK);
    }
    assert_eq!(route(&s, "GET /never").faults.total(), 0);
}

#[tokio::test]
async fn sleeps_report_their_overshoot_and_models_answer() {
    let s = start_stubs(FAULTS).await;
    let addr = s.addr("f").expect("addr");
    for _ in 0..5 {
        assert_eq!(get(addr, "/delayed").await.json(), "late");
    }
    let r = route(&s, "GET /delayed");
    assert_eq!(r.overshoot_count, 5);
    assert!(r.overshoot_p50_us <= r.overshoot_p99_us && r.overshoot_p99_us <= r.overshoot_max_us);
    // Routes without a delay record nothing.
    get(addr, "/never").await;
    assert_eq!(route(&s, "GET /never").overshoot_count, 0);

    for _ in 0..10 {
        assert_eq!(get(addr, "/stalled").await.json(), "s");
        assert_eq!(get(addr, "/models").await.json(), "m");
    }
    assert_eq!(route(&s, "GET /stalled").completed, 10);
    assert_eq!(route(&s, "GET /models").completed, 10);

    // The stats JSON carries the new fields.
    let v = get(addr, "/__stub/stats").await.json();
    let d = &v["routes"]["GET /delayed"];
    for field in [
        "overshoot_count",
        "overshoot_p50_us",
        "overshoot_p99_us",
        "overshoot_max_us",
    ] {
        assert!(d[field].is_u64(), "{field} in {d}");
    }
    assert_eq!(v["routes"]["GET /half"]["faults"]["status"], 0);
    assert_eq!(
        v["routes"]["GET /reset"]["faults"]
            .as_object()
            .map(|o| o.len()),
        Some(7)
    );

    // Reset zeroes faults and overshoot.
    s.reset_stats();
    assert_eq!(
        route(&s, "GET /delayed"),
        fanout_stub::RouteStats::default()
    );
}
