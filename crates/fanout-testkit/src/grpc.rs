//! A hand-written h2c gRPC server for the tests of gRPC *clients* (the load generator,
//! `fanout load --grpc`): hyper's HTTP/2 server on an ephemeral 127.0.0.1 port, one answer
//! function for every request, and a record of what each request carried. Framing and trailers
//! are written by hand ([`grpc_frame`], [`grpc_trailers`]), so a client is checked against the
//! bytes of the protocol rather than against a second gRPC implementation.
//!
//! ```no_run
//! # async fn demo() {
//! use fanout_testkit::grpc::{GrpcServer, grpc_answer, grpc_trailers};
//! let server = GrpcServer::start(|req| match req.path.as_str() {
//!     "/test.v1.Echo/Hello" => grpc_answer(Some(b"\x0a\x02hi"), Some(grpc_trailers("0", None))),
//!     _ => grpc_answer(None, Some(grpc_trailers("14", Some("try later")))),
//! })
//! .await;
//! // … point the client at server.addr, then:
//! assert!(server.requests().iter().all(|r| r.header("te") == Some("trailers")));
//! # }
//! ```

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// The body of an answer of the [`GrpcServer`].
pub type GrpcBody = BoxBody<Bytes, Infallible>;

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub struct GrpcRequest {
    /// The path (`/package.Service/Method`).
    pub path: String,
    /// The request headers (gRPC metadata included).
    pub headers: HeaderMap,
    /// The whole request body, still framed.
    pub body: Bytes,
}

impl GrpcRequest {
    /// A header's value as text (`None` when absent or not text).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The one message of the body, unframed ([`grpc_unframe`]).
    pub fn message(&self) -> Option<&[u8]> {
        grpc_unframe(&self.body)
    }
}

type Answer = dyn Fn(&GrpcRequest) -> Response<GrpcBody> + Send + Sync;

/// A running h2c server; stops accepting connections when dropped.
pub struct GrpcServer {
    /// Its address (`127.0.0.1:PORT`).
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<GrpcRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcServer {
    /// Start on an ephemeral port; every request is read whole, recorded, then answered by
    /// `answer` (build answers with [`grpc_answer`], [`grpc_trailers_only`], [`http_answer`]).
    pub async fn start(
        answer: impl Fn(&GrpcRequest) -> Response<GrpcBody> + Send + Sync + 'static,
    ) -> GrpcServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<GrpcRequest>>> = Arc::default();
        let answer: Arc<Answer> = Arc::new(answer);
        let (s, a) = (seen.clone(), answer);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (s, a) = (s.clone(), a.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let (s, a) = (s.clone(), a.clone());
                        async move { Ok::<_, Infallible>(handle(req, &s, &*a).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        GrpcServer { addr, seen, task }
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<GrpcRequest> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests were received so far.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    req: Request<Incoming>,
    seen: &Mutex<Vec<GrpcRequest>>,
    answer: &Answer,
) -> Response<GrpcBody> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let req = GrpcRequest {
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body,
    };
    let resp = answer(&req);
    seen.lock().unwrap().push(req);
    resp
}

/// A gRPC answer (`content-type: application/grpc`): `message` framed as the body (none: an
/// empty body), then `trailers` (none: no trailers at all — a broken server's answer).
pub fn grpc_answer(message: Option<&[u8]>, trailers: Option<HeaderMap>) -> Response<GrpcBody> {
    let body = message.map_or_else(Bytes::new, grpc_frame);
    let body = match trailers {
        Some(t) => Full::new(body)
            .with_trailers(std::future::ready(Some(Ok(t))))
            .boxed(),
        None => Full::new(body).boxed(),
    };
    let mut r = Response::new(body);
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    r
}

/// A trailers-only gRPC answer: `trailers` sent as the headers, which end the stream.
pub fn grpc_trailers_only(trailers: HeaderMap) -> Response<GrpcBody> {
    let mut r = Response::new(Empty::new().boxed());
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    r.headers_mut().extend(trailers);
    r
}

/// A plain HTTP answer with `status` and no body (not a gRPC answer: no `grpc-status`).
pub fn http_answer(status: StatusCode) -> Response<GrpcBody> {
    let mut r = Response::new(Empty::new().boxed());
    *r.status_mut() = status;
    r
}

/// `grpc-status: status` (the code's number, as text) and, if given, `grpc-message`.
pub fn grpc_trailers(status: &str, message: Option<&str>) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_str(status).unwrap());
    if let Some(m) = message {
        t.insert("grpc-message", HeaderValue::from_str(m).unwrap());
    }
    t
}

/// One gRPC message behind its 5-byte prefix (uncompressed, big-endian length).
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let len = u32::try_from(message.len()).unwrap();
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// The one message of a framed body: `None` unless the body is exactly one uncompressed frame.
pub fn grpc_unframe(body: &[u8]) -> Option<&[u8]> {
    let (head, rest) = body.split_at_checked(5)?;
    let len = u32::from_be_bytes(head[1..5].try_into().ok()?);
    (head[0] == 0 && usize::try_from(len).ok()? == rest.len()).then_some(rest)
}
