//! gRPC compression against other implementations (tier 2: docs/grpc.md#compression): a Python
//! grpcio client calling a gateway route with gzip, a gateway `grpc` step calling a grpcio
//! server that answers gzip, and grpcurl (which asks for no compression) against a gateway that
//! offers it. The tools are installed once under `$FANOUT_TOOLS_DIR` (default
//! `~/.cache/fanout-tools`), as `scripts/check-deploy` installs its own: grpcio and grpcio-tools
//! from PyPI into a venv (about a minute), grpcurl through the Go module proxy (`go install`,
//! about two minutes). Without `python3` or Go the test says so and skips that part.

use super::grpc::example;
use crate::support::python::{self, run, tools_dir};
use crate::support::{gateway, gateway_with};
use fanout_testkit::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GRPCIO_VERSION: &str = "1.85.3";
const GRPCIO_TOOLS_VERSION: &str = "1.85.1";
const GRPCURL_VERSION: &str = "v1.9.3";

/// The venv's python with grpcio and grpcio-tools (made once, `support::python`); `Err` when
/// python3 is missing (a failing install fails the test).
fn python() -> Result<PathBuf, String> {
    match python::venv(
        &[
            &format!("grpcio=={GRPCIO_VERSION}"),
            &format!("grpcio-tools=={GRPCIO_TOOLS_VERSION}"),
        ],
        &["grpc", "grpc_tools"],
    ) {
        Ok(py) => Ok(py),
        Err(python::VenvError::NoPython(why)) => Err(why),
        Err(e) => panic!("{e}"),
    }
}

/// grpcurl, built once with `go install`; `Err` when Go is missing (a failing build fails the
/// test).
fn grpcurl() -> Result<PathBuf, String> {
    let dir = tools_dir().join(format!("grpcurl-{GRPCURL_VERSION}"));
    let bin = dir.join("grpcurl");
    if bin.is_file() {
        return Ok(bin);
    }
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| Command::new(g).arg("version").output().is_ok())
        .ok_or("no Go (https://go.dev/dl/)")?;
    eprintln!(
        "installing grpcurl {GRPCURL_VERSION} into {} (go install, once)",
        dir.display()
    );
    run(
        Command::new(go)
            .env("GOBIN", &dir)
            .env("GOFLAGS", "-mod=mod")
            .arg("install")
            .arg(format!(
                "github.com/fullstorydev/grpcurl/cmd/grpcurl@{GRPCURL_VERSION}"
            )),
        "go install grpcurl",
    )
    .unwrap();
    Ok(bin)
}

fn protos_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grpc-gateway/protos")
}

/// The example's Python stubs, generated into `dir`.
fn python_stubs(py: &Path, dir: &Path) {
    let protos = protos_dir();
    run(
        Command::new(py)
            .args(["-m", "grpc_tools.protoc"])
            .arg(format!("-I{}", protos.display()))
            .arg(format!("--python_out={}", dir.display()))
            .arg(format!("--grpc_python_out={}", dir.display()))
            .arg("demo/v1/profile.proto"),
        "grpc_tools.protoc",
    )
    .unwrap();
}

/// A grpcio client: GetProfile with gzip; prints the answer and the request encoding the
/// gateway saw (echoed by the route as metadata).
const CLIENT: &str = r#"
import json, sys
import grpc
from demo.v1 import profile_pb2, profile_pb2_grpc
addr, compression = sys.argv[1], sys.argv[2]
comp = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression
with grpc.insecure_channel(addr, compression=comp) as ch:
    stub = profile_pb2_grpc.ProfileGatewayStub(ch)
    resp, call = stub.GetProfile.with_call(
        profile_pb2.ProfileRequest(user_id="u1" * 3000), compression=comp, timeout=20)
    md = dict(call.initial_metadata())
    print(json.dumps({"user": resp.user.id, "name": resp.user.name, "orders": len(resp.orders),
                      "seen": md.get("x-seen-encoding")}))
"#;

/// A grpcio server of demo.v1.Users/GetUser answering gzip; prints its port.
const SERVER: &str = r#"
import sys
from concurrent import futures
import grpc
from demo.v1 import profile_pb2, profile_pb2_grpc
class Users(profile_pb2_grpc.UsersServicer):
    def GetUser(self, request, context):
        context.set_compression(grpc.Compression.Gzip)
        return profile_pb2.User(id=request.id, name="from grpcio " + "x" * 20000, tier=2)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), compression=grpc.Compression.Gzip)
profile_pb2_grpc.add_UsersServicer_to_server(Users(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
"#;

/// A TCP relay to `target` counting the bytes each way (counted before they are forwarded: once
/// an answer has arrived, its bytes are counted), so a test sees whether messages travelled
/// compressed without trusting either end.
struct Relay {
    addr: std::net::SocketAddr,
    /// Client → target.
    up: Arc<AtomicU64>,
    /// Target → client.
    down: Arc<AtomicU64>,
}

impl Relay {
    async fn start(target: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (u, d) = (up.clone(), down.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, u.clone()));
                tokio::spawn(pipe(sr, cw, d.clone()));
            }
        });
        Relay { addr, up, down }
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::SeqCst),
            self.down.load(Ordering::SeqCst),
        )
    }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    n: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                n.fetch_add(k as u64, Ordering::SeqCst);
                if w.write_all(&buf[..k]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = w.shutdown().await;
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The gateway routes: GetProfile echoing the request's `grpc-encoding` as metadata, answers
/// compressed from 1 byte on.
fn config() -> String {
    example("fanout.yaml")
        .replace(
            "routes:",
            "server:\n  grpc: { compress_min_bytes: 1 }\nroutes:",
        )
        .replace(
            "    respond:\n",
            "    respond:\n      headers: { x-seen-encoding: '$request.headers[\"grpc-encoding\"] // \"identity\"' }\n",
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs python3 (grpcio from PyPI) and Go (grpcurl)"]
async fn gzip_interoperates_with_grpcio_and_grpcurl() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let dir = TempDir::new("grpc-interop");
    let py = tokio::task::spawn_blocking(python).await.unwrap();
    match &py {
        Ok(py) => {
            let (py, d) = (py.clone(), dir.path().to_path_buf());
            tokio::task::spawn_blocking(move || python_stubs(&py, &d))
                .await
                .unwrap();
            std::fs::write(dir.join("client.py"), CLIENT).unwrap();
            std::fs::write(dir.join("server.py"), SERVER).unwrap();
        }
        Err(why) => eprintln!("note: the grpcio interop skipped: {why}"),
    }

    // A grpcio client sending gzip (and accepting it): the gateway reads the compressed
    // message, and answers it compressed — the answer (the 6 KB id in it four times) crosses the
    // relay in a few KB. Without compression, the 6 KB request crosses as it is.
    let gw = gateway(&config(), &stubs).await;
    if let Ok(py) = &py {
        for (compression, seen) in [("gzip", "gzip"), ("none", "identity")] {
            let relay = Relay::start(gw.addr).await;
            let (py, d, addr) = (py.clone(), dir.path().to_path_buf(), relay.addr.to_string());
            let out = tokio::task::spawn_blocking(move || {
                run(
                    Command::new(&py)
                        .arg(d.join("client.py"))
                        .args([&addr, compression])
                        .env("PYTHONPATH", &d),
                    "the grpcio client",
                )
            })
            .await
            .unwrap()
            .unwrap();
            let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            assert_eq!(v["user"], "u1".repeat(3000), "{compression}: {v}");
            assert_eq!(v["orders"], 2, "{compression}: {v}");
            assert_eq!(
                v["seen"], seen,
                "{compression}: the request's grpc-encoding: {v}"
            );
            let (up, down) = relay.counts();
            assert!(
                down < 4000,
                "{compression}: the answer compressed: {down} bytes"
            );
            if compression == "gzip" {
                assert!(up < 4000, "the request compressed: {up} bytes");
            } else {
                assert!(up > 6000, "the request uncompressed: {up} bytes");
            }
        }
    }

    // A gateway `grpc` step to a grpcio server answering gzip, the step sending gzip.
    if let Ok(py) = &py {
        let mut child = Command::new(py)
            .arg(dir.join("server.py"))
            .env("PYTHONPATH", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let server = Server(child);
        let port = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).unwrap();
            line.trim().parse::<u16>().unwrap()
        })
        .await
        .unwrap();
        // Through a relay: the 10 KB request and the 30 KB answer cross it compressed.
        let relay = Relay::start(([127, 0, 0, 1], port).into()).await;
        let old = r#"users:  { url: "http://${USERS_ADDR:-127.0.0.1:9201}", protocol: grpc, timeout: 200ms }"#;
        let cfg = example("fanout.yaml").replace(
            old,
            &format!("users: {{ url: \"http://{}\", protocol: grpc, grpc_compression: gzip, timeout: 10s }}", relay.addr),
        );
        let gw = gateway_with(&cfg, &stubs, &[]).await;
        let out = post(
            &format!("http://{}/demo.v1.ProfileGateway/GetProfile", gw.addr),
            &format!(r#"{{"user_id": "{}"}}"#, "u9".repeat(5000)),
        )
        .await;
        assert_eq!(out.status, 200, "{}", String::from_utf8_lossy(&out.body));
        let v = out.json();
        assert_eq!(v["user"]["id"], "u9".repeat(5000));
        let name = v["user"]["name"].as_str().unwrap();
        assert!(name.starts_with("from grpcio xxx") && name.len() > 20000);
        let (up, down) = relay.counts();
        assert!(up < 4000, "the step's request compressed: {up} bytes");
        assert!(down < 4000, "the grpcio answer compressed: {down} bytes");
        drop(server);
    }

    // grpcurl (grpc-go) against a gateway that compresses for those who ask: it works, and
    // reflection too.
    match tokio::task::spawn_blocking(grpcurl).await.unwrap() {
        Ok(bin) => {
            let addr = gw.addr.to_string();
            let out = tokio::task::spawn_blocking(move || {
                let call = run(
                    Command::new(&bin).args([
                        "-plaintext",
                        "-max-time",
                        "20",
                        "-d",
                        r#"{"user_id":"u1"}"#,
                        &addr,
                        "demo.v1.ProfileGateway/GetProfile",
                    ]),
                    "grpcurl",
                );
                let list = run(
                    Command::new(&bin).args(["-plaintext", "-max-time", "20", &addr, "list"]),
                    "grpcurl list",
                );
                (call, list)
            })
            .await
            .unwrap();
            let v: serde_json::Value = serde_json::from_str(&out.0.unwrap()).unwrap();
            assert_eq!(v["user"]["id"], "u1", "{v}");
            assert_eq!(v["orders"].as_array().unwrap().len(), 2, "{v}");
            assert!(out.1.unwrap().contains("demo.v1.ProfileGateway"));

            // The same over TLS (h2 by ALPN), the certificate checked against its CA.
            let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
            let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
            std::fs::write(&cert, ck.cert.pem()).unwrap();
            std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
            let tls_cfg = format!(
                "{}\ntls:\n  certificates:\n    - {{ cert_file: '{}', key_file: '{}' }}\n",
                config(),
                cert.display(),
                key.display()
            );
            let tls_gw = gateway_with(&tls_cfg, &stubs, &[]).await;
            let (bin, addr) = (
                grpcurl().unwrap(),
                format!("127.0.0.1:{}", tls_gw.addr.port()),
            );
            let out = tokio::task::spawn_blocking(move || {
                run(
                    Command::new(&bin).args([
                        "-cacert",
                        &cert.display().to_string(),
                        "-servername",
                        "localhost",
                        "-max-time",
                        "20",
                        "-d",
                        r#"{"user_id":"u2"}"#,
                        &addr,
                        "demo.v1.ProfileGateway/GetProfile",
                    ]),
                    "grpcurl over TLS",
                )
            })
            .await
            .unwrap();
            let v: serde_json::Value = serde_json::from_str(&out.unwrap()).unwrap();
            assert_eq!(v["user"]["id"], "u2", "{v}");
        }
        Err(why) => eprintln!("note: the grpcurl interop skipped: {why}"),
    }
}

/// A grpcio server of streams.v1.Numbers (tests/gateway/protos/streams.proto); prints its port,
/// then `cancelled` when an endless `Count` ends because its client went away.
const STREAMS_SERVER: &str = r#"
import sys, time
from concurrent import futures
import grpc
import streams_pb2, streams_pb2_grpc
class Numbers(streams_pb2_grpc.NumbersServicer):
    def Count(self, request, context):
        i = 0
        try:
            while request.n == 0 or i < request.n:
                yield streams_pb2.Num(value=i)
                i += 1
                if request.n == 0:
                    time.sleep(0.01)
        finally:
            if request.n == 0:
                print("cancelled", flush=True)
    def Sum(self, it, context):
        return streams_pb2.Num(value=sum(m.value for m in it))
    def Echo(self, it, context):
        for m in it:
            yield streams_pb2.Num(value=m.value)
    def Get(self, request, context):
        return streams_pb2.Num(value=request.value + 1)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
streams_pb2_grpc.add_NumbersServicer_to_server(Numbers(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
"#;

/// A grpcio client: server, client and bidi streams (gzip messages), the bidi one in lock step,
/// then an endless stream cancelled after two numbers; prints what it got as JSON.
const STREAMS_CLIENT: &str = r#"
import json, sys, queue
import grpc
import streams_pb2, streams_pb2_grpc
out = {}
with grpc.insecure_channel(sys.argv[1], compression=grpc.Compression.Gzip) as ch:
    stub = streams_pb2_grpc.NumbersStub(ch)
    out["count"] = [m.value for m in stub.Count(streams_pb2.CountRequest(n=5), timeout=20)]
    out["sum"] = stub.Sum(iter([streams_pb2.Num(value=v) for v in (1, 2, 39)]), timeout=20).value
    q = queue.Queue()
    def numbers():
        while True:
            v = q.get()
            if v is None:
                return
            yield streams_pb2.Num(value=v)
    q.put(0)
    echoes = []
    for m in stub.Echo(numbers(), timeout=20):
        echoes.append(m.value)
        q.put(m.value + 1 if m.value < 9 else None)
    out["echo"] = echoes
    call = stub.Count(streams_pb2.CountRequest(n=0), timeout=20)
    out["before_cancel"] = [next(call).value, next(call).value]
    call.cancel()
    out["unary"] = stub.Get(streams_pb2.Num(value=41), timeout=20).value
print(json.dumps(out), flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs python3 (grpcio from PyPI)"]
async fn grpcio_streams_pass_through_and_a_cancel_reaches_the_grpcio_server() {
    let py = tokio::task::spawn_blocking(python)
        .await
        .unwrap()
        .unwrap_or_else(|why| panic!("this test needs python3 with grpcio: {why}"));
    let dir = TempDir::new("grpc-streams");
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/protos");
    let (p, d, pr) = (py.clone(), dir.path().to_path_buf(), protos.clone());
    tokio::task::spawn_blocking(move || {
        run(
            Command::new(&p)
                .args(["-m", "grpc_tools.protoc"])
                .arg(format!("-I{}", pr.display()))
                .arg(format!("--python_out={}", d.display()))
                .arg(format!("--grpc_python_out={}", d.display()))
                .arg("streams.proto"),
            "grpc_tools.protoc",
        )
        .unwrap()
    })
    .await
    .unwrap();
    std::fs::write(dir.join("server.py"), STREAMS_SERVER).unwrap();
    std::fs::write(dir.join("client.py"), STREAMS_CLIENT).unwrap();
    let mut child = Command::new(&py)
        .arg(dir.join("server.py"))
        .env("PYTHONPATH", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    async fn next_line(
        lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
        what: &str,
    ) -> String {
        tokio::time::timeout(std::time::Duration::from_secs(60), lines.recv())
            .await
            .unwrap_or_else(|_| panic!("the grpcio server did not print {what} within 60 s"))
            .unwrap_or_else(|| panic!("the grpcio server ended before {what}"))
    }
    let port: u16 = next_line(&mut lines, "its port")
        .await
        .trim()
        .parse()
        .unwrap();
    let stubs =
        stubs("services:\n  unused:\n    listen: \"${UNUSED_ADDR}\"\n    routes: []\n").await;
    let cfg = format!(
        r#"
protos: {{ files: [streams.proto], include: ["{}"] }}
backends:
  numbers: {{ url: "http://127.0.0.1:{port}", protocol: grpc }}
routes:
  - grpc: streams.v1.Numbers/Count
    pass: {{ backend: numbers }}
  - grpc: streams.v1.Numbers/Sum
    pass: {{ backend: numbers }}
  - grpc: streams.v1.Numbers/Echo
    pass: {{ backend: numbers }}
  - grpc: streams.v1.Numbers/Get
    pass: {{ backend: numbers }}
"#,
        protos.display()
    );
    let gw = gateway_with(&cfg, &stubs, &[]).await;
    let (p, d, addr) = (py.clone(), dir.path().to_path_buf(), gw.addr.to_string());
    let out = tokio::task::spawn_blocking(move || {
        run(
            Command::new(&p)
                .arg(d.join("client.py"))
                .arg(&addr)
                .env("PYTHONPATH", &d),
            "the grpcio client",
        )
    })
    .await
    .unwrap()
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["count"], serde_json::json!([0, 1, 2, 3, 4]), "{v}");
    assert_eq!(v["sum"], 42, "{v}");
    assert_eq!(
        v["echo"],
        serde_json::json!([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
        "{v}"
    );
    assert_eq!(v["before_cancel"], serde_json::json!([0, 1]), "{v}");
    assert_eq!(v["unary"], 42, "{v}");
    // The client's cancel went through the gateway: the server's stream ended.
    assert_eq!(
        next_line(&mut lines, "`cancelled`").await.trim(),
        "cancelled"
    );
    drop(server);
}
