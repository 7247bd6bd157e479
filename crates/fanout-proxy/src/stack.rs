//! One backend's call stack, built from its config and read top to bottom: what a step's call
//! goes through on its way to the backend. Each layer is an `Arc<dyn Backend>` around the one
//! below; the protocol client (`HttpBackend`: HTTP/1.1, HTTP/2 and gRPC) is the bottom, so every
//! protocol gets the same layers.
//!
//! ```text
//!   cache        answers by call identity; stale on error only after retries failed; with
//!                `l2: true`, a miss in memory asks the shared Redis (`crate::l2`) first
//!   dedup        identical calls in flight share one (merged callers share one retried call)
//!   breaker      judges outcomes after retries: one bad replica (handled below by ejection +
//!                retry) does not open the whole backend's breaker; open → fail fast, no budget
//!   bulkhead     one slot per logical call through all its attempts and backoffs; its
//!                rejections are local: never retried, never counted by outlier ejection
//!   retry        every attempt goes through the balancer again: a retry lands on another
//!                address, ejected ones are skipped (like Envoy's retries above the balancer)
//!   hedge        an attempt may be hedged; a failed hedged attempt is retried as a whole
//!   rate limit   `rate_limit`: every attempt and hedged copy takes a slot; one past the burst
//!                waits for its slot within its time, or fails at once (`backend_rejected`)
//!   client       the protocol client: pool, TLS, P2C peak-EWMA balancer, outlier ejection
//! ```
//!
//! Every layer classifies outcomes with `fanout_layers::outcome::CallOutcome`.
//! The bottom is the client of the backend's protocol ([`fanout_protocol`]: one crate and one
//! line in [`crate::PROTOCOLS`] per protocol; docs/ARCHITECTURE.md, "How to add a backend
//! protocol").

use fanout_config::{Backend as BackendConfig, ConfigError};
use fanout_flow::Backend;
use fanout_layers::cache::{CachePolicy, CacheStats, Cached};
use fanout_layers::dedup::Dedup;
use fanout_layers::hedge::{Hedge, HedgeStats};
use fanout_layers::isolation::{Breaker, BreakerPolicy, BreakerView, Bulkhead};
use fanout_layers::l2::L2;
use fanout_layers::ratelimit::RateLimit;
use fanout_layers::retry::{Retry, RetryStats};
use fanout_layers::singleflight::Flights;
use fanout_protocol::ProtocolClient;
use fanout_protocol::Shared;
use http::HeaderName;
use std::sync::Arc;

/// A backend's stack, ready for the flow compiler, with handles to its layers' state.
pub struct Stack {
    /// The top of the stack: what steps call.
    pub service: Arc<dyn Backend>,
    /// The layers' counters and state.
    pub stats: StackStats,
}

/// Handles to a backend's layer state (balancer and addresses, breaker, retry, hedge, dedup and
/// cache counters), for `/__fanout/status` and the metrics.
#[derive(Clone)]
pub struct StackStats {
    /// The protocol client (HTTP: balancer and addresses; a database: its pool).
    pub client: Arc<dyn ProtocolClient>,
    /// The retry layer's counters, if retries are configured.
    pub retry: Option<Arc<RetryStats>>,
    /// The hedge layer's counters, if hedging is configured.
    pub hedge: Option<Arc<HedgeStats>>,
    /// The in-flight dedup table, if dedup is on.
    pub dedup: Option<Arc<Flights>>,
    /// The answer cache's counters, if the backend has a cache.
    pub cache: Option<Arc<CacheStats>>,
    /// The circuit breaker's state, if the backend has one.
    pub breaker: Option<BreakerView>,
}

/// Build backend `name`'s stack from its config, bottom up (the order is the one drawn above),
/// its client with what every backend's shares (`shared`: `defaults`, the deadline header);
/// `l2` is the gateway's shared Redis, if the config has one (used when `cache.l2` is set).
pub fn build(
    name: &str,
    b: &BackendConfig,
    shared: &Shared<'_>,
    l2: Option<&Arc<L2>>,
) -> Result<Stack, ConfigError> {
    let client = fanout_protocol::client(crate::PROTOCOLS, name, b, shared)?;
    let defaults = shared.defaults;
    let mut stats = StackStats {
        client: client.clone(),
        retry: None,
        hedge: None,
        dedup: None,
        cache: None,
        breaker: None,
    };
    let mut s: Arc<dyn Backend> = client.clone().service();
    if let Some(r) = &b.rate_limit {
        s = Arc::new(RateLimit::new(s, r.per_second(), r.burst_size()));
    }
    if let Some(h) = &b.hedge {
        let hedge = Hedge::new(s, h.into());
        stats.hedge = Some(hedge.stats());
        s = Arc::new(hedge);
    }
    if let Some(r) = &b.retry {
        let retry = Retry::new(s, r.into());
        stats.retry = Some(retry.stats());
        s = Arc::new(retry);
    }
    if let Some(max) = b.max_concurrency {
        s = Arc::new(Bulkhead::new(s, max));
    }
    if let Some(bc) = &b.breaker {
        let policy = BreakerPolicy {
            consecutive_failures: bc.consecutive_failures.max(1),
            failure_rate: bc.failure_rate,
            min_calls: bc.min_calls.max(1),
            window: bc.window.0,
            open_for: bc.open_for.0,
        };
        let breaker = Breaker::new(s, policy, name);
        stats.breaker = Some(breaker.view());
        s = Arc::new(breaker);
    }
    if b.dedup.unwrap_or(defaults.dedup) {
        let dedup = Dedup::new(s);
        stats.dedup = Some(dedup.flights());
        s = Arc::new(dedup);
    }
    if let Some(c) = &b.cache {
        let l2 = l2.filter(|_| c.l2).map(|l2| l2.for_backend(name));
        let cached = Cached::with_l2(s, CachePolicy::from(c), l2);
        stats.cache = Some(cached.stats());
        s = Arc::new(cached);
    }
    Ok(Stack { service: s, stats })
}

/// Whether backend `name`'s stack built from `new` would be the one built from `old`: the same
/// backend config, the same `defaults`, the same `server.deadline_header` (its client writes it)
/// and, when its cache uses Redis, the same `redis:` (everything [`build`] reads). A config
/// reload keeps such a stack with all its state.
pub fn unchanged(old: &fanout_config::Config, new: &fanout_config::Config, name: &str) -> bool {
    let (Some(a), Some(b)) = (old.backends.get(name), new.backends.get(name)) else {
        return false;
    };
    let uses_redis = b.cache.as_ref().is_some_and(|c| c.l2);
    // `defaults.rate_limit` names the routes' limits, nothing of a backend's stack.
    let mut defaults = old.defaults.clone();
    defaults.rate_limit.clone_from(&new.defaults.rate_limit);
    a == b
        && defaults == new.defaults
        && old.server.deadline_header == new.server.deadline_header
        && (!uses_redis || old.redis == new.redis)
}

/// `server.deadline_header` as a header name: read from clients (the lifecycle's deadline) and
/// written on every HTTP call by its client ([`Shared::deadline_header`]).
pub fn deadline_header(cfg: &fanout_config::Config) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(cfg.server.deadline_header.as_bytes()).map_err(|_| ConfigError {
        path: None,
        file: cfg.file.clone(),
        pos: None,
        message: format!(
            "server.deadline_header `{}` is not a valid header name",
            cfg.server.deadline_header
        ),
        hint: None,
    })
}

impl StackStats {
    /// `{strategy, addresses, retry, hedge, dedup}`.
    pub fn status_json(&self) -> serde_json::Value {
        let mut v = self.client.status_json();
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "retry".into(),
                serde_json::to_value(self.retry.as_ref().map(|r| r.counters())).unwrap_or_default(),
            );
            o.insert(
                "hedge".into(),
                serde_json::to_value(self.hedge.as_ref().map(|h| h.counters())).unwrap_or_default(),
            );
            o.insert(
                "dedup".into(),
                serde_json::to_value(self.dedup.as_ref().map(|d| d.counters())).unwrap_or_default(),
            );
        }
        v
    }
}
