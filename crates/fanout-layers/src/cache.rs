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
//! - With a second level ([`crate::l2`], `cache: {l2: true}`), a miss in memory asks the shared
//!   store before the backend (a fresh value there answers and fills memory with its remaining
//!   freshness; a stale one is kept for `stale_if_error`), and each answer from the backend is
//!   also written there (without waiting) for `ttl` + the longer stale window.

use crate::backend::{Backend, CallError, CallKey, CallRequest, CallResponse};
use crate::l2::{L2Cache, L2Counters, L2Stats};
use crate::singleflight::Flights;
use crate::trace::{CacheRole, CallTrace, served};
use fanout_expr::Val;
use futures_util::future::BoxFuture;
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
    /// The second level's counters, when the cache has one.
    l2: Option<Arc<L2Stats>>,
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
    /// The second level's counters (shared store), when the cache has one. Its reads are part of
    /// `misses` (a miss in memory asks the second level).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l2: Option<L2Counters>,
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
            l2: self.l2.as_ref().map(|l| l.counters()),
        }
    }

    /// The second level's counters, when the cache has one.
    pub fn l2_counters(&self) -> Option<L2Counters> {
        self.l2.as_ref().map(|l| l.counters())
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
    l2: Option<L2Cache>,
}

/// A backend whose successful GET/HEAD answers are cached.
pub struct Cached {
    shared: Arc<Shared>,
}

impl Cached {
    /// Wrap `inner` (put it outside the dedup layer, so refreshes are de-duplicated too).
    pub fn new(inner: Arc<dyn Backend>, policy: CachePolicy) -> Cached {
        Cached::with_l2(inner, policy, None)
    }

    /// [`Cached::new`] with a second level (the shared store) behind the memory.
    pub fn with_l2(inner: Arc<dyn Backend>, policy: CachePolicy, l2: Option<L2Cache>) -> Cached {
        let stats = CacheStats {
            l2: l2.as_ref().map(|l| l.stats()),
            ..CacheStats::default()
        };
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
                stats: {
                    let _ = stats.entries.set(entry_count(entries));
                    Arc::new(stats)
                },
                flights: Arc::new(Flights::new()),
                l2,
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
    /// Load `key` (coalesced with a live load of the same key that ends in time): from the second
    /// level if it has a fresh answer, else from the backend, storing a successful answer.
    fn fetch_and_store(
        self: &Arc<Self>,
        key: Key,
        req: CallRequest,
    ) -> impl std::future::Future<Output = Result<CallResponse, CallError>> + use<> {
        let me = self.clone();
        let timeout = req.timeout;
        let k = key.clone();
        self.flights.run(key, timeout, move |limit| {
            let mut req = req;
            req.timeout = limit;
            Box::pin(me.load(k, req))
        })
    }

    async fn load(
        self: Arc<Self>,
        key: Key,
        mut req: CallRequest,
    ) -> Result<CallResponse, CallError> {
        let p = self.policy;
        let l2 = self.l2.as_ref().map(|l2| (l2, l2.key(&key)));
        let mut stale = None;
        if let Some((l2, l2_key)) = &l2 {
            let started = Instant::now();
            match l2.get(l2_key, p.ttl).await {
                Some(e) if e.age < p.ttl => {
                    self.remember(key, e.resp.clone(), e.age).await;
                    return Ok(e.resp);
                }
                e => stale = e.filter(|e| e.age < p.ttl + p.stale_if_error),
            }
            req.timeout = req.timeout.saturating_sub(started.elapsed());
        }
        let r = self.inner.call(req).await;
        match &r {
            Ok(resp) if resp.status.is_success() => {
                self.remember(key, resp.clone(), Duration::ZERO).await;
                if let Some((l2, l2_key)) = &l2 {
                    l2.put(l2_key, resp, p.retention());
                }
            }
            _ => {
                if let Some(e) = stale.filter(|_| failed(&r)) {
                    // another instance's stale answer, kept for stale_if_error like our own
                    self.remember(key, e.resp.clone(), e.age).await;
                    self.stats.stale_served.fetch_add(1, Relaxed);
                    return Ok(e.resp);
                }
            }
        }
        r
    }

    /// Keep `resp`, fetched `age` ago, in memory.
    async fn remember(&self, key: Key, mut resp: CallResponse, age: Duration) {
        // the cache's size counts bytes: a parsed value shared by a dedup flight is not kept
        resp.parsed = None;
        if let Some(at) = Instant::now().checked_sub(age) {
            self.cache.insert(key, Entry { resp, at }).await;
        }
    }
}

impl Backend for Cached {
    /// A stream is never stored: passed down.
    fn open(
        &self,
        req: crate::stream::StreamRequest,
    ) -> BoxFuture<'static, Result<crate::stream::StreamResponse, CallError>> {
        self.shared.inner.open(req)
    }

    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        if !req.is_safe() {
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
                    return from_cache(req.trace.as_ref(), CacheRole::Hit, e.resp).await;
                }
                if age < p.ttl + p.stale_while_revalidate {
                    s.stats.stale_served.fetch_add(1, Relaxed);
                    s.stats.refreshes.fetch_add(1, Relaxed);
                    let bg = s.clone();
                    // The refresh outlives this request; identical refreshes are merged by the
                    // dedup layer below.
                    // It is limited to the call's own time like any shared call.
                    tokio::spawn(
                        bg.fetch_and_store(key, with_role(req.clone(), CacheRole::Refresh)),
                    );
                    return from_cache(req.trace.as_ref(), CacheRole::Stale, e.resp).await;
                }
                s.stats.misses.fetch_add(1, Relaxed);
                let trace = req.trace.clone();
                let r = s
                    .fetch_and_store(key, with_role(req, CacheRole::Miss))
                    .await;
                if failed(&r) && age < p.ttl + p.stale_if_error {
                    s.stats.stale_served.fetch_add(1, Relaxed);
                    return from_cache(trace.as_ref(), CacheRole::Stale, e.resp).await;
                }
                return r;
            }
            s.stats.misses.fetch_add(1, Relaxed);
            // A true miss: concurrent misses of the key share one call.
            s.fetch_and_store(key, with_role(req, CacheRole::Miss))
                .await
        })
    }
}

/// `req` with the cache's role in its trace.
fn with_role(mut req: CallRequest, role: CacheRole) -> CallRequest {
    if let Some(t) = &mut req.trace {
        t.cache = Some(role);
    }
    req
}

/// An answer from the cache, recorded in the call's trace (a span without an attempt).
async fn from_cache(
    trace: Option<&CallTrace>,
    role: CacheRole,
    resp: CallResponse,
) -> Result<CallResponse, CallError> {
    // Only a traced call has a span to record (a counted one sent no attempt).
    let trace = trace.filter(|t| t.is_traced()).map(|t| CallTrace {
        cache: Some(role),
        ..t.clone()
    });
    served(trace.as_ref(), std::future::ready(Ok(resp))).await
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
    use http::Method;
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
                    value: None,
                    parsed: None,
                })
            })
        }
    }

    fn req() -> CallRequest {
        CallRequest {
            call: crate::backend::Call::Http(crate::backend::HttpCall {
                method: Method::GET,
                path_and_query: http::uri::PathAndQuery::from_static("/k"),
                headers: Default::default(),
                body: Bytes::new(),
            }),
            timeout: Duration::from_secs(1),
            deadline: Instant::now() + Duration::from_secs(1),
            idempotent: true,
            trace: None,
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

    /// Two caches over one second level (as two instances over one Redis).
    #[tokio::test(start_paused = true)]
    async fn a_second_cache_answers_from_the_shared_level_without_a_call() {
        use crate::l2::{L2, L2Error, L2Policy, L2Store};
        #[derive(Default)]
        struct Map(std::sync::Mutex<HashMap<String, Bytes>>);
        impl L2Store for Arc<Map> {
            fn get(&self, k: String, _: usize) -> BoxFuture<'static, Result<Bytes, L2Error>> {
                let v = self.0.lock().unwrap().get(&k).cloned().unwrap_or_default();
                Box::pin(async move { Ok(v) })
            }
            fn set(
                &self,
                k: String,
                v: Bytes,
                _: Duration,
            ) -> BoxFuture<'static, Result<(), L2Error>> {
                self.0.lock().unwrap().insert(k, v);
                Box::pin(async { Ok(()) })
            }
        }
        let map = Arc::new(Map::default());
        let policy = CachePolicy {
            ttl: Duration::from_secs(10),
            max_entries: 100,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
        };
        let l2 = Arc::new(L2::new(
            Arc::new(map.clone()),
            L2Policy {
                timeout: Duration::from_millis(50),
                max_value_bytes: 1 << 20,
                key_prefix: "t:".into(),
                max_pending_writes: 8,
                consecutive_failures: 3,
                open_for: Duration::from_secs(1),
            },
        ));
        let instance = || {
            let calls = Arc::new(AtomicUsize::new(0));
            let backend = Arc::new(Counting {
                calls: calls.clone(),
                fail: Default::default(),
            });
            let c = Cached::with_l2(backend, policy, Some(l2.for_backend("b")));
            (c, calls)
        };
        let (a, a_calls) = instance();
        let (b, b_calls) = instance();
        assert_eq!(a.call(req()).await.unwrap().body, "{\"n\":1}");
        while map.0.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            b.call(req()).await.unwrap().body,
            "{\"n\":1}",
            "from the second level"
        );
        assert_eq!(
            b.call(req()).await.unwrap().body,
            "{\"n\":1}",
            "then from memory"
        );
        assert_eq!((a_calls.load(Relaxed), b_calls.load(Relaxed)), (1, 0));
        let l2 = b.stats().counters().l2.unwrap();
        assert_eq!((l2.hits, l2.misses), (1, 0));
        assert_eq!(b.stats().counters().hits, 1);
    }
}
