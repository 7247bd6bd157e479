//! R4 retries and hedging end to end, proven with the stubs' counters and `/__fanout/status`
//! (no wall-clock assertions):
//! - under a full outage the retry budget keeps backend attempts ≤ 1.2 per request (research
//!   test #9);
//! - non-idempotent calls are never retried, steps marked `idempotent: true` are;
//! - a connect error (closed port) is retried on another address;
//! - hedges stay within `max_extra` of the calls, losers are cancelled at the backend, answers
//!   are correct, and non-idempotent calls are never hedged.
//!
//! The routes say `coalesce: false`: concurrent identical requests must each run their flow here
//! (coalescing has its own tests in `coalesce.rs`).

use crate::support::gateway;
use fanout_testkit::*;
use futures_util::StreamExt;
use http::Method;
use serde_json::{Value, json};

async fn status(gw: &fanout::RunningGateway) -> Value {
    get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json()
}

/// Send `n` requests, `concurrency` at a time; returns the answers (status, JSON body).
async fn run(
    gw: &fanout::RunningGateway,
    method: Method,
    path: impl Fn(usize) -> String,
    n: usize,
    concurrency: usize,
) -> Vec<(u16, Value)> {
    let c = client(false);
    futures_util::stream::iter(0..n)
        .map(|i| {
            let (c, url, m) = (
                c.clone(),
                format!("http://{}{}", gw.addr, path(i)),
                method.clone(),
            );
            async move {
                let r = send(&c, m, &url, &[], "").await;
                (r.status.as_u16(), r.json())
            }
        })
        .buffered(concurrency)
        .collect()
        .await
}

const DOWN: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - { path: /x, method: "*", status: 503, body: '{down: true}' }
  b:
    listen: "${B_ADDR}"
    routes:
      - { path: /x, method: "*", status: 503, body: '{down: true}' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_full_outage_the_budget_keeps_attempts_per_request_at_most_1_2() {
    let s = stubs(DOWN).await;
    let gw = gateway(
        r#"
backends:
  down:
    urls: ["http://${A_ADDR}", "http://${B_ADDR}"]
    dedup: false
    retry: { attempts: 3, budget: { ratio: 0.2, min_per_second: 0 } }
routes:
  - path: /x
    coalesce: false
    flow:
      x: { http: { backend: down, path: '"/x"' } }
    respond: { body: '$x' }
"#,
        &s,
    )
    .await;
    let answers = run(&gw, Method::GET, |_| "/x".into(), 500, 8).await;
    assert!(
        answers.iter().all(|(st, _)| *st == 502),
        "all fail: 503 → 502"
    );
    let attempts = route_calls(&s, "a", "* /x") + route_calls(&s, "b", "* /x");
    assert!(
        attempts as f64 <= 1.2 * 500.0,
        "{attempts} backend attempts for 500 requests"
    );
    let st = status(&gw).await;
    let r = &st["backends"]["down"]["retry"];
    let (calls, retries, exhausted) = (
        r["calls"].as_u64().unwrap(),
        r["retries"].as_u64().unwrap(),
        r["budget_exhausted"].as_u64().unwrap(),
    );
    assert_eq!(calls, 500, "{r}");
    assert_eq!(attempts, calls + retries, "{r}");
    assert!(retries > 0 && retries <= 100, "{r}");
    assert!(exhausted > 0, "the budget refused retries: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_idempotent_calls_are_never_retried_unless_marked() {
    let s = stubs(DOWN).await;
    let gw = gateway(
        r#"
backends:
  down:
    url: "http://${A_ADDR}"
    dedup: false
    retry: { attempts: 3 }
routes:
  - path: /post
    coalesce: false
    method: POST
    flow:
      x: { http: { backend: down, method: POST, path: '"/x"', body: '{n: 1}' } }
    respond: { body: '$x' }
  - path: /post-idempotent
    coalesce: false
    method: POST
    flow:
      x: { http: { backend: down, method: POST, path: '"/x"', body: '{n: 1}', idempotent: true } }
    respond: { body: '$x' }
"#,
        &s,
    )
    .await;
    let answers = run(&gw, Method::POST, |_| "/post".into(), 20, 4).await;
    assert!(answers.iter().all(|(st, _)| *st == 502));
    assert_eq!(route_calls(&s, "a", "* /x"), 20, "one attempt per POST");
    // Marked idempotent: retried (3 attempts; the default budget's reserve allows it).
    let answers = run(&gw, Method::POST, |_| "/post-idempotent".into(), 5, 1).await;
    assert!(answers.iter().all(|(st, _)| *st == 502));
    assert_eq!(route_calls(&s, "a", "* /x"), 20 + 5 * 3);
    let st = status(&gw).await;
    assert_eq!(st["backends"]["down"]["retry"]["retries"], 10, "{st}");
}

const UP: &str = r#"
services:
  up:
    listen: "${UP_ADDR}"
    routes:
      - { path: /x, body: '{id: $request.query.id}' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_error_is_retried_on_another_address() {
    // A port nobody listens on: bind, read the port, close.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    let s = stubs(UP).await;
    let yaml = format!(
        r#"
backends:
  svc:
    urls: ["http://{closed_addr}", "http://${{UP_ADDR}}"]
    dedup: false
    balance: {{ strategy: round_robin }}
    retry: {{}}
routes:
  - path: /x/{{id}}
    coalesce: false
    flow:
      x: {{ http: {{ backend: svc, path: '"/x"', query: {{ id: '$request.params.id' }} }} }}
    respond: {{ body: '$x' }}
"#
    );
    let gw = gateway(&yaml, &s).await;
    let answers = run(&gw, Method::GET, |i| format!("/x/{i}"), 40, 1).await;
    for (i, (st, body)) in answers.iter().enumerate() {
        assert_eq!((*st, body), (200, &json!({"id": i.to_string()})));
    }
    assert_eq!(route_calls(&s, "up", "GET /x"), 40);
    let st = status(&gw).await;
    let backend = &st["backends"]["svc"];
    // Round robin sends every other call to the closed port until it is ejected (5 failures).
    assert_eq!(backend["retry"]["retries"], 5, "{st}");
    let dead = backend["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["address"] == format!("http://{closed_addr}"))
        .unwrap();
    assert_eq!(dead["state"], "ejected", "{st}");
    assert_eq!(dead["failures"], 5);
}

const TAIL: &str = r#"
services:
  tail:
    listen: "${TAIL_ADDR}"
    routes:
      - path: /x
        method: "*"
        body: '{id: $request.query.id}'
        latency:
          mixture:
            - { p: 0.95, latency: 2ms }
            - { p: 0.05, latency: 40ms }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_stay_within_the_budget_and_losers_are_cancelled() {
    let s = stubs(TAIL).await;
    let gw = gateway(
        r#"
backends:
  tail:
    url: "http://${TAIL_ADDR}"
    dedup: false
    hedge: { delay: 10ms, max_extra: 0.1 }
routes:
  - path: /x/{id}
    coalesce: false
    flow:
      x: { http: { backend: tail, path: '"/x"', query: { id: '$request.params.id' } } }
    respond: { body: '$x' }
  - path: /p/{id}
    coalesce: false
    method: POST
    flow:
      x: { http: { backend: tail, method: POST, path: '"/x"', query: { id: '$request.params.id' } } }
    respond: { body: '$x' }
"#,
        &s,
    )
    .await;
    let n = 400;
    let answers = run(&gw, Method::GET, |i| format!("/x/{i}"), n, 1).await;
    for (i, (st, body)) in answers.iter().enumerate() {
        assert_eq!((*st, body), (200, &json!({"id": i.to_string()})));
    }
    let st = status(&gw).await;
    let h = st["backends"]["tail"]["hedge"].clone();
    let (calls, hedges) = (h["calls"].as_u64().unwrap(), h["hedges"].as_u64().unwrap());
    assert_eq!(calls, n as u64, "{h}");
    assert!(hedges >= 1, "some of the 5 % slow calls were hedged: {h}");
    assert!(
        hedges as f64 <= 0.1 * calls as f64 + 2.0,
        "hedges within max_extra: {h}"
    );
    // Every hedge is exactly one extra backend call; each race leaves a loser, cancelled at the
    // stub (its handler dropped: `aborted`) unless it finished in the same instant.
    let stats = || s.stats("tail").unwrap().routes["* /x"];
    wait_until("no call left in flight at the stub", || {
        stats().in_flight == 0
    })
    .await;
    let r = stats();
    // A hedge copy dropped before it was written (the original won while the copy was still
    // connecting) never reaches the stub, so the stub may see fewer than calls + hedges.
    assert!(
        r.requests > n as u64 && r.requests <= n as u64 + hedges,
        "{r:?} hedges {hedges}"
    );
    assert_eq!(r.completed + r.aborted, r.requests, "{r:?}");
    assert!(
        r.aborted >= 1 && r.aborted <= hedges,
        "{r:?} hedges {hedges}"
    );

    // Non-idempotent calls are never hedged: 60 POSTs are exactly 60 more calls at the stub
    // (counted from what the stub saw before, which may be fewer than calls + hedges).
    let before = r.requests;
    let posts = run(&gw, Method::POST, |i| format!("/p/{i}"), 60, 1).await;
    assert!(posts.iter().all(|(st, _)| *st == 200));
    let after = status(&gw).await["backends"]["tail"]["hedge"]["hedges"].clone();
    assert_eq!(after, hedges, "no hedge for POST");
    assert_eq!(stats().requests, before + 60);
}
