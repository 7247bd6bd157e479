//! Shared support of the engine's integration tests: a scripted in-memory backend and helpers to
//! compile a YAML config and run one of its routes.
//!
//! Every backend of a [`World`] answers from a script: per backend and path, a status and JSON
//! body (or a transport error) after a latency slept with `tokio::time::sleep` — so under
//! `#[tokio::test(start_paused = true)]` time is virtual and a test asserts exact instants, never
//! wall time. The world records every call: backend, what was sent, the virtual time it started,
//! and how it ended (answered, or dropped by the caller while in flight), plus the most calls in
//! flight at once per backend.
//!
//! The plan's compute pool is deliberately left unstarted, as in the engine benchmark: an
//! unstarted pool runs its jobs inline on the caller, so everything stays on the test's one
//! thread. A started pool would run jobs on OS threads, and while the test task waited for one
//! the paused clock would auto-advance to the next timer — virtual times would then depend on
//! thread scheduling.
// Each test file uses part of this module.
#![allow(dead_code)]

use bytes::Bytes;
use fanout_config::{Config, ConfigErrors};
use fanout_expr::json::from_serde;
use fanout_expr::request::{RequestParts, request_val};
use fanout_flow::{
    Backend, CallError, CallErrorKind, CallRequest, CallResponse, FlowError, Outcome, Plan,
    RoutePlan, compile,
};
use futures_util::future::BoxFuture;
use http::StatusCode;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// The file name errors of test configs carry.
pub const FILE: &str = "engine.yaml";

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What a scripted path answers, and after how long.
#[derive(Debug, Clone)]
pub struct Reply {
    outcome: Result<(u16, Bytes), CallErrorKind>,
    latency: Duration,
}

/// 200 with this body (JSON text), at once.
pub fn ok(body: &str) -> Reply {
    status(200, body)
}

/// This status and body, at once.
pub fn status(code: u16, body: &str) -> Reply {
    Reply {
        outcome: Ok((code, Bytes::copy_from_slice(body.as_bytes()))),
        latency: Duration::ZERO,
    }
}

/// A transport failure of this kind, at once.
pub fn transport(kind: CallErrorKind) -> Reply {
    Reply {
        outcome: Err(kind),
        latency: Duration::ZERO,
    }
}

impl Reply {
    /// The same answer after `latency` (virtual time).
    pub fn after(mut self, latency: Duration) -> Reply {
        self.latency = latency;
        self
    }
}

/// How a recorded call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Still running.
    InFlight,
    /// The scripted answer was returned.
    Answered,
    /// The caller dropped the call's future before the answer (deadline, timeout, failure).
    Dropped,
}

/// One call a backend of the world received.
#[derive(Debug, Clone)]
pub struct Call {
    /// Backend name.
    pub backend: String,
    /// Method sent.
    pub method: String,
    /// Path and query sent.
    pub path: String,
    /// Body sent (UTF-8, lossy).
    pub body: String,
    /// The time the call was given (`CallRequest::timeout`).
    pub timeout: Duration,
    /// Virtual time since the world was made when the call started.
    pub started: Duration,
    /// Virtual time when it ended (answered or dropped).
    pub ended: Option<Duration>,
    /// How it ended.
    pub end: End,
}

#[derive(Default)]
struct State {
    /// (backend, path pattern, reply): patterns are exact paths, or prefixes ending in `*`.
    scripts: Vec<(String, String, Reply)>,
    calls: Vec<Call>,
    /// Per backend: (in flight now, most in flight at once).
    in_flight: HashMap<String, (usize, usize)>,
}

/// Scripted backends sharing one script and one call log.
#[derive(Clone)]
pub struct World {
    t0: Instant,
    state: Arc<Mutex<State>>,
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

impl World {
    /// An empty world; its clock starts now.
    pub fn new() -> World {
        World {
            t0: Instant::now(),
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the log from the others.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Script what `backend` answers on `path` (the path without query; a pattern ending in `*`
    /// matches every path with that prefix). A later script of the same pattern replaces it.
    pub fn script(&self, backend: &str, path: &str, reply: Reply) -> &World {
        let mut st = self.state();
        st.scripts.retain(|(b, p, _)| !(b == backend && p == path));
        st.scripts.push((backend.into(), path.into(), reply));
        self
    }

    /// Virtual time since the world was made.
    pub fn now(&self) -> Duration {
        Instant::now() - self.t0
    }

    /// Every call so far, in the order they started.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// `(start time, "backend path")` of every call, sorted by time then text: calls started at
    /// the same instant compare equal whatever order the executor polled them in.
    pub fn timeline(&self) -> Vec<(Duration, String)> {
        let mut t: Vec<(Duration, String)> = self
            .calls()
            .into_iter()
            .map(|c| (c.started, format!("{} {}", c.backend, c.path)))
            .collect();
        t.sort();
        t
    }

    /// The one call whose path and query is `path`; panics unless there is exactly one.
    pub fn call(&self, path: &str) -> Call {
        let found: Vec<Call> = self
            .calls()
            .into_iter()
            .filter(|c| c.path == path)
            .collect();
        assert_eq!(found.len(), 1, "calls to {path}: {:?}", self.calls());
        found.into_iter().next().unwrap()
    }

    /// Most calls in flight at once to `backend`.
    pub fn max_in_flight(&self, backend: &str) -> usize {
        self.state().in_flight.get(backend).map_or(0, |x| x.1)
    }

    /// A backend of this world named `name`.
    pub fn backend(&self, name: &str) -> Arc<dyn Backend> {
        Arc::new(Scripted {
            name: name.into(),
            world: self.clone(),
        })
    }

    fn reply_for(&self, backend: &str, path: &str) -> Reply {
        let path = path.split('?').next().unwrap_or(path);
        let st = self.state();
        let mine = || st.scripts.iter().filter(|(b, _, _)| b == backend);
        let exact = mine().find(|(_, p, _)| p == path);
        let prefix = mine()
            .filter(|(_, p, _)| p.strip_suffix('*').is_some_and(|pre| path.starts_with(pre)))
            .max_by_key(|(_, p, _)| p.len());
        match exact.or(prefix) {
            Some((_, _, r)) => r.clone(),
            None => panic!("no script for backend `{backend}`, path `{path}`"),
        }
    }

    /// Record the start of a call; the guard records its end.
    fn start(&self, backend: &str, req: &CallRequest) -> CallGuard {
        let now = self.now();
        let mut st = self.state();
        let index = st.calls.len();
        st.calls.push(Call {
            backend: backend.into(),
            method: req.as_http().unwrap().method.to_string(),
            path: req.as_http().unwrap().path_and_query.to_string(),
            body: String::from_utf8_lossy(&req.as_http().unwrap().body).into_owned(),
            timeout: req.timeout,
            started: now,
            ended: None,
            end: End::InFlight,
        });
        let n = st.in_flight.entry(backend.into()).or_default();
        n.0 += 1;
        n.1 = n.1.max(n.0);
        CallGuard {
            world: self.clone(),
            index,
            answered: false,
        }
    }
}

/// Records how a call ended when its future completes or is dropped.
struct CallGuard {
    world: World,
    index: usize,
    answered: bool,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let now = self.world.now();
        let mut st = self.world.state();
        let call = &mut st.calls[self.index];
        call.ended = Some(now);
        call.end = if self.answered {
            End::Answered
        } else {
            End::Dropped
        };
        let backend = call.backend.clone();
        if let Some(n) = st.in_flight.get_mut(&backend) {
            n.0 -= 1;
        }
    }
}

/// A backend answering from its world's script.
struct Scripted {
    name: String,
    world: World,
}

impl Scripted {
    async fn answer(
        world: World,
        name: String,
        req: CallRequest,
    ) -> Result<CallResponse, CallError> {
        let reply = world.reply_for(&name, req.as_http().unwrap().path_and_query.as_str());
        let mut guard = world.start(&name, &req);
        tokio::time::sleep(reply.latency).await;
        guard.answered = true;
        match reply.outcome {
            Ok((code, body)) => Ok(CallResponse {
                status: StatusCode::from_u16(code).expect("scripted status"),
                body,
                value: None,
                parsed: None,
            }),
            Err(kind) => Err(CallError::new(kind, "scripted transport failure")),
        }
    }
}

// The one implementation of `Backend` in the tests.
impl Backend for Scripted {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        Box::pin(Scripted::answer(self.world.clone(), self.name.clone(), req))
    }
}

/// Load a config from YAML text (no `${VAR}` is set).
pub fn load(yaml: &str) -> Result<Config, ConfigErrors> {
    Config::from_yaml(FILE, yaml, &|_: &str| None)
}

/// Load and compile a config; every backend it declares is a backend of `world`.
pub fn compile_in(yaml: &str, world: &World) -> Result<Plan, ConfigErrors> {
    let cfg = load(yaml)?;
    let backends: HashMap<String, Arc<dyn Backend>> = cfg
        .backends
        .keys()
        .map(|name| (name.clone(), world.backend(name)))
        .collect();
    compile(&cfg, &backends)
}

/// The text of config errors (what `fanout validate` prints); panics if the config compiles.
pub fn compile_errors(yaml: &str) -> String {
    match compile_in(yaml, &World::new()) {
        Ok(_) => panic!("the config compiled"),
        Err(e) => e.to_string(),
    }
}

/// The 1-based line:column of the first occurrence of `needle` in `text`.
pub fn line_col(text: &str, needle: &str) -> String {
    let at = text.find(needle).expect("needle in text");
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{line}:{col}")
}

/// An inbound request for a route.
#[derive(Debug, Clone)]
pub struct Req {
    method: String,
    route: String,
    query: Option<String>,
    params: Vec<(String, String)>,
    body: serde_json::Value,
}

impl Req {
    /// `GET` of the route with this path pattern.
    pub fn get(route: &str) -> Req {
        Req {
            method: "GET".into(),
            route: route.into(),
            query: None,
            params: Vec::new(),
            body: serde_json::Value::Null,
        }
    }
    /// The raw query string (without `?`).
    pub fn query(mut self, q: &str) -> Req {
        self.query = Some(q.into());
        self
    }
    /// A path parameter.
    pub fn param(mut self, name: &str, value: &str) -> Req {
        self.params.push((name.into(), value.into()));
        self
    }
    /// The `$request` value.
    pub fn val(&self) -> fanout_expr::Val {
        let headers = std::iter::empty::<(&str, &[u8])>();
        request_val(
            RequestParts::new(&self.method, &self.route, self.query.as_deref(), headers)
                .with_params(self.params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .with_body(from_serde(&self.body)),
        )
    }
}

/// A compiled config over a world's backends.
pub struct Flow {
    /// The plan.
    pub plan: Plan,
    /// Its backends.
    pub world: World,
}

impl Flow {
    /// Compile `yaml` against a new world; panics on config errors.
    pub fn new(yaml: &str) -> Flow {
        let world = World::new();
        match compile_in(yaml, &world) {
            Ok(plan) => Flow { plan, world },
            Err(e) => panic!("config errors:\n{e}"),
        }
    }

    /// Script an answer (see [`World::script`]).
    pub fn script(&self, backend: &str, path: &str, reply: Reply) -> &Flow {
        self.world.script(backend, path, reply);
        self
    }

    /// The route with this method and path pattern.
    pub fn route(&self, method: &str, path: &str) -> Arc<RoutePlan> {
        let r = self
            .plan
            .routes
            .iter()
            .find(|r| r.method.as_str() == method && r.path == path);
        match r {
            Some(r) => r.clone(),
            None => panic!("no route {method} {path}"),
        }
    }

    /// Run `req` on its route with the route's full deadline, from now.
    pub async fn run(&self, req: Req) -> Result<Outcome, FlowError> {
        let route = self.route(&req.method, &req.route);
        let deadline = Instant::now() + route.deadline;
        route.run(req.val(), deadline).await
    }
}

/// An outcome's body as JSON.
pub fn body(out: &Outcome) -> serde_json::Value {
    serde_json::from_slice(&out.body).expect("the body is JSON")
}

/// An outcome's header, as text.
pub fn header(out: &Outcome, name: &str) -> Option<String> {
    out.headers
        .iter()
        .find(|(k, _)| k.as_str() == name)
        .and_then(|(_, v)| v.to_str().ok())
        .map(str::to_string)
}

/// `(status, code, step)` of a failed request, as the client sees them.
pub fn error_of(e: &FlowError) -> (u16, String, Option<String>) {
    (
        e.status(),
        e.code().to_string(),
        e.step.as_deref().map(str::to_string),
    )
}
