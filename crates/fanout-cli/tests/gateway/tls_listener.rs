//! TLS on the gateway's listener (`tls:`): HTTP/1.1 and h2 by ALPN on one port, certificates
//! chosen by SNI, TLS 1.2/1.3 only (rustls, `openssl s_client`, curl), client certificates in
//! `$request.tls` (a Python `ssl` client), rotation of the files Kubernetes-style with no failed
//! request, the handshake timeout, gRPC over TLS, and the config errors.

use crate::support::gateway;
use bytes::Bytes;
use fanout_testkit::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// A test CA issuing server and client certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            issuer: CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `names` (DNS SANs; `uris` as URI SANs) with common name `cn`.
    pub fn leaf(&self, cn: &str, names: &[&str], uris: &[&str], client: bool) -> Leaf {
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
        for u in uris {
            p.subject_alt_names
                .push(SanType::URI(u.to_string().try_into().unwrap()));
        }
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        self.sign(p)
    }

    /// A client certificate with common name `cn` valid until `not_after` (whole seconds).
    pub fn client_leaf_until(&self, cn: &str, not_after: std::time::SystemTime) -> Leaf {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(1970, 1, 1)
            + not_after.duration_since(std::time::UNIX_EPOCH).unwrap();
        self.sign(p)
    }

    fn sign(&self, p: CertificateParams) -> Leaf {
        let k = KeyPair::generate().unwrap();
        let c = p.signed_by(&k, &self.issuer).unwrap();
        Leaf {
            cert: c.pem(),
            key: k.serialize_pem(),
        }
    }
}

/// A fresh directory under the temp dir.
pub fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "fanout-{what}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A gateway config with `tls` (YAML flow text) and routes answering `$request.tls`.
fn config(tls: &str) -> String {
    format!(
        r#"
tls: {tls}
routes:
  - path: /tls
    respond: {{ body: '$request.tls + {{http: $request.headers["x-http"]}}' }}
  - path: /client
    respond: {{ body: '$request.tls.client' }}
"#
    )
}

async fn no_stubs() -> fanout_stub::StubServer {
    stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await
}

/// How a test client connects.
#[derive(Clone)]
pub struct Dial {
    pub ca: String,
    pub sni: &'static str,
    pub alpn: &'static [&'static [u8]],
    pub versions: &'static [&'static rustls::SupportedProtocolVersion],
    pub client: Option<(String, String)>,
}

impl Dial {
    pub fn new(ca: &str, sni: &'static str) -> Dial {
        Dial {
            ca: ca.to_string(),
            sni,
            alpn: &[b"http/1.1"],
            versions: rustls::DEFAULT_VERSIONS,
            client: None,
        }
    }

    fn config(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(self.versions)
        .unwrap()
        .with_root_certificates(roots);
        let mut c = match &self.client {
            Some((cert, key)) => b
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(cert.as_bytes())
                        .map(|c| c.unwrap())
                        .collect(),
                    rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        c.alpn_protocols = self.alpn.iter().map(|a| a.to_vec()).collect();
        c
    }

    /// Handshake with the gateway: the stream, or the handshake's error.
    pub async fn connect(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.keeping_sessions().connect(addr).await
    }

    /// A client that keeps its TLS sessions from one connection to the next (rustls's
    /// in-memory store, on by default): its second connection to a server resumes.
    pub fn keeping_sessions(&self) -> Session {
        Session {
            connector: tokio_rustls::TlsConnector::from(Arc::new(self.config())),
            sni: self.sni,
        }
    }
}

/// A client keeping its TLS sessions ([`Dial::keeping_sessions`]).
#[derive(Clone)]
pub struct Session {
    connector: tokio_rustls::TlsConnector,
    sni: &'static str,
}

impl Session {
    /// Handshake with the gateway (resuming a kept session when there is one).
    pub async fn connect(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let handshake = async {
            let tcp = TcpStream::connect(addr).await?;
            self.connector
                .connect(ServerName::try_from(self.sni).unwrap(), tcp)
                .await
        };
        tokio::time::timeout(CLIENT_PATIENCE, handshake)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no handshake within {CLIENT_PATIENCE:?}"),
                ))
            })
    }

    /// A new connection and GET `path` on it: how the handshake went (the client's word) and
    /// the answer, or why there is none (the handshake or the request failed). The answer
    /// read also reads the TLS 1.3 session ticket, which arrives after the handshake.
    pub async fn get(
        &self,
        addr: SocketAddr,
        path: &str,
    ) -> (
        Option<rustls::HandshakeKind>,
        Result<(u16, serde_json::Value), String>,
    ) {
        match over(self.connect(addr).await).await {
            Ok((mut c, shown)) => (shown.kind, c.get(path).await),
            Err(e) => (None, Err(e.to_string())),
        }
    }
}

/// An open HTTP connection over TLS (HTTP/1.1 or h2, as ALPN chose).
pub enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// What a TLS connection showed: its server certificate (DER), ALPN and handshake kind.
pub struct Shown {
    pub cert: Vec<u8>,
    pub alpn: Option<Vec<u8>>,
    pub kind: Option<rustls::HandshakeKind>,
}

pub async fn open(dial: &Dial, addr: SocketAddr) -> std::io::Result<(Conn, Shown)> {
    over(dial.connect(addr).await).await
}

/// HTTP over a TLS connection just made.
async fn over(
    s: std::io::Result<tokio_rustls::client::TlsStream<TcpStream>>,
) -> std::io::Result<(Conn, Shown)> {
    let s = s?;
    let (_, c) = s.get_ref();
    let shown = Shown {
        cert: c
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .unwrap_or_default(),
        alpn: c.alpn_protocol().map(|a| a.to_vec()),
        kind: c.handshake_kind(),
    };
    let io = TokioIo::new(s);
    let conn = tokio::time::timeout(CLIENT_PATIENCE, async {
        Ok::<_, std::io::Error>(if shown.alpn.as_deref() == Some(b"h2") {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Conn::H2(send)
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Conn::H1(send)
        })
    })
    .await
    .map_err(|_| std::io::Error::other("no HTTP handshake within the client's patience"))??;
    Ok((conn, shown))
}

/// How long the test client waits for a handshake or an answer: a gateway that never
/// answers fails the look instead of hanging the test.
const CLIENT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

impl Conn {
    /// GET `path`: (status, JSON body); an error when there is none within [`CLIENT_PATIENCE`].
    pub async fn get(&mut self, path: &str) -> Result<(u16, serde_json::Value), String> {
        tokio::time::timeout(CLIENT_PATIENCE, self.get_unbounded(path))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {CLIENT_PATIENCE:?}")))
    }

    async fn get_unbounded(&mut self, path: &str) -> Result<(u16, serde_json::Value), String> {
        let uri = if matches!(self, Conn::H2(_)) {
            format!("https://localhost{path}")
        } else {
            path.to_string()
        };
        let mut req = http::Request::get(uri)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let v = match self {
            Conn::H1(_) => "1.1",
            Conn::H2(_) => "2",
        };
        req.headers_mut()
            .insert("x-http", http::HeaderValue::from_static(v));
        let resp = match self {
            Conn::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Conn::H2(s) => {
                *req.version_mut() = http::Version::HTTP_2;
                req.headers_mut().remove("host");
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let v = serde_json::from_slice(&body).map_err(|e| format!("{e}: {body:?}"))?;
        Ok((status, v))
    }
}

static ONLY_13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
static ONLY_12: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS12];

/// The DER of a PEM certificate.
fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_picks_http1_or_h2_on_one_port_and_sni_picks_the_certificate() {
    let ca = Ca::new("test ca");
    let a = ca.leaf("a", &["a.test", "localhost"], &[], false);
    let b = ca.leaf("b", &["*.b.test"], &[], false);
    let dir = temp_dir("tls-sni");
    let tls = format!(
        "{{ certificates: [{{ cert_file: '{}', key_file: '{}' }}, {{ cert_file: '{}', key_file: '{}' }}] }}",
        write(&dir, "a.crt", &a.cert),
        write(&dir, "a.key", &a.key),
        write(&dir, "b.crt", &b.cert),
        write(&dir, "b.key", &b.key),
    );
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let ca_pem = ca.pem();

    // HTTP/1.1 and h2 on the same port, as ALPN chose.
    let mut dial = Dial::new(&ca_pem, "localhost");
    let (mut c, shown) = open(&dial, gw.addr).await.unwrap();
    assert_eq!(shown.alpn.as_deref(), Some(&b"http/1.1"[..]));
    let (status, v) = c.get("/tls").await.unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["alpn"], "http/1.1");
    assert_eq!(v["http"], "1.1");
    assert_eq!(v["sni"], "localhost");
    assert_eq!(v["client"], serde_json::Value::Null);
    dial.alpn = &[b"h2", b"http/1.1"];
    let (mut c, shown) = open(&dial, gw.addr).await.unwrap();
    assert_eq!(shown.alpn.as_deref(), Some(&b"h2"[..]));
    let (status, v) = c.get("/tls").await.unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["alpn"].as_str(), v["http"].as_str()),
        (Some("h2"), Some("2"))
    );

    // SNI picks the certificate: exact name, wildcard, and the first one for an unknown name.
    let (_, shown) = open(&Dial::new(&ca_pem, "a.test"), gw.addr).await.unwrap();
    assert_eq!(shown.cert, der(&a.cert));
    let (_, shown) = open(&Dial::new(&ca_pem, "x.b.test"), gw.addr)
        .await
        .unwrap();
    assert_eq!(shown.cert, der(&b.cert), "the wildcard certificate");
    let mut unknown = Dial::new(&ca_pem, "other.test");
    let err = open(&unknown, gw.addr).await.err().expect("not the name");
    assert!(err.to_string().contains("certificate"), "{err}");
    // (the client refuses the default certificate, which does not name `other.test`)
    unknown.sni = "localhost";
    assert_eq!(open(&unknown, gw.addr).await.unwrap().1.cert, der(&a.cert));

    // TLS 1.3 and 1.2 each accepted.
    for (versions, want) in [(&ONLY_13[..], "1.3"), (&ONLY_12[..], "1.2")] {
        let mut d = Dial::new(&ca_pem, "localhost");
        d.versions = versions;
        let (mut c, _) = open(&d, gw.addr).await.unwrap();
        let (_, v) = c.get("/tls").await.unwrap();
        assert_eq!(v["version"], want);
    }
    let st = gw.gateway().status_json();
    assert!(
        st["tls"]["main"]["handshakes"].as_u64().unwrap() >= 7,
        "{st}"
    );
    assert_eq!(st["tls"]["main"]["certificates"][1]["names"][0], "*.b.test");
}

/// One certificate for `localhost`, its CA's PEM file and the `tls` settings naming them.
fn localhost_tls(dir: &Path, extra: &str) -> (Ca, String, String) {
    let ca = Ca::new("test ca");
    let l = ca.leaf("localhost", &["localhost"], &[], false);
    let tls = format!(
        "{{ certificates: [{{ cert_file: '{}', key_file: '{}' }}]{extra} }}",
        write(dir, "tls.crt", &l.cert),
        write(dir, "tls.key", &l.key),
    );
    let ca_file = write(dir, "ca.pem", &ca.pem());
    (ca, ca_file, tls)
}

/// Run a command off the runtime's workers: (success, stdout + stderr).
async fn run(cmd: &'static str, args: Vec<String>, stdin: Option<&'static str>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let mut c = Command::new(cmd);
        c.args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        if let Some(mut i) = child.stdin.take() {
            use std::io::Write;
            let _ = i.write_all(stdin.unwrap_or("").as_bytes());
        }
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_s_client_gets_tls_1_3_and_1_2_and_never_older() {
    let dir = temp_dir("tls-openssl");
    let (_ca, ca_file, tls) = localhost_tls(&dir, "");
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let connect = format!("127.0.0.1:{}", gw.addr.port());
    for (flag, ok, protocol) in [
        ("-tls1_3", true, "TLSv1.3"),
        ("-tls1_2", true, "TLSv1.2"),
        ("-tls1_1", false, ""),
        ("-tls1", false, ""),
    ] {
        let args = [
            "s_client",
            "-connect",
            &connect,
            "-servername",
            "localhost",
            "-CAfile",
            &ca_file,
            "-verify_return_error",
            flag,
        ]
        .map(String::from)
        .to_vec();
        let (success, out) = run("openssl", args, Some("")).await;
        assert_eq!(success, ok, "openssl s_client {flag}:\n{out}");
        if ok {
            assert!(out.contains(protocol), "{flag}: {out}");
            assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_over_https_with_http2_and_http1_1() {
    let dir = temp_dir("tls-curl");
    let (_ca, ca_file, tls) = localhost_tls(&dir, "");
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let port = gw.addr.port();
    for (flag, alpn) in [("--http2", "h2"), ("--http1.1", "http/1.1")] {
        let args = [
            "-sS",
            "--max-time",
            "30",
            flag,
            "--cacert",
            &ca_file,
            "--resolve",
            &format!("localhost:{port}:127.0.0.1"),
            &format!("https://localhost:{port}/tls"),
        ]
        .map(String::from)
        .to_vec();
        let (ok, out) = run("curl", args, None).await;
        assert!(ok, "curl {flag}: {out}");
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(v["alpn"], alpn, "{out}");
        assert_eq!(v["sni"], "localhost");
    }
}

/// A Python `ssl` client: GET `path` over HTTP/1.1 with `cert`/`key` (or none); prints the
/// answer's body, or `HANDSHAKE-FAILED <error>`.
const PY_CLIENT: &str = r#"
import socket, ssl, sys
port, ca, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
if len(sys.argv) > 5:
    ctx.load_cert_chain(sys.argv[4], sys.argv[5])
try:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            t.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" % path).encode())
            data = b""
            while True:
                chunk = t.recv(65536)
                if not chunk:
                    break
                data += chunk
except (ssl.SSLError, ConnectionError, OSError) as e:
    print("HANDSHAKE-FAILED", e)
    sys.exit(0)
if not data:
    print("HANDSHAKE-FAILED closed")
    sys.exit(0)
head, _, body = data.partition(b"\r\n\r\n")
print(body.decode())
"#;

async fn python_get(port: u16, ca: &str, path: &str, client: Option<(&str, &str)>) -> String {
    let mut args = vec![
        "-c".to_string(),
        PY_CLIENT.to_string(),
        port.to_string(),
        ca.to_string(),
        path.to_string(),
    ];
    if let Some((c, k)) = client {
        args.push(c.to_string());
        args.push(k.to_string());
    }
    let (ok, out) = run("python3", args, None).await;
    assert!(ok, "python3: {out}");
    out.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_certificate_is_request_tls_client_and_required_refuses_without_one() {
    let dir = temp_dir("tls-mtls");
    let clients = Ca::new("client ca");
    let client_ca = write(&dir, "clients.pem", &clients.pem());
    let leaf = clients.leaf(
        "svc-a",
        &["svc-a.internal"],
        &["spiffe://example.org/ns/prod/sa/svc-a"],
        true,
    );
    let (cert, key) = (
        write(&dir, "client.crt", &leaf.cert),
        write(&dir, "client.key", &leaf.key),
    );
    let stranger = Ca::new("other ca").leaf("mallory", &["m.test"], &[], true);
    let (s_cert, s_key) = (
        write(&dir, "stranger.crt", &stranger.cert),
        write(&dir, "stranger.key", &stranger.key),
    );

    for mode in ["optional", "required"] {
        let (_ca, ca_file, tls) = localhost_tls(
            &dir,
            &format!(", client_auth: {{ ca_file: '{client_ca}', mode: {mode} }}"),
        );
        let log = dir.join(format!("access-{mode}.log"));
        let yaml = format!(
            "{}telemetry:\n  access_log: {{ enabled: true, output: '{}' }}\n",
            config(&tls),
            log.display()
        );
        let gw = gateway(&yaml, &no_stubs().await).await;
        let port = gw.addr.port();
        let out = python_get(port, &ca_file, "/client", Some((&cert, &key))).await;
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{mode}: {e}: {out}"));
        assert_eq!(v["subject"], "CN=svc-a", "{mode}: {v}");
        assert_eq!(v["issuer"], "CN=client ca", "{v}");
        assert_eq!(v["sans"]["dns"], serde_json::json!(["svc-a.internal"]));
        assert_eq!(
            v["sans"]["uri"],
            serde_json::json!(["spiffe://example.org/ns/prod/sa/svc-a"])
        );
        assert_eq!(v["fingerprint_sha256"].as_str().unwrap().len(), 64);
        assert!(v["not_after"].as_i64().unwrap() > 0);
        // The access log names the verified client.
        wait_until("the access log line", || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains(r#""tls_client":"CN=svc-a""#))
        })
        .await;

        // A certificate of another CA is refused in both modes.
        let out = python_get(port, &ca_file, "/client", Some((&s_cert, &s_key))).await;
        assert!(out.starts_with("HANDSHAKE-FAILED"), "{mode}: {out}");

        let out = python_get(port, &ca_file, "/client", None).await;
        match mode {
            "optional" => assert_eq!(out, "null", "no certificate: `client` is null"),
            _ => assert!(out.starts_with("HANDSHAKE-FAILED"), "required: {out}"),
        }
        let want = if mode == "required" { 2 } else { 1 };
        wait_until("the refused handshakes are counted", || {
            gw.gateway().status_json()["tls"]["main"]["handshake_failures"]["client_certificate"]
                .as_u64()
                == Some(want)
        })
        .await;
    }
}

/// A Kubernetes Secret volume: `tls.crt -> ..data/tls.crt`, `..data -> ..<version>`; an
/// update writes a new version directory and swaps `..data` with a rename.
struct SecretVolume {
    dir: PathBuf,
    version: u32,
}

impl SecretVolume {
    fn new(leaf: &Leaf) -> SecretVolume {
        let dir = temp_dir("tls-secret");
        let mut v = SecretVolume { dir, version: 0 };
        v.update(&leaf.cert, &leaf.key);
        std::os::unix::fs::symlink("..data/tls.crt", v.dir.join("tls.crt")).unwrap();
        std::os::unix::fs::symlink("..data/tls.key", v.dir.join("tls.key")).unwrap();
        v
    }

    fn update(&mut self, cert: &str, key: &str) {
        self.version += 1;
        let name = format!(
            "..2026_11_27_00_00_{:02}.{}",
            self.version,
            rand::random::<u16>()
        );
        let d = self.dir.join(&name);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("tls.crt"), cert).unwrap();
        std::fs::write(d.join("tls.key"), key).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_kubernetes_style_with_no_failed_request_and_a_bad_pair_is_refused() {
    let ca = Ca::new("test ca");
    let first = ca.leaf("first", &["localhost"], &[], false);
    let mut vol = SecretVolume::new(&first);
    let tls = format!(
        "{{ certificates: [{{ cert_file: '{}', key_file: '{}' }}], poll: 1s }}",
        vol.file("tls.crt"),
        vol.file("tls.key")
    );
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let admin = gw.admin_addr.unwrap();
    let addr = gw.addr;
    let dial = Dial::new(&ca.pem(), "localhost");
    let (mut old, shown) = open(&dial, addr).await.unwrap();
    assert_eq!(shown.cert, der(&first.cert));
    let expiry = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("fanout_tls_certificate_expiry_timestamp_seconds{"))
            .map(str::to_string)
    };
    let m = get(&format!("http://{admin}/metrics")).await.text();
    let line = expiry(&m).expect("the expiry metric");
    assert!(line.contains(r#"listener="main""#), "{line}");

    // A client keeps sending, over one kept connection and over new ones.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (dial, stop) = (dial.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut kept, _) = open(&dial, addr).await.unwrap();
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match kept.get("/tls").await {
                    Ok((200, _)) => ok += 1,
                    other => failed.push(format!("kept: {other:?}")),
                }
                match open(&dial, addr).await {
                    Ok((mut c, _)) => match c.get("/tls").await {
                        Ok((200, _)) => ok += 1,
                        other => failed.push(format!("new: {other:?}")),
                    },
                    Err(e) => failed.push(format!("handshake: {e}")),
                }
            }
            (ok, failed)
        })
    };

    let second = ca.leaf("second", &["localhost"], &[], false);
    vol.update(&second.cert, &second.key);
    wait_until_async("new handshakes present the new certificate", || {
        let (dial, want) = (dial.clone(), der(&second.cert));
        async move { matches!(open(&dial, addr).await, Ok((_, s)) if s.cert == want) }
    })
    .await;
    // The connection opened before the swap still works.
    let (status, _) = old.get("/tls").await.unwrap();
    assert_eq!(status, 200);

    // A pair whose key is not the certificate's: refused, counted, the second one kept.
    let third = ca.leaf("third", &["localhost"], &[], false);
    let other_key = KeyPair::generate().unwrap().serialize_pem();
    vol.update(&third.cert, &other_key);
    wait_until("the bad pair is refused and counted", || {
        gw.gateway().status_json()["tls"]["main"]["reloads_refused"] == 1
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert!(ok > 0);

    let (_, shown) = open(&dial, addr).await.unwrap();
    assert_eq!(shown.cert, der(&second.cert), "the old pair keeps serving");
    let st = gw.gateway().status_json();
    let t = &st["tls"]["main"];
    assert_eq!(t["reloads"], 1, "{t}");
    assert!(
        t["last_reload_error"]
            .as_str()
            .unwrap()
            .contains("is not the key of"),
        "{t}"
    );
    let m = get(&format!("http://{admin}/metrics")).await.text();
    assert!(
        m.contains(r#"fanout_tls_reloads_total{listener="main",result="refused"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"fanout_tls_reloads_total{listener="main",result="ok"} 1"#),
        "{m}"
    );
    assert!(expiry(&m).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tls_client_is_closed_after_the_handshake_timeout_and_counted() {
    let dir = temp_dir("tls-silent");
    let (_ca, _ca_file, tls) = localhost_tls(&dir, ", handshake_timeout: 200ms");
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    wait_until("the silent connection counts as open", || {
        gw.gateway().status_json()["connections"]["open"] == 1
    })
    .await;
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
        .await
        .expect("closed by the gateway")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    wait_until("counted", || {
        let st = gw.gateway().status_json();
        st["connections"]["timeouts"]["tls_handshake"] == 1
            && st["tls"]["main"]["handshake_failures"]["timeout"] == 1
            && st["connections"]["open"] == 0
    })
    .await;
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetUserRequest {
    #[prost(string, tag = "1")]
    id: String,
}
#[derive(Clone, PartialEq, prost::Message)]
struct User {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    name: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_route_over_tls_with_h2() {
    use prost::Message;
    let dir = temp_dir("tls-grpc");
    let (ca, _ca_file, tls) = localhost_tls(&dir, "");
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grpc-gateway/protos");
    let yaml = format!(
        r#"
protos: {{ files: [demo/v1/profile.proto], include: ["{}"] }}
tls: {tls}
routes:
  - grpc: demo.v1.Users/GetUser
    respond: {{ body: '{{id: $request.body.id, name: ($request.tls.alpn + " " + $request.tls.version)}}' }}
"#,
        protos.display()
    );
    let gw = gateway(&yaml, &no_stubs().await).await;
    let mut dial = Dial::new(&ca.pem(), "localhost");
    dial.alpn = &[b"h2"];
    let (conn, _) = open(&dial, gw.addr).await.unwrap();
    let Conn::H2(mut send) = conn else {
        panic!("h2 by ALPN")
    };
    let msg = GetUserRequest { id: "u7".into() }.encode_to_vec();
    let req = http::Request::post("https://localhost/demo.v1.Users/GetUser")
        .version(http::Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(fanout_testkit::grpc::grpc_frame(&msg)))
        .unwrap();
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.to_str().unwrap()),
        Some("0"),
        "{trailers:?}"
    );
    let body = collected.to_bytes();
    let user = User::decode(fanout_testkit::grpc::grpc_unframe(&body).unwrap()).unwrap();
    assert_eq!(user.id, "u7");
    assert!(user.name == "h2 1.3", "{}", user.name);
}

#[tokio::test]
async fn tls_config_errors_are_refused_at_load_with_clear_messages() {
    let dir = temp_dir("tls-errors");
    let ca = Ca::new("test ca");
    let l = ca.leaf("localhost", &["localhost"], &[], false);
    let other = ca.leaf("other", &["localhost"], &[], false);
    let cert = write(&dir, "tls.crt", &l.cert);
    let key = write(&dir, "tls.key", &l.key);
    let wrong_key = write(&dir, "other.key", &other.key);
    let not_pem = write(&dir, "junk.pem", "hello");
    let mut expired = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    expired.not_before = rcgen::date_time_ymd(2020, 1, 1);
    expired.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let ek = KeyPair::generate().unwrap();
    let expired_cert = write(
        &dir,
        "expired.crt",
        &expired.self_signed(&ek).unwrap().pem(),
    );
    let expired_key = write(&dir, "expired.key", &ek.serialize_pem());
    let missing = dir.join("missing.crt").display().to_string();
    let pair =
        |c: &str, k: &str| format!("{{ certificates: [{{ cert_file: '{c}', key_file: '{k}' }}] }}");
    let cases: Vec<(&str, String, &str)> = vec![
        ("missing file", pair(&missing, &key), "cannot read"),
        (
            "key of another certificate",
            pair(&cert, &wrong_key),
            "is not the key of",
        ),
        ("not PEM", pair(&not_pem, &key), "no certificate"),
        (
            "no key in the key file",
            pair(&cert, &cert),
            "no private key",
        ),
        ("expired", pair(&expired_cert, &expired_key), "expired"),
        (
            "bad min_version",
            format!(
                "{{ certificates: [{{ cert_file: '{cert}', key_file: '{key}' }}], min_version: '1.1' }}"
            ),
            "unknown variant `1.1`",
        ),
        (
            "no certificates",
            "{ certificates: [] }".to_string(),
            "`tls.certificates` is empty",
        ),
        (
            "missing client CA",
            format!(
                "{{ certificates: [{{ cert_file: '{cert}', key_file: '{key}' }}], client_auth: {{ ca_file: '{missing}' }} }}"
            ),
            "cannot read",
        ),
        (
            "bad client_auth mode",
            format!(
                "{{ certificates: [{{ cert_file: '{cert}', key_file: '{key}' }}], client_auth: {{ ca_file: '{cert}', mode: sometimes }} }}"
            ),
            "unknown variant `sometimes`",
        ),
    ];
    for (what, tls, words) in cases {
        let yaml = format!("tls: {tls}\nroutes:\n  - path: /a\n    respond: {{ body: '1' }}\n");
        let err = match fanout::load_gateway("fanout.yaml", &yaml, &|_| None) {
            Ok(_) => panic!("{what}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(words), "{what}: {err}");
        assert!(err.starts_with("fanout.yaml:"), "{what}: {err}");
    }
    // Backends: a client certificate without its key.
    let yaml = format!(
        "backends:\n  b: {{ url: 'https://localhost:1', tls: {{ cert_file: '{cert}' }} }}\nroutes:\n  - path: /a\n    respond: {{ body: '1' }}\n"
    );
    let err = fanout::load_gateway("fanout.yaml", &yaml, &|_| None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("go together"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_over_tls_with_http1_1() {
    let dir = temp_dir("tls-admin");
    let (ca, _ca_file, tls) = localhost_tls(&dir, "");
    let yaml =
        format!("admin:\n  tls: {tls}\nroutes:\n  - path: /a\n    respond: {{ body: '1' }}\n");
    let gw = gateway(&yaml, &no_stubs().await).await;
    let admin = gw.admin_addr.unwrap();
    let mut dial = Dial::new(&ca.pem(), "localhost");
    dial.alpn = &[b"h2", b"http/1.1"];
    let (mut c, shown) = open(&dial, admin).await.unwrap();
    assert_eq!(
        shown.alpn.as_deref(),
        Some(&b"http/1.1"[..]),
        "the admin listener is HTTP/1.1"
    );
    let (status, v) = c.get("/healthz").await.unwrap();
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
    // The live page's data, over the same TLS connection.
    let (status, v) = c.get("/ui/api/state").await.unwrap();
    assert_eq!(
        (status, v["routes"][0]["name"].as_str()),
        (200, Some("GET /a"))
    );
    // The client port stays plain.
    assert_eq!(get(&format!("http://{}/a", gw.addr)).await.status, 200);
    let st = gw.gateway().status_json();
    assert_eq!(st["tls"]["admin"]["handshakes"], 1, "{st}");
    assert!(st["tls"].get("main").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_keyed_by_the_client_certificate_counts_each_client_apart() {
    let dir = temp_dir("tls-ratelimit");
    let clients = Ca::new("client ca");
    let client_ca = write(&dir, "clients.pem", &clients.pem());
    let (ca, _ca_file, tls) = localhost_tls(
        &dir,
        &format!(", client_auth: {{ ca_file: '{client_ca}' }}"),
    );
    let yaml = format!(
        r#"
tls: {tls}
rate_limits:
  per-cert:
    rate: 1/h
    burst: 1
    key: '$request.tls.client.subject'
routes:
  - path: /limited
    rate_limit: [per-cert]
    respond: {{ body: '$request.tls.client.subject' }}
"#
    );
    let gw = gateway(&yaml, &no_stubs().await).await;
    let dial = |cn: &str| {
        let l = clients.leaf(cn, &[], &[], true);
        let mut d = Dial::new(&ca.pem(), "localhost");
        d.client = Some((l.cert, l.key));
        d
    };
    let get = |d: Dial| async move {
        let (mut c, _) = open(&d, gw.addr).await.unwrap();
        let (status, v) = c.get("/limited").await.unwrap();
        (status, v)
    };
    let (a, b) = (dial("a"), dial("b"));
    assert_eq!(get(a.clone()).await, (200, serde_json::json!("CN=a")));
    assert_eq!(get(a.clone()).await.0, 429, "a's budget is spent");
    assert_eq!(
        get(b.clone()).await,
        (200, serde_json::json!("CN=b")),
        "b has its own"
    );
    assert_eq!(get(b).await.0, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_with_tls_1_3_and_1_2() {
    let dir = temp_dir("tls-resume");
    let (ca, _ca_file, tls) = localhost_tls(&dir, "");
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    for versions in [&ONLY_13[..], &ONLY_12[..]] {
        let mut d = Dial::new(&ca.pem(), "localhost");
        d.versions = versions;
        // One client config (and its session store) for both connections.
        let connector = tokio_rustls::TlsConnector::from(Arc::new(d.config()));
        let mut kinds = Vec::new();
        for _ in 0..2 {
            let tcp = TcpStream::connect(gw.addr).await.unwrap();
            let s = connector
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap();
            kinds.push(s.get_ref().1.handshake_kind());
            // A request and its answer: the TLS 1.3 ticket arrives after the handshake.
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                .await
                .unwrap();
            tokio::spawn(conn);
            let resp = send
                .send_request(
                    http::Request::get("/tls")
                        .header("host", "localhost")
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
        }
        assert_eq!(
            kinds,
            [
                Some(rustls::HandshakeKind::Full),
                Some(rustls::HandshakeKind::Resumed)
            ],
            "{versions:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_swap_is_seen_by_the_directory_watch_alone() {
    let ca = Ca::new("test ca");
    let first = ca.leaf("first", &["localhost"], &[], false);
    let mut vol = SecretVolume::new(&first);
    // No poll within the test's patience: only the watch of the directory can see the swap.
    let tls = format!(
        "{{ certificates: [{{ cert_file: '{}', key_file: '{}' }}], poll: 1h }}",
        vol.file("tls.crt"),
        vol.file("tls.key")
    );
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let dial = Dial::new(&ca.pem(), "localhost");
    assert_eq!(open(&dial, gw.addr).await.unwrap().1.cert, der(&first.cert));
    let second = ca.leaf("second", &["localhost"], &[], false);
    vol.update(&second.cert, &second.key);
    let addr = gw.addr;
    wait_until_async("new handshakes present the new certificate", || {
        let (dial, want) = (dial.clone(), der(&second.cert));
        async move { matches!(open(&dial, addr).await, Ok((_, s)) if s.cert == want) }
    })
    .await;
    assert_eq!(gw.gateway().status_json()["tls"]["main"]["reloads"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_load_speaks_https_with_http1_1_and_h2() {
    let dir = temp_dir("tls-load");
    let (_ca, ca_file, tls) = localhost_tls(&dir, "");
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let url = format!("https://localhost:{}", gw.addr.port());
    for (protocol, insecure) in [
        (fanout_load::Protocol::Http1, false),
        (fanout_load::Protocol::Http2, false),
        (fanout_load::Protocol::Http1, true),
    ] {
        let mut spec = fanout_load::LoadSpec::new(
            url.clone(),
            fanout_load::Schedule::parse("const(50,1s)").unwrap(),
        );
        spec.requests = vec![fanout_load::RequestTemplate::get("/tls")];
        spec.protocol = protocol;
        spec.max_connections = 4;
        spec.tls = fanout_load::TlsOptions {
            ca_file: (!insecure).then(|| std::path::PathBuf::from(&ca_file)),
            insecure,
            ..fanout_load::TlsOptions::default()
        };
        let r = fanout_load::run(&spec, None).await.unwrap();
        assert!(r.ok > 0, "{protocol:?}: {r:?}");
        assert_eq!(r.ok, r.completed, "{protocol:?}: every answer ok: {r:?}");
    }
    // Without the CA the certificate is not trusted: nothing succeeds.
    let mut spec =
        fanout_load::LoadSpec::new(url, fanout_load::Schedule::parse("const(20,1s)").unwrap());
    spec.requests = vec![fanout_load::RequestTemplate::get("/tls")];
    let r = fanout_load::run(&spec, None).await.unwrap();
    assert_eq!(r.ok, 0, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sni_refuse_fails_the_handshake_of_a_name_no_certificate_has() {
    let dir = temp_dir("tls-refuse");
    let (ca, _ca_file, tls) = localhost_tls(&dir, ", unknown_sni: refuse");
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let (mut c, _) = open(&Dial::new(&ca.pem(), "localhost"), gw.addr)
        .await
        .unwrap();
    assert_eq!(c.get("/tls").await.unwrap().0, 200);
    let err = open(&Dial::new(&ca.pem(), "other.test"), gw.addr)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("alert"), "{err}");
    wait_until("counted as no_certificate", || {
        gw.gateway().status_json()["tls"]["main"]["handshake_failures"]["no_certificate"] == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_client_ca_file_is_reloaded() {
    let dir = temp_dir("tls-ca-reload");
    let (old_ca, new_ca) = (Ca::new("old clients"), Ca::new("new clients"));
    let ca_file = write(&dir, "clients.pem", &old_ca.pem());
    let (ca, _ca_file, tls) = localhost_tls(
        &dir,
        &format!(", client_auth: {{ ca_file: '{ca_file}' }}, poll: 1s"),
    );
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let leaf = new_ca.leaf("svc-new", &[], &[], true);
    let mut dial = Dial::new(&ca.pem(), "localhost");
    dial.client = Some((leaf.cert, leaf.key));
    let addr = gw.addr;
    let works = |dial: Dial| async move {
        match open(&dial, addr).await {
            Ok((mut c, _)) => matches!(c.get("/client").await, Ok((200, _))),
            Err(_) => false,
        }
    };
    assert!(!works(dial.clone()).await, "not trusted yet");
    // Written in place (a new file renamed over the old one, as editors and tools do).
    let tmp = dir.join("clients.pem.tmp");
    std::fs::write(&tmp, new_ca.pem()).unwrap();
    std::fs::rename(&tmp, &ca_file).unwrap();
    wait_until_async("the new client CA is trusted", || works(dial.clone())).await;
    assert_eq!(gw.gateway().status_json()["tls"]["main"]["reloads"], 1);
}

/// Whether an answer is a 200 (a resumed session that was let through).
fn answered(r: &Result<(u16, serde_json::Value), String>) -> bool {
    matches!(r, Ok((200, _)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_is_checked_against_the_client_ca_of_now() {
    use rustls::HandshakeKind::{Full, Resumed};
    let dir = temp_dir("tls-resume-ca");
    let (old_ca, new_ca) = (Ca::new("old clients"), Ca::new("new clients"));
    let ca_file = write(&dir, "clients.pem", &old_ca.pem());
    let (ca, _ca_file, tls) = localhost_tls(
        &dir,
        &format!(", client_auth: {{ ca_file: '{ca_file}' }}, poll: 1s"),
    );
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let addr = gw.addr;
    let client = |issuer: &Ca, cn: &str, versions| {
        let l = issuer.leaf(cn, &[], &[], true);
        let mut d = Dial::new(&ca.pem(), "localhost");
        d.client = Some((l.cert, l.key));
        d.versions = versions;
        d
    };
    // A client of the old CA, on TLS 1.3 and on TLS 1.2, keeps its session: it resumes.
    let mut kept = Vec::new();
    for versions in [&ONLY_13[..], &ONLY_12[..]] {
        let dial = client(&old_ca, "svc-old", versions);
        let session = dial.keeping_sessions();
        let (kind, r) = session.get(addr, "/client").await;
        assert_eq!(kind, Some(Full), "{versions:?}");
        assert_eq!(r.unwrap().1["subject"], "CN=svc-old");
        let (kind, r) = session.get(addr, "/client").await;
        assert_eq!(kind, Some(Resumed), "{versions:?}");
        assert_eq!(r.unwrap().1["subject"], "CN=svc-old");
        kept.push((versions, dial, session));
    }

    // The client CA file now names another CA only: a full handshake is refused...
    let tmp = dir.join("clients.pem.tmp");
    std::fs::write(&tmp, new_ca.pem()).unwrap();
    std::fs::rename(&tmp, &ca_file).unwrap();
    wait_until_async(
        "a full handshake with the old CA's certificate is refused",
        || {
            let d = kept[0].1.clone();
            async move { !answered(&d.keeping_sessions().get(addr, "/client").await.1) }
        },
    )
    .await;
    assert_eq!(gw.gateway().status_json()["tls"]["main"]["reloads"], 1);
    // ... and so is the kept session: checked again, with the CA set of now.
    for (versions, dial, session) in &kept {
        let (_, r) = dial.keeping_sessions().get(addr, "/client").await;
        assert!(!answered(&r), "{versions:?}: full handshake: {r:?}");
        let (_, r) = session.get(addr, "/client").await;
        assert!(!answered(&r), "{versions:?}: resumed session: {r:?}");
    }
    wait_until("each refusal is counted as client_certificate", || {
        gw.gateway().status_json()["tls"]["main"]["handshake_failures"]["client_certificate"]
            .as_u64()
            .is_some_and(|n| n >= 5)
    })
    .await;

    // A client whose certificate the CA set of now trusts keeps resuming.
    for versions in [&ONLY_13[..], &ONLY_12[..]] {
        let session = client(&new_ca, "svc-new", versions).keeping_sessions();
        let (kind, r) = session.get(addr, "/client").await;
        assert_eq!(kind, Some(Full), "{versions:?}");
        assert_eq!(r.unwrap().1["subject"], "CN=svc-new");
        for _ in 0..2 {
            let (kind, r) = session.get(addr, "/client").await;
            assert_eq!(kind, Some(Resumed), "{versions:?}");
            assert_eq!(r.unwrap().1["subject"], "CN=svc-new", "{versions:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_of_a_client_certificate_expired_since_is_refused() {
    use rustls::HandshakeKind::{Full, Resumed};
    use std::time::SystemTime;
    let dir = temp_dir("tls-resume-expired");
    let clients = Ca::new("client ca");
    let client_ca = write(&dir, "clients.pem", &clients.pem());
    let (ca, _ca_file, tls) = localhost_tls(
        &dir,
        &format!(", client_auth: {{ ca_file: '{client_ca}' }}"),
    );
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let addr = gw.addr;
    for versions in [&ONLY_13[..], &ONLY_12[..]] {
        // A certificate valid for a few seconds more: long enough for a full handshake and an
        // answer (a longer life if this machine was too slow for it), then expired.
        let mut tried = Vec::new();
        let (dial, session, not_after) = 'valid: {
            for life in [3, 10, 30, 90] {
                let not_after = SystemTime::now() + Duration::from_secs(life);
                let leaf = clients.client_leaf_until("svc-expiring", not_after);
                let mut dial = Dial::new(&ca.pem(), "localhost");
                dial.client = Some((leaf.cert, leaf.key));
                dial.versions = versions;
                let session = dial.keeping_sessions();
                let (kind, r) = session.get(addr, "/client").await;
                if kind == Some(Full) && answered(&r) {
                    break 'valid (dial, session, not_after);
                }
                tried.push(format!("{life}s: {kind:?} {r:?}"));
            }
            panic!("{versions:?}: no certificate was served while valid: {tried:?}");
        };
        // Expired once the second after `not_after` has begun (the certificate's times are
        // whole seconds; the check is `now > not_after`).
        wait_within(
            "the client certificate has expired",
            Duration::from_secs(100),
            || SystemTime::now() > not_after + Duration::from_secs(1),
        )
        .await;
        let (_, r) = dial.keeping_sessions().get(addr, "/client").await;
        assert!(!answered(&r), "{versions:?}: full handshake: {r:?}");
        let (kind, r) = session.get(addr, "/client").await;
        assert_eq!(kind, Some(Resumed), "{versions:?}: the client resumed");
        assert!(!answered(&r), "{versions:?}: resumed session: {r:?}");
    }
}

/// An SNI that is not a valid DNS name is refused by rustls before a certificate is chosen: a
/// fatal `illegal_parameter` alert (counted as `other`), whatever `unknown_sni` says. An IP
/// address sent as SNI counts as no SNI: the first certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sni_that_is_not_a_dns_name_is_refused_and_an_ip_address_is_no_sni() {
    let ca = Ca::new("test ca");
    let first = ca.leaf("first-cert", &["a.test"], &[], false);
    let dir = temp_dir("tls-bad-sni");
    let tls = format!(
        "{{ certificates: [{{ cert_file: '{}', key_file: '{}' }}] }}",
        write(&dir, "a.crt", &first.cert),
        write(&dir, "a.key", &first.key),
    );
    let gw = gateway(&config(&tls), &no_stubs().await).await;
    let connect = format!("127.0.0.1:{}", gw.addr.port());
    let s_client = |sni: &str| {
        [
            "s_client",
            "-connect",
            &connect,
            "-servername",
            sni,
            "-tls1_3",
        ]
        .map(String::from)
        .to_vec()
    };
    for bad in ["bad_name!.test", "a..test", "-a.test", "a.test-"] {
        let (ok, out) = run("openssl", s_client(bad), Some("")).await;
        assert!(!ok, "{bad}: {out}");
        assert!(out.contains("illegal parameter"), "{bad}: {out}");
    }
    wait_until("counted as other", || {
        gw.gateway().status_json()["tls"]["main"]["handshake_failures"]["other"] == 4
    })
    .await;
    for ip in ["127.0.0.1", "::1"] {
        let (ok, out) = run("openssl", s_client(ip), Some("")).await;
        assert!(ok, "{ip}: {out}");
        assert!(out.contains("CN = first-cert"), "{ip}: {out}");
    }
}

/// The `tls` edge stage says what `fanout explain` prints of a route reached over TLS, and its
/// status section and metric families are the listeners' (through the stage registry).
#[tokio::test]
async fn explain_says_a_route_is_reached_over_tls_and_the_stage_reports_the_listener() {
    let dir = temp_dir("explain");
    let ca_file = dir.join("ca.pem").display().to_string();
    let extra = format!(", min_version: '1.3', client_auth: {{ ca_file: '{ca_file}' }}");
    let (_ca, written, tls) = localhost_tls(&dir, &extra);
    assert_eq!(written, ca_file);
    let path = dir.join("fanout.yaml");
    std::fs::write(&path, config(&tls)).unwrap();
    let text = fanout::explain::explain_file_at(
        path.to_str().unwrap(),
        &|_: &str| None,
        Some("/client"),
        fanout::explain::Format::Text,
        None,
    )
    .unwrap();
    assert!(
        text.contains(&format!(
            "  tls: over TLS 1.3+ on the main listener; client certificates required (CA {ca_file})"
        )),
        "{text}"
    );
    let gw = fanout::load_gateway("f.yaml", &config(&tls), &|_: &str| None).unwrap();
    let st = gw.status_json();
    assert_eq!(
        st["tls"]["main"]["certificates"][0]["names"][0], "localhost",
        "{st}"
    );
    let plain = fanout::load_gateway("f.yaml", &config("null"), &|_: &str| None).unwrap();
    assert_eq!(plain.status_json()["tls"], serde_json::json!({}));
}
