//! [`FlowError`]: why a request failed, with the step and backend it concerns, the status code the
//! client gets and whether a retry would be safe.

use bytes::Bytes;
use fanout_layers::backend::{CallError, CallErrorKind, RejectReason};
use fanout_layers::outcome::CallClass;
use std::fmt;
use std::sync::Arc;

/// What went wrong. Each kind maps to one status code and one stable `code` string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A backend call exceeded its timeout (504 `backend_timeout`).
    BackendTimeout,
    /// The route deadline passed (504 `deadline_exceeded`).
    DeadlineExceeded,
    /// No connection to the backend (502 `backend_unavailable`).
    BackendUnavailable,
    /// The connection broke mid-call (502 `backend_reset`).
    BackendReset,
    /// The backend answered with an error status (502 `backend_status`, or that status with
    /// `status_passthrough`).
    BackendStatus {
        /// The backend's status code.
        status: u16,
        /// Whether to pass it to the client.
        passthrough: bool,
    },
    /// The backend's answer was not usable: invalid JSON, too large, or `result` failed on it
    /// (502 `bad_backend_answer`).
    BadBackendAnswer,
    /// A call was refused locally (503 `backend_rejected`).
    Rejected,
    /// A backend call could not be built from its values: they do not make a valid request (a
    /// header value with a newline, a URI too long), so nothing was sent. The flow's fault, never
    /// the backend's (500 `invalid_call`).
    InvalidCall,
    /// An expression failed at run time on request data or step values (500 `expression_failed`).
    Expression,
    /// An expression exceeded a limit of `server.expressions` — work, size or depth of what it
    /// builds (500 `expression_limit`).
    ExpressionLimit,
    /// A key looked up through a batch form is absent from the answer (404 `key_not_found`).
    KeyNotFound,
    /// The compute pool refused the work: its queue is full (503 `overloaded`).
    Overloaded,
    /// The backend of a required step answered 404 and the step does not map it otherwise
    /// (404 `not_found`, naming the step).
    NotFound,
    /// A `fail` step ended the request, or an `on_status` entry mapped a backend status: the
    /// status and code are the error's [`Answer`].
    Answered,
    /// A backend's connection pool is exhausted: every connection busy and its waiters full,
    /// or none free in the time allowed (503 `pool_exhausted`).
    PoolExhausted,
    /// The gateway's memory budget for in-flight data (`server.bodies.memory_budget_bytes`) had
    /// no room for a backend's answer as it arrived (a database statement's rows): 503
    /// `memory_budget_exhausted`, the code of a request body refused by the same budget.
    MemoryBudget,
    /// An error of a class a step kind or a backend protocol defines for itself (the `sql`
    /// step's `conflict`, `database_unavailable`, `pool_exhausted` …, the `model` step's
    /// `model_queue_full` …): its code, status and outcome class are the class's.
    Class(&'static ErrorClass),
}

/// A class of errors a step kind or a backend protocol defines in its own module, registered
/// with its kind (`step::ERROR_CLASSES`): a stable `error.code`, the HTTP status and gRPC code
/// the client gets, and how the call's outcome is classified (which decides retries, breakers
/// and metrics: [`CallClass`]). The central [`ErrorKind`] holds only what every kind shares.
#[derive(Debug, PartialEq, Eq)]
pub struct ErrorClass {
    /// The stable `error.code`.
    pub code: &'static str,
    /// The HTTP status for the client.
    pub status: u16,
    /// The gRPC code for a gRPC client, when it is not the one the status implies
    /// (`fanout_grpc::Code::for_answer`): `RESOURCE_EXHAUSTED` for a refusal of a full queue.
    pub grpc: Option<fanout_grpc::Code>,
    /// How a call that ended with this error is classified (retry safety, breakers, metrics).
    pub outcome: CallClass,
    /// The status a step's `on_status` sees for this error (a database's 409, 422, 503, 500,
    /// or 404 for no row), if `on_status` applies to it.
    pub on_status: Option<u16>,
    /// The message of a 404 that `on_status` leaves to the default (`not_found`).
    pub not_found: Option<&'static str>,
}

impl ErrorClass {
    /// A class with `code` and `status`, classified as `outcome`, nothing else.
    pub const fn new(code: &'static str, status: u16, outcome: CallClass) -> ErrorClass {
        ErrorClass {
            code,
            status,
            grpc: None,
            outcome,
            on_status: None,
            not_found: None,
        }
    }
}

impl ErrorKind {
    /// The kinds every step shares, `BackendStatus` once (its code does not depend on the
    /// status); [`crate::error_kinds`] adds the step kinds' classes.
    pub const CORE: [ErrorKind; 16] = [
        ErrorKind::BackendTimeout,
        ErrorKind::DeadlineExceeded,
        ErrorKind::BackendUnavailable,
        ErrorKind::BackendReset,
        ErrorKind::BackendStatus {
            status: 502,
            passthrough: false,
        },
        ErrorKind::BadBackendAnswer,
        ErrorKind::Rejected,
        ErrorKind::InvalidCall,
        ErrorKind::Expression,
        ErrorKind::ExpressionLimit,
        ErrorKind::KeyNotFound,
        ErrorKind::Overloaded,
        ErrorKind::NotFound,
        ErrorKind::Answered,
        ErrorKind::PoolExhausted,
        ErrorKind::MemoryBudget,
    ];

    /// HTTP status code for the client.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::BackendTimeout | ErrorKind::DeadlineExceeded => 504,
            ErrorKind::BackendUnavailable
            | ErrorKind::BackendReset
            | ErrorKind::BadBackendAnswer => 502,
            ErrorKind::BackendStatus {
                status,
                passthrough: true,
            } if (400..=599).contains(&status) => status,
            ErrorKind::BackendStatus { .. } => 502,
            ErrorKind::Rejected
            | ErrorKind::Overloaded
            | ErrorKind::PoolExhausted
            | ErrorKind::MemoryBudget => 503,
            ErrorKind::Expression | ErrorKind::ExpressionLimit | ErrorKind::InvalidCall => 500,
            ErrorKind::Class(c) => c.status,
            ErrorKind::KeyNotFound | ErrorKind::NotFound => 404,
            ErrorKind::Answered => 400,
        }
    }
    /// Stable machine-readable code for the error body.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::BackendTimeout => "backend_timeout",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
            ErrorKind::BackendUnavailable => "backend_unavailable",
            ErrorKind::BackendReset => "backend_reset",
            ErrorKind::BackendStatus { .. } => "backend_status",
            ErrorKind::BadBackendAnswer => "bad_backend_answer",
            ErrorKind::Rejected => "backend_rejected",
            ErrorKind::InvalidCall => "invalid_call",
            ErrorKind::Expression => "expression_failed",
            ErrorKind::ExpressionLimit => "expression_limit",
            ErrorKind::KeyNotFound => "key_not_found",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Answered => "bad_request",
            ErrorKind::PoolExhausted => "pool_exhausted",
            ErrorKind::MemoryBudget => "memory_budget_exhausted",
            ErrorKind::Class(c) => c.code,
        }
    }
}

/// The message of [`ErrorKind::InvalidCall`] (the detail says what was invalid).
pub const INVALID_CALL: &str =
    "the backend call could not be built: its values do not make a valid request";

/// A client answer chosen by the config: a `fail` step, or an `on_status` mapping.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code (400–599).
    pub status: u16,
    /// `error.code`.
    pub code: Arc<str>,
    /// `error.details` (JSON text), from a `fail` step's `details`.
    pub details: Option<Bytes>,
}

/// A failed request, with context. `message` is safe to show a client (it never carries backend
/// bodies, addresses, backend names or expression errors over data); `detail` is for the log
/// line of the request (and for clients only with `server.expose_error_details`).
#[derive(Debug, Clone, thiserror::Error)]
pub struct FlowError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// A safe, human-readable message, without the step (rendered next to it).
    pub message: String,
    /// The internal detail: backend status and body excerpt, transport error, expression error.
    pub detail: Option<String>,
    /// The step concerned, if any.
    pub step: Option<Arc<str>>,
    /// The backend concerned, if any.
    pub backend: Option<Arc<str>>,
    /// The status and code chosen by the config (`fail` steps, `on_status`), if any.
    pub answer: Option<Arc<Answer>>,
    /// The failed call behind this error, if any (its kind, message and transport error).
    #[source]
    pub source: Option<Arc<CallError>>,
}

impl fmt::Display for FlowError {
    /// The full text for logs: step, message, backend and detail.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.step {
            write!(f, "step `{s}`: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(b) = &self.backend {
            write!(f, " [backend `{b}`]")?;
        }
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

impl FlowError {
    /// A new error without context.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        FlowError {
            kind,
            message: message.into(),
            detail: None,
            step: None,
            backend: None,
            answer: None,
            source: None,
        }
    }
    /// From a transport error of a call made by `step` to `backend`.
    pub fn from_call(e: CallError, step: &Arc<str>, backend: &Arc<str>) -> Self {
        let (kind, message) = match e.kind {
            CallErrorKind::Timeout => (
                ErrorKind::BackendTimeout,
                "the backend did not answer in time",
            ),
            CallErrorKind::Connect => (
                ErrorKind::BackendUnavailable,
                "the backend could not be reached",
            ),
            CallErrorKind::Reset => (
                ErrorKind::BackendReset,
                "the connection to the backend broke during the call",
            ),
            CallErrorKind::BodyTooLarge => (
                ErrorKind::BadBackendAnswer,
                "the backend's answer is larger than allowed",
            ),
            CallErrorKind::BadEncoding => (
                ErrorKind::BadBackendAnswer,
                "the backend's answer is in an encoding that does not decode",
            ),
            CallErrorKind::Rejected(fanout_layers::backend::RejectReason::Pool) => (
                ErrorKind::PoolExhausted,
                "the database's connection pool is exhausted",
            ),
            CallErrorKind::Rejected(fanout_layers::backend::RejectReason::Memory) => (
                ErrorKind::MemoryBudget,
                "the memory budget for in-flight data (server.bodies.memory_budget_bytes) has no room for the backend's answer; retry later",
            ),
            CallErrorKind::Rejected(fanout_layers::backend::RejectReason::RateLimit) => (
                ErrorKind::Rejected,
                "the backend's rate limit (rate_limit) had no room for the call within its time",
            ),
            CallErrorKind::Rejected(_) => (
                ErrorKind::Rejected,
                "the call was refused by the gateway's protection of the backend (bulkhead or open circuit breaker)",
            ),
            CallErrorKind::Invalid => (ErrorKind::InvalidCall, INVALID_CALL),
        };
        let mut out = FlowError::new(kind, message)
            .in_step(step)
            .with_backend(backend)
            .with_detail(e.message.clone());
        out.source = Some(Arc::new(e));
        out
    }
    /// Drop the step (for errors shared by several steps).
    pub fn without_step(mut self) -> Self {
        self.step = None;
        self
    }
    /// Attach the step.
    pub fn in_step(mut self, step: &Arc<str>) -> Self {
        self.step = Some(step.clone());
        self
    }
    /// Attach the backend.
    pub fn with_backend(mut self, backend: &Arc<str>) -> Self {
        self.backend = Some(backend.clone());
        self
    }
    /// Attach the internal detail (for the log).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
    /// Attach the answer chosen by the config.
    pub fn with_answer(mut self, answer: Answer) -> Self {
        self.answer = Some(Arc::new(answer));
        self
    }
    /// HTTP status for the client.
    pub fn status(&self) -> u16 {
        match &self.answer {
            Some(a) => a.status,
            None => self.kind.status(),
        }
    }
    /// `error.code` for the client.
    pub fn code(&self) -> &str {
        match &self.answer {
            Some(a) => &a.code,
            None => self.kind.code(),
        }
    }
}

/// The `error.code` of an answer chosen by the config for a backend's status: `code` if given,
/// else derived from the status ([`code_for_status`]).
pub fn answer_code(status: u16, code: Option<&str>) -> Arc<str> {
    code.map_or_else(|| code_for_status(status), Arc::from)
}

/// The `error.code` of a status chosen for a backend's answer: the reason phrase of a 4xx in
/// snake case (`not_found`, `conflict`, `unprocessable_entity`, …), `backend_status` otherwise.
pub fn code_for_status(status: u16) -> Arc<str> {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .filter(|_| (400..500).contains(&status))
        .and_then(|s| s.canonical_reason());
    match reason {
        Some(r) => r
            .chars()
            .filter_map(|c| match c {
                ' ' | '-' => Some('_'),
                c if c.is_ascii_alphanumeric() => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect::<String>()
            .into(),
        None => "backend_status".into(),
    }
}

/// Classify a step's call: `Ok(())` for an answer the step accepted, else its error (the
/// transport kind from its `source` when there is one, else its [`ErrorKind`]).
pub fn call_class(result: Result<(), &FlowError>) -> CallClass {
    let e = match result {
        Ok(()) => return CallClass::Ok,
        Err(e) => e,
    };
    if let Some(src) = &e.source {
        return match src.kind {
            CallErrorKind::Timeout => CallClass::Timeout,
            CallErrorKind::Connect => CallClass::Refused,
            CallErrorKind::Reset => CallClass::Reset,
            CallErrorKind::BodyTooLarge | CallErrorKind::BadEncoding => CallClass::BadAnswer,
            CallErrorKind::Rejected(RejectReason::Bulkhead) => CallClass::RejectedBulkhead,
            CallErrorKind::Rejected(RejectReason::Breaker) => CallClass::RejectedBreaker,
            CallErrorKind::Rejected(RejectReason::Pool) => CallClass::RejectedPool,
            CallErrorKind::Rejected(RejectReason::Memory | RejectReason::RateLimit) => {
                CallClass::Other
            }
            CallErrorKind::Invalid => CallClass::InvalidCall,
        };
    }
    match e.kind {
        ErrorKind::BackendTimeout | ErrorKind::DeadlineExceeded => CallClass::Timeout,
        ErrorKind::BackendUnavailable => CallClass::Refused,
        ErrorKind::BackendReset => CallClass::Reset,
        ErrorKind::BadBackendAnswer => CallClass::BadAnswer,
        ErrorKind::BackendStatus { status, .. } => match status {
            400..=499 => CallClass::Status4xx,
            500..=599 => CallClass::Status5xx,
            _ => CallClass::Other,
        },
        ErrorKind::NotFound => CallClass::Status4xx,
        ErrorKind::PoolExhausted => CallClass::RejectedPool,
        ErrorKind::InvalidCall => CallClass::InvalidCall,
        ErrorKind::Class(c) => c.outcome,
        ErrorKind::Rejected
        | ErrorKind::KeyNotFound
        | ErrorKind::Expression
        | ErrorKind::ExpressionLimit
        | ErrorKind::Overloaded
        | ErrorKind::MemoryBudget
        | ErrorKind::Answered => CallClass::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_kind() {
        // A new kind does not compile here until it is matched — then add it to `CORE`.
        let listed = ErrorKind::CORE.iter().filter(|k| match k {
            ErrorKind::BackendTimeout
            | ErrorKind::DeadlineExceeded
            | ErrorKind::BackendUnavailable
            | ErrorKind::BackendReset
            | ErrorKind::BackendStatus { .. }
            | ErrorKind::BadBackendAnswer
            | ErrorKind::Rejected
            | ErrorKind::InvalidCall
            | ErrorKind::Expression
            | ErrorKind::ExpressionLimit
            | ErrorKind::KeyNotFound
            | ErrorKind::Overloaded
            | ErrorKind::NotFound
            | ErrorKind::Answered
            | ErrorKind::PoolExhausted
            | ErrorKind::MemoryBudget => true,
            ErrorKind::Class(_) => false,
        });
        let codes: std::collections::BTreeSet<&str> = listed.map(|k| k.code()).collect();
        assert_eq!(codes.len(), ErrorKind::CORE.len(), "a kind is listed twice");
        // The classes of the step kinds the compiler is given come after the core kinds (the
        // gateway's kinds: fanout-proxy's registry test).
        static MINE: ErrorClass = ErrorClass::new("mine", 418, CallClass::Other);
        static ERRORS: [&ErrorClass; 1] = [&MINE];
        let kind = crate::kind::Registration {
            compile: |_, _| None,
            errors: &ERRORS,
        };
        let all = crate::error_kinds(&[kind]);
        assert_eq!(all.len(), ErrorKind::CORE.len() + 1);
        assert_eq!(all.last(), Some(&ErrorKind::Class(&MINE)));
    }

    #[test]
    fn codes_for_statuses() {
        assert_eq!(&*code_for_status(404), "not_found");
        assert_eq!(&*code_for_status(409), "conflict");
        assert_eq!(&*code_for_status(422), "unprocessable_entity");
        assert_eq!(&*code_for_status(429), "too_many_requests");
        assert_eq!(&*code_for_status(503), "backend_status");
        assert_eq!(&*code_for_status(499), "backend_status");
    }

    #[test]
    fn the_log_text_has_the_detail_the_message_does_not() {
        let e = FlowError::from_call(
            CallError::new(CallErrorKind::Connect, "connect 10.0.0.7:9001: refused"),
            &Arc::from("order"),
            &Arc::from("orders"),
        );
        assert!(!e.message.contains("10.0.0.7"));
        assert!(!e.message.contains("orders"));
        assert!(e.to_string().contains("10.0.0.7"), "{e}");
        assert!(e.to_string().starts_with("step `order`: "), "{e}");
    }

    /// A step's call, classified from its error: by the transport kind of its source when it
    /// has one, else by the error's kind.
    #[test]
    fn step_calls_are_classified_once() {
        use std::sync::Arc;
        let (step, backend): (Arc<str>, Arc<str>) = ("s".into(), "b".into());
        let call = |k| FlowError::from_call(CallError::new(k, "x"), &step, &backend);
        let kind = |k| FlowError::new(k, "x");
        let status = |status| {
            kind(ErrorKind::BackendStatus {
                status,
                passthrough: false,
            })
        };
        let rows: Vec<(Option<FlowError>, &str)> = vec![
            (None, "ok"),
            (Some(call(CallErrorKind::Timeout)), "timeout"),
            (Some(call(CallErrorKind::Connect)), "refused"),
            (Some(call(CallErrorKind::Reset)), "reset"),
            (Some(call(CallErrorKind::BodyTooLarge)), "bad_answer"),
            (Some(call(CallErrorKind::BadEncoding)), "bad_answer"),
            (
                Some(call(CallErrorKind::Rejected(RejectReason::Bulkhead))),
                "rejected_bulkhead",
            ),
            (
                Some(call(CallErrorKind::Rejected(RejectReason::Breaker))),
                "rejected_breaker",
            ),
            (Some(call(CallErrorKind::Invalid)), "invalid_call"),
            (Some(kind(ErrorKind::InvalidCall)), "invalid_call"),
            (Some(kind(ErrorKind::BackendTimeout)), "timeout"),
            (Some(kind(ErrorKind::DeadlineExceeded)), "timeout"),
            (Some(kind(ErrorKind::BadBackendAnswer)), "bad_answer"),
            (Some(status(404)), "status_4xx"),
            (Some(status(503)), "status_5xx"),
            (Some(status(304)), "other"),
            (Some(kind(ErrorKind::Overloaded)), "other"),
        ];
        for (e, label) in &rows {
            let r = match e {
                Some(e) => Err(e),
                None => Ok(()),
            };
            assert_eq!(call_class(r).label(), *label, "{e:?}");
        }
        for (i, c) in CallClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
