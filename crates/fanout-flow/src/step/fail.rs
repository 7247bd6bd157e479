//! The fail step (`fail: {status, code, message, details}`): when it runs, the request ends with
//! that client answer. Fail steps start before the other steps of their round, so a guard that
//! refuses a request does so before any call of the round is sent.

use super::{Prepared, StepArgs, StepCx, StepKind, StepWork};
use crate::call::{Env, Yielded, eval, expr_err, yielded};
use crate::error::{Answer, ErrorKind, FlowError};
use bytes::Bytes;
use fanout_config::Step;
use fanout_expr::{Expr, Val, json};
use std::sync::Arc;
use tokio::time::Instant;

/// A `fail` step: the client answer it ends the request with.
pub(crate) struct FailPlan {
    /// Status.
    status: u16,
    /// `error.code`.
    code: Arc<str>,
    /// Message expression (default: the status's reason phrase).
    message: Option<Expr>,
    /// `error.details` expression.
    details: Option<Expr>,
}

impl StepKind for FailPlan {
    fn starts_first(&self) -> bool {
        true
    }

    fn work(&self) -> StepWork {
        let (status, code) = (self.status, &self.code);
        StepWork {
            text: format!(
                "fail {status} `{code}` (a guard: starts before the other steps of its round)"
            ),
            label: format!("fail {status} {code}"),
            io: super::StepIo::Guard {
                status,
                code: code.to_string(),
            },
        }
    }

    fn prepare(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        _items: Option<Arc<Vec<Val>>>,
        _deadline: Instant,
    ) -> Result<Prepared, Yielded> {
        Ok(Prepared::Done(Err(self.answer(step, env)?)))
    }
}

impl FailPlan {
    /// The request's error: the status, code, message and details of this step.
    fn answer(&self, step: &StepArgs<'_>, env: &Env) -> Result<FlowError, Yielded> {
        let message = match &self.message {
            None => http::StatusCode::from_u16(self.status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("request refused")
                .to_string(),
            Some(e) => match yielded(eval(e, env, &Val::Null))? {
                Ok(v) => json::to_display(&v),
                Err(e) => return Ok(expr_err(step.name, "`fail.message`", e)),
            },
        };
        let details = match &self.details {
            None => None,
            Some(e) => match yielded(eval(e, env, &Val::Null))? {
                Ok(v) => {
                    let mut out = Vec::with_capacity(64);
                    json::write(&v, &mut out);
                    Some(Bytes::from(out))
                }
                Err(e) => return Ok(expr_err(step.name, "`fail.details`", e)),
            },
        };
        Ok(FlowError::new(ErrorKind::Answered, message)
            .in_step(step.name)
            .with_answer(Answer {
                status: self.status,
                code: self.code.clone(),
                details,
            }))
    }
}

/// `fail:`.
pub(super) fn compile(sc: &mut StepCx<'_, '_>, step: &Step) -> Option<Option<Box<dyn StepKind>>> {
    let f = step.fail.as_ref()?;
    let message = sc.expr(f.message.as_ref(), false);
    let details = sc.expr(f.details.as_ref(), false);
    let ok = f.message.is_none() == message.is_none() && f.details.is_none() == details.is_none();
    Some(ok.then(|| {
        Box::new(FailPlan {
            status: f.status.value,
            code: f.code.value.as_str().into(),
            message,
            details,
        }) as Box<dyn StepKind>
    }))
}
