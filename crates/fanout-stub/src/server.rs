//! The running stub: one listener per service, HTTP/1.1 and h2c on the same port, per-request
//! latency and templated JSON bodies, counters, and the `/__stub/` admin endpoints.

use crate::compile::{ADMIN_PREFIX, Behaviour, BehaviourCell, CompiledService, CompiledStubs};
use crate::stats::{ConnCounters, RouteCounters, ServiceStats};
use bytes::Bytes;
use fanout_expr::Val;
use fanout_expr::request::{RequestParts, request_val};
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Largest accepted request body; larger bodies get 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;

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
}

impl ServiceState {
    fn new(compiled: CompiledService) -> Self {
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
        ServiceState {
            compiled,
            routes,
            conns: ConnCounters::default(),
            http,
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
    }

    fn route_index(&self, key: &str) -> Option<usize> {
        self.compiled.routes.iter().position(|r| r.key == key)
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
            let state = Arc::new(ServiceState::new(svc.clone()));
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

    /// Zero the counters of every service (gauges — open connections, requests in flight —
    /// keep their current values).
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
    let svc_state = state.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = svc_state.clone();
        async move { Ok::<_, Infallible>(handle(&state, req).await) }
    });
    if let Err(e) = state
        .http
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(service = %state.compiled.name, error = %e, "connection ended with an error");
    }
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_response(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": message }).to_string();
    json_response(status, body.into_bytes())
}

async fn handle(state: &ServiceState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    if let Some(admin) = path.strip_prefix(ADMIN_PREFIX) {
        return admin_request(state, &parts.method, admin);
    }
    let table = &state.compiled.table;
    let routes = &state.compiled.routes;
    let Ok(found) = table.router.at(path) else {
        return error_response(
            StatusCode::NOT_FOUND,
            &format!("no route for {} {path}", parts.method),
        );
    };
    let entry = *found.value;
    let Some(idx) = table.pick(entry, &parts.method, routes) else {
        let mut resp = error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {} not allowed for {path}", parts.method),
        );
        if let Ok(v) = HeaderValue::from_str(&table.allowed(entry, routes)) {
            resp.headers_mut().insert(ALLOW, v);
        }
        return resp;
    };
    let params: Vec<(&str, &str)> = found.params.iter().collect();
    let Some(route) = state.routes.get(idx) else {
        return error_response(StatusCode::INTERNAL_SERVER_ERROR, "route table mismatch");
    };

    let guard = route.counters.start();
    let behaviour = route.behaviour.load();

    let too_large = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES as u64);
    if too_large {
        guard.complete();
        return too_large_response();
    }
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            guard.complete();
            if e.is::<http_body_util::LengthLimitError>() {
                return too_large_response();
            }
            return error_response(
                StatusCode::BAD_REQUEST,
                &format!("cannot read request body: {e}"),
            );
        }
    };

    let delay = behaviour.latency.sample();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let resp = respond(&behaviour, &parts, path, &params, &bytes);
    guard.complete();
    resp
}

fn too_large_response() -> Response<Full<Bytes>> {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request body larger than {MAX_BODY_BYTES} bytes"),
    )
}

fn respond(
    b: &Behaviour,
    parts: &http::request::Parts,
    path: &str,
    params: &[(&str, &str)],
    body: &[u8],
) -> Response<Full<Bytes>> {
    let mut out = Vec::with_capacity(128);
    match &b.body {
        None if b.raw_body.is_some() => {}
        None => out.extend_from_slice(b"null"),
        Some(expr) => {
            let body_val = if body.is_empty() {
                Val::Null
            } else {
                fanout_expr::json::parse(body)
                    .unwrap_or_else(|_| fanout_expr::json::str_val(&String::from_utf8_lossy(body)))
            };
            let request = request_val(RequestParts {
                method: parts.method.as_str(),
                path,
                query: parts.uri.query(),
                params: params.iter().copied(),
                headers: parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_bytes())),
                body: body_val,
            });
            match expr.eval(&Val::Null, |_| request.clone()) {
                Ok(v) => fanout_expr::json::write(&v, &mut out),
                Err(e) => {
                    return error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("body expression failed: {e}"),
                    );
                }
            }
        }
    }
    let out = match &b.raw_body {
        Some(raw) => raw.clone(),
        None => Bytes::from(out),
    };
    let mut resp = Response::new(Full::new(out));
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

fn admin_request(state: &ServiceState, method: &Method, what: &str) -> Response<Full<Bytes>> {
    match (what, method) {
        ("stats", &Method::GET) => match serde_json::to_vec(&state.stats()) {
            Ok(body) => json_response(StatusCode::OK, body),
            Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        },
        ("reset", &Method::POST) => {
            state.reset();
            json_response(StatusCode::OK, br#"{"reset":true}"#.to_vec())
        }
        ("stats" | "reset", _) => {
            let allow = if what == "stats" { "GET" } else { "POST" };
            let mut resp = error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method {method} not allowed for {ADMIN_PREFIX}{what}"),
            );
            resp.headers_mut()
                .insert(ALLOW, HeaderValue::from_static(allow));
            resp
        }
        _ => error_response(
            StatusCode::NOT_FOUND,
            &format!(
                "no admin endpoint {ADMIN_PREFIX}{what}; use GET {ADMIN_PREFIX}stats or POST {ADMIN_PREFIX}reset"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..2000 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("timed out waiting for: {what}");
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
