//! A route's response: `respond.body`, `status` and `headers` evaluated over the finished
//! steps, with the `_partial` list of optional steps that fell back to their default.

use crate::call::{Env, Yielded, eval, expr_failure, short_json, yielded};
use crate::error::{ErrorKind, FlowError};
use crate::plan::{RespondPlan, StatusPlan};
use bytes::Bytes;
use fanout_expr::{Val, json};
use http::{HeaderName, HeaderValue};
use std::sync::Arc;

/// Header naming the optional steps that fell back to their default.
pub const PARTIAL_HEADER: &str = "x-fanout-partial";

/// A finished response.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Status code.
    pub status: u16,
    /// Headers from `respond.headers` (plus `x-fanout-partial` when steps fell back).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// JSON body (empty when the answer is kept as `value`).
    pub body: Bytes,
    /// The body as a value, unserialized, for gRPC routes (their answer is encoded as a
    /// protobuf message from it; an HTTP client of such a route gets it as JSON).
    pub value: Option<fanout_expr::Val>,
    /// Optional steps that failed and used their default.
    pub partial: Vec<Arc<str>>,
}

/// A status code (100–599) from an expression's value.
fn status_of(v: &Val) -> Option<u16> {
    match v {
        Val::Num(n) => n.as_isize(),
        _ => None,
    }
    .and_then(|i| u16::try_from(i).ok())
    .filter(|s| (100..=599).contains(s))
}

/// The response: `respond.body`, status and headers evaluated in `env`'s mode.
pub(crate) fn respond_with(
    plan: &RespondPlan,
    env: &Env,
    partial: &[Arc<str>],
) -> Result<Result<Outcome, FlowError>, Yielded> {
    let mut body = match yielded(eval(&plan.body, env, &Val::Null))? {
        Ok(b) => b,
        Err(e) => return Ok(Err(expr_failure("respond.body", e))),
    };
    let status = match &plan.status {
        StatusPlan::Fixed(s) => *s,
        StatusPlan::Expr(x) => match yielded(eval(x, env, &Val::Null))? {
            Ok(v) => match status_of(&v) {
                Some(n) => n,
                None => {
                    return Ok(Err(FlowError::new(
                        ErrorKind::Expression,
                        "respond.status did not give a status code (100–599)",
                    )
                    .with_detail(format!("respond.status gave {}", short_json(&v)))));
                }
            },
            Err(e) => return Ok(Err(expr_failure("respond.status", e))),
        },
    };
    let mut headers = Vec::new();
    for (name, e) in &plan.headers {
        let v = match yielded(eval(e, env, &Val::Null))? {
            Ok(v) => v,
            Err(e) => return Ok(Err(expr_failure(&format!("respond header `{name}`"), e))),
        };
        if matches!(v, Val::Null) {
            continue;
        }
        let text = json::to_display(&v);
        let Ok(hv) = HeaderValue::from_str(&text) else {
            return Ok(Err(FlowError::new(
                ErrorKind::Expression,
                format!("respond header `{name}` is not a valid header value"),
            )
            .with_detail(format!("respond header `{name}`: {}", short_json(&v)))));
        };
        headers.push((name.clone(), hv));
    }
    if !partial.is_empty() {
        let list = partial.iter().map(|s| &**s).collect::<Vec<_>>().join(",");
        if let Ok(hv) = HeaderValue::from_str(&list) {
            headers.push((HeaderName::from_static(PARTIAL_HEADER), hv));
        }
        if plan.partial_in_body
            && let Val::Obj(o) = &mut body
        {
            let names: Val = partial.iter().map(|s| json::str_val(s)).collect();
            Arc::make_mut(o).insert(json::str_val("_partial"), names);
        }
    }
    if !plan.partial_in_body {
        // A gRPC route: the answer is encoded from the value, no JSON in between.
        return Ok(Ok(Outcome {
            status,
            headers,
            body: Bytes::new(),
            value: Some(body),
            partial: partial.to_vec(),
        }));
    }
    let mut out = Vec::with_capacity(256);
    json::write(&body, &mut out);
    Ok(Ok(Outcome {
        status,
        headers,
        body: Bytes::from(out),
        value: None,
        partial: partial.to_vec(),
    }))
}
