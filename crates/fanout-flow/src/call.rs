//! Building and performing one backend call — what every step kind that calls a backend
//! shares: the evaluation environment of expressions ([`Env`]), the compiled call
//! ([`HttpPlan`]), [`build_call`] (expressions → [`CallRequest`], with the path percent-encoded
//! where it must be: `crate::uri`) and [`fetch_json`] (timeout, status, parse). It depends on no
//! step kind and no scheduler: `exec`, `batch` and `reference` use it, it uses none of them.

use crate::error::{ErrorKind, FlowError, INVALID_CALL};
use crate::memory::{RequestMemory, parsed_size_estimate};
use bytes::Bytes;
use fanout_expr::{Budget, EvalError, EvalErrorKind, EvalLimits, Expr, Mode, Val, json};
use fanout_layers::backend::{Backend, CallErrorKind, CallRequest, CallResponse, PathAndQuery};
use fanout_runtime::compute::ComputePool;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use std::sync::Arc;
use tokio::time::Instant;

/// Scope slot of `$request`.
pub const SLOT_REQUEST: usize = 0;
/// Scope slot of `$item` (inside `for_each` steps).
pub const SLOT_ITEM: usize = 1;
/// Scope slot of `$index` (inside `for_each` steps).
pub const SLOT_INDEX: usize = 2;
/// Scope slot of `$ref` (reference data snapshot).
pub const SLOT_REF: usize = 3;
/// First slot of step values: step `i` is in slot `FIRST_STEP_SLOT + i`.
pub const FIRST_STEP_SLOT: usize = 4;

/// A compiled HTTP call.
pub struct HttpPlan {
    /// Backend (possibly wrapped in policy layers).
    pub backend: Arc<dyn Backend>,
    /// Backend name.
    pub backend_name: Arc<str>,
    /// Method.
    pub method: Method,
    /// Path expression.
    pub path: Expr,
    /// The path when it is a constant (a string literal, a gRPC method's path), encoded and
    /// checked once: a call without query parameters clones it instead of evaluating `path`.
    pub const_path: Option<PathAndQuery>,
    /// Query parameters.
    pub query: Vec<(String, Expr)>,
    /// Headers.
    pub headers: Vec<(HeaderName, Expr)>,
    /// JSON body.
    pub body: Option<Expr>,
    /// Whether the call may be retried or hedged (GET/HEAD, batch lookups, or marked).
    pub idempotent: bool,
    /// The compute pool: large answers are parsed there.
    pub compute: Arc<ComputePool>,
    /// Deepest nesting accepted in an answer (`server.expressions.max_depth`).
    pub max_depth: usize,
    /// Whether the backend's error statuses reach the client as they are
    /// (`backends.*.status_passthrough`) instead of 502.
    pub status_passthrough: bool,
}

/// The scope slots of an [`Env`]: inline for a flow of up to four steps (no allocation per
/// request).
pub(crate) type Slots = smallvec::SmallVec<[Val; FIRST_STEP_SLOT + 4]>;

/// What expressions of one evaluation context see: the scope slots, the request's evaluation
/// budget, and whether they run on an I/O worker (inline: short, then yield) or on the compute
/// pool.
#[derive(Clone)]
pub struct Env {
    pub(crate) slots: Slots,
    pub(crate) budget: Budget,
    pub(crate) mode: Mode,
}

impl Env {
    /// An environment where every name is `null` (reference data: no request, no steps); its
    /// expressions run under the default limits.
    pub(crate) fn empty() -> Env {
        Env::with_slots(Vec::new())
    }

    /// An environment with the given slots (batch calls: slot 0 is `$keys`), under the default
    /// limits.
    pub(crate) fn with_slots(slots: Vec<Val>) -> Env {
        Env {
            slots: Slots::from_vec(slots),
            budget: Budget::unlimited_time(EvalLimits::default()),
            mode: Mode::Offload,
        }
    }

    /// The value of scope slot `i` (`SLOT_REQUEST`: `$request`), `null` past the end.
    pub fn slot(&self, i: usize) -> Val {
        self.get(i)
    }

    pub(crate) fn get(&self, i: usize) -> Val {
        self.slots.get(i).cloned().unwrap_or(Val::Null)
    }

    /// The same scope, for evaluation on the compute pool.
    pub(crate) fn offloaded(mut self) -> Env {
        self.mode = Mode::Offload;
        self
    }
}

/// An inline evaluation used its share of the worker: the work must be redone on the compute
/// pool (expressions are pure, so redoing is safe; the ops already used still count).
#[derive(Debug)]
pub struct Yielded;

/// An error that may be an inline evaluation's request to move to the compute pool.
pub trait MayYield {
    /// Whether this is that request ([`EvalErrorKind::Yield`]).
    fn is_yield(&self) -> bool;
}

impl MayYield for EvalError {
    fn is_yield(&self) -> bool {
        self.kind() == EvalErrorKind::Yield
    }
}

/// Separate "go to the compute pool" from an evaluation's result.
pub fn yielded<T, E: MayYield>(r: Result<T, E>) -> Result<Result<T, E>, Yielded> {
    match r {
        Err(e) if e.is_yield() => Err(Yielded),
        r => Ok(r),
    }
}

/// Why [`build_call`] built no call.
#[derive(Debug)]
pub(crate) enum BuildError {
    /// One of the call's expressions failed (or yielded: [`yielded`]).
    Eval(EvalError),
    /// The values do not make a valid request (a header value with a newline): what was
    /// invalid, for the log.
    Invalid(String),
}

impl From<EvalError> for BuildError {
    fn from(e: EvalError) -> Self {
        BuildError::Eval(e)
    }
}

impl MayYield for BuildError {
    fn is_yield(&self) -> bool {
        matches!(self, BuildError::Eval(e) if e.is_yield())
    }
}

impl BuildError {
    /// The error of step `step`, whose call to `backend` was being built: an expression's failure
    /// ([`expr_err`]), or 500 `invalid_call` ([`invalid_call`]).
    pub(crate) fn in_step(self, step: &Arc<str>, backend: &Arc<str>) -> FlowError {
        match self {
            BuildError::Eval(e) => expr_err(step, "building the call", e),
            BuildError::Invalid(detail) => invalid_call(detail).in_step(step).with_backend(backend),
        }
    }
}

/// A call that cannot be sent because the values it was built from do not make a valid request:
/// 500 `invalid_call`, the flow's fault (never counted against the backend); `detail` (what was
/// invalid) goes to the log.
pub(crate) fn invalid_call(detail: impl Into<String>) -> FlowError {
    FlowError::new(ErrorKind::InvalidCall, INVALID_CALL).with_detail(detail)
}

/// Evaluate `e` on `input` in `env`.
pub fn eval(e: &Expr, env: &Env, input: &Val) -> Result<Val, EvalError> {
    e.eval_in(input, |i| env.get(i), &env.budget, env.mode)
}

/// Evaluate `e` on `input` in `env`, with `item` and `index` as `$item` and `$index` (a
/// `for_each` element).
pub fn eval_item(
    e: &Expr,
    env: &Env,
    input: &Val,
    item: &Val,
    index: usize,
) -> Result<Val, EvalError> {
    e.eval_in(
        input,
        |i| match i {
            SLOT_ITEM => item.clone(),
            SLOT_INDEX => Val::from(index),
            _ => env.get(i),
        },
        &env.budget,
        env.mode,
    )
}

/// The error kind of a failed evaluation: a limit of `server.expressions`, the deadline, or an
/// ordinary jq error.
pub(crate) fn eval_kind(e: &EvalError) -> ErrorKind {
    match e.kind() {
        EvalErrorKind::Failed | EvalErrorKind::Yield => ErrorKind::Expression,
        EvalErrorKind::Ops | EvalErrorKind::TooLarge | EvalErrorKind::TooDeep => {
            ErrorKind::ExpressionLimit
        }
        EvalErrorKind::Cancelled | EvalErrorKind::Deadline => ErrorKind::DeadlineExceeded,
    }
}

/// An expression of a step failed. The client sees which expression failed and, for a limit or
/// the deadline, which one (named by its config field); jq's own message — which quotes the data
/// it failed on — goes to the detail.
pub fn expr_err(step: &Arc<str>, what: &str, e: EvalError) -> FlowError {
    expr_failure(what, e).in_step(step)
}

/// An expression (named by its config field, `what`) failed: see [`expr_err`].
pub(crate) fn expr_failure(what: &str, e: EvalError) -> FlowError {
    let kind = eval_kind(&e);
    let message = match kind {
        ErrorKind::Expression => format!("{what} failed"),
        _ => format!("{what} failed: {}", e.0),
    };
    FlowError::new(kind, message).with_detail(format!("{what}: {}", e.0))
}

/// A value for messages: its JSON, cut to 200 bytes.
pub(crate) fn short_json(v: &Val) -> String {
    let mut s = json::to_string(v);
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// Build one call from `h`'s expressions (with `item` as `$item`/`$index`): the path (a `/` in
/// front if it has none; characters a URI may not hold percent-encoded, as browsers and curl do),
/// the query (form-encoded), the headers and the body.
pub(crate) fn build_call(
    h: &HttpPlan,
    env: &Env,
    item: Option<(&Val, usize)>,
    deadline: Instant,
) -> Result<CallRequest, BuildError> {
    let ev = |e: &Expr| match item {
        Some((it, k)) => eval_item(e, env, &Val::Null, it, k),
        None => eval(e, env, &Val::Null),
    };
    let path = match &h.const_path {
        Some(p) if h.query.is_empty() => p.clone(),
        _ => build_path(h, &ev)?,
    };
    // `HeaderMap::new` allocates nothing until a header is set (most calls set none)
    let mut headers = if h.headers.is_empty() && h.body.is_none() {
        HeaderMap::new()
    } else {
        HeaderMap::with_capacity(h.headers.len() + 2)
    };
    for (name, e) in &h.headers {
        let v = ev(e)?;
        if matches!(v, Val::Null) {
            continue;
        }
        let text = json::to_display(&v);
        let hv = HeaderValue::from_str(&text).map_err(|_| {
            BuildError::Invalid(format!(
                "header `{name}`: `{}` is not a valid header value (control characters such as a newline, or non-ASCII text)",
                short_json(&v)
            ))
        })?;
        headers.insert(name.clone(), hv);
    }
    let body = match &h.body {
        None => Bytes::new(),
        Some(e) => {
            let mut out = Vec::with_capacity(128);
            json::write(&ev(e)?, &mut out);
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Bytes::from(out)
        }
    };
    Ok(CallRequest {
        call: fanout_layers::backend::Call::Http(fanout_layers::backend::HttpCall {
            method: h.method.clone(),
            path_and_query: path,
            headers,
            body,
        }),
        timeout: std::time::Duration::ZERO, // set when the call starts
        deadline,
        idempotent: h.idempotent,
        trace: None, // set when the call starts
    })
}

/// The path and query of a call whose path is not a constant (or that has query parameters):
/// `path` evaluated, what a URI may not hold percent-encoded, a leading `/` added, the query
/// parameters appended form-encoded (`null` leaves a parameter out, an array repeats it).
fn build_path(
    h: &HttpPlan,
    ev: &impl Fn(&Expr) -> Result<Val, EvalError>,
) -> Result<PathAndQuery, BuildError> {
    let mut path = encoded_path(json::to_display(&ev(&h.path)?));
    if !h.query.is_empty() {
        // Appended in place: `?` before the first pair (`&` when the path has a query already).
        let mut sep = if path.contains('?') { '&' } else { '?' };
        path.reserve(64);
        for (k, e) in &h.query {
            match ev(e)? {
                Val::Null => {}
                Val::Arr(a) => {
                    for x in a.iter() {
                        crate::uri::append_form_pair(&mut path, sep, k, &json::to_display_cow(x));
                        sep = '&';
                    }
                }
                v => {
                    crate::uri::append_form_pair(&mut path, sep, k, &json::to_display_cow(&v));
                    sep = '&';
                }
            }
        }
    }
    path_and_query(path)
}

/// A constant path (a string literal's value), made as [`build_path`] would make it from
/// that value; `None` when it is not a valid one (then it is built, and refused, per call).
pub(crate) fn const_path(path: &str) -> Option<PathAndQuery> {
    path_and_query(encoded_path(path.to_string())).ok()
}

/// `path` with what a URI may not hold percent-encoded (`crate::uri`) and a leading `/`.
fn encoded_path(mut path: String) -> String {
    if let std::borrow::Cow::Owned(encoded) = crate::uri::encode_path_and_query(&path) {
        path = encoded;
    }
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    path
}

/// `path` (already percent-encoded) as a URI's path and query; too long a one is refused.
pub(crate) fn path_and_query(path: String) -> Result<PathAndQuery, BuildError> {
    let len = path.len();
    PathAndQuery::from_maybe_shared(Bytes::from(path)).map_err(|e| {
        BuildError::Invalid(format!(
            "the path and query built ({len} bytes) is not a valid URI path: {e}"
        ))
    })
}

/// What performing a call and reading its answer needs of a step's compiled call, whatever its
/// protocol: the backend's stack and name, how its error statuses reach clients, where large
/// answers are parsed.
pub trait CallTarget: Sync {
    /// The backend's stack.
    fn backend(&self) -> &Arc<dyn Backend>;
    /// The backend's name.
    fn backend_name(&self) -> &Arc<str>;
    /// `backends.*.status_passthrough`.
    fn status_passthrough(&self) -> bool;
    /// The compute pool (large answers are parsed there).
    fn compute(&self) -> &Arc<ComputePool>;
    /// `server.expressions.max_depth`.
    fn max_depth(&self) -> usize;
}

impl CallTarget for HttpPlan {
    fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    fn backend_name(&self) -> &Arc<str> {
        &self.backend_name
    }
    fn status_passthrough(&self) -> bool {
        self.status_passthrough
    }
    fn compute(&self) -> &Arc<ComputePool> {
        &self.compute
    }
    fn max_depth(&self) -> usize {
        self.max_depth
    }
}

/// Perform one call with min(`step_timeout`, remaining budget), forward the budget, check the
/// status and parse the answer (once). `step` names the caller in errors.
pub(crate) async fn fetch_json(
    step_name: &Arc<str>,
    h: &impl CallTarget,
    req: CallRequest,
    step_timeout: std::time::Duration,
    deadline: Instant,
    memory: &RequestMemory<'_>,
) -> Result<Val, FlowError> {
    let resp = fetch_answer(step_name, h, req, step_timeout, deadline).await?;
    // An answer shared by dedup is parsed once for all who share it (the value is immutable).
    let depth = h.max_depth();
    if let Some((d, v)) = resp.parsed.as_deref().and_then(|c| c.get())
        && *d == depth
    {
        return Ok(v.clone());
    }
    let body = resp.bytes();
    if body.is_empty() {
        return Ok(Val::Null);
    }
    let v = parse_answer(step_name, h, body, deadline, memory).await?;
    if let Some(cell) = &resp.parsed {
        // a caller that parsed at the same time may have set it first: either value is the same
        let _ = cell.set((depth, v.clone()));
    }
    Ok(v)
}

/// [`fetch_json`] up to the answer's body: perform the call within its time, check the status.
pub(crate) async fn fetch_body(
    step_name: &Arc<str>,
    h: &impl CallTarget,
    req: CallRequest,
    step_timeout: std::time::Duration,
    deadline: Instant,
) -> Result<Bytes, FlowError> {
    fetch_answer(step_name, h, req, step_timeout, deadline)
        .await
        .map(|r| r.bytes())
}

/// [`fetch_body`], keeping an answer the protocol gave as a value ([`CallResponse::value`]).
pub async fn fetch_answer(
    step_name: &Arc<str>,
    h: &impl CallTarget,
    mut req: CallRequest,
    step_timeout: std::time::Duration,
    deadline: Instant,
) -> Result<CallResponse, FlowError> {
    let now = Instant::now();
    let remaining = deadline.saturating_duration_since(now);
    let timeout = step_timeout.min(remaining);
    if timeout.is_zero() {
        // No time left (a client's `x-request-timeout: 0`, or a deadline spent by earlier
        // steps): fail without calling, rather than race a zero-length timer against the
        // backend (the timer's granularity would let a fast backend win now and then).
        return Err(timed_out(step_name, h, timeout, step_timeout, timeout));
    }
    req.timeout = timeout;
    let fut = h.backend().call(req);
    // At `now + timeout`: the clock read above, not a second one.
    let resp: CallResponse = match tokio::time::timeout_at(now + timeout, fut).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if e.kind != CallErrorKind::Timeout => {
            return Err(FlowError::from_call(e, step_name, h.backend_name()));
        }
        Ok(Err(e)) => return Err(inner_timeout(step_name, h, e, now, timeout, step_timeout)),
        Err(_) => return Err(timed_out(step_name, h, timeout, step_timeout, timeout)),
    };
    if !resp.status.is_success() {
        return Err(error_status(step_name, h, &resp));
    }
    Ok(resp)
}

/// A timeout from inside the call (a layer's or the backend's own) before our timer fired: the
/// backend's own stop ([`ServerTimeout`]: a database's `statement_timeout`) says so; a layer's
/// (a shared call's own limit, a retry's last attempt) that came when our time was spent is
/// classified like our timer, one that came earlier is the backend's timeout — with the time
/// actually waited, never the time we would have waited.
fn inner_timeout(
    step_name: &Arc<str>,
    h: &impl CallTarget,
    e: fanout_layers::backend::CallError,
    started: Instant,
    timeout: std::time::Duration,
    step_timeout: std::time::Duration,
) -> FlowError {
    let waited = started.elapsed();
    let server = e
        .source
        .as_deref()
        .and_then(|s| s.downcast_ref::<fanout_layers::backend::ServerTimeout>())
        .map(|s| s.0.clone());
    if let Some(message) = server {
        let mut out = FlowError::from_call(e, step_name, h.backend_name());
        out.message = message;
        return out;
    }
    // Our timer's resolution is a millisecond: a layer's timer at the same instant is ours.
    if waited + std::time::Duration::from_millis(1) >= timeout {
        return timed_out(step_name, h, timeout, step_timeout, waited);
    }
    let mut out = FlowError::from_call(e, step_name, h.backend_name());
    out.message = format!(
        "the backend call timed out after {:.1} ms",
        waited.as_secs_f64() * 1000.0
    );
    out
}

/// No answer in `timeout` (after `waited`): the request's deadline (when it cut the step's own
/// timeout short) or the backend's timeout.
fn timed_out(
    step_name: &Arc<str>,
    h: &impl CallTarget,
    timeout: std::time::Duration,
    step_timeout: std::time::Duration,
    waited: std::time::Duration,
) -> FlowError {
    let kind = if timeout < step_timeout {
        ErrorKind::DeadlineExceeded
    } else {
        ErrorKind::BackendTimeout
    };
    let waited = format!("{:.1} ms", waited.as_secs_f64() * 1000.0);
    let message = if kind == ErrorKind::DeadlineExceeded {
        format!("the request deadline passed after waiting {waited} for the backend")
    } else {
        format!("the backend did not answer within its timeout ({waited})")
    };
    FlowError::new(kind, message)
        .in_step(step_name)
        .with_backend(h.backend_name())
        .with_detail(format!(
            "backend `{}`: no answer after {waited}",
            h.backend_name()
        ))
}

/// The backend answered an error status. The body excerpt is for the log only: backends put
/// internals in error bodies.
fn error_status(step_name: &Arc<str>, h: &impl CallTarget, resp: &CallResponse) -> FlowError {
    let snippet = String::from_utf8_lossy(&resp.body[..resp.body.len().min(200)]).into_owned();
    let status = resp.status.as_u16();
    FlowError::new(
        ErrorKind::BackendStatus {
            status,
            passthrough: h.status_passthrough(),
        },
        format!("the backend answered {status}"),
    )
    .in_step(step_name)
    .with_backend(h.backend_name())
    .with_detail(format!(
        "backend `{}` answered {status}{}",
        h.backend_name(),
        if snippet.is_empty() {
            String::new()
        } else {
            format!(": {snippet}")
        }
    ))
}

/// Parse an answer (a large one on the compute pool, not on this worker), first holding what
/// its value will cost in the request's account of the memory budget ([`crate::memory`]).
pub async fn parse_answer(
    step_name: &Arc<str>,
    h: &impl CallTarget,
    body: Bytes,
    deadline: Instant,
    memory: &RequestMemory<'_>,
) -> Result<Val, FlowError> {
    let cost = parsed_size_estimate(&body);
    if let Err(budget) = memory.hold(cost) {
        return Err(FlowError::new(
            ErrorKind::MemoryBudget,
            format!(
                "the backend's answer ({} bytes, about {} once parsed) has no room in the memory \
                 budget for in-flight data (server.bodies.memory_budget_bytes: {budget}); retry later",
                body.len(),
                cost
            ),
        )
        .in_step(step_name)
        .with_backend(h.backend_name()));
    }
    let parsed = if body.len() >= h.compute().offload_bytes && h.compute().started() {
        let depth = h.max_depth();
        // Bounded by the request's deadline like the call before it, so that a call and its
        // parse together end by the deadline ([`crate::step::StepKind::call_ends_by_deadline`]).
        let parse = h.compute().run(move || json::parse_limited(&body, depth));
        match tokio::time::timeout_at(deadline, parse).await {
            Ok(parsed) => parsed.map_err(|e| {
                FlowError::new(ErrorKind::Overloaded, e.to_string())
                    .in_step(step_name)
                    .with_backend(h.backend_name())
            })?,
            Err(_) => {
                return Err(FlowError::new(
                    ErrorKind::DeadlineExceeded,
                    "the request deadline passed while the backend's answer waited to be parsed",
                )
                .in_step(step_name)
                .with_backend(h.backend_name()));
            }
        }
    } else {
        json::parse_limited(&body, h.max_depth())
    };
    parsed.map_err(|e| {
        FlowError::new(
            ErrorKind::BadBackendAnswer,
            "the backend's answer is not valid JSON",
        )
        .in_step(step_name)
        .with_backend(h.backend_name())
        .with_detail(format!(
            "backend `{}` answered invalid JSON: {e}",
            h.backend_name()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_layers::backend::CallError;
    use futures_util::future::BoxFuture;
    use std::time::Duration;

    /// A backend that is never called: `parse_answer` only reads the target's pool and limits.
    struct Unused;

    impl Backend for Unused {
        fn call(&self, _: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
            Box::pin(std::future::pending())
        }
    }

    struct Target {
        backend: Arc<dyn Backend>,
        name: Arc<str>,
        pool: Arc<ComputePool>,
    }

    impl CallTarget for Target {
        fn backend(&self) -> &Arc<dyn Backend> {
            &self.backend
        }
        fn backend_name(&self) -> &Arc<str> {
            &self.name
        }
        fn status_passthrough(&self) -> bool {
            false
        }
        fn compute(&self) -> &Arc<ComputePool> {
            &self.pool
        }
        fn max_depth(&self) -> usize {
            64
        }
    }

    /// A large answer waits for the compute pool to be parsed; the pool is busy: the wait ends at
    /// the request's deadline (504), not whenever a pool thread frees — so a call and its parse
    /// together end by the deadline, which lets a one-step flow run without a timer of its own.
    #[tokio::test(start_paused = true)]
    async fn a_parse_waiting_for_the_compute_pool_ends_at_the_deadline() {
        // Every answer is parsed on the pool (offload threshold 0); its only thread is taken.
        let pool = Arc::new(ComputePool::new(1, 4, 0));
        pool.start().unwrap();
        let (release_tx, blocker) = fanout_runtime::compute::block_the_thread(&pool).await;
        let target = Target {
            backend: Arc::new(Unused),
            name: Arc::from("db"),
            pool: pool.clone(),
        };
        let step: Arc<str> = Arc::from("user");
        let deadline = Instant::now() + Duration::from_millis(50);
        let body = Bytes::from_static(br#"{"id": 1}"#);
        let e = parse_answer(&step, &target, body, deadline, RequestMemory::unlimited())
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::DeadlineExceeded);
        assert_eq!(e.step.as_deref(), Some("user"));
        assert_eq!(e.backend.as_deref(), Some("db"));
        assert!(Instant::now() >= deadline);
        release_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
    }

    /// A backend whose calls fail with a timeout of their own after `after` (a layer's limit,
    /// or the server's own: `source`).
    struct TimesOut {
        after: Duration,
        source: Option<fanout_layers::backend::ServerTimeout>,
    }

    impl Backend for TimesOut {
        fn call(&self, _: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
            let (after, source) = (self.after, self.source.clone());
            Box::pin(async move {
                tokio::time::sleep(after).await;
                let e =
                    CallError::new(CallErrorKind::Timeout, "statement timeout (SQLSTATE 57014)");
                Err(match source {
                    Some(s) => e.with_source(s),
                    None => e,
                })
            })
        }
    }

    /// A timeout from inside the call, long before our timer and the deadline: neither "the
    /// request deadline passed" nor a wait we did not do; the server's own says so.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_from_inside_the_call_quotes_the_time_waited_not_ours() {
        let pool = Arc::new(ComputePool::new(1, 4, 1 << 20));
        let step: Arc<str> = Arc::from("user");
        for (source, want) in [
            (None, "the backend call timed out after 300.0 ms"),
            (
                Some(fanout_layers::backend::ServerTimeout(
                    "the database stopped the statement at its statement_timeout (300 ms)".into(),
                )),
                "the database stopped the statement at its statement_timeout (300 ms)",
            ),
        ] {
            let target = Target {
                backend: Arc::new(TimesOut {
                    after: Duration::from_millis(300),
                    source,
                }),
                name: Arc::from("db"),
                pool: pool.clone(),
            };
            // 3 s left of the request, a 5 s step timeout: our timer would fire at 3 s.
            let deadline = Instant::now() + Duration::from_secs(3);
            let req = CallRequest::http(Method::GET, http::uri::PathAndQuery::from_static("/u"));
            let e = fetch_answer(&step, &target, req, Duration::from_secs(5), deadline)
                .await
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::BackendTimeout, "{e}");
            assert_eq!(e.message, want);
            assert_eq!(e.step.as_deref(), Some("user"));
        }
    }
}
