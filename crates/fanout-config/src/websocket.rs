//! WebSocket routes (`websocket:` on a route): the handshake checked and forwarded to one
//! backend, then messages relayed both ways under the route's limits
//! (docs/config.md#websocket-routes).

use crate::{ConfigError, Dur, Located, PassForwarded, Route};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// A WebSocket route's backend, origins and limits.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSocketRoute {
    /// Name of an HTTP backend under `backends:` (`protocol: http1`): the handshake is sent to
    /// one of its URLs (`ws://` for `http://`, `wss://` for `https://`) as an HTTP/1.1
    /// `Upgrade`, whatever the client used (HTTP/1.1 or RFC 8441 over HTTP/2).
    pub backend: Located<String>,
    /// The path sent to the backend, as `pass.path`: the route's parameters as they came, the
    /// query kept. Default: the request's path as it came.
    pub path: Option<Located<String>>,
    /// Origins a browser's handshake may come from (`Origin: scheme://host[:port]`, compared
    /// case-insensitively), or `["*"]` for any. A handshake whose `Origin` is not listed is
    /// refused with 403 `origin_refused`; one without `Origin` (not a browser) is let through.
    /// Default: none listed — only the gateway's own origin (an `Origin` whose host is the
    /// request's `Host`).
    #[serde(default)]
    pub origins: Vec<String>,
    /// Largest message either way, in bytes, after its fragments are joined: a bigger one
    /// closes the connection with 1009 (message too big) to both sides. Default 1 MiB.
    #[serde(default = "default_max_message")]
    pub max_message_bytes: usize,
    /// Largest frame either way, in bytes: a bigger one closes with 1009. Default
    /// `max_message_bytes`; at most that.
    #[serde(default)]
    pub max_frame_bytes: Option<usize>,
    /// Longest time without a frame from either side (a message, a ping or a pong): past it
    /// both sides get a close 1001 (going away) with the reason `idle timeout`. Default 60s.
    #[serde(default = "default_idle")]
    pub idle_timeout: Dur,
    /// The gateway pings the client this often (an answering client stays open through silent
    /// periods; one that does not answer is closed by `idle_timeout`). `0s` turns it off.
    /// Default 20s; it must be shorter than `idle_timeout`.
    #[serde(default = "default_ping")]
    pub ping_interval: Dur,
    /// Most WebSockets open at once on this route; past it a handshake is refused with 503
    /// `websocket_limit`. Default 10000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Time the backend has to accept the connection and answer the handshake; past it the
    /// client is answered 504 `backend_timeout`. Default 10s.
    #[serde(default = "default_handshake")]
    pub handshake_timeout: Dur,
    /// Time a closing connection is given for the close handshake (each side's close frame
    /// answered) before its sockets are dropped. Default 5s.
    #[serde(default = "default_close")]
    pub close_timeout: Dur,
    /// The forwarding headers added to the handshake (as `pass.forwarded`).
    #[serde(default)]
    pub forwarded: PassForwarded,
    /// Send the client's `Host` to the backend. Default false (the backend's own).
    #[serde(default)]
    pub preserve_host: bool,
    /// Headers set from the verified claims of the route's `auth` (as `pass.claims`).
    #[serde(default)]
    pub claims: IndexMap<String, String>,
}

fn default_max_message() -> usize {
    1 << 20
}

impl WebSocketRoute {
    /// `max_frame_bytes`, or its default: `max_message_bytes` (browsers and most libraries
    /// send a message as one frame, so a lower frame limit would be the real message limit).
    pub fn frame_limit(&self) -> usize {
        self.max_frame_bytes.unwrap_or(self.max_message_bytes)
    }
}

fn default_idle() -> Dur {
    Dur::secs(60)
}

fn default_ping() -> Dur {
    Dur::secs(20)
}

fn default_max_connections() -> usize {
    10_000
}

fn default_handshake() -> Dur {
    Dur::secs(10)
}

fn default_close() -> Dur {
    Dur::secs(5)
}

/// Limits every WebSocket route shares (`server.websockets`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WebSocketServer {
    /// Most WebSockets open at once over all routes; past it a handshake is refused with 503
    /// `websocket_limit`. An open WebSocket is not counted under
    /// `server.connections.max_connections` once upgraded. Default 10000.
    pub max_connections: usize,
}

impl Default for WebSocketServer {
    fn default() -> Self {
        WebSocketServer {
            max_connections: default_max_connections(),
        }
    }
}

/// A route with `websocket:` has nothing of a flow nor `pass`; its method is GET.
pub(crate) fn check_route(r: &Route, errs: &mut Vec<ConfigError>) {
    let Some(w) = &r.websocket else {
        return;
    };
    let at = w.backend.pos;
    let mut not = |what: &str, hint: &str| {
        errs.push(ConfigError::at(at, format!("a `websocket` route has no `{what}`")).hint(hint));
    };
    if r.pass.is_some() {
        not(
            "pass",
            "a route either passes requests or relays a WebSocket",
        );
    }
    if !r.flow.is_empty() {
        not(
            "flow",
            "messages go to `websocket.backend` as they are; remove `flow`",
        );
    }
    if r.respond.is_some() {
        not(
            "respond",
            "the backend answers the handshake; remove `respond`",
        );
    }
    if r.grpc.is_some() {
        not("grpc", "a WebSocket route is an HTTP path");
    }
    if r.deadline.is_some() {
        not("deadline", "use `websocket.idle_timeout`");
    }
    if r.coalesce.is_some() {
        not("coalesce", "connections are never shared");
    }
    if r.server_timing {
        not("server_timing", "a WebSocket route has no steps to time");
    }
    if !r.method.value.eq_ignore_ascii_case("GET") {
        errs.push(
            ConfigError::at(
                r.method.pos,
                format!(
                    "a `websocket` route's method is GET, not `{}` (an HTTP/2 client's extended \
                     CONNECT is taken as its GET)",
                    r.method.value
                ),
            )
            .hint("remove `method`, or write `method: GET`"),
        );
    }
    let mut positive = |what: &str, zero: bool| {
        if zero {
            errs.push(
                ConfigError::at(at, format!("`websocket.{what}` must be positive"))
                    .hint("e.g. `max_message_bytes: 1048576`, `idle_timeout: 60s`"),
            );
        }
    };
    positive("max_message_bytes", w.max_message_bytes == 0);
    positive("max_frame_bytes", w.max_frame_bytes == Some(0));
    positive("idle_timeout", w.idle_timeout.0.is_zero());
    positive("max_connections", w.max_connections == 0);
    positive("handshake_timeout", w.handshake_timeout.0.is_zero());
    positive("close_timeout", w.close_timeout.0.is_zero());
    if w.frame_limit() > w.max_message_bytes {
        errs.push(
            ConfigError::at(
                at,
                format!(
                    "`websocket.max_frame_bytes` ({}) exceeds `max_message_bytes` ({})",
                    w.frame_limit(),
                    w.max_message_bytes
                ),
            )
            .hint("a frame is part of a message: lower `max_frame_bytes`"),
        );
    }
    if !w.ping_interval.0.is_zero() && w.ping_interval.0 >= w.idle_timeout.0 {
        errs.push(
            ConfigError::at(
                at,
                format!(
                    "`websocket.ping_interval` ({}) must be shorter than `idle_timeout` ({}): a \
                     client answering every ping would still be closed as idle",
                    crate::format_duration(w.ping_interval.0),
                    crate::format_duration(w.idle_timeout.0)
                ),
            )
            .hint("e.g. `ping_interval: 20s`, `idle_timeout: 60s`; `0s` turns pings off"),
        );
    }
    for o in &w.origins {
        if o != "*" && !(o.starts_with("http://") || o.starts_with("https://")) {
            errs.push(
                ConfigError::at(
                    at,
                    format!("`websocket.origins`: `{o}` is not an origin (`scheme://host[:port]`)"),
                )
                .hint("e.g. `https://app.example.com`, or `*` for any"),
            );
        }
    }
    if let Some(path) = &w.path
        && !path.value.starts_with('/')
    {
        errs.push(
            ConfigError::at(
                path.pos,
                format!("`websocket.path` `{}` must start with `/`", path.value),
            )
            .hint("e.g. `/ws/{room}`"),
        );
    }
}
