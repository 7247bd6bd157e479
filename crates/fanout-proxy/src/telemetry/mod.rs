//! What the gateway tells operators about each request: OpenTelemetry traces ([`trace`],
//! exported by [`fanout_ops::telemetry::export`]) and `Server-Timing` ([`server_timing`]), both
//! in [`fanout_ops::telemetry`], and what the logging phase of the edge stages is told of a
//! request ([`Facts`]; the access log is the `access_log` stage, `fanout_edge::access_log`).
//! All are off by default, and off they cost a few branches per request: no span, no
//! timeline, no line is built.
//!
//! [`Telemetry`] is built with the gateway and started inside the runtime; each request gets a
//! [`RequestTelemetry`] (what is on for it), whose parts the executor feeds through
//! [`crate::observe::RequestObserver`], and which finishes the answer (header, span, the facts
//! of the log line).

use fanout_config::{Config, ConfigError, ConfigErrors};
use fanout_edge::{Degraded, Done, LogWants, StageSet};
use fanout_flow::{Outcome, RoutePlan};
use fanout_ops::telemetry::{server_timing, trace};
use fanout_transport::body::{Body, BoxError};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use server_timing::{StepTiming, Timeline, TimingGate};
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;
use tokio::time::Instant;
use trace::{RequestTrace, Tracing};

/// The gateway's telemetry: config, and once started the tracer.
pub struct Telemetry {
    cfg: fanout_config::Telemetry,
    tracing: OnceLock<Tracing>,
    gate: Option<TimingGate>,
}

impl Telemetry {
    /// Check the config (endpoint, ratios, the trusted header); starts nothing.
    pub fn new(cfg: &Config) -> Result<Telemetry, ConfigErrors> {
        let mut errs = Vec::new();
        let t = &cfg.telemetry;
        if let Some(tr) = &t.tracing {
            let url = &tr.otlp_endpoint.value;
            let ok_scheme = url.starts_with("http://") || url.starts_with("https://");
            if !ok_scheme || url.parse::<http::Uri>().is_err() {
                errs.push(
                    ConfigError::at(
                        tr.otlp_endpoint.pos,
                        format!("telemetry.tracing.otlp_endpoint `{url}` is not an http(s) URL"),
                    )
                    .hint("the full OTLP/HTTP traces URL, e.g. `http://127.0.0.1:4318/v1/traces`"),
                );
            }
            if !(0.0..=1.0).contains(&tr.sampling_ratio) {
                errs.push(ratio_error("telemetry.tracing.sampling_ratio"));
            }
        }
        let gate = match TimingGate::new(cfg.server.server_timing.as_ref()) {
            Ok(g) => g,
            Err(e) => {
                errs.push(ConfigError::at(Default::default(), e));
                None
            }
        };
        if !errs.is_empty() {
            return Err(ConfigErrors(
                errs.into_iter().map(|e| e.in_file(&cfg.file)).collect(),
            ));
        }
        Ok(Telemetry {
            cfg: t.clone(),
            tracing: OnceLock::new(),
            gate,
        })
    }

    /// Start the exporter (inside the runtime; once).
    pub fn start(&self) -> Result<(), String> {
        if let Some(cfg) = &self.cfg.tracing
            && self.tracing.get().is_none()
        {
            let _ = self.tracing.set(Tracing::start(cfg)?);
        }
        Ok(())
    }

    /// Send the spans still queued (bounded by the export timeout).
    pub async fn shutdown(&self) {
        if let Some(t) = self.tracing.get() {
            t.shutdown().await;
        }
    }

    /// `{tracing}` counters for the status endpoint (`null` when off; the access log's are
    /// its stage's section, `access_log`).
    pub fn status_json(&self) -> serde_json::Value {
        serde_json::json!({
            "tracing": self.tracing.get().map(Tracing::status_json),
        })
    }

    /// What is on for a request that arrived at `start`; `logged`: a logging stage wants it
    /// (its facts are gathered for [`Facts`]).
    pub fn request(&self, parts: &Parts, start: Instant, logged: bool) -> RequestTelemetry<'_> {
        let trace = self
            .tracing
            .get()
            .map(|t| t.request(&parts.method, &parts.headers, SystemTime::now()));
        let timing = self.gate.as_ref().is_some_and(|g| g.allows(&parts.headers));
        RequestTelemetry {
            start,
            trace,
            logged,
            timing,
            timeline: None,
            route: None,
            bytes_in: 0,
            partial: Vec::new(),
        }
    }
}

fn ratio_error(field: &str) -> ConfigError {
    ConfigError::at_path(field, format!("{field} must be between 0.0 and 1.0"))
        .hint("1.0 keeps everything, 0.1 one in ten, 0.0 nothing")
}

/// What is on for one request, and what it gathered.
pub struct RequestTelemetry<'a> {
    start: Instant,
    trace: Option<RequestTrace>,
    /// A logging stage wants the request ([`Facts`] are gathered).
    logged: bool,
    /// `Server-Timing` is sent (the route or the trusted header asks for it).
    timing: bool,
    timeline: Option<Timeline>,
    route: Option<&'a str>,
    /// Request body bytes read.
    pub bytes_in: u64,
    partial: Vec<Arc<str>>,
}

/// How an error answer ended a request, for its span and log line.
pub struct Failure<'e> {
    /// `error.code`.
    pub code: &'e Cow<'static, str>,
    /// The step it names.
    pub step: Option<&'e Arc<str>>,
}

impl<'a> RequestTelemetry<'a> {
    /// The request matched `route`.
    pub fn routed(&mut self, route: &'a RoutePlan) {
        self.route = Some(&route.path);
        if route.server_timing {
            self.timing = true;
        }
        if let Some(t) = &self.trace {
            t.routed(&route.method, &route.path);
        }
        if self.timing || self.logged {
            self.timeline = Some(Timeline::default());
        }
    }

    /// The observer of the flow's run.
    pub fn observer(&self) -> crate::observe::RequestObserver<'_> {
        crate::observe::RequestObserver {
            metrics: None,
            trace: self.trace.as_ref(),
            timing: self.timeline.as_ref(),
            degraded: None,
            memory: None,
            coverage: None,
            ui: None,
        }
    }

    /// The request takes the answer of another request's run of the flow (coalesced, `leader`
    /// the span of the request that ran it): its span says so and links to it.
    pub fn coalesced(&mut self, leader: Option<&opentelemetry::trace::SpanContext>) {
        if let Some(t) = &self.trace {
            t.coalesced(leader);
        }
    }

    /// The request's span, when tracing is on (the requests that join its run link to it).
    pub fn span_context(&self) -> Option<opentelemetry::trace::SpanContext> {
        self.trace.as_ref().map(RequestTrace::span_context)
    }

    /// The flow answered: keep its degraded steps.
    pub fn ran<E>(&mut self, out: &Result<Outcome, E>) {
        if let Ok(o) = out
            && !o.partial.is_empty()
            && (self.trace.is_some() || self.logged)
        {
            self.partial = o.partial.clone();
        }
    }

    /// The answer is ready: add `Server-Timing`, end the request span, and put what the log
    /// line needs in `facts` (when a logging stage wants the request).
    pub fn finish<B>(
        self,
        resp: &mut Response<B>,
        request_id: &HeaderValue,
        failure: Option<Failure<'_>>,
        facts: Option<&mut Facts<'a>>,
    ) {
        if self.trace.is_none() && !self.logged && !self.timing {
            return;
        }
        let total = self.start.elapsed();
        let steps = self
            .timeline
            .as_ref()
            .map(Timeline::take)
            .unwrap_or_default();
        if self.timing
            && let Some(v) = server_timing::header_value(&steps, total)
        {
            resp.headers_mut().insert("server-timing", v);
        }
        if let Some(t) = &self.trace {
            let rid = String::from_utf8_lossy(request_id.as_bytes());
            t.end(
                resp.status(),
                &rid,
                failure.as_ref().map(|f| f.code.as_ref()),
                !self.partial.is_empty(),
            );
        }
        if let Some(f) = facts {
            f.route = self.route.map(Cow::Borrowed);
            f.bytes_in = self.bytes_in;
            f.error = failure.map(|e| (e.code.clone(), e.step.cloned()));
            f.partial = self.partial;
            f.steps = steps;
        }
    }
}

/// What the logging phase of the edge stages is told of a request ([`fanout_edge::Done`]),
/// gathered only when a logging stage wants it: its head on arrival, what the lifecycle learnt
/// (route, body size, error, degraded steps), the answer after the answer phase.
pub struct Facts<'a> {
    method: Method,
    uri: Uri,
    client: Option<std::net::IpAddr>,
    tls_client: Option<String>,
    route: Option<Cow<'a, str>>,
    bytes_in: u64,
    error: Option<(Cow<'static, str>, Option<Arc<str>>)>,
    partial: Vec<Arc<str>>,
    steps: Vec<StepTiming>,
}

impl<'a> Facts<'a> {
    /// A request on arrival: its head, its client (as trusted proxies resolve it) and the
    /// subject of its client certificate.
    pub fn arrived(
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        extensions: &http::Extensions,
        peer: Option<std::net::SocketAddr>,
        stages: &StageSet,
    ) -> Self {
        let _ = headers;
        Facts {
            method: method.clone(),
            uri: uri.clone(),
            client: stages.clients().resolve_headers(headers, peer),
            tls_client: extensions
                .get::<Arc<fanout_transport::tls::TlsInfo>>()
                .and_then(|t| t.client_subject())
                .map(str::to_string),
            route: None,
            bytes_in: 0,
            error: None,
            partial: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// The answer is the error `code` (made without the lifecycle: a refusal on arrival, a
    /// panic).
    pub fn refused(&mut self, code: Cow<'static, str>) {
        self.error = Some((code, None));
    }

    /// The request is done: the answer is `resp` (its `status` as the client reads it), made
    /// `since` its arrival; every stage that wanted it sees it.
    pub fn log<B: hyper::body::Body>(
        self,
        stages: &StageSet,
        wants: &LogWants,
        request_id: &HeaderValue,
        status: StatusCode,
        resp: &Response<B>,
        since: Instant,
    ) {
        let bytes_out = resp.body().size_hint().exact();
        self.log_sent(stages, wants, request_id, status, bytes_out, since);
    }

    /// [`Facts::log`] once the answer's body is sent: `bytes_out` of it went out, and the
    /// request took until now.
    fn log_sent(
        self,
        stages: &StageSet,
        wants: &LogWants,
        request_id: &HeaderValue,
        status: StatusCode,
        bytes_out: Option<u64>,
        since: Instant,
    ) {
        let duration = since.elapsed();
        let partial = degraded_steps(&self.partial, &self.steps);
        let rid = String::from_utf8_lossy(request_id.as_bytes());
        let done = Done {
            arrived: SystemTime::now()
                .checked_sub(duration)
                .unwrap_or(SystemTime::UNIX_EPOCH),
            duration,
            request_id: &rid,
            method: &self.method,
            path: self.uri.path(),
            route: self.route.as_deref(),
            client: self.client,
            tls_client: self.tls_client.as_deref(),
            status,
            bytes_in: self.bytes_in,
            bytes_out,
            error: self.error.as_ref().map(|(c, _)| c.as_ref()),
            error_step: self.error.as_ref().and_then(|(_, s)| s.as_deref()),
            partial: &partial,
        };
        stages.on_logged(wants, &done);
    }

    /// The facts of a request whose answer is streamed (`Body::Passed`), to be logged when the
    /// stream ends ([`log_at_end`]): the route's name copied, so they outlive the request.
    fn into_owned(self) -> Facts<'static> {
        Facts {
            method: self.method,
            uri: self.uri,
            client: self.client,
            tls_client: self.tls_client,
            route: self.route.map(|r| Cow::Owned(r.into_owned())),
            bytes_in: self.bytes_in,
            error: self.error,
            partial: self.partial,
            steps: self.steps,
        }
    }
}

/// What a streamed answer's line waits for: everything but the bytes sent and the time taken.
struct AtEnd {
    facts: Facts<'static>,
    live: Arc<crate::Live>,
    wants: LogWants,
    request_id: HeaderValue,
    status: StatusCode,
    since: Instant,
}

/// A streamed answer's body (`Body::Passed`: pass-through routes, event streams) whose log line
/// is written when it ends — its last frame, its failure, or the client leaving (the body
/// dropped) — with the bytes actually sent and the whole duration.
struct LoggedAtEnd {
    inner: UnsyncBoxBody<bytes::Bytes, BoxError>,
    sent: u64,
    end: Option<Box<AtEnd>>,
}

impl LoggedAtEnd {
    fn log(&mut self) {
        if let Some(e) = self.end.take() {
            let AtEnd {
                facts,
                live,
                wants,
                request_id,
                status,
                since,
            } = *e;
            facts.log_sent(
                &live.stages,
                &wants,
                &request_id,
                status,
                Some(self.sent),
                since,
            );
        }
    }
}

impl Drop for LoggedAtEnd {
    fn drop(&mut self) {
        self.log();
    }
}

impl hyper::body::Body for LoggedAtEnd {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.sent += d.len() as u64;
                }
            }
            std::task::Poll::Ready(_) => this.log(),
            std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The logging phase of a request whose answer `resp` is streamed (`Body::Passed`): its line is
/// written when the body ends (see [`LoggedAtEnd`]) rather than when the head goes out. (Any
/// other answer is logged at once, with [`Facts::log`].)
pub(crate) fn log_at_end(
    resp: &mut Response<Body>,
    facts: Facts<'_>,
    live: &Arc<crate::Live>,
    wants: LogWants,
    request_id: &HeaderValue,
    status: StatusCode,
    since: Instant,
) {
    let Body::Passed(inner) = std::mem::replace(resp.body_mut(), Body::empty()) else {
        return;
    };
    let end = AtEnd {
        facts: facts.into_owned(),
        live: live.clone(),
        wants,
        request_id: request_id.clone(),
        status,
        since,
    };
    *resp.body_mut() = Body::Passed(UnsyncBoxBody::new(LoggedAtEnd {
        inner,
        sent: 0,
        end: Some(Box::new(end)),
    }));
}

/// Each degraded step with the cause of its fallback from the timeline (`missing_elements` for a
/// step that only left elements out).
fn degraded_steps<'s>(
    partial: &'s [Arc<str>],
    steps: &'s [server_timing::StepTiming],
) -> Vec<Degraded<'s>> {
    partial
        .iter()
        .map(|name| {
            let cause = steps
                .iter()
                .find(|s| s.name == *name)
                .and_then(|s| s.failure.as_ref());
            Degraded {
                step: name,
                code: cause.map_or("missing_elements", |(c, _)| c),
                cause: cause.map_or("elements left out or replaced by `missing`", |(_, c)| c),
            }
        })
        .collect()
}
