//! Behaviour beyond the example cases: routing errors, deadlines and their forwarding, backend
//! failures, the concurrency bound, the product page's schedule (main products never wait for
//! recommendations), h2c and graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod common;

use common::*;
use fanout_testkit::*;
use http::Method;
use serde_json::json;
use std::time::{Duration, Instant};

const PAGE: &str = r#"{"products":["p1","p2"],"mask":"card","recommendation_mask":"mini"}"#;

/// A search stub (`SEARCH_ADDR`) answering with `body` after `latency`, with `status`, plus the
/// example's vacancies stub.
fn search_stub(body: &str, latency: &str, status: u16) -> String {
    format!(
        r#"
services:
  search:
    listen: "${{SEARCH_ADDR}}"
    routes:
      - path: /search
        latency: {latency}
        status: {status}
        body: '{body}'
  vacancies:
    listen: "${{VACANCIES_ADDR}}"
    routes:
      - path: /vacancies/{{id}}
        latency: 20ms
        body: '{{id: ($request.params.id | tonumber)}}'
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_and_request_errors() {
    let agg = start(hyper_aggregator::Config::default()).await;

    let r = get(&agg.url("/nope")).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.code(), "not_found");
    assert_eq!(
        r.text(),
        r#"{"error":{"code":"not_found","message":"no route for /nope","step":null,"backend":null}}"#
    );

    let r = post(&agg.url("/vacancies"), "").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.code(), "method_not_allowed");
    assert_eq!(r.header("allow"), Some("GET"));

    let r = get(&agg.url("/product-page")).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));

    let r = post(&agg.url("/product-page"), "{x").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), "invalid_json");

    let r = post(&agg.url("/product-page"), r#"{"mask":"card"}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), "invalid_body");

    let c = client(false);
    let r = send(
        &c,
        Method::GET,
        &agg.url("/vacancies?text=rust"),
        &[("x-request-timeout", "soon")],
        "",
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.code(), "bad_header");

    let big = "x".repeat(hyper_aggregator::MAX_BODY_BYTES + 1);
    let r = post(&agg.url("/product-page"), &big).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.code(), "body_too_large");

    agg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_the_remaining_budget() {
    // The search stub reports the x-request-timeout it received as `total`.
    let stubs = stubs(&search_stub(
        r#"{total: ($request.headers["x-request-timeout"] | tonumber), ids: []}"#,
        "1ms",
        200,
    ))
    .await;
    let agg = start(config(&stubs, &[])).await;
    let c = client(false);

    let r = get(&agg.url("/vacancies?text=a")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // min(search timeout 150 ms, route deadline 500 ms minus a few µs)
    assert_eq!(r.json(), json!({"total": 150, "items": []}));

    let url = agg.url("/vacancies?text=a");
    let r = send(&c, Method::GET, &url, &[("x-request-timeout", "80")], "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let ms = r.json()["total"].as_u64().expect("a number");
    assert!(
        (70..=80).contains(&ms),
        "forwarded {ms} ms of an 80 ms budget"
    );

    agg.shutdown().await;
    stubs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_and_timeouts_give_504() {
    let stubs = stubs(&search_stub("{total: 1, ids: [1]}", "300ms", 200)).await;
    let agg = start(config(&stubs, &[])).await;
    let c = client(false);

    // The search backend's own timeout (150 ms) passes first.
    let r = get(&agg.url("/vacancies?text=a")).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.code(), "backend_timeout");
    assert_eq!(r.json()["error"]["step"], "found");
    assert_eq!(r.json()["error"]["backend"], "search");

    // A client budget shorter than the call timeout: the request deadline passes first.
    let url = agg.url("/vacancies?text=a");
    let r = send(&c, Method::GET, &url, &[("x-request-timeout", "20")], "").await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.code(), "deadline_exceeded");

    agg.shutdown().await;
    stubs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failures_give_502() {
    let stubs = stubs(&search_stub("{total: 1, ids: [1]}", "1ms", 500)).await;
    let agg = start(config(&stubs, &[])).await;
    let r = get(&agg.url("/vacancies?text=a")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.code(), "backend_status");
    agg.shutdown().await;

    // Search works, the vacancy backend is down.
    let stubs = stubs_ok().await;
    let down = closed_port().await;
    let agg = start(config(&stubs, &[("VACANCIES_ADDR", down)])).await;
    let r = get(&agg.url("/vacancies?text=a")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.code(), "backend_unavailable");
    assert_eq!(r.json()["error"]["step"], "details");
    agg.shutdown().await;
}

async fn stubs_ok() -> fanout_stub::StubServer {
    stubs(&example_file("hh-vacancies", "stubs.yaml")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacancies_run_at_most_8_at_a_time_in_order() {
    let stubs = stubs(&search_stub("{total: 20, ids: [range(20)]}", "1ms", 200)).await;
    let agg = start(config(&stubs, &[])).await;
    let r = get(&agg.url("/vacancies?text=a")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let want: Vec<_> = (0..20).map(|i| json!({"id": i})).collect();
    assert_eq!(r.json(), json!({"total": 20, "items": want}));
    let route = stubs.stats("vacancies").expect("stats").routes["GET /vacancies/{id}"];
    assert_eq!(route.requests, 20);
    assert_eq!(route.max_in_flight, 8);
    agg.shutdown().await;
    stubs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_products_do_not_wait_for_recommendations() {
    let stubs = stubs(&example_file("product-page", "stubs.yaml")).await;
    let agg = start(config(&stubs, &[])).await;
    let page = r#"{"products":["p-slow"],"mask":"card","recommendation_mask":"mini"}"#;
    let url = agg.url("/product-page");
    let req = tokio::spawn(async move { post(&url, page).await });
    // The price call for the main product completes while the recommendations call (2 s, cut
    // at 50 ms) is still in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let price = stubs.stats("price").expect("price").routes["GET /price"];
        if price.completed == 1 {
            let recs = stubs.stats("recommendations").expect("recs");
            let slow = recs.routes["GET /recommendations/p-slow"];
            assert_eq!(slow.in_flight, 1, "recommendations already finished");
            break;
        }
        assert!(Instant::now() < deadline, "the price call never completed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let r = req.await.expect("request task");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-fanout-partial"), Some("recs"));
    agg.shutdown().await;
    stubs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_mask_services_add_no_fields() {
    let stubs = stubs(&example_file("product-page", "stubs.yaml")).await;
    let agg = start(config(&stubs, &[])).await;
    // An unknown mask lists no services: ids only, and no attribute call at all.
    let body = r#"{"products":["p1"],"mask":"none","recommendation_mask":"none"}"#;
    let r = post(&agg.url("/product-page"), body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        r#"{"products":[{"id":"p1"}],"recommendations":[{"id":"r-p1"}]}"#
    );
    for service in ["price", "stock", "media"] {
        assert_eq!(calls(&stubs, service), 0, "{service}");
    }
    // A required mask that fails fails the page.
    agg.shutdown().await;
    let down = closed_port().await;
    let agg = start(config(&stubs, &[("MASKS_ADDR", down)])).await;
    let r = post(&agg.url("/product-page"), PAGE).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.code(), "backend_unavailable");
    agg.shutdown().await;
    stubs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let stubs = stubs(&search_stub("{total: 0, ids: []}", "100ms", 200)).await;
    let agg = start(config(&stubs, &[])).await;
    let url = agg.url("/vacancies?text=a");
    let req = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let addr = agg.addr;
    agg.shutdown().await;
    let r = req.await.expect("request task");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
    stubs.shutdown().await;
}
