//! Backends (`backends:`): addresses, protocol, balancing and resilience settings.

use crate::route::default_method;
use crate::{Dur, ExprSrc, Located};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// How calls reach a backend: HTTP/1.1, HTTP/2, gRPC (`grpc:` steps) or PostgreSQL (`sql:` steps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 with pooled keep-alive connections (default).
    #[default]
    Http1,
    /// HTTP/2 (h2c prior knowledge for `http://`, ALPN `h2` for `https://`), multiplexed.
    Http2,
    /// gRPC (unary calls over HTTP/2), called by `grpc:` steps; messages from the `protos:`
    /// files. HTTP/2 keepalive is on by default (`keepalive`).
    Grpc,
    /// PostgreSQL (`url: postgres://user:password@host:port/database`), called by `sql:` steps
    /// through the pool configured by `postgres:`.
    Postgres,
}

impl Protocol {
    /// Whether calls go over HTTP/2.
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }

    /// Whether calls are HTTP requests (HTTP/1.1, HTTP/2 or gRPC).
    pub fn is_http(self) -> bool {
        matches!(self, Protocol::Http1 | Protocol::Http2 | Protocol::Grpc)
    }
}

/// HTTP/2 keepalive of a backend's connections: a PING after `interval` without any frame from
/// the peer; no answer within `timeout` closes the connection, failing its calls at once (a
/// frozen or vanished peer is found in at most `interval + timeout`, instead of when the kernel
/// gives up on the socket, minutes later). On by default for `protocol: grpc`, off for `http2`
/// unless set; ignored for `http1`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveConfig {
    /// Time without frames from the peer before a PING is sent. Default 1s.
    pub interval: Dur,
    /// Time a PING may go unanswered before the connection is closed. Default 1s.
    pub timeout: Dur,
    /// Also ping connections without calls in flight (idle pooled connections), so a dead peer
    /// is found before a call is given to it. Default true. (grpc-go servers refuse pings more
    /// often than their `EnforcementPolicy.MinTime`, 5 minutes by default: see docs/grpc.md.)
    pub while_idle: bool,
}

impl Default for KeepaliveConfig {
    fn default() -> Self {
        KeepaliveConfig {
            interval: Dur::secs(1),
            timeout: Dur::secs(1),
            while_idle: true,
        }
    }
}

/// How a `protocol: grpc` backend's request messages are compressed (`grpc-encoding`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GrpcCompression {
    /// Uncompressed (default).
    #[default]
    Identity,
    /// gzip, with `grpc-encoding: gzip`.
    Gzip,
}

fn default_max_message() -> usize {
    4 << 20
}

/// A backend: one or more base URLs of the same service.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Base URL, e.g. `http://127.0.0.1:9001` or `https://svc.internal`. Use `urls` for several.
    pub url: Option<Located<String>>,
    /// Several base URLs of the same service; calls are spread over them by `balance`
    /// (P2C with peak-EWMA latency by default).
    #[serde(default)]
    pub urls: Vec<Located<String>>,
    /// Per-call timeout (a step's `timeout` overrides it); defaults to `defaults.timeout`.
    pub timeout: Option<Dur>,
    /// TCP connect timeout; defaults to `defaults.connect_timeout`.
    pub connect_timeout: Option<Dur>,
    /// `http1` (default), `http2`, `grpc` or `postgres`.
    #[serde(default)]
    pub protocol: Protocol,
    /// The connection pool of a `protocol: postgres` backend (defaults apply when absent).
    pub postgres: Option<crate::PostgresConfig>,
    /// HTTP/2 keepalive PINGs (`http2`, `grpc`). Default for `grpc`: every 1s without frames,
    /// 1s to answer, idle connections too; for `http2`: off unless this is set.
    pub keepalive: Option<KeepaliveConfig>,
    /// Largest gRPC message sent or accepted from this backend, in bytes (`protocol: grpc`).
    /// Default 4 MiB (gRPC's usual limit).
    #[serde(default = "default_max_message")]
    pub max_message_bytes: usize,
    /// `protocol: grpc`: how request messages are sent — `identity` (default) or `gzip`
    /// (compressed, `grpc-encoding: gzip`). Compressed answers are accepted either way
    /// (`grpc-accept-encoding: gzip, identity`), inflated within `max_message_bytes`.
    #[serde(default)]
    pub grpc_compression: GrpcCompression,
    /// Largest accepted answer body in bytes; larger answers fail the call (502). Default 16 MiB.
    #[serde(default = "default_max_response")]
    pub max_response_bytes: usize,
    /// The codings asked for in `Accept-Encoding` (`[gzip, br, zstd]`, preferred first).
    /// Answers in gzip, br or zstd are decoded whether asked or not, `max_response_bytes`
    /// applying to the decoded size (a body decoding past it is a 502 `bad_backend_answer`);
    /// any other `Content-Encoding` is a 502 `bad_backend_answer`. Default: none asked.
    #[serde(default)]
    pub accept_encoding: Vec<crate::ContentCoding>,
    /// Idle pooled connections are closed after this long; default 90s.
    #[serde(default = "default_idle")]
    pub pool_idle_timeout: Dur,
    /// Maximum idle connections kept per address; default 256.
    #[serde(default = "default_pool_max_idle")]
    pub pool_max_idle: usize,
    /// When a required step fails because this backend answered with an error status, answer the
    /// client with that same status (instead of 502). Default false.
    #[serde(default)]
    pub status_passthrough: bool,
    /// Static headers sent with every call (e.g. `authorization: "Bearer ${TOKEN}"`).
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// TLS settings for `https://` URLs.
    #[serde(default)]
    pub tls: Tls,
    /// How to fetch many keys in one call. Steps that look up single keys (`http: {key: …}`) are
    /// then merged automatically into batch calls.
    pub batch: Option<BatchConfig>,
    /// Share identical GET/HEAD calls that are in flight at the same time (within a request or
    /// across requests): one call, one answer for all. Default: `defaults.dedup` (true).
    #[serde(default)]
    pub dedup: Option<bool>,
    /// Cache successful GET/HEAD answers (keyed by method, path and query, body) and, with a
    /// `batch` form, values per key — a batch then asks only for the keys that missed.
    pub cache: Option<CacheConfig>,
    /// Bulkhead: most calls in flight to this backend; more fail at once (`backend_rejected`),
    /// which the step's failure policy handles (optional steps take their default). Default: none.
    pub max_concurrency: Option<usize>,
    /// Most calls per second to this backend from every route (every attempt, retries and
    /// hedges included): a call over it waits for its slot within its time, or fails at once
    /// (`backend_rejected`). Default: none.
    pub rate_limit: Option<crate::ratelimit::BackendRateLimit>,
    /// Circuit breaker: after enough failures, calls fail at once for a while (optional steps use
    /// their default immediately), then a probe decides whether to close again.
    pub breaker: Option<BreakerConfig>,
    /// How calls are spread over `urls`: P2C with peak-EWMA latency (default) or round robin.
    #[serde(default)]
    pub balance: BalanceConfig,
    /// Outlier ejection of addresses (on by default when there are several `urls`).
    #[serde(default)]
    pub outlier: OutlierConfig,
    /// Retries of idempotent calls (GET/HEAD or steps marked `idempotent`). Default: none.
    pub retry: Option<RetryConfig>,
    /// Hedged calls: a second copy of a slow idempotent call; the first answer wins, the other
    /// is cancelled. Default: none.
    pub hedge: Option<HedgeConfig>,
}

/// Balancing strategy over a backend's addresses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BalanceStrategy {
    /// Power of two choices: of two random addresses, the one with the lower
    /// `peak-EWMA latency × (in flight + 1)`.
    #[default]
    P2cPeakEwma,
    /// Each address in turn.
    RoundRobin,
}

/// Balancing over a backend's addresses (R3).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BalanceConfig {
    /// `p2c_peak_ewma` (default) or `round_robin`.
    pub strategy: BalanceStrategy,
    /// Time constant of the latency average. Default 10s.
    pub decay: Dur,
    /// Latency assumed for an address without samples. Default 30ms.
    pub default_rtt: Dur,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            strategy: BalanceStrategy::P2cPeakEwma,
            decay: Dur::secs(10),
            default_rtt: Dur::millis(30),
        }
    }
}

/// Outlier ejection (R3): an address that failed `consecutive_failures` times in a row (connect
/// error, reset, timeout or 5xx) is taken out of rotation for `base_ejection × times ejected`,
/// capped at `max_ejection`; afterwards one probe call decides whether it is back.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Default true (has an effect only with several addresses).
    pub enabled: bool,
    /// Default 5.
    pub consecutive_failures: u32,
    /// Default 30s.
    pub base_ejection: Dur,
    /// Default 300s.
    pub max_ejection: Dur,
    /// Most addresses ejected at once, as a percentage (at least one address may always be
    /// ejected while another remains). Default 50.
    pub max_ejected_percent: u32,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            enabled: true,
            consecutive_failures: 5,
            base_ejection: Dur::secs(30),
            max_ejection: Dur::secs(300),
            max_ejected_percent: 50,
        }
    }
}

/// Retries (R4): only idempotent calls, on connect errors, resets, timeouts of a single attempt
/// and the listed statuses; jittered exponential backoff; never past the deadline; at most
/// `budget.ratio` of recent calls (plus `budget.min_per_second`) may be retries.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Total attempts including the first. Default 2.
    pub attempts: u32,
    /// Statuses that are retried. Default [502, 503, 504].
    pub on_status: Vec<u16>,
    /// First backoff (×0.8–1.2 jitter, doubling per attempt). Default 10ms.
    pub backoff: Dur,
    /// Longest backoff. Default 200ms.
    pub max_backoff: Dur,
    /// The retry budget.
    pub budget: RetryBudget,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            attempts: 2,
            on_status: vec![502, 503, 504],
            backoff: Dur::millis(10),
            max_backoff: Dur::millis(200),
            budget: RetryBudget::default(),
        }
    }
}

/// A retry budget (Finagle/Linkerd): over the last `ttl`, retries may be at most `ratio` of the
/// calls, plus `min_per_second`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryBudget {
    /// Default 0.2.
    pub ratio: f64,
    /// Default 10.
    pub min_per_second: f64,
    /// Default 10s.
    pub ttl: Dur,
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget {
            ratio: 0.2,
            min_per_second: 10.0,
            ttl: Dur::secs(10),
        }
    }
}

/// Hedging (R4): when an idempotent call has not answered after `delay` (or, without `delay`,
/// after the backend's recent `percentile` latency), a second copy is sent; the first answer
/// wins and the other call is cancelled. Hedges are bounded by `max_extra` of recent calls.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HedgeConfig {
    /// Fixed hedge delay. Default: none (use `percentile`).
    pub delay: Option<Dur>,
    /// Latency percentile of this backend's recent calls used as the delay. Default 95.
    pub percentile: f64,
    /// Shortest delay. Default 1ms.
    pub min_delay: Dur,
    /// Hedges as a share of calls (the hedge budget). Default 0.1.
    pub max_extra: f64,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            delay: None,
            percentile: 95.0,
            min_delay: Dur::millis(1),
            max_extra: 0.1,
        }
    }
}

/// A backend's circuit breaker (R3).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Open after this many failures in a row. Default 5.
    pub consecutive_failures: u32,
    /// Or open when at least this share of the calls in `window` failed… Default 0.5.
    pub failure_rate: f64,
    /// …over at least `min_calls` calls. Default 20.
    pub min_calls: u32,
    /// The window of the failure rate. Default 10s.
    pub window: Dur,
    /// How long to stay open before letting a probe through. Default 5s.
    pub open_for: Dur,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_rate: 0.5,
            min_calls: 20,
            window: Dur::secs(10),
            open_for: Dur::secs(5),
        }
    }
}

/// A backend's cache (E1).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// How long an answer is fresh.
    pub ttl: Dur,
    /// Most entries kept (least recently/frequently used go first). Default 10 000.
    #[serde(default = "default_max_entries")]
    pub max_entries: u64,
    /// After `ttl`, keep answering from the stale entry for this long while one background call
    /// refreshes it. Default 0 (off).
    #[serde(default = "zero_dur")]
    pub stale_while_revalidate: Dur,
    /// After `ttl`, answer from the stale entry for this long when the backend fails (error, 5xx,
    /// timeout). Default 0 (off).
    #[serde(default = "zero_dur")]
    pub stale_if_error: Dur,
    /// Also keep answers in the shared Redis (top-level `redis:`), so the gateway's instances
    /// share them: a miss in memory asks Redis before the backend. Default false.
    #[serde(default)]
    pub l2: bool,
}

fn default_max_entries() -> u64 {
    10_000
}

fn zero_dur() -> Dur {
    Dur::millis(0)
}

/// The batch form of a backend: how N keys are fetched in one call and how the answer is split.
/// Expressions read `$keys` (the list of keys, as strings).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// HTTP method of the batch call; default GET.
    #[serde(default = "default_method")]
    pub method: Located<String>,
    /// Path expression, e.g. `"/items"` or `"/items?ids=\($keys | join(","))"`.
    pub path: ExprSrc,
    /// Query parameters: name → expression, e.g. `ids: '$keys | join(",")'`.
    #[serde(default)]
    pub query: IndexMap<String, ExprSrc>,
    /// JSON body expression, e.g. `{ids: $keys}`.
    pub body: Option<ExprSrc>,
    /// Splits the answer (`.`) into an object key → value, e.g. `.items | map({key: .id|tostring,
    /// value: .}) | from_entries`, or `.` when the answer already is such an object. Keys absent
    /// from it are "not found" for their step.
    pub split: ExprSrc,
    /// Most keys per call; more keys are split into several calls sent concurrently. Default 100.
    #[serde(default = "default_batch_max")]
    pub max: usize,
    /// Merge keys from concurrent requests arriving within this window into shared batch calls
    /// (e.g. `1ms`). Default: off (each request's keys are merged only with its own).
    pub window: Option<Dur>,
}

fn default_batch_max() -> usize {
    100
}

fn default_max_response() -> usize {
    16 << 20
}
fn default_idle() -> Dur {
    Dur::secs(90)
}
fn default_pool_max_idle() -> usize {
    256
}

/// TLS settings of a backend.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// PEM file of CA certificates to trust instead of the bundled web PKI roots.
    pub ca_file: Option<Located<String>>,
    /// PEM file with a client certificate chain presented to the backend (mTLS); needs
    /// `key_file`.
    pub cert_file: Option<Located<String>>,
    /// PEM file with the private key of `cert_file`.
    pub key_file: Option<Located<String>>,
}

impl Backend {
    /// The checks of a protocol other than HTTP, by the protocol's module (one line per
    /// protocol): `true` when the backend is of that protocol (its settings and `urls` were
    /// checked there), `false` for HTTP (its URLs are checked as HTTP ones); settings of another
    /// protocol than the backend's are errors.
    pub(crate) fn check_protocol(
        &self,
        name: &str,
        urls: &[&crate::Located<String>],
        errs: &mut Vec<crate::ConfigError>,
    ) -> bool {
        crate::postgres::check_backend(name, self, urls, errs)
    }

    /// The connection pool a database backend calls through, for `fanout explain`: (max_size,
    /// max_waiters, max_wait, statement_timeout); `None` for other protocols.
    pub fn pool_summary(&self) -> Option<(usize, usize, std::time::Duration, std::time::Duration)> {
        (self.protocol == Protocol::Postgres).then(|| {
            let p = self.postgres.clone().unwrap_or_default();
            (
                p.max_size,
                p.max_waiters,
                p.max_wait.0,
                p.statement_timeout.0,
            )
        })
    }
}
