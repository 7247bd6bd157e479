//! Named policies: a [`Policy`] decides each request's key locally (GCRA in a bounded
//! [`KeyTable`]) or in the shared Redis with a local fallback ([`Shared`]).

use crate::gcra::{Decision, Gcra};
use crate::table::{Full, KeyTable};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Why a decision in Redis failed (the policy then falls back).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within the policy's `redis.timeout`.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis or the connection failed.
    #[error("redis failed: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// The script answered something else than four integers.
    #[error("the rate-limit script answered {0} values instead of 4")]
    BadReply(usize),
}

/// What to do when Redis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Decide locally at the fleet share of the budget.
    Local,
    /// Refuse (fail closed).
    Deny,
}

/// A policy as the limiter needs it.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The policy's name (logs, Redis keys).
    pub name: String,
    /// Requests per second.
    pub per_second: f64,
    /// Burst.
    pub burst: u64,
    /// The key table's bound.
    pub max_keys: usize,
    /// `Some` for a policy shared through Redis.
    pub shared: Option<SharedSpec>,
}

/// A shared policy's use of Redis.
#[derive(Clone)]
pub struct SharedSpec {
    /// The connection.
    pub conn: Arc<dyn crate::redis::Connect>,
    /// The start of every key (`redis.key_prefix`).
    pub key_prefix: String,
    /// A decision's time limit.
    pub timeout: Duration,
    /// The share of the budget enforced alone.
    pub fleet_share: f64,
    /// What a failure does.
    pub on_failure: OnFailure,
    /// How long Redis is skipped after a failure.
    pub retry_after: Duration,
}

impl std::fmt::Debug for SharedSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSpec")
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("fleet_share", &self.fleet_share)
            .field("on_failure", &self.on_failure)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

/// A policy's counters (read by the metrics and the status endpoint).
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests allowed.
    pub allowed: AtomicU64,
    /// Requests refused.
    pub denied: AtomicU64,
    /// Decisions made by the local fallback (or refused by `on_failure: deny`) because Redis failed.
    pub fallback: AtomicU64,
    /// Redis decisions that failed or timed out.
    pub redis_errors: AtomicU64,
    /// Requests refused from the table of keys already denied, without asking Redis.
    pub denied_locally: AtomicU64,
}

/// The limiter's clock: nanoseconds since the policy was made (tokio's, so tests can pause it);
/// never 0 (0 is an empty table entry).
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos())
            .unwrap_or(u64::MAX / 2)
            .saturating_add(1)
    }
}

/// A local GCRA over a bounded table.
struct Local {
    gcra: Gcra,
    table: KeyTable,
}

impl Local {
    fn decide(&self, key: &[u8], now: u64) -> Decision {
        let h = self.table.hash(key);
        self.table.with(h, now, Full::Overflow, |tat| {
            let (t, d) = self.gcra.decide(*tat, now);
            if let Some(t) = t {
                *tat = t;
            }
            d
        })
    }
}

/// A policy shared through Redis, with its fallback and its table of keys already refused.
struct Shared {
    spec: SharedSpec,
    script: crate::redis::RedisGcra,
    fallback: Local,
    denied: KeyTable,
    /// 0: Redis is used; else the clock time until which it is skipped.
    open_until: AtomicU64,
}

/// One policy: its limit and its state.
pub struct Policy {
    name: String,
    gcra: Gcra,
    clock: Clock,
    local: Option<Local>,
    shared: Option<Shared>,
    counters: Counters,
}

/// A decision and the policy's rate, for the answer's headers.
#[derive(Debug, Clone, Copy)]
pub struct Verdict {
    /// The decision.
    pub decision: Decision,
    /// The burst (`q` of `RateLimit-Policy`).
    pub quota: u64,
    /// The time the burst takes to refill (`w`).
    pub window: Duration,
}

impl Policy {
    /// A policy from its spec.
    pub fn new(spec: &Spec) -> Policy {
        let gcra = Gcra::new(spec.per_second, spec.burst);
        let (local, shared) = match &spec.shared {
            None => (
                Some(Local {
                    gcra,
                    table: KeyTable::new(spec.max_keys),
                }),
                None,
            ),
            Some(s) => (
                None,
                Some(Shared {
                    spec: s.clone(),
                    script: crate::redis::RedisGcra::default(),
                    fallback: Local {
                        gcra: gcra.scaled(s.fleet_share),
                        table: KeyTable::new(spec.max_keys),
                    },
                    denied: KeyTable::new(spec.max_keys),
                    open_until: AtomicU64::new(0),
                }),
            ),
        };
        Policy {
            name: spec.name.clone(),
            gcra,
            clock: Clock(Instant::now()),
            local,
            shared,
            counters: Counters::default(),
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its burst (`q` of `RateLimit-Policy`).
    pub fn burst(&self) -> u64 {
        self.gcra.burst()
    }

    /// Its counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Keys held in memory (the local table, or the fallback's and the denied keys').
    pub fn keys(&self) -> usize {
        match (&self.local, &self.shared) {
            (Some(l), _) => l.table.len(),
            (_, Some(s)) => s.fallback.table.len() + s.denied.len(),
            _ => 0,
        }
    }

    /// Bytes those tables hold.
    pub fn table_bytes(&self) -> usize {
        match (&self.local, &self.shared) {
            (Some(l), _) => l.table.bytes(),
            (_, Some(s)) => s.fallback.table.bytes() + s.denied.bytes(),
            _ => 0,
        }
    }

    /// Decisions made on the overflow bucket (new keys while the table was full).
    pub fn overflowed(&self) -> u64 {
        match (&self.local, &self.shared) {
            (Some(l), _) => l.table.overflowed(),
            (_, Some(s)) => s.fallback.table.overflowed(),
            _ => 0,
        }
    }

    /// Whether the policy is shared through Redis.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Decide a request with `key` that costs `cost` units (a GraphQL operation's estimated
    /// cost) on a local policy; `None` for a shared one (not charged by cost).
    pub fn decide_cost(&self, key: &[u8], cost: u64) -> Option<Verdict> {
        let l = self.local.as_ref()?;
        let now = self.clock.now();
        let h = l.table.hash(key);
        let decision = l.table.with(h, now, Full::Overflow, |tat| {
            let (t, d) = l.gcra.decide_n(*tat, now, cost);
            if let Some(t) = t {
                *tat = t;
            }
            d
        });
        let c = if decision.allowed {
            &self.counters.allowed
        } else {
            &self.counters.denied
        };
        c.fetch_add(1, Ordering::Relaxed);
        Some(Verdict {
            decision,
            quota: self.gcra.burst(),
            window: self.gcra.window(),
        })
    }

    /// Decide one request with `key`. A local policy never waits; a shared one waits at most
    /// its `redis.timeout`, then falls back.
    pub async fn decide(&self, key: &[u8]) -> Verdict {
        let decision = match (&self.local, &self.shared) {
            (Some(l), _) => l.decide(key, self.clock.now()),
            (_, Some(s)) => self.decide_shared(s, key).await,
            _ => Decision {
                allowed: true,
                remaining: 0,
                reset: Duration::ZERO,
                retry_after: Duration::ZERO,
            },
        };
        let c = if decision.allowed {
            &self.counters.allowed
        } else {
            &self.counters.denied
        };
        c.fetch_add(1, Ordering::Relaxed);
        Verdict {
            decision,
            quota: self.gcra.burst(),
            window: self.gcra.window(),
        }
    }

    async fn decide_shared(&self, s: &Shared, key: &[u8]) -> Decision {
        let now = self.clock.now();
        // A key Redis refused is refused here until its retry time, without asking Redis.
        let h = s.denied.hash(key);
        let known = s.denied.with(h, now, Full::Forget, |until| {
            (*until > now).then(|| *until - now)
        });
        if let Some(wait) = known {
            self.counters.denied_locally.fetch_add(1, Ordering::Relaxed);
            return Decision {
                allowed: false,
                remaining: 0,
                reset: self.gcra.window(),
                retry_after: Duration::from_nanos(wait),
            };
        }
        let open_until = s.open_until.load(Ordering::Acquire);
        if open_until != 0 {
            // One request tries Redis again once the backoff is over; the others fall back.
            let retry = now + dur_ns(s.spec.retry_after);
            if now < open_until
                || s.open_until
                    .compare_exchange(open_until, retry, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                return self.fall_back(s, key, now);
            }
        }
        let rkey = redis_key(&s.spec.key_prefix, &self.name, key);
        let asked = tokio::time::timeout(
            s.spec.timeout,
            s.script.decide(&*s.spec.conn, &rkey, &self.gcra),
        )
        .await
        .unwrap_or(Err(StoreError::Timeout(s.spec.timeout)));
        match asked {
            Ok(d) => {
                if s.open_until.swap(0, Ordering::AcqRel) != 0 {
                    tracing::info!(policy = %self.name, "rate limit: redis answers again; the shared budget applies");
                }
                if !d.allowed && !d.retry_after.is_zero() {
                    let until = now.saturating_add(dur_ns(d.retry_after));
                    s.denied.with(h, now, Full::Forget, |v| *v = until);
                }
                d
            }
            Err(e) => {
                self.counters.redis_errors.fetch_add(1, Ordering::Relaxed);
                let until = self.clock.now().saturating_add(dur_ns(s.spec.retry_after));
                if s.open_until.swap(until, Ordering::AcqRel) == 0 {
                    tracing::warn!(
                        policy = %self.name,
                        error = %e,
                        on_failure = ?s.spec.on_failure,
                        "rate limit: redis failed; deciding without it for {:?}",
                        s.spec.retry_after
                    );
                }
                self.fall_back(s, key, now)
            }
        }
    }

    fn fall_back(&self, s: &Shared, key: &[u8], now: u64) -> Decision {
        self.counters.fallback.fetch_add(1, Ordering::Relaxed);
        match s.spec.on_failure {
            OnFailure::Local => s.fallback.decide(key, now),
            OnFailure::Deny => Decision {
                allowed: false,
                remaining: 0,
                reset: s.spec.retry_after,
                retry_after: s.spec.retry_after,
            },
        }
    }
}

fn dur_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 4)
}

/// Longest key kept as it is in a Redis key; longer ones (and keys that are not text) are
/// replaced by their SHA-256.
const MAX_PLAIN_KEY: usize = 128;

/// `PREFIX` `rl:` `POLICY` `:` `KEY`.
fn redis_key(prefix: &str, policy: &str, key: &[u8]) -> String {
    let mut out = format!("{prefix}rl:{policy}:");
    match std::str::from_utf8(key) {
        Ok(k) if k.len() <= MAX_PLAIN_KEY => out.push_str(k),
        _ => {
            use sha2::Digest;
            out.push_str("sha256:");
            for b in sha2::Sha256::digest(key) {
                out.push_str(&format!("{b:02x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(per_second: f64, burst: u64, max_keys: usize) -> Policy {
        Policy::new(&Spec {
            name: "p".into(),
            per_second,
            burst,
            max_keys,
            shared: None,
        })
    }

    async fn allowed(p: &Policy, key: &str, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            ok += usize::from(p.decide(key.as_bytes()).await.decision.allowed);
        }
        ok
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_gets_its_burst_then_the_rate_on_the_paused_clock() {
        let p = local(10.0, 3, 100);
        assert_eq!(allowed(&p, "a", 10).await, 3);
        let v = p.decide(b"a").await;
        assert!(!v.decision.allowed);
        assert_eq!(v.decision.retry_after, Duration::from_millis(100));
        assert_eq!((v.quota, v.window), (3, Duration::from_millis(300)));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(allowed(&p, "a", 10).await, 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(allowed(&p, "a", 10).await, 3);
        assert_eq!(p.counters().allowed.load(Ordering::Relaxed), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_limited_apart() {
        let p = local(1.0, 2, 100);
        assert_eq!(allowed(&p, "a", 5).await, 2);
        assert_eq!(allowed(&p, "b", 5).await, 2);
        assert_eq!(p.keys(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_whose_budget_refilled_leave_the_table() {
        let p = local(100.0, 1, 100);
        for i in 0..100 {
            allowed(&p, &i.to_string(), 1).await;
        }
        assert_eq!(p.keys(), 100);
        tokio::time::advance(Duration::from_secs(1)).await;
        // a full table makes room for the new key from the expired ones
        allowed(&p, "new", 1).await;
        assert_eq!(p.keys(), 1);
        assert_eq!(p.overflowed(), 0);
    }

    #[test]
    fn long_keys_are_hashed_in_redis() {
        assert_eq!(redis_key("f:", "p", b"1.2.3.4"), "f:rl:p:1.2.3.4");
        let long = redis_key("f:", "p", &[b'x'; 200]);
        assert!(
            long.starts_with("f:rl:p:sha256:") && long.len() == 14 + 64,
            "{long}"
        );
    }
}
