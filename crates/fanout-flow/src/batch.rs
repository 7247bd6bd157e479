//! Batch forms of backends (E3): N keys fetched in one call, the answer split back per key.
//!
//! The executor merges the keyed lookups of all steps that start together into one
//! [`BatchPlan::fetch`] (keys de-duplicated, split into calls of at most `max` keys sent
//! concurrently). With a `window`, keys from concurrent requests are merged too: a collector task
//! per backend gathers keys for `window`, makes the calls once, and hands each waiting request the
//! values of its own keys.

use crate::call::HttpPlan;
use crate::call::{BuildError, Env, build_call, fetch_json};
use crate::error::{ErrorKind, FlowError, INVALID_CALL};
use fanout_expr::{Expr, Val, json};
use fanout_layers::cache::{CachePolicy, CacheStats, KeyCache};
use fanout_layers::trace::CallTrace;
use fanout_runtime::hist::{AtomicHistogram, HistogramSnapshot};
use futures_util::future::try_join_all;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Values by key, as split from batch answers. Keys absent here were not found.
pub type Found = Arc<HashMap<String, Val>>;

/// A compiled batch form.
pub struct BatchPlan {
    /// Backend name.
    pub name: Arc<str>,
    /// The batch call; its expressions read `$keys` (scope slot 0).
    pub call: HttpPlan,
    /// Splits an answer into key → value.
    pub split: Expr,
    /// Most keys per call.
    pub max: usize,
    /// Cross-request merging window.
    pub window: Option<Duration>,
    /// Per-call timeout.
    pub timeout: Duration,
    collector: OnceLock<mpsc::UnboundedSender<Waiter>>,
    key_cache: Option<KeyCache>,
    stats: BatchStats,
}

/// Bounds of the batch-size histogram (keys per call).
const SIZES: &[u64] = &[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000];

/// What batching did for one backend: keys per call, and calls saved — each key looked up
/// would otherwise have been a call of its own, so a call with `n` keys saves `n - 1`, and keys
/// that concurrent requests share in one window are fetched once.
#[derive(Debug)]
pub struct BatchStats {
    sizes: AtomicHistogram,
    saved: std::sync::atomic::AtomicU64,
}

impl BatchStats {
    fn new() -> BatchStats {
        BatchStats {
            sizes: AtomicHistogram::new(SIZES, 1.0),
            saved: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn saved(&self, n: usize) {
        self.saved
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keys per batch call.
    pub fn sizes(&self) -> HistogramSnapshot {
        self.sizes.snapshot()
    }

    /// Calls saved by batching and by merging requests' keys.
    pub fn saved_calls(&self) -> u64 {
        self.saved.load(std::sync::atomic::Ordering::Relaxed)
    }
}

struct Waiter {
    keys: Vec<String>,
    deadline: Instant,
    reply: oneshot::Sender<Result<Found, FlowError>>,
}

impl BatchPlan {
    /// A batch form; the call's expressions and `split` are compiled with scope `["keys"]`.
    pub fn new(
        call: HttpPlan,
        split: Expr,
        max: usize,
        window: Option<Duration>,
        timeout: Duration,
    ) -> BatchPlan {
        BatchPlan {
            name: call.backend_name.clone(),
            call,
            split,
            max: max.max(1),
            window,
            timeout,
            collector: OnceLock::new(),
            key_cache: None,
            stats: BatchStats::new(),
        }
    }

    /// Cache values per key: a batch then asks only for the keys that missed.
    pub fn with_cache(mut self, policy: CachePolicy) -> BatchPlan {
        self.key_cache = Some(KeyCache::new(policy));
        self
    }

    /// Keys per call and calls saved.
    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }

    /// The per-key cache's counters, if there is one.
    pub fn cache_stats(&self) -> Option<Arc<CacheStats>> {
        self.key_cache.as_ref().map(KeyCache::stats)
    }

    /// Fetch `keys` (unique): fresh cached values first, the rest from the backend (then cached);
    /// if that fails, stale values are used where allowed (`stale_if_error`).
    /// `trace`: the context of the step that asked (the calls' parent span), for calls made for
    /// this request alone; calls merged across requests (`window`) are not traced.
    pub async fn fetch(
        self: &Arc<Self>,
        keys: Vec<String>,
        deadline: Instant,
        trace: Option<CallTrace>,
    ) -> Result<Found, FlowError> {
        let Some(kc) = &self.key_cache else {
            return self.fetch_uncached(keys, deadline, trace).await;
        };
        let (mut values, missing, stale) = kc.lookup(&keys).await;
        if missing.is_empty() {
            return Ok(Arc::new(values));
        }
        match self.fetch_uncached(missing.clone(), deadline, trace).await {
            Ok(found) => {
                let fetched: HashMap<String, Val> =
                    found.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                kc.store(&fetched).await;
                values.extend(fetched);
                Ok(Arc::new(values))
            }
            Err(e) if missing.iter().all(|k| stale.contains_key(k)) => {
                kc.served_stale(missing.len());
                tracing::debug!(backend = %self.name, error = %e, "batch failed; serving stale values");
                values.extend(stale);
                Ok(Arc::new(values))
            }
            Err(e) => Err(e),
        }
    }

    /// Fetch `keys` (unique) for a request with `deadline`: directly, or through the
    /// cross-request collector when a window is configured.
    async fn fetch_uncached(
        self: &Arc<Self>,
        keys: Vec<String>,
        deadline: Instant,
        trace: Option<CallTrace>,
    ) -> Result<Found, FlowError> {
        let Some(window) = self.window else {
            return self.fetch_now(keys, deadline, trace).await;
        };
        let tx = self.collector.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(collect(Arc::downgrade(self), rx, window));
            tx
        });
        let (reply, rx) = oneshot::channel();
        if tx
            .send(Waiter {
                keys: keys.clone(),
                deadline,
                reply,
            })
            .is_err()
        {
            return self.fetch_now(keys, deadline, trace).await;
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(self.error(
                ErrorKind::BackendReset,
                "the batch call was interrupted",
                "the batch collector stopped".into(),
            )),
        }
    }

    fn error(&self, kind: ErrorKind, message: &str, detail: String) -> FlowError {
        FlowError::new(kind, message)
            .with_backend(&self.name)
            .with_detail(format!("backend `{}` (batch): {detail}", self.name))
    }

    /// Make the calls now: chunks of at most `max` keys, concurrently.
    pub async fn fetch_now(
        &self,
        keys: Vec<String>,
        deadline: Instant,
        trace: Option<CallTrace>,
    ) -> Result<Found, FlowError> {
        let trace = trace.map(|t| CallTrace { batch: true, ..t });
        let chunks = keys.len().div_ceil(self.max);
        self.stats.saved(keys.len().saturating_sub(chunks));
        let calls = keys
            .chunks(self.max)
            .map(|chunk| self.call_chunk(chunk, deadline, trace.clone()));
        let parts = try_join_all(calls).await?;
        let mut all = HashMap::with_capacity(keys.len());
        for p in parts {
            all.extend(p);
        }
        Ok(Arc::new(all))
    }

    async fn call_chunk(
        &self,
        keys: &[String],
        deadline: Instant,
        trace: Option<CallTrace>,
    ) -> Result<HashMap<String, Val>, FlowError> {
        self.stats.sizes.record(keys.len() as u64);
        let keys_val: Val = keys.iter().map(|k| json::str_val(k)).collect();
        let env = Env::with_slots(vec![keys_val.clone()]);
        let mut req = build_call(&self.call, &env, None, deadline).map_err(|e| match e {
            BuildError::Eval(m) => self.error(
                ErrorKind::Expression,
                "building the batch call failed",
                format!("building the batch call failed: {}", m.0),
            ),
            BuildError::Invalid(detail) => self.error(ErrorKind::InvalidCall, INVALID_CALL, detail),
        })?;
        req.trace = trace;
        let who: Arc<str> = Arc::from(format!("{} (batch)", self.name));
        let answer = fetch_json(
            &who,
            &self.call,
            req,
            self.timeout,
            deadline,
            // Shared by the requests of the batch: in no one request's account.
            crate::memory::RequestMemory::unlimited(),
        )
        .await
        .map_err(FlowError::without_step)?;
        match self.split.eval(&answer, |_| keys_val.clone()) {
            Ok(Val::Obj(m)) => Ok(m
                .iter()
                .map(|(k, v)| (json::to_display(k), v.clone()))
                .collect()),
            Ok(Val::Null) => Ok(HashMap::new()),
            Ok(other) => Err(self.error(
                ErrorKind::BadBackendAnswer,
                "the backend's batch answer could not be split into values",
                format!(
                    "`split` must give an object key → value, got {}",
                    fanout_expr::kind_phrase(&other)
                ),
            )),
            Err(e) => Err(self.error(
                ErrorKind::BadBackendAnswer,
                "the backend's batch answer could not be split into values",
                format!("`split` failed: {}", e.0),
            )),
        }
    }
}

/// The cross-request collector of one backend: gathers waiters for `window` (or until `max` keys),
/// fetches their union once, answers each with the values of its keys.
async fn collect(
    plan: std::sync::Weak<BatchPlan>,
    mut rx: mpsc::UnboundedReceiver<Waiter>,
    window: Duration,
) {
    while let Some(first) = rx.recv().await {
        let Some(p) = plan.upgrade() else { return };
        let close = Instant::now() + window;
        let mut waiters = vec![first];
        let mut n_keys = waiters[0].keys.len();
        while n_keys < p.max {
            match tokio::time::timeout_at(close, rx.recv()).await {
                Ok(Some(w)) => {
                    n_keys += w.keys.len();
                    waiters.push(w);
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
        // The calls run on their own task so the next window starts collecting at once.
        tokio::spawn(async move {
            waiters.retain(|w| !w.reply.is_closed());
            if waiters.is_empty() {
                return;
            }
            let mut keys: Vec<String> = waiters
                .iter()
                .flat_map(|w| w.keys.iter().cloned())
                .collect();
            let asked = keys.len();
            keys.sort_unstable();
            keys.dedup();
            p.stats.saved(asked.saturating_sub(keys.len()));
            // The shared call lives as long as the latest caller's deadline; earlier callers
            // give up on their own.
            let deadline = waiters
                .iter()
                .map(|w| w.deadline)
                .max()
                .unwrap_or_else(Instant::now);
            let result = p.fetch_now(keys, deadline, None).await;
            for w in waiters {
                let _ = w.reply.send(result.clone());
            }
        });
    }
}
