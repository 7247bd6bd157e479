//! A hand-written HTTP backend of raw bodies (HTTP/1.1 and h2c on one port), for the tests of
//! pass-through routes: it hashes what it receives as it arrives (SHA-256, never holding a body),
//! produces large answers a chunk at a time, and has the odd answers a proxy must carry
//! (ranges, trailers, `HEAD`, hop-by-hop fields, an answer that breaks or stalls).
//!
//! Paths (the first segment decides; the query is free):
//! - `/upload…`: the body read and hashed; answers `{"sha256", "bytes"}` (JSON);
//! - `/echo…`: the body sent back as it arrives, with the request's `content-type`;
//! - `/download/N`: `N` bytes of [`pattern`] with a `Content-Length` (`?chunked` without);
//! - `/range`: the 1000 bytes of [`pattern`], or the `Range: bytes=A-B` part of them (206);
//! - `/trailers`: `abc`, then the trailer `x-checksum: 42`;
//! - `/hop`: answers with hop-by-hop fields (`Connection: x-backend-hop`, `x-backend-hop`,
//!   `Keep-Alive`) beside an end-to-end one;
//! - `/stall`: the head and 5 bytes, then nothing, ever;
//! - `/drip`: a byte every 50 ms, forever;
//! - `/never`: no answer, ever;
//! - `/abort`: a head announcing 100 bytes, 10 of them, then the connection breaks;
//! - `/status/CODE`: that status, body `status CODE`;
//! - anything else: 200 `ok`.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type RawBody = UnsyncBoxBody<Bytes, BoxError>;

/// What the backend saw of one request, recorded when its body ended (or broke).
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method.
    pub method: http::Method,
    /// Path and query as received.
    pub uri: String,
    /// The HTTP version it came in.
    pub version: Version,
    /// Its headers.
    pub headers: HeaderMap,
    /// SHA-256 of the body's bytes (lowercase hex).
    pub sha256: String,
    /// The body's length.
    pub bytes: u64,
    /// The body came to its end (false: it broke off).
    pub complete: bool,
    /// The request's trailers, if it had any.
    pub trailers: Option<HeaderMap>,
}

/// A running raw backend; stops accepting when dropped.
pub struct RawBackend {
    /// Its address.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// Byte `i` of the backend's generated bodies: a pattern that does not repeat at any power of
/// two (so a lost or doubled chunk changes the hash).
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i % 251) as u8
}

/// Bytes `from..to` of [`pattern`].
pub fn pattern_bytes(from: u64, to: u64) -> Vec<u8> {
    (from..to).map(pattern).collect()
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 of the first `n` bytes of [`pattern`], lowercase hex (computed a chunk at a time).
pub fn pattern_sha256(n: u64) -> String {
    let mut h = Sha256::new();
    let mut at = 0;
    while at < n {
        let end = (at + CHUNK).min(n);
        h.update(pattern_bytes(at, end));
        at = end;
    }
    hex(&h.finalize())
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The size of the chunks the backend sends.
const CHUNK: u64 = 64 << 10;

impl RawBackend {
    /// Start on an ephemeral port of 127.0.0.1.
    pub async fn start() -> RawBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let s = seen.clone();
        let connections: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let accepted = connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(handle(req, s).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        RawBackend {
            addr,
            seen,
            connections,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request whose body ended (or broke) so far, in that order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<RawBody> {
    let mut r = Response::new(UnsyncBoxBody::new(
        Full::new(body.into()).map_err(|e| match e {}),
    ));
    *r.status_mut() = status;
    r
}

fn stream(
    frames: impl futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + 'static,
) -> RawBody {
    UnsyncBoxBody::new(StreamBody::new(frames))
}

/// Read `body` to its end, hashing it; record what was seen.
async fn consume(
    parts: &http::request::Parts,
    mut body: Incoming,
    seen: &Mutex<Vec<Seen>>,
) -> (String, u64) {
    let mut h = Sha256::new();
    let mut n = 0u64;
    let mut trailers = None;
    let mut complete = true;
    loop {
        match body.frame().await {
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => {
                    n += d.len() as u64;
                    h.update(&d);
                }
                Err(f) => trailers = f.into_trailers().ok(),
            },
            Some(Err(_)) => {
                complete = false;
                break;
            }
            None => break,
        }
    }
    let sha = hex(&h.finalize());
    seen.lock().unwrap().push(Seen {
        method: parts.method.clone(),
        uri: parts
            .uri
            .path_and_query()
            .map_or(String::new(), |p| p.to_string()),
        version: parts.version,
        headers: parts.headers.clone(),
        sha256: sha.clone(),
        bytes: n,
        complete,
        trailers,
    });
    (sha, n)
}

async fn handle(req: Request<Incoming>, seen: Arc<Mutex<Vec<Seen>>>) -> Response<RawBody> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let first = path.split('/').nth(1).unwrap_or("").to_string();
    let chunked = parts.uri.query().is_some_and(|q| q.contains("chunked"));
    if first == "echo" {
        // The body goes back as it arrives; what was seen is recorded at its end.
        let ct = parts.headers.get(http::header::CONTENT_TYPE).cloned();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(2);
        tokio::spawn(async move {
            let mut body = body;
            let mut h = Sha256::new();
            let mut n = 0u64;
            let mut complete = true;
            while let Some(f) = body.frame().await {
                match f {
                    Ok(f) => {
                        if let Some(d) = f.data_ref() {
                            n += d.len() as u64;
                            h.update(d);
                        }
                        if tx.send(Ok(f)).await.is_err() {
                            complete = false;
                            break;
                        }
                    }
                    Err(e) => {
                        complete = false;
                        let _ = tx.send(Err(Box::new(e))).await;
                        break;
                    }
                }
            }
            seen.lock().unwrap().push(Seen {
                method: parts.method.clone(),
                uri: parts
                    .uri
                    .path_and_query()
                    .map_or(String::new(), |p| p.to_string()),
                version: parts.version,
                headers: parts.headers.clone(),
                sha256: hex(&h.finalize()),
                bytes: n,
                complete,
                trailers: None,
            });
        });
        let frames =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        let mut r = Response::new(stream(frames));
        if let Some(ct) = ct {
            r.headers_mut().insert(http::header::CONTENT_TYPE, ct);
        }
        return r;
    }
    let (sha, n) = consume(&parts, body, &seen).await;
    match first.as_str() {
        "upload" => {
            let mut r = full(
                StatusCode::OK,
                format!("{{\"sha256\":\"{sha}\",\"bytes\":{n}}}"),
            );
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        "download" => {
            let total: u64 = path
                .rsplit('/')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            let frames = futures_util::stream::unfold(0u64, move |at| async move {
                if at >= total {
                    return None;
                }
                let end = (at + CHUNK).min(total);
                Some((Ok(Frame::data(Bytes::from(pattern_bytes(at, end)))), end))
            });
            let mut r = Response::new(stream(frames));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            if !chunked {
                r.headers_mut()
                    .insert(http::header::CONTENT_LENGTH, HeaderValue::from(total));
            }
            r
        }
        "range" => {
            let all = pattern_bytes(0, 1000);
            let range = parts
                .headers
                .get(http::header::RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes="))
                .and_then(|v| v.split_once('-'))
                .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
                .filter(|(a, b)| a <= b && *b < 1000);
            let mut r = match range {
                Some((a, b)) => {
                    let mut r = full(StatusCode::PARTIAL_CONTENT, all[a..=b].to_vec());
                    r.headers_mut().insert(
                        http::header::CONTENT_RANGE,
                        HeaderValue::from_str(&format!("bytes {a}-{b}/1000")).unwrap(),
                    );
                    r
                }
                None => full(StatusCode::OK, all),
            };
            r.headers_mut().insert(
                http::header::ACCEPT_RANGES,
                HeaderValue::from_static("bytes"),
            );
            r
        }
        "trailers" => {
            let mut t = HeaderMap::new();
            t.insert("x-checksum", HeaderValue::from_static("42"));
            let frames = futures_util::stream::iter([
                Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"abc"))),
                Ok(Frame::trailers(t)),
            ]);
            let mut r = Response::new(stream(frames));
            r.headers_mut().insert(
                http::header::TRAILER,
                HeaderValue::from_static("x-checksum"),
            );
            r
        }
        "hop" => {
            let mut r = full(StatusCode::OK, "hop");
            let h = r.headers_mut();
            h.insert(
                http::header::CONNECTION,
                HeaderValue::from_static("x-backend-hop"),
            );
            h.insert("x-backend-hop", HeaderValue::from_static("1"));
            h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
            h.insert("x-end-to-end", HeaderValue::from_static("1"));
            r
        }
        "stall" => {
            let frames = futures_util::stream::iter([Ok::<_, BoxError>(Frame::data(
                Bytes::from_static(b"12345"),
            ))]);
            use futures_util::StreamExt;
            Response::new(stream(frames.chain(futures_util::stream::pending())))
        }
        "drip" => {
            let frames = futures_util::stream::unfold((), |()| async {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                Some((Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"."))), ()))
            });
            Response::new(stream(frames))
        }
        "never" => std::future::pending().await,
        "abort" => {
            // The ten bytes, then (after a pause that lets the connection send them) a failure.
            let frames = futures_util::stream::unfold(0u8, |step| async move {
                match step {
                    0 => Some((
                        Ok::<_, BoxError>(Frame::data(Bytes::from(vec![b'x'; 10]))),
                        1,
                    )),
                    1 => {
                        tokio::task::yield_now().await;
                        Some((Err(BoxError::from("the backend broke off")), 2))
                    }
                    _ => None,
                }
            });
            let mut r = Response::new(stream(frames));
            r.headers_mut()
                .insert(http::header::CONTENT_LENGTH, HeaderValue::from(100u64));
            r
        }
        "status" => {
            let code: u16 = path
                .rsplit('/')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or(500);
            full(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                format!("status {code}"),
            )
        }
        _ => full(StatusCode::OK, "ok"),
    }
}
