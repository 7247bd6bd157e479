//! Simulated backends for fanout: `fanout stub --config stubs.yaml`, end-to-end tests, the demo
//! and the load lab.
//!
//! A stub config names services; each listens on its own address (port 0 = ephemeral) and serves
//! HTTP/1.1 and h2c on the same port. A route matches a method and a path pattern (matchit syntax:
//! `/items/{id}`, `/files/{*rest}`) and answers with a status, static headers and a JSON body
//! computed per request by a jq expression over `$request` (`{method, path, params, query,
//! headers, body}`), after a latency drawn from its [`Latency`] model:
//!
//! ```yaml
//! services:
//!   search:
//!     listen: "${SEARCH_ADDR:-127.0.0.1:9101}"
//!     routes:
//!       - path: /search
//!         method: GET                  # default GET; "*" = any method
//!         status: 200                  # default 200
//!         latency: 5ms                 # or a model, see below
//!         headers: { x-a: "1" }
//!         body: '{items: [range(3) | {id: ., q: $request.query.text}]}'
//!         faults:                      # tried in order, at most one fires per request
//!           - {status: 503, p: 0.01}
//!           - {reset: {}, p: 0.001}
//! ```
//!
//! Latency models ([`LatencyModel`]): `{fixed: 5ms}`, `{uniform: {min, max}}`,
//! `{normal: {mean, sd}}` (truncated at 0), `{lognormal: {median, sigma}}` (WireMock's
//! parameters), `{mixture: [{p, latency}, ...]}` and `{stall: {every, duration, base}}`
//! (periodic freezes aligned to the server's start). Faults ([`FaultConfig`]): `status`,
//! `reset` (TCP RST), `hang`, `slow_body`, `malformed`, `close_after_headers`, `grpc_status`.
//! The user guide is `docs/stubs.md`.
//!
//! Every route counts requests started, completed, in flight (and the maximum), and *aborted* —
//! handlers dropped before they finished because the client went away (connection closed, or an
//! HTTP/2 stream reset). Every service counts open and total connections. Tests read the counters
//! in process ([`StubServer::stats`]) or over HTTP (`GET /__stub/stats`, `POST /__stub/reset` on
//! every service port).
//!
//! A route with `sse:` answers a **Server-Sent Events** stream (`text/event-stream`): its
//! events sent one by one after their delays, repeated, numbered and resumed after the client's
//! `Last-Event-ID`, then ended or held open; its stats count the streams open and those the
//! client left (`events.rs`).
//!
//! Per route, the stats also count the faults fired by kind and report the *overshoot* of the
//! stub's sleeps (actual minus requested delay, p50/p99/max in µs): the proof that the stub was
//! not the bottleneck.
//!
//! A route can instead serve a unary **gRPC method** (`grpc: demo.v1.Users/GetUser`, from the
//! `.proto` files of the top-level `protos:` section, compiled once at load): the request message
//! is decoded to JSON as `$request.body`, the body expression's result is encoded as the answer
//! message, and the status travels in trailers (`grpc_status` answers another code). HTTP/2
//! (h2c) and HTTP/1.1 share every port; latency, faults, counters and the admin API work for
//! gRPC routes as for HTTP ones (route key `POST /package.Service/Method`).
//!
//! In process, [`StubServer::record_calls`] keeps the requests each service receives (route,
//! method, path, query, headers, body; at most a given number per service) for
//! [`StubServer::recorded_calls`]: what `fanout test` checks a case's backend calls against.
//!
//! A route's [`Behaviour`] sits in a [`BehaviourCell`] and can be replaced while running:
//! whole ([`StubServer::set_behaviour`]) or field by field with a [`RouteUpdate`]
//! ([`StubServer::update_route`], or `PUT /__stub/routes` over HTTP; `GET /__stub/routes`
//! lists the current latency and faults of every route).

#![warn(missing_docs)]

mod admin;
mod body;
mod compile;
mod config;
mod conn;
mod events;
mod fault;
mod latency;
mod precise;
mod record;
mod server;
mod stats;
mod ws;

pub use admin::{RouteUpdate, RouteUpdateError, RouteView};
pub use compile::{ADMIN_PREFIX, Behaviour, BehaviourCell, CompiledStubs};
pub use config::{
    FaultAction, FaultConfig, GrpcCode, LatencyConfig, LatencyModel, LognormalLatency, MixtureArm,
    NoArgs, NormalLatency, RouteConfig, ServiceConfig, SlowBodyConfig, SseConfig, SseEvent,
    SseThen, StallLatency, StubConfig, TimerKind, UniformLatency,
};
pub use events::EventPlan;
pub use fault::{Fault, FaultKind, MAX_SLOW_BODY_CHUNKS};
pub use latency::{
    Latency, MAX_DELAY, PROBABILITY_TOLERANCE, WeightedLatency, stall_hold, with_rng,
};
pub use record::RecordedCall;
pub use server::{MAX_BODY_BYTES, MAX_GRPC_MESSAGE_BYTES, StubError, StubServer};
pub use stats::{FaultCounts, RouteStats, ServiceStats};

use fanout_config::{ConfigError, ConfigErrors, VarLookup};
use std::path::Path;

/// Load a stub config from YAML text (`${VAR}` substitution via `vars`), check it and compile
/// its body expressions and `.proto` files. `file` names the source in errors
/// (`FILE:LINE:COL: message`); relative `protos:` paths are relative to its directory.
pub fn load(file: &str, text: &str, vars: VarLookup<'_>) -> Result<CompiledStubs, ConfigErrors> {
    load_in(file, text, vars, fanout_config::config_dir(file).as_deref())
}

/// [`load`] with relative `protos:` paths resolved against `dir` (`None`: the current
/// directory) instead of `file`'s directory — for configs that come from no file (embedded in a
/// program, written to a temporary directory with their `.proto` files).
pub fn load_in(
    file: &str,
    text: &str,
    vars: VarLookup<'_>,
    dir: Option<&Path>,
) -> Result<CompiledStubs, ConfigErrors> {
    let cfg: StubConfig = fanout_config::from_yaml_all(file, text, vars)?;
    let source = fanout_config::substitute(text, vars).map_err(|e| e.in_file(file))?;
    compile::compile(&cfg, &source, dir).map_err(|errs| compile::in_file(errs, file))
}

/// Read and [`load`] a stub config file.
pub fn load_file(path: &str, vars: VarLookup<'_>) -> Result<CompiledStubs, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        path: None,
        file: path.to_string(),
        pos: None,
        message: format!("cannot read stub config: {e}"),
        hint: Some("check the path passed with --config".into()),
    })?;
    load(path, &text, vars)
}

/// The JSON Schema of the stub config.
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(StubConfig)).unwrap_or_default()
}

/// The variable a stub service's address is published under, by convention of the examples, the
/// demo and the lab: service `search` listens on `${SEARCH_ADDR}` and gateways reach it there.
pub fn addr_var(service: &str) -> String {
    let upper: String = service
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{upper}_ADDR")
}
