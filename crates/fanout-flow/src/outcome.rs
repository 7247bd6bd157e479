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
//!
//! ¹ statuses are retried when the retry policy lists them (`retry.on_status`).
//! ² unless the call was given less than the balancer's `default_rtt` (a budget used up
//! elsewhere), decided by the HTTP client, which knows the attempt's time.

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

    /// No usable answer: anything but an answer below 500. A cache serves a stale value then; a
    /// hedged race goes on.
    pub fn is_failure(self) -> bool {
        self != CallOutcome::Answered
    }

    /// The backend failed (not the gateway's own protection refusing the call): what a circuit
    /// breaker counts.
    pub fn is_backend_failure(self) -> bool {
        self.is_failure() && self != CallOutcome::Failed(CallErrorKind::Rejected)
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

    /// The call never reached the backend (no connection, or refused by the gateway itself), so
    /// it had no side effect there.
    pub fn never_sent(self) -> bool {
        matches!(
            self,
            CallOutcome::Failed(CallErrorKind::Connect | CallErrorKind::Rejected)
        )
    }

    /// A short stable label (for logs and metrics): `ok`, `5xx`, `timeout`, `refused`, `reset`,
    /// `bad_answer`, `rejected`.
    pub fn label(self) -> &'static str {
        match self {
            CallOutcome::Answered => "ok",
            CallOutcome::ServerError => "5xx",
            CallOutcome::Failed(CallErrorKind::Timeout) => "timeout",
            CallOutcome::Failed(CallErrorKind::Connect) => "refused",
            CallOutcome::Failed(CallErrorKind::Reset) => "reset",
            CallOutcome::Failed(CallErrorKind::BodyTooLarge) => "bad_answer",
            CallOutcome::Failed(CallErrorKind::Rejected) => "rejected",
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
            (failed(Rejected), true, false, false, false, true),
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
