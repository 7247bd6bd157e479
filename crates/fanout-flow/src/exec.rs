//! The per-request executor: runs a [`RoutePlan`] for one request.
//!
//! Steps start as soon as the steps they read are done; independent steps run concurrently on
//! the same task (no spawning, no threads). The whole request races its deadline: when it passes,
//! every call still in flight is dropped — which closes its connection or stream — and the request
//! fails with 504. A required step's failure ends the request the same way.

use crate::backend::CallRequest;
use crate::batch::{BatchPlan, Found};
use crate::call::{
    Env, Yielded, build_call, eval, eval_item, eval_kind, expr_err, expr_failure, fetch_json,
    short_json, yielded,
};
use crate::error::{Answer, ErrorKind, FlowError, code_for_status};
use crate::plan::{
    Action, FIRST_STEP_SLOT, FailPlan, HttpPlan, Missing, RespondPlan, RoutePlan, SLOT_REF,
    SLOT_REQUEST, StatusPlan, StepPlan,
};
use bytes::Bytes;
use fanout_config::StatusAction;
use fanout_expr::{Budget, EvalError, EvalErrorKind, Expr, Mode, Val, json, truthy};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use futures_util::stream::{FuturesUnordered, StreamExt, TryStreamExt};
use futures_util::{Future, stream};
use http::{HeaderName, HeaderValue};
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

/// A running step: its index, its value or failure, and whether the value is incomplete (some
/// elements were missing and replaced per the step's `missing` policy).
type StepFuture<'a> =
    Pin<Box<dyn Future<Output = (usize, Result<Val, FlowError>, bool)> + Send + 'a>>;

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
            while let Some(i) = next_ready(&self.steps, &mut ready) {
                let step = &self.steps[i];
                match self.start(step, i, &env, deadline) {
                    Started::Done(result) => {
                        let v = self.settle(step, result, false, &mut partial)?;
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
            let (i, result, incomplete) = tokio::select! {
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
            let v = self.settle(step, result, incomplete, &mut partial)?;
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

    /// Apply the failure policy to a finished step: `on_status`, then `optional`. An explicit
    /// client answer (a `fail` step, an `on_status` entry) is never replaced by a default.
    fn settle(
        &self,
        step: &StepPlan,
        result: Result<Val, FlowError>,
        incomplete: bool,
        partial: &mut Vec<Arc<str>>,
    ) -> Result<Val, FlowError> {
        let e = match result {
            Ok(v) => {
                if incomplete {
                    partial.push(step.name.clone());
                }
                return Ok(v);
            }
            Err(e) => match map_status(step, e) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            },
        };
        if step.optional && e.kind != ErrorKind::Answered {
            partial.push(step.name.clone());
            Ok(step.default.clone())
        } else {
            Err(e)
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
                            "evaluation yielded on the compute pool",
                        )
                        .in_step(&step.name))),
                        Err(e) => Prepared::Done(Err(pool_error(&step.name, e))),
                    };
                    match self.launch(step, i, p, &env, deadline) {
                        Started::Done(r) => (i, r, false),
                        Started::Pending(f) => f.await,
                        Started::Keyed { batch, keys } => {
                            let mut unique: Vec<String> =
                                keys.iter().map(|(k, _)| k.clone()).collect();
                            unique.sort_unstable();
                            unique.dedup();
                            let result_env = needs_env(step).then(|| env.clone());
                            let out = match batch.fetch(unique, deadline).await {
                                Err(e) => Err(e.in_step(&step.name)),
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
                            match out {
                                Ok((v, incomplete)) => (i, Ok(v), incomplete),
                                Err(e) => (i, Err(e), false),
                            }
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
                    (i, out, false)
                }))
            }
            (Prepared::Calls(reqs), Action::Http(h)) => {
                let result_env = needs_env(step).then(|| snapshot(env, step));
                Started::Pending(Box::pin(async move {
                    let result_env = result_env.as_ref();
                    let out = stream::iter(reqs)
                        .map(|(req, item, k)| async move {
                            match call(step, h, req, deadline, &self.deadline_header).await {
                                Ok(body) => {
                                    crate::activity::enter(i);
                                    let item = Some((&item, k));
                                    map_result_on(self, step, result_env, body, item)
                                        .await
                                        .map(|v| (Some(v), false))
                                }
                                // A 404 of one element is a missing element, when the step
                                // says what to do with those.
                                Err(e)
                                    if is_not_found(&e)
                                        && !matches!(step.missing, Missing::Fail) =>
                                {
                                    missing_on(self, step, result_env, Some((&item, k)))
                                        .await
                                        .map(|v| (v, true))
                                }
                                Err(e) => Err(e),
                            }
                        })
                        .buffered(step.concurrency)
                        .try_collect::<Vec<(Option<Val>, bool)>>()
                        .await;
                    match out {
                        Ok(v) => {
                            let incomplete = v.iter().any(|(_, m)| *m);
                            (
                                i,
                                Ok(v.into_iter().filter_map(|(v, _)| v).collect()),
                                incomplete,
                            )
                        }
                        Err(e) => (i, Err(e), false),
                    }
                }))
            }
            _ => Started::Done(Err(FlowError::new(
                ErrorKind::Expression,
                "prepared work does not match its kind",
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
                    Err(e) => Err(FlowError::new(ErrorKind::Overloaded, e.to_string())),
                }
            }
        }
    }
}

fn pool_error(step: &Arc<str>, e: crate::compute::ComputeError) -> FlowError {
    FlowError::new(ErrorKind::Overloaded, e.to_string()).in_step(step)
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
        (Action::Fail(f), _) => Done(Err(fail_error(step, f, env)?)),
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

/// A status code (100–599) from an expression's value.
fn status_of(v: &Val) -> Option<u16> {
    match v {
        Val::Num(n) => n.as_isize(),
        _ => None,
    }
    .and_then(|i| u16::try_from(i).ok())
    .filter(|s| (100..=599).contains(s))
}

/// The response: `respond.body`, status and headers evaluated in `env`'s mode.
fn respond_with(
    plan: &RespondPlan,
    env: &Env,
    partial: &[Arc<str>],
) -> Result<Result<Outcome, FlowError>, Yielded> {
    let mut body = match yielded(eval(&plan.body, env, &Val::Null))? {
        Ok(b) => b,
        Err(e) => return Ok(Err(expr_failure("respond.body", e))),
    };
    let status = match &plan.status {
        StatusPlan::Fixed(s) => *s,
        StatusPlan::Expr(x) => match yielded(eval(x, env, &Val::Null))? {
            Ok(v) => match status_of(&v) {
                Some(n) => n,
                None => {
                    return Ok(Err(FlowError::new(
                        ErrorKind::Expression,
                        "respond.status did not give a status code (100–599)",
                    )
                    .with_detail(format!("respond.status gave {}", short_json(&v)))));
                }
            },
            Err(e) => return Ok(Err(expr_failure("respond.status", e))),
        },
    };
    let mut headers = Vec::with_capacity(plan.headers.len() + 1);
    for (name, e) in &plan.headers {
        let v = match yielded(eval(e, env, &Val::Null))? {
            Ok(v) => v,
            Err(e) => return Ok(Err(expr_failure(&format!("respond header `{name}`"), e))),
        };
        if matches!(v, Val::Null) {
            continue;
        }
        let text = json::to_display(&v);
        let Ok(hv) = HeaderValue::from_str(&text) else {
            return Ok(Err(FlowError::new(
                ErrorKind::Expression,
                format!("respond header `{name}` is not a valid header value"),
            )
            .with_detail(format!("respond header `{name}`: {}", short_json(&v)))));
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
        status,
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
            let result_env = needs_env(step).then(|| snapshot(env, step));
            let each = step.for_each.is_some();
            inflight.push(Box::pin(async move {
                let out = match fetch.await {
                    Err(e) => Err(e.in_step(&step.name)),
                    Ok(found) => {
                        pick(self, step, &batch, &found, keys, each, result_env.as_ref()).await
                    }
                };
                match out {
                    Ok((v, incomplete)) => (i, Ok(v), incomplete),
                    Err(e) => (i, Err(e), false),
                }
            }));
        }
    }
}

/// A keyed step's value from the fetched values: one value, or a list in input order; and
/// whether some keys were missing (replaced per the step's `missing` policy).
async fn pick(
    route: &RoutePlan,
    step: &StepPlan,
    batch: &BatchPlan,
    found: &Found,
    keys: Vec<(String, Val)>,
    each: bool,
    env: Option<&Env>,
) -> Result<(Val, bool), FlowError> {
    let mut out = Vec::with_capacity(keys.len());
    let mut incomplete = false;
    for (k, (key, item)) in keys.into_iter().enumerate() {
        let item = each.then_some((&item, k));
        let Some(v) = found.get(&key) else {
            if matches!(step.missing, Missing::Fail) {
                return Err(
                    FlowError::new(ErrorKind::KeyNotFound, "a key was not found")
                        .in_step(&step.name)
                        .with_backend(&batch.name)
                        .with_detail(format!(
                            "key `{key}` is not in the answer of backend `{}`",
                            batch.name
                        )),
                );
            }
            incomplete = true;
            if let Some(v) = missing_on(route, step, env, item).await? {
                out.push(v);
            }
            continue;
        };
        out.push(map_result_on(route, step, env, v.clone(), item).await?);
    }
    if each {
        Ok((out.into_iter().collect(), incomplete))
    } else {
        Ok((out.pop().unwrap_or(Val::Null), incomplete))
    }
}

/// Whether a step needs its scope captured for evaluation after its call (`result`, or a
/// `missing: {value: …}` expression).
fn needs_env(step: &StepPlan) -> bool {
    step.result.is_some() || matches!(step.missing, Missing::Value(_))
}

/// The backend answered 404.
fn is_not_found(e: &FlowError) -> bool {
    matches!(e.kind, ErrorKind::BackendStatus { status: 404, .. })
}

/// The value that takes a missing element's place (`None`: left out), per the step's policy.
async fn missing_on(
    route: &RoutePlan,
    step: &StepPlan,
    env: Option<&Env>,
    item: Option<(&Val, usize)>,
) -> Result<Option<Val>, FlowError> {
    let (e, env) = match (&step.missing, env) {
        (Missing::Skip, _) => return Ok(None),
        (Missing::Null | Missing::Fail, _) | (Missing::Value(_), None) => {
            return Ok(Some(Val::Null));
        }
        (Missing::Value(e), Some(env)) => (e, env),
    };
    let name = step.name.clone();
    eval_step_expr(route, step, e, env, Val::Null, item, move |m| {
        expr_err(&name, "`missing.value`", m)
    })
    .await
    .map(Some)
}

/// A `fail` step's answer.
fn fail_error(step: &StepPlan, f: &FailPlan, env: &Env) -> Result<FlowError, Yielded> {
    let message = match &f.message {
        None => http::StatusCode::from_u16(f.status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("request refused")
            .to_string(),
        Some(e) => match yielded(eval(e, env, &Val::Null))? {
            Ok(v) => json::to_display(&v),
            Err(e) => return Ok(expr_err(&step.name, "`fail.message`", e)),
        },
    };
    let details = match &f.details {
        None => None,
        Some(e) => match yielded(eval(e, env, &Val::Null))? {
            Ok(v) => {
                let mut out = Vec::with_capacity(64);
                json::write(&v, &mut out);
                Some(Bytes::from(out))
            }
            Err(e) => return Ok(expr_err(&step.name, "`fail.details`", e)),
        },
    };
    Ok(FlowError::new(ErrorKind::Answered, message)
        .in_step(&step.name)
        .with_answer(Answer {
            status: f.status,
            code: f.code.clone(),
            details,
        }))
}

/// A backend's error status through the step's `on_status` map (exact statuses first, then
/// classes), then the default: 404 → 404 `not_found`; the rest stays `backend_status` (502, or
/// the backend's status with `status_passthrough`). `Ok` when the map says `default`.
fn map_status(step: &StepPlan, e: FlowError) -> Result<Val, FlowError> {
    let ErrorKind::BackendStatus { status, .. } = e.kind else {
        return Err(e);
    };
    let answered = |e: FlowError, to: u16, code: Option<&str>, message: Option<&str>| {
        let message = match message {
            Some(m) => m.to_string(),
            None => format!("the backend answered {status}"),
        };
        FlowError {
            kind: ErrorKind::Answered,
            message,
            ..e
        }
        .with_answer(Answer {
            status: to,
            code: code.map_or_else(|| code_for_status(to), Arc::from),
            details: None,
        })
    };
    match step.on_status.iter().find(|(p, _)| p.matches(status)) {
        Some((_, StatusAction::Default)) => Ok(step.default.clone()),
        Some((_, StatusAction::Status(to))) => Err(answered(e, *to, None, None)),
        Some((_, StatusAction::Pass)) => Err(answered(e, status, None, None)),
        Some((
            _,
            StatusAction::Answer {
                status: to,
                code,
                message,
            },
        )) => Err(answered(e, *to, code.as_deref(), message.as_deref())),
        None if status == 404 => Err(FlowError {
            kind: ErrorKind::NotFound,
            message: "not found: the backend answered 404".into(),
            ..e
        }),
        None => Err(e),
    }
}

/// The next ready step to start: `fail` steps first, so a guard that refuses the request does
/// so before any call of the same round is sent.
fn next_ready(steps: &[Arc<StepPlan>], ready: &mut Vec<usize>) -> Option<usize> {
    match ready
        .iter()
        .position(|&i| matches!(steps[i].action, Action::Fail(_)))
    {
        Some(p) => Some(ready.swap_remove(p)),
        None => ready.pop(),
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

/// A step's `result` over one answer (`body` unchanged without a `result`).
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
    let (name, backend) = (step.name.clone(), step_backend(step));
    eval_step_expr(route, step, r, env, body, item, move |m| {
        result_err(&name, backend, m)
    })
    .await
}

/// `e` over `input` (with `$item`/`$index` when given): on this worker, or on the compute pool
/// for `compute: true` steps and for evaluations too heavy to finish inline. `err` makes the
/// failure.
async fn eval_step_expr(
    route: &RoutePlan,
    step: &StepPlan,
    e: &Expr,
    env: &Env,
    input: Val,
    item: Option<(&Val, usize)>,
    err: impl FnOnce(EvalError) -> FlowError + Send + 'static,
) -> Result<Val, FlowError> {
    if !step.compute {
        let out = match item {
            Some((it, k)) => eval_item(e, env, &input, it, k),
            None => eval(e, env, &input),
        };
        if let Ok(out) = yielded(out) {
            return out.map_err(err);
        }
    }
    let (e, env) = (e.clone(), env.clone().offloaded());
    let item = item.map(|(v, k)| (v.clone(), k));
    route
        .compute
        .run(move || {
            let out = match &item {
                Some((it, k)) => eval_item(&e, &env, &input, it, *k),
                None => eval(&e, &env, &input),
            };
            out.map_err(err)
        })
        .await
        .map_err(|x| pool_error(&step.name, x))?
}

/// The backend a step calls, if any (for errors).
fn step_backend(step: &StepPlan) -> Option<Arc<str>> {
    match &step.action {
        Action::Http(h) => Some(h.backend_name.clone()),
        Action::Keyed { batch, .. } => Some(batch.name.clone()),
        Action::Value(_) | Action::Fail(_) => None,
    }
}

/// `result` failed: on the answer (502), or on a limit or the deadline.
fn result_err(step: &Arc<str>, backend: Option<Arc<str>>, m: EvalError) -> FlowError {
    let kind = match eval_kind(&m) {
        ErrorKind::Expression => ErrorKind::BadBackendAnswer,
        other => other,
    };
    let message = match kind {
        ErrorKind::BadBackendAnswer => "`result` failed on the backend's answer".to_string(),
        _ => format!("`result` failed: {}", m.0),
    };
    let mut e = FlowError::new(kind, message)
        .in_step(step)
        .with_detail(format!("`result`: {}", m.0));
    e.backend = backend;
    e
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
