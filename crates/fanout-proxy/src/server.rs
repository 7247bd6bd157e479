//! The inbound server: HTTP/1.1 and h2c on one port ([`serve`]), and one request's way through it
//! ([`Gateway::handle`]): its id, the panic guard, HTTP or gRPC, and the answer. The stages
//! between (route, deadline, body, admit, run) are in `lifecycle.rs`, the request body in
//! `request_body.rs`; what the client is answered (status, JSON error body) in `answer.rs`.

use crate::answer::ApiError;
use crate::lifecycle::Req;
use crate::telemetry::{Facts, Failure};
use crate::{Gateway, Live};
use bytes::Bytes;
use fanout_ops::metrics::{RequestRecord, RouteTable};
use fanout_transport::conn::{Connections, Socket, TrackedBody, TrackedIo};
use fanout_transport::cores::{Cores, Exec};
use fanout_transport::tls::TlsInfo;
use futures_util::FutureExt;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// The gateway's error answers by code live with the other answers; named here for `Gateway`.
pub(crate) use crate::answer::ErrorCounts;

/// Response body type of the server.
pub use fanout_transport::body::Body;

impl Gateway {
    /// Handle one request (never fails: every error becomes a JSON response, and a panic while
    /// handling it becomes a 500 `internal_error` for this request only).
    /// `peer`: the socket address of the connection the request came on.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        peer: Option<std::net::SocketAddr>,
    ) -> Response<Body> {
        // The config's live part for this request: a reload meanwhile does not change it.
        let live = self.live();
        // Named on arrival, before every phase (the `request_id` stage).
        let (rid, rid_header) = live.stages.request_id(req.headers());
        let mut rec =
            RouteTable::request(live.route_metrics.as_ref(), Instant::now(), req.method());
        let start = rec.start();
        // The logging stages' sampling (the access log): what the request's line needs is
        // gathered only when one wants it.
        let wants = live.stages.log_wants();
        let mut facts = wants.any().then(|| {
            Facts::arrived(
                req.method(),
                req.uri(),
                req.headers(),
                req.extensions(),
                peer,
                &live.stages,
            )
        });
        // The edge stages' arrival phase (CORS: a preflight is answered here, before
        // authentication and without a flow; compression: the coding the client accepts);
        // their answer phase below, whatever made the answer (CORS headers, compression).
        // A stage that panics (in any phase) answers 500 for this request only, like the
        // lifecycle (`catch_panics`).
        let expose = self.limits.expose_error_details;
        let arrived =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| arrival(&live, &req)));
        let (early, noted, failed) = match arrived {
            Ok((early, noted)) => (early, noted, None),
            Err(payload) => (
                fanout_edge::Early::Next,
                None,
                Some(panicked(&*payload, &self.panics, &rid, expose)),
            ),
        };
        let mut resp = match (failed, early) {
            (Some(resp), _) => resp,
            (None, fanout_edge::Early::Next) => {
                catch_panics(
                    self.handle_unguarded(req, peer, &rid, &live, &mut rec, facts.as_mut()),
                    &self.panics,
                    &rid,
                    expose,
                )
                .await
            }
            (None, fanout_edge::Early::Answer { status, headers }) => {
                rec.ignore();
                let mut resp = Response::new(Body::empty());
                *resp.status_mut() = status;
                *resp.headers_mut() = headers;
                resp
            }
            (None, fanout_edge::Early::Refuse(r)) => {
                rec.ignore();
                if let Some(f) = &mut facts {
                    f.refused(r.code.clone());
                }
                ApiError::from(r).into_response(&rid, expose)
            }
        };
        if let Some(noted) = noted {
            let tools = fanout_edge::Tools {
                compute: &self.compute,
            };
            let answered =
                std::panic::AssertUnwindSafe(live.stages.on_answer(noted, &mut resp, tools))
                    .catch_unwind()
                    .await;
            if let Err(payload) = answered {
                resp = panicked(&*payload, &self.panics, &rid, expose);
            }
        }
        let status = resp
            .extensions()
            .get::<crate::grpc::EffectiveStatus>()
            .map_or(resp.status(), |s| s.0);
        rec.finish(status);
        // The logging phase: after the answer phase, so the line has the bytes the client is
        // sent and the time the answer took to make (a streamed answer's: to its end).
        if let Some(mut f) = facts {
            if resp.extensions().get::<Panicked>().is_some() {
                f.refused(std::borrow::Cow::Borrowed("internal_error"));
            }
            // A streamed answer's line when its body ends, with the bytes sent.
            if matches!(resp.body(), Body::Passed(_)) {
                crate::telemetry::log_at_end(&mut resp, f, &live, wants, &rid, status, start);
            } else {
                f.log(&live.stages, &wants, &rid, status, &resp, start);
            }
        }
        // Never indexed by HPACK (HTTP/2): every answer's id is new, and indexing each one
        // would only evict what is worth keeping from the connection's table and make every
        // encoder compare against a growing list of stale ids.
        let mut rid = rid;
        rid.set_sensitive(true);
        resp.headers_mut().insert(rid_header.clone(), rid);
        resp
    }

    /// [`Gateway::handle`] without the panic guard: the status endpoint (deprecated here: it is
    /// on the admin listener), or the lifecycle and its answer; what the lifecycle learnt goes
    /// in `facts` for the logging phase (when a logging stage wants the request).
    async fn handle_unguarded<'a>(
        &'a self,
        req: Request<Incoming>,
        peer: Option<std::net::SocketAddr>,
        rid: &HeaderValue,
        live: &'a Live,
        rec: &mut RequestRecord<'a>,
        facts: Option<&mut Facts<'a>>,
    ) -> Response<Body> {
        if req.uri().path() == "/__fanout/status" {
            rec.ignore();
            let mut resp = Response::new(Body::full(Bytes::from(self.status_json().to_string())));
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return resp;
        }
        let grpc = req
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| fanout_grpc::looks_like_grpc(v.as_bytes()));
        let req = if grpc {
            match self.grpc_builtin(live, req).await {
                Ok(resp) => {
                    rec.ignore();
                    return resp;
                }
                Err(req) => req,
            }
        } else {
            req
        };
        let (parts, body) = req.into_parts();
        let tel = self.telemetry.request(&parts, rec.start(), facts.is_some());
        let mut cx = Req {
            live,
            parts: &parts,
            rid,
            rec,
            tel,
            peer,
        };
        let result = if grpc {
            self.grpc_lifecycle(&mut cx, body).await
        } else {
            self.lifecycle(&mut cx, body).await
        };
        let tel = cx.tel;
        match result {
            Ok(mut resp) => {
                tel.finish(&mut resp, rid, None, facts);
                resp
            }
            Err(e) => {
                let (code, step) = (e.code.clone(), e.step.clone());
                let mut resp = if grpc {
                    self.grpc_error_response(e, rid, &parts)
                } else {
                    self.error_response(e, rid, &parts)
                };
                let failure = Failure {
                    code: &code,
                    step: step.as_ref(),
                };
                tel.finish(&mut resp, rid, Some(failure), facts);
                resp
            }
        }
    }
}

/// The arrival phase of the edge stages (`fanout-edge`: [`fanout_edge::EdgeStage::on_arrival`]),
/// before routing, on every request of every route kind: what it decided, and what it noted for
/// the answer phase. Without a stage that arrives it costs nothing.
fn arrival<B>(
    live: &Live,
    req: &Request<B>,
) -> (fanout_edge::Early, Option<fanout_edge::AnswerNotes>) {
    if !live.stages.has_arrival() {
        return (fanout_edge::Early::Next, None);
    }
    let mut a = fanout_edge::Arrival::new(req.method(), req.uri(), req.headers(), &live.router);
    let early = live.stages.on_arrival(&mut a);
    (early, Some(a.into_answer_notes()))
}

/// Run a request handler; a panic inside it becomes a 500 `internal_error` for this request
/// only (logged with its message, counted in `panics`). Whatever the handler held (admission
/// slot, body permits, memory) is released when its future is dropped.
pub(crate) fn catch_panics<'a, F>(
    fut: F,
    panics: &'a AtomicU64,
    rid: &'a HeaderValue,
    expose: bool,
) -> impl Future<Output = Response<Body>> + 'a
where
    F: Future<Output = Response<Body>> + 'a,
{
    // A combinator, not an `async fn`: an `async fn` would keep `fut` as its argument and again
    // as the future it awaits, doubling the request's future (3 KB more, copied per request).
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .map(move |result| match result {
            Ok(resp) => resp,
            Err(payload) => panicked(&*payload, panics, rid, expose),
        })
}

/// The answer of a request whose handling panicked (`payload`): 500 `internal_error`, the
/// panic's message logged under the request id, counted in `panics`.
fn panicked(
    payload: &(dyn std::any::Any + Send),
    panics: &AtomicU64,
    rid: &HeaderValue,
    expose: bool,
) -> Response<Body> {
    panics.fetch_add(1, Ordering::Relaxed);
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string());
    let request_id = String::from_utf8_lossy(rid.as_bytes());
    tracing::error!(%request_id, panic = %msg, "a request handler panicked; answered 500");
    let mut resp = ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal_error",
        "the gateway failed while handling this request",
    )
    .into_response(rid, expose);
    resp.extensions_mut().insert(Panicked);
    resp
}

/// Marks the answer of a request whose handling panicked (its log line says `internal_error`).
#[derive(Clone, Copy)]
struct Panicked;

/// Serve `gateway` on `listener` until `shutdown` resolves, then stop accepting, close idle
/// connections and give in-flight requests `grace` to finish. This runs on the work-stealing
/// runtime it is called on; [`serve_per_core`] is the `server.runtime: per_core` form.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let builder = conn_builder(&gateway, Exec::default());
    if let Some(t) = &gateway.tls {
        t.watch();
    }
    accept_loop(&gateway, listener, &builder, None, shutdown).await;
    finish(&gateway).await;
    Ok(())
}

/// Serve `gateway` with one single-threaded runtime per listener in `listeners` (bound with
/// [`fanout_transport::cores::bind_reuseport`]), each on a thread of its own (`fanout-core-N`): the cores
/// serve from when this returns. The future returned waits for `shutdown`, then drains as
/// [`serve`] does; the runtime it runs on (the control thread) serves no client connection.
/// An error when a core's runtime or thread could not be started (the cores that started stop).
pub fn serve_per_core(
    gateway: Arc<Gateway>,
    listeners: Vec<std::net::TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<impl Future<Output = std::io::Result<()>> + Send + 'static> {
    let mut runtimes = Vec::with_capacity(listeners.len());
    for i in 0..listeners.len() {
        runtimes.push(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // DNS lookups and file reads of this core; the thread count stays fixed.
                .max_blocking_threads(2)
                .thread_name(format!("fanout-core-{i}-blocking"))
                .build()?,
        );
    }
    let cores = Arc::new(Cores::new(
        runtimes.iter().map(|r| r.handle().clone()).collect(),
    ));
    let _ = gateway.cores.set(cores.clone());
    if let Some(w) = gateway.watchdog.get() {
        for (i, r) in runtimes.iter().enumerate() {
            w.watch_core(r.handle(), cores.clone(), i);
        }
    }
    let builder = conn_builder(&gateway, Exec::per_core(cores.clone()));
    if let Some(t) = &gateway.tls {
        t.watch();
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut done = Vec::with_capacity(runtimes.len());
    let mut started = Ok(());
    for (i, (rt, listener)) in runtimes.into_iter().zip(listeners).enumerate() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (gw, builder, cores, mut stop) = (
            gateway.clone(),
            builder.clone(),
            cores.clone(),
            stop_rx.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("fanout-core-{i}"))
            .spawn(move || {
                fanout_runtime::cores::enter(i);
                rt.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(l) => {
                            let stopped = async move {
                                let _ = stop.wait_for(|s| *s).await;
                            };
                            accept_loop(&gw, l, &builder, Some((cores, i)), stopped).await;
                        }
                        Err(e) => {
                            tracing::error!(core = i, error = %e, "a core could not listen")
                        }
                    }
                    // This core's connections are served until they end; the control thread
                    // runs the drain (grace, then abort) for all of them.
                    let bound = gw.limits.shutdown_grace.0 + std::time::Duration::from_secs(2);
                    let _ = tokio::time::timeout(bound, async {
                        gw.conns.all_closed().await;
                        // Their relays run on this core: it stops once they closed (1001).
                        gw.websockets.all_closed().await;
                    })
                    .await;
                });
                drop(rt);
                let _ = tx.send(());
            });
        match spawned {
            Ok(_) => done.push(rx),
            Err(e) => {
                started = Err(e);
                break;
            }
        }
    }
    if let Err(e) = started {
        let _ = stop_tx.send(true);
        return Err(e);
    }
    Ok(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        gateway.drain.start();
        let grace = gateway.limits.shutdown_grace.0;
        tokio::join!(
            gateway.conns.shutdown(grace),
            gateway.websockets.shutdown(grace)
        );
        for d in done {
            let _ = d.await;
        }
        finish(&gateway).await;
        Ok(())
    })
}

/// hyper's connection builder with the gateway's limits; `exec` runs the tasks a connection
/// spawns (HTTP/2 streams).
fn conn_builder(gateway: &Gateway, exec: Exec) -> Arc<auto::Builder<Exec>> {
    let mut builder = auto::Builder::new(exec);
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(gateway.limits.max_header_bytes.max(8192))
        // The header read timeout is enforced per connection (`conn::drive`): hyper's timer
        // also runs while a keep-alive connection waits for its next request, which would cap
        // the idle time at the header timeout.
        .header_read_timeout(None)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(gateway.limits.max_concurrent_streams)
        .max_header_list_size(gateway.limits.max_header_bytes as u32)
        // WebSockets over HTTP/2 (RFC 8441): `SETTINGS_ENABLE_CONNECT_PROTOCOL`.
        .enable_connect_protocol();
    Arc::new(builder)
}

/// After the last accept: stop watching certificates, drain the connections (`grace`, then
/// abort), flush the last spans.
async fn finish(gateway: &Arc<Gateway>) {
    if let Some(t) = &gateway.tls {
        t.stop_watching();
    }
    // Event streams end at their next event boundary, within the grace; open WebSockets are
    // closed with 1001 (going away) meanwhile, new ones refused.
    gateway.drain.start();
    let grace = gateway.limits.shutdown_grace.0;
    tokio::join!(
        gateway.conns.shutdown(grace),
        gateway.websockets.shutdown(grace)
    );
    // The spans of the last requests.
    gateway.telemetry.shutdown().await;
}

/// Accept on `listener` until `shutdown` resolves, each admitted connection served on a task of
/// its own — per core (`core`: the cores and this one's index), on this core or handed to the
/// least loaded one ([`Cores::core_for_connection`]).
async fn accept_loop(
    gateway: &Arc<Gateway>,
    listener: TcpListener,
    builder: &Arc<auto::Builder<Exec>>,
    core: Option<(Arc<Cores>, usize)>,
    shutdown: impl Future<Output = ()>,
) {
    let conns: Arc<Connections> = gateway.conns.clone();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, peer)) => (stream, peer),
                Err(e) => {
                    // Out of file descriptors: idle connections are closed, or accepting
                    // pauses briefly; logged at most once a second.
                    tokio::select! {
                        _ = conns.accept_failed(&e) => {}
                        _ = &mut shutdown => break,
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // The edge stages' connection phase (`ip_filter` with `on_connection`): a refused
        // peer is closed before admission, its TLS handshake and any request.
        let live = gateway.live();
        if live.stages.has_connection_phase() && !live.stages.on_connection(peer) {
            drop(stream);
            continue;
        }
        drop(live);
        // At the connection cap the oldest idle connections make room (this connection takes
        // the place of the first that closes); with none idle it is closed at once.
        let admitted = tokio::select! {
            admitted = conns.admit() => admitted,
            _ = &mut shutdown => break,
        };
        if !admitted {
            conns.refuse(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let entry = Entry(conns.clone(), conns.register());
        let Some((cores, me)) = &core else {
            tokio::spawn(serve_one(
                gateway.clone(),
                builder.clone(),
                stream,
                peer,
                entry,
                None,
            ));
            continue;
        };
        let to = cores.core_for_connection(*me);
        let load = cores.connection(to);
        if to == *me {
            tokio::spawn(serve_one(
                gateway.clone(),
                builder.clone(),
                stream,
                peer,
                entry,
                Some(load),
            ));
            continue;
        }
        cores.handed_connection(*me);
        let (gw, b) = (gateway.clone(), builder.clone());
        // When the hand-off fails the socket is closed, and the entry (dropped with the
        // closure) leaves the connection table.
        fanout_transport::cores::hand_off(cores, to, stream, peer, move |s, p| {
            serve_one(gw, b, s, p, entry, Some(load))
        });
    }
    drop(listener);
}

/// An admitted connection's entry in the connection table: removed when the connection ends
/// (`conn::drive`), or when it is dropped before it was served (a hand-off to a core that is
/// shutting down, a failed TLS handshake).
struct Entry(Arc<Connections>, Arc<fanout_transport::conn::ConnShared>);

impl Drop for Entry {
    fn drop(&mut self) {
        self.0.deregister(&self.1);
    }
}

/// Serve one admitted connection (after its TLS handshake, which runs here, after admission:
/// the cap counts it, its timeout closes a silent client) until it ends. `load` counts it on
/// its core meanwhile.
async fn serve_one(
    gw: Arc<Gateway>,
    builder: Arc<auto::Builder<Exec>>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    entry: Entry,
    load: Option<fanout_transport::cores::CoreLoad>,
) {
    let sh = entry.1.clone();
    let conns = gw.conns.clone();
    match gw.tls.clone() {
        None => {
            let conn = serve_connection(&builder, &gw, stream, &sh, peer, None);
            fanout_transport::conn::drive(conn, sh, conns).await;
        }
        Some(t) => {
            if let Some((stream, info)) = t.accept(stream, &sh, &conns).await {
                let conn = serve_connection(&builder, &gw, stream, &sh, peer, Some(info));
                fanout_transport::conn::drive(conn, sh, conns).await;
            }
        }
    }
    drop(entry);
    drop(load);
}

/// One accepted connection (plain, or TLS after its handshake) served by hyper: each request
/// gets the peer's address and, over TLS, the connection's [`TlsInfo`] (an `Arc`, no
/// allocation per request).
fn serve_connection<S: Socket + Send + 'static>(
    builder: &Arc<auto::Builder<Exec>>,
    gateway: &Arc<Gateway>,
    stream: S,
    sh: &Arc<fanout_transport::conn::ConnShared>,
    peer: std::net::SocketAddr,
    tls: Option<Arc<TlsInfo>>,
) -> impl hyper_util::server::graceful::GracefulConnection<
    Error = Box<dyn std::error::Error + Send + Sync>,
> + Send
+ 'static {
    let gw = gateway.clone();
    let on_conn = sh.clone();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(info) = &tls {
            req.extensions_mut().insert(info.clone());
        }
        let gw = gw.clone();
        let sh = on_conn.clone();
        async move {
            let active = sh.request();
            // An HTTP/2 WebSocket (extended CONNECT) keeps its connection busy while it is open,
            // so the connection is not closed as idle under it.
            if req.method() == http::Method::CONNECT {
                req.extensions_mut().insert(Arc::new(sh.request()));
            }
            // Boxed: the request's whole future (flow, calls, respond) is made once on the
            // heap — in place, not built on the stack and copied (`pinned`) — and the
            // per-stream future HTTP/2 spawns (and moves) stays small.
            let resp = fanout_layers::boxed::pinned(|| gw.handle(req, Some(peer)))
                .await
                .map(|b| TrackedBody::new(b, sh.clone()));
            drop(active);
            Ok::<_, Infallible>(resp)
        }
    });
    // With upgrades: a WebSocket route's 101 hands the socket to its relay (`websocket.rs`).
    builder
        .serve_connection_with_upgrades(TokioIo::new(TrackedIo::new(stream, sh.clone())), svc)
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_panicking_handler_becomes_a_500_for_that_request_only() {
        let panics = AtomicU64::new(0);
        let resp = catch_panics(
            async {
                if panics.load(Ordering::Relaxed) == 0 {
                    panic!("secret internal detail");
                }
                Response::new(Body::full(Bytes::new()))
            },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "internal_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(!msg.contains("secret"), "no internals in the answer: {msg}");
        assert_eq!(v["error"]["request_id"], "rid-1");
        assert_eq!(panics.load(Ordering::Relaxed), 1);

        // The next request is served normally.
        let ok = catch_panics(
            async { Response::new(Body::full(Bytes::from_static(b"{}"))) },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(panics.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn what_the_panicking_handler_held_is_released() {
        struct Held<'a>(&'a AtomicU64);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let released = AtomicU64::new(0);
        let panics = AtomicU64::new(0);
        let resp = catch_panics(
            async {
                let _slot = Held(&released);
                tokio::task::yield_now().await;
                let v: Vec<u8> = Vec::new();
                #[allow(clippy::indexing_slicing)]
                let _ = v[1];
                Response::new(Body::full(Bytes::new()))
            },
            &panics,
            &HeaderValue::from_static("rid-1"),
            false,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(released.load(Ordering::Relaxed), 1);
        assert_eq!(panics.load(Ordering::Relaxed), 1);
    }
}
