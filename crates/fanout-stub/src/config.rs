//! The stub config (`stubs.yaml`) as typed structs: strict YAML, positions kept for errors.
//!
//! The latency and fault forms here are also what the admin API accepts as JSON
//! (`PUT /__stub/routes`) and prints back (`GET /__stub/routes`), so they serialize to the same
//! shapes they are read from.

use fanout_config::{Dur, Located, ProtosConfig};
use fanout_grpc::Code;
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// The whole stub config: named services, each listening on its own address.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StubConfig {
    /// The `.proto` files whose methods `grpc:` routes serve (the same section as in
    /// `fanout.yaml`); relative paths are relative to the stub config's directory.
    #[serde(default)]
    pub protos: Option<ProtosConfig>,
    /// Simulated backends by name.
    pub services: IndexMap<String, ServiceConfig>,
    /// The timer delays are slept on: `tokio` (default; 1 ms granularity — a delay ends on the
    /// first millisecond tick at or after its deadline) or `precise` (a timer thread, delays of
    /// up to 1 s end within tens of microseconds of their deadline: for measuring
    /// sub-millisecond differences, such as the latency one gateway hop adds).
    #[serde(default)]
    pub timer: TimerKind,
}

/// The timer a stub's delays are slept on (see [`StubConfig::timer`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TimerKind {
    /// tokio's timer, 1 ms granularity.
    #[default]
    Tokio,
    /// A timer thread with microsecond precision for delays up to 1 s.
    Precise,
}

/// One simulated backend: an address and its routes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Socket address to listen on, e.g. `127.0.0.1:9101`; port 0 picks a free port.
    pub listen: Located<String>,
    /// Routes; each matches a method and a path pattern, or is a gRPC method.
    #[serde(default)]
    pub routes: Vec<Located<RouteConfig>>,
    /// Requests this service works on at once (a fixed worker pool); more wait in line, so its
    /// latency grows with load like a saturated real backend's. Capacity ≈ `concurrency /
    /// latency`. Default: unlimited.
    pub concurrency: Option<usize>,
}

/// A route of a simulated backend: what it answers, how slowly, and how it fails. An HTTP route
/// has a `path`; a gRPC route names its method in `grpc`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{"required": ["path"]}, {"required": ["grpc"]}]))]
pub struct RouteConfig {
    /// Path pattern: `/items/{id}` captures a segment, `/files/{*rest}` the rest of the path.
    /// Every route has either `path` (HTTP) or `grpc`.
    pub path: Option<Located<String>>,
    /// A unary gRPC method, `package.Service/Method`, from the `.proto` files under `protos:`
    /// (instead of `path`): the request message is `$request.body` (as JSON), `body` builds the
    /// answer message (as JSON).
    pub grpc: Option<Located<String>>,
    /// HTTP method; default `GET`; `*` matches any method. Not for `grpc` routes (always POST).
    #[serde(default = "default_method")]
    pub method: Located<String>,
    /// Response status; default 200. Not for `grpc` routes (see `grpc_status`).
    #[serde(default = "default_status")]
    pub status: Located<u16>,
    /// `grpc` routes: answer with this gRPC status instead of the message (a name such as
    /// `UNAVAILABLE`, or its number); default `OK`.
    pub grpc_status: Option<Located<GrpcCode>>,
    /// `grpc` routes: the `grpc-message` sent with a `grpc_status` other than OK.
    pub grpc_message: Option<Located<String>>,
    /// Delay before answering: a duration (`5ms`, `1.5s`, a number of milliseconds) is fixed;
    /// or one of the models `{fixed: 5ms}`, `{uniform: {min, max}}`, `{normal: {mean, sd}}`,
    /// `{lognormal: {median, sigma}}`, `{mixture: [{p, latency}, ...]}`,
    /// `{stall: {every, duration, base}}`.
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
    /// Faults, tried in order; each fires with its probability `p`, at most one per request.
    #[serde(default)]
    pub faults: Vec<Located<FaultConfig>>,
    /// A Server-Sent Events stream instead of `body`: a `text/event-stream` answer whose
    /// events are sent one by one, each after its delay (docs/stubs.md#event-streams).
    pub sse: Option<Located<SseConfig>>,
    /// A body sent in chunks instead of `body`: each chunk's text, as written, after its delay
    /// (a chunked answer over HTTP/1.1, one data frame each over h2) — an NDJSON or other
    /// streamed backend (docs/stubs.md#chunked-answers). `Content-Type` defaults to
    /// `application/octet-stream`.
    pub chunks: Option<Located<Vec<ChunkConfig>>>,
    /// A WebSocket instead of an answer: the handshake accepted (HTTP/1.1 `Upgrade`), then the
    /// scripted messages, then an echo of what the client sends or a close
    /// (docs/stubs.md#websockets).
    pub websocket: Option<Located<WsConfig>>,
}

/// A WebSocket route of a stub (`websocket:`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WsConfig {
    /// Text messages sent after the handshake, in order, each after its delay.
    #[serde(default)]
    pub messages: Vec<WsMessage>,
    /// After the messages, send each message the client sends back (until it closes). Default
    /// true; ignored when `close` is given.
    #[serde(default = "yes")]
    pub echo: bool,
    /// After the messages, close with this code and reason (and wait for the client's close).
    pub close: Option<WsClose>,
}

fn yes() -> bool {
    true
}

/// A scripted WebSocket message.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WsMessage {
    /// The text sent.
    pub text: String,
    /// The wait before it (from the previous message, or from the handshake).
    pub delay: Option<Dur>,
}

/// How a scripted WebSocket closes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WsClose {
    /// The close code, e.g. 1000 (normal) or 1011 (server error).
    pub code: u16,
    /// The close reason.
    #[serde(default)]
    pub reason: String,
    /// The wait before the close (from the last message).
    pub delay: Option<Dur>,
}

/// One chunk of a `chunks:` answer.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChunkConfig {
    /// The chunk's text, sent as written.
    pub data: String,
    /// The wait before it is sent (from the previous chunk, or from the answer's head).
    pub delay: Option<Dur>,
}

/// A route's event stream (`sse:`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SseConfig {
    /// The events, in order.
    #[serde(default)]
    pub events: Vec<SseEvent>,
    /// How many times the list is sent; `0` for ever. Default 1.
    #[serde(default = "once")]
    pub repeat: u64,
    /// Number the events `id: 1`, `id: 2`, … across repeats (an event with its own `id` keeps
    /// it); a request with a numeric `Last-Event-ID: N` resumes with event N+1. Default false.
    #[serde(default)]
    pub ids: bool,
    /// `retry: MS` sent first: the client's reconnection delay, in milliseconds.
    pub retry: Option<u64>,
    /// After the last event: `close` ends the answer (default), `hold` keeps it open, sending
    /// nothing more, until the client leaves.
    #[serde(default)]
    pub then: SseThen,
}

fn once() -> u64 {
    1
}

/// What an event stream does after its last event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SseThen {
    /// End the answer.
    #[default]
    Close,
    /// Keep it open, sending nothing.
    Hold,
}

/// One event of a stream: its fields, sent after `delay`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SseEvent {
    /// The event's data; each line of it becomes a `data:` line.
    pub data: Option<String>,
    /// Its type (`event:`).
    pub event: Option<String>,
    /// Its id (`id:`).
    pub id: Option<String>,
    /// A comment sent before its fields (`: …`); alone, a comment-only block (a heartbeat).
    pub comment: Option<String>,
    /// The wait before it is sent (from the previous event, or from the answer's head).
    pub delay: Option<Dur>,
}

fn default_method() -> Located<String> {
    Located::unknown("GET".to_string())
}

fn default_status() -> Located<u16> {
    Located::unknown(200)
}

/// A gRPC status code as written in a config or an admin update: its name (`UNAVAILABLE`,
/// any case) or its number (`14`). Written back as the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcCode(pub Code);

impl<'de> Deserialize<'de> for GrpcCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GrpcCode;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a gRPC status: a name such as UNAVAILABLE, or a number from 0 to 16")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GrpcCode, E> {
                match i32::try_from(v) {
                    Ok(n @ 0..=16) => Ok(GrpcCode(Code::from_i32(n))),
                    _ => Err(E::custom(format!(
                        "gRPC status {v} is not within 0..16; write a number from 0 to 16 or a \
                         name such as UNAVAILABLE"
                    ))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GrpcCode, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "gRPC status {v} is not within 0..16; write a number from 0 to 16 or a \
                         name such as UNAVAILABLE"
                    ))),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GrpcCode, E> {
                if let Some(c) = Code::from_name(v.trim()) {
                    return Ok(GrpcCode(c));
                }
                let names = GRPC_CODE_NAMES;
                let suggestion = fanout_config::did_you_mean(&v.to_ascii_uppercase(), names)
                    .map(|s| format!("; {s}"))
                    .unwrap_or_default();
                Err(E::custom(format!(
                    "unknown gRPC status `{v}`{suggestion} (the names are {})",
                    names.join(", ")
                )))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for GrpcCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

/// The names of the gRPC status codes, in number order.
pub(crate) const GRPC_CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

impl JsonSchema for GrpcCode {
    fn schema_name() -> Cow<'static, str> {
        "GrpcStatus".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A gRPC status code: its name (e.g. `UNAVAILABLE`) or its number (0..16).",
            "anyOf": [
                {"type": "string", "enum": GRPC_CODE_NAMES},
                {"type": "integer", "minimum": 0, "maximum": 16}
            ]
        })
    }
}

/// A latency as written in the config: a bare duration (fixed) or a model.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(untagged)]
pub enum LatencyConfig {
    /// A fixed delay written as a bare duration.
    Fixed(Dur),
    /// A latency model: a mapping with exactly one key naming it.
    Model(LatencyModel),
}

/// A latency model: a mapping with exactly one key naming the model.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum LatencyModel {
    /// Always the same delay.
    Fixed(#[serde(serialize_with = "ser_dur")] Dur),
    /// Uniformly distributed between `min` and `max` (inclusive).
    Uniform(UniformLatency),
    /// Normally distributed, truncated at 0 (negative draws are drawn again).
    Normal(NormalLatency),
    /// Log-normally distributed (WireMock's parameters): `median · e^(sigma · Z)`, `Z` standard
    /// normal. A long right tail that grows with `sigma`.
    Lognormal(LognormalLatency),
    /// One of several models, chosen per request with the given probabilities (which must sum
    /// to 1), e.g. cache hits and misses.
    Mixture(Vec<MixtureArm>),
    /// Periodic stalls (GC-pause-like freezes): windows of length `duration` starting every
    /// `every` after the service started, during which nothing is answered; a response due
    /// inside a window is held until the window ends. Outside the windows, `base` applies.
    Stall(StallLatency),
}

/// Bounds of a uniform latency.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UniformLatency {
    /// Shortest delay.
    #[serde(serialize_with = "ser_dur")]
    pub min: Dur,
    /// Longest delay.
    #[serde(serialize_with = "ser_dur")]
    pub max: Dur,
}

/// Parameters of a normal latency.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NormalLatency {
    /// Mean (before truncation at 0).
    #[serde(serialize_with = "ser_dur")]
    pub mean: Dur,
    /// Standard deviation.
    #[serde(serialize_with = "ser_dur")]
    pub sd: Dur,
}

/// Parameters of a log-normal latency, as WireMock writes them.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LognormalLatency {
    /// The median delay (half of the requests are faster).
    #[serde(serialize_with = "ser_dur")]
    pub median: Dur,
    /// Shape: the standard deviation of the delay's natural logarithm (`0.1` is narrow, `1` a
    /// heavy tail).
    #[schemars(range(min = 0))]
    pub sigma: f64,
}

/// One arm of a mixture.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MixtureArm {
    /// Probability of this arm, 0..1; the arms' probabilities sum to 1.
    #[schemars(range(min = 0, max = 1))]
    pub p: f64,
    /// The latency of this arm (any form, including another mixture).
    pub latency: LatencyConfig,
}

/// Parameters of periodic stalls.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StallLatency {
    /// Period: a stall window starts every `every`, the first one `every` after the service
    /// started.
    #[serde(serialize_with = "ser_dur")]
    pub every: Dur,
    /// Length of each stall window; shorter than `every`.
    #[serde(serialize_with = "ser_dur")]
    pub duration: Dur,
    /// Latency outside the stalls; default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<Box<LatencyConfig>>,
}

impl<'de> Deserialize<'de> for LatencyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LatencyConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a duration (`5ms`, `1.5s`, milliseconds) or a latency model: `{fixed: 5ms}`, \
                     `{uniform: {min, max}}`, `{normal: {mean, sd}}`, `{lognormal: {median, \
                     sigma}}`, `{mixture: [{p, latency}, ...]}`, `{stall: {every, duration, base}}`",
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
                    Ok(LatencyConfig::Fixed(Dur(Duration::from_secs_f64(
                        v / 1000.0,
                    ))))
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

impl Serialize for LatencyConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LatencyConfig::Fixed(d) => ser_dur(d, s),
            LatencyConfig::Model(m) => m.serialize(s),
        }
    }
}

/// Write a duration so that [`Dur::parse`] reads it back exactly: `5ms`, `250us`, `10ns`.
pub(crate) fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

fn ser_dur<S: Serializer>(d: &Dur, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(d.0))
}

/// A fault of a route: with probability `p`, answer a request in a broken way instead of the
/// normal response.
///
/// Written as a mapping with one key naming the kind plus `p`:
/// `{status: 503, p: 0.1, body: '{error: "down"}'}`, `{reset: {}, p: 0.01}`, `{hang: {}, p}`,
/// `{slow_body: {chunks: 10, duration: 1s}, p}`, `{malformed: {}, p}`,
/// `{close_after_headers: {}, p}`, `{grpc_status: UNAVAILABLE, grpc_message: "down", p}`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Probability that the fault fires for a request that reaches it, 0..1; default 1.
    pub p: f64,
    /// What happens when it fires.
    pub action: FaultAction,
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer this status, with `body` (a jq expression over `$request`) or a JSON error
    /// object as the body.
    Status {
        /// The status code.
        status: u16,
        /// Body expression; default `{"error": "injected fault", "status": STATUS}`.
        body: Option<Located<String>>,
    },
    /// Reset the connection (TCP RST): the client sees "connection reset by peer".
    Reset,
    /// Never answer; the request ends when the client gives up (counted as aborted).
    Hang,
    /// Send the headers at once, then the body in `chunks` pieces spread over `duration`.
    SlowBody(SlowBodyConfig),
    /// Status 200 with a truncated, invalid JSON body.
    Malformed,
    /// Send the status and headers (with a `content-length`), then close the connection
    /// without the body.
    CloseAfterHeaders,
    /// Answer this gRPC status (a trailers-only answer) with `message` as its `grpc-message`;
    /// on an HTTP route, the HTTP status the code maps to.
    GrpcStatus {
        /// The code.
        code: GrpcCode,
        /// The `grpc-message`; default `injected fault`.
        message: Option<String>,
    },
}

/// Parameters of a slow (dribbled) body.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlowBodyConfig {
    /// Number of pieces the body is sent in (1 to 65536).
    #[schemars(range(min = 1, max = 65536))]
    pub chunks: u32,
    /// Time over which the pieces are spread; the last one is sent `duration` after the
    /// headers.
    #[serde(serialize_with = "ser_dur")]
    pub duration: Dur,
}

/// The fault kinds, as written in the config and reported in the stats.
pub(crate) const FAULT_KINDS: [&str; 7] = [
    "status",
    "reset",
    "hang",
    "slow_body",
    "malformed",
    "close_after_headers",
    "grpc_status",
];

impl FaultAction {
    /// The kind's name as written in the config (`status`, `reset`, ...).
    pub fn kind(&self) -> &'static str {
        FAULT_KINDS[self.kind_index()]
    }

    /// Index of the kind in [`FAULT_KINDS`].
    pub(crate) fn kind_index(&self) -> usize {
        match self {
            FaultAction::Status { .. } => 0,
            FaultAction::Reset => 1,
            FaultAction::Hang => 2,
            FaultAction::SlowBody(_) => 3,
            FaultAction::Malformed => 4,
            FaultAction::CloseAfterHeaders => 5,
            FaultAction::GrpcStatus { .. } => 6,
        }
    }
}

/// The `{}` argument of the fault kinds that take no parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

impl<'de> Deserialize<'de> for FaultConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FaultConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a fault: a mapping with one of the keys status, reset, hang, slow_body, \
                     malformed, close_after_headers, grpc_status, and `p`",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FaultConfig, A::Error> {
                let mut p: Option<f64> = None;
                let mut body: Option<Located<String>> = None;
                let mut grpc_message: Option<String> = None;
                let mut action: Option<FaultAction> = None;
                let set = |action: &mut Option<FaultAction>, a: FaultAction| {
                    if let Some(prev) = action {
                        return Err(de::Error::custom(format!(
                            "a fault has one kind, found both `{}` and `{}`",
                            prev.kind(),
                            a.kind()
                        )));
                    }
                    *action = Some(a);
                    Ok(())
                };
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "p" => {
                            if p.is_some() {
                                return Err(de::Error::duplicate_field("p"));
                            }
                            p = Some(map.next_value()?);
                        }
                        "body" => {
                            if body.is_some() {
                                return Err(de::Error::duplicate_field("body"));
                            }
                            body = Some(map.next_value()?);
                        }
                        "status" => {
                            let status: u16 = map.next_value()?;
                            set(&mut action, FaultAction::Status { status, body: None })?;
                        }
                        "reset" => {
                            map.next_value::<NoArgs>()?;
                            set(&mut action, FaultAction::Reset)?;
                        }
                        "hang" => {
                            map.next_value::<NoArgs>()?;
                            set(&mut action, FaultAction::Hang)?;
                        }
                        "slow_body" => {
                            let s: SlowBodyConfig = map.next_value()?;
                            set(&mut action, FaultAction::SlowBody(s))?;
                        }
                        "malformed" => {
                            map.next_value::<NoArgs>()?;
                            set(&mut action, FaultAction::Malformed)?;
                        }
                        "close_after_headers" => {
                            map.next_value::<NoArgs>()?;
                            set(&mut action, FaultAction::CloseAfterHeaders)?;
                        }
                        "grpc_status" => {
                            let code: GrpcCode = map.next_value()?;
                            set(
                                &mut action,
                                FaultAction::GrpcStatus {
                                    code,
                                    message: None,
                                },
                            )?;
                        }
                        "grpc_message" => {
                            if grpc_message.is_some() {
                                return Err(de::Error::duplicate_field("grpc_message"));
                            }
                            grpc_message = Some(map.next_value()?);
                        }
                        other => {
                            return Err(de::Error::custom(format!(
                                "unknown fault kind `{other}`; expected one of status, reset, \
                                 hang, slow_body, malformed, close_after_headers, grpc_status \
                                 (and `p`, `body`, `grpc_message`)"
                            )));
                        }
                    }
                }
                let mut action = action.ok_or_else(|| {
                    de::Error::custom(
                        "a fault needs a kind: one of status, reset, hang, slow_body, \
                         malformed, close_after_headers, grpc_status",
                    )
                })?;
                match (&mut action, body) {
                    (FaultAction::Status { body: slot, .. }, b) => *slot = b,
                    (_, Some(_)) => {
                        return Err(de::Error::custom("only a `status` fault has a `body`"));
                    }
                    (_, None) => {}
                }
                match (&mut action, grpc_message) {
                    (FaultAction::GrpcStatus { message: slot, .. }, m) => *slot = m,
                    (_, Some(_)) => {
                        return Err(de::Error::custom(
                            "only a `grpc_status` fault has a `grpc_message`",
                        ));
                    }
                    (_, None) => {}
                }
                Ok(FaultConfig {
                    p: p.unwrap_or(1.0),
                    action,
                })
            }
        }
        d.deserialize_map(V)
    }
}

impl Serialize for FaultConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match &self.action {
            FaultAction::Status { status, body } => {
                m.serialize_entry("status", status)?;
                if let Some(b) = body {
                    m.serialize_entry("body", &b.value)?;
                }
            }
            FaultAction::SlowBody(sb) => m.serialize_entry("slow_body", sb)?,
            FaultAction::GrpcStatus { code, message } => {
                m.serialize_entry("grpc_status", code)?;
                if let Some(msg) = message {
                    m.serialize_entry("grpc_message", msg)?;
                }
            }
            other => m.serialize_entry(other.kind(), &NoArgs {})?,
        }
        m.serialize_entry("p", &self.p)?;
        m.end()
    }
}

/// The JSON Schema of a fault (one variant per kind), for [`FaultConfig`]'s hand-written serde.
#[derive(JsonSchema)]
#[serde(untagged, deny_unknown_fields)]
#[allow(dead_code)]
enum FaultSchema {
    /// Answer this status (100..999) with `body` or a JSON error object.
    Status {
        /// The status code.
        #[schemars(range(min = 100, max = 999))]
        status: u16,
        /// Body: a jq expression over `$request`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "String")]
        body: Option<String>,
        /// Probability, 0..1; default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 0, max = 1))]
        p: f64,
    },
    /// Reset the connection (TCP RST).
    Reset {
        /// Always `{}`.
        reset: NoArgs,
        /// Probability, 0..1; default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 0, max = 1))]
        p: f64,
    },
    /// Never answer.
    Hang {
        /// Always `{}`.
        hang: NoArgs,
        /// Probability, 0..1; default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 0, max = 1))]
        p: f64,
    },
    /// Headers at once, then the body in pieces spread over a duration.
    SlowBody {
        /// Chunks and total duration.
        slow_body: SlowBodyConfig,
        /// Probability, 0..1; default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 0, max = 1))]
        p: f64,
    },
    /// Status 200 with a truncated, invalid JSON body.
    Malformed {
        /// Always `{}`.
        malformed: NoArgs,
        /// Probability, 0..1; default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 0, max = 1))]
        p: f64,
    },
    /// Status and headers with a `content-length`, then the connection closes.
    CloseAfterHeaders {
        /// Always `{}`.
        close_after_headers: NoArgs,
        /// Probability, 0..1; default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 0, max = 1))]
        p: f64,
    },
    /// A gRPC status (trailers-only answer); on an HTTP route, the HTTP status it maps to.
    GrpcStatus {
        /// The code: a name such as `UNAVAILABLE`, or its number.
        grpc_status: GrpcCode,
        /// The `grpc-message`; default `injected fault`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grpc_message: Option<String>,
        /// Probability, 0..1; default 1.
        #[serde(default = "one")]
        #[schemars(range(min = 0, max = 1))]
        p: f64,
    },
}

/// The default probability of a fault.
fn one() -> f64 {
    1.0
}

impl JsonSchema for FaultConfig {
    fn schema_name() -> Cow<'static, str> {
        "Fault".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut schema = FaultSchema::json_schema(generator);
        schema.insert(
            "description".into(),
            "A fault: one key naming the kind (status, reset, hang, slow_body, malformed, \
             close_after_headers, grpc_status) plus `p`, the probability that it fires (default 1). Faults \
             are tried in order; at most one fires per request."
                .into(),
        );
        schema
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_format_so_they_parse_back() {
        for d in [
            Duration::ZERO,
            Duration::from_millis(5),
            Duration::from_micros(1500),
            Duration::from_nanos(10),
            Duration::from_secs(3600),
        ] {
            let text = format_duration(d);
            assert_eq!(Dur::parse(&text).map(|d| d.0), Ok(d), "{text}");
        }
    }

    #[test]
    fn faults_and_latencies_round_trip_through_json() {
        let src = r#"[{"status": 503, "p": 0.5, "body": "{a: 1}"}, {"reset": {}, "p": 0.1},
            {"slow_body": {"chunks": 3, "duration": "1s"}}, {"close_after_headers": {}},
            {"grpc_status": "unavailable", "grpc_message": "down", "p": 0.5}, {"grpc_status": 5}]"#;
        let faults: Vec<FaultConfig> = serde_json::from_str(src).expect("faults parse");
        assert_eq!(faults[2].p, 1.0);
        let back: Vec<FaultConfig> =
            serde_json::from_value(serde_json::to_value(&faults).expect("serialize"))
                .expect("parse back");
        assert_eq!(back, faults);
        assert!(serde_json::from_str::<FaultConfig>(r#"{"explode": {}}"#).is_err());
        assert!(serde_json::from_str::<FaultConfig>(r#"{"reset": {}, "body": "1"}"#).is_err());
        assert!(serde_json::from_str::<FaultConfig>(r#"{"p": 1}"#).is_err());
        assert!(
            serde_json::from_str::<FaultConfig>(r#"{"reset": {}, "grpc_message": "x"}"#).is_err()
        );
        assert!(serde_json::from_str::<FaultConfig>(r#"{"grpc_status": 17}"#).is_err());
        let e = serde_json::from_str::<FaultConfig>(r#"{"grpc_status": "UNAVAILBLE"}"#)
            .expect_err("typo");
        assert!(e.to_string().contains("did you mean `UNAVAILABLE`?"), "{e}");
        assert_eq!(
            faults[4].action,
            FaultAction::GrpcStatus {
                code: GrpcCode(Code::Unavailable),
                message: Some("down".into())
            }
        );
        assert_eq!(
            serde_json::to_value(&faults[5]).expect("serialize"),
            serde_json::json!({"grpc_status": "NOT_FOUND", "p": 1.0})
        );

        let src = r#"{"mixture": [{"p": 0.9, "latency": "1ms"},
            {"p": 0.1, "latency": {"stall": {"every": "1s", "duration": "100ms",
             "base": {"lognormal": {"median": "20ms", "sigma": 0.5}}}}}]}"#;
        let l: LatencyConfig = serde_json::from_str(src).expect("latency parses");
        let back: LatencyConfig =
            serde_json::from_value(serde_json::to_value(&l).expect("serialize")).expect("back");
        assert_eq!(back, l);
    }
}
