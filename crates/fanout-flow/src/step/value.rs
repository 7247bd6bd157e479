//! The value step (`value:`): computes a value from the request and other steps; no I/O. With
//! `for_each`, per element, then `result` per element.

use super::{Prepared, StepArgs, StepCx, StepKind, StepWork};
use crate::call::{Env, Yielded, eval, eval_item, expr_err, yielded};
use crate::error::FlowError;
use fanout_config::{ConfigError, Step};
use fanout_expr::{Expr, Val};
use std::sync::Arc;
use tokio::time::Instant;

/// A compiled `value` step.
struct ValueStep(Expr);

impl StepKind for ValueStep {
    fn is_pure(&self) -> bool {
        true
    }

    fn work(&self) -> StepWork {
        StepWork {
            text: "value (no I/O)".into(),
            label: "value".into(),
            io: super::StepIo::None,
        }
    }

    fn prepare(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        items: Option<Arc<Vec<Val>>>,
        _deadline: Instant,
    ) -> Result<Prepared, Yielded> {
        let v = eval_value(step.name, &self.0, step.result, env, items)?;
        Ok(Prepared::Done(v))
    }
}

/// `value:` (the kind of every step that is of no other kind; the config requires it then). A
/// step of a kind the compiler was not given (a `sql` step compiled with the engine's kinds
/// alone) has none: a config error.
pub(super) fn compile(sc: &mut StepCx<'_, '_>, step: &Step) -> Option<Option<Box<dyn StepKind>>> {
    let Some(src) = step.value.as_ref() else {
        let name = sc.name();
        let e = ConfigError::at(
            name.pos,
            format!("step `{}`: no step kind given to the compiler takes it", name.value),
        )
        .hint("`sql` and `model` steps are compiled with the gateway's kinds (fanout-proxy's STEP_KINDS)");
        sc.error(e);
        return Some(None);
    };
    let e = sc.expr(Some(src), sc.in_each);
    Some(e.map(|e| Box::new(ValueStep(e)) as Box<dyn StepKind>))
}

fn eval_value(
    name: &Arc<str>,
    e: &Expr,
    result: Option<&Expr>,
    env: &Env,
    items: Option<Arc<Vec<Val>>>,
) -> Result<Result<Val, FlowError>, Yielded> {
    let Some(items) = items else {
        return Ok(yielded(eval(e, env, &Val::Null))?.map_err(|m| expr_err(name, "`value`", m)));
    };
    let mut out = Vec::with_capacity(items.len());
    for (k, item) in items.iter().enumerate() {
        let v = match yielded(eval_item(e, env, &Val::Null, item, k))? {
            Ok(v) => v,
            Err(m) => return Ok(Err(expr_err(name, "`value`", m))),
        };
        let v = match result {
            Some(r) => match yielded(eval_item(r, env, &v, item, k))? {
                Ok(v) => v,
                Err(m) => return Ok(Err(expr_err(name, "`value`", m))),
            },
            None => v,
        };
        out.push(v);
    }
    Ok(Ok(out.into_iter().collect()))
}
