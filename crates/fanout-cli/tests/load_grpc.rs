//! `fanout load --grpc`: the binary against the testkit's hand-written h2c gRPC server
//! (`fanout_testkit::grpc`), which records the exact bytes of the framed message the JSON asked
//! for.
//!
//! Counts and exit codes only, no timings (a loaded 2-core machine): a run the generator could
//! not keep on schedule exits 3 instead of 0, which is accepted where 0 is expected.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use fanout_testkit::TempDir;
use fanout_testkit::grpc::{GrpcServer, grpc_answer, grpc_trailers};
use std::path::Path;

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

/// The server: `Hello` answers `EchoReply { message: "hi" }` then OK, anything else
/// UNAVAILABLE in the trailers.
async fn server() -> GrpcServer {
    GrpcServer::start(|req| {
        if req.path == "/test.v1.Echo/Hello" {
            grpc_answer(Some(&[0x0a, 2, b'h', b'i']), Some(grpc_trailers("0", None)))
        } else {
            grpc_answer(None, Some(grpc_trailers("14", None)))
        }
    })
    .await
}

/// A temp directory with `protos/test.proto`, removed on drop.
fn dir() -> TempDir {
    let d = TempDir::new("load-grpc-cli");
    d.write("protos/test.proto", PROTO);
    d
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `fanout load ARGS` run in `cwd`.
async fn fanout_load(cwd: &Path, args: &[&str]) -> Out {
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
    let server = server().await;
    let addr = server.addr;
    let d = dir();
    let url = server.url();
    let json_file = d.join("report.json");
    let json_path = json_file.to_str().unwrap();

    // A relative --proto with no --import-path: found next to itself.
    let ok = fanout_load(
        d.path(),
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
    let seen = server.requests();
    assert_eq!(seen.len(), 40);
    for r in &seen {
        assert_eq!(r.path, "/test.v1.Echo/Hello");
        assert_eq!(r.body.as_ref(), FRAMED, "the framed message");
        assert_eq!(r.header("x-tenant"), Some("t1"));
    }

    // Every answer UNAVAILABLE: the error-rate threshold fails (exit 2). host:port works too.
    let busy = fanout_load(
        d.path(),
        &[
            &addr.to_string(),
            "--grpc",
            "test.v1.Echo/Busy",
            "--proto",
            d.join("protos/test.proto").to_str().unwrap(),
            "--import-path",
            d.join("protos").to_str().unwrap(),
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
    assert_eq!(server.count(), 60);

    // Mistakes are caught before any request, naming the flag and what to write instead.
    let proto = "protos/test.proto";
    let bad = fanout_load(
        d.path(),
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
        d.path(),
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
        d.path(),
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
        d.path(),
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
    let bad = fanout_load(d.path(), &[&url, "--grpc", "test.v1.Echo/Hello"]).await;
    assert_eq!(bad.code, 2, "clap: --grpc requires --proto");
    assert!(bad.stderr.contains("--proto"), "{}", bad.stderr);
    assert_eq!(server.count(), 60, "no request sent by a refused command");
}
