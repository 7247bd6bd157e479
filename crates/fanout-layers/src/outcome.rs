//! The one classification of a backend call's outcome. Every layer that asks "was this a
//! failure?" asks it here, so they cannot disagree: the cache (serve stale on error), the hedge
//! (does this answer end the race), the retry layer (is another attempt worth it), the circuit
//! breaker (does it count against the backend), the balancer's outlier ejection (is the address
//! to blame), and the status mapping (fanout-flow's `FlowError::from_call`, by [`CallErrorKind`]).
//!
//! | outcome          | failure | backend failure | blames address | transient |
//! |------------------|---------|-----------------|----------------|-----------|
//! | answer < 500     | no      | no              | no             | no        |
//! | answer 5xx       | yes     | yes             | yes            | no ¹      |
//! | timeout          | yes     | yes             | yes ²          | yes       |
//! | connect failure  | yes     | yes             | yes            | yes       |
//! | reset            | yes     | yes             | yes            | yes       |
//! | answer too large | yes     | yes             | no             | no        |
//! | bad encoding ³   | yes     | yes             | no             | no        |
//! | rejected locally | yes     | no              | no             | no        |
//! | invalid call     | yes     | no              | no             | no        |
//!
//! ¹ statuses are retried when the retry policy lists them (`retry.on_status`).
//! ² unless the call was given less than the balancer's `default_rtt` (a budget used up
//! elsewhere), decided by the HTTP client, which knows the attempt's time.
//! ³ a `Content-Encoding` the client does not decode, or a body that does not decode.
//!
//! A rejected or invalid call was never sent: the first by the gateway's protection of the
//! backend, the second because the flow built something that is not a valid request. Neither
//! is retried, counted by a breaker or blamed on an address.
//!
//! A step's call as the flow saw it (after every layer, as fanout-flow's `FlowError`) is
//! classified once too, by `fanout_flow::error::call_class`, into a [`CallClass`]: the outcome
//! classes of metrics and traces.

use crate::backend::{CallError, CallErrorKind, CallResponse};

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

    /// Classify a streamed call's result by its answer's head.
    pub fn of_stream(r: &Result<crate::stream::StreamResponse, CallError>) -> CallOutcome {
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
            CallOutcome::Failed(CallErrorKind::BodyTooLarge | CallErrorKind::BadEncoding) => {
                "bad_answer"
            }
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
    use crate::backend::RejectReason;
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
            (failed(BadEncoding), true, true, false, false, false),
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
}
