//! Limits of expression evaluation: a per-request [`Budget`] of work (ops), a deadline, a
//! cancel flag, and caps on the size and depth of the values an expression builds.
//!
//! The checks run inside the (forked) jaq interpreter, see `vendor/jaq-core/src/budget.rs`.

use crate::EvalError;
use jaq_core::budget::{Limits, Scope, Shared, Stop};
use std::sync::Arc;
use std::time::Instant;

/// Limits of expression evaluation.
#[derive(Debug, Clone, Copy)]
pub struct EvalLimits {
    /// Ops (interpreter steps, values through loops, bulk work) a request may use in total.
    pub max_ops: u64,
    /// Ops an evaluation may use on an I/O worker ([`Mode::Inline`]) before it yields.
    pub inline_ops: u64,
    /// No value may be nested deeper than this (`[]` is 1 deep, `[[]]` 2).
    pub max_depth: usize,
    /// No array or object may have more elements than this.
    pub max_elements: usize,
    /// No string may be longer than this many bytes.
    pub max_string_bytes: usize,
}

impl Default for EvalLimits {
    fn default() -> Self {
        Self {
            max_ops: 10_000_000,
            inline_ops: 50_000,
            max_depth: 128,
            max_elements: 1_000_000,
            max_string_bytes: 16 << 20,
        }
    }
}

impl EvalLimits {
    pub(crate) fn jaq(&self) -> Limits {
        Limits {
            // config validation caps it there too; values deeper cannot be parsed
            max_depth: self.max_depth.min(crate::json::MAX_DEPTH_CAP),
            max_elements: self.max_elements,
            max_string_bytes: self.max_string_bytes,
        }
    }
}

/// A request's evaluation budget: shared by every expression the request evaluates (cheap
/// clone, Send + Sync). `max_ops` is for the whole request.
#[derive(Clone)]
pub struct Budget {
    limits: EvalLimits,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("limits", &self.limits)
            .field("used_ops", &self.used_ops())
            .field("deadline", &self.shared.deadline())
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl Budget {
    /// A budget of `limits`, until `deadline` if given.
    pub fn new(limits: EvalLimits, deadline: Option<Instant>) -> Budget {
        Budget {
            limits,
            shared: Arc::new(Shared::new(limits.max_ops, deadline)),
        }
    }

    /// A budget without a deadline.
    pub fn unlimited_time(limits: EvalLimits) -> Budget {
        Self::new(limits, None)
    }

    /// The limits.
    pub fn limits(&self) -> &EvalLimits {
        &self.limits
    }

    /// Any evaluation using this budget stops at its next check ([`EvalErrorKind::Cancelled`]).
    pub fn cancel(&self) {
        self.shared.cancel()
    }

    /// Whether [`Self::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.shared.is_cancelled()
    }

    /// Ops used so far by all evaluations with this budget (and its clones).
    pub fn used_ops(&self) -> u64 {
        self.shared.used_ops()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// How an evaluation may use the thread it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On an I/O worker: at most `inline_ops`, then fails with [`EvalErrorKind::Yield`].
    Inline,
    /// On the compute pool: up to the request's remaining ops, its deadline and cancellation.
    Offload,
}

/// What kind of failure an [`EvalError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalErrorKind {
    /// An ordinary jq error (`error`, a type error, …), or no output.
    Failed,
    /// An [`Mode::Inline`] evaluation used its `inline_ops`: run it again with
    /// [`Mode::Offload`] on another thread (the ops it used still count).
    Yield,
    /// The request's `max_ops` are used up.
    Ops,
    /// A string, array or object would exceed `max_string_bytes` or `max_elements`.
    TooLarge,
    /// A value would be nested deeper than `max_depth`, or the expression recursed too deeply.
    TooDeep,
    /// The budget was cancelled.
    Cancelled,
    /// The deadline passed.
    Deadline,
}

/// Runs an evaluation in a budget scope (installed on this thread until dropped).
pub(crate) struct Run {
    scope: Scope,
    limits: EvalLimits,
}

impl Run {
    /// A scope for `budget` in `mode`, or for a fresh default budget (`None`).
    pub(crate) fn new(budget: Option<(&Budget, Mode)>) -> Run {
        match budget {
            Some((b, mode)) => {
                let (cap, yields) = match mode {
                    Mode::Inline => (b.limits().inline_ops, true),
                    Mode::Offload => (u64::MAX, false),
                };
                let limits = *b.limits();
                let scope = Scope::enter(Some(b.shared().clone()), limits.jaq(), cap, yields);
                Run { scope, limits }
            }
            None => {
                let limits = EvalLimits::default();
                let scope = Scope::enter(None, limits.jaq(), limits.max_ops, false);
                Run { scope, limits }
            }
        }
    }

    /// How much stack is left where the evaluation runs.
    pub(crate) fn stack_remaining(&self, remaining: usize) {
        self.scope.stack_remaining(remaining)
    }

    /// The error for the scope's stop, if it stopped.
    pub(crate) fn stopped(&self) -> Option<EvalError> {
        self.scope.stopped().map(|s| stop_error(s, &self.limits))
    }

    /// Charge an op for an output value and check the number of outputs.
    pub(crate) fn output(&self, n: usize) -> Result<(), EvalError> {
        let r = jaq_core::budget::tick().and_then(|()| jaq_core::budget::check_elements(n));
        r.map_err(|s| stop_error(s, &self.limits))
    }
}

/// The error of a stop, with the limit named as in the config.
pub(crate) fn stop_error(stop: Stop, l: &EvalLimits) -> EvalError {
    use EvalErrorKind as K;
    let (msg, kind) = match stop {
        Stop::Ops => (
            format!(
                "expression exceeded its work budget (server.expressions.max_ops = {})",
                l.max_ops
            ),
            K::Ops,
        ),
        Stop::Yield => (
            format!(
                "expression exceeded its inline work budget \
                 (server.expressions.inline_ops = {}); it is to run on the compute pool",
                l.inline_ops
            ),
            K::Yield,
        ),
        Stop::Cancelled => ("expression evaluation was cancelled".into(), K::Cancelled),
        Stop::Deadline => (
            "expression evaluation did not finish before the request's deadline".into(),
            K::Deadline,
        ),
        Stop::TooDeep => (
            format!(
                "value nested deeper than {} (server.expressions.max_depth)",
                l.max_depth
            ),
            K::TooDeep,
        ),
        Stop::Stack => (
            "expression recursion too deep (its thread's stack ran out)".into(),
            K::TooDeep,
        ),
        Stop::String(n) => (
            format!(
                "string of {n} bytes exceeds server.expressions.max_string_bytes ({})",
                l.max_string_bytes
            ),
            K::TooLarge,
        ),
        Stop::Elements(n) => (
            format!(
                "array or object of {n} elements exceeds server.expressions.max_elements ({})",
                l.max_elements
            ),
            K::TooLarge,
        ),
    };
    EvalError(msg, kind)
}
