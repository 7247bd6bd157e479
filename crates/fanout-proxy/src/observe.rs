//! The gateway's observer of a request's flow: one [`Observer`] that forwards each event to the
//! parts that are on (metrics here; traces and `Server-Timing` plug in as further optional
//! fields), so the executor is given one observer whatever is enabled.

use crate::metrics::RouteMetrics;
use fanout_flow::FlowError;
use fanout_flow::observe::{Observer, StepEnd};
use fanout_flow::plan::StepPlan;
use std::time::Duration;
use tokio::time::Instant;

/// Forwards a request's flow events to the enabled parts.
#[derive(Default)]
pub struct RequestObserver<'a> {
    /// The route's metric handles (`None`: metrics off, or the route has none).
    pub metrics: Option<&'a RouteMetrics>,
}

impl Observer for RequestObserver<'_> {
    fn step_started(&self, step: &StepPlan) {
        let _ = step;
    }

    #[inline]
    fn call_finished(&self, step: &StepPlan, elapsed: Duration, result: Result<(), &FlowError>) {
        if let Some(m) = self.metrics {
            m.call_finished(step, elapsed, result);
        }
    }

    fn step_finished(&self, step: &StepPlan, started: Instant, end: StepEnd<'_>) {
        let _ = (step, started, end);
    }
}
