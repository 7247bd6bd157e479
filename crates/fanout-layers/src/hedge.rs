//! Hedged calls (R4), a [`Backend`] layer ("The Tail at Scale", Finagle's backup requests): an
//! idempotent call that has not answered after the hedge delay gets one second copy; the first
//! good answer wins and the other call is dropped (which closes its connection or resets its
//! stream at the backend).
//!
//! - The delay is fixed (`delay`) or the backend's recent `percentile` latency, from a windowed
//!   HdrHistogram of good answers (two windows of [`WINDOW`]; no hedging with fewer than
//!   [`MIN_SAMPLES`] samples), never below `min_delay`.
//! - At most one hedge per call, none when the call's remaining time is not longer than the
//!   delay, and hedges ≤ `max_extra` × calls over a sliding 10 s window (the hedge budget).
//! - A good answer is any answer that is not 5xx; if the first call to finish failed, the other
//!   one is awaited and its result returned (an answer is preferred over a transport error).

use crate::backend::{Backend, CallError, CallRequest, CallResponse};
use crate::retry::RateBudget;
use fanout_config::HedgeConfig;
use futures_util::future::{BoxFuture, Either, select};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Length of one latency window; the percentile covers the current and the previous window.
pub const WINDOW: Duration = Duration::from_secs(3);
/// The percentile is recomputed at most this often.
pub const REFRESH: Duration = Duration::from_millis(250);
/// Fewer samples than this in the two windows: no percentile, no hedging.
pub const MIN_SAMPLES: u64 = 50;
/// No copy is sent with less time than this left before the call's end.
pub const MIN_HEDGE_TIME: Duration = Duration::from_millis(1);
/// Window of the hedge budget.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(10);

/// Hedging settings at run time.
#[derive(Debug, Clone, Copy)]
pub struct HedgePolicy {
    /// Fixed delay; `None`: the `percentile` of recent latency.
    pub delay: Option<Duration>,
    /// Latency percentile used as the delay (0–100).
    pub percentile: f64,
    /// Shortest delay.
    pub min_delay: Duration,
    /// Hedges as a share of calls.
    pub max_extra: f64,
}

impl From<&HedgeConfig> for HedgePolicy {
    fn from(c: &HedgeConfig) -> Self {
        let percentile = if c.percentile.is_finite() {
            c.percentile.clamp(0.0, 100.0)
        } else {
            95.0
        };
        HedgePolicy {
            delay: c.delay.map(|d| d.0),
            percentile,
            min_delay: c.min_delay.0,
            max_extra: if c.max_extra.is_finite() {
                c.max_extra.max(0.0)
            } else {
                0.0
            },
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    // Microseconds, 2 significant digits, resizing beyond 60 s. Neither constructor fails for
    // these constants; the fallback chain only avoids a panic path.
    let mut h = Histogram::new_with_bounds(1, 60_000_000, 2)
        .or_else(|_| Histogram::new(2))
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable_histogram()));
    h.auto(true);
    h
}

#[cold]
fn unreachable_histogram() -> Histogram<u64> {
    match Histogram::new(1) {
        Ok(h) => h,
        Err(_) => panic!("hdrhistogram rejected 1 significant digit"),
    }
}

/// Recent latencies of good answers in two rotating windows, with the percentile cached.
/// Time is passed in (testable with a synthetic clock).
pub struct LatencyWindow {
    current: Histogram<u64>,
    previous: Histogram<u64>,
    started: Instant,
    cached: Option<(Instant, f64, Option<Duration>)>,
}

impl LatencyWindow {
    /// An empty window starting at `now`.
    pub fn new(now: Instant) -> LatencyWindow {
        LatencyWindow {
            current: new_histogram(),
            previous: new_histogram(),
            started: now,
            cached: None,
        }
    }

    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.started);
        if age < WINDOW {
            return;
        }
        if age >= WINDOW * 2 {
            self.previous.reset(); // both windows are stale
        } else {
            std::mem::swap(&mut self.previous, &mut self.current);
        }
        self.current.reset();
        self.started = now;
        self.cached = None;
    }

    /// Record one latency.
    pub fn record(&mut self, now: Instant, latency: Duration) {
        self.rotate(now);
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        // `auto(true)`: recording only fails for values beyond u64 range.
        let _ = self.current.record(us);
    }

    /// The `percentile` (0–100) of the two windows, `None` with fewer than [`MIN_SAMPLES`]
    /// samples. Recomputed at most every [`REFRESH`].
    pub fn percentile(&mut self, now: Instant, percentile: f64) -> Option<Duration> {
        self.rotate(now);
        if let Some((at, p, v)) = self.cached
            && p == percentile
            && now.saturating_duration_since(at) < REFRESH
        {
            return v;
        }
        let v = if self.previous.len() + self.current.len() < MIN_SAMPLES {
            None
        } else {
            let mut merged = self.previous.clone();
            let q = (percentile / 100.0).clamp(0.0, 1.0);
            match merged.add(&self.current) {
                Ok(()) => Some(Duration::from_micros(merged.value_at_quantile(q))),
                Err(_) => Some(Duration::from_micros(self.current.value_at_quantile(q))),
            }
        };
        self.cached = Some((now, percentile, v));
        v
    }
}

/// The delay to hedge after, if any: fixed, else the percentile; never below `min_delay`.
pub fn hedge_delay(
    policy: &HedgePolicy,
    window: &mut LatencyWindow,
    now: Instant,
) -> Option<Duration> {
    let d = match policy.delay {
        Some(d) => d,
        None => window.percentile(now, policy.percentile)?,
    };
    Some(d.max(policy.min_delay))
}

/// Counters of a [`Hedge`] layer.
#[derive(Debug, Default)]
pub struct HedgeStats {
    calls: AtomicU64,
    hedges: AtomicU64,
    hedge_wins: AtomicU64,
    budget_exhausted: AtomicU64,
    delay_us: AtomicU64,
}

/// A snapshot of [`HedgeStats`].
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct HedgeCounters {
    /// Calls through the layer (each deposits into the hedge budget).
    pub calls: u64,
    /// Second copies sent.
    pub hedges: u64,
    /// Calls answered by the second copy.
    pub hedge_wins: u64,
    /// Hedges that were due but refused by the budget.
    pub budget_exhausted: u64,
    /// The last hedge delay used, in ms (`None` before any, or without enough samples).
    pub delay_ms: Option<f64>,
}

impl HedgeStats {
    /// Read the counters.
    pub fn counters(&self) -> HedgeCounters {
        let us = self.delay_us.load(Relaxed);
        HedgeCounters {
            calls: self.calls.load(Relaxed),
            hedges: self.hedges.load(Relaxed),
            hedge_wins: self.hedge_wins.load(Relaxed),
            budget_exhausted: self.budget_exhausted.load(Relaxed),
            delay_ms: (us > 0).then(|| us as f64 / 1000.0),
        }
    }
}

struct State {
    window: LatencyWindow,
    budget: RateBudget,
}

struct Shared {
    policy: HedgePolicy,
    state: Mutex<State>,
    stats: Arc<HedgeStats>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record the latency of the original call (from its start) when its answer is good.
    fn record(&self, start: Instant, r: &Result<CallResponse, CallError>) {
        if good(r) {
            let now = Instant::now();
            self.lock().window.record(now, now.duration_since(start));
        }
    }
}

/// A backend whose slow idempotent calls are hedged.
pub struct Hedge {
    inner: Arc<dyn Backend>,
    shared: Arc<Shared>,
}

impl Hedge {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Backend>, policy: HedgePolicy) -> Hedge {
        let now = Instant::now();
        Hedge {
            inner,
            shared: Arc::new(Shared {
                policy,
                state: Mutex::new(State {
                    window: LatencyWindow::new(now),
                    budget: RateBudget::new(policy.max_extra, 0.0, BUDGET_WINDOW, now),
                }),
                stats: Arc::new(HedgeStats::default()),
            }),
        }
    }

    /// The layer's counters (for `/__fanout/status`).
    pub fn stats(&self) -> Arc<HedgeStats> {
        self.shared.stats.clone()
    }
}

/// An answer that ends the race: anything but a transport error or a 5xx.
fn good(r: &Result<CallResponse, CallError>) -> bool {
    !crate::outcome::CallOutcome::of(r).is_failure()
}

/// Of two failed results, the one to return: an answer (5xx) over a transport error, else the
/// later one.
fn better(
    a: Result<CallResponse, CallError>,
    b: Result<CallResponse, CallError>,
) -> Result<CallResponse, CallError> {
    if b.is_err() && a.is_ok() { a } else { b }
}

impl Backend for Hedge {
    /// A stream is never sent twice: passed down.
    fn open(
        &self,
        req: crate::stream::StreamRequest,
    ) -> BoxFuture<'static, Result<crate::stream::StreamResponse, CallError>> {
        self.inner.open(req)
    }

    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let s = self.shared.clone();
        s.stats.calls.fetch_add(1, Relaxed);
        let start = Instant::now();
        let delay = {
            let mut st = s.lock();
            st.budget.deposit(start);
            if req.idempotent {
                hedge_delay(&s.policy, &mut st.window, start)
            } else {
                None
            }
        };
        let end = req.deadline.min(start + req.timeout);
        let delay = delay.filter(|d| start + *d < end);
        let Some(delay) = delay else {
            if !req.idempotent {
                return self.inner.call(req);
            }
            // Not hedged, but its latency feeds the percentile.
            let fut = self.inner.call(req);
            return Box::pin(async move {
                let r = fut.await;
                s.record(start, &r);
                r
            });
        };
        s.stats
            .delay_us
            .store(delay.as_micros().max(1) as u64, Relaxed);
        let inner = self.inner.clone();
        let first = inner.call(req.clone());
        Box::pin(async move {
            let timer = Box::pin(tokio::time::sleep(delay));
            let first = match select(first, timer).await {
                Either::Left((r, _)) => {
                    s.record(start, &r);
                    return r;
                }
                Either::Right(((), first)) => first,
            };
            let now = Instant::now();
            let granted = now + MIN_HEDGE_TIME < end && {
                let ok = s.lock().budget.try_withdraw(now);
                if !ok {
                    s.stats.budget_exhausted.fetch_add(1, Relaxed);
                }
                ok
            };
            if !granted {
                let r = first.await;
                s.record(start, &r);
                return r;
            }
            s.stats.hedges.fetch_add(1, Relaxed);
            let mut copy = req;
            copy.timeout = copy.timeout.min(end.saturating_duration_since(now));
            if let Some(t) = &mut copy.trace {
                t.hedge = true;
            }
            let second = inner.call(copy);
            race(&s, start, first, second).await
        })
    }
}

type CallFuture = BoxFuture<'static, Result<CallResponse, CallError>>;

/// The original and its copy race: the first good answer wins and the other is dropped
/// (cancelled); with two failures, the better one is returned.
async fn race(
    s: &Shared,
    start: Instant,
    first: CallFuture,
    second: CallFuture,
) -> Result<CallResponse, CallError> {
    match select(first, second).await {
        Either::Left((r1, second)) => {
            if good(&r1) {
                s.record(start, &r1);
                return r1; // the copy is dropped: cancelled
            }
            let r2 = second.await;
            if good(&r2) {
                s.stats.hedge_wins.fetch_add(1, Relaxed);
            }
            better(r1, r2)
        }
        Either::Right((r2, first)) => {
            if good(&r2) {
                s.stats.hedge_wins.fetch_add(1, Relaxed);
                // The original took at least this long: a lower bound keeps the tail in the
                // histogram although the original is cancelled.
                s.record(start, &r2);
                return r2;
            }
            let r1 = first.await;
            s.record(start, &r1);
            better(r2, r1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{Method, StatusCode};
    use std::sync::atomic::AtomicUsize;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_percentile_needs_enough_samples_and_follows_the_windows() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(t0);
        for _ in 0..49 {
            w.record(t0, ms(1));
        }
        assert_eq!(w.percentile(t0, 95.0), None, "49 samples: no percentile");
        w.record(t0, ms(100));
        let t = t0 + REFRESH;
        // 49 × 1 ms, 1 × 100 ms: p95 is 1 ms, p99 100 ms (2 significant digits).
        let p95 = w.percentile(t, 95.0).unwrap();
        assert!(
            p95 >= ms(1) && p95 < Duration::from_micros(1_020),
            "{p95:?}"
        );
        let t = t + REFRESH;
        let p99 = w.percentile(t, 99.0).unwrap();
        assert!(p99 >= ms(99) && p99 <= ms(101), "{p99:?}");
        // Cached within REFRESH: a new sample does not change it yet.
        w.record(t, ms(100));
        assert_eq!(w.percentile(t + ms(1), 99.0), Some(p99));
        // One rotation: the samples are in the previous window, still counted.
        let t = t0 + WINDOW + ms(1);
        assert!(w.percentile(t, 95.0).is_some());
        // Two windows without samples: forgotten.
        let t = t + WINDOW;
        assert_eq!(w.percentile(t, 95.0), None);
    }

    #[test]
    fn the_delay_is_fixed_or_the_percentile_never_below_min_delay() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(t0);
        for i in 0..100 {
            w.record(t0, if i < 96 { ms(2) } else { ms(40) });
        }
        let mut p = HedgePolicy::from(&HedgeConfig::default());
        let d = hedge_delay(&p, &mut w, t0).unwrap();
        assert!(
            d >= ms(2) && d <= Duration::from_micros(2_020),
            "p95: {d:?}"
        );
        p.percentile = 99.0;
        let d = hedge_delay(&p, &mut w, t0 + REFRESH).unwrap();
        assert!(d >= ms(39) && d <= ms(41), "p99: {d:?}");
        p.min_delay = ms(50);
        assert_eq!(hedge_delay(&p, &mut w, t0 + REFRESH), Some(ms(50)));
        p.delay = Some(ms(70));
        assert_eq!(hedge_delay(&p, &mut w, t0), Some(ms(70)));
        let mut empty = LatencyWindow::new(t0);
        p.delay = None;
        assert_eq!(hedge_delay(&p, &mut empty, t0), None, "too few samples");
    }

    /// The first call (and every odd one) takes `slow`, the others `fast`.
    struct Alternating {
        calls: Arc<AtomicUsize>,
        finished: Arc<AtomicUsize>,
        slow: Duration,
        fast: Duration,
    }

    impl Backend for Alternating {
        fn call(&self, _req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
            let n = self.calls.fetch_add(1, Relaxed);
            let d = if n.is_multiple_of(2) {
                self.slow
            } else {
                self.fast
            };
            let finished = self.finished.clone();
            Box::pin(async move {
                tokio::time::sleep(d).await;
                finished.fetch_add(1, Relaxed);
                Ok(CallResponse {
                    status: StatusCode::OK,
                    body: Bytes::from(format!("{n}")),
                    value: None,
                    parsed: None,
                })
            })
        }
    }

    fn req(idempotent: bool) -> CallRequest {
        CallRequest {
            call: crate::backend::Call::Http(crate::backend::HttpCall {
                method: Method::GET,
                path_and_query: http::uri::PathAndQuery::from_static("/x"),
                headers: Default::default(),
                body: Bytes::new(),
            }),
            timeout: Duration::from_secs(1),
            deadline: Instant::now() + Duration::from_secs(1),
            idempotent,
            trace: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_is_hedged_the_copy_wins_and_the_loser_is_dropped() {
        let calls = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let inner = Arc::new(Alternating {
            calls: calls.clone(),
            finished: finished.clone(),
            slow: ms(500),
            fast: ms(5),
        });
        let policy = HedgePolicy {
            delay: Some(ms(20)),
            percentile: 95.0,
            min_delay: ms(1),
            max_extra: 1.0,
        };
        let h = Hedge::new(inner, policy);
        let r = h.call(req(true)).await.unwrap();
        assert_eq!(r.body, "1", "the copy answered");
        assert_eq!(calls.load(Relaxed), 2);
        tokio::time::sleep(ms(1000)).await;
        assert_eq!(finished.load(Relaxed), 1, "the slow original was cancelled");
        let c = h.stats().counters();
        assert_eq!((c.calls, c.hedges, c.hedge_wins), (1, 1, 1));

        // Not idempotent: never hedged.
        let r = h.call(req(false)).await.unwrap();
        assert_eq!(r.body, "2");
        assert_eq!(calls.load(Relaxed), 3);
        assert_eq!(h.stats().counters().hedges, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_bounds_hedges() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = Arc::new(Alternating {
            calls: calls.clone(),
            finished: Arc::new(AtomicUsize::new(0)),
            slow: ms(50),
            fast: ms(50),
        });
        let policy = HedgePolicy {
            delay: Some(ms(10)),
            percentile: 95.0,
            min_delay: ms(1),
            max_extra: 0.1,
        };
        let h = Hedge::new(inner, policy);
        for _ in 0..30 {
            h.call(req(true)).await.unwrap();
        }
        let c = h.stats().counters();
        assert_eq!(c.hedges, 3, "0.1 × 30 calls");
        assert_eq!(c.budget_exhausted, 27);
        assert_eq!(calls.load(Relaxed), 33);
    }
}
