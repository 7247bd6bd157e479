//! R1: the thread count does not change with load — identical at 1 and at 5 000 requests in flight
//! (read from /proc/self/task; gateway, stubs and client share this test's fixed runtime).
//!
//! The stub holds every call for a minute, so "5 000 in flight" is a state the test waits for
//! however slowly the machine sends them; the client then goes away and the gateway cancels.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod support;

use fanout_testkit::*;
use futures_util::future::join_all;
use http::Method;
use support::gateway;

const STUBS: &str = r#"
services:
  one:
    listen: "${ONE_ADDR}"
    routes: [{ path: /slow, latency: 60s, body: '{ok: true}' }]
  two:
    listen: "${TWO_ADDR}"
    routes: [{ path: /slow, latency: 60s, body: '{ok: true}' }]
"#;

const GATEWAY: &str = r#"
server:
  max_concurrent_streams: 8000
  admission: { max_concurrency: 10000 }
backends:
  slow:
    urls: ["http://${ONE_ADDR}", "http://${TWO_ADDR}"]
    protocol: http2
    # Even spread: each stub caps a connection at 4 096 streams, and P2C would (rightly) send
    # nearly all 5 000 to the address that has not answered slowly yet.
    balance: { strategy: round_robin }
    dedup: false
    timeout: 120s
routes:
  - path: /slow
    deadline: 120s
    # 5 000 identical requests must each be in flight (not share one run of the flow).
    coalesce: false
    flow:
      s: { http: { backend: slow, path: '"/slow"' } }
    respond: { body: '$s' }
"#;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn in_flight(s: &fanout_stub::StubServer) -> u64 {
    ["one", "two"]
        .iter()
        .map(|n| {
            s.stats(n)
                .map(|st| st.routes["GET /slow"].in_flight)
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_count_is_the_same_at_1_and_5000_requests_in_flight() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let url = format!("http://{}/slow", gw.addr);
    let c = client(true); // h2c: 5 000 streams over one connection
    let limit = std::time::Duration::from_secs(50);

    let one = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { send(&c, Method::GET, &url, &[], "").await }
    });
    wait_within("1 request in flight", limit, || in_flight(&s) == 1).await;
    let at_one = threads();
    one.abort();
    let _ = one.await;
    wait_within("the cancelled request left the stub", limit, || {
        in_flight(&s) == 0
    })
    .await;

    let n = 5000;
    let all = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move {
            join_all((0..n).map(|_| {
                let (c, url) = (c.clone(), url.clone());
                async move { send(&c, Method::GET, &url, &[], "").await }
            }))
            .await
        }
    });
    wait_within("5000 requests in flight", limit, || in_flight(&s) == n).await;
    let at_many = threads();
    eprintln!("threads: {at_one} at 1 in flight, {at_many} at {n} in flight");
    // The client goes away: the gateway cancels every call (nothing is left running).
    all.abort();
    let _ = all.await;
    drop(c);
    wait_within("every cancelled call left the stubs", limit, || {
        in_flight(&s) == 0
    })
    .await;
    assert_eq!(
        at_one, at_many,
        "threads at 1 in flight: {at_one}, at {n} in flight: {at_many}"
    );
}
