//! What the gateway tells operators about each request, its parts: OpenTelemetry traces
//! ([`trace`], exported by [`export`]), the JSON access log ([`access_log`]) and `Server-Timing`
//! ([`server_timing`]). `fanout-proxy`'s `telemetry` module ties them to a request.

pub mod access_log;
pub mod export;
pub mod server_timing;
pub mod trace;
