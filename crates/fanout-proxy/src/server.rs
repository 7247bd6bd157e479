//! The inbound server: HTTP/1.1 and h2c on one port ([`serve`]), and the lifecycle of one request
//! ([`Gateway::handle`]): route, deadline, read body, admit, build `$request`, run, respond — one
//! short method per stage, called in that order by `Gateway::lifecycle` (docs/ARCHITECTURE.md,
//! "Request lifecycle"). What the client is answered (status, JSON error body) is in `answer.rs`.

use crate::admission::{Permit, Rejection};
use crate::answer::{ApiError, BodyRefusal, Refusal, outcome_response};
use crate::bodies::{Reservation, parsed_size_estimate, value_overhead};
use crate::coalesce::{self, Role, Waited};
use crate::conn::{Connections, TrackedBody, TrackedIo};
use crate::metrics::{RequestRecord, RouteTable};
use crate::telemetry::{Failure, RequestTelemetry};
use crate::{Gateway, Live};
use bytes::Bytes;
use fanout_expr::request::{
    ParamKey, RequestParts, RequestUse, decode_path_param, request_val_reading,
};
use fanout_expr::{Val, json};
use fanout_flow::memory::RequestMemory;
use fanout_flow::{ErrorKind, FlowError, Outcome, RoutePlan};
use fanout_protocol::headers::find_headers;
use futures_util::FutureExt;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// The gateway's error answers by code live with the other answers; named here for `Gateway`.
pub(crate) use crate::answer::ErrorCounts;

/// The gRPC deadline header (a name made once: looking a header up by `&str` parses the name
/// on every request).
static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// Response body type of the server.
pub use crate::body::Body;

impl Gateway {
    /// Handle one request (never fails: every error becomes a JSON response, and a panic while
    /// handling it becomes a 500 `internal_error` for this request only).
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let [client_rid] = find_headers(req.headers(), [&self.request_id_header]);
        let rid = self.request_ids.for_request(client_rid);
        // The config's live part for this request: a reload meanwhile does not change it.
        let live = self.live();
        let mut rec =
            RouteTable::request(live.route_metrics.as_ref(), Instant::now(), req.method());
        let mut resp = catch_panics(
            self.handle_unguarded(req, &rid, &live, &mut rec),
            &self.panics,
            &rid,
            self.limits.expose_error_details,
        )
        .await;
        let status = resp
            .extensions()
            .get::<crate::grpc::EffectiveStatus>()
            .map_or(resp.status(), |s| s.0);
        rec.finish(status);
        // Never indexed by HPACK (HTTP/2): every answer's id is new, and indexing each one
        // would only evict what is worth keeping from the connection's table and make every
        // encoder compare against a growing list of stale ids.
        let mut rid = rid;
        rid.set_sensitive(true);
        resp.headers_mut()
            .insert(self.request_id_header.clone(), rid);
        resp
    }

    /// [`Gateway::handle`] without the panic guard: the status endpoint (deprecated here: it is
    /// on the admin listener), or the lifecycle and its answer.
    async fn handle_unguarded<'a>(
        &'a self,
        req: Request<Incoming>,
        rid: &HeaderValue,
        live: &'a Live,
        rec: &mut RequestRecord<'a>,
    ) -> Response<Body> {
        if req.uri().path() == "/__fanout/status" {
            rec.ignore();
            let mut resp = Response::new(Body::full(Bytes::from(self.status_json().to_string())));
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return resp;
        }
        let grpc = req
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| fanout_grpc::looks_like_grpc(v.as_bytes()));
        let req = if grpc {
            match self.grpc_builtin(live, req).await {
                Ok(resp) => {
                    rec.ignore();
                    return resp;
                }
                Err(req) => req,
            }
        } else {
            req
        };
        let (parts, body) = req.into_parts();
        let mut tel = self.telemetry.request(&parts, rec.start());
        let result = if grpc {
            self.grpc_lifecycle(live, &parts, body, rid, rec, &mut tel)
                .await
        } else {
            self.lifecycle(live, &parts, body, rid, rec, &mut tel)
                .await
                .map(outcome_response)
        };
        match result {
            Ok(mut resp) => {
                tel.finish(&mut resp, rid, &parts, None);
                resp
            }
            Err(e) => {
                let (code, step) = (e.code.clone(), e.step.clone());
                let mut resp = if grpc {
                    self.grpc_error_response(e, rid, &parts)
                } else {
                    self.error_response(e, rid, &parts)
                };
                let failure = Failure {
                    code: &code,
                    step: step.as_deref(),
                };
                tel.finish(&mut resp, rid, &parts, Some(failure));
                resp
            }
        }
    }

    /// The request lifecycle after accept, one stage per line (docs/ARCHITECTURE.md); any stage
    /// may end it with the [`ApiError`] the client is answered. `rec` records the request's
    /// metrics and knows its arrival time; `tel` its trace, timeline and access log line.
    async fn lifecycle<'a, 'r: 'a>(
        &'a self,
        live: &'r Live,
        parts: &'a Parts,
        body: Incoming,
        rid: &'a HeaderValue,
        rec: &mut RequestRecord<'r>,
        tel: &mut RequestTelemetry<'a>,
    ) -> Result<Outcome, ApiError> {
        let start = rec.start();
        let (route, params) = route(live, parts)?;
        rec.routed(route);
        tel.routed(route);
        let params = path_params(&params)?;
        let deadline = self.deadline(&parts.headers, route, start)?;
        let (body_val, _memory) = self
            .read_body(&parts.headers, body, start, deadline, tel)
            .await?;
        let request = build_request(
            parts,
            params.iter().map(|(k, v)| (route.param_key(k), v.as_ref())),
            body_val,
            &route.request_use,
        )?;
        self.run_flow(live, route, deadline, request, rid, rec, tel)
            .await
    }

    /// Admit, run, observe, complete: the part of the lifecycle that HTTP and gRPC requests
    /// share once their request value is built. On a route that coalesces (`coalesce.rs`), a
    /// request whose `$request` equals that of a live run which ends within its deadline takes
    /// that run's answer instead; otherwise it runs the flow ([`Gateway::run_once`]) and hands
    /// its answer to the requests that joined it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run_flow<'a, 'r: 'a>(
        &'a self,
        live: &'r Live,
        route: &'a RoutePlan,
        deadline: Instant,
        request: Val,
        rid: &'a HeaderValue,
        rec: &mut RequestRecord<'r>,
        tel: &mut RequestTelemetry<'a>,
    ) -> Result<Outcome, ApiError> {
        let Some(runs) = live.coalesce.get(route.index).and_then(Option::as_ref) else {
            return self
                .run_once(live, route, deadline, request, rid, rec, tel, &mut false)
                .await;
        };
        let key = coalesce::key_of(&request);
        let mut again = false;
        loop {
            match runs.role(&key, deadline, again, || tel.span_context()) {
                Role::Lead(leader) => {
                    let mut refused = false;
                    let out = self
                        .run_once(live, route, deadline, request, rid, rec, tel, &mut refused)
                        .await;
                    leader.finish(&out, refused);
                    return out;
                }
                Role::Join(joined) => {
                    let span = joined.span.clone();
                    match joined.wait(deadline).await {
                        Waited::Answer(f) => {
                            let out = f.answer.clone();
                            runs.coalesced();
                            rec.coalesced();
                            rec.ran(&out);
                            tel.coalesced(span.as_ref());
                            tel.ran(&out);
                            return out;
                        }
                        // The leader's client went away, or its deadline cut the run short while
                        // this request has more time: run again (lead, or join the next run).
                        Waited::Again => again = true,
                        Waited::Deadline(waited) => {
                            return Err(ApiError::from(FlowError::new(
                                ErrorKind::DeadlineExceeded,
                                format!(
                                    "the request deadline passed after waiting {:.1} ms for the \
                                     run of an identical request that it shares",
                                    waited.as_secs_f64() * 1000.0
                                ),
                            )));
                        }
                    }
                }
            }
        }
    }

    /// Admit, run, observe, complete: one run of the flow for this request. The admission slot
    /// is held while the flow runs; the flow's latency is a sample for the adaptive limit.
    #[allow(clippy::too_many_arguments)]
    async fn run_once<'a, 'r: 'a>(
        &'a self,
        live: &'r Live,
        route: &'a RoutePlan,
        deadline: Instant,
        request: Val,
        rid: &'a HeaderValue,
        rec: &mut RequestRecord<'r>,
        tel: &mut RequestTelemetry<'a>,
        refused: &mut bool,
    ) -> Result<Outcome, ApiError> {
        let mut slot = self.admit(live, route, deadline).await.inspect_err(|_| {
            *refused = true;
        })?;
        // The backend answers parsed for this run are held in the memory budget until it ends.
        let memory = RequestMemory::new(&*self.bodies);
        let mut obs = tel.observer();
        obs.metrics = rec.route_metrics();
        obs.memory = Some(&memory);
        obs.degraded = Some(crate::observe::DegradedLog {
            request_id: rid,
            throttle: &self.error_log,
        });
        let out = route.run_observed(request, deadline, &obs).await;
        rec.ran(&out);
        tel.ran(&out);
        slot.completed();
        out.map_err(ApiError::from)
    }

    /// Deadline: the route's maximum, shortened by the client if it asks — in milliseconds in
    /// `server.deadline_header` (`x-request-timeout`), or in `grpc-timeout`; a bad value is
    /// refused (400). Fixed once, from the arrival time `start`.
    pub(crate) fn deadline<'a>(
        &'a self,
        headers: &HeaderMap,
        route: &RoutePlan,
        start: Instant,
    ) -> Result<Instant, Refusal<'a>> {
        let mut budget = route.deadline;
        let [asked, grpc_timeout] = find_headers(headers, [&self.deadline_header, &GRPC_TIMEOUT]);
        if let Some(v) = asked {
            let ms = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or(Refusal::BadDeadline {
                    header: &self.deadline_header,
                })?;
            budget = budget.min(Duration::from_millis(ms));
        }
        if let Some(v) = grpc_timeout {
            let d = v
                .to_str()
                .ok()
                .and_then(fanout_grpc::timeout::parse)
                .ok_or(Refusal::BadGrpcTimeout)?;
            budget = budget.min(d);
        }
        Ok(start + budget)
    }

    /// Read body: read completely *before* admission, so a body that trickles in holds a reader
    /// permit (bounded), never a flow slot; requests without a body skip all of it. Refused early
    /// by `Content-Length`, under the reader cap, the memory budget, the size limit while
    /// streaming and the read time ([`BodyRefusal`]; the refusals that may leave a client writing
    /// drain a bounded part of the rest first, with the permit and memory still held). Returns
    /// `$request.body` and the memory it holds, counted against the budget until the request ends.
    async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Incoming,
        start: Instant,
        deadline: Instant,
        tel: &mut RequestTelemetry<'_>,
    ) -> Result<(Val, Option<Reservation>), ApiError> {
        let limit = self.limits.max_body_bytes;
        let (bytes, memory) = self
            .read_bytes(headers, body, start, deadline, tel, limit)
            .await?;
        if memory.is_none() {
            return Ok((Val::Null, None));
        }
        Ok((self.parse_body(&bytes)?, memory))
    }

    /// [`Gateway::read_body`] without parsing: the body's bytes (at most `limit`) and the memory
    /// they hold (`None` for a request without a body).
    pub(crate) async fn read_bytes(
        &self,
        headers: &HeaderMap,
        mut body: Incoming,
        start: Instant,
        deadline: Instant,
        tel: &mut RequestTelemetry<'_>,
        limit: usize,
    ) -> Result<(Bytes, Option<Reservation>), ApiError> {
        if hyper::body::Body::is_end_stream(&body) {
            return Ok((Bytes::new(), None));
        }
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|len| len.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit as u64) {
            return Err(refuse(BodyRefusal::TooLarge { limit }, &mut body, deadline).await);
        }
        let Some(reader) = self.bodies.reader() else {
            let max_readers = self.bodies.max_readers();
            return Err(refuse(
                BodyRefusal::ReadersFull { max_readers },
                &mut body,
                deadline,
            )
            .await);
        };
        let mut memory = self.bodies.reservation();
        let declared = declared.map(|n| n as usize);
        let received = self
            .receive(&mut body, &mut memory, declared, start, deadline, limit)
            .await;
        let bytes = match received {
            Ok(bytes) => bytes,
            Err(refusal) => return Err(refuse(refusal, &mut body, deadline).await),
        };
        drop(reader);
        tel.bytes_in = bytes.len() as u64;
        Ok((bytes, Some(memory)))
    }

    /// The body's bytes, all of them, within the time allowance ([`Gateway::read_allowance`]),
    /// the size limit (`server.max_body_bytes`) and the memory budget (`memory`).
    async fn receive(
        &self,
        body: &mut Incoming,
        memory: &mut Reservation,
        declared: Option<usize>,
        start: Instant,
        deadline: Instant,
        limit: usize,
    ) -> Result<Bytes, BodyRefusal> {
        let budget_exhausted = || BodyRefusal::MemoryBudget {
            budget: self.bodies.budget(),
        };
        // A declared length takes its bytes (the part of the estimate known before reading)
        // at once: under contention requests are refused whole, instead of all of them taking
        // part of the budget and none completing. The per-value part is added as data arrives.
        if let Some(n) = declared
            && memory.grow(n.saturating_mul(2)).is_err()
        {
            return Err(budget_exhausted());
        }
        let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0));
        loop {
            let until = self.read_allowance(buf.len(), start, deadline);
            let frame = match tokio::time::timeout_at(until, body.frame()).await {
                Err(_) => {
                    self.bodies.timed_out();
                    return Err(self.too_slow(buf.len(), until, start, deadline));
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(BodyRefusal::Broken(e)),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if buf.len() + data.len() > limit {
                return Err(BodyRefusal::TooLarge { limit });
            }
            let cost = if declared.is_some() {
                value_overhead(&data)
            } else {
                parsed_size_estimate(&data)
            };
            if memory.grow(cost).is_err() {
                return Err(budget_exhausted());
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf.freeze())
    }

    /// Time allowed for the first `received` bytes: `server.bodies.read_timeout`, one more
    /// second per `min_bytes_per_sec` bytes, never past the deadline.
    fn read_allowance(&self, received: usize, start: Instant, deadline: Instant) -> Instant {
        let cfg = &self.limits.bodies;
        let min_rate = cfg.min_bytes_per_sec;
        let extra = if min_rate == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(received as f64 / min_rate as f64)
        };
        (start + cfg.read_timeout.0 + extra).min(deadline)
    }

    /// The refusal of a body that had `received` bytes when its allowance `until` was up.
    fn too_slow(
        &self,
        received: usize,
        until: Instant,
        start: Instant,
        deadline: Instant,
    ) -> BodyRefusal {
        if until >= deadline {
            return BodyRefusal::PastDeadline;
        }
        let cfg = &self.limits.bodies;
        BodyRefusal::TooSlow {
            received,
            allowed: until.saturating_duration_since(start),
            read_timeout: cfg.read_timeout,
            min_bytes_per_sec: cfg.min_bytes_per_sec,
        }
    }

    /// The complete body parsed once, with the depth limit (`server.expressions.max_depth`);
    /// whitespace only is `null`.
    fn parse_body(&self, bytes: &[u8]) -> Result<Val, BodyRefusal> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Val::Null);
        }
        json::parse_limited(bytes, self.limits.expressions.max_depth)
            .map_err(BodyRefusal::InvalidJson)
    }

    /// Admit: a slot under the concurrency limit of the route's priority class now, after a
    /// short bounded wait, or an immediate 503 `overloaded` — before any flow work.
    pub(crate) async fn admit(
        &self,
        live: &Live,
        route: &RoutePlan,
        deadline: Instant,
    ) -> Result<Permit, Rejection> {
        let class = live.route_admission.get(&route.method, &route.path);
        self.admission.admit(class, deadline).await
    }

    /// Respond with a refusal or failure: counted by code, logged when it says so, rendered as
    /// the JSON error body.
    fn error_response(&self, e: ApiError, rid: &HeaderValue, parts: &Parts) -> Response<Body> {
        self.errors.count(&e.code);
        if e.log {
            self.log_failure(&e, rid, &parts.method, parts.uri.path());
        }
        e.into_response(rid, self.limits.expose_error_details)
    }

    /// The log line of a failed request, with the detail the client does not see.
    pub(crate) fn log_failure(
        &self,
        e: &ApiError,
        rid: &HeaderValue,
        method: &http::Method,
        path: &str,
    ) {
        let (write, suppressed) = self.error_log.admit(std::time::Instant::now());
        if suppressed > 0 {
            tracing::warn!(
                suppressed,
                "{suppressed} failed-request log lines were not written (server.error_log_per_second)"
            );
        }
        if !write {
            return;
        }
        let request_id = String::from_utf8_lossy(rid.as_bytes());
        let step = e.step.as_deref().unwrap_or("");
        let backend = e.backend.as_deref().unwrap_or("");
        let detail = e.detail.as_deref().unwrap_or("");
        if e.status.is_server_error() {
            tracing::warn!(%request_id, %method, path, status = e.status.as_u16(), code = %e.code, step = %step, backend = %backend, detail = %detail, "request failed: {}", e.message);
        } else {
            tracing::info!(%request_id, %method, path, status = e.status.as_u16(), code = %e.code, step = %step, backend = %backend, detail = %detail, "request refused: {}", e.message);
        }
    }
}

/// Route: the path (404), then the method (405 with `Allow`). Returns the route's plan and the
/// path parameters it captured.
pub(crate) fn route<'a>(
    live: &'a Live,
    parts: &'a Parts,
) -> Result<(&'a RoutePlan, matchit::Params<'a, 'a>), Refusal<'a>> {
    let path = parts.uri.path();
    let matched = live
        .router
        .at(path)
        .map_err(|_| Refusal::NoRoute { path })?;
    let entry = matched.value;
    match entry.iter().find(|r| r.method == parts.method) {
        Some(route) => Ok((route, matched.params)),
        None => Err(Refusal::MethodNotAllowed {
            method: &parts.method,
            path,
            allow: entry.iter().map(|r| r.method.as_str()).collect(),
        }),
    }
}

/// The path parameters a route captured, percent-decoded ([`decode_path_param`]): `%20` is a
/// space and `%2F` a `/` (routing matched the raw path, so a decoded `/` never changes the
/// route). A parameter that does not decode is refused (400 `bad_path`, naming it). Inline up
/// to four: no allocation per request on most routes.
pub(crate) fn path_params<'a>(
    params: &matchit::Params<'a, 'a>,
) -> Result<PathParams<'a>, Refusal<'a>> {
    params
        .iter()
        .map(|(param, raw)| match decode_path_param(raw) {
            Ok(v) => Ok((param, v)),
            Err(why) => Err(Refusal::BadPath { param, why }),
        })
        .collect()
}

/// A route's path parameters, decoded: (name, value).
pub(crate) type PathParams<'a> = smallvec::SmallVec<[(&'a str, Cow<'a, str>); 4]>;

/// Build `$request`: `{method, path, params, query, headers, body}`; `params` as the route
/// captured them (decoded for HTTP routes by [`path_params`]), `path` as sent. A query or header
/// the flow reads that is not UTF-8 is refused (400 `bad_query` / `bad_header`), never replaced.
pub(crate) fn build_request<'a, K: ParamKey>(
    parts: &'a Parts,
    params: impl IntoIterator<Item = (K, &'a str)>,
    body: Val,
    reads: &RequestUse,
) -> Result<Val, Refusal<'a>> {
    fanout_expr::request::check_text(
        parts.uri.query(),
        parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes())),
        reads,
    )
    .map_err(Refusal::NotText)?;
    Ok(request_val_reading(
        RequestParts {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query(),
            params,
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_bytes())),
            body,
        },
        reads,
    ))
}

/// Refuse a body: drain a bounded part of the rest first when the refusal says so
/// ([`BodyRefusal::drains`]), then answer.
async fn refuse(refusal: BodyRefusal, body: &mut Incoming, deadline: Instant) -> ApiError {
    if refusal.drains() {
        drain_rejected_body(body, deadline).await;
    }
    refusal.into()
}

/// Run a request handler; a panic inside it becomes a 500 `internal_error` for this request
/// only (logged with its message, counted in `panics`). Whatever the handler held (admission
/// slot, body permits, memory) is released when its future is dropped.
pub(crate) fn catch_panics<'a, F>(
    fut: F,
    panics: &'a AtomicU64,
    rid: &'a HeaderValue,
    expose: bool,
) -> impl Future<Output = Response<Body>> + 'a
where
    F: Future<Output = Response<Body>> + 'a,
{
    // A combinator, not an `async fn`: an `async fn` would keep `fut` as its argument and again
    // as the future it awaits, doubling the request's future (3 KB more, copied per request).
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .map(move |result| match result {
            Ok(resp) => resp,
            Err(payload) => {
                panics.fetch_add(1, Ordering::Relaxed);
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".to_string());
                let request_id = String::from_utf8_lossy(rid.as_bytes());
                tracing::error!(%request_id, panic = %msg, "a request handler panicked; answered 500");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "the gateway failed while handling this request",
                )
                .into_response(rid, expose)
            }
        })
}

/// How much of an oversized body is read and discarded before the 413 is sent, and for how long.
/// A client that is still writing its body when the server answers and closes would otherwise get
/// a broken pipe instead of the 413 (the "lingering close" of nginx and Envoy); past these bounds
/// the connection is closed anyway, so a huge upload costs at most this much.
const DRAIN_BYTES: usize = 1 << 20;
const DRAIN_TIME: Duration = Duration::from_millis(250);

async fn drain_rejected_body(body: &mut Incoming, deadline: Instant) {
    let until = deadline.min(Instant::now() + DRAIN_TIME);
    let mut seen = 0usize;
    let _ = tokio::time::timeout_at(until, async {
        while seen <= DRAIN_BYTES {
            match body.frame().await {
                Some(Ok(f)) => seen += f.data_ref().map_or(0, |d| d.len()),
                _ => break,
            }
        }
    })
    .await;
}

/// Serve `gateway` on `listener` until `shutdown` resolves, then stop accepting, close idle
/// connections and give in-flight requests `grace` to finish.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(gateway.limits.max_header_bytes.max(8192))
        // The header read timeout is enforced per connection (`conn::drive`): hyper's timer
        // also runs while a keep-alive connection waits for its next request, which would cap
        // the idle time at the header timeout.
        .header_read_timeout(None)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(gateway.limits.max_concurrent_streams)
        .max_header_list_size(gateway.limits.max_header_bytes as u32);
    let builder = Arc::new(builder);
    let conns: Arc<Connections> = gateway.conns.clone();
    let grace = gateway.limits.shutdown_grace.0;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors: idle connections are closed, or accepting
                    // pauses briefly; logged at most once a second.
                    tokio::select! {
                        _ = conns.accept_failed(&e) => {}
                        _ = &mut shutdown => break,
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // At the connection cap the oldest idle connections make room; with none idle the new
        // connection is closed at once.
        if !conns.admit() {
            conns.refuse(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let sh = conns.register();
        let gw = gateway.clone();
        let on_conn = sh.clone();
        let svc = hyper::service::service_fn(move |req| {
            let gw = gw.clone();
            let sh = on_conn.clone();
            async move {
                let active = sh.request();
                // Boxed: the request's whole future (flow, calls, respond) is made once on the
                // heap — in place, not built on the stack and copied (`pinned`) — and the
                // per-stream future HTTP/2 spawns (and moves) stays small.
                let resp = fanout_flow::boxed::pinned(|| gw.handle(req))
                    .await
                    .map(|b| TrackedBody::new(b, sh.clone()));
                drop(active);
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(TrackedIo::new(stream, sh.clone())), svc)
            .into_owned();
        tokio::spawn(crate::conn::drive(conn, sh, conns.clone()));
    }
    drop(listener);
    conns.shutdown(grace).await;
    // The spans of the last requests.
    gateway.telemetry.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_becomes_a_500_for_that_request_only() {
        let panics = AtomicU64::new(0);
        let resp = catch_panics(
            async {
                if panics.load(Ordering::Relaxed) == 0 {
                    panic!("secret internal detail");
                }
                Response::new(Body::full(Bytes::new()))
            },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "internal_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(!msg.contains("secret"), "no internals in the answer: {msg}");
        assert_eq!(v["error"]["request_id"], "rid-1");
        assert_eq!(panics.load(Ordering::Relaxed), 1);

        // The next request is served normally.
        let ok = catch_panics(
            async { Response::new(Body::full(Bytes::from_static(b"{}"))) },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(panics.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn what_the_panicking_handler_held_is_released() {
        struct Held<'a>(&'a AtomicU64);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let released = AtomicU64::new(0);
        let panics = AtomicU64::new(0);
        let resp = catch_panics(
            async {
                let _slot = Held(&released);
                tokio::task::yield_now().await;
                let v: Vec<u8> = Vec::new();
                #[allow(clippy::indexing_slicing)]
                let _ = v[1];
                Response::new(Body::full(Bytes::new()))
            },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(released.load(Ordering::Relaxed), 1);
        assert_eq!(panics.load(Ordering::Relaxed), 1);
    }
}
