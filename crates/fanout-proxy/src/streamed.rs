//! Streamed answers (`stream:` on a flow route; docs/config.md#streamed-answers): the same
//! lifecycle as a flow's request up to admission — route, edge stages, deadline, body,
//! `$request`, admission — then the answer's head at once (`200`, `text/event-stream` or
//! `application/x-ndjson`) and the flow run **inside the answer's body** ([`Streamed`]): each
//! `for_each` element and each step value the engine reports ([`Sink`], an
//! [`fanout_flow::observe::Observer`]) goes to the client as one event as soon as it is ready,
//! in completion order; the route's answer (its `respond.body`, `_partial` included) is the
//! last event, `end`, or the flow's failure is, `error`, with the contract's error object.
//!
//! Nothing is spawned: the body polls the run, so a client that leaves drops the run and with it
//! every call in flight; a slow client is not polled, so the run does not outpace it by more
//! than the events one poll produces. The request's deadline bounds the whole stream (the run
//! fails with `deadline_exceeded`, sent as the `error` event); `stream.max_events` bounds the
//! events (and the queue between the run and the body); SSE heartbeats while nothing is sent;
//! the gateway's drain ends a stream between events with an `error` event, code `draining`.
//! The access log line is written when the stream ends (`Body::Passed`).

use crate::Gateway;
use crate::answer::ApiError;
use crate::lifecycle::{Req, build_request, edge_stages, once_only, path_params};
use bytes::Bytes;
use fanout_config::StreamFormat;
use fanout_expr::Val;
use fanout_flow::memory::RequestMemory;
use fanout_flow::observe::Observer;
use fanout_flow::plan::StepPlan;
use fanout_flow::{FlowError, Outcome, RoutePlan};
use fanout_transport::body::{Body, BoxError};
use http::{HeaderValue, Response, StatusCode};
use hyper::body::{Frame, Incoming, SizeHint};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

impl Gateway {
    /// A request of a streamed route: checked, admitted, then answered with its stream.
    pub(crate) async fn stream_lifecycle(
        &self,
        cx: &mut Req<'_, '_>,
        route: &RoutePlan,
        params: matchit::Params<'_, '_>,
        body: Incoming,
    ) -> Result<Response<Body>, ApiError> {
        let start = cx.rec.start();
        let (plan, stream) = match (cx.live.routes.get(route.index), route.stream.as_ref()) {
            (Some(p), Some(s)) => (p.clone(), s.clone()),
            _ => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "the route's plan is missing",
                ));
            }
        };
        let checked = async {
            once_only(&cx.parts.headers)?;
            let params = path_params(&params)?;
            let (auth, client) =
                edge_stages(cx, route, fanout_edge::RouteKind::Http, &params).await?;
            let deadline = self.deadline(&cx.parts.headers, route, start)?;
            let (body_val, reserved) = self
                .read_body(
                    cx.live,
                    &cx.parts.headers,
                    body,
                    start,
                    deadline,
                    &mut cx.tel,
                )
                .await?;
            let request = build_request(
                cx.parts,
                params.iter().map(|(k, v)| (route.param_key(k), v.as_ref())),
                body_val,
                auth,
                &route.request_use,
                client.as_deref(),
            )?;
            let slot = self
                .admit(cx.live, route, deadline)
                .await
                .map_err(ApiError::from)?;
            Ok::<_, ApiError>((deadline, request, reserved, slot))
        }
        .await;
        let (deadline, request, reserved, mut slot) = match checked {
            Ok(r) => r,
            Err(e) => {
                self.record_refusal(cx, route, &e);
                return Err(e);
            }
        };
        let sink = Arc::new(Sink::new(stream.max_events));
        let gate = self.bodies.clone();
        let run_sink = sink.clone();
        let run = Box::pin(async move {
            // The request body's memory, the admission slot and the answers parsed for the run
            // are held until the run ends (or the client leaves).
            let _reserved = reserved;
            let memory = RequestMemory::new(&*gate);
            let obs = Observed {
                sink: &run_sink,
                memory: &memory,
            };
            let out = plan.run_observed(request, deadline, &obs).await;
            slot.completed();
            out
        });
        let body = Streamed {
            format: stream.format,
            run: Some(run),
            sink,
            ending: None,
            done: false,
            events: 0,
            max_events: stream.max_events,
            request_id: cx.rid.clone(),
            heartbeat: match stream.format {
                StreamFormat::Sse => (!stream.heartbeat.0.is_zero()).then_some(stream.heartbeat.0),
                StreamFormat::Ndjson => None,
            },
            beat: Box::pin(tokio::time::sleep_until(Instant::now())),
            beat_armed: false,
            drain: self.drain.wait(),
            merge: stream.merge.as_ref().map(|m| {
                (
                    crate::merge::Sources::open(m, &cx.live.services, deadline),
                    Box::pin(tokio::time::sleep_until(deadline)),
                )
            }),
        };
        let mut resp = Response::new(Body::Passed(
            http_body_util::combinators::UnsyncBoxBody::new(body),
        ));
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(match stream.format {
                StreamFormat::Sse => "text/event-stream",
                StreamFormat::Ndjson => "application/x-ndjson",
            }),
        );
        h.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        );
        // Tell buffering proxies in front (nginx) to pass each event at once.
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        Ok(resp)
    }
}

/// What the run reports, waiting for the body to send it.
enum Item {
    /// A `for_each` element: its step, index and value or error.
    Element(Arc<str>, usize, Result<Val, ElementError>),
    /// A step's whole value.
    Step(Arc<str>, Val),
}

/// An element's failure as the client sees it (the safe part of the error).
struct ElementError {
    status: u16,
    code: String,
    message: String,
}

impl ElementError {
    fn of(e: &FlowError) -> ElementError {
        ElementError {
            status: e.status(),
            code: e.code().to_string(),
            message: e.message.clone(),
        }
    }
}

/// The queue between the run and the body: at most `max_events` + 1 items (past that the body
/// ends the stream), each a reference to a value the run holds anyway.
struct Sink {
    state: Mutex<SinkState>,
    max: usize,
}

#[derive(Default)]
struct SinkState {
    queue: VecDeque<Item>,
    /// The steps that reported elements one by one (their whole value is not sent again).
    by_element: Vec<Arc<str>>,
    /// Items refused because the queue was full (the body ends the stream on them).
    overflow: bool,
}

impl Sink {
    fn new(max_events: u64) -> Sink {
        Sink {
            state: Mutex::new(SinkState::default()),
            max: usize::try_from(max_events).unwrap_or(usize::MAX),
        }
    }

    fn push(&self, f: impl FnOnce(&mut SinkState) -> Option<Item>) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if s.queue.len() > self.max {
            s.overflow = true;
            return;
        }
        if let Some(item) = f(&mut s) {
            s.queue.push_back(item);
        }
    }

    fn take(&self) -> (Vec<Item>, bool) {
        match self.state.lock() {
            Ok(mut s) => (s.queue.drain(..).collect(), s.overflow),
            Err(_) => (Vec::new(), true),
        }
    }
}

/// The run's observer on a streamed route: the values to the sink, the memory account.
struct Observed<'a> {
    sink: &'a Sink,
    memory: &'a RequestMemory<'a>,
}

impl Observer for Observed<'_> {
    fn element(&self, step: &StepPlan, index: usize, value: Result<&Val, &FlowError>) {
        self.sink.push(|s| {
            if !s.by_element.iter().any(|n| Arc::ptr_eq(n, &step.name)) {
                s.by_element.push(step.name.clone());
            }
            Some(Item::Element(
                step.name.clone(),
                index,
                value.cloned().map_err(ElementError::of),
            ))
        });
    }

    fn step_value(&self, step: &StepPlan, value: &Val) {
        self.sink.push(|s| {
            if s.by_element.iter().any(|n| Arc::ptr_eq(n, &step.name)) {
                return None;
            }
            Some(Item::Step(step.name.clone(), value.clone()))
        });
    }

    fn memory(&self) -> &RequestMemory<'_> {
        self.memory
    }
}

type Run = Pin<Box<dyn Future<Output = Result<Outcome, FlowError>> + Send>>;

/// The streamed answer: polls the run, sends what it reported, then its end.
struct Streamed {
    format: StreamFormat,
    /// The flow's run, until it ends (dropped early when the stream ends first).
    run: Option<Run>,
    sink: Arc<Sink>,
    /// The run's outcome, sent after the events still queued.
    ending: Option<Result<Outcome, FlowError>>,
    done: bool,
    events: u64,
    max_events: u64,
    request_id: HeaderValue,
    heartbeat: Option<Duration>,
    beat: Pin<Box<Sleep>>,
    beat_armed: bool,
    /// The drain, at this stream's offset in `server.drain_spread`.
    drain: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    /// `stream.merge`: the backend streams merged into the answer, and the request's deadline,
    /// which ends them (a flow's run has its own).
    merge: Option<(crate::merge::Sources, Pin<Box<Sleep>>)>,
}

impl Streamed {
    /// One event, encoded.
    fn event(&self, out: &mut Vec<u8>, name: &str, index: Option<usize>, data: &[u8]) {
        match self.format {
            StreamFormat::Sse => {
                out.extend_from_slice(b"event: ");
                out.extend_from_slice(name.as_bytes());
                out.push(b'\n');
                if let Some(i) = index {
                    out.extend_from_slice(format!("id: {i}\n").as_bytes());
                }
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(data);
                out.extend_from_slice(b"\n\n");
            }
            StreamFormat::Ndjson => {
                out.extend_from_slice(b"{\"event\":");
                out.extend_from_slice(json_str(name).as_bytes());
                if let Some(i) = index {
                    out.extend_from_slice(format!(",\"index\":{i}").as_bytes());
                }
                out.extend_from_slice(b",\"data\":");
                out.extend_from_slice(data);
                out.extend_from_slice(b"}\n");
            }
        }
    }

    /// The contract's error object, `{"error": {code, message, step, status, request_id}}`
    /// (plus `index` for an element).
    fn error_data(
        &self,
        status: u16,
        code: &str,
        message: &str,
        step: Option<&str>,
        index: Option<usize>,
    ) -> Vec<u8> {
        let mut e = serde_json::Map::with_capacity(6);
        e.insert("code".into(), code.into());
        e.insert("message".into(), message.into());
        e.insert("step".into(), step.into());
        if let Some(i) = index {
            e.insert("index".into(), i.into());
        }
        e.insert("status".into(), status.into());
        e.insert(
            "request_id".into(),
            String::from_utf8_lossy(self.request_id.as_bytes()).into(),
        );
        serde_json::json!({ "error": e }).to_string().into_bytes()
    }

    /// The stream ends with an `error` event of ours (`too_many_events`, `draining`): the run
    /// is dropped, cancelling its calls.
    fn cut(&mut self, out: &mut Vec<u8>, code: &str, message: &str) {
        self.run = None;
        self.ending = None;
        self.merge = None;
        let data = self.error_data(503, code, message, None, None);
        self.event(out, "error", None, &data);
        self.done = true;
    }

    /// The run's outcome as the last event.
    fn end(&mut self, out: &mut Vec<u8>, outcome: Result<Outcome, FlowError>) {
        match outcome {
            Ok(o) => {
                let body = match &o.value {
                    Some(v) if o.body.is_empty() => {
                        let mut b = Vec::with_capacity(256);
                        fanout_expr::json::write(v, &mut b);
                        Bytes::from(b)
                    }
                    _ => o.body,
                };
                self.event(out, "end", None, &body);
            }
            Err(e) => {
                let a = ApiError::from(e);
                let data = self.error_data(
                    a.status.as_u16(),
                    &a.code,
                    &a.message,
                    a.step.as_deref(),
                    None,
                );
                self.event(out, "error", None, &data);
            }
        }
        self.done = true;
    }

    /// Encode what the merged sources gave; `false` once `max_events` is passed.
    fn encode_merged(&mut self, got: Vec<crate::merge::Got>, out: &mut Vec<u8>) -> bool {
        for g in got {
            if self.events >= self.max_events {
                return false;
            }
            self.events += 1;
            match g {
                crate::merge::Got::Event { source, id, data } => match self.format {
                    // Each line of the source's data its own `data:` line, as it came.
                    StreamFormat::Sse => {
                        out.extend_from_slice(b"event: ");
                        out.extend_from_slice(source.as_bytes());
                        out.push(b'\n');
                        if let Some(id) = id.filter(|i| !i.contains(['\n', '\r'])) {
                            out.extend_from_slice(format!("id: {id}\n").as_bytes());
                        }
                        for line in data.split('\n') {
                            out.extend_from_slice(b"data: ");
                            out.extend_from_slice(line.as_bytes());
                            out.push(b'\n');
                        }
                        out.push(b'\n');
                    }
                    StreamFormat::Ndjson => {
                        let data = crate::merge::data_json(&data);
                        self.event(out, &source, None, &data);
                    }
                },
                crate::merge::Got::Failed {
                    source,
                    code,
                    message,
                } => {
                    let mut data = self.error_data(502, code, &message, None, None);
                    // `{"error": {…}}` with the source named.
                    if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&data) {
                        v["error"]["source"] = serde_json::Value::from(&*source);
                        data = v.to_string().into_bytes();
                    }
                    self.event(out, "error", None, &data);
                }
            }
        }
        true
    }

    /// Encode what the run reported; `false` once `max_events` is passed.
    fn encode(&mut self, items: Vec<Item>, out: &mut Vec<u8>) -> bool {
        for item in items {
            if self.events >= self.max_events {
                return false;
            }
            self.events += 1;
            match item {
                Item::Element(step, k, Ok(v)) => {
                    let mut data = Vec::with_capacity(128);
                    fanout_expr::json::write(&v, &mut data);
                    self.event(out, &step, Some(k), &data);
                }
                Item::Element(step, k, Err(e)) => {
                    let data = self.error_data(e.status, &e.code, &e.message, Some(&step), Some(k));
                    self.event(out, "error", Some(k), &data);
                }
                Item::Step(step, v) => {
                    let mut data = Vec::with_capacity(128);
                    fanout_expr::json::write(&v, &mut data);
                    self.event(out, &step, None, &data);
                }
            }
        }
        true
    }
}

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(run) = this.run.as_mut()
            && let Poll::Ready(out) = run.as_mut().poll(cx)
        {
            this.run = None;
            this.ending = Some(out);
        }
        let mut out = Vec::new();
        let (items, overflow) = this.sink.take();
        let mut merged = Vec::new();
        let mut merge_over = true;
        let mut deadline_passed = false;
        if let Some((sources, deadline)) = this.merge.as_mut() {
            sources.poll(cx, &mut merged);
            merge_over = sources.done();
            deadline_passed = !merge_over && deadline.as_mut().poll(cx).is_ready();
        }
        if !this.encode(items, &mut out) || overflow || !this.encode_merged(merged, &mut out) {
            let message = format!(
                "the stream sent its limit of {} events (stream.max_events)",
                this.max_events
            );
            this.cut(&mut out, "too_many_events", &message);
        } else if deadline_passed {
            this.merge = None;
            let e = FlowError::new(
                fanout_flow::ErrorKind::DeadlineExceeded,
                "route deadline exceeded while merging the streams",
            );
            this.end(&mut out, Err(e));
        } else if merge_over && let Some(outcome) = this.ending.take() {
            this.merge = None;
            this.end(&mut out, outcome);
        } else if this.drain.as_mut().poll(cx).is_ready() {
            this.cut(
                &mut out,
                "draining",
                "the gateway is shutting down; the stream ended before its flow",
            );
        }
        if !out.is_empty() {
            this.beat_armed = false;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
        }
        if let Some(every) = this.heartbeat {
            if !this.beat_armed {
                this.beat_armed = true;
                this.beat.as_mut().reset(Instant::now() + every);
            }
            if this.beat.as_mut().poll(cx).is_ready() {
                this.beat_armed = false;
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                    fanout_pass::sse::HEARTBEAT,
                )))));
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// `s` as a JSON string.
fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}
