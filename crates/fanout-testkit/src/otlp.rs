//! An OTLP/HTTP trace receiver for tests: a small hyper server on an ephemeral 127.0.0.1 port that
//! decodes `ExportTraceServiceRequest` (protobuf) on `POST /v1/traces`, keeps every span, and
//! answers an encoded `ExportTraceServiceResponse`. Tests point `telemetry.tracing.otlp_endpoint`
//! at [`OtlpReceiver::endpoint`] and wait for spans with [`crate::wait_until`] (export is
//! batched).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// A received span, flattened for assertions (ids as lowercase hex, attributes as text).
#[derive(Debug, Clone)]
pub struct RecvSpan {
    /// Span name.
    pub name: String,
    /// Trace id (32 hex digits).
    pub trace_id: String,
    /// Span id (16 hex digits).
    pub span_id: String,
    /// Parent span id (16 hex digits), empty for a root span.
    pub parent_span_id: String,
    /// OTLP span kind (1 internal, 2 server, 3 client).
    pub kind: i32,
    /// Attributes, values as text (`true`, `200`, `search`).
    pub attributes: BTreeMap<String, String>,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Links to other spans: (trace id, span id), hex.
    pub links: Vec<(String, String)>,
}

impl RecvSpan {
    /// An attribute's value as text.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A running receiver.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<RecvSpan>>>,
}

impl OtlpReceiver {
    /// Start on an ephemeral port.
    pub async fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let store = spans.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let store = store.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| receive(req, store.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        OtlpReceiver { addr, spans }
    }

    /// The traces URL: `http://127.0.0.1:PORT/v1/traces`.
    pub fn endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<RecvSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<RecvSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }
}

async fn receive(
    req: Request<Incoming>,
    store: Arc<Mutex<Vec<RecvSpan>>>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.method() != http::Method::POST || req.uri().path() != "/v1/traces" {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return Ok(r);
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let Ok(msg) = ExportTraceServiceRequest::decode(body) else {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return Ok(r);
    };
    let mut got = Vec::new();
    for rs in msg.resource_spans {
        let service_name = rs
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .map(|v| text(v.value.as_ref()))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(RecvSpan {
                    name: s.name,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    kind: s.kind,
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    attributes: s
                        .attributes
                        .iter()
                        .map(|kv| {
                            let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                            (kv.key.clone(), text(v))
                        })
                        .collect(),
                    service_name: service_name.clone(),
                });
            }
        }
    }
    store.lock().unwrap().extend(got);
    let resp = ExportTraceServiceResponse::default().encode_to_vec();
    let mut r = Response::new(Full::new(Bytes::from(resp)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(r)
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
