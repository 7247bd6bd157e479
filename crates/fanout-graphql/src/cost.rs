//! Cost limits per client (`graphql.cost_limit`): a `rate_limits` policy — its key telling
//! clients apart, its `rate` and `burst` read as cost units — charged each operation's
//! estimated cost (the estimate `limits.max_cost` bounds) instead of 1, before any backend call.
//! The budget is the route's own (POST and GET share it), kept by `fanout-ratelimit`'s GCRA.

use fanout_config::ratelimit::RateLimitStore;
use fanout_config::{ConfigError, GraphqlRoute};
use fanout_expr::{Expr, Val};
use fanout_ratelimit::{Policy, Spec};
use std::sync::Arc;
use std::time::Duration;

/// A route's cost budget: the policy's key and the route's state.
pub(crate) struct CostLimit {
    pub(crate) name: String,
    key: Expr,
    policy: Arc<Policy>,
}

/// What the key, the policy and its rate say; how the route's shared state is made.
pub(crate) struct CostSpec {
    name: String,
    key: Expr,
    spec: Spec,
}

/// Check `g.cost_limit` against `cfg.rate_limits` (errors in `errs`).
pub(crate) fn spec(
    cfg: &fanout_config::Config,
    g: &GraphqlRoute,
    errs: &mut Vec<ConfigError>,
) -> Option<CostSpec> {
    let name = g.cost_limit.as_ref()?;
    let Some(p) = cfg.rate_limits.get(&name.value) else {
        let mut e = ConfigError::at(
            name.pos,
            format!(
                "graphql.cost_limit `{}` is not a policy of `rate_limits`",
                name.value
            ),
        );
        if let Some(h) =
            fanout_names::did_you_mean(&name.value, cfg.rate_limits.keys().map(String::as_str))
        {
            e = e.hint(h);
        }
        errs.push(e);
        return None;
    };
    if p.store != RateLimitStore::Local {
        errs.push(
            ConfigError::at(
                name.pos,
                format!(
                    "graphql.cost_limit `{}`: the policy is `store: redis`; a cost budget is local for now",
                    name.value
                ),
            )
            .hint("name a policy with `store: local` (each instance enforces the whole budget)"),
        );
        return None;
    }
    // The key's own errors are reported by the rate-limit stage, at their position.
    let key = Expr::compile(&p.key.value, &["request"]).ok()?;
    Some(CostSpec {
        name: name.value.clone(),
        key,
        spec: Spec {
            name: name.value.clone(),
            per_second: p.per_second(),
            burst: p.burst_size(),
            max_keys: p.max_keys,
            shared: None,
        },
    })
}

impl CostSpec {
    /// The route's budget, its state `policy` (shared by the route's POST and GET halves).
    pub(crate) fn policy(&self) -> Arc<Policy> {
        Arc::new(Policy::new(&self.spec))
    }

    pub(crate) fn limit(self, policy: Arc<Policy>) -> CostLimit {
        CostLimit {
            name: self.name,
            key: self.key,
            policy,
        }
    }
}

impl CostLimit {
    /// Charge `cost` to the client of `request`: `Err(retry after)` when its budget is short.
    pub(crate) fn charge(&self, request: &Val, cost: u64) -> Result<(), Duration> {
        let mut key = Vec::new();
        match self.key.eval(&Val::Null, |_| request.clone()) {
            Ok(Val::TStr(s) | Val::BStr(s)) => key.extend_from_slice(&s),
            Ok(v) => fanout_expr::json::write(&v, &mut key),
            Err(_) => key.extend_from_slice(b"\0key-error"),
        }
        match self.policy.decide_cost(&key, cost) {
            Some(v) if !v.decision.allowed => Err(v.decision.retry_after),
            _ => Ok(()),
        }
    }

    /// The budget's burst (cost units that may be spent at once).
    pub(crate) fn burst(&self) -> u64 {
        self.policy.burst()
    }
}
