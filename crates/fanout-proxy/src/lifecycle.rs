//! The lifecycle of one request once it is off the connection (docs/ARCHITECTURE.md, "Request
//! lifecycle"): route, deadline, read body, build `$request`, admit, run, observe — one short
//! method per stage, called in that order by [`Gateway::lifecycle`] (HTTP) and
//! `Gateway::grpc_lifecycle` (`grpc.rs`), which share [`Gateway::run_flow`]. Every stage gets
//! the request's context ([`Req`]); a stage that refuses returns the [`ApiError`] the client is
//! answered (`answer.rs`). A new edge stage (authentication, rate limits) is one method here
//! and one line in each lifecycle.

use crate::answer::{ApiError, Refusal};
use crate::coalesce::{self, Role, Waited};
use crate::telemetry::RequestTelemetry;
use crate::{Gateway, Live};
use fanout_expr::Val;
use fanout_expr::request::{
    ParamKey, RequestParts, RequestUse, decode_path_param, request_val_reading,
};
use fanout_flow::memory::RequestMemory;
use fanout_flow::{ErrorKind, FlowError, Outcome, RoutePlan};
use fanout_ops::metrics::RequestRecord;
use fanout_protocol::headers::find_headers;
use fanout_transport::admission::{Permit, Rejection};
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use hyper::body::Incoming;
use std::borrow::Cow;
use std::time::Duration;
use tokio::time::Instant;

/// The gRPC deadline header (a name made once: looking a header up by `&str` parses the name
/// on every request).
static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// One request as it goes through the stages: what every stage reads or records. `'r` is the
/// live config the request runs on (a reload meanwhile does not change it), the other lifetime
/// the request's own parts.
pub(crate) struct Req<'a, 'r> {
    /// The config's live part for this request.
    pub(crate) live: &'r Live,
    /// Method, URI, headers.
    pub(crate) parts: &'a Parts,
    /// The request id (the client's, or one made for it).
    pub(crate) rid: &'a HeaderValue,
    /// The request's metrics; knows its arrival time.
    pub(crate) rec: &'a mut RequestRecord<'r>,
    /// Its trace, timeline and access log line.
    pub(crate) tel: RequestTelemetry<'r>,
    /// The socket address of the connection it came on (kept here rather than as a request
    /// extension: `http::Extensions` allocates a map and a box for it on every request).
    pub(crate) peer: Option<std::net::SocketAddr>,
}

impl Gateway {
    /// The request lifecycle after accept, one stage per line (docs/ARCHITECTURE.md); any stage
    /// may end it with the [`ApiError`] the client is answered.
    pub(crate) async fn lifecycle(
        &self,
        cx: &mut Req<'_, '_>,
        body: Incoming,
    ) -> Result<http::Response<fanout_transport::body::Body>, ApiError> {
        let start = cx.rec.start();
        let (route, params) = route(cx.live, cx.parts)?;
        cx.rec.routed(route);
        cx.tel.routed(route);
        // A pass-through route (`pass.rs`): its own future, boxed, so a flow's request future
        // is not made larger by it.
        let live = cx.live;
        if let Some(plan) = live.pass.get(route.index) {
            return fanout_layers::boxed::pinned(|| {
                self.pass_lifecycle(cx, route, params, plan, body, fanout_edge::RouteKind::Http)
            })
            .await;
        }
        // A WebSocket route (`websocket.rs`), boxed apart the same way.
        if let Some(plan) = live.websockets.get(route.index) {
            return fanout_layers::boxed::pinned(|| {
                self.websocket_lifecycle(cx, route, params, plan, body)
            })
            .await;
        }
        // A streamed flow route (`streamed.rs`), boxed apart the same way.
        if route.stream.is_some() {
            return fanout_layers::boxed::pinned(|| self.stream_lifecycle(cx, route, params, body))
                .await;
        }
        // The edge stages: a refusal here is listed on the live page (the route is known).
        let (deadline, request, _memory) = match async {
            once_only(&cx.parts.headers)?;
            let params = path_params(&params)?;
            let (auth, client) =
                edge_stages(cx, route, fanout_edge::RouteKind::Http, &params).await?;
            let deadline = self.deadline(&cx.parts.headers, route, start)?;
            // The route's declared parameters and body schema (`fanout-openapi`), before
            // admission: a vector lookup for a route without one.
            let check = cx.live.contract.route(route.index);
            if let Some(c) = check {
                c.params(
                    params.iter().map(|(k, v)| (*k, v.as_ref())),
                    cx.parts.uri.query(),
                )?;
            }
            let (body_val, memory) = self
                .read_body(
                    cx.live,
                    &cx.parts.headers,
                    body,
                    start,
                    deadline,
                    &mut cx.tel,
                )
                .await?;
            if let Some(c) = check {
                c.body(&body_val)?;
            }
            let request = build_request(
                cx.parts,
                param_vals(route, &params),
                body_val,
                auth,
                &route.request_use,
                client.as_deref(),
            )?;
            Ok::<_, ApiError>((deadline, request, memory))
        }
        .await
        {
            Ok(r) => r,
            Err(e) => {
                self.record_refusal(cx, route, &e);
                return Err(e);
            }
        };
        self.run_flow(cx, route, deadline, request)
            .await
            .map(crate::answer::outcome_response)
    }

    /// The live page's list of failed requests (`admin.ui`) takes a request of `route` refused
    /// before its flow ran (`e`): its status, code and message, no steps.
    pub(crate) fn record_refusal(&self, cx: &Req<'_, '_>, route: &RoutePlan, e: &ApiError) {
        let Some(recent) = &self.recent else {
            return;
        };
        recent.refused(fanout_ops::record::Refused {
            start: cx.rec.start(),
            route_name: cx.live.route_name(route.index),
            path: cx.parts.uri.path(),
            request_id: cx.rid,
            status: e.status.as_u16(),
            code: &e.code,
            message: &e.message,
            detail: e.detail.as_deref(),
        });
    }

    /// Admit, run, observe, complete: the part of the lifecycle that HTTP and gRPC requests
    /// share once their request value is built. On a route that coalesces (`coalesce.rs`), a
    /// request whose `$request` equals that of a live run which ends within its deadline takes
    /// that run's answer instead; otherwise it runs the flow ([`Gateway::run_once`]) and hands
    /// its answer to the requests that joined it.
    pub(crate) async fn run_flow<'r>(
        &self,
        cx: &mut Req<'_, 'r>,
        route: &'r RoutePlan,
        deadline: Instant,
        request: Val,
    ) -> Result<Outcome, ApiError> {
        let Some(runs) = cx.live.coalesce.get(route.index).and_then(Option::as_ref) else {
            return self
                .run_once(cx, route, deadline, request, &mut false)
                .await;
        };
        let key = coalesce::key_of(&request);
        let mut again = false;
        loop {
            match runs.role(&key, deadline, again, || cx.tel.span_context()) {
                Role::Lead(leader) => {
                    let mut refused = false;
                    let out = self
                        .run_once(cx, route, deadline, request, &mut refused)
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
                            cx.rec.coalesced();
                            cx.rec.ran(&out);
                            cx.tel.coalesced(span.as_ref());
                            cx.tel.ran(&out);
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
    async fn run_once<'r>(
        &self,
        cx: &mut Req<'_, 'r>,
        route: &'r RoutePlan,
        deadline: Instant,
        request: Val,
        refused: &mut bool,
    ) -> Result<Outcome, ApiError> {
        let mut slot = match self.admit(cx.live, route, deadline).await {
            Ok(slot) => slot,
            Err(r) => {
                *refused = true;
                let e = ApiError::from(r);
                self.record_refusal(cx, route, &e);
                return Err(e);
            }
        };
        // The backend answers parsed for this run are held in the memory budget until it ends.
        let memory = RequestMemory::new(&*self.bodies);
        let mut obs = cx.tel.observer();
        obs.metrics = cx.rec.route_metrics();
        obs.memory = Some(&memory);
        obs.degraded = Some(crate::observe::DegradedLog {
            request_id: cx.rid,
            throttle: &self.error_log,
        });
        if let Some(c) = &self.coverage {
            let c = c.route(route);
            c.ran();
            obs.coverage = Some(c);
        }
        // The live page's record of the steps (`admin.ui`): kept only if the run is slow or
        // fails.
        let ui_steps = self
            .recent
            .as_ref()
            .map(|_| fanout_ops::record::RequestSteps::new(cx.rec.start()));
        let ui_stats = cx.live.ui_stats.as_ref().and_then(|s| s.route(route.index));
        obs.ui = ui_steps.as_ref().map(|s| (s, ui_stats));
        let out = route.run_observed(request, deadline, &obs).await;
        if let (Some(recent), Some(steps)) = (&self.recent, ui_steps) {
            recent.finish(
                fanout_ops::record::Finished {
                    steps,
                    route,
                    route_name: cx.live.route_name(route.index),
                    path: cx.parts.uri.path(),
                    request_id: cx.rid,
                    result: out.as_ref().map(|o| o.status),
                },
                ui_stats,
            );
        }
        cx.rec.ran(&out);
        cx.tel.ran(&out);
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
}

/// Route: the path (404), then the method (405 with `Allow`). Returns the route's plan and the
/// path parameters it captured.
/// The headers a request may send once (RFC 9110 §5.3: only list-valued fields may repeat;
/// RFC 9112 §3.2: a request with two `Host` lines is a 400).
static ONCE_ONLY: [http::HeaderName; 2] = [http::header::HOST, http::header::AUTHORIZATION];

/// Refuse a request that repeats a header of [`ONCE_ONLY`]: 400 `bad_header`.
pub(crate) fn once_only(headers: &http::HeaderMap) -> Result<(), Refusal<'static>> {
    for header in &ONCE_ONLY {
        if headers.get_all(header).iter().nth(1).is_some() {
            return Err(Refusal::RepeatedHeader { header });
        }
    }
    Ok(())
}

pub(crate) fn route<'a, 'r: 'a>(
    live: &'r Live,
    parts: &'a Parts,
) -> Result<(&'r RoutePlan, matchit::Params<'r, 'a>), Refusal<'a>> {
    let path = parts.uri.path();
    let matched = live
        .router
        .at(path)
        .map_err(|_| Refusal::NoRoute { path })?;
    let entry = matched.value;
    match entry.iter().find(|r| r.method == parts.method) {
        Some(route) => Ok((route, matched.params)),
        // An HTTP/2 WebSocket (RFC 8441's extended CONNECT) opens a route's GET.
        None if fanout_ws::handshake::extended_connect(parts) => {
            match entry.iter().find(|r| r.method == http::Method::GET) {
                Some(route) => Ok((route, matched.params)),
                None => Err(Refusal::MethodNotAllowed {
                    method: &parts.method,
                    path,
                    allow: entry.iter().map(|r| r.method.as_str()).collect(),
                }),
            }
        }
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

/// The edge stages of `route` (`fanout-edge`, in the registry's order) on the request head: the
/// first refusal ends the request. Returns `$request.auth` (as the stages leave it) and
/// `$request.client.address` when the flow reads it.
pub(crate) async fn edge_stages(
    cx: &Req<'_, '_>,
    route: &RoutePlan,
    kind: fanout_edge::RouteKind,
    params: &PathParams<'_>,
) -> Result<(Val, Option<String>), ApiError> {
    let stages = &cx.live.stages;
    let mut head = fanout_edge::RequestHead::new(stages, cx.parts, route, kind, params, cx.peer);
    stages.on_request(&mut head).await.map_err(ApiError::from)?;
    let client = head.client_text(&route.request_use);
    Ok((head.auth, client))
}

/// The path parameters as `$request.params` keys them.
fn param_vals<'p>(
    route: &RoutePlan,
    params: &'p PathParams<'_>,
) -> impl Iterator<Item = (Val, &'p str)> {
    params.iter().map(|(k, v)| (route.param_key(k), v.as_ref()))
}

/// A route's path parameters, decoded: (name, value).
pub(crate) type PathParams<'a> = smallvec::SmallVec<[(&'a str, Cow<'a, str>); 4]>;

/// Build `$request`: `{method, path, params, query, headers, body, auth}`; `params` as the route
/// captured them (decoded for HTTP routes by [`path_params`]), `path` as sent. A query or header
/// the flow reads that is not UTF-8 is refused (400 `bad_query` / `bad_header`), never replaced.
pub(crate) fn build_request<'a, K: ParamKey>(
    parts: &'a Parts,
    params: impl IntoIterator<Item = (K, &'a str)>,
    body: Val,
    auth: Val,
    reads: &RequestUse,
    client: Option<&'a str>,
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
    let headers = parts
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()));
    // The connection's, made once per connection (`tls.rs`); `null` on plain ones.
    let tls = match reads.tls {
        true => parts
            .extensions
            .get::<std::sync::Arc<fanout_transport::tls::TlsInfo>>()
            .map_or(Val::Null, |t| t.val()),
        false => Val::Null,
    };
    let request = RequestParts::new(
        parts.method.as_str(),
        parts.uri.path(),
        parts.uri.query(),
        headers,
    )
    .with_params(params)
    .with_body(body)
    .with_client(client)
    .with_auth(auth)
    .with_tls(tls);
    Ok(request_val_reading(request, reads))
}
