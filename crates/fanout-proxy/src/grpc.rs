//! Inbound gRPC on the gateway's port (docs/grpc.md): routes with `grpc:` served as unary
//! methods, server reflection and health.
//!
//! A request is gRPC when its `content-type` starts with `application/grpc`. Its lifecycle is
//! the HTTP one with gRPC's framing and statuses ([`Gateway::grpc_lifecycle`]): route by path
//! (`/package.Service/Method`; unknown → UNIMPLEMENTED), deadline (`grpc-timeout`), body (one
//! message of at most `server.grpc.max_message_bytes`, refused by its announced length before
//! the rest is read; compressed with gzip when `grpc-encoding` says so, inflated within the
//! same limit: [`crate::grpc_compression`]), the message decoded to JSON as `$request.body`,
//! admission (RESOURCE_EXHAUSTED when full), the flow, then `respond.body` encoded as the
//! answer message (a field the type does not have is INTERNAL, naming it; gzip-compressed for
//! a client that accepts gzip). Every answer says `grpc-accept-encoding: gzip, identity`.
//! Every refusal or failure is the
//! [`ApiError`] an HTTP client would get, answered trailers-only with the gRPC code of its
//! status and code ([`fanout_grpc::Code::for_answer`]) and its safe message as `grpc-message`.

use crate::answer::{ApiError, BodyRefusal};
use crate::grpc_compression::{self as gz, GRPC_ACCEPT_ENCODING, GRPC_ENCODING, Inflate};
use crate::lifecycle::{Req, build_request, route};
use crate::{Gateway, Live};
use bytes::Bytes;
use fanout_config::{Config, ConfigError, ConfigErrors};
use fanout_flow::RoutePlan;
use fanout_grpc::{Code, ProtoLimits, ProtoSet, frame, status};
use fanout_transport::body::Body;
use futures_util::future::BoxFuture;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::borrow::Cow;
use std::sync::Arc;
use tokio::time::Instant;

/// Paths of the gRPC services fanout serves itself.
const REFLECTION_V1: &str = "/grpc.reflection.v1.ServerReflection/";
const REFLECTION_V1ALPHA: &str = "/grpc.reflection.v1alpha.ServerReflection/";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// Longest `grpc-message` sent, in bytes.
const MAX_STATUS_MESSAGE: usize = 1024;

/// The config's `.proto` files compiled (`None` without `protos:`). Reads files: run at start
/// and on the blocking pool at reload.
pub fn load_protos(cfg: &Config) -> Result<Option<Arc<ProtoSet>>, ConfigErrors> {
    if cfg.protos.is_empty() {
        return Ok(None);
    }
    let (files, include) = cfg
        .protos
        .resolve(fanout_config::config_dir(&cfg.file).as_deref());
    let limits = ProtoLimits {
        max_file_bytes: cfg.protos.max_file_bytes,
        max_files: cfg.protos.max_files,
    };
    ProtoSet::compile(&files, &include, limits)
        .map(|p| Some(Arc::new(p)))
        .map_err(|e| {
            let file = e
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .or(e.file.clone())
                .unwrap_or_else(|| cfg.file.clone());
            let pos = e.line_col.map(|(l, c)| fanout_config::Pos {
                line: l as u32,
                col: c as u32,
            });
            ConfigErrors(vec![ConfigError {
 path: None,
                file,
                pos,
                message: format!("in the `protos:` files: {}", e.message),
                hint: Some(
                    "fanout compiles .proto files itself (like protoc): check the file and the `protos.include` directories".into(),
                ),
            }])
        })
}

type Serve =
    Arc<dyn Fn(Request<Incoming>) -> BoxFuture<'static, Response<tonic::body::Body>> + Send + Sync>;

/// The gRPC services of one config: server reflection over its routes' services.
pub(crate) struct GrpcServices {
    reflection_v1: Serve,
    reflection_v1alpha: Serve,
}

/// Reflection over the services the routes serve (and reflection and health themselves);
/// `None` when no route is a gRPC method.
pub(crate) fn services(
    cfg: &Config,
    protos: &ProtoSet,
    routes: &[Arc<RoutePlan>],
) -> Result<Option<Arc<GrpcServices>>, ConfigErrors> {
    let mut names: Vec<String> = routes
        .iter()
        .filter_map(|r| r.grpc.as_ref())
        .map(|g| g.method.desc.parent_service().full_name().to_string())
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    names.sort();
    names.dedup();
    let build_err = |e: tonic_reflection::server::Error| {
        ConfigErrors(vec![ConfigError {
            path: None,
            file: cfg.file.clone(),
            pos: None,
            message: format!("server reflection over the `protos:` files failed: {e}"),
            hint: None,
        }])
    };
    let fds = protos.file_descriptor_set().clone();
    let builder = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(&fds)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(HEALTH_SERVICE);
        for n in &names {
            b = b.with_service_name(n.clone());
        }
        b
    };
    let v1 = builder().build_v1().map_err(build_err)?;
    let v1alpha = builder().build_v1alpha().map_err(build_err)?;
    Ok(Some(Arc::new(GrpcServices {
        reflection_v1: Arc::new(move |req| {
            let mut s = v1.clone();
            fanout_layers::boxed::pinned(|| async move {
                use tonic::codegen::Service;
                match s.call(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            })
        }),
        reflection_v1alpha: Arc::new(move |req| {
            let mut s = v1alpha.clone();
            fanout_layers::boxed::pinned(|| async move {
                use tonic::codegen::Service;
                match s.call(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            })
        }),
    })))
}

/// The HTTP status that counts for metrics when the answer is a gRPC failure (the HTTP status
/// of a gRPC answer is always 200).
#[derive(Clone, Copy)]
pub(crate) struct EffectiveStatus(pub(crate) StatusCode);

impl Gateway {
    /// Reflection and health: the services fanout serves itself, outside the route lifecycle.
    /// `Err(req)` when the request is for neither.
    pub(crate) async fn grpc_builtin(
        &self,
        live: &Live,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Request<Incoming>> {
        let path = req.uri().path();
        let cfg = &self.limits.grpc;
        if path == HEALTH_CHECK && cfg.health {
            return Ok(self.health_check(live, req).await);
        }
        let serve = match (&live.grpc, cfg.reflection) {
            (Some(g), true) if path.starts_with(REFLECTION_V1) => g.reflection_v1.clone(),
            (Some(g), true) if path.starts_with(REFLECTION_V1ALPHA) => g.reflection_v1alpha.clone(),
            _ => return Err(req),
        };
        let until = Instant::now() + cfg.stream_timeout.0;
        let resp = serve(req).await;
        let (parts, body) = resp.into_parts();
        let body = body
            .map_err(|e| Box::new(e) as fanout_transport::body::BoxError)
            .boxed_unsync();
        Ok(Response::from_parts(parts, Body::stream(body, until)))
    }

    /// `grpc.health.v1.Health/Check`: SERVING while ready, NOT_SERVING otherwise; for the
    /// overall health (`service: ""`) and every served service, NOT_FOUND for others.
    async fn health_check(&self, live: &Live, req: Request<Incoming>) -> Response<Body> {
        use prost::Message;
        use tonic_health::pb::health_check_response::ServingStatus;
        const LIMIT: usize = 4096;
        let (parts, body) = req.into_parts();
        let headers = parts.headers;
        let read = tokio::time::timeout(
            self.limits.bodies.read_timeout.0,
            http_body_util::Limited::new(body, LIMIT + frame::HEADER_LEN).collect(),
        )
        .await;
        let Ok(Ok(body)) = read else {
            return grpc_status(
                Code::InvalidArgument,
                "the health check request could not be read",
                None,
            );
        };
        let Ok(encoding) = gz::request_encoding(&headers) else {
            return grpc_status(Code::Unimplemented, "unsupported grpc-encoding", None);
        };
        let msg = match frame::decode_unary_frame(&body.to_bytes(), LIMIT)
            .and_then(|f| fanout_grpc::compression::decode_message(f, encoding, LIMIT))
        {
            Ok(m) => m,
            Err(e) => {
                let code = fanout_grpc::stubsupport::frame_error_code(&e);
                return grpc_status(code, &e.to_string(), None);
            }
        };
        let Ok(check) = tonic_health::pb::HealthCheckRequest::decode(msg) else {
            return grpc_status(Code::InvalidArgument, "invalid HealthCheckRequest", None);
        };
        let known = check.service.is_empty()
            || check.service == HEALTH_SERVICE
            || live.grpc_services.iter().any(|s| s == &check.service);
        if !known {
            return grpc_status(Code::NotFound, "unknown service", None);
        }
        let status = if self.health.readiness(&live.reference).is_ok() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        let answer = tonic_health::pb::HealthCheckResponse {
            status: status as i32,
        };
        grpc_answer(frame::encode(&answer.encode_to_vec()), Vec::new())
    }

    /// The lifecycle of a gRPC request (module docs); `Err` is answered by
    /// [`Gateway::grpc_error_response`].
    pub(crate) async fn grpc_lifecycle(
        &self,
        cx: &mut Req<'_, '_>,
        body: Incoming,
    ) -> Result<Response<Body>, ApiError> {
        let (live, parts) = (cx.live, cx.parts);
        let start = cx.rec.start();
        let ct = parts
            .headers
            .get(CONTENT_TYPE)
            .map_or(&b""[..], |v| v.as_bytes());
        if !fanout_grpc::is_grpc_content_type(ct) {
            return Err(unimplemented(
                "unsupported_content_type",
                format!(
                    "content-type `{}` is not supported: send protobuf messages as `application/grpc`",
                    String::from_utf8_lossy(ct)
                ),
            ));
        }
        // A `grpc:` route, or a pass-through route of any path (`path: /pkg.Service/{method}`
        // forwards a whole service, no `.proto` needed).
        let (route, params) = match route(live, parts) {
            Ok((r, p)) if r.grpc.is_some() || live.pass.get(r.index).is_some() => (r, p),
            _ => {
                return Err(unimplemented(
                    "unknown_method",
                    format!("unknown method {}", parts.uri.path()),
                ));
            }
        };
        // A pass-through method (unary or streaming): its messages go to the backend as they
        // are, whatever their encoding (`pass.rs`, `fanout_pass::grpc`).
        if let Some(plan) = live.pass.get(route.index) {
            cx.rec.routed(route);
            cx.tel.routed(route);
            return fanout_layers::boxed::pinned(|| {
                self.pass_lifecycle(cx, route, params, plan, body, fanout_edge::RouteKind::Grpc)
            })
            .await;
        }
        let encoding = gz::request_encoding(&parts.headers).map_err(gz::unsupported)?;
        let Some(g) = route.grpc.as_ref() else {
            return Err(unimplemented("unknown_method", "unknown method".into()));
        };
        cx.rec.routed(route);
        cx.tel.routed(route);
        // The edge stages: a refusal here is listed on the live page (the route is known).
        let (deadline, request, offload, _memory) = match async {
            crate::lifecycle::once_only(&cx.parts.headers)?;
            let decoded = crate::lifecycle::path_params(&params)?;
            let (auth, client) =
                crate::lifecycle::edge_stages(cx, route, fanout_edge::RouteKind::Grpc, &decoded)
                    .await?;
            let deadline = self.deadline(&parts.headers, route, start)?;
            let max = self.limits.grpc.max_message_bytes;
            if let Some(len) = parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
                && len > max + frame::HEADER_LEN
            {
                return Err(too_large(max));
            }
            let (bytes, mut memory) = self
                .read_bytes(
                    &parts.headers,
                    body,
                    start,
                    deadline,
                    &mut cx.tel,
                    max + frame::HEADER_LEN,
                )
                .await
                .map_err(|e| {
                    if e.code == "body_too_large" {
                        too_large(max)
                    } else {
                        e
                    }
                })?;
            let offload = self.limits.compute.offload_bytes;
            let message = match frame::decode_unary_frame(&bytes, max) {
                Ok(f) if f.compressed => {
                    // The inflated message is held while the request runs: counted in the memory
                    // budget like the body (at most `max` bytes, the budget's room checked after).
                    let m = gz::request_message(&self.compute, f, encoding, max, offload).await;
                    if let (Ok(m), Some(r)) = (&m, memory.as_mut())
                        && r.grow(m.len()).is_err()
                    {
                        return Err(BodyRefusal::MemoryBudget {
                            budget: self.bodies.budget(),
                        }
                        .into());
                    }
                    m
                }
                Ok(f) => Ok(f.message),
                Err(e) => Err(Inflate::Frame(e)),
            };
            let message = message.map_err(|e| match e {
                Inflate::Frame(frame::FrameError::TooLarge { .. }) => too_large(max),
                Inflate::Frame(frame::FrameError::InflatedTooLarge { .. }) => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "message_too_large",
                    format!(
                        "the request message inflates to more than server.grpc.max_message_bytes ({max})"
                    ),
                ),
                Inflate::Frame(frame::FrameError::Compressed) => unimplemented(
                    "unsupported_compression",
                    "the message is compressed, and no compression was negotiated (grpc-encoding)"
                        .into(),
                ),
                Inflate::Frame(e @ frame::FrameError::BadCompression(_)) => {
                    let mut err = invalid(format!("the request message does not inflate: {e}"));
                    err.grpc = Some(Code::Internal);
                    err
                }
                Inflate::Frame(e) => invalid(format!("the request is not one gRPC message: {e}")),
                Inflate::Overloaded => gz::overloaded(),
            })?;
            drop(bytes);
            let input = &g.method.input;
            let val = input
                .decode_val(&message, self.limits.expressions.max_depth)
                .map_err(|_| {
                    invalid(format!(
                        "the request is not a valid {} message (or nests deeper than server.expressions.max_depth)",
                        input.name()
                    ))
                })?;
            let request = build_request(
                parts,
                params.iter(),
                val,
                auth,
                &route.request_use,
                client.as_deref(),
            )?;
            Ok::<_, ApiError>((deadline, request, offload, memory))
        }
        .await
        {
            Ok(r) => r,
            Err(e) => {
                self.record_refusal(cx, route, &e);
                return Err(e);
            }
        };
        let out = self.run_flow(cx, route, deadline, request).await?;
        let status = StatusCode::from_u16(out.status).unwrap_or(StatusCode::OK);
        if !status.is_success() {
            let mut e = ApiError::new(status, "flow_status", format!("the flow answered {status}"));
            e.code = Cow::Borrowed("flow_status");
            return Err(e);
        }
        let output = &g.method.output;
        let mut framed = vec![0u8; frame::HEADER_LEN];
        let encoded = match &out.value {
            Some(v) => output.encode_val(v, &mut framed),
            None => output.json_to_proto_into(&out.body, &mut framed),
        };
        encoded.map_err(|e| {
            let mut err = ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "bad_answer_message",
                format!(
                    "the route's answer does not fit {}: {}",
                    output.name(),
                    field_problem(&e.to_string())
                ),
            );
            err.detail = Some(e.to_string());
            err.log = true;
            err
        })?;
        let len = (framed.len() - frame::HEADER_LEN) as u32;
        framed[1..frame::HEADER_LEN].copy_from_slice(&len.to_be_bytes());
        let (framed, gzipped) = gz::answer_frame(
            &self.compute,
            &self.limits.grpc,
            gz::wants_gzip(&self.limits.grpc, &parts.headers),
            Bytes::from(framed),
            offload,
        )
        .await;
        let mut resp = grpc_answer(framed, out.headers);
        if gzipped {
            resp.headers_mut()
                .insert(GRPC_ENCODING, HeaderValue::from_static("gzip"));
        }
        Ok(resp)
    }

    /// A refusal or failure as a trailers-only gRPC answer: counted and logged like an HTTP
    /// one, the code from its status and error code, its safe message as `grpc-message`.
    pub(crate) fn grpc_error_response(
        &self,
        e: ApiError,
        rid: &HeaderValue,
        parts: &Parts,
    ) -> Response<Body> {
        self.errors.count(&e.code);
        if e.log {
            self.log_failure(&e, rid, &parts.method, parts.uri.path());
        }
        let code = e
            .grpc
            .unwrap_or_else(|| Code::for_answer(e.status, &e.code));
        let mut message = e.message;
        if self.limits.expose_error_details
            && let Some(d) = &e.detail
        {
            message.push_str(" — ");
            message.push_str(d);
        }
        let mut resp = grpc_status(code, &message, Some(&e.code));
        resp.extensions_mut().insert(EffectiveStatus(e.status));
        resp
    }
}

/// What is wrong with a message in a few safe words: the unknown field's name, or the codec's
/// complaint without values.
fn field_problem(detail: &str) -> String {
    match detail
        .split_once("unrecognized field name '")
        .and_then(|(_, rest)| rest.split_once('\''))
    {
        Some((f, _)) => format!("it has no field `{f}`"),
        None => "a field has the wrong type".to_string(),
    }
}

fn unimplemented(code: &'static str, message: String) -> ApiError {
    ApiError::new(StatusCode::NOT_IMPLEMENTED, code, message)
}

fn invalid(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_message", message)
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "message_too_large",
        format!("the request message is larger than server.grpc.max_message_bytes ({max})"),
    )
}

/// Header names read or written per call, made once.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// A successful answer: the framed message, `grpc-status: 0` in the trailers.
fn grpc_answer(framed: Bytes, headers: Vec<(HeaderName, HeaderValue)>) -> Response<Body> {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, Code::Ok.header_value());
    let mut resp = Response::new(Body::with_trailers(Some(framed), trailers));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(fanout_grpc::CONTENT_TYPE),
    );
    h.insert(GRPC_ACCEPT_ENCODING, gz::accept_encoding());
    for (k, v) in headers {
        h.insert(k, v);
    }
    resp
}

/// A trailers-only answer with `code` and `message` (and the gateway's error code as
/// `x-fanout-error-code` metadata).
fn grpc_status(code: Code, message: &str, error_code: Option<&str>) -> Response<Body> {
    let mut resp = Response::new(Body::empty());
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(fanout_grpc::CONTENT_TYPE),
    );
    h.insert(GRPC_ACCEPT_ENCODING, gz::accept_encoding());
    h.insert(HeaderName::from_static("grpc-status"), code.header_value());
    if !message.is_empty() {
        h.insert(
            HeaderName::from_static("grpc-message"),
            status::encode_message(message, MAX_STATUS_MESSAGE),
        );
    }
    if let Some(c) = error_code.and_then(|c| HeaderValue::from_str(c).ok()) {
        h.insert(HeaderName::from_static("x-fanout-error-code"), c);
    }
    resp
}
