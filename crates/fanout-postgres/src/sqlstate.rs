//! What a SQLSTATE means, in one table ([`classify`]): the `sql` step's error class — whose
//! `on_status` is the status the call answers with, so the pool ([`crate::pool`]) and the step
//! ([`crate::step`]) read the same row — or the transport failure it is. Also the classes SQL
//! errors are counted by ([`SQLSTATE_CLASSES`]) and where a failed call carries its SQLSTATE
//! ([`sqlstate_of`]).

use fanout_flow::kind::{ErrorClass, FlowError};
use fanout_layers::CallErrorKind;
use fanout_layers::outcome::CallClass;
use http::StatusCode;

/// What a SQL error the database answered is to the `sql` step.
pub struct SqlError {
    /// The step's error class; its `on_status` is the status the call answers with (what a
    /// step's `on_status` sees, and what retries and breakers classify).
    pub class: &'static ErrorClass,
    /// What the client is told.
    pub message: &'static str,
}

impl SqlError {
    /// The status the call answers with.
    pub fn status(&self) -> StatusCode {
        self.class
            .on_status
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// A database answered a statement with an error the client can act on; the step's
/// `on_status` may map its status: a unique or foreign-key violation (409).
pub(crate) static CONFLICT: ErrorClass = ErrorClass {
    on_status: Some(409),
    ..ErrorClass::new("conflict", 409, CallClass::Status4xx)
};
/// A check or not-null violation, invalid data (422).
pub(crate) static CONSTRAINT_VIOLATION: ErrorClass = ErrorClass {
    on_status: Some(422),
    ..ErrorClass::new("constraint_violation", 422, CallClass::Status4xx)
};
/// A serialization failure or deadlock not retried, insufficient resources (503).
pub(crate) static DATABASE_BUSY: ErrorClass = ErrorClass {
    on_status: Some(503),
    ..ErrorClass::new("database_busy", 503, CallClass::Status5xx)
};
/// Any other SQL error (502; `on_status` sees 500).
pub(crate) static DATABASE_ERROR: ErrorClass = ErrorClass {
    on_status: Some(500),
    ..ErrorClass::new("database_error", 502, CallClass::Status5xx)
};

static CONFLICTS: SqlError = SqlError {
    class: &CONFLICT,
    message: "the statement conflicts with existing data",
};
static INVALID: SqlError = SqlError {
    class: &CONSTRAINT_VIOLATION,
    message: "the statement's data violates a constraint or is invalid",
};
static BUSY: SqlError = SqlError {
    class: &DATABASE_BUSY,
    message: "the database could not run the statement now; try again",
};
/// Every SQLSTATE the table has no row for (and a column the pool could not read, `XX000`).
pub(crate) static OTHER: SqlError = SqlError {
    class: &DATABASE_ERROR,
    message: "the database failed to run the statement",
};

/// What SQLSTATE `state` means: the `sql` step's error ([`SqlError`]: class, status, message),
/// or the transport failure it is (the database stopped the statement, or is going away).
pub fn classify(state: &str) -> Result<&'static SqlError, CallErrorKind> {
    Ok(match state {
        // unique_violation, foreign_key_violation, exclusion_violation
        "23505" | "23503" | "23P01" => &CONFLICTS,
        // serialization_failure, deadlock_detected, lock_not_available: try again
        "40001" | "40P01" | "55P03" => &BUSY,
        // query_canceled: statement_timeout (ours are sent for deadlines, which end the call
        // before this answer arrives)
        "57014" => return Err(CallErrorKind::Timeout),
        // admin_shutdown, crash_shutdown, cannot_connect_now
        "57P01" | "57P02" | "57P03" => return Err(CallErrorKind::Reset),
        s if s.starts_with("08") => return Err(CallErrorKind::Reset),
        // insufficient resources (too many connections, out of memory, disk full)
        s if s.starts_with("53") => &BUSY,
        // other integrity constraints (check, not null), data exceptions (invalid text for a
        // type, value out of range, division by zero)
        s if s.starts_with("23") || s.starts_with("22") => &INVALID,
        _ => &OTHER,
    })
}

/// The SQLSTATE classes counted separately (the first two characters of the code); every other
/// class is `other`.
pub const SQLSTATE_CLASSES: [(&str, &str); 8] = [
    ("22", "data_exception"),
    ("23", "integrity_constraint_violation"),
    ("40", "transaction_rollback"),
    ("42", "syntax_error_or_access_rule_violation"),
    ("53", "insufficient_resources"),
    ("55", "object_not_in_prerequisite_state"),
    ("57", "operator_intervention"),
    ("08", "connection_exception"),
];

/// The index of `state`'s class in [`SQLSTATE_CLASSES`], or `SQLSTATE_CLASSES.len()` (`other`).
pub fn class_index(state: &str) -> usize {
    SQLSTATE_CLASSES
        .iter()
        .position(|(c, _)| state.starts_with(c))
        .unwrap_or(SQLSTATE_CLASSES.len())
}

/// The marker before a SQLSTATE in the texts of the `postgres` protocol: `"sqlstate":"23505"` in
/// the body of an error answer, `(SQLSTATE 40001)` in the message of a failed call.
pub const SQLSTATE_IN_BODY: &str = "\"sqlstate\":\"";
/// See [`SQLSTATE_IN_BODY`].
pub const SQLSTATE_IN_MESSAGE: &str = "(SQLSTATE ";

/// The SQLSTATE a database answered a call with, if it did.
pub fn sqlstate_of(e: &FlowError) -> Option<&str> {
    e.detail
        .as_deref()
        .and_then(|d| code_after(d, SQLSTATE_IN_BODY))
        .or_else(|| code_after(&e.source.as_ref()?.message, SQLSTATE_IN_MESSAGE))
}

/// The five-character code right after `marker` in `text`.
fn code_after<'t>(text: &'t str, marker: &str) -> Option<&'t str> {
    let rest = text.split_once(marker)?.1;
    let code = rest.get(..5)?;
    code.bytes()
        .all(|b| b.is_ascii_alphanumeric())
        .then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per SQLSTATE: the status the pool answers with is the class's `on_status`, so
    /// the step's class and the call's status cannot disagree.
    #[test]
    fn each_sqlstate_has_one_class_and_its_status() {
        type Meaning = Result<(&'static str, u16), CallErrorKind>;
        let cases: [(&str, Meaning); 12] = [
            ("23505", Ok(("conflict", 409))),
            ("23503", Ok(("conflict", 409))),
            ("23P01", Ok(("conflict", 409))),
            ("23514", Ok(("constraint_violation", 422))),
            ("22P02", Ok(("constraint_violation", 422))),
            ("40001", Ok(("database_busy", 503))),
            ("40P01", Ok(("database_busy", 503))),
            ("53300", Ok(("database_busy", 503))),
            ("42P01", Ok(("database_error", 500))),
            ("XX000", Ok(("database_error", 500))),
            ("57014", Err(CallErrorKind::Timeout)),
            ("08006", Err(CallErrorKind::Reset)),
        ];
        for (state, want) in cases {
            let got = classify(state).map(|e| (e.class.code, e.status().as_u16()));
            assert_eq!(got, want, "{state}");
        }
        assert_eq!(classify("57P01").err(), Some(CallErrorKind::Reset));
    }
}
