//! `hh-vacancies`: HeadHunter's flow (examples/hh-vacancies), compared across targets. No
//! acceptance lines: the comparison is the result.

use crate::model::{Mode, Scenario};
use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;

pub(super) const HH_STUBS: &str = include_str!("../../../../examples/hh-vacancies/stubs.yaml");
pub(super) const HH_GATEWAY: &str = include_str!("../../../../examples/hh-vacancies/fanout.yaml");

/// Appended to the example's config for the `fanout-nometrics` target.
const NO_METRICS: &str = "\nadmin:\n  metrics: false\n";

/// `GET /vacancies?text=rust` (also the `overload` scenario's request).
pub(super) fn hh_requests() -> Vec<RequestTemplate> {
    vec![RequestTemplate {
        method: Method::GET,
        path: "/vacancies?text=rust".into(),
        headers: vec![],
        body: Bytes::new(),
    }]
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "hh-vacancies",
        about: "HeadHunter's logic: search → 3 vacancy calls in parallel (examples/hh-vacancies)",
        stubs: HH_STUBS,
        gateway: HH_GATEWAY,
        requests: hh_requests(),
        mode: Mode::Compare,
        slo_p99_ms: 50.0,
        critical_path: vec![
            ("search", "/search?text=rust"),
            ("vacancies", "/vacancies/101"),
        ],
        // The same config with metrics off: `--targets fanout,fanout-nometrics` measures what
        // recording metrics costs per request (docs/benchmarks.md).
        variants: vec![("fanout-nometrics", format!("{HH_GATEWAY}{NO_METRICS}"))],
        baselines: &["hyper-baseline", "java-threads"],
        grpc: None,
        database: None,
        default_targets: &["fanout"],
    }
}
