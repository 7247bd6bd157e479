//! `product-page`: Leroy Merlin's product page (examples/product-page), compared across targets.
//! No acceptance lines: the comparison is the result.

use crate::model::{Mode, Scenario};
use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;

const PP_STUBS: &str = include_str!("../../../../examples/product-page/stubs.yaml");
const PP_GATEWAY: &str = include_str!("../../../../examples/product-page/fanout.yaml");

fn pp_requests() -> Vec<RequestTemplate> {
    vec![RequestTemplate {
        method: Method::POST,
        path: "/product-page".into(),
        // Every target gets the same request; only the `fanout-gzip` and `fanout-br` variants
        // compress (the others ignore `Accept-Encoding`).
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("accept-encoding".into(), "gzip, br".into()),
        ],
        body: Bytes::from_static(
            br#"{"products":["p1","p2","p3","p4","p5"],"mask":"card","recommendation_mask":"mini"}"#,
        ),
    }]
}

/// A variant compressing its answers with `coding` only (at its default level); `min_bytes` low
/// enough for this answer (729 bytes for the lab's 5 products).
fn compressing(name: &'static str, coding: &str) -> (&'static str, String) {
    (
        name,
        format!(
            "{PP_GATEWAY}\ncompression:\n  response: {{ enabled: true, algorithms: [{coding}], min_bytes: 256 }}\n"
        ),
    )
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "product-page",
        about: "Leroy Merlin's product page: masks, recommendations, 3 attribute services (examples/product-page)",
        stubs: PP_STUBS,
        gateway: PP_GATEWAY,
        requests: pp_requests(),
        mode: Mode::Compare,
        slo_p99_ms: 50.0,
        critical_path: vec![
            ("recommendations", "/recommendations/p1,p2,p3,p4,p5"),
            ("price", "/price?ids=r-p1,r-p2,r-p3,r-p4,r-p5"),
        ],
        // `--targets fanout,fanout-gzip,fanout-br` what compressing the answer costs per request.
        variants: vec![
            compressing("fanout-gzip", "gzip"),
            compressing("fanout-br", "br"),
        ],
        baselines: &["hyper-baseline", "java-threads"],
        grpc: None,
        database: None,
        default_targets: &["fanout"],
    }
}
