//! TLS on a listener (`tls:`, `admin.tls`): the acceptor, the certificates it presents, their
//! reload, and the client's identity.
//!
//! - **Certificates** ([`CertStore`]): one slot per configured pair, each an `ArcSwap` of the
//!   loaded `CertifiedKey`. The resolver picks the slot whose names match the SNI (exact, then
//!   `*.domain` wildcards), else the first one (or refuses, `unknown_sni: refuse`).
//! - **Reload** ([`TlsListener::watch`]): the directories of the files are watched (a Kubernetes
//!   Secret is updated by swapping its `..data` symlink, which no watch on the file itself sees)
//!   and the files are also read every `poll` (lost events). A pair whose content changed is
//!   loaded, its key checked against its certificate and the certificate against its validity
//!   window, and only then swapped in; a pair that fails is refused, logged and counted, and the
//!   old one keeps serving. A changed client CA builds a new `ServerConfig` (taken per accept).
//!   Open connections are never touched.
//! - **Handshake** ([`TlsListener::accept`]): TLS 1.2/1.3, ALPN `h2` and `http/1.1`, session
//!   resumption (rotating ticket keys, in-memory session cache), under the connection's limits
//!   (`conn::setup`: its own timeout, the cap, shutdown).
//! - **Resumption and client certificates**: a resumed session carries the client certificate
//!   verified at its full handshake, maybe under a client CA since replaced, maybe since
//!   expired. rustls does not verify it again, so [`recheck`] does, after the handshake, with
//!   the client verifier of now and the time now; a chain that fails closes the connection
//!   before any request is read (counted as `client_certificate`).
//! - **Identity** ([`TlsInfo`]): version, ALPN, SNI and the verified client certificate,
//!   computed once per connection and handed to each request as an `Arc` extension;
//!   `$request.tls` is made from it only when a route reads it.

use crate::conn::{ConnShared, Connections, Socket};
use arc_swap::ArcSwap;
use fanout_config::{ClientAuthMode, ConfigError, ListenerTls, Located, TlsVersion, UnknownSni};
use fanout_expr::Val;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// Largest certificate chain or key file read (1 MiB).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Events of the watched directories are gathered for this long before the files are read
/// (a Secret update is several events: the new directory, the `..data` swap, the removal).
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Why a certificate pair (or a CA file) could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind needed.
    #[error("`{path}`: {what}")]
    Pem {
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// The key does not belong to the certificate, or cannot be used.
    #[error("`{key}` is not the key of `{cert}`: {why}")]
    KeyMismatch {
        /// The certificate file.
        cert: String,
        /// The key file.
        key: String,
        /// rustls's word.
        why: String,
    },
    /// The certificate is not valid now.
    #[error("`{path}`: the certificate is {why}")]
    Validity {
        /// The file.
        path: String,
        /// `expired` / `not valid yet`.
        why: &'static str,
    },
    /// rustls refused the settings.
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

/// A loaded certificate pair.
struct Loaded {
    key: Arc<CertifiedKey>,
    /// DNS names (lower case; wildcards as `*.domain`).
    names: Vec<String>,
    not_after: i64,
}

/// One configured pair and what is loaded from it.
struct Slot {
    cert_file: String,
    key_file: String,
    current: ArcSwap<Loaded>,
    /// Digest of the contents last looked at (loaded or refused): a refused pair is not
    /// counted again until its files change.
    seen: AtomicU64,
    /// Digest of the contents loaded now (a file that was briefly unreadable and came back
    /// unchanged is not a reload).
    loaded: AtomicU64,
}

/// The certificates of a listener, chosen per handshake.
pub struct CertStore {
    slots: Vec<Slot>,
    unknown_sni: UnknownSni,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("certificates", &self.slots.len())
            .finish()
    }
}

impl CertStore {
    /// The slot whose names match `sni`: an exact name first, then a `*.domain` wildcard
    /// covering one label.
    fn find(&self, sni: &str) -> Option<Arc<CertifiedKey>> {
        let sni = sni.trim_end_matches('.').to_ascii_lowercase();
        let loaded: Vec<_> = self.slots.iter().map(|s| s.current.load()).collect();
        if let Some(l) = loaded.iter().find(|l| l.names.contains(&sni)) {
            return Some(l.key.clone());
        }
        let parent = sni.split_once('.').map(|(_, p)| p)?;
        loaded
            .iter()
            .find(|l| l.names.iter().any(|n| n.strip_prefix("*.") == Some(parent)))
            .map(|l| l.key.clone())
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(found) = hello.server_name().and_then(|s| self.find(s)) {
            return Some(found);
        }
        match self.unknown_sni {
            UnknownSni::Default => self.slots.first().map(|s| s.current.load().key.clone()),
            UnknownSni::Refuse => None,
        }
    }
}

/// Reload and handshake counters of a listener.
#[derive(Default)]
struct Counters {
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    handshakes: AtomicU64,
    failures: [AtomicU64; FAILURE_REASONS.len()],
    last_error: Mutex<Option<String>>,
}

/// The reasons a handshake fails, as the metric labels them.
pub const FAILURE_REASONS: [&str; 6] = [
    "timeout",
    "protocol_version",
    "no_certificate",
    "client_certificate",
    "closed",
    "other",
];

/// The `ServerConfig` new handshakes take and the client verifier it was built with (`None`
/// without `client_auth`), which also checks resumed sessions again ([`recheck`]).
struct Server {
    config: Arc<rustls::ServerConfig>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
}

/// TLS on one listener: its settings, certificates, `ServerConfig` and counters.
pub struct TlsListener {
    /// `main` or `admin` (the metrics' `listener` label).
    pub name: &'static str,
    cfg: ListenerTls,
    certs: Arc<CertStore>,
    server: ArcSwap<Server>,
    /// Digest of the client CA file last looked at.
    ca_seen: AtomicU64,
    ticketer: Arc<dyn rustls::server::ProducesTickets>,
    sessions: Arc<dyn rustls::server::StoresServerSessions>,
    counters: Counters,
    watching: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What a connection's handshake told: `$request.tls`.
#[derive(Debug)]
pub struct TlsInfo(serde_json::Value);

/// `$request.tls` of a request: its connection's [`TlsInfo`], `null` on a plain connection.
pub fn request_tls(parts: &http::request::Parts) -> Val {
    parts
        .extensions
        .get::<std::sync::Arc<TlsInfo>>()
        .map_or(Val::Null, |t| t.val())
}

impl TlsInfo {
    /// `$request.tls` (made per request that reads it).
    pub fn val(&self) -> Val {
        fanout_expr::json::from_serde(&self.0)
    }

    /// The verified client's subject, for the access log.
    pub fn client_subject(&self) -> Option<&str> {
        self.0.get("client")?.get("subject")?.as_str()
    }
}

fn config_error(path: &Located<String>, at: &str, e: TlsError) -> ConfigError {
    ConfigError::at(path.pos, format!("{at}: {e}"))
}

fn digest(parts: &[&[u8]]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

fn read(path: &str) -> Result<Vec<u8>, TlsError> {
    fanout_config::read_limited(path, MAX_PEM_BYTES).map_err(|source| TlsError::Read {
        path: path.to_string(),
        source,
    })
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Load a pair from the file contents: the chain, the key, the key checked against the first
/// certificate, the certificate inside its validity window.
fn load_pair(cert_file: &str, key_file: &str, cert: &[u8], key: &[u8]) -> Result<Loaded, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_file.to_string(),
            what: format!("bad PEM: {e}"),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::Pem {
            path: cert_file.to_string(),
            what: "no certificate (`-----BEGIN CERTIFICATE-----`) in the file".into(),
        });
    };
    let pem_key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem {
        path: key_file.to_string(),
        what: format!("no private key: {e}"),
    })?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| TlsError::Pem {
            path: cert_file.to_string(),
            what: format!("unreadable certificate: {e}"),
        })?;
    let now = now_unix();
    let validity = parsed.validity();
    if validity.not_after.timestamp() < now {
        return Err(TlsError::Validity {
            path: cert_file.to_string(),
            why: "expired",
        });
    }
    if validity.not_before.timestamp() > now {
        return Err(TlsError::Validity {
            path: cert_file.to_string(),
            why: "not valid yet",
        });
    }
    let mut names = Vec::new();
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push(d.trim_end_matches('.').to_ascii_lowercase());
            }
        }
    }
    let not_after = validity.not_after.timestamp();
    let provider = rustls::crypto::ring::default_provider();
    let mismatch = |why: String| TlsError::KeyMismatch {
        cert: cert_file.to_string(),
        key: key_file.to_string(),
        why,
    };
    let signing = provider
        .key_provider
        .load_private_key(pem_key)
        .map_err(|e| mismatch(e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| mismatch(e.to_string()))?;
    Ok(Loaded {
        key: Arc::new(certified),
        names,
        not_after,
    })
}

/// The client CA roots.
fn load_roots(path: &str, pem: &[u8]) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| TlsError::Pem {
            path: path.to_string(),
            what: format!("bad PEM: {e}"),
        })?;
        roots.add(c).map_err(|e| TlsError::Pem {
            path: path.to_string(),
            what: format!("unusable CA certificate: {e}"),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_string(),
            what: "no CA certificate in the file".into(),
        });
    }
    Ok(roots)
}

impl TlsListener {
    /// Load the listener's files (errors name the file and its line in the config).
    pub fn new(name: &'static str, cfg: &ListenerTls) -> Result<TlsListener, ConfigError> {
        let at = if name == "admin" { "admin.tls" } else { "tls" };
        let mut slots = Vec::with_capacity(cfg.certificates.len());
        for pair in &cfg.certificates {
            let cert =
                read(&pair.cert_file.value).map_err(|e| config_error(&pair.cert_file, at, e))?;
            let key =
                read(&pair.key_file.value).map_err(|e| config_error(&pair.key_file, at, e))?;
            let loaded = load_pair(&pair.cert_file.value, &pair.key_file.value, &cert, &key)
                .map_err(|e| config_error(&pair.cert_file, at, e))?;
            slots.push(Slot {
                cert_file: pair.cert_file.value.clone(),
                key_file: pair.key_file.value.clone(),
                current: ArcSwap::from_pointee(loaded),
                seen: AtomicU64::new(digest(&[&cert, &key])),
                loaded: AtomicU64::new(digest(&[&cert, &key])),
            });
        }
        let certs = Arc::new(CertStore {
            slots,
            unknown_sni: cfg.unknown_sni,
        });
        let ticketer = rustls::crypto::ring::Ticketer::new()
            .map_err(|e| fanout_config::tls::whole(format!("{at}: {e}")))?;
        let sessions: Arc<dyn rustls::server::StoresServerSessions> =
            rustls::server::ServerSessionMemoryCache::new(4096);
        let (roots, ca_seen) = match &cfg.client_auth {
            Some(c) => {
                let pem = read(&c.ca_file.value).map_err(|e| config_error(&c.ca_file, at, e))?;
                let roots = load_roots(&c.ca_file.value, &pem)
                    .map_err(|e| config_error(&c.ca_file, at, e))?;
                (Some(roots), digest(&[&pem]))
            }
            None => (None, 0),
        };
        let server = server_config(
            name == "admin",
            cfg,
            certs.clone(),
            roots,
            &ticketer,
            &sessions,
        )
        .map_err(|e| fanout_config::tls::whole(format!("{at}: {e}")))?;
        Ok(TlsListener {
            name,
            cfg: cfg.clone(),
            certs,
            server: ArcSwap::from_pointee(server),
            ca_seen: AtomicU64::new(ca_seen),
            ticketer,
            sessions,
            counters: Counters::default(),
            watching: Mutex::new(None),
        })
    }

    /// The handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        self.cfg.handshake_timeout.0
    }

    /// Run the handshake on an accepted (admitted, registered) connection under its limits;
    /// `None` when it failed, timed out or the connection was closed meanwhile (counted).
    pub async fn accept(
        &self,
        stream: TcpStream,
        sh: &Arc<ConnShared>,
        conns: &Connections,
    ) -> Option<(TlsStream<TcpStream>, Arc<TlsInfo>)> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server.load().config.clone());
        let handshake = async {
            match acceptor.accept(stream).await {
                Ok(s) => self.resumed_client_ok(s.get_ref().1).then_some(s),
                Err(e) => {
                    self.handshake_failed(&e);
                    None
                }
            }
        };
        match crate::conn::setup(handshake, sh, conns, self.handshake_timeout()).await {
            Ok(stream) => {
                self.counters.handshakes.fetch_add(1, Ordering::Relaxed);
                let info = Arc::new(info(stream.get_ref().1));
                Some((stream, info))
            }
            Err(timed_out) => {
                if timed_out {
                    self.count_failure("timeout");
                }
                None
            }
        }
    }

    /// The handshake of a connection of the admin listener (no connection table: its own
    /// timeout only); `None` when it failed or timed out (counted).
    pub async fn accept_admin(&self, stream: TcpStream) -> Option<TlsStream<TcpStream>> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server.load().config.clone());
        match tokio::time::timeout(self.handshake_timeout(), acceptor.accept(stream)).await {
            Ok(Ok(s)) if self.resumed_client_ok(s.get_ref().1) => {
                self.counters.handshakes.fetch_add(1, Ordering::Relaxed);
                Some(s)
            }
            Ok(Ok(_)) => None,
            Ok(Err(e)) => {
                self.handshake_failed(&e);
                None
            }
            Err(_) => {
                self.count_failure("timeout");
                None
            }
        }
    }

    /// Whether a finished handshake may serve: a full one always (rustls verified the client's
    /// chain); a resumed one carrying a client certificate only if that chain passes the client
    /// verifier of now at the time now ([`recheck`]) — else counted as `client_certificate`,
    /// logged at debug, and the caller drops the connection.
    fn resumed_client_ok(&self, conn: &rustls::ServerConnection) -> bool {
        if conn.handshake_kind() != Some(rustls::HandshakeKind::Resumed) {
            return true;
        }
        let (Some(verifier), Some(chain)) = (&self.server.load().clients, conn.peer_certificates())
        else {
            return true;
        };
        match recheck(verifier.as_ref(), chain, UnixTime::now()) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(
                    listener = self.name,
                    error = %e,
                    "TLS session resumption refused: the client certificate does not verify now"
                );
                self.count_failure("client_certificate");
                false
            }
        }
    }

    /// A handshake that failed, counted by reason (logged at debug: clients cause them).
    fn handshake_failed(&self, e: &std::io::Error) {
        let reason = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::PeerIncompatible(_)) => "protocol_version",
            Some(rustls::Error::NoCertificatesPresented) => "client_certificate",
            Some(rustls::Error::InvalidCertificate(_)) => "client_certificate",
            Some(rustls::Error::General(m)) if m.contains("no server certificate") => {
                "no_certificate"
            }
            Some(_) => "other",
            None => match e.kind() {
                std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe => "closed",
                _ => "other",
            },
        };
        tracing::debug!(listener = self.name, error = %e, reason, "TLS handshake failed");
        self.count_failure(reason);
    }

    fn count_failure(&self, reason: &str) {
        if let Some(i) = FAILURE_REASONS.iter().position(|r| *r == reason) {
            self.counters.failures[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Start watching the files (once; the watcher ends with the listener).
    pub fn watch(self: &Arc<Self>) {
        let Ok(mut w) = self.watching.lock() else {
            return;
        };
        if w.is_none() {
            // The directories are watched before this returns: a change made once the listener
            // serves is never missed.
            let changed = Arc::new(tokio::sync::Notify::new());
            let watcher = watch_dirs(&self.dirs(), changed.clone());
            *w = Some(tokio::spawn(watch(
                Arc::downgrade(self),
                watcher,
                changed,
                self.cfg.poll.0,
            )));
        }
    }

    /// Stop watching the files.
    pub fn stop_watching(&self) {
        if let Some(h) = self.watching.lock().ok().and_then(|mut w| w.take()) {
            h.abort();
        }
    }

    /// The directories of every file (each watched once).
    fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = self
            .cfg
            .files()
            .map(|f| {
                Path::new(&f.value)
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// Read every file again; load what changed (blocking: file reads).
    pub fn reload(&self) {
        for slot in &self.certs.slots {
            let (cert, key) = match (read(&slot.cert_file), read(&slot.key_file)) {
                (Ok(c), Ok(k)) => (c, k),
                (Err(e), _) | (_, Err(e)) => {
                    // A file briefly missing while a Secret is swapped: looked at again on the
                    // next event or poll; counted once per error.
                    let d = digest(&[e.to_string().as_bytes()]);
                    if slot.seen.swap(d, Ordering::AcqRel) != d {
                        self.refused(&slot.cert_file, &e);
                    }
                    continue;
                }
            };
            let d = digest(&[&cert, &key]);
            if slot.seen.swap(d, Ordering::AcqRel) == d || slot.loaded.load(Ordering::Acquire) == d
            {
                continue;
            }
            match load_pair(&slot.cert_file, &slot.key_file, &cert, &key) {
                Ok(loaded) => {
                    tracing::info!(
                        listener = self.name,
                        cert_file = %slot.cert_file,
                        not_after = loaded.not_after,
                        "TLS certificate reloaded"
                    );
                    slot.current.store(Arc::new(loaded));
                    slot.loaded.store(d, Ordering::Release);
                    self.counters.reloads_ok.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.refused(&slot.cert_file, &e),
            }
        }
        if let Some(c) = &self.cfg.client_auth {
            let path = &c.ca_file.value;
            let res = read(path).and_then(|pem| {
                let d = digest(&[&pem]);
                if self.ca_seen.swap(d, Ordering::AcqRel) == d {
                    return Ok(false);
                }
                let roots = load_roots(path, &pem)?;
                let cfg = server_config(
                    self.name == "admin",
                    &self.cfg,
                    self.certs.clone(),
                    Some(roots),
                    &self.ticketer,
                    &self.sessions,
                )?;
                self.server.store(Arc::new(cfg));
                Ok(true)
            });
            match res {
                Ok(true) => {
                    tracing::info!(listener = self.name, ca_file = %path, "TLS client CA reloaded");
                    self.counters.reloads_ok.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false) => {}
                Err(e) => {
                    let d = digest(&[e.to_string().as_bytes()]);
                    if matches!(e, TlsError::Read { .. })
                        && self.ca_seen.swap(d, Ordering::AcqRel) == d
                    {
                        return;
                    }
                    self.refused(path, &e);
                }
            }
        }
    }

    fn refused(&self, file: &str, e: &TlsError) {
        tracing::error!(
            listener = self.name,
            file,
            error = %e,
            "TLS certificate reload refused; the loaded certificate keeps serving"
        );
        self.counters.reloads_failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.counters.last_error.lock() {
            *l = Some(e.to_string());
        }
    }

    /// Each certificate's file and expiry (Unix seconds).
    pub fn expiries(&self) -> Vec<(String, i64)> {
        self.certs
            .slots
            .iter()
            .map(|s| (s.cert_file.clone(), s.current.load().not_after))
            .collect()
    }

    /// Reloads: (succeeded, refused).
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.counters.reloads_ok.load(Ordering::Relaxed),
            self.counters.reloads_failed.load(Ordering::Relaxed),
        )
    }

    /// Failed handshakes by reason ([`FAILURE_REASONS`]).
    pub fn failures(&self) -> Vec<(&'static str, u64)> {
        FAILURE_REASONS
            .iter()
            .zip(&self.counters.failures)
            .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// This listener's part of the `tls` section of `/__fanout/status`.
    pub fn status_json(&self) -> serde_json::Value {
        let (ok, failed) = self.reloads();
        let certs: Vec<serde_json::Value> = self
            .certs
            .slots
            .iter()
            .map(|s| {
                let l = s.current.load();
                serde_json::json!({
                    "cert_file": s.cert_file,
                    "names": l.names,
                    "not_after": l.not_after,
                    "expires_in_s": l.not_after - now_unix(),
                })
            })
            .collect();
        let failures: serde_json::Map<String, serde_json::Value> = self
            .failures()
            .into_iter()
            .map(|(r, n)| (r.to_string(), n.into()))
            .collect();
        serde_json::json!({
            "certificates": certs,
            "handshakes": self.counters.handshakes.load(Ordering::Relaxed),
            "handshake_failures": failures,
            "reloads": ok,
            "reloads_refused": failed,
            "last_reload_error": self.counters.last_error.lock().ok().and_then(|l| l.clone()),
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.stop_watching();
    }
}

/// A resumed session's client chain (`chain`: the end entity first) verified again by
/// `verifier` at `now`: a session resumed after its CA left the client CA file, or after its
/// certificate expired, fails here as a full handshake would. An empty chain (no certificate,
/// `mode: optional`) passes.
fn recheck(
    verifier: &dyn ClientCertVerifier,
    chain: &[CertificateDer<'_>],
    now: UnixTime,
) -> Result<(), rustls::Error> {
    match chain.split_first() {
        Some((end_entity, intermediates)) => verifier
            .verify_client_cert(end_entity, intermediates, now)
            .map(|_| ()),
        None => Ok(()),
    }
}

fn server_config(
    admin: bool,
    cfg: &ListenerTls,
    certs: Arc<CertStore>,
    client_roots: Option<rustls::RootCertStore>,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
    sessions: &Arc<dyn rustls::server::StoresServerSessions>,
) -> Result<Server, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&'static rustls::SupportedProtocolVersion] = match cfg.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let (builder, clients) = match (client_roots, &cfg.client_auth) {
        (Some(roots), Some(auth)) => {
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = match auth.mode {
                ClientAuthMode::Required => v,
                ClientAuthMode::Optional => v.allow_unauthenticated(),
            };
            let v = v.build().map_err(|e| TlsError::Setup(e.to_string()))?;
            (builder.with_client_cert_verifier(v.clone()), Some(v))
        }
        _ => (builder.with_no_client_auth(), None),
    };
    let mut c = builder.with_cert_resolver(certs);
    // The admin listener speaks HTTP/1.1 only.
    c.alpn_protocols = match admin {
        false => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        true => vec![b"http/1.1".to_vec()],
    };
    c.ticketer = ticketer.clone();
    c.session_storage = sessions.clone();
    Ok(Server {
        config: Arc::new(c),
        clients,
    })
}

/// `$request.tls` of a connection.
fn info(conn: &rustls::ServerConnection) -> TlsInfo {
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "1.2",
        _ => "",
    };
    let alpn = conn
        .alpn_protocol()
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let client = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| client_json(c.as_ref()));
    TlsInfo(serde_json::json!({
        "version": version,
        "alpn": alpn,
        "sni": conn.server_name(),
        "client": client,
    }))
}

/// A verified client certificate as `$request.tls.client`.
fn client_json(der: &[u8]) -> serde_json::Value {
    use sha2::Digest;
    let fingerprint: String = sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return serde_json::json!({ "fingerprint_sha256": fingerprint });
    };
    let (mut dns, mut uri, mut email, mut ip) = (vec![], vec![], vec![], vec![]);
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        use x509_parser::extensions::GeneralName;
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::URI(u) => uri.push(u.to_string()),
                GeneralName::RFC822Name(e) => email.push(e.to_string()),
                GeneralName::IPAddress(b) => {
                    let a = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        _ => None,
                    };
                    if let Some(a) = a {
                        ip.push(a.to_string());
                    }
                }
                _ => {}
            }
        }
    }
    serde_json::json!({
        "subject": cert.subject().to_string(),
        "issuer": cert.issuer().to_string(),
        "serial": cert.raw_serial_as_string(),
        "not_after": cert.validity().not_after.timestamp(),
        "fingerprint_sha256": fingerprint,
        "sans": { "dns": dns, "uri": uri, "email": email, "ip": ip },
    })
}

impl Socket for TlsStream<TcpStream> {
    fn reset_on_drop(&self) {
        let _ = self.get_ref().0.set_zero_linger();
    }
}

/// A file-system watcher (inotify on Linux) of `dirs`, notifying `changed`; `None` when there
/// is none (the poll remains), logged.
fn watch_dirs(
    dirs: &[PathBuf],
    changed: Arc<tokio::sync::Notify>,
) -> Option<notify::RecommendedWatcher> {
    let on_event = changed;
    // inotify (Linux): a failure to watch leaves the poll, logged.
    let watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if e.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
            on_event.notify_one();
        }
    });
    match watcher {
        Ok(mut w) => {
            for d in dirs {
                if let Err(e) =
                    notify::Watcher::watch(&mut w, d, notify::RecursiveMode::NonRecursive)
                {
                    tracing::warn!(dir = %d.display(), error = %e, "cannot watch a TLS file directory; its files are read every `poll`");
                }
            }
            Some(w)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no file-system watcher; TLS files are read every `poll`");
            None
        }
    }
}

/// Read the files again on events (debounced) and every `poll`; ends when the listener is
/// dropped (or the task is aborted: [`TlsListener::stop_watching`]).
async fn watch(
    listener: Weak<TlsListener>,
    _watcher: Option<notify::RecommendedWatcher>,
    changed: Arc<tokio::sync::Notify>,
    poll: Duration,
) {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
            _ = tick.tick() => {}
        }
        let Some(l) = listener.upgrade() else {
            return;
        };
        if tokio::task::spawn_blocking(move || l.reload())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The TLS listeners a gateway serves, by name, for the metrics and the status.
pub fn status(listeners: &[&Arc<TlsListener>]) -> serde_json::Value {
    let m: HashMap<&str, serde_json::Value> = listeners
        .iter()
        .map(|l| (l.name, l.status_json()))
        .collect();
    serde_json::to_value(m).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client CA, and a client certificate it issued, valid 2020-01-01 to 2030-01-01
    /// (ECDSA P-256, made once with Python's `cryptography`).
    const CA: &str = "-----BEGIN CERTIFICATE-----
MIIBTjCB9aADAgECAhRg/0cDUt7VFAxb2czqvO1+mfk/6DAKBggqhkjOPQQDAjAV
MRMwEQYDVQQDDApyZWNoZWNrIGNhMB4XDTIwMDEwMTAwMDAwMFoXDTQwMDEwMTAw
MDAwMFowFTETMBEGA1UEAwwKcmVjaGVjayBjYTBZMBMGByqGSM49AgEGCCqGSM49
AwEHA0IABIJHLNjr6sJMll5zeLOe7ixGrolf2japOLxdwJG0wE7KBrezAoIoLyHn
0ysbhs01bxLiELkRLSyenRRbbzsB9KijIzAhMA8GA1UdEwEB/wQFMAMBAf8wDgYD
VR0PAQH/BAQDAgGGMAoGCCqGSM49BAMCA0gAMEUCIBusAE2DphmfWh5wdfZssSmv
3pkz70Y1n7UGGSbCLK9kAiEA6EmIhS/MnZlpr2zcgLIW0kXzUvYLGXzQZ+wOHUSj
+jY=
-----END CERTIFICATE-----
";
    const LEAF: &str = "-----BEGIN CERTIFICATE-----
MIIBPDCB4qADAgECAhRTOA/3rpRB0Miek9n1fu3lURUmJjAKBggqhkjOPQQDAjAV
MRMwEQYDVQQDDApyZWNoZWNrIGNhMB4XDTIwMDEwMTAwMDAwMFoXDTMwMDEwMTAw
MDAwMFowDjEMMAoGA1UEAwwDc3ZjMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
KSAqLOo932Z1dCwxDbEfACmD8v2ygJ352POz/Gf6t33NjgTQsmhfdjvOPmI1eGk8
/PyJvq5L1KBZmgA9aWd4iaMXMBUwEwYDVR0lBAwwCgYIKwYBBQUHAwIwCgYIKoZI
zj0EAwIDSQAwRgIhAN+FB8jjqaFsqj8sN2RKUw8oyVCoCL42V8D5m3jZdeveAiEA
56eY5XFMZBpcggCBYfbPPlBqaV95zZQ+Ux4Xkq5GHEc=
-----END CERTIFICATE-----
";
    /// Another CA.
    const OTHER_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBSTCB8aADAgECAhQ2uOIVNHPPpHKGvscodhkcjg8BzjAKBggqhkjOPQQDAjAT
MREwDwYDVQQDDAhvdGhlciBjYTAeFw0yMDAxMDEwMDAwMDBaFw00MDAxMDEwMDAw
MDBaMBMxETAPBgNVBAMMCG90aGVyIGNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcD
QgAEjnKYLd4GUFpozvecAlDm+uRznKOdCRWUmNCgSoaNUm3zNuXdBwK+6xcfWHO9
clhKUHlj4NJYsWz6xlyvMq121KMjMCEwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8B
Af8EBAMCAYYwCgYIKoZIzj0EAwIDRwAwRAIgISdH1c9wgR4ZxHpc6swoWizZORuE
0f7QeddKI3bQGcUCIDjtWRfvRgX97qXryWVHAT9hL7xQi8f5Tb99zJVZLp6u
-----END CERTIFICATE-----
";
    /// The leaf's `not_after`: 2030-01-01T00:00:00Z.
    const NOT_AFTER: u64 = 1_893_456_000;

    fn verifier(ca: &str) -> Arc<dyn ClientCertVerifier> {
        let roots = load_roots("ca.pem", ca.as_bytes()).unwrap();
        WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap()
    }

    fn at(secs: u64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(secs))
    }

    #[test]
    fn a_resumed_chain_is_checked_with_the_verifier_and_the_time_given() {
        let chain = [CertificateDer::from_pem_slice(LEAF.as_bytes()).unwrap()];
        let ours = verifier(CA);
        assert!(recheck(ours.as_ref(), &chain, at(NOT_AFTER - 3600)).is_ok());
        assert!(
            recheck(ours.as_ref(), &chain, at(NOT_AFTER)).is_ok(),
            "valid to the second"
        );
        assert!(matches!(
            recheck(ours.as_ref(), &chain, at(NOT_AFTER + 1)),
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ExpiredContext { .. } | rustls::CertificateError::Expired
            ))
        ));
        assert!(matches!(
            recheck(verifier(OTHER_CA).as_ref(), &chain, at(NOT_AFTER - 3600)),
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))
        ));
        assert!(
            recheck(ours.as_ref(), &[], at(NOT_AFTER + 1)).is_ok(),
            "no certificate"
        );
    }
}
