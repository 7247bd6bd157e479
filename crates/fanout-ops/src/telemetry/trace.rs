//! OpenTelemetry traces of requests: a SERVER span per request, an INTERNAL span per step (its
//! child), a CLIENT span per backend call attempt (the step's child), exported over OTLP/HTTP by
//! [`super::export`]. The OTel API is used directly (no `tracing` bridge): steps run concurrently
//! on the request's task, so each span's parent is passed explicitly, and with tracing off nothing
//! here runs at all.
//!
//! W3C Trace Context: an incoming `traceparent` is parsed strictly ([`parse_traceparent`]; a
//! malformed one is ignored and the request starts a new trace), its sampled flag decides
//! (parent-based sampling; requests without one are sampled by trace id at
//! `telemetry.tracing.sampling_ratio`). Every backend attempt is sent a `traceparent` naming its
//! own span — also when not sampled (flag `00`), so downstream services see one trace either
//! way — and the client's `tracestate`, if any.

use super::export::{ExportStats, QueueProcessor};
use fanout_config::TracingConfig;
use fanout_flow::observe::StepEnd;
use fanout_flow::plan::StepPlan;
use fanout_layers::backend::{CallError, CallErrorKind};
use fanout_layers::trace::{AttemptSpan, CallTrace, CallTracer};
use http::{HeaderMap, HeaderValue, StatusCode};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// The W3C trace context headers.
pub const TRACEPARENT: &str = "traceparent";
/// See [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
/// Longest `tracestate` accepted from a client (W3C asks to propagate at least 512 bytes).
pub const MAX_TRACESTATE: usize = 512;

/// The tracer of a serving gateway: the provider (sampler, resource, span queue) and its
/// counters.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    stats: Arc<ExportStats>,
    export: super::export::Handle,
}

impl Tracing {
    /// Build the provider and start the export task (inside the runtime).
    pub fn start(cfg: &TracingConfig) -> Result<Tracing, String> {
        let ratio = if cfg.sampling_ratio.is_finite() {
            cfg.sampling_ratio.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let resource = Resource::builder()
            .with_service_name(cfg.service_name.clone())
            .build();
        let (processor, export, stats) = QueueProcessor::start(cfg, &resource)?;
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .with_resource(resource)
            .with_span_processor(processor)
            .build();
        let tracer = provider.tracer("fanout");
        Ok(Tracing {
            provider,
            tracer,
            stats,
            export,
        })
    }

    /// The request span of a request arriving with `headers` at `at`, named `method` until
    /// its route is known.
    pub fn request(
        &self,
        method: &http::Method,
        headers: &HeaderMap,
        at: SystemTime,
    ) -> RequestTrace {
        let parent = match incoming(headers) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(method.as_str().to_string())
            .with_kind(SpanKind::Server)
            .with_start_time(at)
            .with_attributes([KeyValue::new("http.request.method", method.to_string())])
            .start_with_context(&self.tracer, &parent);
        let sampled = opentelemetry::trace::Span::span_context(&span).is_sampled();
        RequestTrace {
            cx: parent.with_span(span),
            sampled,
            tracer: self.tracer.clone(),
            steps: Mutex::new(Vec::new()),
        }
    }

    /// `{exported, dropped, failed_exports, …}` for the status endpoint.
    pub fn status_json(&self) -> serde_json::Value {
        self.stats.json()
    }

    /// Export what is queued (bounded by the export timeout), then stop the provider.
    pub async fn shutdown(&self) {
        self.export.flush().await;
        let _ = self.provider.shutdown();
    }
}

/// The trace context a client sent: a valid `traceparent` (exactly one), with its `tracestate`
/// when that is valid too.
fn incoming(headers: &HeaderMap) -> Option<SpanContext> {
    let mut all = headers.get_all(TRACEPARENT).iter();
    let tp = all.next()?;
    if all.next().is_some() {
        return None; // more than one: invalid (W3C)
    }
    let (trace, span, flags) = parse_traceparent(tp.as_bytes())?;
    let state = tracestate(headers).unwrap_or_default();
    Some(SpanContext::new(trace, span, flags, true, state))
}

/// The client's `tracestate` (all its headers joined), when valid and not longer than
/// [`MAX_TRACESTATE`].
fn tracestate(headers: &HeaderMap) -> Option<TraceState> {
    let mut joined = String::new();
    for v in headers.get_all(TRACESTATE) {
        let s = v.to_str().ok()?;
        if !joined.is_empty() {
            joined.push(',');
        }
        joined.push_str(s);
        if joined.len() > MAX_TRACESTATE {
            return None;
        }
    }
    if joined.trim().is_empty() {
        return None;
    }
    joined.parse().ok()
}

/// Parse a W3C `traceparent` strictly: `VV-TTTT…(32)-PPPP…(16)-FF`, lowercase hex, version not
/// `ff`, trace and parent ids not all zero; version `00` has exactly these 55 characters, a
/// later version may add `-…` after them. Anything else is `None` (the request starts a new
/// trace).
pub fn parse_traceparent(v: &[u8]) -> Option<(TraceId, SpanId, TraceFlags)> {
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex_u128(&v[0..2])?;
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let trace = hex_u128(&v[3..35])?;
    let parent = hex_u128(&v[36..52])?;
    let flags = hex_u128(&v[53..55])?;
    if trace == 0 || parent == 0 {
        return None;
    }
    Some((
        TraceId::from(trace),
        SpanId::from(parent as u64),
        TraceFlags::new((flags as u8) & TraceFlags::SAMPLED.to_u8()),
    ))
}

/// Lowercase hex digits (at most 32) as a number.
fn hex_u128(s: &[u8]) -> Option<u128> {
    let mut n: u128 = 0;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        n = (n << 4) | u128::from(d);
    }
    Some(n)
}

/// The `traceparent` naming `sc`.
pub fn traceparent(sc: &SpanContext) -> Option<HeaderValue> {
    let v = format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    );
    HeaderValue::from_str(&v).ok()
}

/// One request's spans: the request span, and the span of each running step.
pub struct RequestTrace {
    /// Holds the request span.
    cx: Context,
    /// The request is recorded. When not, its steps and calls make no spans (they would not be
    /// recorded either: parent-based sampling); calls still send a `traceparent` (flag `00`).
    sampled: bool,
    tracer: SdkTracer,
    /// Running steps' tracers, by step name (`Arc` identity).
    steps: Mutex<Vec<Arc<StepTracer>>>,
}

impl RequestTrace {
    /// The route is known: name the span `METHOD PATTERN` and record the route.
    pub fn routed(&self, method: &http::Method, pattern: &str) {
        let span = self.cx.span();
        span.update_name(format!("{method} {pattern}"));
        span.set_attribute(KeyValue::new("http.route", pattern.to_string()));
    }

    /// The request's span (for the requests that join its run of the flow).
    pub fn span_context(&self) -> SpanContext {
        self.cx.span().span_context().clone()
    }

    /// The request takes the answer of another request's run of the flow: `fanout.coalesced`
    /// on its span, and a link to the span of the request that ran it (`leader`).
    pub fn coalesced(&self, leader: Option<&SpanContext>) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("fanout.coalesced", true));
        if let Some(sc) = leader.filter(|sc| sc.is_valid()) {
            span.add_link(
                sc.clone(),
                vec![KeyValue::new("fanout.link", "coalesced_run")],
            );
        }
    }

    /// The request ended: status, request id, outcome (`ok`, `partial` or the error code).
    pub fn end(&self, status: StatusCode, request_id: &str, error: Option<&str>, partial: bool) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        ));
        span.set_attribute(KeyValue::new("fanout.request_id", request_id.to_string()));
        let outcome = match (error, partial) {
            (Some(code), _) => code.to_string(),
            (None, true) => "partial".to_string(),
            (None, false) => "ok".to_string(),
        };
        span.set_attribute(KeyValue::new("fanout.outcome", outcome));
        if status.is_server_error() {
            span.set_status(Status::error(error.unwrap_or("").to_string()));
        }
        span.end();
    }

    fn step(&self, step: &StepPlan) -> Option<Arc<StepTracer>> {
        let steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
        steps
            .iter()
            .find(|s| Arc::ptr_eq(&s.name, &step.name))
            .cloned()
    }

    /// `step` starts: its span, a child of the request span.
    pub fn step_started(&self, step: &StepPlan) {
        let backend = step.backend().cloned();
        if !self.sampled {
            let st = Arc::new(StepTracer {
                name: step.name.clone(),
                backend,
                cx: self.cx.clone(),
                recording: false,
                tracer: self.tracer.clone(),
            });
            self.steps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(st);
            return;
        }
        let mut attrs = vec![KeyValue::new("fanout.step", step.name.to_string())];
        if let Some(b) = &backend {
            attrs.push(KeyValue::new("fanout.backend", b.to_string()));
        }
        let span = self
            .tracer
            .span_builder(format!("step {}", step.name))
            .with_kind(SpanKind::Internal)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, &self.cx);
        let st = Arc::new(StepTracer {
            name: step.name.clone(),
            backend,
            cx: self.cx.with_span(span),
            recording: true,
            tracer: self.tracer.clone(),
        });
        self.steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(st);
    }

    /// The tracer of the calls `step` makes (the parent of their spans).
    pub fn call_tracer(&self, step: &StepPlan) -> Option<Arc<dyn CallTracer>> {
        let st: Arc<dyn CallTracer> = self.step(step)?;
        Some(st)
    }

    /// `step` ended: its outcome, then its span ends.
    pub fn step_finished(&self, step: &StepPlan, end: StepEnd<'_>) {
        let st = {
            let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
            let Some(i) = steps.iter().position(|s| Arc::ptr_eq(&s.name, &step.name)) else {
                return;
            };
            steps.swap_remove(i)
        };
        if !st.recording {
            return; // its context is the request's: nothing to end
        }
        let span = st.cx.span();
        let (outcome, err) = match end {
            StepEnd::Ok => ("ok", None),
            StepEnd::Defaulted(e) => ("defaulted", Some(e)),
            StepEnd::Failed(e) => ("failed", Some(e)),
        };
        span.set_attribute(KeyValue::new("fanout.outcome", outcome));
        if let Some(e) = err {
            span.set_attribute(KeyValue::new("error.type", e.code().to_string()));
            span.set_status(Status::error(e.message.clone()));
        }
        span.end();
    }
}

/// A running step's span; the parent of its calls' spans.
pub struct StepTracer {
    name: Arc<str>,
    backend: Option<Arc<str>>,
    /// Holds the step span (the request's context when not recording).
    cx: Context,
    /// The step has a span of its own (the request is sampled).
    recording: bool,
    tracer: SdkTracer,
}

impl StepTracer {
    fn call_span(&self, call: &CallTrace, address: Option<&str>) -> CallSpan {
        if !self.recording {
            // Not sampled: no span, only a fresh span id to send downstream.
            let span = self.cx.span();
            let parent = span.span_context();
            let id = SpanId::from(rand::random::<u64>().max(1));
            let sc = SpanContext::new(
                parent.trace_id(),
                id,
                parent.trace_flags(),
                false,
                parent.trace_state().clone(),
            );
            return CallSpan {
                cx: None,
                unsampled: Some(sc),
                ended: false,
            };
        }
        let backend = self.backend.as_deref().unwrap_or("");
        let mut attrs = vec![
            KeyValue::new("fanout.step", self.name.to_string()),
            KeyValue::new("fanout.backend", backend.to_string()),
            KeyValue::new("fanout.attempt", i64::from(call.attempt)),
            KeyValue::new("fanout.hedge", call.hedge),
        ];
        if let Some(a) = address {
            attrs.push(KeyValue::new("server.address", a.to_string()));
        }
        if let Some(c) = call.cache {
            attrs.push(KeyValue::new("fanout.cache", c.as_str()));
        }
        if let Some(d) = call.dedup {
            attrs.push(KeyValue::new("fanout.dedup", d.as_str()));
        }
        if call.batch {
            attrs.push(KeyValue::new("fanout.batch", true));
        }
        let span = self
            .tracer
            .span_builder(format!("call {backend}"))
            .with_kind(SpanKind::Client)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, &self.cx);
        CallSpan {
            cx: Some(self.cx.with_span(span)),
            unsampled: None,
            ended: false,
        }
    }
}

impl CallTracer for StepTracer {
    fn attempt(&self, call: &CallTrace, address: &str) -> Box<dyn AttemptSpan> {
        Box::new(self.call_span(call, Some(address)))
    }

    fn served(&self, call: &CallTrace) -> Box<dyn AttemptSpan> {
        Box::new(self.call_span(call, None))
    }

    /// A root span (the work belongs to no single request) linked to the step span of every
    /// call that is sampled; none when none is.
    fn shared(
        &self,
        name: &str,
        attributes: Vec<(&'static str, String)>,
        calls: &[&CallTrace],
    ) -> Option<Box<dyn AttemptSpan>> {
        let steps: Vec<&StepTracer> = calls
            .iter()
            .filter_map(|c| c.tracer.as_ref()?.as_any()?.downcast_ref::<StepTracer>())
            .filter(|t| t.recording)
            .collect();
        let first = steps.first()?;
        let links = steps
            .iter()
            .map(|t| Link::with_context(t.cx.span().span_context().clone()))
            .collect();
        let mut attrs: Vec<KeyValue> = attributes
            .into_iter()
            .map(|(k, v)| KeyValue::new(k, v))
            .collect();
        attrs.push(KeyValue::new("fanout.linked_requests", calls.len() as i64));
        let span = first
            .tracer
            .span_builder(name.to_string())
            .with_kind(SpanKind::Internal)
            .with_attributes(attrs)
            .with_links(links)
            .start_with_context(&first.tracer, &Context::new());
        Some(Box::new(CallSpan {
            cx: Some(Context::new().with_span(span)),
            unsampled: None,
            ended: false,
        }))
    }

    /// A child of the step span (a GraphQL resolver run); its calls' spans are its children.
    fn child(
        &self,
        name: &str,
        attributes: Vec<(&'static str, String)>,
    ) -> Option<(Arc<dyn CallTracer>, Box<dyn AttemptSpan>)> {
        if !self.recording {
            return None;
        }
        let backend = attributes
            .iter()
            .find(|(k, _)| *k == "fanout.backend")
            .map(|(_, v)| Arc::<str>::from(v.as_str()));
        let attrs: Vec<KeyValue> = attributes
            .into_iter()
            .map(|(k, v)| KeyValue::new(k, v))
            .collect();
        let span = self
            .tracer
            .span_builder(name.to_string())
            .with_kind(SpanKind::Internal)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, &self.cx);
        let cx = self.cx.with_span(span);
        let tracer = Arc::new(StepTracer {
            name: self.name.clone(),
            backend,
            cx: cx.clone(),
            recording: true,
            tracer: self.tracer.clone(),
        });
        Some((tracer, Box::new(WorkSpan { cx })))
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// A span of a step's own work ([`CallTracer::child`]): its attributes as set, an error status
/// when ended with an error, ended when dropped.
struct WorkSpan {
    cx: Context,
}

impl AttemptSpan for WorkSpan {
    fn inject(&self, headers: &mut HeaderMap) {
        inject(self.cx.span().span_context(), headers);
    }

    fn set_attributes(&mut self, attributes: &[(&'static str, &str)]) {
        let span = self.cx.span();
        for (k, v) in attributes {
            if *k == "error.type" {
                span.set_status(Status::error(v.to_string()));
            }
            span.set_attribute(KeyValue::new(*k, v.to_string()));
        }
    }

    fn end(self: Box<Self>, result: Result<StatusCode, &CallError>) {
        if let Err(e) = result {
            self.cx.span().set_status(Status::error(kind_name(e.kind)));
        }
        // ended by the drop below
    }
}

impl Drop for WorkSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// One attempt's span: ended with its result, or as cancelled when dropped first.
struct CallSpan {
    /// Holds the span (sampled requests).
    cx: Option<Context>,
    /// The context sent downstream by a call of a request that is not sampled.
    unsampled: Option<SpanContext>,
    ended: bool,
}

impl AttemptSpan for CallSpan {
    fn inject(&self, headers: &mut HeaderMap) {
        match (&self.cx, &self.unsampled) {
            (Some(cx), _) => inject(cx.span().span_context(), headers),
            (None, Some(sc)) => inject(sc, headers),
            (None, None) => {}
        }
    }

    fn set_attributes(&mut self, attributes: &[(&'static str, &str)]) {
        if let Some(cx) = &self.cx {
            let span = cx.span();
            for (k, v) in attributes {
                span.set_attribute(KeyValue::new(*k, v.to_string()));
            }
        }
    }

    fn end(mut self: Box<Self>, result: Result<StatusCode, &CallError>) {
        self.ended = true;
        let Some(cx) = &self.cx else {
            return;
        };
        let span = cx.span();
        match result {
            Ok(status) => {
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status.as_u16()),
                ));
                let outcome = if status.is_server_error() {
                    "5xx"
                } else {
                    "ok"
                };
                span.set_attribute(KeyValue::new("fanout.outcome", outcome));
                if status.is_server_error() {
                    span.set_status(Status::error(status.as_str().to_string()));
                }
            }
            Err(e) => {
                span.set_attribute(KeyValue::new("fanout.outcome", kind_name(e.kind)));
                span.set_status(Status::error(kind_name(e.kind)));
            }
        }
        span.end();
    }
}

/// Write `sc` as `traceparent` (and `tracestate` when it has one).
fn inject(sc: &SpanContext, headers: &mut HeaderMap) {
    if let Some(v) = traceparent(sc) {
        headers.insert(TRACEPARENT, v);
    }
    let state = sc.trace_state().header();
    if !state.is_empty()
        && let Ok(v) = HeaderValue::from_str(&state)
    {
        headers.insert(TRACESTATE, v);
    }
}

impl Drop for CallSpan {
    fn drop(&mut self) {
        if !self.ended
            && let Some(cx) = &self.cx
        {
            let span = cx.span();
            span.set_attribute(KeyValue::new("fanout.outcome", "cancelled"));
            span.end();
        }
    }
}

/// A transport failure's attribute value: the one classification's label (the same words as
/// the metrics and logs).
fn kind_name(k: CallErrorKind) -> &'static str {
    fanout_flow::CallOutcome::Failed(k).label()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_parsed_strictly() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (t, s, f) = parse_traceparent(ok).unwrap();
        assert_eq!(t.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s.to_string(), "00f067aa0ba902b7");
        assert!(f.is_sampled());
        // A later version may carry more after a dash.
        assert!(
            parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x")
                .is_some()
        );
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"[..], // v00 with extra
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",       // version ff
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",       // zero trace
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",       // zero parent
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",       // uppercase
            b"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",       // misplaced dash
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",        // short
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.",      // no dash after
            b"0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"",
        ] {
            assert!(
                parse_traceparent(bad).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn traceparent_round_trips() {
        let sc = SpanContext::new(
            TraceId::from(0x4bf92f3577b34da6a3ce929d0e0e4736),
            SpanId::from(0x00f067aa0ba902b7),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let v = traceparent(&sc).unwrap();
        assert_eq!(v, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert!(parse_traceparent(v.as_bytes()).is_some());
    }
}
