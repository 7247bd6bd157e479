//! Streamed answers (`stream:` on a flow route; docs/config.md#streamed-answers): each
//! `for_each` element reaches the client as an event as soon as its call completes — while the
//! slower elements' backends are still held by the test —, in completion order; an element that
//! fails is an `error` event and the stream goes on; the route's answer is the last event; a
//! client that leaves closes the calls in flight; the deadline ends the stream with an `error`
//! event; NDJSON carries the same events a line each. A merged answer (`stream.merge`) passes
//! each source's events as they arrive, tagged with the source, and ends when the sources have.
//!
//! The backend is `fanout_testkit::sse::EventBackend`: each call's answer is written and ended
//! by the test, so the order of completions is the test's, never a timer's.

use crate::support::gateway_with;
use bytes::Bytes;
use fanout_testkit::sse::{Block, EventBackend, EventReader, Stream};
use fanout_testkit::*;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;

fn yaml(backend: &EventBackend) -> String {
    format!(
        r#"
backends:
  items: {{ url: "{url}" }}
routes:
  - path: /search
    stream: {{ format: sse, steps: [items] }}
    flow:
      items:
        for_each: '["a", "b", "c"]'
        http: {{ backend: items, path: '"/item/\($item)"' }}
    respond: {{ body: '{{count: ($items | length), ids: [$items[].id]}}' }}
  - path: /lines
    stream: {{ format: ndjson }}
    flow:
      user:
        http: {{ backend: items, path: '"/user"' }}
      orders:
        http: {{ backend: items, path: '"/orders"' }}
    respond: {{ body: '{{user: $user.id, orders: $orders.n}}' }}
  - path: /slow
    deadline: 300ms
    stream: {{}}
    flow:
      items:
        for_each: '["x", "y"]'
        timeout: 10s
        http: {{ backend: items, path: '"/slow/\($item)"' }}
    respond: {{ body: '$items' }}
  - path: /few
    stream: {{ max_events: 1 }}
    flow:
      items:
        for_each: '["p", "q"]'
        http: {{ backend: items, path: '"/few/\($item)"' }}
    respond: {{ body: '$items' }}
  - path: /merged
    stream:
      merge:
        sources:
          left: {{ backend: items, path: /left }}
          right: {{ backend: items, path: /right }}
    respond: {{ body: '"done"' }}
  - path: /first
    stream:
      format: ndjson
      merge:
        end: first
        sources:
          left: {{ backend: items, path: /left }}
          right: {{ backend: items, path: /right }}
    respond: {{ body: '"done"' }}
"#,
        url = backend.url()
    )
}

async fn start(backend: &EventBackend) -> (fanout::RunningGateway, fanout_stub::StubServer) {
    let s = stubs(
        r#"
services:
  idle:
    listen: "127.0.0.1:0"
    routes: [{path: /x, body: "1"}]
"#,
    )
    .await;
    let gw = gateway_with(&yaml(backend), &s, &[]).await;
    (gw, s)
}

/// Open `GET url`: its status, content type and a reader of its body.
async fn open(c: &TestClient, url: &str) -> (StatusCode, String, EventReader<Incoming>) {
    let req = Request::builder()
        .method(Method::GET)
        .uri(url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(PATIENCE, c.request(req))
        .await
        .expect("the stream's head within the test's patience")
        .expect("an answer");
    let (parts, body) = resp.into_parts();
    let ct = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (parts.status, ct, EventReader::new(body))
}

/// The `n` calls the flow made, by path.
async fn calls(backend: &EventBackend, n: usize) -> Vec<Stream> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(backend.next_stream().await);
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Answer a held call with `body` and end it.
fn answer(s: &mut Stream, body: &str) {
    s.send(body);
    s.end();
}

fn event(reader_block: Block) -> String {
    match reader_block {
        Block::Lines(l) => l,
        other => panic!("expected an event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_element_is_sent_as_it_completes_while_slower_ones_are_held() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend).await;
    for h2 in [false, true] {
        let c = client(h2);
        let (status, ct, mut reader) = open(&c, &format!("http://{}/search", gw.addr)).await;
        assert_eq!(status, 200);
        assert_eq!(ct, "text/event-stream");
        let mut held = calls(&backend, 3).await;
        assert_eq!(held[0].path, "/item/a");
        // The last element completes first: its event comes while a and b are still held.
        answer(&mut held[2], r#"{"id": "c"}"#);
        assert_eq!(
            event(reader.next_event(&mut 0).await),
            "event: items\nid: 2\ndata: {\"id\":\"c\"}"
        );
        assert!(!held[0].is_closed() && !held[1].is_closed(), "a and b held");
        answer(&mut held[0], r#"{"id": "a"}"#);
        assert_eq!(
            event(reader.next_event(&mut 0).await),
            "event: items\nid: 0\ndata: {\"id\":\"a\"}"
        );
        // An element whose answer is not JSON: an error event with the contract's error
        // object, and the stream goes on to its end.
        answer(&mut held[1], "not json");
        let e = event(reader.next_event(&mut 0).await);
        let (head, data) = e.split_once("\ndata: ").expect("an error event with data");
        assert_eq!(head, "event: error\nid: 1");
        let data: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["error"]["code"], "bad_backend_answer", "{data}");
        assert_eq!(data["error"]["step"], "items", "{data}");
        assert_eq!(data["error"]["index"], 1, "{data}");
        let end = event(reader.next_event(&mut 0).await);
        let (head, data) = end.split_once("\ndata: ").expect("the end event");
        assert_eq!(head, "event: end");
        let data: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["count"], 2, "{data}");
        assert_eq!(data["ids"], serde_json::json!(["a", "c"]), "{data}");
        assert_eq!(data["_partial"], serde_json::json!(["items"]), "{data}");
        assert_eq!(reader.next().await, Block::End(String::new()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_sends_each_step_as_a_line_when_it_completes() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend).await;
    let c = client(false);
    let (status, ct, mut reader) = open(&c, &format!("http://{}/lines", gw.addr)).await;
    assert_eq!(status, 200);
    assert_eq!(ct, "application/x-ndjson");
    let mut held = calls(&backend, 2).await;
    assert_eq!(held[1].path, "/user");
    answer(&mut held[1], r#"{"id": 7}"#);
    assert!(reader.read_until("\n").await);
    assert_eq!(reader.raw, "{\"event\":\"user\",\"data\":{\"id\":7}}\n");
    assert!(!held[0].is_closed(), "orders held while user's line is out");
    answer(&mut held[0], r#"{"n": 3}"#);
    assert!(reader.read_until("\"end\"").await);
    assert!(reader.read_until("}}\n").await);
    let lines: Vec<serde_json::Value> = reader
        .raw
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        vec![
            serde_json::json!({"event": "user", "data": {"id": 7}}),
            serde_json::json!({"event": "orders", "data": {"n": 3}}),
            serde_json::json!({"event": "end", "data": {"user": 7, "orders": 3}}),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_closes_the_calls_in_flight() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend).await;
    let c = client(false);
    let (_, _, mut reader) = open(&c, &format!("http://{}/search", gw.addr)).await;
    let mut held = calls(&backend, 3).await;
    answer(&mut held[0], r#"{"id": "a"}"#);
    assert!(event(reader.next_event(&mut 0).await).starts_with("event: items\nid: 0"));
    drop(reader);
    drop(c);
    held[1].closed("b's call closed when the client left").await;
    held[2].closed("c's call closed when the client left").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_ends_the_stream_with_an_error_event() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend).await;
    let c = client(false);
    let (_, _, mut reader) = open(&c, &format!("http://{}/slow", gw.addr)).await;
    let mut held = calls(&backend, 2).await;
    answer(&mut held[0], r#"{"id": "x"}"#);
    assert!(event(reader.next_event(&mut 0).await).starts_with("event: items\nid: 0"));
    // y is never answered: the route's deadline ends the stream — y's call, timed by the time
    // left, fails as an `error` event (or the run's deadline does, whichever the scheduler sees
    // first), and the stream ends.
    let mut rest = Vec::new();
    loop {
        match reader.next_event(&mut 0).await {
            Block::Lines(l) => rest.push(l),
            Block::End(tail) => {
                assert_eq!(tail, "");
                break;
            }
            cut => panic!("the stream ends cleanly, got {cut:?}"),
        }
    }
    let errors: Vec<serde_json::Value> = rest
        .iter()
        .filter(|e| e.starts_with("event: error"))
        .map(|e| serde_json::from_str(e.split_once("\ndata: ").unwrap().1).unwrap())
        .collect();
    assert!(
        errors.iter().any(|d| {
            let code = d["error"]["code"].as_str().unwrap_or("");
            code == "deadline_exceeded" || code == "backend_timeout"
        }),
        "{rest:?}"
    );
    assert!(rest.iter().all(|e| !e.contains("\"y\"")), "{rest:?}");
    held[1].closed("y's call closed at the deadline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_events_ends_the_stream_with_too_many_events() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend).await;
    let c = client(false);
    let (_, _, mut reader) = open(&c, &format!("http://{}/few", gw.addr)).await;
    let mut held = calls(&backend, 2).await;
    answer(&mut held[0], "1");
    assert_eq!(
        event(reader.next_event(&mut 0).await),
        "event: items\nid: 0\ndata: 1"
    );
    answer(&mut held[1], "2");
    let e = event(reader.next_event(&mut 0).await);
    assert!(e.starts_with("event: error\ndata: "), "{e}");
    assert!(e.contains("\"too_many_events\""), "{e}");
    assert_eq!(reader.next().await, Block::End(String::new()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_sources_are_interleaved_as_they_send_and_end_when_all_have() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend).await;
    let c = client(true);
    let (status, ct, mut reader) = open(&c, &format!("http://{}/merged", gw.addr)).await;
    assert_eq!((status.as_u16(), ct.as_str()), (200, "text/event-stream"));
    let mut held = calls(&backend, 2).await;
    assert_eq!(
        (held[0].path.as_str(), held[1].path.as_str()),
        ("/left", "/right")
    );
    held[1].send("data: r1\n\n");
    assert_eq!(
        event(reader.next_event(&mut 0).await),
        "event: right\ndata: r1"
    );
    held[0].send("id: 5\ndata: {\"x\": 1}\n");
    held[0].send("\n");
    assert_eq!(
        event(reader.next_event(&mut 0).await),
        "event: left\nid: 5\ndata: {\"x\": 1}"
    );
    held[1].send(": a comment\n\ndata: two\ndata: lines\n\n");
    assert_eq!(
        event(reader.next_event(&mut 0).await),
        "event: right\ndata: two\ndata: lines"
    );
    held[1].end();
    held[0].send("data: l2\n\n");
    assert_eq!(
        event(reader.next_event(&mut 0).await),
        "event: left\ndata: l2"
    );
    held[0].end();
    assert_eq!(
        event(reader.next_event(&mut 0).await),
        "event: end\ndata: \"done\""
    );
    assert_eq!(reader.next().await, Block::End(String::new()));

    // A client that leaves closes every source.
    let (_, _, reader) = open(&c, &format!("http://{}/merged", gw.addr)).await;
    let held = calls(&backend, 2).await;
    drop(reader);
    held[0].closed("left closed when the client left").await;
    held[1].closed("right closed when the client left").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_that_ends_with_the_first_source_closes_the_others() {
    let backend = EventBackend::start().await;
    let (gw, _s) = start(&backend).await;
    let c = client(false);
    let (_, ct, mut reader) = open(&c, &format!("http://{}/first", gw.addr)).await;
    assert_eq!(ct, "application/x-ndjson");
    let mut held = calls(&backend, 2).await;
    held[0].send("data: {\"n\": 1}\n\n");
    assert!(reader.read_until("\n").await);
    assert_eq!(reader.raw, "{\"event\":\"left\",\"data\":{\"n\": 1}}\n");
    held[0].end();
    assert!(reader.read_until("\"end\"").await);
    assert!(
        reader
            .raw
            .ends_with("{\"event\":\"end\",\"data\":\"done\"}\n"),
        "{}",
        reader.raw
    );
    held[1].closed("right closed once left ended").await;
}

/// `fanout stub`'s WebSocket routes, through a gateway's WebSocket route: scripted messages then
/// a close with the route's code, and an echo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stub_websocket_routes_send_their_script_then_close_or_echo() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let s = stubs(
        r#"
services:
  sockets:
    listen: "127.0.0.1:0"
    routes:
      - path: /script
        websocket:
          messages: [{text: hello}, {text: world, delay: 20ms}]
          close: {code: 4001, reason: bye}
      - path: /echo
        websocket: {messages: [{text: ready}]}
"#,
    )
    .await;
    let yaml = r#"
backends:
  sockets: { url: "http://${SOCKETS_ADDR}" }
routes:
  - path: /script
    websocket: { backend: sockets }
  - path: /echo
    websocket: { backend: sockets }
"#;
    let gw = gateway_with(yaml, &s, &[]).await;
    let open = |path: &str| {
        let url = format!("ws://{}{path}", gw.addr);
        let addr = gw.addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (ws, _) = tokio::time::timeout(PATIENCE, tokio_tungstenite::client_async(url, tcp))
                .await
                .expect("the handshake within the test's patience")
                .expect("a WebSocket");
            ws
        }
    };
    let mut ws = open("/script").await;
    let mut got = Vec::new();
    loop {
        let m = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a message within the test's patience");
        match m {
            Some(Ok(Message::Text(t))) => got.push(t.to_string()),
            Some(Ok(Message::Close(Some(c)))) => {
                assert_eq!((u16::from(c.code), c.reason.as_str()), (4001, "bye"));
                break;
            }
            other => panic!("expected the script, got {other:?}"),
        }
    }
    assert_eq!(got, ["hello", "world"]);

    let mut ws = open("/echo").await;
    macro_rules! next {
        ($ws:expr) => {
            match tokio::time::timeout(PATIENCE, $ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
                other => panic!("expected a text message, got {other:?}"),
            }
        };
    }
    assert_eq!(next!(ws), "ready");
    ws.send(Message::text("ping 1")).await.unwrap();
    assert_eq!(next!(ws), "ping 1");
    ws.send(Message::text("ping 2")).await.unwrap();
    assert_eq!(next!(ws), "ping 2");
    ws.close(None).await.unwrap();
}
