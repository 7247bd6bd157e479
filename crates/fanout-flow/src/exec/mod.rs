//! The per-request executor: runs a [`RoutePlan`] for one request.
//!
//! Steps start as soon as the steps they read are done; independent steps run concurrently on
//! the same task (no spawning, no threads). The whole request races its deadline: when it passes,
//! every call still in flight is dropped — which closes its connection or stream — and the request
//! fails with 504. A required step's failure ends the request the same way.

use crate::call::{Env, Slots, Yielded, eval, expr_err, short_json, yielded};
use crate::coverage::Branch;
use crate::error::{Answer, ErrorKind, FlowError, answer_code};
use crate::observe::{NoObserver, Observer, StepEnd};
use crate::plan::{FIRST_STEP_SLOT, Missing, RoutePlan, SLOT_REF, SLOT_REQUEST, StepPlan};
use crate::respond::respond_with;
use crate::step::{Prepared, StepArgs};
use answer::{map_result_on, missing_on, needs_env, pool_error, snapshot};
use fanout_layers::backend::CallRequest;
use keyed::{KeyedLookup, flush_keyed, keyed_alone};

mod answer;
mod inflight;
mod keyed;

use inflight::InFlight;

use fanout_config::StatusAction;
use fanout_expr::{Budget, EvalError, EvalErrorKind, Mode, Val, truthy};
use futures_util::Future;

use smallvec::SmallVec;
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;

pub use crate::respond::{Outcome, PARTIAL_HEADER};

/// A running step: its index, its value or failure, and whether the value is incomplete (some
/// elements were missing and replaced per the step's `missing` policy).
pub(crate) type StepFuture<'a> =
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

/// One request's scheduling state: the scope (step values as they finish), how many inputs each
/// step still waits for, the steps ready to start, those in flight, and the optional steps
/// that fell back to their default.
struct Sched {
    env: Env,
    /// Per step: inline for flows of up to [`INLINE_STEPS`] steps (no allocation per request).
    steps: SmallVec<[StepState; INLINE_STEPS]>,
    ready: Ready,
    partial: Vec<Arc<str>>,
    done: usize,
}

/// Steps of a flow whose run state is kept inline in the request's future (most flows have a
/// few steps); larger flows allocate.
const INLINE_STEPS: usize = 8;

/// Steps ready to start.
type Ready = SmallVec<[usize; INLINE_STEPS]>;

/// Where one step of a run is.
#[derive(Clone, Copy)]
struct StepState {
    /// Dependencies not yet finished.
    waiting: usize,
    running: bool,
    /// When the step started (for the observer).
    started: Option<Instant>,
}

/// How a step continues after its start: finished, running, or keyed lookups to be merged with
/// the round's others.
enum Started<'a> {
    Done(Result<Val, FlowError>),
    Pending(StepFuture<'a>),
    Keyed(Arc<crate::batch::BatchPlan>, Vec<(String, Val)>),
}

impl RoutePlan {
    /// `METHOD PATH STEP`: a step's identity across reloads (what its kind counts is kept by a
    /// reload under it: [`crate::kind::StepCx::key`]).
    pub fn step_key(&self, step: &StepPlan) -> String {
        format!("{} {} {}", self.method, self.path, step.name)
    }

    /// Run the flow for one request. `request` is the `$request` value; `deadline` the request's
    /// effective deadline (route maximum, possibly shortened by the client).
    pub async fn run(&self, request: Val, deadline: Instant) -> Result<Outcome, FlowError> {
        self.run_observed(request, deadline, &NoObserver).await
    }

    /// [`RoutePlan::run`], telling `obs` when each step starts and ends and how each backend
    /// call ended (metrics, traces, `Server-Timing`).
    pub async fn run_observed(
        &self,
        request: Val,
        deadline: Instant,
        obs: &dyn Observer,
    ) -> Result<Outcome, FlowError> {
        // Every poll is timed: a poll that holds the worker too long is logged with route/step.
        let mut flow = std::pin::pin!(self.run_flow(request, deadline, obs));
        std::future::poll_fn(|cx| {
            crate::activity::poll_timed(
                &self.path,
                |i| self.steps.get(i).map(|s| s.name.to_string()),
                || flow.as_mut().poll(cx),
            )
        })
        .await
    }

    async fn run_flow(
        &self,
        request: Val,
        deadline: Instant,
        obs: &dyn Observer,
    ) -> Result<Outcome, FlowError> {
        let n = self.steps.len();
        if n == 1 {
            return self.run_one(request, deadline, obs).await;
        }
        let budget = Budget::new(self.limits, Some(deadline.into_std()));
        let _cancel = CancelOnDrop(budget.clone());
        let mut slots: Slots = smallvec::smallvec![Val::Null; FIRST_STEP_SLOT + n];
        slots[SLOT_REQUEST] = request;
        slots[SLOT_REF] = self.reference.snapshot();
        let mut s = Sched {
            env: Env {
                slots,
                budget,
                mode: Mode::Inline,
            },
            steps: self
                .steps
                .iter()
                .map(|s| StepState {
                    waiting: s.deps.len(),
                    running: false,
                    started: None,
                })
                .collect(),
            ready: self.roots.iter().copied().collect(),
            partial: Vec::new(),
            done: 0,
        };
        let mut inflight: InFlight<StepFuture<'_>> = InFlight::with_capacity(n);
        let sleep = tokio::time::sleep_until(deadline);
        tokio::pin!(sleep);
        loop {
            self.start_ready(&mut s, &mut inflight, deadline, obs)?;
            if s.done == n {
                break;
            }
            let (i, result, incomplete) = tokio::select! {
                biased;
                next = inflight.next() => match next {
                    Some(x) => x,
                    None => break, // unreachable: a dependency graph without cycles always drains
                },
                _ = &mut sleep => return Err(self.deadline_error(&s.steps)),
            };
            s.steps[i].running = false;
            self.finish(&mut s, i, result, incomplete, obs)?;
        }
        drop(inflight);
        self.respond(s.env, s.partial).await
    }

    /// [`RoutePlan::run_flow`] for a flow of one step (the most common shape): the same stages —
    /// start, race the deadline, settle, respond — without the scheduler's bookkeeping for steps
    /// that wait for others, and with a single call awaited in place instead of boxed into the
    /// in-flight set.
    async fn run_one(
        &self,
        request: Val,
        deadline: Instant,
        obs: &dyn Observer,
    ) -> Result<Outcome, FlowError> {
        let budget = Budget::new(self.limits, Some(deadline.into_std()));
        let _cancel = CancelOnDrop(budget.clone());
        let mut slots: Slots = smallvec::smallvec![Val::Null; FIRST_STEP_SLOT + 1];
        slots[SLOT_REQUEST] = request;
        slots[SLOT_REF] = self.reference.snapshot();
        let mut env = Env {
            slots,
            budget,
            mode: Mode::Inline,
        };
        let step = &self.steps[0];
        let started = Instant::now();
        obs.step_started(step);
        crate::activity::enter(0);
        let prepared = prepare(step, &env, deadline).map(|(p, taken)| {
            taken.report(step, obs);
            p
        });
        let started_step = match prepared {
            Ok(Prepared::Call(mut req)) => {
                req.trace = obs.call_trace(step);
                let a = args(step, obs);
                let call = step.kind.call(&a, req, deadline);
                // A call that ends by the deadline by itself (its kind's call is timed by the
                // time left) needs no timer of its own; one is armed for a `result` after it.
                if step.kind.call_ends_by_deadline() && step.result.is_none() {
                    Started::Done(observed_from(step, obs, started, call).await)
                } else {
                    let run = async {
                        let body = observed_from(step, obs, started, call).await?;
                        crate::activity::enter(0);
                        map_result_on(self, step, Some(&env), body, None).await
                    };
                    Started::Done(self.by_deadline(step, deadline, run).await?)
                }
            }
            Ok(p) => self.launch(step, 0, p, &env, deadline, obs),
            Err(Yielded) => self.start_on_pool(step, 0, &env, deadline, obs),
        };
        let (result, incomplete) = match started_step {
            Started::Done(r) => (r, false),
            Started::Pending(fut) => {
                let (_, r, incomplete) = self.by_deadline(step, deadline, fut).await?;
                (r, incomplete)
            }
            Started::Keyed(batch, keys) => {
                let fut = keyed_alone(self, step, (0, batch, keys), &env, deadline, obs);
                let (_, r, incomplete) = self.by_deadline(step, deadline, fut).await?;
                (r, incomplete)
            }
        };
        let mut partial = Vec::new();
        let end = |e: StepEnd<'_>| obs.step_finished(step, started, e);
        let v = self.settle(step, result, incomplete, &mut partial, obs, end)?;
        if step.streamed {
            obs.step_value(step, &v);
        }
        env.slots[FIRST_STEP_SLOT] = v;
        self.respond(env, partial).await
    }

    /// `fut`, or the deadline error of `step` (the flow's only step) if the deadline passes first
    /// (`fut` is polled first, as the scheduler polls its steps before its timer).
    async fn by_deadline<T>(
        &self,
        step: &StepPlan,
        deadline: Instant,
        fut: impl Future<Output = T>,
    ) -> Result<T, FlowError> {
        tokio::time::timeout_at(deadline, fut)
            .await
            .map_err(|_| self.deadline_error_in([step]))
    }

    /// Start every ready step (synchronous steps finish at once and may free others), then
    /// merge the keyed lookups of the steps started in this round, per batch form.
    fn start_ready<'a>(
        &'a self,
        s: &mut Sched,
        inflight: &mut InFlight<StepFuture<'a>>,
        deadline: Instant,
        obs: &'a dyn Observer,
    ) -> Result<(), FlowError> {
        let mut keyed: Vec<KeyedLookup> = Vec::new();
        while let Some(i) = next_ready(&self.steps, &mut s.ready) {
            s.steps[i].started = Some(Instant::now());
            obs.step_started(&self.steps[i]);
            match self.start(&self.steps[i], i, &s.env, deadline, obs) {
                Started::Done(result) => self.finish(s, i, result, false, obs)?,
                Started::Pending(fut) => {
                    s.steps[i].running = true;
                    inflight.push(fut);
                }
                Started::Keyed(batch, keys) => {
                    s.steps[i].running = true;
                    keyed.push((i, batch, keys));
                }
            }
        }
        if !keyed.is_empty() {
            flush_keyed(self, keyed, &s.env, deadline, inflight, obs);
        }
        Ok(())
    }

    /// A step finished: apply its failure policy, store its value, release its dependents.
    fn finish(
        &self,
        s: &mut Sched,
        i: usize,
        result: Result<Val, FlowError>,
        incomplete: bool,
        obs: &dyn Observer,
    ) -> Result<(), FlowError> {
        let step = &self.steps[i];
        let started = s.steps[i].started.unwrap_or_else(Instant::now);
        let end = |e: StepEnd<'_>| obs.step_finished(step, started, e);
        let v = self.settle(step, result, incomplete, &mut s.partial, obs, end)?;
        if step.streamed {
            obs.step_value(step, &v);
        }
        s.env.slots[FIRST_STEP_SLOT + i] = v;
        s.done += 1;
        release(step, &mut s.steps, &mut s.ready);
        Ok(())
    }

    fn deadline_error(&self, states: &[StepState]) -> FlowError {
        self.deadline_error_in(
            states
                .iter()
                .zip(&self.steps)
                .filter(|(s, _)| s.running)
                .map(|(_, step)| &**step),
        )
    }

    /// The request's deadline passed while `pending` were running.
    fn deadline_error_in<'s>(&self, pending: impl IntoIterator<Item = &'s StepPlan>) -> FlowError {
        let pending: Vec<&StepPlan> = pending.into_iter().collect();
        let waiting_for = match pending.as_slice() {
            [] => "the flow".to_string(),
            steps => {
                let names: Vec<&str> = steps.iter().map(|s| &*s.name).collect();
                format!("step(s) {}", names.join(", "))
            }
        };
        let mut e = FlowError::new(
            ErrorKind::DeadlineExceeded,
            format!("route deadline exceeded while waiting for {waiting_for}"),
        );
        if let [one] = pending.as_slice() {
            e.step = Some(one.name.clone());
            e.backend = one.kind.backend().cloned();
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
        obs: &dyn Observer,
        end: impl FnOnce(StepEnd<'_>),
    ) -> Result<Val, FlowError> {
        let e = match result {
            Ok(v) => {
                if incomplete {
                    partial.push(step.name.clone());
                }
                end(StepEnd::Ok);
                return Ok(v);
            }
            Err(e) => match map_status(step, e, obs) {
                Ok(v) => {
                    end(StepEnd::Ok);
                    return Ok(v);
                }
                Err(e) => e,
            },
        };
        if step.optional && e.kind != ErrorKind::Answered {
            partial.push(step.name.clone());
            end(StepEnd::Defaulted(&e));
            Ok(step.default.clone())
        } else {
            end(StepEnd::Failed(&e));
            Err(e)
        }
    }

    fn start<'a>(
        &'a self,
        step: &'a Arc<StepPlan>,
        i: usize,
        env: &Env,
        deadline: Instant,
        obs: &'a dyn Observer,
    ) -> Started<'a> {
        crate::activity::enter(i);
        match prepare(step, env, deadline) {
            Ok((p, taken)) => {
                taken.report(step, obs);
                self.launch(step, i, p, env, deadline, obs)
            }
            Err(Yielded) => self.start_on_pool(step, i, env, deadline, obs),
        }
    }

    /// The step's synchronous work was too heavy for the worker: redo it on the compute pool,
    /// then go on here (keyed lookups prepared there are fetched on their own).
    fn start_on_pool<'a>(
        &'a self,
        step: &'a Arc<StepPlan>,
        i: usize,
        env: &Env,
        deadline: Instant,
        obs: &'a dyn Observer,
    ) -> Started<'a> {
        let env = snapshot(env, step);
        let (s, snap, pool) = (step.clone(), env.clone().offloaded(), self.compute.clone());
        Started::Pending(fanout_layers::boxed::pinned(|| async move {
            let p = match pool.run(move || prepare(&s, &snap, deadline)).await {
                Ok(Ok((p, taken))) => {
                    taken.report(step, obs);
                    p
                }
                Ok(Err(Yielded)) => Prepared::Done(Err(FlowError::new(
                    ErrorKind::Expression,
                    "evaluation yielded on the compute pool",
                )
                .in_step(&step.name))),
                Err(e) => Prepared::Done(Err(pool_error(&step.name, e))),
            };
            match self.launch(step, i, p, &env, deadline, obs) {
                Started::Done(r) => (i, r, false),
                Started::Pending(f) => f.await,
                Started::Keyed(batch, keys) => {
                    keyed_alone(self, step, (i, batch, keys), &env, deadline, obs).await
                }
            }
        }))
    }

    /// Turn a step's prepared work into what the scheduler runs.
    fn launch<'a>(
        &'a self,
        step: &'a StepPlan,
        i: usize,
        p: Prepared,
        env: &Env,
        deadline: Instant,
        obs: &'a dyn Observer,
    ) -> Started<'a> {
        match p {
            Prepared::Done(r) => Started::Done(r),
            Prepared::Keys(batch, keys) => Started::Keyed(batch, keys),
            Prepared::Call(mut req) => {
                req.trace = obs.call_trace(step);
                let env = step.result.as_ref().map(|_| Box::new(snapshot(env, step)));
                Started::Pending(fanout_layers::boxed::pinned(|| async move {
                    let a = args(step, obs);
                    let out = match observed(step, obs, step.kind.call(&a, req, deadline)).await {
                        Ok(body) => {
                            crate::activity::enter(i);
                            map_result_on(self, step, env.as_deref(), body, None).await
                        }
                        Err(e) => Err(e),
                    };
                    (i, out, false)
                }))
            }
            Prepared::Task(work, items) => {
                let env = needs_env(step).then(|| Box::new(snapshot(env, step)));
                let work = work(obs.call_trace(step));
                Started::Pending(fanout_layers::boxed::pinned(|| async move {
                    let out = match observed(step, obs, work).await {
                        Ok(values) => {
                            crate::activity::enter(i);
                            self.task_values(step, values, items, env.as_deref()).await
                        }
                        Err(e) => Err(e),
                    };
                    (i, out, false)
                }))
            }
            Prepared::Calls(mut reqs) => {
                for (req, _, _) in &mut reqs {
                    req.trace = obs.call_trace(step);
                }
                let env = needs_env(step).then(|| Box::new(snapshot(env, step)));
                Started::Pending(fanout_layers::boxed::pinned(|| async move {
                    self.run_calls(step, i, reqs, env.as_deref(), deadline, obs)
                        .await
                }))
            }
        }
    }

    /// The values of a [`Prepared::Task`] through the step's `result`: one value, or one per
    /// `for_each` element (an array).
    async fn task_values(
        &self,
        step: &StepPlan,
        values: Vec<Val>,
        items: Option<Arc<Vec<Val>>>,
        env: Option<&Env>,
    ) -> Result<Val, FlowError> {
        let Some(items) = items else {
            let v = values.into_iter().next().unwrap_or(Val::Null);
            return map_result_on(self, step, env, v, None).await;
        };
        let mut out = Vec::with_capacity(values.len());
        for (k, (v, item)) in values.into_iter().zip(items.iter()).enumerate() {
            out.push(map_result_on(self, step, env, v, Some((item, k))).await?);
        }
        Ok(Val::Arr(out.into()))
    }

    /// A `for_each` step's calls, at most `concurrency` at a time, values in input order. A 404
    /// of one element is a missing element when the step says what to do with those.
    async fn run_calls(
        &self,
        step: &StepPlan,
        i: usize,
        reqs: Vec<(CallRequest, Val, usize)>,
        env: Option<&Env>,
        deadline: Instant,
        obs: &dyn Observer,
    ) -> (usize, Result<Val, FlowError>, bool) {
        if step.share_calls && reqs.len() > 1 {
            return self
                .run_shared_calls(step, i, reqs, env, deadline, obs)
                .await;
        }
        let a = &args(step, obs);
        let memo = ResultMemo::for_step(step);
        let memo = &memo;
        let each = |(req, item, k): (CallRequest, Val, usize)| async move {
            let item = Some((&item, k));
            let call = step.kind.call(a, req, deadline);
            match observed(step, obs, call).await {
                Ok(body) => {
                    crate::activity::enter(i);
                    if let Some(v) = memo.get(&body) {
                        return Ok((Some(v), false));
                    }
                    let v = map_result_on(self, step, env, body.clone(), item).await?;
                    memo.put(body, &v);
                    Ok((Some(v), false))
                }
                Err(e) if is_not_found(&e) && !matches!(step.missing, Missing::Fail) => {
                    Ok((missing_on(self, step, env, item).await?, true))
                }
                Err(e) => Err(e),
            }
        };
        let each = &each;
        // On a streamed route each element is told as it completes, and one that fails is left
        // out (the step partial) rather than failing the step.
        let one = |r: (CallRequest, Val, usize)| async move {
            let k = r.2;
            let out = each(r).await;
            if !step.streamed {
                return out;
            }
            match out {
                Ok((Some(v), m)) => {
                    obs.element(step, k, Ok(&v));
                    Ok((Some(v), m))
                }
                Ok((None, m)) => Ok((None, m)),
                Err(e) => {
                    obs.element(step, k, Err(&e));
                    Ok((None, true))
                }
            }
        };
        let out = in_order(reqs, step.concurrency, |(n, r)| {
            fanout_layers::boxed::pinned(|| async move { (n, one(r).await) })
        })
        .await;
        match out {
            Ok(v) => {
                let incomplete = v.iter().any(|(_, m)| *m);
                let values = v.into_iter().filter_map(|(v, _)| v).collect();
                (i, Ok(values), incomplete)
            }
            Err(e) => (i, Err(e), false),
        }
    }

    /// [`RoutePlan::run_calls`] for a step that shares equal calls (`share_calls`: a GraphQL
    /// field resolved for a list of parents): each distinct call that only reads is made once,
    /// at most `concurrency` at a time, and its answer read by every element that built it.
    async fn run_shared_calls(
        &self,
        step: &StepPlan,
        i: usize,
        reqs: Vec<(CallRequest, Val, usize)>,
        env: Option<&Env>,
        deadline: Instant,
        obs: &dyn Observer,
    ) -> (usize, Result<Val, FlowError>, bool) {
        let a = &args(step, obs);
        let mut seen = std::collections::HashMap::with_capacity(reqs.len());
        let mut which = Vec::with_capacity(reqs.len());
        let mut items = Vec::with_capacity(reqs.len());
        let mut distinct = Vec::new();
        for (req, item, k) in reqs {
            if req.is_safe() {
                let key = req.key();
                if let Some(&u) = seen.get(&key) {
                    which.push(u);
                    items.push((item, k));
                    continue;
                }
                seen.insert(key, distinct.len());
            }
            which.push(distinct.len());
            items.push((item, k));
            distinct.push(req);
        }
        let one = |req: CallRequest| async move {
            match observed(step, obs, step.kind.call(a, req, deadline)).await {
                Ok(body) => Ok(Some(body)),
                Err(e) if is_not_found(&e) && !matches!(step.missing, Missing::Fail) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let answers = match in_order(distinct, step.concurrency, |(n, r)| {
            fanout_layers::boxed::pinned(|| async move { (n, one(r).await) })
        })
        .await
        {
            Ok(a) => a,
            Err(e) => return (i, Err(e), false),
        };
        crate::activity::enter(i);
        let mut values = Vec::with_capacity(items.len());
        let mut incomplete = false;
        for (u, (item, k)) in which.into_iter().zip(items.iter()) {
            let item = Some((item, *k));
            let v = match answers.get(u).cloned().flatten() {
                Some(body) => map_result_on(self, step, env, body, item).await.map(Some),
                None => {
                    incomplete = true;
                    missing_on(self, step, env, item).await
                }
            };
            match v {
                Ok(Some(v)) => values.push(v),
                Ok(None) => {}
                Err(e) => return (i, Err(e), false),
            }
        }
        (i, Ok(Val::Arr(values.into())), incomplete)
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

/// Run `items` through `run`, at most `limit` at a time (at least one), and collect their
/// values in input order; the failure of the first element (in input order) that fails ends it,
/// as `buffered(limit)` + `try_collect` would, without its self-waking poll ([`InFlight`]) or its
/// head-of-line window: `limit` counts the futures running, not the answers waiting for an
/// earlier one.
async fn in_order<I, T, E, F>(
    items: Vec<I>,
    limit: usize,
    mut run: impl FnMut((usize, I)) -> Pin<Box<F>>,
) -> Result<Vec<T>, E>
where
    F: Future<Output = (usize, Result<T, E>)> + ?Sized,
{
    let total = items.len();
    let mut values: Vec<Option<T>> = Vec::with_capacity(total);
    values.resize_with(total, || None);
    let mut failed: Option<(usize, E)> = None;
    let mut todo = items.into_iter().enumerate();
    let limit = limit.max(1);
    let mut running = InFlight::with_capacity(limit.min(total));
    loop {
        while running.len() < limit && failed.is_none() {
            match todo.next() {
                Some(x) => running.push(run(x)),
                None => break,
            }
        }
        // After a failure, only the elements before it can still change the outcome.
        let Some((n, result)) = running.next().await else {
            break;
        };
        match result {
            Ok(v) => {
                if let Some(slot) = values.get_mut(n) {
                    *slot = Some(v);
                }
            }
            Err(e) => {
                if failed.as_ref().is_none_or(|(m, _)| n < *m) {
                    failed = Some((n, e));
                }
            }
        }
        if let Some((m, _)) = &failed
            && values.iter().take(*m).all(Option::is_some)
        {
            break;
        }
    }
    match failed {
        Some((_, e)) => Err(e),
        None => Ok(values.into_iter().flatten().collect()),
    }
}

/// The ways a step's `when` and `for_each` went in [`prepare`], told to the observer after it
/// (`prepare` may run on the compute pool, away from the request's observer).
#[derive(Clone, Copy, Default)]
struct Taken {
    /// The `when`'s value, when the step has one and it evaluated.
    when: Option<bool>,
    /// Whether the `for_each` list was empty, when the step has one and it evaluated.
    empty: Option<bool>,
}

impl Taken {
    /// Tell `obs` (a step without `when` or `for_each` makes no call).
    fn report(self, step: &StepPlan, obs: &dyn Observer) {
        if let Some(w) = self.when {
            obs.branch(step, Branch::When(w));
        }
        if let Some(e) = self.empty {
            obs.branch(step, Branch::ForEachEmpty(e));
        }
    }
}

/// A step's synchronous part — `when`, `for_each`, then its kind's work (building its call(s)
/// or keys, or its value) — in `env`'s mode, with the ways its `when` and `for_each` went;
/// `Err(Yielded)` when an inline evaluation must move to the compute pool.
fn prepare(step: &StepPlan, env: &Env, deadline: Instant) -> Result<(Prepared, Taken), Yielded> {
    use Prepared::Done;
    let mut taken = Taken::default();
    // `compute: true` steps without I/O always run on the pool.
    if step.compute && env.mode == Mode::Inline && step.kind.is_pure() {
        return Err(Yielded);
    }
    if let Some(when) = &step.when {
        match yielded(eval(when, env, &Val::Null))? {
            Ok(v) if !truthy(&v) => {
                taken.when = Some(false);
                return Ok((Done(Ok(step.default.clone())), taken));
            }
            Ok(_) => taken.when = Some(true),
            Err(e) => return Ok((Done(Err(expr_err(&step.name, "`when`", e))), taken)),
        }
    }
    let items = match &step.for_each {
        None => None,
        Some(e) => match yielded(eval(e, env, &Val::Null))? {
            Ok(Val::Arr(a)) => Some(a),
            Ok(Val::Null) => Some(Default::default()),
            Ok(other) => {
                let m = EvalError(
                    format!("expected a list, got {}", short_json(&other)),
                    EvalErrorKind::Failed,
                );
                return Ok((Done(Err(expr_err(&step.name, "`for_each`", m))), taken));
            }
            Err(e) => return Ok((Done(Err(expr_err(&step.name, "`for_each`", e))), taken)),
        },
    };
    taken.empty = items.as_ref().map(|a| a.is_empty());
    let p = step
        .kind
        .prepare(&args(step, &NoObserver), env, items, deadline)?;
    Ok((p, taken))
}

/// A step's backend call, its end reported to `obs` (before the step's `result` runs).
async fn observed<T>(
    step: &StepPlan,
    obs: &dyn Observer,
    call: impl Future<Output = Result<T, FlowError>>,
) -> Result<T, FlowError> {
    observed_from(step, obs, Instant::now(), call).await
}

/// [`observed`] for a call that started at `t` (a time already read when the step started in
/// the same poll: one clock read less).
async fn observed_from<T>(
    step: &StepPlan,
    obs: &dyn Observer,
    t: Instant,
    call: impl Future<Output = Result<T, FlowError>>,
) -> Result<T, FlowError> {
    let r = call.await;
    obs.call_finished(step, t.elapsed(), r.as_ref().map(|_| ()));
    r
}

/// What a step's kind sees of the step (`obs`: the request's, for its memory account).
fn args<'a>(step: &'a StepPlan, obs: &'a dyn Observer) -> StepArgs<'a> {
    StepArgs {
        name: &step.name,
        result: step.result.as_ref(),
        timeout: step.timeout,
        memory: obs.memory(),
    }
}

/// The backend answered 404.
fn is_not_found(e: &FlowError) -> bool {
    matches!(e.kind, ErrorKind::BackendStatus { status: 404, .. })
}

/// A backend's error status through the step's `on_status` map (exact statuses first, then
/// classes), then the default: 404 → 404 `not_found`; the rest stays `backend_status` (502, or
/// the backend's status with `status_passthrough`). `Ok` when the map says `default`.
/// The entry that matched is told to `obs` (coverage).
fn map_status(step: &StepPlan, e: FlowError, obs: &dyn Observer) -> Result<Val, FlowError> {
    let status = match e.kind {
        ErrorKind::BackendStatus { status, .. } => status,
        ErrorKind::Class(c) => match c.on_status {
            Some(status) => status,
            None => return Err(e),
        },
        _ => return Err(e),
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
            code: answer_code(to, code),
            details: None,
        })
    };
    let entry = step.on_status.iter().find(|(p, _)| p.matches(status));
    if let Some((p, _)) = entry {
        obs.branch(step, Branch::OnStatus(*p));
    }
    match entry {
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
            message: match e.kind {
                ErrorKind::Class(c) => c.not_found.unwrap_or("not found").into(),
                _ => "not found: the backend answered 404".into(),
            },
            ..e
        }),
        None => Err(e),
    }
}

/// The next ready step to start: guards (`fail` steps) first, so a guard that refuses the request does
/// so before any call of the same round is sent.
fn next_ready(steps: &[Arc<StepPlan>], ready: &mut Ready) -> Option<usize> {
    match ready.iter().position(|&i| steps[i].kind.starts_first()) {
        Some(p) => Some(ready.swap_remove(p)),
        None => ready.pop(),
    }
}

fn release(step: &StepPlan, states: &mut [StepState], ready: &mut Ready) {
    for &d in &step.dependents {
        states[d].waiting -= 1;
        if states[d].waiting == 0 {
            ready.push(d);
        }
    }
}

/// A `for_each` step's `result` values by answer, within one run of the step: elements whose
/// calls were shared (dedup) hold the very same parsed answer, and a `result` that reads neither
/// `$item` nor `$index` (nor runs on the compute pool) gives them the same value, so it is
/// evaluated once per distinct answer. Answers are told apart by identity (the memo holds them,
/// so an address is never reused while it is looked up); at most [`ResultMemo::MAX`] are kept.
struct ResultMemo(Option<std::sync::Mutex<Vec<(Val, Val)>>>);

impl ResultMemo {
    const MAX: usize = 64;

    fn for_step(step: &StepPlan) -> ResultMemo {
        let pure = !step.compute
            && step
                .result
                .as_ref()
                .is_some_and(|r| !crate::plan::reads_item(r));
        ResultMemo(pure.then(|| std::sync::Mutex::new(Vec::new())))
    }

    fn get(&self, answer: &Val) -> Option<Val> {
        let m = self.0.as_ref()?.lock().ok()?;
        m.iter()
            .find(|(a, _)| same_container(a, answer))
            .map(|(_, v)| v.clone())
    }

    fn put(&self, answer: Val, result: &Val) {
        if !matches!(answer, Val::Arr(_) | Val::Obj(_)) {
            return;
        }
        if let Some(Ok(mut m)) = self.0.as_ref().map(|m| m.lock())
            && m.len() < Self::MAX
        {
            m.push((answer, result.clone()));
        }
    }
}

/// Whether `a` and `b` are the same array or object (not merely equal).
fn same_container(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Arr(x), Val::Arr(y)) => Arc::ptr_eq(x, y),
        (Val::Obj(x), Val::Obj(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}
