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
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from_static(
            br#"{"products":["p1","p2","p3","p4","p5"],"mask":"card","recommendation_mask":"mini"}"#,
        ),
    }]
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
        variants: vec![],
        baselines: &["hyper-baseline", "java-threads"],
        grpc: None,
        database: None,
        default_targets: &["fanout"],
    }
}
