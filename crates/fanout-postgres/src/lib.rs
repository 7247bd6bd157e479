//! The `postgres` backend protocol: [`PgBackend`] answers `sql` steps' calls
//! ([`fanout_layers::backend::Call::Sql`]) from a pool of tokio-postgres connections that never lets
//! a request wait longer than it can afford.
//!
//! - **Waiting** is FIFO (a fair semaphore), bounded by `max_waiters` (one more is refused at
//!   once: `pool_exhausted`) and by min(the call's time, `max_wait`).
//! - **A call past its time** (its deadline, or its request gone) has its statement cancelled at
//!   the server (a CancelRequest on a new connection); the connection keeps its pool slot until an
//!   empty statement after the cancelled one has come back — then it is known idle, and reused if
//!   the server confirmed the cancel by closing its connection — or it is closed.
//!   `statement_timeout` is set on every connection as the server's backstop.
//! - **A database that cannot be reached** fails calls at once (`database_unavailable`) while a
//!   background task reconnects with backoff; readiness says which database is down.
//! - **Answers** are values built from the wire format — the rows alone (`[...]`) when the call
//!   asks for them ([`SqlCall::rows_only`]: every mode but `exec`; exactly one row alone, not in
//!   an array, when it asks for that too: [`SqlCall::single_row`], `one` and `optional`), else
//!   `{"rows": [...], "rows_affected": N}` —
//!   (`types::to_val`) and handed to the step as they are (no JSON text written and parsed
//!   again) while the answer is small; past 64 KiB of JSON the rows are written as JSON text as
//!   they arrive, which the step parses (a value costs 10–30× its JSON). Rows are counted against
//!   `max_response_bytes` and the in-flight memory budget as they arrive, and a row longer than
//!   the cap is refused from its message header (`guard.rs`) — in every case the statement is
//!   cancelled at the server;
//!   caches and dedup hold them like HTTP answers, the shared cache as their JSON text. SQL errors become statuses the
//!   `sql` step maps (409 unique/foreign key, 422 data and check, 503 serialization failure or
//!   deadlock — retried when idempotent —, 500 other), with `{"sqlstate", "message"}` for the log:
//!   one table ([`sqlstate::classify`]) gives the status and the step's error class.
//!
//! The `sql` step kind lives here too ([`STEP_KIND`], `step.rs`), with its per-step counters
//! ([`STEP_COUNTERS`], `step_stats.rs`): the gateway's lists of step kinds and runtimes
//! (`fanout-proxy`'s `STEP_KINDS`, `RUNTIMES`) name them.

#![forbid(unsafe_code)]

mod cancel;
mod exec;
mod guard;
mod metrics;
mod pool;
pub mod sqlstate;
mod step;
pub mod step_stats;
pub mod types;

use cancel::*;
use exec::*;
pub use pool::Pool;
pub use step::STEP_KIND;
pub use step_stats::STEP_COUNTERS;

use bytes::Bytes;
use fanout_config::{Backend as BackendConfig, ConfigError, Defaults, PostgresConfig, SslMode};
use fanout_expr::json::static_str_val;
use fanout_expr::{Map, Val};
use fanout_layers::backend::{Call, SqlCall};
use fanout_layers::{Backend, CallError, CallErrorKind, CallRequest, CallResponse, RejectReason};
use futures_util::future::BoxFuture;
use futures_util::{StreamExt, pin_mut};
use http::StatusCode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use step_stats::ErrorsByClass;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, Statement};

/// How connections are made: plain TCP or TLS (rustls).
#[derive(Clone)]
enum Connector {
    Plain,
    Tls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// A pooled connection with the statements it has prepared. Boxed wherever it is kept
/// ([`PooledConn`]): the client is a few hundred bytes, and a connection moves from the idle list
/// to the call and back on every statement.
struct Conn {
    client: Client,
    /// By statement text (from the config, not from requests: a fast hash is safe).
    prepared: HashMap<Arc<str>, Prepared, foldhash::fast::RandomState>,
    idle_since: Instant,
    /// Set by the connection's guard when it refused a row longer than `max_response_bytes`
    /// (the connection is then closed): the row's length.
    tripped: guard::Tripped,
    /// The server it was opened to, when the pool opened the socket itself (plain connections):
    /// its cancel requests go there and are confirmed.
    peer: Option<Peer>,
    /// The core whose runtime runs the connection's task (`server.runtime: per_core`; `None` on
    /// the work-stealing runtime): that core's calls take it first.
    home: Option<usize>,
}

/// A connection as the pool keeps it.
type PooledConn = Box<Conn>;

/// Whether the database can be reached, as far as the pool knows.
#[derive(Debug, Clone, Default)]
struct Health {
    /// The last connection attempt failed (or a connection was lost): calls fail at once until
    /// `retry_at`.
    down: bool,
    /// Why, for readiness and the status endpoint (no password: tokio-postgres never prints it).
    error: Option<String>,
    retry_at: Option<Instant>,
    backoff: Duration,
    /// A connection has been made since start.
    connected_once: bool,
}

/// A statement some `sql` step runs, to prepare against the database at start and on reload.
#[derive(Debug, Clone)]
pub struct StatementCheck {
    /// The statement's text.
    pub query: fanout_config::Located<String>,
    /// How many parameters the step passes.
    pub params: usize,
    /// `route METHOD PATH, step NAME`, for messages.
    pub owner: String,
}

/// The pool's counters (for the status endpoint and metrics).
#[derive(Debug)]
pub struct PoolCounters {
    /// Calls refused because `max_waiters` were already waiting.
    pub rejected_full: AtomicU64,
    /// Calls that waited `max_wait` (or their deadline) without getting a connection.
    pub rejected_wait: AtomicU64,
    /// Statements cancelled at the server (deadline passed or request gone).
    pub cancelled: AtomicU64,
    /// Connections opened.
    pub connects: AtomicU64,
    /// Connection attempts that failed.
    pub connect_failures: AtomicU64,
    /// Connections closed because they broke or could not be known idle after a cancel.
    pub discarded: AtomicU64,
    /// Sum of the waits for a connection, in microseconds, and their count (calls that waited).
    pub wait_us_total: AtomicU64,
    /// Calls that had to wait for a connection.
    pub waits: AtomicU64,
    /// How long calls waited for a connection (those that got one at once: 0).
    pub wait: fanout_runtime::hist::AtomicHistogram,
    /// Rows returned by statements.
    pub rows: AtomicU64,
    /// Statements sent to the database (prepared ones included once per run).
    pub statements: AtomicU64,
    /// SQL errors by class.
    pub errors: ErrorsByClass,
}

impl Default for PoolCounters {
    fn default() -> Self {
        PoolCounters {
            rejected_full: AtomicU64::new(0),
            rejected_wait: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            wait_us_total: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            wait: fanout_runtime::hist::AtomicHistogram::latency(),
            rows: AtomicU64::new(0),
            statements: AtomicU64::new(0),
            errors: Default::default(),
        }
    }
}

/// The protocol client of a `protocol: postgres` backend.
pub struct PgBackend {
    pool: Arc<Pool>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PgBackend {
    /// The client for backend `name`'s config: parses the URL and sets up TLS (no I/O).
    pub fn new(
        name: &str,
        b: &BackendConfig,
        defaults: &Defaults,
    ) -> Result<PgBackend, ConfigError> {
        let url = b.url.as_ref().ok_or_else(|| {
            ConfigError::at(Default::default(), format!("backend `{name}` has no `url`"))
        })?;
        let mut pg: tokio_postgres::Config = url.value.parse().map_err(|e| {
            // The URL may hold a password: name the backend, not the text.
            ConfigError::at(
                url.pos,
                format!("backend `{name}`: invalid postgres URL: {e}"),
            )
        })?;
        let cfg = b.postgres.clone().unwrap_or_default();
        let connect_timeout = b.connect_timeout.unwrap_or(defaults.connect_timeout).0;
        pg.connect_timeout(connect_timeout);
        pg.application_name(&cfg.application_name);
        pg.keepalives(true);
        let ms = cfg.statement_timeout.0.as_millis().max(1);
        pg.options(format!("-c statement_timeout={ms}"));
        let loopback = pg.get_hosts().iter().all(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => {
                h == "localhost"
                    || h.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
            tokio_postgres::config::Host::Unix(_) => true,
        });
        let mode = match cfg.sslmode {
            SslMode::Auto if loopback => SslMode::Disable,
            SslMode::Auto => SslMode::VerifyFull,
            m => m,
        };
        let connector = match mode {
            SslMode::Disable | SslMode::Auto => {
                pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
                Connector::Plain
            }
            SslMode::Require | SslMode::VerifyFull => {
                pg.ssl_mode(tokio_postgres::config::SslMode::Require);
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| {
                        ConfigError::at(
                            Default::default(),
                            format!("backend `{name}`: TLS setup failed: {e}"),
                        )
                    })?;
                let tls = if mode == SslMode::VerifyFull {
                    builder
                        .with_root_certificates(fanout_protocol::tls::trusted_roots(name, b)?)
                        .with_no_client_auth()
                } else {
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
                        .with_no_client_auth()
                };
                Connector::Tls(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
            }
        };
        let max = cfg.max_size.max(1);
        Ok(PgBackend {
            pool: Arc::new(Pool {
                name: name.into(),
                address: address(&pg),
                pg,
                connector,
                connect_timeout,
                max_response_bytes: b.max_response_bytes,
                slots: Arc::new(Semaphore::new(max)),
                waiting: AtomicUsize::new(0),
                open: AtomicUsize::new(0),
                growing: AtomicUsize::new(0),
                idle: Mutex::new(Vec::new()),
                health: Mutex::new(Health::default()),
                wake: Notify::new(),
                reconnecting: std::sync::atomic::AtomicBool::new(false),
                unchecked: Mutex::new(None),
                refused: Mutex::new(None),
                memory: std::sync::OnceLock::new(),
                counters: PoolCounters::default(),
                cfg,
            }),
        })
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

/// `host:port` of a connection config's first server.
fn address(pg: &tokio_postgres::Config) -> String {
    let host = match pg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// `sslmode: require`: TLS without checking the certificate (as libpq's `require`), signatures
/// still checked.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl Backend for PgBackend {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let pool = self.pool.clone();
        fanout_layers::boxed::pinned(|| async move {
            let Call::Sql(call) = req.call else {
                return Err(CallError::new(
                    CallErrorKind::Invalid,
                    "a postgres backend was given an HTTP call",
                ));
            };
            // Traced calls: a span per statement, with the statement as written (never its
            // parameters) and the server's address (never the URL: it may hold a password).
            // Counted calls: the statement counted, nothing else.
            let span = req.trace.and_then(|t| {
                let mut span = t.sent(|| pool.address.as_str())?;
                span.set_attributes(&[
                    ("db.system", "postgresql"),
                    ("db.system.name", "postgresql"),
                    ("db.query.text", &call.statement),
                ]);
                Some(span)
            });
            let end = (Instant::now() + req.timeout).min(req.deadline);
            let result = pool.run(call, end).await;
            if let Some(span) = span {
                span.end(result.as_ref().map(|r| r.status));
            }
            result
        })
    }
}

/// Why a connection to `address` could not be made, for the operator (readiness, the status
/// endpoint, the log): what failed — authentication failed, host not found, connection
/// refused, TLS failed, timed out — and the error's chain of causes (tokio-postgres's own text
/// is only its kind: "db error", "error connecting to server"). Neither holds the password or
/// the URL: the server's messages name the user at most.
fn connect_error(e: &tokio_postgres::Error, address: &str) -> String {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let what = match code {
            // invalid_password, invalid_authorization_specification (no pg_hba.conf entry,
            // a role that may not log in)
            "28P01" | "28000" => "authentication failed",
            "3D000" => "the database does not exist",
            "53300" => "the server has too many connections",
            "57P03" => "the server is starting up or shutting down",
            _ => "the server refused the connection",
        };
        return format!("{what}: {} (SQLSTATE {code})", db.message());
    }
    let chain = error_chain(e);
    let mut io = None;
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        if x.is::<rustls::Error>() {
            return format!("TLS failed with {address}: {chain}");
        }
        if let Some(i) = x.downcast_ref::<std::io::Error>() {
            if i.get_ref().is_some_and(|r| r.is::<rustls::Error>()) {
                return format!("TLS failed with {address}: {chain}");
            }
            io = io.or(Some(i));
        }
        src = x.source();
    }
    // tokio-postgres's kinds are not public; their texts are what it prints.
    let top = e.to_string();
    let what = match (top.as_str(), io) {
        ("error performing TLS handshake", _) => "TLS failed",
        ("authentication error", _) => "authentication failed",
        ("timeout waiting for server", _) => "timed out",
        (_, Some(i)) if i.kind() == std::io::ErrorKind::ConnectionRefused => "connection refused",
        (_, Some(i)) if i.kind() == std::io::ErrorKind::TimedOut => "connection timed out",
        // getaddrinfo's failure (std's text), or a name without addresses (tokio-postgres's)
        (_, Some(i))
            if i.to_string()
                .starts_with("failed to lookup address information")
                || i.to_string() == "could not resolve any addresses" =>
        {
            "host not found"
        }
        _ => "cannot connect",
    };
    format!("{what} ({address}): {chain}")
}

/// An error and its causes, `: `-separated (a cause whose text its parent already ends with is
/// left out).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !t.is_empty() && !out.ends_with(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        src = x.source();
    }
    out
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgBackend({})", self.pool.name)
    }
}

/// Every statement of `cfg`'s `sql` steps, by backend name.
pub fn statements(cfg: &fanout_config::Config) -> HashMap<String, Vec<StatementCheck>> {
    let mut out: HashMap<String, Vec<StatementCheck>> = HashMap::new();
    for r in &cfg.routes {
        for (name, step) in &r.flow {
            if let Some(sql) = &step.sql {
                out.entry(sql.backend.value.clone())
                    .or_default()
                    .push(StatementCheck {
                        query: sql.query.clone(),
                        params: sql.params.len(),
                        owner: format!(
                            "route {} {}, step `{}`",
                            r.method.value, r.path.value, name.value
                        ),
                    });
            }
        }
    }
    out
}

/// The PostgreSQL protocol: its line in `fanout-proxy`'s `PROTOCOLS`.
pub const PROTOCOL: fanout_protocol::Registration = fanout_protocol::Registration {
    serves: |p| p == fanout_config::Protocol::Postgres,
    build: |name, b, shared| Ok(Arc::new(PgBackend::new(name, b, shared.defaults)?)),
    metrics: metrics::write,
};

impl fanout_protocol::ProtocolClient for PgBackend {
    fn service(self: Arc<Self>) -> Arc<dyn Backend> {
        self
    }

    fn status_json(&self) -> serde_json::Value {
        self.pool.status_json()
    }

    fn readiness(&self) -> Result<(), String> {
        self.pool.readiness()
    }

    fn share_memory_budget(&self, gate: &Arc<fanout_protocol::bodies::BodyGate>) {
        self.pool.share_memory_budget(gate);
    }

    /// Prepare every `sql` step's statement on this database: a statement Postgres refuses, a
    /// parameter count that does not match or a type the step cannot read or write is a config
    /// error at the statement's line. The pool keeps them to check again when it connects.
    fn check<'a>(
        &'a self,
        backend: &'a str,
        config: &'a Arc<fanout_config::Config>,
    ) -> BoxFuture<'a, Result<Vec<ConfigError>, String>> {
        Box::pin(async move {
            let checks = statements(config).remove(backend).unwrap_or_default();
            self.pool.set_statements(config.clone(), checks.clone());
            self.pool.check(config, &checks).await
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
