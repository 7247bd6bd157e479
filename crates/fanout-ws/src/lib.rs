//! WebSocket routes (`websocket:` on a route; docs/config.md#websocket-routes): a client's
//! WebSocket relayed to one backend, message by message.
//!
//! The gateway routes the handshake and runs the route's edge stages on it (IP lists,
//! authentication, rate limits, request id, access log) like any request; then
//! [`WsPlan::accept`]:
//!
//! 1. the handshake is checked ([`handshake::asked`]: HTTP/1.1 `Upgrade` or RFC 8441 extended
//!    CONNECT over HTTP/2; 426 / 400), its `Origin` against `websocket.origins` (403), the
//!    drain and the connection caps (503), the path made ([`fanout_pass::path`]);
//! 2. the handshake goes to the backend ([`backend::Target::open`]) as an HTTP/1.1 upgrade with
//!    the pass-through header rules ([`handshake::backend_headers`]); a failure is answered
//!    before anything is upgraded (502 unreachable or refused, 504 no answer in time);
//! 3. the client is answered with the backend's answer ([`handshake::client_answer`]) and the
//!    relay ([`relay::run`]) is spawned: it waits for the client's side of the upgrade, then
//!    relays messages both ways under the route's limits until both sides close, counting
//!    them ([`counters`]).
//!
//! Memory of an idle WebSocket: each side's codec allocates its read buffer
//! ([`READ_BUFFER`]) up front and writes each message at once (no write buffering); what is
//! held beyond that is the message in hand, at most `max_message_bytes` per direction.

#![forbid(unsafe_code)]

pub mod backend;
pub mod counters;
pub mod handshake;
pub mod relay;

use backend::{DialError, Target};
use counters::{Hub, Refused, RouteCounters};
use fanout_config::{Config, ConfigError};
use fanout_expr::Val;
use fanout_pass::headers::{Forwarding, Hop};
use fanout_pass::path::{PathError, Rewrite};
use handshake::{Asked, HandshakeError, Origins};
use http::header::{HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// Each side's read buffer, allocated when the relay starts: small, so that an idle WebSocket
/// costs little (tungstenite's default is 128 KiB); a larger message grows it while it is read.
pub const READ_BUFFER: usize = 4 << 10;

/// Why a handshake was not relayed (nothing was upgraded).
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    /// Not a WebSocket handshake, a bad one, or an `Origin` not allowed.
    #[error("{0}")]
    Handshake(#[from] HandshakeError),
    /// A connection cap, or the drain.
    #[error("{}", limit_message(*.0))]
    Limit(Refused),
    /// The path cannot be sent.
    #[error("{0}")]
    Path(#[from] PathError),
    /// The backend could not be reached.
    #[error("{0}")]
    Unavailable(DialError),
    /// The backend did not answer the handshake in time.
    #[error("the backend did not answer the WebSocket handshake within {0:?}")]
    Timeout(Duration),
    /// The backend refused the upgrade or answered it wrongly.
    #[error("{0}")]
    Refused(DialError),
}

fn limit_message(r: Refused) -> &'static str {
    match r {
        Refused::RouteLimit => "too many WebSockets open on this route (websocket.max_connections)",
        Refused::GlobalLimit => {
            "too many WebSockets open on this gateway (server.websockets.max_connections)"
        }
        _ => "the gateway is shutting down",
    }
}

impl WsError {
    /// The reason it is counted under.
    pub fn reason(&self) -> Refused {
        match self {
            WsError::Handshake(h) => h.reason(),
            WsError::Limit(r) => *r,
            WsError::Path(_) => Refused::BadPath,
            WsError::Unavailable(_) => Refused::BackendUnavailable,
            WsError::Timeout(_) => Refused::BackendTimeout,
            WsError::Refused(_) => Refused::BackendRefused,
        }
    }
}

/// One WebSocket route, compiled.
pub struct WsPlan {
    target: Target,
    backend_name: Arc<str>,
    rewrite: Option<Rewrite>,
    origins: Origins,
    forwarding: Forwarding,
    preserve_host: bool,
    claims: Vec<(HeaderName, Box<str>)>,
    codec: WebSocketConfig,
    limits: relay::Limits,
    handshake_timeout: Duration,
    max_connections: usize,
    counters: Arc<RouteCounters>,
}

/// A handshake checked, its place taken, the backend's handshake ready ([`WsPlan::prepare`]).
pub struct Prepared {
    asked: Asked,
    path: http::uri::PathAndQuery,
    headers: http::HeaderMap,
    key: String,
    offered: Vec<String>,
    ticket: counters::Ticket,
    drain: counters::DrainSignal,
}

/// What the gateway knows of one handshake.
pub struct Handshake<'a> {
    /// Its head.
    pub parts: &'a http::request::Parts,
    /// The route's path parameters as they came (for `websocket.path`).
    pub params: &'a [(&'a str, &'a str)],
    /// The hop it came over.
    pub hop: Hop<'a>,
    /// `$request.auth` as the edge stages left it.
    pub auth: &'a Val,
}

impl WsPlan {
    /// The route's counters.
    pub fn counters(&self) -> &Arc<RouteCounters> {
        &self.counters
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &Arc<str> {
        &self.backend_name
    }

    /// The route's cap.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Check the handshake (what it asks, its `Origin`, the path to send, the drain and the
    /// caps — a place is taken) and make the backend's handshake ready; nothing is sent yet. A
    /// refusal is counted by reason.
    pub fn prepare(&self, hub: &Arc<Hub>, x: Handshake<'_>) -> Result<Prepared, WsError> {
        let r = self.prepare_uncounted(hub, x);
        if let Err(e) = &r {
            self.counters.refused(e.reason());
        }
        r
    }

    fn prepare_uncounted(&self, hub: &Arc<Hub>, x: Handshake<'_>) -> Result<Prepared, WsError> {
        let parts = x.parts;
        let asked = handshake::asked(parts)?;
        self.origins.check(&parts.headers, x.hop.host)?;
        let path = match &self.rewrite {
            Some(r) => r.apply(x.params.iter().copied(), parts.uri.query())?,
            None => parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        };
        let ticket = hub
            .ticket(&self.counters, self.max_connections)
            .map_err(WsError::Limit)?;
        let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
        let mut headers = handshake::backend_headers(
            &parts.headers,
            self.forwarding,
            x.hop,
            self.preserve_host,
            &key,
        );
        self.claim_headers(&mut headers, x.auth);
        Ok(Prepared {
            asked,
            path,
            headers,
            key,
            offered: handshake::offered(&parts.headers),
            ticket,
            drain: hub.drain_signal(),
        })
    }

    /// Send the prepared handshake to the backend and, when it accepted, return the answer's
    /// head for the client (101, or 200 for HTTP/2) and spawn the relay, which starts once
    /// `upgrade` (the client's side) completes; it keeps `keep` (an HTTP/2 connection's busy
    /// mark) until it ends. A refusal is counted by reason.
    pub async fn open(
        &self,
        p: Prepared,
        upgrade: hyper::upgrade::OnUpgrade,
        keep: impl Send + 'static,
    ) -> Result<http::Response<()>, WsError> {
        let r = self.open_uncounted(p, upgrade, keep).await;
        if let Err(e) = &r {
            self.counters.refused(e.reason());
        }
        r
    }

    async fn open_uncounted(
        &self,
        p: Prepared,
        upgrade: hyper::upgrade::OnUpgrade,
        keep: impl Send + 'static,
    ) -> Result<http::Response<()>, WsError> {
        let opened = tokio::time::timeout(
            self.handshake_timeout,
            self.target
                .open(&p.path, p.headers, &p.key, &p.offered, self.preserve_host),
        )
        .await
        .map_err(|_| WsError::Timeout(self.handshake_timeout))?;
        let (backend, answer) = match opened {
            Ok(o) => o,
            Err(e @ (DialError::Connect { .. } | DialError::Broke(_))) => {
                return Err(WsError::Unavailable(e));
            }
            Err(e) => return Err(WsError::Refused(e)),
        };
        let head = handshake::client_answer(&answer.headers, &p.asked, self.forwarding.via);
        let codec = self.codec;
        let limits = self.limits;
        let counters = self.counters.clone();
        let (ticket, drain) = (p.ticket, p.drain);
        let wait = self.handshake_timeout;
        tokio::spawn(async move {
            let _held = (ticket, keep);
            let client = match tokio::time::timeout(wait, upgrade).await {
                Ok(Ok(u)) => u,
                _ => {
                    counters.closed(counters::By::Client, 1006);
                    return;
                }
            };
            let client =
                WebSocketStream::from_raw_socket(TokioIo::new(client), Role::Server, Some(codec))
                    .await;
            let backend =
                WebSocketStream::from_raw_socket(TokioIo::new(backend), Role::Client, Some(codec))
                    .await;
            relay::run(client, backend, limits, &counters, drain).await;
        });
        Ok(head)
    }

    /// The configured claim headers: the client's removed, then set from `auth`.
    fn claim_headers(&self, h: &mut http::HeaderMap, auth: &Val) {
        for (name, claim) in &self.claims {
            h.remove(name);
            let Val::Obj(o) = auth else { continue };
            let Some(v) = fanout_expr::json::obj_get(o, claim) else {
                continue;
            };
            let text = match v {
                Val::Null | Val::Arr(_) | Val::Obj(_) => continue,
                v => fanout_expr::json::to_display(v),
            };
            if let Ok(v) = HeaderValue::from_str(&text) {
                h.insert(name.clone(), v);
            }
        }
    }
}

/// The WebSocket routes of one config, by route index (`None`: another kind of route).
#[derive(Default)]
pub struct WsRoutes {
    by_route: Vec<Option<Arc<WsPlan>>>,
    /// The path of each WebSocket route, by route index.
    names: Vec<Option<String>>,
}

impl WsRoutes {
    /// Route `index`'s plan, if it is a WebSocket route.
    #[inline]
    pub fn get(&self, index: usize) -> Option<&Arc<WsPlan>> {
        self.by_route.get(index).and_then(Option::as_ref)
    }

    /// Whether the config has any.
    pub fn is_empty(&self) -> bool {
        self.by_route.iter().all(Option::is_none)
    }

    /// (path, plan) of each WebSocket route.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<WsPlan>)> {
        self.names
            .iter()
            .zip(&self.by_route)
            .filter_map(|(n, p)| Some((n.as_deref()?, p.as_ref()?)))
    }
}

/// Compile the WebSocket routes of `cfg`, keeping the counters of `prev`'s routes of the same
/// path.
pub fn compile(cfg: &Config, prev: Option<&WsRoutes>) -> Result<WsRoutes, Vec<ConfigError>> {
    let mut errs = Vec::new();
    let mut out = WsRoutes::default();
    for r in &cfg.routes {
        let Some(w) = &r.websocket else {
            out.by_route.push(None);
            out.names.push(None);
            continue;
        };
        let name = r.path.value.clone();
        let target = match cfg.backends.get(&w.backend.value) {
            Some(b) if b.protocol == fanout_config::Protocol::Http1 => {
                match Target::new(&w.backend.value, b, &cfg.defaults) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        errs.push(e);
                        None
                    }
                }
            }
            Some(b) => {
                errs.push(
                    ConfigError::at(
                        w.backend.pos,
                        format!(
                            "`websocket.backend` `{}` is a {:?} backend; a WebSocket route needs an `http1` one (the handshake is an HTTP/1.1 upgrade)",
                            w.backend.value, b.protocol
                        ),
                    )
                    .hint("use a backend with `protocol: http1` (the default)"),
                );
                None
            }
            None => {
                let names: Vec<&str> = cfg.backends.keys().map(String::as_str).collect();
                let mut e = ConfigError::at(
                    w.backend.pos,
                    format!(
                        "unknown backend `{}` in `websocket.backend`",
                        w.backend.value
                    ),
                );
                if let Some(s) = fanout_config::did_you_mean(&w.backend.value, names) {
                    e = e.hint(s);
                }
                errs.push(e);
                None
            }
        };
        let rewrite = match &w.path {
            Some(t) => match Rewrite::compile(&t.value, &r.path.value) {
                Ok(rw) => Some(rw),
                Err(e) => {
                    errs.push(ConfigError::at(t.pos, e.to_string()).hint(
                        "use the route path's parameters, e.g. `/ws/{room}` on `/chat/{room}`",
                    ));
                    None
                }
            },
            None => None,
        };
        let mut claims = Vec::new();
        for (header, claim) in &w.claims {
            match HeaderName::from_bytes(header.as_bytes()) {
                Ok(h) if !fanout_config::framing_header(header) => {
                    claims.push((h, claim.as_str().into()))
                }
                _ => errs.push(
                    ConfigError::at(
                        w.backend.pos,
                        format!("`websocket.claims`: `{header}` is not a header a claim may set"),
                    )
                    .hint("a header name such as `x-user-id`"),
                ),
            }
        }
        let Some(target) = target else { continue };
        let counters = prev
            .and_then(|p| {
                p.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, p)| p.counters.clone())
            })
            .unwrap_or_default();
        let codec = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(0)
            .max_write_buffer_size(w.max_message_bytes.saturating_add(64 << 10))
            .max_message_size(Some(w.max_message_bytes))
            .max_frame_size(Some(w.frame_limit()));
        out.by_route.push(Some(Arc::new(WsPlan {
            target,
            backend_name: w.backend.value.as_str().into(),
            rewrite,
            origins: Origins::new(&w.origins),
            forwarding: Forwarding {
                x_forwarded: w.forwarded.x_forwarded,
                forwarded: w.forwarded.forwarded,
                via: w.forwarded.via,
            },
            preserve_host: w.preserve_host,
            claims,
            codec,
            limits: relay::Limits {
                idle: w.idle_timeout.0,
                ping: (!w.ping_interval.0.is_zero()).then_some(w.ping_interval.0),
                close: w.close_timeout.0,
            },
            handshake_timeout: w.handshake_timeout.0,
            max_connections: w.max_connections,
            counters,
        })));
        out.names.push(Some(name));
    }
    if !errs.is_empty() {
        return Err(errs.into_iter().map(|e| e.in_file(&cfg.file)).collect());
    }
    if out.is_empty() {
        return Ok(WsRoutes::default());
    }
    Ok(out)
}

/// The handshake's future must be `Send` (the gateway's request futures are): checked here, at
/// compile time, where a failure names it rather than the server's connection.
#[allow(dead_code)]
fn send_check(p: &WsPlan, pr: Prepared, u: hyper::upgrade::OnUpgrade) {
    fn s<T: Send>(_: &T) {}
    let f = p.open(pr, u, ());
    s(&f);
}
