//! Requests on fresh HTTP/1.1 connections (the stub's tests count connections and requests per
//! connection, so nothing is pooled here).

use crate::client::Resp;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// A request for a stub: `host: stub`, the given method, path and body.
pub fn request(method: Method, path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "stub")
        .body(Full::new(body.into()))
        .expect("request")
}

/// An HTTP/1.1 connection to `addr`; the connection runs in a task of its own.
pub async fn conn(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

/// One request on a fresh connection; the whole body is read, then the connection is dropped
/// (closed once the connection task sees no more requests).
pub async fn send(addr: SocketAddr, method: Method, path: &str, body: impl Into<Bytes>) -> Resp {
    let mut c = conn(addr).await;
    let resp = c
        .send_request(request(method, path, body))
        .await
        .expect("response");
    Resp::read(resp).await
}

/// `req` on a fresh connection that is aborted (closed at once) after the whole body is read.
pub async fn exchange(addr: SocketAddr, req: Request<Full<Bytes>>) -> Resp {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let conn = tokio::spawn(conn);
    let resp = send.send_request(req).await.expect("response");
    let resp = Resp::read(resp).await;
    drop(send);
    conn.abort();
    resp
}

/// `GET path` on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    send(addr, Method::GET, path, Bytes::new()).await
}

/// `PUT path` with a JSON body on a fresh connection.
pub async fn put_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Resp {
    send(addr, Method::PUT, path, body.to_string()).await
}
