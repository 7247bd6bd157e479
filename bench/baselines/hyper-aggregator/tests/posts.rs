//! `GET /posts?page=N` (the lab's `n-plus-one` scenario) against the scenario's own stubs: the
//! page's 100 posts in order, each with its user projected to `{id, name, email}`, from 1 call to
//! `posts` and one call per distinct user (10). That fanout's route answers the same bytes is
//! checked in `crates/fanout-cli/tests/lab.rs` (`n_plus_one_answers_like_the_hyper_baseline`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod common;

use common::*;
use fanout_testkit::*;
use serde_json::Value;
use std::path::Path;

fn scenario_stubs() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../crates/fanout-lab/src/scenarios/n-plus-one.stubs.yaml");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_are_joined_with_their_users_in_eleven_calls() {
    let stubs = stubs(&scenario_stubs()).await;
    let agg = start(config(&stubs, &[])).await;
    for page in [2u64, 7] {
        stubs.reset_stats();
        let r = get(&agg.url(&format!("/posts?page={page}"))).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = r.json();
        let items = v.as_array().expect("a list");
        assert_eq!(items.len(), 100);
        for (i, item) in items.iter().enumerate() {
            let i = i as u64;
            let uid = page * 10 + i % 10 + 1;
            let keys: Vec<&String> = item.as_object().unwrap().keys().collect();
            assert_eq!(
                keys,
                ["id", "title", "user"],
                "key order as fanout writes it"
            );
            assert_eq!(item["id"], page * 100 + i + 1);
            assert!(item["title"].as_str().is_some_and(|t| !t.is_empty()));
            assert_eq!(
                item["user"],
                serde_json::json!({"id": uid, "name": format!("Leanne Graham {uid}"), "email": format!("Sincere{uid}@april.biz")})
            );
        }
        assert_eq!(calls(&stubs, "posts"), 1, "page {page}");
        assert_eq!(calls(&stubs, "users"), 10, "one call per distinct user");
    }
    // Without a page: the stub's page 0 (users 1 … 10); another method is refused.
    let r = get(&agg.url("/posts")).await;
    assert_eq!(r.json()[0]["user"]["id"], Value::from(1));
    let r = post(&agg.url("/posts"), "").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET"));
    agg.shutdown().await;
    stubs.shutdown().await;
}
