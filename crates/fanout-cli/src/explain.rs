//! `fanout explain`: load and check a config like `fanout validate`, then describe the plan of
//! one route (or every route) as text or Mermaid (`fanout_flow::explain`).

use fanout_config::{Config, ConfigErrors, VarLookup};
use fanout_flow::explain::{self, explain_config_with};
use std::fmt;

/// The output format of `fanout explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Steps by level, timeouts, backend layers, critical path.
    Text,
    /// A Mermaid flowchart (for docs).
    Mermaid,
}

/// Why `fanout explain` printed no plan.
#[derive(Debug)]
pub enum ExplainError {
    /// The config does not load or compile (the same errors as `fanout validate`).
    Config(ConfigErrors),
    /// `--route` names no route of the config.
    UnknownRoute {
        /// What `--route` said.
        spec: String,
        /// The config's routes, one `METHOD /path` a line.
        routes: String,
    },
}

impl fmt::Display for ExplainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExplainError::Config(e) => write!(f, "{e}"),
            ExplainError::UnknownRoute { spec, routes } => write!(
                f,
                "no route `{spec}` in the config; give a path pattern or `METHOD /path`. Routes:\n{}",
                routes.trim_end()
            ),
        }
    }
}

impl std::error::Error for ExplainError {}

/// The plan of the route(s) `route` names (every route when `None`) of the config at `path`.
pub fn explain_file(
    path: &str,
    vars: VarLookup<'_>,
    route: Option<&str>,
    format: Format,
) -> Result<String, ExplainError> {
    let cfg = Config::from_file(path, vars).map_err(ExplainError::Config)?;
    // Every check the gateway makes at start (backend addresses, routes, …), not only the flows'.
    fanout_proxy::Gateway::build(&cfg).map_err(ExplainError::Config)?;
    let protos = fanout_proxy::load_protos(&cfg).map_err(ExplainError::Config)?;
    // The models as the server loads them (read once; nothing is watched).
    let models = fanout_flow::models::ModelSet::open(
        &cfg.models,
        fanout_config::config_dir(&cfg.file).as_deref(),
    )
    .map_err(|e| ExplainError::Config(fanout_config::ConfigErrors(vec![e.in_file(&cfg.file)])))?;
    let all = explain_config_with(&cfg, protos, Some(std::sync::Arc::new(models)))
        .map_err(ExplainError::Config)?;
    let routes = match route {
        None => all.routes.iter().collect(),
        Some(spec) => all.select(spec),
    };
    if routes.is_empty() {
        return Err(ExplainError::UnknownRoute {
            spec: route.unwrap_or_default().to_string(),
            routes: all.route_list(),
        });
    }
    Ok(match format {
        Format::Text => explain::text(&routes),
        Format::Mermaid => explain::mermaid(&routes),
    })
}
