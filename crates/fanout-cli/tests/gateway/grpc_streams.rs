//! gRPC streaming methods through pass-through routes (docs/grpc.md#streaming-methods): server,
//! client and bidi streams between a tonic client and a gRPC backend written here on hyper (h2c),
//! message by message; per-message size limits both ways (`RESOURCE_EXHAUSTED`); the client's
//! `grpc-timeout`; cancellation seen by the backend; the edge stages on the call's head.

use crate::support::gateway;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use fanout_testkit::*;
use futures_util::StreamExt;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Count {
    #[prost(int32, tag = "1")]
    pub n: i32,
    #[prost(int32, tag = "2")]
    pub size: i32,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct Num {
    #[prost(int32, tag = "1")]
    pub value: i32,
    #[prost(bytes = "vec", tag = "2")]
    pub pad: Vec<u8>,
}

fn num(value: i32) -> Num {
    Num { value, pad: vec![] }
}

/// What the backend saw.
#[derive(Default)]
struct Seen {
    calls: AtomicU64,
    /// Answer streams that ended because the other side went away (the call was cancelled).
    cancelled: AtomicU64,
    /// Request messages read.
    received: AtomicU64,
}

fn frame(m: &impl prost::Message) -> Bytes {
    let body = m.encode_to_vec();
    let mut b = BytesMut::with_capacity(5 + body.len());
    b.put_u8(0);
    b.put_u32(body.len() as u32);
    b.put_slice(&body);
    b.freeze()
}

type Tx = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>;

fn ok_trailers() -> http::HeaderMap {
    let mut t = http::HeaderMap::new();
    t.insert("grpc-status", "0".parse().unwrap());
    t
}

/// Messages of a request body, one at a time (`None` at its end or when it breaks).
struct Reader {
    body: Incoming,
    buf: BytesMut,
}

impl Reader {
    async fn next<M: prost::Message + Default>(&mut self) -> Option<M> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let m = self.buf.split_to(len);
                    return M::decode(m).ok();
                }
            }
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                _ => return None,
            }
        }
    }
}

/// The backend: `Count` streams numbers (forever with `n: 0`, until the client goes away),
/// `Sum` adds a stream up, `Echo` answers each number as it comes, `Get` answers one.
async fn backend() -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let s = s.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let s = s.clone();
                    async move { Ok::<_, Infallible>(serve(req, s)) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn serve(req: Request<Incoming>, seen: Arc<Seen>) -> Response<StreamBody<tokio_stream_shim::Rx>> {
    seen.calls.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path().to_string();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let mut reader = Reader {
        body: req.into_body(),
        buf: BytesMut::new(),
    };
    tokio::spawn(async move {
        let send = |tx: &Tx, f: Frame<Bytes>| {
            let tx = tx.clone();
            async move { tx.send(Ok(f)).await.is_ok() }
        };
        let gone = |seen: &Seen| {
            seen.cancelled.fetch_add(1, Ordering::Relaxed);
        };
        match path.as_str() {
            "/streams.v1.Numbers/Count" => {
                let Some(c) = reader.next::<Count>().await else {
                    return;
                };
                seen.received.fetch_add(1, Ordering::Relaxed);
                let mut i = 0;
                loop {
                    if c.n > 0 && i >= c.n {
                        break;
                    }
                    let m = Num {
                        value: i,
                        pad: vec![7; c.size as usize],
                    };
                    if !send(&tx, Frame::data(frame(&m))).await {
                        return gone(&seen);
                    }
                    i += 1;
                    if c.n == 0 {
                        // Forever: until the client goes away (the send fails).
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                if !send(&tx, Frame::trailers(ok_trailers())).await {
                    gone(&seen);
                }
            }
            "/streams.v1.Numbers/Sum" => {
                let mut sum = 0;
                while let Some(m) = reader.next::<Num>().await {
                    seen.received.fetch_add(1, Ordering::Relaxed);
                    sum += m.value;
                }
                let _ = send(&tx, Frame::data(frame(&num(sum)))).await;
                let _ = send(&tx, Frame::trailers(ok_trailers())).await;
            }
            "/streams.v1.Numbers/Echo" => {
                while let Some(m) = reader.next::<Num>().await {
                    seen.received.fetch_add(1, Ordering::Relaxed);
                    if !send(&tx, Frame::data(frame(&num(m.value)))).await {
                        return gone(&seen);
                    }
                }
                let _ = send(&tx, Frame::trailers(ok_trailers())).await;
            }
            _ => {
                let m = reader.next::<Num>().await.unwrap_or_default();
                let _ = send(&tx, Frame::data(frame(&num(m.value + 1)))).await;
                let _ = send(&tx, Frame::trailers(ok_trailers())).await;
            }
        }
    });
    let mut resp = Response::new(StreamBody::new(tokio_stream_shim::Rx(rx)));
    resp.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    resp
}

/// An mpsc receiver as a stream (no tokio-stream dependency).
mod tokio_stream_shim {
    use super::*;
    pub struct Rx(pub tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);
    impl futures_util::Stream for Rx {
        type Item = Result<Frame<Bytes>, Infallible>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            self.0.poll_recv(cx)
        }
    }
}

fn config(backend: SocketAddr, extra_defaults: &str) -> String {
    let protos = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/protos");
    format!(
        r#"
protos: {{ files: [streams.proto], include: ["{}"] }}
backends:
  numbers: {{ url: "http://{backend}", protocol: grpc, timeout: 10s }}
defaults: {{ {extra_defaults} }}
routes:
  - grpc: streams.v1.Numbers/Count
    pass: {{ backend: numbers, max_message_bytes: 1000, idle_timeout: 10s }}
  - grpc: streams.v1.Numbers/Sum
    pass: {{ backend: numbers }}
  - grpc: streams.v1.Numbers/Echo
    pass: {{ backend: numbers, max_message_bytes: 1000 }}
  - grpc: streams.v1.Numbers/Get
    pass: {{ backend: numbers }}
"#,
        protos.display()
    )
}

type H2 = Client<HttpConnector, tonic::body::Body>;

fn grpc_client(addr: SocketAddr) -> tonic::client::Grpc<H2> {
    let h2: H2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let origin: Uri = format!("http://{addr}").parse().unwrap();
    tonic::client::Grpc::with_origin(h2, origin)
}

fn path(method: &'static str) -> http::uri::PathAndQuery {
    http::uri::PathAndQuery::from_static(method)
}

/// Every wait of these tests is bounded: a stream that stops moving fails the test.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no progress within 20 s"))
}

/// `Count { n, size }` (server streaming) on a ready client: the call's answer stream.
async fn count(
    c: &mut tonic::client::Grpc<H2>,
    n: i32,
    size: i32,
    timeout: Option<Duration>,
) -> Result<tonic::Streaming<Num>, tonic::Status> {
    within("ready", c.ready()).await.unwrap();
    let mut req = tonic::Request::new(Count { n, size });
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    let codec = tonic_prost::ProstCodec::<Count, Num>::default();
    within(
        "Count",
        c.server_streaming(req, path("/streams.v1.Numbers/Count"), codec),
    )
    .await
    .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_client_and_bidi_streams_pass_message_by_message() {
    let (backend_addr, seen) = backend().await;
    let stubs =
        stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await;
    let gw = gateway(&config(backend_addr, ""), &stubs).await;
    let mut c = grpc_client(gw.addr);

    // Server streaming: five numbers, then OK.
    let resp = count(&mut c, 5, 0, None).await.unwrap();
    let got: Vec<i32> = within("Count's numbers", resp.collect::<Vec<_>>())
        .await
        .into_iter()
        .map(|m| m.unwrap().value)
        .collect();
    assert_eq!(got, [0, 1, 2, 3, 4]);

    // Client streaming: the backend adds up what the client streams.
    within("ready", c.ready()).await.unwrap();
    let codec = tonic_prost::ProstCodec::<Num, Num>::default();
    let sum = within(
        "Sum",
        c.client_streaming(
            tonic::Request::new(futures_util::stream::iter([num(1), num(2), num(39)])),
            path("/streams.v1.Numbers/Sum"),
            codec,
        ),
    )
    .await
    .unwrap();
    assert_eq!(sum.into_inner().value, 42);

    // Bidi in lock step: each number comes back before the next one is sent — nothing waits
    // for the stream's end anywhere on the way.
    within("ready", c.ready()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Num>(1);
    let requests =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let codec = tonic_prost::ProstCodec::<Num, Num>::default();
    tx.send(num(0)).await.unwrap();
    let resp = within(
        "Echo",
        c.streaming(
            tonic::Request::new(requests),
            path("/streams.v1.Numbers/Echo"),
            codec,
        ),
    )
    .await
    .unwrap();
    let mut answers = resp.into_inner();
    for i in 0..10 {
        let m = within("an echo", answers.message()).await.unwrap().unwrap();
        assert_eq!(m.value, i);
        tx.send(num(i + 1)).await.unwrap();
    }
    drop(tx);
    let last = within("the last echo", answers.message()).await.unwrap();
    assert_eq!(last.map(|m| m.value), Some(10));
    assert!(
        within("the end", answers.message())
            .await
            .unwrap()
            .is_none()
    );

    // Unary through the same kind of route.
    within("ready", c.ready()).await.unwrap();
    let codec = tonic_prost::ProstCodec::<Num, Num>::default();
    let one = within(
        "Get",
        c.unary(
            tonic::Request::new(num(41)),
            path("/streams.v1.Numbers/Get"),
            codec,
        ),
    )
    .await
    .unwrap();
    assert_eq!(one.into_inner().value, 42);
    assert_eq!(seen.calls.load(Ordering::Relaxed), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_is_cancelled_at_the_backend_and_limits_end_calls_with_a_status() {
    let (backend_addr, seen) = backend().await;
    let stubs =
        stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await;
    let gw = gateway(&config(backend_addr, ""), &stubs).await;
    let mut c = grpc_client(gw.addr);

    // An endless stream: the client takes two numbers and goes away; the backend sees it.
    let resp = count(&mut c, 0, 0, None).await.unwrap();
    let mut stream = resp;
    for i in 0..2 {
        let m = within("a number", stream.message()).await.unwrap().unwrap();
        assert_eq!(m.value, i);
    }
    drop(stream);
    wait_until("the backend sees the call cancelled", || {
        seen.cancelled.load(Ordering::Relaxed) == 1
    })
    .await;

    // An answer message over the route's max_message_bytes (1 000): the numbers before it are
    // not there (each is too large), the call ends RESOURCE_EXHAUSTED.
    let resp = count(&mut c, 3, 2000, None).await.unwrap();
    let mut stream = resp;
    let err = within("the status", stream.message()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("max_message_bytes"), "{err:?}");

    // A request message over it: the backend never gets it, the call ends RESOURCE_EXHAUSTED.
    within("ready", c.ready()).await.unwrap();
    let received = seen.received.load(Ordering::Relaxed);
    let big = Num {
        value: 1,
        pad: vec![1; 2000],
    };
    let codec = tonic_prost::ProstCodec::<Num, Num>::default();
    let outcome = within(
        "Echo",
        c.streaming(
            tonic::Request::new(
                futures_util::stream::iter([big]).chain(futures_util::stream::pending()),
            ),
            path("/streams.v1.Numbers/Echo"),
            codec,
        ),
    )
    .await;
    let code = match outcome {
        Err(e) => e.code(),
        Ok(resp) => within("the status", resp.into_inner().message())
            .await
            .unwrap_err()
            .code(),
    };
    assert_eq!(code, tonic::Code::ResourceExhausted);
    assert_eq!(seen.received.load(Ordering::Relaxed), received);

    // The client's grpc-timeout ends an endless stream DEADLINE_EXCEEDED, with a status.
    let mut stream = count(&mut c, 0, 0, Some(Duration::from_millis(300)))
        .await
        .unwrap();
    let code = loop {
        match within("a number or the status", stream.message()).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("an endless stream ended OK"),
            Err(e) => break e.code(),
        }
    };
    assert_eq!(code, tonic::Code::DeadlineExceeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_stages_decide_on_a_streaming_calls_head() {
    let (backend_addr, seen) = backend().await;
    let stubs =
        stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await;
    let yaml = config(
        backend_addr,
        "stages: { ip_filter: { deny: [127.0.0.0/8, '::1'] } }",
    );
    let gw = gateway(&yaml, &stubs).await;
    let mut c = grpc_client(gw.addr);
    let err = count(&mut c, 5, 0, None).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert_eq!(
        err.metadata().get("x-fanout-error-code").unwrap(),
        "ip_denied"
    );
    assert_eq!(seen.calls.load(Ordering::Relaxed), 0);
}

#[test]
fn a_streaming_method_with_a_flow_is_refused_and_told_about_pass() {
    let protos = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/protos");
    let yaml = format!(
        "protos: {{ files: [streams.proto], include: [\"{}\"] }}\nroutes:\n  - grpc: streams.v1.Numbers/Count\n    respond: {{ body: '{{value: 1}}' }}\n",
        protos.display()
    );
    let err = fanout::load_gateway("fanout.yaml", &yaml, &|_: &str| None)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("fanout.yaml:3:")
            && err.contains("is a streaming method")
            && err.contains("pass"),
        "{err}"
    );
}

/// A `path:` pass-through route forwards a whole gRPC service — no `.proto` needed — with the
/// same per-message limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_route_passes_a_whole_service_without_protos() {
    let (backend_addr, seen) = backend().await;
    let stubs =
        stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await;
    let yaml = format!(
        "backends:\n  numbers: {{ url: \"http://{backend_addr}\", protocol: grpc }}\nroutes:\n  - path: /streams.v1.Numbers/{{method}}\n    method: POST\n    pass: {{ backend: numbers, max_message_bytes: 1000 }}\n"
    );
    let gw = gateway(&yaml, &stubs).await;
    let mut c = grpc_client(gw.addr);
    let resp = count(&mut c, 3, 0, None).await.unwrap();
    let got: Vec<i32> = within("numbers", resp.collect::<Vec<_>>())
        .await
        .into_iter()
        .map(|m| m.unwrap().value)
        .collect();
    assert_eq!(got, [0, 1, 2]);
    let mut resp = count(&mut c, 1, 5000, None).await.unwrap();
    let err = within("the status", resp.message()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(seen.calls.load(Ordering::Relaxed), 2);
}

#[test]
fn explain_names_the_kind_of_each_streaming_method() {
    let dir = TempDir::new("grpc-streams-explain");
    let path = dir.write("fanout.yaml", &config("127.0.0.1:1".parse().unwrap(), ""));
    for (method, kind) in [
        ("Count", "server-streaming"),
        ("Sum", "client-streaming"),
        ("Echo", "bidi-streaming"),
        ("Get", "unary"),
    ] {
        let text = fanout::explain::explain_file_at(
            path.to_str().unwrap(),
            &|_: &str| None,
            Some(&format!("/streams.v1.Numbers/{method}")),
            fanout::explain::Format::Text,
            None,
        )
        .unwrap();
        assert!(
            text.contains("pass-through to backend `numbers`")
                && text.contains(&format!("gRPC {kind} method, messages passed as they come")),
            "{method}: {text}"
        );
    }
}
