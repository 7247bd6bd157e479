//! Everything shared between requests — in-flight dedup, the answer cache, cross-request batch
//! windows — is keyed by everything a call sends, so no user ever receives another user's
//! answer; and a shared call has its own time limit, so a backend that hangs for a moment cannot
//! wedge a hot key for as long as traffic continues.

use crate::support::gateway;
use fanout_testkit::*;
use http::{Method, StatusCode};
use std::time::Duration;
use tokio::time::Instant;

const STUBS: &str = r#"
services:
  me:
    listen: "${ME_ADDR}"
    routes:
      # Who the backend thinks is asking (slow enough that concurrent calls overlap).
      - path: /me-dedup
        latency: 100ms
        body: '{user: $request.headers.authorization, q: $request.query.q}'
      - path: /me-cache
        latency: 100ms
        body: '{user: $request.headers.authorization}'
      - path: /profiles
        latency: 20ms
        body: '($request.query.ids | split(",")) | map({key: ., value: {id: .}}) | from_entries'
      - path: /hot
        latency: 1ms
        body: '{ok: true}'
"#;

const GATEWAY: &str = r#"
backends:
  me:       { url: "http://${ME_ADDR}", timeout: 2s }
  me_cache: { url: "http://${ME_ADDR}", timeout: 2s, cache: { ttl: 60s } }
  profiles:
    url: "http://${ME_ADDR}"
    timeout: 2s
    batch: { path: '"/profiles"', query: { ids: '$keys | join(",")' }, split: '.', window: 20ms }
  hot: { url: "http://${ME_ADDR}", timeout: 250ms }
defaults: { deadline: 5s }
routes:
  - path: /dedup
    flow:
      me:
        http:
          backend: me
          path: '"/me-dedup"'
          query: { q: '$request.query.q' }
          headers: { authorization: '$request.headers.authorization' }
    respond: { body: '$me' }
  - path: /cache
    flow:
      me:
        http:
          backend: me_cache
          path: '"/me-cache"'
          headers: { authorization: '$request.headers.authorization' }
    respond: { body: '$me' }
  - path: /batch
    flow:
      p: { http: { backend: profiles, key: '$request.headers.authorization' } }
    respond: { body: '$p' }
  - path: /hot
    deadline: 1s
    flow:
      h: { http: { backend: hot, path: '"/hot"' } }
    respond: { body: '$h' }
"#;

const USERS: usize = 40;

/// Every user sends two requests at once, all users at once; returns (user, answer) pairs.
async fn all_users(url: &str, q: &str) -> Vec<(String, serde_json::Value)> {
    let c = client(false);
    let reqs = (0..USERS).flat_map(|u| {
        let c = c.clone();
        let user = format!("user-{u}");
        let url = format!("{url}?q={q}");
        (0..2).map(move |_| {
            let (c, user, url) = (c.clone(), user.clone(), url.clone());
            async move {
                let r = send(&c, Method::GET, &url, &[("authorization", &user)], "").await;
                assert_eq!(
                    r.status,
                    StatusCode::OK,
                    "{}",
                    String::from_utf8_lossy(&r.body)
                );
                (user, r.json())
            }
        })
    });
    futures_util::future::join_all(reqs).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_users_each_receive_only_their_own_answer() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;

    // In-flight dedup (on by default): the calls differ only in `authorization`.
    for (user, answer) in all_users(&format!("http://{}/dedup", gw.addr), "x").await {
        assert_eq!(answer["user"], user.as_str(), "dedup: {user} got {answer}");
    }
    let dedup_calls = route_calls(&s, "me", "GET /me-dedup");
    assert!(
        (USERS as u64..=2 * USERS as u64).contains(&dedup_calls),
        "at least one call per user: {dedup_calls}"
    );
    // The query is part of the identity too.
    for (user, answer) in all_users(&format!("http://{}/dedup", gw.addr), "y").await {
        assert_eq!(answer["user"], user.as_str());
        assert_eq!(answer["q"], "y", "{user} got an answer for another query");
    }

    // Answer cache: each user's answer is cached under that user's call; a second round is
    // served from the cache, still each user's own.
    for (user, answer) in all_users(&format!("http://{}/cache", gw.addr), "x").await {
        assert_eq!(answer["user"], user.as_str(), "cache: {user} got {answer}");
    }
    let first_round = route_calls(&s, "me", "GET /me-cache");
    assert!(
        first_round >= USERS as u64,
        "one call per user at least: {first_round}"
    );
    for (user, answer) in all_users(&format!("http://{}/cache", gw.addr), "x").await {
        assert_eq!(answer["user"], user.as_str(), "cached: {user} got {answer}");
    }
    assert_eq!(
        route_calls(&s, "me", "GET /me-cache"),
        first_round,
        "the second round came from the cache"
    );

    // Cross-request batch window: users' keys are merged into shared calls, and each request
    // gets the value of its own key only.
    for (user, answer) in all_users(&format!("http://{}/batch", gw.addr), "x").await {
        assert_eq!(answer, serde_json::json!({"id": user}), "batch: {user}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_call_does_not_wedge_a_hot_key() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let url = format!("http://{}/hot", gw.addr);
    let c = client(false);
    let timeout = Duration::from_millis(250); // the `hot` backend's timeout

    // ~200 requests per second on one URL throughout; results are (send time, status).
    let driver = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let until = Instant::now() + Duration::from_millis(2000);
            let mut reqs = Vec::new();
            while Instant::now() < until {
                tick.tick().await;
                let (c, url) = (c.clone(), url.clone());
                let sent = Instant::now();
                reqs.push(tokio::spawn(async move {
                    (sent, send(&c, Method::GET, &url, &[], "").await.status)
                }));
            }
            let mut out = Vec::new();
            for r in reqs {
                out.push(r.await.expect("request task"));
            }
            out
        })
    };
    // Normal traffic, then the backend hangs for 0.3 s, then it is back.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let hang = serde_json::json!({"faults": [{"hang": {}}]});
    s.update_route("me", "GET /hot", serde_json::from_value(hang).unwrap())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let back = serde_json::json!({"faults": []});
    s.update_route("me", "GET /hot", serde_json::from_value(back).unwrap())
        .unwrap();
    let recovered = Instant::now();

    let results = driver.await.unwrap();
    let failed_during_hang = results
        .iter()
        .filter(|(t, st)| *t < recovered && *st == StatusCode::GATEWAY_TIMEOUT)
        .count();
    assert!(failed_during_hang > 0, "the hang was real");
    // Every request sent one backend timeout + 100 ms after the recovery succeeded: no new
    // request joined a call that started while the backend hung.
    let resumed = recovered + timeout + Duration::from_millis(100);
    let after: Vec<_> = results.iter().filter(|(t, _)| *t >= resumed).collect();
    assert!(after.len() > 50, "traffic continued: {}", after.len());
    let st = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    let dedup = &st["backends"]["hot"]["dedup"];
    assert!(
        dedup["expired"].as_u64().unwrap_or(0) >= 1,
        "the hung shared call expired: {dedup}"
    );
    let bad: Vec<_> = after.iter().filter(|(_, st)| !st.is_success()).collect();
    assert!(
        bad.is_empty(),
        "{} of {} requests after the recovery failed, e.g. {:?} at +{:?}",
        bad.len(),
        after.len(),
        bad[0].1,
        bad[0].0 - recovered
    );
}
