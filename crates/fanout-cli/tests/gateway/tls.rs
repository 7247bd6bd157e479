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
