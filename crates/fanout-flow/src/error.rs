//! [`FlowError`]: why a request failed, with the step and backend it concerns, the status code the
//! client gets and whether a retry would be safe.

use crate::backend::{CallError, CallErrorKind};
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
    /// An expression failed at run time on request data or step values (500 `expression_failed`).
    Expression,
    /// An expression exceeded a limit of `server.expressions` — work, size or depth of what it
    /// builds (500 `expression_limit`).
    ExpressionLimit,
    /// A key looked up through a batch form is absent from the answer (404 `key_not_found`).
    KeyNotFound,
    /// The compute pool refused the work: its queue is full (503 `overloaded`).
    Overloaded,
}

impl ErrorKind {
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
            ErrorKind::Rejected | ErrorKind::Overloaded => 503,
            ErrorKind::Expression | ErrorKind::ExpressionLimit => 500,
            ErrorKind::KeyNotFound => 404,
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
            ErrorKind::Expression => "expression_failed",
            ErrorKind::ExpressionLimit => "expression_limit",
            ErrorKind::KeyNotFound => "key_not_found",
            ErrorKind::Overloaded => "overloaded",
        }
    }
}

/// A failed request, with context.
#[derive(Debug, Clone, thiserror::Error)]
pub struct FlowError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
    /// The step concerned, if any.
    pub step: Option<Arc<str>>,
    /// The backend concerned, if any.
    pub backend: Option<Arc<str>>,
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl FlowError {
    /// A new error without context.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        FlowError {
            kind,
            message: message.into(),
            step: None,
            backend: None,
        }
    }
    /// From a transport error of a call made by `step` to `backend`.
    pub fn from_call(e: CallError, step: &Arc<str>, backend: &Arc<str>) -> Self {
        let kind = match e.kind {
            CallErrorKind::Timeout => ErrorKind::BackendTimeout,
            CallErrorKind::Connect => ErrorKind::BackendUnavailable,
            CallErrorKind::Reset => ErrorKind::BackendReset,
            CallErrorKind::BodyTooLarge => ErrorKind::BadBackendAnswer,
            CallErrorKind::Rejected => ErrorKind::Rejected,
        };
        FlowError {
            kind,
            message: format!("step `{step}`: backend `{backend}`: {}", e.message),
            step: Some(step.clone()),
            backend: Some(backend.clone()),
        }
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
    /// HTTP status for the client.
    pub fn status(&self) -> u16 {
        self.kind.status()
    }
    /// Whether the whole request could be retried by the client without side effects having
    /// happened twice (only when nothing reached a backend).
    pub fn retry_safe(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::BackendUnavailable | ErrorKind::Rejected
        )
    }
}
