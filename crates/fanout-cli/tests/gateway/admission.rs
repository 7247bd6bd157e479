//! R2: at the concurrency limit, requests wait briefly in a bounded queue or are rejected at once
//! with 503 + Retry-After — never queued until they time out.
//!
//! The routes say `coalesce: false`: concurrent identical requests must each run their flow here
//! (coalescing has its own tests in `coalesce.rs`).

use crate::support::gateway;
use fanout_testkit::*;
use futures_util::future::join_all;
use http::Method;

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes: [{ path: /slow, latency: 400ms, body: '{ok: true}' }]
"#;

const GATEWAY: &str = r#"
server:
  admission: { max_concurrency: 2, queue: 1, queue_timeout: 50ms }
backends:
  a: { url: "http://${A_ADDR}", dedup: false }
routes:
  - path: /slow
    coalesce: false
    deadline: 5s
    flow:
      s: { http: { backend: a, path: '"/slow"' } }
    respond: { body: '$s' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_requests_are_rejected_at_once_with_retry_after() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let url = format!("http://{}/slow", gw.addr);
    let stub = &s;
    let answers = join_all((0..6).map(|_| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let r = send(&c, Method::GET, &url, &[], "").await;
            // When a rejection arrives, no admitted request has finished yet.
            let finished = stub.stats("a").unwrap().routes["GET /slow"].completed;
            (r, finished)
        }
    }))
    .await;
    let ok = answers.iter().filter(|(r, _)| r.status == 200).count();
    let rejected: Vec<_> = answers.iter().filter(|(r, _)| r.status == 503).collect();
    assert_eq!(ok, 2, "two slots");
    assert_eq!(
        rejected.len(),
        4,
        "one waited 50 ms then gave up, three were rejected at once"
    );
    for (r, finished) in &rejected {
        assert_eq!(r.code(), "overloaded");
        assert_eq!(r.headers["retry-after"], "1");
        assert_eq!(
            *finished, 0,
            "rejected without waiting for the admitted requests"
        );
    }
    let st = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    let a = &st["admission"];
    assert_eq!(a["admitted"], 2, "{st}"); // the status endpoint itself is never subject to admission
    assert!(
        st["runtime"]["stalls"].is_u64(),
        "the stall watchdog runs: {st}"
    );
    assert_eq!(a["rejected_queue_full"], 3, "{st}");
    assert_eq!(a["rejected_waited_too_long"], 1, "{st}");
    assert_eq!(
        s.stats("a").unwrap().routes["GET /slow"].requests,
        2,
        "rejected requests did no flow work"
    );
}

// ---------------------------------------------------------------------------------------------
// Priority classes, per-route limits, CoDel, adaptive limit. Outcomes are counted, never timed:
// backends are slow enough (seconds) that every request of a phase is decided while the admitted
// ones still run; phases are sequenced through the status counters.

const SLOW_STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - { path: /slow, latency: 3s, body: '{ok: true}' }
      - { path: /fast, latency: 20ms, body: '{ok: true}' }
"#;

/// Start `n` GET requests to `url` in the background.
fn spawn_gets(c: &TestClient, url: &str, n: usize) -> Vec<tokio::task::JoinHandle<Resp>> {
    (0..n)
        .map(|_| {
            let (c, url) = (c.clone(), url.to_string());
            tokio::spawn(async move { send(&c, Method::GET, &url, &[], "").await })
        })
        .collect()
}

/// Send `n` GETs to `url` at once; each answer with the number of `/slow` calls stub `a` had
/// completed when it arrived (0 or 1 here: answered while the admitted requests still ran).
async fn answered_while_running(
    c: &TestClient,
    url: &str,
    stubs: &fanout_stub::StubServer,
    n: usize,
) -> Vec<(Resp, u64)> {
    join_all((0..n).map(|_| async move {
        let r = send(c, Method::GET, url, &[], "").await;
        (r, stubs.stats("a").unwrap().routes["GET /slow"].completed)
    }))
    .await
}

/// Wait for every request and count `(200s, 503s)`; anything else fails the test.
async fn outcomes(handles: Vec<tokio::task::JoinHandle<Resp>>) -> (usize, usize) {
    let (mut ok, mut rejected) = (0, 0);
    for h in handles {
        let r = h.await.expect("request task");
        match r.status.as_u16() {
            200 => ok += 1,
            503 => {
                assert_eq!(r.code(), "overloaded");
                assert_eq!(r.headers["retry-after"], "1");
                rejected += 1;
            }
            s => panic!(
                "unexpected status {s}: {}",
                String::from_utf8_lossy(&r.body)
            ),
        }
    }
    (ok, rejected)
}

/// The gateway's `admission` status object.
async fn admission_status(addr: &str) -> serde_json::Value {
    get(&format!("http://{addr}/__fanout/status")).await.json()["admission"].clone()
}

/// Poll the admission status until `f` holds (phases are sequenced on counters, not on time).
async fn until_status(addr: &str, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
    for _ in 0..500 {
        if f(&admission_status(addr).await) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!(
        "timed out waiting for: {what}; admission = {}",
        admission_status(addr).await
    );
}

const PRIORITY_GATEWAY: &str = r#"
server:
  admission: { max_concurrency: 8, queue: 0 }
defaults: { timeout: 8s }
backends:
  a: { url: "http://${A_ADDR}", dedup: false }
routes:
  - path: /critical
    coalesce: false
    deadline: 10s
    admission: { priority: critical }
    flow:
      s: { http: { backend: a, path: '"/slow"' } }
    respond: { body: '$s' }
  - path: /sheddable
    coalesce: false
    deadline: 10s
    admission: { priority: sheddable }
    flow:
      s: { http: { backend: a, path: '"/slow"' } }
    respond: { body: '$s' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_requests_are_admitted_while_sheddable_ones_absorb_the_rejections() {
    let s = stubs(SLOW_STUBS).await;
    let gw = gateway(PRIORITY_GATEWAY, &s).await;
    let addr = gw.addr.to_string();
    let c = client(false);
    let shed_url = format!("http://{addr}/sheddable");
    let crit_url = format!("http://{addr}/critical");

    // Phase 1: slow sheddable requests fill their share (0.5 × 8 = 4 slots); the rest is shed.
    let phase1 = spawn_gets(&c, &shed_url, 8);
    until_status(&addr, "8 sheddable requests decided", |a| {
        a["admitted_by_priority"]["sheddable"] == 4 && a["rejected_by_priority"]["sheddable"] == 4
    })
    .await;

    // Phase 2: a 50/50 mix while they run. Critical requests may use the whole limit: all 4 fit;
    // sheddable ones find their share full and are rejected at once.
    let mut mixed_crit = Vec::new();
    let mut mixed_shed = Vec::new();
    for _ in 0..4 {
        mixed_crit.extend(spawn_gets(&c, &crit_url, 1));
        mixed_shed.extend(spawn_gets(&c, &shed_url, 1));
    }
    let (crit_ok, crit_rejected) = outcomes(mixed_crit).await;
    let (shed_ok, shed_rejected) = outcomes(mixed_shed).await;
    let (p1_ok, p1_rejected) = outcomes(phase1).await;
    assert_eq!((p1_ok, p1_rejected), (4, 4), "sheddable share of 8 is 4");
    assert_eq!(
        (crit_ok, crit_rejected),
        (4, 0),
        "critical: every request admitted"
    );
    assert_eq!(
        (shed_ok, shed_rejected),
        (0, 4),
        "sheddable absorbs the rejections"
    );

    let a = admission_status(&addr).await;
    assert_eq!(a["limit"], 8, "{a}");
    assert_eq!(a["limit_by_priority"]["sheddable"], 4, "{a}");
    assert_eq!(a["rejected_by_priority"]["critical"], 0, "{a}");
    assert_eq!(a["rejected_by_priority"]["sheddable"], 8, "{a}");
    assert_eq!(a["admitted"], 8, "{a}");
    assert_eq!(a["rejected_queue_full"], 8, "{a}");
    assert_eq!(a["in_flight"], 0, "{a}");
    assert_eq!(calls(&s, "a"), 8, "rejected requests did no flow work");
}

const ROUTE_LIMIT_GATEWAY: &str = r#"
server:
  admission: { max_concurrency: 100, queue: 16, queue_timeout: 50ms }
defaults: { timeout: 8s }
backends:
  a: { url: "http://${A_ADDR}", dedup: false }
routes:
  - path: /one
    coalesce: false
    deadline: 10s
    admission: { max_concurrency: 1 }
    flow:
      s: { http: { backend: a, path: '"/slow"' } }
    respond: { body: '$s' }
  - path: /other
    coalesce: false
    deadline: 10s
    flow:
      s: { http: { backend: a, path: '"/slow"' } }
    respond: { body: '$s' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_limit_serves_one_request_and_leaves_other_routes_alone() {
    let s = stubs(SLOW_STUBS).await;
    let gw = gateway(ROUTE_LIMIT_GATEWAY, &s).await;
    let addr = gw.addr.to_string();
    let c = client(false);
    let one = spawn_gets(&c, &format!("http://{addr}/one"), 5);
    let other = spawn_gets(&c, &format!("http://{addr}/other"), 5);
    let (one_ok, one_rejected) = outcomes(one).await;
    let (other_ok, other_rejected) = outcomes(other).await;
    assert_eq!((one_ok, one_rejected), (1, 4), "route limit 1");
    assert_eq!(
        (other_ok, other_rejected),
        (5, 0),
        "the other route is unaffected"
    );
    let a = admission_status(&addr).await;
    let r = &a["routes"]["GET /one"];
    assert_eq!(r["max_concurrency"], 1, "{a}");
    assert_eq!(r["rejected"], 4, "{a}");
    assert_eq!(r["in_flight"], 0, "{a}");
    assert!(a["routes"].get("GET /other").is_none(), "{a}");
    // They waited in the queue (50 ms, or CoDel's 5 ms) and gave up: the slow request was busy.
    assert_eq!(a["rejected_waited_too_long"], 4, "{a}");
    assert_eq!(a["admitted"], 6, "{a}");
}

const CODEL_GATEWAY: &str = r#"
server:
  admission:
    max_concurrency: 1
    queue: 16
    queue_timeout: 2s
    codel: { target: 5ms, interval: 100ms }
defaults: { timeout: 8s }
backends:
  a: { url: "http://${A_ADDR}", dedup: false }
routes:
  - path: /slow
    coalesce: false
    deadline: 10s
    flow:
      s: { http: { backend: a, path: '"/slow"' } }
    respond: { body: '$s' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_standing_queue_requests_wait_only_the_codel_target() {
    let s = stubs(SLOW_STUBS).await;
    let gw = gateway(CODEL_GATEWAY, &s).await;
    let addr = gw.addr.to_string();
    let c = client(false);
    let url = format!("http://{addr}/slow");
    // One request runs (3 s), one waits (up to queue_timeout, 2 s): the queue is not empty ...
    let running = spawn_gets(&c, &url, 1);
    until_status(&addr, "one admitted", |a| a["in_flight"] == 1).await;
    let waiting = spawn_gets(&c, &url, 1);
    until_status(&addr, "one queued", |a| a["queued"] == 1).await;
    // ... for longer than the interval: a standing queue.
    until_status(&addr, "a standing queue", |a| a["standing_queue"] == true).await;
    // Newcomers now get codel.target instead of queue_timeout: all rejected as waited too long,
    // before the running request finishes.
    let newcomers = answered_while_running(&c, &url, &s, 5).await;
    for (r, finished) in &newcomers {
        assert_eq!(r.status, 503);
        assert_eq!(r.code(), "overloaded");
        assert_eq!(
            *finished, 0,
            "rejected while the admitted request still ran"
        );
    }
    let a = admission_status(&addr).await;
    assert_eq!(a["rejected_codel"], 5, "{a}");
    assert_eq!(a["rejected_waited_too_long"], 5, "{a}");
    assert_eq!(
        a["queued"], 1,
        "the first waiter still waits (queue_timeout): {a}"
    );
    // The first waiter had the full queue_timeout (2 s), shorter than the 3 s request: it too
    // gives up, as a plain wait, not a CoDel expiry.
    let (w_ok, w_rejected) = outcomes(waiting).await;
    assert_eq!((w_ok, w_rejected), (0, 1));
    assert_eq!(outcomes(running).await, (1, 0));
    let a = admission_status(&addr).await;
    assert_eq!(a["rejected_waited_too_long"], 6, "{a}");
    assert_eq!(a["rejected_codel"], 5, "{a}");
    assert_eq!(a["rejected_queue_full"], 0, "{a}");
    assert_eq!(a["standing_queue"], false, "the queue drained: {a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_could_not_get_a_slot_within_its_allowed_wait_is_refused_without_waiting() {
    let s = stubs(SLOW_STUBS).await;
    let gw = gateway(ROUTE_LIMIT_GATEWAY, &s).await;
    let addr = gw.addr.to_string();
    let c = client(false);
    let url = format!("http://{addr}/one");
    // One request teaches the route that its requests hold the slot ~3 s.
    assert_eq!(outcomes(spawn_gets(&c, &url, 1)).await, (1, 0));
    // The next one holds it ~3 s from now; a request arriving meanwhile could not get it within
    // its 50 ms queue_timeout, so it is answered at once rather than after waiting 50 ms.
    let running = spawn_gets(&c, &url, 1);
    until_status(&addr, "one admitted", |a| a["in_flight"] == 1).await;
    let refused = answered_while_running(&c, &url, &s, 3).await;
    for (r, finished) in &refused {
        assert_eq!(r.status, 503);
        assert_eq!(r.code(), "overloaded");
        assert_eq!(r.headers["retry-after"], "1");
        assert!(
            r.text()
                .contains("no slot would free within the time the request may wait"),
            "{}",
            r.text()
        );
        assert_eq!(*finished, 1, "refused while the admitted request still ran");
    }
    let a = admission_status(&addr).await;
    assert_eq!(a["rejected_expected_wait"], 3, "{a}");
    assert_eq!(a["rejected_waited_too_long"], 0, "{a}");
    assert_eq!(a["queued"], 0, "{a}");
    assert_eq!(outcomes(running).await, (1, 0));
    let admin = gw.admin_addr.expect("the admin listener runs");
    let m = get(&format!("http://{admin}/metrics")).await.text();
    assert!(
        m.contains(r#"fanout_admission_rejections_total{class="normal",reason="expected_wait"} 3"#),
        "{m}"
    );
}

const ADAPTIVE_GATEWAY: &str = r#"
server:
  admission:
    max_concurrency: 64
    adaptive: { initial: 10, min: 8, window: 20ms }
backends:
  a: { url: "http://${A_ADDR}", dedup: false }
routes:
  - path: /fast
    coalesce: false
    deadline: 10s
    flow:
      s: { http: { backend: a, path: '"/fast"' } }
    respond: { body: '$s' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_limit_serves_and_stays_within_its_bounds() {
    let s = stubs(SLOW_STUBS).await;
    let gw = gateway(ADAPTIVE_GATEWAY, &s).await;
    let addr = gw.addr.to_string();
    let c = client(false);
    let url = format!("http://{addr}/fast");
    let a = admission_status(&addr).await;
    assert_eq!(a["limit"], 10, "starts at initial: {a}");
    assert_eq!(a["adaptive"]["min"], 8, "{a}");
    // 6 at a time never exceeds the normal share of the lowest possible limit (ceil(0.9 × 8)).
    let mut total = (0, 0);
    for _ in 0..25 {
        let (ok, rejected) = outcomes(spawn_gets(&c, &url, 6)).await;
        total = (total.0 + ok, total.1 + rejected);
        let a = admission_status(&addr).await;
        let limit = a["limit"].as_u64().unwrap_or(0);
        assert!((8..=64).contains(&limit), "limit out of [min, max]: {a}");
    }
    assert_eq!(total, (150, 0));
    let a = admission_status(&addr).await;
    assert_eq!(a["max_concurrency"], 64, "{a}");
    assert_eq!(a["admitted"], 150, "{a}");
    assert!(a["adaptive"]["updates"].is_u64(), "{a}");
}
