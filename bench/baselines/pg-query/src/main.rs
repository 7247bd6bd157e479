//! `pg-query`: the load lab's hand-written baseline for a one-query Postgres route — what a team
//! writes without an orchestrator: hyper for HTTP/1.1, tokio-postgres with the statement prepared
//! once per connection, a fixed pool of connections handed out round robin (tokio-postgres
//! pipelines the queries of one connection), serde_json for the answer.
//!
//! ```text
//! pg-query [--listen ADDR] [--workers N] [--connections N]
//! ```
//!
//! `GET /users/{id}` → `SELECT id, name, email FROM users WHERE id = $1` as `{id, name, email}`
//! (404 when there is no such user). The database is `$DB_URL` (`postgres://…`).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::TcpListener;
use tokio_postgres::{Client, NoTls, Statement};

// Same allocator as the fanout binary, so the comparison is about the code, not malloc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: pg-query [--listen ADDR] [--workers N] [--connections N]

Serves GET /users/{id} from $DB_URL (SELECT id, name, email FROM users WHERE id = $1),
hand-written on hyper + tokio-postgres, as the load lab's baseline.

  --listen ADDR      listen address (default: $LISTEN, else 127.0.0.1:8090)
  --workers N        runtime worker threads (default: one per core)
  --connections N    database connections (default 4)";

/// The query, the same text as the lab's fanout config.
const QUERY: &str = "SELECT id, name, email FROM users WHERE id = $1";

struct Db {
    conns: Vec<(Client, Statement)>,
    next: AtomicUsize,
}

impl Db {
    async fn user(&self, id: i32) -> Result<Option<Bytes>, tokio_postgres::Error> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let (client, stmt) = &self.conns[i];
        let Some(row) = client.query_opt(stmt, &[&id]).await? else {
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
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

async fn handle(db: Arc<Db>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let Some(id) = path.strip_prefix("/users/") else {
        return answer(StatusCode::NOT_FOUND, r#"{"error":{"code":"not_found"}}"#);
    };
    let Ok(id) = id.parse::<i32>() else {
        return answer(
            StatusCode::BAD_REQUEST,
            r#"{"error":{"code":"bad_parameter"}}"#,
        );
    };
    match db.user(id).await {
        Ok(Some(body)) => answer(StatusCode::OK, body),
        Ok(None) => answer(StatusCode::NOT_FOUND, r#"{"error":{"code":"not_found"}}"#),
        Err(_) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":"database_unavailable"}}"#,
        ),
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
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        let db = db.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let db = db.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(db, req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
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
