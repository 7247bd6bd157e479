//! End-to-end runs of the load generator against in-process `fanout-stub` backends.
//!
//! Timing assertions are deliberately loose: these run on a shared 2-core machine.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use fanout_load::{
    LoadReport, LoadSpec, Protocol, RequestTemplate, Schedule, SecondStats, Threshold,
    check_thresholds, run, summary_text,
};
use fanout_stub::StubServer;
use fanout_testkit::start_stubs;
use std::sync::Mutex;
use std::time::Duration;

/// The tests measure timing on a small machine: run them one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn stub(route: &str) -> StubServer {
    let yaml = format!(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - {{path: /x, {route}}}\n"
    );
    start_stubs(&yaml).await
}

fn spec(stub: &StubServer, schedule: &str) -> LoadSpec {
    let addr = stub
        .addr("a")
        .unwrap_or_else(|| panic!("stub service a missing"));
    let schedule = Schedule::parse(schedule).unwrap_or_else(|e| panic!("{e}"));
    let mut s = LoadSpec::new(format!("http://{addr}"), schedule);
    s.requests = vec![RequestTemplate::get("/x")];
    s
}

async fn go(spec: &LoadSpec) -> LoadReport {
    let r = run(spec, None).await.unwrap_or_else(|e| panic!("run: {e}"));
    eprintln!("{}", summary_text(&r));
    r
}

/// Run until valid, at most 5 times: the machine is shared, and a run during which other
/// processes took the CPU is (correctly) reported invalid by the lag check.
async fn go_valid(
    spec: &LoadSpec,
    progress: Option<&(dyn Fn(&SecondStats) + Send + Sync)>,
) -> LoadReport {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let r = run(spec, progress)
            .await
            .unwrap_or_else(|e| panic!("run: {e}"));
        eprintln!("{}", summary_text(&r));
        if r.valid || attempt == 5 {
            return r;
        }
        eprintln!(
            "attempt {attempt} invalid ({:?}); retrying",
            r.invalid_reason
        );
    }
}

/// A run is valid exactly when it has no reason to be invalid, and the only reason a healthy
/// run against a stub can be invalid is generator lag above the spec's threshold.
fn check_verdict(r: &LoadReport, spec: &LoadSpec) {
    assert_eq!(
        r.valid,
        r.invalid_reason.is_none(),
        "{:?}",
        r.invalid_reason
    );
    if let Some(reason) = &r.invalid_reason {
        assert!(reason.contains("lag"), "{reason}");
        assert!(
            r.lag_ms.p99 >= spec.lag_threshold.as_secs_f64() * 1000.0,
            "{reason}"
        );
    }
}

fn check_accounting(r: &LoadReport) {
    assert_eq!(
        r.offered,
        r.completed + r.errors.total(),
        "every offered request is accounted for: {r:?}"
    );
    let classes: u64 = r.status_classes.iter().iter().map(|(_, n)| n).sum();
    assert_eq!(classes, r.completed);
    assert_eq!(r.status_classes.s2xx, r.ok);
    let per_second: u64 = r.seconds.iter().map(|s| s.offered).sum();
    assert_eq!(per_second, r.offered, "per-second offered adds up");
    let sent: u64 = r.seconds.iter().map(|s| s.sent).sum();
    assert_eq!(sent, r.sent, "per-second sent adds up");
    for (i, s) in r.seconds.iter().enumerate() {
        assert_eq!(s.t, i as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn const_rate_completes_all_and_is_valid() {
    let _serial = SERIAL.lock().await;
    let stub = stub("latency: 2ms, body: '{ok: true}'").await;
    let spec = spec(&stub, "const(200,2s)");
    let seen: Mutex<Vec<SecondStats>> = Mutex::new(Vec::new());
    let progress = |s: &SecondStats| {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        if s.t == 0 {
            seen.clear(); // a retried run starts over
        }
        seen.push(*s);
    };
    let r = go_valid(&spec, Some(&progress)).await;
    assert_eq!(r.offered, 400);
    assert_eq!(r.sent, 400);
    assert_eq!(r.completed, 400);
    assert_eq!(r.ok, 400);
    assert_eq!(r.error_rate, 0.0);
    // Whether the run is valid depends on how busy the machine was (the lag check, tested on
    // its own below); what must hold is that the verdict and its reason agree.
    check_verdict(&r, &spec);
    assert!(
        r.latency_ms.p50 >= 2.0,
        "stub latency is 2 ms: {:?}",
        r.latency_ms
    );
    assert!(r.service_ms.p50 <= r.latency_ms.p50 + 0.01);
    assert_eq!(r.bytes_received, 400 * "{\"ok\":true}".len() as u64);
    assert!(r.connections_opened >= 1 && r.connections_opened <= spec.max_connections as u64);
    assert!(r.max_connections_used >= 1);
    assert!((r.offered_rps - 200.0).abs() < 1e-9);
    assert!((r.achieved_rps - 200.0).abs() < 1e-9);
    assert_eq!(r.latency_hist.len(), 400);
    assert_eq!(r.lag_hist.len(), 400);
    assert!(
        r.seconds.len() >= 2 && r.seconds.len() <= 3,
        "{:?}",
        r.seconds
    );
    assert_eq!(r.seconds[0].offered, 200);
    assert_eq!(r.seconds[1].offered, 200);
    check_accounting(&r);
    let seen = seen.into_inner().unwrap_or_else(|p| p.into_inner());
    assert_eq!(seen, r.seconds, "progress saw every second, in order");

    // JSON round trip: the schema is the struct.
    let json = serde_json::to_value(&r).unwrap_or_else(|e| panic!("{e}"));
    for key in [
        "target",
        "protocol",
        "schedule",
        "duration_s",
        "offered",
        "sent",
        "completed",
        "ok",
        "status_classes",
        "errors",
        "error_rate",
        "latency_ms",
        "service_ms",
        "lag_ms",
        "late_fraction",
        "valid",
        "invalid_reason",
        "connections_opened",
        "max_connections_used",
        "seconds",
    ] {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }
    assert_eq!(json["protocol"], "http1");
    assert_eq!(json["schedule"], "const(200,2s)");
    assert_eq!(json["status_classes"]["2xx"], 400);
    assert_eq!(json["errors"]["not_sent"], 0);
    assert!(json.get("latency_hist").is_none());
    let back: LoadReport = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.completed, 400);
    assert_eq!(back.seconds, r.seconds);

    let ths: Vec<Threshold> = ["p99<500ms", "errors<1%", "rate>=190"]
        .iter()
        .map(|t| Threshold::parse(t).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert!(check_thresholds(&r, &ths).is_empty());
    let fail = Threshold::parse("p50<1ms").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(check_thresholds(&r, &[fail]).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_classified() {
    let _serial = SERIAL.lock().await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().unwrap_or_else(|e| panic!("{e}")).port()
    };
    let schedule = Schedule::parse("const(50,1s)").unwrap_or_else(|e| panic!("{e}"));
    let spec = LoadSpec::new(format!("http://127.0.0.1:{port}"), schedule);
    let r = go(&spec).await;
    assert_eq!(r.offered, 50);
    assert_eq!(r.errors.connect_refused, 50, "{:?}", r.errors);
    assert_eq!(r.completed, 0);
    assert_eq!(r.sent, 0);
    assert_eq!(r.error_rate, 1.0);
    assert_eq!(r.connections_opened, 0);
    check_accounting(&r);
    assert!(summary_text(&r).contains("connect_refused 50"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_counted_by_class() {
    let _serial = SERIAL.lock().await;
    let stub = stub("status: 503, body: '{down: true}'").await;
    let r = go(&spec(&stub, "const(100,1s)")).await;
    assert_eq!(r.completed, 100);
    assert_eq!(r.ok, 0);
    assert_eq!(r.status_classes.s5xx, 100);
    assert_eq!(r.errors.total(), 0);
    assert_eq!(r.error_rate, 1.0);
    assert_eq!(
        r.seconds[0].completed - r.seconds[0].ok,
        r.seconds[0].completed
    );
    check_accounting(&r);
    let fails = check_thresholds(
        &r,
        &[Threshold::parse("errors<1%").unwrap_or_else(|e| panic!("{e}"))],
    );
    assert_eq!(fails.len(), 1, "{fails:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_are_recorded_at_the_timeout() {
    let _serial = SERIAL.lock().await;
    let stub = stub("latency: 2s").await;
    let mut spec = spec(&stub, "const(20,1s)");
    spec.timeout = Duration::from_millis(200);
    spec.drain = Duration::from_millis(500);
    let r = go(&spec).await;
    assert_eq!(r.errors.timeout, 20, "{:?}", r.errors);
    assert_eq!(r.completed, 0);
    assert_eq!(r.sent, 20);
    assert_eq!(
        r.latency_hist.len(),
        20,
        "timeouts are in the latency histogram"
    );
    assert!(
        r.latency_ms.p50 >= 199.0 && r.latency_ms.p50 < 260.0,
        "{:?}",
        r.latency_ms
    );
    assert!(r.latency_ms.max < 300.0, "{:?}", r.latency_ms);
    assert!(r.service_ms.p50 >= 190.0 && r.service_ms.p50 <= 201.0);
    // Each HTTP/1.1 timeout costs its connection.
    assert!(r.connections_opened >= 2);
    assert_eq!(r.errors.not_sent, 0);
    check_accounting(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_at_the_end_is_aborted() {
    let _serial = SERIAL.lock().await;
    let stub = stub("latency: 2s").await;
    let mut spec = spec(&stub, "const(20,500ms)");
    spec.drain = Duration::from_millis(200);
    let r = go(&spec).await;
    assert_eq!(r.offered, 10);
    assert_eq!(r.errors.aborted_at_end, 10, "{:?}", r.errors);
    assert_eq!(r.errors.not_sent, 0);
    // Aborted requests are results, not generator failures.
    let reason = r.invalid_reason.clone().unwrap_or_default();
    assert!(!reason.contains("could not be sent"), "{reason}");
    check_accounting(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_queues_then_counts_not_sent() {
    let _serial = SERIAL.lock().await;
    let stub = stub("latency: 100ms").await;
    let mut spec = spec(&stub, "const(50,1s)");
    spec.max_connections = 1;
    spec.drain = Duration::from_millis(300);
    let r = go(&spec).await;
    assert_eq!(r.max_connections_used, 1);
    assert_eq!(r.connections_opened, 1);
    // One connection at ~100 ms per request: ~13 done in 1.3 s, the rest never left.
    assert!(r.completed >= 8 && r.completed <= 14, "{}", r.completed);
    assert_eq!(r.errors.aborted_at_end, 1, "{:?}", r.errors);
    assert!(r.errors.not_sent >= 30, "{:?}", r.errors);
    // Queueing shows up as latency (from the intended time) but not as service time.
    assert!(r.latency_ms.max > 500.0, "{:?}", r.latency_ms);
    assert!(r.service_ms.max < 200.0, "{:?}", r.service_ms);
    assert!(!r.valid);
    let reason = r.invalid_reason.clone().unwrap_or_default();
    assert!(
        reason.contains("generator lagged behind schedule"),
        "{reason}"
    );
    assert!(reason.contains("connection pool exhausted"), "{reason}");
    assert!(reason.contains("could not be sent"), "{reason}");
    assert!(summary_text(&r).contains("WARNING: INVALID RUN"));
    check_accounting(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_rate_is_invalid() {
    let _serial = SERIAL.lock().await;
    let stub = stub("body: '{ok: true}'").await;
    let mut spec = spec(&stub, "const(200000,2s)");
    spec.max_connections = 64;
    spec.drain = Duration::from_millis(500);
    let r = go(&spec).await;
    assert_eq!(r.offered, 400_000);
    assert!(!r.valid);
    let reason = r.invalid_reason.clone().unwrap_or_default();
    assert!(reason.contains("lag p99"), "{reason}");
    assert!(r.lag_ms.p99 > 1.0);
    assert!(r.late_fraction > 0.1);
    assert!(r.achieved_rps < 200_000.0);
    check_accounting(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_multiplexes() {
    let _serial = SERIAL.lock().await;
    let stub = stub("latency: 5ms").await;
    let mut spec = spec(&stub, "const(200,2s)");
    spec.protocol = Protocol::Http2;
    // The unoptimised h2 stacks of client and in-process server share two cores here (and the
    // machine with other builds); the 1 ms default is checked in release by the calibration.
    spec.lag_threshold = Duration::from_millis(5);
    let r = go_valid(&spec, None).await;
    assert_eq!(r.protocol, Protocol::Http2);
    assert_eq!(r.completed, 400);
    assert_eq!(r.ok, 400);
    assert_eq!(r.connections_opened, 1, "all streams share one connection");
    check_verdict(&r, &spec);
    assert!(r.latency_ms.p50 >= 5.0);
    check_accounting(&r);
    let json = serde_json::to_value(&r).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json["protocol"], "http2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_are_opened_first_and_used_in_turn() {
    let _serial = SERIAL.lock().await;
    let stub = stub("latency: 1ms").await;
    let mut spec = spec(&stub, "const(400,1s)");
    spec.protocol = Protocol::Http2;
    spec.open_connections = 200;
    spec.max_connections = 4;
    spec.lag_threshold = Duration::from_millis(5);
    let r = go(&spec).await;
    assert_eq!(r.ok, 400);
    // All 200 before the first request, none more: 400 requests took them in turn (the pool
    // would otherwise have carried them on one connection, like `http2_multiplexes`).
    assert_eq!(r.connections_opened, 200);
    assert_eq!(r.max_connections_used, 200);
    check_accounting(&r);
    // HTTP/1.1 connections open on demand only.
    let mut h1 = spec.clone();
    h1.protocol = Protocol::Http1;
    let e = run(&h1, None).await.err().map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("open_connections"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ramp_and_round_robin() {
    let _serial = SERIAL.lock().await;
    let yaml = "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - {path: /x}\n      - {path: /y, status: 404}\n";
    let stub = start_stubs(yaml).await;
    let mut spec = spec(&stub, "line(0,200,1s) const(0,500ms)");
    spec.requests = vec![RequestTemplate::get("/x"), RequestTemplate::get("/y")];
    let r = go(&spec).await;
    assert_eq!(r.offered, 100);
    assert_eq!(r.completed, 100);
    assert_eq!(r.ok, 50);
    assert_eq!(r.status_classes.s4xx, 50);
    assert!((r.error_rate - 0.5).abs() < 1e-9);
    assert!(r.elapsed_s >= 1.5, "the pause is part of the schedule");
    assert_eq!(r.seconds.len(), 2);
    assert_eq!(r.seconds[1].offered, 0);
    check_accounting(&r);
}

#[tokio::test]
async fn bad_specs_are_errors() {
    let _serial = SERIAL.lock().await;
    let schedule = Schedule::parse("const(1,1s)").unwrap_or_else(|e| panic!("{e}"));
    let mut spec = LoadSpec::new("ftp://127.0.0.1:1", schedule.clone());
    let e = run(&spec, None).await.err().map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("unsupported scheme"));
    // https: a CA file that cannot be read is an error before anything is sent.
    spec.target = "https://127.0.0.1:1".into();
    spec.tls.cacert = Some("/nonexistent/ca.pem".into());
    let e = run(&spec, None).await.err().map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("--cacert"));
    spec.tls.cacert = None;
    spec.target = "http://127.0.0.1:1".into();
    spec.max_connections = 0;
    let e = run(&spec, None).await.err().map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("max_connections"));
    spec.max_connections = 1;
    spec.requests.clear();
    let e = run(&spec, None).await.err().map(|e| e.to_string());
    assert!(e.unwrap_or_default().contains("request template"));
}
