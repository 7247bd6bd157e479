//! What the routes promise, for the OpenAPI document (`fanout openapi`, the admin listener's
//! `/openapi.json`) and for request validation at the edge: the document's own section
//! (`openapi:`) and the route fields that describe a route (`summary`, `tags`, `parameters`,
//! `request_schema`, `answer_schema`, `examples`, …). Schemas are JSON Schema 2020-12, compiled
//! when the config loads (`fanout-openapi`); see docs/openapi.md.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// The OpenAPI document's `info` and the bounds of the routes' declared schemas.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OpenApiConfig {
    /// The document's `info.title`. Default `fanout gateway`.
    pub title: String,
    /// The document's `info.version` (the API's version, not fanout's). Default `0.0.0`.
    pub version: String,
    /// The document's `info.description`. Default: none.
    pub description: Option<String>,
    /// The document's `servers` (URLs clients call). Default: the listener's address (`https://`
    /// with `tls:`).
    pub servers: Vec<String>,
    /// Whether the admin listener serves the document at `/openapi.json`. Default true.
    pub serve: bool,
    /// Whether `format` (`date-time`, `email`, `uuid`, …) is asserted when requests are
    /// validated (JSON Schema 2020-12 makes it an annotation only). Default true.
    pub validate_formats: bool,
    /// Largest declared schema (request, answer or parameter), in bytes of its JSON text: a
    /// larger one is a config error. Default 65536.
    pub max_schema_bytes: usize,
    /// Deepest declared schema (nested objects and arrays of its JSON): a deeper one is a config
    /// error. Default 32.
    pub max_schema_depth: usize,
}

impl Default for OpenApiConfig {
    fn default() -> Self {
        OpenApiConfig {
            title: "fanout gateway".to_string(),
            version: "0.0.0".to_string(),
            description: None,
            servers: Vec::new(),
            serve: true,
            validate_formats: true,
            max_schema_bytes: 65536,
            max_schema_depth: 32,
        }
    }
}

/// Where a route's parameter is: a segment of its path or a query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParamIn {
    /// A `{name}` of the route's path.
    Path,
    /// A query parameter (`?name=`).
    Query,
}

/// A parameter of a route, typed: documented in the OpenAPI document and checked on each
/// request (400 `invalid_request`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteParam {
    /// `path` or `query`. Default: `path` when the route's path has `{NAME}`, else `query`.
    #[serde(rename = "in")]
    pub location: Option<ParamIn>,
    /// JSON Schema (2020-12) of the value. A parameter is text: with `type` `integer`,
    /// `number` or `boolean` the text is read as one first (a text that is not one fails
    /// `type`); with `type: array` each repetition of a query parameter is an element. Default
    /// `{type: string}`.
    #[schemars(with = "Option<serde_json::Value>")]
    pub schema: Option<serde_json::Value>,
    /// Whether a request must have it. Default: true for a path parameter, false for a query
    /// parameter.
    pub required: Option<bool>,
    /// What it means, for the document.
    pub description: Option<String>,
}

/// An example of a route's request and answer, for the document.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteExample {
    /// One line about it.
    pub summary: Option<String>,
    /// A request body (JSON/YAML value).
    #[schemars(with = "Option<serde_json::Value>")]
    pub request: Option<serde_json::Value>,
    /// An answer body (JSON/YAML value).
    #[schemars(with = "Option<serde_json::Value>")]
    pub answer: Option<serde_json::Value>,
}

/// A route's typed parameters, by name (`parameters:`).
pub type RouteParams = IndexMap<String, RouteParam>;
