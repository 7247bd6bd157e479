//! No request, backend answer or expression can crash the gateway or hold a worker: deep data,
//! huge builds and runaway loops end in a clear answer (`expression_limit`, `deadline_exceeded`,
//! `bad_backend_answer`), heavy expressions leave the I/O workers, and a compute job whose request
//! has ended is cancelled.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod support;

use fanout_testkit::*;
use http::{Method, StatusCode};
use std::time::Duration;
use support::gateway;
use tokio::time::Instant;

fn nested(n: usize) -> String {
    format!("{}{}", "[".repeat(n), "]".repeat(n))
}

fn stubs_yaml() -> String {
    format!(
        r#"
services:
  data:
    listen: "${{DATA_ADDR}}"
    routes:
      - path: /deep-string
        body: '{{s: ("[" * 20000) + ("]" * 20000)}}'
      - path: /deep-json
        raw_body: '{deep}'
      - path: /ok
        body: '{{ok: true}}'
"#,
        deep = nested(20_000)
    )
}

const GATEWAY: &str = r#"
server:
  compute: { threads: 1, queue: 16 }
backends:
  data: { url: "http://${DATA_ADDR}", timeout: 5s }
defaults: { deadline: 10s }
routes:
  - path: /fromjson-request
    method: POST
    flow:
      v: { value: '$request.body | fromjson' }
    respond: { body: '{depth: ($v | [paths] | length)}' }
  - path: /fromjson-backend
    flow:
      s: { http: { backend: data, path: '"/deep-string"' }, result: '.s | fromjson' }
    respond: { body: '$s' }
  - path: /deep-answer
    flow:
      s: { http: { backend: data, path: '"/deep-json"' } }
    respond: { body: '$s' }
  - path: /deep-build
    flow:
      v: { value: 'reduce range(0; 100000) as $i (null; [.])' }
    respond: { body: '$v' }
  - path: /range
    flow:
      v: { value: '[range(0; ($request.query.n | tonumber))]' }
    respond: { body: '{n: ($v | length)}' }
  - path: /repeat
    flow:
      v: { value: '$request.query.s * ($request.query.n | tonumber)' }
    respond: { body: '{n: ($v | length)}' }
  - path: /recurse
    flow:
      v: { value: 'def f: 1 + f; f' }
    respond: { body: '$v' }
  - path: /heavy
    flow:
      v: { value: '[range(0; 200000)] | map(. * 2) | add' }
    respond: { body: '{sum: $v}' }
  - path: /ok
    respond: { body: '{ok: true}' }
"#;

async fn status(gw: &fanout::RunningGateway) -> serde_json::Value {
    get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_data_and_expressions_get_clear_answers_and_the_gateway_lives() {
    let s = stubs(&stubs_yaml()).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let url = |p: &str| format!("http://{}{p}", gw.addr);
    let expect = |r: &Resp, status: u16, code: &str, what: &str| {
        assert!(
            r.body.starts_with(b"{"),
            "{what}: {} with {:?}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(
            (r.status.as_u16(), r.code().as_str()),
            (status, code),
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
    };

    // Client text nested 7 000 and 100 000 deep, parsed by `fromjson`.
    for n in [7_000, 100_000] {
        let body = serde_json::to_string(&nested(n)).unwrap();
        let r = send(&c, Method::POST, &url("/fromjson-request"), &[], body).await;
        expect(&r, 500, "expression_limit", "fromjson of client text");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("max_depth")
        );
    }
    // A backend string nested 20 000 deep, parsed by `fromjson` in `result`.
    let r = get(&url("/fromjson-backend")).await;
    expect(&r, 500, "expression_limit", "fromjson of a backend string");
    // A backend answer nested 20 000 deep.
    let r = get(&url("/deep-answer")).await;
    expect(&r, 502, "bad_backend_answer", "deep backend answer");
    // A request body nested 100 000 deep.
    let r = send(
        &c,
        Method::POST,
        &url("/fromjson-request"),
        &[],
        nested(100_000),
    )
    .await;
    expect(&r, 400, "invalid_json", "deep request body");
    // A deep value built by an expression.
    let r = get(&url("/deep-build")).await;
    expect(&r, 500, "expression_limit", "deep build");
    // Sizes taken from the request.
    let r = get(&url("/range?n=1000000000000")).await;
    expect(&r, 500, "expression_limit", "range of 1e12");
    let s16k = "x".repeat(8 << 10);
    let r = get(&url(&format!("/repeat?s={s16k}&n=1000000000"))).await;
    expect(&r, 500, "expression_limit", "string repetition");
    // Unbounded recursion.
    let r = get(&url("/recurse")).await;
    expect(&r, 500, "expression_limit", "recursion");
    // Ordinary sizes still work.
    let r = get(&url("/range?n=1000")).await;
    assert_eq!(r.json(), serde_json::json!({"n": 1000}));
    let r = get(&url("/repeat?s=ab&n=3")).await;
    assert_eq!(r.json(), serde_json::json!({"n": 6}));

    // A heavy expression leaves the worker by itself (default `inline_ops`): no stall. On a
    // loaded machine a worker can also be preempted mid-poll for 100 ms; an expression that
    // really kept the worker would stall every attempt, so one clean attempt of three is the test.
    let mut clean = false;
    let mut st = serde_json::Value::Null;
    for _ in 0..3 {
        let stalls_before = status(&gw).await["runtime"]["flow_stalls"].as_u64();
        let r = get(&url("/heavy")).await;
        assert_eq!(r.json(), serde_json::json!({"sum": 199_999u64 * 200_000}));
        st = status(&gw).await;
        if st["runtime"]["flow_stalls"].as_u64() == stalls_before {
            clean = true;
            break;
        }
    }
    assert!(clean, "every heavy request stalled a worker: {st}");
    assert!(
        st["runtime"]["compute"]["done"].as_u64().unwrap_or(0) >= 1,
        "{st}"
    );

    // Still alive and well, and every refusal is counted by its code.
    let r = get(&url("/ok")).await;
    assert_eq!(r.status, StatusCode::OK);
    let errors = &status(&gw).await["errors"];
    assert_eq!(errors["expression_limit"], 7, "{errors}");
    assert_eq!(errors["bad_backend_answer"], 1, "{errors}");
    assert_eq!(errors["invalid_json"], 1, "{errors}");
}

const RUNAWAY: &str = r#"
server:
  compute: { threads: 1, queue: 16 }
  expressions: { max_ops: 100000000000 }
routes:
  - path: /runaway
    deadline: 1s
    flow:
      v: { value: 'reduce range(0; 1e12) as $i (0; . + 1)' }
    respond: { body: '{v: $v}' }
  - path: /runaway-long
    deadline: 60s
    flow:
      v: { value: 'reduce range(0; 1e12) as $i (0; . + 1)' }
    respond: { body: '{v: $v}' }
  - path: /small-compute
    deadline: 20s
    flow:
      v: { value: '[range(0; 100)] | add', compute: true }
    respond: { body: '{v: $v}' }
  - path: /normal
    respond: { body: '{ok: true}' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_expression_ends_at_its_deadline_without_stalling_other_requests() {
    let s = stubs("services: {idle: {listen: \"${IDLE_ADDR}\", routes: [{path: /x}]}}").await;
    let gw = gateway(RUNAWAY, &s).await;
    let c = client(false);
    let url = |p: &str| format!("http://{}{p}", gw.addr);

    // A runaway request, and meanwhile a normal route served from the same 2 workers.
    let runaway = tokio::spawn({
        let (c, u) = (c.clone(), url("/runaway"));
        async move { send(&c, Method::GET, &u, &[], "").await }
    });
    let mut latencies = Vec::new();
    while !runaway.is_finished() {
        let t = Instant::now();
        let r = send(&c, Method::GET, &url("/normal"), &[], "").await;
        latencies.push(t.elapsed());
        assert_eq!(r.status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = runaway.await.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.code().as_str()),
        (504, "deadline_exceeded"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    latencies.sort();
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    assert!(
        latencies.len() >= 20,
        "normal requests ran meanwhile: {}",
        latencies.len()
    );
    assert!(
        p99 < Duration::from_millis(50),
        "normal route p99 {p99:?} over {} requests",
        latencies.len()
    );

    // A runaway whose client goes away is cancelled: the single compute thread is free again
    // for the next job long before that request's 60 s deadline.
    let gone = tokio::spawn({
        let (c, u) = (c.clone(), url("/runaway-long"));
        async move { send(&c, Method::GET, &u, &[], "").await }
    });
    let st_url = url("/__fanout/status");
    let mut reached = false;
    for _ in 0..2000 {
        let st = get(&st_url).await.json();
        if st["runtime"]["compute"]["running"].as_u64() == Some(1) {
            reached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reached, "the runaway moved to the compute pool");
    gone.abort();
    let _ = gone.await;
    let r = send(&c, Method::GET, &url("/small-compute"), &[], "").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json(), serde_json::json!({"v": 4950}));
}
