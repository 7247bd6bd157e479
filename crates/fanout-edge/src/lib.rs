//! fanout's edge: the stages every request goes through between its connection and its flow,
//! whatever its route kind (HTTP, gRPC, and every later kind). A stage is a type implementing
//! [`EdgeStage`] plus one [`Registration`] line in `fanout-proxy`'s `registry.rs`
//! (`STAGES`, in the order the stages run); it owns its config section (`stages.NAME` on routes
//! and in `defaults`, read by [`BuildCx::read`]), its build and reload (it is handed the stage it
//! replaces), its readiness, its section of the status endpoint, its metric families and what
//! `fanout explain` prints of it. The gateway holds one [`StageSet`] per loaded config and runs
//! each route's stages on the request head ([`StageSet::on_request`]); a stage that applies to no
//! route costs nothing.
//!
//! Besides the contract: the client's address as trusted proxies resolve it ([`client`]) and the
//! stages themselves, one module each.

#![forbid(unsafe_code)]

pub mod access_log;
pub mod auth;
pub mod client;
pub mod compression;
pub mod cors;
pub mod ip_filter;
pub mod rate_limit;
pub mod request_id;
mod stage;
pub mod tls;

/// The metrics text writer a stage's families go through (the protocols' own).
pub use fanout_protocol::metrics;

pub use client::{Cidr, ClientAddresses};
pub use stage::{
    Answer, AnswerNotes, Arrival, BodyStep, Build, BuildCx, Degraded, Done, Early, EdgeStage,
    Later, Lent, LogWant, LogWants, Namer, RedisConnect, Registration, Rejection, RequestHead,
    RouteKind, Router, StageSet, Step, TlsOf, Tools,
};
