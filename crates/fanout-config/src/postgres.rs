//! Databases: `protocol: postgres` backends (`postgres:` pool settings) and `sql:` steps.

use crate::{ConfigError, Dur, ExprSrc, Located, Pos};
use schemars::JsonSchema;
use serde::Deserialize;

/// TLS towards a database (`postgres.sslmode`), as libpq names the modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// `disable` for a loopback host (127.0.0.1, ::1, localhost), `verify-full` for any other.
    #[default]
    Auto,
    /// Plain TCP.
    Disable,
    /// TLS, without checking the server's certificate (encryption only, as libpq's `require`).
    Require,
    /// TLS, the certificate checked against the trusted roots (`tls.ca_file`, else the web PKI
    /// roots) and the host name.
    VerifyFull,
}

/// The connection pool of a `protocol: postgres` backend.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// Most connections open at once. Default 10 (HikariCP's, PostgREST's, sqlx's default).
    pub max_size: usize,
    /// Most requests waiting for a connection when all are busy; one more is answered at once
    /// with 503 `pool_exhausted`. Default 64.
    pub max_waiters: usize,
    /// Longest wait for a connection (also bounded by the request's remaining deadline); past it
    /// the call fails with 503 `pool_exhausted`. Default 1s.
    pub max_wait: Dur,
    /// The server-side backstop (`SET statement_timeout` on every connection): a statement
    /// running longer is cancelled by Postgres itself, even if the gateway's own cancel request
    /// were lost. Default 30s.
    pub statement_timeout: Dur,
    /// TLS: `auto` (default: `disable` for a loopback host, `verify-full` otherwise),
    /// `disable`, `require` or `verify-full`.
    pub sslmode: SslMode,
    /// `application_name` of the connections (shown in `pg_stat_activity`). Default `fanout`.
    pub application_name: String,
    /// Idle connections are closed after this long. Default 10m.
    pub idle_timeout: Dur,
    /// First wait before reconnecting to a database that refused or dropped a connection; it
    /// doubles up to `reconnect_max`. Default 100ms.
    pub reconnect_min: Dur,
    /// Longest wait between reconnection attempts. Default 5s.
    pub reconnect_max: Dur,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            max_size: 10,
            max_waiters: 64,
            max_wait: Dur::secs(1),
            statement_timeout: Dur::secs(30),
            sslmode: SslMode::Auto,
            application_name: "fanout".into(),
            idle_timeout: Dur::secs(600),
            reconnect_min: Dur::millis(100),
            reconnect_max: Dur::secs(5),
        }
    }
}

/// What a `sql` step makes of the rows of its statement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SqlMode {
    /// Exactly one row, as an object: none → 404 `not_found` naming the step (or the step's
    /// `on_status: {404: …}`), more than one → 500.
    One,
    /// At most one row: the row, or `null` when there is none; more than one → 500.
    Optional,
    /// Every row, as an array of objects (default).
    #[default]
    Many,
    /// A statement that changes data: `{rows_affected: N, rows: [...]}` (`rows`: what
    /// `RETURNING` returned, else `[]`).
    Exec,
}

/// A `sql` step: one statement of a `protocol: postgres` backend. The SQL text is fixed by the
/// config; request data reaches the database only as parameters (`$1`…), never as SQL text.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlCall {
    /// Name of a backend under `backends:` with `protocol: postgres`.
    pub backend: Located<String>,
    /// The statement, with `$1`, `$2`… for the parameters. Prepared against the database at
    /// start and on reload: errors are reported at this line.
    pub query: Located<String>,
    /// One expression per parameter, in order (`$1` is the first). Their types come from the
    /// prepared statement (a value of the wrong type fails the step, naming the parameter).
    #[serde(default)]
    pub params: Vec<ExprSrc>,
    /// `one`, `optional`, `many` (default) or `exec`.
    #[serde(default)]
    pub mode: SqlMode,
    /// Whether the statement only reads: such calls are shared by dedup and cached, like GETs.
    /// Default: true for a statement starting with `SELECT`, `VALUES` or `TABLE` in a mode other
    /// than `exec`; set `false` for a SELECT calling a function that writes.
    pub read_only: Option<bool>,
    /// Whether the statement may be run twice (retried after a serialization failure or a
    /// deadlock, hedged). Default: the same as `read_only`.
    pub idempotent: Option<bool>,
}

impl SqlCall {
    /// Whether the statement only reads (see `read_only`).
    pub fn is_read_only(&self) -> bool {
        self.read_only
            .unwrap_or_else(|| self.mode != SqlMode::Exec && starts_read_only(&self.query.value))
    }
    /// Whether the statement may be run twice (see `idempotent`).
    pub fn is_idempotent(&self) -> bool {
        self.idempotent.unwrap_or_else(|| self.is_read_only())
    }
}

/// Whether SQL text starts (after spaces and comments) with a keyword of a statement that only
/// reads: `SELECT`, `VALUES`, `TABLE`. (`WITH` may hold an `INSERT`; such statements must say
/// `read_only: true` themselves.)
fn starts_read_only(sql: &str) -> bool {
    let mut s = sql.trim_start();
    loop {
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            break;
        }
    }
    let word: String = s
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase();
    // `SELECT … INTO` creates a table.
    matches!(word.as_str(), "SELECT" | "VALUES" | "TABLE")
        && !s.to_ascii_uppercase().contains(" INTO ")
}

/// A `protocol: postgres` backend: one `postgres://` URL, a pool that can hold a connection,
/// and none of the HTTP-only settings; `false` when `b` is not one (then it may not have
/// `postgres:` settings either).
pub(crate) fn check_backend(
    name: &str,
    b: &crate::Backend,
    urls: &[&Located<String>],
    errs: &mut Vec<ConfigError>,
) -> bool {
    let at = |pos: Option<Pos>, message: String, hint: &str| {
        ConfigError {
            path: None,
            file: String::new(),
            pos,
            message: format!("backend `{name}`: {message}"),
            hint: None,
        }
        .hint(hint)
    };
    if b.protocol != crate::Protocol::Postgres {
        if b.postgres.is_some() {
            errs.push(at(
                None,
                "`postgres:` settings need `protocol: postgres`".into(),
                "set `protocol: postgres` with a `url: postgres://…`, or remove `postgres:`",
            ));
        }
        return false;
    }
    if !b.urls.is_empty() {
        errs.push(at(
            b.urls.first().map(|u| u.pos),
            "a `protocol: postgres` backend has one `url`, not `urls`".into(),
            "declare one backend per database server",
        ));
    }
    for u in urls {
        let v = &u.value;
        if !(v.starts_with("postgres://") || v.starts_with("postgresql://")) {
            errs.push(at(
                Some(u.pos),
                "the URL of a `protocol: postgres` backend starts with `postgres://`".into(),
                "e.g. `url: postgres://app:${DB_PASSWORD}@db.internal:5432/shop`",
            ));
        }
    }
    if let Some(p) = &b.postgres {
        if p.max_size == 0 {
            errs.push(at(
                None,
                "postgres.max_size must be at least 1".into(),
                "e.g. `max_size: 10`",
            ));
        }
        if p.reconnect_min.0.is_zero() || p.reconnect_max < p.reconnect_min {
            errs.push(at(
                None,
                "postgres.reconnect_min must be positive and at most reconnect_max".into(),
                "e.g. `reconnect_min: 100ms`, `reconnect_max: 5s`",
            ));
        }
    }
    if b.batch.is_some() {
        errs.push(at(
            None,
            "a `protocol: postgres` backend has no `batch` form".into(),
            "look many keys up with one `sql` step (`WHERE id = ANY($1)`)",
        ));
    }
    if b.hedge.is_some() {
        errs.push(at(
            None,
            "a `protocol: postgres` backend cannot hedge (a second copy of a statement costs the database a connection)".into(),
            "remove `hedge:`",
        ));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_recognised_conservatively() {
        for s in [
            "SELECT 1",
            "  select * from t",
            "-- c\nSELECT 1",
            "/* x */ VALUES (1)",
            "TABLE t",
        ] {
            assert!(starts_read_only(s), "{s}");
        }
        for s in [
            "INSERT INTO t VALUES (1)",
            "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
            "SELECT * INTO t2 FROM t",
            "UPDATE t SET a = 1",
            "",
            "/* unterminated",
        ] {
            assert!(!starts_read_only(s), "{s}");
        }
    }
}
