//! Keyed lookups at run time: the lookups of every step that starts in the same scheduling
//! round are merged into one fetch per batch form ([`flush_keyed`]); each step then picks its
//! own values from the shared answer, applying its `result` and `missing` policy.

use super::StepFuture;
use super::answer::{map_result_on, missing_on, needs_env, snapshot};
use super::inflight::InFlight;
use crate::batch::{BatchPlan, Found};
use crate::call::Env;
use crate::error::{ErrorKind, FlowError};
use crate::observe::Observer;
use crate::plan::{Missing, RoutePlan, StepPlan};
use fanout_expr::Val;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use std::sync::Arc;
use tokio::time::Instant;

type SharedFetch = Shared<BoxFuture<'static, Result<Found, FlowError>>>;

/// A step's keyed lookups waiting for the end of the scheduling round: (step, batch form,
/// (key, `for_each` element) pairs).
pub(crate) type KeyedLookup = (usize, Arc<BatchPlan>, Vec<(String, Val)>);

/// One fetch per batch form for the union of the round's keys; each step then picks its own
/// values (in its own order) from the shared answer.
pub(crate) fn flush_keyed<'a>(
    route: &'a RoutePlan,
    keyed: Vec<KeyedLookup>,
    env: &Env,
    deadline: Instant,
    inflight: &mut InFlight<StepFuture<'a>>,
    obs: &'a dyn Observer,
) {
    let mut groups: Vec<(Arc<BatchPlan>, Vec<String>)> = Vec::new();
    for (_, batch, keys) in &keyed {
        let keys = keys.iter().map(|(k, _)| k.clone());
        match groups.iter_mut().find(|(b, _)| Arc::ptr_eq(b, batch)) {
            Some((_, all)) => all.extend(keys),
            None => groups.push((batch.clone(), keys.collect())),
        }
    }
    let fetches: Vec<(Arc<BatchPlan>, SharedFetch)> = groups
        .into_iter()
        .map(|(batch, mut keys)| {
            keys.sort_unstable();
            keys.dedup();
            let b = batch.clone();
            // A fetch merged for several steps is traced under the first of them.
            let trace = keyed
                .iter()
                .find(|(_, kb, _)| Arc::ptr_eq(kb, &batch))
                .and_then(|(i, _, _)| obs.call_trace(&route.steps[*i]));
            let fut = async move { b.fetch(keys, deadline, trace).await }
                .boxed()
                .shared();
            (batch, fut)
        })
        .collect();
    for (i, batch, keys) in keyed {
        let step = &route.steps[i];
        let Some(fetch) = fetches
            .iter()
            .find(|(b, _)| Arc::ptr_eq(b, &batch))
            .map(|(_, f)| f.clone())
        else {
            continue;
        };
        let env = needs_env(step).then(|| Box::new(snapshot(env, step)));
        let t = Instant::now();
        inflight.push(fanout_layers::boxed::pinned(|| async move {
            let found = fetch.await;
            obs.call_finished(step, t.elapsed(), found.as_ref().map(|_| ()));
            let out = pick_found(route, step, &batch, found, keys, env.as_deref()).await;
            into_step_output(i, out)
        }));
    }
}

/// A step's keyed lookups fetched on their own (prepared on the compute pool, after the round
/// was merged).
pub(crate) async fn keyed_alone(
    route: &RoutePlan,
    step: &StepPlan,
    (i, batch, keys): KeyedLookup,
    env: &Env,
    deadline: Instant,
    obs: &dyn Observer,
) -> (usize, Result<Val, FlowError>, bool) {
    let mut unique: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
    unique.sort_unstable();
    unique.dedup();
    let env = needs_env(step).then(|| env.clone());
    let t = Instant::now();
    let found = batch.fetch(unique, deadline, obs.call_trace(step)).await;
    obs.call_finished(step, t.elapsed(), found.as_ref().map(|_| ()));
    let out = pick_found(route, step, &batch, found, keys, env.as_ref()).await;
    into_step_output(i, out)
}

fn into_step_output(
    i: usize,
    out: Result<(Val, bool), FlowError>,
) -> (usize, Result<Val, FlowError>, bool) {
    match out {
        Ok((v, incomplete)) => (i, Ok(v), incomplete),
        Err(e) => (i, Err(e), false),
    }
}

async fn pick_found(
    route: &RoutePlan,
    step: &StepPlan,
    batch: &BatchPlan,
    found: Result<Found, FlowError>,
    keys: Vec<(String, Val)>,
    env: Option<&Env>,
) -> Result<(Val, bool), FlowError> {
    match found {
        Err(e) => Err(e.in_step(&step.name)),
        Ok(found) => pick(route, step, batch, &found, keys, env).await,
    }
}

/// A keyed step's value from the fetched values: one value, or a list in input order; and
/// whether some keys were missing (replaced per the step's `missing` policy).
async fn pick(
    route: &RoutePlan,
    step: &StepPlan,
    batch: &BatchPlan,
    found: &Found,
    keys: Vec<(String, Val)>,
    env: Option<&Env>,
) -> Result<(Val, bool), FlowError> {
    let each = step.for_each.is_some();
    let mut out = Vec::with_capacity(keys.len());
    let mut incomplete = false;
    for (k, (key, item)) in keys.into_iter().enumerate() {
        let item = each.then_some((&item, k));
        let Some(v) = found.get(&key) else {
            if matches!(step.missing, Missing::Fail) {
                return Err(
                    FlowError::new(ErrorKind::KeyNotFound, "a key was not found")
                        .in_step(&step.name)
                        .with_backend(&batch.name)
                        .with_detail(format!(
                            "key `{key}` is not in the answer of backend `{}`",
                            batch.name
                        )),
                );
            }
            incomplete = true;
            if let Some(v) = missing_on(route, step, env, item).await? {
                out.push(v);
            }
            continue;
        };
        out.push(map_result_on(route, step, env, v.clone(), item).await?);
    }
    if each {
        Ok((out.into_iter().collect(), incomplete))
    } else {
        Ok((out.pop().unwrap_or(Val::Null), incomplete))
    }
}
