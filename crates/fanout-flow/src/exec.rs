//! The per-request executor: runs a [`RoutePlan`] for one request.
//!
//! Steps start as soon as the steps they read are done; independent steps run concurrently on
//! the same task (no spawning, no threads). The whole request races its deadline: when it passes,
//! every call still in flight is dropped — which closes its connection or stream — and the request
//! fails with 504. A required step's failure ends the request the same way.

use crate::backend::{CallErrorKind, CallRequest, CallResponse};
use crate::batch::{BatchPlan, Found};
use crate::error::{ErrorKind, FlowError};
use crate::plan::{
    Action, FIRST_STEP_SLOT, HttpPlan, RespondPlan, RoutePlan, SLOT_INDEX, SLOT_ITEM, SLOT_REF,
    SLOT_REQUEST, StepPlan,
};
use bytes::Bytes;
use fanout_expr::{Budget, EvalError, EvalErrorKind, EvalLimits, Expr, Mode, Val, json, truthy};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use futures_util::stream::{FuturesUnordered, StreamExt, TryStreamExt};
use futures_util::{Future, stream};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;

/// Header naming the optional steps that fell back to their default.
pub const PARTIAL_HEADER: &str = "x-fanout-partial";

/// A finished response.
#[derive(Debug)]
pub struct Outcome {
    /// Status code.
    pub status: u16,
    /// Headers from `respond.headers` (plus `x-fanout-partial` when steps fell back).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// JSON body.
    pub body: Bytes,
    /// Optional steps that failed and used their default.
    pub partial: Vec<Arc<str>>,
}

type StepFuture<'a> = Pin<Box<dyn Future<Output = (usize, Result<Val, FlowError>)> + Send + 'a>>;

/// What expressions of one evaluation context see: the scope slots, the request's evaluation
/// budget, and whether they run on an I/O worker (inline: short, then yield) or on the compute
/// pool.
#[derive(Clone)]
pub(crate) struct Env {
    slots: Vec<Val>,
    budget: Budget,
    mode: Mode,
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
            slots,
            budget: Budget::unlimited_time(EvalLimits::default()),
            mode: Mode::Offload,
        }
    }

    fn get(&self, i: usize) -> Val {
        self.slots.get(i).cloned().unwrap_or(Val::Null)
    }

    /// The same scope, for evaluation on the compute pool.
    fn offloaded(mut self) -> Env {
        self.mode = Mode::Offload;
        self
    }
}

/// An inline evaluation used its share of the worker: the work must be redone on the compute
/// pool (expressions are pure, so redoing is safe; the ops already used still count).
#[derive(Debug)]
struct Yielded;

/// Separate "go to the compute pool" from an evaluation's result.
fn yielded<T>(r: Result<T, EvalError>) -> Result<Result<T, EvalError>, Yielded> {
    match r {
        Err(e) if e.kind() == EvalErrorKind::Yield => Err(Yielded),
        r => Ok(r),
    }
}

fn eval(e: &Expr, env: &Env, input: &Val) -> Result<Val, EvalError> {
    e.eval_in(input, |i| env.get(i), &env.budget, env.mode)
}

fn eval_item(e: &Expr, env: &Env, input: &Val, item: &Val, index: usize) -> Result<Val, EvalError> {
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
fn eval_kind(e: &EvalError) -> ErrorKind {
    match e.kind() {
        EvalErrorKind::Failed | EvalErrorKind::Yield => ErrorKind::Expression,
        EvalErrorKind::Ops | EvalErrorKind::TooLarge | EvalErrorKind::TooDeep => {
            ErrorKind::ExpressionLimit
        }
        EvalErrorKind::Cancelled | EvalErrorKind::Deadline => ErrorKind::DeadlineExceeded,
    }
}

fn expr_err(step: &Arc<str>, what: &str, e: EvalError) -> FlowError {
    FlowError::new(
        eval_kind(&e),
        format!("step `{step}`: {what} failed: {}", e.0),
    )
    .in_step(step)
}

/// Cancels the request's evaluation budget when the request ends, however it ends (answered,
/// deadline, client gone): an expression still running on the compute pool stops at its next
/// check instead of holding a pool thread for nobody.
struct CancelOnDrop(Budget);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl RoutePlan {
    /// Run the flow for one request. `request` is the `$request` value; `deadline` the request's
    /// effective deadline (route maximum, possibly shortened by the client).
    pub async fn run(&self, request: Val, deadline: Instant) -> Result<Outcome, FlowError> {
        // Every poll is timed: a poll that holds the worker too long is logged with route/step.
        let mut flow = std::pin::pin!(self.run_flow(request, deadline));
        std::future::poll_fn(|cx| {
            crate::activity::poll_timed(
                &self.path,
                |i| self.steps.get(i).map(|s| s.name.to_string()),
                || flow.as_mut().poll(cx),
            )
        })
        .await
    }

    async fn run_flow(&self, request: Val, deadline: Instant) -> Result<Outcome, FlowError> {
        let n = self.steps.len();
        let budget = Budget::new(self.limits, Some(deadline.into_std()));
        let _cancel = CancelOnDrop(budget.clone());
        let mut env = Env {
            slots: vec![Val::Null; FIRST_STEP_SLOT + n],
            budget,
            mode: Mode::Inline,
        };
        env.slots[SLOT_REQUEST] = request;
        env.slots[SLOT_REF] = self.reference.snapshot();
        let mut waiting: Vec<usize> = self.steps.iter().map(|s| s.deps.len()).collect();
        let mut partial: Vec<Arc<str>> = Vec::new();
        let mut inflight: FuturesUnordered<StepFuture<'_>> = FuturesUnordered::new();
        let mut ready: Vec<usize> = self.roots.clone();
        let mut done = 0usize;
        let mut running = vec![false; n];
        let mut keyed: Vec<KeyedLookup> = Vec::new();
        let sleep = tokio::time::sleep_until(deadline);
        tokio::pin!(sleep);

        loop {
            // Start every ready step; synchronous steps complete at once and may free others.
            while let Some(i) = ready.pop() {
                let step = &self.steps[i];
                match self.start(step, i, &env, deadline) {
                    Started::Done(result) => {
                        let v = self.settle(step, result, &mut partial)?;
                        env.slots[FIRST_STEP_SLOT + i] = v;
                        done += 1;
                        release(step, &mut waiting, &mut ready);
                    }
                    Started::Pending(fut) => {
                        running[i] = true;
                        inflight.push(fut);
                    }
                    Started::Keyed { batch, keys } => {
                        running[i] = true;
                        keyed.push((i, batch, keys));
                    }
                }
            }
            // Merge the keyed lookups of every step started in this round, per backend.
            if !keyed.is_empty() {
                self.flush_keyed(std::mem::take(&mut keyed), &env, deadline, &mut inflight);
            }
            if done == n {
                break;
            }
            let (i, result) = tokio::select! {
                biased;
                next = inflight.next() => match next {
                    Some(x) => x,
                    None => break, // unreachable: a dependency graph without cycles always drains
                },
                _ = &mut sleep => {
                    return Err(self.deadline_error(&running));
                }
            };
            running[i] = false;
            let step = &self.steps[i];
            let v = self.settle(step, result, &mut partial)?;
            env.slots[FIRST_STEP_SLOT + i] = v;
            done += 1;
            release(step, &mut waiting, &mut ready);
        }
        drop(inflight);
        self.respond(env, partial).await
    }

    fn deadline_error(&self, running: &[bool]) -> FlowError {
        let pending: Vec<&str> = (0..running.len())
            .filter(|&i| running[i])
            .map(|i| &*self.steps[i].name)
            .collect();
        let mut e = FlowError::new(
            ErrorKind::DeadlineExceeded,
            format!(
                "route deadline exceeded while waiting for {}",
                if pending.is_empty() {
                    "the flow".to_string()
                } else {
                    format!("step(s) {}", pending.join(", "))
                }
            ),
        );
        if let [one] = pending.as_slice() {
            let step = self.steps.iter().find(|s| &*s.name == *one);
            if let Some(s) = step {
                e.step = Some(s.name.clone());
                if let Action::Http(h) = &s.action {
                    e.backend = Some(h.backend_name.clone());
                }
            }
        }
        e
    }

    /// Apply the failure policy to a finished step.
    fn settle(
        &self,
        step: &StepPlan,
        result: Result<Val, FlowError>,
        partial: &mut Vec<Arc<str>>,
    ) -> Result<Val, FlowError> {
        match result {
            Ok(v) => Ok(v),
            Err(_) if step.optional => {
                partial.push(step.name.clone());
                Ok(step.default.clone())
            }
            Err(e) => Err(e),
        }
    }

    fn start<'a>(
        &'a self,
        step: &'a Arc<StepPlan>,
        i: usize,
        env: &Env,
        deadline: Instant,
    ) -> Started<'a> {
        crate::activity::enter(i);
        match prepare(step, env, deadline) {
            Ok(p) => self.launch(step, i, p, env, deadline),
            // Heavy: redo the step's expressions on the compute pool, then go on here.
            Err(Yielded) => {
                let on_pool = (step.clone(), snapshot(env, step).offloaded());
                let env = snapshot(env, step);
                let pool = self.compute.clone();
                Started::Pending(Box::pin(async move {
                    let (s, snap) = on_pool;
                    let p = match pool.run(move || prepare(&s, &snap, deadline)).await {
                        Ok(Ok(p)) => p,
                        Ok(Err(Yielded)) => Prepared::Done(Err(FlowError::new(
                            ErrorKind::Expression,
                            format!(
                                "step `{}`: evaluation yielded on the compute pool",
                                step.name
                            ),
                        )
                        .in_step(&step.name))),
                        Err(e) => Prepared::Done(Err(pool_error(&step.name, e))),
                    };
                    match self.launch(step, i, p, &env, deadline) {
                        Started::Done(r) => (i, r),
                        Started::Pending(f) => f.await,
                        Started::Keyed { batch, keys } => {
                            let mut unique: Vec<String> =
                                keys.iter().map(|(k, _)| k.clone()).collect();
                            unique.sort_unstable();
                            unique.dedup();
                            let result_env = step.result.as_ref().map(|_| env.clone());
                            let out = match batch.fetch(unique, deadline).await {
                                Err(e) => Err(FlowError {
                                    step: Some(step.name.clone()),
                                    ..e
                                }),
                                Ok(found) => {
                                    let each = step.for_each.is_some();
                                    pick(
                                        self,
                                        step,
                                        &batch,
                                        &found,
                                        keys,
                                        each,
                                        result_env.as_ref(),
                                    )
                                    .await
                                }
                            };
                            (i, out)
                        }
                    }
                }))
            }
        }
    }

    /// Turn a step's prepared work into what the scheduler runs.
    fn launch<'a>(
        &'a self,
        step: &'a StepPlan,
        i: usize,
        p: Prepared,
        env: &Env,
        deadline: Instant,
    ) -> Started<'a> {
        match (p, &step.action) {
            (Prepared::Done(r), _) => Started::Done(r),
            (Prepared::Keys(keys), Action::Keyed { batch, .. }) => Started::Keyed {
                batch: batch.clone(),
                keys,
            },
            (Prepared::Call(req), Action::Http(h)) => {
                let result_env = step.result.as_ref().map(|_| snapshot(env, step));
                Started::Pending(Box::pin(async move {
                    let out = match call(step, h, req, deadline, &self.deadline_header).await {
                        Ok(body) => {
                            crate::activity::enter(i);
                            map_result_on(self, step, result_env.as_ref(), body, None).await
                        }
                        Err(e) => Err(e),
                    };
                    (i, out)
                }))
            }
            (Prepared::Calls(reqs), Action::Http(h)) => {
                let result_env = step.result.as_ref().map(|_| snapshot(env, step));
                Started::Pending(Box::pin(async move {
                    let result_env = result_env.as_ref();
                    let out = stream::iter(reqs)
                        .map(|(req, item, k)| async move {
                            let body = call(step, h, req, deadline, &self.deadline_header).await?;
                            crate::activity::enter(i);
                            map_result_on(self, step, result_env, body, Some((&item, k))).await
                        })
                        .buffered(step.concurrency)
                        .try_collect::<Vec<Val>>()
                        .await
                        .map(|v| v.into_iter().collect::<Val>());
                    (i, out)
                }))
            }
            _ => Started::Done(Err(FlowError::new(
                ErrorKind::Expression,
                format!(
                    "step `{}`: prepared work does not match its kind",
                    step.name
                ),
            )
            .in_step(&step.name))),
        }
    }

    async fn respond(&self, env: Env, partial: Vec<Arc<str>>) -> Result<Outcome, FlowError> {
        crate::activity::enter(crate::activity::RESPOND);
        match respond_with(&self.respond, &env, &partial) {
            Ok(out) => out,
            Err(Yielded) => {
                let (plan, env) = (self.respond.clone(), env.offloaded());
                match self
                    .compute
                    .run(move || respond_with(&plan, &env, &partial))
                    .await
                {
                    Ok(Ok(out)) => out,
                    Ok(Err(Yielded)) => Err(FlowError::new(
                        ErrorKind::Expression,
                        "respond: evaluation yielded on the compute pool",
                    )),
                    Err(e) => Err(FlowError::new(
                        ErrorKind::Overloaded,
                        format!("respond: {e}"),
                    )),
                }
            }
        }
    }
}

fn pool_error(step: &Arc<str>, e: crate::compute::ComputeError) -> FlowError {
    FlowError::new(ErrorKind::Overloaded, format!("step `{step}`: {e}")).in_step(step)
}

/// A step's synchronous work — `when`, `for_each`, building its call(s) or keys, or its value —
/// done in `env`'s mode; `Err(Yielded)` when an inline evaluation must move to the compute pool.
enum Prepared {
    Done(Result<Val, FlowError>),
    Call(CallRequest),
    Calls(Vec<(CallRequest, Val, usize)>),
    Keys(Vec<(String, Val)>),
}

fn prepare(step: &StepPlan, env: &Env, deadline: Instant) -> Result<Prepared, Yielded> {
    use Prepared::Done;
    // `compute: true` value steps always run on the pool.
    if step.compute && env.mode == Mode::Inline && matches!(step.action, Action::Value(_)) {
        return Err(Yielded);
    }
    if let Some(when) = &step.when {
        match yielded(eval(when, env, &Val::Null))? {
            Ok(v) if !truthy(&v) => return Ok(Done(Ok(step.default.clone()))),
            Ok(_) => {}
            Err(e) => return Ok(Done(Err(expr_err(&step.name, "`when`", e)))),
        }
    }
    let items = match &step.for_each {
        None => None,
        Some(e) => match yielded(eval(e, env, &Val::Null))? {
            Ok(Val::Arr(a)) => Some(a),
            Ok(Val::Null) => Some(Default::default()),
            Ok(other) => {
                return Ok(Done(Err(expr_err(
                    &step.name,
                    "`for_each`",
                    EvalError(
                        format!("expected a list, got {}", short_json(&other)),
                        EvalErrorKind::Failed,
                    ),
                ))));
            }
            Err(e) => return Ok(Done(Err(expr_err(&step.name, "`for_each`", e)))),
        },
    };
    Ok(match (&step.action, items) {
        (Action::Keyed { key, .. }, None) => match yielded(eval(key, env, &Val::Null))? {
            Ok(k) => Prepared::Keys(vec![(json::to_display(&k), Val::Null)]),
            Err(e) => Done(Err(expr_err(&step.name, "`key`", e))),
        },
        (Action::Keyed { key, .. }, Some(items)) => {
            let mut keys = Vec::with_capacity(items.len());
            for (k, item) in items.iter().enumerate() {
                match yielded(eval_item(key, env, &Val::Null, item, k))? {
                    Ok(v) => keys.push((json::to_display(&v), item.clone())),
                    Err(e) => return Ok(Done(Err(expr_err(&step.name, "`key`", e)))),
                }
            }
            Prepared::Keys(keys)
        }
        (Action::Value(e), items) => {
            Done(eval_value(&step.name, e, step.result.as_ref(), env, items)?)
        }
        (Action::Http(h), None) => match yielded(build_call(h, env, None, deadline))? {
            Ok(r) => Prepared::Call(r),
            Err(e) => Done(Err(expr_err(&step.name, "building the call", e))),
        },
        (Action::Http(h), Some(items)) => {
            let mut reqs = Vec::with_capacity(items.len());
            for (k, item) in items.iter().enumerate() {
                match yielded(build_call(h, env, Some((item, k)), deadline))? {
                    Ok(r) => reqs.push((r, item.clone(), k)),
                    Err(e) => return Ok(Done(Err(expr_err(&step.name, "building the call", e)))),
                }
            }
            Prepared::Calls(reqs)
        }
    })
}

/// A value for messages: its JSON, cut to 200 bytes.
fn short_json(v: &Val) -> String {
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

/// The response: `respond.body` and headers evaluated in `env`'s mode.
fn respond_with(
    plan: &RespondPlan,
    env: &Env,
    partial: &[Arc<str>],
) -> Result<Result<Outcome, FlowError>, Yielded> {
    let mut body = match yielded(eval(&plan.body, env, &Val::Null))? {
        Ok(b) => b,
        Err(e) => {
            return Ok(Err(FlowError::new(
                eval_kind(&e),
                format!("respond.body failed: {}", e.0),
            )));
        }
    };
    let mut headers = Vec::with_capacity(plan.headers.len() + 1);
    for (name, e) in &plan.headers {
        let v = match yielded(eval(e, env, &Val::Null))? {
            Ok(v) => v,
            Err(e) => {
                return Ok(Err(FlowError::new(
                    eval_kind(&e),
                    format!("respond header `{name}` failed: {}", e.0),
                )));
            }
        };
        if matches!(v, Val::Null) {
            continue;
        }
        let text = json::to_display(&v);
        let Ok(hv) = HeaderValue::from_str(&text) else {
            return Ok(Err(FlowError::new(
                ErrorKind::Expression,
                format!(
                    "respond header `{name}`: `{}` is not a valid header value",
                    short_json(&v)
                ),
            )));
        };
        headers.push((name.clone(), hv));
    }
    if !partial.is_empty() {
        let list = partial.iter().map(|s| &**s).collect::<Vec<_>>().join(",");
        if let Ok(hv) = HeaderValue::from_str(&list) {
            headers.push((HeaderName::from_static(PARTIAL_HEADER), hv));
        }
        if let Val::Obj(o) = &mut body {
            let names: Val = partial.iter().map(|s| json::str_val(s)).collect();
            Arc::make_mut(o).insert(json::str_val("_partial"), names);
        }
    }
    let mut out = Vec::with_capacity(256);
    json::write(&body, &mut out);
    Ok(Ok(Outcome {
        status: plan.status,
        headers,
        body: Bytes::from(out),
        partial: partial.to_vec(),
    }))
}

enum Started<'a> {
    Done(Result<Val, FlowError>),
    Pending(StepFuture<'a>),
    /// Keyed lookups (key, `for_each` element), to be merged with the round's others.
    Keyed {
        batch: Arc<BatchPlan>,
        keys: Vec<(String, Val)>,
    },
}

type SharedFetch = Shared<BoxFuture<'static, Result<Found, FlowError>>>;

/// A step's keyed lookups waiting for the end of the scheduling round: (step, batch form,
/// (key, `for_each` element) pairs).
type KeyedLookup = (usize, Arc<BatchPlan>, Vec<(String, Val)>);

impl RoutePlan {
    /// One fetch per batch backend for the union of the round's keys; each step then picks its
    /// own values (in its own order) from the shared answer.
    fn flush_keyed<'a>(
        &'a self,
        keyed: Vec<KeyedLookup>,
        env: &Env,
        deadline: Instant,
        inflight: &mut FuturesUnordered<StepFuture<'a>>,
    ) {
        let mut fetches: Vec<(Arc<BatchPlan>, SharedFetch)> = Vec::new();
        let mut groups: Vec<(Arc<BatchPlan>, Vec<String>)> = Vec::new();
        for (_, batch, keys) in &keyed {
            match groups.iter_mut().find(|(b, _)| Arc::ptr_eq(b, batch)) {
                Some((_, all)) => all.extend(keys.iter().map(|(k, _)| k.clone())),
                None => groups.push((batch.clone(), keys.iter().map(|(k, _)| k.clone()).collect())),
            }
        }
        for (batch, mut keys) in groups {
            keys.sort_unstable();
            keys.dedup();
            let b = batch.clone();
            let fut = async move { b.fetch(keys, deadline).await }
                .boxed()
                .shared();
            fetches.push((batch, fut));
        }
        for (i, batch, keys) in keyed {
            let step = &self.steps[i];
            let Some(fetch) = fetches
                .iter()
                .find(|(b, _)| Arc::ptr_eq(b, &batch))
                .map(|(_, f)| f.clone())
            else {
                continue;
            };
            let result_env = step.result.as_ref().map(|_| snapshot(env, step));
            let each = step.for_each.is_some();
            inflight.push(Box::pin(async move {
                let out = match fetch.await {
                    Err(e) => Err(FlowError {
                        step: Some(step.name.clone()),
                        ..e
                    }),
                    Ok(found) => {
                        pick(self, step, &batch, &found, keys, each, result_env.as_ref()).await
                    }
                };
                (i, out)
            }));
        }
    }
}

/// A keyed step's value from the fetched values: one value, or a list in input order.
async fn pick(
    route: &RoutePlan,
    step: &StepPlan,
    batch: &BatchPlan,
    found: &Found,
    keys: Vec<(String, Val)>,
    each: bool,
    env: Option<&Env>,
) -> Result<Val, FlowError> {
    let mut out = Vec::with_capacity(keys.len());
    for (k, (key, item)) in keys.into_iter().enumerate() {
        let Some(v) = found.get(&key) else {
            return Err(FlowError {
                kind: ErrorKind::KeyNotFound,
                message: format!(
                    "step `{}`: key `{key}` not found at backend `{}`",
                    step.name, batch.name
                ),
                step: Some(step.name.clone()),
                backend: Some(batch.name.clone()),
            });
        };
        let item = each.then_some((&item, k));
        out.push(map_result_on(route, step, env, v.clone(), item).await?);
    }
    if each {
        Ok(out.into_iter().collect())
    } else {
        Ok(out.pop().unwrap_or(Val::Null))
    }
}

fn release(step: &StepPlan, waiting: &mut [usize], ready: &mut Vec<usize>) {
    for &d in &step.dependents {
        waiting[d] -= 1;
        if waiting[d] == 0 {
            ready.push(d);
        }
    }
}

/// The values a step's `result` expression may read, captured when the step starts.
fn snapshot(env: &Env, step: &StepPlan) -> Env {
    let mut slots = vec![Val::Null; env.slots.len()];
    slots[SLOT_REQUEST] = env.get(SLOT_REQUEST);
    slots[SLOT_REF] = env.get(SLOT_REF);
    for &d in &step.deps {
        slots[FIRST_STEP_SLOT + d] = env.get(FIRST_STEP_SLOT + d);
    }
    Env {
        slots,
        budget: env.budget.clone(),
        mode: env.mode,
    }
}

/// A `value` step (with `for_each`: per element, then `result`).
fn eval_value(
    name: &Arc<str>,
    e: &Expr,
    result: Option<&Expr>,
    env: &Env,
    items: Option<Arc<Vec<Val>>>,
) -> Result<Result<Val, FlowError>, Yielded> {
    let Some(items) = items else {
        return Ok(yielded(eval(e, env, &Val::Null))?.map_err(|m| expr_err(name, "`value`", m)));
    };
    let mut out = Vec::with_capacity(items.len());
    for (k, item) in items.iter().enumerate() {
        let v = match yielded(eval_item(e, env, &Val::Null, item, k))? {
            Ok(v) => v,
            Err(m) => return Ok(Err(expr_err(name, "`value`", m))),
        };
        let v = match result {
            Some(r) => match yielded(eval_item(r, env, &v, item, k))? {
                Ok(v) => v,
                Err(m) => return Ok(Err(expr_err(name, "`value`", m))),
            },
            None => v,
        };
        out.push(v);
    }
    Ok(Ok(out.into_iter().collect()))
}

/// [`map_result`] on this worker, or on the compute pool for `compute: true` steps and for
/// results too heavy to finish inline.
async fn map_result_on(
    route: &RoutePlan,
    step: &StepPlan,
    env: Option<&Env>,
    body: Val,
    item: Option<(&Val, usize)>,
) -> Result<Val, FlowError> {
    let (Some(r), Some(env)) = (&step.result, env) else {
        return Ok(body);
    };
    if !step.compute
        && let Ok(out) = map_result(step, r, env, &body, item)
    {
        return out;
    }
    let (r, env, name) = (r.clone(), env.clone().offloaded(), step.name.clone());
    let backend = match &step.action {
        Action::Http(h) => Some(h.backend_name.clone()),
        _ => None,
    };
    let item = item.map(|(v, k)| (v.clone(), k));
    route
        .compute
        .run(move || {
            let out = match &item {
                Some((it, k)) => eval_item(&r, &env, &body, it, *k),
                None => eval(&r, &env, &body),
            };
            out.map_err(|m| result_err(&name, backend, m))
        })
        .await
        .map_err(|err| pool_error(&step.name, err))?
}

/// A step's `result` over one answer, in `env`'s mode.
fn map_result(
    step: &StepPlan,
    r: &Expr,
    env: &Env,
    body: &Val,
    item: Option<(&Val, usize)>,
) -> Result<Result<Val, FlowError>, Yielded> {
    let out = match item {
        Some((item, k)) => eval_item(r, env, body, item, k),
        None => eval(r, env, body),
    };
    let backend = match &step.action {
        Action::Http(h) => Some(h.backend_name.clone()),
        Action::Keyed { batch, .. } => Some(batch.name.clone()),
        Action::Value(_) => None,
    };
    Ok(yielded(out)?.map_err(|m| result_err(&step.name, backend, m)))
}

/// `result` failed: on the answer (502), or on a limit or the deadline.
fn result_err(step: &Arc<str>, backend: Option<Arc<str>>, m: EvalError) -> FlowError {
    let kind = match eval_kind(&m) {
        ErrorKind::Expression => ErrorKind::BadBackendAnswer,
        other => other,
    };
    let mut e = FlowError::new(
        kind,
        format!(
            "step `{step}`: `result` failed on the backend's answer: {}",
            m.0
        ),
    )
    .in_step(step);
    e.backend = backend;
    e
}

pub(crate) fn build_call(
    h: &HttpPlan,
    env: &Env,
    item: Option<(&Val, usize)>,
    deadline: Instant,
) -> Result<CallRequest, EvalError> {
    let ev = |e: &Expr| match item {
        Some((it, k)) => eval_item(e, env, &Val::Null, it, k),
        None => eval(e, env, &Val::Null),
    };
    let mut path = json::to_display(&ev(&h.path)?);
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    if !h.query.is_empty() {
        let mut ser = form_urlencoded::Serializer::new(String::new());
        for (k, e) in &h.query {
            match ev(e)? {
                Val::Null => {}
                Val::Arr(a) => {
                    for x in a.iter() {
                        ser.append_pair(k, &json::to_display(x));
                    }
                }
                v => {
                    ser.append_pair(k, &json::to_display(&v));
                }
            }
        }
        let q = ser.finish();
        if !q.is_empty() {
            path.push(if path.contains('?') { '&' } else { '?' });
            path.push_str(&q);
        }
    }
    let mut headers = HeaderMap::with_capacity(h.headers.len() + 2);
    for (name, e) in &h.headers {
        let v = ev(e)?;
        if matches!(v, Val::Null) {
            continue;
        }
        let text = json::to_display(&v);
        let hv = HeaderValue::from_str(&text).map_err(|_| {
            EvalError(
                format!(
                    "header `{name}`: `{}` is not a valid header value",
                    short_json(&v)
                ),
                EvalErrorKind::Failed,
            )
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
        method: h.method.clone(),
        path_and_query: path,
        headers,
        body,
        timeout: std::time::Duration::ZERO, // set when the call starts
        deadline,
        idempotent: h.idempotent,
        deadline_header: None, // set when the call starts
    })
}

/// Perform a step's call.
async fn call(
    step: &StepPlan,
    h: &HttpPlan,
    req: CallRequest,
    deadline: Instant,
    deadline_header: &HeaderName,
) -> Result<Val, FlowError> {
    fetch_json(&step.name, h, req, step.timeout, deadline, deadline_header).await
}

/// Perform one call with min(`step_timeout`, remaining budget), forward the budget, check the
/// status and parse the answer (once). `step` names the caller in errors.
pub(crate) async fn fetch_json(
    step_name: &Arc<str>,
    h: &HttpPlan,
    mut req: CallRequest,
    step_timeout: std::time::Duration,
    deadline: Instant,
    deadline_header: &HeaderName,
) -> Result<Val, FlowError> {
    let now = Instant::now();
    let remaining = deadline.saturating_duration_since(now);
    let timeout = step_timeout.min(remaining);
    req.timeout = timeout;
    req.deadline_header = Some(deadline_header.clone());
    let fut = h.backend.call(req);
    let resp: CallResponse = match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => r,
        // A timeout inside the layers (a shared call's own limit, a retry's last attempt) is
        // classified like our own timer: the request's deadline or the backend's timeout.
        Ok(Err(e)) if e.kind != CallErrorKind::Timeout => {
            return Err(FlowError::from_call(e, step_name, &h.backend_name));
        }
        Ok(Err(_)) | Err(_) => {
            let kind = if timeout < step_timeout {
                ErrorKind::DeadlineExceeded
            } else {
                ErrorKind::BackendTimeout
            };
            let waited = format!("{:.1} ms", timeout.as_secs_f64() * 1000.0);
            let message = if kind == ErrorKind::DeadlineExceeded {
                format!(
                    "step `{}`: the request deadline passed after waiting {waited} for backend `{}`",
                    step_name, h.backend_name
                )
            } else {
                format!(
                    "step `{}`: backend `{}` did not answer within its timeout ({waited})",
                    step_name, h.backend_name
                )
            };
            return Err(FlowError {
                kind,
                message,
                step: Some(step_name.clone()),
                backend: Some(h.backend_name.clone()),
            });
        }
    };
    if !resp.status.is_success() {
        let snippet = String::from_utf8_lossy(&resp.body[..resp.body.len().min(200)]).into_owned();
        return Err(FlowError {
            kind: ErrorKind::BackendStatus {
                status: resp.status.as_u16(),
                passthrough: h.backend.status_passthrough(),
            },
            message: format!(
                "step `{}`: backend `{}` answered {}{}",
                step_name,
                h.backend_name,
                resp.status.as_u16(),
                if snippet.is_empty() {
                    String::new()
                } else {
                    format!(": {snippet}")
                }
            ),
            step: Some(step_name.clone()),
            backend: Some(h.backend_name.clone()),
        });
    }
    if resp.body.is_empty() {
        return Ok(Val::Null);
    }
    let parsed = if resp.body.len() >= h.compute.offload_bytes && h.compute.started() {
        // A large answer: parse it on the compute pool, not on this worker.
        let body = resp.body.clone();
        let depth = h.max_depth;
        h.compute
            .run(move || json::parse_limited(&body, depth))
            .await
            .map_err(|e| FlowError {
                kind: ErrorKind::Overloaded,
                message: format!(
                    "step `{}`: parsing the answer of backend `{}`: {e}",
                    step_name, h.backend_name
                ),
                step: Some(step_name.clone()),
                backend: Some(h.backend_name.clone()),
            })?
    } else {
        json::parse_limited(&resp.body, h.max_depth)
    };
    parsed.map_err(|e| FlowError {
        kind: ErrorKind::BadBackendAnswer,
        message: format!(
            "step `{}`: backend `{}` answered invalid JSON: {e}",
            step_name, h.backend_name
        ),
        step: Some(step_name.clone()),
        backend: Some(h.backend_name.clone()),
    })
}
