//! `fanout-load`: the open-model HTTP and gRPC load generator behind `fanout load` and the load
//! lab.
//!
//! * **Open model.** A [`Schedule`] in Yandex.Tank syntax (`const(r,d)`, `line(a,b,d)`,
//!   `step(a,b,s,d)`) fixes the *intended* send time of every request in advance. A request's
//!   latency is `done − intended`, so a stalled target shows up in full (no coordinated
//!   omission); `done − actual send` is kept as `service_ms` — what a closed-loop tool reports.
//! * **Pacing.** A dedicated pacer thread sleeps (nanosleep, ~70 µs overshoot, not tokio's 1 ms
//!   timer) until just before the next due time, finishes with a short spin budgeted to 5 % of
//!   a core, then releases *every* request due by now in one batch to the connection workers.
//!   The lag `dispatch − intended` is measured for every request; when its p99 exceeds
//!   [`LoadSpec::lag_threshold`] the run is reported **invalid** instead of as a fantasy rate.
//! * **Connections** grow on demand up to [`LoadSpec::max_connections`] (HTTP/1.1: one request
//!   in flight per connection; HTTP/2: many streams per connection); HTTP/2 and gRPC can instead
//!   open [`LoadSpec::open_connections`] up front and spread the requests over all of them. Beyond the cap requests
//!   queue — their intended time keeps ticking — and whatever is still queued after the drain
//!   is counted as `not_sent`, never dropped silently.
//! * **Results**: [`LoadReport`] (the `--json` schema, see README.md) with HdrHistogram
//!   percentiles, status classes, network errors by class, per-second [`SecondStats`] (also
//!   streamed to a progress callback), k6-style [`Threshold`]s and a [`summary_text`].
//! * **gRPC** (unary): [`grpc_request`] turns `pkg.Service/Method` and a JSON message into a
//!   template (the framed protobuf built once); with [`Protocol::Grpc`] (h2c) every answer is
//!   judged by its `grpc-status` and counted by code name in [`LoadReport::grpc_status`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use fanout_load::{LoadSpec, Schedule, run, summary_text};
//! let spec = LoadSpec::new("http://127.0.0.1:8080", Schedule::parse("const(1000,30s)")?);
//! let report = run(&spec, Some(&|s: &fanout_load::SecondStats| eprintln!("{s:?}"))).await?;
//! print!("{}", summary_text(&report));
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod conn;
pub mod grpc;
mod recorder;
mod report;
mod runner;
mod schedule;
mod threshold;
mod tls;

pub use grpc::{GrpcTemplateError, grpc_request, load_protos};
pub use report::{
    ErrorCounts, LagStats, LatencyStats, LoadReport, SecondHistograms, SecondStats, SendSecond,
    StatusClasses, empty_histogram, summary_text,
};
pub use runner::run;
pub use schedule::{Profile, Schedule, ScheduleError};
pub use threshold::{LatencyField, Metric, Op, Threshold, ThresholdError, check_thresholds};
pub use tls::TlsOptions;

/// The histogram crate, re-exported so users can name [`LoadReport`]'s raw histograms.
pub use hdrhistogram;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// What to send, where, and how fast.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Base URL, e.g. `http://127.0.0.1:8080` (a path prefix is allowed: `http://h:1/api`);
    /// `https://` speaks TLS ([`LoadSpec::tls`]; ALPN `h2` for HTTP/2 and gRPC).
    pub target: String,
    /// Requests sent round robin (request `n` uses template `n % len`).
    pub requests: Vec<RequestTemplate>,
    /// When to send (parsed from Tank syntax).
    pub schedule: Schedule,
    /// HTTP/1.1 (default), HTTP/2 with prior knowledge (h2c), or unary gRPC over h2c (answers
    /// judged by `grpc-status`; templates from [`grpc_request`]).
    pub protocol: Protocol,
    /// Cap of the connection pool (default 512). HTTP/1.1: one request in flight per
    /// connection. HTTP/2: the number of connections, each carrying up to 100 streams.
    pub max_connections: usize,
    /// HTTP/2 and gRPC: open this many connections before the schedule starts and send the
    /// requests over them round robin, one request per connection in turn — many clients, each
    /// with a connection of its own, as a server behind a fleet of callers sees them (default 0:
    /// connections open on demand, each carrying up to 100 streams). The pool may still grow on
    /// demand up to `max(max_connections, open_connections)`. HTTP/1.1: an error.
    pub open_connections: usize,
    /// Notified once, right before the schedule's time zero, after the pre-opened connections
    /// are open and their handshakes settled — a caller measuring the target's CPU over the
    /// schedule starts there, so 1 000 handshakes are not charged to the requests.
    pub on_start: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// Per-request timeout (default 10 s), counted from the dispatch (a new connection's
    /// connect time included). Timeouts are counted as errors and recorded at the timeout value.
    pub timeout: Duration,
    /// The run is invalid when the scheduling-lag p99 exceeds this (default 1 ms); sends later
    /// than this are counted in `late_fraction`.
    pub lag_threshold: Duration,
    /// After the schedule ends, how long to wait for in-flight and queued requests (default =
    /// `timeout`); then in-flight ones count as `aborted_at_end`, queued ones as `not_sent`.
    pub drain: Duration,
    /// `https://` targets: the roots to trust, or none; session resumption.
    pub tls: TlsOptions,
    /// Count the Server-Sent Events in the answers' bodies (default off): each blank line that
    /// ends an event (`\n\n`, also across frames; the `\n` line ends fanout's stub writes) is
    /// one, reported in [`LoadReport::events`]. Bodies are read a frame at a time as always,
    /// nothing is held: the scan keeps one byte of state per answer.
    pub count_events: bool,
}

impl LoadSpec {
    /// Default [`LoadSpec::max_connections`].
    pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
    /// Default [`LoadSpec::timeout`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default [`LoadSpec::lag_threshold`].
    pub const DEFAULT_LAG_THRESHOLD: Duration = Duration::from_millis(1);

    /// A spec with defaults: `GET /` over HTTP/1.1, 512 connections, 10 s timeout and drain,
    /// 1 ms lag threshold.
    pub fn new(target: impl Into<String>, schedule: Schedule) -> LoadSpec {
        LoadSpec {
            target: target.into(),
            requests: vec![RequestTemplate::get("/")],
            schedule,
            protocol: Protocol::Http1,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            open_connections: 0,
            on_start: None,
            timeout: Self::DEFAULT_TIMEOUT,
            lag_threshold: Self::DEFAULT_LAG_THRESHOLD,
            drain: Self::DEFAULT_TIMEOUT,
            tls: TlsOptions::default(),
            count_events: false,
        }
    }
}

/// One request to send (its URL is the target's base joined with `path`).
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// HTTP method.
    pub method: http::Method,
    /// Path and query, e.g. `/search?q=x` (joined to the target's base path).
    pub path: String,
    /// Extra headers (`Host` is set from the target unless given here).
    pub headers: Vec<(String, String)>,
    /// Request body (empty for none).
    pub body: Bytes,
}

impl RequestTemplate {
    /// A `GET` of `path` without headers or body.
    pub fn get(path: impl Into<String>) -> RequestTemplate {
        RequestTemplate {
            method: http::Method::GET,
            path: path.into(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }
}

/// The protocol spoken to the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 with keep-alive, one request in flight per connection.
    #[default]
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (h2c), multiplexed.
    Http2,
    /// Unary gRPC: HTTP/2 over cleartext with prior knowledge, like [`Protocol::Http2`], but an
    /// answer succeeds only with `grpc-status: 0` (in the trailers, or in the headers of a
    /// trailers-only answer); every answer is counted by its gRPC code in
    /// [`LoadReport::grpc_status`]. Requests carry `content-type: application/grpc` and
    /// `te: trailers` (added when a template lacks them); build them with [`grpc_request`].
    Grpc,
}

impl Protocol {
    /// Whether this is spoken over HTTP/2 (h2c, prior knowledge): `Http2` and `Grpc`.
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Http1 => "http1",
            Protocol::Http2 => "http2",
            Protocol::Grpc => "grpc",
        })
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Protocol, String> {
        match s.to_ascii_lowercase().as_str() {
            "http1" | "h1" | "http/1.1" | "http1.1" => Ok(Protocol::Http1),
            "http2" | "h2" | "h2c" | "http/2" => Ok(Protocol::Http2),
            "grpc" => Ok(Protocol::Grpc),
            _ => Err(format!(
                "unknown protocol `{s}`; expected http1, http2 (h2c) or grpc"
            )),
        }
    }
}

/// Why a run could not start. Problems *during* the run (refused connections, timeouts…) are
/// results, counted in the [`LoadReport`], not errors.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The target URL is unusable.
    #[error("invalid target `{target}`: {reason}")]
    Target {
        /// The target as given.
        target: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The target's host name did not resolve.
    #[error("cannot resolve `{authority}`: {source}")]
    Resolve {
        /// `host:port`.
        authority: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// A request template cannot be turned into a request.
    #[error("request #{index}: {reason}")]
    Request {
        /// Index in [`LoadSpec::requests`].
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A spec field is out of range.
    #[error("invalid load spec: {0}")]
    Spec(&'static str),
    /// [`run`] was polled outside a tokio runtime.
    #[error("fanout_load::run must be called from within a tokio runtime")]
    NoRuntime,
    /// The pacer thread could not be started.
    #[error("cannot start the pacer thread: {0}")]
    Pacer(std::io::Error),
}
