//! A provider's keys over time ([`KeyCache`]): fixed (inline, PEM, HMAC) or a JWK set fetched
//! from a URL — one cache per URL, shared by every provider and route that names it; fetched
//! before the gateway is ready, refreshed in the background by the answer's `max-age` within
//! `refresh.min`..`refresh.max`, and once more (single-flight, at most every
//! `refresh.unknown_kid_cooldown`) when a token names a `kid` it lacks. A failed fetch keeps
//! the last good keys.

use crate::error::{FetchError, KeysError};
use crate::keys::KeySet;
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// A fetched JWK set document and how long its server says it stays fresh.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The document.
    pub body: Bytes,
    /// `Cache-Control: max-age`, when given.
    pub max_age: Option<Duration>,
}

/// A fetch in flight.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<Fetched, FetchError>> + Send>>;

/// How JWK sets are fetched (the gateway's: [`HttpFetch`]; tests count theirs).
pub trait Fetch: Send + Sync {
    /// GET `url` within `timeout`, reading at most `max_bytes`.
    fn fetch(&self, url: &str, timeout: Duration, max_bytes: usize) -> FetchFuture;
}

/// When a JWK set is fetched (from `refresh:`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Schedule {
    pub(crate) min: Duration,
    pub(crate) max: Duration,
    pub(crate) cooldown: Duration,
    pub(crate) timeout: Duration,
    pub(crate) max_bytes: usize,
}

/// Where the keys come from.
enum Source {
    Fixed,
    Url {
        url: String,
        schedule: Schedule,
        fetch: Arc<dyn Fetch>,
    },
}

/// Counters and the last error, for the status endpoint and the metrics.
#[derive(Debug, Clone, Default)]
pub struct KeyStatus {
    /// The JWKS URL (`None` for fixed keys).
    pub url: Option<String>,
    /// Keys in use.
    pub keys: usize,
    /// Keys of the document that were not taken (unsupported type, `oct`, bad parameters).
    pub skipped_keys: usize,
    /// When the keys in use were loaded.
    pub loaded_at: Option<SystemTime>,
    /// Successful fetches.
    pub fetches: u64,
    /// Failed fetches.
    pub failures: u64,
    /// Fetches made for an unknown `kid`.
    pub unknown_kid_fetches: u64,
    /// The last fetch's error, while the last fetch failed.
    pub last_error: Option<String>,
}

/// One provider's (or one URL's) keys.
pub(crate) struct KeyCache {
    source: Source,
    keys: ArcSwapOption<KeySet>,
    /// Bumped by every successful load.
    generation: AtomicU64,
    /// Single-flight of fetches; holds when the last one started.
    gate: tokio::sync::Mutex<Option<Instant>>,
    status: Mutex<KeyStatus>,
    started: AtomicBool,
}

impl KeyCache {
    /// Keys given in the config: loaded from the start.
    pub(crate) fn fixed(keys: KeySet) -> KeyCache {
        let status = KeyStatus {
            keys: keys.keys.len(),
            skipped_keys: keys.skipped,
            loaded_at: Some(SystemTime::now()),
            ..KeyStatus::default()
        };
        KeyCache {
            source: Source::Fixed,
            keys: ArcSwapOption::from_pointee(keys),
            generation: AtomicU64::new(1),
            gate: tokio::sync::Mutex::new(None),
            status: Mutex::new(status),
            started: AtomicBool::new(true),
        }
    }

    /// A JWK set at `url`: no keys until the first fetch ([`KeyCache::start`]).
    pub(crate) fn url(url: String, schedule: Schedule, fetch: Arc<dyn Fetch>) -> KeyCache {
        let status = KeyStatus {
            url: Some(fanout_config::shown_url(&url).into_owned()),
            ..KeyStatus::default()
        };
        KeyCache {
            source: Source::Url {
                url,
                schedule,
                fetch,
            },
            keys: ArcSwapOption::empty(),
            generation: AtomicU64::new(0),
            gate: tokio::sync::Mutex::new(None),
            status: Mutex::new(status),
            started: AtomicBool::new(false),
        }
    }

    /// The URL and schedule (a reload keeps a cache whose are equal).
    pub(crate) fn same_source(&self, url: &str, schedule: &Schedule) -> bool {
        matches!(&self.source, Source::Url { url: u, schedule: s, .. } if u == url && s == schedule)
    }

    /// The keys in use (`None` until the first successful load).
    pub(crate) fn snapshot(&self) -> Option<Arc<KeySet>> {
        self.keys.load_full()
    }

    /// Which load the keys in use come from.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(crate) fn status(&self) -> KeyStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Fetch now (the caller holds the gate, `last` is its state): new keys replace the old
    /// ones only when they parse. Returns the `max-age` of a successful fetch.
    async fn fetch_locked(
        &self,
        last: &mut Option<Instant>,
    ) -> Result<Option<Duration>, KeysError> {
        let Source::Url {
            url,
            schedule,
            fetch,
        } = &self.source
        else {
            return Ok(None);
        };
        *last = Some(Instant::now());
        let got = fetch
            .fetch(url, schedule.timeout, schedule.max_bytes)
            .await
            .map_err(KeysError::from)
            .and_then(|f| Ok((KeySet::from_jwks(&f.body)?, f.max_age)));
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        match got {
            Ok((keys, max_age)) => {
                st.fetches += 1;
                st.keys = keys.keys.len();
                st.skipped_keys = keys.skipped;
                st.loaded_at = Some(SystemTime::now());
                st.last_error = None;
                self.keys.store(Some(Arc::new(keys)));
                self.generation.fetch_add(1, Ordering::AcqRel);
                Ok(max_age)
            }
            Err(e) => {
                st.failures += 1;
                st.last_error = Some(e.to_string());
                tracing::warn!(target: "fanout::auth", url = %fanout_config::shown_url(url), error = %e, "JWK set fetch failed; the last good keys stay in use");
                Err(e)
            }
        }
    }

    /// A token named a `kid` the keys in use (of generation `seen`) lack: fetch once unless
    /// another fetch has happened since `seen` or one started less than the cooldown ago.
    /// Concurrent callers wait for the one fetch. True when the keys changed since `seen`.
    pub(crate) async fn refresh_for_unknown_kid(&self, seen: u64) -> bool {
        let Source::Url { schedule, .. } = &self.source else {
            return false;
        };
        let mut last = self.gate.lock().await;
        if self.generation() != seen {
            return true;
        }
        if last.is_some_and(|t| t.elapsed() < schedule.cooldown) {
            return false;
        }
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unknown_kid_fetches += 1;
        self.fetch_locked(&mut last).await.is_ok() && self.generation() != seen
    }

    /// The first load and the background refresh: called once per cache (later calls do
    /// nothing). Returns when the first fetch is done: `Some(url)` when it failed (it is
    /// retried in the background).
    pub(crate) async fn start(self: &Arc<Self>) -> Option<String> {
        if self.started.swap(true, Ordering::AcqRel) {
            return None;
        }
        let Source::Url { schedule, url, .. } = &self.source else {
            return None;
        };
        let first = {
            let mut last = self.gate.lock().await;
            self.fetch_locked(&mut last).await
        };
        let failed = first
            .is_err()
            .then(|| fanout_config::shown_url(url).into_owned());
        let schedule = schedule.clone();
        let weak = Arc::downgrade(self);
        tokio::spawn(refresh_loop(weak, schedule, first.map_err(|_| ())));
        failed
    }
}

/// The wait before the next scheduled fetch after one that gave `last`.
fn next_wait(schedule: &Schedule, last: &Result<Option<Duration>, ()>) -> Duration {
    match last {
        Ok(max_age) => max_age
            .unwrap_or(schedule.max)
            .clamp(schedule.min, schedule.max.max(schedule.min)),
        Err(()) => schedule.cooldown,
    }
}

/// Refresh on schedule until the cache is dropped (its config replaced).
async fn refresh_loop(
    cache: Weak<KeyCache>,
    schedule: Schedule,
    mut last: Result<Option<Duration>, ()>,
) {
    loop {
        tokio::time::sleep(next_wait(&schedule, &last)).await;
        let Some(cache) = cache.upgrade() else {
            return;
        };
        let mut gate = cache.gate.lock().await;
        last = cache.fetch_locked(&mut gate).await.map_err(|_| ());
    }
}

/// The gateway's fetcher: HTTP/1.1 GET over plain TCP or TLS (webpki roots).
pub struct HttpFetch {
    client: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        http_body_util::Empty<Bytes>,
    >,
}

impl HttpFetch {
    /// A client (no connection is made until the first fetch).
    pub fn new() -> Result<HttpFetch, FetchError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| FetchError::Transport(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https);
        Ok(HttpFetch { client })
    }
}

impl Fetch for HttpFetch {
    fn fetch(&self, url: &str, timeout: Duration, max_bytes: usize) -> FetchFuture {
        let client = self.client.clone();
        let uri = url.parse::<http::Uri>();
        Box::pin(async move {
            let uri = uri.map_err(|e| FetchError::BadUrl(e.to_string()))?;
            let req = http::Request::get(uri)
                .header(http::header::ACCEPT, "application/json")
                .body(http_body_util::Empty::new())
                .map_err(|e| FetchError::BadUrl(e.to_string()))?;
            let work = async {
                use http_body_util::BodyExt;
                let resp = client
                    .request(req)
                    .await
                    .map_err(|e| FetchError::Transport(e.to_string()))?;
                if resp.status() != http::StatusCode::OK {
                    return Err(FetchError::Status(resp.status().as_u16()));
                }
                let max_age = resp
                    .headers()
                    .get_all(http::header::CACHE_CONTROL)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(max_age);
                let body = http_body_util::Limited::new(resp.into_body(), max_bytes)
                    .collect()
                    .await
                    .map_err(|e| {
                        if e.is::<http_body_util::LengthLimitError>() {
                            FetchError::TooLarge(max_bytes)
                        } else {
                            FetchError::Transport(e.to_string())
                        }
                    })?
                    .to_bytes();
                Ok(Fetched { body, max_age })
            };
            tokio::time::timeout(timeout, work)
                .await
                .map_err(|_| FetchError::Timeout(timeout))?
        })
    }
}

/// `max-age=N` of a `Cache-Control` value.
fn max_age(v: &str) -> Option<Duration> {
    v.split(',').find_map(|d| {
        let (k, n) = d.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("max-age")
            .then(|| n.trim().trim_matches('"').parse::<u64>().ok())
            .flatten()
            .map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_read_from_cache_control() {
        assert_eq!(
            max_age("public, max-age=300"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(max_age("no-cache"), None);
        assert_eq!(max_age("max-age=x"), None);
    }

    #[test]
    fn the_next_refresh_keeps_max_age_within_the_bounds() {
        let s = Schedule {
            min: Duration::from_secs(60),
            max: Duration::from_secs(3600),
            cooldown: Duration::from_secs(10),
            timeout: Duration::from_secs(2),
            max_bytes: 1024,
        };
        assert_eq!(next_wait(&s, &Ok(Some(Duration::from_secs(5)))), s.min);
        assert_eq!(
            next_wait(&s, &Ok(Some(Duration::from_secs(600)))),
            Duration::from_secs(600)
        );
        assert_eq!(next_wait(&s, &Ok(Some(Duration::from_secs(86400)))), s.max);
        assert_eq!(next_wait(&s, &Ok(None)), s.max);
        assert_eq!(next_wait(&s, &Err(())), s.cooldown);
    }
}
