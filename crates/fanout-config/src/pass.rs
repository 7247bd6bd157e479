//! Pass-through routes (`pass:` on a route): the request forwarded to one backend and its answer
//! streamed back as it is (docs/config.md#pass-through-routes).

use crate::{ConfigError, Dur, Located, Route};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// A pass-through route's target: one backend, the path it is sent to, the headers added and
/// the limits of the exchange.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PassRoute {
    /// Name of an HTTP backend under `backends:` (`http1`, `http2` or `grpc`).
    pub backend: Located<String>,
    /// The path sent to the backend (after its URL's base path), with the route's parameters as
    /// they came (still percent-encoded): `/v1/{rest}` on a route `/files/{*rest}` strips the
    /// prefix `/files` and adds `/v1`. The query is kept. Default: the request's path as it came.
    pub path: Option<Located<String>>,
    /// Time the whole exchange may take, from the request's arrival to the answer's last byte;
    /// past it an answer not started is 504 `backend_timeout`, one started is cut. Default 10m.
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    /// Longest time without a byte moving in either direction (the request's body to the
    /// backend, the answer to the client) — the same consequences. Default 30s; it may not exceed
    /// `server.connections.send_timeout`, which also cuts an answer that sends nothing that long.
    #[serde(default = "default_idle")]
    pub idle_timeout: Dur,
    /// Largest request body in bytes: a `Content-Length` over it is refused with 413
    /// `body_too_large` before any byte is read, a body without one is cut when it crosses it
    /// (the backend sees an aborted upload). Default `server.max_body_bytes`.
    pub max_body_bytes: Option<u64>,
    /// For gRPC calls (a `grpc:` route, or any `application/grpc` request on a `path:` route):
    /// the largest message, in bytes, either way (its length prefix is read as the stream
    /// passes; the bytes are untouched): a bigger one ends the call with `RESOURCE_EXHAUSTED`.
    /// Default `server.grpc.max_message_bytes`. (`max_body_bytes` bounds a call's whole request
    /// stream; on a `grpc:` route it has no default bound.)
    pub max_message_bytes: Option<usize>,
    /// The forwarding headers added to the request (and `Via` to both).
    #[serde(default)]
    pub forwarded: PassForwarded,
    /// Send the client's `Host` to the backend. Default false: the backend's own host (from
    /// its URL), the client's in `X-Forwarded-Host`.
    #[serde(default)]
    pub preserve_host: bool,
    /// Headers set from the verified claims of the route's `auth` (`$request.auth`): header name
    /// → claim name, e.g. `{x-user-id: sub}`. A header of that name sent by the client is always
    /// removed; a claim that is absent or not a string, number or boolean sends nothing.
    #[serde(default)]
    pub claims: IndexMap<String, String>,
    /// Server-Sent Events: an answer `200` with `Content-Type: text/event-stream` (and no
    /// `Content-Length`) is passed event by event, with heartbeats while the backend is silent,
    /// its own idle limit and a clean end at an event boundary on shutdown
    /// (docs/config.md#server-sent-events).
    #[serde(default)]
    pub sse: PassSse,
}

/// How a pass-through route carries Server-Sent Events.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PassSse {
    /// While the backend sends nothing, a comment (`: keep-alive`) is sent to the client this
    /// often, only between events; `0s` sends none. It counts as a byte moved for
    /// `pass.idle_timeout`, so it must be shorter than that. Default 15s, or half of
    /// `pass.idle_timeout` when that is shorter than 30s.
    pub heartbeat: Option<Dur>,
    /// A stream whose backend sent no byte for this long is ended cleanly (at an event
    /// boundary; cut if the backend stopped inside an event). Default 5m.
    pub idle_timeout: Dur,
}

impl Default for PassSse {
    fn default() -> Self {
        PassSse {
            heartbeat: None,
            idle_timeout: Dur::secs(300),
        }
    }
}

impl PassSse {
    /// The heartbeat period on a route whose `pass.idle_timeout` is `idle` (`None`: no
    /// heartbeats): as written, else 15s or half of `idle` when shorter.
    pub fn heartbeat(&self, idle: Dur) -> Option<std::time::Duration> {
        let h = match self.heartbeat {
            Some(h) => h.0,
            None => std::time::Duration::from_secs(15).min(idle.0 / 2),
        };
        (!h.is_zero()).then_some(h)
    }
}

fn default_timeout() -> Dur {
    Dur::secs(600)
}

fn default_idle() -> Dur {
    Dur::secs(30)
}

/// The forwarding headers a pass-through route adds.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PassForwarded {
    /// `X-Forwarded-For` (the client's address appended to what trusted proxies sent; from any
    /// other peer, only its address), `X-Forwarded-Proto`, `X-Forwarded-Host` (kept from a
    /// trusted proxy, else ours). Default true.
    pub x_forwarded: bool,
    /// RFC 7239 `Forwarded: for=…;proto=…;host=…`, appended the same way. Default false.
    pub forwarded: bool,
    /// `Via: 1.1 fanout` (the protocol version of each hop) on the request and the answer
    /// (RFC 9110 §7.6.3). Default true.
    pub via: bool,
}

impl Default for PassForwarded {
    fn default() -> Self {
        PassForwarded {
            x_forwarded: true,
            forwarded: false,
            via: true,
        }
    }
}

/// A route with `pass:` has nothing of a flow: no `flow`, `respond`, `deadline`,
/// `coalesce` or `server_timing`; a route without it needs `respond`.
pub(crate) fn check_route(r: &Route, send_timeout: Dur, errs: &mut Vec<ConfigError>) {
    let Some(p) = &r.pass else {
        if r.respond.is_none() && r.websocket.is_none() && r.graphql.is_none() {
            errs.push(
                ConfigError::at(r.path.pos, "a route needs `respond` (or `pass`)").hint(
                    "add `respond: {body: …}`, or `pass: {backend: NAME}` to forward requests (if \
                     it is there, check its indentation: it must start in the same column as \
                     `path`)",
                ),
            );
        }
        return;
    };
    let at = p.backend.pos;
    let mut not = |what: &str, hint: &str| {
        errs.push(ConfigError::at(at, format!("a `pass` route has no `{what}`")).hint(hint));
    };
    if !r.flow.is_empty() {
        not(
            "flow",
            "the request goes to `pass.backend` as it is; remove `flow`",
        );
    }
    if r.respond.is_some() {
        not(
            "respond",
            "the backend's answer is the route's; remove `respond`",
        );
    }
    if r.deadline.is_some() {
        not("deadline", "use `pass.timeout` and `pass.idle_timeout`");
    }
    if r.coalesce.is_some() {
        not(
            "coalesce",
            "requests are never shared on a pass-through route",
        );
    }
    if r.server_timing {
        not("server_timing", "a pass-through route has no steps to time");
    }
    if p.idle_timeout.0.is_zero() || p.timeout.0.is_zero() {
        errs.push(
            ConfigError::at(
                at,
                "`pass.timeout` and `pass.idle_timeout` must be positive",
            )
            .hint("e.g. `timeout: 10m`, `idle_timeout: 30s`"),
        );
    }
    if p.idle_timeout.0 > send_timeout.0 {
        errs.push(
            ConfigError::at(
                at,
                format!(
                    "`pass.idle_timeout` ({}) exceeds server.connections.send_timeout ({}), which \
                     also cuts an answer that sends nothing that long",
                    crate::format_duration(p.idle_timeout.0),
                    crate::format_duration(send_timeout.0)
                ),
            )
            .hint("lower `idle_timeout`, or raise `server.connections.send_timeout`"),
        );
    }
    check_sse(&p.sse, p.idle_timeout, at, errs);
    if let Some(path) = &p.path
        && !path.value.starts_with('/')
    {
        errs.push(
            ConfigError::at(
                path.pos,
                format!("`pass.path` `{}` must start with `/`", path.value),
            )
            .hint("e.g. `/v1/{rest}`"),
        );
    }
}

/// `pass.sse`: a heartbeat shorter than `pass.idle_timeout` (which it keeps from cutting a
/// quiet stream) and a positive idle limit.
fn check_sse(sse: &PassSse, idle: Dur, at: crate::Pos, errs: &mut Vec<ConfigError>) {
    if sse.idle_timeout.0.is_zero() {
        errs.push(
            ConfigError::at(at, "`pass.sse.idle_timeout` must be positive")
                .hint("e.g. `idle_timeout: 5m`"),
        );
    }
    if let Some(h) = sse.heartbeat
        && !h.0.is_zero()
        && h.0 >= idle.0
    {
        errs.push(
            ConfigError::at(
                at,
                format!(
                    "`pass.sse.heartbeat` ({}) must be shorter than `pass.idle_timeout` ({}), \
                     which cuts a stream that sends nothing that long",
                    crate::format_duration(h.0),
                    crate::format_duration(idle.0)
                ),
            )
            .hint("e.g. `heartbeat: 15s` with the default `idle_timeout: 30s` (without `heartbeat`: half of `idle_timeout`, at most 15s)"),
        );
    }
}
