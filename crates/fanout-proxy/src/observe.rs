//! The gateway's observer of a request's run: one small struct forwarding each hook of
//! [`fanout_flow::observe::Observer`] to the parts that are on for this request (each `None`
//! when off, so a request with nothing on pays a branch per hook). The parts keep their logic in
//! their own modules: metrics in `metrics/`, the trace in `telemetry/trace.rs`, the timeline (for
//! `Server-Timing` and the access log) in `telemetry/server_timing.rs`, the live page's record in
//! `ui/record.rs`.

use fanout_flow::FlowError;
use fanout_flow::coverage::{Branch, RouteCoverage};
use fanout_flow::memory::RequestMemory;
use fanout_flow::observe::{Observer, StepEnd};
use fanout_flow::plan::StepPlan;
use fanout_layers::trace::CallTrace;
use fanout_ops::errlog::LogThrottle;
use fanout_ops::metrics::RouteMetrics;
use fanout_ops::record::{RequestSteps, RouteStat};
use fanout_ops::telemetry::server_timing::Timeline;
use fanout_ops::telemetry::trace::RequestTrace;
use std::time::Duration;
use tokio::time::Instant;

/// Forwards the executor's events to the request's metrics, trace and timeline.
#[derive(Default, Clone, Copy)]
pub struct RequestObserver<'a> {
    /// The route's metric handles (`None`: metrics off).
    pub metrics: Option<&'a RouteMetrics>,
    /// The request's spans (tracing on).
    pub trace: Option<&'a RequestTrace>,
    /// The request's step timeline (`Server-Timing` or the access log on).
    pub timing: Option<&'a Timeline>,
    /// Where an optional step that failed is logged (`None`: not logged).
    pub degraded: Option<DegradedLog<'a>>,
    /// The request's account in the memory budget (`None`: none is kept).
    pub memory: Option<&'a RequestMemory<'a>>,
    /// Where the branches the run takes are recorded (`None`: coverage is not recorded, as
    /// when serving; `fanout test --coverage` records it).
    pub coverage: Option<RouteCoverage<'a>>,
    /// The live page's record of the request's steps and its route's numbers (`None`:
    /// `admin.ui` off).
    pub ui: Option<(&'a RequestSteps, Option<&'a RouteStat>)>,
}

/// The log line of an optional step that failed and gave its default (the answer is partial):
/// at `info`, with the request id, step, backend and cause, within the failed-request lines'
/// budget (`server.error_log_per_second`).
#[derive(Clone, Copy)]
pub struct DegradedLog<'a> {
    /// The request's id.
    pub request_id: &'a http::HeaderValue,
    /// The per-second cap shared with failed-request lines.
    pub throttle: &'a LogThrottle,
}

impl DegradedLog<'_> {
    fn write(&self, step: &StepPlan, e: &FlowError) {
        if !self.throttle.admit(std::time::Instant::now()).0 {
            return;
        }
        let request_id = String::from_utf8_lossy(self.request_id.as_bytes());
        let backend = e.backend.as_deref().unwrap_or("");
        let detail = e.detail.as_deref().unwrap_or("");
        tracing::info!(
            %request_id,
            step = %step.name,
            backend = %backend,
            code = %e.code(),
            detail = %detail,
            "optional step failed, its default is used (partial answer): {}",
            e.message
        );
    }
}

impl Observer for RequestObserver<'_> {
    fn memory(&self) -> &RequestMemory<'_> {
        self.memory.unwrap_or(RequestMemory::unlimited())
    }

    fn step_started(&self, step: &StepPlan) {
        if let Some(t) = self.trace {
            t.step_started(step);
        }
        if let Some(c) = self.coverage {
            c.step(step, Branch::Ran);
        }
    }

    fn branch(&self, step: &StepPlan, branch: Branch) {
        if let Some(c) = self.coverage {
            c.step(step, branch);
        }
    }

    #[inline]
    fn call_finished(&self, step: &StepPlan, elapsed: Duration, result: Result<(), &FlowError>) {
        if let Some(m) = self.metrics {
            m.call_finished(step, elapsed, result);
        }
        if let Some((steps, _)) = self.ui {
            steps.call_finished(step);
        }
    }

    /// The call's tracer when the request is traced, and the live page's counter of the
    /// step's attempts when `admin.ui` is on (no allocation: `Arc` clones).
    fn call_trace(&self, step: &StepPlan) -> Option<CallTrace> {
        let tracer = self.trace.and_then(|t| t.call_tracer(step));
        let counter = self.ui.map(|(s, _)| s.counter());
        if tracer.is_none() && counter.is_none() {
            return None;
        }
        let mut t = CallTrace::new(u16::try_from(step.index).unwrap_or(u16::MAX));
        t.tracer = tracer;
        t.counter = counter;
        Some(t)
    }

    fn step_finished(&self, step: &StepPlan, started: Instant, end: StepEnd<'_>) {
        if let Some(t) = self.trace {
            t.step_finished(step, end);
        }
        if let Some(t) = self.timing {
            t.step_finished(step, started, end);
        }
        if let Some((steps, stats)) = self.ui {
            steps.step_finished(stats, step, started, end);
        }
        if let (Some(l), StepEnd::Defaulted(e)) = (self.degraded, end) {
            l.write(step, e);
        }
        if let (Some(c), StepEnd::Defaulted(_)) = (self.coverage, end) {
            c.step(step, Branch::Defaulted);
        }
    }
}
