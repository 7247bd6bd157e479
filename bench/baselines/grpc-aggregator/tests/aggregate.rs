//! The baseline end to end: three in-test gRPC backends (hand-written `tonic::server::Grpc` on a
//! hyper-util server, ephemeral ports), the aggregator in process, and a tonic client (hyper-util
//! h2c client + `tonic::client::Grpc`) calling `GetPage` — the merged page, concurrency, deadline
//! forwarding, unknown methods, failing and slow backends, and the client's `grpc-timeout`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use futures_util::future::BoxFuture;
use grpc_aggregator::Config;
use grpc_aggregator::proto::*;
use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

/// Upper bound for any single wait in these tests.
const BOUND: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Backends

/// What an in-test backend does with each call.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Answer at once with data derived from the request.
    Answer,
    /// Answer with data after sleeping this long.
    Sleep(Duration),
    /// Fail with this status code.
    Fail(Code),
}

/// One unary method of a test backend: `answer` computes the reply from the request.
struct Handler<Req, Resp> {
    behaviour: Behaviour,
    answer: fn(Req) -> Resp,
}

impl<Req: Send + 'static, Resp: Send + 'static> tonic::server::UnaryService<Req>
    for Handler<Req, Resp>
{
    type Response = Resp;
    type Future = BoxFuture<'static, Result<tonic::Response<Resp>, Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let (behaviour, answer) = (self.behaviour, self.answer);
        Box::pin(async move {
            match behaviour {
                Behaviour::Answer => {}
                Behaviour::Sleep(d) => tokio::time::sleep(d).await,
                Behaviour::Fail(code) => return Err(Status::new(code, "the test backend fails")),
            }
            Ok(tonic::Response::new(answer(request.into_inner())))
        })
    }
}

/// A running test backend and the `grpc-timeout` header of every call it got.
struct Backend {
    addr: SocketAddr,
    timeouts: Arc<Mutex<Vec<Option<String>>>>,
}

impl Backend {
    /// The `grpc-timeout` values received so far, parsed.
    fn budgets(&self) -> Vec<Option<Duration>> {
        self.timeouts
            .lock()
            .unwrap()
            .iter()
            .map(|t| {
                t.as_deref()
                    .map(|v| grpc_aggregator::parse_grpc_timeout(v).expect(v))
            })
            .collect()
    }
}

/// Serve one unary method at `path` on 127.0.0.1:0 (h2c); other paths are UNIMPLEMENTED.
async fn backend<Req, Resp>(
    path: &'static str,
    behaviour: Behaviour,
    answer: fn(Req) -> Resp,
) -> Backend
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let timeouts = Arc::new(Mutex::new(Vec::new()));
    let seen = timeouts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            let seen = seen.clone();
            let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    if req.uri().path() != path {
                        return Ok::<_, Infallible>(
                            Status::unimplemented(req.uri().path().to_string()).into_http(),
                        );
                    }
                    let timeout = req
                        .headers()
                        .get("grpc-timeout")
                        .map(|v| v.to_str().unwrap().to_string());
                    seen.lock().unwrap().push(timeout);
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default());
                    Ok(grpc.unary(Handler { behaviour, answer }, req).await)
                }
            });
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Backend { addr, timeouts }
}

fn user(r: UserRequest) -> User {
    User {
        name: format!("User {}", r.id),
        email: format!("{}@example.com", r.id),
        level: 3,
        id: r.id,
    }
}

fn orders(r: OrdersRequest) -> OrderList {
    OrderList {
        orders: (1..=r.limit)
            .map(|i| Order {
                id: format!("o-{}-{i}", r.user_id),
                amount_cents: 1000 * i64::from(i),
                status: "paid".into(),
            })
            .collect(),
    }
}

fn recs(_: RecsRequest) -> RecList {
    RecList {
        items: [0.9, 0.8, 0.7]
            .into_iter()
            .enumerate()
            .map(|(i, score)| Rec {
                sku: format!("sku-{}", i + 1),
                score,
            })
            .collect(),
    }
}

/// The page the aggregator must build for `id` from the deterministic backends.
fn expected_page(id: &str) -> Page {
    Page {
        user: Some(user(UserRequest { id: id.into() })),
        orders: orders(OrdersRequest {
            user_id: id.into(),
            limit: 3,
        })
        .orders,
        recs: recs(RecsRequest::default()).items,
    }
}

/// The three backends, each with its own behaviour.
struct Backends {
    users: Backend,
    orders: Backend,
    recs: Backend,
}

async fn backends(users: Behaviour, orders_b: Behaviour, recs_b: Behaviour) -> Backends {
    Backends {
        users: backend(GET_USER, users, user).await,
        orders: backend(LIST_ORDERS, orders_b, orders).await,
        recs: backend(GET_RECS, recs_b, recs).await,
    }
}

impl Backends {
    /// A config pointing at these backends, with per-call `timeout`.
    fn config(&self, timeout: Duration) -> Config {
        let vars = [
            ("USERS_ADDR", self.users.addr.to_string()),
            ("ORDERS_ADDR", self.orders.addr.to_string()),
            ("RECS_ADDR", self.recs.addr.to_string()),
            ("BACKEND_TIMEOUT_MS", timeout.as_millis().to_string()),
        ];
        Config::from_lookup(|var| vars.iter().find(|(k, _)| *k == var).map(|(_, v)| v.clone()))
            .unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// The aggregator and its client

/// The aggregator serving in a background task.
struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Signal shutdown and wait (bounded) for `serve` to return.
    async fn shutdown(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task")
            .expect("serve result");
    }
}

async fn start(config: Config) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(grpc_aggregator::serve(config, listener, async move {
        let _ = rx.await;
    }));
    Running { addr, stop, task }
}

type GrpcClient = tonic::client::Grpc<Client<HttpConnector, tonic::body::Body>>;

/// A tonic client for `addr` over a hyper-util h2c client (no tonic transport).
fn client(addr: SocketAddr) -> GrpcClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let http = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    tonic::client::Grpc::with_origin(http, format!("http://{addr}").parse().unwrap())
}

/// Call unary `path` on `client` with an optional `grpc-timeout`, within [`BOUND`].
async fn call<Req, Resp>(
    client: &GrpcClient,
    path: &'static str,
    message: Req,
    grpc_timeout: Option<&str>,
) -> Result<Resp, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut request = tonic::Request::new(message);
    if let Some(t) = grpc_timeout {
        request
            .metadata_mut()
            .insert("grpc-timeout", t.parse().unwrap());
    }
    let mut client = client.clone();
    let answer = async move {
        client.ready().await.unwrap();
        client
            .unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::<Req, Resp>::default(),
            )
            .await
    };
    tokio::time::timeout(BOUND, answer)
        .await
        .expect("an answer within the bound")
        .map(tonic::Response::into_inner)
}

async fn get_page(
    client: &GrpcClient,
    id: &str,
    grpc_timeout: Option<&str>,
) -> Result<Page, Status> {
    let req = PageRequest { user_id: id.into() };
    call(client, GET_PAGE, req, grpc_timeout).await
}

fn code(r: Result<Page, Status>) -> Code {
    match r {
        Ok(page) => panic!("expected a failure, got {page:?}"),
        Err(s) => s.code(),
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_the_three_backends() {
    let b = backends(Behaviour::Answer, Behaviour::Answer, Behaviour::Answer).await;
    let agg = start(b.config(Duration::from_secs(1))).await;
    let c = client(agg.addr);

    let page = get_page(&c, "42", None).await.unwrap();
    assert_eq!(page, expected_page("42"));
    // Spelled out once, so a bug shared by the expectation and the code cannot hide.
    let u = page.user.as_ref().unwrap();
    assert_eq!(
        (u.id.as_str(), u.name.as_str(), u.email.as_str(), u.level),
        ("42", "User 42", "42@example.com", 3)
    );
    let ids: Vec<_> = page.orders.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["o-42-1", "o-42-2", "o-42-3"]);
    let amounts: Vec<_> = page.orders.iter().map(|o| o.amount_cents).collect();
    assert_eq!(amounts, [1000, 2000, 3000]);
    assert!(page.orders.iter().all(|o| o.status == "paid"));
    let recs: Vec<_> = page
        .recs
        .iter()
        .map(|r| (r.sku.as_str(), r.score))
        .collect();
    assert_eq!(recs, [("sku-1", 0.9), ("sku-2", 0.8), ("sku-3", 0.7)]);

    // Every backend was told its budget: the 1 s call timeout at most.
    for budgets in [b.users.budgets(), b.orders.budgets(), b.recs.budgets()] {
        assert_eq!(budgets.len(), 1);
        let t = budgets[0].expect("a grpc-timeout header");
        assert!(t > Duration::ZERO && t <= Duration::from_secs(1), "{t:?}");
    }

    // A client deadline shorter than the call timeout is what the backends are told.
    let page = get_page(&c, "7", Some("300m")).await.unwrap();
    assert_eq!(page, expected_page("7"));
    for budgets in [b.users.budgets(), b.orders.budgets(), b.recs.budgets()] {
        let t = budgets[1].expect("a grpc-timeout header");
        assert!(
            t > Duration::ZERO && t <= Duration::from_millis(300),
            "{t:?}"
        );
    }

    // Many pages at once over the one h2 connection, each with its own data.
    let pages = futures_util::future::join_all((0..50).map(|i| {
        let c = c.clone();
        async move { (i, get_page(&c, &format!("u{i}"), None).await) }
    }))
    .await;
    for (i, page) in pages {
        assert_eq!(page.unwrap(), expected_page(&format!("u{i}")));
    }

    agg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_the_backends_concurrently() {
    let slow = Behaviour::Sleep(Duration::from_secs(1));
    let b = backends(slow, slow, slow).await;
    let agg = start(b.config(Duration::from_secs(5))).await;
    let c = client(agg.addr);

    // One after the other the three 1 s calls would need 3 s, past the client's 2.5 s
    // deadline: the answer shows they ran at the same time (a count, not a stopwatch).
    let page = get_page(&c, "1", Some("2500m")).await.unwrap();
    assert_eq!(page, expected_page("1"));
    agg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_methods_are_unimplemented() {
    let b = backends(Behaviour::Answer, Behaviour::Answer, Behaviour::Answer).await;
    let agg = start(b.config(Duration::from_secs(1))).await;
    let c = client(agg.addr);

    let req = PageRequest {
        user_id: "1".into(),
    };
    let r: Result<Page, Status> = call(&c, "/lab.v1.Aggregator/GetPages", req.clone(), None).await;
    assert_eq!(code(r), Code::Unimplemented);
    // A backend's method is not the aggregator's either.
    let r: Result<User, Status> = call(&c, GET_USER, UserRequest { id: "1".into() }, None).await;
    assert_eq!(r.err().map(|s| s.code()), Some(Code::Unimplemented));
    // The connection still serves the real method.
    assert_eq!(get_page(&c, "1", None).await.unwrap(), expected_page("1"));
    agg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backend_fails_the_page_with_unavailable() {
    let b = backends(
        Behaviour::Answer,
        Behaviour::Fail(Code::Unavailable),
        Behaviour::Answer,
    )
    .await;
    let agg = start(b.config(Duration::from_secs(1))).await;
    let c = client(agg.addr);
    let err = get_page(&c, "1", None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("orders"), "{err:?}");
    agg.shutdown().await;

    // Any non-OK code from a backend is mapped, not passed through.
    let b = backends(
        Behaviour::Answer,
        Behaviour::Answer,
        Behaviour::Fail(Code::NotFound),
    )
    .await;
    let agg = start(b.config(Duration::from_secs(1))).await;
    let err = get_page(&client(agg.addr), "1", None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("recs"), "{err:?}");
    agg.shutdown().await;

    // A backend nobody listens on.
    let b = backends(Behaviour::Answer, Behaviour::Answer, Behaviour::Answer).await;
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut config = b.config(Duration::from_secs(1));
    config.users = closed;
    let agg = start(config).await;
    let err = get_page(&client(agg.addr), "1", None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    agg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_grpc_timeout_is_enforced() {
    let slow = Behaviour::Sleep(Duration::from_secs(2));
    let b = backends(Behaviour::Answer, Behaviour::Answer, slow).await;
    // A call timeout far beyond the test: only the client's deadline can end these calls.
    let agg = start(b.config(Duration::from_secs(30))).await;
    let c = client(agg.addr);

    let t0 = Instant::now();
    let r = get_page(&c, "1", Some("1m")).await;
    let took = t0.elapsed();
    assert_eq!(code(r), Code::DeadlineExceeded);
    // Far below the 2 s backend and the 30 s call timeout (a bound for a loaded machine).
    assert!(took < Duration::from_millis(1900), "{took:?}");

    let t0 = Instant::now();
    let r = get_page(&c, "1", Some("200m")).await;
    let took = t0.elapsed();
    assert_eq!(code(r), Code::DeadlineExceeded);
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(1900),
        "{took:?}"
    );
    // The slow backend was told what was left of the 200 ms.
    let t = b
        .recs
        .budgets()
        .last()
        .copied()
        .flatten()
        .expect("grpc-timeout");
    assert!(t <= Duration::from_millis(200), "{t:?}");

    // A malformed deadline is the client's error.
    let r = get_page(&c, "1", Some("soon")).await;
    assert_eq!(code(r), Code::InvalidArgument);
    agg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_backend_times_out_with_deadline_exceeded() {
    let slow = Behaviour::Sleep(Duration::from_secs(2));
    let b = backends(Behaviour::Answer, slow, Behaviour::Answer).await;
    let agg = start(b.config(Duration::from_millis(200))).await;
    let c = client(agg.addr);

    let t0 = Instant::now();
    let err = get_page(&c, "1", None).await.unwrap_err();
    let took = t0.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("orders"), "{err:?}");
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(1900),
        "{took:?}"
    );
    agg.shutdown().await;
}
