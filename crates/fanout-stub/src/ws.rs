//! WebSocket routes (`websocket:` on a route; docs/stubs.md#websockets): the HTTP/1.1
//! handshake accepted (`101` with its `Sec-WebSocket-Accept`), then the route's scripted
//! messages, each after its delay, then a close with the route's code, or an echo of every
//! message the client sends until it closes. Each WebSocket is a task of its own, ended when
//! either side closes or the connection drops; a request that is not a handshake is `426`.

use crate::body::StubBody;
use crate::config::WsConfig;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, frame::coding::CloseCode};

/// Answer a request of a `websocket:` route: the `101` and the WebSocket's task, or `426`.
pub(crate) fn answer(
    plan: &std::sync::Arc<WsConfig>,
    headers: &http::HeaderMap,
    on: Option<hyper::upgrade::OnUpgrade>,
) -> Response<StubBody> {
    let upgrade = headers
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let key = headers.get("sec-websocket-key").cloned();
    let (true, Some(key), Some(on)) = (upgrade, key, on) else {
        let mut r = Response::new(StubBody::full(Bytes::from_static(
            b"{\"error\": \"a WebSocket route: send an HTTP/1.1 Upgrade: websocket handshake\"}",
        )));
        *r.status_mut() = StatusCode::UPGRADE_REQUIRED;
        r.headers_mut()
            .insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
        return r;
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let plan = plan.clone();
    tokio::spawn(async move {
        let Ok(io) = on.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await;
        run(ws, &plan).await;
    });
    let mut r = Response::new(StubBody::full(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert("sec-websocket-accept", v);
    }
    r
}

async fn run<S>(mut ws: WebSocketStream<S>, plan: &WsConfig)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for m in &plan.messages {
        if let Some(d) = m.delay {
            tokio::time::sleep(d.0).await;
        }
        if ws.send(Message::text(m.text.clone())).await.is_err() {
            return;
        }
    }
    if let Some(c) = &plan.close {
        if let Some(d) = c.delay {
            tokio::time::sleep(d.0).await;
        }
        let frame = CloseFrame {
            code: CloseCode::from(c.code),
            reason: c.reason.clone().into(),
        };
        if ws.close(Some(frame)).await.is_err() {
            return;
        }
        // The client's close (or the end of the connection), bounded.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
        return;
    }
    while let Some(Ok(m)) = ws.next().await {
        let echo = plan.echo && matches!(m, Message::Text(_) | Message::Binary(_));
        if matches!(m, Message::Close(_)) || (echo && ws.send(m).await.is_err()) {
            break;
        }
    }
}
