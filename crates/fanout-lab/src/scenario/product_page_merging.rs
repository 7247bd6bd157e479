//! `product-page-merging`: a product page of 10 products + 10 recommended, naive one call per key
//! vs automatic batching (variant 1) vs merged main+recommended calls (variant 2). No acceptance
//! lines: the comparison is the result.

use crate::model::{Mode, Scenario};
use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;

const MERGED_STUBS: &str = include_str!("../../../../examples/product-page-merged/stubs.yaml");
const MERGED_GATEWAY: &str = include_str!("../../../../examples/product-page-merged/fanout.yaml");
const NAIVE: &str = include_str!("../variants/naive.yaml");
const VARIANT1: &str = include_str!("../variants/variant1.yaml");

/// Variant 2 without its caches: the scenario compares call merging, not caching.
fn variant2() -> String {
    MERGED_GATEWAY
        .lines()
        .filter(|l| !l.trim_start().starts_with("cache:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// 64 different pages of 10 products each (overlapping), so that concurrent requests rarely ask
/// identical calls: the scenario measures merging within a request, not in-flight dedup.
fn merging_requests() -> Vec<RequestTemplate> {
    (0..64)
        .map(|k| {
            let products: Vec<String> = (0..10).map(|i| format!("\"p{}\"", k * 7 + i)).collect();
            RequestTemplate {
                method: Method::POST,
                path: "/product-page".into(),
                headers: vec![("content-type".into(), "application/json".into())],
                body: Bytes::from(format!(
                    r#"{{"products":[{}],"mask":"card","recommendation_mask":"mini"}}"#,
                    products.join(",")
                )),
            }
        })
        .collect()
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "product-page-merging",
        about: "product page with 10 products + 10 recommended: naive one-call-per-key vs automatic batching (variant 1) vs merged main+recommended (variant 2)",
        stubs: MERGED_STUBS,
        gateway: MERGED_GATEWAY,
        requests: merging_requests(),
        mode: Mode::Compare,
        slo_p99_ms: 50.0,
        critical_path: vec![
            (
                "recommendations",
                "/recommendations/p1,p2,p3,p4,p5,p6,p7,p8,p9,p10",
            ),
            ("price", "/price?ids=p1,p2,p3,p4,p5,p6,p7,p8,p9,p10"),
        ],
        variants: vec![
            ("naive", NAIVE.to_string()),
            ("variant1", VARIANT1.to_string()),
            ("variant2", variant2()),
        ],
        baselines: &[],
        grpc: None,
        database: None,
        default_targets: &["naive", "variant1", "variant2"],
    }
}
