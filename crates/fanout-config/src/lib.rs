//! Config of fanout: the YAML a team writes, as typed structs.
//!
//! This crate only *reads* config: `${ENV}` substitution, strict YAML deserialization (unknown
//! fields are errors) and the structural checks that need no knowledge of flows (duplicate routes,
//! bad URLs). Every error carries `line:column`. Expressions stay strings here; the flow compiler
//! (`fanout-flow`) compiles them and reports their errors at the locations kept in [`Located`].
//! The JSON Schema printed by `fanout schema` is generated from these types (schemars).

mod contract;
mod duration;
mod env;
mod hints;
mod located;

pub use contract::{FailSpec, MissingPolicy, StatusAction, StatusPattern, StatusSrc};

pub use duration::Dur;
pub use env::substitute;
pub use hints::{closest, did_you_mean};
pub use located::{Located, Pos, pos_in_scalar};

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;
use std::fmt;

/// An expression source (jq), with its position in the file.
pub type ExprSrc = Located<String>;

/// A config error with its position. Display: `FILE:LINE:COL: message` and an indented hint.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    /// File name as given by the user ("<embedded>" for built-in configs).
    pub file: String,
    /// Position (1-based line and column); `None` when the error concerns the whole file.
    pub pos: Option<Pos>,
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
}

impl ConfigError {
    /// An error at `pos` (file is filled in by the loader).
    pub fn at(pos: Pos, message: impl Into<String>) -> Self {
        ConfigError {
            file: String::new(),
            pos: Some(pos),
            message: message.into(),
            hint: None,
        }
    }
    /// Attach a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    /// Set the file name.
    pub fn in_file(mut self, file: &str) -> Self {
        self.file = file.to_string();
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.col, self.message)?,
            None => write!(f, "{}: {}", self.file, self.message)?,
        }
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

/// A list of config errors (validation reports all it can find).
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

/// The gateway config (`fanout.yaml`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on, e.g. `0.0.0.0:8080`. Default `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Limits of the inbound server.
    #[serde(default)]
    pub server: ServerConfig,
    /// Defaults applied where a route, step or backend does not say otherwise.
    #[serde(default)]
    pub defaults: Defaults,
    /// Named backends the flows call.
    #[serde(default)]
    pub backends: IndexMap<String, Backend>,
    /// Reference data: small datasets loaded at start, refreshed in the background, read by
    /// flows as `$ref.NAME` without any call.
    #[serde(default)]
    pub reference: IndexMap<String, Reference>,
    /// Routes: each matches a method and path and runs a flow.
    pub routes: Vec<Route>,
    /// The config text after `${VAR}` substitution (to point inside expressions in errors).
    #[serde(skip)]
    #[schemars(skip)]
    pub source: String,
    /// File name the config came from.
    #[serde(skip)]
    #[schemars(skip)]
    pub file: String,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}

/// Limits of the inbound HTTP server. Every limit has a default.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Largest accepted request body in bytes; larger bodies get 413. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Largest accepted request head (request line + headers) in bytes; default 16 KiB.
    pub max_header_bytes: usize,
    /// Maximum concurrent HTTP/2 streams per connection; default 256.
    pub max_concurrent_streams: u32,
    /// Time allowed to receive a request head; default 10s.
    pub header_read_timeout: Dur,
    /// Header carrying the remaining deadline in milliseconds, read from clients and sent to
    /// backends. Default `x-request-timeout`.
    pub deadline_header: String,
    /// Time in-flight requests get to finish on shutdown; default 10s.
    pub shutdown_grace: Dur,
    /// Admission control: how many requests run at once, how many may wait, and for how long.
    pub admission: Admission,
    /// The bounded pool for CPU-heavy work (large answers, `compute: true` steps), so workers
    /// never stall on it.
    pub compute: ComputeConfig,
    /// A worker that runs one piece of work longer than this without yielding is a stall: counted
    /// on `/__fanout/status` and logged with its route and step. Default 100ms.
    pub stall_threshold: Dur,
    /// Budgets of expression evaluation (work, size and depth of what expressions build), so
    /// no request can make an expression run away with a worker, memory or the stack.
    pub expressions: ExpressionLimits,
    /// Limits of client connections: how many may be open, and how long one may stay silent,
    /// idle or unable to take its answer.
    pub connections: ConnectionLimits,
    /// Limits of request bodies: how long they may take to arrive, how many may arrive at once,
    /// and the memory all in-flight request data may use.
    pub bodies: BodyLimits,
    /// Header carrying the request id: taken from the client when present and valid (1–128
    /// characters of `A-Z a-z 0-9 - _ . : @`), otherwise generated; returned in this header and
    /// in error bodies, and written in the log. Default `x-request-id`.
    pub request_id_header: String,
    /// Put the internal detail of a failure (backend name, backend status and body excerpt,
    /// expression error, transport error) into error bodies as `error.detail` and
    /// `error.backend`. For development only: by default clients get the status, `code`, step,
    /// a safe message and the request id, and the detail goes only to the log. Default false.
    pub expose_error_details: bool,
    /// Most failed-request log lines (with their detail) written per second; past it lines are
    /// counted and the count is logged once the second is over, so a storm of failures cannot
    /// flood the log or spend the CPU on it. 0: no limit. Default 1000.
    pub error_log_per_second: u32,
}

/// Limits of client connections. Every connection ends: a timeout closes it (counted by kind on
/// `/__fanout/status`), and at the connection cap the oldest idle connections are closed first.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionLimits {
    /// Most open client connections. At the cap, and when accepting fails for lack of file
    /// descriptors, the oldest idle connections are closed first; if none is idle, new
    /// connections are accepted and closed at once. Default: three quarters of the process's
    /// open-files limit (`RLIMIT_NOFILE`), the rest left to backend connections and files.
    pub max_connections: Option<usize>,
    /// Time a new connection has to send its first byte, and an HTTP/2 connection its whole
    /// 24-byte preface; default 10s.
    pub first_byte_timeout: Dur,
    /// A connection with no request in flight and no answer being sent for this long is closed
    /// (HTTP/2: GOAWAY, then closed). Client PINGs are not activity. Default 60s.
    pub idle_timeout: Dur,
    /// A connection with answer data to send that makes no progress for this long (the client
    /// does not read, or keeps an HTTP/2 flow-control window at zero) is closed and its buffered
    /// answers freed. Default 30s.
    pub send_timeout: Dur,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: None,
            first_byte_timeout: Dur::secs(10),
            idle_timeout: Dur::secs(60),
            send_timeout: Dur::secs(30),
        }
    }
}

/// Limits of request bodies. A body is read completely before the request takes an admission
/// slot, so slow or large bodies never hold the gateway's concurrency.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BodyLimits {
    /// Time a body has to arrive, counted from the request head, extended by one second per
    /// `min_bytes_per_sec` bytes received (and never past the route's deadline); later → 408
    /// `body_timeout`. Default 5s.
    pub read_timeout: Dur,
    /// The slowest upload rate that keeps extending `read_timeout`, in bytes per second; 0: no
    /// extension. Default 16384 (a 1 MiB body needs about 15 KB/s; 1 byte/s ends after 5s).
    pub min_bytes_per_sec: u64,
    /// Requests reading a body at once; more get 503 `body_readers_full`. Requests without a
    /// body do not count. Default 256.
    pub max_readers: usize,
    /// Memory all in-flight request data may use, in bytes: each body is counted at the
    /// estimated size of its parsed value (two bytes per byte plus 64 per `,` `:` `[` `{`) from
    /// the moment it is read until its request ends. A request that would exceed it gets 503
    /// `memory_budget_exhausted`. Default 256 MiB.
    pub memory_budget_bytes: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            read_timeout: Dur::secs(5),
            min_bytes_per_sec: 16 << 10,
            max_readers: 256,
            memory_budget_bytes: 256 << 20,
        }
    }
}

/// Budgets of expression evaluation. Exceeding one fails the expression with a clear error
/// (500 `expression_limit`, naming the route, step and limit) instead of exhausting the process.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExpressionLimits {
    /// Operations (filter steps, produced values) all expressions of one request may perform.
    /// Default 10 000 000.
    pub max_ops: u64,
    /// Operations an expression may run on an I/O worker; past this it is moved to the compute
    /// pool (and ends at the route deadline), so a heavy expression never holds a worker.
    /// Default 50 000.
    pub inline_ops: u64,
    /// Deepest nesting of data: request bodies, backend answers, `fromjson`, values built by
    /// expressions, and expression recursion. Default 128, at most 1000.
    pub max_depth: usize,
    /// Most elements of one array or object an expression builds. Default 1 000 000.
    pub max_elements: usize,
    /// Longest string an expression builds, in bytes. Default 16 MiB.
    pub max_string_bytes: usize,
}

impl Default for ExpressionLimits {
    fn default() -> Self {
        ExpressionLimits {
            max_ops: 10_000_000,
            inline_ops: 50_000,
            max_depth: 128,
            max_elements: 1_000_000,
            max_string_bytes: 16 << 20,
        }
    }
}

/// The compute pool (R1): a fixed number of threads started with the server and a bounded queue;
/// a full queue fails the step (503 `overloaded`) instead of growing memory.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ComputeConfig {
    /// Threads; default: half the cores, at least 1.
    pub threads: Option<usize>,
    /// Jobs waiting for a thread; more are refused. Default 1024.
    pub queue: usize,
    /// Backend answers at least this large are parsed on the pool. Default 256 KiB.
    pub offload_bytes: usize,
}

impl Default for ComputeConfig {
    fn default() -> Self {
        ComputeConfig {
            threads: None,
            queue: 1024,
            offload_bytes: 256 << 10,
        }
    }
}

/// Admission control (R2): excess load is rejected at once with 503 + `Retry-After` instead of
/// queueing until it times out.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Admission {
    /// Requests running at once (per listener). Default 1024.
    pub max_concurrency: usize,
    /// Requests that may wait for a slot; more are rejected immediately. Default 256.
    pub queue: usize,
    /// Longest wait in the queue: a request that waited longer is rejected (its client would
    /// rather retry elsewhere than wait). Default 50ms.
    pub queue_timeout: Dur,
    /// CoDel-style queue discipline: once the queue has not been empty for `interval`, a waiting
    /// request only gets `target` before it is rejected, and the queue is served newest first
    /// (adaptive LIFO) until it has stayed empty for `target`. Default target 5ms, interval 100ms.
    pub codel: Codel,
    /// Adaptive limit: instead of a fixed `max_concurrency`, a gradient limit that follows the
    /// measured latency (`max_concurrency` is then its ceiling). Default: off (static limit).
    pub adaptive: Option<AdaptiveLimit>,
    /// Share of the limit each priority class may fill (critical routes may always use all of
    /// it), so critical routes keep their share under overload. Default normal 0.9, sheddable 0.5.
    pub shares: PriorityShares,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            max_concurrency: 1024,
            queue: 256,
            queue_timeout: Dur::millis(50),
            codel: Codel::default(),
            adaptive: None,
            shares: PriorityShares::default(),
        }
    }
}

/// CoDel queue settings (Facebook "Fail at Scale": M = 5ms, N = 100ms).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Codel {
    /// Longest wait of a request while a standing queue exists. Default 5ms.
    pub target: Dur,
    /// A queue that has not been empty for this long is a standing queue. Default 100ms.
    pub interval: Dur,
}

impl Default for Codel {
    fn default() -> Self {
        Codel {
            target: Dur::millis(5),
            interval: Dur::millis(100),
        }
    }
}

/// A gradient concurrency limit (after Netflix Gradient2 / Envoy adaptive concurrency): every
/// `window`, `gradient = clamp(tolerance × long_rtt / short_rtt, 0.5, 1.0)`;
/// `new = limit + queue_size` while the gradient is 1, else `limit × gradient`; smoothed
/// `limit = limit × (1 − smoothing) + new × smoothing`, clamped to `[min, max_concurrency]`.
/// `long_rtt` is the baseline latency, learnt only from windows our own concurrency cannot have
/// slowed (few requests in flight, or the limit at `min`). See docs/resilience.md.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveLimit {
    /// Limit at start. Default 20.
    pub initial: usize,
    /// The limit never goes below this. Default 8.
    pub min: usize,
    /// How often the limit is recomputed from the samples of the last window. Default 100ms.
    pub window: Dur,
    /// Latency growth tolerated before the limit shrinks (short/long RTT ratio). Default 1.5.
    pub tolerance: f64,
    /// Weight of a new limit (0–1]. Default 0.2.
    pub smoothing: f64,
    /// Samples in the long-term RTT average (EMA). Default 600.
    pub long_window: u32,
    /// Headroom added each window while latency is within tolerance, so the limit can grow:
    /// `queue_size`; 0 means `sqrt(limit)`. Default 4.
    pub queue_size: usize,
}

impl Default for AdaptiveLimit {
    fn default() -> Self {
        AdaptiveLimit {
            initial: 20,
            min: 8,
            window: Dur::millis(100),
            tolerance: 1.5,
            smoothing: 0.2,
            long_window: 600,
            queue_size: 4,
        }
    }
}

/// Share of the concurrency limit a priority class may fill.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityShares {
    /// Default 0.9: the last 10 % of the limit is kept for critical routes.
    pub normal: f64,
    /// Default 0.5.
    pub sheddable: f64,
}

impl Default for PriorityShares {
    fn default() -> Self {
        PriorityShares {
            normal: 0.9,
            sheddable: 0.5,
        }
    }
}

/// A route's priority class under overload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Shed last: may use the whole limit.
    Critical,
    /// The default.
    #[default]
    Normal,
    /// Shed first.
    Sheddable,
}

/// A route's admission settings.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RouteAdmission {
    /// Priority class; default `normal`.
    pub priority: Priority,
    /// Most requests of this route running at once (on top of the listener's limit). Default: none.
    pub max_concurrency: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body_bytes: 1 << 20,
            max_header_bytes: 16 << 10,
            max_concurrent_streams: 256,
            header_read_timeout: Dur::secs(10),
            deadline_header: "x-request-timeout".into(),
            shutdown_grace: Dur::secs(10),
            admission: Admission::default(),
            compute: ComputeConfig::default(),
            stall_threshold: Dur::millis(100),
            expressions: ExpressionLimits::default(),
            connections: ConnectionLimits::default(),
            bodies: BodyLimits::default(),
            request_id_header: "x-request-id".into(),
            expose_error_details: false,
            error_log_per_second: 1000,
        }
    }
}

/// Defaults for routes, steps and backends.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Defaults {
    /// Route deadline when a route sets none; default 1s.
    pub deadline: Dur,
    /// Per-call timeout when neither step nor backend sets one; default 1s.
    pub timeout: Dur,
    /// TCP connect timeout of backends; default 500ms.
    pub connect_timeout: Dur,
    /// `for_each` concurrency bound when a step sets none; default 16.
    pub concurrency: usize,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            deadline: Dur::secs(1),
            timeout: Dur::secs(1),
            connect_timeout: Dur::millis(500),
            concurrency: 16,
        }
    }
}

/// HTTP protocol used towards a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 with pooled keep-alive connections (default).
    #[default]
    Http1,
    /// HTTP/2 (h2c prior knowledge for `http://`, ALPN `h2` for `https://`), multiplexed.
    Http2,
}

/// A backend: one or more base URLs of the same service.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
    /// `http1` (default) or `http2`.
    #[serde(default)]
    pub protocol: Protocol,
    /// Largest accepted answer body in bytes; larger answers fail the call (502). Default 16 MiB.
    #[serde(default = "default_max_response")]
    pub max_response_bytes: usize,
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
    /// across requests): one call, one answer for all. Default true.
    #[serde(default = "default_true")]
    pub dedup: bool,
    /// Cache successful GET/HEAD answers (keyed by method, path and query, body) and, with a
    /// `batch` form, values per key — a batch then asks only for the keys that missed.
    pub cache: Option<CacheConfig>,
    /// Bulkhead: most calls in flight to this backend; more fail at once (`backend_rejected`),
    /// which the step's failure policy handles (optional steps take their default). Default: none.
    pub max_concurrency: Option<usize>,
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
}

fn default_max_entries() -> u64 {
    10_000
}

fn zero_dur() -> Dur {
    Dur::millis(0)
}

fn default_true() -> bool {
    true
}

/// The batch form of a backend: how N keys are fetched in one call and how the answer is split.
/// Expressions read `$keys` (the list of keys, as strings).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// PEM file of CA certificates to trust instead of the bundled web PKI roots.
    pub ca_file: Option<Located<String>>,
}

/// A reference dataset.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// How to fetch it (expressions may not read steps; there is no request).
    pub http: HttpCall,
    /// Maps the answer (`.`) to the dataset, e.g. `.masks | map({key: .name, value: .fields}) |
    /// from_entries`.
    pub result: Option<ExprSrc>,
    /// Refresh period; default 5m.
    #[serde(default = "default_refresh")]
    pub refresh: Dur,
    /// When true, the gateway starts even if the first load fails (the dataset is `null` until a
    /// refresh succeeds). Default false: startup fails clearly.
    #[serde(default)]
    pub optional: bool,
}

fn default_refresh() -> Dur {
    Dur::secs(300)
}

/// A route: a method + path and the flow that answers it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Path pattern; `{name}` captures a segment (`$request.params.name`), `{*rest}` the rest.
    pub path: Located<String>,
    /// HTTP method; default GET.
    #[serde(default = "default_method")]
    pub method: Located<String>,
    /// Total time budget of a request; the client may shorten it (header or `grpc-timeout`).
    /// Defaults to `defaults.deadline`.
    pub deadline: Option<Dur>,
    /// Priority class and optional per-route concurrency limit.
    #[serde(default)]
    pub admission: RouteAdmission,
    /// The steps, by name. Order does not matter: dependencies come from the expressions.
    #[serde(default)]
    pub flow: IndexMap<Located<String>, Step>,
    /// How to build the response.
    pub respond: Respond,
}

fn default_method() -> Located<String> {
    Located::unknown("GET".to_string())
}

/// One step of a flow: a backend call (`http`) or a computed value (`value`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Run the step only when this expression is true; otherwise its value is `default` (or null).
    pub when: Option<ExprSrc>,
    /// Run the step once per element of this list (the element is `$item`, its index `$index`);
    /// the step's value is the list of results in input order.
    pub for_each: Option<ExprSrc>,
    /// Maximum calls in flight for a `for_each` step; defaults to `defaults.concurrency`.
    pub concurrency: Option<usize>,
    /// Timeout of each call of this step (capped by the remaining deadline).
    pub timeout: Option<Dur>,
    /// An optional step that fails takes its `default` value and is listed in `_partial`;
    /// a required step (the default) that fails fails the request.
    #[serde(default)]
    pub optional: bool,
    /// Value used when the step is skipped (`when` false) or, if optional, fails. JSON/YAML value.
    #[schemars(with = "Option<serde_json::Value>")]
    pub default: Option<serde_json::Value>,
    /// Maps the backend's answer (`.`) to the step's value, e.g. `.items`.
    pub result: Option<ExprSrc>,
    /// Call an HTTP backend.
    pub http: Option<HttpCall>,
    /// Compute a value from other steps without any call.
    pub value: Option<ExprSrc>,
    /// Evaluate this step's `value`/`result` on the compute pool (for large transforms), so the
    /// worker thread keeps serving other requests. Default false.
    #[serde(default)]
    pub compute: bool,
    /// End the request with a client answer (status, code, message) when this step runs — with
    /// `when`, a guard such as input validation that answers 400 before any backend is called.
    pub fail: Option<FailSpec>,
    /// What the client gets when the backend answers an error status: status (`404`) or class
    /// (`4xx`, `5xx`) → a status to answer, `pass` (the backend's), `default` (not a failure:
    /// the step's value is its `default`), or `{status, code, message}`. Unlisted statuses: 404
    /// answers 404 `not_found` naming the step, every other 4xx/5xx answers 502
    /// `backend_status` (the backend's status with its `status_passthrough`).
    #[serde(default)]
    #[schemars(with = "std::collections::BTreeMap<String, StatusAction>")]
    pub on_status: IndexMap<Located<StatusPattern>, StatusAction>,
    /// Keys a batch lookup (`http.key`) did not find, and elements of a `for_each` `http` step
    /// whose call answered 404: `fail` (default: the step fails, 404 `key_not_found` for keys),
    /// `skip` (left out of the list), `null`, or `{value: EXPRESSION}` (per element, reads
    /// `$item`/`$index`). Steps with missing elements are listed in `_partial`.
    #[serde(default)]
    pub missing: MissingPolicy,
}

/// An HTTP call of a step. Every part except `backend` and `method` is an expression.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpCall {
    /// Name of a backend under `backends:`.
    pub backend: Located<String>,
    /// HTTP method; default GET.
    #[serde(default = "default_method")]
    pub method: Located<String>,
    /// Path (and optionally query) expression, e.g. `"/items/\($item)"`. Required unless `key`.
    pub path: Option<ExprSrc>,
    /// Look up one key through the backend's `batch` form instead of building a call: lookups
    /// of all steps that start together (and, with `batch.window`, of concurrent requests) are
    /// merged into batch calls. With `for_each`, one key per element.
    pub key: Option<ExprSrc>,
    /// Query parameters: name → expression (null values are left out; arrays repeat the name).
    #[serde(default)]
    pub query: IndexMap<String, ExprSrc>,
    /// Headers: name → expression (null values are left out).
    #[serde(default)]
    pub headers: IndexMap<String, ExprSrc>,
    /// JSON body expression (sent as `application/json`).
    pub body: Option<ExprSrc>,
    /// Whether the call may be retried or hedged. Default: true for GET/HEAD, false otherwise.
    pub idempotent: Option<bool>,
}

/// The response of a route.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Respond {
    /// Body expression (JSON), e.g. `{total: $search.total, items: $details}`.
    pub body: ExprSrc,
    /// Status code, or an expression giving one (e.g. `'if $found then 200 else 404 end'`);
    /// default 200.
    #[serde(default)]
    pub status: StatusSrc,
    /// Response headers: name → expression.
    #[serde(default)]
    pub headers: IndexMap<String, ExprSrc>,
}

/// Looks up `${NAME}` values; the process environment by default.
pub type VarLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as a [`VarLookup`].
pub fn env_lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Substitute `${VARS}` and deserialize YAML into `T`, strictly. `file` names the source in errors.
pub fn from_yaml<T: for<'de> Deserialize<'de>>(
    file: &str,
    text: &str,
    vars: VarLookup<'_>,
) -> Result<T, ConfigError> {
    let text = substitute(text, vars).map_err(|e| e.in_file(file))?;
    let opts = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::Error,
    };
    serde_saphyr::from_str_with_options(&text, opts).map_err(|e| yaml_error(file, &e))
}

fn yaml_error(file: &str, e: &serde_saphyr::Error) -> ConfigError {
    let pos = e.location().and_then(Pos::from_location);
    let full = e.to_string();
    // The library renders a snippet after the first line; we print our own position.
    let first = full.lines().next().unwrap_or("invalid YAML").trim();
    let message = hints::polish_yaml_message(strip_location_suffix(first));
    let hint = Some(hints::yaml_hint(&message));
    ConfigError {
        file: file.to_string(),
        pos,
        message,
        hint,
    }
}

fn strip_location_suffix(s: &str) -> String {
    // serde-saphyr renders "error: line X column Y: message"; we print our own position.
    let mut m = s.strip_prefix("error: ").unwrap_or(s);
    if let Some(rest) = m.strip_prefix("line ")
        && let Some(i) = rest.find(": ")
    {
        m = &rest[i + 2..];
    }
    let m = m
        .trim_end_matches(", set DuplicateKeyPolicy in Options if acceptable")
        .replace("expected sequence start", "expected a list here")
        .replace(
            "expected mapping start",
            "expected a mapping (key: value) here",
        );
    match m.rfind(" at line ") {
        Some(i) => m[..i].to_string(),
        None => m,
    }
}

/// Largest config file read, in bytes (16 MiB): a config is text written by people.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Largest CA bundle read for `tls.ca_file`, in bytes (1 MiB; a full public root bundle is ~250 KiB).
pub const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// Read a file the config names, refusing anything that is not a regular file (a FIFO would
/// block, `/dev/zero` never ends) and anything larger than `max` bytes.
pub fn read_limited(path: &str, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    // Checked before opening: opening a FIFO for reading blocks until a writer appears.
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "file of {} bytes is larger than the limit of {max} bytes",
                meta.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("file is larger than the limit of {max} bytes"),
        ));
    }
    Ok(out)
}

impl Config {
    /// Load a gateway config from YAML text (with `${VAR}` substitution) and run the structural
    /// checks. Flow-level checks (expressions, references, cycles) happen in the flow compiler.
    pub fn from_yaml(file: &str, text: &str, vars: VarLookup<'_>) -> Result<Config, ConfigErrors> {
        let mut cfg: Config = from_yaml(file, text, vars)?;
        cfg.source = substitute(text, vars).map_err(|e| e.in_file(file))?;
        cfg.file = file.to_string();
        let mut errs = Vec::new();
        cfg.check(&mut errs);
        if errs.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigErrors(
                errs.into_iter().map(|e| e.in_file(file)).collect(),
            ))
        }
    }

    /// Read and load a config file (at most [`MAX_CONFIG_BYTES`]).
    pub fn from_file(path: &str, vars: VarLookup<'_>) -> Result<Config, ConfigErrors> {
        let text = read_limited(path, MAX_CONFIG_BYTES)
            .and_then(|b| {
                String::from_utf8(b).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text")
                })
            })
            .map_err(|e| ConfigError {
                file: path.to_string(),
                pos: None,
                message: format!("cannot read config: {e}"),
                hint: Some(match e.kind() {
                    std::io::ErrorKind::InvalidData => {
                        "a config is UTF-8 text of at most 16 MiB".into()
                    }
                    std::io::ErrorKind::InvalidInput => "pass the path of a regular file".into(),
                    _ => format!("check that the file exists and is readable: {path}"),
                }),
            })?;
        Config::from_yaml(path, &text, vars)
    }

    fn check(&self, errs: &mut Vec<ConfigError>) {
        let mut seen: Vec<(&str, &str, Pos)> = Vec::new();
        for r in &self.routes {
            let method = r.method.value.to_ascii_uppercase();
            if !r.path.value.starts_with('/') {
                errs.push(
                    ConfigError::at(
                        r.path.pos,
                        format!("route path `{}` must start with `/`", r.path.value),
                    )
                    .hint("write e.g. `/vacancies/{id}`"),
                );
            }
            if let Some((_, _, first)) = seen
                .iter()
                .find(|(m, p, _)| m.eq_ignore_ascii_case(&method) && *p == r.path.value)
            {
                errs.push(
                    ConfigError::at(
                        r.path.pos,
                        format!(
                            "duplicate route {method} {} (first defined at line {})",
                            r.path.value, first.line
                        ),
                    )
                    .hint("each method + path may appear once; merge the two routes"),
                );
            } else {
                seen.push((r.method.value.as_str(), r.path.value.as_str(), r.path.pos));
            }
            for (name, step) in &r.flow {
                step_check(name, step, errs);
            }
        }
        self.admission_check(errs);
        self.expressions_check(errs);
        for (name, b) in &self.backends {
            let urls: Vec<&Located<String>> = b.url.iter().chain(b.urls.iter()).collect();
            if urls.is_empty() {
                errs.push(
                    ConfigError {
                        file: String::new(),
                        pos: None,
                        message: format!("backend `{name}` has no `url` or `urls`"),
                        hint: None,
                    }
                    .hint("add `url: http://host:port`"),
                );
            }
            let mut bad = |what: String, hint: &str| {
                errs.push(
                    ConfigError {
                        file: String::new(),
                        pos: None,
                        message: format!("backend `{name}`: {what}"),
                        hint: None,
                    }
                    .hint(hint),
                )
            };
            if let Some(r) = &b.retry {
                if !(1..=5).contains(&r.attempts) {
                    bad(
                        format!("retry.attempts must be 1–5 (is {})", r.attempts),
                        "attempts counts the first call too; 2 means one retry",
                    );
                }
                if !(r.budget.ratio >= 0.0 && r.budget.ratio <= 1.0)
                    || r.budget.min_per_second < 0.0
                {
                    bad(
                        "retry.budget.ratio must be in [0, 1] and min_per_second ≥ 0".into(),
                        "e.g. `budget: {ratio: 0.2, min_per_second: 10}`",
                    );
                }
                if r.budget.ttl.0.is_zero() {
                    bad(
                        "retry.budget.ttl must be positive".into(),
                        "e.g. `ttl: 10s`",
                    );
                }
            }
            if let Some(h) = &b.hedge {
                if !(h.percentile > 0.0 && h.percentile < 100.0) {
                    bad(
                        format!(
                            "hedge.percentile must be between 0 and 100 (is {})",
                            h.percentile
                        ),
                        "e.g. `percentile: 95`",
                    );
                }
                if !(h.max_extra > 0.0 && h.max_extra <= 1.0) {
                    bad(
                        format!("hedge.max_extra must be in (0, 1] (is {})", h.max_extra),
                        "e.g. `max_extra: 0.1` allows 10 % extra calls",
                    );
                }
            }
            if b.outlier.consecutive_failures == 0 || b.outlier.max_ejected_percent > 100 {
                bad(
                    "outlier.consecutive_failures must be ≥ 1 and max_ejected_percent ≤ 100".into(),
                    "or turn it off with `outlier: {enabled: false}`",
                );
            }
            if b.balance.decay.0.is_zero() {
                bad("balance.decay must be positive".into(), "e.g. `decay: 10s`");
            }
            for u in urls {
                let v = &u.value;
                let ok = (v.starts_with("http://") || v.starts_with("https://"))
                    && v.split("://").nth(1).is_some_and(|rest| {
                        let host = rest.split('/').next().unwrap_or("");
                        !host.is_empty()
                    });
                if !ok {
                    errs.push(
                        ConfigError::at(u.pos, format!("backend `{name}`: invalid URL `{v}`"))
                            .hint("use http://host:port or https://host[:port], optionally with a base path"),
                    );
                }
            }
        }
    }
}

fn step_check(name: &Located<String>, step: &Step, errs: &mut Vec<ConfigError>) {
    let kinds = step.http.is_some() as u8 + step.value.is_some() as u8 + step.fail.is_some() as u8;
    if kinds != 1 {
        errs.push(
            ConfigError::at(
                name.pos,
                format!(
                    "step `{}` must have exactly one of `http`, `value` or `fail` (has {kinds})",
                    name.value
                ),
            )
            .hint("a step calls a backend (`http:`), computes a value (`value:`) or ends the request with a client answer (`fail:`)"),
        );
    }
    if let Some(f) = &step.fail {
        let mut no = |what: &str, set: bool| {
            if set {
                errs.push(
                    ConfigError::at(
                        name.pos,
                        format!("step `{}`: a `fail` step cannot have `{what}`", name.value),
                    )
                    .hint("a `fail` step only decides (with `when`) whether the request ends with its answer"),
                );
            }
        };
        no("optional", step.optional);
        no("for_each", step.for_each.is_some());
        no("result", step.result.is_some());
        no("default", step.default.is_some());
        no("on_status", !step.on_status.is_empty());
        no("missing", !matches!(step.missing, MissingPolicy::Fail));
        no("compute", step.compute);
        if !(400..=599).contains(&f.status.value) {
            errs.push(
                ConfigError::at(
                    f.status.pos,
                    format!("fail.status {} must be within 400–599", f.status.value),
                )
                .hint("e.g. 400 for invalid input, 404, 409, 422"),
            );
        }
        if !valid_code(&f.code.value) {
            errs.push(
                ConfigError::at(f.code.pos, format!("invalid fail.code `{}`", f.code.value))
                    .hint("codes are 1–64 lower-case letters, digits and `_`, e.g. `invalid_id`"),
            );
        }
    }
    if step.http.is_none() {
        if let Some((k, _)) = step.on_status.iter().next() {
            errs.push(
                ConfigError::at(
                    k.pos,
                    format!("step `{}`: `on_status` needs an `http` step", name.value),
                )
                .hint("`on_status` maps the statuses a backend answers; this step calls none"),
            );
        }
        if !matches!(step.missing, MissingPolicy::Fail) {
            errs.push(
                ConfigError::at(
                    name.pos,
                    format!("step `{}`: `missing` needs an `http` step", name.value),
                )
                .hint("`missing` applies to keys a batch lookup did not find and to 404s of `for_each` calls"),
            );
        }
    }
    for (k, a) in &step.on_status {
        if let StatusAction::Answer { code: Some(c), .. } = a
            && !valid_code(c)
        {
            errs.push(
                ConfigError::at(k.pos, format!("invalid on_status code `{c}`")).hint(
                    "codes are 1–64 lower-case letters, digits and `_`, e.g. `order_not_found`",
                ),
            );
        }
        if matches!(k.value, StatusPattern::Exact(s) if s < 300)
            || matches!(k.value, StatusPattern::Class(c) if c < 3)
        {
            errs.push(
                ConfigError::at(
                    k.pos,
                    format!(
                        "on_status `{}`: only statuses ≥ 300 reach `on_status`",
                        k.value
                    ),
                )
                .hint("2xx answers are successes; map 3xx, 4xx or 5xx statuses"),
            );
        }
    }
    let valid = name
        .value
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        errs.push(
            ConfigError::at(name.pos, format!("invalid step name `{}`", name.value))
                .hint("step names are identifiers (letters, digits, `_`) because expressions read them as `$name`"),
        );
    }
    if ["request", "item", "index", "ref", "ENV", "__loc__"].contains(&name.value.as_str()) {
        errs.push(
            ConfigError::at(name.pos, format!("step name `{}` is reserved", name.value))
                .hint("choose another name; `$request`, `$item`, `$index` and `$ref` are built in"),
        );
    }
    if step.concurrency == Some(0) {
        errs.push(ConfigError::at(
            name.pos,
            "`concurrency` must be at least 1",
        ));
    }
}

/// An `error.code` written in the config: 1–64 of `a-z 0-9 _`.
pub fn valid_code(c: &str) -> bool {
    (1..=64).contains(&c.len())
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl Config {
    fn expressions_check(&self, errs: &mut Vec<ConfigError>) {
        let x = &self.server.expressions;
        let mut bad = |what: String| {
            errs.push(
                ConfigError {
                    file: String::new(),
                    pos: None,
                    message: format!("server.expressions: {what}"),
                    hint: None,
                }
                .hint("see docs/config.md, `server.expressions`"),
            )
        };
        if !(1..=1000).contains(&x.max_depth) {
            bad(format!(
                "max_depth must be within 1..=1000 (is {})",
                x.max_depth
            ));
        }
        for (name, v) in [
            ("max_ops", x.max_ops),
            ("inline_ops", x.inline_ops),
            ("max_elements", x.max_elements as u64),
            ("max_string_bytes", x.max_string_bytes as u64),
        ] {
            if v == 0 {
                bad(format!("{name} must be at least 1"));
            }
        }
    }

    fn admission_check(&self, errs: &mut Vec<ConfigError>) {
        let a = &self.server.admission;
        let mut bad = |what: String, hint: &str| {
            errs.push(
                ConfigError {
                    file: String::new(),
                    pos: None,
                    message: format!("server.admission: {what}"),
                    hint: None,
                }
                .hint(hint),
            )
        };
        if a.max_concurrency == 0 {
            bad(
                "max_concurrency must be at least 1".into(),
                "e.g. `max_concurrency: 1024`",
            );
        }
        for (n, v) in [
            ("normal", a.shares.normal),
            ("sheddable", a.shares.sheddable),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                bad(
                    format!("shares.{n} must be in (0, 1] (is {v})"),
                    "a share is the part of the limit a class may fill, e.g. 0.5",
                );
            }
        }
        if let Some(ad) = &a.adaptive {
            if ad.min == 0 || ad.min > ad.initial || ad.initial > a.max_concurrency {
                bad(
                    format!(
                        "adaptive limit needs 1 ≤ min ≤ initial ≤ max_concurrency (min {}, initial {}, max_concurrency {})",
                        ad.min, ad.initial, a.max_concurrency
                    ),
                    "e.g. `adaptive: {min: 8, initial: 20}` with `max_concurrency: 1024`",
                );
            }
            let tolerance_ok = ad.tolerance >= 1.0;
            if !(tolerance_ok && ad.smoothing > 0.0 && ad.smoothing <= 1.0) {
                bad(
                    "adaptive.tolerance must be ≥ 1 and smoothing in (0, 1]".into(),
                    "defaults: tolerance 1.5, smoothing 0.2",
                );
            }
            if ad.window.0.is_zero() || ad.long_window == 0 {
                bad(
                    "adaptive.window and long_window must be positive".into(),
                    "defaults: window 100ms, long_window 600",
                );
            }
        }
        for r in &self.routes {
            if r.admission.max_concurrency == Some(0) {
                errs.push(ConfigError::at(
                    r.path.pos,
                    format!(
                        "route {}: admission.max_concurrency must be at least 1",
                        r.path.value
                    ),
                ));
            }
        }
    }

    /// Position of byte `offset` of expression `src`, whose YAML scalar starts at `start`.
    pub fn pos_in_scalar(&self, start: Pos, src: &str, offset: usize) -> Pos {
        pos_in_scalar(&self.source, start, src, offset)
    }
}

/// The JSON Schema of [`Config`] (what `fanout schema` prints).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default()
}
