//! `server.runtime`: a config that does not name a runtime is served per core (one thread per
//! core, `fanout-core-N`), and `work_stealing` brings back the one
//! multi-threaded runtime (`fanout-worker`) — read from the running `fanout serve` process's
//! threads (/proc/PID/task), with a request answered on each.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};

const ROUTES: &str = r#"
routes:
  - path: /hello
    respond: { body: '{hello: "world"}' }
"#;

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
    let gw = support::ServeProcess::start(name, config, &["--workers", "2"], &[]).await;
    let answer = get(gw.port, "/hello").unwrap_or_default();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains(r#"{"hello":"world"}"#),
        "{name}: {answer}"
    );
    thread_names(gw.child.id())
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
