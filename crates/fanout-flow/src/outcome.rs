//! The one classification of a backend call's outcome. Every layer that asks "was this a
//! failure?" asks it here, so they cannot disagree: the cache (serve stale on error), the hedge
//! (does this answer end the race), the retry layer (is another attempt worth it), the circuit
//! breaker (does it count against the backend), the balancer's outlier ejection (is the address
//! to blame), and the status mapping (`FlowError::from_call`, by [`CallErrorKind`]).
//!
//! | outcome          | failure | backend failure | blames address | transient |
//! |------------------|---------|-----------------|----------------|-----------|
//! | answer < 500     | no      | no              | no             | no        |
//! | answer 5xx       | yes     | yes             | yes            | no ¹      |
//! | timeout          | yes     | yes             | yes ²          | yes       |
//! | connect failure  | yes     | yes             | yes            | yes       |
//! | reset            | yes     | yes             | yes            | yes       |
//! | answer too large | yes     | yes             | no             | no        |
//! | rejected locally | yes     | no              | no             | no        |
//! | invalid call     | yes     | no              | no             | no        |
//!
//! ¹ statuses are retried when the retry policy lists them (`retry.on_status`).
//! ² unless the call was given less than the balancer's `default_rtt` (a budget used up
//! elsewhere), decided by the HTTP client, which knows the attempt's time.
//!
//! A rejected or invalid call was never sent: the first by the gateway's protection of the
//! backend, the second because the flow built something that is not a valid request. Neither
//! is retried, counted by a breaker or blamed on an address.
//!
//! A step's call as the flow saw it (after every layer, as a [`FlowError`]) is classified once
//! too, by [`CallClass::of`]: the outcome classes of metrics and traces.

use crate::backend::{CallError, CallErrorKind, CallResponse, RejectReason};
use crate::error::{ErrorKind, FlowError};

/// What happened to one backend call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The backend answered with a status below 500 (a 4xx is the backend working as designed).
    Answered,
    /// The backend answered 5xx.
    ServerError,
    /// The call failed without a usable answer.
    Failed(CallErrorKind),
}

impl CallOutcome {
    /// Classify a call's result.
    pub fn of(r: &Result<CallResponse, CallError>) -> CallOutcome {
        match r {
            Ok(resp) if resp.status.is_server_error() => CallOutcome::ServerError,
            Ok(_) => CallOutcome::Answered,
            Err(e) => CallOutcome::Failed(e.kind),
        }
    }

    /// No usable answer: anything but an answer below 500. A cache serves a stale value then; a
    /// hedged race goes on.
    pub fn is_failure(self) -> bool {
        self != CallOutcome::Answered
    }

    /// The backend failed (not the gateway's own protection refusing the call, nor a call the
    /// flow built invalid): what a circuit breaker counts.
    pub fn is_backend_failure(self) -> bool {
        self.is_failure()
            && !matches!(
                self,
                CallOutcome::Failed(CallErrorKind::Rejected(_) | CallErrorKind::Invalid)
            )
    }

    /// The address that took the call is to blame: what outlier ejection counts. A too-large
    /// answer came from a working address; a local rejection never reached one.
    pub fn blames_address(self) -> bool {
        matches!(
            self,
            CallOutcome::ServerError
                | CallOutcome::Failed(
                    CallErrorKind::Timeout | CallErrorKind::Connect | CallErrorKind::Reset
                )
        )
    }

    /// Another attempt of the same (idempotent) call may succeed: transport failures. Statuses
    /// are retried only when the retry policy lists them.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            CallOutcome::Failed(
                CallErrorKind::Timeout | CallErrorKind::Connect | CallErrorKind::Reset
            )
        )
    }

    /// The call never reached the backend (no connection, refused by the gateway itself, or not
    /// a valid request), so it had no side effect there.
    pub fn never_sent(self) -> bool {
        matches!(
            self,
            CallOutcome::Failed(
                CallErrorKind::Connect | CallErrorKind::Rejected(_) | CallErrorKind::Invalid
            )
        )
    }

    /// A short stable label (for logs): `ok`, `5xx`, `timeout`, `refused`, `reset`,
    /// `bad_answer`, `rejected`, `invalid`.
    pub fn label(self) -> &'static str {
        match self {
            CallOutcome::Answered => "ok",
            CallOutcome::ServerError => "5xx",
            CallOutcome::Failed(CallErrorKind::Timeout) => "timeout",
            CallOutcome::Failed(CallErrorKind::Connect) => "refused",
            CallOutcome::Failed(CallErrorKind::Reset) => "reset",
            CallOutcome::Failed(CallErrorKind::BodyTooLarge) => "bad_answer",
            CallOutcome::Failed(CallErrorKind::Rejected(_)) => "rejected",
            CallOutcome::Failed(CallErrorKind::Invalid) => "invalid",
        }
    }
}

/// How a step's backend call ended, as the flow saw it (after cache, retries, hedging): the
/// outcome classes of the `fanout_backend_calls_total` metric and of traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallClass {
    /// An answer the step accepted.
    Ok,
    /// No answer in time (the step's timeout or the request's deadline).
    Timeout,
    /// No connection could be made.
    Refused,
    /// The connection broke during the call.
    Reset,
    /// The answer was unusable: too large, not JSON, not splittable into batch values.
    BadAnswer,
    /// The backend answered 4xx.
    Status4xx,
    /// The backend answered 5xx.
    Status5xx,
    /// Refused by the backend's bulkhead before being sent.
    RejectedBulkhead,
    /// Refused by the backend's open circuit breaker before being sent.
    RejectedBreaker,
    /// Not sent: the values the flow built it from do not make a valid request (the flow's
    /// fault, not the backend's).
    InvalidCall,
    /// Anything else (a 1xx/3xx answer, a full compute pool).
    Other,
    /// Refused by a database's exhausted connection pool before being sent.
    RejectedPool,
}

impl CallClass {
    /// Every class, in the order of [`CallClass::index`].
    pub const ALL: [CallClass; 12] = [
        CallClass::Ok,
        CallClass::Timeout,
        CallClass::Refused,
        CallClass::Reset,
        CallClass::BadAnswer,
        CallClass::Status4xx,
        CallClass::Status5xx,
        CallClass::RejectedBulkhead,
        CallClass::RejectedBreaker,
        CallClass::InvalidCall,
        CallClass::Other,
        CallClass::RejectedPool,
    ];

    /// Classify a step's call: `Ok(())` for an answer the step accepted, else its error (the
    /// transport kind from its `source` when there is one, else its [`ErrorKind`]).
    pub fn of(result: Result<(), &FlowError>) -> CallClass {
        let e = match result {
            Ok(()) => return CallClass::Ok,
            Err(e) => e,
        };
        if let Some(src) = &e.source {
            return match src.kind {
                CallErrorKind::Timeout => CallClass::Timeout,
                CallErrorKind::Connect => CallClass::Refused,
                CallErrorKind::Reset => CallClass::Reset,
                CallErrorKind::BodyTooLarge => CallClass::BadAnswer,
                CallErrorKind::Rejected(RejectReason::Bulkhead) => CallClass::RejectedBulkhead,
                CallErrorKind::Rejected(RejectReason::Breaker) => CallClass::RejectedBreaker,
                CallErrorKind::Rejected(RejectReason::Pool) => CallClass::RejectedPool,
                CallErrorKind::Rejected(RejectReason::Memory) => CallClass::Other,
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

    /// The position of this class in [`CallClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The stable label: `ok`, `timeout`, `refused`, `reset`, `bad_answer`, `status_4xx`,
    /// `status_5xx`, `rejected_bulkhead`, `rejected_breaker`, `invalid_call`, `other`.
    pub fn label(self) -> &'static str {
        match self {
            CallClass::Ok => "ok",
            CallClass::Timeout => "timeout",
            CallClass::Refused => "refused",
            CallClass::Reset => "reset",
            CallClass::BadAnswer => "bad_answer",
            CallClass::Status4xx => "status_4xx",
            CallClass::Status5xx => "status_5xx",
            CallClass::RejectedBulkhead => "rejected_bulkhead",
            CallClass::RejectedBreaker => "rejected_breaker",
            CallClass::InvalidCall => "invalid_call",
            CallClass::Other => "other",
            CallClass::RejectedPool => "rejected_pool",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::StatusCode;

    fn answer(status: u16) -> Result<CallResponse, CallError> {
        Ok(CallResponse {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            body: Bytes::new(),
            value: None,
            parsed: None,
        })
    }

    fn failed(kind: CallErrorKind) -> Result<CallResponse, CallError> {
        Err(CallError::new(kind, "x"))
    }

    /// The table in the module docs, row by row.
    #[test]
    fn the_table_holds() {
        use CallErrorKind::*;
        // (result, failure, backend failure, blames address, transient, never sent)
        let rows = [
            (answer(200), false, false, false, false, false),
            (answer(404), false, false, false, false, false),
            (answer(503), true, true, true, false, false),
            (failed(Timeout), true, true, true, true, false),
            (failed(Connect), true, true, true, true, true),
            (failed(Reset), true, true, true, true, false),
            (failed(BodyTooLarge), true, true, false, false, false),
            (
                failed(Rejected(RejectReason::Bulkhead)),
                true,
                false,
                false,
                false,
                true,
            ),
            (
                failed(Rejected(RejectReason::Breaker)),
                true,
                false,
                false,
                false,
                true,
            ),
            (failed(Invalid), true, false, false, false, true),
        ];
        for (r, failure, backend, address, transient, unsent) in rows {
            let o = CallOutcome::of(&r);
            assert_eq!(o.is_failure(), failure, "{o:?}");
            assert_eq!(o.is_backend_failure(), backend, "{o:?}");
            assert_eq!(o.blames_address(), address, "{o:?}");
            assert_eq!(o.is_transient(), transient, "{o:?}");
            assert_eq!(o.never_sent(), unsent, "{o:?}");
        }
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
            assert_eq!(CallClass::of(r).label(), *label, "{e:?}");
        }
        for (i, c) in CallClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
