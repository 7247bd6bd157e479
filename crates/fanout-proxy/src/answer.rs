//! What a client is answered: a flow's [`Outcome`] as a response ([`outcome_response`]), and every
//! refusal or failure as a status with a JSON error body ([`ApiError`]), counted by `code`
//! ([`ErrorCounts`]). The request lifecycle that decides which answer is in `server.rs`.

use bytes::Bytes;
use fanout_config::Dur;
use fanout_flow::{FlowError, Outcome};
use fanout_transport::admission::Rejection;
use fanout_transport::body::Body;
use http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// Every `error.code` the gateway answers with by itself (its refusals, gRPC's and a panic's);
/// with the flow's ([`fanout_flow::ErrorKind::all`]) and the config's, each has a
/// `fanout_errors_total` series from the start. A test checks that every code given to
/// [`ApiError::new`] in this crate is listed.
pub(crate) const GATEWAY_CODES: [&str; 26] = [
    "overloaded",
    "not_found",
    "method_not_allowed",
    "bad_header",
    "bad_path",
    "bad_query",
    "body_too_large",
    "body_readers_full",
    "memory_budget_exhausted",
    "body_timeout",
    "bad_body",
    "invalid_json",
    "internal_error",
    "unsupported_content_type",
    "unsupported_compression",
    "unknown_method",
    "flow_status",
    "bad_answer_message",
    "invalid_message",
    "message_too_large",
    "upgrade_required",
    "bad_handshake",
    "origin_refused",
    "websocket_limit",
    "shutting_down",
    "invalid_request",
];

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

    /// Every code with its count.
    pub(crate) fn snapshot(&self) -> Vec<(String, u64)> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::to_value(&*m).unwrap_or_default()
    }
}

/// A client-side error (bad request) or a flow failure, rendered as JSON.
#[derive(Clone)]
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
    /// The gRPC code for a gRPC client when the error's class names one (else the one its
    /// status and code imply: `fanout_grpc::Code::for_answer`).
    pub grpc: Option<fanout_grpc::Code>,
    /// More headers of the answer (a rate limit's `Retry-After`, `RateLimit-Policy`, `RateLimit`).
    pub headers: Vec<(http::HeaderName, HeaderValue)>,
    /// `WWW-Authenticate` of an authentication refusal (RFC 6750).
    pub www_authenticate: Option<HeaderValue>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError::coded(status, Cow::Borrowed(code), message)
    }

    /// [`ApiError::new`] with a code of another part (an edge stage's refusal).
    fn coded(status: StatusCode, code: Cow<'static, str>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            step: None,
            backend: None,
            detail: None,
            details: None,
            allow: None,
            log: false,
            grpc: None,
            headers: Vec::new(),
            www_authenticate: None,
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
        let mut resp = Response::new(Body::full(Bytes::from(body.to_string())));
        *resp.status_mut() = self.status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(allow) = self.allow {
            resp.headers_mut().insert(ALLOW, allow);
        }
        if let Some(challenge) = self.www_authenticate {
            resp.headers_mut().insert(WWW_AUTHENTICATE, challenge);
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        for (k, v) in self.headers {
            resp.headers_mut().insert(k, v);
        }
        resp
    }
}

impl From<FlowError> for ApiError {
    fn from(e: FlowError) -> Self {
        let code = Cow::Owned(e.code().to_string());
        let details = e.answer.as_ref().and_then(|a| a.details.clone());
        let grpc = match e.kind {
            fanout_flow::ErrorKind::Class(c) if e.answer.is_none() => c.grpc,
            _ => None,
        };
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
            grpc,
            headers: Vec::new(),
            www_authenticate: None,
        }
    }
}

impl From<fanout_openapi::Invalid> for ApiError {
    /// 400 `invalid_request`: the request does not match its route's declared schemas; the
    /// pointer and keyword in `error.details`.
    fn from(e: fanout_openapi::Invalid) -> Self {
        let mut a = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.message);
        a.details = Some(Bytes::from(e.details.to_string()));
        a
    }
}

impl From<Rejection> for ApiError {
    /// 503 `overloaded`, with why the request was not admitted.
    fn from(r: Rejection) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            match r {
                Rejection::QueueFull => {
                    "the gateway is at its concurrency limit and its queue is full; retry later"
                }
                Rejection::Waited => {
                    "the gateway is at its concurrency limit and the request waited too long; retry later"
                }
                Rejection::WouldWait => {
                    "the gateway is at its concurrency limit and no slot would free within the time the request may wait; retry later"
                }
            },
        )
    }
}

/// The server's refusals of a request by its head, before any body is read: no route (404), no
/// route for the method (405 with `Allow`), a path parameter or a deadline header that does not
/// decode (400). Each maps to one status, `code` and message (`From<Refusal> for ApiError`).
#[derive(Debug)]
pub(crate) enum Refusal<'a> {
    /// No route has this path: 404 `not_found`.
    NoRoute { path: &'a str },
    /// Routes have this path, none this method: 405 `method_not_allowed`, `Allow: <allow>`.
    MethodNotAllowed {
        method: &'a http::Method,
        path: &'a str,
        allow: Vec<&'a str>,
    },
    /// The deadline header (`server.deadline_header`) is not a number of milliseconds: 400
    /// `bad_header`.
    BadDeadline { header: &'a http::HeaderName },
    /// `grpc-timeout` is not `<digits><unit>`: 400 `bad_header`.
    BadGrpcTimeout,
    /// The path parameter `param` does not percent-decode (a bad `%` escape, or not UTF-8 after
    /// decoding): 400 `bad_path`.
    BadPath {
        param: &'a str,
        why: fanout_expr::request::PathParamError,
    },
    /// A query parameter or header the flow reads is not UTF-8: 400 `bad_query` /
    /// `bad_header`, naming it.
    NotText(fanout_expr::request::RequestTextError),
    /// A header that may appear once (`Host`, `Authorization`) appears more than once: 400
    /// `bad_header`. Which of them counts would be a guess: authentication would verify one
    /// while `$request.headers` and the backends see them joined.
    RepeatedHeader { header: &'static http::HeaderName },
}

/// An edge stage's refusal (`fanout-edge`): its status, code, message and headers; the detail for
/// the log only.
impl From<fanout_edge::Rejection> for ApiError {
    fn from(r: fanout_edge::Rejection) -> Self {
        let mut e = ApiError::coded(r.status, r.code, r.message);
        e.detail = r.detail;
        e.log = r.log;
        e.headers = r.headers;
        e
    }
}

impl From<Refusal<'_>> for ApiError {
    fn from(r: Refusal<'_>) -> Self {
        match r {
            Refusal::NoRoute { path } => ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no route for {path}"),
            ),
            Refusal::MethodNotAllowed {
                method,
                path,
                allow,
            } => {
                let allow = allow.join(", ");
                let mut e = ApiError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    format!("{method} is not allowed on {path}; allowed: {allow}"),
                );
                e.allow = HeaderValue::from_str(&allow).ok();
                e
            }
            Refusal::BadDeadline { header } => ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_header",
                format!("header {header}: expected a number of milliseconds"),
            ),
            Refusal::RepeatedHeader { header } => ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_header",
                format!("header {header} is sent more than once; it may appear once"),
            ),
            Refusal::BadGrpcTimeout => ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_header",
                "header grpc-timeout: expected e.g. `500m` (digits and one of H M S m u n)",
            ),
            Refusal::BadPath { param, why } => ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_path",
                format!("path parameter `{param}`: {why}"),
            ),
            Refusal::NotText(why) => match why {
                fanout_expr::request::RequestTextError::Query(_) => {
                    ApiError::new(StatusCode::BAD_REQUEST, "bad_query", why.to_string())
                }
                fanout_expr::request::RequestTextError::Header(_) => {
                    ApiError::new(StatusCode::BAD_REQUEST, "bad_header", why.to_string())
                }
            },
        }
    }
}

/// Why a request body was refused, before, while or after it was read. Each maps to one status,
/// `code` and message (`From<BodyRefusal> for ApiError`); [`BodyRefusal::drains`] says whether
/// the unread rest of the body is read and discarded before the answer is sent.
#[derive(Debug)]
pub(crate) enum BodyRefusal {
    /// Declared by `Content-Length`, or grown while streaming, past `server.max_body_bytes`
    /// (`limit`): 413 `body_too_large`.
    TooLarge { limit: usize },
    /// `server.bodies.max_readers` bodies are being read: 503 `body_readers_full`.
    ReadersFull { max_readers: usize },
    /// No room left in `server.bodies.memory_budget_bytes` (`budget`): 503
    /// `memory_budget_exhausted`.
    MemoryBudget { budget: usize },
    /// The route deadline came before the whole body: 408 `body_timeout`.
    PastDeadline,
    /// Slower than `server.bodies.read_timeout`, then `min_bytes_per_sec`, allow: `received`
    /// bytes had arrived when `allowed` (since arrival) was up: 408 `body_timeout`.
    TooSlow {
        received: usize,
        allowed: Duration,
        read_timeout: Dur,
        min_bytes_per_sec: u64,
    },
    /// The transport failed while the body was read: 400 `bad_body`.
    Broken(hyper::Error),
    /// The whole body is not JSON (or nests deeper than `server.expressions.max_depth`): 400
    /// `invalid_json`.
    InvalidJson(fanout_expr::json::ParseError),
}

impl BodyRefusal {
    /// Whether the rest of the body is drained (a bounded part of it) before answering: a client
    /// still writing a body the server refuses would otherwise get a broken pipe instead of the
    /// answer. Only refusals that leave a client writing — the body is too large for the limit or
    /// the memory budget — drain.
    pub(crate) fn drains(&self) -> bool {
        matches!(
            self,
            BodyRefusal::TooLarge { .. } | BodyRefusal::MemoryBudget { .. }
        )
    }
}

impl From<BodyRefusal> for ApiError {
    fn from(r: BodyRefusal) -> Self {
        match r {
            BodyRefusal::TooLarge { limit } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body exceeds {limit} bytes (server.max_body_bytes)"),
            ),
            BodyRefusal::ReadersFull { max_readers } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "body_readers_full",
                format!(
                    "{max_readers} requests are already sending their bodies (server.bodies.max_readers); retry later"
                ),
            ),
            BodyRefusal::MemoryBudget { budget } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "memory_budget_exhausted",
                format!(
                    "the memory budget for in-flight request data ({budget} bytes, server.bodies.memory_budget_bytes) is exhausted; retry later"
                ),
            ),
            BodyRefusal::PastDeadline => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the request body did not arrive before the deadline",
            ),
            BodyRefusal::TooSlow {
                received,
                allowed,
                read_timeout,
                min_bytes_per_sec,
            } => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive in time: {received} received, {allowed:?} allowed \
                     (server.bodies.read_timeout = {read_timeout}, then server.bodies.min_bytes_per_sec = {min_bytes_per_sec})"
                ),
            ),
            BodyRefusal::Broken(e) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_body",
                format!("reading the request body failed: {e}"),
            ),
            BodyRefusal::InvalidJson(e) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("request body is not valid JSON: {e}"),
            ),
        }
    }
}

/// A flow's answer: its status (200 if out of range), `Content-Type: application/json`, then its
/// own headers.
pub(crate) fn outcome_response(out: Outcome) -> Response<Body> {
    let body = match &out.value {
        // A gRPC route called over HTTP: its answer as JSON.
        Some(v) if out.body.is_empty() => {
            let mut b = Vec::with_capacity(256);
            fanout_expr::json::write(v, &mut b);
            Bytes::from(b)
        }
        _ => out.body,
    };
    let mut resp = Response::new(Body::full(body));
    *resp.status_mut() = StatusCode::from_u16(out.status).unwrap_or(StatusCode::OK);
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (k, v) in out.headers {
        h.insert(k, v);
    }
    resp
}

impl crate::Gateway {
    /// Respond with a refusal or failure: counted by code, logged when it says so, rendered as
    /// the JSON error body.
    pub(crate) fn error_response(
        &self,
        e: ApiError,
        rid: &HeaderValue,
        parts: &http::request::Parts,
    ) -> Response<Body> {
        self.errors.count(&e.code);
        if e.log {
            self.log_failure(&e, rid, &parts.method, parts.uri.path());
        }
        e.into_response(rid, self.limits.expose_error_details)
    }

    /// The log line of a failed request, with the detail the client does not see.
    pub(crate) fn log_failure(
        &self,
        e: &ApiError,
        rid: &HeaderValue,
        method: &http::Method,
        path: &str,
    ) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(e: ApiError) -> (u16, String, String) {
        (e.status.as_u16(), e.code.to_string(), e.message)
    }

    #[test]
    fn body_refusals_keep_their_status_code_and_message() {
        let too_large = ApiError::from(BodyRefusal::TooLarge { limit: 10 });
        assert_eq!(
            parts(too_large),
            (
                413,
                "body_too_large".into(),
                "request body exceeds 10 bytes (server.max_body_bytes)".into()
            )
        );
        let slow = ApiError::from(BodyRefusal::TooSlow {
            received: 3,
            allowed: Duration::from_millis(1500),
            read_timeout: Dur::secs(1),
            min_bytes_per_sec: 2,
        });
        assert!(!slow.log);
        assert_eq!(
            parts(slow),
            (
                408,
                "body_timeout".into(),
                "the request body did not arrive in time: 3 received, 1.5s allowed \
                 (server.bodies.read_timeout = 1s, then server.bodies.min_bytes_per_sec = 2)"
                    .into()
            )
        );
        let budget = ApiError::from(BodyRefusal::MemoryBudget { budget: 7 });
        assert_eq!(budget.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(budget.code, "memory_budget_exhausted");
    }

    #[test]
    fn only_refusals_that_leave_a_client_writing_drain_the_body() {
        assert!(BodyRefusal::TooLarge { limit: 1 }.drains());
        assert!(BodyRefusal::MemoryBudget { budget: 1 }.drains());
        assert!(!BodyRefusal::ReadersFull { max_readers: 1 }.drains());
        assert!(!BodyRefusal::PastDeadline.drains());
        let bad_json = fanout_expr::json::parse(b"{").unwrap_err();
        assert!(!BodyRefusal::InvalidJson(bad_json).drains());
    }

    #[test]
    fn a_path_parameter_that_does_not_decode_is_a_400_naming_it() {
        use fanout_expr::request::PathParamError;
        let e = ApiError::from(Refusal::BadPath {
            param: "id",
            why: PathParamError::BadEscape,
        });
        assert!(!e.log);
        assert_eq!(
            parts(e),
            (
                400,
                "bad_path".into(),
                "path parameter `id`: invalid percent-encoding (a `%` must be followed by two hex digits)"
                    .into()
            )
        );
        let e = ApiError::from(Refusal::BadPath {
            param: "id",
            why: PathParamError::NotUtf8,
        });
        assert_eq!(
            e.message,
            "path parameter `id`: not UTF-8 after percent-decoding"
        );
    }

    #[test]
    fn a_wrong_method_is_a_405_with_allow() {
        let e = ApiError::from(Refusal::MethodNotAllowed {
            method: &http::Method::DELETE,
            path: "/a",
            allow: vec!["GET", "POST"],
        });
        assert_eq!(e.allow, Some(HeaderValue::from_static("GET, POST")));
        assert_eq!(
            parts(e),
            (
                405,
                "method_not_allowed".into(),
                "DELETE is not allowed on /a; allowed: GET, POST".into()
            )
        );
    }

    /// The top-level arguments of the call whose `(` ends `text[..at]`: string literals kept
    /// whole (with their quotes), nested brackets skipped.
    fn call_args(text: &str, at: usize) -> Vec<String> {
        let mut args = vec![String::new()];
        let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
        for c in text[at..].chars() {
            if in_str {
                in_str = c != '"' || escaped;
                escaped = c == '\\' && !escaped;
            } else {
                match c {
                    '"' => in_str = true,
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' if depth == 0 => break,
                    ')' | ']' | '}' => depth -= 1,
                    ',' if depth == 0 => {
                        args.push(String::new());
                        continue;
                    }
                    _ => {}
                }
            }
            if let Some(a) = args.last_mut() {
                a.push(c);
            }
        }
        args.into_iter().map(|a| a.trim().to_string()).collect()
    }

    #[test]
    fn every_code_the_gateway_answers_with_is_listed() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src];
        let mut found = std::collections::BTreeSet::new();
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            if p.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            // The code is the second argument of `ApiError::new`, the first of grpc's
            // `unimplemented`; a literal there is a code.
            // (The patterns are split so that this test does not find itself.)
            let calls = [
                (concat!("ApiError::new", "("), 1),
                (concat!("unimplemented", "("), 0),
            ];
            for (call, arg) in calls {
                for (i, _) in text.match_indices(call) {
                    let args = call_args(&text, i + call.len());
                    if let Some(code) = args.get(arg).and_then(|a| a.strip_prefix('"')) {
                        found.insert(code.trim_end_matches('"').to_string());
                    }
                }
            }
        }
        let listed: std::collections::BTreeSet<String> =
            GATEWAY_CODES.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            found, listed,
            "GATEWAY_CODES (answer.rs) must list exactly the codes of ApiError::new in src/"
        );
    }
}
