//! SQLSTATE classes and the per-step counters of `sql` steps (rows received, errors by class),
//! read by the metrics. The classes are shared with the database protocol's per-database
//! counters, so both count an error under the same name.

use crate::error::FlowError;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Counts of SQL errors by class.
#[derive(Debug, Default)]
pub struct ErrorsByClass([AtomicU64; SQLSTATE_CLASSES.len() + 1]);

impl ErrorsByClass {
    /// Count an error of SQLSTATE `state`.
    pub fn count(&self, state: &str) {
        if let Some(a) = self.0.get(class_index(state)) {
            a.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every class by name (then `other`), zero until counted.
    pub fn by_class(&self) -> Vec<(&'static str, u64)> {
        SQLSTATE_CLASSES
            .iter()
            .map(|(_, name)| *name)
            .chain(["other"])
            .zip(self.0.iter().map(|a| a.load(Ordering::Relaxed)))
            .collect()
    }
}

/// What one `sql` step received: rows in its answers, SQL errors by class. A cached or shared
/// answer counts for every step that received it.
#[derive(Debug, Default)]
pub struct SqlStats {
    rows: AtomicU64,
    errors: ErrorsByClass,
}

impl SqlStats {
    /// Rows received.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// SQL errors received, by class.
    pub fn errors(&self) -> &ErrorsByClass {
        &self.errors
    }

    pub(crate) fn add_rows(&self, n: u64) {
        self.rows.fetch_add(n, Ordering::Relaxed);
    }

    /// Count `e` if the database answered it with a SQLSTATE.
    pub(crate) fn add_error(&self, e: &FlowError) {
        if let Some(state) = sqlstate_of(e) {
            self.errors.count(state);
        }
    }
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
    use crate::error::ErrorKind;
    use fanout_layers::backend::{CallError, CallErrorKind};
    use std::sync::Arc;

    #[test]
    fn the_sqlstate_of_an_answer_or_a_failed_call_is_counted_by_class() {
        let stats = SqlStats::default();
        let mut conflict =
            FlowError::new(ErrorKind::Class(&super::super::sql::CONFLICT), "conflict");
        conflict.detail = Some(r#"{"sqlstate":"23505","message":"duplicate key"}"#.into());
        let mut retry = FlowError::new(
            ErrorKind::Class(&super::super::sql::DATABASE_BUSY),
            "try again",
        );
        retry.source = Some(Arc::new(CallError::new(
            CallErrorKind::Timeout,
            "database `db`: could not serialize access (SQLSTATE 40001)",
        )));
        let plain = FlowError::new(
            ErrorKind::Class(&super::super::sql::DATABASE_UNAVAILABLE),
            "unreachable",
        );
        for e in [&conflict, &retry, &retry, &plain] {
            stats.add_error(e);
        }
        assert_eq!(sqlstate_of(&conflict), Some("23505"));
        assert_eq!(sqlstate_of(&plain), None);
        let counts = stats.errors().by_class();
        assert_eq!(counts.len(), SQLSTATE_CLASSES.len() + 1);
        let of = |name: &str| counts.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
        assert_eq!(of("integrity_constraint_violation"), Some(1));
        assert_eq!(of("transaction_rollback"), Some(2));
        assert_eq!(of("other"), Some(0));
        assert_eq!(class_index("XX000"), SQLSTATE_CLASSES.len());
    }
}
