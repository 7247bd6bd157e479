//! R2: at the concurrency limit, requests wait briefly in a bounded queue or are rejected at once
//! with 503 + Retry-After — never queued until they time out.

mod common;

use common::*;
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
