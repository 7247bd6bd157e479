//! The SQL step (`sql: {backend, query, params, mode}`): evaluates the parameters (one jq
//! expression per `$n`), sends the statement — text fixed by the config, so request data never
//! becomes SQL — through the backend's stack as a [`Call::Sql`], and shapes the rows by `mode`.
//!
//! The `postgres` protocol client ([`crate::PgBackend`]) answers `{"rows": [...],
//! "rows_affected": N}` or an error status (409, 422, 503, 500 for SQL errors: the status of the
//! SQLSTATE's row in [`crate::sqlstate::classify`]; 400 for a parameter that does not fit its
//! type), which this step turns into the client's answer (its own error classes: `conflict`,
//! `constraint_violation`, `database_busy`, `database_error` — the class of the same row —,
//! `database_unavailable`, `bad_parameter`; and `invalid_call`), through the step's `on_status`
//! like HTTP statuses.
//!
//! The kind's line in the gateway's list of step kinds is [`STEP_KIND`] (`fanout-proxy`'s
//! `STEP_KINDS`); each step's counters are registered with [`crate::step_stats::StepCounters`].

use crate::sqlstate::{
    CONFLICT, CONSTRAINT_VIOLATION, DATABASE_BUSY, DATABASE_ERROR, OTHER, classify, sqlstate_of,
};
use crate::step_stats::{SqlStats, StepCounters};
use fanout_config::{ConfigError, Protocol, SqlMode, Step};
use fanout_expr::json::obj_get;
use fanout_expr::{Expr, Val};
use fanout_flow::kind::{
    CallTarget, Env, ErrorClass, ErrorKind, FlowError, INVALID_CALL, Prepared, Registration,
    SLOT_REQUEST, StepArgs, StepCx, StepIo, StepKind, StepWork, Yielded, eval, eval_item, expr_err,
    fetch_answer, parse_answer, prepare_calls, unknown_backend, yielded,
};
use fanout_layers::backend::{Backend, Call, CallErrorKind, CallRequest, SqlCall, SqlParams};
use fanout_layers::outcome::CallClass;
use fanout_runtime::compute::ComputePool;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio::time::Instant;
/// `mode: one` and no row: `on_status` sees 404; left to the default, 404 `not_found`.
static NO_ROW: ErrorClass = ErrorClass {
    on_status: Some(404),
    not_found: Some("not found: the statement returned no row"),
    ..ErrorClass::new("database_error", 502, CallClass::Status4xx)
};
/// The database could not be reached (503).
pub(crate) static DATABASE_UNAVAILABLE: ErrorClass =
    ErrorClass::new("database_unavailable", 503, CallClass::Refused);
/// A statement parameter built from the request does not fit its type (400).
static BAD_PARAMETER: ErrorClass = ErrorClass::new("bad_parameter", 400, CallClass::Status4xx);

/// The `sql` step kind: its line in the gateway's list of step kinds, with its error classes
/// (`NO_ROW` shares `database_error`'s code).
pub const STEP_KIND: Registration = Registration {
    compile,
    errors: &[
        &CONFLICT,
        &CONSTRAINT_VIOLATION,
        &DATABASE_BUSY,
        &DATABASE_ERROR,
        &DATABASE_UNAVAILABLE,
        &BAD_PARAMETER,
    ],
};

/// A compiled `sql` step.
struct SqlStep {
    backend: Arc<dyn Backend>,
    backend_name: Arc<str>,
    statement: Arc<str>,
    /// `$1…$n`, and whether each reads only the request (a value of the wrong type is then the
    /// client's fault: 400; else the flow's: 500).
    params: Vec<(Expr, bool)>,
    mode: SqlMode,
    read_only: bool,
    idempotent: bool,
    compute: Arc<ComputePool>,
    max_depth: usize,
    /// The backend's `max_response_bytes` (named when an answer passes it).
    max_response_bytes: usize,
    /// What this step received (for metrics).
    stats: Arc<SqlStats>,
}

impl CallTarget for SqlStep {
    fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    fn backend_name(&self) -> &Arc<str> {
        &self.backend_name
    }
    fn status_passthrough(&self) -> bool {
        false
    }
    fn compute(&self) -> &Arc<ComputePool> {
        &self.compute
    }
    fn max_depth(&self) -> usize {
        self.max_depth
    }
}

fn mode_name(m: SqlMode) -> &'static str {
    match m {
        SqlMode::One => "one",
        SqlMode::Optional => "optional",
        SqlMode::Many => "many",
        SqlMode::Exec => "exec",
    }
}

impl StepKind for SqlStep {
    fn backend(&self) -> Option<&Arc<str>> {
        Some(&self.backend_name)
    }

    fn call_ends_by_deadline(&self) -> bool {
        true
    }

    fn work(&self) -> StepWork {
        let (backend, mode) = (&self.backend_name, mode_name(self.mode));
        let reads = if self.read_only {
            "read-only"
        } else {
            "writes"
        };
        StepWork {
            text: format!("sql ({mode}, {reads}) on database {backend}"),
            label: format!("SQL {mode} {backend}"),
            io: StepIo::Calls {
                backend: backend.to_string(),
                idempotent: self.idempotent,
                writes: (!self.read_only)
                    .then(|| format!("a SQL statement on `{backend}` that is not read-only")),
            },
        }
    }

    fn prepare(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        items: Option<Arc<Vec<Val>>>,
        deadline: Instant,
    ) -> Result<Prepared, Yielded> {
        prepare_calls(items, |item| self.build(step, env, item, deadline))
    }

    fn call<'a>(
        &'a self,
        step: &'a StepArgs<'a>,
        req: CallRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Val, FlowError>> {
        fanout_layers::boxed::pinned(|| async move {
            let resp = fetch_answer(step.name, self, req, step.timeout, deadline)
                .await
                .map_err(|e| {
                    self.stats.add_error(&e);
                    self.sql_error(step.name, e)
                })?;
            let answer = match resp.value {
                Some(v) => v,
                None => parse_answer(step.name, self, resp.body, deadline, step.memory).await?,
            };
            if let Some(rows) = self.rows(&answer) {
                self.stats.add_rows(rows.len() as u64);
            }
            self.shape(step.name, answer)
        })
    }
}

impl SqlStep {
    fn build(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        item: Option<(&Val, usize)>,
        deadline: Instant,
    ) -> Result<Result<CallRequest, FlowError>, Yielded> {
        let mut params = SqlParams::with_capacity(self.params.len());
        for (i, (e, from_request)) in self.params.iter().enumerate() {
            let v = match item {
                Some((it, k)) => eval_item(e, env, &Val::Null, it, k),
                None => eval(e, env, &Val::Null),
            };
            match yielded(v)? {
                Ok(v) => params.push(v),
                Err(e) => {
                    let what = format!("parameter ${}", i + 1);
                    let mut err = expr_err(step.name, &what, e);
                    // An expression over the request alone that fails (`"abc" | tonumber`) was
                    // given a value it cannot take: the client's error, like a value of the
                    // wrong type (limits such as the evaluation budget keep their own kind).
                    if *from_request && err.kind == ErrorKind::Expression {
                        err.kind = ErrorKind::Class(&BAD_PARAMETER);
                        err.message = format!("{what}: the request's value does not fit it");
                    }
                    return Ok(Err(err));
                }
            }
        }
        let mut req = CallRequest::new(Call::Sql(SqlCall {
            statement: self.statement.clone(),
            params,
            read_only: self.read_only,
            rows_only: self.mode != SqlMode::Exec,
            single_row: matches!(self.mode, SqlMode::One | SqlMode::Optional),
            max_depth: self.max_depth,
        }));
        req.deadline = deadline;
        req.idempotent = self.idempotent;
        Ok(Ok(req))
    }

    /// A failed call, in the database's terms: statuses of SQL errors become the step's
    /// classes (`conflict` …; the executor applies `on_status` to them), a parameter that did
    /// not fit its type `bad_parameter` or `invalid_call`, an unreachable database
    /// `database_unavailable`.
    fn sql_error(&self, step: &Arc<str>, e: FlowError) -> FlowError {
        let transport = e.source.as_ref().map(|s| s.kind);
        match (e.kind, transport) {
            (_, Some(CallErrorKind::Connect | CallErrorKind::Reset)) => FlowError {
                kind: ErrorKind::Class(&DATABASE_UNAVAILABLE),
                message: "the database could not be reached".into(),
                ..e
            },
            (_, Some(CallErrorKind::BodyTooLarge)) => FlowError {
                message: format!(
                    "the statement's rows are larger than the backend's max_response_bytes ({} bytes)",
                    self.max_response_bytes
                ),
                ..e
            },
            (ErrorKind::BackendStatus { status: 400, .. }, _) => {
                // `{"param": n, "problem": "..."}`: which parameter, and why (no value in it).
                let detail = e.detail.clone().unwrap_or_default();
                let n = detail
                    .split_once("\"param\":")
                    .and_then(|(_, r)| {
                        r.chars()
                            .take_while(char::is_ascii_digit)
                            .collect::<String>()
                            .parse::<usize>()
                            .ok()
                    })
                    .unwrap_or(0);
                let problem = detail
                    .split_once("\"problem\":\"")
                    .and_then(|(_, r)| r.split_once('"'))
                    .map(|(p, _)| p.to_string())
                    .unwrap_or_default();
                let from_request = n > 0 && self.params.get(n - 1).is_some_and(|(_, r)| *r);
                let (kind, message) = match (n, from_request) {
                    (0, _) => (ErrorKind::InvalidCall, INVALID_CALL.to_string()),
                    (n, true) => (
                        ErrorKind::Class(&BAD_PARAMETER),
                        format!("parameter ${n}: {problem}"),
                    ),
                    (n, false) => (
                        ErrorKind::InvalidCall,
                        format!("parameter ${n} built from the flow's data: {problem}"),
                    ),
                };
                FlowError { kind, message, ..e }.in_step(step)
            }
            (ErrorKind::BackendStatus { .. }, _) => {
                // The SQLSTATE the answer carries, by the table the pool chose its status by.
                let sql = sqlstate_of(&e)
                    .and_then(|state| classify(state).ok())
                    .unwrap_or(&OTHER);
                FlowError {
                    kind: ErrorKind::Class(sql.class),
                    message: sql.message.into(),
                    ..e
                }
            }
            _ => e,
        }
    }

    /// The rows of the database's answer, in the shape this step's call asked for: the rows
    /// alone ([`SqlCall::rows_only`]), or `{"rows": [...], "rows_affected": N}` for `exec`.
    fn rows<'v>(&self, answer: &'v Val) -> Option<&'v [Val]> {
        match (answer, self.mode) {
            (Val::Arr(rows), m) if m != SqlMode::Exec => Some(rows),
            // The one row alone ([`SqlCall::single_row`]).
            (Val::Obj(_), SqlMode::One | SqlMode::Optional) => Some(std::slice::from_ref(answer)),
            (Val::Obj(o), SqlMode::Exec) => match obj_get(o, "rows") {
                Some(Val::Arr(rows)) => Some(rows),
                _ => None,
            },
            _ => None,
        }
    }

    /// The database's answer → the step's answer by `mode`: `exec` and `many` take it as it
    /// is, `one` and `optional` its only row.
    fn shape(&self, step: &Arc<str>, answer: Val) -> Result<Val, FlowError> {
        let fail = |message: String| {
            FlowError::new(ErrorKind::BadBackendAnswer, message)
                .in_step(step)
                .with_backend(&self.backend_name)
        };
        if let (Val::Obj(_), SqlMode::One | SqlMode::Optional) = (&answer, self.mode) {
            return Ok(answer);
        }
        let Some(rows) = self.rows(&answer) else {
            return Err(fail("the database's answer has no rows".into()));
        };
        match (self.mode, rows) {
            (SqlMode::Many | SqlMode::Exec, _) => Ok(answer),
            (SqlMode::Optional, []) => Ok(Val::Null),
            (SqlMode::One, []) => Err(FlowError::new(
                ErrorKind::Class(&NO_ROW),
                "the statement returned no row",
            )
            .in_step(step)
            .with_backend(&self.backend_name)),
            (SqlMode::One | SqlMode::Optional, [row]) => Ok(row.clone()),
            (_, rows) => Err(fail(format!(
                "the statement returned {} rows where `mode: {}` takes at most one",
                rows.len(),
                mode_name(self.mode)
            ))),
        }
    }
}

/// `sql:`.
fn compile(sc: &mut StepCx<'_, '_>, step: &Step) -> Option<Option<Box<dyn StepKind>>> {
    let q = step.sql.as_ref()?;
    let step_name = sc.name().value.clone();
    let backend = sc.backend(&q.backend.value);
    let cfg = sc.config();
    let backend_cfg = cfg.backends.get(&q.backend.value);
    sc.set_backend_timeout(backend_cfg.and_then(|b| b.timeout));
    match backend_cfg {
        None => {
            let e = unknown_backend(cfg, q.backend.pos, "", &q.backend.value);
            sc.error(e);
        }
        Some(b) if b.protocol != Protocol::Postgres => sc.error(
            ConfigError::at(
                q.backend.pos,
                format!(
                    "step `{step_name}`: backend `{}` is not a database",
                    q.backend.value
                ),
            )
            .hint(
                "a `sql` step calls a backend with `protocol: postgres` and a `url: postgres://…`",
            ),
        ),
        Some(_) => {}
    }
    if q.query.value.trim().is_empty() {
        sc.error(ConfigError::at(
            q.query.pos,
            format!("step `{step_name}`: `query` is empty"),
        ));
    }
    let item_ok = sc.in_each();
    let mut params = Vec::with_capacity(q.params.len());
    let mut ok = true;
    for p in &q.params {
        match sc.expr(Some(p), item_ok) {
            Some(e) => {
                // Reads the request and nothing else (no step, no `$item` that a step's list
                // may have given).
                let from_request =
                    !e.vars().is_empty() && e.vars().iter().all(|&v| v == SLOT_REQUEST);
                params.push((e, from_request));
            }
            None => ok = false,
        }
    }
    let backend = backend?;
    if !ok {
        return Some(None);
    }
    let backend_name: Arc<str> = q.backend.value.as_str().into();
    // Registered with the sql steps' counters the metrics read (kept by a reload that keeps the
    // step); compiled without that runtime, it counts for nobody.
    let stats = match sc.runtimes().get::<StepCounters>() {
        Some(counters) => counters.register(sc.key(), &backend_name, &step_name.as_str().into()),
        None => Arc::default(),
    };
    Some(Some(Box::new(SqlStep {
        backend,
        backend_name,
        statement: q.query.value.as_str().into(),
        params,
        mode: q.mode,
        read_only: q.is_read_only(),
        idempotent: q.is_idempotent(),
        compute: sc.compute().clone(),
        max_depth: cfg.server.expressions.max_depth,
        max_response_bytes: backend_cfg.map_or(0, |b| b.max_response_bytes),
        stats,
    })))
}
