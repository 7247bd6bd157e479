//! The cases file (`cases.yaml`): requests, what the gateway must answer to each, and what each
//! simulated backend must have received. `fanout schema --cases` prints its JSON Schema; the
//! user guide is `docs/testing.md`.

use fanout_config::{ConfigError, ConfigErrors, Located};
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A cases file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cases {
    /// The cases, run in file order, each against freshly zeroed backend counters.
    pub cases: Vec<Located<Case>>,
}

impl Cases {
    /// Parse a cases file's text; errors are `FILE:LINE:COL: message` like the gateway
    /// config's. `${VARS}` are not substituted (a case's text is taken as it is written).
    pub fn parse(file: &str, text: &str) -> Result<Cases, ConfigErrors> {
        // no variables in a cases file: `${…}` reaches the case as written
        let escaped = text.replace("${", "$${");
        let cases: Cases =
            fanout_config::from_yaml_all(file, &escaped, &|_| None).map_err(|mut errs| {
                for e in &mut errs.0 {
                    if let Some(h) = &mut e.hint {
                        *h = h.replace("`fanout schema`", "`fanout schema --cases`");
                    }
                }
                errs
            })?;
        let errs = cases.check(text);
        if errs.is_empty() {
            Ok(cases)
        } else {
            Err(ConfigErrors(
                errs.into_iter().map(|e| e.in_file(file)).collect(),
            ))
        }
    }

    /// What the types do not say: every `expect` compiles as jq, every `backends:` status is
    /// an HTTP status. A mistake here is a mistake in the file (exit 2), not a failing case.
    fn check(&self, text: &str) -> Vec<ConfigError> {
        let mut errs = Vec::new();
        for case in &self.cases {
            for pred in &case.value.expect {
                if let Err(e) = fanout_expr::Expr::compile(&pred.value, PREDICATE_VARS) {
                    let pos = fanout_config::pos_in_scalar(text, pred.pos, &pred.value, e.offset);
                    let hint = e.hint.unwrap_or_else(|| {
                        "`expect` entries are jq predicates over the answer (docs/testing.md#the-cases-file): check brackets, quotes and `|`".into()
                    });
                    errs.push(
                        ConfigError::at(
                            pos,
                            format!(
                                "expect `{}`: {}",
                                super::diff::clip(&pred.value, 80),
                                e.message
                            ),
                        )
                        .hint(hint),
                    );
                }
            }
            if let Some(st) = &case.value.stream {
                let given = [
                    st.value.events.is_some(),
                    st.value.lines.is_some(),
                    st.value.chunks.is_some(),
                ];
                if given.iter().filter(|g| **g).count() != 1 {
                    errs.push(
                        ConfigError::at(st.pos, "`stream` needs exactly one of `events`, `lines`, `chunks`")
                            .hint("`events` for Server-Sent Events, `lines` for NDJSON, `chunks` for any other body"),
                    );
                }
            }
            for o in case.value.backends.values() {
                if let Some(s) = &o.status
                    && http::StatusCode::from_u16(s.value).is_err()
                {
                    errs.push(
                        ConfigError::at(s.pos, format!("invalid status {}", s.value))
                            .hint("a status is a number from 100 to 999"),
                    );
                }
            }
        }
        errs
    }

    /// Read and [`Cases::parse`] a file.
    pub fn load_file(path: &str) -> Result<Cases, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![fanout_config::ConfigError {
                path: None,
                file: path.to_string(),
                pos: None,
                message: format!("cannot read cases file: {e}"),
                hint: None,
            }])
        })?;
        Cases::parse(path, &text)
    }
}

/// The variables of an `expect` predicate besides the answer (`.`).
pub(crate) const PREDICATE_VARS: &[&str] = &["status", "headers"];

/// The JSON Schema of the cases file (`fanout schema --cases`).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Cases)).unwrap_or_default()
}

/// One request and what the gateway must answer to it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// What the case shows; `fanout test FILE NAME…` runs the cases whose name contains NAME.
    pub name: String,
    /// The request to send.
    pub request: CaseRequest,
    /// The expected status.
    pub status: u16,
    /// Headers the answer must have, with exactly these values (names in any case).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The expected JSON answer, exactly (numbers compare by value: `1` equals `1.0`).
    /// `fanout test --update` rewrites it with the actual answer.
    pub response: Option<Located<serde_json::Value>>,
    /// A part of the answer that must be in it: every key of an object given here must be in
    /// the answer's object with a matching value (recursively); an array matches an array of
    /// the same length whose items match in order; any other value must be equal.
    pub response_includes: Option<serde_json::Value>,
    /// jq predicates that must each give `true`, over the answer's JSON body (`.`), with
    /// `$status` (a number) and `$headers` (an object of lower-case names to values).
    #[serde(default)]
    #[schemars(extend("default" = []))]
    pub expect: Vec<Located<String>>,
    /// The answer must be complete within this many milliseconds of the request being sent
    /// (wall time, including the simulated backends' latencies).
    pub max_latency_ms: Option<u64>,
    /// Requests each simulated backend must have received for this case: a count, or
    /// `{count, routes: {"METHOD /pattern": n}, calls: [{method, path, query, headers, body}]}`.
    #[serde(default)]
    pub backend_calls: BTreeMap<String, BackendCalls>,
    /// Per-case changes to simulated backends (every route of the service), undone after the
    /// case.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendOverride>,
    /// Texts the gateway's log line for this request (found by its `x-request-id`, which the
    /// request must set) must contain: the detail the client does not see.
    #[serde(default)]
    pub log: Vec<String>,
    /// A streamed answer: the Server-Sent Events, NDJSON lines or chunks expected, in order
    /// (the body is read as it arrives, up to `stream.max_events`, the stream's end or the
    /// runner's timeout).
    pub stream: Option<Located<ExpectedStream>>,
}

/// A streamed answer a case expects ([`Case::stream`]): exactly one of `events`, `lines` and
/// `chunks`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedStream {
    /// Server-Sent Events, in order (comments not counted): as many as the answer sends (or
    /// `max_events`), each with the fields given here (`event`, `id`, `data`).
    pub events: Option<Vec<ExpectedEvent>>,
    /// NDJSON: the lines as JSON values, in order, as many as the answer sends (or
    /// `max_events`), each equal to its line (numbers by value).
    pub lines: Option<Vec<serde_json::Value>>,
    /// Texts the body must contain in this order, each after the previous one, however its
    /// bytes were split into chunks on the way.
    pub chunks: Option<Vec<String>>,
    /// Stop reading after this many events (or lines) and close the answer: for streams that
    /// never end. Default: read to the stream's end (bounded by the runner's timeout).
    pub max_events: Option<usize>,
}

/// An expected Server-Sent Event; only the fields given are compared.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedEvent {
    /// The `event:` field (absent: the default type, `message`).
    pub event: Option<String>,
    /// The `id:` field.
    pub id: Option<String>,
    /// The `data:` (lines joined by `\n`): JSON data is compared with this value as JSON
    /// (numbers by value), other data with this text.
    pub data: Option<serde_json::Value>,
}

/// The request of a [`Case`].
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    /// The method (default GET).
    #[serde(default = "default_method")]
    pub method: String,
    /// Path and query, e.g. `/vacancies?text=rust`.
    pub path: String,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A JSON body, sent as compact text (with `content-type: application/json` unless
    /// `headers` sets one).
    pub body: Option<serde_json::Value>,
}

fn default_method() -> String {
    "GET".into()
}

impl CaseRequest {
    /// The method; `None` when it is not a valid HTTP method.
    pub fn method(&self) -> Option<http::Method> {
        http::Method::from_bytes(self.method.as_bytes()).ok()
    }

    /// The body as sent: the compact JSON text, or empty.
    pub fn body_text(&self) -> bytes::Bytes {
        self.body
            .as_ref()
            .map(|b| bytes::Bytes::from(b.to_string()))
            .unwrap_or_default()
    }
}

impl Case {
    /// The expected number of calls per service, for the services given a total count.
    pub fn call_counts(&self) -> BTreeMap<String, u64> {
        self.backend_calls
            .iter()
            .filter_map(|(svc, c)| {
                let n = match c {
                    BackendCalls::Count(n) => Some(*n),
                    BackendCalls::Detailed(d) => d.count,
                };
                n.map(|n| (svc.clone(), n))
            })
            .collect()
    }
}

/// What a backend must have received: a count, or a count with counts per route.
// Read by hand rather than as an untagged enum, so that a mistake inside the detailed form (an
// unknown field) is reported as itself, at its place, not as "no variant matched".
#[derive(Debug, Clone, JsonSchema)]
#[serde(untagged)]
pub enum BackendCalls {
    /// Requests the service received, all routes together.
    Count(u64),
    /// A count, and per route.
    Detailed(DetailedCalls),
}

impl<'de> Deserialize<'de> for BackendCalls {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<BackendCalls, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = BackendCalls;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a count of calls, or {count, routes, calls}")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<BackendCalls, E> {
                Ok(BackendCalls::Count(n))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<BackendCalls, A::Error> {
                DetailedCalls::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(BackendCalls::Detailed)
            }
        }
        d.deserialize_any(V)
    }
}

/// The detailed form of [`BackendCalls`].
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetailedCalls {
    /// Requests the service received, all routes together.
    pub count: Option<u64>,
    /// Requests per route of the stubs file, keyed `"METHOD /pattern"` as in the stub's stats
    /// (`"GET /vacancies/{id}"`).
    #[serde(default)]
    pub routes: BTreeMap<String, u64>,
    /// Calls the service must have received, each matched to a different received call (in
    /// any order: concurrent calls arrive in any order); received calls not listed are allowed
    /// (`count` bounds them).
    #[serde(default)]
    pub calls: Vec<ExpectedCall>,
}

/// A call a backend must have received ([`DetailedCalls::calls`]); only the fields given are
/// compared.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedCall {
    /// The method.
    pub method: Option<String>,
    /// The path, without the query, exactly (`/vacancies/101`).
    pub path: Option<String>,
    /// Query parameters the call must have, with these values (decoded; a repeated parameter
    /// is a list); others may be there too.
    #[serde(default)]
    pub query: BTreeMap<String, serde_json::Value>,
    /// Headers the call must have, with these values (names in any case); others may be there
    /// too.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The JSON body, exactly.
    pub body: Option<serde_json::Value>,
}

/// A change to a simulated backend for one case.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendOverride {
    /// Answer this status instead (100 to 999).
    pub status: Option<Located<u16>>,
    /// Answer this JSON body instead (sent as it is; the route's body expression is not run).
    pub body: Option<serde_json::Value>,
    /// Answer after this many milliseconds instead of the route's latency.
    pub latency_ms: Option<u64>,
    /// A fault on every request.
    pub fault: Option<FaultName>,
}

/// A fault injected by [`BackendOverride::fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum FaultName {
    /// The backend drops every connection without answering (TCP reset once the request is
    /// read): the gateway sees a refused/reset call.
    #[serde(rename = "down")]
    Down,
    /// The backend never answers: the gateway's timeout for it fires.
    #[serde(rename = "slow")]
    Slow,
    /// The backend answers 503 with a JSON error body.
    #[serde(rename = "5xx")]
    ServerError,
    /// The backend resets the connection (TCP RST) instead of answering.
    #[serde(rename = "reset")]
    Reset,
}
