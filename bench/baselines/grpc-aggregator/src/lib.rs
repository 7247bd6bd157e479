//! `grpc-aggregator`: the load lab's baseline for the `grpc-aggregate` scenario
//! (`crates/fanout-lab/src/scenarios/grpc-aggregate.proto`), written by hand on tonic's codec
//! layer (`tonic::server::Grpc`, `tonic::client::Grpc`, prost messages derived by hand) over a
//! plain hyper-util server and client — no code generation, no tonic transport, no tower stack.
//! It is the practical limit of a gRPC fan-out on the stack fanout is built on.
//!
//! `lab.v1.Aggregator/GetPage(PageRequest)` calls, concurrently,
//! `lab.v1.Users/GetUser(UserRequest { id: user_id })`,
//! `lab.v1.Orders/ListOrders(OrdersRequest { user_id, limit: 3 })` and
//! `lab.v1.Recs/GetRecs(RecsRequest { user_id })`, and answers
//! `Page { user, orders: OrderList.orders, recs: RecList.items }`. Any other path is
//! UNIMPLEMENTED. A failed backend call fails the page: DEADLINE_EXCEEDED on a timeout,
//! UNAVAILABLE otherwise. The client's `grpc-timeout` is enforced here (tonic's `server::Grpc`
//! does not) and each backend gets the time left in its own `grpc-timeout`.
//!
//! The library holds everything runnable; the binary only parses arguments. Tests call [`serve`]
//! with a [`Config`] pointing at in-process backends.

mod backend;
pub mod proto;

use backend::Backend;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use proto::{
    GET_PAGE, GET_RECS, GET_USER, LIST_ORDERS, OrderList, OrdersRequest, Page, PageRequest,
    RecList, RecsRequest, User, UserRequest,
};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::Status;
use tonic_prost::ProstCodec;

/// Response body type of the server.
pub type Body = tonic::body::Body;

/// Listen address when neither `--listen` nor `LISTEN` says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8091";

/// Per-call backend timeout when neither `--backend-timeout-ms` nor `BACKEND_TIMEOUT_MS` says
/// otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Environment variable with the per-call backend timeout in milliseconds.
pub const TIMEOUT_VAR: &str = "BACKEND_TIMEOUT_MS";

/// Time in-flight requests get to finish after the shutdown signal (fanout's default).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The request header carrying the client's deadline (`<1–8 digits><H|M|S|m|u|n>`).
pub const GRPC_TIMEOUT: &str = "grpc-timeout";

/// Backend addresses (`host:port`, plain h2c) and the per-call timeout. Each address has an
/// environment variable named after the lab's stub service (`users` → `USERS_ADDR`, see
/// [`Config::VARS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `USERS_ADDR`, default `127.0.0.1:9301`: serves `lab.v1.Users`.
    pub users: String,
    /// `ORDERS_ADDR`, default `127.0.0.1:9302`: serves `lab.v1.Orders`.
    pub orders: String,
    /// `RECS_ADDR`, default `127.0.0.1:9303`: serves `lab.v1.Recs`.
    pub recs: String,
    /// Per-call timeout (`BACKEND_TIMEOUT_MS`, default [`DEFAULT_TIMEOUT`]); a client's
    /// `grpc-timeout` can only shorten it.
    pub timeout: Duration,
}

impl Config {
    /// Every address variable with its default, in field order.
    pub const VARS: [(&'static str, &'static str); 3] = [
        ("USERS_ADDR", "127.0.0.1:9301"),
        ("ORDERS_ADDR", "127.0.0.1:9302"),
        ("RECS_ADDR", "127.0.0.1:9303"),
    ];

    /// Addresses and timeout from `lookup` (unset or empty variables take the default). Fails on
    /// a timeout that is not a positive number of milliseconds or an address that is not
    /// `host:port`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let [users, orders, recs] = Self::VARS.map(|(var, default)| {
            lookup(var)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        });
        let timeout = match lookup(TIMEOUT_VAR).filter(|v| !v.is_empty()) {
            Some(v) => parse_timeout_ms(&v).map_err(|e| format!("{TIMEOUT_VAR}: {e}"))?,
            None => DEFAULT_TIMEOUT,
        };
        for ((var, _), addr) in Self::VARS.iter().zip([&users, &orders, &recs]) {
            backend::origin(var, addr)?;
        }
        Ok(Config {
            users,
            orders,
            recs,
            timeout,
        })
    }

    /// Addresses and timeout from the process environment.
    pub fn from_env() -> Result<Config, String> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }
}

impl Default for Config {
    /// The default addresses and timeout.
    fn default() -> Self {
        Config {
            users: Self::VARS[0].1.to_string(),
            orders: Self::VARS[1].1.to_string(),
            recs: Self::VARS[2].1.to_string(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// A positive number of milliseconds (`--backend-timeout-ms`, `BACKEND_TIMEOUT_MS`).
pub fn parse_timeout_ms(v: &str) -> Result<Duration, String> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("expected a positive number of milliseconds, got `{v}`"))
}

/// The three backends, sharing one HTTP/2 client (one connection per backend address).
struct App {
    users: Backend,
    orders: Backend,
    recs: Backend,
}

impl App {
    fn new(cfg: &Config) -> Result<App, String> {
        let client = backend::http_client();
        Ok(App {
            users: Backend::new("users", client.clone(), &cfg.users, cfg.timeout)?,
            orders: Backend::new("orders", client.clone(), &cfg.orders, cfg.timeout)?,
            recs: Backend::new("recs", client, &cfg.recs, cfg.timeout)?,
        })
    }

    /// Route one request by path; every failure is a gRPC status (trailers-only response).
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        if req.uri().path() != GET_PAGE {
            let path = req.uri().path();
            return Status::unimplemented(format!("unknown method {path}")).into_http();
        }
        let budget = match grpc_timeout(req.headers()) {
            Ok(b) => b,
            Err(status) => return status.into_http(),
        };
        let deadline = budget.map(|b| start + b);
        let service = GetPage {
            app: self,
            deadline,
        };
        let mut grpc = tonic::server::Grpc::new(ProstCodec::<Page, PageRequest>::default());
        let answer = grpc.unary(service, req);
        match deadline {
            // Past the deadline everything still in flight (the body, the backend calls) is
            // dropped.
            Some(deadline) => tokio::time::timeout_at(deadline, answer)
                .await
                .unwrap_or_else(|_| {
                    Status::deadline_exceeded("the client's grpc-timeout passed").into_http()
                }),
            None => answer.await,
        }
    }

    /// The fan-out: three concurrent calls, the first failure fails the page (and drops the
    /// other calls).
    async fn get_page(&self, user_id: String, deadline: Option<Instant>) -> Result<Page, Status> {
        let (user, orders, recs) = tokio::try_join!(
            self.users.call::<_, User>(
                GET_USER,
                UserRequest {
                    id: user_id.clone()
                },
                deadline
            ),
            self.orders.call::<_, OrderList>(
                LIST_ORDERS,
                OrdersRequest {
                    user_id: user_id.clone(),
                    limit: 3,
                },
                deadline
            ),
            self.recs
                .call::<_, RecList>(GET_RECS, RecsRequest { user_id }, deadline),
        )?;
        Ok(Page {
            user: Some(user),
            orders: orders.orders,
            recs: recs.items,
        })
    }
}

/// `GetPage` as tonic's server side wants it: one value per request, carrying its deadline.
struct GetPage {
    app: Arc<App>,
    deadline: Option<Instant>,
}

impl tonic::server::UnaryService<PageRequest> for GetPage {
    type Response = Page;
    type Future = BoxFuture<'static, Result<tonic::Response<Page>, Status>>;

    fn call(&mut self, request: tonic::Request<PageRequest>) -> Self::Future {
        let app = self.app.clone();
        let deadline = self.deadline;
        Box::pin(async move {
            let user_id = request.into_inner().user_id;
            app.get_page(user_id, deadline)
                .await
                .map(tonic::Response::new)
        })
    }
}

/// The client's `grpc-timeout`, if it sent one; a malformed value is INVALID_ARGUMENT (fanout
/// answers such a header 400 `bad_header`, which it maps to the same code).
fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, Status> {
    let Some(v) = headers.get(GRPC_TIMEOUT) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(parse_grpc_timeout)
        .map(Some)
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "header {GRPC_TIMEOUT}: expected <1-8 digits><H|M|S|m|u|n>"
            ))
        })
}

/// Parse a `grpc-timeout` value: `<1–8 digits><unit>`, unit one of `H M S m u n`; `None` when
/// malformed.
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 || !v.is_ascii() {
        return None;
    }
    let (num, unit) = v.split_at(v.len() - 1);
    if !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Serve `GetPage` on `listener` (h2c with prior knowledge; HTTP/1.1 is accepted too, so plain
/// readiness probes get an answer) until `shutdown` resolves, then stop accepting and give
/// in-flight requests [`SHUTDOWN_GRACE`] to finish. Fails at once (`InvalidInput`) if a backend
/// address in `config` is not `host:port`.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let app = Arc::new(
        App::new(&config).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
    );
    // The same server limits as fanout's defaults (and hyper-aggregator's).
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(16 << 10)
        .header_read_timeout(Duration::from_secs(10))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .max_header_list_size(16 << 10);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(_) => {
                    // Out of file descriptors and the like: back off briefly, keep serving.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Best effort, but it matters: without TCP_NODELAY small h2 frames wait for delayed
        // ACKs (p50 ≈ 44 ms instead of well under 1 ms).
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(app.handle(req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client that goes away mid-request is not an error worth reporting here.
            let _ = conn.await;
        });
    }
    drop(listener);
    // Past the grace period the remaining connections are simply dropped.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// Resolves when the process gets Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn config_defaults_and_variables() {
        let c = Config::from_lookup(|_| None).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.users, "127.0.0.1:9301");
        assert_eq!(c.orders, "127.0.0.1:9302");
        assert_eq!(c.recs, "127.0.0.1:9303");
        assert_eq!(c.timeout, Duration::from_secs(1));

        let c = Config::from_lookup(|v| match v {
            "ORDERS_ADDR" => Some("10.0.0.1:80".into()),
            "RECS_ADDR" => Some(String::new()),
            "BACKEND_TIMEOUT_MS" => Some("250".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.orders, "10.0.0.1:80");
        assert_eq!(c.recs, "127.0.0.1:9303");
        assert_eq!(c.timeout, Duration::from_millis(250));
    }

    #[test]
    fn config_refuses_bad_values() {
        for (var, value) in [
            ("BACKEND_TIMEOUT_MS", "0"),
            ("BACKEND_TIMEOUT_MS", "soon"),
            ("USERS_ADDR", "not an address"),
            ("RECS_ADDR", "127.0.0.1:1/x"),
        ] {
            let r = Config::from_lookup(|v| (v == var).then(|| value.to_string()));
            assert!(r.is_err(), "{var}={value}");
        }
    }

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "m", "100", "100x", "123456789m", "-1m", "1.5S", "１m"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }

        let mut h = HeaderMap::new();
        assert_eq!(grpc_timeout(&h).ok(), Some(None));
        h.insert(GRPC_TIMEOUT, HeaderValue::from_static("200m"));
        assert_eq!(
            grpc_timeout(&h).ok(),
            Some(Some(Duration::from_millis(200)))
        );
        h.insert(GRPC_TIMEOUT, HeaderValue::from_static("soon"));
        assert_eq!(
            grpc_timeout(&h).err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
    }
}
