//! The keyed lookup step (`http: {backend, key}`): one key (one per element with `for_each`)
//! looked up through the backend's batch form. The lookups of every step that starts in the
//! same scheduling round are merged into one fetch per batch form ([`flush_keyed`]); each step
//! then picks its own values from the shared answer.

use super::{Prepared, StepArgs, StepCx, StepKind, StepWork};
use crate::batch::BatchPlan;
use crate::call::{Env, Yielded, eval, eval_item, expr_err, yielded};
use crate::ctx::unknown_backend;
use fanout_config::{ConfigError, Step};
use fanout_expr::{Expr, Val, json};
use std::sync::Arc;
use tokio::time::Instant;

/// A compiled keyed lookup.
struct KeyedStep {
    batch: Arc<BatchPlan>,
    key: Expr,
}

impl StepKind for KeyedStep {
    fn backend(&self) -> Option<&Arc<str>> {
        Some(&self.batch.name)
    }

    fn work(&self) -> StepWork {
        let (backend, max_keys) = (&self.batch.name, self.batch.max);
        let mut text = format!("keyed lookup on {backend} (batch calls of ≤ {max_keys} keys");
        if let Some(w) = self.batch.window {
            text.push_str(&format!(
                ", keys of concurrent requests collected for {}",
                fanout_config::format_duration(w)
            ));
        }
        text.push(')');
        StepWork {
            text,
            label: format!("keyed {backend} · batch ≤ {max_keys}"),
            io: super::StepIo::Keyed {
                backend: backend.to_string(),
                max_keys,
                window: self.batch.window,
                timeout: self.batch.timeout,
            },
        }
    }

    fn prepare(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        items: Option<Arc<Vec<Val>>>,
        _deadline: Instant,
    ) -> Result<Prepared, Yielded> {
        let Some(items) = items else {
            return Ok(match yielded(eval(&self.key, env, &Val::Null))? {
                Ok(k) => {
                    Prepared::Keys(self.batch.clone(), vec![(json::to_display(&k), Val::Null)])
                }
                Err(e) => Prepared::Done(Err(expr_err(step.name, "`key`", e))),
            });
        };
        let mut keys = Vec::with_capacity(items.len());
        for (k, item) in items.iter().enumerate() {
            match yielded(eval_item(&self.key, env, &Val::Null, item, k))? {
                Ok(v) => keys.push((json::to_display(&v), item.clone())),
                Err(e) => return Ok(Prepared::Done(Err(expr_err(step.name, "`key`", e)))),
            }
        }
        Ok(Prepared::Keys(self.batch.clone(), keys))
    }
}

/// `http` with `key`.
pub(super) fn compile(sc: &mut StepCx<'_, '_>, step: &Step) -> Option<Option<Box<dyn StepKind>>> {
    let h = step.http.as_ref().filter(|h| h.key.is_some())?;
    let key = sc.expr(h.key.as_ref(), sc.in_each);
    let extra = h.path.is_some()
        || !h.query.is_empty()
        || !h.headers.is_empty()
        || h.body.is_some()
        || h.method.pos.line > 0;
    if extra {
        sc.cx.errs.push(
            ConfigError::at(
                h.backend.pos,
                format!(
                    "step `{}`: `key` cannot be combined with method, path, query, headers or body",
                    sc.name.value
                ),
            )
            .hint("with `key`, the call is built by the backend's `batch:` form"),
        );
    }
    let declared = sc.cx.cfg.backends.get(&h.backend.value);
    sc.backend_timeout = declared.and_then(|b| b.timeout);
    let batch = match (sc.batches.get(&h.backend.value), declared) {
        (Some(b), _) => Some(b.clone()),
        (None, Some(_)) => {
            sc.cx.errs.push(
                ConfigError::at(
                    h.backend.pos,
                    format!(
                        "backend `{}` has no `batch` form, so steps cannot look up a `key` on it",
                        h.backend.value
                    ),
                )
                .hint("add `batch: {path: …, split: …}` to the backend, or use `path:` instead of `key:`"),
            );
            None
        }
        (None, None) => {
            let e = unknown_backend(sc.cx.cfg, h.backend.pos, "", &h.backend.value);
            sc.cx.errs.push(e);
            None
        }
    };
    Some(match (batch, key) {
        (Some(batch), Some(key)) => Some(Box::new(KeyedStep { batch, key })),
        _ => None,
    })
}
