//! How a backend call fails, at the transport level: [`CallError`] and its [`CallErrorKind`].
//! Every layer and every protocol client speaks these; the `outcome` module classifies them
//! once.

use std::fmt;
use std::sync::Arc;

/// Why a call failed, at the transport level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallErrorKind {
    /// The call's timeout elapsed.
    Timeout,
    /// No connection could be made (refused, unreachable, connect timeout, TLS handshake).
    Connect,
    /// The connection broke while the call was in flight (reset, closed early, protocol error).
    Reset,
    /// The answer body was larger than the backend's `max_response_bytes`.
    BodyTooLarge,
    /// The answer's `Content-Encoding` is not one fanout decodes, or its body does not decode.
    BadEncoding,
    /// The call was refused locally before being sent: a full bulkhead or an open breaker.
    Rejected(RejectReason),
    /// The call is not a valid request of its protocol (e.g. a URI longer than the HTTP library
    /// allows), so it was never sent: the fault of the flow that built it, not of the backend.
    Invalid,
}

/// Which of the gateway's own protections refused a call ([`CallErrorKind::Rejected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The backend's bulkhead (`max_concurrency`) was full.
    Bulkhead,
    /// The backend's circuit breaker was open (or half-open with its probe in flight).
    Breaker,
    /// A database's connection pool: every connection busy and `max_waiters` calls already
    /// waiting, or no connection free within the wait allowed.
    Pool,
    /// The gateway's memory budget for in-flight data (`server.bodies.memory_budget_bytes`)
    /// had no room left for the answer (a database statement's rows as they arrive).
    Memory,
    /// The backend's rate limit (`backends.NAME.rate_limit`) had no token for the call within
    /// its time.
    RateLimit,
}

/// A failed call: its kind, a human-readable cause (for the log), and the underlying error.
#[derive(Debug, Clone, thiserror::Error)]
pub struct CallError {
    /// What kind of failure.
    pub kind: CallErrorKind,
    /// Details (e.g. the OS error).
    pub message: String,
    /// The underlying error (transport, TLS, I/O), if any.
    #[source]
    pub source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl CallError {
    /// A new error.
    pub fn new(kind: CallErrorKind, message: impl Into<String>) -> Self {
        CallError {
            kind,
            message: message.into(),
            source: None,
        }
    }
    /// Attach the underlying error.
    pub fn with_source(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(e));
        self
    }
}

/// The source of a [`CallErrorKind::Timeout`] that the backend decided itself, not a timer of
/// the gateway's (a database's `statement_timeout`): the message for the client, which says so
/// (the step's 504 `backend_timeout` then quotes neither the request's deadline nor a wait the
/// gateway did not do).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ServerTimeout(pub String);
