//! fanout's HTTP layer — the only crate that knows HTTP transports: the inbound server
//! ([`server`]), the pooled backend client ([`client`]), and [`Gateway`], which ties a compiled
//! plan to a router.

pub mod client;
pub mod server;

use fanout_config::{Config, ConfigError, ConfigErrors, ServerConfig};
use fanout_flow::{Backend, RoutePlan};
use http::HeaderName;
use std::collections::HashMap;
use std::sync::Arc;

pub use client::HttpBackend;
pub use server::serve;

/// A ready-to-serve gateway: routes compiled into plans, backends with their pools.
pub struct Gateway {
    router: matchit::Router<Vec<Arc<RoutePlan>>>,
    limits: ServerConfig,
    deadline_header: HeaderName,
    /// The address from the config.
    pub listen: String,
}

impl Gateway {
    /// Build everything from a loaded config: backends (no network I/O), the plan, the router.
    pub fn build(cfg: &Config) -> Result<Gateway, ConfigErrors> {
        let mut backends: HashMap<String, Arc<dyn Backend>> = HashMap::new();
        let mut errs = Vec::new();
        for (name, b) in &cfg.backends {
            match HttpBackend::new(name, b, &cfg.defaults) {
                Ok(hb) => {
                    // Layers, innermost first: the HTTP client, then in-flight de-duplication.
                    let mut layered: Arc<dyn Backend> = Arc::new(hb);
                    if b.dedup {
                        layered = Arc::new(fanout_flow::dedup::Dedup::new(layered));
                    }
                    backends.insert(name.clone(), layered);
                }
                Err(e) => errs.push(e.in_file(&cfg.file)),
            }
        }
        if !errs.is_empty() {
            return Err(ConfigErrors(errs));
        }
        let plan = fanout_flow::compile(cfg, &backends)?;
        let mut router: matchit::Router<Vec<Arc<RoutePlan>>> = matchit::Router::new();
        let mut by_path: Vec<(String, Vec<Arc<RoutePlan>>)> = Vec::new();
        for r in &plan.routes {
            match by_path.iter_mut().find(|(p, _)| *p == r.path) {
                Some((_, v)) => v.push(r.clone()),
                None => by_path.push((r.path.clone(), vec![r.clone()])),
            }
        }
        for (path, plans) in by_path {
            if let Err(e) = router.insert(path.clone(), plans) {
                let pos = cfg
                    .routes
                    .iter()
                    .find(|r| r.path.value == path)
                    .map(|r| r.path.pos)
                    .unwrap_or_default();
                errs.push(
                    ConfigError::at(pos, format!("route path `{path}` conflicts with another route: {e}"))
                        .hint("`{name}` captures one segment and `{*rest}` the rest; two patterns may not overlap ambiguously")
                        .in_file(&cfg.file),
                );
            }
        }
        if !errs.is_empty() {
            return Err(ConfigErrors(errs));
        }
        Ok(Gateway {
            router,
            limits: cfg.server.clone(),
            deadline_header: plan.deadline_header.clone(),
            listen: cfg.listen.clone(),
        })
    }
}
