//! `server.runtime`: a config that does not name a runtime is served per core (one thread per
//! core, `fanout-core-N`), and `work_stealing` brings back the one
//! multi-threaded runtime (`fanout-worker`) — read from the running `fanout serve` process's
//! threads (/proc/PID/task), with a request answered on each.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};

const ROUTES: &str = r#"
routes:
  - path: /hello
    respond: { body: '{hello: "world"}' }
"#;

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The port in the `fanout serving` log line (JSON logs).
fn serving_port(log: &str) -> Option<u16> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "fanout serving")
        .and_then(|v| {
            let addr: std::net::SocketAddr = v["fields"]["addr"].as_str()?.parse().ok()?;
            Some(addr.port())
        })
}

/// `GET path` on 127.0.0.1:`port` over HTTP/1.1: the whole answer as text.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The names of the process's threads.
fn thread_names(pid: u32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Start `fanout serve --workers 2` on `config`, wait until it answers, and return its threads'
/// names.
async fn threads_of(name: &str, config: &str) -> BTreeSet<String> {
    let dir = std::env::temp_dir().join(format!(
        "fanout-runtime-default-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fanout.yaml");
    std::fs::write(&file, config).unwrap();
    let log = dir.join("stderr.log");
    let mut gw = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
            .args([
                "--admin-listen",
                "127.0.0.1:0",
                "--workers",
                "2",
                "--config",
            ])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut port = None;
    fanout_testkit::wait_until("the gateway to log its address", || {
        if let Ok(Some(status)) = gw.0.try_wait() {
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("fanout serve exited ({status}):\n{err}");
        }
        port = serving_port(&std::fs::read_to_string(&log).unwrap_or_default());
        port.is_some()
    })
    .await;
    let port = port.unwrap();
    let answer = get(port, "/hello").unwrap_or_default();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains(r#"{"hello":"world"}"#),
        "{name}: {answer}"
    );
    let names = thread_names(gw.0.id());
    let _ = std::fs::remove_dir_all(&dir);
    names
}

#[tokio::test]
async fn a_config_without_a_runtime_is_served_per_core() {
    let names = threads_of("default", ROUTES).await;
    // The serving cores' threads live as long as the gateway (the control runtime's blocking
    // threads, `fanout-control`, come and go with their work: not asserted).
    for want in ["fanout-core-0", "fanout-core-1"] {
        assert!(names.contains(want), "no {want} thread: {names:?}");
    }
    assert!(
        !names.contains("fanout-worker"),
        "a work-stealing worker in a per-core gateway: {names:?}"
    );
}

#[tokio::test]
async fn work_stealing_is_one_multi_threaded_runtime() {
    let config = format!("server: {{ runtime: work_stealing }}\n{ROUTES}");
    let names = threads_of("work-stealing", &config).await;
    assert!(names.contains("fanout-worker"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("fanout-core")),
        "a per-core thread in a work-stealing gateway: {names:?}"
    );
}
