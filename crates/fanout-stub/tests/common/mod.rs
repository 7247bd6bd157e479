//! Helpers shared by the fault and admin tests: start a stub, send requests on real sockets.
#![allow(dead_code)]

use bytes::Bytes;
use fanout_stub::StubServer;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

fn no_vars(_: &str) -> Option<String> {
    None
}

pub async fn start(yaml: &str) -> StubServer {
    let stubs = match fanout_stub::load("stubs.yaml", yaml, &no_vars) {
        Ok(c) => c,
        Err(e) => panic!("config should load:\n{e}"),
    };
    stubs.start().await.expect("stub starts")
}

/// Poll `cond` until it holds; panics (naming `what`) if it does not within 10 s. This bounds
/// the test, it does not measure anything.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "JSON body expected ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

pub fn request(method: Method, path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "stub")
        .body(Full::new(body.into()))
        .expect("request")
}

/// An HTTP/1.1 connection to `addr`.
pub async fn h1_conn(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

/// One request on a fresh HTTP/1.1 connection; the whole body is read.
pub async fn send(addr: SocketAddr, method: Method, path: &str, body: impl Into<Bytes>) -> Resp {
    let mut conn = h1_conn(addr).await;
    let resp = conn
        .send_request(request(method, path, body))
        .await
        .expect("response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    send(addr, Method::GET, path, Bytes::new()).await
}

pub async fn put_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Resp {
    send(addr, Method::PUT, path, body.to_string()).await
}
