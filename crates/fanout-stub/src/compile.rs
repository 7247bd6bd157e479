//! From [`StubConfig`] to [`CompiledStubs`]: routes in a matchit router, body expressions
//! compiled, statuses, headers, latencies and faults checked, the `.proto` files compiled and
//! every `grpc:` method looked up in them. Every error carries `FILE:LINE:COL` (a `.proto`
//! error: the `.proto` file's own).

use crate::config::{RouteConfig, ServiceConfig, StubConfig, TimerKind};
use crate::fault::Fault;
use crate::latency::Latency;
use bytes::Bytes;
use fanout_config::{ConfigError, ConfigErrors, Located, Pos, ProtosConfig};
use fanout_config::{closest, pos_in_scalar};
use fanout_expr::Expr;
use fanout_grpc::{Code, MessageCodec, MethodLookupError, ProtoError, ProtoLimits, ProtoSet};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use std::path::Path;
use std::sync::{Arc, RwLock};

/// Path prefix reserved for the admin endpoints of every service.
pub const ADMIN_PREFIX: &str = "/__stub/";

/// What a route does with a request. Swapped whole at run time through a [`BehaviourCell`].
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Response status.
    pub status: StatusCode,
    /// Delay before answering.
    pub latency: Latency,
    /// Static response headers (`content-type: application/json` is added when absent).
    pub headers: HeaderMap,
    /// Body expression over `$request`; `None` answers `null`.
    pub body: Option<Expr>,
    /// Body sent byte for byte instead of `body` (e.g. malformed JSON for fault tests).
    pub raw_body: Option<Bytes>,
    /// Faults, tried in order; at most one fires per request.
    pub faults: Vec<Fault>,
    /// An event stream answered instead of a body (`sse:`).
    pub sse: Option<Arc<crate::events::EventPlan>>,
    /// A WebSocket instead of an answer (`websocket:`).
    pub websocket: Option<Arc<crate::config::WsConfig>>,
    /// gRPC routes: the status answered. `OK` answers the body's message; any other code is a
    /// trailers-only answer with `grpc_message`. Ignored by HTTP routes.
    pub grpc_status: Code,
    /// gRPC routes: the `grpc-message` sent with a `grpc_status` other than OK.
    pub grpc_message: Option<String>,
}

/// A route's current [`Behaviour`], replaceable while the stub runs (e.g. by an admin API).
/// Readers take a cheap `Arc` snapshot per request.
#[derive(Debug)]
pub struct BehaviourCell(RwLock<Arc<Behaviour>>);

impl BehaviourCell {
    /// A cell holding `b`.
    pub fn new(b: Arc<Behaviour>) -> Self {
        BehaviourCell(RwLock::new(b))
    }
    /// The current behaviour.
    pub fn load(&self) -> Arc<Behaviour> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
    /// Replace the behaviour; requests already running keep the one they started with.
    pub fn store(&self, b: Arc<Behaviour>) {
        match self.0.write() {
            Ok(mut g) => *g = b,
            Err(poisoned) => *poisoned.into_inner() = b,
        }
    }
    /// Replace the behaviour by `f(current)`, atomically with respect to other updates (the
    /// write lock is held while `f` runs: keep it cheap). Returns the new behaviour.
    pub fn update(&self, f: impl FnOnce(&Behaviour) -> Behaviour) -> Arc<Behaviour> {
        let mut g = match self.0.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let next = Arc::new(f(&g));
        *g = next.clone();
        next
    }
}

/// Which methods a route accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MethodMatch {
    Any,
    Exact(Method),
}

/// A route of a compiled service (its initial behaviour; counters live in the server).
#[derive(Debug, Clone)]
pub(crate) struct CompiledRoute {
    /// `"METHOD PATH-PATTERN"` (a gRPC method: `"POST /package.Service/Method"`).
    pub(crate) key: String,
    pub(crate) method: MethodMatch,
    pub(crate) behaviour: Arc<Behaviour>,
    /// Set for a gRPC route: the method's messages.
    pub(crate) grpc: Option<Arc<GrpcMethod>>,
}

/// The method a gRPC route serves: what its requests are decoded with and its answers
/// encoded with.
#[derive(Debug)]
pub(crate) struct GrpcMethod {
    /// `package.Service/Method`.
    pub(crate) name: String,
    /// The request message.
    pub(crate) input: MessageCodec,
    /// The answer message.
    pub(crate) output: MessageCodec,
}

/// All routes sharing one path pattern.
#[derive(Debug)]
pub(crate) struct PathEntry {
    pub(crate) pattern: String,
    /// Indices into the service's routes, in config order.
    pub(crate) routes: Vec<usize>,
}

/// The immutable routing table of a service.
#[derive(Debug)]
pub(crate) struct RouteTable {
    /// Path pattern → index into `paths`.
    pub(crate) router: matchit::Router<usize>,
    pub(crate) paths: Vec<PathEntry>,
}

impl RouteTable {
    /// Find the route for `method` among the routes of path entry `entry`: an exact method first,
    /// then `*`.
    pub(crate) fn pick(
        &self,
        entry: usize,
        method: &Method,
        routes: &[CompiledRoute],
    ) -> Option<usize> {
        let e = self.paths.get(entry)?;
        let exact = e.routes.iter().copied().find(|&i| {
            routes
                .get(i)
                .is_some_and(|r| r.method == MethodMatch::Exact(method.clone()))
        });
        exact.or_else(|| {
            e.routes
                .iter()
                .copied()
                .find(|&i| routes.get(i).is_some_and(|r| r.method == MethodMatch::Any))
        })
    }

    /// The methods accepted on path entry `entry`, for an `allow` header.
    pub(crate) fn allowed(&self, entry: usize, routes: &[CompiledRoute]) -> String {
        let Some(e) = self.paths.get(entry) else {
            return String::new();
        };
        e.routes
            .iter()
            .filter_map(|&i| routes.get(i))
            .filter_map(|r| match &r.method {
                MethodMatch::Exact(m) => Some(m.as_str()),
                MethodMatch::Any => None,
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A compiled service: where it listens and how it routes.
#[derive(Debug, Clone)]
pub(crate) struct CompiledService {
    pub(crate) name: String,
    pub(crate) listen: String,
    pub(crate) table: Arc<RouteTable>,
    pub(crate) routes: Arc<Vec<CompiledRoute>>,
    pub(crate) concurrency: Option<usize>,
    /// Delays on the precise timer (`timer: precise`).
    pub(crate) precise: bool,
}

/// A loaded and checked stub config, ready to [`start`](CompiledStubs::start) (any number of
/// times; each server gets fresh counters).
#[derive(Debug, Clone)]
pub struct CompiledStubs {
    pub(crate) services: Vec<CompiledService>,
}

impl CompiledStubs {
    /// Service names with their configured listen addresses, in config order.
    pub fn services(&self) -> Vec<(String, String)> {
        self.services
            .iter()
            .map(|s| (s.name.clone(), s.listen.clone()))
            .collect()
    }

    /// Route keys (`"METHOD PATH-PATTERN"`) of `service`, in config order.
    pub fn routes(&self, service: &str) -> Option<Vec<String>> {
        self.services
            .iter()
            .find(|s| s.name == service)
            .map(|s| s.routes.iter().map(|r| r.key.clone()).collect())
    }
}

/// The `.proto` files of a config, as far as routes are concerned.
enum Protos {
    /// No `protos:` section.
    Absent,
    /// They did not compile (the error is reported once, not again for every route).
    Failed,
    /// Compiled.
    Loaded(ProtoSet),
}

/// Check and compile a parsed config. `source` is the config text after `${VAR}` substitution
/// (to point inside expressions); `base` is the directory relative `protos:` paths start from
/// (`None`: the current directory). Errors are not yet stamped with the file name (except those
/// in `.proto` files, which name their own).
pub(crate) fn compile(
    cfg: &StubConfig,
    source: &str,
    base: Option<&Path>,
) -> Result<CompiledStubs, Vec<ConfigError>> {
    let mut errs = Vec::new();
    let mut services = Vec::new();
    let protos = match &cfg.protos {
        None => Protos::Absent,
        Some(p) => {
            let (files, includes) = p.resolve(base);
            let limits = ProtoLimits {
                max_file_bytes: p.max_file_bytes,
                max_files: p.max_files,
            };
            match ProtoSet::compile(&files, &includes, limits) {
                Ok(set) => Protos::Loaded(set),
                Err(e) => {
                    errs.push(proto_config_error(&e, p));
                    Protos::Failed
                }
            }
        }
    };
    if cfg.services.is_empty() {
        errs.push(ConfigError {
            path: None,
            file: String::new(),
            pos: None,
            message: "no services defined".into(),
            hint: Some("add at least one service under `services:`".into()),
        });
    }
    for (name, svc) in &cfg.services {
        if let Some(mut s) = compile_service(name, svc, source, &protos, &mut errs) {
            s.precise = cfg.timer == TimerKind::Precise;
            services.push(s);
        }
    }
    if errs.is_empty() {
        Ok(CompiledStubs { services })
    } else {
        Err(errs)
    }
}

fn check_listen(listen: &str) -> bool {
    if listen.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    match listen.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}

fn compile_service(
    name: &str,
    svc: &ServiceConfig,
    source: &str,
    protos: &Protos,
    errs: &mut Vec<ConfigError>,
) -> Option<CompiledService> {
    let before = errs.len();
    if !check_listen(&svc.listen.value) {
        errs.push(
            ConfigError::at(
                svc.listen.pos,
                format!(
                    "service `{name}`: invalid listen address `{}`",
                    svc.listen.value
                ),
            )
            .hint("write HOST:PORT, e.g. `127.0.0.1:9101` (port 0 picks a free port)"),
        );
    }
    let mut routes: Vec<CompiledRoute> = Vec::new();
    let mut paths: Vec<PathEntry> = Vec::new();
    let mut router = matchit::Router::new();
    for r in &svc.routes {
        let Some((route, at)) = compile_route(name, r, source, protos, errs) else {
            continue;
        };
        let pattern = &at.value;
        let idx = routes.len();
        match paths.iter().position(|p| &p.pattern == pattern) {
            Some(pi) => {
                let dup = paths[pi]
                    .routes
                    .iter()
                    .any(|&i| routes.get(i).is_some_and(|x| x.method == route.method));
                if dup {
                    errs.push(
                        ConfigError::at(
                            at.pos,
                            format!("service `{name}`: duplicate route {}", route.key),
                        )
                        .hint("each method + path may appear once per service"),
                    );
                    continue;
                }
                paths[pi].routes.push(idx);
            }
            None => {
                if let Err(e) = router.insert(pattern.clone(), paths.len()) {
                    errs.push(
                        ConfigError::at(
                            at.pos,
                            format!("service `{name}`: invalid route path `{pattern}`: {e}"),
                        )
                        .hint(
                            "use `/items/{id}` to capture a segment and `/files/{*rest}` for the \
                             rest; two patterns may not overlap ambiguously",
                        ),
                    );
                    continue;
                }
                paths.push(PathEntry {
                    pattern: pattern.clone(),
                    routes: vec![idx],
                });
            }
        }
        routes.push(route);
    }
    (errs.len() == before).then(|| CompiledService {
        name: name.to_string(),
        listen: svc.listen.value.clone(),
        table: Arc::new(RouteTable { router, paths }),
        routes: Arc::new(routes),
        concurrency: svc.concurrency.map(|c| c.max(1)),
        precise: false,
    })
}

/// Check and compile a route; with it, the path pattern it is routed by and where that was
/// written (a gRPC method's path `/package.Service/Method`, at its `grpc:` value).
fn compile_route(
    service: &str,
    located: &Located<RouteConfig>,
    source: &str,
    protos: &Protos,
    errs: &mut Vec<ConfigError>,
) -> Option<(CompiledRoute, Located<String>)> {
    let before = errs.len();
    let r = &located.value;
    let is_grpc = r.grpc.is_some();
    let (at, grpc) = match (&r.path, &r.grpc) {
        (Some(path), None) => {
            check_path(service, path, errs);
            (Some(path.clone()), None)
        }
        (None, Some(g)) => match grpc_method(service, g, protos, errs) {
            Some(m) => {
                let at = Located {
                    value: format!("/{}", m.name),
                    pos: g.pos,
                    used: g.used,
                    quoted: g.quoted,
                };
                (Some(at), Some(Arc::new(m)))
            }
            None => (None, None),
        },
        (Some(_), Some(g)) => {
            errs.push(
                ConfigError::at(
                    g.pos,
                    format!("service `{service}`: a route has either `path` or `grpc`, not both"),
                )
                .hint(
                    "`path` serves HTTP requests; `grpc` serves a gRPC method (its path is \
                     `/package.Service/Method`)",
                ),
            );
            (None, None)
        }
        (None, None) => {
            errs.push(
                ConfigError::at(
                    located.pos,
                    format!(
                        "service `{service}`: a route needs `path` (an HTTP route) or `grpc` (a \
                         gRPC method)"
                    ),
                )
                .hint("write e.g. `path: /items/{id}` or `grpc: demo.v1.Users/GetUser`"),
            );
            (None, None)
        }
    };
    // Where errors about the route as a whole point.
    let route_pos = at.as_ref().map_or(located.pos, |a| a.pos);
    let method_pos = if r.method.pos == Pos::default() {
        route_pos
    } else {
        r.method.pos
    };
    let method = if is_grpc {
        if r.method.pos != Pos::default() {
            errs.push(
                ConfigError::at(r.method.pos, "a `grpc` route has no `method`")
                    .hint("gRPC calls are always POST; remove `method`"),
            );
        }
        Some(MethodMatch::Exact(Method::POST))
    } else {
        let method_src = r.method.value.trim().to_ascii_uppercase();
        if method_src == "*" {
            Some(MethodMatch::Any)
        } else {
            match Method::from_bytes(method_src.as_bytes()) {
                Ok(m) if !method_src.is_empty() => Some(MethodMatch::Exact(m)),
                _ => {
                    errs.push(
                        ConfigError::at(
                            method_pos,
                            format!("invalid HTTP method `{}`", r.method.value),
                        )
                        .hint("write e.g. GET, POST, or `*` for any method"),
                    );
                    None
                }
            }
        }
    };
    check_grpc_fields(r, is_grpc, errs);
    let status_pos = if r.status.pos == Pos::default() {
        route_pos
    } else {
        r.status.pos
    };
    let status = match StatusCode::from_u16(r.status.value) {
        Ok(s) => Some(s),
        Err(_) => {
            errs.push(
                ConfigError::at(status_pos, format!("invalid status {}", r.status.value))
                    .hint("a status is a number from 100 to 999"),
            );
            None
        }
    };
    let latency = match &r.latency {
        None => Some(Latency::None),
        Some(l) => match Latency::from_config(&l.value) {
            Ok(l) => Some(l),
            Err(msg) => {
                let hint = latency_hint(&msg);
                errs.push(ConfigError::at(l.pos, msg).hint(hint));
                None
            }
        },
    };
    let mut faults = Vec::with_capacity(r.faults.len());
    for f in &r.faults {
        match Fault::compile(&f.value) {
            Ok(c) => faults.push(c),
            Err(problem) => {
                let body = match &f.value.action {
                    crate::config::FaultAction::Status { body: Some(b), .. } => Some(b),
                    _ => None,
                };
                let pos = match (problem.body_offset, body) {
                    (Some(offset), Some(b)) if b.pos != Pos::default() => {
                        pos_in_scalar(source, b.pos, &b.value, offset)
                    }
                    _ => f.pos,
                };
                errs.push(ConfigError::at(pos, problem.message).hint(problem.hint));
            }
        }
    }
    let mut headers = HeaderMap::new();
    for (k, v) in &r.headers {
        let name = HeaderName::from_bytes(k.as_bytes());
        let value = HeaderValue::from_str(&v.value);
        match (name, value) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            (Err(_), _) => errs.push(
                ConfigError::at(v.pos, format!("invalid header name `{k}`"))
                    .hint("header names are tokens such as `x-request-id`"),
            ),
            (_, Err(_)) => errs.push(
                ConfigError::at(v.pos, format!("invalid value for header `{k}`"))
                    .hint("header values are visible ASCII without line breaks"),
            ),
        }
    }
    let body = match &r.body {
        None => None,
        Some(src) => match Expr::compile(&src.value, &["request"]) {
            Ok(e) => Some(e),
            Err(e) => {
                let pos = pos_in_scalar(source, src.pos, &src.value, e.offset);
                let mut err = ConfigError::at(pos, format!("body expression: {}", e.message));
                err.hint = Some(e.hint.unwrap_or_else(|| {
                    "a body is a jq expression over `$request` (method, path, params, query, \
                     headers, body)"
                        .into()
                }));
                errs.push(err);
                None
            }
        },
    };
    let sse = r.sse.as_ref().and_then(|sse| {
        if is_grpc || r.body.is_some() || r.raw_body.is_some() {
            errs.push(
                ConfigError::at(
                    sse.pos,
                    "an `sse` route has no `body`, `raw_body` or `grpc`",
                )
                .hint("its answer is the event stream"),
            );
        }
        if let Some(f) = r.faults.iter().find(|f| {
            matches!(
                f.value.action,
                crate::config::FaultAction::SlowBody(_)
                    | crate::config::FaultAction::Malformed
                    | crate::config::FaultAction::CloseAfterHeaders
            )
        }) {
            errs.push(
                ConfigError::at(
                    f.pos,
                    "this fault shapes a body; an `sse` route has a stream",
                )
                .hint("an `sse` route takes the faults status, reset, hang and grpc_status"),
            );
        }
        crate::events::EventPlan::compile(&sse.value, sse.pos, errs).map(Arc::new)
    });
    if let Some(w) = &r.websocket
        && (is_grpc
            || r.body.is_some()
            || r.raw_body.is_some()
            || r.sse.is_some()
            || r.chunks.is_some())
    {
        errs.push(
            ConfigError::at(
                w.pos,
                "a `websocket` route has no `body`, `raw_body`, `sse`, `chunks` or `grpc`",
            )
            .hint("its answer is the WebSocket"),
        );
    }
    let sse = match (&r.chunks, sse) {
        (None, sse) => sse,
        (Some(c), sse) => {
            if is_grpc || r.body.is_some() || r.raw_body.is_some() || r.sse.is_some() {
                errs.push(
                    ConfigError::at(
                        c.pos,
                        "a `chunks` route has no `body`, `raw_body`, `sse` or `grpc`",
                    )
                    .hint("its answer is the chunks"),
                );
            }
            if !headers.contains_key(http::header::CONTENT_TYPE) {
                headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/octet-stream"),
                );
            }
            sse.or_else(|| Some(Arc::new(crate::events::EventPlan::chunks(&c.value))))
        }
    };
    if let (Some(_), Some(raw)) = (&r.body, &r.raw_body) {
        errs.push(
            ConfigError::at(raw.pos, "a route has either `body` or `raw_body`, not both")
                .hint("`body` is a jq expression; `raw_body` is sent as written"),
        );
    }
    if errs.len() != before {
        return None;
    }
    let (method, status, latency, at) = (method?, status?, latency?, at?);
    let key = match &method {
        MethodMatch::Any => format!("* {}", at.value),
        MethodMatch::Exact(m) => format!("{m} {}", at.value),
    };
    let route = CompiledRoute {
        key,
        method,
        behaviour: Arc::new(Behaviour {
            status,
            latency,
            headers,
            body,
            raw_body: r.raw_body.as_ref().map(|b| Bytes::from(b.value.clone())),
            faults,
            sse,
            websocket: r.websocket.as_ref().map(|w| Arc::new(w.value.clone())),
            grpc_status: r.grpc_status.as_ref().map_or(Code::Ok, |c| c.value.0),
            grpc_message: r
                .grpc_message
                .as_ref()
                .map(|m| m.value.clone())
                .filter(|m| !m.is_empty()),
        }),
        grpc,
    };
    Some((route, at))
}

/// The checks of an HTTP route's path.
fn check_path(service: &str, path: &Located<String>, errs: &mut Vec<ConfigError>) {
    if !path.value.starts_with('/') {
        errs.push(
            ConfigError::at(
                path.pos,
                format!(
                    "service `{service}`: route path `{}` must start with `/`",
                    path.value
                ),
            )
            .hint("write e.g. `/items/{id}`"),
        );
    }
    if path.value.starts_with(ADMIN_PREFIX) {
        errs.push(
            ConfigError::at(
                path.pos,
                format!("service `{service}`: paths under `{ADMIN_PREFIX}` are reserved"),
            )
            .hint("the stub serves its admin endpoints there; choose another path"),
        );
    }
}

/// The fields that belong to gRPC routes only, or to HTTP routes only.
fn check_grpc_fields(r: &RouteConfig, is_grpc: bool, errs: &mut Vec<ConfigError>) {
    if is_grpc {
        if r.status.pos != Pos::default() {
            errs.push(
                ConfigError::at(r.status.pos, "a `grpc` route has no HTTP `status`")
                    .hint("answer a gRPC status with `grpc_status: UNAVAILABLE` (name or number)"),
            );
        }
        if let Some(raw) = &r.raw_body {
            errs.push(
                ConfigError::at(raw.pos, "a `grpc` route has no `raw_body`")
                    .hint("`body` is a jq expression building the answer message as JSON"),
            );
        }
        if let Some((_, v)) = r
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            errs.push(
                ConfigError::at(v.pos, "a `grpc` route always answers `application/grpc`")
                    .hint("remove the `content-type` header"),
            );
        }
    } else {
        if let Some(s) = &r.grpc_status {
            errs.push(
                ConfigError::at(s.pos, "`grpc_status` is for `grpc` routes")
                    .hint("an HTTP route answers `status: 503`; a fault can be `{status: 503}`"),
            );
        }
        if let Some(m) = &r.grpc_message {
            errs.push(
                ConfigError::at(m.pos, "`grpc_message` is for `grpc` routes")
                    .hint("an HTTP route's error text goes in its `body`"),
            );
        }
    }
}

/// Look up the method of a `grpc:` route.
fn grpc_method(
    service: &str,
    g: &Located<String>,
    protos: &Protos,
    errs: &mut Vec<ConfigError>,
) -> Option<GrpcMethod> {
    let set = match protos {
        Protos::Loaded(set) => set,
        Protos::Failed => return None,
        Protos::Absent => {
            errs.push(
                ConfigError::at(
                    g.pos,
                    format!(
                        "service `{service}`: `grpc: {}` needs the .proto files that define it",
                        g.value
                    ),
                )
                .hint(
                    "add a top-level `protos:` section, e.g. `protos: {files: \
                     [demo/v1/users.proto], include: [protos]}` (relative to this file's \
                     directory)",
                ),
            );
            return None;
        }
    };
    match set.method(&g.value) {
        Ok(m) if m.streaming => {
            errs.push(
                ConfigError::at(
                    g.pos,
                    format!(
                        "service `{service}`: `{}` is a streaming method; stubs serve unary \
                         methods only",
                        g.value
                    ),
                )
                .hint("choose a method whose request and answer are single messages"),
            );
            None
        }
        Ok(m) => Some(GrpcMethod {
            name: m.path.trim_start_matches('/').to_string(),
            input: m.input,
            output: m.output,
        }),
        Err(e) => {
            let hint = lookup_hint(&g.value, &e, set);
            errs.push(ConfigError::at(g.pos, format!("service `{service}`: {e}")).hint(hint));
            None
        }
    }
}

/// What to do about a method the `.proto` files do not have: the closest name, or the names
/// there are.
fn lookup_hint(name: &str, e: &MethodLookupError, set: &ProtoSet) -> String {
    let method_part = name
        .trim()
        .trim_start_matches('/')
        .rsplit_once('/')
        .map_or("", |(_, m)| m);
    let list = |names: &[String]| {
        const SHOWN: usize = 10;
        let mut s = names
            .iter()
            .take(SHOWN)
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > SHOWN {
            s.push_str(&format!(" and {} more", names.len() - SHOWN));
        }
        s
    };
    match e {
        MethodLookupError::BadName(_) => {
            "write `package.Service/Method`, e.g. `demo.v1.Users/GetUser`".into()
        }
        MethodLookupError::UnknownService { service, known } => {
            if known.is_empty() {
                return format!(
                    "the loaded .proto files ({}) define no services",
                    set.files().join(", ")
                );
            }
            match closest(service, known) {
                Some(c) => format!("did you mean `{c}/{method_part}`?"),
                None => format!("the services are {}", list(known)),
            }
        }
        MethodLookupError::UnknownMethod { service, known, .. } => {
            match closest(method_part, known) {
                Some(c) => format!("did you mean `{service}/{c}`?"),
                None if known.is_empty() => format!("`{service}` has no methods"),
                None => format!("`{service}` has {}", list(known)),
            }
        }
    }
}

/// A `.proto` compile error as a config error: at its place in the `.proto` file when the
/// compiler knows it; otherwise (a file not found, a limit) at the `protos:` entry it concerns.
fn proto_config_error(e: &ProtoError, p: &ProtosConfig) -> ConfigError {
    let hint = "the error is in the .proto files: `protos.files` are looked up (and their \
                imports) in `protos.include`, relative to the stub config's directory";
    let file = e
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .or_else(|| e.file.clone());
    if let (Some(file), Some((line, col))) = (file, e.line_col) {
        return ConfigError {
            path: None,
            file,
            pos: Some(Pos {
                line: u32::try_from(line).unwrap_or(u32::MAX),
                col: u32::try_from(col).unwrap_or(u32::MAX),
            }),
            message: e.message.clone(),
            hint: Some(hint.into()),
        };
    }
    let entry = e
        .file
        .as_ref()
        .and_then(|f| {
            p.files
                .iter()
                .find(|x| x.value == *f || f.ends_with(&x.value))
        })
        .or_else(|| p.files.first());
    ConfigError {
        path: None,
        file: String::new(),
        pos: entry.map(|x| x.pos).filter(|pos| *pos != Pos::default()),
        message: format!("protos: {e}"),
        hint: Some(hint.into()),
    }
}

/// What to do about a latency error, by its message.
fn latency_hint(msg: &str) -> &'static str {
    if msg.contains("mixture") && msg.contains("sum") {
        "the `p` of a mixture's arms must add up to 1, e.g. 0.99 and 0.01"
    } else if msg.contains("probability") {
        "a mixture arm's `p` is a probability between 0 and 1"
    } else if msg.contains("stall") {
        "write e.g. `{stall: {every: 1s, duration: 200ms, base: 5ms}}`"
    } else if msg.contains("uniform") {
        "`min` must not exceed `max`"
    } else {
        "see docs/stubs.md for the latency models"
    }
}

/// Stamp errors with the file name (errors in `.proto` files keep theirs).
pub(crate) fn in_file(errs: Vec<ConfigError>, file: &str) -> ConfigErrors {
    ConfigErrors(
        errs.into_iter()
            .map(|e| {
                if e.file.is_empty() {
                    e.in_file(file)
                } else {
                    e
                }
            })
            .collect(),
    )
}
