//! R3: a backend's circuit breaker opens after failures (optional steps then use their default
//! without calling it); a full bulkhead fails fast. Proven with the stub's counters.
//!
//! The routes say `coalesce: false`: concurrent identical requests must each run their flow here
//! (coalescing has its own tests in `coalesce.rs`).

use crate::support::gateway;
use fanout_testkit::*;
use futures_util::future::join_all;
use http::Method;
use serde_json::json;

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - { path: /broken, status: 503, body: '{down: true}' }
      - { path: /slow, latency: 300ms, body: '{ok: true}' }
"#;

const GATEWAY: &str = r#"
backends:
  broken:
    url: "http://${A_ADDR}"
    breaker: { consecutive_failures: 3, open_for: 10s }
  narrow:
    url: "http://${A_ADDR}"
    max_concurrency: 1
    dedup: false
routes:
  - path: /page
    coalesce: false
    flow:
      extra: { optional: true, default: "fallback", http: { backend: broken, path: '"/broken"' } }
    respond: { body: '{extra: $extra}' }
  - path: /narrow
    coalesce: false
    flow:
      s: { optional: true, default: "busy", http: { backend: narrow, path: '"/slow"' } }
    respond: { body: '$s' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_serves_the_default_without_calling() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    for _ in 0..10 {
        let r = get(&format!("http://{}/page", gw.addr)).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.json(),
            json!({"extra": "fallback", "_partial": ["extra"]})
        );
    }
    // 3 failures opened the breaker; the other 7 requests never reached the backend.
    assert_eq!(s.stats("a").unwrap().routes["GET /broken"].requests, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bulkhead_fails_fast() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let url = format!("http://{}/narrow", gw.addr);
    let answers = join_all((0..4).map(|_| {
        let (c, url) = (c.clone(), url.clone());
        async move { send(&c, Method::GET, &url, &[], "").await.json() }
    }))
    .await;
    let served = answers
        .iter()
        .filter(|a| **a == json!({"ok": true}))
        .count();
    let busy = answers.iter().filter(|a| **a == json!("busy")).count();
    assert_eq!((served, busy), (1, 3), "{answers:?}");
    assert_eq!(s.stats("a").unwrap().routes["GET /slow"].max_in_flight, 1);
}
