//! The second level (L2) of the answer caches: a store shared by every instance of the gateway
//! (Redis, implemented in `fanout-proxy`), behind each backend's in-memory [`crate::cache`].
//!
//! - **Keys** name everything that makes an answer differ: `{prefix}v1:{backend}:{sha256}`, the
//!   digest over a format tag, the backend's name and the call's [`CallKey`] (method, path with
//!   query, every header the step set, body). Answers are never shared across backends.
//! - **Values** are [`encode`]d answers: a header (magic, format version, status, the wall-clock
//!   time the answer was fetched, the key's digest, the body length) and the body. A value that
//!   does not decode exactly — wrong magic, version, digest or length, a non-2xx status, larger
//!   than `max_value_bytes` — is *corrupt*: counted, and treated as a miss.
//! - **Reads** (on an in-memory miss) wait at most `timeout`; **writes** never wait on the request
//!   path: they are queued (at most `max_pending_writes`, more are dropped) for one writer task.
//! - **Failures** (errors, timeouts) never fail a request; after `consecutive_failures` in a row
//!   the store is skipped for `open_for`, then one probe command decides whether to use it again.
//!
//! The counters ([`L2Stats`]) are per backend; the breaker and the write queue are per store.

use crate::backend::{CallKey, CallResponse};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The store behind the L2: a key-value server with expiring entries.
pub trait L2Store: Send + Sync + 'static {
    /// At most `limit` bytes of the value under `key` (its first ones); empty when there is none.
    fn get(&self, key: String, limit: usize) -> BoxFuture<'static, Result<Bytes, L2Error>>;
    /// Store `value` under `key` for `ttl`.
    fn set(
        &self,
        key: String,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<(), L2Error>>;
}

/// Why a store command failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum L2Error {
    /// The key holds something that is not a value of ours (e.g. another type): a corrupt value,
    /// not a failure of the store.
    #[error("the key holds a value of another type")]
    WrongType,
    /// The store could not be reached or failed the command.
    #[error("{0}")]
    Failed(String),
}

/// L2 settings at run time.
#[derive(Debug, Clone)]
pub struct L2Policy {
    /// Time limit of each command.
    pub timeout: Duration,
    /// Largest encoded value written or read.
    pub max_value_bytes: usize,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Most writes queued.
    pub max_pending_writes: usize,
    /// Failures in a row that open the breaker.
    pub consecutive_failures: u32,
    /// How long the breaker stays open before a probe.
    pub open_for: Duration,
}

impl From<&fanout_config::RedisConfig> for L2Policy {
    fn from(c: &fanout_config::RedisConfig) -> L2Policy {
        L2Policy {
            timeout: c.timeout.0,
            max_value_bytes: c.max_value_bytes,
            key_prefix: c.key_prefix.clone(),
            max_pending_writes: c.max_pending_writes,
            consecutive_failures: c.breaker.consecutive_failures.max(1),
            open_for: c.breaker.open_for.0,
        }
    }
}

/// The L2 counters of one backend's cache (for the status endpoint and metrics).
#[derive(Debug, Default)]
pub struct L2Stats {
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    corrupt: AtomicU64,
    writes: AtomicU64,
    write_errors: AtomicU64,
    write_skipped: AtomicU64,
    too_large: AtomicU64,
}

/// A snapshot of [`L2Stats`]. Every read is exactly one of `hits`, `misses`, `errors`, `skipped`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct L2Counters {
    /// Reads that found a fresh answer (younger than the cache's `ttl`).
    pub hits: u64,
    /// Reads that found no fresh answer: none, a stale one (still usable on a backend failure,
    /// within `stale_if_error`) or a corrupt one.
    pub misses: u64,
    /// Reads that failed (error or timeout).
    pub errors: u64,
    /// Reads not sent: the breaker was open.
    pub skipped: u64,
    /// Values read that did not decode (also counted in `misses`).
    pub corrupt: u64,
    /// Values written.
    pub writes: u64,
    /// Writes that failed (error or timeout).
    pub write_errors: u64,
    /// Writes not sent: the breaker was open or the write queue full.
    pub write_skipped: u64,
    /// Answers not written: larger than `max_value_bytes`.
    pub too_large: u64,
}

impl L2Stats {
    /// Read the counters.
    pub fn counters(&self) -> L2Counters {
        L2Counters {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            errors: self.errors.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            corrupt: self.corrupt.load(Relaxed),
            writes: self.writes.load(Relaxed),
            write_errors: self.write_errors.load(Relaxed),
            write_skipped: self.write_skipped.load(Relaxed),
            too_large: self.too_large.load(Relaxed),
        }
    }
}

/// The breaker of a store: closed, open until a time, or (after it) letting one probe through.
struct Breaker {
    threshold: u32,
    open_for: Duration,
    state: Mutex<BreakerState>,
}

#[derive(Default)]
struct BreakerState {
    failures: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    fn state(&self) -> std::sync::MutexGuard<'_, BreakerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a command may be sent now (after `open_for`, one probe; the next ones wait for
    /// another `open_for` unless the probe closes the breaker).
    fn allow(&self) -> bool {
        let mut s = self.state();
        match s.open_until {
            None => true,
            Some(t) if Instant::now() < t => false,
            Some(_) => {
                s.open_until = Some(Instant::now() + self.open_for);
                true
            }
        }
    }

    fn record(&self, r: &Result<(), String>) {
        let mut s = self.state();
        match r {
            Ok(()) => {
                if s.open_until.take().is_some() {
                    tracing::info!("shared cache (redis) answers again: using it");
                }
                s.failures = 0;
            }
            Err(e) => {
                s.failures = s.failures.saturating_add(1);
                if s.failures >= self.threshold {
                    if s.open_until.is_none() {
                        tracing::warn!(
                            error = %e,
                            skip_for = ?self.open_for,
                            "shared cache (redis) failing: caches work in memory only for a while"
                        );
                    }
                    s.open_until = Some(Instant::now() + self.open_for);
                }
            }
        }
    }
}

/// One queued write.
struct Write {
    key: String,
    value: Bytes,
    ttl: Duration,
    stats: Arc<L2Stats>,
}

/// How many queued writes are sent at once by the writer task.
const WRITE_CONCURRENCY: usize = 16;

struct Inner {
    store: Arc<dyn L2Store>,
    policy: L2Policy,
    breaker: Breaker,
}

impl Inner {
    /// Run `cmd` within the timeout, recording the outcome in the breaker; `None` when skipped.
    async fn run<T>(
        &self,
        cmd: BoxFuture<'static, Result<T, L2Error>>,
    ) -> Option<Result<T, L2Error>> {
        if !self.breaker.allow() {
            return None;
        }
        let r = match tokio::time::timeout(self.policy.timeout, cmd).await {
            Ok(r) => r,
            Err(_) => Err(L2Error::Failed(format!(
                "no answer within {:?}",
                self.policy.timeout
            ))),
        };
        // A value of another type is the key's fault, not the store's.
        let outcome = match &r {
            Ok(_) | Err(L2Error::WrongType) => Ok(()),
            Err(L2Error::Failed(e)) => Err(e.clone()),
        };
        self.breaker.record(&outcome);
        Some(r)
    }

    async fn write(&self, w: Write) {
        match self.run(self.store.set(w.key, w.value, w.ttl)).await {
            None => w.stats.write_skipped.fetch_add(1, Relaxed),
            Some(Ok(())) => w.stats.writes.fetch_add(1, Relaxed),
            Some(Err(_)) => w.stats.write_errors.fetch_add(1, Relaxed),
        };
    }
}

/// A shared store with its policy, breaker and write queue; one per gateway, shared by the
/// backends whose cache has `l2: true`.
pub struct L2 {
    inner: Arc<Inner>,
    writes: OnceLock<mpsc::Sender<Write>>,
}

impl L2 {
    /// An L2 over `store` (no I/O until the first command).
    pub fn new(store: Arc<dyn L2Store>, policy: L2Policy) -> L2 {
        let breaker = Breaker {
            threshold: policy.consecutive_failures.max(1),
            open_for: policy.open_for,
            state: Mutex::new(BreakerState::default()),
        };
        L2 {
            inner: Arc::new(Inner {
                store,
                policy,
                breaker,
            }),
            writes: OnceLock::new(),
        }
    }

    /// The handle of backend `backend`'s cache, with its own counters.
    pub fn for_backend(self: &Arc<Self>, backend: &str) -> L2Cache {
        L2Cache {
            l2: self.clone(),
            backend: backend.into(),
            stats: Arc::new(L2Stats::default()),
        }
    }

    /// The write queue; its writer task is started on first use (inside the runtime) and ends
    /// when this `L2` is dropped.
    fn queue(&self) -> &mpsc::Sender<Write> {
        self.writes.get_or_init(|| {
            let (tx, mut rx) = mpsc::channel::<Write>(self.inner.policy.max_pending_writes.max(1));
            let inner = self.inner.clone();
            let queued = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
            tokio::spawn(queued.for_each_concurrent(WRITE_CONCURRENCY, move |w| {
                let inner = inner.clone();
                async move { inner.write(w).await }
            }));
            tx
        })
    }
}

/// An answer read from the L2.
#[derive(Debug, Clone)]
pub struct L2Entry {
    /// The answer.
    pub resp: CallResponse,
    /// How long ago it was fetched from the backend (by whichever instance).
    pub age: Duration,
}

/// The key of one call in the L2.
pub struct L2Key {
    key: String,
    digest: [u8; 32],
}

/// One backend's view of the L2: its key space and its counters.
pub struct L2Cache {
    l2: Arc<L2>,
    backend: Box<str>,
    stats: Arc<L2Stats>,
}

/// The format tag of keys and values; change it with the value format.
const FORMAT: &str = "v1";

impl L2Cache {
    /// The counters.
    pub fn stats(&self) -> Arc<L2Stats> {
        self.stats.clone()
    }

    /// The L2 key of a call to this backend.
    pub fn key(&self, call: &CallKey) -> L2Key {
        let mut h = Sha256::new();
        h.update(b"fanout-l2/");
        h.update(FORMAT.as_bytes());
        h.update((self.backend.len() as u64).to_le_bytes());
        h.update(self.backend.as_bytes());
        h.update(call.as_bytes());
        let digest: [u8; 32] = h.finalize().into();
        let prefix = &self.l2.inner.policy.key_prefix;
        let mut key = String::with_capacity(prefix.len() + self.backend.len() + 70);
        key.push_str(prefix);
        key.push_str(FORMAT);
        key.push(':');
        key.push_str(&self.backend);
        key.push(':');
        for b in digest {
            key.push(char::from(HEX[usize::from(b >> 4)]));
            key.push(char::from(HEX[usize::from(b & 15)]));
        }
        L2Key { key, digest }
    }

    /// The answer stored under `key`, fresh or not (never an error: failures and corrupt values
    /// are counted and read as nothing). Counted as a hit when it is younger than `ttl`, else as
    /// a miss (the caller may still serve it stale).
    pub async fn get(&self, key: &L2Key, ttl: Duration) -> Option<L2Entry> {
        let inner = &self.l2.inner;
        let limit = inner.policy.max_value_bytes + 1;
        let read = inner.run(inner.store.get(key.key.clone(), limit)).await;
        let s = &self.stats;
        let bytes = match read {
            None => {
                s.skipped.fetch_add(1, Relaxed);
                return None;
            }
            Some(Err(L2Error::WrongType)) => None,
            Some(Err(L2Error::Failed(_))) => {
                s.errors.fetch_add(1, Relaxed);
                return None;
            }
            Some(Ok(b)) if b.is_empty() => {
                s.misses.fetch_add(1, Relaxed);
                return None;
            }
            Some(Ok(b)) => Some(b),
        };
        match bytes
            .filter(|b| b.len() <= inner.policy.max_value_bytes)
            .and_then(|b| decode(&b, &key.digest, unix_ms()))
        {
            Some(e) => {
                let counter = if e.age < ttl { &s.hits } else { &s.misses };
                counter.fetch_add(1, Relaxed);
                Some(e)
            }
            None => {
                s.corrupt.fetch_add(1, Relaxed);
                s.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Queue a write of `resp` under `key`, to expire after `ttl`; never waits.
    pub fn put(&self, key: &L2Key, resp: &CallResponse, ttl: Duration) {
        let body = resp.bytes();
        if HEADER + body.len() > self.l2.inner.policy.max_value_bytes {
            self.stats.too_large.fetch_add(1, Relaxed);
            return;
        }
        let w = Write {
            key: key.key.clone(),
            value: encode(resp, &key.digest, unix_ms()),
            ttl: ttl.max(Duration::from_millis(1)),
            stats: self.stats.clone(),
        };
        if self.l2.queue().try_send(w).is_err() {
            self.stats.write_skipped.fetch_add(1, Relaxed);
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The first bytes of every value.
const MAGIC: &[u8; 4] = b"FOL2";
/// The value format (the key's `v1`).
const VERSION: u8 = 1;
/// Magic, version, status (u16), fetched at (u64 ms since the epoch), digest, body length (u32).
pub const HEADER: usize = 4 + 1 + 2 + 8 + 32 + 4;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The stored form of an answer fetched at `now_ms`, for the key with `digest`.
pub fn encode(resp: &CallResponse, digest: &[u8; 32], now_ms: u64) -> Bytes {
    let body = resp.bytes();
    let mut out = BytesMut::with_capacity(HEADER + body.len());
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u16(resp.status.as_u16());
    out.put_u64(now_ms);
    out.put_slice(digest);
    out.put_u32(u32::try_from(body.len()).unwrap_or(u32::MAX));
    out.put_slice(&body);
    out.freeze()
}

/// The answer in `value` (read at `now_ms`) if it is exactly a value of ours for the key with
/// `digest`, with a 2xx status; `None` for anything else.
pub fn decode(value: &Bytes, digest: &[u8; 32], now_ms: u64) -> Option<L2Entry> {
    let h = value.get(..HEADER)?;
    let (magic, h) = h.split_at(4);
    let (version, h) = h.split_at(1);
    let (status, h) = h.split_at(2);
    let (at, h) = h.split_at(8);
    let (d, len) = h.split_at(32);
    let status = u16::from_be_bytes(status.try_into().ok()?);
    let at = u64::from_be_bytes(at.try_into().ok()?);
    let len = u32::from_be_bytes(len.try_into().ok()?);
    let status = http::StatusCode::from_u16(status).ok()?;
    let ok = magic == MAGIC
        && version == [VERSION]
        && d == digest
        && status.is_success()
        && usize::try_from(len).ok()? == value.len() - HEADER;
    ok.then(|| L2Entry {
        resp: CallResponse {
            status,
            body: value.slice(HEADER..),
            value: None,
            parsed: None,
        },
        age: Duration::from_millis(now_ms.saturating_sub(at)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;

    /// An in-process store (the L2 layer's own logic; Redis itself is tested end to end).
    #[derive(Default)]
    struct MapStore {
        map: Mutex<HashMap<String, Bytes>>,
        hang: AtomicBool,
        sent: AtomicU64,
    }

    impl L2Store for Arc<MapStore> {
        fn get(&self, key: String, limit: usize) -> BoxFuture<'static, Result<Bytes, L2Error>> {
            let me = self.clone();
            Box::pin(async move {
                me.sent.fetch_add(1, Relaxed);
                if me.hang.load(Relaxed) {
                    std::future::pending::<()>().await;
                }
                let v = me
                    .map
                    .lock()
                    .unwrap()
                    .get(&key)
                    .cloned()
                    .unwrap_or_default();
                Ok(v.slice(..v.len().min(limit)))
            })
        }
        fn set(
            &self,
            key: String,
            value: Bytes,
            _ttl: Duration,
        ) -> BoxFuture<'static, Result<(), L2Error>> {
            let me = self.clone();
            Box::pin(async move {
                me.sent.fetch_add(1, Relaxed);
                me.map.lock().unwrap().insert(key, value);
                Ok(())
            })
        }
    }

    fn policy() -> L2Policy {
        L2Policy {
            timeout: Duration::from_millis(50),
            max_value_bytes: 1000,
            key_prefix: "t:".into(),
            max_pending_writes: 8,
            consecutive_failures: 2,
            open_for: Duration::from_secs(5),
        }
    }

    fn answer(body: &'static str) -> CallResponse {
        CallResponse {
            status: http::StatusCode::OK,
            body: Bytes::from_static(body.as_bytes()),
            value: None,
            parsed: None,
        }
    }

    fn call_key(path: &str) -> CallKey {
        crate::backend::CallRequest {
            call: crate::backend::Call::Http(crate::backend::HttpCall {
                method: http::Method::GET,
                path_and_query: path.parse().expect("a test path"),
                headers: Default::default(),
                body: Bytes::new(),
            }),
            timeout: Duration::from_secs(1),
            deadline: Instant::now() + Duration::from_secs(1),
            idempotent: true,
            trace: None,
        }
        .key()
    }

    #[test]
    fn values_round_trip_and_anything_else_is_rejected() {
        let d = [7u8; 32];
        let v = encode(&answer("{\"a\":1}"), &d, 1_000);
        assert_eq!(HEADER, 51, "documented in docs/config.md and caching.md");
        assert_eq!(v.len(), HEADER + 7);
        let e = decode(&v, &d, 1_250).unwrap();
        assert_eq!(e.resp.body, "{\"a\":1}");
        assert_eq!(e.age, Duration::from_millis(250));
        assert_eq!(
            decode(&v, &d, 10).unwrap().age,
            Duration::ZERO,
            "clock skew"
        );
        assert!(
            decode(&v, &[8u8; 32], 1_250).is_none(),
            "another key's value"
        );
        for cut in 0..v.len() {
            assert!(decode(&v.slice(..cut), &d, 1_250).is_none(), "cut at {cut}");
        }
        let mut longer = v.to_vec();
        longer.push(b'x');
        assert!(decode(&Bytes::from(longer), &d, 0).is_none());
        for i in 0..HEADER {
            let mut bad = v.to_vec();
            bad[i] ^= 0xff;
            // the time field may take any value
            if (7..15).contains(&i) {
                continue;
            }
            assert!(
                decode(&Bytes::from(bad), &d, 0).is_none(),
                "byte {i} flipped"
            );
        }
        let err = CallResponse {
            status: http::StatusCode::INTERNAL_SERVER_ERROR,
            body: Bytes::new(),
            value: None,
            parsed: None,
        };
        assert!(decode(&encode(&err, &d, 0), &d, 0).is_none(), "only 2xx");
        assert!(decode(&Bytes::from_static(b"garbage"), &d, 0).is_none());
    }

    #[test]
    fn keys_separate_backends_and_calls() {
        let l2 = Arc::new(L2::new(Arc::new(Arc::new(MapStore::default())), policy()));
        let (a, b) = (l2.for_backend("a"), l2.for_backend("b"));
        let ka = a.key(&call_key("/x"));
        assert!(ka.key.starts_with("t:v1:a:"), "{}", ka.key);
        assert_eq!(ka.key.len(), "t:v1:a:".len() + 64);
        assert_ne!(ka.digest, b.key(&call_key("/x")).digest);
        assert_ne!(ka.digest, a.key(&call_key("/y")).digest);
        assert_eq!(ka.digest, a.key(&call_key("/x")).digest);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_are_read_back_oversized_ones_are_not_written() {
        let store = Arc::new(MapStore::default());
        let l2 = Arc::new(L2::new(Arc::new(store.clone()), policy()));
        let c = l2.for_backend("a");
        let k = c.key(&call_key("/x"));
        assert!(c.get(&k, Duration::from_secs(1)).await.is_none());
        c.put(&k, &answer("{}"), Duration::from_secs(1));
        let big = CallResponse {
            status: http::StatusCode::OK,
            body: Bytes::from(vec![b' '; 1000]),
            value: None,
            parsed: None,
        };
        c.put(&c.key(&call_key("/big")), &big, Duration::from_secs(1));
        while c.stats().counters().writes == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            c.get(&k, Duration::from_secs(1)).await.unwrap().resp.body,
            "{}"
        );
        let n = c.stats().counters();
        assert_eq!((n.hits, n.misses, n.writes, n.too_large), (1, 1, 1, 1));
        // garbage under the key: a miss, counted as corrupt
        store
            .map
            .lock()
            .unwrap()
            .insert(k.key.clone(), Bytes::from_static(b"FOL2 garbage"));
        assert!(c.get(&k, Duration::from_secs(1)).await.is_none());
        assert_eq!(c.stats().counters().corrupt, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_store_times_out_then_is_skipped_then_probed() {
        let store = Arc::new(MapStore::default());
        let l2 = Arc::new(L2::new(Arc::new(store.clone()), policy()));
        let c = l2.for_backend("a");
        let k = c.key(&call_key("/x"));
        store.hang.store(true, Relaxed);
        assert!(c.get(&k, Duration::from_secs(1)).await.is_none());
        assert!(c.get(&k, Duration::from_secs(1)).await.is_none());
        assert_eq!(
            c.stats().counters().errors,
            2,
            "two timeouts open the breaker"
        );
        for _ in 0..10 {
            assert!(c.get(&k, Duration::from_secs(1)).await.is_none());
        }
        assert_eq!(c.stats().counters().skipped, 10);
        assert_eq!(store.sent.load(Relaxed), 2, "skipped reads are not sent");
        store.hang.store(false, Relaxed);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            c.get(&k, Duration::from_secs(1)).await.is_none(),
            "the probe: a plain miss"
        );
        assert!(c.get(&k, Duration::from_secs(1)).await.is_none());
        let n = c.stats().counters();
        assert_eq!((n.misses, n.errors, n.skipped), (2, 2, 10), "closed again");
    }
}
