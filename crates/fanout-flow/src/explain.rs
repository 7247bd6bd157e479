//! `fanout explain`: a route's compiled plan described for people — its steps, what each waits
//! for, which run in parallel, the timeouts against the route's deadline, the resilience layers
//! of the backends the steps call, and the worst case of the critical path.
//!
//! The description is built from the compiled [`Plan`] — dependencies as the compiler inferred
//! them from the `$names` each step reads, step kinds as compiled ([`StepWork`]) — and from the
//! config for what the plan does not keep (where each timeout comes from, each backend's retry,
//! hedge, cache, dedup, breaker and bulkhead settings). [`explain`] returns a typed
//! [`Explanation`]; [`Explanation::text`] and [`Explanation::mermaid`] render it.
//!
//! Levels: a step's level is 1 for a step that waits for nothing, else one more than the deepest
//! step it waits for. Steps of one level can run in parallel, but the executor does not wait for
//! a whole level: a step starts as soon as the steps it reads are done.
//!
//! Worst case: an HTTP step can take its timeout per call (retries and hedged copies stay within
//! the call's timeout), a keyed lookup its batch window plus the batch call's timeout, a `value`
//! or `fail` step no I/O time. The critical path is the chain of steps whose worst cases add up
//! to the most; its sum is an upper bound, not a prediction (a `for_each` step counts one round
//! of calls).

use crate::plan::{Plan, RoutePlan};
pub use crate::plan::{StepIo, StepWork};
use fanout_config::{Config, ConfigErrors};
// A duration as the config writes it, for the renderers (`explain/text.rs`, `explain/mermaid.rs`).
use fanout_config::format_duration as fmt_dur;
use fanout_expr::json;
use fanout_layers::backend::{Backend, CallError, CallErrorKind, CallRequest, CallResponse};
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

mod mermaid;
mod text;

/// The description of every route of a config.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// Routes in config order.
    pub routes: Vec<RouteExplain>,
}

/// One route's plan, described.
#[derive(Debug, Clone)]
pub struct RouteExplain {
    /// Method matched.
    pub method: String,
    /// Path pattern matched.
    pub path: String,
    /// The route's deadline (a client may shorten it).
    pub deadline: Duration,
    /// Steps in config order; `waits_for` and `levels` index into this.
    pub steps: Vec<StepExplain>,
    /// Step indices by level (level 1 first), each in config order.
    pub levels: Vec<Vec<usize>>,
    /// The critical path: the chain of steps (first to last) with the largest sum of worst
    /// cases. Empty when no step does I/O.
    pub critical: Vec<usize>,
    /// The critical path's worst case: the sum of its steps' worst cases (an upper bound).
    pub worst: Duration,
    /// Whole-request coalescing: on, off by the config, or not eligible (a step writes).
    pub coalesce: crate::plan::Coalesce,
    /// The parts of the request that key coalesced runs — exactly what the flow reads of
    /// `$request` (e.g. `$request.params`, `$request.headers["authorization"]`); empty when it
    /// reads nothing (every concurrent request shares a run).
    pub key: Vec<String>,
    /// The edge stages the route runs, in order: filled by the gateway, which knows them;
    /// empty here.
    pub edge: Vec<String>,
    /// What the edge stages say of the route, a line each (`auth: …`, `rate limit …`).
    pub edge_lines: Vec<String>,
    /// A pass-through route (`pass:`) or a WebSocket route (`websocket:`): where it forwards and
    /// its limits, instead of steps.
    pub pass: Option<String>,
}

/// The parts of `$request` that `u` names, as a flow reads them.
pub fn key_parts(u: &fanout_expr::request::RequestUse) -> Vec<String> {
    use fanout_expr::request::HeaderUse;
    let mut out = Vec::new();
    for (read, name) in [
        (u.method, "method"),
        (u.path, "path"),
        (u.params, "params"),
        (u.query, "query"),
    ] {
        if read {
            out.push(format!("$request.{name}"));
        }
    }
    match &u.headers {
        HeaderUse::None => {}
        HeaderUse::All => out.push("$request.headers (all of them)".to_string()),
        HeaderUse::Named(names) => {
            out.extend(names.iter().map(|n| format!("$request.headers[\"{n}\"]")));
        }
    }
    if u.body {
        out.push("$request.body".to_string());
    }
    if u.auth {
        out.push("$request.auth".to_string());
    }
    out
}

/// A route's authentication in words (`None` without any).
/// One step, described.
#[derive(Debug, Clone)]
pub struct StepExplain {
    /// Step name.
    pub name: String,
    /// What the step does.
    pub work: StepWork,
    /// The steps it reads (and so waits for), by index.
    pub waits_for: Vec<usize>,
    /// Its level (1: starts when the request arrives).
    pub level: usize,
    /// Whether it has a `when` condition (skipped when false; its value is then its default).
    pub conditional: bool,
    /// `for_each` with this many calls in flight at most (keyed lookups merge their keys).
    pub for_each: Option<usize>,
    /// Whether a failure falls back to `default` (the answer is then marked partial).
    pub optional: bool,
    /// The default value, as JSON text.
    pub default: String,
    /// The timeout of each call, and where it comes from; `None` for steps without I/O.
    pub timeout: Option<Timeout>,
    /// A step `timeout:` that has no effect (keyed lookups use their batch call's timeout).
    pub unused_timeout: Option<Duration>,
    /// The step's worst case (one round of calls), at most the route's deadline.
    pub worst: Duration,
    /// Whether `value`/`result` are evaluated on the compute pool.
    pub compute: bool,
    /// The resilience settings of the backend it calls, if it calls one.
    pub backend: Option<BackendExplain>,
}

/// A call timeout and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout {
    /// The timeout of one call (each call gets at most the time left before the deadline).
    pub value: Duration,
    /// Where it is set.
    pub from: TimeoutFrom,
}

/// Where a timeout is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutFrom {
    /// The step's `timeout:`.
    Step,
    /// The backend's `timeout:`.
    Backend,
    /// `defaults.timeout`.
    Defaults,
}

/// What a step's calls go through in its backend's stack (only what the config turns on and what
/// applies to the step's calls).
#[derive(Debug, Clone, Default)]
pub struct BackendExplain {
    /// Backend name.
    pub name: String,
    /// How many addresses the calls are spread over.
    pub addresses: usize,
    /// Answers (or, for keyed lookups, values per key) cached.
    pub cache: Option<CacheExplain>,
    /// Identical calls in flight share one.
    pub dedup: bool,
    /// A circuit breaker fails calls fast while the backend is failing.
    pub breaker: bool,
    /// Bulkhead: most calls in flight to the backend.
    pub max_concurrency: Option<usize>,
    /// Retries: (attempts, statuses retried).
    pub retry: Option<(u32, Vec<u16>)>,
    /// Hedging: a second copy after this delay (`None`: after the latency percentile).
    pub hedge: Option<HedgeExplain>,
    /// Configured retries or hedging that do not apply: the call is not idempotent.
    pub not_idempotent: bool,
    /// A database's pool ([`fanout_config::Backend::pool_summary`]): (max_size, max_waiters,
    /// max_wait, statement_timeout).
    pub pool: Option<(usize, usize, Duration, Duration)>,
}

/// A backend's cache settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheExplain {
    /// How long an answer is fresh.
    pub ttl: Duration,
    /// How long a stale answer is served while it is refreshed.
    pub stale_while_revalidate: Duration,
    /// How long a stale answer is served when the backend fails.
    pub stale_if_error: Duration,
}

/// When the hedged copy of a call is sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeExplain {
    /// After a fixed delay.
    Delay(Duration),
    /// After the backend's latency percentile (at least `min_delay`).
    Percentile {
        /// The percentile, e.g. 95.
        percentile: f64,
        /// The smallest delay.
        min_delay: Duration,
    },
}

/// Compile `cfg` with placeholder backends (nothing is connected or called) and describe it.
/// The config should have passed the gateway's own checks first (`fanout validate`).
pub fn explain_config(cfg: &Config) -> Result<Explanation, ConfigErrors> {
    explain_config_with(cfg, &[], None, None)
}

/// [`explain_config`] with the step kinds of `kinds` beside the engine's own
/// ([`crate::compile_with`]), for a config with `.proto` files (`protos:`) and runtimes (the
/// models of `models:`), loaded by the caller.
pub fn explain_config_with(
    cfg: &Config,
    kinds: &[crate::step::Registration],
    protos: Option<Arc<fanout_grpc::ProtoSet>>,
    runtimes: Option<crate::runtime::Runtimes>,
) -> Result<Explanation, ConfigErrors> {
    let backends: HashMap<String, Arc<dyn Backend>> = cfg
        .backends
        .keys()
        .map(|name| (name.clone(), Arc::new(NotConnected) as Arc<dyn Backend>))
        .collect();
    let carry = crate::plan::Carry {
        protos,
        runtimes: runtimes.unwrap_or_default(),
        ..Default::default()
    };
    let plan = crate::plan::compile_with(cfg, &backends, kinds, carry)?;
    Ok(explain(cfg, &plan))
}

/// Describe `plan`, compiled from `cfg`.
pub fn explain(cfg: &Config, plan: &Plan) -> Explanation {
    let routes = plan
        .routes
        .iter()
        .map(|route| {
            let src = cfg.routes.iter().find(|r| {
                r.path.value == route.path
                    && r.method.value.eq_ignore_ascii_case(route.method.as_str())
            });
            explain_route(cfg, src, route)
        })
        .collect();
    Explanation { routes }
}

impl Explanation {
    /// The routes `spec` names: a path pattern (`/orders/{id}`, every method) or a method and a
    /// path pattern (`POST /orders/{id}`; the method in any case). Empty when none matches.
    pub fn select(&self, spec: &str) -> Vec<&RouteExplain> {
        let spec = spec.trim();
        let (method, path) = match spec.split_once(char::is_whitespace) {
            Some((m, p)) => (Some(m), p.trim()),
            None => (None, spec),
        };
        self.routes
            .iter()
            .filter(|r| r.path == path && method.is_none_or(|m| m.eq_ignore_ascii_case(&r.method)))
            .collect()
    }

    /// The routes as `METHOD /path` lines (for "unknown route" messages).
    pub fn route_list(&self) -> String {
        let mut out = String::new();
        for r in &self.routes {
            let _ = writeln!(out, "  {} {}", r.method, r.path);
        }
        out
    }

    /// Every route, as text.
    pub fn text(&self) -> String {
        text::render(&self.routes.iter().collect::<Vec<_>>())
    }

    /// Every route, as one Mermaid flowchart.
    pub fn mermaid(&self) -> String {
        mermaid::render(&self.routes.iter().collect::<Vec<_>>())
    }
}

/// Render `routes` as text.
pub fn text(routes: &[&RouteExplain]) -> String {
    text::render(routes)
}

/// Render `routes` as one Mermaid flowchart (one subgraph per route when there are several).
pub fn mermaid(routes: &[&RouteExplain]) -> String {
    mermaid::render(routes)
}

fn explain_route(
    cfg: &Config,
    src: Option<&fanout_config::Route>,
    route: &RoutePlan,
) -> RouteExplain {
    let mut steps: Vec<StepExplain> = route
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let step_src = src.and_then(|r| r.flow.get_index(i)).map(|(_, s)| s);
            let work = s.work();
            let timeout = timeout_of(cfg, step_src, &work, s.timeout);
            let worst = worst_case(&work, timeout).min(route.deadline);
            StepExplain {
                name: s.name.to_string(),
                backend: backend_of(cfg, &work),
                unused_timeout: match &work.io {
                    StepIo::Keyed { .. } => step_src.and_then(|s| s.timeout).map(|d| d.0),
                    _ => None,
                },
                work,
                waits_for: s.deps.clone(),
                level: 0,
                conditional: s.when.is_some(),
                for_each: s.for_each.as_ref().map(|_| s.concurrency),
                optional: s.optional,
                default: json::to_string(&s.default),
                timeout,
                worst,
                compute: s.compute,
            }
        })
        .collect();
    let levels = levels(&mut steps);
    let (critical, worst) = critical_path(&steps, &levels);
    RouteExplain {
        method: route.method.to_string(),
        path: route.path.clone(),
        deadline: route.deadline,
        steps,
        levels,
        critical,
        worst,
        coalesce: route.coalesce.clone(),
        key: key_parts(&route.request_use),
        edge: Vec::new(),
        edge_lines: Vec::new(),
        pass: src.and_then(|r| r.pass.as_ref()).map(|p| {
            let messages = p
                .max_message_bytes
                .unwrap_or(cfg.server.grpc.max_message_bytes);
            let body = match (p.max_body_bytes, &route.grpc) {
                (Some(b), _) => format!("request bodies up to {b} bytes"),
                (None, Some(_)) => "request streams unbounded as a whole".to_string(),
                (None, None) => format!(
                    "request bodies up to {} bytes",
                    cfg.server.max_body_bytes
                ),
            };
            let grpc = match &route.grpc {
                Some(g) => {
                    let d = &g.method.desc;
                    let kind = match (d.is_client_streaming(), d.is_server_streaming()) {
                        (true, true) => "bidi-streaming",
                        (true, false) => "client-streaming",
                        (false, true) => "server-streaming",
                        (false, false) => "unary",
                    };
                    format!("; gRPC {kind} method, messages passed as they come, each up to {messages} bytes")
                }
                None => String::new(),
            };
            format!(
                "pass-through to backend `{}`, path {}; the answer streamed back as it is; \
                 timeout {}, idle_timeout {}, {body}; event streams: heartbeat {}, ended \
                 after {} without a byte from the backend{grpc}",
                p.backend.value,
                p.path
                    .as_ref()
                    .map_or("as it came".to_string(), |t| format!("`{}`", t.value)),
                fmt_dur(p.timeout.0),
                fmt_dur(p.idle_timeout.0),
                p.sse
                    .heartbeat(p.idle_timeout)
                    .map_or("none".to_string(), fmt_dur),
                fmt_dur(p.sse.idle_timeout.0),
            )
        })
            .or_else(|| {
                src.and_then(|r| r.websocket.as_ref()).map(|w| {
                let origins = match w.origins.as_slice() {
                    [] => "the gateway's own origin".to_string(),
                    o => o.join(", "),
                };
                let ping = match w.ping_interval.0.is_zero() {
                    true => "no pings".to_string(),
                    false => format!("a ping every {}", fmt_dur(w.ping_interval.0)),
                };
                format!(
                    "WebSocket relayed to backend `{}`, path {}; origins: {origins}; messages up \
                     to {} bytes (frames {}); idle_timeout {}, {ping}; at most {} open",
                    w.backend.value,
                    w.path
                        .as_ref()
                        .map_or("as it came".to_string(), |t| format!("`{}`", t.value)),
                    w.max_message_bytes,
                    w.frame_limit(),
                    fmt_dur(w.idle_timeout.0),
                    w.max_connections,
                )
            })
            }),
    }
}

/// The timeout of each of a step's calls and where it is set; `None` without I/O.
fn timeout_of(
    cfg: &Config,
    step: Option<&fanout_config::Step>,
    work: &StepWork,
    compiled: Duration,
) -> Option<Timeout> {
    let backend_timeout = |b: &str| cfg.backends.get(b).and_then(|b| b.timeout);
    let (value, from) = match &work.io {
        StepIo::None | StepIo::Guard { .. } | StepIo::Compute { .. } => return None,
        StepIo::Keyed {
            backend, timeout, ..
        } => match backend_timeout(backend) {
            Some(_) => (*timeout, TimeoutFrom::Backend),
            None => (*timeout, TimeoutFrom::Defaults),
        },
        StepIo::Calls { backend, .. } => {
            let from = if step.is_some_and(|s| s.timeout.is_some()) {
                TimeoutFrom::Step
            } else if backend_timeout(backend).is_some() {
                TimeoutFrom::Backend
            } else {
                TimeoutFrom::Defaults
            };
            (compiled, from)
        }
    };
    Some(Timeout { value, from })
}

/// A step's worst case for one round of calls (before the deadline caps it).
fn worst_case(work: &StepWork, timeout: Option<Timeout>) -> Duration {
    let t = timeout.map(|t| t.value).unwrap_or_default();
    match &work.io {
        StepIo::Keyed { window, .. } => window.unwrap_or_default() + t,
        _ => t,
    }
}

/// The layers of the step's backend that apply to its calls.
fn backend_of(cfg: &Config, work: &StepWork) -> Option<BackendExplain> {
    let (name, idempotent, get) = match &work.io {
        StepIo::Calls {
            backend,
            idempotent,
            writes,
        } => (backend, *idempotent, writes.is_none()),
        // Batch lookups are idempotent; values are cached per key whatever the method.
        StepIo::Keyed { backend, .. } => (backend, true, true),
        StepIo::None | StepIo::Guard { .. } | StepIo::Compute { .. } => return None,
    };
    let b = cfg.backends.get(name)?;
    let resilient = b.retry.is_some() || b.hedge.is_some();
    Some(BackendExplain {
        name: name.clone(),
        addresses: b.urls.len() + usize::from(b.url.is_some()),
        cache: b.cache.as_ref().filter(|_| get).map(|c| CacheExplain {
            ttl: c.ttl.0,
            stale_while_revalidate: c.stale_while_revalidate.0,
            stale_if_error: c.stale_if_error.0,
        }),
        dedup: b.dedup.unwrap_or(cfg.defaults.dedup) && get,
        breaker: b.breaker.is_some(),
        max_concurrency: b.max_concurrency,
        retry: b
            .retry
            .as_ref()
            .filter(|_| idempotent)
            .map(|r| (r.attempts, r.on_status.clone())),
        hedge: b
            .hedge
            .as_ref()
            .filter(|_| idempotent)
            .map(|h| match h.delay {
                Some(d) => HedgeExplain::Delay(d.0),
                None => HedgeExplain::Percentile {
                    percentile: h.percentile,
                    min_delay: h.min_delay.0,
                },
            }),
        not_idempotent: resilient && !idempotent,
        pool: b.pool_summary(),
    })
}

/// Assign each step its level (1 + the deepest step it waits for) and group the steps by level.
fn levels(steps: &mut [StepExplain]) -> Vec<Vec<usize>> {
    let n = steps.len();
    let mut level = vec![0usize; n];
    // The graph has no cycle (the compiler checked), so n passes settle every level.
    for _ in 0..n {
        let mut changed = false;
        for i in 0..n {
            let l = 1 + steps[i]
                .waits_for
                .iter()
                .map(|&d| level[d])
                .max()
                .unwrap_or(0);
            if l != level[i] {
                level[i] = l;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let depth = level.iter().copied().max().unwrap_or(0);
    let mut by_level = vec![Vec::new(); depth];
    for (i, s) in steps.iter_mut().enumerate() {
        s.level = level[i];
        if let Some(l) = by_level.get_mut(level[i].saturating_sub(1)) {
            l.push(i);
        }
    }
    by_level
}

/// The chain with the largest sum of worst cases (first in config order on ties), and that sum.
fn critical_path(steps: &[StepExplain], levels: &[Vec<usize>]) -> (Vec<usize>, Duration) {
    let n = steps.len();
    let mut total = vec![Duration::ZERO; n];
    let mut via: Vec<Option<usize>> = vec![None; n];
    for &i in levels.iter().flatten() {
        let mut best: Option<usize> = None;
        for &d in &steps[i].waits_for {
            if best.is_none_or(|b| total[d] > total[b]) {
                best = Some(d);
            }
        }
        total[i] = steps[i].worst + best.map(|b| total[b]).unwrap_or_default();
        via[i] = best;
    }
    let mut end: Option<usize> = None;
    for i in 0..n {
        if total[i] > Duration::ZERO && end.is_none_or(|e| total[i] > total[e]) {
            end = Some(i);
        }
    }
    let Some(end) = end else {
        return (Vec::new(), Duration::ZERO);
    };
    let mut path = vec![end];
    let mut at = end;
    while let Some(prev) = via[at] {
        path.push(prev);
        at = prev;
    }
    path.reverse();
    (path, total[end])
}

/// The backends of [`explain_config`]'s plan: the plan is never run, so they are never called.
struct NotConnected;

impl Backend for NotConnected {
    fn call(&self, _req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        Box::pin(async {
            Err(CallError::new(
                CallErrorKind::Connect,
                "a plan compiled for `fanout explain` makes no calls",
            ))
        })
    }
}
