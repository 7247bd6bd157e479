//! The inbound server: HTTP/1.1 and h2c on one port, routing, limits, deadlines, and the mapping of
//! every failure to a status code and a JSON error body.

use crate::Gateway;
use bytes::Bytes;
use fanout_expr::request::{RequestParts, request_val};
use fanout_expr::{Val, json};
use fanout_flow::{FlowError, Outcome};
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// Response body type of the server.
pub type Body = Full<Bytes>;

/// A client-side error (bad request) or a flow failure, rendered as JSON.
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub step: Option<Arc<str>>,
    pub backend: Option<Arc<str>>,
    /// `Allow` header for 405.
    pub allow: Option<HeaderValue>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            step: None,
            backend: None,
            allow: None,
        }
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let body = serde_json::json!({
            "error": {
                "code": self.code,
                "message": self.message,
                "step": self.step.as_deref(),
                "backend": self.backend.as_deref(),
            }
        });
        let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
        *resp.status_mut() = self.status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(allow) = self.allow {
            resp.headers_mut().insert(ALLOW, allow);
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

impl From<FlowError> for ApiError {
    fn from(e: FlowError) -> Self {
        ApiError {
            status: StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY),
            code: e.kind.code(),
            message: e.message,
            step: e.step,
            backend: e.backend,
            allow: None,
        }
    }
}

/// Parse a `grpc-timeout` value (`<digits><unit>`, unit one of H M S m u n).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (num, unit) = v.split_at(v.len() - 1);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl Gateway {
    /// Handle one request (never fails: every error becomes a JSON response).
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        if req.uri().path() == "/__fanout/status" {
            let mut resp = Response::new(Full::new(Bytes::from(self.status_json().to_string())));
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return resp;
        }
        match self.handle_inner(req, start).await {
            Ok(out) => outcome_response(out),
            Err(e) => e.into_response(),
        }
    }

    async fn handle_inner(
        &self,
        req: Request<Incoming>,
        start: Instant,
    ) -> Result<Outcome, ApiError> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path();
        let matched = self.router.at(path).map_err(|_| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no route for {path}"),
            )
        })?;
        let entry = matched.value;
        let Some(route) = entry.iter().find(|r| r.method == parts.method).cloned() else {
            let allow: Vec<&str> = entry.iter().map(|r| r.method.as_str()).collect();
            let mut e = ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!(
                    "{} is not allowed on {path}; allowed: {}",
                    parts.method,
                    allow.join(", ")
                ),
            );
            e.allow = HeaderValue::from_str(&allow.join(", ")).ok();
            return Err(e);
        };

        // Deadline: the route's maximum, shortened by the client if it asks.
        let mut budget = route.deadline;
        if let Some(v) = parts.headers.get(&self.deadline_header) {
            let ms = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "bad_header",
                        format!(
                            "header {}: expected a number of milliseconds",
                            self.deadline_header
                        ),
                    )
                })?;
            budget = budget.min(Duration::from_millis(ms));
        }
        if let Some(v) = parts.headers.get("grpc-timeout") {
            let d = v
                .to_str()
                .ok()
                .and_then(parse_grpc_timeout)
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "bad_header",
                        "header grpc-timeout: expected e.g. `500m` (digits and one of H M S m u n)",
                    )
                })?;
            budget = budget.min(d);
        }
        let deadline = start + budget;

        // Admission: a slot now, a short bounded wait, or an immediate 503 — before any flow work.
        let class = self.route_admission.get(&route.method, &route.path);
        let mut slot = self.admission.admit(class, deadline).await.map_err(|r| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                match r {
                    crate::admission::Rejection::QueueFull => {
                        "the gateway is at its concurrency limit and its queue is full; retry later"
                    }
                    crate::admission::Rejection::Waited => {
                        "the gateway is at its concurrency limit and the request waited too long; retry later"
                    }
                },
            )
        })?;

        // Body: size-limited, read within the deadline, parsed once.
        let limit = self.limits.max_body_bytes;
        let mut body = body;
        if let Some(len) = parts.headers.get(CONTENT_LENGTH)
            && let Some(len) = len.to_str().ok().and_then(|s| s.parse::<u64>().ok())
            && len > limit as u64
        {
            drain_rejected_body(&mut body, deadline).await;
            return Err(too_large(limit));
        }
        let mut buf = bytes::BytesMut::new();
        let read = tokio::time::timeout_at(deadline, async {
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "bad_body",
                        format!("reading the request body failed: {e}"),
                    )
                })?;
                if let Ok(data) = frame.into_data() {
                    if buf.len() + data.len() > limit {
                        return Err(too_large(limit));
                    }
                    buf.extend_from_slice(&data);
                }
            }
            Ok(())
        })
        .await;
        match read {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    "the request body did not arrive before the deadline",
                ));
            }
            Ok(Err(e)) => {
                if e.code == "body_too_large" {
                    drain_rejected_body(&mut body, deadline).await;
                }
                return Err(e);
            }
            Ok(Ok(())) => {}
        }
        let bytes = buf.freeze();
        let body_val = if bytes.iter().all(u8::is_ascii_whitespace) {
            Val::Null
        } else {
            json::parse(&bytes).map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_json",
                    format!("request body is not valid JSON: {e}"),
                )
            })?
        };
        let request = request_val(RequestParts {
            method: parts.method.as_str(),
            path,
            query: parts.uri.query(),
            params: matched.params.iter(),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_bytes())),
            body: body_val,
        });
        let out = route.run(request, deadline).await;
        // The flow ran: its latency is a sample for the adaptive limit (released on return).
        slot.completed();
        out.map_err(ApiError::from)
    }
}

/// How much of an oversized body is read and discarded before the 413 is sent, and for how long.
/// A client that is still writing its body when the server answers and closes would otherwise get
/// a broken pipe instead of the 413 (the "lingering close" of nginx and Envoy); past these bounds
/// the connection is closed anyway, so a huge upload costs at most this much.
const DRAIN_BYTES: usize = 1 << 20;
const DRAIN_TIME: Duration = Duration::from_millis(250);

async fn drain_rejected_body(body: &mut Incoming, deadline: Instant) {
    let until = deadline.min(Instant::now() + DRAIN_TIME);
    let mut seen = 0usize;
    let _ = tokio::time::timeout_at(until, async {
        while seen <= DRAIN_BYTES {
            match body.frame().await {
                Some(Ok(f)) => seen += f.data_ref().map_or(0, |d| d.len()),
                _ => break,
            }
        }
    })
    .await;
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("request body exceeds {limit} bytes (server.max_body_bytes)"),
    )
}

fn outcome_response(out: Outcome) -> Response<Body> {
    let mut resp = Response::new(Full::new(out.body));
    *resp.status_mut() = StatusCode::from_u16(out.status).unwrap_or(StatusCode::OK);
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (k, v) in out.headers {
        h.insert(k, v);
    }
    resp
}

/// Serve `gateway` on `listener` until `shutdown` resolves, then stop accepting and give
/// in-flight requests `grace` to finish.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(gateway.limits.max_header_bytes.max(8192))
        .header_read_timeout(gateway.limits.header_read_timeout.0)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(gateway.limits.max_concurrent_streams)
        .max_header_list_size(gateway.limits.max_header_bytes as u32);
    let builder = Arc::new(builder);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let grace = gateway.limits.shutdown_grace.0;
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            res = listener.accept() => match res {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and similar: back off briefly, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let gw = gateway.clone();
        let svc = hyper::service::service_fn(move |req| {
            let gw = gw.clone();
            async move { Ok::<_, Infallible>(gw.handle(req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period elapsed with requests still in flight");
    }
    Ok(())
}
