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

/// A route with `pass:` has nothing of a flow: no `flow`, `respond`, `grpc`, `deadline`,
/// `coalesce` or `server_timing`; a route without it needs `respond`.
pub(crate) fn check_route(r: &Route, send_timeout: Dur, errs: &mut Vec<ConfigError>) {
    let Some(p) = &r.pass else {
        if r.respond.is_none() && r.websocket.is_none() {
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
    if r.grpc.is_some() {
        not(
            "grpc",
            "give the path (`path: /package.Service/{method}`) instead",
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
