//! Pass-through routes (`pass:` on a route; docs/config.md#pass-through-routes): a request
//! forwarded to one backend and its answer streamed back as it is — any content type, any size,
//! the exact bytes both ways, with backpressure: a frame is read from one side only when the
//! other can take it, so what an exchange holds is the frame in hand whatever the body's size.
//!
//! The gateway routes the request and runs the route's edge stages on its head first (before a
//! byte of the body is read, so a refused `Expect: 100-continue` request never gets its
//! `100 Continue`); then [`PassPlan::forward`]:
//!
//! 1. ([`PassPlan::target`]) a `Content-Length` over `pass.max_body_bytes` is refused (413)
//!    unread, and the path is made from `pass.path` ([`path`]);
//! 2. ([`PassPlan::forward`]) the headers are made ready ([`headers`]:
//!    hop-by-hop fields out, `X-Forwarded-*` / `Forwarded` / `Via` in, verified claims as
//!    configured headers);
//! 3. the call goes through the backend's stack ([`fanout_layers::stream`]: balancer, breaker,
//!    bulkhead, rate limit; a retry only for an idempotent method whose body no attempt touched);
//! 4. the answer's head comes back with its hop-by-hop fields out and `Via` in, its body
//!    streamed ([`body`]).
//!
//! Both bodies watch the exchange's two limits on one clock ([`body::Clock`]): `pass.timeout`
//! for the whole exchange and `pass.idle_timeout` since a byte last moved either way. Before the
//! answer's head a failure is an error answer ([`PassError`]: 502, 503, 504 or 413 with the
//! contract's JSON body); after it, the answer is cut — the client sees an aborted body.

#![forbid(unsafe_code)]

pub mod body;
pub mod grpc;
pub mod headers;
pub mod path;
pub mod spread;
pub mod sse;

use body::{Clock, Counters, Cut, Download, Upload, Watch};
use bytes::Bytes;
use fanout_config::{Config, ConfigError};
use fanout_expr::Val;
use fanout_layers::stream::{BodySlot, StreamBody, StreamRequest};
use fanout_layers::{Backend, CallError};
use fanout_protocol::metrics::{MetricType, Out, Value};
use headers::{Forwarding, Hop};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use path::Rewrite;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// One pass-through route, compiled.
pub struct PassPlan {
    backend: Arc<dyn Backend>,
    backend_name: Arc<str>,
    rewrite: Option<Rewrite>,
    timeout: Duration,
    idle: Duration,
    max_body: u64,
    forwarding: Forwarding,
    preserve_host: bool,
    claims: Vec<(HeaderName, Box<str>)>,
    counters: Arc<Counters>,
    /// The largest message either way of a gRPC call (`grpc.rs`).
    max_message: usize,
    sse: sse::SseLimits,
    streams: Arc<sse::SseCounters>,
}

/// Why a pass-through request got an error answer instead of the backend's (nothing of the
/// answer had gone out).
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The request's `Content-Length` is over `pass.max_body_bytes`: 413 `body_too_large`.
    #[error("request body exceeds {limit} bytes (pass.max_body_bytes)")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// The path cannot be sent: 400 `bad_path`.
    #[error("{0}")]
    Path(#[from] path::PathError),
    /// A limit of the exchange ran out (or the upload broke) before the answer's head: 504
    /// `backend_timeout` for the timeouts, 413 for the body, 400 `bad_body` for a broken upload.
    #[error("{0}")]
    Cut(Cut),
    /// The backend's stack failed the call (unreachable, reset, refused by its protection).
    #[error("{0}")]
    Call(CallError),
    /// A gRPC call's request message was over `pass.max_message_bytes` before the answer's
    /// head (`grpc.rs`): `message_too_large`, RESOURCE_EXHAUSTED.
    #[error("a request message exceeds {limit} bytes (pass.max_message_bytes)")]
    MessageTooLarge {
        /// The limit.
        limit: usize,
    },
}

/// What the gateway knows of one request on a pass-through route.
pub struct Exchange<'a, B> {
    /// The request's head.
    pub parts: &'a http::request::Parts,
    /// Its body, unread.
    pub body: B,
    /// The hop it came over (peer, trusted or not, TLS, host, version).
    pub hop: Hop<'a>,
    /// `$request.auth` as the edge stages left it.
    pub auth: &'a Val,
    /// When it arrived (the exchange's clock starts there).
    pub start: Instant,
    /// The call's trace context, when the request is traced.
    pub trace: Option<fanout_layers::trace::CallTrace>,
    /// When the client wants the exchange over (gRPC's `grpc-timeout`), if sooner than
    /// `pass.timeout`.
    pub deadline: Option<Instant>,
    /// The gateway's shutdown, which ends an event stream at its next event boundary.
    pub drain: &'a Arc<sse::Drain>,
}

impl PassPlan {
    /// The route's counters (bytes, cuts).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// The backend's name (for the log).
    pub fn backend_name(&self) -> &Arc<str> {
        &self.backend_name
    }

    /// The whole exchange's limit (`pass.timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The limit on the request's body.
    pub fn max_body(&self) -> u64 {
        self.max_body
    }

    /// What is decided before the body is touched: a `Content-Length` over the limit (413),
    /// the path to send (400 for one that cannot be sent). The gateway answers such a refusal
    /// with the body still unread; [`PassPlan::forward`] takes the path.
    pub fn target(
        &self,
        parts: &http::request::Parts,
        params: &[(&str, &str)],
        body: http_body::SizeHint,
    ) -> Result<http::uri::PathAndQuery, PassError> {
        if body.lower() > self.max_body {
            self.counters.cut(Cut::TooLarge(self.max_body));
            return Err(PassError::TooLarge {
                limit: self.max_body,
            });
        }
        Ok(match &self.rewrite {
            Some(r) => r.apply(params.iter().copied(), parts.uri.query())?,
            None => parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        })
    }

    /// Forward the request to `path_and_query` ([`PassPlan::target`]) and return the backend's
    /// answer, its body streaming; an error answer before the answer's head ([`PassError`]).
    pub async fn forward<B>(
        &self,
        x: Exchange<'_, B>,
        path_and_query: http::uri::PathAndQuery,
    ) -> Result<Response<StreamBody>, PassError>
    where
        B: Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: Into<fanout_layers::stream::BoxError>,
    {
        let parts = x.parts;
        let mut h: HeaderMap = parts.headers.clone();
        headers::request_headers(&mut h, self.forwarding, x.hop, self.preserve_host);
        self.claim_headers(&mut h, x.auth);
        let timeout = x.deadline.map_or(self.timeout, |d| {
            self.timeout.min(d.saturating_duration_since(x.start))
        });
        let clock = Arc::new(Clock::new(x.start, timeout, self.idle));
        let watch = Watch::new(clock.clone());
        let verdict = Arc::new(grpc::Verdict::default());
        // A gRPC call's messages are watched both ways (`grpc.rs`).
        let grpc = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let limit = self.max_message;
        let upload = match grpc {
            true => UnsyncBoxBody::new(Upload::new(
                grpc::Requests::new(x.body, limit, verdict.clone()),
                self.max_body,
                watch,
                self.counters.clone(),
            )),
            false => UnsyncBoxBody::new(Upload::new(
                x.body,
                self.max_body,
                watch,
                self.counters.clone(),
            )),
        };
        let slot = BodySlot::new(upload);
        let deadline = clock.deadline();
        let req = StreamRequest {
            method: parts.method.clone(),
            path_and_query,
            headers: h,
            body: slot,
            timeout: deadline.saturating_duration_since(Instant::now()),
            deadline,
            idempotent: parts.method.is_idempotent(),
            trace: x.trace,
        };
        let mut open = self.backend.open(req);
        let mut watch = Watch::new(clock.clone());
        let head = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = Pin::new(&mut open).poll(cx) {
                return Poll::Ready(r.map_err(PassError::Call));
            }
            watch.poll_cut(cx).map(|c| Err(PassError::Cut(c)))
        })
        .await;
        let resp = match head {
            Ok(r) => r,
            Err(PassError::Call(_)) if verdict.request_too_large() => {
                // The upload failed the call at a message over the limit.
                return Err(PassError::MessageTooLarge { limit });
            }
            Err(PassError::Call(e)) => {
                // The upload may have failed the call: say why.
                return Err(upload_cut(&e).map_or(PassError::Call(e), PassError::Cut));
            }
            Err(e) => {
                if let PassError::Cut(c) = &e {
                    self.counters.cut(*c);
                }
                return Err(e);
            }
        };
        let watch = Watch::new(clock);
        let passed = if parts.method != http::Method::HEAD
            && sse::is_event_stream(resp.status, &resp.headers)
        {
            UnsyncBoxBody::new(sse::SseBody::new(
                resp.body,
                watch,
                self.counters.clone(),
                self.streams.clone(),
                self.sse,
                x.drain.clone(),
            ))
        } else {
            UnsyncBoxBody::new(Download::new(resp.body, watch, self.counters.clone()))
        };
        let body = match grpc {
            true => UnsyncBoxBody::new(grpc::Answers::new(passed, limit, verdict)),
            false => passed,
        };
        let mut out = Response::new(body);
        *out.status_mut() = resp.status;
        *out.headers_mut() = resp.headers;
        headers::answer_headers(out.headers_mut(), self.forwarding, resp.version);
        Ok(out)
    }

    /// The configured claim headers: the client's removed, then set from `auth`.
    fn claim_headers(&self, h: &mut HeaderMap, auth: &Val) {
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

/// The [`Cut`] inside a call's error chain (the upload's own failure, as the client saw it).
fn upload_cut(e: &CallError) -> Option<Cut> {
    let mut src: Option<&(dyn std::error::Error + 'static)> = e
        .source
        .as_deref()
        .map(|s| s as &(dyn std::error::Error + 'static));
    while let Some(s) = src {
        if let Some(c) = s.downcast_ref::<Cut>() {
            return Some(*c);
        }
        src = s.source();
    }
    None
}

/// The pass-through routes of one config, by route index (`None`: a route with a flow).
#[derive(Default)]
pub struct PassRoutes {
    by_route: Vec<Option<Arc<PassPlan>>>,
    /// (method, path) of each pass-through route, by route index.
    names: Vec<Option<(String, String)>>,
}

impl PassRoutes {
    /// Route `index`'s plan, if it is a pass-through route.
    #[inline]
    pub fn get(&self, index: usize) -> Option<&Arc<PassPlan>> {
        self.by_route.get(index).and_then(Option::as_ref)
    }

    /// Whether the config has any.
    pub fn is_empty(&self) -> bool {
        self.by_route.iter().all(Option::is_none)
    }

    /// Their families: bytes each way and exchanges cut, per route (every series from the start).
    pub fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        let routes = || {
            self.by_route
                .iter()
                .zip(&self.names)
                .filter_map(|(p, n)| Some((p.as_ref()?, n.as_ref()?)))
        };
        out.family(
            "fanout_pass_bytes",
            "Body bytes passed through pass-through routes, by route and direction (in: the request's to the backend; out: the answer's to the client)",
            MetricType::Counter,
            routes().flat_map(|(p, (m, path))| {
                [
                    ("in", p.counters.bytes_in.load(Relaxed)),
                    ("out", p.counters.bytes_out.load(Relaxed)),
                ]
                .map(|(d, n)| {
                    (
                        [
                            ("route", path.clone()),
                            ("method", m.clone()),
                            ("direction", d.to_string()),
                        ],
                        Value::Counter(n),
                    )
                })
            }),
        )?;
        out.family(
            "fanout_pass_cut",
            "Pass-through exchanges cut, by route and reason (timeout, idle_timeout, body_too_large, client_broke, backend_broke)",
            MetricType::Counter,
            routes().flat_map(|(p, (m, path))| {
                Cut::REASONS
                    .iter()
                    .zip(&p.counters.cut)
                    .map(|(r, n)| {
                        (
                            [
                                ("route", path.clone()),
                                ("method", m.clone()),
                                ("reason", r.to_string()),
                            ],
                            Value::Counter(n.load(Relaxed)),
                        )
                    })
                    .collect::<Vec<_>>()
            }),
        )?;
        let labels = |m: &String, path: &String| [("route", path.clone()), ("method", m.clone())];
        out.family(
            "fanout_sse_streams_open",
            "Server-Sent Events streams open on pass-through routes, by route",
            MetricType::Gauge,
            routes().map(|(p, (m, path))| {
                (
                    labels(m, path),
                    Value::Gauge(p.streams.open.load(Relaxed) as f64),
                )
            }),
        )?;
        out.family(
            "fanout_sse_events",
            "Server-Sent Events passed to clients (events with data), by route",
            MetricType::Counter,
            routes().map(|(p, (m, path))| {
                (
                    labels(m, path),
                    Value::Counter(p.streams.events.load(Relaxed)),
                )
            }),
        )?;
        out.family(
            "fanout_sse_heartbeats",
            "Heartbeat comments the gateway sent on Server-Sent Events streams, by route",
            MetricType::Counter,
            routes().map(|(p, (m, path))| {
                (
                    labels(m, path),
                    Value::Counter(p.streams.heartbeats.load(Relaxed)),
                )
            }),
        )?;
        out.family(
            "fanout_sse_streams_ended",
            "Server-Sent Events streams ended, by route and cause (client_left, backend_ended, idle, timeout, drain, error)",
            MetricType::Counter,
            routes().flat_map(|(p, (m, path))| {
                sse::End::CAUSES
                    .iter()
                    .zip(&p.streams.ended)
                    .map(|(c, n)| {
                        (
                            [
                                ("route", path.clone()),
                                ("method", m.clone()),
                                ("cause", c.to_string()),
                            ],
                            Value::Counter(n.load(Relaxed)),
                        )
                    })
                    .collect::<Vec<_>>()
            }),
        )
    }

    /// `sse` on the status endpoint: the event streams of every pass-through route, summed,
    /// and by route (`"METHOD path"`).
    pub fn sse_json(&self) -> serde_json::Value {
        let total = sse::SseCounters::default();
        let mut routes = serde_json::Map::new();
        for (p, n) in self.by_route.iter().zip(&self.names) {
            let (Some(p), Some((m, path))) = (p, n) else {
                continue;
            };
            let c = &p.streams;
            total.open.fetch_add(c.open.load(Relaxed), Relaxed);
            total.events.fetch_add(c.events.load(Relaxed), Relaxed);
            total
                .heartbeats
                .fetch_add(c.heartbeats.load(Relaxed), Relaxed);
            for (t, n) in total.ended.iter().zip(&c.ended) {
                t.fetch_add(n.load(Relaxed), Relaxed);
            }
            routes.insert(format!("{m} {path}"), c.json());
        }
        let mut out = total.json();
        if let Some(o) = out.as_object_mut() {
            o.insert("routes".into(), routes.into());
        }
        out
    }
}

/// Compile the pass-through routes of `cfg` against the backends' stacks, keeping the counters
/// of `prev`'s routes of the same method and path.
pub fn compile(
    cfg: &Config,
    backends: &HashMap<String, Arc<dyn Backend>>,
    prev: Option<&PassRoutes>,
) -> Result<PassRoutes, Vec<ConfigError>> {
    let mut errs = Vec::new();
    let mut out = PassRoutes::default();
    for r in &cfg.routes {
        let Some(p) = &r.pass else {
            out.by_route.push(None);
            out.names.push(None);
            continue;
        };
        let name = (r.method.value.to_ascii_uppercase(), r.path.value.clone());
        let backend = match (
            backends.get(&p.backend.value),
            cfg.backends.get(&p.backend.value),
        ) {
            (Some(b), Some(c)) if c.protocol.is_http() => Some(b.clone()),
            (_, Some(c)) => {
                errs.push(
                    ConfigError::at(
                        p.backend.pos,
                        format!(
                            "`pass.backend` `{}` is a {:?} backend; a pass-through route needs an HTTP one",
                            p.backend.value, c.protocol
                        ),
                    )
                    .hint("use a backend with `protocol: http1`, `http2` or `grpc`"),
                );
                None
            }
            _ => {
                let names: Vec<&str> = cfg.backends.keys().map(String::as_str).collect();
                let mut e = ConfigError::at(
                    p.backend.pos,
                    format!("unknown backend `{}` in `pass.backend`", p.backend.value),
                );
                if let Some(s) = fanout_config::did_you_mean(&p.backend.value, names) {
                    e = e.hint(s);
                }
                errs.push(e);
                None
            }
        };
        let rewrite = match &p.path {
            Some(t) => match Rewrite::compile(&t.value, &r.path.value) {
                Ok(rw) => Some(rw),
                Err(e) => {
                    errs.push(ConfigError::at(t.pos, e.to_string()).hint(
                        "use the route path's parameters, e.g. `/v1/{rest}` on `/files/{*rest}`",
                    ));
                    continue;
                }
            },
            None => None,
        };
        let mut claims = Vec::new();
        for (header, claim) in &p.claims {
            match HeaderName::from_bytes(header.as_bytes()) {
                Ok(h) if !fanout_config::framing_header(header) => {
                    claims.push((h, claim.as_str().into()))
                }
                _ => errs.push(
                    ConfigError::at(
                        p.backend.pos,
                        format!("`pass.claims`: `{header}` is not a header a claim may set"),
                    )
                    .hint("a header name such as `x-user-id`"),
                ),
            }
        }
        let Some(backend) = backend else { continue };
        let kept = prev.and_then(|prev| {
            prev.names
                .iter()
                .zip(&prev.by_route)
                .find(|(n, _)| n.as_ref() == Some(&name))
                .and_then(|(_, p)| p.as_ref())
        });
        let counters = kept.map(|p| p.counters.clone()).unwrap_or_default();
        let streams = kept.map(|p| p.streams.clone()).unwrap_or_default();
        out.by_route.push(Some(Arc::new(PassPlan {
            backend,
            backend_name: p.backend.value.as_str().into(),
            rewrite,
            timeout: p.timeout.0,
            idle: p.idle_timeout.0,
            // A gRPC stream is bounded per message, not as a whole, unless the route says so.
            max_body: p.max_body_bytes.unwrap_or(match r.grpc {
                Some(_) => u64::MAX,
                None => cfg.server.max_body_bytes as u64,
            }),
            max_message: p
                .max_message_bytes
                .unwrap_or(cfg.server.grpc.max_message_bytes),
            forwarding: Forwarding {
                x_forwarded: p.forwarded.x_forwarded,
                forwarded: p.forwarded.forwarded,
                via: p.forwarded.via,
            },
            preserve_host: p.preserve_host,
            claims,
            counters,
            sse: sse::SseLimits {
                heartbeat: p.sse.heartbeat(p.idle_timeout),
                idle: p.sse.idle_timeout.0,
            },
            streams,
        })));
        out.names.push(Some(name));
    }
    if errs.is_empty() {
        // Without a pass-through route, an empty table: every route's lookup is one failed
        // bounds check.
        if out.is_empty() {
            return Ok(PassRoutes::default());
        }
        Ok(out)
    } else {
        Err(errs.into_iter().map(|e| e.in_file(&cfg.file)).collect())
    }
}
