//! The stage contract ([`EdgeStage`]), its registration line ([`Registration`]) and the set of
//! stages one loaded config runs ([`StageSet`]).

use crate::client::ClientAddresses;
use bytes::Bytes;
use fanout_config::{Config, ConfigError, ConfigErrors};
use fanout_expr::Val;
use fanout_expr::request::RequestUse;
use fanout_flow::RoutePlan;
use fanout_protocol::metrics::Out;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use smallvec::SmallVec;
use std::any::Any;
use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The kind of route a request is on: every kind runs the same stages; a stage may apply to
/// some kinds only ([`EdgeStage::applies`]), and each kind renders a [`Rejection`] its own way
/// (a JSON error body, trailers-only gRPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// An HTTP route (`path:`).
    Http,
    /// A gRPC method (`grpc:`).
    Grpc,
}

/// What every stage sees of a request before its body is read: the head, the route, the path
/// parameters, the client's address (the socket's peer, or what trusted proxies say), and what
/// earlier stages found (the verified claims that become `$request.auth`).
pub struct RequestHead<'a> {
    /// Method, URI, headers.
    pub parts: &'a Parts,
    /// The route it matched.
    pub route: &'a RoutePlan,
    /// HTTP or gRPC.
    pub kind: RouteKind,
    /// The path parameters, decoded: (name, value).
    pub params: &'a [(&'a str, Cow<'a, str>)],
    /// The socket address of the connection it came on (`None` when unknown).
    pub peer: Option<SocketAddr>,
    /// `$request.auth`: `null` until a stage verifies who is calling.
    pub auth: Val,
    clients: &'a ClientAddresses,
    client: Option<Option<IpAddr>>,
    tls_of: TlsOf,
}

/// How the gateway tells a stage the connection's TLS as `$request.tls` (`null` on a plain
/// connection).
pub type TlsOf = fn(&Parts) -> Val;

impl<'a> RequestHead<'a> {
    /// A request's head as the stages of `set` see it.
    pub fn new(
        set: &'a StageSet,
        parts: &'a Parts,
        route: &'a RoutePlan,
        kind: RouteKind,
        params: &'a [(&'a str, Cow<'a, str>)],
        peer: Option<SocketAddr>,
    ) -> Self {
        RequestHead {
            parts,
            route,
            kind,
            params,
            peer,
            auth: Val::Null,
            clients: &set.clients,
            client: None,
            tls_of: set.tls_of,
        }
    }

    /// The client's address: the peer's, or — when the peer is one of
    /// `server.trusted_proxies` — the first untrusted hop of the forwarding header, read from
    /// the right (resolved once per request).
    pub fn client(&mut self) -> Option<IpAddr> {
        match self.client {
            Some(c) => c,
            None => {
                let c = self.clients.resolve(self.parts, self.peer);
                self.client = Some(c);
                c
            }
        }
    }

    /// The path parameters as `$request.params` keys them.
    pub fn param_vals(&self) -> impl Iterator<Item = (Val, &str)> {
        self.params
            .iter()
            .map(|(k, v)| (self.route.param_key(k), v.as_ref()))
    }

    /// The client's address as text (`$request.client.address`), when `reads` says so.
    pub fn client_text(&mut self, reads: &RequestUse) -> Option<String> {
        if !reads.client {
            return None;
        }
        self.client().map(|ip| ip.to_string())
    }

    /// `$request` without its body (not read yet) as far as `reads` reads it: what a stage's
    /// expressions see. A query or header they read that is not UTF-8 is refused (400
    /// `bad_query` / `bad_header`), as the flow's `$request` is.
    pub fn request_val(&mut self, reads: &RequestUse) -> Result<Val, Rejection> {
        let parts = self.parts;
        fanout_expr::request::check_text(
            parts.uri.query(),
            parts
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_bytes())),
            reads,
        )
        .map_err(|why| {
            let code = match why {
                fanout_expr::request::RequestTextError::Query(_) => "bad_query",
                fanout_expr::request::RequestTextError::Header(_) => "bad_header",
            };
            Rejection::new(StatusCode::BAD_REQUEST, code, why.to_string())
        })?;
        let client = self.client_text(reads);
        let headers = parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()));
        let request = fanout_expr::request::RequestParts::new(
            parts.method.as_str(),
            parts.uri.path(),
            parts.uri.query(),
            headers,
        )
        .with_params(self.param_vals())
        .with_client(client.as_deref())
        .with_auth(self.auth.clone());
        // The connection's TLS (`$request.tls`), only when read: the gateway knows its form.
        let request = match reads.tls {
            true => request.with_tls((self.tls_of)(parts)),
            false => request,
        };
        Ok(fanout_expr::request::request_val_reading(request, reads))
    }
}

/// A stage's refusal of a request, protocol-neutral: each route kind renders it (HTTP: the status
/// and the JSON error body `{"error": {"code", "message"}}`; gRPC: trailers-only with the code
/// its status implies). The message is safe for the client; `detail` goes to the log only.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The HTTP status.
    pub status: StatusCode,
    /// The error code (`error.code`).
    pub code: Cow<'static, str>,
    /// The message for the client.
    pub message: String,
    /// Why, for the log under the request id (never sent to the client).
    pub detail: Option<String>,
    /// More headers of the answer (`Retry-After`, `WWW-Authenticate`, …).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether the refusal is logged (with its detail, under the request id); otherwise it is
    /// only counted.
    pub log: bool,
}

impl Rejection {
    /// A refusal with `status`, `code` and the client's `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            status,
            code: Cow::Borrowed(code),
            message: message.into(),
            detail: None,
            headers: Vec::new(),
            log: false,
        }
    }

    /// Logged (with its detail, under the request id), not only counted.
    pub fn logged(mut self) -> Self {
        self.log = true;
        self
    }

    /// With `detail` for the log.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// With one more answer header.
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }
}

/// What a stage decides about a request: go on, refuse, or wait for something (a key fetch, a
/// shared counter) before deciding. Deciding at once costs no allocation; only a stage that
/// waits boxes its future.
pub enum Step<'a> {
    /// The next stage.
    Next,
    /// Answer the client with this refusal; no later stage runs, nor the flow.
    Refuse(Rejection),
    /// Decide after this future.
    Wait(BoxFuture<'a, Result<(), Rejection>>),
}

/// A request on arrival, before routing: what a stage of the arrival phase sees
/// ([`EdgeStage::on_arrival`]). A stage may answer it there (a CORS preflight), may note
/// headers its answer will carry whatever makes that answer — the flow, a refusal, a 404
/// ([`Arrival::answer_header`]) — and may ask to see that answer ([`Arrival::keep`]: its
/// [`EdgeStage::on_answer`] runs with the note it kept).
pub struct Arrival<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The headers.
    pub headers: &'a HeaderMap,
    router: &'a Router,
    /// The routes at its path, once looked up ([`Arrival::routes`]).
    routes: Option<&'a [Arc<RoutePlan>]>,
    /// The stage being run (its index in the set), for [`Arrival::keep`].
    current: u8,
    answer: AnswerNotes,
}

/// What the arrival phase noted for the request's answer: headers (name, value, whether
/// appended rather than replacing) and the stages that see the answer, each with its note.
/// Empty — no allocation — unless a stage notes something.
#[derive(Default)]
pub struct AnswerNotes {
    headers: Vec<(HeaderName, HeaderValue, bool)>,
    kept: SmallVec<[(u8, u64); 2]>,
}

/// The gateway's routing table of a loaded config: by path, the routes there (every method).
pub type Router = matchit::Router<Vec<Arc<RoutePlan>>>;

impl<'a> Arrival<'a> {
    /// A request on arrival: its head and the config's routing table.
    pub fn new(
        method: &'a Method,
        uri: &'a Uri,
        headers: &'a HeaderMap,
        router: &'a Router,
    ) -> Self {
        Arrival {
            method,
            uri,
            headers,
            router,
            routes: None,
            current: 0,
            answer: AnswerNotes::default(),
        }
    }

    /// The routes at the request's path, every method (empty when no route has the path):
    /// looked up on the first call only — a stage that does not ask costs no lookup.
    pub fn routes(&mut self) -> &'a [Arc<RoutePlan>] {
        if let Some(r) = self.routes {
            return r;
        }
        let r = self
            .router
            .at(self.uri.path())
            .map_or(&[][..], |m| m.value.as_slice());
        self.routes = Some(r);
        r
    }

    /// Note a header for the answer: set (replacing one of that name) or, with `append`, added.
    pub fn answer_header(&mut self, name: HeaderName, value: HeaderValue, append: bool) {
        self.answer.headers.push((name, value, append));
    }

    /// Ask to see the answer: the stage's [`EdgeStage::on_answer`] runs with `note` (what it
    /// decided now, e.g. the coding a client accepts) once the answer is made.
    pub fn keep(&mut self, note: u64) {
        self.answer.kept.push((self.current, note));
    }

    /// What was noted for the answer.
    pub fn into_answer_notes(self) -> AnswerNotes {
        self.answer
    }
}

/// What a stage decides about a request on arrival.
pub enum Early {
    /// The next stage (then routing).
    Next,
    /// Answer now with `status`, `headers` and no body; no later stage runs, nor routing.
    Answer {
        /// The status.
        status: StatusCode,
        /// The headers.
        headers: HeaderMap,
    },
    /// Refuse now; no later stage runs, nor routing.
    Refuse(Rejection),
}

/// What the gateway lends a stage while it works on a request or an answer.
#[derive(Clone, Copy)]
pub struct Tools<'a> {
    /// The bounded pool for CPU-heavy work (never on a serving thread).
    pub compute: &'a fanout_runtime::compute::ComputePool,
}

/// What a stage does to an answer: done at once, or after a future (work on the compute pool).
pub enum Later<'a> {
    /// Done.
    Done,
    /// Done when this future is.
    Wait(BoxFuture<'a, ()>),
}

/// What a stage does to a request body: the body (as it was, or replaced) or a refusal, at once
/// or after a future.
pub enum BodyStep<'a> {
    /// Decided.
    Done(Result<Bytes, Rejection>),
    /// Decided after this future.
    Wait(BoxFuture<'a, Result<Bytes, Rejection>>),
}

/// An answer as the answer phase sees it.
pub type Answer = http::Response<fanout_transport::body::Body>;

/// What a logging stage wants of one request, decided when it arrives ([`EdgeStage::log_want`]:
/// its sampling).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogWant {
    /// Its line, whatever the answer.
    pub line: bool,
    /// Its line if the answer is degraded (partial) or failed (5xx) — the gateway then keeps
    /// the request's step timeline, for the cause of each degraded step.
    pub if_degraded: bool,
}

impl LogWant {
    /// Whether it wants anything of the request.
    pub fn any(self) -> bool {
        self.line || self.if_degraded
    }

    /// Whether it wants the line of a request that ended as `done` says.
    pub fn takes(self, done: &Done<'_>) -> bool {
        self.line || self.if_degraded && done.degraded()
    }
}

/// What each logging stage wants of one request (empty — no allocation — without a logging
/// stage, or when none wants it).
#[derive(Default)]
pub struct LogWants(SmallVec<[(u8, LogWant); 1]>);

impl LogWants {
    /// Whether a stage wants the request logged in some case (else the gateway gathers
    /// nothing for it; otherwise it keeps the request's step timeline, for the cause of each
    /// degraded step).
    pub fn any(&self) -> bool {
        !self.0.is_empty()
    }
}

/// One step of a degraded answer, and why it fell back.
pub use fanout_ops::telemetry::access_log::Degraded;

/// A request once its answer is made (after the answer phase), as the logging phase sees it
/// ([`EdgeStage::on_logged`]).
pub struct Done<'a> {
    /// When it arrived.
    pub arrived: std::time::SystemTime,
    /// From arrival to the answer (its head and, for a body of known size, all of it; for a
    /// streamed answer — a pass-through route's — to its body's end).
    pub duration: std::time::Duration,
    /// The request id.
    pub request_id: &'a str,
    /// The method.
    pub method: &'a Method,
    /// The request path.
    pub path: &'a str,
    /// The route's path pattern (`None`: no route matched, or an answer before routing).
    pub route: Option<&'a str>,
    /// The client's address (the peer, or what trusted proxies say), when known.
    pub client: Option<IpAddr>,
    /// The subject of the client's verified TLS certificate.
    pub tls_client: Option<&'a str>,
    /// The answer's status (for gRPC, the HTTP status its `grpc-status` implies).
    pub status: StatusCode,
    /// Request body bytes read.
    pub bytes_in: u64,
    /// Answer body bytes, when the answer's size is known (a streamed answer's: the bytes
    /// sent before it ended, the client left or it was cut).
    pub bytes_out: Option<u64>,
    /// The `error.code` of an error answer.
    pub error: Option<&'a str>,
    /// The step an error answer names.
    pub error_step: Option<&'a str>,
    /// The steps of a degraded answer, with why each fell back.
    pub partial: &'a [Degraded<'a>],
}

impl Done<'_> {
    /// Degraded (partial) or failed (5xx).
    pub fn degraded(&self) -> bool {
        !self.partial.is_empty() || self.status.is_server_error()
    }
}

/// An edge stage: what the gateway does to every request between the connection and the flow,
/// whatever the route kind (docs/ARCHITECTURE.md, "How to add an edge stage"). One value per
/// loaded config, built by its [`Registration`] from the config (and the stage it replaces, whose
/// state it may keep across a reload); the gateway runs the stages of each route in the
/// registry's order.
///
/// The phases, in pingora's sense: [`EdgeStage::on_arrival`] before routing (a stage that says
/// it [`EdgeStage::arrives`]; it may answer, refuse, or note headers for the answer, whatever
/// makes it), then [`EdgeStage::on_request`] on the request head (after routing, before the
/// deadline is fixed and before the body is read), [`EdgeStage::on_body`] on the request body
/// once read whole (a stage that [`EdgeStage::reads_body`]), and [`EdgeStage::on_answer`] on
/// the answer once made, whatever made it (a stage that kept a note on arrival). The component surface:
/// [`EdgeStage::readiness`], [`EdgeStage::start`], [`EdgeStage::status_json`] (its section of the
/// status endpoint), [`EdgeStage::metrics`] (its families, every series from the start),
/// [`EdgeStage::explain`] (what `fanout explain` prints of a route) and
/// [`EdgeStage::warnings`].
pub trait EdgeStage: Send + Sync + 'static {
    /// Whether the stage does anything on route `route` (its index in the config) of `kind`:
    /// a stage runs only on the routes it applies to (no per-request cost elsewhere).
    fn applies(&self, route: usize, kind: RouteKind) -> bool;

    /// On the request head: go on, refuse, or wait.
    fn on_request<'a>(&'a self, head: &'a mut RequestHead<'_>) -> Step<'a>;

    /// Whether the stage has a connection phase ([`EdgeStage::on_connection`]); only those
    /// run there.
    fn connects(&self) -> bool {
        false
    }

    /// On a connection of the main listener once accepted, before its TLS handshake and any
    /// request: `false` closes it at once (the stage counts what it refuses). Only the peer's
    /// address is known here — a stage must let a trusted proxy's connection in and judge its
    /// requests.
    fn on_connection(&self, peer: SocketAddr) -> bool {
        let _ = peer;
        true
    }

    /// Whether the stage has an arrival phase ([`EdgeStage::on_arrival`]); only those run
    /// there, on every request of every route kind.
    fn arrives(&self) -> bool {
        false
    }

    /// On arrival, before routing: go on, answer, or refuse; headers noted on `arrival` go on
    /// the answer.
    fn on_arrival(&self, arrival: &mut Arrival<'_>) -> Early {
        let _ = arrival;
        Early::Next
    }

    /// Whether the stage has a body phase ([`EdgeStage::on_body`]); only those run there.
    fn reads_body(&self) -> bool {
        false
    }

    /// On the request body, read whole (at most `limit` bytes): go on with it (as it was, or
    /// replaced — a decoded body, at most `limit` bytes too), or refuse.
    fn on_body<'a>(
        &'a self,
        headers: &'a HeaderMap,
        body: Bytes,
        limit: usize,
        tools: Tools<'a>,
    ) -> BodyStep<'a> {
        let _ = (headers, limit, tools);
        BodyStep::Done(Ok(body))
    }

    /// On the answer, once made (whatever made it), for a stage that kept `note` on arrival
    /// ([`Arrival::keep`]): it may change the head and replace the body.
    fn on_answer<'a>(&'a self, note: u64, answer: &'a mut Answer, tools: Tools<'a>) -> Later<'a> {
        let _ = (note, answer, tools);
        Later::Done
    }

    /// Whether the stage names requests, and how: the first stage in the order that does
    /// names every request, on arrival, before every other phase (`request_id`).
    fn namer(&self) -> Option<&dyn Namer> {
        None
    }

    /// Whether the stage has a logging phase ([`EdgeStage::on_logged`]); only those run there.
    fn logs(&self) -> bool {
        false
    }

    /// What the stage wants of a request that has just arrived (its sampling decision); a
    /// request no stage wants costs nothing more.
    fn log_want(&self) -> LogWant {
        LogWant::default()
    }

    /// The logging phase: the request is done (its answer made, every other phase run) and the
    /// stage wanted it (`want`, as it decided on arrival). Runs on the serving thread: hand the
    /// line to a writer of its own, never wait.
    fn on_logged(&self, want: LogWant, done: &Done<'_>) {
        let _ = (want, done);
    }

    /// `Err(why)` while the stage cannot decide and the gateway must not report ready.
    fn readiness(&self) -> Result<(), String> {
        Ok(())
    }

    /// Background work of a serving gateway, started inside the runtime before it is ready
    /// (a key set's first fetch); what it returns is logged as warnings.
    fn start(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async { Vec::new() })
    }

    /// Its section of `/__fanout/status` (`None`: no section).
    fn status_json(&self) -> Option<serde_json::Value> {
        None
    }

    /// Its metric families (`/metrics`).
    fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        let _ = out;
        Ok(())
    }

    /// What it does on route `route`, a line each, for `fanout explain` (empty: nothing to say
    /// beyond its name).
    fn explain(&self, route: usize) -> Vec<String> {
        let _ = route;
        Vec::new()
    }

    /// What the config may not mean (`FILE:LINE:COL: warning: …`): said by `fanout validate`,
    /// logged at start and on reload.
    fn warnings(&self) -> Vec<ConfigError> {
        Vec::new()
    }

    /// The stage as `Any`: its next build reads the state it keeps across a reload.
    fn as_any(&self) -> &dyn Any;
}

/// What names requests ([`EdgeStage::namer`]): the header a request's id comes in and goes
/// back in, and the id of a request that has just arrived.
pub trait Namer: Send + Sync {
    /// The header carrying the id (from the client, and on every answer).
    fn header(&self) -> &HeaderName;

    /// The id of a request with `headers` (the client's, when it may be used, or a new one).
    fn name(&self, headers: &HeaderMap) -> HeaderValue;
}

/// What a stage's build is given.
pub struct BuildCx<'a> {
    /// The config being loaded.
    pub config: &'a Config,
    /// The stage of the config it replaces (a reload), to keep its state.
    pub prev: Option<&'a dyn EdgeStage>,
    /// The config being replaced.
    pub prev_config: Option<&'a Config>,
    /// The client addresses as trusted proxies resolve them (`server.trusted_proxies`).
    pub clients: &'a ClientAddresses,
    /// A connection to the config's Redis (`redis:`), lent by the gateway.
    pub redis: RedisConnect,
    /// The config's backends (the top of each stack), lent by the gateway: a stage may call
    /// one (the JWK sets of `jwks_url: backend://NAME/…`).
    pub backends: &'a HashMap<String, Arc<dyn fanout_layers::backend::Backend>>,
    /// The backends whose stack the reload kept (state fetched through one may be kept).
    pub kept_backends: &'a [String],
    /// The gateway's TLS listeners (main, admin), lent: they live as long as the process
    /// (`tls` is applied at start; the files are reloaded when they change).
    pub listeners: &'a [Arc<fanout_transport::tls::TlsListener>],
}

/// How the gateway lends a stage a connection to the config's Redis.
pub type RedisConnect = fn(
    &fanout_config::RedisConfig,
) -> Result<Arc<dyn fanout_ratelimit::redis::Connect>, ConfigError>;

impl BuildCx<'_> {
    /// Route `route`'s section of stage `name`: the route's `stages.NAME`, else
    /// `defaults.stages.NAME`, with the path of the one that applies (for errors).
    pub fn section(&self, name: &str, route: usize) -> Option<(&serde_json::Value, String)> {
        let r = self.config.routes.get(route)?;
        match r.stages.get(name) {
            Some(v) => Some((v, format!("routes[{route}].stages.{name}"))),
            None => self
                .config
                .defaults
                .stages
                .get(name)
                .map(|v| (v, format!("defaults.stages.{name}"))),
        }
    }

    /// Read a section into the stage's own config type; a section that does not fit is a
    /// config error at `path`.
    pub fn read<T: serde::de::DeserializeOwned>(
        &self,
        value: &serde_json::Value,
        path: &str,
    ) -> Result<T, ConfigError> {
        T::deserialize(value).map_err(|e| {
            ConfigError::at_path(path.to_string(), format!("{path}: {e}"))
                .in_file(&self.config.file)
        })
    }
}

/// What the gateway lends the stages when it builds them.
#[derive(Clone, Copy)]
pub struct Lent<'a> {
    /// A connection to the config's Redis.
    pub redis: RedisConnect,
    /// The config's backends, by name (the top of each stack).
    pub backends: &'a HashMap<String, Arc<dyn fanout_layers::backend::Backend>>,
    /// The backends whose stack a reload kept.
    pub kept_backends: &'a [String],
    /// The connection's TLS as `$request.tls`.
    pub tls_of: TlsOf,
    /// The gateway's TLS listeners (main, admin).
    pub listeners: &'a [Arc<fanout_transport::tls::TlsListener>],
}

/// Builds a stage for a loaded config; `Ok(None)` when the config gives it nothing to do.
pub type Build = fn(&BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors>;

/// A stage's line in the registry (`fanout-proxy`'s `registry.rs`).
#[derive(Clone, Copy)]
pub struct Registration {
    /// Its name: its key under `stages:` (when it reads its section there), its section of the
    /// status endpoint, what `fanout explain` names it.
    pub name: &'static str,
    /// Whether it reads a section under `stages:` (an unknown name there is a config error).
    pub section: bool,
    /// The `error.code`s of its refusals (each has a `fanout_errors_total` series from the
    /// start).
    pub codes: &'static [&'static str],
    /// Its build.
    pub build: Build,
    /// The JSON Schema of its section under `stages:` (in `fanout schema`), when it reads one.
    pub schema: Option<fn() -> serde_json::Value>,
}

/// The stages of one loaded config, in the registry's order, and which of them each route runs.
pub struct StageSet {
    stages: Vec<(&'static str, Arc<dyn EdgeStage>)>,
    /// By route index, then kind (HTTP, gRPC): the indices of the stages it runs.
    routes: Vec<[SmallVec<[u8; 4]>; 2]>,
    /// The indices of the stages with an arrival phase.
    arrival: SmallVec<[u8; 4]>,
    /// The indices of the stages with a body phase.
    body: SmallVec<[u8; 4]>,
    /// The indices of the stages with a logging phase.
    logging: SmallVec<[u8; 2]>,
    /// The indices of the stages with a connection phase.
    connection: SmallVec<[u8; 2]>,
    /// The index of the stage that names requests.
    namer: Option<u8>,
    clients: ClientAddresses,
    tls_of: TlsOf,
}

impl StageSet {
    /// Build every registered stage for `config`, in order (a stage of `prev` with the same name
    /// is handed to its build). Errors of every stage are collected.
    pub fn build(
        registry: &[Registration],
        config: &Config,
        prev: Option<(&Config, &StageSet)>,
        lent: Lent<'_>,
    ) -> Result<StageSet, ConfigErrors> {
        let mut errs = Vec::new();
        let clients = match ClientAddresses::new(config) {
            Ok(c) => c,
            Err(mut e) => {
                errs.append(&mut e.0);
                ClientAddresses::default()
            }
        };
        check_section_names(registry, config, &mut errs);
        let mut stages = Vec::new();
        for reg in registry {
            let cx = BuildCx {
                config,
                prev: prev.and_then(|(_, p)| p.get(reg.name)),
                prev_config: prev.map(|(c, _)| c),
                clients: &clients,
                redis: lent.redis,
                backends: lent.backends,
                kept_backends: lent.kept_backends,
                listeners: lent.listeners,
            };
            match (reg.build)(&cx) {
                Ok(Some(s)) => stages.push((reg.name, s)),
                Ok(None) => {}
                Err(mut e) => errs.append(&mut e.0),
            }
        }
        if stages.len() > usize::from(u8::MAX) {
            errs.push(ConfigError::at_path(
                "stages",
                format!("more than {} edge stages are registered", u8::MAX),
            ));
        }
        if !errs.is_empty() {
            fanout_config::locate(&mut errs, &config.source);
            for e in &mut errs {
                if e.file.is_empty() {
                    e.file = config.file.clone();
                }
            }
            return Err(ConfigErrors(errs));
        }
        let routes = (0..config.routes.len())
            .map(|r| {
                [RouteKind::Http, RouteKind::Grpc].map(|kind| {
                    stages
                        .iter()
                        .enumerate()
                        .filter(|(_, (_, s))| s.applies(r, kind))
                        .filter_map(|(i, _)| u8::try_from(i).ok())
                        .collect()
                })
            })
            .collect();
        let arrival = stages
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| s.arrives())
            .filter_map(|(i, _)| u8::try_from(i).ok())
            .collect();
        let body = stages
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| s.reads_body())
            .filter_map(|(i, _)| u8::try_from(i).ok())
            .collect();
        let logging = stages
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| s.logs())
            .filter_map(|(i, _)| u8::try_from(i).ok())
            .collect();
        let connection = stages
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| s.connects())
            .filter_map(|(i, _)| u8::try_from(i).ok())
            .collect();
        let namer = stages
            .iter()
            .position(|(_, s)| s.namer().is_some())
            .and_then(|i| u8::try_from(i).ok());
        Ok(StageSet {
            stages,
            routes,
            arrival,
            body,
            logging,
            connection,
            namer,
            clients,
            tls_of: lent.tls_of,
        })
    }

    /// The stage named `name`, if this config has it.
    pub fn get(&self, name: &str) -> Option<&dyn EdgeStage> {
        self.stages
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| &**s)
    }

    /// The client addresses as trusted proxies resolve them.
    pub fn clients(&self) -> &ClientAddresses {
        &self.clients
    }

    /// The names of the stages route `route` of `kind` runs, in order.
    pub fn route_stages(&self, route: usize, kind: RouteKind) -> Vec<&'static str> {
        self.indices(route, kind)
            .iter()
            .filter_map(|&i| self.stages.get(usize::from(i)))
            .map(|(n, _)| *n)
            .collect()
    }

    fn indices(&self, route: usize, kind: RouteKind) -> &[u8] {
        let k = match kind {
            RouteKind::Http => 0,
            RouteKind::Grpc => 1,
        };
        self.routes
            .get(route)
            .and_then(|r| r.get(k))
            .map_or(&[], |v| v.as_slice())
    }

    /// Run the request head through the stages of its route, in order: the first refusal ends
    /// it. A route without stages costs a lookup.
    pub async fn on_request(&self, head: &mut RequestHead<'_>) -> Result<(), Rejection> {
        for &i in self.indices(head.route.index, head.kind) {
            let Some((_, stage)) = self.stages.get(usize::from(i)) else {
                continue;
            };
            match stage.on_request(head) {
                Step::Next => {}
                Step::Refuse(r) => return Err(r),
                Step::Wait(f) => f.await?,
            }
        }
        Ok(())
    }

    /// Whether any stage has a connection phase (else accepting skips it).
    pub fn has_connection_phase(&self) -> bool {
        !self.connection.is_empty()
    }

    /// The connection phase: whether a connection from `peer` may stay open (every stage with
    /// the phase, in order, until one refuses).
    pub fn on_connection(&self, peer: SocketAddr) -> bool {
        self.connection.iter().all(|&i| {
            self.stages
                .get(usize::from(i))
                .is_none_or(|(_, s)| s.on_connection(peer))
        })
    }

    /// Whether any stage has an arrival phase (else the gateway skips it: no route lookup).
    pub fn has_arrival(&self) -> bool {
        !self.arrival.is_empty()
    }

    /// Run a request on arrival through the stages with an arrival phase, in order: the first
    /// that answers or refuses ends it.
    pub fn on_arrival(&self, arrival: &mut Arrival<'_>) -> Early {
        for &i in &self.arrival {
            let Some((_, stage)) = self.stages.get(usize::from(i)) else {
                continue;
            };
            arrival.current = i;
            match stage.on_arrival(arrival) {
                Early::Next => {}
                done => return done,
            }
        }
        Early::Next
    }

    /// Whether any stage has a body phase (else the body is taken as read).
    pub fn has_body_phase(&self) -> bool {
        !self.body.is_empty()
    }

    /// Run a request body through the stages with a body phase, in order (each gets what the
    /// one before left); the first refusal ends it.
    pub async fn on_body(
        &self,
        headers: &HeaderMap,
        mut body: Bytes,
        limit: usize,
        tools: Tools<'_>,
    ) -> Result<Bytes, Rejection> {
        for &i in &self.body {
            let Some((_, stage)) = self.stages.get(usize::from(i)) else {
                continue;
            };
            body = match stage.on_body(headers, body, limit, tools) {
                BodyStep::Done(r) => r?,
                BodyStep::Wait(f) => f.await?,
            };
        }
        Ok(body)
    }

    /// The answer phase: the headers noted on arrival go on `answer`, then each stage that
    /// kept a note sees it, in the order they kept them.
    pub async fn on_answer(&self, notes: AnswerNotes, answer: &mut Answer, tools: Tools<'_>) {
        let AnswerNotes { headers, kept } = notes;
        let h = answer.headers_mut();
        for (name, value, append) in headers {
            if append {
                h.append(name, value);
            } else {
                h.insert(name, value);
            }
        }
        for (i, note) in kept {
            let Some((_, stage)) = self.stages.get(usize::from(i)) else {
                continue;
            };
            if let Later::Wait(f) = stage.on_answer(note, answer, tools) {
                f.await;
            }
        }
    }

    /// The id of a request that has just arrived, and the header that carries it on the
    /// answer: named by the stage that names requests, or — without one (a registry that left
    /// `request_id` out) — a new id, in `x-request-id`.
    pub fn request_id(&self, headers: &HeaderMap) -> (HeaderValue, &HeaderName) {
        let namer = self
            .namer
            .and_then(|i| self.stages.get(usize::from(i)))
            .and_then(|(_, s)| s.namer());
        match namer {
            Some(n) => (n.name(headers), n.header()),
            None => {
                static IDS: std::sync::OnceLock<crate::request_id::RequestIds> =
                    std::sync::OnceLock::new();
                static HEADER: HeaderName = HeaderName::from_static("x-request-id");
                (
                    IDS.get_or_init(crate::request_id::RequestIds::new)
                        .generate(),
                    &HEADER,
                )
            }
        }
    }

    /// What the logging stages want of a request that has just arrived (their sampling).
    pub fn log_wants(&self) -> LogWants {
        let mut out = LogWants::default();
        for &i in &self.logging {
            if let Some((_, stage)) = self.stages.get(usize::from(i)) {
                let want = stage.log_want();
                if want.any() {
                    out.0.push((i, want));
                }
            }
        }
        out
    }

    /// The logging phase: each stage that wanted the request sees it done.
    pub fn on_logged(&self, wants: &LogWants, done: &Done<'_>) {
        for &(i, want) in &wants.0 {
            if let Some((_, stage)) = self.stages.get(usize::from(i)) {
                stage.on_logged(want, done);
            }
        }
    }

    /// `Ok` when every stage is ready, else the first reason.
    pub fn readiness(&self) -> Result<(), String> {
        self.stages.iter().try_for_each(|(_, s)| s.readiness())
    }

    /// Start every stage's background work; the warnings they return.
    pub async fn start(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (_, s) in &self.stages {
            out.extend(s.start().await);
        }
        out
    }

    /// Each stage's section of the status endpoint, by name.
    pub fn status_json(&self) -> impl Iterator<Item = (&'static str, serde_json::Value)> + '_ {
        self.stages
            .iter()
            .filter_map(|(n, s)| Some((*n, s.status_json()?)))
    }

    /// Every stage's metric families.
    pub fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        self.stages.iter().try_for_each(|(_, s)| s.metrics(out))
    }

    /// What the config may not mean: the trusted proxies', then every stage's warnings.
    pub fn warnings(&self) -> Vec<ConfigError> {
        let mut out = self.clients.warnings().to_vec();
        out.extend(self.stages.iter().flat_map(|(_, s)| s.warnings()));
        out
    }

    /// What `fanout explain` prints of route `route`: the stages it runs, in order, and what
    /// every stage says of it (a stage that does not run there may say why: `auth: none`).
    pub fn explain(&self, route: usize, kind: RouteKind) -> (Vec<&'static str>, Vec<String>) {
        let lines = self
            .stages
            .iter()
            .flat_map(|(_, s)| s.explain(route))
            .collect();
        (self.route_stages(route, kind), lines)
    }
}

/// Every name under `stages:` must be a registered stage that reads a section.
fn check_section_names(registry: &[Registration], config: &Config, errs: &mut Vec<ConfigError>) {
    let known: Vec<&str> = registry
        .iter()
        .filter(|r| r.section)
        .map(|r| r.name)
        .collect();
    let sections = std::iter::once((String::from("defaults.stages"), &config.defaults.stages))
        .chain(
            config
                .routes
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("routes[{i}].stages"), &r.stages)),
        );
    for (at, s) in sections {
        for name in s.0.keys() {
            if known.contains(&name.as_str()) {
                continue;
            }
            let mut e = ConfigError::at_path(
                format!("{at}.{name}"),
                format!("{at}: unknown edge stage `{name}`"),
            );
            e = match fanout_config::closest(name, known.iter().copied()) {
                Some(c) => e.hint(format!("did you mean `{c}`?")),
                None => e.hint(format!("the stages with a section: {}", known.join(", "))),
            };
            errs.push(e);
        }
    }
}
