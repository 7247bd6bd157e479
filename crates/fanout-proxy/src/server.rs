//! The inbound server: HTTP/1.1 and h2c on one port, routing, limits, deadlines, and the mapping of
//! every failure to a status code and a JSON error body.

use crate::Gateway;
use crate::bodies::{Reservation, parsed_size_estimate, value_overhead};
use crate::conn::{Connections, TrackedBody, TrackedIo};
use bytes::Bytes;
use fanout_expr::request::{RequestParts, request_val};
use fanout_expr::{Val, json};
use fanout_flow::{FlowError, Outcome};
use futures_util::FutureExt;
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// Error answers by `error.code` (for the status endpoint): every refusal is counted.
#[derive(Default)]
pub(crate) struct ErrorCounts(std::sync::Mutex<std::collections::BTreeMap<String, u64>>);

impl ErrorCounts {
    /// Count one answer with `code` (codes come from the gateway and the config: a bounded set).
    pub(crate) fn count(&self, code: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(code) {
            Some(n) => *n += 1,
            None => {
                m.insert(code.to_string(), 1);
            }
        }
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::to_value(&*m).unwrap_or_default()
    }
}

/// Response body type of the server.
pub type Body = Full<Bytes>;

/// A client-side error (bad request) or a flow failure, rendered as JSON.
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: Cow<'static, str>,
    /// Safe for the client.
    pub message: String,
    pub step: Option<Arc<str>>,
    /// For the log (and the client only with `server.expose_error_details`).
    pub backend: Option<Arc<str>>,
    /// For the log (and the client only with `server.expose_error_details`).
    pub detail: Option<String>,
    /// `error.details` (JSON text) from a `fail` step.
    pub details: Option<Bytes>,
    /// `Allow` header for 405.
    pub allow: Option<HeaderValue>,
    /// Whether the failure is logged: flow failures and panics are; the server's own refusals
    /// (no route, overload, body limits) are only counted — their cause is in the message.
    pub log: bool,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: Cow::Borrowed(code),
            message: message.into(),
            step: None,
            backend: None,
            detail: None,
            details: None,
            allow: None,
            log: false,
        }
    }

    /// The JSON answer: `{"error": {code, message, step, request_id[, details][, backend,
    /// detail]}}` — the last two only with `expose` (`server.expose_error_details`).
    pub(crate) fn into_response(self, request_id: &HeaderValue, expose: bool) -> Response<Body> {
        let mut e = serde_json::Map::with_capacity(7);
        e.insert("code".into(), self.code.as_ref().into());
        e.insert("message".into(), self.message.into());
        e.insert("step".into(), self.step.as_deref().into());
        e.insert(
            "request_id".into(),
            String::from_utf8_lossy(request_id.as_bytes()).into(),
        );
        if let Some(d) = &self.details {
            let v = serde_json::from_slice::<serde_json::Value>(d).unwrap_or_default();
            e.insert("details".into(), v);
        }
        if expose {
            e.insert("backend".into(), self.backend.as_deref().into());
            e.insert("detail".into(), self.detail.into());
        }
        let body = serde_json::json!({ "error": e });
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
        let code = Cow::Owned(e.code().to_string());
        let details = e.answer.as_ref().and_then(|a| a.details.clone());
        ApiError {
            status: StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY),
            code,
            message: e.message,
            step: e.step,
            backend: e.backend,
            detail: e.detail,
            details,
            allow: None,
            log: true,
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
    /// Handle one request (never fails: every error becomes a JSON response, and a panic while
    /// handling it becomes a 500 `internal_error` for this request only).
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let rid = self
            .request_ids
            .for_request(req.headers().get(&self.request_id_header));
        let mut resp = catch_panics(
            self.handle_unguarded(req, &rid),
            &self.panics,
            &rid,
            self.limits.expose_error_details,
        )
        .await;
        resp.headers_mut()
            .insert(self.request_id_header.clone(), rid);
        resp
    }

    async fn handle_unguarded(&self, req: Request<Incoming>, rid: &HeaderValue) -> Response<Body> {
        let start = Instant::now();
        if req.uri().path() == "/__fanout/status" {
            let mut resp = Response::new(Full::new(Bytes::from(self.status_json().to_string())));
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return resp;
        }
        let (parts, body) = req.into_parts();
        match self.handle_inner(&parts, body, start).await {
            Ok(out) => outcome_response(out),
            Err(e) => {
                self.errors.count(&e.code);
                if e.log {
                    self.log_failure(&e, rid, &parts.method, parts.uri.path());
                }
                e.into_response(rid, self.limits.expose_error_details)
            }
        }
    }

    /// The log line of a failed request, with the detail the client does not see.
    fn log_failure(&self, e: &ApiError, rid: &HeaderValue, method: &http::Method, path: &str) {
        let (write, suppressed) = self.error_log.admit(std::time::Instant::now());
        if suppressed > 0 {
            tracing::warn!(
                suppressed,
                "{suppressed} failed-request log lines were not written (server.error_log_per_second)"
            );
        }
        if !write {
            return;
        }
        let request_id = String::from_utf8_lossy(rid.as_bytes());
        let step = e.step.as_deref().unwrap_or("");
        let backend = e.backend.as_deref().unwrap_or("");
        let detail = e.detail.as_deref().unwrap_or("");
        if e.status.is_server_error() {
            tracing::warn!(%request_id, %method, path, status = e.status.as_u16(), code = %e.code, step = %step, backend = %backend, detail = %detail, "request failed: {}", e.message);
        } else {
            tracing::info!(%request_id, %method, path, status = e.status.as_u16(), code = %e.code, step = %step, backend = %backend, detail = %detail, "request refused: {}", e.message);
        }
    }

    async fn handle_inner(
        &self,
        parts: &http::request::Parts,
        body: Incoming,
        start: Instant,
    ) -> Result<Outcome, ApiError> {
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

        // Body: read completely *before* admission, so a body that trickles in holds a reader
        // permit (bounded), never a flow slot; its memory is counted against the budget until
        // the request ends. Requests without a body skip all of it.
        let (body_val, _memory) = if hyper::body::Body::is_end_stream(&body) {
            (Val::Null, None)
        } else {
            let (val, memory) = self
                .read_body(&parts.headers, body, start, deadline)
                .await?;
            (val, Some(memory))
        };

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

    /// Read and parse a request body (the request has one): refused early by `Content-Length`
    /// (413), under the body-reader cap (503 `body_readers_full`), the memory budget (503
    /// `memory_budget_exhausted`), the size limit while streaming (413), and the read time
    /// (408 `body_timeout`: `server.bodies.read_timeout` extended by `min_bytes_per_sec`, never
    /// past the route deadline). Returns the parsed value and the memory it holds.
    async fn read_body(
        &self,
        headers: &http::HeaderMap,
        mut body: Incoming,
        start: Instant,
        deadline: Instant,
    ) -> Result<(Val, Reservation), ApiError> {
        let limit = self.limits.max_body_bytes;
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|len| len.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(len) = declared
            && len > limit as u64
        {
            drain_rejected_body(&mut body, deadline).await;
            return Err(too_large(limit));
        }
        let Some(reader) = self.bodies.reader() else {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "body_readers_full",
                format!(
                    "{} requests are already sending their bodies (server.bodies.max_readers); retry later",
                    self.bodies.max_readers()
                ),
            ));
        };
        let cfg = &self.limits.bodies;
        let min_rate = cfg.min_bytes_per_sec;
        // Time allowed for the first `received` bytes: the initial allowance, one more second
        // per `min_rate` bytes, never past the deadline.
        let allowed = |received: usize| {
            let extra = if min_rate == 0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(received as f64 / min_rate as f64)
            };
            (start + cfg.read_timeout.0 + extra).min(deadline)
        };
        let budget_exhausted = || {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "memory_budget_exhausted",
                format!(
                    "the memory budget for in-flight request data ({} bytes, server.bodies.memory_budget_bytes) is exhausted; retry later",
                    self.bodies.budget()
                ),
            )
        };
        // A declared length takes its bytes (the part of the estimate known before reading)
        // at once: under contention requests are refused whole, instead of all of them taking
        // part of the budget and none completing. The per-value part is added as data arrives.
        let mut memory = self.bodies.reservation();
        let declared = declared.map(|n| n as usize);
        if let Some(n) = declared
            && memory.grow(n.saturating_mul(2)).is_err()
        {
            drain_rejected_body(&mut body, deadline).await;
            return Err(budget_exhausted());
        }
        let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0));
        loop {
            let until = allowed(buf.len());
            let frame = match tokio::time::timeout_at(until, body.frame()).await {
                Err(_) => {
                    self.bodies.timed_out();
                    return Err(if until >= deadline {
                        ApiError::new(
                            StatusCode::REQUEST_TIMEOUT,
                            "body_timeout",
                            "the request body did not arrive before the deadline",
                        )
                    } else {
                        ApiError::new(
                            StatusCode::REQUEST_TIMEOUT,
                            "body_timeout",
                            format!(
                                "the request body did not arrive in time: {} received, {:?} allowed \
                                 (server.bodies.read_timeout = {}, then server.bodies.min_bytes_per_sec = {})",
                                buf.len(),
                                until.saturating_duration_since(start),
                                cfg.read_timeout,
                                min_rate
                            ),
                        )
                    });
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "bad_body",
                        format!("reading the request body failed: {e}"),
                    ));
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if buf.len() + data.len() > limit {
                drain_rejected_body(&mut body, deadline).await;
                return Err(too_large(limit));
            }
            let cost = if declared.is_some() {
                value_overhead(&data)
            } else {
                parsed_size_estimate(&data)
            };
            if memory.grow(cost).is_err() {
                drain_rejected_body(&mut body, deadline).await;
                return Err(budget_exhausted());
            }
            buf.extend_from_slice(&data);
        }
        drop(reader);
        let bytes = buf.freeze();
        let val = if bytes.iter().all(u8::is_ascii_whitespace) {
            Val::Null
        } else {
            json::parse_limited(&bytes, self.limits.expressions.max_depth).map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_json",
                    format!("request body is not valid JSON: {e}"),
                )
            })?
        };
        Ok((val, memory))
    }
}

/// Run a request handler; a panic inside it becomes a 500 `internal_error` for this request
/// only (logged with its message, counted in `panics`). Whatever the handler held (admission
/// slot, body permits, memory) is released when its future is dropped.
pub(crate) async fn catch_panics<F>(
    fut: F,
    panics: &AtomicU64,
    rid: &HeaderValue,
    expose: bool,
) -> Response<Body>
where
    F: Future<Output = Response<Body>>,
{
    match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
        Ok(resp) => resp,
        Err(payload) => {
            panics.fetch_add(1, Ordering::Relaxed);
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_string());
            let request_id = String::from_utf8_lossy(rid.as_bytes());
            tracing::error!(%request_id, panic = %msg, "a request handler panicked; answered 500");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "the gateway failed while handling this request",
            )
            .into_response(rid, expose)
        }
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

/// Serve `gateway` on `listener` until `shutdown` resolves, then stop accepting, close idle
/// connections and give in-flight requests `grace` to finish.
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
        // The header read timeout is enforced per connection (`conn::drive`): hyper's timer
        // also runs while a keep-alive connection waits for its next request, which would cap
        // the idle time at the header timeout.
        .header_read_timeout(None)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(gateway.limits.max_concurrent_streams)
        .max_header_list_size(gateway.limits.max_header_bytes as u32);
    let builder = Arc::new(builder);
    let conns: Arc<Connections> = gateway.conns.clone();
    let grace = gateway.limits.shutdown_grace.0;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors: idle connections are closed, or accepting
                    // pauses briefly; logged at most once a second.
                    tokio::select! {
                        _ = conns.accept_failed(&e) => {}
                        _ = &mut shutdown => break,
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // At the connection cap the oldest idle connections make room; with none idle the new
        // connection is closed at once.
        if !conns.admit() {
            conns.refuse(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let sh = conns.register();
        let gw = gateway.clone();
        let on_conn = sh.clone();
        let svc = hyper::service::service_fn(move |req| {
            let gw = gw.clone();
            let sh = on_conn.clone();
            async move {
                let active = sh.request();
                let resp = gw
                    .handle(req)
                    .await
                    .map(|b| TrackedBody::new(b, sh.clone()));
                drop(active);
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(TrackedIo::new(stream, sh.clone())), svc)
            .into_owned();
        tokio::spawn(crate::conn::drive(conn, sh, conns.clone()));
    }
    drop(listener);
    conns.shutdown(grace).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_becomes_a_500_for_that_request_only() {
        let panics = AtomicU64::new(0);
        let resp = catch_panics(
            async {
                if panics.load(Ordering::Relaxed) == 0 {
                    panic!("secret internal detail");
                }
                Response::new(Full::new(Bytes::new()))
            },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "internal_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(!msg.contains("secret"), "no internals in the answer: {msg}");
        assert_eq!(v["error"]["request_id"], "rid-1");
        assert_eq!(panics.load(Ordering::Relaxed), 1);

        // The next request is served normally.
        let ok = catch_panics(
            async { Response::new(Full::new(Bytes::from_static(b"{}"))) },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(panics.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn what_the_panicking_handler_held_is_released() {
        struct Held<'a>(&'a AtomicU64);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let released = AtomicU64::new(0);
        let panics = AtomicU64::new(0);
        let resp = catch_panics(
            async {
                let _slot = Held(&released);
                tokio::task::yield_now().await;
                let v: Vec<u8> = Vec::new();
                #[allow(clippy::indexing_slicing)]
                let _ = v[1];
                Response::new(Full::new(Bytes::new()))
            },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(released.load(Ordering::Relaxed), 1);
        assert_eq!(panics.load(Ordering::Relaxed), 1);
    }
}
