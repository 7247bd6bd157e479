//! `https://` targets: HTTP/1.1 and h2 chosen by ALPN, a CA file or no verification, a server
//! the client does not trust, and full handshakes with resumption off.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use fanout_load::{LoadSpec, Protocol, RequestTemplate, Schedule, TlsOptions, run};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::net::TcpListener;

/// What the TLS server saw: handshakes, of them resumed ones, and requests by HTTP version.
#[derive(Default)]
struct Seen {
    handshakes: AtomicU64,
    resumed: AtomicU64,
    h1: AtomicU64,
    h2: AtomicU64,
}

/// A TLS server (h2 and http/1.1 by ALPN) for `localhost`; returns its address, the PEM of its
/// certificate and what it saw.
async fn tls_server(dir: &std::path::Path) -> (std::net::SocketAddr, PathBuf, Arc<Seen>) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, ck.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, seen) = (acceptor.clone(), s.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(sock).await else {
                    return;
                };
                seen.handshakes.fetch_add(1, Ordering::Relaxed);
                if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                    seen.resumed.fetch_add(1, Ordering::Relaxed);
                }
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let seen = seen.clone();
                    async move {
                        match req.version() {
                            http::Version::HTTP_2 => seen.h2.fetch_add(1, Ordering::Relaxed),
                            _ => seen.h1.fetch_add(1, Ordering::Relaxed),
                        };
                        let _: &hyper::body::Incoming = req.body();
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"{}"),
                        )))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, ca, seen)
}

/// A directory removed at the end of the test.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "fanout-load-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spec(port: u16, protocol: Protocol, tls: TlsOptions, headers: &[(&str, &str)]) -> LoadSpec {
    let mut s = LoadSpec::new(
        format!("https://localhost:{port}"),
        Schedule::parse("const(20,1s)").unwrap(),
    );
    let mut r = RequestTemplate::get("/x");
    r.headers = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    s.requests = vec![r];
    s.protocol = protocol;
    s.max_connections = 2;
    s.tls = tls;
    // Counts are asserted, not timings: a loaded machine may send late.
    s.lag_threshold = std::time::Duration::from_secs(5);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_speak_http1_and_h2_by_alpn_and_check_the_certificate() {
    let dir = TempDir::new();
    let (addr, ca, seen) = tls_server(&dir.0).await;
    let port = addr.port();
    let with_ca = TlsOptions {
        ca_file: Some(ca),
        ..TlsOptions::default()
    };
    let r = run(&spec(port, Protocol::Http1, with_ca.clone(), &[]), None)
        .await
        .unwrap();
    assert_eq!((r.ok, r.errors.total()), (20, 0), "HTTP/1.1 over TLS");
    assert_eq!(seen.h1.load(Ordering::Relaxed), 20);
    let insecure = TlsOptions {
        insecure: true,
        ..TlsOptions::default()
    };
    let r = run(&spec(port, Protocol::Http2, insecure, &[]), None)
        .await
        .unwrap();
    assert_eq!(
        (r.ok, r.errors.total()),
        (20, 0),
        "h2 over TLS, chosen by ALPN"
    );
    assert_eq!(seen.h2.load(Ordering::Relaxed), 20);

    // A server whose certificate the client does not trust: every request fails, none hangs.
    let other = TempDir::new();
    let (_, other_ca, _) = tls_server(&other.0).await;
    let untrusted = TlsOptions {
        ca_file: Some(other_ca),
        ..TlsOptions::default()
    };
    let r = run(&spec(port, Protocol::Http1, untrusted, &[]), None)
        .await
        .unwrap();
    assert_eq!(
        (r.ok, r.completed),
        (0, 0),
        "nothing answered: {:?}",
        r.errors
    );
    assert_eq!(r.errors.total(), 20, "{:?}", r.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_per_request_resumes_sessions_unless_told_not_to() {
    let dir = TempDir::new();
    let (addr, ca, seen) = tls_server(&dir.0).await;
    let close = [("connection", "close")];
    let tls = TlsOptions {
        ca_file: Some(ca),
        ..TlsOptions::default()
    };
    let r = run(
        &spec(addr.port(), Protocol::Http1, tls.clone(), &close),
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.ok, 20);
    assert_eq!(
        seen.handshakes.load(Ordering::Relaxed),
        20,
        "one per request"
    );
    let resumed = seen.resumed.load(Ordering::Relaxed);
    assert!(resumed >= 18, "all but the first ones resumed: {resumed}");

    let fresh = TlsOptions {
        no_resumption: true,
        ..tls
    };
    let r = run(&spec(addr.port(), Protocol::Http1, fresh, &close), None)
        .await
        .unwrap();
    assert_eq!(r.ok, 20);
    assert_eq!(seen.handshakes.load(Ordering::Relaxed), 40);
    assert_eq!(
        seen.resumed.load(Ordering::Relaxed),
        resumed,
        "no session resumed"
    );
}
