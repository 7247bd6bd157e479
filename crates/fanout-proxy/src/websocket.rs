//! The lifecycle of a handshake on a WebSocket route (`websocket:`; `fanout-ws`): the same
//! route and header checks and the same edge stages as any request (IP lists, authentication,
//! rate limits; the request id and the access log around it in `server.rs`), then
//! [`fanout_ws::WsPlan::accept`] — the handshake checked, sent to the backend, and the client
//! answered with 101 (HTTP/1.1) or 200 (HTTP/2's extended CONNECT) while the relay starts on a
//! task of its own. Its refusals as `ApiError`s with the contract's JSON body.

use crate::Gateway;
use crate::answer::ApiError;
use crate::lifecycle::{Req, edge_stages, once_only, path_params};
use crate::pass::hop;
use fanout_flow::{ErrorKind, FlowError, RoutePlan};
use fanout_transport::body::Body;
use fanout_ws::counters::Refused;
use fanout_ws::handshake::HandshakeError;
use fanout_ws::{WsError, WsPlan};
use http::{HeaderValue, Response, StatusCode};
use hyper::body::Incoming;
use std::sync::Arc;

impl Gateway {
    /// Route `route` relays WebSockets (`plan`): check the head, run the edge stages, accept.
    pub(crate) async fn websocket_lifecycle(
        &self,
        cx: &mut Req<'_, '_>,
        route: &RoutePlan,
        params: matchit::Params<'_, '_>,
        plan: &Arc<WsPlan>,
        body: Incoming,
    ) -> Result<Response<Body>, ApiError> {
        // A handshake has no body; nothing of one is read.
        drop(body);
        let raw: smallvec::SmallVec<[(&str, &str); 4]> = params.iter().collect();
        let stages = async {
            once_only(&cx.parts.headers)?;
            let decoded = path_params(&params)?;
            let (auth, _) = edge_stages(cx, route, fanout_edge::RouteKind::Http, &decoded).await?;
            Ok::<_, ApiError>(auth)
        }
        .await;
        let auth = match stages {
            Ok(a) => a,
            Err(e) => {
                self.record_refusal(cx, route, &e);
                return Err(e);
            }
        };
        let parts = cx.parts;
        let mut authority = None;
        let hop = hop(cx, &mut authority);
        let upgrade = parts.extensions.get::<hyper::upgrade::OnUpgrade>().cloned();
        let handshake = fanout_ws::Handshake {
            parts,
            params: &raw,
            hop,
            auth: &auth,
        };
        // An HTTP/2 WebSocket's hold on its connection (`server.rs`), kept by the relay.
        let busy = parts
            .extensions
            .get::<Arc<fanout_transport::conn::ActiveRequest>>()
            .cloned();
        let accepted = match (upgrade, plan.prepare(&self.websockets, handshake)) {
            (_, Err(e)) => Err(e),
            (Some(u), Ok(p)) => plan.open(p, u, busy).await,
            // hyper gives no upgrade to a request that is no handshake.
            (None, Ok(_)) => {
                plan.counters().refused(Refused::NotWebSocket);
                Err(WsError::Handshake(HandshakeError::NotWebSocket))
            }
        };
        match accepted {
            Ok(head) => Ok(head.map(|()| Body::empty())),
            Err(e) => {
                let e = refusal(e, plan.backend_name());
                self.record_refusal(cx, route, &e);
                Err(e)
            }
        }
    }
}

/// The error answer of a handshake that was not relayed.
fn refusal(e: WsError, backend: &Arc<str>) -> ApiError {
    let message = e.to_string();
    match e {
        WsError::Handshake(HandshakeError::NotWebSocket) => {
            let mut a = ApiError::new(StatusCode::UPGRADE_REQUIRED, "upgrade_required", message);
            a.headers
                .push((http::header::UPGRADE, HeaderValue::from_static("websocket")));
            a.headers.push((
                http::header::SEC_WEBSOCKET_VERSION,
                HeaderValue::from_static("13"),
            ));
            a
        }
        WsError::Handshake(HandshakeError::Bad(_)) => {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_handshake", message)
        }
        WsError::Handshake(HandshakeError::Origin(_)) => {
            ApiError::new(StatusCode::FORBIDDEN, "origin_refused", message)
        }
        WsError::Limit(Refused::Draining) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
        }
        WsError::Limit(_) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "websocket_limit", message)
        }
        WsError::Path(p) => ApiError::new(StatusCode::BAD_REQUEST, "bad_path", p.to_string()),
        WsError::Timeout(_) => backend_error(
            ErrorKind::BackendTimeout,
            "the backend did not answer the WebSocket handshake in time",
            message,
            backend,
        ),
        WsError::Unavailable(_) => backend_error(
            ErrorKind::BackendUnavailable,
            "the backend could not be reached",
            message,
            backend,
        ),
        WsError::Refused(_) => backend_error(
            ErrorKind::BadBackendAnswer,
            "the backend refused the WebSocket handshake",
            message,
            backend,
        ),
    }
}

/// A backend's failure as the flow's error of that kind (status, code), its detail for the log.
fn backend_error(kind: ErrorKind, message: &str, detail: String, backend: &Arc<str>) -> ApiError {
    let e = FlowError::new(kind, message)
        .with_backend(backend)
        .with_detail(detail)
        .without_step();
    ApiError::from(e)
}
