//! The gRPC call step (`grpc: {backend, method, message, metadata}`): builds one unary call (one
//! per element with `for_each`) — the message from its jq expression, checked against the
//! method's input type and encoded as protobuf — performs it through the backend's stack, and
//! decodes the answer message to JSON (proto field names, defaults written: docs/grpc.md).
//!
//! The call travels the stack like an HTTP call: path `/package.Service/Method`, the framed
//! message as body, metadata as headers; its operation is `QUERY` for methods without side
//! effects (so dedup and caches share it) and `POST` otherwise. The backend's gRPC client
//! (`fanout-proxy`) sends it, maps `grpc-status` to an HTTP status for the layers and returns
//! the answer message's bytes.

use super::{Prepared, StepArgs, StepCx, StepKind, StepWork};
use crate::call::{
    Env, HttpPlan, Yielded, build_call, eval, eval_item, expr_err, fetch_body, yielded,
};
use crate::ctx::{Ctx, unknown_backend};
use crate::error::{ErrorKind, FlowError};
use bytes::Bytes;
use fanout_config::{ConfigError, Located, Protocol, Step};
use fanout_expr::{Expr, Val};
use fanout_grpc::{CodecError, MessageCodec, MethodInfo};
use fanout_layers::backend::{CallRequest, query_method};
use futures_util::future::BoxFuture;
use http::Method;
use std::sync::Arc;
use tokio::time::Instant;

/// A compiled `grpc` step.
struct GrpcStep {
    /// The call (path, metadata) as every calling step has it; its `body` is unused.
    call: HttpPlan,
    /// The message expression.
    message: Expr,
    /// `package.Service/Method`, for messages.
    method: Arc<str>,
    /// The request message type.
    input: MessageCodec,
    /// The answer message type.
    output: MessageCodec,
}

impl StepKind for GrpcStep {
    fn backend(&self) -> Option<&Arc<str>> {
        Some(&self.call.backend_name)
    }

    fn work(&self) -> StepWork {
        let (backend, method) = (&self.call.backend_name, &self.method);
        StepWork {
            text: format!("grpc {method} on {backend}"),
            label: format!("gRPC {method} {backend}"),
            io: super::StepIo::Calls {
                backend: backend.to_string(),
                idempotent: self.call.idempotent,
                writes: (self.call.method == Method::POST).then(|| {
                    format!(
                        "the gRPC method `{method}` of `{backend}`, which may have side effects (its \
                         .proto does not say `idempotency_level = NO_SIDE_EFFECTS`)"
                    )
                }),
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
        super::prepare_calls(items, |item| self.build(step, env, item, deadline))
    }

    fn call<'a>(
        &'a self,
        step: &'a StepArgs<'a>,
        req: CallRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Val, FlowError>> {
        fanout_layers::boxed::pinned(|| async move {
            let body = fetch_body(step.name, &self.call, req, step.timeout, deadline).await?;
            self.decode(step.name, body).await
        })
    }
}

impl GrpcStep {
    /// One call: path and metadata by `build_call`, the message by its expression, checked
    /// against the input type and encoded (framed) straight from the value.
    fn build(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        item: Option<(&Val, usize)>,
        deadline: Instant,
    ) -> Result<Result<CallRequest, FlowError>, Yielded> {
        let mut req = match yielded(build_call(&self.call, env, item, deadline))? {
            Ok(r) => r,
            Err(e) => return Ok(Err(e.in_step(step.name, &self.call.backend_name))),
        };
        let message = match item {
            Some((it, k)) => eval_item(&self.message, env, &Val::Null, it, k),
            None => eval(&self.message, env, &Val::Null),
        };
        let message = match yielded(message)? {
            Ok(v) => v,
            Err(e) => return Ok(Err(expr_err(step.name, "building the message", e))),
        };
        let mut out = Vec::with_capacity(64);
        out.resize(fanout_grpc::frame::HEADER_LEN, 0);
        if let Err(e) = self.input.encode_val(&message, &mut out) {
            return Ok(Err(message_error(step.name, &self.method, &self.input, &e)));
        }
        let len = (out.len() - fanout_grpc::frame::HEADER_LEN) as u32;
        out[1..fanout_grpc::frame::HEADER_LEN].copy_from_slice(&len.to_be_bytes());
        if let Some(h) = req.as_http_mut() {
            h.body = Bytes::from(out);
        }
        Ok(Ok(req))
    }

    /// The answer message → a value (a large one on the compute pool).
    async fn decode(&self, step_name: &Arc<str>, body: Bytes) -> Result<Val, FlowError> {
        let h = &self.call;
        let body_len = body.len();
        let output = self.output.clone();
        let depth = h.max_depth;
        let work = move || -> Result<Result<Val, String>, CodecError> {
            Ok(output.decode_val(&body, depth).map_err(|e| e.to_string()))
        };
        let parsed = if h.compute.started() && body_len >= h.compute.offload_bytes {
            h.compute.run(work).await.map_err(|e| {
                FlowError::new(ErrorKind::Overloaded, e.to_string())
                    .in_step(step_name)
                    .with_backend(&h.backend_name)
            })?
        } else {
            work()
        };
        let bad = |detail: String| {
            FlowError::new(
                ErrorKind::BadBackendAnswer,
                format!("the backend's answer is not a valid {}", self.output.name()),
            )
            .in_step(step_name)
            .with_backend(&h.backend_name)
            .with_detail(format!("backend `{}`: {detail}", h.backend_name))
        };
        match parsed {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(bad(e)),
            Err(e) => Err(bad(e.to_string())),
        }
    }
}

/// A message that does not fit its type: the client learns which field (names come from the
/// `.proto` and the flow, not from data); values stay in the detail.
fn message_error(step: &Arc<str>, method: &str, codec: &MessageCodec, e: &CodecError) -> FlowError {
    let detail = e.to_string();
    let field = detail
        .split_once("unrecognized field name '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(f, _)| f);
    let message = match field {
        Some(f) => format!(
            "the message built for `{method}` has a field `{f}` that {} does not have",
            codec.name()
        ),
        None => format!(
            "the message built for `{method}` does not fit its type {}",
            codec.name()
        ),
    };
    FlowError::new(ErrorKind::Expression, message)
        .in_step(step)
        .with_detail(format!("building the message for `{method}`: {detail}"))
}

/// The method a config names (`what`: "route" or "step `x`"), from the loaded `.proto` files;
/// unary only unless `streaming_ok` (a pass-through route). Errors are reported in `cx` at the name's position.
pub(crate) fn grpc_method(
    cx: &mut Ctx<'_>,
    name: &Located<String>,
    what: &str,
    streaming_ok: bool,
) -> Option<MethodInfo> {
    if cx.protos.is_empty() {
        cx.errs.push(
            ConfigError::at(
                name.pos,
                format!("{what}: gRPC method `{}` needs `.proto` files", name.value),
            )
            .hint("list them under `protos: {files: [...], include: [...]}` (docs/grpc.md)"),
        );
        return None;
    }
    match cx.protos.method(&name.value) {
        Ok(m) if m.streaming && !streaming_ok => {
            cx.errs.push(
                ConfigError::at(
                    name.pos,
                    format!("{what}: `{}` is a streaming method", name.value),
                )
                .hint(
                    "a flow serves and calls unary methods only; a streaming method is served by \
                     a pass-through route (`pass: {backend: …}`, docs/grpc.md)",
                ),
            );
            None
        }
        Ok(m) => Some(m),
        Err(e) => {
            let hint = match e.candidates() {
                Some((wrong, known)) => fanout_config::did_you_mean(wrong, known.iter())
                    .unwrap_or_else(|| {
                        if known.is_empty() {
                            "the loaded .proto files have none".to_string()
                        } else {
                            format!("there are: {}", known.join(", "))
                        }
                    }),
                None => "write `package.Service/Method`".to_string(),
            };
            cx.errs
                .push(ConfigError::at(name.pos, format!("{what}: {e}")).hint(hint));
            None
        }
    }
}

/// The fields a config's literal message (`src`, an expression) names that `codec`'s type does
/// not have: errors at their line and column, with a did-you-mean hint.
pub(crate) fn check_message_fields(
    cx: &mut Ctx<'_>,
    src: &fanout_config::ExprSrc,
    codec: &MessageCodec,
    what: &str,
) {
    let mut unknown = Vec::new();
    super::grpc_fields::unknown_fields(&src.value, 0, src.value.len(), codec, 0, &mut unknown);
    for u in unknown {
        let pos = cx.cfg.pos_in_scalar(src.pos, &src.value, u.offset);
        let hint = fanout_config::did_you_mean(&u.name, u.fields.iter())
            .unwrap_or_else(|| format!("{} has: {}", u.message, u.fields.join(", ")));
        cx.errs.push(
            ConfigError::at(
                pos,
                format!("{what}: message {} has no field `{}`", u.message, u.name),
            )
            .hint(hint),
        );
    }
}

/// `grpc:`.
pub(super) fn compile(sc: &mut StepCx<'_, '_>, step: &Step) -> Option<Option<Box<dyn StepKind>>> {
    let g = step.grpc.as_ref()?;
    let step_name = sc.name.value.clone();
    let what = format!("step `{step_name}`");
    let backend = sc.backends.get(&g.backend.value).cloned();
    let backend_cfg = sc.cx.cfg.backends.get(&g.backend.value);
    sc.backend_timeout = backend_cfg.and_then(|b| b.timeout);
    match backend_cfg {
        None => {
            let e = unknown_backend(sc.cx.cfg, g.backend.pos, "", &g.backend.value);
            sc.cx.errs.push(e);
        }
        Some(b) if b.protocol != Protocol::Grpc => sc.cx.errs.push(
            ConfigError::at(
                g.backend.pos,
                format!("{what}: backend `{}` does not speak gRPC", g.backend.value),
            )
            .hint("set `protocol: grpc` on the backend, or call it with an `http:` step"),
        ),
        Some(_) => {}
    }
    let method = grpc_method(sc.cx, &g.method, &what, false);
    let item_ok = sc.in_each;
    let message = match &g.message {
        Some(src) => sc.expr(Some(src), item_ok),
        None => Expr::compile("{}", &[]).ok(),
    };
    let mut headers = Vec::new();
    for (k, v) in &g.metadata {
        let hn = sc.cx.header_name(k, v.pos);
        if let (Some(hn), Some(e)) = (hn, sc.expr(Some(v), item_ok)) {
            headers.push((hn, e));
        }
    }
    if let (Some(m), Some(src)) = (&method, &g.message) {
        check_message_fields(sc.cx, src, &m.input, &what);
    }
    let (backend, method, message) = (backend?, method?, message?);
    let path = Expr::compile(&format!("{:?}", method.path), &[]).ok()?;
    // Retried and hedged when idempotent; shared and cached when without side effects (the
    // .proto's idempotency_level, or the step saying so).
    let safe = g.idempotent.unwrap_or(method.no_side_effects);
    let idempotent = g.idempotent.unwrap_or(method.idempotent);
    let cfg = sc.cx.cfg;
    let call = HttpPlan {
        backend,
        backend_name: g.backend.value.as_str().into(),
        method: if safe { query_method() } else { Method::POST },
        const_path: crate::call::const_path(&method.path),
        path,
        query: Vec::new(),
        headers,
        body: None,
        idempotent,
        compute: sc.cx.compute.clone(),
        max_depth: cfg.server.expressions.max_depth,
        status_passthrough: backend_cfg.is_some_and(|b| b.status_passthrough),
    };
    Some(Some(Box::new(GrpcStep {
        call,
        message,
        method: g.method.value.trim().trim_start_matches('/').into(),
        input: method.input.clone(),
        output: method.output.clone(),
    })))
}
