//! The registries: every component the gateway is assembled from, one line each. A new backend
//! protocol, step kind, runtime or edge stage is a module (or crate) of its own plus its line here
//! (docs/ARCHITECTURE.md, "How to add …").

/// Every backend protocol, one line each ([`fanout_protocol`]; docs/ARCHITECTURE.md, "How to add
/// a backend protocol").
pub const PROTOCOLS: &[fanout_protocol::Registration] =
    &[fanout_client::PROTOCOL, fanout_postgres::PROTOCOL];

/// Every edge stage, in the order they run on a request (`fanout_edge`; docs/ARCHITECTURE.md,
/// "How to add an edge stage").
pub const STAGES: &[fanout_edge::Registration] = &[
    fanout_edge::ip_filter::STAGE,
    fanout_edge::auth::STAGE,
    fanout_edge::rate_limit::STAGE,
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
}

impl Default for Registry {
    fn default() -> Self {
        Registry::standard()
    }
}
