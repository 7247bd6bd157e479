//! `GET /items/{id}` (the hand-written hop of `fanout lab hop --targets …,hyper-baseline`): one
//! call to the item stub, its JSON answer sent back; its timeout and a missing backend answer
//! as fanout's route does (504, 502).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod common;

use common::*;
use fanout_testkit::*;
use serde_json::json;

/// The hop's stub (as in `crates/fanout-lab/src/hop.rs`, on tokio's timer).
const ITEM_STUBS: &str = r#"
services:
  item:
    listen: "${ITEM_ADDR:-127.0.0.1:0}"
    routes:
      - path: /items/{id}
        latency: 1ms
        body: '{id: $request.params.id, name: "item", price: 12.5}'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_is_the_stubs_answer_from_one_call() {
    let stubs = stubs(ITEM_STUBS).await;
    let agg = start(config(&stubs, &[])).await;
    for id in ["7", "42"] {
        stubs.reset_stats();
        let r = get(&agg.url(&format!("/items/{id}"))).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.json(), json!({"id": id, "name": "item", "price": 12.5}));
        assert_eq!(calls(&stubs, "item"), 1);
    }
    agg.shutdown().await;
    // No item backend: a 502 naming the step, as fanout's.
    let agg = start(config(&stubs, &[("ITEM_ADDR", closed_port().await)])).await;
    let r = get(&agg.url("/items/1")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["step"], "got");
    agg.shutdown().await;
    stubs.shutdown().await;
}
