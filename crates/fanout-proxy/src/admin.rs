//! The admin listener (`admin.listen`): `/metrics`, `/healthz`, `/readyz`,
//! `/__fanout/status` and the live page `/ui` (`ui/`) on an address of their own. A tiny HTTP/1.1 server, separate from the
//! client port: its own connection cap (`admin.max_connections`, further connections are closed
//! at once) and timeout (`admin.timeout`: to send a request head, and idle between requests),
//! never the client port's admission — so an overloaded gateway still answers its health checks
//! and scrapes.

use crate::Gateway;
use crate::body::Body;
use crate::metrics::scrape;
use bytes::Bytes;
use http::header::{
    ALLOW, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long open admin connections get to finish when the listener stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Serve the admin endpoints of `gateway` on `listener` until `shutdown` resolves.
pub async fn serve_admin(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let cfg = &gateway.admin;
    let slots = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.timeout.0)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let tls = gateway.admin_tls.clone();
    if let Some(t) = &tls {
        t.watch();
    }
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _)) => stream,
                // Out of descriptors or similar: the client port's accept loop logs it; here a
                // short pause keeps the loop from spinning.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let gw = gateway.clone();
        let svc = hyper::service::service_fn(move |req| {
            let gw = gw.clone();
            async move { Ok::<_, Infallible>(answer(&gw, req).await) }
        });
        match &tls {
            None => {
                let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(slot);
                });
            }
            // `admin.tls`: the handshake in the connection's task, under its own timeout.
            Some(t) => {
                let (t, builder, watcher) = (t.clone(), builder.clone(), graceful.watcher());
                tokio::spawn(async move {
                    if let Some(stream) = t.accept_admin(stream).await {
                        let conn =
                            watcher.watch(builder.serve_connection(TokioIo::new(stream), svc));
                        let _ = conn.await;
                    }
                    drop(slot);
                });
            }
        }
    }
    drop(listener);
    if let Some(t) = &tls {
        t.stop_watching();
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// The answer to one admin request.
async fn answer(gw: &Arc<Gateway>, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = json(
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"error":"only GET"}"#.into(),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => metrics(gw).await,
        "/healthz" => json(StatusCode::OK, r#"{"status":"ok"}"#.into()),
        "/readyz" => ready(gw),
        "/__fanout/status" => json(StatusCode::OK, gw.status_json().to_string()),
        "/ui" | "/ui/" if gw.recent.is_some() => page(),
        "/ui/api/state" if gw.recent.is_some() => ui_state(gw).await,
        _ => json(
            StatusCode::NOT_FOUND,
            r#"{"error":"not found: the admin listener serves /metrics, /healthz, /readyz, /__fanout/status and /ui"}"#.into(),
        ),
    }
}

/// `/metrics`: the asynchronous reads first, then the encoding off the runtime's workers (it
/// reads `/proc`).
async fn metrics(gw: &Arc<Gateway>) -> Response<Body> {
    let pre = scrape::prefetch(gw).await;
    let gw = gw.clone();
    match tokio::task::spawn_blocking(move || scrape::encode(&gw, pre)).await {
        Ok(Ok(text)) => {
            let mut r = Response::new(Body::full(Bytes::from(text)));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(scrape::CONTENT_TYPE));
            r
        }
        _ => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"error":"encoding the metrics failed"}"#.into(),
        ),
    }
}

/// `/ui`: the live page (`ui/page.html`), with a Content-Security-Policy that allows nothing
/// from elsewhere.
fn page() -> Response<Body> {
    let mut r = Response::new(Body::full(Bytes::from_static(crate::ui::PAGE.as_bytes())));
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(crate::ui::CSP),
    );
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `/ui/api/state`: built off the runtime's workers (its size grows with the routes and steps).
async fn ui_state(gw: &Arc<Gateway>) -> Response<Body> {
    let gw = gw.clone();
    match tokio::task::spawn_blocking(move || crate::ui::state_json(&gw).to_string()).await {
        Ok(text) => {
            let mut r = json(StatusCode::OK, text);
            r.headers_mut()
                .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Err(_) => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"error":"building the page's state failed"}"#.into(),
        ),
    }
}

/// `/readyz`: 200 when ready, else 503 with the reason.
fn ready(gw: &Gateway) -> Response<Body> {
    match gw.readiness() {
        Ok(()) => json(StatusCode::OK, r#"{"status":"ready"}"#.into()),
        Err(reason) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "not_ready", "reason": reason}).to_string(),
        ),
    }
}

fn json(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Body::full(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
