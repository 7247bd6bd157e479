//! Reference data (E2): loaded at start, refreshed on its period, swapped atomically, survives a
//! failed refresh with its age visible, and a required dataset that cannot load fails the start.

use crate::support::gateway;
use fanout_expr::Expr;
use fanout_stub::StubServer;
use fanout_testkit::*;
use serde_json::json;

const STUBS: &str = r#"
services:
  masks:
    listen: "${MASKS_ADDR}"
    routes:
      - path: /masks
        body: '{v: 1, list: [1, 1, 1, 1, 1, 1, 1, 1]}'
"#;

const GATEWAY: &str = r#"
backends:
  masks: { url: "http://${MASKS_ADDR}", timeout: 200ms }
reference:
  masks:
    http: { backend: masks, path: '"/masks"' }
    refresh: 30ms
routes:
  - path: /r
    respond: { body: '$ref.masks' }
"#;

fn set_version(s: &StubServer, v: u32) {
    let mut b = (*s.behaviour("masks", "GET /masks").expect("route")).clone();
    b.body = Some(
        Expr::compile(
            &format!("{{v: {v}, list: [range(8)] | map({v})}}"),
            &["request"],
        )
        .unwrap(),
    );
    assert!(s.set_behaviour("masks", "GET /masks", b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refreshes_atomically_and_survives_a_failed_refresh() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let url = format!("http://{}/r", gw.addr);
    assert_eq!(get(&url).await.json()["v"], 1, "loaded at start");

    // Refresh on period.
    set_version(&s, 2);
    let mut seen = 0;
    for _ in 0..200 {
        seen = get(&url).await.json()["v"].as_u64().unwrap_or(0);
        if seen == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(seen, 2, "refreshed on its period");

    // Atomic swap: while versions change underneath, every answer is internally consistent.
    let flipper = {
        let s2 = &s;
        async move {
            for v in 3..30 {
                set_version(s2, v);
                tokio::time::sleep(std::time::Duration::from_millis(7)).await;
            }
        }
    };
    let reader = async {
        let c = client(false);
        let mut versions = std::collections::BTreeSet::new();
        for _ in 0..300 {
            let j = send(&c, http::Method::GET, &url, &[], "").await.json();
            let v = j["v"].as_u64().unwrap();
            let list = j["list"].as_array().unwrap();
            assert_eq!(list.len(), 8);
            assert!(
                list.iter().all(|x| x.as_u64() == Some(v)),
                "half-updated dataset: {j}"
            );
            versions.insert(v);
        }
        versions
    };
    let ((), versions) = tokio::join!(flipper, reader);
    assert!(versions.len() >= 3, "saw several versions: {versions:?}");

    // A failed refresh keeps the last good copy; the status shows the error and the age.
    set_version(&s, 42);
    eventually_async(&url, 42).await;
    s.update_route(
        "masks",
        "GET /masks",
        serde_json::from_value(json!({"status": 500})).unwrap(),
    )
    .unwrap();
    let status_url = format!("http://{}/__fanout/status", gw.addr);
    for _ in 0..200 {
        if get(&status_url).await.json()["reference"]["masks"]["failures"]
            .as_u64()
            .unwrap_or(0)
            >= 2
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let st = get(&status_url).await.json();
    let m = &st["reference"]["masks"];
    assert!(m["failures"].as_u64().unwrap() >= 2, "{st}");
    assert!(
        m["last_error"].as_str().is_some_and(|e| e.contains("500")),
        "{st}"
    );
    assert!(m["age_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        get(&url).await.json()["v"],
        42,
        "last good copy still served"
    );
    let age_during_outage = m["age_s"].as_f64().unwrap();

    // Back: refreshed again, error cleared, age reset.
    s.update_route(
        "masks",
        "GET /masks",
        serde_json::from_value(json!({"status": 200})).unwrap(),
    )
    .unwrap();
    for _ in 0..200 {
        if get(&status_url).await.json()["reference"]["masks"]["last_error"].is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let m = get(&status_url).await.json()["reference"]["masks"].clone();
    assert!(m["last_error"].is_null(), "{m}");
    assert!(m["age_s"].as_f64().unwrap() < age_during_outage + 0.5);
}

async fn eventually_async(url: &str, v: u64) {
    for _ in 0..200 {
        if get(url).await.json()["v"].as_u64() == Some(v) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("dataset never reached version {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_dataset_that_cannot_load_fails_the_start_clearly() {
    let s = stubs(STUBS).await;
    let down = r#"
backends:
  gone: { url: "http://127.0.0.1:1", connect_timeout: 200ms }
reference:
  masks: { http: { backend: gone, path: '"/masks"' } }
routes:
  - path: /r
    respond: { body: '$ref.masks' }
"#;
    let lookup = |_: &str| None;
    let gw = fanout::load_gateway("fanout.yaml", down, &lookup).unwrap();
    let err = match fanout::start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0")).await {
        Ok(_) => panic!("started without its required reference data"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("reference data `masks`: first load failed"),
        "{err}"
    );

    let optional = down.replace(
        "path: '\"/masks\"' } }",
        "path: '\"/masks\"' }, optional: true }",
    );
    let gw = fanout::load_gateway("fanout.yaml", &optional, &lookup).unwrap();
    let running = fanout::start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .expect("optional dataset: starts");
    assert_eq!(
        get(&format!("http://{}/r", running.addr)).await.json(),
        serde_json::Value::Null
    );
    drop(s);
}
