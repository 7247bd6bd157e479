//! The admin listener (`admin.listen`): `/metrics`, `/healthz`, `/readyz`,
//! `/__fanout/status`, the routes' OpenAPI document `/openapi.json` (`fanout-openapi`) and the live page `/ui` (`ui/`) on an address of their own. A tiny HTTP/1.1 server, separate from the
//! client port: its own connection cap (`admin.max_connections`, further connections are closed
//! at once) and timeout (`admin.timeout`: to send a request head, and idle between requests),
//! never the client port's admission — so an overloaded gateway still answers its health checks
//! and scrapes.

use crate::Gateway;
use crate::scrape;
use bytes::Bytes;
use fanout_transport::body::Body;
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
    let path = req.uri().path();
    // Health checks answer anyone (probes reach them by address, and they tell nothing);
    // everything else only to a Host of the listener's and, with `admin.token`, the token.
    if !matches!(path, "/healthz" | "/readyz")
        && let Err(refused) = guard(&gw.admin, req.headers())
    {
        return refused;
    }
    let nonce = matches!(path, "/ui" | "/ui/").then(page_nonce);
    match path {
        "/metrics" => metrics(gw).await,
        "/healthz" => json(StatusCode::OK, r#"{"status":"ok"}"#.into()),
        "/readyz" => ready(gw),
        "/__fanout/status" => json(StatusCode::OK, gw.status_json().to_string()),
        "/openapi.json" if gw.live().config.openapi.serve => {
            let doc = gw.live().contract.document_json().clone();
            let mut r = Response::new(Body::full(doc));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        "/ui" | "/ui/" if gw.recent.is_some() => page(nonce.as_deref().unwrap_or_default()),
        "/ui/api/state" if gw.recent.is_some() => ui_state(gw, after(req.uri().query())).await,
        _ => json(
            StatusCode::NOT_FOUND,
            r#"{"error":"not found: the admin listener serves /metrics, /healthz, /readyz, /__fanout/status, /openapi.json and /ui"}"#.into(),
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

/// Whether the admin listener answers this request: its `Host` is an IP address, `localhost`
/// or a name of `admin.hosts` (DNS rebinding: a page on another site that resolves its own
/// name to this address sends its own name), and it carries `admin.token` when one is set.
/// The refusal otherwise: 403, or 401 with the challenges.
#[allow(clippy::result_large_err)]
fn guard(
    cfg: &fanout_config::AdminConfig,
    headers: &http::HeaderMap,
) -> Result<(), Response<Body>> {
    if let Some(host) = headers.get(http::header::HOST)
        && !host_allowed(&cfg.hosts, host.as_bytes())
    {
        let shown = String::from_utf8_lossy(host.as_bytes());
        let shown: String = shown.chars().take(100).collect();
        return Err(json(
            StatusCode::FORBIDDEN,
            serde_json::json!({
                "error": format!(
                    "the admin listener does not answer to Host `{shown}`: reach it by IP address or localhost, or list the name under admin.hosts"
                ),
            })
            .to_string(),
        ));
    }
    if let Some(token) = &cfg.token
        && !token_given(&token.value, headers)
    {
        let mut r = json(
            StatusCode::UNAUTHORIZED,
            r#"{"error":"the admin listener needs its token (admin.token): Authorization: Bearer <token>, or Basic credentials with the token as the password"}"#.into(),
        );
        let h = r.headers_mut();
        h.append(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Bearer realm="fanout admin""#),
        );
        h.append(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Basic realm="fanout admin", charset="UTF-8""#),
        );
        return Err(r);
    }
    Ok(())
}

/// `host[:port]` is an IP address, `localhost`, or matches `names` (`*.suffix`, `*`).
fn host_allowed(names: &[fanout_config::Located<String>], host: &[u8]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let host = host.trim();
    // `[v6]:port` / `[v6]`
    if let Some(rest) = host.strip_prefix('[') {
        return rest
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    }
    let name = match host.rsplit_once(':') {
        Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.parse::<std::net::Ipv4Addr>().is_ok() || name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    names.iter().any(|n| {
        let n = n.value.as_str();
        if n == "*" {
            return true;
        }
        match n.strip_prefix("*.") {
            Some(suffix) => {
                name.len() > suffix.len() + 1
                    && name[name.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
            }
            None => name.eq_ignore_ascii_case(n),
        }
    })
}

/// The request carries `token`: `Bearer <token>`, or `Basic` with it as the password (any
/// user). Compared in constant time.
fn token_given(token: &str, headers: &http::HeaderMap) -> bool {
    use base64::Engine;
    use subtle::ConstantTimeEq;
    let same = |given: &[u8]| {
        use sha2::Digest;
        let (a, b) = (
            sha2::Sha256::digest(given),
            sha2::Sha256::digest(token.as_bytes()),
        );
        bool::from(a.as_slice().ct_eq(b.as_slice()))
    };
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let (Some(v), None) = (values.next(), values.next()) else {
        return false;
    };
    let Ok(v) = v.to_str() else { return false };
    let Some((scheme, rest)) = v.trim().split_once(' ') else {
        return false;
    };
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        same(rest.as_bytes())
    } else if scheme.eq_ignore_ascii_case("basic") {
        base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()
            .and_then(|b| {
                let i = b.iter().position(|&c| c == b':')?;
                Some(same(&b[i + 1..]))
            })
            .unwrap_or(false)
    } else {
        false
    }
}

/// A fresh nonce for the page's script and style (CSP `'nonce-…'`): 128 random bits.
fn page_nonce() -> String {
    use base64::Engine;
    let bytes: [u8; 16] = rand::random();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `/ui`: the live page (`ui/page.html`), with a Content-Security-Policy that allows nothing
/// from elsewhere and only the page's own script and style (by a nonce made for this answer:
/// no `'unsafe-inline'`).
fn page(nonce: &str) -> Response<Body> {
    let html = crate::ui::PAGE
        .replacen("<script>", &format!("<script nonce=\"{nonce}\">"), 1)
        .replacen("<style>", &format!("<style nonce=\"{nonce}\">"), 1);
    let mut r = Response::new(Body::full(Bytes::from(html)));
    let csp = crate::ui::csp(nonce);
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&csp) {
        h.insert(CONTENT_SECURITY_POLICY, v);
    }
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `after=N` of the query (0 without one, or when it is no number).
fn after(query: Option<&str>) -> u64 {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|p| p.strip_prefix("after="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `/ui/api/state`: built off the runtime's workers (its size grows with the routes and steps).
async fn ui_state(gw: &Arc<Gateway>, after: u64) -> Response<Body> {
    let gw = gw.clone();
    match tokio::task::spawn_blocking(move || crate::ui::state_json(&gw, after).to_string()).await {
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
