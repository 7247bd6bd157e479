//! The rate-limit stage (docs/config.md#rate-limits): each of the route's policies
//! (`rate_limit:`, else `defaults.rate_limit`) decides the request by its key — a jq expression
//! over `$request` without the body, which is not read yet (with `$request.auth` as the
//! authentication stage verified it, and `$request.client.address` as trusted proxies resolve
//! it) — in `fanout-ratelimit`. Over a limit: 429 `rate_limited` with `Retry-After` and the
//! draft-09 `RateLimit-Policy` / `RateLimit` fields.

use crate::metrics::{MetricType, Out, Value};
use crate::{BuildCx, EdgeStage, Registration, Rejection, RequestHead, RouteKind, Step};
use fanout_config::ratelimit::{RateLimitOnFailure, RateLimitStore};
use fanout_config::{Config, ConfigError, ConfigErrors};
use fanout_expr::request::RequestUse;
use fanout_expr::{Expr, Val};
use fanout_ratelimit::{OnFailure, Policy, SharedSpec, Spec, Verdict};
use http::{HeaderName, HeaderValue, StatusCode};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The stage's line in the registry. Its config is `rate_limits:` and each route's
/// `rate_limit:`, not a section under `stages:`.
pub const STAGE: Registration = Registration {
    name: "rate_limits",
    section: false,
    codes: &["rate_limited", "bad_query", "bad_header"],
    build,
    schema: None,
};

/// One policy as the stage runs it.
struct Compiled {
    name: Arc<str>,
    key: Expr,
    /// The config it was built from (a reload keeps its state while this is equal).
    config: fanout_config::ratelimit::RateLimitPolicy,
    policy: Arc<Policy>,
    /// `"NAME"` as a structured-field string.
    sf_name: String,
    /// What `fanout explain` says of it.
    described: String,
}

/// The rate limits of one loaded config.
struct RateLimits {
    /// The policies, in config order.
    policies: Vec<Compiled>,
    /// By route index: the route's policies (indices into `policies`) and what their keys read.
    routes: Vec<(Vec<usize>, RequestUse)>,
    /// The Redis connection of the shared policies (kept by a reload that keeps `redis:`).
    conn: Option<Arc<dyn fanout_ratelimit::redis::Connect>>,
    warnings: Vec<ConfigError>,
}

/// `name` as a structured-field string (`"…"`, `\` and `"` escaped, other characters outside
/// printable ASCII dropped).
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => {}
        }
    }
    out.push('"');
    out
}

/// What `fanout explain` says of a policy: rate, burst, key, store.
fn describe(name: &str, p: &fanout_config::ratelimit::RateLimitPolicy) -> String {
    let store = match (p.store, p.redis.on_failure) {
        (RateLimitStore::Local, _) => "local".to_string(),
        (RateLimitStore::Redis, RateLimitOnFailure::Local) => format!(
            "shared in redis; without it {} of the budget locally",
            p.redis.fleet_share
        ),
        (RateLimitStore::Redis, RateLimitOnFailure::Deny) => {
            "shared in redis; without it every request refused".to_string()
        }
    };
    format!(
        "rate limit {name}: {}, burst {}, per `{}` ({store}); over it: 429 rate_limited",
        p.rate.value,
        p.burst_size(),
        p.key.value
    )
}

/// The rate limits of the config: every policy's key compiled (errors at their line:col), the
/// policies of each route resolved; a policy whose config (and `redis:`) did not change keeps
/// its state from the stage it replaces.
fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let cfg = cx.config;
    let prev = cx
        .prev
        .and_then(|p| p.as_any().downcast_ref::<RateLimits>());
    let same_redis = cx.prev_config.is_some_and(|p| p.redis == cfg.redis);
    let mut errs = Vec::new();
    let mut conn = prev.filter(|_| same_redis).and_then(|r| r.conn.clone());
    let mut policies = Vec::with_capacity(cfg.rate_limits.len());
    for (name, p) in &cfg.rate_limits {
        let key = match Expr::compile(&p.key.value, &["request"]) {
            Ok(e) => e,
            Err(e) => {
                let pos = cfg.pos_in_scalar(p.key.pos, &p.key.value, e.offset);
                errs.push(
                    ConfigError::at(pos, format!("rate_limits.{name}.key: {}", e.message))
                        .hint("a jq expression over `$request`, e.g. `$request.headers[\"x-api-key\"]`")
                        .in_file(&cfg.file),
                );
                continue;
            }
        };
        let kept = prev
            .filter(|_| same_redis)
            .and_then(|r| r.policies.iter().find(|c| *c.name == **name))
            .filter(|c| c.config == *p)
            .map(|c| c.policy.clone());
        let policy = match kept {
            Some(k) => k,
            None => {
                let shared = match (p.store, &cfg.redis) {
                    (RateLimitStore::Redis, Some(r)) => {
                        let c = match &conn {
                            Some(c) => c.clone(),
                            None => match (cx.redis)(r) {
                                Ok(c) => {
                                    conn = Some(c.clone());
                                    c
                                }
                                Err(e) => {
                                    errs.push(e.in_file(&cfg.file));
                                    continue;
                                }
                            },
                        };
                        Some(SharedSpec {
                            conn: c,
                            key_prefix: r.key_prefix.clone(),
                            timeout: p.redis.timeout.0,
                            fleet_share: p.redis.fleet_share,
                            on_failure: match p.redis.on_failure {
                                RateLimitOnFailure::Local => OnFailure::Local,
                                RateLimitOnFailure::Deny => OnFailure::Deny,
                            },
                            retry_after: p.redis.retry_after.0,
                        })
                    }
                    _ => None,
                };
                Arc::new(Policy::new(&Spec {
                    name: name.clone(),
                    per_second: p.per_second(),
                    burst: p.burst_size(),
                    max_keys: p.max_keys,
                    shared,
                }))
            }
        };
        policies.push(Compiled {
            name: name.as_str().into(),
            key,
            config: p.clone(),
            policy,
            sf_name: sf_string(name),
            described: describe(name, p),
        });
    }
    let routes = (0..cfg.routes.len())
        .map(|i| {
            let mut reads = RequestUse::default();
            let ids: Vec<usize> = cfg
                .route_rate_limits(i)
                .into_iter()
                .filter_map(|n| policies.iter().position(|c| &*c.name == n))
                .collect();
            for &id in &ids {
                if let Some(c) = policies.get(id) {
                    reads.add(&c.key.request_use());
                }
            }
            reads.body = false;
            (ids, reads)
        })
        .collect();
    if !errs.is_empty() {
        return Err(ConfigErrors(errs));
    }
    let warnings = warnings(cfg, &policies);
    Ok(Some(Arc::new(RateLimits {
        policies,
        routes,
        conn,
        warnings,
    })))
}

fn warnings(cfg: &Config, policies: &[Compiled]) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for c in policies {
        let reads = c.key.request_use();
        let at = format!("rate_limits.{}.key", c.name);
        if reads.body {
            out.push(
                ConfigError::at_path(
                    at.clone(),
                    format!(
                        "warning: rate_limits.{}.key reads $request.body, which is null when the limit decides (before the body is read): that part of the key is the same for every request",
                        c.name
                    ),
                )
                .hint("key on what arrives before the body: a header, the client address, $request.auth"),
            );
        }
        if reads.auth {
            let anonymous: Vec<String> = (0..cfg.routes.len())
                .filter(|&i| cfg.route_rate_limits(i).contains(&&*c.name))
                .filter(|&i| {
                    cfg.routes
                        .get(i)
                        .and_then(|r| r.auth.as_ref())
                        .or(cfg.defaults.auth.as_ref())
                        .is_none_or(|a| a.mode == fanout_config::auth::AuthMode::None)
                })
                .filter_map(|i| cfg.routes.get(i))
                .map(|r| format!("{} {}", r.method.value.to_ascii_uppercase(), r.path.value))
                .collect();
            if !anonymous.is_empty() {
                out.push(
                    ConfigError::at_path(
                        at,
                        format!(
                            "warning: rate_limits.{}.key reads $request.auth, which is null on {} (no `auth`): every request there shares one budget",
                            c.name,
                            anonymous.join(", ")
                        ),
                    )
                    .hint("give those routes `auth:`, or key them on something else (`$request.client.address`)"),
                );
            }
        }
    }
    fanout_config::locate(&mut out, &cfg.source);
    for w in &mut out {
        w.file = cfg.file.clone();
    }
    out
}

/// `Retry-After`, `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-09):
/// the policy's quota (its burst) and window (the time the burst takes to refill), what is left
/// (0) and the seconds until a request is allowed again.
fn refusal(c: &Compiled, verdict: &Verdict) -> Rejection {
    let secs = |d: std::time::Duration| d.as_secs_f64().ceil().max(1.0) as u64;
    let d = &verdict.decision;
    let retry = secs(d.retry_after);
    let mut r = Rejection::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("rate limit `{}` exceeded; retry after {retry} s", c.name),
    )
    .header(http::header::RETRY_AFTER, HeaderValue::from(retry));
    let policy = format!(
        "{};q={};w={}",
        c.sf_name,
        verdict.quota,
        secs(verdict.window)
    );
    let state = format!("{};r={};t={retry}", c.sf_name, d.remaining);
    for (name, v) in [("ratelimit-policy", policy), ("ratelimit", state)] {
        if let Ok(v) = HeaderValue::from_str(&v) {
            r = r.header(HeaderName::from_static(name), v);
        }
    }
    r
}

impl RateLimits {
    /// Every policy of the route decides by its key; the first that refuses ends the request.
    async fn decide(&self, head: &mut RequestHead<'_>) -> Result<(), Rejection> {
        let Some((ids, reads)) = self.routes.get(head.route.index) else {
            return Ok(());
        };
        // `$request` without its body, as the flow's is built (a part the keys read that is not
        // UTF-8 is refused the same way: 400, never replaced).
        let request = head.request_val(reads)?;
        let mut key = Vec::new();
        for &id in ids {
            let Some(c) = self.policies.get(id) else {
                continue;
            };
            key.clear();
            match c.key.eval(&Val::Null, |_| request.clone()) {
                Ok(Val::TStr(s) | Val::BStr(s)) => key.extend_from_slice(&s),
                Ok(v) => fanout_expr::json::write(&v, &mut key),
                // A key that does not evaluate is counted under one key of its own.
                Err(e) => {
                    tracing::debug!(policy = %c.name, error = %e.0, "rate limit key failed");
                    key.extend_from_slice(b"\0key-error");
                }
            }
            let verdict = c.policy.decide(&key).await;
            if !verdict.decision.allowed {
                return Err(refusal(c, &verdict));
            }
        }
        Ok(())
    }
}

/// One counter of a policy.
type CounterOf = fn(&fanout_ratelimit::Counters) -> &std::sync::atomic::AtomicU64;

impl EdgeStage for RateLimits {
    fn applies(&self, route: usize, _: RouteKind) -> bool {
        self.routes
            .get(route)
            .is_some_and(|(ids, _)| !ids.is_empty())
    }

    fn on_request<'a>(&'a self, head: &'a mut RequestHead<'_>) -> Step<'a> {
        Step::Wait(Box::pin(self.decide(head)))
    }

    /// `{name: {allowed, denied, fallback, redis_errors, denied_locally, keys, table_bytes,
    /// overflow, store}}`.
    fn status_json(&self) -> Option<serde_json::Value> {
        let m: serde_json::Map<String, serde_json::Value> = self
            .policies
            .iter()
            .map(|c| {
                let p = &c.policy;
                let n = p.counters();
                (
                    c.name.to_string(),
                    serde_json::json!({
                        "store": if p.is_shared() { "redis" } else { "local" },
                        "allowed": n.allowed.load(Ordering::Relaxed),
                        "denied": n.denied.load(Ordering::Relaxed),
                        "fallback": n.fallback.load(Ordering::Relaxed),
                        "redis_errors": n.redis_errors.load(Ordering::Relaxed),
                        "denied_locally": n.denied_locally.load(Ordering::Relaxed),
                        "keys": p.keys(),
                        "table_bytes": p.table_bytes(),
                        "overflow": p.overflowed(),
                    }),
                )
            })
            .collect();
        Some(serde_json::Value::Object(m))
    }

    /// Decisions, fallbacks, Redis errors, the key tables.
    fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        use MetricType::{Counter, Gauge};
        use std::sync::atomic::Ordering::Relaxed;
        let p = &self.policies;
        out.family(
            "fanout_ratelimit_decisions",
            "Rate-limit decisions, by policy and decision (allowed, denied)",
            Counter,
            p.iter().flat_map(|c| {
                let n = c.policy.counters();
                [("allowed", &n.allowed), ("denied", &n.denied)].map(|(d, v)| {
                    (
                        [("policy", &*c.name), ("decision", d)],
                        Value::Counter(v.load(Relaxed)),
                    )
                })
            }),
        )?;
        let counters: [(&str, &str, CounterOf); 3] = [
            (
                "fanout_ratelimit_fallback",
                "Decisions of a `store: redis` policy made without Redis (local fallback or on_failure: deny) because Redis failed or was skipped after a failure",
                |n| &n.fallback,
            ),
            (
                "fanout_ratelimit_redis_errors",
                "Rate-limit decisions in Redis that failed or timed out",
                |n| &n.redis_errors,
            ),
            (
                "fanout_ratelimit_denied_locally",
                "Requests of a key Redis had refused, refused again before its retry time without asking Redis",
                |n| &n.denied_locally,
            ),
        ];
        for (name, help, get) in counters {
            out.family(
                name,
                help,
                Counter,
                p.iter().map(|c| {
                    (
                        [("policy", &*c.name)],
                        Value::Counter(get(c.policy.counters()).load(Relaxed)),
                    )
                }),
            )?;
        }
        out.family(
            "fanout_ratelimit_overflow",
            "Decisions of new keys made on a policy's shared overflow bucket because its key table was full (max_keys)",
            Counter,
            p.iter()
                .map(|c| ([("policy", &*c.name)], Value::Counter(c.policy.overflowed()))),
        )?;
        out.family(
            "fanout_ratelimit_keys",
            "Keys held in a policy's key tables",
            Gauge,
            p.iter()
                .map(|c| ([("policy", &*c.name)], Value::Gauge(c.policy.keys() as f64))),
        )?;
        out.family(
            "fanout_ratelimit_table_bytes",
            "Bytes held by a policy's key tables",
            Gauge,
            p.iter().map(|c| {
                (
                    [("policy", &*c.name)],
                    Value::Gauge(c.policy.table_bytes() as f64),
                )
            }),
        )
    }

    fn explain(&self, route: usize) -> Vec<String> {
        let Some((ids, _)) = self.routes.get(route) else {
            return Vec::new();
        };
        ids.iter()
            .filter_map(|&i| self.policies.get(i))
            .map(|c| c.described.clone())
            .collect()
    }

    fn warnings(&self) -> Vec<ConfigError> {
        self.warnings.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_structured_field_strings() {
        assert_eq!(sf_string("per-user"), "\"per-user\"");
        assert_eq!(sf_string("a\"b"), "\"a\\\"b\"");
    }
}
