//! Batch forms (E3) and in-flight dedup, proven by the stubs' call counters.

use crate::support::gateway;
use fanout_testkit::*;
use futures_util::future::join_all;
use http::Method;
use serde_json::json;

const STUBS: &str = r#"
services:
  attrs:
    listen: "${ATTRS_ADDR}"
    routes:
      - path: /attrs
        latency: 20ms
        body: '{items: ($request.query.ids | split(",") | map(select(. != "nope")) | map({id: ., v: ("val-" + .)}))}'
      - path: /one/{id}
        latency: 100ms
        body: '{id: $request.params.id}'
"#;

const GATEWAY: &str = r#"
# Generous limits: these tests count calls, and 200 concurrent requests on a loaded 2-core
# machine must not time out.
defaults: { timeout: 30s, deadline: 30s, connect_timeout: 10s }
backends:
  attrs:
    url: "http://${ATTRS_ADDR}"
    batch:
      path: '"/attrs"'
      query: { ids: '$keys | join(",")' }
      split: '.items | map({key: .id, value: .v}) | from_entries'
      max: 3
  windowed:
    url: "http://${ATTRS_ADDR}"
    batch:
      path: '"/attrs"'
      query: { ids: '$keys | join(",")' }
      split: '.items | map({key: .id, value: .v}) | from_entries'
      max: 100
      window: 5ms
routes:
  - path: /page
    method: POST
    flow:
      main:
        for_each: '$request.body.products'
        http: { backend: attrs, key: '$item' }
      rec_ids:
        value: '$request.body.recommended'
      recs:
        for_each: '$rec_ids'
        http: { backend: attrs, key: '$item' }
        result: '{id: $item, v: .}'
    respond: { body: '{main: $main, recs: $recs}' }
  - path: /single/{id}
    flow:
      a: { http: { backend: attrs, key: '$request.params.id' } }
      b: { optional: true, default: "none", http: { backend: attrs, key: '"nope"' } }
    respond: { body: '{a: $a, b: $b}' }
  - path: /windowed/{id}
    flow:
      a: { http: { backend: windowed, key: '$request.params.id' } }
    respond: { body: '$a' }
  - path: /unwindowed/{id}
    flow:
      a: { http: { backend: attrs, key: '$request.params.id' } }
    respond: { body: '$a' }
  - path: /same
    flow:
      x: { http: { backend: attrs, path: '"/one/1"' } }
      y: { http: { backend: attrs, path: '"/one/1"' } }
    respond: { body: '[$x, $y]' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_lookups_of_a_request_are_merged_deduplicated_and_split() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let body =
        json!({"products": ["p1", "p2", "p3", "p4"], "recommended": ["r1", "p1"]}).to_string();
    let r = send(
        &client(false),
        Method::POST,
        &format!("http://{}/page", gw.addr),
        &[],
        body,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json(),
        json!({
            "main": ["val-p1", "val-p2", "val-p3", "val-p4"],
            "recs": [{"id": "r1", "v": "val-r1"}, {"id": "p1", "v": "val-p1"}]
        })
    );
    // 6 lookups from two steps, 5 distinct keys, at most 3 per call: exactly 2 calls, in parallel.
    let st = s.stats("attrs").unwrap();
    assert_eq!(st.routes["GET /attrs"].requests, 2, "{st:?}");
    assert_eq!(st.routes["GET /attrs"].max_in_flight, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_keys_follow_the_step_failure_policy() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let r = get(&format!("http://{}/single/k1", gw.addr)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json(),
        json!({"a": "val-k1", "b": "none", "_partial": ["b"]})
    );
    assert_eq!(
        s.stats("attrs").unwrap().routes["GET /attrs"].requests,
        1,
        "a and b share one call"
    );
    let r = get(&format!("http://{}/single/nope", gw.addr)).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.code(), "key_not_found");
    assert_eq!(r.json()["error"]["step"], "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_merges_keys_of_concurrent_requests() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let n = 200;
    for (route, windowed) in [("windowed", true), ("unwindowed", false)] {
        s.reset_stats();
        let reqs = (0..n).map(|i| {
            let c = c.clone();
            let url = format!("http://{}/{route}/k{i}", gw.addr);
            async move { send(&c, Method::GET, &url, &[], "").await }
        });
        let answers = join_all(reqs).await;
        for (i, r) in answers.iter().enumerate() {
            assert_eq!(r.status, 200, "{:?}", r.body);
            assert_eq!(r.json(), json!(format!("val-k{i}")));
        }
        let calls = s.stats("attrs").unwrap().routes["GET /attrs"].requests;
        eprintln!("{route}: {n} concurrent requests → {calls} batch calls");
        if windowed {
            assert!(
                calls < n as u64 / 4,
                "cross-request merging: {calls} batch calls for {n} requests"
            );
        } else {
            assert_eq!(
                calls, n as u64,
                "without a window: exactly one batch per request"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_in_flight_are_sent_once() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let reqs = (0..10).map(|_| {
        let c = c.clone();
        let url = format!("http://{}/same", gw.addr);
        async move { send(&c, Method::GET, &url, &[], "").await }
    });
    for r in join_all(reqs).await {
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), json!([{"id": "1"}, {"id": "1"}]));
    }
    // 20 identical calls (2 per request × 10 concurrent requests) while one is in flight.
    let calls = s.stats("attrs").unwrap().routes["GET /one/{id}"].requests;
    assert!(
        calls < 10,
        "in-flight dedup: {calls} calls for 20 identical lookups"
    );
}

/// `defaults.dedup: false` (what the lab sets against hand-written baselines): every call is
/// its own — 20 identical lookups, 20 calls, coalescing off as well — and a backend that states
/// `dedup: true` keeps sharing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_off_by_default_makes_every_call_unless_a_backend_says_otherwise() {
    let s = stubs(STUBS).await;
    for (backend_says, shared) in [("", false), ("\n    dedup: true", true)] {
        let cfg = GATEWAY
            .replace(
                "defaults: { timeout: 30s,",
                "defaults: { dedup: false, coalesce: false, timeout: 30s,",
            )
            .replacen(
                "  attrs:\n    url: \"http://${ATTRS_ADDR}\"",
                &format!("  attrs:\n    url: \"http://${{ATTRS_ADDR}}\"{backend_says}"),
                1,
            );
        assert!(cfg.contains("dedup: false"), "{cfg}");
        let gw = gateway(&cfg, &s).await;
        let c = client(false);
        s.reset_stats();
        let reqs = (0..10).map(|_| {
            let c = c.clone();
            let url = format!("http://{}/same", gw.addr);
            async move { send(&c, Method::GET, &url, &[], "").await }
        });
        for r in join_all(reqs).await {
            assert_eq!(r.status, 200);
        }
        let calls = s.stats("attrs").unwrap().routes["GET /one/{id}"].requests;
        if shared {
            assert!(calls < 20, "dedup: true kept: {calls} calls");
        } else {
            assert_eq!(calls, 20, "every lookup its own call");
        }
    }
}

const PAGE_STUBS: &str = r#"
services:
  recommendations:
    listen: "${RECOMMENDATIONS_ADDR}"
    routes:
      - path: /recs
        latency: 30ms
        body: '{products: ([range(15; 20)] + [range(100; 105)] | map("p\(.)"))}'
  price:
    listen: "${PRICE_ADDR}"
    routes:
      - { path: /price, latency: 5ms, body: '$request.query.ids | split(",") | map({key: ., value: {price: length}}) | from_entries' }
  stock:
    listen: "${STOCK_ADDR}"
    routes:
      - { path: /stock, latency: 5ms, body: '$request.query.ids | split(",") | map({key: ., value: {stock: 1}}) | from_entries' }
  media:
    listen: "${MEDIA_ADDR}"
    routes:
      - { path: /media, latency: 5ms, body: '$request.query.ids | split(",") | map({key: ., value: {img: .}}) | from_entries' }
"#;

fn page_gateway(variant: u8) -> String {
    // The test counts calls: generous time limits, so a loaded machine cannot fail it by time.
    let backends = r#"
defaults: { deadline: 30s, timeout: 20s }
backends:
  recommendations: { url: "http://${RECOMMENDATIONS_ADDR}" }
  price: { url: "http://${PRICE_ADDR}", batch: { path: '"/price"', query: { ids: '$keys | join(",")' }, split: '.', max: 25 } }
  stock: { url: "http://${STOCK_ADDR}", batch: { path: '"/stock"', query: { ids: '$keys | join(",")' }, split: '.', max: 25 } }
  media: { url: "http://${MEDIA_ADDR}", batch: { path: '"/media"', query: { ids: '$keys | join(",")' }, split: '.', max: 25 } }
routes:
  - path: /page
    method: POST
    flow:
      recs: { http: { backend: recommendations, path: '"/recs"' }, result: .products }
"#;
    let steps = if variant == 2 {
        r#"      all: { value: '$request.body.products + $recs' }
      price: { for_each: '$all', http: { backend: price, key: '$item' } }
      stock: { for_each: '$all', http: { backend: stock, key: '$item' } }
      media: { for_each: '$all', http: { backend: media, key: '$item' } }
    respond: { body: '{n: ($price | length), m: ($media | length)}' }
"#
    } else {
        r#"      price: { for_each: '$request.body.products', http: { backend: price, key: '$item' } }
      stock: { for_each: '$request.body.products', http: { backend: stock, key: '$item' } }
      media: { for_each: '$request.body.products', http: { backend: media, key: '$item' } }
      rprice: { for_each: '$recs', http: { backend: price, key: '$item' } }
      rstock: { for_each: '$recs', http: { backend: stock, key: '$item' } }
      rmedia: { for_each: '$recs', http: { backend: media, key: '$item' } }
    respond: { body: '{n: (($price + $rprice) | length), m: (($media + $rmedia) | length)}' }
"#
    };
    format!("{backends}{steps}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn product_page_variants_cost_one_or_two_calls_per_service() {
    // 20 main products p0..p19; 10 recommended, 5 of which (p15..p19) are also main products.
    let products: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let body = json!({ "products": products }).to_string();
    for variant in [2u8, 1] {
        let s = stubs(PAGE_STUBS).await;
        let gw = gateway(&page_gateway(variant), &s).await;
        let r = send(
            &client(false),
            Method::POST,
            &format!("http://{}/page", gw.addr),
            &[],
            body.clone(),
        )
        .await;
        assert_eq!(r.status, 200, "variant {variant}: {:?}", r.body);
        assert_eq!(r.json(), json!({"n": 30, "m": 30}), "variant {variant}");
        assert_eq!(calls(&s, "recommendations"), 1);
        for svc in ["price", "stock", "media"] {
            let n = calls(&s, svc);
            if variant == 2 {
                // 25 distinct keys (30 lookups, 5 duplicates) ≤ max 25: exactly one call.
                assert_eq!(
                    n, 1,
                    "variant 2, {svc}: duplicates are fetched once, one call per service"
                );
            } else {
                // Main products in round 1 (20 keys), recommended in round 2 (10 keys).
                assert_eq!(
                    n, 2,
                    "variant 1, {svc}: one call per round, never one per key"
                );
            }
        }
    }
}
