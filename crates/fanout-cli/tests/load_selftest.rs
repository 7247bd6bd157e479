//! Acceptance self-test of the load generator: no coordinated omission.
//!
//! A real `fanout stub` process (1 ms route) is loaded at const(1000, 6s); 2 s in it is frozen
//! with SIGSTOP for 2 s. An open-model generator must charge the pause to every request
//! *scheduled* during it: ≈ 2000 requests, of which those scheduled in the first ~1.5 s of the
//! pause (≈ 1500–1600) wait ≥ 500 ms, and p99 ≥ 1 s. The service time — what a closed-loop
//! tool measures — only sees the requests already written when it froze (at most one per
//! connection: 64).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use fanout_load::{LoadSpec, RequestTemplate, Schedule, run, summary_text};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Kills the stub process (resuming it first, in case it is stopped) and removes the config,
/// also when the test panics.
struct StubProcess {
    child: Child,
    config: PathBuf,
}

impl Drop for StubProcess {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-CONT", &pid]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

async fn answers(port: u16) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let req = "GET /x HTTP/1.1\r\nhost: stub\r\nconnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), s.read_to_end(&mut buf)).await;
    buf.starts_with(b"HTTP/1.1 200")
}

/// Samples of at least 500 ms in a microsecond histogram.
fn at_least_500ms(h: &fanout_load::hdrhistogram::Histogram<u64>) -> u64 {
    h.count_between(500_000, h.max().max(500_000))
}

async fn signal(pid: u32, sig: &str) -> Instant {
    let status = tokio::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .await
        .unwrap_or_else(|e| panic!("kill {sig}: {e}"));
    assert!(status.success(), "kill {sig} {pid} failed");
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_backend_is_charged_to_every_scheduled_request() {
    let test_start = Instant::now();
    let port = fanout_testkit::free_addr().port();
    let config = std::env::temp_dir().join(format!(
        "fanout-load-selftest-{}-{port}.yaml",
        std::process::id()
    ));
    let yaml = format!(
        "services:\n  a:\n    listen: \"127.0.0.1:{port}\"\n    routes:\n      - {{path: /x, latency: 1ms, body: '{{ok: true}}'}}\n"
    );
    std::fs::write(&config, yaml).unwrap_or_else(|e| panic!("write config: {e}"));
    let child = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("stub")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn fanout stub: {e}"));
    let stub = StubProcess { child, config };
    let pid = stub.child.id();

    let what = format!("fanout stub to answer on port {port}");
    fanout_testkit::wait_for_async(&what, Duration::from_secs(5), || async {
        answers(port).await.then_some(())
    })
    .await;

    let schedule = Schedule::parse("const(1000,6s)").unwrap_or_else(|e| panic!("{e}"));
    let mut spec = LoadSpec::new(format!("http://127.0.0.1:{port}"), schedule);
    spec.requests = vec![RequestTemplate::get("/x")];
    // Enough connections for 1000 req/s at 1 ms; few enough that a closed-loop view (requests
    // already written when the stub froze) stays small.
    spec.max_connections = 64;

    let freezer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stopped = signal(pid, "-STOP").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let resumed = signal(pid, "-CONT").await;
        resumed - stopped
    });
    let report = run(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("run: {e}"));
    let pause = freezer.await.unwrap_or_else(|e| panic!("freezer: {e}"));
    drop(stub);

    let corrected_slow = at_least_500ms(&report.latency_hist);
    let service_slow = at_least_500ms(&report.service_hist);
    eprintln!("{}", summary_text(&report));
    eprintln!(
        "pause {pause:?}; samples >= 500 ms: corrected {corrected_slow}, service (closed-loop view) {service_slow}; test took {:?}",
        test_start.elapsed()
    );

    assert_eq!(report.offered, 6000);
    assert_eq!(
        report.completed, 6000,
        "everything is answered after the pause: {:?}",
        report.errors
    );
    assert!(
        report.latency_ms.p99 >= 1000.0,
        "p99 must show the 2 s pause: {:?}",
        report.latency_ms
    );
    assert!(
        (1000..=3000).contains(&corrected_slow),
        "≈1500 requests scheduled during the pause wait >= 500 ms; got {corrected_slow}"
    );
    assert!(
        service_slow < 300,
        "only requests in flight at the pause have a long service time; got {service_slow}"
    );
    assert!(
        report.service_ms.p95 < 500.0 && report.latency_ms.p95 >= 1000.0,
        "the closed-loop view hides the pause: service p95 {} ms vs latency p95 {} ms",
        report.service_ms.p95,
        report.latency_ms.p95
    );
}
