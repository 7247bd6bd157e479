//! R1: CPU-heavy work off the workers. A `compute: true` step and large backend answers run on the
//! bounded compute pool; a transform that holds a worker past `server.stall_threshold` is counted
//! (and logged with its route and step) on `/__fanout/status`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod support;

use fanout_testkit::*;
use support::gateway;

const STUBS: &str = r#"
services:
  big:
    listen: "${BIG_ADDR}"
    routes:
      - path: /numbers
        body: '[range(0; 20000)]'
"#;

const GATEWAY: &str = r#"
server:
  stall_threshold: 1ms
  compute: { threads: 1, queue: 8, offload_bytes: 1024 }
  # Never move expressions off the worker by themselves: /inline shows what the stall watchdog
  # sees when a transform holds a worker (tests/hostile_requests.rs shows the default moving it).
  expressions: { inline_ops: 1000000000 }
backends:
  big: { url: "http://${BIG_ADDR}" }
routes:
  - path: /inline
    deadline: 30s
    flow:
      nums: { http: { backend: big, path: '"/numbers"' } }
      sum: { value: '[range(0; 200000)] | map(. * 2) | add' }
    respond: { body: '{count: ($nums | length), sum: $sum}' }
  - path: /pooled
    deadline: 30s
    flow:
      nums: { http: { backend: big, path: '"/numbers"' }, compute: true, result: 'map(. + 1) | add' }
      sum: { value: '[range(0; 200000)] | map(. * 2) | add', compute: true }
    respond: { body: '{total: $nums, sum: $sum}' }
"#;

async fn status(addr: &std::net::SocketAddr) -> serde_json::Value {
    get(&format!("http://{addr}/__fanout/status")).await.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_steps_run_on_the_compute_pool_and_stalls_are_counted() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;

    let before = status(&gw.addr).await["runtime"].clone();
    assert_eq!(before["compute"]["threads"], 1);
    assert_eq!(before["compute"]["started"], true);

    // Pooled: the 20 000-number answer (> offload_bytes) is parsed on the pool, and both the
    // `result` and the `value` transform run there.
    let r = get(&format!("http://{}/pooled", gw.addr)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let sum_0_to_n = |n: u64| n * (n - 1) / 2;
    assert_eq!(
        r.json(),
        serde_json::json!({"total": sum_0_to_n(20000) + 20000, "sum": 2 * sum_0_to_n(200000)})
    );
    let after = status(&gw.addr).await["runtime"].clone();
    let done = after["compute"]["done"].as_u64().unwrap_or(0);
    assert!(done >= 3, "parse + result + value on the pool: {after}");
    assert_eq!(after["compute"]["refused_queue_full"], 0);

    // Inline: the same transform on the worker holds it far longer than 1 ms: a counted stall.
    let r = get(&format!("http://{}/inline", gw.addr)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["sum"], 2 * sum_0_to_n(200000));
    let stalls = status(&gw.addr).await["runtime"]["flow_stalls"]
        .as_u64()
        .unwrap_or(0);
    assert!(stalls >= 1, "the inline transform is a stall");
}
