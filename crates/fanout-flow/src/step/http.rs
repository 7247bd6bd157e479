//! The HTTP call step (`http: {backend, path, …}`): builds one call (one per element with
//! `for_each`) from expressions and performs it through the backend's stack. Also the one
//! compiler of an HTTP call ([`compile_call`]), shared with batch forms and reference data.

use super::{Prepared, StepArgs, StepCx, StepKind, StepWork};
use crate::call::{Env, HttpPlan, Yielded, build_call, fetch_json, yielded};
use crate::ctx::{Ctx, unknown_backend};
use crate::error::FlowError;
use fanout_config::{ExprSrc, Located, Step};
use fanout_expr::{Expr, Val};
use fanout_layers::backend::{Backend, CallRequest};
use futures_util::future::BoxFuture;
use http::Method;
use indexmap::IndexMap;
use std::sync::Arc;
use tokio::time::Instant;

/// A compiled `http` step.
struct HttpStep(HttpPlan);

impl StepKind for HttpStep {
    fn backend(&self) -> Option<&Arc<str>> {
        Some(&self.0.backend_name)
    }

    fn work(&self) -> StepWork {
        let (backend, method) = (&self.0.backend_name, &self.0.method);
        StepWork {
            text: format!("http {method} {backend}"),
            label: format!("{method} {backend}"),
            io: super::StepIo::Calls {
                backend: backend.to_string(),
                idempotent: self.0.idempotent,
                writes: (method != http::Method::GET && method != http::Method::HEAD)
                    .then(|| format!("an HTTP {method} call to `{backend}`")),
            },
        }
    }

    fn prepare(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        items: Option<Arc<Vec<Val>>>,
        deadline: Instant,
    ) -> Result<Prepared, Yielded> {
        let h = &self.0;
        super::prepare_calls(items, |item| {
            Ok(yielded(build_call(h, env, item, deadline))?
                .map_err(|e| e.in_step(step.name, &h.backend_name)))
        })
    }

    fn call_ends_by_deadline(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        step: &'a StepArgs<'a>,
        req: CallRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Val, FlowError>> {
        fanout_layers::boxed::pinned(|| {
            fetch_json(step.name, &self.0, req, step.timeout, deadline, step.memory)
        })
    }
}

/// `http` without `key`.
pub(super) fn compile(sc: &mut StepCx<'_, '_>, step: &Step) -> Option<Option<Box<dyn StepKind>>> {
    let h = step.http.as_ref().filter(|h| h.key.is_none())?;
    if h.path.is_none() {
        let name = &sc.name.value;
        sc.cx.errs.push(
            fanout_config::ConfigError::at(
                h.backend.pos,
                format!("step `{name}`: `http` needs `path` (or `key` for a batch lookup)"),
            )
            .hint("e.g. `path: '\"/items/\\($item)\"'`"),
        );
    }
    let backend = sc.backends.get(&h.backend.value).cloned();
    sc.backend_timeout = sc
        .cx
        .cfg
        .backends
        .get(&h.backend.value)
        .and_then(|b| b.timeout);
    let StepCx {
        cx,
        scope,
        exprs,
        in_each,
        ..
    } = sc;
    let src = CallSrc::of(h);
    let item_ok = *in_each;
    let call = compile_call(cx, scope, src, backend, &mut |e, s| {
        exprs.push((e.clone(), s.clone(), item_ok))
    });
    check_backend(sc, &h.backend);
    Some(call.map(|c| Box::new(HttpStep(c)) as Box<dyn StepKind>))
}

/// The config of one HTTP call, wherever it comes from (a step's `http`, a batch form, a
/// reference dataset).
pub(crate) struct CallSrc<'s> {
    /// The backend's name.
    pub(crate) backend_name: &'s str,
    /// Method.
    pub(crate) method: &'s Located<String>,
    /// Path expression (required: `None` compiles nothing more than the other parts, to report
    /// their errors).
    pub(crate) path: Option<&'s ExprSrc>,
    /// Query expressions.
    pub(crate) query: &'s IndexMap<String, ExprSrc>,
    /// Header expressions (batch forms have none).
    pub(crate) headers: Option<&'s IndexMap<String, ExprSrc>>,
    /// Body expression.
    pub(crate) body: Option<&'s ExprSrc>,
    /// `idempotent:`; unset means GET and HEAD are.
    pub(crate) idempotent: Option<bool>,
}

impl<'s> CallSrc<'s> {
    /// The call of an `http:` block (a step's, or a reference dataset's).
    pub(crate) fn of(h: &'s fanout_config::HttpCall) -> CallSrc<'s> {
        CallSrc {
            backend_name: &h.backend.value,
            method: &h.method,
            path: h.path.as_ref(),
            query: &h.query,
            headers: Some(&h.headers),
            body: h.body.as_ref(),
            idempotent: h.idempotent,
        }
    }
}

/// Compile an HTTP call: method, path, query, headers and body (each expression in `scope`,
/// passed to `record`). Every error is reported in `cx`; `None` when there was one or when the
/// backend is unknown (`backend` is `None`: reported by the caller, which knows the context).
pub(crate) fn compile_call(
    cx: &mut Ctx<'_>,
    scope: &[&str],
    src: CallSrc<'_>,
    backend: Option<Arc<dyn Backend>>,
    record: &mut dyn FnMut(&Expr, &ExprSrc),
) -> Option<HttpPlan> {
    let mut expr = |cx: &mut Ctx<'_>, s: &ExprSrc| {
        let e = cx.expr(s, scope)?;
        record(&e, s);
        Some(e)
    };
    let method = cx.method(src.method);
    let path = src.path.and_then(|p| expr(cx, p));
    let mut query = Vec::new();
    for (k, v) in src.query {
        if let Some(e) = expr(cx, v) {
            query.push((k.clone(), e));
        }
    }
    let mut headers = Vec::new();
    for (k, v) in src.headers.into_iter().flatten() {
        let hn = cx.header_name(k, v.pos);
        if let (Some(hn), Some(e)) = (hn, expr(cx, v)) {
            headers.push((hn, e));
        }
    }
    let body = src.body.and_then(|b| expr(cx, b));
    let (backend, method, path) = (backend?, method?, path?);
    Some(HttpPlan {
        backend,
        backend_name: src.backend_name.into(),
        idempotent: src
            .idempotent
            .unwrap_or(method == Method::GET || method == Method::HEAD),
        method,
        const_path: src
            .path
            .and_then(|p| serde_json::from_str::<String>(&p.value).ok())
            .and_then(|p| crate::call::const_path(&p)),
        path,
        query,
        headers,
        body,
        compute: cx.compute.clone(),
        max_depth: cx.cfg.server.expressions.max_depth,
        status_passthrough: cx
            .cfg
            .backends
            .get(src.backend_name)
            .is_some_and(|b| b.status_passthrough),
    })
}

/// The "unknown backend" error of a step's `http.backend`, when it is unknown, or the error of a
/// gRPC backend called by `http:`.
fn check_backend(sc: &mut StepCx<'_, '_>, backend: &Located<String>) {
    if !sc.backends.contains_key(&backend.value) {
        let e = unknown_backend(sc.cx.cfg, backend.pos, "", &backend.value);
        sc.cx.errs.push(e);
    } else if sc
        .cx
        .cfg
        .backends
        .get(&backend.value)
        .is_some_and(|b| b.protocol == fanout_config::Protocol::Grpc)
    {
        sc.cx.errs.push(
            fanout_config::ConfigError::at(
                backend.pos,
                format!("backend `{}` speaks gRPC", backend.value),
            )
            .hint("call it with a `grpc: {backend, method, message}` step"),
        );
    }
}
