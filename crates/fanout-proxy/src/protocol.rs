//! What a backend protocol brings to the gateway: the client at the bottom of a backend's stack
//! ([`crate::stack`]) and everything around its calls — its part of the status endpoint,
//! readiness, the check made when a config is loaded, its share of the memory budget and its
//! metric families. A protocol is a module implementing [`ProtocolClient`] plus one
//! [`Registration`] line in [`crate::PROTOCOLS`]; nothing else in the gateway names it. Its trace
//! attributes travel with each call ([`fanout_flow::trace::CallTrace::attributes`]), its error
//! classes with its step kind, and a reload keeps its client with the whole stack when the
//! backend's config did not change ([`crate::stack::unchanged`]).

use fanout_config::{Backend as BackendConfig, Config, ConfigError, Defaults, Protocol};
use fanout_flow::Backend;
use futures_util::future::BoxFuture;
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
    fn addresses(&self) -> Vec<crate::client::AddressStatus> {
        Vec::new()
    }
    /// `Err(why)` while the backend cannot take calls and the gateway must not report ready
    /// (`/readyz`).
    fn readiness(&self) -> Result<(), String> {
        Ok(())
    }
    /// Hold the answers it reads in the gateway's budget for in-flight data
    /// (`server.bodies.memory_budget_bytes`).
    fn share_memory_budget(&self, gate: &Arc<crate::bodies::BodyGate>) {
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
pub(crate) type Build =
    fn(&str, &BackendConfig, &Defaults) -> Result<Arc<dyn ProtocolClient>, ConfigError>;

/// A protocol's line in [`crate::PROTOCOLS`].
pub(crate) struct Registration {
    /// The `protocol:` values it serves.
    pub(crate) serves: fn(Protocol) -> bool,
    /// Its client for a backend's config (no I/O).
    pub(crate) build: Build,
    /// Its metric families, every series from the start (`/metrics`).
    pub(crate) metrics: fn(&crate::Live, &mut crate::metrics::scrape::Out<'_>) -> std::fmt::Result,
}

/// The client of backend `name`, built by the protocol that serves its `protocol:`.
pub(crate) fn client(
    name: &str,
    b: &BackendConfig,
    defaults: &Defaults,
) -> Result<Arc<dyn ProtocolClient>, ConfigError> {
    let reg = crate::PROTOCOLS
        .iter()
        .find(|r| (r.serves)(b.protocol))
        .ok_or_else(|| {
            ConfigError::at(
                Default::default(),
                format!("backend `{name}`: no client serves its protocol"),
            )
        })?;
    (reg.build)(name, b, defaults)
}
