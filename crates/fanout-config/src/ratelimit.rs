//! Rate limits (`rate_limits:`): named policies — a rate, a burst, a key over `$request`, where
//! their state lives — that routes (`rate_limit:`) and `defaults.rate_limit` apply. The limiter
//! itself is the `fanout-ratelimit` crate; the key expression is compiled by the gateway.

use crate::{Config, ConfigError, Dur, ExprSrc, Located};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// The named rate-limit policies, by name.
pub type RateLimits = IndexMap<String, RateLimitPolicy>;

/// One rate-limit policy: requests with the same key share a budget of `rate` with bursts of up
/// to `burst` (GCRA). Over it: 429 `rate_limited` with `Retry-After`, `RateLimit-Policy` and
/// `RateLimit`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitPolicy {
    /// The sustained rate: `N/s`, `N/min` or `N/h` (N a positive number, e.g. `100/s`, `0.5/s`).
    pub rate: Located<String>,
    /// Requests that may arrive at once above the sustained rate's spacing (the bucket's
    /// size), at least 1. Default: one second of `rate` (at least 1).
    pub burst: Option<u64>,
    /// jq over `$request` giving the key requests are counted by (a string; a number or other
    /// value is used by its JSON text; `null` counts the request under the key `null`). Any part
    /// of `$request` can be read: a header, a path parameter, the client address
    /// (`$request.client.address`). Default `$request.client.address`.
    #[serde(default = "default_key")]
    pub key: ExprSrc,
    /// Where the state lives: `local` (this instance) or `redis` (the top-level `redis:`,
    /// shared by every instance). Default `local`.
    #[serde(default)]
    pub store: RateLimitStore,
    /// With `store: redis`: the command's time limit, the share of the budget an instance
    /// enforces alone when Redis fails, and what it does then.
    #[serde(default)]
    pub redis: RateLimitRedis,
    /// Most keys kept in memory by this instance (the local table; with `store: redis`, the
    /// fallback's table and the table of keys already denied). Keys whose budget is full again
    /// are dropped first; when the table is still full, new keys share one overflow bucket
    /// (counted in `fanout_ratelimit_overflow_total`). Default 100000.
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
}

/// A backend's rate limit (`backends.NAME.rate_limit`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendRateLimit {
    /// Calls per second: `N/s`, `N/min` or `N/h`.
    pub rate: Located<String>,
    /// Calls that may go at once above the rate's spacing, at least 1. Default: one second of
    /// `rate` (at least 1).
    pub burst: Option<u64>,
}

impl BackendRateLimit {
    /// Calls per second (1 if `rate` does not parse; [`check`] refuses that).
    pub fn per_second(&self) -> f64 {
        parse_rate(&self.rate.value).unwrap_or(1.0)
    }

    /// The burst: as set, or one second of the rate (at least 1).
    pub fn burst_size(&self) -> u64 {
        self.burst
            .unwrap_or_else(|| self.per_second().ceil().max(1.0) as u64)
            .max(1)
    }
}

/// Where a policy's state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitStore {
    /// In this instance's memory: each instance enforces the whole budget.
    #[default]
    Local,
    /// In the shared Redis (`redis:`), updated atomically per decision by a server-side script:
    /// the instances together enforce one budget.
    Redis,
}

/// What an instance does when Redis fails for a `store: redis` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitOnFailure {
    /// Decide locally at `fleet_share` of the budget.
    #[default]
    Local,
    /// Refuse every request of the policy (429) until Redis answers again (fail closed).
    Deny,
}

/// A `store: redis` policy's use of Redis.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitRedis {
    /// Time limit of one decision in Redis; past it the instance falls back
    /// (`on_failure`). Default 5ms.
    pub timeout: Dur,
    /// Share of the policy's rate and burst an instance enforces alone while Redis fails
    /// (e.g. 0.5 with two instances), in (0, 1]. Default 1.
    pub fleet_share: f64,
    /// `local` (decide at `fleet_share`) or `deny` (fail closed: 429). Default `local`.
    pub on_failure: RateLimitOnFailure,
    /// After a failure, Redis is skipped this long before one request tries it again.
    /// Default 1s.
    pub retry_after: Dur,
}

impl Default for RateLimitRedis {
    fn default() -> Self {
        RateLimitRedis {
            timeout: Dur::millis(5),
            fleet_share: 1.0,
            on_failure: RateLimitOnFailure::Local,
            retry_after: Dur::secs(1),
        }
    }
}

fn default_key() -> ExprSrc {
    Located::unknown("$request.client.address".to_string())
}

fn default_max_keys() -> usize {
    100_000
}

/// Largest `max_keys`.
pub const MAX_RATE_LIMIT_KEYS: usize = 100_000_000;

/// A rate in requests per second from `N/s`, `N/min`, `N/h` (`None` when it is not one, or not
/// positive and finite).
pub fn parse_rate(text: &str) -> Option<f64> {
    let (n, unit) = text.trim().split_once('/')?;
    let n: f64 = n.trim().parse().ok()?;
    let per = match unit.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        _ => return None,
    };
    let r = n / per;
    (r.is_finite() && r > 0.0).then_some(r)
}

impl RateLimitPolicy {
    /// Requests per second (`rate` checked by [`check`]; 1 if it does not parse).
    pub fn per_second(&self) -> f64 {
        parse_rate(&self.rate.value).unwrap_or(1.0)
    }

    /// The burst: as set, or one second of the rate (at least 1).
    pub fn burst_size(&self) -> u64 {
        self.burst
            .unwrap_or_else(|| self.per_second().ceil().max(1.0) as u64)
            .max(1)
    }
}

/// The checks of `rate_limits:` and of every name `rate_limit:` lists.
pub(crate) fn check(cfg: &Config, errs: &mut Vec<ConfigError>) {
    let bad = |path: String, msg: String, hint: &str| ConfigError::at_path(path, msg).hint(hint);
    for (name, p) in &cfg.rate_limits {
        // A shared policy's counters live under `PREFIX:rl:NAME:KEY` in Redis: a `:` in the
        // name could make two policies' keys meet.
        if name.is_empty() || name.contains(':') || name.chars().any(char::is_control) {
            errs.push(bad(
                format!("rate_limits.{name}"),
                format!("rate limit policy name `{}` may not be empty or hold `:` or control characters", name.escape_debug()),
                "the name is part of the policy's Redis keys: use letters, digits, `-`, `_` or `.`",
            ));
        }
        if parse_rate(&p.rate.value).is_none() {
            errs.push(
                ConfigError::at(
                    p.rate.pos,
                    format!("rate_limits.{name}.rate `{}` is not a rate", p.rate.value),
                )
                .hint("write `N/s`, `N/min` or `N/h` with N > 0, e.g. `100/s`"),
            );
        }
        if p.burst == Some(0) {
            errs.push(bad(
                format!("rate_limits.{name}.burst"),
                format!("rate_limits.{name}.burst must be at least 1"),
                "e.g. `burst: 20`",
            ));
        }
        if p.max_keys == 0 || p.max_keys > MAX_RATE_LIMIT_KEYS {
            errs.push(bad(
                format!("rate_limits.{name}.max_keys"),
                format!("rate_limits.{name}.max_keys must be in 1..={MAX_RATE_LIMIT_KEYS}"),
                "default 100000",
            ));
        }
        let share = p.redis.fleet_share;
        if !(share > 0.0 && share <= 1.0) {
            errs.push(bad(
                format!("rate_limits.{name}.redis.fleet_share"),
                format!("rate_limits.{name}.redis.fleet_share must be in (0, 1]"),
                "e.g. 0.5 with two instances",
            ));
        }
        if p.redis.timeout.0.is_zero() || p.redis.retry_after.0.is_zero() {
            errs.push(bad(
                format!("rate_limits.{name}.redis"),
                format!("rate_limits.{name}.redis.timeout and retry_after must be positive"),
                "defaults: timeout 5ms, retry_after 1s",
            ));
        }
        if p.store == RateLimitStore::Redis && cfg.redis.is_none() {
            errs.push(bad(
                format!("rate_limits.{name}.store"),
                format!("rate_limits.{name}: `store: redis` needs a top-level `redis:` section"),
                "add `redis: {url: \"${REDIS_URL}\"}` or use `store: local`",
            ));
        }
    }
    for (name, b) in &cfg.backends {
        let Some(r) = &b.rate_limit else { continue };
        if parse_rate(&r.rate.value).is_none() {
            errs.push(
                ConfigError::at(
                    r.rate.pos,
                    format!(
                        "backends.{name}.rate_limit.rate `{}` is not a rate",
                        r.rate.value
                    ),
                )
                .hint("write `N/s`, `N/min` or `N/h` with N > 0, e.g. `200/s`"),
            );
        }
        if r.burst == Some(0) {
            errs.push(bad(
                format!("backends.{name}.rate_limit.burst"),
                format!("backends.{name}.rate_limit.burst must be at least 1"),
                "e.g. `burst: 10`",
            ));
        }
    }
    let known: Vec<&str> = cfg.rate_limits.keys().map(String::as_str).collect();
    let lists = cfg.defaults.rate_limit.iter().chain(
        cfg.routes
            .iter()
            .flat_map(|r| r.rate_limit.iter().flatten()),
    );
    for n in lists {
        if !cfg.rate_limits.contains_key(&n.value) {
            let hint = match crate::did_you_mean(&n.value, known.iter().copied()) {
                Some(s) => s,
                None => "name a policy of `rate_limits:`".to_string(),
            };
            errs.push(
                ConfigError::at(n.pos, format!("unknown rate limit `{}`", n.value)).hint(hint),
            );
        }
    }
}

impl Config {
    /// The names of the policies route `i` applies, in order: its own `rate_limit`, else
    /// `defaults.rate_limit`.
    pub fn route_rate_limits(&self, i: usize) -> Vec<&str> {
        let own = self.routes.get(i).and_then(|r| r.rate_limit.as_ref());
        own.unwrap_or(&self.defaults.rate_limit)
            .iter()
            .map(|n| n.value.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_per_second_minute_and_hour() {
        assert_eq!(parse_rate("100/s"), Some(100.0));
        assert_eq!(parse_rate("60/min"), Some(1.0));
        assert_eq!(parse_rate("3600/h"), Some(1.0));
        assert_eq!(parse_rate("0.5/s"), Some(0.5));
        assert_eq!(parse_rate("0/s"), None);
        assert_eq!(parse_rate("10"), None);
        assert_eq!(parse_rate("10/d"), None);
    }
}
