//! Per-backend isolation (R3), as [`Backend`] layers: a bulkhead (a cap on calls in flight that
//! fails fast when full) and a circuit breaker (consecutive-failure and failure-rate modes,
//! half-open probe). Both fail with [`CallErrorKind::Rejected`] (saying which of them refused), which the step's failure policy
//! turns into the step's default (optional) or a 503 (required) — without waiting.

use crate::backend::{Backend, CallError, CallErrorKind, CallRequest, CallResponse, RejectReason};
use crate::stream::{StreamRequest, StreamResponse};
use futures_util::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// A backend with at most `max` calls in flight.
pub struct Bulkhead {
    inner: Arc<dyn Backend>,
    slots: Arc<Semaphore>,
    max: usize,
}

impl Bulkhead {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Backend>, max: usize) -> Bulkhead {
        let max = max.max(1);
        Bulkhead {
            inner,
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

impl Backend for Bulkhead {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let e = self.full();
            return Box::pin(async move { Err(e) });
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(permit);
            r
        })
    }

    /// The same slots, each held until the answer's body ends.
    fn open(&self, req: StreamRequest) -> BoxFuture<'static, Result<StreamResponse, CallError>> {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let e = self.full();
            return Box::pin(async move { Err(e) });
        };
        let fut = self.inner.open(req);
        Box::pin(async move { fut.await.map(|r| r.hold(permit)) })
    }
}

impl Bulkhead {
    fn full(&self) -> CallError {
        let msg = format!(
            "bulkhead full: {} calls already in flight (max_concurrency)",
            self.max
        );
        CallError::new(CallErrorKind::Rejected(RejectReason::Bulkhead), msg)
    }
}

/// Breaker settings.
#[derive(Debug, Clone, Copy)]
pub struct BreakerPolicy {
    /// Open after this many failures in a row.
    pub consecutive_failures: u32,
    /// Or open at this failure share over the window…
    pub failure_rate: f64,
    /// …with at least this many calls in it.
    pub min_calls: u32,
    /// Failure-rate window.
    pub window: Duration,
    /// Open time before a probe.
    pub open_for: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Closed,
    Open {
        until: Instant,
    },
    /// One probe is in flight; others are rejected.
    HalfOpen,
}

/// The breaker's state machine, with time passed in (testable with a synthetic clock).
#[derive(Debug)]
pub struct BreakerState {
    policy: BreakerPolicy,
    mode: Mode,
    consecutive: u32,
    recent: VecDeque<(Instant, bool)>,
}

/// Whether a call may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Closed: go.
    Call,
    /// Half-open: this call is the probe.
    Probe,
    /// Open: fail fast.
    Reject,
}

impl BreakerState {
    /// A closed breaker.
    pub fn new(policy: BreakerPolicy) -> BreakerState {
        BreakerState {
            policy,
            mode: Mode::Closed,
            consecutive: 0,
            recent: VecDeque::new(),
        }
    }

    /// May a call start at `now`?
    pub fn allow(&mut self, now: Instant) -> Permit {
        match self.mode {
            Mode::Closed => Permit::Call,
            Mode::Open { until } if now >= until => {
                self.mode = Mode::HalfOpen;
                Permit::Probe
            }
            Mode::Open { .. } | Mode::HalfOpen => Permit::Reject,
        }
    }

    /// Record a finished call (`probe` if it was the half-open probe).
    pub fn record(&mut self, now: Instant, ok: bool, probe: bool) {
        if probe {
            if ok {
                self.mode = Mode::Closed;
                self.consecutive = 0;
                self.recent.clear();
            } else {
                self.open(now);
            }
            return;
        }
        if self.mode != Mode::Closed {
            return; // a call that started before the breaker opened
        }
        self.consecutive = if ok { 0 } else { self.consecutive + 1 };
        self.recent.push_back((now, ok));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > self.policy.window)
        {
            self.recent.pop_front();
        }
        let calls = self.recent.len() as u32;
        let failures = self.recent.iter().filter(|(_, ok)| !ok).count() as f64;
        let rate_trips =
            calls >= self.policy.min_calls && failures / calls as f64 >= self.policy.failure_rate;
        if self.consecutive >= self.policy.consecutive_failures || rate_trips {
            self.open(now);
        }
    }

    fn open(&mut self, now: Instant) {
        self.mode = Mode::Open {
            until: now + self.policy.open_for,
        };
        self.consecutive = 0;
        self.recent.clear();
    }

    /// `closed`, `open` or `half-open`.
    pub fn state(&self) -> &'static str {
        match self.mode {
            Mode::Closed => "closed",
            Mode::Open { .. } => "open",
            Mode::HalfOpen => "half-open",
        }
    }
}

/// A backend behind a circuit breaker. Failures: transport errors, timeouts (the layer applies the
/// call's timeout itself so it sees them) and 5xx answers.
pub struct Breaker {
    inner: Arc<dyn Backend>,
    state: Arc<Mutex<BreakerState>>,
    /// The backend's name, for the message of a rejected call.
    name: Arc<str>,
}

impl Breaker {
    /// Wrap `inner`, the stack of backend `name`.
    pub fn new(inner: Arc<dyn Backend>, policy: BreakerPolicy, name: &str) -> Breaker {
        Breaker {
            inner,
            state: Arc::new(Mutex::new(BreakerState::new(policy))),
            name: name.into(),
        }
    }

    /// The current state, for status pages.
    pub fn state(&self) -> &'static str {
        self.view().state()
    }

    /// A handle that reads this breaker's state (kept by the gateway for status and metrics
    /// after the breaker itself disappears into the backend's stack).
    pub fn view(&self) -> BreakerView {
        BreakerView(self.state.clone())
    }
}

/// Reads a [`Breaker`]'s state.
#[derive(Clone)]
pub struct BreakerView(Arc<Mutex<BreakerState>>);

impl BreakerView {
    /// `closed`, `open` or `half-open` (`unknown` if the state's lock was poisoned).
    pub fn state(&self) -> &'static str {
        self.0.lock().map(|s| s.state()).unwrap_or("unknown")
    }

    /// The state as a number (the `fanout_breaker_state` gauge): 0 closed, 1 half-open, 2 open.
    pub fn level(&self) -> u8 {
        match self.state() {
            "closed" => 0,
            "half-open" => 1,
            _ => 2,
        }
    }
}

impl Backend for Breaker {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let permit = match self.state.lock() {
            Ok(mut s) => s.allow(Instant::now()),
            Err(_) => Permit::Call,
        };
        if permit == Permit::Reject {
            let e = self.open_error();
            return Box::pin(async move { Err(e) });
        }
        let timeout = req.timeout;
        let fut = self.inner.call(req);
        let state = self.state.clone();
        Box::pin(async move {
            let r = match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(CallError::new(
                    CallErrorKind::Timeout,
                    format!("no answer within {timeout:?}"),
                )),
            };
            let ok = !crate::outcome::CallOutcome::of(&r).is_backend_failure();
            if let Ok(mut s) = state.lock() {
                s.record(Instant::now(), ok, permit == Permit::Probe);
            }
            r
        })
    }

    /// The same state: refused while open, judged by the answer's head (what happens to its
    /// body afterwards is not counted).
    fn open(&self, req: StreamRequest) -> BoxFuture<'static, Result<StreamResponse, CallError>> {
        let permit = match self.state.lock() {
            Ok(mut s) => s.allow(Instant::now()),
            Err(_) => Permit::Call,
        };
        if permit == Permit::Reject {
            let e = self.open_error();
            return Box::pin(async move { Err(e) });
        }
        let timeout = req.timeout;
        let fut = self.inner.open(req);
        let state = self.state.clone();
        Box::pin(async move {
            let r = match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(CallError::new(
                    CallErrorKind::Timeout,
                    format!("no answer within {timeout:?}"),
                )),
            };
            let ok = !crate::outcome::CallOutcome::of_stream(&r).is_backend_failure();
            if let Ok(mut s) = state.lock() {
                s.record(Instant::now(), ok, permit == Permit::Probe);
            }
            r
        })
    }
}

impl Breaker {
    fn open_error(&self) -> CallError {
        let msg = format!("circuit breaker of `{}` is open: failing fast", self.name);
        CallError::new(CallErrorKind::Rejected(RejectReason::Breaker), msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            consecutive_failures: 3,
            failure_rate: 0.5,
            min_calls: 10,
            window: Duration::from_secs(10),
            open_for: Duration::from_secs(5),
        }
    }

    #[test]
    fn consecutive_failures_open_then_probe_closes() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(policy());
        for i in 0..2 {
            assert_eq!(b.allow(t0), Permit::Call);
            b.record(t0 + Duration::from_millis(i), false, false);
        }
        assert_eq!(b.state(), "closed", "2 failures < 3");
        b.record(t0, true, false); // a success resets the run
        for _ in 0..3 {
            b.record(t0, false, false);
        }
        assert_eq!(b.state(), "open");
        assert_eq!(
            b.allow(t0 + Duration::from_secs(1)),
            Permit::Reject,
            "open: fail fast"
        );
        let later = t0 + Duration::from_secs(5);
        assert_eq!(b.allow(later), Permit::Probe, "after open_for: one probe");
        assert_eq!(b.allow(later), Permit::Reject, "only one probe at a time");
        b.record(later, true, true);
        assert_eq!(b.state(), "closed");
        assert_eq!(b.allow(later), Permit::Call);
    }

    #[test]
    fn a_failed_probe_reopens() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(policy());
        for _ in 0..3 {
            b.record(t0, false, false);
        }
        let probe_at = t0 + Duration::from_secs(6);
        assert_eq!(b.allow(probe_at), Permit::Probe);
        b.record(probe_at, false, true);
        assert_eq!(b.state(), "open");
        assert_eq!(
            b.allow(probe_at + Duration::from_secs(4)),
            Permit::Reject,
            "open again for open_for"
        );
        assert_eq!(b.allow(probe_at + Duration::from_secs(5)), Permit::Probe);
    }

    #[test]
    fn failure_rate_opens_only_with_enough_calls_in_the_window() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(policy());
        // Alternate: never 3 in a row, but 50 % failures.
        for i in 0..9 {
            b.record(t0 + Duration::from_millis(i), i % 2 == 0, false);
        }
        assert_eq!(b.state(), "closed", "9 calls < min_calls 10");
        b.record(t0 + Duration::from_millis(9), false, false);
        assert_eq!(b.state(), "open", "5 of 10 failed");
        // Old calls leave the window.
        let mut b = BreakerState::new(policy());
        for i in 0..9 {
            b.record(t0 + Duration::from_millis(i), i % 2 == 0, false);
        }
        b.record(t0 + Duration::from_secs(11), false, false);
        assert_eq!(
            b.state(),
            "closed",
            "the first 9 calls are outside the 10 s window"
        );
    }
}
