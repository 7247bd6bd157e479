//! Test harness: real stubs and a real gateway on ephemeral 127.0.0.1 ports, and a small client.
#![allow(dead_code)]

use bytes::Bytes;
use fanout::{RunningGateway, addr_var, load_gateway, start_gateway};
use fanout_stub::StubServer;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Start stubs from YAML text; every `*_ADDR` variable becomes an ephemeral port.
pub async fn stubs(yaml: &str) -> StubServer {
    let any = |n: &str| n.ends_with("_ADDR").then(|| "127.0.0.1:0".to_string());
    fanout_stub::load("stubs.yaml", yaml, &any)
        .unwrap_or_else(|e| panic!("stub config: {e}"))
        .start()
        .await
        .unwrap_or_else(|e| panic!("stub start: {e}"))
}

/// Variables pointing a gateway config at running stubs (`SEARCH_ADDR` → the search stub).
pub fn stub_vars(stubs: &StubServer) -> HashMap<String, String> {
    stubs
        .services()
        .into_iter()
        .map(|(n, a)| (addr_var(&n), a.to_string()))
        .collect()
}

/// Start a gateway from YAML text against running stubs, on an ephemeral port.
pub async fn gateway(yaml: &str, stubs: &StubServer) -> RunningGateway {
    let vars = stub_vars(stubs);
    let lookup = |n: &str| vars.get(n).cloned();
    let gw = load_gateway("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    start_gateway(gw, "127.0.0.1:0")
        .await
        .expect("bind gateway")
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
}

/// HTTP/1.1 pooled client (or h2c with `h2`).
pub fn client(h2: bool) -> Client<HttpConnector, Full<Bytes>> {
    let mut b = Client::builder(TokioExecutor::new());
    if h2 {
        b.http2_only(true);
    }
    b.build(HttpConnector::new())
}

pub async fn send(
    c: &Client<HttpConnector, Full<Bytes>>,
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

/// Total requests a stub service received (all routes).
pub fn calls(stubs: &StubServer, service: &str) -> u64 {
    stubs
        .stats(service)
        .map(|s| s.routes.values().map(|r| r.requests).sum())
        .unwrap_or(0)
}

/// Poll `f` until it holds (up to 5 s); for effects that settle asynchronously (a closed socket).
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// An example's `cases.yaml`: requests, the expected answers and backend calls per service.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cases {
    pub cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    pub request: CaseRequest,
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub response: serde_json::Value,
    #[serde(default)]
    pub backend_calls: BTreeMap<String, u64>,
    /// Texts the gateway's log line for this request (found by its `x-request-id`) must contain:
    /// the detail the client does not see.
    #[serde(default)]
    pub log: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    #[serde(default = "default_method")]
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub body: Option<serde_json::Value>,
}

pub fn default_method() -> String {
    "GET".into()
}

/// The log of every gateway in this test binary (a global subscriber writing to memory).
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[derive(Clone)]
struct LogWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Capture the log (level info and above) of this test binary; idempotent.
pub fn capture_logs() -> &'static Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let w = LogWriter(buf.clone());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || w.clone())
            .try_init();
        Logs(buf)
    })
}

impl Logs {
    /// Every line logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
    /// The lines that mention `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}
