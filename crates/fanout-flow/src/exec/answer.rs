//! From a call's answer to a step's value, for every calling kind: the step's `result` over the
//! answer, the `missing` policy for absent elements, and where an expression runs (on the
//! worker, or on the compute pool when it is heavy or the step says `compute: true`).

use crate::call::{Env, eval, eval_item, eval_kind, expr_err, yielded};
use crate::error::{ErrorKind, FlowError};
use crate::plan::{FIRST_STEP_SLOT, Missing, RoutePlan, SLOT_REF, SLOT_REQUEST, StepPlan};
use fanout_expr::{EvalError, Expr, Val};
use std::sync::Arc;

/// Whether a step needs its scope captured for evaluation after its call (`result`, or a
/// `missing: {value: …}` expression).
pub(crate) fn needs_env(step: &StepPlan) -> bool {
    step.result.is_some() || matches!(step.missing, Missing::Value(_))
}

/// The values a step's `result` expression may read, captured when the step starts (boxed by the
/// callers that keep it in a step's future: the scope slots are inline, and a step without a
/// `result` should not carry their room).
pub(crate) fn snapshot(env: &Env, step: &StepPlan) -> Env {
    let mut slots: crate::call::Slots = smallvec::smallvec![Val::Null; env.slots.len()];
    slots[SLOT_REQUEST] = env.get(SLOT_REQUEST);
    slots[SLOT_REF] = env.get(SLOT_REF);
    for &d in &step.deps {
        slots[FIRST_STEP_SLOT + d] = env.get(FIRST_STEP_SLOT + d);
    }
    Env {
        slots,
        budget: env.budget.clone(),
        mode: env.mode,
    }
}

/// A step's `result` over one answer (`body` unchanged without a `result`).
pub(crate) async fn map_result_on(
    route: &RoutePlan,
    step: &StepPlan,
    env: Option<&Env>,
    body: Val,
    item: Option<(&Val, usize)>,
) -> Result<Val, FlowError> {
    let (Some(r), Some(env)) = (&step.result, env) else {
        return Ok(body);
    };
    let (name, backend) = (step.name.clone(), step.kind.backend().cloned());
    eval_step_expr(route, step, r, env, body, item, move |m| {
        result_err(&name, backend, m)
    })
    .await
}

/// The value that takes a missing element's place (`None`: left out), per the step's policy.
pub(crate) async fn missing_on(
    route: &RoutePlan,
    step: &StepPlan,
    env: Option<&Env>,
    item: Option<(&Val, usize)>,
) -> Result<Option<Val>, FlowError> {
    let (e, env) = match (&step.missing, env) {
        (Missing::Skip, _) => return Ok(None),
        (Missing::Null | Missing::Fail, _) | (Missing::Value(_), None) => {
            return Ok(Some(Val::Null));
        }
        (Missing::Value(e), Some(env)) => (e, env),
    };
    let name = step.name.clone();
    eval_step_expr(route, step, e, env, Val::Null, item, move |m| {
        expr_err(&name, "`missing.value`", m)
    })
    .await
    .map(Some)
}

/// `e` over `input` (with `$item`/`$index` when given): on this worker, or on the compute pool
/// for `compute: true` steps and for evaluations too heavy to finish inline. `err` makes the
/// failure.
pub(crate) async fn eval_step_expr(
    route: &RoutePlan,
    step: &StepPlan,
    e: &Expr,
    env: &Env,
    input: Val,
    item: Option<(&Val, usize)>,
    err: impl FnOnce(EvalError) -> FlowError + Send + 'static,
) -> Result<Val, FlowError> {
    if !step.compute {
        let out = match item {
            Some((it, k)) => eval_item(e, env, &input, it, k),
            None => eval(e, env, &input),
        };
        if let Ok(out) = yielded(out) {
            return out.map_err(err);
        }
    }
    let (e, env) = (e.clone(), env.clone().offloaded());
    let item = item.map(|(v, k)| (v.clone(), k));
    route
        .compute
        .run(move || {
            let out = match &item {
                Some((it, k)) => eval_item(&e, &env, &input, it, *k),
                None => eval(&e, &env, &input),
            };
            out.map_err(err)
        })
        .await
        .map_err(|x| pool_error(&step.name, x))?
}

/// The compute pool refused a step's work.
pub(crate) fn pool_error(step: &Arc<str>, e: fanout_runtime::compute::ComputeError) -> FlowError {
    FlowError::new(ErrorKind::Overloaded, e.to_string()).in_step(step)
}

/// `result` failed: on the answer (502), or on a limit or the deadline.
fn result_err(step: &Arc<str>, backend: Option<Arc<str>>, m: EvalError) -> FlowError {
    let kind = match eval_kind(&m) {
        ErrorKind::Expression => ErrorKind::BadBackendAnswer,
        other => other,
    };
    let message = match kind {
        ErrorKind::BadBackendAnswer => "`result` failed on the backend's answer".to_string(),
        _ => format!("`result` failed: {}", m.0),
    };
    let mut e = FlowError::new(kind, message)
        .in_step(step)
        .with_detail(format!("`result`: {}", m.0));
    e.backend = backend;
    e
}
