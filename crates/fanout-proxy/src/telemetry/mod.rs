//! What the gateway tells operators about each request: OpenTelemetry traces ([`trace`],
//! exported by [`fanout_ops::telemetry::export`]), the JSON access log ([`access_log`]) and
//! `Server-Timing` ([`server_timing`]), all in [`fanout_ops::telemetry`]. All are off by
//! default, and off they cost a few branches per request: no span, no timeline, no line is
//! built.
//!
//! [`Telemetry`] is built with the gateway and started inside the runtime; each request gets a
//! [`RequestTelemetry`] (what is on for it), whose parts the executor feeds through
//! [`crate::observe::RequestObserver`], and which finishes the answer (header, span, line).

use access_log::{AccessLog, Degraded, Line};
use fanout_config::{Config, ConfigError, ConfigErrors};
use fanout_flow::{Outcome, RoutePlan};
use fanout_ops::telemetry::{access_log, server_timing, trace};
use http::request::Parts;
use http::{HeaderValue, Response};
use server_timing::{Timeline, TimingGate};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;
use tokio::time::Instant;
use trace::{RequestTrace, Tracing};

/// The gateway's telemetry: config, and once started the tracer and access log writer.
pub struct Telemetry {
    cfg: fanout_config::Telemetry,
    tracing: OnceLock<Tracing>,
    access_log: OnceLock<AccessLog>,
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
        if !(0.0..=1.0).contains(&t.access_log.sample_ratio) {
            errs.push(ratio_error("telemetry.access_log.sample_ratio"));
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
            access_log: OnceLock::new(),
            gate,
        })
    }

    /// Start the exporter and the access log writer (inside the runtime; once).
    pub fn start(&self) -> Result<(), String> {
        if let Some(cfg) = &self.cfg.tracing
            && self.tracing.get().is_none()
        {
            let _ = self.tracing.set(Tracing::start(cfg)?);
        }
        if self.cfg.access_log.enabled && self.access_log.get().is_none() {
            let _ = self.access_log.set(AccessLog::start(&self.cfg.access_log)?);
        }
        Ok(())
    }

    /// Send the spans still queued (bounded by the export timeout).
    pub async fn shutdown(&self) {
        if let Some(t) = self.tracing.get() {
            t.shutdown().await;
        }
    }

    /// `{tracing, access_log}` counters for the status endpoint (`null` when off).
    pub fn status_json(&self) -> serde_json::Value {
        serde_json::json!({
            "tracing": self.tracing.get().map(Tracing::status_json),
            "access_log": self.access_log.get().map(AccessLog::status_json),
        })
    }

    /// What is on for a request that arrived at `start`.
    pub fn request(&self, parts: &Parts, start: Instant) -> RequestTelemetry<'_> {
        let trace = self
            .tracing
            .get()
            .map(|t| t.request(&parts.method, &parts.headers, SystemTime::now()));
        let log = self.access_log.get().map(|l| (l, l.sampled()));
        let timing = self.gate.as_ref().is_some_and(|g| g.allows(&parts.headers));
        RequestTelemetry {
            start,
            trace,
            log,
            timing,
            timeline: None,
            route: None,
            bytes_in: 0,
            partial: Vec::new(),
        }
    }
}

fn ratio_error(field: &str) -> ConfigError {
    ConfigError::at(
        Default::default(),
        format!("{field} must be between 0.0 and 1.0"),
    )
    .hint("1.0 keeps everything, 0.1 one in ten, 0.0 nothing")
}

/// What is on for one request, and what it gathered.
pub struct RequestTelemetry<'a> {
    start: Instant,
    trace: Option<RequestTrace>,
    /// The access log, and whether this request is in its sample.
    log: Option<(&'a AccessLog, bool)>,
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
    pub code: &'e str,
    /// The step it names.
    pub step: Option<&'e str>,
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
        let logs = self
            .log
            .is_some_and(|(l, sampled)| sampled || l.always_log_degraded);
        if self.timing || logs {
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
            && (self.trace.is_some() || self.log.is_some())
        {
            self.partial = o.partial.clone();
        }
    }

    /// The answer is ready: add `Server-Timing`, end the request span, write the log line.
    pub fn finish<B: hyper::body::Body>(
        self,
        resp: &mut Response<B>,
        request_id: &HeaderValue,
        parts: &Parts,
        failure: Option<Failure<'_>>,
        client: impl FnOnce() -> Option<std::net::IpAddr>,
    ) {
        if self.trace.is_none() && self.log.is_none() && !self.timing {
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
        let rid = String::from_utf8_lossy(request_id.as_bytes());
        let status = resp.status();
        if let Some(t) = &self.trace {
            t.end(
                status,
                &rid,
                failure.as_ref().map(|f| f.code),
                !self.partial.is_empty(),
            );
        }
        let Some((log, sampled)) = self.log else {
            return;
        };
        let degraded = !self.partial.is_empty() || status.is_server_error();
        if !(sampled || degraded && log.always_log_degraded) {
            return;
        }
        let partial = degraded_steps(&self.partial, &steps);
        log.write(&Line {
            time: access_log::rfc3339(SystemTime::now() - total),
            request_id: &rid,
            method: parts.method.as_str(),
            route: self.route,
            path: parts.uri.path(),
            client: client().map(|ip| ip.to_string()),
            tls_client: parts
                .extensions
                .get::<Arc<fanout_transport::tls::TlsInfo>>()
                .and_then(|t| t.client_subject()),
            status: status.as_u16(),
            duration_ms: (total.as_secs_f64() * 1e6).round() / 1e3,
            bytes_in: self.bytes_in,
            bytes_out: resp.body().size_hint().exact().unwrap_or(0),
            error: failure.as_ref().map(|f| f.code),
            error_step: failure.as_ref().and_then(|f| f.step),
            partial,
        });
    }
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
