//! R1: the thread count does not change with load — identical at 1 and at 5 000 requests in flight
//! (read from /proc/self/task; gateway, stubs and client share this test's fixed runtime).

mod common;

use common::*;
use futures_util::future::join_all;
use http::Method;

const STUBS: &str = r#"
services:
  one:
    listen: "${ONE_ADDR}"
    routes: [{ path: /slow, latency: 1500ms, body: '{ok: true}' }]
  two:
    listen: "${TWO_ADDR}"
    routes: [{ path: /slow, latency: 1500ms, body: '{ok: true}' }]
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
    timeout: 10s
routes:
  - path: /slow
    deadline: 20s
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

    let one = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { send(&c, Method::GET, &url, &[], "").await }
    });
    eventually("1 request in flight", || in_flight(&s) == 1).await;
    let at_one = threads();
    one.await.unwrap();

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
    eventually("5000 requests in flight", || in_flight(&s) == n).await;
    let at_many = threads();
    eprintln!("threads: {at_one} at 1 in flight, {at_many} at {n} in flight");
    let answers = all.await.unwrap();
    assert!(answers.iter().all(|r| r.status == 200));
    assert_eq!(
        at_one, at_many,
        "threads at 1 in flight: {at_one}, at {n} in flight: {at_many}"
    );
}
