//! Routes and their flows (`routes:`), and reference datasets (`reference:`).

use crate::{
    Dur, ExprSrc, FailSpec, Located, MissingPolicy, Priority, StatusAction, StatusPattern,
    StatusSrc,
};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// A route's admission settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RouteAdmission {
    /// Priority class; default `normal`.
    pub priority: Priority,
    /// Most requests of this route running at once (on top of the listener's limit). Default: none.
    pub max_concurrency: Option<usize>,
}

/// A reference dataset.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// How to fetch it (expressions may not read steps; there is no request).
    pub http: HttpCall,
    /// Maps the answer (`.`) to the dataset, e.g. `.masks | map({key: .name, value: .fields}) |
    /// from_entries`.
    pub result: Option<ExprSrc>,
    /// Refresh period; default 5m.
    #[serde(default = "default_refresh")]
    pub refresh: Dur,
    /// When true, the gateway starts even if the first load fails (the dataset is `null` until a
    /// refresh succeeds). Default false: startup fails clearly.
    #[serde(default)]
    pub optional: bool,
}

fn default_refresh() -> Dur {
    Dur::secs(300)
}

/// A route: a method + path and the flow that answers it (or the backend it passes to).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Path pattern; `{name}` captures a segment (`$request.params.name`), `{*rest}` the rest.
    /// Required unless the route is a gRPC method (`grpc`).
    #[serde(default = "no_path")]
    pub path: Located<String>,
    /// HTTP method; default GET (POST for a `grpc` route).
    #[serde(default = "default_method")]
    pub method: Located<String>,
    /// Serve this gRPC method (`package.Service/Method`, from the `protos:` files) instead of an
    /// HTTP path: the request message is `$request.body` (proto3 JSON), the `respond.body` result
    /// becomes the answer message. The route's path is `/package.Service/Method`, its method POST
    /// (so JSON clients can call it too). See docs/grpc.md.
    pub grpc: Option<Located<String>>,
    /// Total time budget of a request; the client may shorten it (header or `grpc-timeout`).
    /// Defaults to `defaults.deadline`.
    pub deadline: Option<Dur>,
    /// Priority class and optional per-route concurrency limit.
    #[serde(default)]
    pub admission: RouteAdmission,
    /// The steps, by name. Order does not matter: dependencies come from the expressions.
    #[serde(default)]
    pub flow: IndexMap<Located<String>, Step>,
    /// How to build the response. Required unless the route is a pass-through route (`pass`).
    pub respond: Option<Respond>,
    /// Forward the request to one backend and stream its answer back as it is, instead of a
    /// flow: any content type, any size (docs/config.md#pass-through-routes).
    pub pass: Option<crate::PassRoute>,
    /// Relay WebSockets to one backend instead of a flow: the handshake (HTTP/1.1 `Upgrade` or
    /// HTTP/2 extended CONNECT) checked and forwarded, then messages both ways
    /// (docs/config.md#websocket-routes).
    pub websocket: Option<crate::WebSocketRoute>,
    /// Serve a GraphQL schema instead of a flow: fields resolved by steps, operations by POST
    /// (and GET without a `method`) at the route's path (docs/graphql.md).
    pub graphql: Option<crate::GraphqlRoute>,
    /// Stream the answer as the steps complete instead of once at the end: each `for_each`
    /// element or step value an event (SSE or NDJSON), the route's answer the last
    /// (docs/config.md#streamed-answers).
    pub stream: Option<crate::StreamAnswer>,
    /// Answer with a `Server-Timing` header: each finished step's duration and the total, so a
    /// browser's devtools show where the time went. Default false.
    #[serde(default)]
    pub server_timing: bool,
    /// Whole-request coalescing: concurrent requests that would compute the same answer (equal
    /// in every part of the request the flow's expressions read) share one run of the flow.
    /// Default: on when every step only reads (GET/HEAD `http`, gRPC methods without side
    /// effects, read-only `sql`, keyed lookups, `model`, `value`, `fail`); `false` turns it off;
    /// `true` on a route with a step that writes is an error. See docs/config.md#coalescing.
    pub coalesce: Option<Located<bool>>,
    /// CORS for browser pages on other origins; replaces `defaults.cors` for this route
    /// (`cors: {enabled: false, origins: []}` turns it off). See docs/config.md#cors.
    pub cors: Option<crate::Cors>,
    /// The rate-limit policies (names of `rate_limits:`) this route applies, in order; `[]`
    /// applies none. Default: `defaults.rate_limit`.
    pub rate_limit: Option<Vec<Located<String>>>,
    /// Authentication: who may call this route (docs/config.md#auth--authentication). Defaults to
    /// `defaults.auth`.
    pub auth: Option<crate::auth::RouteAuth>,
    /// `off`: this route's answers are never compressed (answers mixing secrets with reflected
    /// input: BREACH). Defaults to `defaults.compression` (on).
    pub compression: Option<crate::RouteCompression>,
    /// The edge stages' sections for this route, by stage name (docs/config.md#stages); each
    /// replaces the stage's section in `defaults.stages`.
    #[serde(default)]
    pub stages: crate::StageSections,
    /// One line about the route, for its OpenAPI operation (docs/openapi.md).
    pub summary: Option<String>,
    /// What the route does, for its OpenAPI operation (Markdown).
    pub description: Option<String>,
    /// The OpenAPI tags that group the route.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Marked deprecated in the OpenAPI document. Default false.
    #[serde(default)]
    pub deprecated: bool,
    /// The route's path and query parameters, typed: documented, and a request whose value
    /// does not match is refused with 400 `invalid_request` before its body is read.
    #[serde(default)]
    pub parameters: crate::RouteParams,
    /// JSON Schema (2020-12) of the request body, inline or a file name (JSON or YAML, beside
    /// the config): documented, and a body that does not match is refused with 400
    /// `invalid_request` before admission and any backend call (flow routes).
    #[schemars(with = "Option<serde_json::Value>")]
    pub request_schema: Option<serde_json::Value>,
    /// JSON Schema (2020-12) of the answer body, inline or a file name: documented (and checked
    /// by `fanout test --schemas`).
    #[schemars(with = "Option<serde_json::Value>")]
    pub answer_schema: Option<serde_json::Value>,
    /// Examples of requests and answers, by name, for the OpenAPI document.
    #[serde(default)]
    pub examples: IndexMap<String, crate::RouteExample>,
}

fn no_path() -> Located<String> {
    Located::unknown(String::new())
}

pub(crate) fn default_method() -> Located<String> {
    Located::unknown("GET".to_string())
}

/// One step of a flow: a backend call (`http`, `grpc`, `sql`), a computed value (`value`) or a
/// guard (`fail`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Run the step only when this expression is true; otherwise its value is `default` (or null).
    pub when: Option<ExprSrc>,
    /// Run the step once per element of this list (the element is `$item`, its index `$index`);
    /// the step's value is the list of results in input order.
    pub for_each: Option<ExprSrc>,
    /// Maximum calls in flight for a `for_each` step; defaults to `defaults.concurrency`.
    pub concurrency: Option<usize>,
    /// Timeout of each call of this step (capped by the remaining deadline).
    pub timeout: Option<Dur>,
    /// An optional step that fails takes its `default` value and is listed in `_partial`;
    /// a required step (the default) that fails fails the request.
    #[serde(default)]
    pub optional: bool,
    /// Value used when the step is skipped (`when` false) or, if optional, fails. JSON/YAML value.
    #[schemars(with = "Option<serde_json::Value>")]
    pub default: Option<serde_json::Value>,
    /// Maps the backend's answer (`.`) to the step's value, e.g. `.items`.
    pub result: Option<ExprSrc>,
    /// Call an HTTP backend.
    pub http: Option<HttpCall>,
    /// Call a gRPC method of a `protocol: grpc` backend.
    pub grpc: Option<GrpcCall>,
    /// Run one SQL statement on a database backend: `backend`, `query`, `params`, `mode`.
    pub sql: Option<crate::SqlCall>,
    /// Run an ONNX model of `models.dir` on features computed from the flow (docs/models.md).
    pub model: Option<crate::ModelCall>,
    /// Compute a value from other steps without any call.
    pub value: Option<ExprSrc>,
    /// Evaluate this step's `value`/`result` on the compute pool (for large transforms), so the
    /// worker thread keeps serving other requests. Default false.
    #[serde(default)]
    pub compute: bool,
    /// End the request with a client answer (status, code, message) when this step runs — with
    /// `when`, a guard such as input validation that answers 400 before any backend is called.
    pub fail: Option<FailSpec>,
    /// What the client gets when the backend answers an error status: status (`404`) or class
    /// (`4xx`, `5xx`) → a status to answer, `pass` (the backend's), `default` (not a failure:
    /// the step's value is its `default`), or `{status, code, message}`. Unlisted statuses: 404
    /// answers 404 `not_found` naming the step, every other 4xx/5xx answers 502
    /// `backend_status` (the backend's status with its `status_passthrough`).
    #[serde(default)]
    #[schemars(with = "std::collections::BTreeMap<String, StatusAction>")]
    pub on_status: IndexMap<Located<StatusPattern>, StatusAction>,
    /// Keys a batch lookup (`http.key`) did not find, and elements of a `for_each` `http` step
    /// whose call answered 404: `fail` (default: the step fails, 404 `key_not_found` for keys),
    /// `skip` (left out of the list), `null`, or `{value: EXPRESSION}` (per element, reads
    /// `$item`/`$index`). Steps with missing elements are listed in `_partial`.
    #[serde(default)]
    pub missing: MissingPolicy,
}

/// An HTTP call of a step. Every part except `backend` and `method` is an expression.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpCall {
    /// Name of a backend under `backends:`.
    pub backend: Located<String>,
    /// HTTP method; default GET.
    #[serde(default = "default_method")]
    pub method: Located<String>,
    /// Path (and optionally query) expression, e.g. `"/items/\($item)"`. Required unless `key`.
    pub path: Option<ExprSrc>,
    /// Look up one key through the backend's `batch` form instead of building a call: lookups
    /// of all steps that start together (and, with `batch.window`, of concurrent requests) are
    /// merged into batch calls. With `for_each`, one key per element.
    pub key: Option<ExprSrc>,
    /// Query parameters: name → expression (null values are left out; arrays repeat the name).
    #[serde(default)]
    pub query: IndexMap<String, ExprSrc>,
    /// Headers: name → expression (null values are left out).
    #[serde(default)]
    pub headers: IndexMap<String, ExprSrc>,
    /// JSON body expression (sent as `application/json`).
    pub body: Option<ExprSrc>,
    /// Whether the call may be retried or hedged. Default: true for GET/HEAD, false otherwise.
    pub idempotent: Option<bool>,
}

/// A gRPC call of a step (unary). The answer message, as proto3 JSON, is the step's answer (`.`
/// in `result`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrpcCall {
    /// Name of a backend under `backends:` with `protocol: grpc`.
    pub backend: Located<String>,
    /// The method, `package.Service/Method`, from the `protos:` files.
    pub method: Located<String>,
    /// The request message as JSON (jq), checked against the method's input type when it is
    /// built (a field the type does not have fails the step, naming it). Default `{}`.
    pub message: Option<ExprSrc>,
    /// Metadata (request headers): name → expression (null values are left out).
    #[serde(default)]
    pub metadata: IndexMap<String, ExprSrc>,
    /// Whether the call may be retried or hedged (and, with them, deduplicated and cached).
    /// Default: what the `.proto` says (`option idempotency_level = NO_SIDE_EFFECTS` or
    /// `IDEMPOTENT`), else false.
    pub idempotent: Option<bool>,
}

/// The response of a route.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Respond {
    /// Body expression (JSON), e.g. `{total: $search.total, items: $details}`.
    pub body: ExprSrc,
    /// Status code, or an expression giving one (e.g. `'if $found then 200 else 404 end'`);
    /// default 200.
    #[serde(default)]
    pub status: StatusSrc,
    /// Response headers: name → expression.
    #[serde(default)]
    pub headers: IndexMap<String, ExprSrc>,
}
