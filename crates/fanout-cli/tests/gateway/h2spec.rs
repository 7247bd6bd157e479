//! HTTP/2 conformance with h2spec (tier 2; `scripts/h2spec` runs the same and prints the
//! failures): every case passes on h2c (prior knowledge, beside HTTP/1.1 on the same port) and
//! on TLS (h2 by ALPN). h2spec is built once through the Go module proxy (`go install`) under
//! `$FANOUT_TOOLS_DIR` (default `~/.cache/fanout-tools`), as grpcurl for the gRPC interop test.

use crate::support::ServeProcess;
use crate::support::python::{run, tools_dir};
use fanout_testkit::TempDir;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// As `scripts/h2spec`.
const H2SPEC_VERSION: &str = "v2.2.1";

/// h2spec, built once; panics when Go is missing (`./scripts/test` asks for it) or the build
/// fails.
fn h2spec() -> PathBuf {
    let dir = tools_dir().join(format!("h2spec-{H2SPEC_VERSION}"));
    let bin = dir.join("h2spec");
    if bin.is_file() {
        return bin;
    }
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| Command::new(g).arg("version").output().is_ok())
        .expect("Go (>= 1.24) is needed once to build h2spec: https://go.dev/dl/");
    eprintln!(
        "installing h2spec {H2SPEC_VERSION} into {} (go install, once)",
        dir.display()
    );
    run(
        Command::new(go)
            .env("GOBIN", &dir)
            .env("GOFLAGS", "-mod=mod")
            .arg("install")
            .arg(format!(
                "github.com/summerwind/h2spec/cmd/h2spec@{H2SPEC_VERSION}+incompatible"
            )),
        "go install h2spec",
    )
    .unwrap();
    bin
}

/// h2spec asks for `/` (GET and POST, some with a body) and wants an answer.
const ROUTES: &str = r#"
routes:
  - path: /
    respond: { body: '{"ok": true}' }
  - path: /
    method: POST
    respond: { body: '{"ok": true}' }
"#;

/// h2spec's output against the gateway on `port`, with `args`; its last line is the count.
async fn h2spec_against(bin: &PathBuf, port: u16, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(bin)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-o", "10"])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("h2spec ends in time")
    .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs Go (h2spec)"]
async fn h2spec_passes_on_h2c_and_tls() {
    let bin = tokio::task::spawn_blocking(h2spec).await.unwrap();
    let h2c = ServeProcess::launch("h2spec", ROUTES).start().await;
    let out = h2spec_against(&bin, h2c.port, &[]).await;
    assert!(
        out.trim_end()
            .ends_with("145 tests, 145 passed, 0 skipped, 0 failed"),
        "h2c:\n{out}"
    );

    let dir = TempDir::new("h2spec-tls");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let yaml = format!(
        "{ROUTES}\ntls:\n  certificates:\n    - {{ cert_file: '{}', key_file: '{}' }}\n",
        cert.display(),
        key.display()
    );
    let tls = ServeProcess::launch("h2spec-tls", &yaml).start().await;
    let out = h2spec_against(&bin, tls.port, &["-t", "-k"]).await;
    assert!(
        out.trim_end()
            .ends_with("145 tests, 145 passed, 0 skipped, 0 failed"),
        "TLS:\n{out}"
    );
}
