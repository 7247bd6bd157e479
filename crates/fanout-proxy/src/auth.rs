//! The authentication stage (docs/config.md#auth--authentication): right after routing, before the
//! deadline and the body, the route's policy (`fanout_auth::Policy`, from its `auth` or
//! `defaults.auth`) decides: the request's token is read and verified by `fanout-auth`, and
//! its verified claims become `$request.auth` (`null` when the route has no policy or the
//! request is anonymous on an optional route). Each request is authenticated on its own,
//! before it may join a coalesced run; what a flow reads of `$request.auth` is part of the
//! coalescing key, as of any backend call that carries it.

use crate::Gateway;
use crate::answer::Refusal;
use crate::lifecycle::Req;
use fanout_expr::Val;
use fanout_flow::RoutePlan;

impl Gateway {
    /// Authenticate: the verified claims (`null` without a policy or for an anonymous request
    /// on an optional route), or the refusal (401, 403, 503) with its reason for the log.
    pub(crate) async fn authenticate(
        &self,
        cx: &Req<'_, '_>,
        route: &RoutePlan,
    ) -> Result<Val, Refusal<'static>> {
        let auth = &cx.live.auth;
        let Some(policy) = auth.policy(route.index) else {
            return Ok(Val::Null);
        };
        auth.authenticate(policy, &cx.parts.headers, cx.parts.uri.query())
            .await
            .map_err(Refusal::Auth)
    }
}
