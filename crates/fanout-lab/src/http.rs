//! A minimal HTTP client for the lab's control calls (readiness probes, stub admin API).

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::time::Duration;

/// A control-call failure.
#[derive(Debug, thiserror::Error)]
#[error("{method} http://{addr}{path}: {message}")]
pub struct HttpError {
    method: Method,
    addr: SocketAddr,
    path: String,
    message: String,
}

/// Send one request and return (status, body). Times out after 5 s.
pub async fn call(
    method: Method,
    addr: SocketAddr,
    path: &str,
    body: Option<String>,
) -> Result<(u16, Bytes), HttpError> {
    let err = |m: String| HttpError {
        method: method.clone(),
        addr,
        path: path.to_string(),
        message: m,
    };
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::builder()
        .method(method.clone())
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| err(e.to_string()))?;
    let fut = async {
        let resp = client.request(req).await.map_err(|e| err(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| err(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .map_err(|_| err("timed out".into()))?
}

/// GET.
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, Bytes), HttpError> {
    call(Method::GET, addr, path, None).await
}
