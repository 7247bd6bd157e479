//! Field-level authorization (`graphql.require`): a field whose requirement the request's
//! verified claims (`$request.auth`) fail is `null` with a `FORBIDDEN` field error, and its
//! resolver never runs. The grammar is a route's `auth`: `scopes` all present, a `require`
//! predicate over `$auth` true.

use fanout_config::{ConfigError, FieldRequire, Located, Route};
use fanout_expr::{Expr, Val};

/// One field's requirement, compiled.
pub(crate) struct Requirement {
    scopes: Vec<String>,
    require: Option<Expr>,
}

impl Requirement {
    /// `Err(why)` when `claims` (null for an anonymous request) fail it.
    pub(crate) fn check(&self, claims: &Val) -> Result<(), String> {
        if matches!(claims, Val::Null) {
            return Err("the request is anonymous".into());
        }
        if !self.scopes.is_empty() {
            let has = fanout_auth::scopes(claims);
            if let Some(missing) = self.scopes.iter().find(|s| !has.contains(s)) {
                return Err(format!("the token lacks the scope `{missing}`"));
            }
        }
        if let Some(e) = &self.require {
            match e.eval(&Val::Null, |_| claims.clone()) {
                Ok(v) if fanout_expr::truthy(&v) => {}
                Ok(_) => return Err(format!("`{}` is false", e.source())),
                Err(err) => return Err(format!("`{}` failed: {}", e.source(), err.0)),
            }
        }
        Ok(())
    }

    /// For `fanout explain`.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.scopes.is_empty() {
            parts.push(format!("scopes {}", self.scopes.join(" ")));
        }
        if let Some(e) = &self.require {
            parts.push(format!("require `{}`", e.source()));
        }
        parts.join(", ")
    }
}

/// Whether `route` authenticates its requests (its `auth`, or `defaults.auth`, not `mode: none`).
fn has_auth(cfg: &fanout_config::Config, route: &Route) -> bool {
    route
        .auth
        .as_ref()
        .or(cfg.defaults.auth.as_ref())
        .is_some_and(|a| a.mode != fanout_config::auth::AuthMode::None)
}

/// Compile one requirement, its errors in `errs`.
pub(crate) fn compile(
    cfg: &fanout_config::Config,
    route: &Route,
    key: &Located<String>,
    req: &FieldRequire,
    errs: &mut Vec<ConfigError>,
) -> Option<Requirement> {
    if !has_auth(cfg, route) {
        errs.push(
            ConfigError::at(
                key.pos,
                format!(
                    "graphql.require `{}`: the route has no `auth`, so there are no claims to check",
                    key.value
                ),
            )
            .hint("give the route (or `defaults`) an `auth: {provider: …}`"),
        );
        return None;
    }
    if req.scopes.is_empty() && req.require.is_none() {
        errs.push(
            ConfigError::at(
                key.pos,
                format!("graphql.require `{}` requires nothing", key.value),
            )
            .hint("give `scopes: [...]` and/or `require: '<jq over $auth>'`"),
        );
        return None;
    }
    let require = match &req.require {
        Some(src) => match Expr::compile(&src.value, &["auth"]) {
            Ok(e) => Some(e),
            Err(e) => {
                errs.push(ConfigError::at(
                    src.pos,
                    format!("graphql.require `{}`: {}", key.value, e.message),
                ));
                return None;
            }
        },
        None => None,
    };
    Some(Requirement {
        scopes: req.scopes.clone(),
        require,
    })
}
