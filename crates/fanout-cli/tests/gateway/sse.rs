//! Server-Sent Events through pass-through routes (docs/config.md#server-sent-events): each event
//! reaches the client before the backend sends the next (HTTP/1.1 and h2, both sides; never
//! compressed), heartbeats between events only that keep `pass.idle_timeout` from cutting a
//! quiet stream, the stream's own idle limit ending it cleanly, `Last-Event-ID` and `retry:`
//! carried, a client that leaves closing the backend's stream, shutdown ending streams at an
//! event boundary, the counters, and the access log line written when a stream ends.
//!
//! The backend is `fanout_testkit::sse::EventBackend` (each stream written by the test, piece by
//! piece, and told when the gateway closes it) or a `fanout stub` route with `sse:`; every wait
//! is bounded and conditions are waited for, never slept on.

use crate::support::gateway_with;
use bytes::Bytes;
use fanout_testkit::sse::{Block, EventBackend, EventReader};
use fanout_testkit::*;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use std::time::{Duration, Instant};

/// The stub the harness wants, with an event stream route of its own.
const STUBS: &str = r#"
services:
  ticks:
    listen: "127.0.0.1:0"
    routes:
      - path: /ticks
        sse:
          retry: 1500
          ids: true
          events:
            - {event: tick, data: "a"}
            - {data: "b\nsecond line"}
            - {data: "c", delay: 10ms}
      - path: /page
        headers: { content-type: text/html }
        raw_body: |
          <!doctype html><meta charset="utf-8"><title>events</title><body><script>
          window.got = []; window.errors = 0;
          const es = window.es = new EventSource("/events/live");
          es.onmessage = (e) => window.got.push({data: e.data, id: e.lastEventId});
          es.onerror = () => { window.errors += 1; };
          </script></body>
"#;

fn yaml(backend: &EventBackend, extra: &str) -> String {
    format!(
        r#"
compression: {{ response: {{ enabled: true, min_bytes: 16 }} }}
backends:
  events: {{ url: "{url}" }}
  events2: {{ url: "{url}", protocol: http2 }}
  ticks: {{ url: "http://${{TICKS_ADDR}}" }}
routes:
  - path: /events/{{*rest}}
    pass: {{ backend: events }}
  - path: /h2/{{*rest}}
    pass: {{ backend: events2, path: "/{{rest}}" }}
  - path: /quiet
    pass: {{ backend: events, idle_timeout: 500ms, sse: {{ heartbeat: 100ms }} }}
  - path: /mid
    pass: {{ backend: events, idle_timeout: 20s, sse: {{ heartbeat: 50ms }} }}
  - path: /idle
    pass: {{ backend: events, idle_timeout: 1s, sse: {{ heartbeat: 100ms, idle_timeout: 1s }} }}
  - path: /ticks
    pass: {{ backend: ticks }}
  - path: /page
    pass: {{ backend: ticks }}
  - path: /flow-sse
    flow: {{}}
    respond:
      body: '[range(0; 40) | "data: \(.)"] | join("\n")'
      headers: {{ content-type: '"text/event-stream"' }}
  - path: /small
    flow: {{}}
    respond: {{ body: '{{ok: true}}' }}
{extra}
"#,
        url = backend.url()
    )
}

async fn start(
    backend: &EventBackend,
    extra: &str,
) -> (fanout::RunningGateway, fanout_stub::StubServer) {
    let s = stubs(STUBS).await;
    let gw = gateway_with(&yaml(backend, extra), &s, &[]).await;
    (gw, s)
}

/// Open an event stream: `GET url` with `headers`; its head and a reader of its body.
async fn open(
    c: &TestClient,
    url: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, EventReader<Incoming>) {
    let mut b = Request::builder().method(Method::GET).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::new())).unwrap();
    let resp = tokio::time::timeout(PATIENCE, c.request(req))
        .await
        .expect("the stream's head within the test's patience")
        .expect("an answer");
    let (parts, body) = resp.into_parts();
    (parts.status, parts.headers, EventReader::new(body))
}

/// `sse` of the status endpoint, for the route `GET path`.
fn route_status(gw: &fanout::RunningGateway, path: &str) -> serde_json::Value {
    gw.gateway.status_json()["sse"]["routes"][format!("GET {path}")].clone()
}

fn lines(block: Block) -> String {
    match block {
        Block::Lines(l) => l,
        other => panic!("expected a block of lines, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_reaches_the_client_before_the_backend_sends_the_next_over_http1_and_h2() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend, "").await;
    let base = format!("http://{}", gw.addr);
    // Client HTTP/1.1 or h2 × backend HTTP/1.1 or h2.
    for (h2, path) in [
        (false, "/events/one"),
        (true, "/events/two"),
        (false, "/h2/three"),
        (true, "/h2/four"),
    ] {
        let c = client(h2);
        let (status, headers, mut reader) = open(
            &c,
            &format!("{base}{path}"),
            &[("accept-encoding", "gzip, br")],
        )
        .await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(
            headers["content-type"], "text/event-stream",
            "{path}: {headers:?}"
        );
        assert!(
            headers.get("content-encoding").is_none(),
            "{path}: never compressed"
        );
        let mut stream = backend.next_stream().await;
        // Lock-step: event N+1 is sent only once the client has event N.
        for i in 0..5 {
            stream.send(&format!("id: {i}\ndata: event {i} of {path}\n\n"));
            let got = lines(reader.next_event(&mut 0).await);
            assert_eq!(got, format!("id: {i}\ndata: event {i} of {path}"));
        }
        // An event sent in pieces arrives whole, in order.
        stream.send("data: split");
        stream.send(" in two\n");
        stream.send("\n");
        assert_eq!(lines(reader.next_event(&mut 0).await), "data: split in two");
        let route = match path.starts_with("/h2") {
            true => "/h2/{*rest}",
            false => "/events/{*rest}",
        };
        assert_eq!(route_status(&gw, route)["open"], 1, "{path}");
        stream.end();
        assert_eq!(reader.next().await, Block::End(String::new()), "{path}");
    }
    let st = gw.gateway.status_json()["sse"].clone();
    assert_eq!(st["events"], 24, "{st}");
    assert_eq!(st["open"], 0, "{st}");
    assert_eq!(st["ended"]["backend_ended"], 4, "{st}");
    assert_eq!(st["routes"]["GET /h2/{*rest}"]["events"], 12, "{st}");

    // /metrics has the same.
    let admin = gw.admin_addr.expect("the admin listener");
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    for line in [
        r#"fanout_sse_events_total{route="/events/{*rest}",method="GET"} 12"#,
        r#"fanout_sse_streams_ended_total{route="/h2/{*rest}",method="GET",cause="backend_ended"} 2"#,
        r#"fanout_sse_streams_open{route="/events/{*rest}",method="GET"} 0"#,
        r#"fanout_sse_heartbeats_total{route="/quiet",method="GET"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }

    // A flow's answer of type text/event-stream is never compressed either.
    let r = send(
        &client(false),
        Method::GET,
        &format!("{base}/flow-sse"),
        &[("accept-encoding", "gzip")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("content-encoding"), None);
    assert!(r.text().contains("data: 39"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_quiet_stream_open_and_go_only_between_events() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend, "").await;
    let base = format!("http://{}", gw.addr);
    let c = client(false);

    // /quiet: heartbeats every 100 ms, pass.idle_timeout 500 ms. Ten heartbeats is over a
    // second of backend silence, and the stream is still there.
    let (_, _, mut reader) = open(&c, &format!("{base}/quiet"), &[]).await;
    let stream = backend.next_stream().await;
    stream.send("data: a\n\n");
    assert_eq!(lines(reader.next().await), "data: a");
    for _ in 0..10 {
        assert_eq!(lines(reader.next().await), ": keep-alive");
    }
    stream.send("data: b\n\n");
    assert_eq!(lines(reader.next_event(&mut 0).await), "data: b");
    let st = route_status(&gw, "/quiet");
    assert!(st["heartbeats"].as_u64().unwrap() >= 10, "{st}");
    assert_eq!(st["open"], 1, "{st}");
    assert_eq!(st["events"], 2, "{st}");
    drop(reader);
    stream.closed("the backend's stream closed").await;

    // /mid: a stream stuck inside an event gets no heartbeat there, while another stream of
    // the route (between events) gets several meanwhile.
    let (_, _, mut a) = open(&c, &format!("{base}/mid"), &[]).await;
    let sa = backend.next_stream().await;
    let (_, _, mut b) = open(&client(false), &format!("{base}/mid"), &[]).await;
    let sb = backend.next_stream().await;
    sa.send("data: a\n\ndata: half\n");
    sb.send("data: b\n\n");
    assert_eq!(lines(a.next().await), "data: a");
    assert_eq!(lines(b.next().await), "data: b");
    for _ in 0..3 {
        assert_eq!(lines(b.next().await), ": keep-alive");
    }
    sa.send("data: rest\n\n");
    assert_eq!(
        lines(a.next().await),
        "data: half\ndata: rest",
        "nothing inside the event"
    );
    assert_eq!(
        lines(a.next().await),
        ": keep-alive",
        "and heartbeats after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_silent_for_the_idle_limit_ends_the_stream_cleanly_or_cuts_a_half_event() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend, "").await;
    let base = format!("http://{}", gw.addr);

    // Between events: the end is clean (the last chunk), after the heartbeats.
    let (_, _, mut reader) = open(&client(false), &format!("{base}/idle"), &[]).await;
    let stream = backend.next_stream().await;
    stream.send("data: a\n\n");
    let mut beats = 0;
    assert_eq!(lines(reader.next_event(&mut beats).await), "data: a");
    assert_eq!(
        reader.next_event(&mut beats).await,
        Block::End(String::new())
    );
    stream.closed("the backend's stream closed").await;
    let st = route_status(&gw, "/idle");
    assert_eq!(st["ended"]["idle"], 1, "{st}");
    assert_eq!(st["heartbeats"].as_u64().unwrap(), beats, "{st}");

    // Inside an event: the answer is cut (the client never takes half an event for a whole one).
    let (_, _, mut reader) = open(&client(true), &format!("{base}/idle"), &[]).await;
    let stream = backend.next_stream().await;
    stream.send("data: half\n");
    assert!(
        matches!(reader.next().await, Block::Cut(_)),
        "{:?}",
        reader.raw
    );
    stream.closed("the backend's stream closed").await;
    let st = route_status(&gw, "/idle");
    assert_eq!(st["ended"]["idle"], 2, "{st}");
    assert_eq!(st["open"], 0, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_closes_the_backends_stream() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend, "").await;
    let base = format!("http://{}", gw.addr);
    for (h2, path) in [(false, "/events/x"), (true, "/events/y"), (true, "/h2/z")] {
        let c = client(h2);
        let (_, _, mut reader) = open(&c, &format!("{base}{path}"), &[]).await;
        let stream = backend.next_stream().await;
        stream.send("data: first\n\n");
        assert_eq!(lines(reader.next().await), "data: first");
        assert!(!stream.is_closed());
        // The client goes: its connection closes (HTTP/1.1) or its stream is reset (h2).
        drop(reader);
        drop(c);
        stream
            .closed(&format!("{path}: the backend sees its stream closed"))
            .await;
    }
    let st = gw.gateway.status_json()["sse"].clone();
    assert_eq!(st["ended"]["client_left"], 3, "{st}");
    assert_eq!(st["open"], 0, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_reaches_the_backend_and_retry_the_client() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend, "").await;
    let base = format!("http://{}", gw.addr);

    // The hand-written backend: the header as the client sent it; `retry:` as the backend sent it.
    let (_, _, mut reader) = open(
        &client(false),
        &format!("{base}/events/resume"),
        &[("last-event-id", "41"), ("accept", "text/event-stream")],
    )
    .await;
    let mut stream = backend.next_stream().await;
    assert_eq!(stream.header("last-event-id"), Some("41"));
    assert_eq!(stream.header("accept"), Some("text/event-stream"));
    stream.send("retry: 2500\nid: 42\ndata: x\n\n");
    assert_eq!(lines(reader.next().await), "retry: 2500\nid: 42\ndata: x");
    stream.end();
    assert_eq!(reader.next().await, Block::End(String::new()));

    // A `fanout stub` event stream (`ids: true`) resumes after the client's Last-Event-ID.
    let (_, headers, mut first) = open(&client(false), &format!("{base}/ticks"), &[]).await;
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(lines(first.next().await), "retry: 1500");
    assert_eq!(lines(first.next().await), "id: 1\nevent: tick\ndata: a");
    assert_eq!(
        lines(first.next().await),
        "id: 2\ndata: b\ndata: second line"
    );
    assert_eq!(lines(first.next().await), "id: 3\ndata: c");
    assert_eq!(first.next().await, Block::End(String::new()));
    // A reconnection (over h2 this time) with the last id seen.
    let (_, _, mut again) = open(
        &client(true),
        &format!("{base}/ticks"),
        &[("last-event-id", "2")],
    )
    .await;
    assert_eq!(lines(again.next().await), "retry: 1500");
    assert_eq!(lines(again.next().await), "id: 3\ndata: c");
    assert_eq!(again.next().await, Block::End(String::new()));
    let st = route_status(&gw, "/ticks");
    assert_eq!(st["events"], 4, "{st}");
    assert_eq!(st["ended"]["backend_ended"], 2, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_at_an_event_boundary_and_refuses_new_requests() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend, "server: { shutdown_grace: 30s }").await;
    let base = format!("http://{}", gw.addr);
    let gateway = gw.gateway.clone();
    let addr = gw.addr;
    let mut open_streams = Vec::new();
    for (h2, path) in [(false, "/events/a"), (true, "/events/b")] {
        let (_, _, mut reader) = open(&client(h2), &format!("{base}{path}"), &[]).await;
        let stream = backend.next_stream().await;
        stream.send("data: before\n\n");
        assert_eq!(lines(reader.next().await), "data: before");
        // Inside the next event when the shutdown starts (its first line has reached the
        // client, so the gateway saw it).
        stream.send("data: a\n");
        assert!(reader.read_until("data: a\n").await);
        open_streams.push((reader, stream));
    }
    let stopping = tokio::spawn(gw.shutdown());
    // New connections are refused once the listener closed.
    wait_until_async("the listener closed", || async move {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    for (reader, stream) in &mut open_streams {
        // The event under way is finished, then the stream ends cleanly at its boundary.
        stream.send("data: b\n\n");
        assert_eq!(lines(reader.next().await), "data: a\ndata: b");
        assert_eq!(reader.next().await, Block::End(String::new()));
        stream.closed("the backend's stream closed").await;
    }
    tokio::time::timeout(PATIENCE, stopping)
        .await
        .expect("the gateway stops once its streams ended")
        .unwrap()
        .unwrap();
    let st = gateway.status_json();
    assert_eq!(st["sse"]["ended"]["drain"], 2, "{}", st["sse"]);
    assert_eq!(st["sse"]["open"], 0);
    assert_eq!(
        st["connections"]["closed_at_shutdown"], 0,
        "nothing was cut at the end of the grace: {}",
        st["connections"]
    );
}

fn log_file(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("fanout-sse-{name}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn log_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answers_access_log_line_is_written_when_it_ends_with_the_bytes_sent() {
    let backend = EventBackend::start().await;
    let path = log_file("access");
    let extra = format!(
        "telemetry: {{ access_log: {{ enabled: true, output: \"{}\" }} }}",
        path.display()
    );
    let (gw, _s) = start(&backend, &extra).await;
    let base = format!("http://{}", gw.addr);
    let line_of = |id: &str| log_lines(&path).into_iter().find(|l| l["request_id"] == id);

    let (_, _, mut reader) = open(
        &client(false),
        &format!("{base}/events/logged"),
        &[("x-request-id", "sse-logged")],
    )
    .await;
    let mut stream = backend.next_stream().await;
    stream.send("data: one\n\n");
    assert_eq!(lines(reader.next().await), "data: one");
    // A request after it is logged (one writer, in order) while the stream's line is not.
    let r = send(
        &client(false),
        Method::GET,
        &format!("{base}/small"),
        &[("x-request-id", "sse-after")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    wait_until("the later request's line", || {
        line_of("sse-after").is_some()
    })
    .await;
    assert!(
        line_of("sse-logged").is_none(),
        "not before the stream ends"
    );

    stream.send("data: two\n\ndata: three\n\n");
    assert_eq!(lines(reader.next().await), "data: two");
    assert_eq!(lines(reader.next().await), "data: three");
    stream.end();
    assert_eq!(reader.next().await, Block::End(String::new()));
    let l = wait_for("the stream's line", PATIENCE, || line_of("sse-logged")).await;
    assert_eq!(l["status"], 200);
    assert_eq!(l["route"], "/events/{*rest}");
    assert_eq!(
        l["bytes_out"].as_u64().unwrap(),
        reader.raw.len() as u64,
        "{l}"
    );
    assert!(l["duration_ms"].as_f64().unwrap() > 0.0, "{l}");

    // A client that leaves: the bytes it was sent.
    let (_, _, mut reader) = open(
        &client(true),
        &format!("{base}/events/left"),
        &[("x-request-id", "sse-left")],
    )
    .await;
    let stream = backend.next_stream().await;
    stream.send("data: only\n\n");
    assert_eq!(lines(reader.next().await), "data: only");
    drop(reader);
    let l = wait_for("the line of the stream the client left", PATIENCE, || {
        line_of("sse-left")
    })
    .await;
    assert_eq!(l["bytes_out"], "data: only\n\n".len(), "{l}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_event_stream_settings_are_checked_at_load() {
    let load = |sse: &str| {
        let yaml = format!(
            "backends:\n  b: {{ url: \"http://127.0.0.1:1\" }}\nroutes:\n  - path: /e\n    pass: {{ backend: b, idle_timeout: 10s, sse: {sse} }}\n"
        );
        match fanout::load_gateway("fanout.yaml", &yaml, &|_| None) {
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        }
    };
    let e = load("{ heartbeat: 10s, idle_timeout: 0s }").expect("refused");
    assert!(
        e.contains("`pass.sse.heartbeat` (10s) must be shorter than `pass.idle_timeout` (10s)"),
        "{e}"
    );
    assert!(
        e.contains("`pass.sse.idle_timeout` must be positive"),
        "{e}"
    );
    assert!(e.contains("fanout.yaml:5:"), "at the route: {e}");
    let e = load("{ hearbeat: 1s }").expect("refused");
    assert!(
        e.contains("heartbeat"),
        "an unknown field, with the one meant: {e}"
    );
    // Without `heartbeat`: half of a short idle_timeout; `0s`: none.
    assert_eq!(load("{ heartbeat: 0s }"), None);
    assert_eq!(load("{ idle_timeout: 1m }"), None);
}

#[test]
fn explain_says_how_a_pass_route_carries_event_streams() {
    let dir = TempDir::new("sse-explain");
    let file = dir.write(
        "fanout.yaml",
        r#"
backends:
  events: { url: "http://127.0.0.1:1" }
routes:
  - path: /events
    pass: { backend: events, idle_timeout: 10s, sse: { idle_timeout: 2m } }
"#,
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["explain", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("event streams: heartbeat 5s, ended after 2m without a byte"),
        "{text}"
    );
}

/// A browser's `EventSource` through the gateway: each event arrives (lock-step: the next is sent
/// once the page has the last), and after the backend restarts the browser reconnects by itself
/// with the last id it saw in `Last-Event-ID`, and the stream goes on. The time from each send to
/// the page having the event is printed (polled every 50 ms: an upper bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs Chromium and chromedriver"]
async fn in_chromium_an_event_source_gets_each_event_and_resumes_after_a_backend_restart() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend, "").await;
    let browser = crate::ui::Browser::start().await;
    browser.open(&format!("http://{}/page", gw.addr)).await;
    let limit = Duration::from_secs(20);
    let stream = backend.next_stream().await;
    assert_eq!(stream.header("accept"), Some("text/event-stream"));
    assert_eq!(stream.header("last-event-id"), None, "a first connection");
    stream.send("retry: 1000\n\n");
    for i in 1..=3 {
        stream.send(&format!("id: {i}\ndata: event {i}\n\n"));
        let (_, took) = browser
            .wait_js(
                &format!("event {i} in the page"),
                limit,
                &format!("return window.got.length >= {i} ? window.got : null"),
            )
            .await;
        println!("event {i}: in the page within {took:?} of its send");
    }
    let got = browser.js("return window.got").await;
    assert_eq!(got[2]["data"], "event 3");
    assert_eq!(got[2]["id"], "3");

    // The backend restarts on the same port: its connections break, the gateway cuts the
    // stream, and the browser reconnects after `retry`.
    let addr = backend.addr();
    drop(backend);
    let listener = wait_for_async("the backend's port again", PATIENCE, || async move {
        tokio::net::TcpListener::bind(addr).await.ok()
    })
    .await;
    let backend = EventBackend::serve(listener);
    let again = backend.next_stream().await;
    assert_eq!(
        again.header("last-event-id"),
        Some("3"),
        "resumed after the last id"
    );
    assert!(
        stream.is_closed(),
        "the first stream went with the old backend"
    );
    again.send("id: 4\ndata: event 4\n\n");
    browser
        .wait_js(
            "event 4 after the restart",
            limit,
            "return window.got.length >= 4 ? window.got : null",
        )
        .await;
    let got = browser.js("return window.got").await;
    assert_eq!(got[3]["data"], "event 4");
    assert!(browser.js("return window.errors").await.as_u64().unwrap() >= 1);
    // The page closes its EventSource: the backend sees its stream closed (the time is
    // printed for docs/benchmarks.md, not asserted).
    let closing = Instant::now();
    browser.js("window.es.close(); return true").await;
    again
        .closed("the backend sees the page's stream closed")
        .await;
    println!(
        "the page closed its EventSource: the backend saw its stream closed {:?} later",
        closing.elapsed()
    );
    let st = route_status(&gw, "/events/{*rest}");
    assert_eq!(
        st["ended"]["error"], 1,
        "the restart cut the first stream: {st}"
    );
    browser.close().await;
}
