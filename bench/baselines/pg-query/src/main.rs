//! `pg-query`: the load lab's hand-written baseline for a one-query Postgres route — what a team
//! writes without an orchestrator: hyper for HTTP/1.1 and h2c, tokio-postgres with the statement
//! prepared once per connection, a fixed pool of connections handed out round robin
//! (tokio-postgres pipelines the queries of one connection), serde_json for the answer.
//!
//! It keeps the same contract as fanout's `pg-one-query` config and as the other baselines
//! (`hyper-aggregator`): the route's deadline (1 s, shortened by the client's `x-request-timeout`),
//! the backend's call timeout (1 s, capped by the time left), the server limits of fanout's
//! defaults (header read timeout, buffer and HTTP/2 limits, graceful shutdown) and fanout's error
//! bodies — so the lab compares equal work, not a server without timeouts against one with them.
//!
//! ```text
//! pg-query [--listen ADDR] [--workers N] [--connections N]
//! ```
//!
//! `GET /users/{id}` → `SELECT id, name, email FROM users WHERE id = $1` as `{id, name, email}`
//! (404 when there is no such user). The database is `$DB_URL` (`postgres://…`).

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls, Statement};

// Same allocator as the fanout binary, so the comparison is about the code, not malloc.
#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

const USAGE: &str = "usage: pg-query [--listen ADDR] [--workers N] [--connections N]

Serves GET /users/{id} from $DB_URL (SELECT id, name, email FROM users WHERE id = $1),
hand-written on hyper + tokio-postgres, as the load lab's baseline.

  --listen ADDR      listen address (default: $LISTEN, else 127.0.0.1:8090)
  --workers N        runtime worker threads (default: one per core)
  --connections N    database connections (default 4)";

/// The query, the same text as the lab's fanout config.
const QUERY: &str = "SELECT id, name, email FROM users WHERE id = $1";

/// The route's deadline (fanout's default `deadline`, as in the lab's config).
const ROUTE_DEADLINE: Duration = Duration::from_secs(1);

/// The database backend's call timeout (the lab config's `timeout: 1s`).
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// Header carrying a deadline in milliseconds: a client may shorten the route's deadline.
const DEADLINE_HEADER: HeaderName = HeaderName::from_static("x-request-timeout");

/// Time in-flight requests get to finish after the shutdown signal (fanout's default).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The flow's step and backend names, for error bodies (as fanout names them).
const STEP: &str = "user";

/// A failed request: fanout's status, `code` and body shape (`{"error": {code, message, step}}`).
struct Failure {
    status: StatusCode,
    code: &'static str,
    message: &'static str,
    step: Option<&'static str>,
}

impl Failure {
    fn response(self) -> Response<Full<Bytes>> {
        let body = serde_json::json!({
            "error": {"code": self.code, "message": self.message, "step": self.step}
        });
        answer(self.status, body.to_string())
    }
}

struct Db {
    conns: Vec<(Client, Statement)>,
    next: AtomicUsize,
}

impl Db {
    /// The user's row as JSON, or `None`; bounded by the call timeout and the time `left`
    /// before the route's deadline.
    async fn user(&self, id: i32, left: Duration) -> Result<Option<Bytes>, Failure> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let (client, stmt) = &self.conns[i];
        let timeout = QUERY_TIMEOUT.min(left);
        let row = match tokio::time::timeout(timeout, client.query_opt(stmt, &[&id])).await {
            Ok(Ok(row)) => row,
            Ok(Err(_)) => {
                return Err(Failure {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "database_unavailable",
                    message: "the database is unavailable",
                    step: Some(STEP),
                });
            }
            Err(_) => {
                return Err(Failure {
                    status: StatusCode::GATEWAY_TIMEOUT,
                    code: "backend_timeout",
                    message: "the statement did not complete within its timeout",
                    step: Some(STEP),
                });
            }
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let id: i32 = row.get(0);
        let name: &str = row.get(1);
        let email: &str = row.get(2);
        let body = serde_json::to_vec(&serde_json::json!({"id": id, "name": name, "email": email}))
            .unwrap_or_default();
        Ok(Some(Bytes::from(body)))
    }
}

fn answer(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The route's deadline, shortened by the client's `x-request-timeout` if it sends one.
fn deadline(headers: &HeaderMap, start: Instant) -> Result<Instant, Failure> {
    let mut budget = ROUTE_DEADLINE;
    if let Some(v) = headers.get(&DEADLINE_HEADER) {
        let ms = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or(Failure {
                status: StatusCode::BAD_REQUEST,
                code: "bad_header",
                message: "header x-request-timeout: expected a number of milliseconds",
                step: None,
            })?;
        budget = budget.min(Duration::from_millis(ms));
    }
    Ok(start + budget)
}

async fn handle(db: Arc<Db>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let start = Instant::now();
    route(&db, &req, start)
        .await
        .unwrap_or_else(Failure::response)
}

async fn route(
    db: &Db,
    req: &Request<Incoming>,
    start: Instant,
) -> Result<Response<Full<Bytes>>, Failure> {
    let not_found = |message| Failure {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message,
        step: None,
    };
    let Some(id) = req.uri().path().strip_prefix("/users/") else {
        return Err(not_found("no route for this path"));
    };
    if req.method() != Method::GET {
        return Err(Failure {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: "method_not_allowed",
            message: "only GET is allowed on /users/{id}",
            step: None,
        });
    }
    let deadline = deadline(req.headers(), start)?;
    let Ok(id) = id.parse::<i32>() else {
        return Err(Failure {
            status: StatusCode::BAD_REQUEST,
            code: "bad_parameter",
            message: "parameter $1: the request's value does not fit it",
            step: Some(STEP),
        });
    };
    let deadline_exceeded = || Failure {
        status: StatusCode::GATEWAY_TIMEOUT,
        code: "deadline_exceeded",
        message: "route deadline exceeded while waiting for the flow",
        step: None,
    };
    // A client that left no time (`x-request-timeout: 0`) is answered without a query.
    let now = Instant::now();
    if deadline <= now {
        return Err(deadline_exceeded());
    }
    // The route's deadline: past it, the query in flight is dropped.
    let found = tokio::time::timeout_at(deadline, db.user(id, deadline - now))
        .await
        .unwrap_or_else(|_| Err(deadline_exceeded()))?;
    match found {
        Some(body) => Ok(answer(StatusCode::OK, body)),
        None => Err(Failure {
            step: Some(STEP),
            ..not_found("not found: the statement returned no row")
        }),
    }
}

struct Args {
    listen: String,
    workers: Option<usize>,
    connections: usize,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut out = Args {
        listen: std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8090".into()),
        workers: None,
        connections: 4,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let number = |v: String| {
            v.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("expected a positive number, got `{v}`"))
        };
        match a.as_str() {
            "--listen" => out.listen = value()?,
            "--workers" => out.workers = Some(number(value()?)?),
            "--connections" => out.connections = number(value()?)?,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Some(out))
}

async fn run(args: Args) -> Result<(), String> {
    let url = std::env::var("DB_URL").map_err(|_| "DB_URL is not set".to_string())?;
    let mut conns = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let (client, conn) = tokio_postgres::connect(&url, NoTls)
            .await
            .map_err(|e| format!("connecting to the database: {e}"))?;
        tokio::spawn(conn);
        let stmt = client
            .prepare(QUERY)
            .await
            .map_err(|e| format!("preparing the query: {e}"))?;
        conns.push((client, stmt));
    }
    let db = Arc::new(Db {
        conns,
        next: AtomicUsize::new(0),
    });
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("{}: {e}", args.listen))?;
    // The same server limits as fanout's defaults (and hyper-aggregator's), so both sides do the
    // same work per request.
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
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of file descriptors and the like: back off briefly, keep serving.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let db = db.clone();
        let svc = hyper::service::service_fn(move |req| {
            let db = db.clone();
            async move { Ok::<_, Infallible>(handle(db, req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// Resolves when the process gets Ctrl-C or SIGTERM.
async fn shutdown_signal() {
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

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = args.workers {
        rt.worker_threads(n);
    }
    let rt = match rt.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
