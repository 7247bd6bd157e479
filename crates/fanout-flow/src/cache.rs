//! Caches (E1): a [`Backend`] layer for whole answers, and a per-key cache used by batch forms.
//!
//! - Entries are keyed by everything the call sends ([`CallKey`]: method, path with query, every
//!   header the step set, body), so an answer is only ever served for the same call.
//! - Fresh entries (younger than `ttl`) answer without a call.
//! - Concurrent misses of one key are coalesced into one call ([`crate::singleflight`]), which
//!   has its own time limit: a hung miss cannot wedge the key.
//! - Within `stale_while_revalidate` after `ttl`, the stale entry answers at once and one call
//!   refreshes it in the background.
//! - Within `stale_if_error` after `ttl`, a failed call (error, 5xx) is answered from the stale
//!   entry instead.
//! - Only successful (2xx) answers are stored.

use crate::backend::{Backend, CallError, CallKey, CallRequest, CallResponse};
use crate::singleflight::Flights;
use fanout_expr::Val;
use futures_util::future::BoxFuture;
use http::Method;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::Instant;

/// Cache settings at run time.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    /// Freshness.
    pub ttl: Duration,
    /// Entry bound.
    pub max_entries: u64,
    /// Serve stale while refreshing, after `ttl`.
    pub stale_while_revalidate: Duration,
    /// Serve stale on failure, after `ttl`.
    pub stale_if_error: Duration,
}

impl From<&fanout_config::CacheConfig> for CachePolicy {
    fn from(c: &fanout_config::CacheConfig) -> CachePolicy {
        CachePolicy {
            ttl: c.ttl.0,
            max_entries: c.max_entries,
            stale_while_revalidate: c.stale_while_revalidate.0,
            stale_if_error: c.stale_if_error.0,
        }
    }
}

impl CachePolicy {
    fn retention(&self) -> Duration {
        self.ttl + self.stale_while_revalidate.max(self.stale_if_error)
    }
}

/// Counters of a cache (read by the status endpoint and the metrics).
#[derive(Default)]
pub struct CacheStats {
    hits: AtomicU64,
    misses: AtomicU64,
    stale_served: AtomicU64,
    refreshes: AtomicU64,
    /// Counts the cache's entries (set by the cache that owns these counters).
    entries: std::sync::OnceLock<EntryCount>,
}

/// Brings a cache's housekeeping up to date, then counts its entries.
type EntryCount = Box<dyn Fn() -> BoxFuture<'static, u64> + Send + Sync>;

/// An [`EntryCount`] of a moka cache.
fn entry_count<K, V>(cache: moka::future::Cache<K, V>) -> EntryCount
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    Box::new(move || {
        let c = cache.clone();
        Box::pin(async move {
            c.run_pending_tasks().await;
            c.entry_count()
        })
    })
}

impl std::fmt::Debug for CacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheStats")
            .field("counters", &self.counters())
            .finish()
    }
}

/// A snapshot of [`CacheStats`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CacheCounters {
    /// Answered from a fresh entry.
    pub hits: u64,
    /// Needed a call.
    pub misses: u64,
    /// Answered from a stale entry (while revalidating, or because the backend failed).
    pub stale_served: u64,
    /// Background refreshes started.
    pub refreshes: u64,
}

impl CacheStats {
    /// Counters whose entries are counted by `entries`.
    fn counting(entries: EntryCount) -> Arc<CacheStats> {
        let stats = CacheStats::default();
        let _ = stats.entries.set(entries);
        Arc::new(stats)
    }

    /// Entries in the cache now, after its pending housekeeping (inserts, evictions, expiry)
    /// has run.
    pub async fn entries(&self) -> u64 {
        match self.entries.get() {
            Some(count) => count().await,
            None => 0,
        }
    }

    /// Read the counters.
    pub fn counters(&self) -> CacheCounters {
        CacheCounters {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            stale_served: self.stale_served.load(Relaxed),
            refreshes: self.refreshes.load(Relaxed),
        }
    }
}

#[derive(Clone)]
struct Entry {
    resp: CallResponse,
    at: Instant,
}

type Key = CallKey;

struct Shared {
    inner: Arc<dyn Backend>,
    cache: moka::future::Cache<Key, Entry>,
    policy: CachePolicy,
    stats: Arc<CacheStats>,
    flights: Arc<Flights>,
}

/// A backend whose successful GET/HEAD answers are cached.
pub struct Cached {
    shared: Arc<Shared>,
}

impl Cached {
    /// Wrap `inner` (put it outside the dedup layer, so refreshes are de-duplicated too).
    pub fn new(inner: Arc<dyn Backend>, policy: CachePolicy) -> Cached {
        let cache = moka::future::Cache::builder()
            .max_capacity(policy.max_entries)
            .time_to_live(policy.retention().max(Duration::from_millis(1)))
            .build();
        let entries = cache.clone();
        Cached {
            shared: Arc::new(Shared {
                inner,
                cache,
                policy,
                stats: CacheStats::counting(entry_count(entries)),
                flights: Arc::new(Flights::new()),
            }),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<CacheStats> {
        self.shared.stats.clone()
    }
}

fn failed(r: &Result<CallResponse, CallError>) -> bool {
    crate::outcome::CallOutcome::of(r).is_failure()
}

impl Shared {
    /// Call the backend for `key` (coalesced with a live call of the same key that ends in time)
    /// and store a successful answer.
    fn fetch_and_store(
        self: &Arc<Self>,
        key: Key,
        req: CallRequest,
    ) -> impl std::future::Future<Output = Result<CallResponse, CallError>> + use<> {
        let me = self.clone();
        let timeout = req.timeout;
        let k = key.clone();
        self.flights.run(key, timeout, move || {
            Box::pin(async move {
                let r = me.inner.call(req).await;
                if let Ok(resp) = &r
                    && resp.status.is_success()
                {
                    me.cache
                        .insert(
                            k,
                            Entry {
                                resp: resp.clone(),
                                at: Instant::now(),
                            },
                        )
                        .await;
                }
                r
            })
        })
    }
}

impl Backend for Cached {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        if req.method != Method::GET && req.method != Method::HEAD {
            return self.shared.inner.call(req);
        }
        let s = self.shared.clone();
        Box::pin(async move {
            let key: Key = req.key();
            let p = s.policy;
            if let Some(e) = s.cache.get(&key).await {
                let age = e.at.elapsed();
                if age < p.ttl {
                    s.stats.hits.fetch_add(1, Relaxed);
                    return Ok(e.resp);
                }
                if age < p.ttl + p.stale_while_revalidate {
                    s.stats.stale_served.fetch_add(1, Relaxed);
                    s.stats.refreshes.fetch_add(1, Relaxed);
                    let bg = s.clone();
                    // The refresh outlives this request; identical refreshes are merged by the
                    // dedup layer below.
                    // It is limited to the call's own time like any shared call.
                    tokio::spawn(bg.fetch_and_store(key, req));
                    return Ok(e.resp);
                }
                s.stats.misses.fetch_add(1, Relaxed);
                let r = s.fetch_and_store(key, req).await;
                if failed(&r) && age < p.ttl + p.stale_if_error {
                    s.stats.stale_served.fetch_add(1, Relaxed);
                    return Ok(e.resp);
                }
                return r;
            }
            s.stats.misses.fetch_add(1, Relaxed);
            // A true miss: concurrent misses of the key share one call.
            s.fetch_and_store(key, req).await
        })
    }
}

/// Per-key values of a batch form, with the same freshness rules (no background refresh: a stale
/// key is fetched again with the next batch, and used only if that batch fails).
pub struct KeyCache {
    cache: moka::future::Cache<String, (Val, Instant)>,
    policy: CachePolicy,
    stats: Arc<CacheStats>,
}

impl KeyCache {
    /// A key cache with `policy`.
    pub fn new(policy: CachePolicy) -> KeyCache {
        let cache: moka::future::Cache<String, (Val, Instant)> = moka::future::Cache::builder()
            .max_capacity(policy.max_entries)
            .time_to_live(policy.retention().max(Duration::from_millis(1)))
            .build();
        let entries = cache.clone();
        KeyCache {
            cache,
            policy,
            stats: CacheStats::counting(entry_count(entries)),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<CacheStats> {
        self.stats.clone()
    }

    /// Split `keys` into fresh values and the keys to fetch (with their stale values, if usable
    /// on error).
    pub async fn lookup(
        &self,
        keys: &[String],
    ) -> (HashMap<String, Val>, Vec<String>, HashMap<String, Val>) {
        let (mut fresh, mut missing, mut stale) = (HashMap::new(), Vec::new(), HashMap::new());
        for k in keys {
            match self.cache.get(k).await {
                Some((v, at)) if at.elapsed() < self.policy.ttl => {
                    self.stats.hits.fetch_add(1, Relaxed);
                    fresh.insert(k.clone(), v);
                }
                Some((v, at)) => {
                    self.stats.misses.fetch_add(1, Relaxed);
                    if at.elapsed() < self.policy.ttl + self.policy.stale_if_error {
                        stale.insert(k.clone(), v);
                    }
                    missing.push(k.clone());
                }
                None => {
                    self.stats.misses.fetch_add(1, Relaxed);
                    missing.push(k.clone());
                }
            }
        }
        (fresh, missing, stale)
    }

    /// Store fetched values.
    pub async fn store(&self, values: &HashMap<String, Val>) {
        let now = Instant::now();
        for (k, v) in values {
            self.cache.insert(k.clone(), (v.clone(), now)).await;
        }
    }

    /// Count stale values served because the fetch failed.
    pub fn served_stale(&self, n: usize) {
        self.stats.stale_served.fetch_add(n as u64, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::AtomicUsize;

    struct Counting {
        calls: Arc<AtomicUsize>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Backend for Counting {
        fn call(&self, _req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
            let n = self.calls.fetch_add(1, Relaxed) + 1;
            let fail = self.fail.load(Relaxed);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if fail {
                    return Err(CallError::new(crate::CallErrorKind::Connect, "down"));
                }
                Ok(CallResponse {
                    status: http::StatusCode::OK,
                    body: Bytes::from(format!("{{\"n\":{n}}}")),
                })
            })
        }
    }

    fn req() -> CallRequest {
        CallRequest {
            method: Method::GET,
            path_and_query: "/k".into(),
            headers: Default::default(),
            body: Bytes::new(),
            timeout: Duration::from_secs(1),
            deadline: Instant::now() + Duration::from_secs(1),
            idempotent: true,
            deadline_header: None,
        }
    }

    fn setup(
        policy: CachePolicy,
    ) -> (Cached, Arc<AtomicUsize>, Arc<std::sync::atomic::AtomicBool>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c = Cached::new(
            Arc::new(Counting {
                calls: calls.clone(),
                fail: fail.clone(),
            }),
            policy,
        );
        (c, calls, fail)
    }

    // Paused clock: every caller registers its miss before the backend's 20 ms pass, however
    // loaded the machine is.
    #[tokio::test(start_paused = true)]
    async fn a_thousand_concurrent_misses_make_one_call() {
        let (c, calls, _) = setup(CachePolicy {
            ttl: Duration::from_secs(10),
            max_entries: 100,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
        });
        let all = futures_util::future::join_all((0..1000).map(|_| c.call(req()))).await;
        assert!(all.iter().all(|r| {
            r.as_ref()
                .is_ok_and(|r| r.body == Bytes::from_static(b"{\"n\":1}"))
        }));
        assert_eq!(calls.load(Relaxed), 1);
        assert_eq!(c.stats().counters().misses, 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_expiry_stale_on_error_and_refresh_when_back() {
        let (c, calls, fail) = setup(CachePolicy {
            ttl: Duration::from_millis(100),
            max_entries: 100,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::from_secs(60),
        });
        assert_eq!(c.call(req()).await.unwrap().body, "{\"n\":1}");
        assert_eq!(c.call(req()).await.unwrap().body, "{\"n\":1}", "fresh hit");
        assert_eq!(calls.load(Relaxed), 1);
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(
            c.call(req()).await.unwrap().body,
            "{\"n\":2}",
            "expired: fetched again"
        );
        tokio::time::advance(Duration::from_millis(150)).await;
        fail.store(true, Relaxed);
        assert_eq!(
            c.call(req()).await.unwrap().body,
            "{\"n\":2}",
            "backend down: stale served"
        );
        assert_eq!(c.stats().counters().stale_served, 1);
        fail.store(false, Relaxed);
        assert_eq!(
            c.call(req()).await.unwrap().body,
            "{\"n\":4}",
            "backend back: refreshed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stale_while_revalidate_answers_at_once_and_refreshes_once() {
        let (c, calls, _) = setup(CachePolicy {
            ttl: Duration::from_millis(100),
            max_entries: 100,
            stale_while_revalidate: Duration::from_secs(10),
            stale_if_error: Duration::ZERO,
        });
        c.call(req()).await.unwrap();
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(
            c.call(req()).await.unwrap().body,
            "{\"n\":1}",
            "stale, served at once"
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // the background refresh completes
        assert_eq!(
            c.call(req()).await.unwrap().body,
            "{\"n\":2}",
            "refreshed in the background"
        );
        assert_eq!(calls.load(Relaxed), 2);
    }
}
