//! The stub config (`stubs.yaml`) as typed structs: strict YAML, positions kept for errors.

use fanout_config::{Dur, Located};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use std::fmt;

/// The whole stub config: named services, each listening on its own address.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StubConfig {
    /// Simulated backends by name.
    pub services: IndexMap<String, ServiceConfig>,
}

/// One simulated backend: an address and its routes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Socket address to listen on, e.g. `127.0.0.1:9101`; port 0 picks a free port.
    pub listen: Located<String>,
    /// Routes; each matches a method and a path pattern.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
}

/// A route of a simulated backend: what it answers and how slowly.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Path pattern: `/items/{id}` captures a segment, `/files/{*rest}` the rest of the path.
    pub path: Located<String>,
    /// HTTP method; default `GET`; `*` matches any method.
    #[serde(default = "default_method")]
    pub method: Located<String>,
    /// Response status; default 200.
    #[serde(default = "default_status")]
    pub status: Located<u16>,
    /// Delay before answering: a duration (`5ms`, `1.5s`, a number of milliseconds) is fixed;
    /// or `{fixed: 5ms}`; or `{uniform: {min: 1ms, max: 10ms}}`.
    pub latency: Option<Located<LatencyConfig>>,
    /// Static response headers.
    #[serde(default)]
    pub headers: IndexMap<String, Located<String>>,
    /// Response body: a jq expression over `$request` (`{method, path, params, query, headers,
    /// body}`), evaluated per request and written as JSON. Default `null`.
    pub body: Option<Located<String>>,
    /// Response body sent byte for byte instead of `body` — e.g. malformed JSON, to test how a
    /// client handles it.
    pub raw_body: Option<Located<String>>,
}

fn default_method() -> Located<String> {
    Located::unknown("GET".to_string())
}

fn default_status() -> Located<u16> {
    Located::unknown(200)
}

/// A latency as written in the config: a bare duration (fixed) or a model.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(untagged)]
pub enum LatencyConfig {
    /// A fixed delay written as a bare duration.
    Fixed(Dur),
    /// A latency model (`{fixed: ..}` or `{uniform: {min, max}}`).
    Model(LatencyModel),
}

/// A latency model: a mapping with exactly one key naming the model.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum LatencyModel {
    /// Always the same delay.
    Fixed(Dur),
    /// Uniformly distributed between `min` and `max` (inclusive).
    Uniform(UniformLatency),
}

/// Bounds of a uniform latency.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UniformLatency {
    /// Shortest delay.
    pub min: Dur,
    /// Longest delay.
    pub max: Dur,
}

impl<'de> Deserialize<'de> for LatencyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LatencyConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a duration (`5ms`, `1.5s`, milliseconds), `{fixed: 5ms}` or \
                     `{uniform: {min: 1ms, max: 10ms}}`",
                )
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LatencyConfig, E> {
                Ok(LatencyConfig::Fixed(Dur::millis(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LatencyConfig, E> {
                u64::try_from(v)
                    .map(|v| LatencyConfig::Fixed(Dur::millis(v)))
                    .map_err(|_| E::custom("a latency cannot be negative"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<LatencyConfig, E> {
                if v.is_finite() && (0.0..1e12).contains(&v) {
                    Ok(LatencyConfig::Fixed(Dur(
                        std::time::Duration::from_secs_f64(v / 1000.0),
                    )))
                } else {
                    Err(E::custom(
                        "a latency must be a non-negative number of milliseconds",
                    ))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LatencyConfig, E> {
                Dur::parse(v).map(LatencyConfig::Fixed).map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LatencyConfig, A::Error> {
                LatencyModel::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(LatencyConfig::Model)
            }
        }
        d.deserialize_any(V)
    }
}
