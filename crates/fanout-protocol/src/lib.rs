//! What a backend protocol brings to the gateway, and what the gateway lends it — the one crate
//! both the inbound side (`fanout-proxy`) and each protocol's crate (`fanout-client` for HTTP
//! and gRPC, one crate per other protocol) depend on, so neither names the other.
//!
//! A protocol's client sits at the bottom of a backend's stack (`fanout-proxy`'s `stack.rs`) and
//! brings everything around its calls — its part of the status endpoint, readiness, the check
//! made when a config is loaded, its share of the memory budget and its metric families. A
//! protocol is a crate implementing [`ProtocolClient`] plus one [`Registration`] line in
//! `fanout-proxy`'s `PROTOCOLS`; nothing else in the gateway names it. Its trace attributes
//! go on each attempt's span ([`fanout_layers::trace::AttemptSpan::set_attributes`]), its
//! error classes with its step kind, and a reload keeps its client with the whole stack when
//! the backend's config did not change.
//!
//! What the gateway lends: the in-flight memory budget ([`bodies`]), the metrics text writer
//! ([`metrics`]), the header scan ([`headers`]) and the roots a backend's TLS trusts ([`tls`]).

#![forbid(unsafe_code)]

pub mod bodies;
pub mod headers;
pub mod metrics;
pub mod tls;

use fanout_config::{Backend as BackendConfig, Config, ConfigError, Defaults, Protocol};
use fanout_layers::Backend;
use futures_util::future::BoxFuture;
use http::HeaderName;
use std::any::Any;
use std::sync::Arc;

/// A backend protocol's client, one per backend.
pub trait ProtocolClient: Send + Sync + 'static {
    /// The client as the bottom layer of the backend's stack: what the layers above call.
    fn service(self: Arc<Self>) -> Arc<dyn Backend>;
    /// The client's part of `/__fanout/status` (an object; the stack adds its layers' parts).
    fn status_json(&self) -> serde_json::Value;
    /// The addresses the client balances over, for the status endpoint and the backend metrics
    /// (none by default).
    fn addresses(&self) -> Vec<AddressStatus> {
        Vec::new()
    }
    /// `Err(why)` while the backend cannot take calls and the gateway must not report ready
    /// (`/readyz`).
    fn readiness(&self) -> Result<(), String> {
        Ok(())
    }
    /// Hold the answers it reads in the gateway's budget for in-flight data
    /// (`server.bodies.memory_budget_bytes`).
    fn share_memory_budget(&self, gate: &Arc<bodies::BodyGate>) {
        let _ = gate;
    }
    /// The check made when `config` is loaded (at start and on reload, before it takes effect):
    /// `Ok(errors)` are config errors at their lines (a `sql` step's statement the database
    /// refuses); `Err(why)`: the backend could not be reached to check (the gateway is not ready
    /// until it is, and the client checks again when it connects).
    fn check<'a>(
        &'a self,
        backend: &'a str,
        config: &'a Arc<Config>,
    ) -> BoxFuture<'a, Result<Vec<ConfigError>, String>> {
        let _ = (backend, config);
        Box::pin(async { Ok(Vec::new()) })
    }
    /// The client as `Any`: its protocol's metrics read their own type.
    fn as_any(&self) -> &dyn Any;
}

/// Builds a protocol's client for backend `name`'s config (no I/O).
pub type Build =
    fn(&str, &BackendConfig, &Shared<'_>) -> Result<Arc<dyn ProtocolClient>, ConfigError>;

/// What every backend's client of one config is built with beside its own section.
pub struct Shared<'a> {
    /// `defaults:`.
    pub defaults: &'a Defaults,
    /// `server.deadline_header`: the header an HTTP call carries the time its attempt may take
    /// in (the client writes it on every call; a protocol without headers ignores it).
    pub deadline_header: &'a HeaderName,
}

/// A protocol's line in `fanout-proxy`'s `PROTOCOLS`.
pub struct Registration {
    /// The `protocol:` values it serves.
    pub serves: fn(Protocol) -> bool,
    /// Its client for a backend's config (no I/O).
    pub build: Build,
    /// Its metric families, every series from the start (`/metrics`).
    pub metrics: fn(&Scope<'_>, &mut metrics::Out<'_>) -> std::fmt::Result,
}

/// What a protocol's metrics read of the live config: every backend's client (each protocol
/// picks its own with [`ProtocolClient::as_any`]). What a protocol's step kind counts per step
/// is written by a runtime of the protocol's crate (the `sql` steps' counters).
pub struct Scope<'a> {
    /// Each backend's name and client, in config order.
    pub backends: &'a [(&'a str, &'a dyn ProtocolClient)],
}

/// One address's state, for `/__fanout/status` and the backend metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressStatus {
    /// The base URL.
    pub address: String,
    /// Balancer and ejection state.
    pub state: AddressSnapshot,
}

/// What `/__fanout/status` shows per address.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressSnapshot {
    /// Index into the backend's addresses.
    pub index: usize,
    /// Calls in flight now.
    pub in_flight: u32,
    /// Current (decayed) peak-EWMA latency, ms.
    pub ewma_ms: f64,
    /// `healthy`, `ejected` or `probation`.
    pub state: &'static str,
    /// Ejected or on probation.
    pub ejected: bool,
    /// Remaining ejection time, ms (0 unless ejected).
    pub ejected_for_ms: u64,
    /// Ejections counted towards the next ejection time.
    pub times_ejected: u32,
    /// Failures in a row now.
    pub consecutive_failures: u32,
    /// Calls finished (any outcome but cancelled).
    pub calls: u64,
    /// Failures in total.
    pub failures: u64,
    /// Ejections in total.
    pub ejections: u64,
}

/// The client of backend `name`, built by the first of `protocols` that serves its `protocol:`.
pub fn client(
    protocols: &[Registration],
    name: &str,
    b: &BackendConfig,
    shared: &Shared<'_>,
) -> Result<Arc<dyn ProtocolClient>, ConfigError> {
    let reg = protocols
        .iter()
        .find(|r| (r.serves)(b.protocol))
        .ok_or_else(|| {
            ConfigError::at(
                Default::default(),
                format!("backend `{name}`: no client serves its protocol"),
            )
        })?;
    (reg.build)(name, b, shared)
}
