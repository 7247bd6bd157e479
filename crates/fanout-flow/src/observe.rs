//! What the executor tells the outside about one request while it runs: when each step starts
//! and ends, and how each of its backend calls ended. The gateway's metrics, traces and
//! `Server-Timing` are [`Observer`]s; the executor only calls these hooks and never depends on
//! what they do. Every hook has an empty default, so an observer implements only what it needs,
//! and [`NoObserver`] costs a virtual call per hook.
//!
//! Hooks run on the request's task, inline: they must be cheap and must not block.

use crate::coverage::Branch;
use crate::error::FlowError;
use crate::memory::RequestMemory;
use crate::plan::StepPlan;
use fanout_expr::Val;
use std::time::Duration;
use tokio::time::Instant;

/// How a step ended, after its failure policy (a step whose `when` was false ended `Ok`; steps
/// still running when the request ends are not reported).
#[derive(Debug, Clone, Copy)]
pub enum StepEnd<'a> {
    /// The step produced its value (possibly incomplete: some `for_each` elements missing).
    Ok,
    /// The optional step failed and its `default` was used instead (`error` is why).
    Defaulted(&'a FlowError),
    /// The step failed and so does the request (unless `on_status` answered it).
    Failed(&'a FlowError),
}

/// Receives the events of one request's run. Implementations are per request (a timeline for
/// `Server-Timing`, a trace context) or shared (metrics).
pub trait Observer: Send + Sync {
    /// `step` is starting now.
    fn step_started(&self, step: &StepPlan) {
        let _ = step;
    }

    /// One backend call made for `step` ended after `elapsed` (a `for_each` step makes one per
    /// element; a keyed step reports the batch fetch it waited for). `result` is `Ok` for an
    /// answer the step accepted, else the call's error (its `source` has the transport kind).
    fn call_finished(&self, step: &StepPlan, elapsed: Duration, result: Result<(), &FlowError>) {
        let _ = (step, elapsed, result);
    }

    /// The trace context of a call `step` is about to make (`None`: the call is not traced).
    fn call_trace(&self, step: &StepPlan) -> Option<fanout_layers::trace::CallTrace> {
        let _ = step;
        None
    }

    /// `step` ended: it started at `started` (the request's clock).
    fn step_finished(&self, step: &StepPlan, started: Instant, end: StepEnd<'_>) {
        let _ = (step, started, end);
    }

    /// `step` took `branch`: its `when` was evaluated, its `for_each` list was empty or not,
    /// an `on_status` entry matched (for coverage, `fanout test --coverage`; the step's start
    /// and its optional default are told by `step_started` and `step_finished`). Called only
    /// for steps that have such a branch.
    fn branch(&self, step: &StepPlan, branch: Branch) {
        let _ = (step, branch);
    }

    /// A streamed route (`stream:`): element `index` of `step`, a `for_each` step making one
    /// call per element, is done — its value after `result`, or its failure (the element is then
    /// left out of the step's value and the step is partial). Called as each completes, in
    /// completion order, only for steps marked [`StepPlan::streamed`].
    fn element(&self, step: &StepPlan, index: usize, value: Result<&Val, &FlowError>) {
        let _ = (step, index, value);
    }

    /// A streamed route (`stream:`): `step` ended with `value` (after its failure policy: an
    /// optional step's default). Called only for steps marked [`StepPlan::streamed`].
    fn step_value(&self, step: &StepPlan, value: &Val) {
        let _ = (step, value);
    }

    /// The request's account in the gateway's memory budget: the backend answers parsed for the
    /// run are held there until it ends ([`crate::memory`]). Not an event but the one
    /// per-request resource the executor takes from outside, so it travels with the hooks.
    fn memory(&self) -> &RequestMemory<'_> {
        RequestMemory::unlimited()
    }
}

/// An observer that ignores everything (`RoutePlan::run`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl Observer for NoObserver {}
