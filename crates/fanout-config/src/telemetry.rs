//! What the gateway tells operators about each request (`telemetry:`): OpenTelemetry traces
//! exported over OTLP, and the JSON access log. Both are off by default. `Server-Timing` is
//! opted into per route (`routes[].server_timing`) or by a trusted header
//! (`server.server_timing`), see [`ServerTimingHeader`].

use crate::{Dur, Located};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// Traces and the access log. Everything here is off unless configured.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Telemetry {
    /// OpenTelemetry traces: a span per request, per step and per backend call attempt,
    /// exported over OTLP. Off when absent.
    pub tracing: Option<TracingConfig>,
    /// The access log: one JSON line per request. Off by default.
    pub access_log: AccessLogConfig,
}

/// OTLP trace export.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// Where spans are sent: the full OTLP/HTTP traces URL, e.g.
    /// `http://127.0.0.1:4318/v1/traces` (http or https).
    pub otlp_endpoint: Located<String>,
    /// OTLP protocol; only `http/protobuf`.
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// Share of traces recorded and exported, 0.0–1.0, for requests that arrive without a
    /// `traceparent` (by trace id, so every span of a trace is kept or dropped together); a
    /// client's `traceparent` decides by its sampled flag. Default 1.0.
    #[serde(default = "one")]
    pub sampling_ratio: f64,
    /// `service.name` of the exported spans. Default `fanout`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Finished spans waiting for export; when full, spans are dropped and counted
    /// (`telemetry.tracing.dropped` on the status endpoint). Default 8192.
    #[serde(default = "default_queue_size")]
    pub queue_size: usize,
    /// Most spans per export request. Default 512.
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// Longest time a finished span waits before its batch is sent. Default 1s.
    #[serde(default = "default_batch_delay")]
    pub batch_delay: Dur,
    /// Time one export request may take; a failed or timed-out batch is dropped and counted.
    /// Default 10s.
    #[serde(default = "default_export_timeout")]
    pub export_timeout: Dur,
    /// Headers sent with every export request (e.g. an API key for a hosted backend).
    #[serde(default)]
    pub headers: IndexMap<String, String>,
}

/// OTLP protocols.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// The access log.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogConfig {
    /// Write one JSON line per request. Default false.
    pub enabled: bool,
    /// Share of requests logged, 0.0–1.0 (chosen at random per request). Default 1.0.
    pub sample_ratio: f64,
    /// Also log every degraded (partial) or failed (5xx) answer, whatever `sample_ratio` says.
    /// Default true.
    pub always_log_degraded: bool,
    /// Where lines go: `stdout`, `stderr`, or a file path (appended to). Default `stdout`.
    pub output: String,
    /// Lines waiting for the writer thread; when full, lines are dropped and counted
    /// (`access_log.dropped` on the status endpoint), never waited for. Default 8192.
    pub queue_size: usize,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            enabled: false,
            sample_ratio: 1.0,
            always_log_degraded: true,
            output: "stdout".into(),
            queue_size: 8192,
        }
    }
}

/// Who may ask for `Server-Timing` by header.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerTimingHeader {
    /// The request header that asks for `Server-Timing`, e.g. `x-fanout-timing`.
    pub header: String,
    /// The value the header must have (compared in constant time); use a secret, e.g.
    /// `"${FANOUT_TIMING_TOKEN}"`. An empty token disables the header.
    pub token: String,
}

fn one() -> f64 {
    1.0
}

fn default_service_name() -> String {
    "fanout".into()
}

fn default_queue_size() -> usize {
    8192
}

fn default_max_batch() -> usize {
    512
}

fn default_batch_delay() -> Dur {
    Dur::secs(1)
}

fn default_export_timeout() -> Dur {
    Dur::secs(10)
}
