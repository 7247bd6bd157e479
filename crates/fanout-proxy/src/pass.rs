//! The lifecycle of a request on a pass-through route (`pass:`; `fanout-pass`), HTTP or gRPC
//! (any method, streaming too; `fanout_pass::grpc`): the same route
//! and header checks and the same edge stages as a flow's request, on the head alone — before a
//! byte of the body is asked for, so a request they refuse never gets `100 Continue` nor has its
//! body read — then the exchange with the backend ([`fanout_pass::PassPlan::forward`]), whose
//! answer streams back as it arrives. No deadline header, body read, `$request`, admission or
//! flow: the exchange has its own limits (`pass.timeout`, `pass.idle_timeout`,
//! `pass.max_body_bytes`), the backend's stack its bulkhead.

use crate::Gateway;
use crate::answer::ApiError;
use crate::lifecycle::{Req, edge_stages, once_only, path_params};
use fanout_flow::{FlowError, RoutePlan};
use fanout_pass::body::Cut;
use fanout_pass::headers::Hop;
use fanout_pass::{Exchange, PassError, PassPlan};
use fanout_transport::body::Body;
use http::{HeaderValue, Response, StatusCode};
use hyper::body::Incoming;
use std::sync::Arc;

impl Gateway {
    /// Route `route` passes requests to its backend (`plan`): check the head, run the edge
    /// stages, forward.
    pub(crate) async fn pass_lifecycle(
        &self,
        cx: &mut Req<'_, '_>,
        route: &RoutePlan,
        params: matchit::Params<'_, '_>,
        plan: &PassPlan,
        body: Incoming,
        kind: fanout_edge::RouteKind,
    ) -> Result<Response<Body>, ApiError> {
        let mut body = body;
        let raw: smallvec::SmallVec<[(&str, &str); 4]> = params.iter().collect();
        let target = async {
            once_only(&cx.parts.headers)?;
            let decoded = path_params(&params)?;
            let (auth, _) = edge_stages(cx, route, kind, &decoded).await?;
            let target = plan
                .target(cx.parts, &raw, hyper::body::Body::size_hint(&body))
                .map_err(|e| refusal(e, plan.backend_name()))?;
            Ok::<_, ApiError>((auth, target))
        }
        .await;
        let (auth, target) = match target {
            Ok(t) => t,
            Err(e) => {
                self.record_refusal(cx, route, &e);
                // Refused with the body unread: a client still writing it would get a broken
                // pipe instead of the answer, so a bounded part is read first (as a flow's
                // refused body is) — unless it waits for `100 Continue`, which it never gets.
                if !expects_continue(&cx.parts.headers) {
                    let until = cx.rec.start() + plan.timeout();
                    crate::request_body::drain_rejected_body(&mut body, until).await;
                }
                return Err(e);
            }
        };
        let parts = cx.parts;
        let mut authority = None;
        let hop = hop(cx, &mut authority);
        let exchange = Exchange {
            parts,
            body,
            hop,
            auth: &auth,
            start: cx.rec.start(),
            trace: None,
            // gRPC: the client's `grpc-timeout`, when sooner than `pass.timeout`.
            deadline: match kind {
                fanout_edge::RouteKind::Grpc => parts
                    .headers
                    .get("grpc-timeout")
                    .and_then(|v| v.to_str().ok())
                    .and_then(fanout_grpc::timeout::parse)
                    .map(|t| cx.rec.start() + t),
                fanout_edge::RouteKind::Http => None,
            },
            drain: &self.drain,
        };
        match plan.forward(exchange, target).await {
            Ok(resp) => Ok(resp.map(Body::Passed)),
            Err(e) => Err(refusal(e, plan.backend_name())),
        }
    }
}

/// The hop a request came over, as the forwarding headers tell it (peer, trusted or not, TLS,
/// host, version); `authority` holds the URI's authority when there is no `Host` (HTTP/2).
pub(crate) fn hop<'a>(cx: &Req<'a, '_>, authority: &'a mut Option<HeaderValue>) -> Hop<'a> {
    let parts = cx.parts;
    let host = match parts.headers.get(http::header::HOST) {
        Some(h) => Some(h),
        None => {
            *authority = parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
            authority.as_ref()
        }
    };
    Hop {
        peer: cx.peer.map(|p| p.ip().to_canonical()),
        trusted: cx.live.stages.clients().trusts_peer(cx.peer),
        tls: parts
            .extensions
            .get::<Arc<fanout_transport::tls::TlsInfo>>()
            .is_some(),
        host,
        version: parts.version,
    }
}

/// The request waits for `100 Continue` before it sends its body.
fn expects_continue(h: &http::HeaderMap) -> bool {
    h.get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The error answer of a pass-through request that failed before its answer's head.
fn refusal(e: PassError, backend: &Arc<str>) -> ApiError {
    let too_large = |limit: u64| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body exceeds {limit} bytes (pass.max_body_bytes)"),
        )
    };
    match e {
        PassError::TooLarge { limit } | PassError::Cut(Cut::TooLarge(limit)) => too_large(limit),
        PassError::Path(p) => ApiError::new(StatusCode::BAD_REQUEST, "bad_path", p.to_string()),
        PassError::MessageTooLarge { limit } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "message_too_large",
            format!("a request message is larger than pass.max_message_bytes ({limit})"),
        ),
        PassError::Cut(Cut::ClientBroke) => ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_body",
            "the request body broke off before the backend answered",
        ),
        PassError::Cut(c @ (Cut::Timeout(_) | Cut::Idle(_))) => {
            let mut e = FlowError::new(
                fanout_flow::ErrorKind::BackendTimeout,
                "the backend did not answer in time",
            )
            .with_backend(backend)
            .with_detail(c.to_string());
            e.step = None;
            ApiError::from(e)
        }
        PassError::Cut(Cut::BackendBroke) => {
            let e = FlowError::new(
                fanout_flow::ErrorKind::BackendReset,
                "the connection to the backend broke during the call",
            )
            .with_backend(backend);
            ApiError::from(e)
        }
        PassError::Call(c) => {
            ApiError::from(FlowError::from_call(c, &Arc::from("pass"), backend).without_step())
        }
    }
}
