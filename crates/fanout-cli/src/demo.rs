//! `fanout demo`: the example stubs and the gateway in one process, on an embedded config.

use crate::{RunningGateway, addr_var, load_gateway, start_gateway};
use anyhow::Context;
use std::collections::HashMap;

/// The embedded example (same files as `examples/hh-vacancies/`).
pub const GATEWAY_YAML: &str = include_str!("../../../examples/hh-vacancies/fanout.yaml");
/// Its stubs.
pub const STUBS_YAML: &str = include_str!("../../../examples/hh-vacancies/stubs.yaml");

/// A running demo: stubs plus gateway.
pub struct Demo {
    /// The stub servers.
    pub stubs: fanout_stub::StubServer,
    /// The gateway.
    pub gateway: RunningGateway,
}

/// Start the demo stubs on ephemeral ports and the gateway on `listen`.
pub async fn start(listen: &str) -> anyhow::Result<Demo> {
    let any_port = |name: &str| name.ends_with("_ADDR").then(|| "127.0.0.1:0".to_string());
    let stubs = fanout_stub::load("<embedded stubs.yaml>", STUBS_YAML, &any_port)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .start()
        .await
        .context("starting the demo stubs")?;
    let vars: HashMap<String, String> = stubs
        .services()
        .into_iter()
        .map(|(name, addr)| (addr_var(&name), addr.to_string()))
        .collect();
    let lookup = |name: &str| vars.get(name).cloned();
    let gw = load_gateway("<embedded fanout.yaml>", GATEWAY_YAML, &lookup)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let gateway = start_gateway(gw, listen, Some("127.0.0.1:0"))
        .await
        .with_context(|| format!("binding the gateway to {listen}"))?;
    Ok(Demo { stubs, gateway })
}
