//! The outbound HTTP client: each call's address is chosen by the backend's balancer (P2C
//! peak-EWMA or round robin, with outlier ejection: [`crate::balance`]); a plain `http://` address
//! of an HTTP/1.1 backend has fanout's own keep-alive pool ([`crate::h1pool`]: no per-call pool
//! key, no task per answer), `https://` and HTTP/2 ones one pooled hyper-util client per backend
//! (TLS via rustls, ALPN, multiplexing). Implements [`Backend`].
//!
//! `protocol: grpc` backends use the same client over HTTP/2 with keepalive PINGs (a frozen peer
//! closes its connection after `keepalive.interval + keepalive.timeout`, failing its calls at
//! once): a call's body is the framed message the `grpc` step built, sent as POST with
//! `content-type: application/grpc`, `te: trailers` and the attempt's time as `grpc-timeout`;
//! the answer's `grpc-status` (trailers, or headers for a trailers-only answer) becomes the call
//! answer's HTTP status ([`fanout_grpc::Code::http_status`]) — so every layer above classifies
//! it like an HTTP answer — and its body is the answer message, unframed. Every call says
//! `grpc-accept-encoding: gzip, identity`; a backend with `grpc_compression: gzip` gets its
//! request message gzip-compressed (`grpc-encoding: gzip`), and a compressed answer is
//! inflated within `max_message_bytes` (more is a too-large answer; inflating stops there).
//! Compressing or inflating more than [`OFFLOAD_BYTES`] is done on tokio's blocking pool.
//!
//! How every call ended is reported to the balancer, also when the call is dropped: the call's
//! timeout is enforced by the caller (the executor's timer, which also decides between
//! `backend_timeout` and `deadline_exceeded`), so a call dropped at its timeout counts as a
//! timeout failure of the address, one dropped earlier as cancelled.

use crate::balance::{BalancePolicy, BalanceState, Outcome, Pick};
use crate::body::CallBody;
use crate::h1pool::H1Pool;
use bytes::Bytes;
use fanout_config::{Backend as BackendConfig, ConfigError, Defaults, Protocol};
use fanout_layers::stream::{BoxError, StreamRequest, StreamResponse};
use fanout_layers::{Backend, CallError, CallErrorKind, CallOutcome, CallRequest, CallResponse};
use fanout_protocol::AddressStatus;
use fanout_protocol::headers::find_header;
use fanout_protocol::tls::trusted_roots;
use futures_util::future::BoxFuture;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

type HttpClient = Client<HttpsConnector<HttpConnector>, CallBody>;

struct Base {
    /// `scheme://host[:port]` — never the URL's userinfo, which is a credential: this is the
    /// address's name everywhere it is shown (status, `/ui`, logs, spans, metric labels).
    origin: String,
    /// `Authorization: Basic …` made from the URL's userinfo (`http://user:pass@host`), sent
    /// with every call to this address unless the call or the backend's `headers` set one.
    basic: Option<HeaderValue>,
    /// Base path without trailing `/` (may be empty).
    path: String,
    /// The scheme and authority parsed once (`None` if they do not parse: the request is then
    /// built from the text, and refused as invalid there).
    parsed: Option<(Scheme, Authority)>,
    /// The `Host` header of an HTTP/1 request to this address (`host[:port]`, the port only
    /// when it is not the scheme's default), made once — as hyper's client would make it for
    /// every request.
    host: Option<HeaderValue>,
    /// An HTTP/1 `http://` address: fanout's own keep-alive pool ([`H1Pool`]); `None`: the
    /// legacy client (TLS, HTTP/2).
    h1: Option<Arc<H1Pool>>,
}

impl Base {
    fn new(scheme: &str, authority: &str, path: &str) -> Base {
        let origin = format!("{scheme}://{authority}");
        let parsed = match (Scheme::try_from(scheme), Authority::try_from(authority)) {
            (Ok(s), Ok(a)) => Some((s, a)),
            _ => None,
        };
        let host = parsed.as_ref().and_then(|(s, a)| {
            let default_port = match s.as_str() {
                "https" => 443,
                _ => 80,
            };
            let text = match a.port_u16() {
                Some(p) if p != default_port => format!("{}:{p}", a.host()),
                _ => a.host().to_string(),
            };
            HeaderValue::from_str(&text).ok()
        });
        Base {
            origin,
            basic: None,
            path: path.to_string(),
            parsed,
            host,
            h1: None,
        }
    }

    /// The URI of a call to `path_and_query` at this address, or (the address, why not).
    /// Requests on an [`H1Pool`] carry it in origin form ([`origin_form`]).
    fn uri(&self, path_and_query: PathAndQuery) -> Result<Uri, (String, String)> {
        let Some((scheme, authority)) = &self.parsed else {
            let text = format!("{}{}{path_and_query}", self.origin, self.path);
            return Err((text, "not a valid URI".into()));
        };
        // (The text of an invalid path is not kept: the message names the address.)
        let invalid = || format!("{}{} (with an invalid path)", self.origin, self.path);
        let pq = if self.path.is_empty() {
            path_and_query
        } else {
            let joined = format!("{}{path_and_query}", self.path);
            PathAndQuery::from_maybe_shared(Bytes::from(joined))
                .map_err(|e| (invalid(), e.to_string()))?
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(scheme.clone());
        parts.authority = Some(authority.clone());
        parts.path_and_query = Some(pq);
        Uri::from_parts(parts).map_err(|e| (invalid(), e.to_string()))
    }
}

/// `Authorization: Basic base64(user:password)` from a URL's userinfo (percent-decoded, as RFC
/// 3986 writes it), marked sensitive (never indexed by HPACK); `None` for an empty userinfo.
fn basic_auth(userinfo: &str) -> Option<HeaderValue> {
    use base64::Engine;
    if userinfo.is_empty() {
        return None;
    }
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let mut plain = percent_decode(user);
    plain.push(b':');
    plain.extend(percent_decode(password));
    let text = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(&plain)
    );
    let mut v = HeaderValue::from_str(&text).ok()?;
    v.set_sensitive(true);
    Some(v)
}

/// `%XX` escapes decoded; anything else (a stray `%`) kept as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The origin form of `uri` (its path and query), as an HTTP/1 request line carries it.
fn origin_form(uri: &Uri) -> Uri {
    let mut parts = http::uri::Parts::default();
    parts.path_and_query = uri.path_and_query().cloned();
    Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"))
}

// Header names of gRPC calls, made once.
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");

/// gRPC messages compressed or inflated beyond this many bytes are worked on in tokio's blocking
/// pool, not on the worker (the default of `server.compute.offload_bytes`).
pub const OFFLOAD_BYTES: usize = 256 << 10;

/// A `protocol: grpc` backend's settings the transport applies.
#[derive(Debug, Clone, Copy)]
struct GrpcOpts {
    /// The largest answer message accepted (inflated, when compressed).
    max_message: usize,
    /// Request messages are sent gzip-compressed.
    gzip: bool,
}

/// An HTTP backend.
pub struct HttpBackend {
    bases: Vec<Base>,
    balancer: Arc<Mutex<BalanceState>>,
    /// The legacy client (TLS, HTTP/2, gRPC): one per core ([`fanout_runtime::cores::shard`]),
    /// each with its own connections, whose tasks run on that core (on the work-stealing
    /// runtime every thread uses the first), and a last one for the threads outside the cores
    /// of a per-core gateway (the control thread's reference loads and probes).
    clients: Box<[HttpClient]>,
    headers: HeaderMap,
    max_response_bytes: usize,
    /// `accept_encoding`: the `Accept-Encoding` sent (`None`: none).
    accept_encoding: Option<HeaderValue>,
    /// `protocol: grpc`: its settings.
    grpc: Option<GrpcOpts>,
    /// HTTP/1 (the `Host` header is ours to set).
    http1: bool,
    /// `server.deadline_header`: the header each HTTP call carries the time its attempt may take
    /// in, in milliseconds (gRPC calls carry `grpc-timeout`); `None` writes none.
    deadline_header: Option<HeaderName>,
}

impl HttpBackend {
    /// Build the client for a backend from its config. Reads the CA file if one is configured;
    /// does no network I/O.
    pub fn new(
        name: &str,
        cfg: &BackendConfig,
        defaults: &Defaults,
    ) -> Result<HttpBackend, ConfigError> {
        let mut bases = Vec::new();
        for u in cfg.url.iter().chain(cfg.urls.iter()) {
            let (scheme, rest) = u.value.split_once("://").unwrap_or(("http", &u.value));
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
                None => (rest, ""),
            };
            // Userinfo is a credential: it becomes the address's `Authorization: Basic` (as
            // curl, Go and Python send it) and is never part of the name shown.
            let (userinfo, authority) = match authority.rsplit_once('@') {
                Some((ui, host)) => (Some(ui), host),
                None => (None, authority),
            };
            let mut base = Base::new(scheme, authority, path);
            base.basic = userinfo.and_then(basic_auth);
            bases.push(base);
        }
        let mut headers = HeaderMap::new();
        for (k, v) in &cfg.headers {
            if fanout_config::framing_header(k) {
                return Err(ConfigError::at(
                    cfg.url.iter().chain(cfg.urls.iter()).next().map(|u| u.pos).unwrap_or_default(),
                    format!("backend `{name}`: header `{k}` frames the message; it may not be set"),
                )
                .hint("fanout writes content-length, transfer-encoding, connection and the like itself: remove it"));
            }
            let hn = HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                ConfigError::at(
                    Default::default(),
                    format!("backend `{name}`: invalid header name `{k}`"),
                )
            })?;
            let hv = HeaderValue::from_str(v).map_err(|_| {
                ConfigError::at(
                    Default::default(),
                    format!("backend `{name}`: invalid value for header `{k}`"),
                )
            })?;
            headers.insert(hn, hv);
        }

        let roots = trusted_roots(name, cfg)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| {
                ConfigError::at(
                    Default::default(),
                    format!("backend `{name}`: TLS setup failed: {e}"),
                )
            })?
            .with_root_certificates(roots);
        let tls = match fanout_protocol::tls::client_identity(name, cfg)? {
            Some((chain, key)) => tls.with_client_auth_cert(chain, key).map_err(|e| {
                ConfigError::at(
                    cfg.tls
                        .cert_file
                        .as_ref()
                        .map(|f| f.pos)
                        .unwrap_or_default(),
                    format!("backend `{name}`: unusable client certificate: {e}"),
                )
            })?,
            None => tls.with_no_client_auth(),
        };

        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(
            cfg.connect_timeout.unwrap_or(defaults.connect_timeout).0,
        ));
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let connector = match cfg.protocol {
            p if p.is_http2() => builder.enable_http2().wrap_connector(http),
            _ => builder.enable_http1().wrap_connector(http),
        };
        let mut cb = Client::builder(TokioExecutor::new());
        cb.pool_idle_timeout(cfg.pool_idle_timeout.0)
            .pool_max_idle_per_host(cfg.pool_max_idle)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new());
        if cfg.protocol.is_http2() {
            cb.http2_only(true);
        }
        let keepalive = match cfg.protocol {
            Protocol::Grpc => Some(cfg.keepalive.clone().unwrap_or_default()),
            Protocol::Http2 => cfg.keepalive.clone(),
            _ => None,
        };
        if let Some(k) = keepalive {
            cb.http2_keep_alive_interval(Some(k.interval.0))
                .http2_keep_alive_timeout(k.timeout.0)
                .http2_keep_alive_while_idle(k.while_idle);
        }
        if cfg.protocol == Protocol::Http1 {
            let connect_timeout = cfg.connect_timeout.unwrap_or(defaults.connect_timeout).0;
            for b in &mut bases {
                if let Some((scheme, authority)) = &b.parsed
                    && *scheme == Scheme::HTTP
                {
                    b.h1 = Some(H1Pool::new(
                        authority,
                        cfg.pool_max_idle,
                        cfg.pool_idle_timeout.0,
                        connect_timeout,
                    ));
                }
            }
        }
        let policy = BalancePolicy::from_config(&cfg.balance, &cfg.outlier);
        let balancer = BalanceState::new(bases.len(), policy, Instant::now());
        Ok(HttpBackend {
            bases,
            balancer: Arc::new(Mutex::new(balancer)),
            clients: (0..=fanout_runtime::cores::shard_count())
                .map(|_| cb.build(connector.clone()))
                .collect(),
            headers,
            max_response_bytes: cfg.max_response_bytes,
            accept_encoding: crate::decode::accept_encoding(&cfg.accept_encoding),
            grpc: (cfg.protocol == Protocol::Grpc).then_some(GrpcOpts {
                max_message: cfg.max_message_bytes,
                gzip: cfg.grpc_compression == fanout_config::GrpcCompression::Gzip,
            }),
            http1: !cfg.protocol.is_http2(),
            deadline_header: None,
        })
    }

    /// The client that writes the time each HTTP call's attempt may take, in milliseconds, in
    /// header `name` (`server.deadline_header`), for the backend to stop early.
    pub fn with_deadline_header(mut self, name: HeaderName) -> HttpBackend {
        self.deadline_header = Some(name);
        self
    }
}

impl HttpBackend {
    /// Per-address load, latency estimate and health.
    pub fn addresses(&self) -> Vec<AddressStatus> {
        let now = Instant::now();
        let snap = self
            .balancer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot(now);
        snap.into_iter()
            .map(|state| AddressStatus {
                address: self
                    .bases
                    .get(state.index)
                    .map(|b| format!("{}{}", b.origin, b.path))
                    .unwrap_or_default(),
                state,
            })
            .collect()
    }

    /// `{strategy, addresses: [{address, state, in_flight, ewma_ms, ejected, …}]}`.
    pub fn status_json(&self) -> serde_json::Value {
        let strategy = match self
            .balancer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .policy()
            .strategy
        {
            fanout_config::BalanceStrategy::P2cPeakEwma => "p2c_peak_ewma",
            fanout_config::BalanceStrategy::RoundRobin => "round_robin",
        };
        let addresses: Vec<serde_json::Value> = self
            .addresses()
            .into_iter()
            .map(|a| {
                let s = a.state;
                serde_json::json!({
                    "address": a.address,
                    "state": s.state,
                    "in_flight": s.in_flight,
                    "ewma_ms": (s.ewma_ms * 1000.0).round() / 1000.0,
                    "ejected": s.ejected,
                    "ejected_for_ms": s.ejected_for_ms,
                    "times_ejected": s.times_ejected,
                    "consecutive_failures": s.consecutive_failures,
                    "calls": s.calls,
                    "failures": s.failures,
                    "ejections": s.ejections,
                })
            })
            .collect();
        serde_json::json!({ "strategy": strategy, "addresses": addresses })
    }
}

/// A call's claim on its address: reports the outcome to the balancer exactly once — when the
/// call ends, or when it is dropped before (then as cancelled, or as a timeout if its time was
/// up).
struct Claim {
    balancer: Arc<Mutex<BalanceState>>,
    pick: Pick,
    started: Instant,
    timeout: Duration,
    default_rtt: Duration,
    done: bool,
}

impl Claim {
    fn finish(&mut self, outcome: Outcome) {
        if self.done {
            return;
        }
        self.done = true;
        let now = Instant::now();
        self.balancer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(self.pick, self.started, now, self.timeout, outcome);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.done {
            // Dropped at its timeout (the caller's timer; 1 ms of slack for the timer wheel and
            // the few µs between the caller's clock reading and ours): a timeout.
            let elapsed = self.started.elapsed() + Duration::from_millis(1);
            let outcome = if blamable(self.timeout, self.default_rtt) && elapsed >= self.timeout {
                Outcome::Failure
            } else {
                Outcome::Cancelled
            };
            self.finish(outcome);
        }
    }
}

/// Whether a timeout of this length is the address's fault: not when the call was given less
/// than `default_rtt` (a deadline nearly used up elsewhere).
fn blamable(timeout: Duration, default_rtt: Duration) -> bool {
    timeout >= default_rtt && !timeout.is_zero()
}

fn classify(e: &hyper_util::client::legacy::Error) -> CallErrorKind {
    if e.is_connect() {
        CallErrorKind::Connect
    } else {
        CallErrorKind::Reset
    }
}

/// At most the first `max` bytes of `s` (on a character boundary), with `…` when cut: an
/// absurdly long URI in a log line.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Send one request on fanout's own HTTP/1 pool and read its answer, at most `limit` bytes of
/// body; the connection goes back to the pool once the answer is read to the end.
async fn exchange_h1(
    pool: Arc<H1Pool>,
    request: Request<CallBody>,
    uri: Uri,
    limit: usize,
) -> Result<CallResponse, CallError> {
    let (resp, conn) = pool.send(request).await.map_err(|e| {
        let kind = if e.is_connect() {
            CallErrorKind::Connect
        } else {
            CallErrorKind::Reset
        };
        CallError::new(kind, format!("{uri}: {}", describe(&e))).with_source(e)
    })?;
    let (parts, body) = resp.into_parts();
    let body = read_body(body, limit).await?;
    pool.put(conn);
    let body = crate::decode::decode_answer(&parts.headers, body, limit).await?;
    Ok(CallResponse {
        status: parts.status,
        body,
        value: None,
        parsed: None,
    })
}

/// Send one request and read its answer, at most `limit` bytes of body (gRPC: one message of
/// at most `grpc.max_message` bytes; `gzip`: the framed message to send compressed).
async fn exchange(
    client: HttpClient,
    request: Request<CallBody>,
    uri: Uri,
    limit: usize,
    grpc: Option<GrpcOpts>,
    gzip: Option<Bytes>,
) -> Result<CallResponse, CallError> {
    if let Some(g) = grpc {
        return grpc_exchange(client, request, uri, g.max_message, gzip).await;
    }
    let resp = client.request(request).await.map_err(|e| {
        CallError::new(classify(&e), format!("{uri}: {}", describe(&e))).with_source(e)
    })?;
    let (parts, body) = resp.into_parts();
    let body = read_body(body, limit).await?;
    let body = crate::decode::decode_answer(&parts.headers, body, limit).await?;
    Ok(CallResponse {
        status: parts.status,
        body,
        value: None,
        parsed: None,
    })
}

/// An answer's whole body, at most `limit` bytes (`max_response_bytes`), never holding more
/// ([`crate::body::read_answer`]).
pub(crate) async fn read_body(
    body: hyper::body::Incoming,
    limit: usize,
) -> Result<Bytes, CallError> {
    crate::body::read_answer(body, limit)
        .await
        .map_err(|e| match e {
            crate::body::ReadError::TooLarge => CallError::new(
                CallErrorKind::BodyTooLarge,
                format!("answer larger than max_response_bytes ({limit})"),
            ),
            crate::body::ReadError::Failed(e) => CallError::new(
                CallErrorKind::Reset,
                format!("reading the answer failed: {}", describe(&e)),
            ),
        })
}

/// The error of an answer body that could not be read: too large (`too_large` says by which
/// limit) or cut off.
fn read_failure(
    e: &(dyn std::error::Error + Send + Sync + 'static),
    too_large: impl FnOnce() -> String,
) -> CallError {
    if e.downcast_ref::<http_body_util::LengthLimitError>()
        .is_some()
    {
        CallError::new(CallErrorKind::BodyTooLarge, too_large())
    } else {
        CallError::new(
            CallErrorKind::Reset,
            format!("reading the answer failed: {}", describe(e)),
        )
    }
}

/// A gRPC call: the answer's status from `grpc-status`, its body the one answer message
/// (inflated when compressed). `gzip`: the framed request message, sent gzip-compressed.
async fn grpc_exchange(
    client: HttpClient,
    mut request: Request<CallBody>,
    uri: Uri,
    max_message: usize,
    gzip: Option<Bytes>,
) -> Result<CallResponse, CallError> {
    use fanout_grpc::{Code, frame, status};
    if let Some(framed) = gzip {
        let compressed = if framed.len() >= OFFLOAD_BYTES {
            let f = framed.clone();
            tokio::task::spawn_blocking(move || fanout_grpc::compression::gzip_framed(&f))
                .await
                .ok()
                .flatten()
        } else {
            fanout_grpc::compression::gzip_framed(&framed)
        };
        // Not one uncompressed frame (never, from a `grpc` step): sent as it is.
        match compressed {
            Some(c) => {
                *request.body_mut() = CallBody::without_length(c);
                request
                    .headers_mut()
                    .insert(GRPC_ENCODING, HeaderValue::from_static("gzip"));
            }
            None => *request.body_mut() = CallBody::without_length(framed),
        }
    }
    let resp = client.request(request).await.map_err(|e| {
        CallError::new(classify(&e), format!("{uri}: {}", describe(&e))).with_source(e)
    })?;
    let (parts, body) = resp.into_parts();
    // Not a gRPC answer at all: the HTTP status decides (the gRPC spec's mapping).
    if parts.status != http::StatusCode::OK {
        let code = Code::for_http_status(parts.status.as_u16());
        return Ok(grpc_failure(code, &format!("HTTP status {}", parts.status)));
    }
    let collected = Limited::new(body, max_message + frame::HEADER_LEN)
        .collect()
        .await
        .map_err(|e| {
            read_failure(&*e, || {
                format!("answer message larger than max_message_bytes ({max_message})")
            })
        })?;
    // The status is in the trailers, or (a trailers-only answer) in the headers; looked up by
    // names made once, the trailers borrowed.
    let (src, code_v) = match collected
        .trailers()
        .and_then(|t| Some((t, find_header(t, &GRPC_STATUS)?)))
    {
        Some((t, v)) => (t, Some(v)),
        None => (&parts.headers, find_header(&parts.headers, &GRPC_STATUS)),
    };
    let code = code_v.map_or(Code::Internal, |v| Code::from_header(v.as_bytes()));
    if code != Code::Ok {
        let msg = src
            .get(&GRPC_MESSAGE)
            .map(|m| status::decode_message(m.as_bytes()))
            .unwrap_or_default();
        return Ok(grpc_failure(code, &msg));
    }
    let body = collected.to_bytes();
    let frame_error = |e: frame::FrameError| match e {
        frame::FrameError::TooLarge { .. } | frame::FrameError::InflatedTooLarge { .. } => {
            CallError::new(
                CallErrorKind::BodyTooLarge,
                format!("answer message larger than max_message_bytes ({max_message})"),
            )
        }
        e => CallError::new(CallErrorKind::Reset, format!("invalid gRPC answer: {e}")),
    };
    let answer = frame::decode_unary_frame(&body, max_message).map_err(frame_error)?;
    let message = if answer.compressed {
        let encoding = find_header(&parts.headers, &GRPC_ENCODING).map(|v| v.as_bytes());
        match fanout_grpc::compression::Encoding::from_header(encoding) {
            Ok(fanout_grpc::compression::Encoding::Gzip) => inflate(answer.message, max_message)
                .await
                .map_err(frame_error)?,
            Ok(fanout_grpc::compression::Encoding::Identity) => {
                return Err(frame_error(frame::FrameError::Compressed));
            }
            Err(e) => {
                return Err(CallError::new(
                    CallErrorKind::Reset,
                    format!("invalid gRPC answer: a compressed message with {e}"),
                ));
            }
        }
    } else {
        answer.message
    };
    Ok(CallResponse {
        status: http::StatusCode::OK,
        body: message,
        value: None,
        parsed: None,
    })
}

/// A gzip answer message inflated within `limit`: the first [`OFFLOAD_BYTES`] here, the rest
/// (a large message, or a bomb on its way to the limit) on the blocking pool.
async fn inflate(compressed: Bytes, limit: usize) -> Result<Bytes, fanout_grpc::FrameError> {
    let mut g = fanout_grpc::compression::Gunzip::new(compressed, limit);
    if !g.step(OFFLOAD_BYTES)? {
        g = tokio::task::spawn_blocking(move || g.step(usize::MAX).map(|_| g))
            .await
            .map_err(|e| fanout_grpc::FrameError::BadCompression(e.to_string()))??;
    }
    Ok(g.into_message())
}

/// A gRPC failure as a call answer: the code's HTTP status, and a body for the log.
fn grpc_failure(code: fanout_grpc::Code, message: &str) -> CallResponse {
    let mut text = format!("grpc-status {} ({})", code.as_i32(), code.name());
    if !message.is_empty() {
        text.push_str(": ");
        text.push_str(message);
    }
    CallResponse {
        status: code.http_status(),
        body: Bytes::from(text),
        value: None,
        parsed: None,
    }
}

impl Backend for HttpBackend {
    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let fanout_layers::backend::Call::Http(http_call) = req.call else {
            // The flow compiler pairs step kinds with protocols: a SQL call never gets here.
            let e = CallError::new(
                CallErrorKind::Invalid,
                "an HTTP backend was given a SQL call",
            );
            return Box::pin(async move { Err(e) });
        };
        let started = Instant::now();
        let (pick, default_rtt) = {
            let mut b = self.balancer.lock().unwrap_or_else(|e| e.into_inner());
            (b.pick(started, &mut rand::rng()), b.policy().default_rtt)
        };
        let mut claim = pick.map(|pick| Claim {
            balancer: self.balancer.clone(),
            pick,
            started,
            timeout: req.timeout,
            default_rtt,
            done: false,
        });
        let base = pick.and_then(|p| self.bases.get(p.index));
        let uri = match base {
            Some(b) => b.uri(http_call.path_and_query),
            None => Err((String::new(), "no address".into())),
        };
        // Traced calls: a span per attempt, its context sent to the backend.
        // Counted calls: the attempt counted, nothing else.
        let span = req.trace.as_ref().and_then(|t| {
            t.sent(|| base.map_or(String::new(), |b| format!("{}{}", b.origin, b.path)))
        });
        let timeout = req.timeout;
        let grpc = self.grpc;
        let method = if grpc.is_some() {
            http::Method::POST
        } else {
            http_call.method
        };
        let h1 = base.and_then(|b| b.h1.clone()).filter(|_| grpc.is_none());
        // A gRPC message to compress: compressed by the exchange (maybe off the worker).
        let (body, gzip) = match grpc {
            Some(g) if g.gzip => (Bytes::new(), Some(http_call.body)),
            _ => (http_call.body, None),
        };
        let (request, uri) = match uri {
            Ok(u) => {
                // Made in place (a `Request::builder()` chain moves the request's parts at
                // every step).
                let mut r = Request::new(if grpc.is_some() {
                    CallBody::without_length(body)
                } else {
                    CallBody::new(body)
                });
                *r.method_mut() = method;
                *r.uri_mut() = match h1 {
                    Some(_) => origin_form(&u),
                    None => u.clone(),
                };
                let h = r.headers_mut();
                for (k, v) in &self.headers {
                    h.insert(k.clone(), v.clone());
                }
                if !http_call.headers.is_empty() {
                    h.extend(http_call.headers);
                }
                if let Some(basic) = base.and_then(|b| b.basic.as_ref())
                    && !h.contains_key(http::header::AUTHORIZATION)
                {
                    h.insert(http::header::AUTHORIZATION, basic.clone());
                }
                if let Some(span) = &span {
                    span.inject(h);
                }
                // `accept_encoding`: compressed answers asked for (decoded by `decode.rs`).
                if let Some(v) = self.accept_encoding.as_ref().filter(|_| grpc.is_none())
                    && !h.contains_key(http::header::ACCEPT_ENCODING)
                {
                    h.insert(http::header::ACCEPT_ENCODING, v.clone());
                }
                if grpc.is_some() {
                    h.insert(
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static(fanout_grpc::CONTENT_TYPE),
                    );
                    h.insert(http::header::TE, HeaderValue::from_static("trailers"));
                    h.insert(
                        GRPC_ACCEPT_ENCODING,
                        HeaderValue::from_static(fanout_grpc::compression::ACCEPT_ENCODING),
                    );
                    if let Ok(v) = HeaderValue::from_str(&fanout_grpc::timeout::format(timeout)) {
                        h.insert(GRPC_TIMEOUT, v);
                    }
                }
                // The time this attempt may take, for the backend to stop early (written here,
                // by the transport, so it is never part of a call's identity).
                if let Some(name) = self.deadline_header.as_ref().filter(|_| grpc.is_none()) {
                    let ms = timeout.as_millis().clamp(1, u64::MAX as u128) as u64;
                    h.insert(name.clone(), http::HeaderValue::from(ms));
                }
                // HTTP/1: the `Host` header made once per address (hyper's client would format
                // it for every request that lacks one).
                if self.http1
                    && let Some(host) = base.and_then(|b| b.host.as_ref())
                    && !h.contains_key(http::header::HOST)
                {
                    h.insert(http::header::HOST, host.clone());
                }
                (r, u)
            }
            Err((uri, e)) => {
                // Not a valid request (the URI is too long, …): never sent, the fault of the flow
                // that built it — not the address's, nor the backend's.
                if let Some(c) = &mut claim {
                    c.finish(Outcome::Cancelled);
                }
                let e = CallError::new(
                    CallErrorKind::Invalid,
                    format!("invalid request to `{}`: {e}", cut(&uri, 200)),
                );
                if let Some(span) = span {
                    span.end(Err(&e));
                }
                return Box::pin(async move { Err(e) });
            }
        };
        let limit = self.max_response_bytes;
        // How the call ended, for the span and the balancer (a call dropped before it ends is
        // reported by `Claim`'s drop).
        let done = move |result: Result<CallResponse, CallError>| {
            if let Some(span) = span {
                span.end(result.as_ref().map(|r| r.status));
            }
            if let Some(mut claim) = claim {
                let outcome = match CallOutcome::of(&result) {
                    // A budget used up elsewhere: not the address's fault.
                    CallOutcome::Failed(CallErrorKind::Timeout)
                        if !blamable(timeout, default_rtt) =>
                    {
                        Outcome::Cancelled
                    }
                    o if o.blames_address() => Outcome::Failure,
                    // Never reached an address.
                    o if o.never_sent() => Outcome::Cancelled,
                    // The address answered (a too-large answer is the answer's problem).
                    _ => Outcome::Success,
                };
                claim.finish(outcome);
            }
            result
        };
        // The exchange's future is made inside the boxed one (not made here and moved in).
        match h1 {
            Some(pool) => fanout_layers::boxed::pinned(|| async move {
                done(exchange_h1(pool, request, uri, limit).await)
            }),
            None => {
                let cores = self.clients.len().saturating_sub(1);
                let client = match fanout_runtime::cores::shard(cores) {
                    Some(i) => self.clients.get(i),
                    None => self.clients.last(),
                };
                let Some(client) = client.cloned() else {
                    return fanout_layers::boxed::pinned(|| async move {
                        done(Err(CallError::new(
                            CallErrorKind::Connect,
                            "no client for this backend",
                        )))
                    });
                };
                fanout_layers::boxed::pinned(|| async move {
                    done(exchange(client, request, uri, limit, grpc, gzip).await)
                })
            }
        }
    }

    fn open(&self, req: StreamRequest) -> BoxFuture<'static, Result<StreamResponse, CallError>> {
        self.open_stream(req)
    }
}

impl HttpBackend {
    /// A streamed call ([`Backend::open`]; pass-through routes): the address chosen by the
    /// balancer as for any call, the request sent with the headers it carries plus the
    /// backend's own (`headers:`, the URL's userinfo, `Host` on HTTP/1), its body taken frame by
    /// frame as the connection can take it, and the answer returned once its head has arrived,
    /// the body unread. Nothing is added or decoded: no `Accept-Encoding`, no deadline header,
    /// no gRPC framing (a `protocol: grpc` backend is HTTP/2 here). The balancer hears how the
    /// call ended at the head (a 5xx or no answer is a failure of the address). An HTTP/1
    /// connection of fanout's pool goes back to it once both bodies went to their end.
    fn open_stream(
        &self,
        req: StreamRequest,
    ) -> BoxFuture<'static, Result<StreamResponse, CallError>> {
        let started = Instant::now();
        let (pick, default_rtt) = {
            let mut b = self.balancer.lock().unwrap_or_else(|e| e.into_inner());
            (b.pick(started, &mut rand::rng()), b.policy().default_rtt)
        };
        let mut claim = pick.map(|pick| Claim {
            balancer: self.balancer.clone(),
            pick,
            started,
            timeout: req.timeout,
            default_rtt,
            done: false,
        });
        let base = pick.and_then(|p| self.bases.get(p.index));
        let uri = match base {
            Some(b) => b.uri(req.path_and_query.clone()),
            None => Err((String::new(), "no address".into())),
        };
        let span = req.trace.as_ref().and_then(|t| {
            t.sent(|| base.map_or(String::new(), |b| format!("{}{}", b.origin, b.path)))
        });
        let h1 = base.and_then(|b| b.h1.clone());
        let uri = match uri {
            Ok(u) => u,
            Err((uri, e)) => {
                if let Some(c) = &mut claim {
                    c.finish(Outcome::Cancelled);
                }
                let e = CallError::new(
                    CallErrorKind::Invalid,
                    format!("invalid request to `{}`: {e}", cut(&uri, 200)),
                );
                if let Some(span) = span {
                    span.end(Err(&e));
                }
                return Box::pin(async move { Err(e) });
            }
        };
        let sent = req.body.clone();
        let mut r = Request::new(CallBody::Stream(req.body.sender()));
        *r.method_mut() = req.method;
        *r.uri_mut() = match h1 {
            Some(_) => origin_form(&uri),
            None => uri.clone(),
        };
        *r.headers_mut() = req.headers;
        let h = r.headers_mut();
        for (k, v) in &self.headers {
            h.insert(k.clone(), v.clone());
        }
        if let Some(basic) = base.and_then(|b| b.basic.as_ref())
            && !h.contains_key(http::header::AUTHORIZATION)
        {
            h.insert(http::header::AUTHORIZATION, basic.clone());
        }
        if let Some(span) = &span {
            span.inject(h);
        }
        if self.http1
            && let Some(host) = base.and_then(|b| b.host.as_ref())
            && !h.contains_key(http::header::HOST)
        {
            h.insert(http::header::HOST, host.clone());
        }
        let timeout = req.timeout;
        let done = move |result: Result<StreamResponse, CallError>| {
            if let Some(span) = span {
                span.end(result.as_ref().map(|r| r.status));
            }
            if let Some(mut claim) = claim {
                let outcome = match CallOutcome::of_stream(&result) {
                    CallOutcome::Failed(CallErrorKind::Timeout)
                        if !blamable(timeout, default_rtt) =>
                    {
                        Outcome::Cancelled
                    }
                    o if o.blames_address() => Outcome::Failure,
                    o if o.never_sent() => Outcome::Cancelled,
                    _ => Outcome::Success,
                };
                claim.finish(outcome);
            }
            result
        };
        match h1 {
            Some(pool) => Box::pin(async move {
                let result = match pool.send(r).await {
                    Ok((resp, conn)) => {
                        let (parts, body) = resp.into_parts();
                        Ok(StreamResponse {
                            status: parts.status,
                            version: parts.version,
                            headers: parts.headers,
                            body: UnsyncBoxBody::new(Pooled {
                                inner: body,
                                back: Some((pool, conn)),
                                sent,
                            }),
                        })
                    }
                    Err(e) => {
                        let kind = if e.is_connect() {
                            CallErrorKind::Connect
                        } else {
                            CallErrorKind::Reset
                        };
                        Err(CallError::new(kind, format!("{uri}: {}", describe(&e))).with_source(e))
                    }
                };
                done(result)
            }),
            None => {
                let cores = self.clients.len().saturating_sub(1);
                let client = match fanout_runtime::cores::shard(cores) {
                    Some(i) => self.clients.get(i),
                    None => self.clients.last(),
                }
                .cloned();
                Box::pin(async move {
                    let Some(client) = client else {
                        return done(Err(CallError::new(
                            CallErrorKind::Connect,
                            "no client for this backend",
                        )));
                    };
                    let result = match client.request(r).await {
                        Ok(resp) => {
                            let (parts, body) = resp.into_parts();
                            Ok(StreamResponse {
                                status: parts.status,
                                version: parts.version,
                                headers: parts.headers,
                                body: UnsyncBoxBody::new(body.map_err(BoxError::from)),
                            })
                        }
                        Err(e) => Err(CallError::new(
                            classify(&e),
                            format!("{uri}: {}", describe(&e)),
                        )
                        .with_source(e)),
                    };
                    done(result)
                })
            }
        }
    }
}

/// The answer body of a streamed call on fanout's HTTP/1 pool: its connection goes back to the
/// pool when the answer ends and the request's body went to its end (a connection still
/// sending a body is not reusable; it is closed with this body when either stops early). The
/// end is seen either as the body's last poll or, when the body is dropped, as its
/// `is_end_stream` — hyper's server stops polling an answer whose `Content-Length` it has
/// written, so without the second a pass-through call answered with a length never gave its
/// connection back and every such call opened a new one.
struct Pooled {
    inner: hyper::body::Incoming,
    back: Option<(Arc<H1Pool>, crate::h1pool::H1Conn)>,
    sent: fanout_layers::stream::BodySlot,
}

impl hyper::body::Body for Pooled {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match r {
            std::task::Poll::Ready(None) => {
                if let Some((pool, conn)) = this.back.take()
                    && this.sent.finished()
                {
                    pool.put(conn);
                }
                std::task::Poll::Ready(None)
            }
            std::task::Poll::Ready(Some(Err(e))) => {
                this.back = None;
                std::task::Poll::Ready(Some(Err(e.into())))
            }
            other => other.map(|f| f.map(|f| f.map_err(BoxError::from))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        // Read to its end but not polled past it (a `Content-Length` answer): reusable.
        if let Some((pool, conn)) = self.back.take()
            && hyper::body::Body::is_end_stream(&self.inner)
            && self.sent.finished()
        {
            pool.put(conn);
        }
    }
}

/// The HTTP protocol (HTTP/1.1, HTTP/2 and gRPC): its line in `fanout-proxy`'s `PROTOCOLS`.
pub const PROTOCOL: fanout_protocol::Registration = fanout_protocol::Registration {
    serves: Protocol::is_http,
    build: |name, b, shared| {
        let client = HttpBackend::new(name, b, shared.defaults)?;
        Ok(Arc::new(
            client.with_deadline_header(shared.deadline_header.clone()),
        ))
    },
    // Its families (in flight, addresses up, ejections) come from `addresses()`, written for
    // every protocol by the backend metrics.
    metrics: |_, _| Ok(()),
};

impl fanout_protocol::ProtocolClient for HttpBackend {
    fn service(self: Arc<Self>) -> Arc<dyn Backend> {
        self
    }

    fn status_json(&self) -> serde_json::Value {
        HttpBackend::status_json(self)
    }

    fn addresses(&self) -> Vec<AddressStatus> {
        HttpBackend::addresses(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
