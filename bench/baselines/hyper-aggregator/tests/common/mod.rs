//! Test harness: example stubs (or stubs from inline YAML) and the aggregator on ephemeral
//! 127.0.0.1 ports in this process, and a small HTTP client.
#![allow(dead_code)]

use bytes::Bytes;
use fanout_stub::StubServer;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_aggregator::Config;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `examples/<name>` of the workspace.
pub fn example_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../examples")
        .join(name)
}

/// A file of an example, as text.
pub fn example_file(example: &str, file: &str) -> String {
    let path = example_dir(example).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Start stubs from YAML text; every `*_ADDR` variable becomes an ephemeral port.
pub async fn stubs(yaml: &str) -> StubServer {
    let any = |n: &str| n.ends_with("_ADDR").then(|| "127.0.0.1:0".to_string());
    fanout_stub::load("stubs.yaml", yaml, &any)
        .unwrap_or_else(|e| panic!("stub config: {e}"))
        .start()
        .await
        .unwrap_or_else(|e| panic!("stub start: {e}"))
}

/// A config pointing at running stubs (`search` → `SEARCH_ADDR`); `extra` overrides variables.
pub fn config(stubs: &StubServer, extra: &[(&str, String)]) -> Config {
    let mut vars: HashMap<String, String> = stubs
        .services()
        .into_iter()
        .map(|(n, a)| (format!("{}_ADDR", n.to_uppercase()), a.to_string()))
        .collect();
    for (k, v) in extra {
        vars.insert(k.to_string(), v.clone());
    }
    Config::from_lookup(|var| vars.get(var).cloned())
}

/// The aggregator serving in a background task.
pub struct Running {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Running {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Signal shutdown and wait for `serve` to return.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task")
            .expect("serve result");
    }
}

/// Start the aggregator with `config` on an ephemeral port.
pub async fn start(config: Config) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(hyper_aggregator::serve(config, listener, async move {
        let _ = rx.await;
    }));
    Running { addr, stop, task }
}

/// A response as the tests see it.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `error.code` of a JSON error body.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub type TestClient = Client<HttpConnector, Full<Bytes>>;

/// HTTP/1.1 pooled client (or h2c with `h2`).
pub fn client(h2: bool) -> TestClient {
    let mut b = Client::builder(TokioExecutor::new());
    if h2 {
        b.http2_only(true);
    }
    b.build(HttpConnector::new())
}

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
    let resp = tokio::time::timeout(Duration::from_secs(20), c.request(req))
        .await
        .expect("response within 20 s")
        .expect("response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(url: &str) -> Resp {
    send(&client(false), Method::GET, url, &[], Bytes::new()).await
}

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

/// Total requests a stub service received (all routes).
pub fn calls(stubs: &StubServer, service: &str) -> u64 {
    stubs
        .stats(service)
        .map(|s| s.routes.values().map(|r| r.requests).sum())
        .unwrap_or(0)
}

/// An address nothing listens on.
pub async fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    addr.to_string()
}
