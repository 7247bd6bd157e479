//! WebSocket routes (docs/config.md#websocket-routes): a client's WebSocket relayed to one
//! backend — messages both ways (text, binary, fragmented, ping/pong, close codes and reasons),
//! subprotocols and the handshake's headers by the pass-through rules, over HTTP/1.1 `Upgrade`
//! and HTTP/2 extended CONNECT; the handshake through the edge stages and the `Origin` list;
//! message size, idle and ping limits, protocol faults; connection caps; the drain's 1001 (in process and on
//! SIGTERM); cancellation both ways; 502 before any upgrade when the backend cannot take it;
//! the counters on `/__fanout/status` and `/metrics`.
//!
//! The backend is a tokio-tungstenite server started here, recording what it saw; the clients
//! are tokio-tungstenite's (hyper's HTTP/2 client for extended CONNECT), every wait bounded.

use crate::support::{ServeProcess, gateway, gateway_with};
use bytes::Bytes;
use fanout_testkit::*;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Method, StatusCode};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{
    Request as WsRequest, Response as WsResponse,
};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// Every wait of a test ends within this (a hung exchange fails the test; it measures nothing).
const LIMIT: Duration = Duration::from_secs(30);

/// The stub the harness wants; it also plays a backend that answers a handshake with 200.
const STUBS: &str = r#"
services:
  plain:
    listen: "127.0.0.1:0"
    routes:
      - path: /
        body: '{}'
"#;

/// What the backend saw, over all its connections.
#[derive(Default, Debug)]
struct Seen {
    /// Each handshake's path and query, and its headers.
    handshakes: Vec<(String, HeaderMap)>,
    /// Every message read (data, pings, pongs, closes), in order.
    messages: Vec<Message>,
}

/// A WebSocket backend: echoes data messages; `close-me` makes it close with 4000 `bye`,
/// `vanish` makes it drop the connection without a close frame, `ping-me` makes it ping,
/// `big-please` makes it send 4 KiB. It picks the subprotocol `chat` when offered.
struct Backend {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    open: Arc<AtomicUsize>,
}

impl Backend {
    async fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let open = Arc::new(AtomicUsize::new(0));
        let (s, o) = (seen.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (seen, open) = (s.clone(), o.clone());
                tokio::spawn(async move {
                    let s2 = seen.clone();
                    #[allow(clippy::result_large_err)] // tungstenite's callback type
                    let pick = move |req: &WsRequest, mut resp: WsResponse| {
                        let path = req.uri().path_and_query().map(|p| p.to_string()).unwrap();
                        s2.lock()
                            .unwrap()
                            .handshakes
                            .push((path, req.headers().clone()));
                        let offered = req
                            .headers()
                            .get("sec-websocket-protocol")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("");
                        if offered.split(',').any(|p| p.trim() == "chat") {
                            resp.headers_mut()
                                .insert("sec-websocket-protocol", "chat".parse().unwrap());
                        }
                        resp.headers_mut()
                            .insert("x-backend", "ws-backend".parse().unwrap());
                        Ok(resp)
                    };
                    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, pick).await else {
                        return;
                    };
                    open.fetch_add(1, Ordering::SeqCst);
                    while let Some(Ok(m)) = ws.next().await {
                        seen.lock().unwrap().messages.push(m.clone());
                        let reply = match &m {
                            Message::Text(t) if t.as_str() == "close-me" => {
                                Some(Message::Close(Some(CloseFrame {
                                    code: CloseCode::from(4000),
                                    reason: "bye".into(),
                                })))
                            }
                            Message::Text(t) if t.as_str() == "vanish" => break,
                            Message::Text(t) if t.as_str() == "ping-me" => {
                                Some(Message::Ping(Bytes::from_static(b"from-backend")))
                            }
                            Message::Text(t) if t.as_str() == "big-please" => {
                                Some(Message::Binary(vec![7u8; 4096].into()))
                            }
                            Message::Text(_) | Message::Binary(_) => Some(m.clone()),
                            _ => None,
                        };
                        if let Some(r) = reply
                            && ws.send(r).await.is_err()
                        {
                            break;
                        }
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Backend { addr, seen, open }
    }

    fn messages(&self) -> Vec<Message> {
        self.seen.lock().unwrap().messages.clone()
    }

    fn handshake(&self, i: usize) -> (String, HeaderMap) {
        self.seen.lock().unwrap().handshakes[i].clone()
    }

    /// The close frames it received (code, reason).
    fn closes(&self) -> Vec<(u16, String)> {
        self.messages()
            .into_iter()
            .filter_map(|m| match m {
                Message::Close(Some(f)) => Some((u16::from(f.code), f.reason.to_string())),
                _ => None,
            })
            .collect()
    }
}

type Client = WebSocketStream<TcpStream>;

/// Open a WebSocket on `path` through the gateway at `addr` with `headers` added.
async fn open(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(Client, HeaderMap), WsError> {
    let mut req = format!("ws://{addr}{path}").into_client_request()?;
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let tcp = TcpStream::connect(addr).await.map_err(WsError::Io)?;
    let (ws, resp) = tokio::time::timeout(LIMIT, tokio_tungstenite::client_async(req, tcp))
        .await
        .expect("handshake answered in time")?;
    Ok((ws, resp.headers().clone()))
}

/// A handshake the gateway refuses: its status and JSON body.
async fn refused(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, serde_json::Value) {
    match open(addr, path, headers).await {
        Err(WsError::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            let json = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&body)));
            (resp.status(), json)
        }
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, the handshake went through"),
    }
}

/// The next message, bounded.
async fn next<S>(ws: &mut WebSocketStream<S>) -> Message
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tokio::time::timeout(LIMIT, ws.next())
        .await
        .expect("a message in time")
        .expect("the stream is open")
        .expect("a message")
}

/// The next data message or close (pings and pongs skipped), bounded.
async fn next_data<S>(ws: &mut WebSocketStream<S>) -> Message
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match next(ws).await {
            Message::Ping(_) | Message::Pong(_) => continue,
            m => return m,
        }
    }
}

/// The close frame the client gets next (data skipped), as (code, reason); then the client
/// reads on (its codec sends the close's answer) until the gateway ends the connection.
async fn close_of(ws: &mut Client) -> (u16, String) {
    let got = loop {
        match next(ws).await {
            Message::Close(Some(f)) => break (u16::from(f.code), f.reason.to_string()),
            Message::Close(None) => break (1005, String::new()),
            _ => continue,
        }
    };
    let ended =
        tokio::time::timeout(LIMIT, async { while let Some(Ok(_)) = ws.next().await {} }).await;
    assert!(
        ended.is_ok(),
        "the gateway ends the connection after the close handshake"
    );
    got
}

fn text(s: &str) -> Message {
    Message::Text(s.into())
}

/// The gateway's config: `/chat/{room}` relayed to the backend at `/echo/{room}` with `limits`
/// (extra `websocket` fields), and `more` (other routes, YAML).
fn config(backend: SocketAddr, limits: &str, more: &str) -> String {
    format!(
        r#"
backends:
  ws: {{ url: "http://{backend}" }}
  plain: {{ url: "http://${{PLAIN_ADDR}}" }}
routes:
  - path: /chat/{{room}}
    websocket:
      backend: ws
      path: /echo/{{room}}
      origins: ["https://app.example"]
      {limits}
{more}
"#
    )
}

fn ws_status(gw: &fanout::RunningGateway) -> serde_json::Value {
    gw.gateway.status_json()["websockets"].clone()
}

async fn wait_closed(gw: &fanout::RunningGateway, backend: &Backend) {
    wait_until(
        "every WebSocket closed at the gateway and the backend",
        || ws_status(gw)["open"] == 0 && backend.open.load(Ordering::SeqCst) == 0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_pass_both_ways_with_the_handshake_by_the_pass_through_rules() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let gw = gateway(&config(backend.addr, "ping_interval: 0s", ""), &stubs).await;
    let (mut ws, head) = open(
        gw.addr,
        "/chat/r%201?x=1",
        &[
            ("origin", "https://app.example"),
            ("sec-websocket-protocol", "superchat, chat"),
            ("sec-websocket-extensions", "permessage-deflate"),
            ("connection", "Upgrade, x-hop"),
            ("x-hop", "secret"),
            ("x-app", "kept"),
            ("x-request-id", "ws-handshake-1"),
        ],
    )
    .await
    .unwrap();
    // The backend's answer reaches the client: its subprotocol and its own fields.
    assert_eq!(head["sec-websocket-protocol"], "chat");
    assert_eq!(head["x-backend"], "ws-backend");
    assert_eq!(head["x-request-id"], "ws-handshake-1");
    assert!(head["via"].to_str().unwrap().contains("fanout"));
    assert!(!head.contains_key("sec-websocket-extensions"));

    // Text, binary, a fragmented message, each echoed whole.
    ws.send(text("hello")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("hello"));
    let binary = Message::Binary(Bytes::from_static(&[0, 159, 146, 150, 255]));
    ws.send(binary.clone()).await.unwrap();
    assert_eq!(next_data(&mut ws).await, binary);
    ws.send(Message::Frame(Frame::message(
        Bytes::from_static(b"frag"),
        OpCode::Data(Data::Text),
        false,
    )))
    .await
    .unwrap();
    ws.send(Message::Frame(Frame::message(
        Bytes::from_static(b"mented"),
        OpCode::Data(Data::Continue),
        true,
    )))
    .await
    .unwrap();
    assert_eq!(next_data(&mut ws).await, text("fragmented"));

    // Pings both ways: the client's is answered and seen by the backend; the backend's reaches
    // the client.
    ws.send(Message::Ping(Bytes::from_static(b"from-client")))
        .await
        .unwrap();
    assert_eq!(
        next(&mut ws).await,
        Message::Pong(Bytes::from_static(b"from-client"))
    );
    ws.send(text("ping-me")).await.unwrap();
    loop {
        if next(&mut ws).await == Message::Ping(Bytes::from_static(b"from-backend")) {
            break;
        }
    }
    wait_until("the backend saw the client's ping", || {
        backend
            .messages()
            .contains(&Message::Ping(Bytes::from_static(b"from-client")))
    })
    .await;

    // The client's close, with its code and reason, reaches the backend.
    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::from(4001),
        reason: "done here".into(),
    })))
    .await
    .unwrap();
    assert_eq!(close_of(&mut ws).await.0, 4001, "the close is answered");
    wait_until("the backend got the close", || {
        backend.closes() == vec![(4001, "done here".to_string())]
    })
    .await;
    wait_closed(&gw, &backend).await;

    // The handshake the backend saw: the rewritten path with the query, the client's fields
    // but the hop-by-hop ones, the forwarding fields, its own key, no extension.
    let (path, h) = backend.handshake(0);
    assert_eq!(path, "/echo/r%201?x=1");
    assert_eq!(h["x-app"], "kept");
    assert!(
        !h.contains_key("x-hop"),
        "a field named in Connection is hop-by-hop"
    );
    assert!(!h.contains_key("sec-websocket-extensions"));
    assert_eq!(h["sec-websocket-protocol"], "superchat, chat");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["origin"], "https://app.example");
    assert!(h["via"].to_str().unwrap().contains("fanout"));
    assert_eq!(h["host"], backend.addr.to_string().as_str());

    let st = ws_status(&gw);
    let route = &st["routes"]["/chat/{room}"];
    assert_eq!(route["messages"]["in"], 4, "{st}");
    assert_eq!(route["messages"]["out"], 3, "{st}");
    assert_eq!(route["bytes"]["in"], 5 + 5 + 10 + 7, "{st}");
    assert_eq!(route["closes"]["client"]["other"], 1, "{st}");
    assert_eq!(st["open"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backends_close_code_reaches_the_client() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let gw = gateway(&config(backend.addr, "", ""), &stubs).await;
    let (mut ws, _) = open(gw.addr, "/chat/a", &[]).await.unwrap();
    ws.send(text("close-me")).await.unwrap();
    assert_eq!(close_of(&mut ws).await, (4000, "bye".to_string()));
    wait_closed(&gw, &backend).await;
    let st = ws_status(&gw);
    assert_eq!(
        st["routes"]["/chat/{room}"]["closes"]["backend"]["other"], 1,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_extended_connect_opens_the_same_route() {
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    // The connection's idle timeout is short: an open WebSocket stream keeps it busy.
    let gw = gateway(
        &config(
            backend.addr,
            "ping_interval: 50ms",
            "server: { connections: { idle_timeout: 200ms } }",
        ),
        &stubs,
    )
    .await;
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Empty<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    // A first request: the server's settings (extended CONNECT on) have arrived after it.
    let warm = http::Request::builder()
        .uri(format!("http://{}/nowhere", gw.addr))
        .body(Empty::new())
        .unwrap();
    let warm = tokio::time::timeout(LIMIT, send.send_request(warm))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(warm.status(), StatusCode::NOT_FOUND);
    let mut req = http::Request::builder()
        .method(Method::CONNECT)
        .uri(format!("http://{}/chat/h2", gw.addr))
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat")
        .body(Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut resp = tokio::time::timeout(LIMIT, send.send_request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["sec-websocket-protocol"], "chat");
    let up = tokio::time::timeout(LIMIT, hyper::upgrade::on(&mut resp))
        .await
        .unwrap()
        .unwrap();
    let mut ws = WebSocketStream::from_raw_socket(TokioIo::new(up), Role::Client, None).await;
    ws.send(text("over h2")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("over h2"));
    // Many connection idle times later (counted in the gateway's pings), still open.
    let mut pings = 0;
    while pings < 20 {
        if let Message::Ping(_) = next(&mut ws).await {
            pings += 1;
        }
    }
    ws.send(text("still there")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("still there"));
    let (path, h) = backend.handshake(0);
    assert_eq!(path, "/echo/h2");
    assert_eq!(
        h["upgrade"], "websocket",
        "the backend gets an HTTP/1.1 upgrade"
    );
    assert!(
        h["via"].to_str().unwrap().starts_with("2 "),
        "{:?}",
        h["via"]
    );
    ws.send(Message::Close(None)).await.unwrap();
    wait_closed(&gw, &backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_goes_through_the_edge_stages_and_the_origin_list() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let log = std::env::temp_dir().join(format!("fanout-ws-access-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let more = format!(
        r#"
  - path: /denied
    stages: {{ ip_filter: {{ deny: [127.0.0.0/8] }} }}
    websocket: {{ backend: ws }}
  - path: /own
    websocket: {{ backend: ws }}
  - path: /any
    websocket: {{ backend: ws, origins: ["*"] }}
telemetry: {{ access_log: {{ enabled: true, output: "{}" }} }}
"#,
        log.display()
    );
    let gw = gateway(&config(backend.addr, "", &more), &stubs).await;
    let host = gw.addr.to_string();

    // IP lists refuse the handshake before anything is upgraded.
    let (status, body) = refused(gw.addr, "/denied", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "ip_denied");

    // Origins: the listed one, not another; none listed: the gateway's own; `*`: any; no
    // Origin (not a browser): let through.
    let (status, body) = refused(gw.addr, "/chat/x", &[("origin", "https://evil.example")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "origin_refused");
    assert!(body["error"]["request_id"].is_string());
    let own = format!("http://{host}");
    let (status, _) = refused(gw.addr, "/own", &[("origin", "https://app.example")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for (path, origin) in [
        ("/chat/x", "https://app.example"),
        ("/own", own.as_str()),
        ("/any", "https://anything.example"),
    ] {
        let (mut ws, _) = open(gw.addr, path, &[("origin", origin)]).await.unwrap();
        ws.send(text("hi")).await.unwrap();
        assert_eq!(next_data(&mut ws).await, text("hi"));
        ws.close(None).await.unwrap();
    }
    let (mut ws, head) = open(gw.addr, "/chat/x", &[("x-request-id", "ws-logged")])
        .await
        .unwrap();
    assert_eq!(head["x-request-id"], "ws-logged");
    ws.close(None).await.unwrap();

    // A plain request on a WebSocket route is told to upgrade.
    let plain = get(&format!("http://{host}/chat/x")).await;
    assert_eq!(plain.status, StatusCode::UPGRADE_REQUIRED);
    assert_eq!(plain.code(), "upgrade_required");
    assert_eq!(plain.header("upgrade"), Some("websocket"));

    wait_closed(&gw, &backend).await;
    let st = ws_status(&gw);
    let refused = &st["routes"]["/chat/{room}"]["refused"];
    assert_eq!(refused["origin"], 1, "{st}");
    assert_eq!(refused["not_websocket"], 1, "{st}");
    assert_eq!(st["routes"]["/own"]["refused"]["origin"], 1, "{st}");

    // The access log has the handshake's line, answered 101.
    wait_until("the handshake's access log line", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("ws-logged")
    })
    .await;
    let line: serde_json::Value = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["request_id"] == "ws-logged")
        .unwrap();
    assert_eq!(line["status"], 101, "{line}");
    assert_eq!(line["route"], "/chat/{room}", "{line}");
    let _ = std::fs::remove_file(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_or_frame_over_the_limit_closes_both_sides_with_1009() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let gw = gateway(
        &config(
            backend.addr,
            "max_message_bytes: 2048\n      max_frame_bytes: 1024",
            "",
        ),
        &stubs,
    )
    .await;
    // A frame over max_frame_bytes from the client.
    let (mut ws, _) = open(gw.addr, "/chat/big", &[]).await.unwrap();
    ws.send(Message::Binary(vec![1u8; 1500].into()))
        .await
        .unwrap();
    assert_eq!(close_of(&mut ws).await.0, 1009);
    // A message over max_message_bytes in frames under the limit.
    let (mut ws, _) = open(gw.addr, "/chat/big", &[]).await.unwrap();
    for (i, chunk) in [0u8, 1, 2].iter().enumerate() {
        let op = if i == 0 { Data::Binary } else { Data::Continue };
        ws.send(Message::Frame(Frame::message(
            vec![*chunk; 1000],
            OpCode::Data(op),
            i == 2,
        )))
        .await
        .unwrap();
    }
    assert_eq!(close_of(&mut ws).await.0, 1009);
    // One from the backend.
    let (mut ws, _) = open(gw.addr, "/chat/big", &[]).await.unwrap();
    ws.send(text("big-please")).await.unwrap();
    assert_eq!(close_of(&mut ws).await.0, 1009);
    // A text message that is not UTF-8 breaks the protocol: 1007 both ways.
    let (mut ws, _) = open(gw.addr, "/chat/utf8", &[]).await.unwrap();
    ws.send(Message::Frame(Frame::message(
        Bytes::from_static(&[0x66, 0xff, 0x6f]),
        OpCode::Data(Data::Text),
        true,
    )))
    .await
    .unwrap();
    assert_eq!(close_of(&mut ws).await.0, 1007);
    wait_closed(&gw, &backend).await;
    assert!(
        backend.closes().iter().any(|(c, _)| *c == 1007),
        "{:?}",
        backend.closes()
    );
    assert_eq!(
        backend.closes().iter().filter(|(c, _)| *c == 1009).count(),
        3,
        "the backend is closed with 1009 too: {:?}",
        backend.closes()
    );
    let st = ws_status(&gw);
    assert_eq!(
        st["routes"]["/chat/{room}"]["closes"]["gateway"]["1009"], 3,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_is_closed_with_1001_unless_it_answers_pings() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let more = r#"
  - path: /pinged
    websocket: { backend: ws, idle_timeout: 1s, ping_interval: 100ms }
"#;
    let gw = gateway(
        &config(
            backend.addr,
            "idle_timeout: 300ms\n      ping_interval: 0s",
            more,
        ),
        &stubs,
    )
    .await;
    // No message either way: both sides closed with 1001.
    let (mut ws, _) = open(gw.addr, "/chat/quiet", &[]).await.unwrap();
    assert_eq!(close_of(&mut ws).await, (1001, "idle timeout".to_string()));
    wait_until("the backend closed as idle too", || {
        backend.closes() == vec![(1001, "idle timeout".to_string())]
    })
    .await;

    // A client that reads answers the gateway's pings (its codec does) and stays open past
    // several idle times; one that never reads does not answer and is closed.
    let (mut reading, _) = open(gw.addr, "/pinged", &[]).await.unwrap();
    let (_silent, _) = open(gw.addr, "/pinged", &[]).await.unwrap();
    // Read on (answering) until the silent one is closed and many idle times have passed.
    let mut pings = 0;
    while pings < 30 || ws_status(&gw)["routes"]["/pinged"]["open"] != 1 {
        match next(&mut reading).await {
            Message::Ping(p) => {
                assert_eq!(&p[..], b"fanout");
                pings += 1;
            }
            m => panic!("only pings while silent, got {m:?}"),
        }
    }
    reading.send(text("still here")).await.unwrap();
    assert_eq!(next_data(&mut reading).await, text("still here"));
    let st = ws_status(&gw);
    assert_eq!(
        st["routes"]["/pinged"]["closes"]["gateway"]["1001"], 1,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_caps_refuse_with_503_per_route_and_for_the_gateway() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let more = r#"
  - path: /other
    websocket: { backend: ws }
server:
  websockets: { max_connections: 2 }
"#;
    let gw = gateway(&config(backend.addr, "max_connections: 1", more), &stubs).await;
    let (_a, _) = open(gw.addr, "/chat/1", &[]).await.unwrap();
    let (status, body) = refused(gw.addr, "/chat/2", &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], "websocket_limit");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("websocket.max_connections"),
        "{body}"
    );
    let (_b, _) = open(gw.addr, "/other", &[]).await.unwrap();
    let (status, body) = refused(gw.addr, "/other", &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("server.websockets.max_connections"),
        "{body}"
    );
    let st = ws_status(&gw);
    assert_eq!(st["open"], 2);
    assert_eq!(st["max_connections"], 2);
    assert_eq!(
        st["routes"]["/chat/{room}"]["refused"]["route_limit"], 1,
        "{st}"
    );
    assert_eq!(st["routes"]["/other"]["refused"]["global_limit"], 1, "{st}");
    // The refusals are counted by code with the other error answers.
    assert_eq!(gw.gateway.status_json()["errors"]["websocket_limit"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_either_way_closes_the_other_side() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let gw = gateway(&config(backend.addr, "", ""), &stubs).await;
    // The client goes away without a close frame: the backend is closed (1001).
    let (mut ws, _) = open(gw.addr, "/chat/leave", &[]).await.unwrap();
    ws.send(text("hi")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("hi"));
    drop(ws);
    wait_closed(&gw, &backend).await;
    assert_eq!(
        backend.closes(),
        vec![(1001, "client went away".to_string())]
    );
    // The backend goes away: the client is closed with 1011.
    let (mut ws, _) = open(gw.addr, "/chat/vanish", &[]).await.unwrap();
    ws.send(text("vanish")).await.unwrap();
    assert_eq!(
        close_of(&mut ws).await,
        (1011, "backend went away".to_string())
    );
    wait_closed(&gw, &backend).await;
    let st = ws_status(&gw);
    let closes = &st["routes"]["/chat/{room}"]["closes"];
    assert_eq!(closes["client"]["1006"], 1, "{st}");
    assert_eq!(closes["backend"]["1006"], 1, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_cannot_take_the_websocket_is_502_before_any_upgrade() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let more = r#"
  - path: /unreachable
    websocket: { backend: gone }
  - path: /refusing
    websocket: { backend: plain }
"#;
    let yaml = config(backend.addr, "", more).replace(
        "backends:\n",
        &format!("backends:\n  gone: {{ url: \"http://{gone}\" }}\n"),
    );
    let gw = gateway(&yaml, &stubs).await;
    let (status, body) = refused(gw.addr, "/unreachable", &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["code"], "backend_unavailable");
    let (status, body) = refused(gw.addr, "/refusing", &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["code"], "bad_backend_answer");
    let st = ws_status(&gw);
    assert_eq!(st["open"], 0);
    assert_eq!(
        st["routes"]["/unreachable"]["refused"]["backend_unavailable"], 1,
        "{st}"
    );
    assert_eq!(
        st["routes"]["/refusing"]["refused"]["backend_refused"], 1,
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_open_websockets_with_1001_both_ways() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let gw = gateway(&config(backend.addr, "", ""), &stubs).await;
    let gateway = gw.gateway.clone();
    let (mut ws, _) = open(gw.addr, "/chat/drain", &[]).await.unwrap();
    ws.send(text("hi")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("hi"));
    let stopped = tokio::spawn(gw.shutdown());
    assert_eq!(close_of(&mut ws).await, (1001, "going away".to_string()));
    tokio::time::timeout(LIMIT, stopped)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(gateway.status_json()["websockets"]["open"], 0);
    assert!(
        gateway.status_json()["websockets"]["draining"]
            .as_bool()
            .unwrap()
    );
    wait_until("the backend got 1001", || {
        backend.closes() == vec![(1001, "going away".to_string())]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_open_websockets_with_1001() {
    let backend = Backend::start().await;
    let yaml = format!(
        r#"
backends:
  ws: {{ url: "http://{}" }}
routes:
  - path: /chat
    websocket: {{ backend: ws }}
"#,
        backend.addr
    );
    let proc = ServeProcess::launch("ws-sigterm", &yaml).start().await;
    let (mut ws, _) = open(proc.addr(), "/chat", &[]).await.unwrap();
    ws.send(text("hi")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("hi"));
    proc.signal("-TERM");
    assert_eq!(close_of(&mut ws).await, (1001, "going away".to_string()));
    wait_until("the backend got 1001", || {
        backend.closes() == vec![(1001, "going away".to_string())]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_families_are_on_metrics() {
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let gw = gateway_with(&config(backend.addr, "", ""), &stubs, &[]).await;
    let (mut ws, _) = open(gw.addr, "/chat/m", &[]).await.unwrap();
    ws.send(text("count me")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("count me"));
    let admin = gw.admin_addr.unwrap();
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    for line in [
        "fanout_websockets_open 1",
        r#"fanout_websocket_open{route="/chat/{room}"} 1"#,
        r#"fanout_websocket_messages_total{route="/chat/{room}",direction="in"} 1"#,
        r#"fanout_websocket_bytes_total{route="/chat/{room}",direction="out"} 8"#,
        r#"fanout_websocket_closes_total{route="/chat/{room}",by="client",code="1000"} 0"#,
        r#"fanout_websocket_refused_total{route="/chat/{room}",reason="origin"} 0"#,
    ] {
        assert!(metrics.contains(line), "no `{line}` in:\n{metrics}");
    }
    ws.close(None).await.unwrap();
    wait_closed(&gw, &backend).await;
}

/// The gateway's memory per idle WebSocket (both sides: the client's and the backend's socket,
/// codecs and buffers, the relay's task), measured on `fanout serve` as resident memory grown
/// while 1000 of them open: within the issue's budget of 32 KiB (about 13 KiB when written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_costs_the_gateway_little_memory() {
    const N: usize = 1000;
    let backend = Backend::start().await;
    let yaml = format!(
        r#"
backends:
  ws: {{ url: "http://{}" }}
routes:
  - path: /idle
    websocket: {{ backend: ws, idle_timeout: 10m, ping_interval: 5m }}
"#,
        backend.addr
    );
    let proc = ServeProcess::launch("ws-memory", &yaml).start().await;
    let status = || async {
        get(&format!("http://{}/__fanout/status", proc.admin_addr()))
            .await
            .json()["websockets"]["open"]
            .as_u64()
            .unwrap()
    };
    let mut open_ws = Vec::with_capacity(N + 50);
    let one = async || {
        let (mut ws, _) = open(proc.addr(), "/idle", &[]).await.unwrap();
        ws.send(text("hi")).await.unwrap();
        assert_eq!(next_data(&mut ws).await, text("hi"));
        ws
    };
    // Warm up (the runtime's and the allocator's first pages), then measure N more.
    for _ in 0..50 {
        open_ws.push(one().await);
    }
    let before = proc.rss_kib();
    for _ in 0..N {
        open_ws.push(one().await);
    }
    wait_until_async("every WebSocket open at the gateway", || async {
        status().await == (N + 50) as u64
    })
    .await;
    let after = proc.rss_kib();
    let each = after.saturating_sub(before) * 1024 / N as u64;
    eprintln!("RSS {before} → {after} KiB for {N} idle WebSockets: {each} bytes each");
    assert!(
        each <= 32 << 10,
        "{each} bytes of gateway memory per idle WebSocket"
    );
    drop(open_ws);
    wait_until_async("every WebSocket closed", || async { status().await == 0 }).await;
}

#[test]
fn explain_says_where_a_websocket_route_relays_and_its_limits() {
    let dir = TempDir::new("ws-explain");
    let file = dir.join("fanout.yaml");
    std::fs::write(
        &file,
        r#"
backends:
  chat: { url: "http://127.0.0.1:9" }
routes:
  - path: /chat/{room}
    websocket: { backend: chat, path: "/ws/{room}", origins: ["https://app.example"], ping_interval: 0s }
"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["explain", "-c", file.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text,
        "GET /chat/{room}\n  WebSocket relayed to backend `chat`, path `/ws/{room}`; origins: \
         https://app.example; messages up to 1048576 bytes (frames 1048576); idle_timeout 1m, no \
         pings; at most 10000 open\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_authenticates_with_a_token_in_the_query_and_its_claims_reach_the_backend() {
    const SECRET: &str = "a-secret-of-at-least-thirty-two-bytes!";
    let stubs = stubs(STUBS).await;
    let backend = Backend::start().await;
    let more = format!(
        r#"
  - path: /secure
    auth: {{ provider: app }}
    websocket: {{ backend: ws, claims: {{ x-user-id: sub }} }}
auth:
  providers:
    app:
      issuer: https://issuer.example
      audiences: [chat]
      hmac_secret: "{SECRET}"
      token: {{ query: access_token, allow_query: true }}
"#
    );
    let gw = gateway(&config(backend.addr, "", &more), &stubs).await;
    // Browsers cannot set headers on a WebSocket: the token comes in the query.
    let (status, body) = refused(gw.addr, "/secure", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthenticated");
    let (status, _) = refused(gw.addr, "/secure?access_token=not.a.token", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let token = fanout_testkit::jwt::hmac_signed(
        SECRET.as_bytes(),
        "k1",
        &fanout_testkit::jwt::claims("https://issuer.example", "chat", "user-7"),
    );
    let (mut ws, _) = open(
        gw.addr,
        &format!("/secure?access_token={token}"),
        &[("x-user-id", "forged")],
    )
    .await
    .unwrap();
    ws.send(text("authenticated")).await.unwrap();
    assert_eq!(next_data(&mut ws).await, text("authenticated"));
    let (_, h) = backend.handshake(0);
    assert_eq!(
        h["x-user-id"], "user-7",
        "the verified claim, not the client's header"
    );
    ws.close(None).await.unwrap();
    wait_closed(&gw, &backend).await;
}

#[test]
fn a_websocket_route_that_cannot_work_is_refused_at_load_at_its_place() {
    let load = |routes: &str| {
        let yaml = format!(
            "backends:\n  ws: {{ url: \"http://127.0.0.1:9\" }}\n  h2: {{ url: \"http://127.0.0.1:9\", protocol: http2 }}\nroutes:\n{routes}"
        );
        match fanout::load_gateway("fanout.yaml", &yaml, &|_: &str| None) {
            Ok(_) => panic!("loaded:\n{yaml}"),
            Err(e) => e.to_string(),
        }
    };
    for (routes, wanted) in [
        (
            "  - path: /a\n    method: POST\n    websocket: { backend: ws }\n",
            "fanout.yaml:6:13: a `websocket` route's method is GET, not `POST`",
        ),
        (
            "  - path: /a\n    websocket: { backend: wz }\n",
            "unknown backend `wz` in `websocket.backend`",
        ),
        (
            "  - path: /a\n    websocket: { backend: h2 }\n",
            "a WebSocket route needs an `http1` one",
        ),
        (
            "  - path: /a\n    websocket: { backend: ws, ping_interval: 60s }\n",
            "must be shorter than `idle_timeout`",
        ),
        (
            "  - path: /a\n    websocket: { backend: ws, max_frame_bytes: 2000000 }\n",
            "exceeds `max_message_bytes`",
        ),
        (
            "  - path: /a\n    websocket: { backend: ws, origins: [app.example] }\n",
            "is not an origin",
        ),
        (
            "  - path: /a\n    websocket: { backend: ws }\n    respond: { body: '1' }\n",
            "a `websocket` route has no `respond`",
        ),
    ] {
        let err = load(routes);
        assert!(err.contains(wanted), "wanted `{wanted}` in:\n{err}");
    }
}
