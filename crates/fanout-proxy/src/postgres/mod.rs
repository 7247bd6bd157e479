//! The `postgres` backend protocol: [`PgBackend`] answers `sql` steps' calls
//! ([`fanout_flow::backend::Call::Sql`]) from a pool of tokio-postgres connections that never lets
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
//!   deadlock — retried when idempotent —, 500 other), with `{"sqlstate", "message"}` for the log.

mod guard;
mod metrics;
pub mod types;

use bytes::Bytes;
use fanout_config::{Backend as BackendConfig, ConfigError, Defaults, PostgresConfig, SslMode};
use fanout_expr::json::static_str_val;
use fanout_expr::{Map, Val};
use fanout_flow::backend::{Call, SqlCall};
use fanout_flow::sqlstats::ErrorsByClass;
use fanout_flow::{Backend, CallError, CallErrorKind, CallRequest, CallResponse, RejectReason};
use futures_util::future::BoxFuture;
use futures_util::{StreamExt, pin_mut};
use http::StatusCode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
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

/// A statement prepared on a connection, with the object its rows are made from: the columns'
/// names as keys (built once), each row a clone whose values are set by position — no key is
/// hashed or allocated per row. Shared: a call takes a reference count.
type Prepared = Arc<PreparedStatement>;

struct PreparedStatement {
    stmt: Statement,
    row: RowShape,
}

/// How a row becomes an object.
enum RowShape {
    /// `{name: null, ...}` in column order (the names are distinct): each row is a clone with its
    /// values set by position.
    Template(Map),
    /// The columns' names as values (two columns share a name): each row is built by inserting,
    /// so the later column wins, as in an object built key by key.
    Names(Box<[Val]>),
}

fn prepared(stmt: Statement) -> Prepared {
    let names: Box<[Val]> = stmt
        .columns()
        .iter()
        .map(|c| Val::utf8_str(bytes::Bytes::copy_from_slice(c.name().as_bytes())))
        .collect();
    let mut template = Map::with_capacity_and_hasher(names.len(), Default::default());
    for n in names.iter() {
        template.insert(n.clone(), Val::Null);
    }
    let row = if template.len() == names.len() {
        RowShape::Template(template)
    } else {
        RowShape::Names(names)
    };
    Arc::new(PreparedStatement { stmt, row })
}

/// `{"rows": null, "rows_affected": null}`: every answer is a clone with the two values set.
static ANSWER: std::sync::LazyLock<Map> = std::sync::LazyLock::new(|| {
    let mut m = Map::with_capacity_and_hasher(2, Default::default());
    m.insert(static_str_val("rows"), Val::Null);
    m.insert(static_str_val("rows_affected"), Val::Null);
    m
});

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
    pub wait: fanout_flow::hist::AtomicHistogram,
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
            wait: fanout_flow::hist::AtomicHistogram::latency(),
            rows: AtomicU64::new(0),
            statements: AtomicU64::new(0),
            errors: Default::default(),
        }
    }
}

/// A database's connection pool.
pub struct Pool {
    name: Arc<str>,
    /// `host:port` of the server (for spans; never the URL, which may hold a password).
    address: String,
    pg: tokio_postgres::Config,
    connector: Connector,
    cfg: PostgresConfig,
    connect_timeout: Duration,
    max_response_bytes: usize,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    open: AtomicUsize,
    idle: Mutex<Vec<PooledConn>>,
    health: Mutex<Health>,
    wake: Notify,
    reconnecting: std::sync::atomic::AtomicBool,
    /// The statements of the current config, checked when a connection is first made after the
    /// database was unreachable (`None` once checked).
    unchecked: Mutex<Option<(Arc<fanout_config::Config>, Vec<StatementCheck>)>>,
    /// Why statements were refused when they were checked late (readiness reports it).
    refused: Mutex<Option<String>>,
    /// The gateway's budget for in-flight data, which statements' answers take from as their
    /// rows arrive (set by the gateway once the pool is built).
    memory: std::sync::OnceLock<Arc<crate::bodies::BodyGate>>,
    /// Counters.
    pub counters: PoolCounters,
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
                        .with_root_certificates(crate::client::trusted_roots(name, b)?)
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
        fanout_flow::boxed::pinned(|| async move {
            let Call::Sql(call) = req.call else {
                return Err(CallError::new(
                    CallErrorKind::Invalid,
                    "a postgres backend was given an HTTP call",
                ));
            };
            // Traced calls: a span per statement, with the statement as written (never its
            // parameters) and the server's address (never the URL: it may hold a password).
            let span = req.trace.map(|mut t| {
                let system: Arc<str> = Arc::from("postgresql");
                t.attributes = vec![
                    ("db.system", system.clone()),
                    ("db.system.name", system),
                    ("db.query.text", call.statement.clone()),
                ];
                t.tracer.attempt(&t, &pool.address)
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

/// A column value in its binary wire form (`None`: NULL), for [`types::write_value`].
struct Raw<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(Some(raw)))
    }
    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(None))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Why a statement did not run to its answer on a connection.
enum ExecError {
    /// The database answered an error (the connection is fine).
    Db(tokio_postgres::Error),
    /// A parameter does not fit its type (`param`: 1-based; 0 = their number): nothing was sent.
    Param(usize, String),
    /// The answer is larger than `max_response_bytes`.
    TooLarge,
    /// The memory budget (of this many bytes) has no room for the answer.
    Memory(usize),
    /// A column value could not be read (its type changed since the statement was checked):
    /// the rest of the rows are still coming.
    Column(String),
    /// The connection broke.
    Broken(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for ExecError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.as_db_error().is_some() {
            ExecError::Db(e)
        } else {
            ExecError::Broken(e)
        }
    }
}

/// A connection in use, with its pool slot. Dropped before the statement finished (the call's
/// time ran out, or its request went away), it cancels the statement at the server and keeps
/// the slot until the connection is known idle again or closed.
struct InUse {
    pool: Arc<Pool>,
    conn: Option<PooledConn>,
    permit: Option<OwnedSemaphorePermit>,
}

impl InUse {
    /// Give the connection back (idle) and free the slot.
    fn release(mut self) {
        if let Some(mut c) = self.conn.take() {
            c.idle_since = Instant::now();
            lock(&self.pool.idle).push(c);
        }
        self.permit.take();
    }

    /// The length of the row the connection's guard refused (0: none).
    fn tripped(&self) -> usize {
        self.conn
            .as_ref()
            .map_or(0, |c| c.tripped.load(Ordering::Relaxed))
    }

    /// Close the connection (it broke) and free the slot.
    fn discard(mut self) {
        if self.conn.take().is_some() {
            self.pool.closed_one();
        }
        self.permit.take();
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let (Some(conn), Some(permit)) = (self.conn.take(), self.permit.take()) else {
            return;
        };
        let pool = self.pool.clone();
        pool.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            pool.closed_one();
            return;
        };
        rt.spawn(async move {
            let _slot = permit;
            let token = conn.client.cancel_token();
            // Confirmed: the server closed the cancel request's connection, so the backend has
            // been signalled already — a signal still on its way could otherwise cancel the
            // *next* statement on this connection (a statement that had just finished when the
            // request arrived). Unconfirmed cancels (TLS, or no close in time) leave the
            // connection to be closed.
            let cancel = tokio::time::timeout(pool.connect_timeout, async {
                let sent = match (&pool.connector, &conn.peer) {
                    (Connector::Plain, Some(peer)) => return cancel_confirmed(&token, peer).await,
                    (Connector::Plain, None) => token.cancel_query(tokio_postgres::NoTls).await,
                    (Connector::Tls(t), _) => token.cancel_query(t.clone()).await,
                };
                sent.map(|()| false).map_err(|e| e.to_string())
            })
            .await;
            let confirmed = match cancel {
                Ok(Ok(confirmed)) => confirmed,
                Ok(Err(e)) => {
                    tracing::warn!(
                        database = %pool.name, error = %e,
                        "could not send the cancel request of a statement past its deadline; closing its connection"
                    );
                    false
                }
                Err(_) => {
                    tracing::warn!(
                        database = %pool.name,
                        "the cancel request of a statement past its deadline was not done within connect_timeout; closing its connection"
                    );
                    false
                }
            };
            // An empty statement answers after the cancelled one has ended: then the connection
            // is idle (and, with the cancel confirmed, safe to reuse). If it does not come back
            // soon, close the connection (the server ends the statement itself:
            // statement_timeout). The slot is held until then either way.
            let grace = pool.connect_timeout.max(Duration::from_secs(1));
            match tokio::time::timeout(grace, conn.client.simple_query("")).await {
                Ok(Ok(_)) if confirmed => {
                    let mut conn = conn;
                    conn.idle_since = Instant::now();
                    lock(&pool.idle).push(conn);
                }
                _ => {
                    drop(conn);
                    pool.closed_one();
                }
            }
        });
    }
}

/// A server a plain connection is opened to: a TCP host or a Unix socket directory, with its
/// port.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Peer {
    Tcp(String, u16),
    Unix(std::path::PathBuf, u16),
}

/// The servers of `pg` in the order the driver tries them (shuffled with
/// `load_balance_hosts=random`), each with its port; a `hostaddr` stands for its host. Empty when
/// the URL's lists do not match (the driver's own attempt then says why).
fn peers(pg: &tokio_postgres::Config) -> Vec<Peer> {
    use tokio_postgres::config::{Host, LoadBalanceHosts};
    let (hosts, addrs, ports) = (pg.get_hosts(), pg.get_hostaddrs(), pg.get_ports());
    if !hosts.is_empty() && !addrs.is_empty() && hosts.len() != addrs.len() {
        return Vec::new();
    }
    let n = hosts.len().max(addrs.len());
    if ports.len() > 1 && ports.len() != n {
        return Vec::new();
    }
    let mut out: Vec<Peer> = (0..n)
        .filter_map(|i| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match (addrs.get(i), hosts.get(i)) {
                (Some(ip), _) => Some(Peer::Tcp(ip.to_string(), port)),
                (None, Some(Host::Tcp(h))) => Some(Peer::Tcp(h.clone(), port)),
                (None, Some(Host::Unix(dir))) => Some(Peer::Unix(dir.clone(), port)),
                (None, None) => None,
            }
        })
        .collect();
    if pg.get_load_balance_hosts() == LoadBalanceHosts::Random {
        use rand::seq::SliceRandom;
        out.shuffle(&mut rand::rng());
    }
    out
}

/// The socket file of a server listening in `dir` on `port`, as libpq names it.
fn unix_socket(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}

/// A plain connection through the row guard (`guard.rs`): each server of the URL in turn, as
/// the driver tries them — our socket handed to it, and `target_session_attrs` checked as it
/// checks it. `None` when no socket could be opened to any (the caller lets the driver's own
/// attempt say why); else the connection and its server, or the last server's refusal.
async fn connect_plain(
    pg: &tokio_postgres::Config,
    limit: usize,
    tripped: &guard::Tripped,
) -> Option<Result<(Client, Peer), tokio_postgres::Error>> {
    let mut refused = None;
    for peer in peers(pg) {
        let client = match &peer {
            Peer::Tcp(host, port) => {
                let Ok(tcp) = guard::tcp(host, *port).await else {
                    continue;
                };
                let stream = guard::Guarded::new(tcp, limit, tripped.clone());
                pg.connect_raw(stream, tokio_postgres::NoTls)
                    .await
                    .map(|(c, conn)| {
                        tokio::spawn(conn);
                        c
                    })
            }
            Peer::Unix(dir, port) => {
                let Ok(unix) = tokio::net::UnixStream::connect(unix_socket(dir, *port)).await
                else {
                    continue;
                };
                let stream = guard::Guarded::new(unix, limit, tripped.clone());
                pg.connect_raw(stream, tokio_postgres::NoTls)
                    .await
                    .map(|(c, conn)| {
                        tokio::spawn(conn);
                        c
                    })
            }
        };
        match client {
            Ok(c) => match session_fits(pg, &c).await {
                Ok(true) => return Some(Ok((c, peer))),
                Ok(false) => continue,
                Err(e) => refused = Some(e),
            },
            Err(e) => refused = Some(e),
        }
    }
    refused.map(Err)
}

/// Whether a new session is what the URL's `target_session_attrs` asks for (`read-write`: a
/// server that accepts writes), as the driver checks it.
async fn session_fits(
    pg: &tokio_postgres::Config,
    c: &Client,
) -> Result<bool, tokio_postgres::Error> {
    use tokio_postgres::config::TargetSessionAttrs;
    let wanted = pg.get_target_session_attrs();
    if wanted == TargetSessionAttrs::Any {
        return Ok(true);
    }
    let read_only = c
        .simple_query("SHOW transaction_read_only")
        .await?
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v == "on"),
            _ => None,
        });
    Ok(match wanted {
        TargetSessionAttrs::ReadWrite => read_only == Some(false),
        TargetSessionAttrs::ReadOnly => read_only == Some(true),
        _ => true,
    })
}

/// Send a CancelRequest to `peer` (plain TCP or a Unix socket) and wait until the server closes
/// that connection, which it does after signalling the statement's backend: `Ok(true)`.
async fn cancel_confirmed(
    token: &tokio_postgres::CancelToken,
    peer: &Peer,
) -> Result<bool, String> {
    match peer {
        Peer::Tcp(host, port) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| e.to_string())?;
            cancel_over(token, stream).await
        }
        Peer::Unix(dir, port) => {
            let stream = tokio::net::UnixStream::connect(unix_socket(dir, *port))
                .await
                .map_err(|e| e.to_string())?;
            cancel_over(token, stream).await
        }
    }
}

/// [`cancel_confirmed`] over an open stream.
async fn cancel_over<S>(token: &tokio_postgres::CancelToken, mut stream: S) -> Result<bool, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    token
        .cancel_query_raw(&mut stream, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(true),
            Ok(_) => {}
        }
    }
}

fn response(status: StatusCode, body: impl Into<Bytes>) -> CallResponse {
    CallResponse {
        status,
        body: body.into(),
        value: None,
        parsed: None,
    }
}

/// The status a SQL error maps to (the `sql` step makes the client's answer of it), or the
/// transport failure it is.
fn sql_status(state: &str) -> Result<StatusCode, CallErrorKind> {
    Ok(match state {
        // unique_violation, foreign_key_violation, exclusion_violation
        "23505" | "23503" | "23P01" => StatusCode::CONFLICT,
        // serialization_failure, deadlock_detected, lock_not_available: try again
        "40001" | "40P01" | "55P03" => StatusCode::SERVICE_UNAVAILABLE,
        // query_canceled: statement_timeout (ours are sent for deadlines, which end the call
        // before this answer arrives)
        "57014" => return Err(CallErrorKind::Timeout),
        // admin_shutdown, crash_shutdown, cannot_connect_now
        "57P01" | "57P02" | "57P03" => return Err(CallErrorKind::Reset),
        s if s.starts_with("08") => return Err(CallErrorKind::Reset),
        // insufficient resources (too many connections, out of memory, disk full)
        s if s.starts_with("53") => StatusCode::SERVICE_UNAVAILABLE,
        // other integrity constraints (check, not null), data exceptions (invalid text for a
        // type, value out of range, division by zero)
        s if s.starts_with("23") || s.starts_with("22") => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    })
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

impl Pool {
    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections idle in the pool now.
    pub fn idle(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Calls waiting for a connection now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The pool's settings.
    pub fn settings(&self) -> &PostgresConfig {
        &self.cfg
    }

    /// Count statements' answers against `gate`'s memory budget (`server.bodies`); the first
    /// gate given stays (the gateway's, for as long as the process).
    pub fn share_memory_budget(&self, gate: &Arc<crate::bodies::BodyGate>) {
        let _ = self.memory.set(gate.clone());
    }

    /// The statements of the config now in force: checked by [`Pool::check`] now, or when the
    /// database is reached if it is not now.
    pub fn set_statements(&self, cfg: Arc<fanout_config::Config>, checks: Vec<StatementCheck>) {
        *lock(&self.unchecked) = Some((cfg, checks));
        *lock(&self.refused) = None;
    }

    /// `Ok` when the database was reached and is not known to be down; else why not.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(r) = lock(&self.refused).as_ref() {
            return Err(r.clone());
        }
        let h = lock(&self.health);
        if h.down || !h.connected_once {
            return Err(format!(
                "database `{}` is not reachable{}",
                self.name,
                h.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// The pool for `/__fanout/status`.
    pub fn status_json(&self) -> serde_json::Value {
        let h = lock(&self.health).clone();
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "protocol": "postgres",
            "up": !h.down && h.connected_once,
            "error": h.error,
            "max_size": self.cfg.max_size,
            "open": self.open(),
            "idle": self.idle(),
            "in_use": self.open().saturating_sub(self.idle()),
            "waiting": self.waiting(),
            "max_waiters": self.cfg.max_waiters,
            "rejected_full": n(&c.rejected_full),
            "rejected_wait": n(&c.rejected_wait),
            "cancelled": n(&c.cancelled),
            "connects": n(&c.connects),
            "connect_failures": n(&c.connect_failures),
            "discarded": n(&c.discarded),
            "statements": n(&c.statements),
            "rows": n(&c.rows),
        })
    }

    /// What a client is told of a statement the server cancelled (SQLSTATE 57014) that the
    /// gateway did not: its `statement_timeout` (the server's message says so) or another
    /// session's cancel.
    fn server_timeout(&self, message: &str) -> fanout_flow::backend::ServerTimeout {
        fanout_flow::backend::ServerTimeout(if message.contains("statement timeout") {
            format!(
                "the database stopped the statement at its statement_timeout ({} ms)",
                self.cfg.statement_timeout.0.as_millis()
            )
        } else {
            "the database cancelled the statement".to_string()
        })
    }

    fn closed_one(&self) {
        self.counters.discarded.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Wait for a pool slot until `end` (capped by `max_wait`), FIFO, at most `max_waiters` waiting.
    async fn acquire(&self, end: Instant) -> Result<OwnedSemaphorePermit, CallError> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            self.counters.wait.record(0);
            return Ok(p);
        }
        let waiting = self.waiting.fetch_add(1, Ordering::AcqRel);
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _w = Waiting(&self.waiting);
        if waiting >= self.cfg.max_waiters {
            self.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(CallError::new(
                CallErrorKind::Rejected(RejectReason::Pool),
                format!(
                    "database `{}`: all {} connections busy and {} calls already waiting (postgres.max_waiters)",
                    self.name, self.cfg.max_size, self.cfg.max_waiters
                ),
            ));
        }
        let started = Instant::now();
        let until = end.min(started + self.cfg.max_wait.0);
        let got = tokio::time::timeout_at(until, self.slots.clone().acquire_owned()).await;
        let waited = started.elapsed();
        self.counters.waits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .wait_us_total
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        self.counters.wait.record_duration(waited);
        match got {
            Ok(Ok(p)) => Ok(p),
            _ => {
                self.counters.rejected_wait.fetch_add(1, Ordering::Relaxed);
                Err(CallError::new(
                    CallErrorKind::Rejected(RejectReason::Pool),
                    format!(
                        "database `{}`: no connection free within {:.0} ms (postgres.max_wait or the call's time)",
                        self.name,
                        waited.as_secs_f64() * 1000.0
                    ),
                ))
            }
        }
    }

    /// An idle connection that is still open (closing those idle past `idle_timeout`).
    fn take_idle(&self) -> Option<PooledConn> {
        let mut idle = lock(&self.idle);
        while let Some(c) = idle.pop() {
            if c.client.is_closed() || c.idle_since.elapsed() > self.cfg.idle_timeout.0 {
                drop(c);
                self.closed_one();
                continue;
            }
            return Some(c);
        }
        None
    }

    /// Fail at once while the database is known to be down (until the next retry time).
    fn fail_fast(&self) -> Option<CallError> {
        let h = lock(&self.health);
        let waiting = h.down && h.retry_at.is_some_and(|t| Instant::now() < t);
        waiting.then(|| {
            CallError::new(
                CallErrorKind::Connect,
                format!(
                    "database `{}` is unreachable{}",
                    self.name,
                    h.error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
            )
        })
    }

    fn mark_down(self: &Arc<Self>, why: String) {
        {
            let mut h = lock(&self.health);
            let min = self.cfg.reconnect_min.0;
            h.backoff = if h.down {
                (h.backoff * 2).clamp(min, self.cfg.reconnect_max.0)
            } else {
                min
            };
            // The log says why when the database goes down or the cause changes (not at every
            // retry of the same failure).
            if !h.down || h.error.as_deref() != Some(why.as_str()) {
                tracing::warn!(database = %self.name, error = %why, "database unreachable");
            }
            h.down = true;
            h.retry_at = Some(Instant::now() + h.backoff);
            h.error = Some(why);
        }
        // Idle connections of a database that went away are no good either.
        let stale: Vec<PooledConn> = std::mem::take(&mut *lock(&self.idle));
        for c in stale {
            drop(c);
            self.closed_one();
        }
        self.spawn_reconnect();
    }

    fn mark_up(&self) {
        let mut h = lock(&self.health);
        if h.down {
            tracing::info!(database = %self.name, "database reachable again");
        }
        h.down = false;
        h.error = None;
        h.retry_at = None;
        h.connected_once = true;
    }

    /// Open a connection (counted in `open`; the caller holds a slot for it).
    async fn connect(self: &Arc<Self>, end: Instant) -> Result<PooledConn, CallError> {
        // Every row is read through a guard that refuses one longer than the answer's cap from
        // its header (`guard.rs`). Plain connections: our socket (TCP or Unix, each server of
        // the URL in turn, as the driver tries them), handed to the driver; TLS: the decrypted
        // stream.
        let tripped = guard::Tripped::default();
        let limit = self.max_response_bytes;
        let attempt = async {
            match &self.connector {
                Connector::Plain => match connect_plain(&self.pg, limit, &tripped).await {
                    Some(Ok((client, to))) => Ok((client, Some(to))),
                    Some(Err(e)) => Err(e),
                    // No socket could be opened to any server: the driver's own attempt says
                    // why, in its terms.
                    None => self
                        .pg
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map(|(c, conn)| {
                            tokio::spawn(conn);
                            (c, None)
                        }),
                },
                Connector::Tls(t) => {
                    let tls = guard::GuardTls::new(t.clone(), limit, tripped.clone());
                    self.pg.connect(tls).await.map(|(c, conn)| {
                        tokio::spawn(conn);
                        (c, None)
                    })
                }
            }
        };
        let attempt_started = Instant::now();
        let until = end.min(attempt_started + self.connect_timeout);
        let result = tokio::time::timeout_at(until, attempt).await;
        match result {
            Ok(Ok((client, peer))) => {
                self.counters.connects.fetch_add(1, Ordering::Relaxed);
                self.open.fetch_add(1, Ordering::Relaxed);
                self.mark_up();
                Ok(Box::new(Conn {
                    client,
                    prepared: HashMap::default(),
                    idle_since: Instant::now(),
                    tripped,
                    peer,
                }))
            }
            Ok(Err(e)) => {
                self.counters
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                let why = connect_error(&e, &self.address);
                self.mark_down(why.clone());
                Err(CallError::new(
                    CallErrorKind::Connect,
                    format!("database `{}`: cannot connect: {why}", self.name),
                )
                .with_source(e))
            }
            Err(_) => {
                self.counters
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                let why = format!(
                    "timed out: no connection to {} within {:.0} ms",
                    self.address,
                    (until - attempt_started).as_secs_f64() * 1000.0
                );
                if until < end {
                    self.mark_down(why.clone());
                }
                Err(CallError::new(
                    CallErrorKind::Connect,
                    format!("database `{}`: {why}", self.name),
                ))
            }
        }
    }

    /// Reconnect in the background while the database is down (one task per pool at a time),
    /// so readiness turns green and calls stop failing fast as soon as it is back.
    fn spawn_reconnect(self: &Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reconnecting.store(false, Ordering::Release);
            return;
        };
        let pool = Arc::downgrade(self);
        rt.spawn(async move {
            loop {
                let Some(p) = pool.upgrade() else { return };
                let (down, retry_at) = {
                    let h = lock(&p.health);
                    (h.down, h.retry_at)
                };
                if !down {
                    p.reconnecting.store(false, Ordering::Release);
                    return;
                }
                if let Some(t) = retry_at {
                    let _ = tokio::time::timeout_at(t, p.wake.notified()).await;
                }
                // Take a slot, so the pool never opens more than max_size connections.
                let Ok(slot) = p.slots.clone().try_acquire_owned() else {
                    drop(p);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let far = Instant::now() + Duration::from_secs(3600);
                if let Ok(conn) = p.connect(far).await {
                    lock(&p.idle).push(conn);
                }
                drop(slot);
                let pending = lock(&p.unchecked).take();
                if let Some((cfg, checks)) = pending
                    && !lock(&p.health).down
                {
                    match p.check(&cfg, &checks).await {
                        Ok(errs) if !errs.is_empty() => {
                            for e in &errs {
                                tracing::error!(database = %p.name, "{e}");
                            }
                            *lock(&p.refused) = Some(format!(
                                "database `{}`: {} statement(s) refused (see the log); fix them and reload",
                                p.name,
                                errs.len()
                            ));
                        }
                        Ok(_) => {}
                        Err(_) => *lock(&p.unchecked) = Some((cfg, checks)),
                    }
                }
            }
        });
    }

    /// Connect (when the database is reachable) and prepare every statement: `Ok(errors)` names
    /// each statement Postgres refuses, a parameter count that does not match, a type the `sql`
    /// step cannot read or write; `Err`: the database could not be reached (readiness says so
    /// and the pool keeps retrying in the background).
    pub async fn check(
        self: &Arc<Self>,
        cfg: &fanout_config::Config,
        statements: &[StatementCheck],
    ) -> Result<Vec<ConfigError>, String> {
        let busy = self.connect_timeout.max(self.cfg.max_wait.0) + Duration::from_secs(5);
        let slot = match tokio::time::timeout(busy, self.slots.clone().acquire_owned()).await {
            Ok(Ok(s)) => s,
            _ => {
                return Err(format!(
                    "database `{}`: no connection free to check the statements",
                    self.name
                ));
            }
        };
        let end = Instant::now() + self.connect_timeout;
        let mut conn = match self.take_idle() {
            Some(c) => c,
            None => self.connect(end).await.map_err(|e| e.message)?,
        };
        *lock(&self.unchecked) = None;
        let mut errs = Vec::new();
        for s in statements {
            let at = |msg: String| ConfigError {
                file: cfg.file.clone(),
                pos: Some(s.query.pos),
                message: format!("{}: {msg}", s.owner),
                hint: None,
            };
            match conn.client.prepare(&s.query.value).await {
                Ok(stmt) => {
                    if stmt.params().len() != s.params {
                        errs.push(
                            at(format!(
                                "the statement has {} parameter(s) ($1…) but the step passes {}",
                                stmt.params().len(),
                                s.params
                            ))
                            .hint("`params:` lists one expression per `$n`, in order"),
                        );
                    }
                    for (i, ty) in stmt.params().iter().enumerate() {
                        if !types::supported(ty) {
                            errs.push(
                                at(format!(
                                    "parameter ${} has type {}, which sql steps cannot send",
                                    i + 1,
                                    ty.name()
                                ))
                                .hint("cast it in the statement, e.g. `$1::text::inet`"),
                            );
                        }
                    }
                    for c in stmt.columns() {
                        if !types::supported(c.type_()) {
                            errs.push(
                                at(format!(
                                    "column `{}` has type {}, which sql steps cannot read",
                                    c.name(),
                                    c.type_().name()
                                ))
                                .hint("cast it in the statement, e.g. `col::text`"),
                            );
                        }
                    }
                    conn.prepared
                        .insert(s.query.value.as_str().into(), prepared(stmt));
                }
                Err(e) => match e.as_db_error() {
                    Some(db) => {
                        let mut msg = format!("Postgres refused the statement: {}", db.message());
                        let mut pos = Some(s.query.pos);
                        if let Some(tokio_postgres::error::ErrorPosition::Original(p)) =
                            db.position()
                        {
                            // 1-based character offset into the statement.
                            let chars = (*p as usize).saturating_sub(1);
                            let offset: usize =
                                s.query.value.chars().take(chars).map(char::len_utf8).sum();
                            msg.push_str(&format!(" (at character {p} of the statement)"));
                            pos = Some(cfg.pos_in_scalar(s.query.pos, &s.query.value, offset));
                        }
                        errs.push(ConfigError {
                            file: cfg.file.clone(),
                            pos,
                            message: format!("{}: {msg}", s.owner),
                            hint: db.hint().map(str::to_string),
                        });
                    }
                    None => {
                        drop(conn);
                        self.closed_one();
                        drop(slot);
                        return Err(format!("database `{}`: {}", self.name, error_chain(&e)));
                    }
                },
            }
        }
        conn.idle_since = Instant::now();
        lock(&self.idle).push(conn);
        drop(slot);
        Ok(errs)
    }

    /// Run one call: a slot (or a refusal), a connection, the statement.
    async fn run(self: Arc<Self>, call: SqlCall, end: Instant) -> Result<CallResponse, CallError> {
        if let Some(e) = self.fail_fast() {
            return Err(e);
        }
        let permit = self.acquire(end).await?;
        let conn = match self.take_idle() {
            Some(c) => c,
            // Boxed: connecting (TLS included) is a large future that a call on an idle
            // connection would otherwise carry, and move, every time.
            None => Box::pin(self.connect(end)).await?,
        };
        let mut in_use = InUse {
            pool: self.clone(),
            conn: Some(conn),
            permit: Some(permit),
        };
        let Some(conn) = in_use.conn.as_mut() else {
            return Err(CallError::new(CallErrorKind::Invalid, "no connection"));
        };
        let max = self.max_response_bytes;
        // No timer of its own: like every backend call, the caller bounds it (the step's
        // timeout, a shared call's limit), and dropping this future at that bound drops
        // `in_use`, which cancels the statement at the server.
        let done = execute(conn, &call, max, &self.counters, self.memory.get()).await;
        match done {
            Ok(Answer::Value(answer)) => {
                in_use.release();
                Ok(CallResponse {
                    status: StatusCode::OK,
                    body: Bytes::new(),
                    value: Some(answer),
                    parsed: None,
                })
            }
            Ok(Answer::Text(text)) => {
                in_use.release();
                Ok(response(StatusCode::OK, text))
            }
            Err(ExecError::Memory(budget)) => {
                // The rest of the rows are still coming: the connection is not idle.
                drop(in_use);
                Err(CallError::new(
                    CallErrorKind::Rejected(RejectReason::Memory),
                    format!(
                        "database `{}`: the rows passed the memory budget for in-flight data \
                         (server.bodies.memory_budget_bytes: {budget})",
                        self.name
                    ),
                ))
            }
            Err(ExecError::Param(n, problem)) => {
                in_use.release();
                let body = format!(r#"{{"param":{n},"problem":{}}}"#, json_str(&problem));
                Ok(response(StatusCode::BAD_REQUEST, body))
            }
            Err(ExecError::Column(problem)) => {
                // Not idle: dropping `in_use` cancels the rest and checks the connection.
                drop(in_use);
                let body = format!(r#"{{"sqlstate":"XX000","message":{}}}"#, json_str(&problem));
                Ok(response(StatusCode::INTERNAL_SERVER_ERROR, body))
            }
            Err(ExecError::TooLarge) => {
                // The rest of the rows are still coming: the connection is not idle.
                drop(in_use);
                Err(CallError::new(
                    CallErrorKind::BodyTooLarge,
                    format!(
                        "database `{}`: the rows are larger than max_response_bytes ({max})",
                        self.name
                    ),
                ))
            }
            Err(ExecError::Db(e)) => {
                let Some(db) = e.as_db_error() else {
                    in_use.discard();
                    return Err(CallError::new(CallErrorKind::Reset, error_chain(&e)));
                };
                let state = db.code().code();
                self.counters.errors.count(state);
                match sql_status(state) {
                    Ok(status) => {
                        in_use.release();
                        let mut body = format!(
                            r#"{{"sqlstate":{},"message":{}"#,
                            json_str(state),
                            json_str(db.message())
                        );
                        if let Some(c) = db.constraint() {
                            body.push_str(&format!(r#","constraint":{}"#, json_str(c)));
                        }
                        body.push('}');
                        Ok(response(status, body))
                    }
                    Err(kind) => {
                        if kind == CallErrorKind::Timeout {
                            in_use.release();
                        } else {
                            in_use.discard();
                            self.mark_down(format!("{} (SQLSTATE {state})", db.message()));
                        }
                        let err = CallError::new(
                            kind,
                            format!(
                                "database `{}`: {} (SQLSTATE {state})",
                                self.name,
                                db.message()
                            ),
                        );
                        Err(if kind == CallErrorKind::Timeout {
                            // The server stopped it: our own cancels are sent past the call's
                            // time, which has then ended already.
                            err.with_source(self.server_timeout(db.message()))
                        } else {
                            err
                        })
                    }
                }
            }
            Err(ExecError::Broken(_)) if in_use.tripped() > 0 => {
                // The guard refused a row longer than the cap from its header and closed the
                // connection; the statement may still run at the server: cancel it there.
                let len = in_use.tripped();
                drop(in_use);
                Err(CallError::new(
                    CallErrorKind::BodyTooLarge,
                    format!(
                        "database `{}`: a row of {len} bytes is larger than max_response_bytes ({max})",
                        self.name
                    ),
                ))
            }
            Err(ExecError::Broken(e)) => {
                in_use.discard();
                let closed = e.is_closed();
                self.mark_down(error_chain(&e));
                Err(CallError::new(
                    if closed {
                        CallErrorKind::Reset
                    } else {
                        CallErrorKind::Connect
                    },
                    format!("database `{}`: connection lost: {e}", self.name),
                )
                .with_source(e))
            }
        }
    }
}

/// Prepare (once per connection), bind, run, and build the answer (`[...]`, or
/// `{rows: [...], rows_affected}`) as a value (the step takes it without a JSON round trip).
async fn execute(
    conn: &mut Conn,
    call: &SqlCall,
    max_bytes: usize,
    counters: &PoolCounters,
    memory: Option<&Arc<crate::bodies::BodyGate>>,
) -> Result<Answer, ExecError> {
    let prep = match conn.prepared.get(&call.statement) {
        Some(s) => s.clone(),
        None => {
            // Boxed: rare (statements are prepared when a connection opens), and large.
            let s = prepared(Box::pin(conn.client.prepare(&call.statement)).await?);
            conn.prepared.insert(call.statement.clone(), s.clone());
            s
        }
    };
    let stmt = &prep.stmt;
    if stmt.params().len() != call.params.len() {
        return Err(ExecError::Param(
            0,
            format!(
                "the statement takes {} parameters, the step passes {}",
                stmt.params().len(),
                call.params.len()
            ),
        ));
    }
    let mut params: smallvec::SmallVec<[types::Param; 4]> =
        smallvec::SmallVec::with_capacity(call.params.len());
    for (i, (v, ty)) in call.params.iter().zip(stmt.params()).enumerate() {
        params.push(types::param(v, ty).map_err(|p| ExecError::Param(i + 1, p))?);
    }
    counters.statements.fetch_add(1, Ordering::Relaxed);
    let rows = conn.client.query_raw(stmt, params.iter()).await?;
    pin_mut!(rows);
    let cols = stmt.columns();
    // A json/jsonb column sits three levels down in the answer `{rows: [{col: …}]}` (two in
    // the rows alone; the same limit for both, as the step's answer is the same).
    let depth = call.max_depth.saturating_sub(3);
    let mut acc = Rows::new(call, memory);
    let mut scratch = Vec::new();
    while let Some(row) = rows.next().await {
        // Rows already buffered come back without the stream ever waiting: a long answer would
        // hold this worker for as long as it takes to convert. Tokio's cooperative budget makes
        // this task yield every so many rows, so the worker's other tasks get their turn.
        tokio::task::consume_budget().await;
        let row = row?;
        // The row's size, counted as its JSON text would be (names, values' wire bytes, quotes
        // and separators) before any value is converted: a row that would pass the cap is
        // refused without a copy of its values being made.
        let mut row_size = 2usize;
        for (i, c) in cols.iter().enumerate() {
            let raw: Raw<'_> = row.try_get(i)?;
            row_size = row_size.saturating_add(c.name().len() + 6 + raw.0.map_or(4, <[u8]>::len));
        }
        if acc.size.saturating_add(row_size) > max_bytes {
            return Err(ExecError::TooLarge);
        }
        let mut obj = match &prep.row {
            RowShape::Template(template) => template.clone(),
            RowShape::Names(_) => Map::with_capacity_and_hasher(cols.len(), Default::default()),
        };
        for (i, c) in cols.iter().enumerate() {
            let raw: Raw<'_> = row.try_get(i)?;
            let v = types::to_val(c.type_(), raw.0, depth, &mut scratch)
                .map_err(|p| ExecError::Column(format!("column `{}`: {p}", c.name())))?;
            match &prep.row {
                RowShape::Template(_) => {
                    if let Some((_, slot)) = obj.get_index_mut(i) {
                        *slot = v;
                    }
                }
                RowShape::Names(names) => {
                    if let Some(name) = names.get(i) {
                        obj.insert(name.clone(), v);
                    }
                }
            }
        }
        acc.push(Val::obj(obj), row_size, max_bytes)?;
    }
    counters.rows.fetch_add(acc.n as u64, Ordering::Relaxed);
    let affected = rows.rows_affected();
    Ok(acc.finish(affected))
}

/// Rows kept as values while the answer's JSON would be at most this many bytes (every answer
/// of a `one`/`optional` step or a short list: no JSON text is written and parsed again); past
/// it the rows are written as JSON text as they arrive — a row as a value costs 10–30 times
/// its JSON size (a map, its table, the `Arc`s, a number or string each), which is what made a
/// statement stopped at a 16 MiB cap hold 400 MiB.
const VALUE_ROWS_MAX_BYTES: usize = 64 << 10;

/// A statement's answer as it was built.
enum Answer {
    /// Built as a value (small answers).
    Value(Val),
    /// Written as JSON text (large answers); the step parses it like an HTTP backend's answer
    /// (a large one on the compute pool). Holds its share of the memory budget until dropped.
    Text(Bytes),
}

/// The rows of an answer as they arrive: values while small, then JSON text.
struct Rows<'a> {
    /// Only the rows (`[...]`), not `{rows, rows_affected}`.
    rows_only: bool,
    /// The one row alone while it is the only one ([`SqlCall::single_row`]).
    single: bool,
    first: Option<Val>,
    vals: Vec<Val>,
    /// Once the answer passed [`VALUE_ROWS_MAX_BYTES`]: its JSON text so far (without the
    /// closing part). For a single row, its first byte is a space, made `[` at the second row.
    text: Option<Text>,
    /// Rows so far.
    n: usize,
    /// The answer's JSON size so far: estimated from the wire while values, exact once text.
    size: usize,
    memory: Option<&'a Arc<crate::bodies::BodyGate>>,
    /// The share of the memory budget taken (`size`, or the text's capacity).
    reserved: Option<crate::bodies::Reservation>,
}

impl<'a> Rows<'a> {
    fn new(call: &SqlCall, memory: Option<&'a Arc<crate::bodies::BodyGate>>) -> Self {
        Rows {
            rows_only: call.rows_only,
            single: call.rows_only && call.single_row,
            first: None,
            vals: Vec::new(),
            text: None,
            n: 0,
            size: 32,
            memory,
            reserved: None,
        }
    }

    /// Add a row (`estimate`: its JSON size from the wire), refusing the answer past `max_bytes`
    /// or when the memory budget has no room for it.
    fn push(&mut self, row: Val, estimate: usize, max_bytes: usize) -> Result<(), ExecError> {
        self.n += 1;
        match &mut self.text {
            Some(t) => {
                Self::write_row(t, &row, estimate, self.n, self.single);
                drop(row);
                self.size = t.len();
            }
            None => {
                self.size = self.size.saturating_add(estimate);
                if self.single && self.first.is_none() && self.vals.is_empty() {
                    self.first = Some(row);
                } else {
                    self.vals.extend(self.first.take());
                    self.vals.push(row);
                }
                if self.size > VALUE_ROWS_MAX_BYTES {
                    self.spill();
                }
            }
        }
        if self.size > max_bytes {
            return Err(ExecError::TooLarge);
        }
        self.reserve()
    }

    /// Append row number `n` (1-based) to the text.
    fn write_row(t: &mut Text, row: &Val, estimate: usize, n: usize, single: bool) {
        if single && n == 2 {
            // A second row of a single-row call: the answer is a list after all.
            if let Some(b) = t.first_byte() {
                *b = b'[';
            }
        }
        // The estimate is from the wire: a number's text may be longer (an int4 is 4 bytes
        // there, up to 11 here), a string's escapes too.
        let buf = t.buf(estimate.saturating_mul(2).saturating_add(64));
        if n > 1 {
            buf.push(b',');
        }
        fanout_expr::json::write(row, buf);
    }

    /// Turn the values so far into JSON text.
    fn spill(&mut self) {
        let mut t = Text::default();
        t.buf(16)
            .extend_from_slice(match (self.rows_only, self.single) {
                (false, _) => br#"{"rows":["#.as_slice(),
                (true, true) => b" ",
                (true, false) => b"[",
            });
        let vals = std::mem::take(&mut self.vals);
        for (i, row) in self.first.take().iter().chain(vals.iter()).enumerate() {
            Self::write_row(&mut t, row, 4096, i + 1, self.single);
        }
        self.size = t.len();
        self.text = Some(t);
    }

    /// Grow the reservation to what the answer holds now.
    fn reserve(&mut self) -> Result<(), ExecError> {
        let Some(gate) = self.memory else {
            return Ok(());
        };
        let holds = self.text.as_ref().map_or(self.size, Text::capacity);
        let r = self.reserved.get_or_insert_with(|| gate.reservation());
        if let Some(more) = holds.checked_sub(r.bytes()).filter(|&m| m > 0) {
            r.grow(more).map_err(|_| ExecError::Memory(gate.budget()))?;
        }
        Ok(())
    }

    /// The answer: `[...]` (one row alone for a single-row call), or `{rows, rows_affected}`.
    fn finish(mut self, affected: Option<u64>) -> Answer {
        if let Some(mut t) = self.text.take() {
            let end = t.buf(64);
            if !self.rows_only {
                end.extend_from_slice(br#"],"rows_affected":"#);
                end.extend_from_slice(affected.unwrap_or(0).to_string().as_bytes());
                end.push(b'}');
            } else if !(self.single && self.n == 1) {
                end.push(b']');
            }
            return Answer::Text(Bytes::from_owner(Held {
                text: t.into_vec(),
                _memory: self.reserved.take(),
            }));
        }
        if let Some(row) = self.first.take() {
            return Answer::Value(row);
        }
        let out = std::mem::take(&mut self.vals);
        if self.rows_only {
            return Answer::Value(Val::Arr(out.into()));
        }
        let mut answer = ANSWER.clone();
        if let Some((_, v)) = answer.get_index_mut(0) {
            *v = out.into_iter().collect();
        }
        if let Some((_, v)) = answer.get_index_mut(1) {
            *v = Val::from(usize::try_from(affected.unwrap_or(0)).unwrap_or(usize::MAX));
        }
        Answer::Value(Val::obj(answer))
    }
}

/// The chunks of an answer's JSON text.
const TEXT_CHUNK: usize = 256 << 10;

/// An answer's JSON text as it is written, in chunks of about [`TEXT_CHUNK`] bytes: growing it
/// never copies what is written (one buffer would be copied at every doubling, and hold up to
/// twice the answer), so an answer refused at the cap has held about the cap. Made one buffer
/// once complete.
#[derive(Default)]
struct Text {
    full: Vec<Vec<u8>>,
    cur: Vec<u8>,
    full_len: usize,
    full_cap: usize,
}

impl Text {
    /// The chunk to write the next `need` bytes into (a new one when the current one has not the
    /// room: a full chunk is never grown, which would double it).
    fn buf(&mut self, need: usize) -> &mut Vec<u8> {
        if self.cur.capacity() - self.cur.len() < need {
            let size = need.max(TEXT_CHUNK);
            if self.cur.is_empty() {
                self.cur.reserve_exact(size);
            } else {
                let done = std::mem::replace(&mut self.cur, Vec::with_capacity(size));
                self.full_len += done.len();
                self.full_cap += done.capacity();
                self.full.push(done);
            }
        }
        &mut self.cur
    }

    fn len(&self) -> usize {
        self.full_len + self.cur.len()
    }

    fn capacity(&self) -> usize {
        self.full_cap + self.cur.capacity()
    }

    fn first_byte(&mut self) -> Option<&mut u8> {
        match self.full.first_mut() {
            Some(c) => c.first_mut(),
            None => self.cur.first_mut(),
        }
    }

    fn into_vec(self) -> Vec<u8> {
        if self.full.is_empty() {
            return self.cur;
        }
        let mut out = Vec::with_capacity(self.len());
        for c in self.full {
            out.extend_from_slice(&c);
        }
        out.extend_from_slice(&self.cur);
        out
    }
}

/// An answer's JSON text with its share of the memory budget, released when the text is
/// dropped (once the step has parsed it).
struct Held {
    text: Vec<u8>,
    _memory: Option<crate::bodies::Reservation>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.text
    }
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

/// The PostgreSQL protocol: its line in [`crate::PROTOCOLS`].
pub(crate) const PROTOCOL: crate::protocol::Registration = crate::protocol::Registration {
    serves: |p| p == fanout_config::Protocol::Postgres,
    build: |name, b, defaults| Ok(Arc::new(PgBackend::new(name, b, defaults)?)),
    metrics: metrics::write,
};

impl crate::protocol::ProtocolClient for PgBackend {
    fn service(self: Arc<Self>) -> Arc<dyn Backend> {
        self
    }

    fn status_json(&self) -> serde_json::Value {
        self.pool.status_json()
    }

    fn readiness(&self) -> Result<(), String> {
        self.pool.readiness()
    }

    fn share_memory_budget(&self, gate: &Arc<crate::bodies::BodyGate>) {
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
