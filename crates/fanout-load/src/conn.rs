//! Target resolution, prepared requests, HTTP/1.1 and HTTP/2 connections, error classes.
//!
//! Connections use hyper's low-level `client::conn` handshakes so the generator knows exactly
//! when a connection is opened and closed. HTTP/1.1: each worker owns one connection (one
//! request in flight). HTTP/2: workers lease a shared connection from [`H2Pool`], up to
//! [`H2_STREAMS_PER_CONN`] workers per connection.

use crate::recorder::Outcome;
use crate::{LoadError, Protocol, RequestTemplate, TlsOptions};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue, TE};
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::Full;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::net::TcpStream;

/// Workers (concurrent streams) sharing one HTTP/2 connection.
pub(crate) const H2_STREAMS_PER_CONN: usize = 100;

/// The request body type.
pub(crate) type Body = Full<Bytes>;

/// Where to connect and how to address requests.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub addr: SocketAddr,
    pub authority: String,
    pub base_path: String,
    /// `https://`: the TLS clients (ALPN `http/1.1`, ALPN `h2`) and the server name.
    pub tls: Option<Arc<TlsDial>>,
}

/// TLS towards an `https://` target.
pub(crate) struct TlsDial {
    h1: tokio_rustls::TlsConnector,
    h2: tokio_rustls::TlsConnector,
    name: rustls_pki_types::ServerName<'static>,
}

impl std::fmt::Debug for TlsDial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsDial").field("name", &self.name).finish()
    }
}

impl TlsDial {
    fn new(host: &str, opts: &TlsOptions) -> Result<TlsDial, String> {
        use rustls_pki_types::pem::PemObject;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let config = if opts.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
                .with_no_client_auth()
        } else {
            let mut roots = rustls::RootCertStore::empty();
            match &opts.cacert {
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| format!("--cacert {path}: {e}"))?;
                    for c in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
                        let c = c.map_err(|e| format!("--cacert {path}: {e}"))?;
                        roots.add(c).map_err(|e| format!("--cacert {path}: {e}"))?;
                    }
                }
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        let with_alpn = |alpn: &[u8]| {
            let mut c = config.clone();
            c.alpn_protocols = vec![alpn.to_vec()];
            tokio_rustls::TlsConnector::from(Arc::new(c))
        };
        Ok(TlsDial {
            h1: with_alpn(b"http/1.1"),
            h2: with_alpn(b"h2"),
            name: rustls_pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| e.to_string())?,
        })
    }
}

/// `--insecure`: every certificate accepted (signatures still checked by the provider).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls_pki_types::UnixTime,
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

impl Target {
    /// Parse and resolve `http://host:port[/base]` or `https://…`.
    pub async fn resolve(target: &str, tls: &TlsOptions) -> Result<Target, LoadError> {
        let bad = |reason: &str| LoadError::Target {
            target: target.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = target
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(bad(&format!("unsupported scheme `{other}`"))),
            None => {
                return Err(bad(
                    "expected an absolute URL such as http://127.0.0.1:8080",
                ));
            }
        };
        let auth = uri
            .authority()
            .ok_or_else(|| bad("missing host (expected http://host:port)"))?;
        let port = auth.port_u16().unwrap_or(if https { 443 } else { 80 });
        let host = auth.host();
        let authority = auth.as_str().to_string();
        let lookup_host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = tokio::net::lookup_host((lookup_host, port))
            .await
            .map_err(|source| LoadError::Resolve {
                authority: authority.clone(),
                source,
            })?
            .next()
            .ok_or_else(|| LoadError::Resolve {
                authority: authority.clone(),
                source: io::Error::new(io::ErrorKind::NotFound, "no addresses"),
            })?;
        let base_path = uri.path().trim_end_matches('/').to_string();
        if uri.query().is_some() {
            return Err(bad(
                "the target must not have a query; put it in the request path",
            ));
        }
        let tls = match https {
            true => Some(Arc::new(
                TlsDial::new(lookup_host, tls).map_err(|e| bad(&e))?,
            )),
            false => None,
        };
        Ok(Target {
            addr,
            authority,
            base_path,
            tls,
        })
    }
}

/// A request template checked and turned into hyper parts once, cloned per request.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl Prepared {
    pub fn new(
        index: usize,
        t: &RequestTemplate,
        target: &Target,
        protocol: Protocol,
    ) -> Result<Prepared, LoadError> {
        let bad = |reason: String| LoadError::Request { index, reason };
        let path = if t.path.is_empty() {
            "/".to_string()
        } else if t.path.starts_with('/') {
            t.path.clone()
        } else {
            format!("/{}", t.path)
        };
        let full_path = format!("{}{}", target.base_path, path);
        let uri_text = match protocol {
            Protocol::Http1 => full_path,
            Protocol::Http2 | Protocol::Grpc => {
                let scheme = if target.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}{}", target.authority, full_path)
            }
        };
        let uri: Uri = uri_text
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(format!("invalid path `{}`: {e}", t.path)))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &t.headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| bad(format!("invalid header name `{name}`")))?;
            let v = HeaderValue::from_str(value)
                .map_err(|_| bad(format!("invalid value for header `{name}`")))?;
            headers.append(n, v);
        }
        match protocol {
            Protocol::Http1 => {
                if headers
                    .get(CONTENT_TYPE)
                    .is_some_and(|v| fanout_grpc::looks_like_grpc(v.as_bytes()))
                {
                    return Err(bad(
                        "a gRPC request needs HTTP/2: send it with protocol grpc".into(),
                    ));
                }
                if !headers.contains_key(HOST) {
                    let v = HeaderValue::from_str(&target.authority)
                        .map_err(|_| bad("target authority is not a valid Host header".into()))?;
                    headers.insert(HOST, v);
                }
            }
            // HTTP/2 carries the authority in `:authority`.
            Protocol::Http2 => {
                headers.remove(HOST);
            }
            Protocol::Grpc => {
                headers.remove(HOST);
                if !headers.contains_key(CONTENT_TYPE) {
                    headers.insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static(fanout_grpc::CONTENT_TYPE),
                    );
                }
                if !headers.contains_key(TE) {
                    headers.insert(TE, HeaderValue::from_static("trailers"));
                }
            }
        }
        Ok(Prepared {
            method: t.method.clone(),
            uri,
            headers,
            body: t.body.clone(),
        })
    }

    pub fn build(&self) -> Request<Body> {
        let mut req = Request::new(Full::new(self.body.clone()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        req
    }
}

/// Connection counters shared by all connections of a run.
#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    pub opened: AtomicU64,
    pub open: AtomicUsize,
    pub max_open: AtomicUsize,
}

impl ConnCounters {
    fn opened(self: &Arc<Self>) -> OpenGuard {
        self.opened.fetch_add(1, Ordering::Relaxed);
        let now = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_open.fetch_max(now, Ordering::Relaxed);
        OpenGuard(self.clone())
    }
}

/// Decrements the open-connection gauge when the connection task ends (or is aborted).
pub(crate) struct OpenGuard(Arc<ConnCounters>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection driver future, to be spawned by the caller together with its guard.
pub(crate) type Driver = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

async fn tcp(addr: SocketAddr) -> Result<TcpStream, Outcome> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| classify_connect(&e))?;
    // Nagle would add up to 40 ms to small requests; failure to disable it is harmless.
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// The TLS handshake over `stream` (ALPN as `connector` offers).
async fn tls(
    connector: &tokio_rustls::TlsConnector,
    name: &rustls_pki_types::ServerName<'static>,
    stream: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Outcome> {
    connector
        .connect(name.clone(), stream)
        .await
        .map_err(|e| classify_connect(&e))
}

/// Open an HTTP/1.1 connection (over TLS for `https://`); returns the sender and the driver
/// to spawn.
pub(crate) async fn connect_h1(
    target: &Target,
    counters: &Arc<ConnCounters>,
) -> Result<(http1::SendRequest<Body>, Driver), Outcome> {
    let stream = tcp(target.addr).await?;
    if let Some(t) = &target.tls {
        let stream = tls(&t.h1, &t.name, stream).await?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| classify(&e))?;
        let guard = counters.opened();
        let driver: Driver = Box::pin(async move {
            let _guard = guard;
            let _ = conn.await;
        });
        return Ok((sender, driver));
    }
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| classify(&e))?;
    let guard = counters.opened();
    let driver: Driver = Box::pin(async move {
        let _guard = guard;
        // The connection ends with an error when the peer resets it; the worker sees the
        // same error on its request and classifies it there.
        let _ = conn.await;
    });
    Ok((sender, driver))
}

/// Open an HTTP/2 connection (h2c with prior knowledge, or h2 by ALPN over TLS for
/// `https://`); returns the sender and the driver.
pub(crate) async fn connect_h2(
    target: &Target,
    counters: &Arc<ConnCounters>,
) -> Result<(http2::SendRequest<Body>, Driver), Outcome> {
    let stream = tcp(target.addr).await?;
    if let Some(t) = &target.tls {
        let stream = tls(&t.h2, &t.name, stream).await?;
        let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| classify(&e))?;
        let guard = counters.opened();
        let driver: Driver = Box::pin(async move {
            let _guard = guard;
            let _ = conn.await;
        });
        return Ok((sender, driver));
    }
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .map_err(|e| classify(&e))?;
    let guard = counters.opened();
    let driver: Driver = Box::pin(async move {
        let _guard = guard;
        let _ = conn.await;
    });
    Ok((sender, driver))
}

/// A shared HTTP/2 connection and the number of workers leasing it.
pub(crate) struct H2Conn {
    sender: http2::SendRequest<Body>,
    leases: AtomicUsize,
}

/// A worker's lease on an HTTP/2 connection (released on drop).
pub(crate) struct H2Lease {
    conn: Arc<H2Conn>,
    pub sender: http2::SendRequest<Body>,
}

impl H2Lease {
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

impl Drop for H2Lease {
    fn drop(&mut self) {
        self.conn.leases.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The HTTP/2 connections of a run.
#[derive(Default)]
pub(crate) struct H2Pool {
    conns: tokio::sync::Mutex<Vec<Arc<H2Conn>>>,
    /// Connections opened before the run ([`LoadSpec::open_connections`](crate::LoadSpec)),
    /// taken in turn by every request.
    fixed: std::sync::OnceLock<Vec<Arc<H2Conn>>>,
    next: AtomicUsize,
}

impl H2Pool {
    /// Lease the least-loaded open connection with room for another stream, opening a new one
    /// (up to `max_conns`) when all are full. Connecting happens under the pool lock, so a
    /// burst of workers opens one connection, not one each.
    pub async fn lease(
        &self,
        target: &Target,
        max_conns: usize,
        counters: &Arc<ConnCounters>,
        spawn: impl FnOnce(Driver),
    ) -> Result<H2Lease, Outcome> {
        let mut conns = self.conns.lock().await;
        conns.retain(|c| !c.sender.is_closed());
        let best = conns
            .iter()
            .min_by_key(|c| c.leases.load(Ordering::Relaxed))
            .cloned();
        let chosen = match best {
            Some(c)
                if c.leases.load(Ordering::Relaxed) < H2_STREAMS_PER_CONN
                    || conns.len() >= max_conns =>
            {
                c
            }
            _ => {
                let (sender, driver) = connect_h2(target, counters).await?;
                spawn(driver);
                let c = Arc::new(H2Conn {
                    sender,
                    leases: AtomicUsize::new(0),
                });
                conns.push(c.clone());
                c
            }
        };
        chosen.leases.fetch_add(1, Ordering::Relaxed);
        Ok(H2Lease {
            sender: chosen.sender.clone(),
            conn: chosen,
        })
    }

    /// Install the connections opened before the run; every request then takes the next one in
    /// turn ([`H2Pool::round_robin`]). Called once, before any request.
    pub fn set_fixed(&self, senders: Vec<http2::SendRequest<Body>>) {
        let conns = senders
            .into_iter()
            .map(|sender| {
                Arc::new(H2Conn {
                    sender,
                    leases: AtomicUsize::new(0),
                })
            })
            .collect();
        let _ = self.fixed.set(conns);
    }

    /// The next open pre-opened connection in turn (skipping closed ones); `None` without
    /// pre-opened connections or when all of them closed (the caller then leases on demand).
    pub fn round_robin(&self) -> Option<H2Lease> {
        let fixed = self.fixed.get()?;
        for _ in 0..fixed.len() {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % fixed.len();
            let c = &fixed[i];
            if !c.sender.is_closed() {
                c.leases.fetch_add(1, Ordering::Relaxed);
                return Some(H2Lease {
                    sender: c.sender.clone(),
                    conn: c.clone(),
                });
            }
        }
        None
    }

    /// Forget every connection (their drivers are aborted separately).
    pub async fn clear(&self) {
        self.conns.lock().await.clear();
    }
}

/// Classify a failed TCP connect.
pub(crate) fn classify_connect(e: &io::Error) -> Outcome {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Outcome::ConnectRefused,
        io::ErrorKind::TimedOut => Outcome::ConnectTimeout,
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Outcome::Reset,
        _ => Outcome::Other,
    }
}

fn classify_io(e: &io::Error) -> Option<Outcome> {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Some(Outcome::Reset),
        io::ErrorKind::ConnectionRefused => Some(Outcome::ConnectRefused),
        io::ErrorKind::TimedOut => Some(Outcome::Timeout),
        _ => None,
    }
}

/// Classify a hyper error by walking its source chain: io errors (reset, broken pipe…),
/// HTTP/2 stream resets and GOAWAY, and hyper's own "incomplete message"/"closed" kinds are
/// `Reset`; everything else is `Other`.
pub(crate) fn classify(e: &hyper::Error) -> Outcome {
    let mut src: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<io::Error>()
            && let Some(o) = classify_io(io)
        {
            return o;
        }
        if let Some(h2e) = s.downcast_ref::<h2::Error>() {
            if let Some(o) = h2e.get_io().and_then(classify_io) {
                return o;
            }
            if h2e.is_reset() || h2e.is_go_away() {
                return Outcome::Reset;
            }
        }
        src = s.source();
    }
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return Outcome::Reset;
    }
    Outcome::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn targets() {
        let t = match Target::resolve("http://127.0.0.1:8080/api/", &TlsOptions::default()).await {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(t.addr.port(), 8080);
        assert_eq!(t.base_path, "/api");
        assert_eq!(t.authority, "127.0.0.1:8080");
        for (bad, msg) in [
            ("127.0.0.1:80", "expected an absolute URL"),
            ("ftp://x", "unsupported scheme"),
            ("http://127.0.0.1:1/?q=1", "must not have a query"),
        ] {
            match Target::resolve(bad, &TlsOptions::default()).await {
                Ok(t) => panic!("{bad} → {t:?}"),
                Err(e) => assert!(e.to_string().contains(msg), "{bad}: {e}"),
            }
        }
        let p = match Prepared::new(0, &RequestTemplate::get("x?y=1"), &t, Protocol::Http1) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let req = p.build();
        assert_eq!(req.uri(), "/api/x?y=1");
        assert_eq!(req.headers()[HOST], "127.0.0.1:8080");
        let p2 = match Prepared::new(0, &RequestTemplate::get("/x"), &t, Protocol::Http2) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(p2.build().uri(), "http://127.0.0.1:8080/api/x");
        let mut g = RequestTemplate::get("/pkg.Svc/M");
        g.method = Method::POST;
        let pg = match Prepared::new(0, &g, &t, Protocol::Grpc) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let req = pg.build();
        assert_eq!(req.uri(), "http://127.0.0.1:8080/api/pkg.Svc/M");
        assert_eq!(req.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(req.headers()[TE], "trailers");
        assert!(!req.headers().contains_key(HOST));
        g.headers
            .push(("content-type".into(), "application/grpc".into()));
        match Prepared::new(1, &g, &t, Protocol::Http1) {
            Ok(_) => panic!("gRPC over HTTP/1.1 accepted"),
            Err(e) => assert!(e.to_string().contains("protocol grpc"), "{e}"),
        }
        let mut bad = RequestTemplate::get("/");
        bad.headers.push(("bad header".into(), "v".into()));
        match Prepared::new(3, &bad, &t, Protocol::Http1) {
            Ok(_) => panic!("bad header accepted"),
            Err(e) => assert!(e.to_string().contains("request #3: invalid header name")),
        }
    }
}
