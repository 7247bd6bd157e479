//! A route's response: `respond.body`, `status` and `headers` evaluated over the finished
//! steps, with the `_partial` list of optional steps that fell back to their default.

use crate::call::{Env, Yielded, eval, expr_failure, short_json, yielded};
use crate::error::{ErrorKind, FlowError};
use bytes::Bytes;
use fanout_expr::Expr;
use fanout_expr::{Val, json};
use http::{HeaderName, HeaderValue};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

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

/// The response of a route.
pub struct RespondPlan {
    /// Body expression.
    pub body: Expr,
    /// Status code, fixed or computed.
    pub status: StatusPlan,
    /// Header expressions.
    pub headers: Vec<(HeaderName, Expr)>,
    /// Whether an object body gets the `_partial` list and is written as JSON — not for gRPC
    /// routes, whose answer is a typed message encoded from the value ([`crate::Outcome`]'s
    /// `value`; their partial list is the `x-fanout-partial` metadata only).
    pub partial_in_body: bool,
    /// The size class of the route's last JSON body, where the next one's buffer starts.
    pub body_size: BodySizeHint,
}

/// `respond.status`.
pub enum StatusPlan {
    /// A fixed status.
    Fixed(u16),
    /// An expression giving the status.
    Expr(Expr),
}

/// The size class (a power of two) of a route's last JSON body: the next body is written into a
/// buffer of that capacity, so that it is at most twice the body and the allocator shrinks it to
/// the body's size in place — a `Bytes` made from a buffer of exactly its size needs no shared
/// header allocated beside it (one allocation and one atomic count less per answer). Stored
/// only when the class changes: the plan is read by every worker.
#[derive(Debug, Default)]
pub struct BodySizeHint(AtomicUsize);

impl BodySizeHint {
    /// Smallest and largest starting capacity (a larger body grows its buffer as before).
    const MIN: usize = 64;
    const MAX: usize = 64 << 10;

    fn capacity(&self) -> usize {
        self.0.load(Relaxed).clamp(Self::MIN, Self::MAX)
    }

    fn observe(&self, len: usize) {
        let class = len.checked_next_power_of_two().unwrap_or(Self::MAX);
        let class = class.clamp(Self::MIN, Self::MAX);
        if self.0.load(Relaxed) != class {
            self.0.store(class, Relaxed);
        }
    }
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
    let mut out = Vec::with_capacity(plan.body_size.capacity());
    json::write(&body, &mut out);
    plan.body_size.observe(out.len());
    Ok(Ok(Outcome {
        status,
        headers,
        // Exactly its size ([`BodySizeHint`]): no header for the `Bytes` to share.
        body: Bytes::from(out.into_boxed_slice()),
        value: None,
        partial: partial.to_vec(),
    }))
}
