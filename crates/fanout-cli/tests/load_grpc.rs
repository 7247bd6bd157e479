//! `fanout load --grpc`: the binary against an h2c gRPC server written here (hyper, trailers).
//! The server checks the exact bytes of the framed message the JSON asked for.
//!
//! Counts and exit codes only, no timings (a loaded 2-core machine): a run the generator could
//! not keep on schedule exits 3 instead of 0, which is accepted where 0 is expected.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

const PROTO: &str = r#"syntax = "proto3";
package test.v1;
service Echo {
  rpc Hello(EchoRequest) returns (EchoReply);
  rpc Busy(EchoRequest) returns (EchoReply);
}
message EchoRequest { string name = 1; int32 count = 2; }
message EchoReply { string message = 1; }
"#;

/// `{"name": "cli", "count": 3}` as a framed EchoRequest: field 1 (string, "cli"), field 2
/// (varint, 3), behind the 5-byte prefix.
const FRAMED: &[u8] = &[0, 0, 0, 0, 7, 0x0a, 3, b'c', b'l', b'i', 0x10, 3];

/// What the server saw of one call: path, body bytes, `x-tenant`.
type Seen = Arc<Mutex<Vec<(String, Bytes, Option<String>)>>>;

fn trailers(code: &'static str) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static(code));
    t
}

async fn handle(req: Request<Incoming>, seen: Seen) -> Response<BoxBody<Bytes, Infallible>> {
    let path = req.uri().path().to_string();
    let tenant = req
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    seen.lock().unwrap().push((path.clone(), body, tenant));
    let body = if path == "/test.v1.Echo/Hello" {
        // EchoReply { message: "hi" }, then OK.
        Full::new(Bytes::from_static(&[0, 0, 0, 0, 4, 0x0a, 2, b'h', b'i']))
            .with_trailers(std::future::ready(Some(Ok(trailers("0")))))
            .boxed()
    } else {
        Empty::new()
            .with_trailers(std::future::ready(Some(Ok(trailers("14")))))
            .boxed()
    };
    let mut r = Response::new(body);
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    r
}

async fn server() -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let s = s.clone();
                    async move { Ok::<_, Infallible>(handle(req, s).await) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A temp directory with `protos/test.proto`, removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir() -> Dir {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("fanout-load-grpc-cli-{}-{n}", std::process::id()));
    std::fs::create_dir_all(d.join("protos")).unwrap();
    std::fs::write(d.join("protos/test.proto"), PROTO).unwrap();
    Dir(d)
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `fanout load ARGS` run in `cwd`.
async fn fanout_load(cwd: &PathBuf, args: &[&str]) -> Out {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("load")
        .args(args)
        .current_dir(cwd)
        .output()
        .await
        .unwrap();
    let o = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "fanout load {args:?} → {}\n{}{}",
        o.code, o.stdout, o.stderr
    );
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_load_from_the_command_line() {
    let (addr, seen) = server().await;
    let d = dir();
    let url = format!("http://{addr}");
    let json_file = d.0.join("report.json");
    let json_path = json_file.to_str().unwrap();

    // A relative --proto with no --import-path: found next to itself.
    let ok = fanout_load(
        &d.0,
        &[
            &url,
            "--grpc",
            "test.v1.Echo/Hello",
            "--proto",
            "protos/test.proto",
            "--data",
            r#"{"name": "cli", "count": 3}"#,
            "-H",
            "x-tenant: t1",
            "--schedule",
            "const(40,1s)",
            "--threshold",
            "errors<1%",
            "--json",
            json_path,
        ],
    )
    .await;
    assert!(ok.code == 0 || ok.code == 3, "exit {}", ok.code);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    assert_eq!(report["protocol"], "grpc");
    assert_eq!(report["ok"], 40);
    assert_eq!(report["grpc_status"], serde_json::json!({"OK": 40}));
    assert_eq!(report["grpc_missing_status"], 0);
    assert!(ok.stdout.contains("grpc       OK 40"), "{}", ok.stdout);
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 40);
        for (path, body, tenant) in seen.iter() {
            assert_eq!(path, "/test.v1.Echo/Hello");
            assert_eq!(body.as_ref(), FRAMED, "the framed message");
            assert_eq!(tenant.as_deref(), Some("t1"));
        }
    }

    // Every answer UNAVAILABLE: the error-rate threshold fails (exit 2). host:port works too.
    let busy = fanout_load(
        &d.0,
        &[
            &addr.to_string(),
            "--grpc",
            "test.v1.Echo/Busy",
            "--proto",
            d.0.join("protos/test.proto").to_str().unwrap(),
            "--import-path",
            d.0.join("protos").to_str().unwrap(),
            "-d",
            r#"{"name": "cli", "count": 3}"#,
            "--schedule",
            "const(20,1s)",
            "--threshold",
            "errors<1%",
            "--json",
            json_path,
        ],
    )
    .await;
    assert_eq!(busy.code, 2, "threshold exit code");
    assert!(
        busy.stdout.contains("THRESHOLD FAILED: errors<1%"),
        "{}",
        busy.stdout
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    assert_eq!(
        report["grpc_status"],
        serde_json::json!({"UNAVAILABLE": 20})
    );
    assert_eq!(
        (report["ok"].as_u64(), report["rejected"].as_u64()),
        (Some(0), Some(20))
    );
    assert_eq!(seen.lock().unwrap().len(), 60);

    // Mistakes are caught before any request, naming the flag and what to write instead.
    let proto = "protos/test.proto";
    let bad = fanout_load(
        &d.0,
        &[&url, "--grpc", "test.v1.Echo/Helo", "--proto", proto],
    )
    .await;
    assert_eq!(bad.code, 1);
    assert!(
        bad.stderr
            .contains("--grpc: service `test.v1.Echo` has no method `Helo`; did you mean `Hello`?"),
        "{}",
        bad.stderr
    );
    let bad = fanout_load(
        &d.0,
        &[
            &url,
            "--grpc",
            "test.v1.Echo/Hello",
            "--proto",
            proto,
            "-d",
            r#"{"nmae": "x"}"#,
        ],
    )
    .await;
    assert_eq!(bad.code, 1);
    assert!(bad.stderr.contains("--data: "), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("at `nmae`") && bad.stderr.contains("did you mean `name`?"),
        "{}",
        bad.stderr
    );
    let bad = fanout_load(
        &d.0,
        &[
            &url,
            "--grpc",
            "test.v1.Echo/Hello",
            "--proto",
            "nope.proto",
        ],
    )
    .await;
    assert_eq!(bad.code, 1);
    assert!(
        bad.stderr.contains("--proto: nope.proto: no such file"),
        "{}",
        bad.stderr
    );
    let bad = fanout_load(
        &d.0,
        &[
            &format!("{url}/x"),
            "--grpc",
            "test.v1.Echo/Hello",
            "--proto",
            proto,
        ],
    )
    .await;
    assert_eq!(bad.code, 1);
    assert!(
        bad.stderr.contains("the method gives the path"),
        "{}",
        bad.stderr
    );
    let bad = fanout_load(&d.0, &[&url, "--grpc", "test.v1.Echo/Hello"]).await;
    assert_eq!(bad.code, 2, "clap: --grpc requires --proto");
    assert!(bad.stderr.contains("--proto"), "{}", bad.stderr);
    assert_eq!(
        seen.lock().unwrap().len(),
        60,
        "no request sent by a refused command"
    );
}
