//! The registries: every component the gateway is assembled from, one line each. A new backend
//! protocol, step kind, runtime or edge stage is a module (or crate) of its own plus its line here
//! (docs/ARCHITECTURE.md, "How to add …").

use fanout_config::{Config, ConfigError, ConfigErrors};
use fanout_flow::runtime::Runtimes;
use fanout_flow::{Backend, Carry, Plan};
use std::collections::HashMap;
use std::sync::Arc;

/// Every backend protocol, one line each ([`fanout_protocol`]; docs/ARCHITECTURE.md, "How to add
/// a backend protocol").
pub const PROTOCOLS: &[fanout_protocol::Registration] =
    &[fanout_client::PROTOCOL, fanout_postgres::PROTOCOL];

/// Every edge stage, in the order they run on a request (`fanout_edge`; docs/ARCHITECTURE.md,
/// "How to add an edge stage").
pub const STAGES: &[fanout_edge::Registration] = &[
    fanout_edge::request_id::STAGE,
    fanout_edge::tls::STAGE,
    fanout_edge::cors::STAGE,
    fanout_edge::compression::STAGE,
    fanout_edge::ip_filter::STAGE,
    fanout_edge::auth::STAGE,
    fanout_edge::rate_limit::STAGE,
    fanout_edge::access_log::STAGE,
];

/// The components a gateway is assembled from: the standard ones ([`Registry::standard`]), plus
/// the stages a program that embeds the gateway adds ([`Registry::with_stage`]).
#[derive(Clone)]
pub struct Registry {
    stages: Vec<fanout_edge::Registration>,
}

impl Registry {
    /// The gateway's own components: [`STAGES`].
    pub fn standard() -> Registry {
        Registry {
            stages: STAGES.to_vec(),
        }
    }

    /// With one more edge stage, run after the others.
    pub fn with_stage(mut self, stage: fanout_edge::Registration) -> Registry {
        self.stages.push(stage);
        self
    }

    /// The edge stages, in the order they run.
    pub fn stages(&self) -> &[fanout_edge::Registration] {
        &self.stages
    }

    /// The config's JSON Schema with each stage's section (`stages:` on routes and in
    /// `defaults`): the registered names only, each with its own schema.
    pub fn schema(&self) -> serde_json::Value {
        let mut schema = fanout_config::schema();
        let sections: serde_json::Map<String, serde_json::Value> = self
            .stages
            .iter()
            .filter(|r| r.section)
            .map(|r| {
                let s = r.schema.map_or_else(
                    || serde_json::json!({ "type": "object" }),
                    |f| {
                        let mut s = f();
                        if let Some(o) = s.as_object_mut() {
                            o.remove("$schema");
                        }
                        s
                    },
                );
                (r.name.to_string(), s)
            })
            .collect();
        if let Some(defs) = schema
            .pointer_mut("/$defs/StageSections")
            .and_then(|v| v.as_object_mut())
        {
            defs.insert("properties".into(), serde_json::Value::Object(sections));
            defs.insert(
                "additionalProperties".into(),
                serde_json::Value::Bool(false),
            );
        }
        schema
    }
}

/// The JSON Schema of a config of the standard gateway (what `fanout schema` prints).
pub fn schema() -> serde_json::Value {
    Registry::standard().schema()
}

impl Default for Registry {
    fn default() -> Self {
        Registry::standard()
    }
}

/// Every step kind beside the engine's own (`http`, keyed lookups, `grpc`, `fail`, `value`), one
/// line each, given to the flow compiler ([`compile`]; docs/ARCHITECTURE.md, "How to add a step
/// kind").
pub const STEP_KINDS: &[fanout_flow::kind::Registration] = &[
    fanout_postgres::STEP_KIND,
    fanout_model::STEP_KIND,
    fanout_graphql::STEP_KIND,
];

/// Every runtime step kinds use, one line each, opened for each config ([`open_runtimes`]).
pub const RUNTIMES: &[fanout_flow::runtime::Registration] = &[
    fanout_model::runtime::RUNTIME,
    fanout_postgres::STEP_COUNTERS,
];

/// Open every runtime of [`RUNTIMES`] for `cfg`, keeping those of `prev` (the running config and
/// its runtimes) whose inputs did not change.
pub fn open_runtimes(
    cfg: &Config,
    prev: Option<(&Config, &Runtimes)>,
) -> Result<Runtimes, ConfigError> {
    Runtimes::open(RUNTIMES, cfg, prev)
}

/// Compile `cfg`'s flows with every step kind of [`STEP_KINDS`] ([`fanout_flow::compile_with`]).
pub fn compile(
    cfg: &Config,
    backends: &HashMap<String, Arc<dyn Backend>>,
    carry: Carry,
) -> Result<Plan, ConfigErrors> {
    fanout_flow::compile_with(cfg, backends, STEP_KINDS, carry)
}

#[cfg(test)]
mod tests {
    /// The classes of every registered step kind are among the flow's error kinds (metrics
    /// export each from the start), and no code means two things.
    #[test]
    fn every_step_kinds_error_classes_are_registered_once() {
        let all = fanout_flow::error_kinds(super::STEP_KINDS);
        for c in [
            "conflict",
            "database_unavailable",
            "bad_parameter",
            "model_queue_full",
        ] {
            assert!(all.iter().any(|k| k.code() == c), "{c} is not registered");
        }
        let mut seen = std::collections::BTreeMap::new();
        for k in &all {
            if let Some(prev) = seen.insert(k.code(), *k) {
                assert_eq!(prev.status(), k.status(), "{} means two things", k.code());
            }
        }
    }
}
