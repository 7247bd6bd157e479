//! The gateway's observer of a request's run: one small struct forwarding each hook of
//! [`fanout_flow::observe::Observer`] to the parts that are on for this request (each `None`
//! when off, so a request with nothing on pays a branch per hook). The parts keep their logic in
//! their own modules: metrics in `metrics/`, the trace in `telemetry/trace.rs`, the timeline (for
//! `Server-Timing` and the access log) in `telemetry/server_timing.rs`.

use crate::metrics::RouteMetrics;
use crate::telemetry::server_timing::Timeline;
use crate::telemetry::trace::RequestTrace;
use fanout_flow::FlowError;
use fanout_flow::observe::{Observer, StepEnd};
use fanout_flow::plan::StepPlan;
use fanout_flow::trace::CallTrace;
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
}

impl Observer for RequestObserver<'_> {
    fn step_started(&self, step: &StepPlan) {
        if let Some(t) = self.trace {
            t.step_started(step);
        }
    }

    #[inline]
    fn call_finished(&self, step: &StepPlan, elapsed: Duration, result: Result<(), &FlowError>) {
        if let Some(m) = self.metrics {
            m.call_finished(step, elapsed, result);
        }
    }

    fn call_trace(&self, step: &StepPlan) -> Option<CallTrace> {
        self.trace?.call_trace(step)
    }

    fn step_finished(&self, step: &StepPlan, started: Instant, end: StepEnd<'_>) {
        if let Some(t) = self.trace {
            t.step_finished(step, end);
        }
        if let Some(t) = self.timing {
            t.step_finished(step, started, end);
        }
    }
}
