//! Built-in scenarios: the examples' flows under load, compared across targets.

use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;

/// What a scenario measures.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Capacity search per target, then interleaved fixed-rate trials at fractions of capacity.
    Compare,
    /// Capacity search, then 0.5× → 3× of capacity, then back to 0.7×: offered vs achieved.
    Overload,
    /// Fixed rate at half capacity; mid-run one stub route is made `factor`× slower, then restored.
    SlowBackend {
        /// Stub service.
        service: &'static str,
        /// Route key at the stub (`GET /recommendations/{ids}`).
        route: &'static str,
        /// Normal latency of that route.
        base_ms: f64,
        /// Slowdown factor.
        factor: f64,
    },
}

/// A scenario: stubs, the gateway config, the requests and what to measure.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name on the command line.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// `fanout stub` config (addresses as `${NAME_ADDR}`).
    pub stubs: &'static str,
    /// `fanout serve` config.
    pub gateway: &'static str,
    /// Requests sent (round robin).
    pub requests: Vec<RequestTemplate>,
    /// What to measure.
    pub mode: Mode,
    /// Latency SLO used by the capacity search (p99, ms).
    pub slo_p99_ms: f64,
    /// The stub calls on the flow's critical path, for the "direct" baseline: (service, path).
    pub critical_path: Vec<(&'static str, &'static str)>,
    /// Extra targets: other `fanout serve` configs of the same flow, by name.
    pub variants: Vec<(&'static str, String)>,
}

const HH_STUBS: &str = include_str!("../../../examples/hh-vacancies/stubs.yaml");
const HH_GATEWAY: &str = include_str!("../../../examples/hh-vacancies/fanout.yaml");
const PP_STUBS: &str = include_str!("../../../examples/product-page/stubs.yaml");
const PP_GATEWAY: &str = include_str!("../../../examples/product-page/fanout.yaml");
const MERGED_STUBS: &str = include_str!("../../../examples/product-page-merged/stubs.yaml");
const MERGED_GATEWAY: &str = include_str!("../../../examples/product-page-merged/fanout.yaml");
const NAIVE: &str = include_str!("variants/naive.yaml");
const VARIANT1: &str = include_str!("variants/variant1.yaml");

/// Variant 2 without its caches: the scenario compares call merging, not caching.
fn variant2() -> String {
    MERGED_GATEWAY
        .lines()
        .filter(|l| !l.trim_start().starts_with("cache:"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn hh_requests() -> Vec<RequestTemplate> {
    vec![RequestTemplate {
        method: Method::GET,
        path: "/vacancies?text=rust".into(),
        headers: vec![],
        body: Bytes::new(),
    }]
}

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

/// Names of the built-in scenarios.
pub const NAMES: [&str; 5] = [
    "hh-vacancies",
    "product-page",
    "product-page-merging",
    "slow-backend",
    "overload",
];

/// Look up a built-in scenario.
pub fn builtin(name: &str) -> Option<Scenario> {
    Some(match name {
        "hh-vacancies" => Scenario {
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
            variants: vec![],
        },
        "product-page-merging" => Scenario {
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
        },
        "product-page" => Scenario {
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
        },
        "slow-backend" => Scenario {
            name: "slow-backend",
            about: "product-page with the (optional) recommendation backend switched to 10× latency mid-run",
            stubs: PP_STUBS,
            gateway: PP_GATEWAY,
            requests: pp_requests(),
            mode: Mode::SlowBackend {
                service: "recommendations",
                route: "GET /recommendations/{ids}",
                base_ms: 5.0,
                factor: 10.0,
            },
            slo_p99_ms: 50.0,
            critical_path: vec![
                ("recommendations", "/recommendations/p1,p2,p3,p4,p5"),
                ("price", "/price?ids=r-p1,r-p2,r-p3,r-p4,r-p5"),
            ],
            variants: vec![],
        },
        "overload" => Scenario {
            name: "overload",
            about: "hh-vacancies offered 0.5× → 3× of its measured capacity, then 0.7×",
            stubs: HH_STUBS,
            gateway: HH_GATEWAY,
            requests: hh_requests(),
            mode: Mode::Overload,
            slo_p99_ms: 50.0,
            critical_path: vec![
                ("search", "/search?text=rust"),
                ("vacancies", "/vacancies/101"),
            ],
            variants: vec![],
        },
        _ => return None,
    })
}
