//! Limits and settings of the inbound server (`server:`) and the config-wide `defaults:`.

use crate::Dur;
use schemars::JsonSchema;
use serde::Deserialize;

/// Limits of the inbound HTTP server. Every limit has a default.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Largest accepted request body in bytes; larger bodies get 413. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Inbound gRPC (routes with `grpc:`): message size, reflection, health (docs/grpc.md).
    pub grpc: GrpcServer,
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
    /// On SIGTERM/Ctrl-C, time between reporting not-ready on `/readyz` and starting to drain,
    /// while still serving (so a load balancer or Kubernetes Service stops sending first);
    /// default 0s (set it to the probe period, e.g. 5s, behind one).
    pub drain_delay: Dur,
    /// On shutdown, long-lived streams (Server-Sent Events, WebSockets) end at times spread
    /// evenly over this window instead of all at once, so their clients reconnect to other
    /// instances gradually; default 0s (all at once). Shorter than `shutdown_grace`.
    pub drain_spread: Dur,
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
    /// Lets a client that sends `header` with the value `token` get a `Server-Timing` answer
    /// header on any route (each step's duration, for the browser's devtools). Absent: only
    /// routes with `server_timing: true` send it.
    pub server_timing: Option<crate::ServerTimingHeader>,
    /// Proxies (CIDRs, e.g. `10.0.0.0/8`, or addresses) whose word about the client is taken:
    /// when the previous hop is one of them, the client address (`$request.client.address`, rate
    /// limits, the access log) is read from `client_address_header`, right to left, skipping
    /// trusted hops. Default: none (the socket's address).
    pub trusted_proxies: Vec<String>,
    /// Where trusted proxies put the client address: `forwarded` (RFC 7239 `for=`) or
    /// `x-forwarded-for`. Default `x-forwarded-for`.
    pub client_address_header: ClientAddressHeader,
    /// How requests are spread over the cores: `work_stealing` (one runtime whose worker threads
    /// take each other's tasks) or `per_core` (one single-threaded runtime per core, each with
    /// its own listener on the same port (`SO_REUSEPORT`) and its own backend connections: a
    /// request stays on the core that accepted it). Like every `server` setting, a change takes
    /// effect at the next restart. Default `per_core`.
    pub runtime: RuntimeKind,
    /// Limits every WebSocket route shares (docs/config.md#websocket-routes).
    pub websockets: crate::WebSocketServer,
}

/// How requests are spread over the cores (`server.runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// One multi-threaded runtime: its workers steal each other's tasks.
    WorkStealing,
    /// One single-threaded runtime per core, a listener each (`SO_REUSEPORT`); connections
    /// are balanced between cores as they arrive, and HTTP/2 streams are handed to a less busy
    /// core when theirs is much busier than it. The default: under load it costs less CPU per
    /// request than work stealing, or the same (docs/benchmarks.md).
    #[default]
    PerCore,
}

impl RuntimeKind {
    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::WorkStealing => "work_stealing",
            RuntimeKind::PerCore => "per_core",
        }
    }
}

/// The header trusted proxies put the client address in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ClientAddressHeader {
    /// `Forwarded: for=…` (RFC 7239).
    Forwarded,
    /// `X-Forwarded-For: client, proxy1, …`.
    #[default]
    XForwardedFor,
}

/// Limits of client connections. Every connection ends: a timeout closes it (counted by kind on
/// `/__fanout/status`), and at the connection cap the oldest idle connections are closed first.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
    /// Memory all in-flight data may use, in bytes, counted at the estimated size of the parsed
    /// value (two bytes per byte plus 96 per `,` `:` `[` `{`): each request body from the moment
    /// it is read until its request ends; each backend answer from before it is parsed until its
    /// request's run ends (a `sql` step's rows at their JSON size as they arrive). A request that
    /// would exceed it gets 503 `memory_budget_exhausted`. Default 256 MiB.
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
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
    /// Refuse at once (503 `overloaded`, reason `expected_wait`) a request that would have to
    /// wait longer than it may (`queue_timeout`, `codel.target` under a standing queue, or its
    /// deadline), judged from the mean time a request holds a slot (per route with its own
    /// `max_concurrency`, else over all routes), the age of the oldest request running and the
    /// waiters ahead — instead of queueing it only for it to give up. No estimate until requests
    /// have completed. Default true.
    pub predict_wait: bool,
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
            predict_wait: true,
            adaptive: None,
            shares: PriorityShares::default(),
        }
    }
}

/// CoDel queue settings (Facebook "Fail at Scale": M = 5ms, N = 100ms).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body_bytes: 1 << 20,
            grpc: GrpcServer::default(),
            max_header_bytes: 16 << 10,
            max_concurrent_streams: 256,
            header_read_timeout: Dur::secs(10),
            deadline_header: "x-request-timeout".into(),
            shutdown_grace: Dur::secs(10),
            drain_delay: Dur::secs(0),
            drain_spread: Dur::secs(0),
            admission: Admission::default(),
            compute: ComputeConfig::default(),
            stall_threshold: Dur::millis(100),
            expressions: ExpressionLimits::default(),
            connections: ConnectionLimits::default(),
            bodies: BodyLimits::default(),
            request_id_header: "x-request-id".into(),
            expose_error_details: false,
            error_log_per_second: 1000,
            server_timing: None,
            trusted_proxies: Vec::new(),
            client_address_header: ClientAddressHeader::XForwardedFor,
            runtime: RuntimeKind::default(),
            websockets: crate::WebSocketServer::default(),
        }
    }
}

/// Inbound gRPC settings (`server.grpc`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcServer {
    /// Largest request message accepted, in bytes; a larger one is refused with
    /// RESOURCE_EXHAUSTED (never more than this is read). Default 4 MiB.
    pub max_message_bytes: usize,
    /// Serve server reflection (`grpc.reflection.v1` and `v1alpha`) so `grpcurl` and other
    /// tools can list and call the routes' methods without the `.proto` files. Default true.
    pub reflection: bool,
    /// Serve `grpc.health.v1.Health/Check` (Kubernetes gRPC probes): SERVING while the gateway is
    /// ready (`/readyz`), NOT_SERVING otherwise. Default true.
    pub health: bool,
    /// Longest a reflection stream stays open. Default 60s.
    pub stream_timeout: Dur,
    /// Compress answer messages with gzip (`grpc-encoding: gzip`) for the clients whose
    /// `grpc-accept-encoding` lists gzip. Compressed requests are accepted either way. Default
    /// true.
    pub compress_answers: bool,
    /// Answer messages smaller than this are sent uncompressed (compressing a few bytes costs
    /// more than it saves). Default 1024.
    pub compress_min_bytes: usize,
}

impl Default for GrpcServer {
    fn default() -> Self {
        GrpcServer {
            max_message_bytes: 4 << 20,
            reflection: true,
            health: true,
            stream_timeout: Dur::secs(60),
            compress_answers: true,
            compress_min_bytes: 1024,
        }
    }
}

/// Defaults for routes, steps and backends.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
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
    /// Whole-request coalescing of the routes that do not set `coalesce` and whose steps only
    /// read; default true. `false` makes every such route compute each request itself (the lab
    /// sets it so that fanout does the same work as the baselines it is compared with).
    pub coalesce: bool,
    /// In-flight dedup of the backends that do not set `dedup`; default true. `false` makes
    /// every call its own (with `coalesce: false`, what the lab sets so that fanout makes every
    /// backend call the baselines make).
    pub dedup: bool,
    /// CORS of the routes that do not set `cors` (docs/config.md#cors). Default: off.
    pub cors: Option<crate::Cors>,
    /// The rate-limit policies (names of `rate_limits:`) of the routes that set no
    /// `rate_limit`. Default: none.
    pub rate_limit: Vec<crate::Located<String>>,
    /// Authentication of the routes that do not set `auth`; default none.
    pub auth: Option<crate::auth::RouteAuth>,
    /// Compression of the routes that do not set `compression`; `off` turns answer
    /// compression off for them. Default on (as `compression.response` says).
    pub compression: Option<crate::RouteCompression>,
    /// The edge stages' sections for the routes that do not write their own
    /// (docs/config.md#stages): a route's section of a stage replaces this one.
    pub stages: crate::StageSections,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            deadline: Dur::secs(1),
            timeout: Dur::secs(1),
            connect_timeout: Dur::millis(500),
            concurrency: 16,
            coalesce: true,
            dedup: true,
            cors: None,
            rate_limit: Vec::new(),
            auth: None,
            compression: None,
            stages: crate::StageSections::default(),
        }
    }
}
