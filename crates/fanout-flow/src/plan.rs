//! The flow compiler: config → execution plan. Does no I/O.
//!
//! Every expression is compiled here, once; step dependencies are inferred from the `$names` the
//! expressions read; unknown references and cycles are reported with their line:column. The
//! per-request executor (`exec`) only reads the resulting [`Plan`].

use crate::batch::BatchPlan;
pub use crate::call::HttpPlan;
use crate::ctx::{Ctx, unknown_backend};
use crate::reference::{Dataset, ReferenceSet};
use crate::step::{CallSrc, StepCx, StepKind, compile_call};
use fanout_config::{
    Config, ConfigError, ConfigErrors, ExprSrc, Located, MissingPolicy, StatusAction,
    StatusPattern, StatusSrc, Step,
};
use fanout_expr::{Expr, Val, json};
use fanout_layers::backend::Backend;
use fanout_runtime::compute::ComputePool;
use http::Method;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use crate::call::{FIRST_STEP_SLOT, SLOT_INDEX, SLOT_ITEM, SLOT_REF, SLOT_REQUEST};
pub use crate::respond::{RespondPlan, StatusPlan};
pub use crate::step::{StepIo, StepWork};

/// A compiled config: routes ready to run.
pub struct Plan {
    /// Routes in config order.
    pub routes: Vec<Arc<RoutePlan>>,
    /// Batch forms by backend name, shared by every route (cross-request merging needs one).
    pub batches: HashMap<String, Arc<BatchPlan>>,
    /// Reference datasets (loaded and refreshed by the server, read as `$ref`).
    pub reference: Arc<ReferenceSet>,
    /// The compute pool shared by every route (started by the server).
    pub compute: Arc<ComputePool>,
    /// The `.proto` files the plan was compiled with (gRPC routes, steps, server reflection).
    pub protos: Arc<fanout_grpc::ProtoSet>,
    /// The runtimes the plan was compiled with (started by the server:
    /// [`crate::runtime::Runtimes::start`]).
    pub runtimes: crate::runtime::Runtimes,
}

/// What a gRPC route (`grpc:`) serves: the method, its request and answer types.
pub struct GrpcRoute {
    /// The method (`/package.Service/Method`, its codecs).
    pub method: fanout_grpc::MethodInfo,
}

/// One route's plan.
pub struct RoutePlan {
    /// Position in [`Plan::routes`] (config order): an index for per-route tables kept beside
    /// the plan (the gateway's metric handles).
    pub index: usize,
    /// Method matched.
    pub method: Method,
    /// Path pattern matched.
    pub path: String,
    /// Maximum deadline (a client can shorten it, not extend it).
    pub deadline: Duration,
    /// `server_timing: true`: answers carry a `Server-Timing` header with each step's time.
    pub server_timing: bool,
    /// Steps, in config order; `deps`/`dependents` index into this.
    pub steps: Vec<Arc<StepPlan>>,
    /// Steps with no dependencies (started first).
    pub roots: Vec<usize>,
    /// The response.
    pub respond: Arc<RespondPlan>,
    /// Budgets of expression evaluation per request (`server.expressions`).
    pub limits: fanout_expr::EvalLimits,
    /// Reference data, read once per request as `$ref`.
    pub reference: Arc<ReferenceSet>,
    /// The compute pool (`compute: true` steps).
    pub compute: Arc<ComputePool>,
    /// The gRPC method the route serves, if it is a `grpc:` route.
    pub grpc: Option<GrpcRoute>,
    /// The parts of `$request` the route's expressions read: the only parts built per request.
    pub request_use: fanout_expr::request::RequestUse,
    /// The path parameters' names as `$request.params` keys, made once ([`RoutePlan::param_key`]).
    pub param_keys: Vec<(Box<str>, Val)>,
    /// Whether concurrent requests that would compute the same answer share one run of the flow
    /// (the gateway keys them by the parts of `$request` in [`RoutePlan::request_use`]).
    pub coalesce: Coalesce,
    /// `stream:`: the answer is streamed as steps complete (the steps marked
    /// [`StepPlan::streamed`] tell the run's observer their values); `None` for every other
    /// route.
    pub stream: Option<Arc<fanout_config::StreamAnswer>>,
}

impl RoutePlan {
    /// Whether concurrent identical requests share one run of the flow.
    pub fn coalesces(&self) -> bool {
        matches!(self.coalesce, Coalesce::On)
    }

    /// Path parameter `name`'s key in `$request.params`: the route's, made once (a reference
    /// count per request), or made now for a name the route's pattern does not have.
    pub fn param_key(&self, name: &str) -> Val {
        match self.param_keys.iter().find(|(n, _)| &**n == name) {
            Some((_, k)) => k.clone(),
            None => json::str_val(name),
        }
    }
}

/// A route's whole-request coalescing (`coalesce:`), as compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coalesce {
    /// On: every step only reads, and the config does not turn it off.
    On,
    /// Off by the config (`coalesce: false`).
    Off,
    /// Not eligible: a step writes (named, with what it does), so requests never share a run.
    Writes {
        /// The first step that writes.
        step: String,
        /// What it does, e.g. "a POST call to `orders`".
        what: String,
    },
}

/// The first step of `steps` whose calls are not safe to share (they may write), with what it
/// does; `None` when every step only reads: GET/HEAD `http` calls, gRPC methods without side
/// effects, read-only `sql`, keyed lookups (batch forms are read-only), models, values, guards.
pub fn first_writer(steps: &[Arc<StepPlan>]) -> Option<(String, String)> {
    steps.iter().find_map(|s| {
        let StepIo::Calls {
            writes: Some(what), ..
        } = s.work().io
        else {
            return None;
        };
        Some((s.name.to_string(), what))
    })
}

/// One compiled step.
pub struct StepPlan {
    /// Step name.
    pub name: Arc<str>,
    /// Position in its route's [`RoutePlan::steps`]: an index for per-step tables kept beside
    /// the plan (the gateway's metric handles).
    pub index: usize,
    /// Indices of the steps it reads.
    pub deps: Vec<usize>,
    /// Indices of the steps that read it.
    pub dependents: Vec<usize>,
    /// `when` condition.
    pub when: Option<Expr>,
    /// `for_each` list.
    pub for_each: Option<Expr>,
    /// `for_each` concurrency bound.
    pub concurrency: usize,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Optional steps fall back to `default` on failure.
    pub optional: bool,
    /// Value when skipped or failed (optional).
    pub default: Val,
    /// Maps each answer to the step value.
    pub result: Option<Expr>,
    /// Evaluate `value`/`result` on the compute pool.
    pub compute: bool,
    /// Backend statuses mapped to client answers (`on_status`), exact statuses first.
    pub on_status: Vec<(StatusPattern, StatusAction)>,
    /// What to do with missing keys / 404 elements.
    pub missing: Missing,
    /// What the step does: its kind (`step/`).
    pub(crate) kind: Box<dyn StepKind>,
    /// A `for_each` step's equal calls that only read are made once (a GraphQL field resolved
    /// for a list of parents: [`compile_flow`]).
    pub(crate) share_calls: bool,
    /// On a streamed route (`stream:`), the step's values are told to the observer as they are
    /// ready ([`crate::observe::Observer::element`], [`crate::observe::Observer::step_value`]),
    /// and a `for_each` element that fails is left out (the step partial) instead of failing
    /// the step. False on every other route: the executor only tests this flag.
    pub streamed: bool,
}

impl StepPlan {
    /// What the step does: its kind, backend and call facts (`fanout explain`).
    pub fn work(&self) -> StepWork {
        self.kind.work()
    }

    /// The backend the step calls, if it calls one (for metrics, traces and `Server-Timing`).
    pub fn backend(&self) -> Option<&Arc<str>> {
        self.kind.backend()
    }

    /// The `error.code`s the config makes this step answer with: its `fail` code and those of
    /// its `on_status` entries (for metrics, which export each from the start). A `pass` entry's
    /// code is that of the backend's status, unknown until it answers: not listed.
    pub fn answer_codes(&self) -> Vec<Arc<str>> {
        let mut out: Vec<Arc<str>> = self
            .on_status
            .iter()
            .filter_map(|(_, a)| match a {
                StatusAction::Status(to) => Some(crate::error::answer_code(*to, None)),
                StatusAction::Answer { status, code, .. } => {
                    Some(crate::error::answer_code(*status, code.as_deref()))
                }
                StatusAction::Pass | StatusAction::Default => None,
            })
            .collect();
        if let StepIo::Guard { code, .. } = self.work().io {
            out.push(code.into());
        }
        out
    }
}

/// A step's policy for keys its lookup did not find (and 404s of `for_each` calls).
pub enum Missing {
    /// The step fails.
    Fail,
    /// The element is left out.
    Skip,
    /// The element is `null`.
    Null,
    /// The element is this expression's value (reads `$item`, `$index`).
    Value(Expr),
}

/// What a plan compiled on a config reload keeps from the plan it replaces, so that what did not
/// change keeps its state.
#[derive(Default)]
pub struct Carry {
    /// The running compute pool (its thread count is fixed at start).
    pub compute: Option<Arc<ComputePool>>,
    /// Batch forms of backends whose config did not change (their windows and per-key caches).
    pub batches: HashMap<String, Arc<BatchPlan>>,
    /// The reference data, when neither the datasets nor their backends changed.
    pub reference: Option<Arc<ReferenceSet>>,
    /// The config's `.proto` files, compiled by the caller (the flow compiler reads no file);
    /// none for a config without `protos:`.
    pub protos: Option<Arc<fanout_grpc::ProtoSet>>,
    /// The runtimes step kinds use, opened by the caller ([`crate::runtime::Runtimes::open`]
    /// with the gateway's list); none opened: a step that needs one is a config error.
    pub runtimes: crate::runtime::Runtimes,
}

/// Compile a config against the given backends (name → implementation), with the engine's own
/// step kinds only (a `sql` or `model` step is an error: [`compile_with`] is given those).
/// Reports every error it finds, each with its position.
pub fn compile(
    cfg: &Config,
    backends: &HashMap<String, Arc<dyn Backend>>,
) -> Result<Plan, ConfigErrors> {
    compile_with(cfg, backends, &[], Carry::default())
}

/// [`compile`] with the step kinds of `kinds` beside the engine's own (the gateway's list:
/// `fanout-proxy`'s `STEP_KINDS`), keeping what `carry` holds from a previous plan instead of
/// new state (everything is still compiled, so a broken part is reported even where the old
/// state is kept).
pub fn compile_with(
    cfg: &Config,
    backends: &HashMap<String, Arc<dyn Backend>>,
    kinds: &[crate::step::Registration],
    carry: Carry,
) -> Result<Plan, ConfigErrors> {
    let compute = carry
        .compute
        .unwrap_or_else(|| Arc::new(ComputePool::from_config(&cfg.server.compute)));
    let mut cx = Ctx {
        cfg,
        protos: carry.protos.unwrap_or_default(),
        errs: Vec::new(),
        compute,
        request_use: Default::default(),
        route_key: String::new(),
        runtimes: carry.runtimes.clone(),
    };
    let runtimes = carry.runtimes;
    let mut batches = compile_batches(&mut cx, backends);
    for (name, kept) in carry.batches {
        if let Some(b) = batches.get_mut(&name) {
            *b = kept;
        }
    }
    let datasets = compile_references(&mut cx, backends);
    let reference = match carry.reference {
        Some(kept) => kept,
        None => Arc::new(ReferenceSet::new(datasets)),
    };
    let given = Given {
        backends,
        batches: &batches,
        kinds,
    };
    let mut routes = Vec::new();
    for r in &cfg.routes {
        if let Some(mut route) = compile_route(&mut cx, r, &given, &reference) {
            route.index = routes.len();
            routes.push(Arc::new(route));
        }
    }
    if cx.errs.is_empty() {
        Ok(Plan {
            routes,
            batches,
            reference,
            compute: cx.compute.clone(),
            protos: cx.protos.clone(),
            runtimes,
        })
    } else {
        Err(ConfigErrors(
            cx.errs.into_iter().map(|e| e.in_file(&cfg.file)).collect(),
        ))
    }
}

/// The batch forms of the backends (`backends.*.batch`), by backend name.
fn compile_batches(
    cx: &mut Ctx<'_>,
    backends: &HashMap<String, Arc<dyn Backend>>,
) -> HashMap<String, Arc<BatchPlan>> {
    let cfg = cx.cfg;
    let mut batches = HashMap::new();
    for (name, b) in &cfg.backends {
        let (Some(bc), Some(backend)) = (&b.batch, backends.get(name)) else {
            continue;
        };
        let src = CallSrc {
            backend_name: name,
            method: &bc.method,
            path: Some(&bc.path),
            query: &bc.query,
            headers: None,
            body: bc.body.as_ref(),
            idempotent: Some(true),
        };
        let call = compile_call(cx, &["keys"], src, Some(backend.clone()), &mut |_, _| {});
        let split = cx.expr(&bc.split, &["keys"]);
        if bc.max == 0 {
            cx.errs.push(ConfigError::at(
                bc.split.pos,
                format!("backend `{name}`: batch.max must be at least 1"),
            ));
        }
        let (Some(call), Some(split)) = (call, split) else {
            continue;
        };
        let timeout = b.timeout.unwrap_or(cfg.defaults.timeout).0;
        let window = bc.window.map(|w| w.0);
        let plan = BatchPlan::new(call, split, bc.max, window, timeout);
        let plan = match &b.cache {
            Some(c) => plan.with_cache(fanout_layers::cache::CachePolicy::from(c)),
            None => plan,
        };
        batches.insert(name.clone(), Arc::new(plan));
    }
    batches
}

/// The reference datasets (`reference.*`): no request and no steps exist for them, so their
/// expressions have an empty scope.
fn compile_references(
    cx: &mut Ctx<'_>,
    backends: &HashMap<String, Arc<dyn Backend>>,
) -> Vec<Dataset> {
    let cfg = cx.cfg;
    let mut datasets = Vec::new();
    for (name, r) in &cfg.reference {
        let h = &r.http;
        let backend = backends.get(&h.backend.value).cloned();
        if backend.is_none() {
            let prefix = format!("reference `{name}`: ");
            let e = unknown_backend(cfg, h.backend.pos, &prefix, &h.backend.value);
            cx.errs.push(e);
        }
        if let Some(k) = &h.key {
            cx.errs.push(
                ConfigError::at(
                    k.pos,
                    format!("reference `{name}`: `http.key` cannot be used for reference data"),
                )
                .hint("a dataset is fetched by `path`; `key` looks keys up for a request's steps"),
            );
        }
        if h.path.is_none() {
            cx.errs.push(ConfigError::at(
                h.backend.pos,
                format!("reference `{name}`: `http` needs `path`"),
            ));
            continue;
        }
        // Reference data is read-only: idempotent unless the config says otherwise.
        let src = CallSrc {
            idempotent: Some(h.idempotent.unwrap_or(true)),
            ..CallSrc::of(h)
        };
        let call = compile_call(cx, &[], src, backend, &mut |_, _| {});
        let result = r.result.as_ref().and_then(|e| cx.expr(e, &[]));
        let Some(call) = call else {
            continue;
        };
        let timeout = cfg
            .backends
            .get(&h.backend.value)
            .and_then(|b| b.timeout)
            .unwrap_or(cfg.defaults.timeout)
            .0;
        datasets.push(Dataset {
            name: name.as_str().into(),
            call,
            result,
            refresh: r.refresh.0,
            optional: r.optional,
            timeout,
        });
    }
    datasets
}

/// What every step of every route is compiled against: the backends, their batch forms, and the
/// step kinds beside the engine's own.
struct Given<'g> {
    backends: &'g HashMap<String, Arc<dyn Backend>>,
    batches: &'g HashMap<String, Arc<BatchPlan>>,
    kinds: &'g [crate::step::Registration],
}

fn compile_route(
    cx: &mut Ctx<'_>,
    r: &fanout_config::Route,
    given: &Given<'_>,
    reference: &Arc<ReferenceSet>,
) -> Option<RoutePlan> {
    match &r.graphql {
        // A GraphQL route is a flow of one step, `graphql`, of the kind a crate brings
        // (`fanout-graphql`): the step runs the operation and gives the answer's status, type
        // and body.
        Some(_) => {
            let r = graphql_flow(r)?;
            compile_route_in(cx, &r, given, reference, &ROUTE_SCOPE, false)
        }
        None => compile_route_in(cx, r, given, reference, &ROUTE_SCOPE, false),
    }
}

/// The names a route's expressions read before its steps' (slots 0–3).
const ROUTE_SCOPE: [&str; 4] = ["request", "item", "index", "ref"];

/// A GraphQL route as the flow the compiler compiles: one step `graphql` (its kind finds the
/// route's `graphql:` by the step's key) answering with the value it gives.
fn graphql_flow(r: &fanout_config::Route) -> Option<fanout_config::Route> {
    let step: Step = serde_json::from_value(serde_json::json!({})).ok()?;
    let mut r = r.clone();
    r.flow
        .insert(fanout_config::Located::unknown("graphql".to_string()), step);
    let at = r.path.pos;
    let located = |s: &str| fanout_config::Located {
        pos: at,
        used: at,
        ..fanout_config::Located::unknown(s.to_string())
    };
    r.respond = Some(fanout_config::Respond {
        body: located("$graphql.body"),
        status: StatusSrc::Expr(located("$graphql.status")),
        headers: [
            ("content-type".to_string(), located("$graphql.type")),
            // a cost budget's refusal (null, and so no header, otherwise)
            ("retry-after".to_string(), located("$graphql.retry_after")),
        ]
        .into_iter()
        .collect(),
    });
    Some(r)
}

/// Compile `r` as a flow of its own inside a step kind's compilation (a GraphQL field's
/// resolver), with the backends, batch forms and step kinds of this compilation (errors
/// reported in `sc`, at their positions). Its expressions read `base` as the names of slots
/// 0–3 (`["request", "parent", "index", "ref"]` makes a `for_each` element `$parent`); with
/// `share_calls`, a `for_each` step's equal calls that only read are made once per run, and
/// the flow's answer is kept as a value ([`crate::Outcome`]'s `value`). Reference data
/// (`$ref`) is `null` there.
pub fn compile_flow(
    sc: &mut StepCx<'_, '_>,
    r: &fanout_config::Route,
    base: &[&str; 4],
    share_calls: bool,
) -> Option<RoutePlan> {
    let given = Given {
        backends: sc.backends,
        batches: sc.batches,
        kinds: sc.kinds,
    };
    let reference = Arc::new(ReferenceSet::new(Vec::new()));
    let cx = &mut *sc.cx;
    let (use_before, key_before) = (
        std::mem::take(&mut cx.request_use),
        std::mem::take(&mut cx.route_key),
    );
    let out = compile_route_in(cx, r, &given, &reference, base, share_calls);
    cx.request_use = use_before;
    cx.route_key = key_before;
    out
}

fn compile_route_in(
    cx: &mut Ctx<'_>,
    r: &fanout_config::Route,
    given: &Given<'_>,
    reference: &Arc<ReferenceSet>,
    base: &[&str; 4],
    share_calls: bool,
) -> Option<RoutePlan> {
    let errs_before = cx.errs.len();
    cx.request_use = Default::default();
    let method = cx.method(&r.method);
    if let Some(m) = &method {
        cx.route_key = format!("{m} {}", r.path.value);
    }
    let names: Vec<&str> = r.flow.keys().map(|k| k.value.as_str()).collect();
    let mut scope: Vec<&str> = base.to_vec();
    scope.extend(names.iter().copied());
    let defaults = &cx.cfg.defaults;

    let mut steps = Vec::with_capacity(r.flow.len());
    for (i, (name, step)) in r.flow.iter().enumerate() {
        if let Some(mut s) = compile_step(cx, i, name, step, &scope, given) {
            s.share_calls = share_calls;
            steps.push(s);
        }
    }
    // A pass-through route (`pass:`, no flow) answers with its backend's answer, not a
    // `respond`: its plan answers `null` (routing, stages and metrics need the plan).
    let none = fanout_config::Respond {
        body: fanout_config::Located::unknown("null".to_string()),
        status: Default::default(),
        headers: Default::default(),
    };
    let respond_src = r.respond.as_ref().unwrap_or(&none);
    let respond = compile_respond(cx, respond_src, &scope);
    let grpc = r.grpc.as_ref().and_then(|g| {
        // A pass-through route forwards the messages as they are: any method, streaming too.
        let method = crate::step::grpc_method(cx, g, "route", r.pass.is_some())?;
        if r.pass.is_none() {
            crate::step::check_message_fields(
                cx,
                &respond_src.body,
                &method.output,
                "respond.body",
            );
        }
        Some(GrpcRoute { method })
    });
    if cx.errs.len() > errs_before {
        return None;
    }
    // Dependencies and cycles.
    let n = steps.len();
    for i in 0..n {
        for &d in &steps[i].deps.clone() {
            steps[d].dependents.push(i);
        }
    }
    if let Some(cycle) = find_cycle(&steps) {
        let first = cycle[0];
        let (name, _) = r.flow.get_index(first)?;
        let path: Vec<String> = cycle
            .iter()
            .chain(std::iter::once(&first))
            .map(|&i| format!("${}", steps[i].name))
            .collect();
        cx.errs.push(
            ConfigError::at(name.pos, format!("dependency cycle: {}", path.join(" → "))).hint(
                "a step cannot read (directly or indirectly) its own result; remove one reference",
            ),
        );
        return None;
    }
    let roots = (0..n).filter(|&i| steps[i].deps.is_empty()).collect();
    if let Some(st) = &r.stream {
        for s in &mut steps {
            s.streamed = match &st.steps {
                None => true,
                Some(names) => names.iter().any(|n| *n.value == *s.name),
            };
        }
    }
    let steps: Vec<Arc<StepPlan>> = steps.into_iter().map(Arc::new).collect();
    let coalesce = match (first_writer(&steps), &r.coalesce) {
        // A pass-through route has no run to share.
        _ if r.pass.is_some() || r.websocket.is_some() => Coalesce::Off,
        // A streamed answer is each request's own stream.
        _ if r.stream.is_some() => Coalesce::Off,
        (None, Some(c)) if !c.value => Coalesce::Off,
        (None, None) if !cx.cfg.defaults.coalesce => Coalesce::Off,
        (None, _) => Coalesce::On,
        (Some((step, what)), Some(c)) if c.value => {
            cx.errs.push(
                ConfigError::at(
                    c.pos,
                    format!("`coalesce: true`, but step `{step}` of this route may write: {what}"),
                )
                .hint(
                    "only routes whose steps all just read can share one run between requests; \
                     remove `coalesce`, or make the step read-only",
                ),
            );
            return None;
        }
        (Some((step, what)), _) => Coalesce::Writes { step, what },
    };
    Some(RoutePlan {
        index: 0, // set by `compile`
        method: method?,
        path: r.path.value.clone(),
        deadline: r.deadline.unwrap_or(defaults.deadline).0,
        server_timing: r.server_timing,
        steps,
        roots,
        respond: Arc::new(RespondPlan {
            // A gRPC route's answer is encoded from the value; so is a resolver's (read as a
            // value by the step that runs it).
            partial_in_body: r.grpc.is_none() && !share_calls,
            ..respond?
        }),
        limits: eval_limits(&cx.cfg.server.expressions),
        reference: reference.clone(),
        compute: cx.compute.clone(),
        grpc,
        request_use: std::mem::take(&mut cx.request_use),
        param_keys: fanout_expr::request::param_keys(&r.path.value),
        coalesce,
        stream: r.stream.clone().map(Arc::new),
    })
}

/// `respond:` — body, status (fixed or an expression) and headers.
fn compile_respond(
    cx: &mut Ctx<'_>,
    r: &fanout_config::Respond,
    scope: &[&str],
) -> Option<RespondPlan> {
    // `$item`/`$index` are refused in `respond` (check_no_item); hints do not offer them
    let hidden = ["item", "index"];
    let body = cx.expr_hiding(&r.body, scope, &hidden);
    let mut headers = Vec::new();
    for (k, v) in &r.headers {
        let h = cx.header_name(k, v.pos);
        let e = cx.expr_hiding(v, scope, &hidden);
        if let (Some(h), Some(e)) = (h, e) {
            headers.push((h, e));
        }
    }
    if let Some(b) = &body {
        check_no_item(cx, b, &r.body, "respond.body");
    }
    let status = match &r.status {
        StatusSrc::Code(c) => {
            if !(100..=599).contains(&c.value) {
                let at = if c.pos.line > 0 { c.pos } else { r.body.pos };
                cx.errs.push(
                    ConfigError::at(
                        at,
                        format!("respond.status {} is not a valid HTTP status", c.value),
                    )
                    .hint("a status is 100–599, or an expression (a string) giving one"),
                );
            }
            Some(StatusPlan::Fixed(c.value))
        }
        StatusSrc::Expr(src) => cx.expr_hiding(src, scope, &hidden).map(|e| {
            check_no_item(cx, &e, src, "respond.status");
            StatusPlan::Expr(e)
        }),
    };
    Some(RespondPlan {
        body: body?,
        status: status?,
        headers,
        partial_in_body: true,
        body_size: Default::default(),
    })
}

/// The evaluation limits of `server.expressions`.
pub fn eval_limits(c: &fanout_config::ExpressionLimits) -> fanout_expr::EvalLimits {
    fanout_expr::EvalLimits {
        max_ops: c.max_ops,
        inline_ops: c.inline_ops,
        max_depth: c.max_depth,
        max_elements: c.max_elements,
        max_string_bytes: c.max_string_bytes,
    }
}

/// Whether `e` reads `$item` or `$index` (a `for_each` element's own values).
pub(crate) fn reads_item(e: &Expr) -> bool {
    e.vars().iter().any(|&v| v == SLOT_ITEM || v == SLOT_INDEX)
}

fn check_no_item(cx: &mut Ctx<'_>, e: &Expr, src: &ExprSrc, what: &str) {
    if reads_item(e) {
        cx.errs.push(
            ConfigError::at(
                cx.at(src),
                format!("`$item`/`$index` used in {what} outside a `for_each` step"),
            )
            .hint("`$item` and `$index` exist only inside a step with `for_each:`"),
        );
    }
}

fn compile_step(
    cx: &mut Ctx<'_>,
    index: usize,
    name: &Located<String>,
    step: &Step,
    scope: &[&str],
    given: &Given<'_>,
) -> Option<StepPlan> {
    let errs_before = cx.errs.len();
    let in_each = step.for_each.is_some();
    let mut sc = StepCx {
        cx,
        name,
        scope,
        backends: given.backends,
        batches: given.batches,
        kinds: given.kinds,
        in_each,
        backend_timeout: None,
        exprs: Vec::new(),
    };
    let when = sc.expr(step.when.as_ref(), false);
    let for_each = sc.expr(step.for_each.as_ref(), false);
    let result = sc.expr(step.result.as_ref(), in_each);
    let kind = sc.kind(step);
    let missing = match &step.missing {
        MissingPolicy::Fail => Some(Missing::Fail),
        MissingPolicy::Skip => Some(Missing::Skip),
        MissingPolicy::Null => Some(Missing::Null),
        MissingPolicy::Value(src) => sc.expr(Some(src), in_each).map(Missing::Value),
    };
    let (exprs, backend_timeout) = (std::mem::take(&mut sc.exprs), sc.backend_timeout);
    let deps = step_deps(cx, index, name, &exprs);
    if cx.errs.len() > errs_before {
        return None;
    }
    let defaults = &cx.cfg.defaults;
    Some(StepPlan {
        name: name.value.as_str().into(),
        index,
        deps,
        dependents: Vec::new(),
        when,
        for_each,
        concurrency: step.concurrency.unwrap_or(defaults.concurrency).max(1),
        timeout: step
            .timeout
            .or(backend_timeout)
            .unwrap_or(defaults.timeout)
            .0,
        optional: step.optional,
        default: step
            .default
            .as_ref()
            .map(json::from_serde)
            .unwrap_or(Val::Null),
        result,
        compute: step.compute,
        on_status: status_map(step),
        missing: missing?,
        kind: kind?,
        share_calls: false,
        streamed: false, // set by `compile_route` on a `stream:` route
    })
}

/// `on_status`, exact statuses before classes: `{4xx: 400, 404: 404}` maps 404 to 404.
fn status_map(step: &Step) -> Vec<(StatusPattern, StatusAction)> {
    let mut on_status: Vec<(StatusPattern, StatusAction)> = step
        .on_status
        .iter()
        .map(|(k, v)| (k.value, v.clone()))
        .collect();
    on_status.sort_by_key(|(k, _)| matches!(k, StatusPattern::Class(_)));
    on_status
}

/// A step's dependencies: the steps its expressions read. Checks that `$item`/`$index` appear
/// only where allowed and that the step does not read itself.
fn step_deps(
    cx: &mut Ctx<'_>,
    index: usize,
    name: &Located<String>,
    exprs: &[(Expr, ExprSrc, bool)],
) -> Vec<usize> {
    let mut deps = Vec::new();
    for (e, src, item_ok) in exprs {
        if !item_ok {
            check_no_item(cx, e, src, &format!("step `{}`", name.value));
        }
        for &v in e.vars() {
            if v < FIRST_STEP_SLOT {
                continue;
            }
            let d = v - FIRST_STEP_SLOT;
            if d == index {
                cx.errs.push(
                    ConfigError::at(
                        cx.at(src),
                        format!(
                            "step `{}` reads its own result `${}`",
                            name.value, name.value
                        ),
                    )
                    .hint("a step can read `$request` and other steps, not itself"),
                );
            }
            deps.push(d);
        }
    }
    deps.sort_unstable();
    deps.dedup();
    deps
}

/// A cycle as a list of step indices, if there is one.
fn find_cycle(steps: &[StepPlan]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum C {
        White,
        Grey,
        Black,
    }
    fn visit(
        i: usize,
        steps: &[StepPlan],
        color: &mut [C],
        stack: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        color[i] = C::Grey;
        stack.push(i);
        for &d in &steps[i].deps {
            match color[d] {
                C::Grey => {
                    let start = stack.iter().position(|&x| x == d).unwrap_or(0);
                    // In reading order: a reads b reads … reads a.
                    return Some(stack[start..].to_vec());
                }
                C::White => {
                    if let Some(c) = visit(d, steps, color, stack) {
                        return Some(c);
                    }
                }
                C::Black => {}
            }
        }
        stack.pop();
        color[i] = C::Black;
        None
    }
    let mut color = vec![C::White; steps.len()];
    let mut stack = Vec::new();
    for i in 0..steps.len() {
        if color[i] == C::White
            && let Some(c) = visit(i, steps, &mut color, &mut stack)
        {
            return Some(c);
        }
    }
    None
}
