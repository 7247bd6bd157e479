//! The running stub: one listener per service, HTTP/1.1 and h2c on the same port, per-request
//! latency, faults and templated JSON bodies, unary gRPC methods (a message decoded to JSON, the
//! answer encoded from JSON, the status in trailers), counters, and the `/__stub/` admin
//! endpoints.
//!
//! The request path takes no lock shared between requests other than the read side of the
//! route's behaviour cell: random draws come from a per-thread RNG, counters are atomics and
//! the overshoot histogram is sharded by thread. Delays use tokio's timer (1 ms granularity:
//! a sleep ends on the next millisecond tick at or after its deadline); the overshoot histogram
//! reports how late sleeps ended.

use crate::admin::{PutRoute, RouteUpdate, RouteUpdateError, RouteView};
use crate::body::StubBody;
use crate::compile::{
    ADMIN_PREFIX, Behaviour, BehaviourCell, CompiledService, CompiledStubs, GrpcMethod,
};
use crate::conn::{ConnCtx, ResetOnDrop};
use crate::fault::{self, FaultKind};
use crate::latency::{MAX_DELAY, with_rng};
use crate::record::{RecordedCall, Recorder};
use crate::stats::{ConnCounters, RouteCounters, ServiceStats};
use bytes::{Bytes, BytesMut};
use fanout_expr::request::{RequestParts, request_val};
use fanout_expr::{Expr, Val};
use fanout_grpc::frame::{self, FrameError};
use fanout_grpc::stubsupport::{self, GRPC_ACCEPT_ENCODING};
use fanout_grpc::{Code, is_grpc_content_type, looks_like_grpc};
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Largest accepted request body; larger bodies get 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Largest accepted gRPC request message (gRPC's usual default); a larger one is answered
/// RESOURCE_EXHAUSTED as soon as its frame header announces it.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 4 << 20;

/// Maximum concurrent HTTP/2 streams per connection (the stub must not be the bottleneck).
const MAX_H2_STREAMS: u32 = 4096;

/// Starting a stub server failed.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    /// A service could not bind its listen address.
    #[error("service `{service}`: cannot listen on {addr}: {source}")]
    Bind {
        /// Service name.
        service: String,
        /// The configured address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// One route at run time: its current behaviour and its counters.
struct RouteState {
    behaviour: BehaviourCell,
    counters: RouteCounters,
}

/// One service at run time, shared by its accept loop and all its connections.
struct ServiceState {
    compiled: CompiledService,
    routes: Vec<RouteState>,
    conns: ConnCounters,
    http: auto::Builder<TokioExecutor>,
    /// When the server started: stall windows are aligned to it.
    origin: Instant,
    /// The service's worker pool (`concurrency`), if limited.
    workers: Option<Arc<tokio::sync::Semaphore>>,
    /// The calls received, while recording is on.
    recorder: Recorder,
}

impl ServiceState {
    fn new(compiled: CompiledService, origin: Instant) -> Self {
        let routes = compiled
            .routes
            .iter()
            .map(|r| RouteState {
                behaviour: BehaviourCell::new(r.behaviour.clone()),
                counters: RouteCounters::default(),
            })
            .collect();
        let mut http = auto::Builder::new(TokioExecutor::new());
        http.http2().max_concurrent_streams(MAX_H2_STREAMS);
        let workers = compiled
            .concurrency
            .map(|n| Arc::new(tokio::sync::Semaphore::new(n)));
        ServiceState {
            compiled,
            routes,
            conns: ConnCounters::default(),
            http,
            origin,
            workers,
            recorder: Recorder::default(),
        }
    }

    fn stats(&self) -> ServiceStats {
        ServiceStats {
            connections_open: self.conns.open_now(),
            connections_total: self.conns.total(),
            routes: self
                .compiled
                .routes
                .iter()
                .zip(&self.routes)
                .map(|(c, r)| (c.key.clone(), r.counters.snapshot()))
                .collect(),
        }
    }

    fn reset(&self) {
        self.conns.reset();
        for r in &self.routes {
            r.counters.reset();
        }
        self.recorder.clear();
    }

    fn route_index(&self, key: &str) -> Option<usize> {
        self.compiled.routes.iter().position(|r| r.key == key)
    }

    fn route_views(&self) -> Vec<RouteView> {
        self.compiled
            .routes
            .iter()
            .zip(&self.routes)
            .map(|(c, r)| RouteView::of(&c.key, &r.behaviour.load(), c.grpc.is_some()))
            .collect()
    }

    /// Apply `update` to route `key`; the new view, or why not.
    fn update_route(&self, key: &str, update: &RouteUpdate) -> Result<RouteView, RouteUpdateError> {
        let route = self
            .route_index(key)
            .and_then(|i| self.routes.get(i))
            .ok_or_else(|| RouteUpdateError::NoRoute {
                service: self.compiled.name.clone(),
                route: key.to_string(),
            })?;
        let grpc = self.is_grpc(key);
        if !grpc && update.has_grpc_fields() {
            return Err(RouteUpdateError::Invalid(format!(
                "grpc_status, grpc_message: `{key}` is not a gRPC route (use `status` and \
                 faults)"
            )));
        }
        // Compile outside the lock; apply under it (concurrent updates do not lose fields).
        let compiled = update.compile().map_err(RouteUpdateError::Invalid)?;
        let next = route.behaviour.update(|b| compiled.apply(b));
        tracing::info!(service = %self.compiled.name, route = %key, "route behaviour updated");
        Ok(RouteView::of(key, &next, grpc))
    }

    /// Whether route `key` serves a gRPC method.
    fn is_grpc(&self, key: &str) -> bool {
        self.compiled
            .routes
            .iter()
            .any(|r| r.key == key && r.grpc.is_some())
    }
}

struct RunningService {
    name: String,
    addr: SocketAddr,
    state: Arc<ServiceState>,
    task: JoinHandle<()>,
}

/// Running stub services. Dropping it aborts the accept loops and closes every connection.
pub struct StubServer {
    services: Vec<RunningService>,
}

impl CompiledStubs {
    /// Bind every service and spawn its accept loop on the current tokio runtime.
    pub async fn start(&self) -> Result<StubServer, StubError> {
        let mut running = StubServer {
            services: Vec::new(),
        };
        let origin = Instant::now();
        for svc in &self.services {
            let listener = TcpListener::bind(svc.listen.as_str())
                .await
                .map_err(|source| StubError::Bind {
                    service: svc.name.clone(),
                    addr: svc.listen.clone(),
                    source,
                })?;
            let addr = listener.local_addr().map_err(|source| StubError::Bind {
                service: svc.name.clone(),
                addr: svc.listen.clone(),
                source,
            })?;
            let state = Arc::new(ServiceState::new(svc.clone(), origin));
            let task = tokio::spawn(accept_loop(listener, state.clone()));
            tracing::info!(service = %svc.name, %addr, "stub service listening");
            running.services.push(RunningService {
                name: svc.name.clone(),
                addr,
                state,
                task,
            });
        }
        Ok(running)
    }
}

impl StubServer {
    fn find(&self, service: &str) -> Option<&RunningService> {
        self.services.iter().find(|s| s.name == service)
    }

    /// The bound address of `service` (with the actual port when the config said 0).
    pub fn addr(&self, service: &str) -> Option<SocketAddr> {
        self.find(service).map(|s| s.addr)
    }

    /// All services with their bound addresses, in config order.
    pub fn services(&self) -> Vec<(String, SocketAddr)> {
        self.services
            .iter()
            .map(|s| (s.name.clone(), s.addr))
            .collect()
    }

    /// A snapshot of `service`'s counters.
    pub fn stats(&self, service: &str) -> Option<ServiceStats> {
        self.find(service).map(|s| s.state.stats())
    }

    /// Keep the requests every service receives from now on, at most `limit` per service
    /// (`0`: stop recording), for [`StubServer::recorded_calls`]; [`StubServer::reset_stats`]
    /// drops those kept.
    pub fn record_calls(&self, limit: usize) {
        for s in &self.services {
            s.state.recorder.set_limit(limit);
        }
    }

    /// The requests `service` received while recording was on, in the order received.
    pub fn recorded_calls(&self, service: &str) -> Option<Vec<RecordedCall>> {
        self.find(service).map(|s| s.state.recorder.calls())
    }

    /// Zero the counters of every service (gauges — open connections, requests in flight —
    /// keep their current values) and drop the recorded calls.
    pub fn reset_stats(&self) {
        for s in &self.services {
            s.state.reset();
        }
    }

    /// The current behaviour of route `route` (`"METHOD PATH-PATTERN"`) of `service`.
    pub fn behaviour(&self, service: &str, route: &str) -> Option<Arc<Behaviour>> {
        let s = self.find(service)?;
        let i = s.state.route_index(route)?;
        s.state.routes.get(i).map(|r| r.behaviour.load())
    }

    /// Replace the behaviour of a route while running; `false` when there is no such route.
    pub fn set_behaviour(&self, service: &str, route: &str, b: Behaviour) -> bool {
        let Some(s) = self.find(service) else {
            return false;
        };
        let Some(r) = s
            .state
            .route_index(route)
            .and_then(|i| s.state.routes.get(i))
        else {
            return false;
        };
        r.behaviour.store(Arc::new(b));
        true
    }

    /// Change a route while running (what `PUT /__stub/routes` does): only the fields given in
    /// `update` change. Requests already running keep the behaviour they started with.
    pub fn update_route(
        &self,
        service: &str,
        route: &str,
        update: RouteUpdate,
    ) -> Result<(), RouteUpdateError> {
        let s = self
            .find(service)
            .ok_or_else(|| RouteUpdateError::NoService(service.to_string()))?;
        s.state.update_route(route, &update).map(|_| ())
    }

    /// The routes of `service` with their current status, latency and faults (what
    /// `GET /__stub/routes` lists), in config order.
    pub fn routes(&self, service: &str) -> Option<Vec<RouteView>> {
        self.find(service).map(|s| s.state.route_views())
    }

    /// Stop accepting, close every connection, and wait until the accept loops have ended.
    pub async fn shutdown(mut self) {
        let services = std::mem::take(&mut self.services);
        for s in &services {
            s.task.abort();
        }
        for s in services {
            // The task was aborted; a cancellation error is the expected outcome.
            let _ = s.task.await;
        }
    }
}

impl Drop for StubServer {
    fn drop(&mut self) {
        for s in &self.services {
            s.task.abort();
        }
    }
}

/// Accept connections until aborted. Connection tasks live in a `JoinSet`, so aborting this
/// task drops them all (closing their sockets and dropping in-flight handlers).
async fn accept_loop(listener: TcpListener, state: Arc<ServiceState>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    conns.spawn(serve_connection(stream, state.clone()));
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(service = %state.compiled.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, state: Arc<ServiceState>) {
    let _open = state.conns.open();
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "set_nodelay failed");
    }
    let ctx = Arc::new(ConnCtx::default());
    let io = TokioIo::new(ResetOnDrop::new(stream, ctx.clone()));
    let svc_state = state.clone();
    let svc_ctx = ctx.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = svc_state.clone();
        let ctx = svc_ctx.clone();
        async move { Ok::<_, Infallible>(handle(&state, &ctx, req).await) }
    });
    let conn = state.http.serve_connection_with_upgrades(io, service);
    tokio::select! {
        r = conn => {
            if let Err(e) = r {
                tracing::debug!(service = %state.compiled.name, error = %e, "connection ended with an error");
            }
        }
        // A `reset` fault: dropping the connection drops the socket with SO_LINGER 0.
        () = ctx.kill.notified() => {
            tracing::debug!(service = %state.compiled.name, "connection reset (injected fault)");
        }
    }
}

fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<StubBody> {
    let mut resp = Response::new(StubBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_response(status: StatusCode, message: &str) -> Response<StubBody> {
    let body = serde_json::json!({ "error": message }).to_string();
    json_response(status, body)
}

/// What a body expression sees of the request.
struct RequestView<'a> {
    parts: &'a http::request::Parts,
    path: &'a str,
    params: &'a [(&'a str, &'a str)],
    body: &'a [u8],
}

impl RequestView<'_> {
    /// Evaluate a body expression over `$request` and write it as JSON.
    fn eval(&self, expr: &Expr) -> Result<Bytes, String> {
        let body_val = if self.body.is_empty() {
            Val::Null
        } else {
            fanout_expr::json::parse(self.body)
                .unwrap_or_else(|_| fanout_expr::json::str_val(&String::from_utf8_lossy(self.body)))
        };
        let headers = self
            .parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()));
        let request = request_val(
            RequestParts::new(
                self.parts.method.as_str(),
                self.path,
                self.parts.uri.query(),
                headers,
            )
            .with_params(self.params.iter().copied())
            .with_body(body_val),
        );
        let mut out = Vec::with_capacity(128);
        let v = expr
            .eval(&Val::Null, |_| request.clone())
            .map_err(|e| format!("body expression failed: {e}"))?;
        fanout_expr::json::write(&v, &mut out);
        Ok(Bytes::from(out))
    }
}

async fn handle(
    state: &ServiceState,
    conn: &ConnCtx,
    req: Request<Incoming>,
) -> Response<StubBody> {
    let (mut parts, body) = req.into_parts();
    // A WebSocket handshake's upgrade (taken only from a request that asks for one).
    let upgrade = match parts.headers.contains_key(http::header::UPGRADE) {
        true => parts.extensions.remove::<hyper::upgrade::OnUpgrade>(),
        false => None,
    };
    let path = parts.uri.path();
    if let Some(admin) = path.strip_prefix(ADMIN_PREFIX) {
        return admin_request(state, &parts, admin, body).await;
    }
    // A gRPC client is answered in gRPC, whatever goes wrong.
    let grpc_request = parts
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| looks_like_grpc(v.as_bytes()));
    let table = &state.compiled.table;
    let routes = &state.compiled.routes;
    let Ok(found) = table.router.at(path) else {
        if grpc_request {
            return unknown_method(state, path);
        }
        return error_response(
            StatusCode::NOT_FOUND,
            &format!("no route for {} {path}", parts.method),
        );
    };
    let entry = *found.value;
    let Some(idx) = table.pick(entry, &parts.method, routes) else {
        if grpc_request {
            return unknown_method(state, path);
        }
        let mut resp = error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {} not allowed for {path}", parts.method),
        );
        if let Ok(v) = HeaderValue::from_str(&table.allowed(entry, routes)) {
            resp.headers_mut().insert(ALLOW, v);
        }
        return resp;
    };
    // Captured segments are percent-decoded, as web frameworks (and the gateway) do.
    let mut decoded: Vec<(&str, std::borrow::Cow<'_, str>)> = Vec::new();
    for (k, v) in found.params.iter() {
        match fanout_expr::request::decode_path_param(v) {
            Ok(d) => decoded.push((k, d)),
            Err(_) if grpc_request => decoded.push((k, v.into())),
            Err(e) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    &format!("path parameter `{k}`: {e}"),
                );
            }
        }
    }
    let params: Vec<(&str, &str)> = decoded.iter().map(|(k, v)| (*k, v.as_ref())).collect();
    let (Some(route), Some(compiled)) = (state.routes.get(idx), routes.get(idx)) else {
        return error_response(StatusCode::INTERNAL_SERVER_ERROR, "route table mismatch");
    };
    if grpc_request && compiled.grpc.is_none() {
        return unknown_method(state, path);
    }

    let guard = route.counters.start();
    let behaviour = route.behaviour.load();
    if let Some(ws) = &behaviour.websocket {
        guard.complete();
        return crate::ws::answer(ws, &parts.headers, upgrade);
    }

    // The request body: as sent, or a gRPC request message decoded to JSON.
    let input = match &compiled.grpc {
        None => read_body(&parts, body).await,
        Some(m) => read_grpc(&parts, body, m).await,
    };
    let bytes = match input {
        Ok(b) => b,
        Err(resp) => {
            guard.complete();
            return resp;
        }
    };

    if state.recorder.on() {
        state.recorder.push(RecordedCall {
            route: compiled.key.clone(),
            method: parts.method.to_string(),
            path: path.to_string(),
            query: parts.uri.query().map(str::to_string),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: bytes.clone(),
        });
    }
    // A limited service works on `concurrency` requests at once; the rest wait in line.
    let _worker = match &state.workers {
        Some(w) => w.clone().acquire_owned().await.ok(),
        None => None,
    };
    let now = Instant::now();
    let since_start = now.saturating_duration_since(state.origin);
    let (fault, delay) = with_rng(|rng| {
        let fault = fault::pick(&behaviour.faults, rng);
        let delay = behaviour.latency.delay_at(since_start, rng);
        (fault.map(|f| &f.kind), delay)
    });
    if let Some(f) = fault {
        route.counters.fault_fired(f.index());
    }
    if let Some(FaultKind::Hang) = fault {
        // Never answer: the handler ends when the client goes away (counted as aborted).
        return std::future::pending().await;
    }

    let delay = delay.min(MAX_DELAY);
    if !delay.is_zero() {
        let deadline = now + delay;
        crate::precise::sleep_until(deadline, state.compiled.precise).await;
        route
            .counters
            .record_overshoot(Instant::now().saturating_duration_since(deadline));
    }

    if let Some(FaultKind::Reset) = fault {
        guard.complete();
        conn.reset();
        // The connection task drops this handler together with the connection.
        return std::future::pending().await;
    }
    let view = RequestView {
        parts: &parts,
        path,
        params: &params,
        body: &bytes,
    };
    let resp = match &compiled.grpc {
        None => http_answer(fault, &behaviour, &view, &route.counters.streams),
        Some(m) => {
            let at = Where {
                service: &state.compiled.name,
                route: &compiled.key,
            };
            grpc_answer(fault, &behaviour, &view, m, at)
        }
    };
    guard.complete();
    resp
}

/// The answer of an HTTP route: normal, or broken by `fault` (`hang` and `reset` are handled
/// before).
fn http_answer(
    fault: Option<&FaultKind>,
    behaviour: &Behaviour,
    view: &RequestView<'_>,
    streams: &Arc<crate::events::StreamCounters>,
) -> Response<StubBody> {
    if let Some(plan) = &behaviour.sse
        && !matches!(
            fault,
            Some(FaultKind::Status { .. } | FaultKind::GrpcStatus { .. })
        )
    {
        return event_stream(behaviour, plan, view, streams);
    }
    match fault {
        None | Some(FaultKind::Hang | FaultKind::Reset) => respond(behaviour, view, StubBody::full),
        Some(FaultKind::Status { status, body }) => status_fault(*status, body.as_ref(), view),
        Some(FaultKind::SlowBody { chunks, duration }) => respond(behaviour, view, |b| {
            StubBody::dribble(b, *chunks, *duration)
        }),
        Some(FaultKind::Malformed) => {
            let mut resp = respond(behaviour, view, |b| StubBody::full(malformed(&b)));
            if resp.status() != StatusCode::INTERNAL_SERVER_ERROR {
                *resp.status_mut() = StatusCode::OK;
            }
            resp
        }
        Some(FaultKind::CloseAfterHeaders) => {
            respond(behaviour, view, |b| StubBody::close_after_headers(b.len()))
        }
        Some(FaultKind::GrpcStatus { code, message }) => {
            let status = code.http_status();
            let body = serde_json::json!({
                "error": message.as_deref().unwrap_or("injected fault"),
                "status": status.as_u16(),
                "grpc_status": code.name(),
            });
            json_response(status, body.to_string())
        }
    }
}

/// Which route answers, for log lines.
#[derive(Clone, Copy)]
struct Where<'a> {
    service: &'a str,
    route: &'a str,
}

/// A trailers-only gRPC answer: HTTP 200 and the status in the headers, no message.
fn grpc_status_response(code: Code, message: &str) -> Response<StubBody> {
    let mut resp = Response::new(StubBody::full(Bytes::new()));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(fanout_grpc::CONTENT_TYPE),
    );
    stubsupport::set_status(h, code, message);
    resp
}

/// The answer to a gRPC call of a method this service does not serve.
fn unknown_method(state: &ServiceState, path: &str) -> Response<StubBody> {
    grpc_status_response(
        Code::Unimplemented,
        &format!(
            "method {path} is not served by stub service `{}`",
            state.compiled.name
        ),
    )
}

/// The answer to a request body that is not one acceptable gRPC message.
fn frame_refusal(e: &FrameError) -> Response<StubBody> {
    let mut resp = grpc_status_response(stubsupport::frame_error_code(e), &e.to_string());
    if *e == FrameError::Compressed {
        resp.headers_mut()
            .insert(GRPC_ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    resp
}

/// Read a gRPC request (`content-type: application/grpc`, one uncompressed message of at most
/// [`MAX_GRPC_MESSAGE_BYTES`]) and decode its message to JSON; the error is the answer to send
/// (a gRPC status; 415 for a request that is not gRPC at all).
async fn read_grpc(
    parts: &http::request::Parts,
    body: Incoming,
    m: &GrpcMethod,
) -> Result<Bytes, Response<StubBody>> {
    let ct = parts
        .headers
        .get(CONTENT_TYPE)
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    if !is_grpc_content_type(ct) {
        if looks_like_grpc(ct) {
            return Err(grpc_status_response(
                Code::Unimplemented,
                &format!(
                    "content-type `{}` is not served: send application/grpc (protobuf)",
                    String::from_utf8_lossy(ct)
                ),
            ));
        }
        return Err(error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!(
                "{} is a gRPC method: send content-type application/grpc",
                m.name
            ),
        ));
    }
    let framed = read_frame(body, MAX_GRPC_MESSAGE_BYTES).await?;
    let msg =
        frame::decode_unary(&framed, MAX_GRPC_MESSAGE_BYTES).map_err(|e| frame_refusal(&e))?;
    match m.input.proto_to_json(&msg) {
        Ok(json) => Ok(Bytes::from(json)),
        Err(e) => Err(grpc_status_response(Code::InvalidArgument, &e.to_string())),
    }
}

/// Read a gRPC request body: stops early when the first frame's header announces more than
/// `limit` bytes (answered at once), or when more than one frame has arrived (a unary call takes
/// one; [`frame::decode_unary`] then says so).
async fn read_frame(mut body: Incoming, limit: usize) -> Result<Bytes, Response<StubBody>> {
    let mut buf = BytesMut::new();
    while let Some(next) = body.frame().await {
        let next = next.map_err(|e| {
            grpc_status_response(Code::Internal, &format!("cannot read the request: {e}"))
        })?;
        let Ok(data) = next.into_data() else {
            continue; // trailers
        };
        buf.extend_from_slice(&data);
        if let Some(len) = frame::announced(&buf) {
            if len > limit {
                // The header alone says why: a bad flag or compression first, else the size.
                let header =
                    Bytes::copy_from_slice(buf.get(..frame::HEADER_LEN).unwrap_or_default());
                let e = frame::decode_unary(&header, limit)
                    .err()
                    .unwrap_or(FrameError::TooLarge { len, limit });
                return Err(frame_refusal(&e));
            }
            if buf.len() > frame::HEADER_LEN + len {
                break;
            }
        }
    }
    Ok(buf.freeze())
}

/// The answer of a gRPC route: normal, or broken by `fault` (`hang` and `reset` are handled
/// before). A fault answering an HTTP status answers the gRPC code it maps to
/// ([`Code::for_answer`]); `slow_body` dribbles the framed message, then the trailers;
/// `malformed` sends a message that is not valid protobuf; `close_after_headers` resets the
/// stream after the headers.
fn grpc_answer(
    fault: Option<&FaultKind>,
    b: &Behaviour,
    view: &RequestView<'_>,
    m: &GrpcMethod,
    at: Where<'_>,
) -> Response<StubBody> {
    match fault {
        None | Some(FaultKind::Hang | FaultKind::Reset) => {
            grpc_respond(b, view, m, at, StubBody::full)
        }
        Some(FaultKind::Status { status, body }) => {
            let code = Code::for_answer(*status, "");
            let message = match body {
                None => format!("injected fault (HTTP status {})", status.as_u16()),
                Some(expr) => match view.eval(expr) {
                    // A string is the message as it is; anything else its JSON text.
                    Ok(json) => serde_json::from_slice::<String>(&json)
                        .unwrap_or_else(|_| String::from_utf8_lossy(&json).into_owned()),
                    Err(e) => return grpc_status_response(Code::Internal, &e),
                },
            };
            grpc_status_response(code, &message)
        }
        Some(FaultKind::GrpcStatus { code, message }) => {
            grpc_status_response(*code, message.as_deref().unwrap_or("injected fault"))
        }
        Some(FaultKind::SlowBody { chunks, duration }) => grpc_respond(b, view, m, at, |f| {
            StubBody::dribble_exact(f, *chunks, *duration)
        }),
        Some(FaultKind::Malformed) => {
            grpc_respond(b, view, m, at, |f| StubBody::full(malformed_frame(&f)))
        }
        Some(FaultKind::CloseAfterHeaders) => {
            grpc_respond(b, view, m, at, |f| StubBody::close_after_headers(f.len()))
        }
    }
}

/// A gRPC route's answer: its `grpc_status` (trailers-only) when not OK, else the body
/// expression's result encoded as the output message, framed, wrapped by `wrap`, and followed
/// by `grpc-status: 0` trailers. A result that does not fit the message is INTERNAL (logged).
fn grpc_respond(
    b: &Behaviour,
    view: &RequestView<'_>,
    m: &GrpcMethod,
    at: Where<'_>,
    wrap: impl FnOnce(Bytes) -> StubBody,
) -> Response<StubBody> {
    let with_headers = |mut resp: Response<StubBody>| {
        for (k, v) in &b.headers {
            resp.headers_mut().append(k, v.clone());
        }
        resp
    };
    if b.grpc_status != Code::Ok {
        let msg = b.grpc_message.as_deref().unwrap_or_default();
        return with_headers(grpc_status_response(b.grpc_status, msg));
    }
    if !b.status.is_success() {
        // An HTTP status set on a gRPC route at run time: the code it maps to.
        let code = Code::for_answer(b.status, "");
        let msg = format!("route status {}", b.status.as_u16());
        return with_headers(grpc_status_response(code, &msg));
    }
    let json = match &b.body {
        None => Bytes::from_static(b"{}"),
        Some(expr) => match view.eval(expr) {
            Ok(j) if &j[..] == b"null" => Bytes::from_static(b"{}"),
            Ok(j) => j,
            Err(e) => {
                tracing::warn!(service = %at.service, route = %at.route, error = %e, "gRPC stub answer failed");
                return grpc_status_response(Code::Internal, &e);
            }
        },
    };
    let mut encoded = Ok(());
    let framed = frame::encode_with(|out| encoded = m.output.json_to_proto_into(&json, out));
    if let Err(e) = encoded {
        let message = format!("the body does not fit the answer message {e}");
        tracing::warn!(service = %at.service, route = %at.route, error = %message, "gRPC stub answer failed");
        return grpc_status_response(Code::Internal, &message);
    }
    let body = wrap(framed).with_trailers(stubsupport::status_trailers(Code::Ok, ""));
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(fanout_grpc::CONTENT_TYPE),
    );
    with_headers(resp)
}

/// A framed message that no protobuf decoder accepts: the message followed by a tag with the
/// invalid wire type 7 (field 1), correctly framed.
fn malformed_frame(framed: &[u8]) -> Bytes {
    let mut msg = framed.get(frame::HEADER_LEN..).unwrap_or_default().to_vec();
    msg.push(0x0f);
    frame::encode(&msg)
}

/// Read the request body, up to [`MAX_BODY_BYTES`]; the error is the response to send.
async fn read_body(
    parts: &http::request::Parts,
    body: Incoming,
) -> Result<Bytes, Response<StubBody>> {
    let too_large = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES as u64);
    if too_large {
        return Err(too_large_response());
    }
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            if e.is::<http_body_util::LengthLimitError>() {
                return Err(too_large_response());
            }
            Err(error_response(
                StatusCode::BAD_REQUEST,
                &format!("cannot read request body: {e}"),
            ))
        }
    }
}

fn too_large_response() -> Response<StubBody> {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request body larger than {MAX_BODY_BYTES} bytes"),
    )
}

/// The route's normal response, its body bytes wrapped by `wrap` (plain, dribbled, ...).
fn respond(
    b: &Behaviour,
    req: &RequestView<'_>,
    wrap: impl FnOnce(Bytes) -> StubBody,
) -> Response<StubBody> {
    let bytes = match (&b.raw_body, &b.body) {
        (Some(raw), _) => raw.clone(),
        (None, None) => Bytes::from_static(b"null"),
        (None, Some(expr)) => match req.eval(expr) {
            Ok(bytes) => bytes,
            Err(e) => return error_response(StatusCode::INTERNAL_SERVER_ERROR, &e),
        },
    };
    let mut resp = Response::new(wrap(bytes));
    *resp.status_mut() = b.status;
    let headers = resp.headers_mut();
    for (k, v) in &b.headers {
        headers.append(k, v.clone());
    }
    if !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    resp
}

/// The answer of an `sse:` route: its status and headers (`text/event-stream` and
/// `Cache-Control: no-cache` unless given), its events as they are due.
fn event_stream(
    b: &Behaviour,
    plan: &Arc<crate::events::EventPlan>,
    req: &RequestView<'_>,
    streams: &Arc<crate::events::StreamCounters>,
) -> Response<StubBody> {
    let last_id = req
        .parts
        .headers
        .get("last-event-id")
        .map(HeaderValue::as_bytes);
    let body = crate::events::EventsBody::new(plan.clone(), last_id, streams.clone());
    let mut resp = Response::new(StubBody::Events(body));
    *resp.status_mut() = b.status;
    let headers = resp.headers_mut();
    for (k, v) in &b.headers {
        headers.append(k, v.clone());
    }
    if !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    }
    if !headers.contains_key(http::header::CACHE_CONTROL) {
        headers.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        );
    }
    resp
}

/// The response of a `status` fault: its body expression, or a JSON error object.
fn status_fault(
    status: StatusCode,
    body: Option<&Expr>,
    req: &RequestView<'_>,
) -> Response<StubBody> {
    let bytes = match body {
        Some(expr) => match req.eval(expr) {
            Ok(b) => b,
            Err(e) => return error_response(StatusCode::INTERNAL_SERVER_ERROR, &e),
        },
        None => Bytes::from(
            serde_json::json!({"error": "injected fault", "status": status.as_u16()}).to_string(),
        ),
    };
    json_response(status, bytes)
}

/// A truncated, never-valid JSON body: the first half of `body` and an unclosed `{` (no valid
/// JSON text ends with an unclosed object, whatever precedes it).
fn malformed(body: &[u8]) -> Bytes {
    let half = body.get(..body.len() / 2).unwrap_or_default();
    let mut out = Vec::with_capacity(half.len() + 1);
    out.extend_from_slice(half);
    out.push(b'{');
    Bytes::from(out)
}

fn method_not_allowed(method: &Method, what: &str, allow: &'static str) -> Response<StubBody> {
    let mut resp = error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("method {method} not allowed for {ADMIN_PREFIX}{what}"),
    );
    resp.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    resp
}

fn to_json<T: serde::Serialize>(v: &T) -> Response<StubBody> {
    match serde_json::to_vec(v) {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn admin_request(
    state: &ServiceState,
    parts: &http::request::Parts,
    what: &str,
    body: Incoming,
) -> Response<StubBody> {
    let method = &parts.method;
    match (what, method) {
        ("stats", &Method::GET) => to_json(&state.stats()),
        ("reset", &Method::POST) => {
            state.reset();
            json_response(StatusCode::OK, Bytes::from_static(br#"{"reset":true}"#))
        }
        ("routes", &Method::GET) => to_json(&serde_json::json!({ "routes": state.route_views() })),
        ("routes", &Method::PUT) => {
            let bytes = match read_body(parts, body).await {
                Ok(b) => b,
                Err(resp) => return resp,
            };
            let put: PutRoute = match serde_json::from_slice(&bytes) {
                Ok(p) => p,
                Err(e) => {
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        &format!("invalid route update: {e}"),
                    );
                }
            };
            let (route, update) = put.into_update();
            match state.update_route(&route, &update) {
                Ok(view) => to_json(&view),
                Err(e @ RouteUpdateError::NoRoute { .. }) => {
                    error_response(StatusCode::NOT_FOUND, &e.to_string())
                }
                Err(e) => error_response(StatusCode::BAD_REQUEST, &e.to_string()),
            }
        }
        ("stats", _) => method_not_allowed(method, what, "GET"),
        ("reset", _) => method_not_allowed(method, what, "POST"),
        ("routes", _) => method_not_allowed(method, what, "GET, PUT"),
        _ => error_response(
            StatusCode::NOT_FOUND,
            &format!(
                "no admin endpoint {ADMIN_PREFIX}{what}; use GET {ADMIN_PREFIX}stats, POST \
                 {ADMIN_PREFIX}reset, GET or PUT {ADMIN_PREFIX}routes"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_testkit::wait_until;
    use http_body_util::Full;
    use tokio::io::AsyncWriteExt;

    /// `concurrency: 1` serialises the service: three concurrent 100 ms requests take ≥ 300 ms
    /// (a lower bound only: sleeps never end early, whatever the machine's load).
    #[tokio::test]
    async fn a_limited_service_works_on_concurrency_requests_at_once() {
        use tokio::io::AsyncReadExt;
        let yaml = "services:\n  s:\n    listen: 127.0.0.1:0\n    concurrency: 1\n    routes:\n      - path: /x\n        latency: 100ms\n";
        let stubs = crate::load("t.yaml", yaml, &|_| None).expect("loads");
        let server = stubs.start().await.expect("starts");
        let addr = server.addr("s").expect("addr");
        let start = std::time::Instant::now();
        let calls = (0..3).map(|_| {
            tokio::spawn(async move {
                let mut c = TcpStream::connect(addr).await.expect("connect");
                c.write_all(b"GET /x HTTP/1.1\r\nhost: s\r\nconnection: close\r\n\r\n")
                    .await
                    .expect("write");
                let mut out = Vec::new();
                c.read_to_end(&mut out).await.expect("read");
                String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200")
            })
        });
        for c in calls.collect::<Vec<_>>() {
            assert!(c.await.expect("task"), "200");
        }
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "one at a time: {:?}",
            start.elapsed()
        );
        server.shutdown().await;
    }

    const SLOW: &str = "services:\n  s:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /slow\n        latency: 30s\n";

    /// After `shutdown`, nothing of the server survives: not the accept loop, not the
    /// connections, not the in-flight handlers of HTTP/1 and HTTP/2 (spawned per stream).
    #[tokio::test]
    async fn shutdown_leaves_no_tasks_behind() {
        let stubs = crate::load("t.yaml", SLOW, &|_| None).expect("loads");
        let server = stubs.start().await.expect("starts");
        let addr = server.addr("s").expect("addr");
        let state = Arc::downgrade(&server.services[0].state);
        let in_flight = || {
            state
                .upgrade()
                .map_or(0, |s| s.stats().routes["GET /slow"].in_flight)
        };

        let mut h1 = TcpStream::connect(addr).await.expect("connect");
        h1.write_all(b"GET /slow HTTP/1.1\r\nhost: s\r\n\r\n")
            .await
            .expect("write");
        let h2 = TcpStream::connect(addr).await.expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(h2))
                .await
                .expect("handshake");
        let conn = tokio::spawn(conn);
        let req = Request::builder()
            .uri("http://s/slow")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let pending = tokio::spawn(async move { send.send_request(req).await.map(|_| ()) });
        wait_until("two handlers running", || in_flight() == 2).await;

        server.shutdown().await;
        wait_until("all server state dropped", || state.upgrade().is_none()).await;
        wait_until("h2 client saw the connection end", || {
            pending.is_finished() && conn.is_finished()
        })
        .await;
    }
}
