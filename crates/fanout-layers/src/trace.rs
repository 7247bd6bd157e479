//! The trace context of one backend call, carried in [`CallRequest::trace`] through the layers
//! of its backend's stack, so the protocol client at the bottom can record each attempt as a
//! span under the step that made the call, and send its context (`traceparent`) to the backend.
//!
//! The layers add what only they know: the retry layer numbers attempts, the hedge layer marks
//! its second copy, the cache and dedup layers say how the call was served. A call answered
//! without an attempt of its own (a cache hit, a caller that joined a shared call) is recorded by
//! [`CallTracer::served`]. A shared call (dedup, cache coalescing) is made with the request of its
//! *first* caller, so its attempts belong to that caller's trace; the callers that joined it get a
//! span of their own saying so.
//!
//! The same context also counts the attempts of the step that made the call, for the gateway's
//! record of slow and failed requests (`/ui`'s waterfall: attempts, retries, hedged copies):
//! [`CallTrace::counter`] ([`AttemptCounts`]), told by [`CallTrace::sent`] at each attempt,
//! with or without a tracer. A call that is only counted (tracing off, or the request not
//! traced) has no tracer: no span, no address or attributes built, no `traceparent` sent, and
//! the layers take their untraced paths; it costs an `Arc` clone per call and a count per
//! attempt. The context is four words, inline in the call (not boxed).
//!
//! This module knows no tracing library: the gateway implements [`CallTracer`]. Calls without a
//! trace (`trace: None`: tracing and the live page off, or a call made for no request) cost
//! nothing here.
//!
//! [`CallRequest::trace`]: crate::backend::CallRequest::trace

use crate::error::CallError;
use http::{HeaderMap, StatusCode};
use smallvec::SmallVec;
use std::fmt;
use std::sync::{Arc, Mutex};

/// How the cache layer served a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheRole {
    /// Not in the cache (or expired): fetched.
    Miss,
    /// A fresh cached answer.
    Hit,
    /// A stale answer (stale-while-revalidate or stale-on-error).
    Stale,
    /// The background refresh of a stale entry.
    Refresh,
}

impl CacheRole {
    /// The attribute value: `miss`, `hit`, `stale`, `refresh`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheRole::Miss => "miss",
            CacheRole::Hit => "hit",
            CacheRole::Stale => "stale",
            CacheRole::Refresh => "refresh",
        }
    }
}

/// How the dedup layer (or cache coalescing) served a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupRole {
    /// Started the shared call (its attempts are this caller's).
    Leader,
    /// Joined a shared call another caller started.
    Joined,
}

impl DedupRole {
    /// The attribute value: `leader`, `joined`.
    pub fn as_str(self) -> &'static str {
        match self {
            DedupRole::Leader => "leader",
            DedupRole::Joined => "joined",
        }
    }
}

/// One call's trace context and what the layers said about it.
#[derive(Clone)]
pub struct CallTrace {
    /// The step's tracer (its span is the parent of the call's spans); `None`: the request is
    /// not traced, the call is only counted.
    pub tracer: Option<Arc<dyn CallTracer>>,
    /// Counts the attempts of the request's steps (`None`: not counted).
    pub counter: Option<Arc<AttemptCounts>>,
    /// The index of the step that made the call (in its route), for the counter.
    pub step: u16,
    /// Attempt number, 1 for the first (set by the retry layer; `retry.attempts` is at most 5).
    pub attempt: u16,
    /// This is the hedge layer's second copy.
    pub hedge: bool,
    /// How the cache layer served the call, when the backend has a cache.
    pub cache: Option<CacheRole>,
    /// How the call was shared, when it went through dedup or cache coalescing.
    pub dedup: Option<DedupRole>,
    /// A batch call (keyed lookups of one request, merged).
    pub batch: bool,
}

impl CallTrace {
    /// A first attempt of step `step`, not yet seen by any layer, neither traced nor counted.
    pub fn new(step: u16) -> CallTrace {
        CallTrace {
            tracer: None,
            counter: None,
            step,
            attempt: 1,
            hedge: false,
            cache: None,
            dedup: None,
            batch: false,
        }
    }

    /// An attempt of this call is sent now: counted, and its span when the call is traced
    /// (`address`, the backend's base URL, is asked only then).
    pub fn sent<A: AsRef<str>>(&self, address: impl FnOnce() -> A) -> Option<Box<dyn AttemptSpan>> {
        if let Some(c) = &self.counter {
            c.count(self);
        }
        let tracer = self.tracer.as_ref()?;
        Some(tracer.attempt(self, address().as_ref()))
    }

    /// Whether the call has a tracer (spans are recorded, a trace context is sent).
    pub fn is_traced(&self) -> bool {
        self.tracer.is_some()
    }
}

impl fmt::Debug for CallTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallTrace")
            .field("traced", &self.tracer.is_some())
            .field("counted", &self.counter.is_some())
            .field("step", &self.step)
            .field("attempt", &self.attempt)
            .field("hedge", &self.hedge)
            .field("cache", &self.cache)
            .field("dedup", &self.dedup)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

/// Records a step's calls (implemented by the gateway's tracing).
pub trait CallTracer: Send + Sync {
    /// An attempt of `call` is sent now to `address` (the backend's base URL): its span, which
    /// also writes the trace context into the attempt's headers. Dropped without
    /// [`AttemptSpan::end`]: the attempt was cancelled.
    fn attempt(&self, call: &CallTrace, address: &str) -> Box<dyn AttemptSpan>;

    /// `call` is served without an attempt of its own (a cache hit, a joined shared call).
    fn served(&self, call: &CallTrace) -> Box<dyn AttemptSpan>;

    /// Work done once for the calls of many requests (a model's batch): a span of its own,
    /// named `name`, linked to the step of each of `calls`. `None`: nothing is recorded.
    fn shared(
        &self,
        name: &str,
        attributes: Vec<(&'static str, String)>,
        calls: &[&CallTrace],
    ) -> Option<Box<dyn AttemptSpan>> {
        let _ = (name, attributes, calls);
        None
    }

    /// Work of the step's own, a child of its span named `name` (a GraphQL field's resolver
    /// run, `attributes` saying which): the tracer the work's calls record under, and the span,
    /// to end when the work is done (its status is not read). `None`: nothing is recorded.
    fn child(
        &self,
        name: &str,
        attributes: Vec<(&'static str, String)>,
    ) -> Option<(Arc<dyn CallTracer>, Box<dyn AttemptSpan>)> {
        let _ = (name, attributes);
        None
    }

    /// The tracer itself (an implementation reads the other tracers of [`CallTracer::shared`]
    /// through it).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// The attempts sent by one request's calls, per step (the gateway's record of slow and failed
/// requests reads them): a few counts behind an uncontended lock, shared by the request's calls
/// (an `Arc` in each [`CallTrace::counter`]).
#[derive(Debug, Default)]
pub struct AttemptCounts {
    steps: Mutex<SmallVec<[StepAttempts; 6]>>,
}

/// The attempts the calls of one step sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepAttempts {
    /// Attempts sent: first attempts, retries and hedged copies.
    pub attempts: u16,
    /// Attempts after the first (the retry layer's).
    pub retries: u16,
    /// Hedged copies (the hedge layer's second attempt).
    pub hedges: u16,
}

impl AttemptCounts {
    /// An attempt of `call` is sent now, for step [`CallTrace::step`]: a retry when
    /// [`CallTrace::attempt`] is over 1, a hedged copy when [`CallTrace::hedge`].
    pub fn count(&self, call: &CallTrace) {
        let index = usize::from(call.step);
        let mut steps = self.steps.lock().unwrap_or_else(|p| p.into_inner());
        if steps.len() <= index {
            steps.resize(index + 1, StepAttempts::default());
        }
        if let Some(s) = steps.get_mut(index) {
            s.attempts = s.attempts.saturating_add(1);
            if call.attempt > 1 {
                s.retries = s.retries.saturating_add(1);
            }
            if call.hedge {
                s.hedges = s.hedges.saturating_add(1);
            }
        }
    }

    /// The attempts counted for step `index`.
    pub fn step(&self, index: usize) -> StepAttempts {
        let steps = self.steps.lock().unwrap_or_else(|p| p.into_inner());
        steps.get(index).copied().unwrap_or_default()
    }
}

/// The span of one attempt (or of a call served without one).
pub trait AttemptSpan: Send {
    /// Write the trace context (`traceparent`, `tracestate`) to send with the attempt.
    fn inject(&self, headers: &mut HeaderMap);

    /// Attributes the backend's protocol adds to the attempt's span (a database's
    /// `db.system.name` and the statement as written in the config, never its parameter
    /// values). Default: ignored.
    fn set_attributes(&mut self, attributes: &[(&'static str, &str)]) {
        let _ = attributes;
    }

    /// The attempt ended: with an answer's status, or an error.
    fn end(self: Box<Self>, result: Result<StatusCode, &CallError>);
}

/// A span for a call served without an attempt, ended when `fut` completes (or cancelled if it
/// is dropped before): the span waits as long as the caller does.
pub fn served<F, T>(
    trace: Option<&CallTrace>,
    fut: F,
) -> impl std::future::Future<Output = Result<T, CallError>> + Send + 'static
where
    F: std::future::Future<Output = Result<T, CallError>> + Send + 'static,
    T: AnswerStatus + Send + 'static,
{
    let span = trace.and_then(|t| Some(t.tracer.as_ref()?.served(t)));
    async move {
        let r = fut.await;
        if let Some(span) = span {
            span.end(r.as_ref().map(AnswerStatus::status));
        }
        r
    }
}

/// What a span records of an answer.
pub trait AnswerStatus {
    /// The answer's status.
    fn status(&self) -> StatusCode;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call of a request recorded by the live page carries a trace context inline in its
    /// `CallRequest` (moved through every layer): it stays four words.
    #[test]
    fn a_call_trace_is_four_words() {
        assert!(std::mem::size_of::<Option<CallTrace>>() <= 32);
    }

    #[test]
    fn attempts_are_counted_per_step_with_retries_and_hedges() {
        let counts = Arc::new(AttemptCounts::default());
        let mut call = CallTrace::new(2);
        call.counter = Some(counts.clone());
        assert!(call.sent(|| "unused").is_none(), "no tracer, no span");
        call.attempt = 2;
        assert!(call.sent(|| "unused").is_none());
        call.hedge = true;
        assert!(call.sent(|| "unused").is_none());
        let want = StepAttempts {
            attempts: 3,
            retries: 2,
            hedges: 1,
        };
        assert_eq!(counts.step(2), want);
        assert_eq!(counts.step(0), StepAttempts::default());
        assert_eq!(counts.step(9), StepAttempts::default());
    }
}
