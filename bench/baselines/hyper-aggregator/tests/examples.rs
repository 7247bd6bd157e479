//! The aggregator answers every case of `examples/hh-vacancies/cases.yaml` and
//! `examples/product-page/cases.yaml` exactly as fanout does: status, JSON body *bytes* (fanout
//! writes compact JSON in the example's key order, which is how the expected value serializes),
//! documented headers, and the number of calls each backend received.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod common;

use common::*;
use fanout_testkit::*;
use http::Method;
use serde_json::Value;

const EXAMPLES: [&str; 2] = ["hh-vacancies", "product-page"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_answer_as_fanout_does() {
    for example in EXAMPLES {
        let stubs = stubs(&example_file(example, "stubs.yaml")).await;
        let agg = start(config(&stubs, &[])).await;
        let cases: Value =
            serde_saphyr::from_str(&example_file(example, "cases.yaml")).expect("cases.yaml");
        let cases = cases["cases"].as_array().expect("cases: a list");
        assert!(!cases.is_empty(), "{example}: no cases");
        for c in [client(false), client(true)] {
            // Cases with an exact expected answer and no backend changed for the case (`fanout
            // test`'s fault and latency overrides need its runner; these stubs are shared).
            for case in cases
                .iter()
                .filter(|c| c.get("backends").is_none() && !c["response"].is_null())
            {
                stubs.reset_stats();
                let ctx = format!("{example} / {}", case["name"].as_str().unwrap_or("?"));
                let req = &case["request"];
                let method = req["method"].as_str().unwrap_or("GET");
                let method = Method::from_bytes(method.as_bytes()).expect("method");
                let url = agg.url(req["path"].as_str().expect("request.path"));
                let headers: Vec<(&str, &str)> = req["headers"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), v.as_str().expect("header value")))
                    .collect();
                let body = match &req["body"] {
                    Value::Null => String::new(),
                    b => b.to_string(),
                };
                let resp = send(&c, method, &url, &headers, body).await;

                assert_eq!(
                    Some(u64::from(resp.status.as_u16())),
                    case["status"].as_u64(),
                    "{ctx}: {}",
                    resp.text()
                );
                assert_eq!(resp.json(), case["response"], "{ctx}");
                assert_eq!(
                    resp.text(),
                    case["response"].to_string(),
                    "{ctx}: body bytes"
                );
                assert_eq!(
                    resp.header("content-type"),
                    Some("application/json"),
                    "{ctx}"
                );
                let want_headers = case["headers"].as_object();
                for (k, v) in want_headers.into_iter().flatten() {
                    assert_eq!(resp.header(k), v.as_str(), "{ctx}: header {k}");
                }
                if want_headers.is_none_or(|h| !h.contains_key("x-fanout-partial")) {
                    assert_eq!(resp.header("x-fanout-partial"), None, "{ctx}");
                }
                // A count, or `{count, calls}` (fanout test's detailed form).
                for (service, n) in case["backend_calls"].as_object().into_iter().flatten() {
                    assert_eq!(
                        Some(calls(&stubs, service)),
                        n.as_u64().or_else(|| n["count"].as_u64()),
                        "{ctx}: calls to {service}"
                    );
                }
            }
        }
        agg.shutdown().await;
        stubs.shutdown().await;
    }
}
