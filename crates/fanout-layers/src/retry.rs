//! Retries (R4), a [`Backend`] layer: idempotent calls that failed on the way (connect error,
//! reset, timeout of one attempt) or with a listed status (502/503/504 by default) are tried
//! again after a jittered exponential backoff, never past the call's time, and only while the
//! backend's retry budget allows (Finagle's `RetryBudget`: over the last `ttl`, retries ≤
//! `ratio` × calls + `min_per_second` × `ttl`).
//!
//! The layer sits above the HTTP client, whose balancer picks the address of every attempt
//! afresh: a retry usually lands on another address (the failed one is penalised in P2C, skipped
//! by round robin, or ejected).

use crate::backend::{Backend, CallError, CallRequest, CallResponse};
use fanout_config::RetryConfig;
use futures_util::future::BoxFuture;
use rand::Rng;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// No attempt starts with less time than this left before the call's end.
pub const MIN_ATTEMPT_TIME: Duration = Duration::from_millis(2);

/// Retry settings at run time (from [`RetryConfig`], clamped to sane values).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Total attempts including the first (≥ 1).
    pub attempts: u32,
    /// Statuses that are retried.
    pub on_status: Vec<u16>,
    /// First backoff.
    pub backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
    /// Retries as a share of calls.
    pub ratio: f64,
    /// Retries allowed per second regardless of the ratio.
    pub min_per_second: f64,
    /// The budget's window.
    pub ttl: Duration,
}

/// A finite, non-negative number (NaN and negatives become 0).
fn non_negative(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}

impl From<&RetryConfig> for RetryPolicy {
    fn from(c: &RetryConfig) -> Self {
        RetryPolicy {
            attempts: c.attempts.max(1),
            on_status: c.on_status.clone(),
            backoff: c.backoff.0,
            max_backoff: c.max_backoff.0.max(c.backoff.0),
            ratio: non_negative(c.budget.ratio),
            min_per_second: non_negative(c.budget.min_per_second),
            ttl: c.budget.ttl.0,
        }
    }
}

impl RetryPolicy {
    /// The backoff before retry `n` (1 = the first retry), before jitter:
    /// `min(backoff × 2^(n−1), max_backoff)`.
    pub fn base_backoff(&self, n: u32) -> Duration {
        let factor = 1u32 << n.saturating_sub(1).min(30);
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }

    /// The backoff before retry `n` with `jitter` (expected in 0.8..1.2) applied.
    pub fn backoff_with(&self, n: u32, jitter: f64) -> Duration {
        let base = self.base_backoff(n);
        Duration::try_from_secs_f64(base.as_secs_f64() * jitter).unwrap_or(base)
    }
}

/// Number of time slots of a [`RateBudget`] window.
const SLOTS: usize = 10;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    epoch: u64,
    calls: u64,
    spent: u64,
}

/// A sliding-window budget of extra work (retries, hedges): over the last `ttl` (in 10 slots of
/// `ttl / 10`, so the window is 0.9–1.0 × `ttl` long), withdrawals may be at most
/// `ratio × deposits + min_per_second × ttl`. Time is passed in, so it is testable with a
/// synthetic clock.
#[derive(Debug, Clone)]
pub struct RateBudget {
    ratio: f64,
    reserve: f64,
    slot: Duration,
    origin: Instant,
    slots: [Slot; SLOTS],
}

impl RateBudget {
    /// A budget with no calls yet; `now` is the origin of its time slots.
    pub fn new(ratio: f64, min_per_second: f64, ttl: Duration, now: Instant) -> RateBudget {
        let ttl = ttl.max(Duration::from_millis(10));
        RateBudget {
            ratio: non_negative(ratio),
            reserve: non_negative(min_per_second) * ttl.as_secs_f64(),
            slot: ttl / SLOTS as u32,
            origin: now,
            slots: [Slot::default(); SLOTS],
        }
    }

    fn epoch(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        (since / self.slot.as_nanos().max(1)) as u64
    }

    fn slot_mut(&mut self, now: Instant) -> &mut Slot {
        let epoch = self.epoch(now);
        let s = &mut self.slots[(epoch % SLOTS as u64) as usize];
        if s.epoch != epoch {
            *s = Slot {
                epoch,
                calls: 0,
                spent: 0,
            };
        }
        s
    }

    /// (calls, withdrawals) in the window ending at `now`.
    fn totals(&self, now: Instant) -> (u64, u64) {
        let epoch = self.epoch(now);
        self.slots
            .iter()
            .filter(|s| s.epoch <= epoch && epoch - s.epoch < SLOTS as u64)
            .fold((0, 0), |(c, w), s| (c + s.calls, w + s.spent))
    }

    /// A call happened.
    pub fn deposit(&mut self, now: Instant) {
        self.slot_mut(now).calls += 1;
    }

    /// How many more withdrawals the window allows at `now`.
    pub fn available(&self, now: Instant) -> u64 {
        let (calls, spent) = self.totals(now);
        let allowed = (self.ratio * calls as f64 + self.reserve + 1e-9).floor();
        (allowed as u64).saturating_sub(spent)
    }

    /// Take one unit (a retry, a hedge) if the window allows it.
    pub fn try_withdraw(&mut self, now: Instant) -> bool {
        if self.available(now) == 0 {
            return false;
        }
        self.slot_mut(now).spent += 1;
        true
    }
}

/// Counters of a [`Retry`] layer.
#[derive(Debug, Default)]
pub struct RetryStats {
    calls: AtomicU64,
    retries: AtomicU64,
    budget_exhausted: AtomicU64,
}

/// A snapshot of [`RetryStats`].
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct RetryCounters {
    /// Calls through the layer (idempotent or not; each deposits into the budget).
    pub calls: u64,
    /// Retries sent (attempts after the first).
    pub retries: u64,
    /// Retries that were due but refused by the budget (the last failure was returned).
    pub budget_exhausted: u64,
}

impl RetryStats {
    /// Read the counters.
    pub fn counters(&self) -> RetryCounters {
        RetryCounters {
            calls: self.calls.load(Relaxed),
            retries: self.retries.load(Relaxed),
            budget_exhausted: self.budget_exhausted.load(Relaxed),
        }
    }
}

/// A backend whose idempotent calls are retried.
pub struct Retry {
    inner: Arc<dyn Backend>,
    shared: Arc<Shared>,
}

struct Shared {
    policy: RetryPolicy,
    budget: Mutex<RateBudget>,
    stats: Arc<RetryStats>,
}

/// Whether an attempt's outcome is worth another attempt.
fn retryable(policy: &RetryPolicy, r: &Result<CallResponse, CallError>) -> bool {
    match r {
        Ok(resp) => policy.on_status.contains(&resp.status.as_u16()),
        Err(_) => crate::outcome::CallOutcome::of(r).is_transient(),
    }
}

impl Retry {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Backend>, policy: RetryPolicy) -> Retry {
        let budget = RateBudget::new(
            policy.ratio,
            policy.min_per_second,
            policy.ttl,
            Instant::now(),
        );
        Retry {
            inner,
            shared: Arc::new(Shared {
                policy,
                budget: Mutex::new(budget),
                stats: Arc::new(RetryStats::default()),
            }),
        }
    }

    /// The layer's counters (for `/__fanout/status`).
    pub fn stats(&self) -> Arc<RetryStats> {
        self.shared.stats.clone()
    }
}

impl Backend for Retry {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let s = &self.shared;
        s.stats.calls.fetch_add(1, Relaxed);
        let start = Instant::now();
        s.budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deposit(start);
        if !req.idempotent || s.policy.attempts <= 1 {
            return self.inner.call(req);
        }
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let s = &*shared;
            // The caller waits at most `timeout` for the whole call (the executor enforces it):
            // all attempts and backoffs fit before `end`.
            let end = req.deadline.min(start + req.timeout);
            let mut attempt = 1;
            loop {
                let now = Instant::now();
                let mut r = req.clone();
                r.timeout = req.timeout.min(end.saturating_duration_since(now));
                if let Some(t) = &mut r.trace {
                    t.attempt = u16::try_from(attempt).unwrap_or(u16::MAX);
                }
                let result = inner.call(r).await;
                if attempt >= s.policy.attempts || !retryable(&s.policy, &result) {
                    return result;
                }
                let jitter = rand::rng().random_range(0.8..1.2);
                let pause = s.policy.backoff_with(attempt, jitter);
                let now = Instant::now();
                if now + pause + MIN_ATTEMPT_TIME > end {
                    return result; // no time for another attempt
                }
                let granted = s
                    .budget
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .try_withdraw(now);
                if !granted {
                    s.stats.budget_exhausted.fetch_add(1, Relaxed);
                    return result;
                }
                s.stats.retries.fetch_add(1, Relaxed);
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
        })
    }
    /// Only an idempotent call whose body no attempt touched yet is tried again (a connect
    /// failure, a refused stream, a listed status before the body was asked for); the rules of
    /// whole calls otherwise (budget, backoff within the time to the answer's head).
    fn open(
        &self,
        req: crate::stream::StreamRequest,
    ) -> BoxFuture<'static, Result<crate::stream::StreamResponse, CallError>> {
        let s = &self.shared;
        s.stats.calls.fetch_add(1, Relaxed);
        let start = Instant::now();
        s.budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deposit(start);
        if !req.idempotent || s.policy.attempts <= 1 {
            return self.inner.open(req);
        }
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let s = &*shared;
            let end = req.deadline.min(start + req.timeout);
            let mut attempt = 1;
            loop {
                let now = Instant::now();
                let mut r = req.clone();
                r.timeout = req.timeout.min(end.saturating_duration_since(now));
                if let Some(t) = &mut r.trace {
                    t.attempt = u16::try_from(attempt).unwrap_or(u16::MAX);
                }
                let result = inner.open(r).await;
                let again = match &result {
                    Ok(resp) => s.policy.on_status.contains(&resp.status.as_u16()),
                    Err(_) => crate::outcome::CallOutcome::of_stream(&result).is_transient(),
                };
                if attempt >= s.policy.attempts || !again || !req.body.untouched() {
                    return result;
                }
                let jitter = rand::rng().random_range(0.8..1.2);
                let pause = s.policy.backoff_with(attempt, jitter);
                let now = Instant::now();
                if now + pause + MIN_ATTEMPT_TIME > end {
                    return result;
                }
                let granted = s
                    .budget
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .try_withdraw(now);
                if !granted {
                    s.stats.budget_exhausted.fetch_add(1, Relaxed);
                    return result;
                }
                // The answer given up (its connection closed with it).
                drop(result);
                s.stats.retries.fetch_add(1, Relaxed);
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{Method, StatusCode};
    use std::sync::atomic::AtomicUsize;

    fn policy() -> RetryPolicy {
        RetryPolicy::from(&RetryConfig::default())
    }

    #[test]
    fn the_budget_allows_exactly_ratio_times_calls_plus_the_reserve() {
        let t0 = Instant::now();
        // ratio 0.2, 1/s over 10 s: 50 calls → 0.2 × 50 + 10 = 20 retries.
        let mut b = RateBudget::new(0.2, 1.0, Duration::from_secs(10), t0);
        for i in 0..50 {
            b.deposit(t0 + Duration::from_millis(i));
        }
        let t = t0 + Duration::from_millis(100);
        assert_eq!(b.available(t), 20);
        for i in 0..20 {
            assert!(b.try_withdraw(t), "retry {i} is within the budget");
        }
        assert!(!b.try_withdraw(t), "the 21st retry is refused");
        assert_eq!(b.available(t), 0);
        // One more call allows 0.2 more: still nothing; five more allow one.
        for _ in 0..4 {
            b.deposit(t);
        }
        assert!(!b.try_withdraw(t), "0.2 × 54 + 10 = 20.8 → 20");
        b.deposit(t);
        assert!(b.try_withdraw(t), "0.2 × 55 + 10 = 21");
        assert!(!b.try_withdraw(t));
        // After the window has passed, old calls and retries are forgotten: the reserve is back.
        let later = t0 + Duration::from_secs(11);
        assert_eq!(b.available(later), 10);
        for _ in 0..10 {
            assert!(b.try_withdraw(later));
        }
        assert!(!b.try_withdraw(later));
    }

    #[test]
    fn without_a_reserve_no_retry_before_enough_calls() {
        let t0 = Instant::now();
        let mut b = RateBudget::new(0.2, 0.0, Duration::from_secs(10), t0);
        for _ in 0..4 {
            b.deposit(t0);
        }
        assert!(!b.try_withdraw(t0), "0.2 × 4 = 0.8 → 0");
        b.deposit(t0);
        assert!(b.try_withdraw(t0), "0.2 × 5 = 1");
        assert!(!b.try_withdraw(t0));
        // The window slides slot by slot: at 9.5 s the calls of t0 still count, at 10 s not.
        assert!(!b.try_withdraw(t0 + Duration::from_millis(9_500)));
        b.deposit(t0 + Duration::from_millis(9_500));
        assert_eq!(b.available(t0 + Duration::from_millis(9_500)), 0);
        assert_eq!(b.available(t0 + Duration::from_secs(10)), 0);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let p = policy(); // 10 ms, max 200 ms
        assert_eq!(p.base_backoff(1), Duration::from_millis(10));
        assert_eq!(p.base_backoff(2), Duration::from_millis(20));
        assert_eq!(p.base_backoff(5), Duration::from_millis(160));
        assert_eq!(p.base_backoff(6), Duration::from_millis(200));
        assert_eq!(p.base_backoff(60), Duration::from_millis(200));
        assert_eq!(p.backoff_with(1, 0.8), Duration::from_millis(8));
        assert_eq!(p.backoff_with(2, 1.2), Duration::from_millis(24));
    }

    /// Answers `status` for the first `failures` calls, then 200.
    struct Flaky {
        calls: Arc<AtomicUsize>,
        failures: usize,
        status: StatusCode,
    }

    impl Backend for Flaky {
        fn call(&self, _req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
            let n = self.calls.fetch_add(1, Relaxed);
            let status = if n < self.failures {
                self.status
            } else {
                StatusCode::OK
            };
            Box::pin(async move {
                Ok(CallResponse {
                    status,
                    body: Bytes::new(),
                    value: None,
                    parsed: None,
                })
            })
        }
    }

    fn req(method: Method, idempotent: bool) -> CallRequest {
        CallRequest {
            call: crate::backend::Call::Http(crate::backend::HttpCall {
                method,
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

    fn layer(failures: usize, status: StatusCode, p: RetryPolicy) -> (Retry, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = Arc::new(Flaky {
            calls: calls.clone(),
            failures,
            status,
        });
        (Retry::new(inner, p), calls)
    }

    #[tokio::test(start_paused = true)]
    async fn retries_listed_statuses_of_idempotent_calls_only() {
        let (r, calls) = layer(1, StatusCode::SERVICE_UNAVAILABLE, policy());
        let resp = r.call(req(Method::GET, true)).await.unwrap();
        assert_eq!(resp.status, StatusCode::OK);
        assert_eq!(calls.load(Relaxed), 2);
        assert_eq!(r.stats().counters().retries, 1);

        let (r, calls) = layer(1, StatusCode::SERVICE_UNAVAILABLE, policy());
        let resp = r.call(req(Method::POST, false)).await.unwrap();
        assert_eq!(resp.status, StatusCode::SERVICE_UNAVAILABLE, "not retried");
        assert_eq!(calls.load(Relaxed), 1);

        let (r, calls) = layer(1, StatusCode::INTERNAL_SERVER_ERROR, policy());
        let resp = r.call(req(Method::GET, true)).await.unwrap();
        assert_eq!(resp.status, 500, "500 is not in on_status");
        assert_eq!(calls.load(Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_bounded_and_the_last_failure_is_returned() {
        let mut p = policy();
        p.attempts = 3;
        let (r, calls) = layer(10, StatusCode::BAD_GATEWAY, p);
        let resp = r.call(req(Method::GET, true)).await.unwrap();
        assert_eq!(resp.status, StatusCode::BAD_GATEWAY);
        assert_eq!(calls.load(Relaxed), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn no_retry_when_the_backoff_does_not_fit_before_the_end() {
        let mut p = policy();
        p.backoff = Duration::from_millis(500);
        p.max_backoff = Duration::from_millis(500);
        let (r, calls) = layer(1, StatusCode::SERVICE_UNAVAILABLE, p);
        let mut q = req(Method::GET, true);
        q.timeout = Duration::from_millis(300);
        let resp = r.call(q).await.unwrap();
        assert_eq!(resp.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(calls.load(Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_exhausted_budget_returns_the_failure_and_counts_it() {
        let mut p = policy();
        p.ratio = 0.0;
        p.min_per_second = 0.2; // × 10 s = 2 retries in the window
        let (r, calls) = layer(100, StatusCode::SERVICE_UNAVAILABLE, p);
        for _ in 0..5 {
            let resp = r.call(req(Method::GET, true)).await.unwrap();
            assert_eq!(resp.status, StatusCode::SERVICE_UNAVAILABLE);
        }
        let c = r.stats().counters();
        assert_eq!((c.calls, c.retries, c.budget_exhausted), (5, 2, 3));
        assert_eq!(calls.load(Relaxed), 7);
    }

    /// A streamed backend that fails its first `failures` opens with a reset, reading
    /// (touching) the body first when `reads` says so.
    struct FlakyStream {
        calls: Arc<AtomicUsize>,
        failures: usize,
        reads: bool,
    }

    impl Backend for FlakyStream {
        fn call(&self, _req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
            unreachable!("only streamed calls")
        }

        fn open(
            &self,
            req: crate::stream::StreamRequest,
        ) -> BoxFuture<'static, Result<crate::stream::StreamResponse, CallError>> {
            use http_body_util::BodyExt;
            let n = self.calls.fetch_add(1, Relaxed);
            let (fail, reads) = (n < self.failures, self.reads);
            Box::pin(async move {
                let mut body = req.body.sender();
                if reads {
                    let _ = body.frame().await;
                }
                if fail {
                    return Err(CallError::new(crate::CallErrorKind::Reset, "reset"));
                }
                Ok(crate::stream::StreamResponse {
                    status: StatusCode::OK,
                    version: http::Version::HTTP_11,
                    headers: Default::default(),
                    body: http_body_util::combinators::UnsyncBoxBody::new(
                        http_body_util::Empty::<Bytes>::new().map_err(|e| match e {}),
                    ),
                })
            })
        }
    }

    fn stream_req(method: Method, idempotent: bool) -> crate::stream::StreamRequest {
        use http_body_util::BodyExt;
        let body = http_body_util::Full::new(Bytes::from_static(b"upload")).map_err(|e| match e {});
        crate::stream::StreamRequest {
            method,
            path_and_query: http::uri::PathAndQuery::from_static("/x"),
            headers: Default::default(),
            body: crate::stream::BodySlot::new(http_body_util::combinators::UnsyncBoxBody::new(
                body,
            )),
            timeout: Duration::from_secs(1),
            deadline: Instant::now() + Duration::from_secs(1),
            idempotent,
            trace: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_is_retried_only_while_its_body_is_untouched_and_the_method_idempotent() {
        let run = |failures, reads| {
            let calls = Arc::new(AtomicUsize::new(0));
            let inner = Arc::new(FlakyStream {
                calls: calls.clone(),
                failures,
                reads,
            });
            (Retry::new(inner, policy()), calls)
        };
        // Failed before its body was asked for: tried again.
        let (r, calls) = run(1, false);
        assert!(r.open(stream_req(Method::PUT, true)).await.is_ok());
        assert_eq!(calls.load(Relaxed), 2);
        // A byte of the body went: never again.
        let (r, calls) = run(1, true);
        assert!(r.open(stream_req(Method::PUT, true)).await.is_err());
        assert_eq!(calls.load(Relaxed), 1);
        // Not idempotent: never again.
        let (r, calls) = run(1, false);
        assert!(r.open(stream_req(Method::POST, false)).await.is_err());
        assert_eq!(calls.load(Relaxed), 1);
    }
}
