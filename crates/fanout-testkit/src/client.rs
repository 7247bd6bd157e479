//! A pooled HTTP client (HTTP/1.1 or h2c) and the response as the tests see it.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// How long [`send`] waits for the response head before it fails the test.
pub const RESPONSE_LIMIT: Duration = Duration::from_secs(20);

/// The client the tests use.
pub type TestClient = Client<HttpConnector, Full<Bytes>>;

/// A response as the tests see it: status, headers and the whole body.
#[derive(Debug)]
pub struct Resp {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Resp {
    /// Read the whole body of a response; panics when it cannot be read.
    pub async fn read(resp: http::Response<hyper::body::Incoming>) -> Resp {
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// The body as JSON; panics (showing the body) when it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `error.code` of a JSON error body (empty when there is none).
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// A header's value, when it is present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// An HTTP/1.1 pooled client (or h2c with `h2`).
pub fn client(h2: bool) -> TestClient {
    let mut b = Client::builder(TokioExecutor::new());
    if h2 {
        b.http2_only(true);
    }
    b.build(HttpConnector::new())
}

/// Send one request with `headers` and `body`; panics when no response comes within
/// [`RESPONSE_LIMIT`] or the exchange fails.
pub async fn send(
    c: &TestClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Resp {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(body.into())).expect("request");
    let resp = tokio::time::timeout(RESPONSE_LIMIT, c.request(req))
        .await
        .expect("response within 20 s")
        .expect("response");
    Resp::read(resp).await
}

/// `GET url` with a new HTTP/1.1 client.
pub async fn get(url: &str) -> Resp {
    send(&client(false), Method::GET, url, &[], Bytes::new()).await
}

/// `POST url` with `body` and a new HTTP/1.1 client.
pub async fn post(url: &str, body: &str) -> Resp {
    send(
        &client(false),
        Method::POST,
        url,
        &[],
        Bytes::copy_from_slice(body.as_bytes()),
    )
    .await
}
