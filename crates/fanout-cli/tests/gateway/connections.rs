//! Every connection ends, and slow or large bodies cannot starve admission or memory: the
//! connection timeouts (first byte, header read, idle, send), the connection cap with idle-first
//! eviction, bodies read before admission (reader cap, read timeout), the memory budget, and a
//! quick shutdown when only idle connections are open (and the end of the grace dropping what is
//! still in flight). Real gateway, real sockets; short limits
//! in the configs and generous overall timeouts, asserting states and counters, never elapsed
//! times (except the shutdown bound, far below its configured grace).

use crate::support::gateway;
use bytes::Bytes;
use fanout_testkit::*;
use futures_util::future::join_all;
use http::Method;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Overall bound of every wait in this file (a loaded 2-core machine is slow, never this slow).
const PATIENCE: Duration = Duration::from_secs(30);

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - { path: /slow, latency: 1500ms, body: '{ok: true}' }
      - { path: /hold, method: POST, latency: 1s, body: '{ok: true}' }
      - { path: /big, raw_body: '"BIG"' }
"#;

/// The stubs, with `/big` answering a JSON string of `len` bytes.
async fn stub_server(big_len: usize) -> fanout_stub::StubServer {
    let big = "x".repeat(big_len);
    stubs(&STUBS.replace("BIG", &big)).await
}

/// A gateway with `server:` settings (indented YAML lines) and the test routes.
async fn gw(server: &str, s: &fanout_stub::StubServer) -> fanout::RunningGateway {
    let yaml = format!(
        r#"
server:
{server}
backends:
  a: {{ url: "http://${{A_ADDR}}", dedup: false }}
routes:
  - path: /small
    flow: {{}}
    respond: {{ body: '{{ok: true}}' }}
  - path: /slow
    deadline: 10s
    # Each slow request holds its own connection and backend call (no sharing of identical ones).
    coalesce: false
    flow:
      s: {{ http: {{ backend: a, path: '"/slow"' }}, timeout: 10s }}
    respond: {{ body: '$s' }}
  - path: /big
    deadline: 20s
    flow:
      b: {{ http: {{ backend: a, path: '"/big"' }}, timeout: 20s }}
    respond: {{ body: '{{n: ($b | length), b: $b}}' }}
  - path: /upload
    method: POST
    deadline: 20s
    flow:
      h: {{ http: {{ backend: a, method: POST, path: '"/hold"' }}, timeout: 10s }}
    respond: {{ body: '{{n: ($request.body | length)}}' }}
  - path: /echo
    method: POST
    deadline: 20s
    flow: {{}}
    respond: {{ body: '{{n: ($request.body | length)}}' }}
"#
    );
    gateway(&yaml, s).await
}

async fn status(addr: SocketAddr) -> serde_json::Value {
    get(&format!("http://{addr}/__fanout/status")).await.json()
}

/// Poll the status endpoint until `f` holds.
async fn wait_status(
    addr: SocketAddr,
    what: &str,
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + PATIENCE;
    loop {
        let st = status(addr).await;
        if f(&st) {
            return st;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}: {st}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn counter(st: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = st;
    for p in path {
        v = &v[*p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("{path:?} is not a counter: {st}"))
}

/// Read until the peer closes (EOF or reset); everything read. Panics after [`PATIENCE`].
async fn read_until_closed(sock: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    tokio::time::timeout(PATIENCE, async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the gateway closed the connection");
    out
}

/// Read one HTTP/1.1 response (head + Content-Length body) from a raw socket.
async fn read_response(sock: &mut (impl AsyncReadExt + Unpin)) -> (u16, String) {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if data.len() >= end + 4 + len {
                    let status = head[9..12].parse().expect("status code");
                    let body = String::from_utf8_lossy(&data[end + 4..end + 4 + len]).to_string();
                    return (status, body);
                }
            }
            let n = sock.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "connection closed mid-response: {}",
                String::from_utf8_lossy(&data)
            );
            data.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("a response")
}

// --- a minimal raw HTTP/2 client: frames written and read by hand ---

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HEADERS of `GET path` (HPACK: static-table `:method GET`, `:scheme http`, literal `:path`
/// and `:authority`), ending the stream.
fn get_headers(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 1, b'x']);
    frame(HEADERS, 0x1 | 0x4, stream, &block)
}

/// Read one frame: `(type, flags, stream, payload)`, or `None` once the connection is closed.
async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await.ok()?;
    let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], stream, payload))
}

/// Open a raw HTTP/2 connection: preface and SETTINGS (`settings` as id/value pairs).
async fn h2_connect(addr: SocketAddr, settings: &[(u16, u32)]) -> TcpStream {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let mut payload = Vec::new();
    for (id, v) in settings {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&v.to_be_bytes());
    }
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &payload));
    sock.write_all(&out).await.unwrap();
    sock
}

/// Read frames until the connection closes, acknowledging the server's SETTINGS; the types seen.
async fn h2_frames_until_closed(sock: TcpStream) -> Vec<(u8, usize)> {
    let (mut r, mut w) = sock.into_split();
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some((kind, flags, _stream, payload)) = read_frame(&mut r).await {
            if kind == SETTINGS && flags & 1 == 0 {
                let _ = w.write_all(&frame(SETTINGS, 1, 0, &[])).await;
            }
            seen.push((kind, payload.len()));
        }
    })
    .await
    .expect("the gateway closed the HTTP/2 connection");
    seen
}

const SHORT: &str =
    "  connections: { first_byte_timeout: 300ms, idle_timeout: 400ms, send_timeout: 400ms }
  header_read_timeout: 300ms";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_and_a_partial_preface_are_closed() {
    let s = stub_server(10).await;
    let g = gw(SHORT, &s).await;

    let mut silent = TcpStream::connect(g.addr).await.unwrap();
    assert!(read_until_closed(&mut silent).await.is_empty());

    let mut partial = TcpStream::connect(g.addr).await.unwrap();
    partial.write_all(&PREFACE[..10]).await.unwrap();
    assert!(read_until_closed(&mut partial).await.is_empty());

    // A partial HTTP/1 head is closed by the header read timeout (ours, not hyper's).
    let mut head = TcpStream::connect(g.addr).await.unwrap();
    head.write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    read_until_closed(&mut head).await;

    let st = wait_status(g.addr, "three timeouts counted", |st| {
        counter(st, &["connections", "timeouts", "first_byte"]) >= 2
            && counter(st, &["connections", "timeouts", "header_read"]) >= 1
    })
    .await;
    assert_eq!(
        counter(&st, &["connections", "timeouts", "send"]),
        0,
        "{st}"
    );
    // Still serving.
    assert_eq!(get(&format!("http://{}/small", g.addr)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2_connection_gets_goaway_and_is_closed_even_with_client_pings() {
    let s = stub_server(10).await;
    let g = gw(SHORT, &s).await;

    // Preface + SETTINGS, then silence.
    let quiet = h2_connect(g.addr, &[]).await;
    // Preface + SETTINGS, then a PING every 100 ms: PINGs are not activity.
    let pinging = h2_connect(g.addr, &[]).await;
    let (r, mut w) = pinging.into_split();
    let pinger = tokio::spawn(async move {
        for i in 0u64.. {
            if w.write_all(&frame(PING, 0, 0, &i.to_be_bytes()))
                .await
                .is_err()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    let seen = h2_frames_until_closed(quiet).await;
    assert!(
        seen.iter().any(|(k, _)| *k == GOAWAY),
        "GOAWAY before the close: {seen:?}"
    );
    let seen = h2_read_until_closed(r).await;
    assert!(
        seen.iter().any(|(k, _)| *k == GOAWAY),
        "GOAWAY before the close: {seen:?}"
    );
    pinger.abort();
    let st = wait_status(g.addr, "idle timeouts", |st| {
        counter(st, &["connections", "timeouts", "idle"]) >= 2
    })
    .await;
    assert_eq!(
        counter(&st, &["connections", "timeouts", "first_byte"]),
        0,
        "{st}"
    );
}

/// Read frames from the reading half of a connection until it closes; the types seen.
async fn h2_read_until_closed(mut r: tokio::net::tcp::OwnedReadHalf) -> Vec<(u8, usize)> {
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some((kind, _, _, payload)) = read_frame(&mut r).await {
            seen.push((kind, payload.len()));
        }
    })
    .await
    .expect("the gateway closed the HTTP/2 connection");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h1_keep_alive_connection_is_closed() {
    let s = stub_server(10).await;
    // The header read timeout is far longer than the idle timeout: the idle timeout governs.
    let g = gw(
        "  connections: { idle_timeout: 400ms, first_byte_timeout: 60s, send_timeout: 60s }\n  header_read_timeout: 60s",
        &s,
    )
    .await;
    let mut sock = TcpStream::connect(g.addr).await.unwrap();
    sock.write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (code, body) = read_response(&mut sock).await;
    assert_eq!(code, 200, "{body}");
    assert!(read_until_closed(&mut sock).await.is_empty());
    let st = wait_status(g.addr, "an idle timeout", |st| {
        counter(st, &["connections", "timeouts", "idle"]) >= 1
    })
    .await;
    assert_eq!(
        counter(&st, &["connections", "timeouts", "header_read"]),
        0,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_a_large_answer_is_closed() {
    // Larger than what the kernel buffers on both sides of a loopback connection.
    const BIG: usize = 12 << 20;
    let s = stub_server(BIG).await;
    let g = gw(
        "  connections: { send_timeout: 400ms, idle_timeout: 60s, first_byte_timeout: 60s }\n  header_read_timeout: 60s",
        &s,
    )
    .await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut sock = sock.connect(g.addr).await.unwrap();
    sock.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Never read until the gateway counted the stalled send.
    wait_status(g.addr, "a send timeout", |st| {
        counter(st, &["connections", "timeouts", "send"]) >= 1
    })
    .await;
    let got = read_until_closed(&mut sock).await;
    assert!(
        got.len() < BIG,
        "the answer was cut off: {} bytes of {BIG}",
        got.len()
    );
    let st = wait_status(g.addr, "the connection closed", |st| {
        counter(st, &["connections", "open"]) == 1 // this status request
    })
    .await;
    assert_eq!(
        counter(&st, &["connections", "timeouts", "idle"]),
        0,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_with_a_zero_window_is_closed_and_counted() {
    let s = stub_server(256 << 10).await;
    let g = gw(
        "  connections: { send_timeout: 400ms, idle_timeout: 60s, first_byte_timeout: 60s }\n  header_read_timeout: 60s",
        &s,
    )
    .await;
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: no stream may receive any DATA.
    let mut sock = h2_connect(g.addr, &[(0x4, 0)]).await;
    sock.write_all(&get_headers(1, "/big")).await.unwrap();
    let seen = h2_frames_until_closed(sock).await;
    assert!(
        seen.iter().any(|(k, _)| *k == HEADERS),
        "the answer's head was sent: {seen:?}"
    );
    assert!(
        !seen.iter().any(|(k, len)| *k == DATA && *len > 0),
        "no data through a zero window: {seen:?}"
    );
    let st = wait_status(g.addr, "a send timeout", |st| {
        counter(st, &["connections", "timeouts", "send"]) >= 1
    })
    .await;
    assert_eq!(
        counter(&st, &["connections", "timeouts", "idle"]),
        0,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_idle_connections_are_closed_first() {
    let s = stub_server(10).await;
    let g = gw(
        "  connections: { max_connections: 3, idle_timeout: 60s }",
        &s,
    )
    .await;
    // Three idle keep-alive connections, oldest first.
    let mut idle = Vec::new();
    for _ in 0..3 {
        let mut sock = TcpStream::connect(g.addr).await.unwrap();
        sock.write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(read_response(&mut sock).await.0, 200);
        idle.push(sock);
    }
    // A fourth connection is served: the oldest idle one made room.
    let c = client(false);
    let r = send(
        &c,
        Method::GET,
        &format!("http://{}/small", g.addr),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        read_until_closed(&mut idle[0]).await.is_empty(),
        "the oldest idle connection was closed"
    );
    // The youngest raw one is still served on its connection.
    idle[2]
        .write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut idle[2]).await.0, 200);
    let st = status(g.addr).await;
    assert!(
        counter(&st, &["connections", "closed_idle_for_pressure"]) >= 1,
        "{st}"
    );
    assert_eq!(counter(&st, &["connections", "refused"]), 0, "{st}");
    assert_eq!(counter(&st, &["connections", "max"]), 3, "{st}");
    // Read over a connection of its own, which took the place of an idle one: `open` counts
    // places, never over the cap while the evicted connection closes.
    assert!(counter(&st, &["connections", "open"]) <= 3, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_nothing_idle_new_connections_are_refused_then_served_again() {
    let s = stub_server(10).await;
    let g = gw(
        "  connections: { max_connections: 2, idle_timeout: 60s }",
        &s,
    )
    .await;
    // Two connections busy with slow requests.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut sock = TcpStream::connect(g.addr).await.unwrap();
        sock.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        busy.push(sock);
    }
    // Wait until both requests reached the backend: both connections are busy.
    let end = Instant::now() + PATIENCE;
    while s
        .stats("a")
        .map_or(0, |st| st.routes.get("GET /slow").map_or(0, |r| r.requests))
        < 2
    {
        assert!(Instant::now() < end, "the slow requests did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A third connection is accepted and reset at once (the reset may even beat `connect`).
    if let Ok(mut third) = TcpStream::connect(g.addr).await {
        let _ = third
            .write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        assert!(
            read_until_closed(&mut third).await.is_empty(),
            "refused without an answer"
        );
    }
    // The busy ones finish normally; then new connections are served again.
    for sock in &mut busy {
        assert_eq!(read_response(sock).await.0, 200);
    }
    drop(busy);
    let st = wait_status(g.addr, "the refusal counted", |st| {
        counter(st, &["connections", "refused"]) >= 1
    })
    .await;
    assert!(counter(&st, &["connections", "accepted"]) >= 3, "{st}");
}

/// Raw HTTP/1.1 POST whose body of `len` bytes arrives one byte per 100 ms; the answer.
async fn slow_post(addr: SocketAddr, path: &str, len: usize) -> (u16, String) {
    let sock = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = sock.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    );
    w.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        for _ in 0..len {
            if w.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        w
    });
    let answer = read_response(&mut r).await;
    writer.abort();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_do_not_take_admission_slots() {
    let s = stub_server(10).await;
    let g = gw(
        "  admission: { max_concurrency: 2, queue: 0 }
  bodies: { read_timeout: 3s, min_bytes_per_sec: 1000 }",
        &s,
    )
    .await;
    const SLOW: usize = 12;
    let addr = g.addr;
    let slow: Vec<_> = (0..SLOW)
        .map(|_| tokio::spawn(slow_post(addr, "/echo", 1000)))
        .collect();
    wait_status(addr, "the slow bodies being read", |st| {
        counter(st, &["bodies", "reading"]) == SLOW as u64
    })
    .await;
    // Two admission slots, twelve slow bodies arriving: a GET is still served, and took no
    // body reader.
    let r = get(&format!("http://{addr}/small")).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let st = status(addr).await;
    assert!(
        counter(&st, &["bodies", "reading"]) >= 1,
        "the GET ran while bodies were still arriving: {st}"
    );
    assert_eq!(counter(&st, &["bodies", "read"]), SLOW as u64, "{st}");
    assert_eq!(
        counter(&st, &["admission", "rejected_queue_full"]),
        0,
        "{st}"
    );
    // The slow ones end with the body-timeout answer, not with 503.
    for h in slow {
        let (code, body) = h.await.unwrap();
        assert_eq!(code, 408, "{body}");
        assert!(body.contains("body_timeout"), "{body}");
        assert!(body.contains("server.bodies.read_timeout"), "{body}");
    }
    let st = status(addr).await;
    assert_eq!(counter(&st, &["bodies", "timeouts"]), SLOW as u64, "{st}");
    assert_eq!(counter(&st, &["bodies", "reading"]), 0, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_reader_cap_answers_its_own_503() {
    let s = stub_server(10).await;
    let g = gw(
        "  bodies: { max_readers: 2, read_timeout: 20s, min_bytes_per_sec: 0 }",
        &s,
    )
    .await;
    let addr = g.addr;
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(slow_post(addr, "/echo", 10_000)))
        .collect();
    wait_status(addr, "two bodies being read", |st| {
        counter(st, &["bodies", "reading"]) == 2
    })
    .await;
    let c = client(false);
    let r = send(
        &c,
        Method::POST,
        &format!("http://{addr}/echo"),
        &[("content-type", "application/json")],
        r#"{"a": 1}"#,
    )
    .await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.code(), "body_readers_full");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("server.bodies.max_readers")),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.headers["retry-after"], "1");
    // Requests without a body are not affected.
    assert_eq!(get(&format!("http://{addr}/small")).await.status, 200);
    let st = status(addr).await;
    assert_eq!(counter(&st, &["bodies", "refused_readers_full"]), 1, "{st}");
    for h in slow {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_budget_answers_its_own_503_under_concurrent_large_bodies() {
    let s = stub_server(10).await;
    const BUDGET: u64 = 3 << 20;
    let g = gw(
        &format!("  max_body_bytes: 2097152\n  bodies: {{ memory_budget_bytes: {BUDGET} }}"),
        &s,
    )
    .await;
    // ~1 MiB of JSON: 1000 strings of 1000 bytes, estimated at ~2.1 MiB parsed: one fits.
    let item = format!("\"{}\"", "y".repeat(1000));
    let body = Bytes::from(format!("[{}]", vec![item; 1000].join(",")));
    let c = client(false);
    let url = format!("http://{}/upload", g.addr);
    let answers = join_all((0..6).map(|_| {
        let (c, url, body) = (c.clone(), url.clone(), body.clone());
        async move {
            send(
                &c,
                Method::POST,
                &url,
                &[("content-type", "application/json")],
                body,
            )
            .await
        }
    }))
    .await;
    let ok = answers.iter().filter(|r| r.status == 200).count();
    let refused: Vec<_> = answers.iter().filter(|r| r.status == 503).collect();
    assert!(
        ok >= 1,
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(
        !refused.is_empty(),
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(ok + refused.len(), 6);
    for r in &refused {
        assert_eq!(r.code(), "memory_budget_exhausted");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("server.bodies.memory_budget_bytes")),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    }
    for r in answers.iter().filter(|r| r.status == 200) {
        assert_eq!(r.json()["n"], 1000);
    }
    let st = wait_status(g.addr, "the memory released", |st| {
        counter(st, &["bodies", "memory", "in_use_bytes"]) == 0
    })
    .await;
    assert!(
        counter(&st, &["bodies", "memory", "refused"]) >= refused.len() as u64,
        "{st}"
    );
    let peak = counter(&st, &["bodies", "memory", "peak_bytes"]);
    assert!(peak > 0 && peak <= BUDGET, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answer_is_held_in_the_memory_budget_at_its_parsed_size_until_the_request_ends() {
    // Rows `{"g":N}`: ~10 bytes of JSON each, ~230 bytes once parsed. 12 000 of them are
    // ~130 KB of JSON, far under any size cap, and ~3 MiB as a value: more than the 2 MiB budget.
    let rows = |n: usize| {
        let r: Vec<String> = (0..n).map(|i| format!(r#"{{"g":{i}}}"#)).collect();
        format!("[{}]", r.join(","))
    };
    let s = stubs(&format!(
        r#"
services:
  a:
    listen: "${{A_ADDR}}"
    routes:
      - {{ path: /many, raw_body: '{}' }}
      - {{ path: /few, raw_body: '{}' }}
"#,
        rows(12_000),
        rows(500)
    ))
    .await;
    let yaml = r#"
server:
  bodies: { memory_budget_bytes: 2097152 }
backends:
  a: { url: "http://${A_ADDR}", dedup: false }
routes:
  - path: /many
    flow: { r: { http: { backend: a, path: '"/many"' } } }
    respond: { body: '$r | length' }
  - path: /few
    flow: { r: { http: { backend: a, path: '"/few"' } } }
    respond: { body: '$r | length' }
"#;
    let g = gateway(yaml, &s).await;
    let few = get(&format!("http://{}/few", g.addr)).await;
    assert_eq!(few.status, 200, "{}", String::from_utf8_lossy(&few.body));
    assert_eq!(few.json(), 500);
    let many = get(&format!("http://{}/many", g.addr)).await;
    assert_eq!(many.status, 503, "{}", String::from_utf8_lossy(&many.body));
    assert_eq!(many.code(), "memory_budget_exhausted");
    let msg = many.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("server.bodies.memory_budget_bytes: 2097152") && msg.contains("once parsed"),
        "{msg}"
    );
    let st = wait_status(g.addr, "the memory released", |st| {
        counter(st, &["bodies", "memory", "in_use_bytes"]) == 0
    })
    .await;
    assert!(counter(&st, &["bodies", "memory", "refused"]) >= 1, "{st}");
    let peak = counter(&st, &["bodies", "memory", "peak_bytes"]);
    assert!(
        peak > 0 && peak <= 2097152,
        "the small answer was held: {st}"
    );
    // The budget serves the next request.
    assert_eq!(get(&format!("http://{}/few", g.addr)).await.json(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_only_idle_connections_is_quick() {
    let s = stub_server(10).await;
    let g = gw(
        "  shutdown_grace: 30s
  connections: { first_byte_timeout: 60s, idle_timeout: 60s }",
        &s,
    )
    .await;
    let addr = g.addr;
    // Silent; a partial preface; an HTTP/1 keep-alive after one answer; a raw HTTP/2
    // connection that never answers PINGs; a pooled hyper HTTP/2 connection after one answer.
    let silent = TcpStream::connect(addr).await.unwrap();
    let mut partial = TcpStream::connect(addr).await.unwrap();
    partial.write_all(&PREFACE[..5]).await.unwrap();
    let mut h1 = TcpStream::connect(addr).await.unwrap();
    h1.write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut h1).await.0, 200);
    let raw_h2 = h2_connect(addr, &[]).await;
    let h2c = client(true);
    let r = send(&h2c, Method::GET, &format!("http://{addr}/small"), &[], "").await;
    assert_eq!(r.status, 200);
    wait_status(addr, "five idle connections", |st| {
        counter(st, &["connections", "open"]) >= 6
    })
    .await;
    let started = Instant::now();
    tokio::time::timeout(PATIENCE, g.shutdown())
        .await
        .expect("shutdown completes")
        .expect("shutdown without error");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "idle connections do not wait for the 30 s grace: {took:?}"
    );
    drop((silent, partial, h1, raw_h2, h2c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drops_what_is_still_in_flight_when_the_grace_runs_out() {
    // A backend that answers only after a minute: the request cannot finish within the grace.
    let s = stubs(
        r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - { path: /stuck, latency: 60s, body: '{ok: true}' }
"#,
    )
    .await;
    let g = gateway(
        r#"
server:
  shutdown_grace: 1s
backends:
  a: { url: "http://${A_ADDR}", dedup: false }
routes:
  - path: /stuck
    deadline: 120s
    coalesce: false
    flow:
      s: { http: { backend: a, path: '"/stuck"' }, timeout: 120s }
    respond: { body: '$s' }
"#,
        &s,
    )
    .await;
    let addr = g.addr;
    let mut h1 = TcpStream::connect(addr).await.unwrap();
    h1.write_all(b"GET /stuck HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    wait_status(addr, "the request in flight", |st| {
        counter(st, &["admission", "in_flight"]) == 1
    })
    .await;
    // Without the abort after the grace, shutdown would wait for the backend's minute.
    tokio::time::timeout(PATIENCE, g.shutdown())
        .await
        .expect("shutdown ends after its grace, not after the request")
        .expect("shutdown without error");
    let rest = tokio::time::timeout(PATIENCE, read_until_closed(&mut h1))
        .await
        .expect("the client's connection is closed");
    assert!(
        !String::from_utf8_lossy(&rest).contains("200 OK"),
        "no answer for a request dropped at the end of the grace"
    );
}

// --- HPACK: how an answer's header fields are represented ---

/// How an HPACK field is represented (RFC 7541 §6).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Indexed,
    WithIndexing,
    WithoutIndexing,
    NeverIndexed,
}

/// An HPACK integer with an `n`-bit prefix at `b[*i]` (RFC 7541 §5.1).
fn hpack_int(b: &[u8], i: &mut usize, n: u8) -> usize {
    let mask = (1usize << n) - 1;
    let mut v = b[*i] as usize & mask;
    *i += 1;
    if v == mask {
        let mut shift = 0;
        loop {
            let x = b[*i];
            *i += 1;
            v += ((x & 0x7f) as usize) << shift;
            shift += 7;
            if x & 0x80 == 0 {
                break;
            }
        }
    }
    v
}

/// An HPACK string literal: its bytes as sent and whether they are Huffman-coded.
fn hpack_str(b: &[u8], i: &mut usize) -> (Vec<u8>, bool) {
    let huffman = b[*i] & 0x80 != 0;
    let len = hpack_int(b, i, 7);
    let s = b[*i..*i + len].to_vec();
    *i += len;
    (s, huffman)
}

/// The fields of a header block: how each is represented and its value as sent (empty for an
/// indexed field).
fn hpack_fields(b: &[u8]) -> Vec<(Field, Vec<u8>, bool)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let first = b[i];
        let (kind, prefix) = if first & 0x80 != 0 {
            hpack_int(b, &mut i, 7);
            out.push((Field::Indexed, Vec::new(), false));
            continue;
        } else if first & 0xc0 == 0x40 {
            (Field::WithIndexing, 6)
        } else if first & 0xe0 == 0x20 {
            hpack_int(b, &mut i, 5); // a table size update
            continue;
        } else if first & 0xf0 == 0x10 {
            (Field::NeverIndexed, 4)
        } else {
            (Field::WithoutIndexing, 4)
        };
        if hpack_int(b, &mut i, prefix) == 0 {
            hpack_str(b, &mut i); // a literal name
        }
        let (value, huffman) = hpack_str(b, &mut i);
        out.push((kind, value, huffman));
    }
    out
}

/// `s` Huffman-coded as HPACK codes it (RFC 7541 Appendix B), for the few characters the ids
/// below use.
fn hpack_huffman(s: &str) -> Vec<u8> {
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u64, 0u32);
    for c in s.chars() {
        let (code, len) = match c {
            '0' => (0x0, 5),
            '1' => (0x1, 5),
            '2' => (0x2, 5),
            '@' => (0x1ffa, 13),
            _ => panic!("no code for {c:?} here"),
        };
        acc = acc << len | code;
        bits += len;
        while bits >= 8 {
            out.push((acc >> (bits - 8)) as u8);
            bits -= 8;
        }
    }
    if bits > 0 {
        // Padded with the most significant bits of EOS (all ones).
        out.push(((acc << (8 - bits)) as u8) | ((1u8 << (8 - bits)) - 1));
    }
    out
}

/// Every answer's request id is new: HTTP/2 answers send it as a literal HPACK never indexes,
/// so ids do not fill the connection's table (evicting the fields worth keeping) and the
/// encoder does not compare each answer against a growing list of stale ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_answers_send_their_request_id_unindexed() {
    let s = stub_server(10).await;
    let g = gw("  request_id_header: x-request-id", &s).await;
    let sock = h2_connect(g.addr, &[]).await;
    let (mut r, mut w) = sock.into_split();
    let ids = ["@@@@@@@@@@0", "@@@@@@@@@@1", "@@@@@@@@@@2"];
    for (n, id) in ids.iter().enumerate() {
        let stream = 1 + 2 * n as u32;
        // `GET /small` with the client's id: `x-request-id` as a literal without indexing.
        let mut block = vec![0x82, 0x86, 0x04, 6];
        block.extend_from_slice(b"/small");
        block.extend_from_slice(&[0x01, 1, b'x', 0x00, 12]);
        block.extend_from_slice(b"x-request-id");
        block.push(id.len() as u8);
        block.extend_from_slice(id.as_bytes());
        w.write_all(&frame(HEADERS, 0x1 | 0x4, stream, &block))
            .await
            .unwrap();
        let fields = tokio::time::timeout(PATIENCE, async {
            loop {
                let (kind, flags, on, payload) = read_frame(&mut r).await.expect("an answer");
                if kind == SETTINGS && flags & 1 == 0 {
                    w.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap();
                }
                if kind == HEADERS && on == stream {
                    assert_eq!(flags & 0x4, 0x4, "one HEADERS frame, no CONTINUATION");
                    // No PADDED or PRIORITY flag: the payload is the header block.
                    assert_eq!(flags & 0x28, 0);
                    return hpack_fields(&payload);
                }
            }
        })
        .await
        .expect("the answer's HEADERS");
        let coded = hpack_huffman(id);
        let sent: Vec<_> = fields
            .iter()
            .filter(|(_, v, huffman)| {
                if *huffman {
                    *v == coded
                } else {
                    v.as_slice() == id.as_bytes()
                }
            })
            .collect();
        assert_eq!(
            sent.len(),
            1,
            "answer {n}: the request id `{id}` once, as a literal: {fields:?}"
        );
        assert_eq!(sent[0].0, Field::NeverIndexed, "answer {n}: {fields:?}");
    }
    drop((r, w));
}
