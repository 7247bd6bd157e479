//! Caches (E1) end to end: whole answers and per-key values of batch forms (a batch asks only for
//! the keys that missed), with their counters on /__fanout/status.

use crate::support::gateway;
use fanout_testkit::*;
use http::Method;
use serde_json::json;

const STUBS: &str = r#"
services:
  attrs:
    listen: "${ATTRS_ADDR}"
    routes:
      # Each value says how many keys the call that produced it asked for.
      - path: /attrs
        body: '($request.query.ids | split(",")) as $ids | $ids | map({key: ., value: "\(.)/\($ids | length)"}) | from_entries'
      - path: /conf
        body: '{conf: true}'
"#;

const GATEWAY: &str = r#"
backends:
  attrs:
    url: "http://${ATTRS_ADDR}"
    cache: { ttl: 10s }
    batch:
      path: '"/attrs"'
      query: { ids: '$keys | join(",")' }
      split: '.'
routes:
  - path: /items
    method: POST
    flow:
      v: { for_each: '$request.body', http: { backend: attrs, key: '$item' } }
    respond: { body: '$v' }
  - path: /conf
    flow:
      c: { http: { backend: attrs, path: '"/conf"' } }
    respond: { body: '$c' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_asks_only_for_the_keys_that_missed() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let url = format!("http://{}/items", gw.addr);
    let a = send(&c, Method::POST, &url, &[], r#"["p1","p2"]"#).await;
    assert_eq!(a.json(), json!(["p1/2", "p2/2"]));
    let b = send(&c, Method::POST, &url, &[], r#"["p2","p3","p4"]"#).await;
    // p2 from the cache (it came from the 2-key call); p3 and p4 from a call asking for 2 keys.
    assert_eq!(b.json(), json!(["p2/2", "p3/2", "p4/2"]));
    let again = send(&c, Method::POST, &url, &[], r#"["p4","p1"]"#).await;
    assert_eq!(again.json(), json!(["p4/2", "p1/2"]));
    assert_eq!(
        s.stats("attrs").unwrap().routes["GET /attrs"].requests,
        2,
        "third request fully cached"
    );

    let st = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    let keys = &st["caches"]["attrs"]["keys"];
    assert_eq!(keys["hits"], 3, "{st}");
    assert_eq!(keys["misses"], 4, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_answers_are_cached() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    for _ in 0..5 {
        let r = get(&format!("http://{}/conf", gw.addr)).await;
        assert_eq!(r.json(), json!({"conf": true}));
    }
    assert_eq!(s.stats("attrs").unwrap().routes["GET /conf"].requests, 1);
    let st = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    assert_eq!(st["caches"]["attrs"]["answers"]["hits"], 4, "{st}");
}
