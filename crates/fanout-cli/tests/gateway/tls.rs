//! HTTPS backends: rustls with a CA file, over HTTP/1.1 and HTTP/2 (ALPN); an untrusted
//! certificate is a 502 `backend_unavailable`, not a hang or a 500.

use crate::support::gateway;
use bytes::Bytes;
use fanout_testkit::*;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::Arc;
use tokio::net::TcpListener;

/// A TLS server answering every request with `{"tls": true, "version": "<HTTP version>"}`.
async fn tls_backend() -> (std::net::SocketAddr, std::path::PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "fanout-tls-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, ck.cert.pem()).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
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
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(sock).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let body = format!(r#"{{"tls":true,"version":"{:?}"}}"#, req.version());
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(body),
                        )))
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, ca)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_backends_with_a_ca_file() {
    let (addr, ca) = tls_backend().await;
    let port = addr.port();
    let ca = ca.display();
    let yaml = format!(
        r#"
backends:
  h1: {{ url: "https://localhost:{port}", tls: {{ ca_file: "{ca}" }} }}
  h2: {{ url: "https://localhost:{port}", protocol: http2, tls: {{ ca_file: "{ca}" }} }}
  untrusted: {{ url: "https://localhost:{port}" }}
routes:
  - path: /both
    flow:
      a: {{ http: {{ backend: h1, path: '"/"' }} }}
      b: {{ http: {{ backend: h2, path: '"/"' }} }}
    respond: {{ body: '{{a: $a, b: $b}}' }}
  - path: /untrusted
    flow:
      u: {{ http: {{ backend: untrusted, path: '"/"' }} }}
    respond: {{ body: '$u' }}
"#
    );
    let no_stubs =
        stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await;
    let gw = gateway(&yaml, &no_stubs).await;
    let r = get(&format!("http://{}/both", gw.addr)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json(),
        serde_json::json!({"a": {"tls": true, "version": "HTTP/1.1"}, "b": {"tls": true, "version": "HTTP/2.0"}})
    );
    let r = get(&format!("http://{}/untrusted", gw.addr)).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.code(), "backend_unavailable");
}

/// A TLS server that requires a client certificate of `client_ca`, answering
/// `{"client": true}`.
async fn mtls_backend(server: &crate::tls_listener::Leaf, client_ca: &str) -> std::net::SocketAddr {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(client_ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            rustls_pki_types::CertificateDer::pem_slice_iter(server.cert.as_bytes())
                .map(|c| c.unwrap())
                .collect(),
            rustls_pki_types::PrivateKeyDer::from_pem_slice(server.key.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(sock).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    |_req: http::Request<hyper::body::Incoming>| async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(br#"{"client":true}"#),
                        )))
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_requiring_a_client_certificate_gets_the_one_configured() {
    use crate::tls_listener::{Ca, temp_dir};
    let servers = Ca::new("server ca");
    let clients = Ca::new("client ca");
    let addr = mtls_backend(
        &servers.leaf("localhost", &["localhost"], &[], false),
        &clients.pem(),
    )
    .await;
    let dir = temp_dir("tls-backend-mtls");
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let gateway_cert = clients.leaf("fanout", &["fanout.internal"], &[], true);
    let (ca, cert, key) = (
        file("ca.pem", &servers.pem()),
        file("client.crt", &gateway_cert.cert),
        file("client.key", &gateway_cert.key),
    );
    let port = addr.port();
    let yaml = format!(
        r#"
backends:
  with: {{ url: "https://localhost:{port}", tls: {{ ca_file: "{ca}", cert_file: "{cert}", key_file: "{key}" }} }}
  with_h2: {{ url: "https://localhost:{port}", protocol: http2, tls: {{ ca_file: "{ca}", cert_file: "{cert}", key_file: "{key}" }} }}
  without: {{ url: "https://localhost:{port}", tls: {{ ca_file: "{ca}" }} }}
routes:
  - path: /with
    flow:
      a: {{ http: {{ backend: with, path: '"/"' }} }}
      b: {{ http: {{ backend: with_h2, path: '"/"' }} }}
    respond: {{ body: '[$a, $b]' }}
  - path: /without
    flow:
      a: {{ http: {{ backend: without, path: '"/"' }} }}
    respond: {{ body: '$a' }}
"#
    );
    let no_stubs =
        stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await;
    let gw = gateway(&yaml, &no_stubs).await;
    let r = get(&format!("http://{}/with", gw.addr)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json(),
        serde_json::json!([{"client": true}, {"client": true}])
    );
    let r = get(&format!("http://{}/without", gw.addr)).await;
    // TLS 1.3: the server refuses the missing certificate after the client's handshake ends,
    // so the call fails on the first read (a reset) rather than in the connect.
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert!(
        ["backend_reset", "backend_unavailable"].contains(&r.code().as_str()),
        "{:?}",
        r.body
    );
}
