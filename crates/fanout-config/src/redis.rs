//! The shared Redis (`redis:`): the second level (L2) of the answer caches, shared by every
//! instance of the gateway. Named once here; a backend opts in with `cache: {l2: true}`.

use crate::{ConfigError, Dur, Located};
use schemars::JsonSchema;
use serde::Deserialize;

/// A Redis server shared by the gateway's instances as the second level (L2) of the answer caches
/// of the backends with `cache: {l2: true}`. Redis is never required: when it is down, slow or
/// answers garbage, the caches work in memory only and no request fails because of it.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db][?protocol=resp3]` (or `redis+unix:///path`).
    /// Usually from the environment: `url: ${REDIS_URL}`. TLS (`rediss://`) is not supported.
    pub url: Located<String>,
    /// Time limit of each Redis command (read or write); a command that takes longer counts as an
    /// error and the request goes on without Redis. Default 50ms.
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    /// Time limit of one attempt to (re)connect. Default 1s.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: Dur,
    /// Largest value written to Redis (the encoded answer: a 51-byte header and the body); larger
    /// answers stay in memory only (counted as `too_large`), larger values read back are ignored.
    /// Default 1 MiB.
    #[serde(default = "default_max_value_bytes")]
    pub max_value_bytes: usize,
    /// Prefix of every key the gateway writes. Give each deployment (environment, config) sharing
    /// one Redis its own prefix. Default `fanout:`.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Most writes waiting to be sent; writes never wait on the request path, and when this many
    /// are queued further ones are dropped (counted as `write_skipped`). Default 1024.
    #[serde(default = "default_max_pending_writes")]
    pub max_pending_writes: usize,
    /// After `breaker.consecutive_failures` failed commands in a row, Redis is skipped for
    /// `breaker.open_for`, then one probe decides whether to use it again.
    #[serde(default)]
    pub breaker: RedisBreakerConfig,
}

/// The breaker of the shared Redis: skip it for a while when it keeps failing.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RedisBreakerConfig {
    /// Failed commands (errors or timeouts) in a row that open the breaker. Default 3.
    pub consecutive_failures: u32,
    /// How long Redis is skipped once the breaker is open, before one probe command. Default 5s.
    pub open_for: Dur,
}

impl Default for RedisBreakerConfig {
    fn default() -> Self {
        RedisBreakerConfig {
            consecutive_failures: 3,
            open_for: Dur::secs(5),
        }
    }
}

fn default_timeout() -> Dur {
    Dur::millis(50)
}
fn default_connect_timeout() -> Dur {
    Dur::secs(1)
}
fn default_max_value_bytes() -> usize {
    1 << 20
}
fn default_key_prefix() -> String {
    "fanout:".into()
}
fn default_max_pending_writes() -> usize {
    1024
}

/// Longest `key_prefix`, in bytes.
pub const MAX_KEY_PREFIX_BYTES: usize = 256;

impl RedisConfig {
    /// The checks of the `redis:` section.
    pub(crate) fn check(&self, errs: &mut Vec<ConfigError>) {
        let url = &self.url.value;
        if url.starts_with("rediss://") {
            errs.push(
                ConfigError::at(
                    self.url.pos,
                    "redis.url: TLS (`rediss://`) is not supported",
                )
                .hint("use `redis://` to a Redis on a trusted network, or a TLS sidecar"),
            );
        } else if !(url.starts_with("redis://") || url.starts_with("redis+unix://")) {
            errs.push(
                ConfigError::at(
                    self.url.pos,
                    "redis.url must start with `redis://` or `redis+unix://`",
                )
                .hint("e.g. `redis://redis.default.svc:6379/?protocol=resp3`"),
            );
        }
        let mut bad = |what: &str, hint: &str| {
            errs.push(
                ConfigError {
                    path: None,
                    file: String::new(),
                    pos: None,
                    message: format!("redis.{what}"),
                    hint: None,
                }
                .hint(hint),
            )
        };
        if self.timeout.0.is_zero() || self.connect_timeout.0.is_zero() {
            bad(
                "timeout and connect_timeout must be positive",
                "e.g. `timeout: 50ms`, `connect_timeout: 1s`",
            );
        }
        if self.max_value_bytes == 0 || self.max_pending_writes == 0 {
            bad(
                "max_value_bytes and max_pending_writes must be at least 1",
                "defaults: max_value_bytes 1048576, max_pending_writes 1024",
            );
        }
        if self.key_prefix.len() > MAX_KEY_PREFIX_BYTES {
            bad(
                &format!("key_prefix is longer than {MAX_KEY_PREFIX_BYTES} bytes"),
                "e.g. `key_prefix: \"fanout:prod:\"`",
            );
        }
        if self.breaker.consecutive_failures == 0 || self.breaker.open_for.0.is_zero() {
            bad(
                "breaker.consecutive_failures must be at least 1 and breaker.open_for positive",
                "defaults: consecutive_failures 3, open_for 5s",
            );
        }
    }
}
