//! Config of fanout: the YAML a team writes, as typed structs.
//!
//! This crate only *reads* config: `${ENV}` substitution, strict YAML deserialization (unknown
//! fields are errors) and the structural checks that need no knowledge of flows (duplicate routes,
//! bad URLs). Every error carries `line:column`. Expressions stay strings here; the flow compiler
//! (`fanout-flow`) compiles them and reports their errors at the locations kept in [`Located`].
//! The JSON Schema printed by `fanout schema` is generated from these types (schemars).

#![forbid(unsafe_code)]

mod admin;
pub mod auth;
mod backend;
mod check;
pub mod compression;
mod contract;
mod cors;
mod duration;
mod env;
mod error;
mod graphql;
mod hints;
mod load;
mod located;
mod models;
mod openapi;
mod pass;
mod postgres;
mod protos;
pub mod ratelimit;
mod redis;
mod route;
mod server;
mod stages;
mod stream;
mod telemetry;
pub mod tls;
mod unknown;
mod websocket;
pub mod yaml_tree;

pub use compression::{Compression, ContentCoding, RouteCompression};
pub use contract::{FailSpec, MissingPolicy, StatusAction, StatusPattern, StatusSrc};
pub use cors::Cors;
pub use stages::StageSections;

pub use duration::{
    BareNumber, Dur, DurationError, DurationProblem, format_duration, parse_duration,
    parse_millis_f64,
};
pub use env::substitute;
/// The did-you-mean rule ([`fanout_names`]), for the crates that already use it from here.
pub use fanout_names::{closest, did_you_mean};
pub use located::{Located, Pos, pos_in_scalar};

pub use admin::{AdminConfig, MIN_ADMIN_TOKEN_CHARS, UiConfig};
pub use backend::{
    Backend, BalanceConfig, BalanceStrategy, BatchConfig, BreakerConfig, CacheConfig,
    GrpcCompression, HedgeConfig, KeepaliveConfig, OutlierConfig, Protocol, RetryBudget,
    RetryConfig, Tls,
};
pub use check::{framing_header, shown_url, valid_code};
pub use error::{ConfigError, ConfigErrors, locate};
pub use graphql::{
    FieldRequire, GraphqlLimits, GraphqlRoute, MAX_SAFELIST_BYTES, MAX_SCHEMA_BYTES,
    PersistedQueries, SchemaSource, SharedSlot,
};
pub use load::{
    MAX_CA_FILE_BYTES, MAX_CONFIG_BYTES, VarLookup, env_lookup, from_yaml, from_yaml_all,
    read_limited, schema,
};
pub use models::{
    MAX_TREE_NODES_CEILING, ModelBatch, ModelBatchOverride, ModelCall, ModelLimits, ModelsConfig,
};
pub use openapi::{OpenApiConfig, ParamIn, RouteExample, RouteParam, RouteParams};
pub use pass::{PassForwarded, PassRoute, PassSse};
pub use postgres::{PostgresConfig, SqlCall, SqlMode, SslMode};
pub use protos::{ProtosConfig, config_dir};
pub use redis::{MAX_KEY_PREFIX_BYTES, RedisBreakerConfig, RedisConfig};
pub use route::{GrpcCall, HttpCall, Reference, Respond, Route, RouteAdmission, Step};
pub use server::{
    AdaptiveLimit, Admission, BodyLimits, ClientAddressHeader, Codel, ComputeConfig,
    ConnectionLimits, Defaults, ExpressionLimits, GrpcServer, Priority, PriorityShares,
    RuntimeKind, ServerConfig,
};
pub use stream::{MergeEnd, MergeSource, MergeStreams, StreamAnswer, StreamFormat};
pub use telemetry::{AccessLogConfig, OtlpProtocol, ServerTimingHeader, Telemetry, TracingConfig};
pub use tls::{CertificatePair, ClientAuth, ClientAuthMode, ListenerTls, TlsVersion, UnknownSni};
pub use websocket::{WebSocketRoute, WebSocketServer};

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// An expression source (jq), with its position in the file.
pub type ExprSrc = Located<String>;

/// The gateway config (`fanout.yaml`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on, e.g. `0.0.0.0:8080`. Default `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// TLS on `listen` (HTTP/1.1 and h2 by ALPN, gRPC routes included). Default: none (plain
    /// HTTP/1.1 and h2c).
    pub tls: Option<ListenerTls>,
    /// Limits of the inbound server.
    #[serde(default)]
    pub server: ServerConfig,
    /// JWT authentication: the providers routes name in `auth:` (docs/config.md#auth--authentication).
    #[serde(default)]
    pub auth: auth::AuthConfig,
    /// The admin listener: `/metrics`, `/healthz`, `/readyz`, `/__fanout/status`.
    #[serde(default)]
    pub admin: AdminConfig,
    /// Defaults applied where a route, step or backend does not say otherwise.
    #[serde(default)]
    pub defaults: Defaults,
    /// `.proto` files for gRPC routes and backends (docs/grpc.md), compiled at start.
    #[serde(default)]
    pub protos: ProtosConfig,
    /// Named backends the flows call.
    #[serde(default)]
    pub backends: IndexMap<String, Backend>,
    /// Reference data: small datasets loaded at start, refreshed in the background, read by
    /// flows as `$ref.NAME` without any call.
    #[serde(default)]
    pub reference: IndexMap<String, Reference>,
    /// A Redis shared by the gateway's instances: the second level of the answer caches of the
    /// backends with `cache: {l2: true}`. Default: none (caches are in memory only).
    pub redis: Option<RedisConfig>,
    /// HTTP compression: answers, request bodies (docs/config.md#compression). Default: off.
    #[serde(default)]
    pub compression: Compression,
    /// Named rate-limit policies that routes apply with `rate_limit:` (docs/config.md#rate-limits).
    #[serde(default)]
    pub rate_limits: ratelimit::RateLimits,
    /// The ONNX models `model` steps run (docs/models.md). Default: none.
    #[serde(default)]
    pub models: ModelsConfig,
    /// The OpenAPI document of the routes and the bounds of their declared schemas
    /// (docs/openapi.md).
    #[serde(default)]
    pub openapi: OpenApiConfig,
    /// Routes: each matches a method and path and runs a flow.
    pub routes: Vec<Route>,
    /// Traces (OpenTelemetry over OTLP) and the JSON access log; both off by default.
    #[serde(default)]
    pub telemetry: Telemetry,
    /// The config text after `${VAR}` substitution (to point inside expressions in errors).
    #[serde(skip)]
    #[schemars(skip)]
    pub source: String,
    /// File name the config came from.
    #[serde(skip)]
    #[schemars(skip)]
    pub file: String,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}

impl Config {
    /// Position of byte `offset` of expression `src`, whose YAML scalar starts at `start`.
    pub fn pos_in_scalar(&self, start: Pos, src: &str, offset: usize) -> Pos {
        pos_in_scalar(&self.source, start, src, offset)
    }
}
