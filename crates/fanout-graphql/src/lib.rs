//! fanout's GraphQL front (docs/graphql.md): a route's `graphql:` section — a schema in SDL and
//! a step per resolved field — compiled once, checked against the schema at load; operations
//! parsed and validated by apollo-compiler (cached per document text), refused by the route's
//! limits before any backend call, then executed field by field on the flow engine: a field's
//! resolver is a flow of its own, run once for all the parents of a level (a list's elements
//! resolved in one run: one batch call, or one call per distinct call), independent fields
//! at once, mutations' root fields in order, the request's deadline over the whole operation.
//!
//! The route is a flow of one step, `graphql`, of the kind this crate registers
//! ([`STEP_KIND`], a line in `fanout-proxy`'s `STEP_KINDS`): the gateway's edge stages,
//! admission, deadline, metrics and traces apply to it as to every flow.

#![forbid(unsafe_code)]

mod authz;
mod cache;
mod cost;
mod exec;
mod limits;
mod persisted;
mod request;
mod schema;

pub use schema::Api;

use fanout_expr::Val;
use fanout_flow::kind::{
    Env, FlowError, Prepared, Registration, SLOT_REQUEST, StepArgs, StepCx, StepIo, StepKind,
    StepWork, Yielded,
};
use std::sync::Arc;
use tokio::time::Instant;

/// The `graphql` step kind's line in the gateway's list of step kinds.
pub const STEP_KIND: Registration = Registration {
    compile,
    errors: &[],
};

/// The compiled GraphQL route: the step that runs an operation.
struct GraphqlStep {
    api: Arc<Api>,
}

fn compile(
    sc: &mut StepCx<'_, '_>,
    _step: &fanout_config::Step,
) -> Option<Option<Box<dyn StepKind>>> {
    if sc.name().value != "graphql" || sc.name().pos.line != 0 {
        return None;
    }
    let key = sc.key();
    let cfg = sc.config();
    // the step's key is `METHOD PATH graphql`, the method as the compiler spells it
    let route = cfg.routes.iter().find(|r| {
        r.graphql.is_some()
            && key
                .strip_suffix(&format!(" {} graphql", r.path.value))
                .is_some_and(|m| m.eq_ignore_ascii_case(&r.method.value))
    })?;
    let g = route.graphql.as_ref()?;
    // `$request` is read whole: every part may be read by a resolver.
    let all = fanout_config::Located::unknown("$request".to_string());
    sc.expr(Some(&all), false);
    Some(
        Api::compile(sc, route, g)
            .map(|api| Box::new(GraphqlStep { api: Arc::new(api) }) as Box<dyn StepKind>),
    )
}

impl StepKind for GraphqlStep {
    fn work(&self) -> StepWork {
        let text = format!("graphql: {}", self.api.describe());
        StepWork {
            text,
            label: "GraphQL".into(),
            io: match self.api.writer() {
                Some((backend, what)) => StepIo::Calls {
                    backend,
                    idempotent: false,
                    writes: Some(what),
                },
                None => StepIo::None,
            },
        }
    }

    fn prepare(
        &self,
        _step: &StepArgs<'_>,
        env: &Env,
        _items: Option<Arc<Vec<Val>>>,
        deadline: Instant,
    ) -> Result<Prepared, Yielded> {
        let request = env.slot(SLOT_REQUEST);
        let api = self.api.clone();
        let task: fanout_flow::kind::Task = Box::new(move |trace| {
            Box::pin(async move {
                let answer = exec::serve(&api, &request, deadline, trace).await;
                Ok::<_, FlowError>(vec![answer])
            })
        });
        Ok(Prepared::Task(task, None))
    }
}
