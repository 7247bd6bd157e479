//! R3 balancing and outlier ejection end to end: a replica that answers 503 is ejected after
//! `consecutive_failures` calls while retries hide its failures from clients (research test #8);
//! a probe re-admits it once it is healthy; local rejections never eject an address (#11).
//! Proven with the stubs' counters and `/__fanout/status` — no wall-clock assertions.
//!
//! The routes say `coalesce: false`: concurrent identical requests must each run their flow here
//! (coalescing has its own tests in `coalesce.rs`).

use crate::support::gateway;
use fanout_testkit::*;
use futures_util::StreamExt;
use http::Method;
use serde_json::{Value, json};

const STUBS: &str = r#"
services:
  good1:
    listen: "${GOOD1_ADDR}"
    routes:
      - { path: /item, body: '{id: $request.query.id}' }
      - { path: /slow, latency: 300ms, body: '{ok: true}' }
  bad:
    listen: "${BAD_ADDR}"
    routes:
      - { path: /item, status: 503, body: '{id: $request.query.id}' }
      - { path: /slow, latency: 300ms, body: '{ok: true}' }
  good2:
    listen: "${GOOD2_ADDR}"
    routes:
      - { path: /item, body: '{id: $request.query.id}' }
"#;

fn gateway_yaml(balance: &str, extra: &str) -> String {
    format!(
        r#"
backends:
  items:
    urls: ["http://${{GOOD1_ADDR}}", "http://${{BAD_ADDR}}", "http://${{GOOD2_ADDR}}"]
    dedup: false
    balance: {balance}
    retry: {{}}
    {extra}
  narrow:
    urls: ["http://${{GOOD1_ADDR}}", "http://${{BAD_ADDR}}"]
    dedup: false
    max_concurrency: 1
routes:
  - path: /item/{{id}}
    coalesce: false
    flow:
      one: {{ http: {{ backend: items, path: '"/item"', query: {{ id: '$request.params.id' }} }} }}
    respond: {{ body: '$one' }}
  - path: /narrow
    coalesce: false
    flow:
      s: {{ optional: true, default: "busy", http: {{ backend: narrow, path: '"/slow"' }} }}
    respond: {{ body: '$s' }}
"#
    )
}

fn item_calls(s: &fanout_stub::StubServer, service: &str) -> u64 {
    s.stats(service).unwrap().routes["GET /item"].requests
}

async fn status(gw: &fanout::RunningGateway) -> Value {
    get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json()
}

/// The status entry of the address whose URL contains `addr`.
fn address(status: &Value, backend: &str, addr: &str) -> Value {
    status["backends"][backend]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["address"].as_str().unwrap().contains(addr))
        .cloned()
        .unwrap_or_else(|| panic!("no address {addr} in {status}"))
}

/// Send `n` GETs of /item/{i}, `concurrency` at a time; returns how many answered correctly.
async fn run(gw: &fanout::RunningGateway, n: usize, concurrency: usize) -> usize {
    let c = client(false);
    futures_util::stream::iter(0..n)
        .map(|i| {
            let (c, url) = (c.clone(), format!("http://{}/item/{i}", gw.addr));
            async move {
                let r = send(&c, Method::GET, &url, &[], "").await;
                r.status == 200 && r.json() == json!({"id": i.to_string()})
            }
        })
        .buffer_unordered(concurrency)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_replica_is_ejected_after_five_failures_and_clients_see_only_successes() {
    let s = stubs(STUBS).await;
    let yaml = gateway_yaml(
        "{ strategy: round_robin }",
        "outlier: { base_ejection: 60s }",
    );
    let gw = gateway(&yaml, &s).await;
    // Sequential: every third call goes to the bad replica until it is ejected; each of its
    // failures is retried on the next address.
    let ok = run(&gw, 300, 1).await;
    assert_eq!(ok, 300, "every request answered correctly");
    assert_eq!(item_calls(&s, "bad"), 5, "ejected after exactly 5 failures");
    assert_eq!(
        item_calls(&s, "good1") + item_calls(&s, "good2"),
        300,
        "each request answered once by a good replica"
    );
    let st = status(&gw).await;
    let bad = address(&st, "items", &s.addr("bad").unwrap().to_string());
    assert_eq!(bad["state"], "ejected", "{st}");
    assert_eq!(bad["ejected"], true);
    assert_eq!(bad["times_ejected"], 1);
    assert_eq!(bad["failures"], 5);
    let retry = &st["backends"]["items"]["retry"];
    assert_eq!(retry["calls"], 300, "{retry}");
    assert_eq!(retry["retries"], 5, "{retry}");
    assert_eq!(retry["budget_exhausted"], 0, "{retry}");
    let good = address(&st, "items", &s.addr("good1").unwrap().to_string());
    assert_eq!(
        (good["state"].clone(), good["in_flight"].clone()),
        (json!("healthy"), json!(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_avoids_a_replica_answering_fast_503s() {
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_yaml("{}", ""), &s).await;
    let ok = run(&gw, 1000, 8).await;
    assert!(ok >= 999, "success ≥ 99.9 %: {ok} of 1000");
    // Its failures are recorded as doubling penalty latencies: after a few it loses every
    // comparison (P2C alone; ejection would need 5 in a row).
    let bad = item_calls(&s, "bad");
    assert!(bad <= 5, "the bad replica got {bad} calls");
    let st = status(&gw).await;
    assert_eq!(st["backends"]["items"]["strategy"], "p2c_peak_ewma");
    let a = address(&st, "items", &s.addr("bad").unwrap().to_string());
    assert_eq!(a["failures"], bad, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_ejection_a_successful_probe_readmits_the_replica() {
    let s = stubs(STUBS).await;
    let yaml = gateway_yaml(
        "{ strategy: round_robin }",
        "outlier: { base_ejection: 200ms }",
    );
    let gw = gateway(&yaml, &s).await;
    assert_eq!(run(&gw, 30, 1).await, 30);
    assert_eq!(item_calls(&s, "bad"), 5);
    let st = status(&gw).await;
    let bad_addr = s.addr("bad").unwrap().to_string();
    assert_eq!(address(&st, "items", &bad_addr)["state"], "ejected");
    // Heal it; after the ejection time the next call is the probe, which succeeds.
    let heal: fanout_stub::RouteUpdate = serde_json::from_value(json!({"status": 200})).unwrap();
    s.update_route("bad", "GET /item", heal).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(run(&gw, 30, 1).await, 30);
    let st = status(&gw).await;
    let bad = address(&st, "items", &bad_addr);
    assert_eq!(bad["state"], "healthy", "{st}");
    assert_eq!(
        bad["times_ejected"], 1,
        "kept until healthy for max_ejection"
    );
    assert!(item_calls(&s, "bad") > 5, "it serves again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_bulkhead_rejections_do_not_eject_an_address() {
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_yaml("{}", ""), &s).await;
    let c = client(false);
    let url = format!("http://{}/narrow", gw.addr);
    for _ in 0..3 {
        let answers = futures_util::future::join_all((0..8).map(|_| {
            let (c, url) = (c.clone(), url.clone());
            async move { send(&c, Method::GET, &url, &[], "").await.json() }
        }))
        .await;
        let busy = answers.iter().filter(|a| **a == json!("busy")).count();
        assert_eq!(busy, 7, "{answers:?}");
    }
    let st = status(&gw).await;
    for a in st["backends"]["narrow"]["addresses"].as_array().unwrap() {
        assert_eq!(a["failures"], 0, "{st}");
        assert_eq!(a["ejected"], false, "{st}");
    }
}
