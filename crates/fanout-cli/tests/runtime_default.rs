//! `server.runtime`: a config that does not name a runtime is served per core (one thread per
//! core, `fanout-core-N`), and `work_stealing` brings back the one
//! multi-threaded runtime (`fanout-worker`) — read from the running `fanout serve` process's
//! threads (/proc/PID/task), with a request answered on each.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::BTreeSet;

const ROUTES: &str = r#"
routes:
  - path: /hello
    respond: { body: '{hello: "world"}' }
"#;

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
    let answer = fanout_testkit::h1::get(([127, 0, 0, 1], gw.port).into(), "/hello").await;
    let body = String::from_utf8_lossy(&answer.body);
    assert!(
        answer.status == 200 && body.contains(r#"{"hello":"world"}"#),
        "{name}: {} {body}",
        answer.status
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
