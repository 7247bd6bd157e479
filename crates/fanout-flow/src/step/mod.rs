//! Step kinds: what one step of a flow does, each kind in a module of its own behind
//! [`StepKind`]. The executor (`exec`) only schedules steps, enforces deadlines and applies the
//! failure policy; it asks a step's kind to do the step's synchronous work ([`StepKind::prepare`]:
//! build calls, compute keys or a value) and, for calls, to perform one ([`StepKind::call`]).
//!
//! The engine's own kinds are those that need no crate but the engine's (below); a kind that
//! needs a protocol or a runtime of its own lives in that crate and is given to the compiler in
//! the list of kinds ([`Registration`]; `fanout-proxy`'s `STEP_KINDS`): `sql` in its
//! protocol's crate, `model` in `fanout-model`. Adding a kind: a type implementing
//! [`StepKind`] and a `compile` function ([`Compile`]), plus its line in that list
//! (docs/ARCHITECTURE.md, "How to add a step kind"); what it is made of is public in
//! [`crate::kind`].
//!
//! | kind      | module     | config                  | work                                   |
//! |-----------|------------|-------------------------|----------------------------------------|
//! | HTTP call | `http`     | `http: {path, …}`       | builds calls, performs them            |
//! | lookup    | `keyed`    | `http: {key}`           | keys, merged per round into batch calls |
//! | gRPC call | `grpc`     | `grpc: {method, …}`     | builds messages, performs unary calls  |
//! | fail      | `fail`     | `fail:`                 | ends the request with a client answer  |
//! | value     | `value`    | `value:`                | computes a value, no I/O               |

mod fail;
mod grpc;
mod grpc_fields;
mod http;
mod keyed;
mod value;

pub(crate) use grpc::{check_message_fields, grpc_method};
pub(crate) use http::{CallSrc, compile_call};

use crate::batch::BatchPlan;
use crate::call::{Env, Yielded};
use crate::ctx::Ctx;
use crate::error::{ErrorClass, ErrorKind, FlowError};
use fanout_config::{Config, ConfigError, Dur, ExprSrc, Located, Step};
use fanout_expr::{Expr, Val};
use fanout_layers::backend::CallRequest;
use fanout_runtime::compute::ComputePool;
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The engine's own kinds, tried in order before the kinds the compiler is given: the first that
/// recognises a step compiles it (a keyed lookup is an `http` step with `key`, so it comes
/// first). [`value::compile`] takes the steps no kind recognised, after the given kinds.
const ENGINE: &[Compile] = &[keyed::compile, http::compile, grpc::compile, fail::compile];

/// A step kind's line in the list of kinds the flow compiler is given ([`crate::compile_with`];
/// the gateway's is `fanout-proxy`'s `STEP_KINDS`), beside the engine's own kinds.
#[derive(Clone, Copy)]
pub struct Registration {
    /// The kind's compiler ([`Compile`]).
    pub compile: Compile,
    /// The kind's error classes ([`ErrorClass`]): their codes are part of the gateway's
    /// `error.code`s (metrics export each from the start).
    pub errors: &'static [&'static ErrorClass],
}

/// Every error kind of the flow with the step kinds of `kinds`: [`ErrorKind::CORE`] and each
/// kind's classes. Their codes are the flow's part of the gateway's `error.code`s (metrics
/// export each from the start).
pub fn error_kinds(kinds: &[Registration]) -> Vec<ErrorKind> {
    ErrorKind::CORE
        .into_iter()
        .chain(
            kinds
                .iter()
                .flat_map(|k| k.errors.iter().copied())
                .map(ErrorKind::Class),
        )
        .collect()
}

/// A kind's compiler: `None` when the step is not of this kind; `Some(None)` when it is but has
/// errors (reported in the context: [`StepCx::error`]).
pub type Compile = fn(&mut StepCx<'_, '_>, &Step) -> Option<Option<Box<dyn StepKind>>>;

/// What one kind of step does, compiled. Implementations are immutable and shared by every
/// request of the route.
pub trait StepKind: Send + Sync + 'static {
    /// The backend the step calls, if any (named in errors).
    fn backend(&self) -> Option<&Arc<str>> {
        None
    }
    /// What the step does, described for people (`fanout explain`).
    fn work(&self) -> StepWork;
    /// Whether the step starts before the other ready steps of its round (guards such as
    /// `fail`, so that nothing is sent when they refuse the request).
    fn starts_first(&self) -> bool {
        false
    }
    /// Whether the future of [`StepKind::call`] always ends by the `deadline` it is given (its
    /// backend call is timed by min(step timeout, time left), and anything it awaits after the
    /// call is bounded by the deadline too): a flow of one such step then needs no timer of its
    /// own for the call.
    fn call_ends_by_deadline(&self) -> bool {
        false
    }
    /// Whether the step does no I/O, so `compute: true` moves all of its work to the compute
    /// pool (for calling kinds, `compute` concerns only `result`).
    fn is_pure(&self) -> bool {
        false
    }
    /// The step's synchronous work, after `when` and `for_each` (`items`: the elements, if the
    /// step has `for_each`), in `env`'s mode. `Err(Yielded)`: redo it on the compute pool.
    fn prepare(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        items: Option<Arc<Vec<Val>>>,
        deadline: Instant,
    ) -> Result<Prepared, Yielded>;
    /// Perform one call built by [`StepKind::prepare`] and decode its answer.
    fn call<'a>(
        &'a self,
        step: &'a StepArgs<'a>,
        req: CallRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Val, FlowError>> {
        let _ = (req, deadline);
        fanout_layers::boxed::pinned(|| async move {
            Err(
                FlowError::new(ErrorKind::Expression, "this step kind makes no calls")
                    .in_step(step.name),
            )
        })
    }
}

/// What a step's kind sees of the step it belongs to.
pub struct StepArgs<'a> {
    /// The step's name (for errors).
    pub name: &'a Arc<str>,
    /// The step's `result` expression, if any.
    pub result: Option<&'a Expr>,
    /// The step's per-call timeout.
    pub timeout: Duration,
    /// The request's account in the memory budget: answers parsed for the step are held there.
    pub memory: &'a crate::memory::RequestMemory<'a>,
}

/// A step's prepared work: what the scheduler runs. Plain data (`Send + 'static`), so it can be
/// prepared on the compute pool and run on the worker.
pub enum Prepared {
    /// Finished: the step's value or failure.
    Done(Result<Val, FlowError>),
    /// One call.
    Call(CallRequest),
    /// One call per `for_each` element: (call, element, index).
    Calls(Vec<(CallRequest, Val, usize)>),
    /// Keyed lookups (key, `for_each` element), merged with the round's others per batch form.
    Keys(Arc<BatchPlan>, Vec<(String, Val)>),
    /// Work done elsewhere (a model's batch on the compute pool), started with the step's
    /// trace context: one value per `for_each` element (the elements given), or one value.
    Task(Task, Option<Arc<Vec<Val>>>),
}

/// See [`Prepared::Task`].
pub type Task = Box<
    dyn FnOnce(
            Option<fanout_layers::trace::CallTrace>,
        ) -> BoxFuture<'static, Result<Vec<Val>, FlowError>>
        + Send,
>;

/// The `prepare` of a kind that makes one call per step, or one per `for_each` element
/// (`items`): `build(None)` or `build(Some((element, index)))` builds each; the first failure
/// ends the step.
pub fn prepare_calls(
    items: Option<Arc<Vec<Val>>>,
    mut build: impl FnMut(Option<(&Val, usize)>) -> Result<Result<CallRequest, FlowError>, Yielded>,
) -> Result<Prepared, Yielded> {
    let Some(items) = items else {
        return Ok(match build(None)? {
            Ok(r) => Prepared::Call(r),
            Err(e) => Prepared::Done(Err(e)),
        });
    };
    let mut reqs = Vec::with_capacity(items.len());
    for (k, item) in items.iter().enumerate() {
        match build(Some((item, k)))? {
            Ok(r) => reqs.push((r, item.clone(), k)),
            Err(e) => return Ok(Prepared::Done(Err(e))),
        }
    }
    Ok(Prepared::Calls(reqs))
}

/// What a step does, as its kind describes itself ([`StepKind::work`]): everything
/// `fanout explain`'s renderers and the coalescing check read — they never match on a kind.
#[derive(Debug, Clone, PartialEq)]
pub struct StepWork {
    /// The kind in a few words, for the text renderer: `http GET users`,
    /// `sql (one, read-only) on database db`, `value (no I/O)`.
    pub text: String,
    /// The same, shorter, for a diagram's node: `GET users`, `SQL one db`, `value`.
    pub label: String,
    /// What the step does beyond computing: calls, keyed lookups, work on the compute pool, a
    /// guard, or nothing.
    pub io: StepIo,
}

/// The I/O of a step ([`StepWork::io`]).
#[derive(Debug, Clone, PartialEq)]
pub enum StepIo {
    /// None: a value computed from the request and other steps.
    None,
    /// Work on the compute pool, batched with other requests' (a model); with `for_each`, one
    /// `per_item` per element (`row`).
    Compute {
        /// What one `for_each` element becomes.
        per_item: &'static str,
    },
    /// A guard ending the request with a client answer when it runs (`fail:`): it starts before
    /// the other steps of its round.
    Guard {
        /// The answer's status.
        status: u16,
        /// The answer's `error.code`.
        code: String,
    },
    /// Calls of its own to `backend` (one per element with `for_each`).
    Calls {
        /// The backend called.
        backend: String,
        /// Whether a call may be retried or hedged.
        idempotent: bool,
        /// What the call may write, when it may (an HTTP POST, a gRPC method with side
        /// effects, a statement that is not read-only): then dedup, caching and whole-request
        /// coalescing do not apply. `None`: it only reads.
        writes: Option<String>,
    },
    /// Keyed lookups through the backend's batch form: the keys of every step starting in the
    /// same round are merged into calls of at most `max_keys` keys.
    Keyed {
        /// The backend called.
        backend: String,
        /// Most keys per batch call.
        max_keys: usize,
        /// Cross-request collection window before the call is sent, if any.
        window: Option<Duration>,
        /// The batch call's timeout (the backend's; a step's own `timeout` does not apply).
        timeout: Duration,
    },
}

impl StepIo {
    /// The backend the step calls, if any.
    pub fn backend(&self) -> Option<&str> {
        match self {
            StepIo::Calls { backend, .. } | StepIo::Keyed { backend, .. } => Some(backend),
            _ => None,
        }
    }
}

/// What a kind's compiler works with: the route's compile context, the step's name and scope,
/// and the expressions compiled so far (their `$names` become the step's dependencies).
pub struct StepCx<'c, 'a> {
    /// The route's compile context (config, errors, compute pool).
    pub(crate) cx: &'c mut Ctx<'a>,
    /// The step's name (with its position).
    pub(crate) name: &'c Located<String>,
    /// Names an expression may read.
    pub(crate) scope: &'c [&'c str],
    /// Backends by name.
    pub(crate) backends: &'c HashMap<String, Arc<dyn crate::Backend>>,
    /// Batch forms by backend name.
    pub(crate) batches: &'c HashMap<String, Arc<BatchPlan>>,
    /// The step kinds the compiler was given, beside the engine's own.
    pub(crate) kinds: &'c [Registration],
    /// Whether the step has `for_each` (`$item`/`$index` allowed in its call).
    pub(crate) in_each: bool,
    /// The timeout of the backend the step calls, if it calls one.
    pub(crate) backend_timeout: Option<Dur>,
    /// Every expression compiled for the step: (expression, source, `$item` allowed).
    pub(crate) exprs: Vec<(Expr, ExprSrc, bool)>,
}

impl<'a> StepCx<'_, 'a> {
    /// Compile one of the step's expressions (when present) and record it for the dependency
    /// and `$item` checks.
    pub fn expr(&mut self, src: Option<&ExprSrc>, item_ok: bool) -> Option<Expr> {
        let src = src?;
        let hidden: &[&str] = if item_ok { &[] } else { &["item", "index"] };
        let e = self.cx.expr_hiding(src, self.scope, hidden)?;
        self.exprs.push((e.clone(), src.clone(), item_ok));
        Some(e)
    }

    /// The expression compiled for the step from `src` (by [`StepCx::expr`]: its `for_each`,
    /// …), if one was.
    pub fn compiled(&self, src: &ExprSrc) -> Option<&Expr> {
        self.exprs
            .iter()
            .find(|(_, s, _)| s.pos == src.pos && s.value == src.value)
            .map(|(e, _, _)| e)
    }

    /// The config being compiled.
    pub fn config(&self) -> &'a Config {
        self.cx.cfg
    }

    /// Report a config error (the step is then not compiled; every error is reported).
    pub fn error(&mut self, e: ConfigError) {
        self.cx.errs.push(e);
    }

    /// How many errors the compilation has reported so far.
    pub fn error_count(&self) -> usize {
        self.cx.errs.len()
    }

    /// The step's name, with its position.
    pub fn name(&self) -> &Located<String> {
        self.name
    }

    /// The step's identity across reloads: `METHOD PATH STEP`
    /// ([`crate::plan::RoutePlan::step_key`]).
    pub fn key(&self) -> String {
        format!("{} {}", self.cx.route_key, self.name.value)
    }

    /// Whether the step has `for_each` (`$item`/`$index` may be read by its call).
    pub fn in_each(&self) -> bool {
        self.in_each
    }

    /// Backend `name`'s stack, if the config declares it.
    pub fn backend(&self, name: &str) -> Option<Arc<dyn crate::Backend>> {
        self.backends.get(name).cloned()
    }

    /// The step calls a backend whose timeout is this (the step's own default timeout).
    pub fn set_backend_timeout(&mut self, timeout: Option<Dur>) {
        self.backend_timeout = timeout;
    }

    /// The compute pool (large answers are parsed there, `compute: true` work runs there).
    pub fn compute(&self) -> &Arc<ComputePool> {
        &self.cx.compute
    }

    /// The runtimes step kinds use, opened by the caller ([`crate::plan::Carry::runtimes`]).
    pub fn runtimes(&self) -> &crate::runtime::Runtimes {
        &self.cx.runtimes
    }

    /// Compile the step's kind: the first of the engine's kinds, then of the kinds the compiler
    /// was given, that recognises it; `value` takes the rest.
    pub(crate) fn kind(&mut self, step: &Step) -> Option<Box<dyn StepKind>> {
        let given = self.kinds;
        let found = ENGINE
            .iter()
            .copied()
            .chain(given.iter().map(|k| k.compile))
            .find_map(|compile| compile(self, step));
        match found {
            Some(kind) => kind,
            None => value::compile(self, step).flatten(),
        }
    }
}
