//! Built-in scenarios: the examples' flows under load, compared across targets.

use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;

/// What a scenario measures.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Capacity search per target, then interleaved fixed-rate trials at fractions of capacity.
    Compare,
    /// Capacity search, then one continuous run per target: 0.5× of its capacity, a ramp to 3×,
    /// 3×, then 0.7× — goodput, rejections, accepted latency per phase and time to recover.
    Overload,
    /// Capacity search, then fixed rate (half of capacity) over several routes at once while one
    /// stub route is normal, `factor`× slower, failing (503), normal again.
    SlowBackend(SlowBackend),
    /// No capacity search: interleaved fixed-rate trials (ABBA) of every target at `rate`;
    /// reports p50/p99/p99.9 and backend calls per request.
    Hedging {
        /// Offered rate, req/s.
        rate: f64,
    },
}

/// The `slow-backend` mode: which stub route changes, and the routes measured separately.
#[derive(Debug, Clone)]
pub struct SlowBackend {
    /// Stub service that changes.
    pub service: &'static str,
    /// Route key at that stub (`GET /reviews/{id}`).
    pub route: &'static str,
    /// Its normal latency, ms.
    pub base_ms: f64,
    /// Slowdown factor of the `slow` phase.
    pub factor: f64,
    /// The gateway routes, each driven by its own generator at the same time.
    pub routes: Vec<RouteLoad>,
}

/// One gateway route under load, measured on its own.
#[derive(Debug, Clone)]
pub struct RouteLoad {
    /// Short name (`A`, `B`).
    pub name: &'static str,
    /// What it calls.
    pub about: &'static str,
    /// Requests sent (round robin).
    pub requests: Vec<RequestTemplate>,
    /// The route's deadline, ms.
    pub deadline_ms: f64,
    /// Whether the route calls the stub route that changes.
    pub uses_changed: bool,
}

/// Phases of the `slow-backend` mode, in order: (name, stub update JSON without `route`).
pub fn slow_backend_phases(sb: &SlowBackend) -> Vec<(&'static str, serde_json::Value)> {
    let normal = serde_json::json!({"latency": format!("{}ms", sb.base_ms), "faults": []});
    vec![
        ("normal", normal.clone()),
        (
            "slow",
            serde_json::json!({"latency": format!("{}ms", sb.base_ms * sb.factor), "faults": []}),
        ),
        (
            "failing",
            serde_json::json!({"latency": format!("{}ms", sb.base_ms), "faults": [{"status": 503}]}),
        ),
        ("restored", normal),
    ]
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
    /// Whether the hand-written baselines (`hyper-baseline`, `java-threads`) serve this
    /// scenario's routes (they implement the examples' two flows only).
    pub baselines: bool,
    /// Targets when none are given.
    pub default_targets: &'static [&'static str],
}

const HH_STUBS: &str = include_str!("../../../examples/hh-vacancies/stubs.yaml");
const HH_GATEWAY: &str = include_str!("../../../examples/hh-vacancies/fanout.yaml");
const PP_STUBS: &str = include_str!("../../../examples/product-page/stubs.yaml");
const PP_GATEWAY: &str = include_str!("../../../examples/product-page/fanout.yaml");
const MERGED_STUBS: &str = include_str!("../../../examples/product-page-merged/stubs.yaml");
const MERGED_GATEWAY: &str = include_str!("../../../examples/product-page-merged/fanout.yaml");
const NAIVE: &str = include_str!("variants/naive.yaml");
const VARIANT1: &str = include_str!("variants/variant1.yaml");
/// hh-vacancies stubs whose search service has a fixed capacity (4 requests at once).
pub const OVERLOAD_STUBS: &str = include_str!("scenarios/overload.stubs.yaml");
/// hh-vacancies with adaptive admission control.
pub const OVERLOAD_GATEWAY: &str = include_str!("scenarios/overload.yaml");
/// Three stub services, the third one changed at run time.
pub const SLOW_STUBS: &str = include_str!("scenarios/slow-backend.stubs.yaml");
/// Routes A (services 1, 2) and B (1, 2 and optional 3).
pub const SLOW_GATEWAY: &str = include_str!("scenarios/slow-backend.yaml");
/// One service with a bimodal latency.
pub const HEDGE_STUBS: &str = include_str!("scenarios/hedging.stubs.yaml");
/// One step, no hedging.
pub const HEDGE_OFF: &str = include_str!("scenarios/hedging.no-hedge.yaml");
/// The same with `hedge: {delay: 4ms}`.
pub const HEDGE_ON: &str = include_str!("scenarios/hedging.hedge.yaml");

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

/// `GET {path}?id=N` for 64 different ids from `first`, so concurrent requests rarely make
/// identical calls (fanout's in-flight dedup would merge those).
fn id_requests(path: &str, first: u32) -> Vec<RequestTemplate> {
    (first..first + 64)
        .map(|i| RequestTemplate {
            method: Method::GET,
            path: format!("{path}?id={i}"),
            headers: vec![],
            body: Bytes::new(),
        })
        .collect()
}

/// Routes A and B interleaved (the capacity search drives both).
fn slow_requests() -> Vec<RequestTemplate> {
    id_requests("/a", 1)
        .into_iter()
        .zip(id_requests("/b", 101))
        .flat_map(|(a, b)| [a, b])
        .collect()
}

/// Names of the built-in scenarios.
pub const NAMES: [&str; 6] = [
    "hh-vacancies",
    "product-page",
    "product-page-merging",
    "slow-backend",
    "overload",
    "hedging",
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
            baselines: true,
            default_targets: &["fanout"],
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
            baselines: false,
            default_targets: &["naive", "variant1", "variant2"],
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
            baselines: true,
            default_targets: &["fanout"],
        },
        "slow-backend" => Scenario {
            name: "slow-backend",
            about: "two routes over three services at half capacity; service 3 (reviews, optional in route B only) becomes 10× slower, then fails with 503, then recovers",
            stubs: SLOW_STUBS,
            gateway: SLOW_GATEWAY,
            requests: slow_requests(),
            mode: Mode::SlowBackend(SlowBackend {
                service: "reviews",
                route: "GET /reviews/{id}",
                base_ms: 5.0,
                factor: 10.0,
                routes: vec![
                    RouteLoad {
                        name: "A",
                        about: "GET /a: users + orders (does not use reviews)",
                        requests: id_requests("/a", 1),
                        deadline_ms: 200.0,
                        uses_changed: false,
                    },
                    RouteLoad {
                        name: "B",
                        about: "GET /b: users + orders + reviews (optional, default, 30 ms step timeout)",
                        // Other ids than A's: the two generators run in lockstep, and identical
                        // concurrent calls of A and B would be merged by fanout's dedup.
                        requests: id_requests("/b", 101),
                        deadline_ms: 200.0,
                        uses_changed: true,
                    },
                ],
            }),
            slo_p99_ms: 50.0,
            critical_path: vec![("users", "/users/1"), ("reviews", "/reviews/1")],
            variants: vec![],
            baselines: false,
            default_targets: &["fanout"],
        },
        "overload" => Scenario {
            name: "overload",
            about: "hh-vacancies with a search backend of fixed capacity (4 at once, like a pool of 4 connections), offered 0.5× → 3× of each target's measured capacity, then 0.7×; fanout with adaptive admission control",
            stubs: OVERLOAD_STUBS,
            gateway: OVERLOAD_GATEWAY,
            requests: hh_requests(),
            mode: Mode::Overload,
            slo_p99_ms: 50.0,
            critical_path: vec![
                ("search", "/search?text=rust"),
                ("vacancies", "/vacancies/101"),
            ],
            variants: vec![],
            baselines: true,
            default_targets: &["fanout", "java-threads"],
        },
        "hedging" => Scenario {
            name: "hedging",
            about: "one backend with a bimodal latency (95 % ~2 ms, 5 % ~40 ms): fanout without and with hedged calls (delay 4 ms ≈ p95)",
            stubs: HEDGE_STUBS,
            gateway: HEDGE_OFF,
            requests: id_requests("/item", 1),
            mode: Mode::Hedging { rate: 200.0 },
            slo_p99_ms: 50.0,
            critical_path: vec![("catalog", "/items/1")],
            variants: vec![
                ("no-hedge", HEDGE_OFF.to_string()),
                ("hedge", HEDGE_ON.to_string()),
            ],
            baselines: false,
            default_targets: &["no-hedge", "hedge"],
        },
        _ => return None,
    })
}

/// Every config a scenario writes: (file name, text), stubs first. For tests and `validate`.
pub fn configs(s: &Scenario) -> Vec<(String, String)> {
    let mut out = vec![
        ("stubs.yaml".to_string(), s.stubs.to_string()),
        ("fanout.yaml".to_string(), s.gateway.to_string()),
    ];
    for (name, yaml) in &s.variants {
        out.push((format!("{name}.yaml"), yaml.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_is_complete() {
        for name in NAMES {
            let s = builtin(name).unwrap_or_else(|| panic!("{name} is listed but not built in"));
            assert_eq!(s.name, name);
            assert!(!s.requests.is_empty(), "{name}: requests");
            assert!(!s.default_targets.is_empty(), "{name}: default targets");
            for t in s.default_targets {
                assert!(
                    *t == "fanout"
                        || (s.baselines && crate::TARGETS.contains(t))
                        || s.variants.iter().any(|(n, _)| n == t),
                    "{name}: default target {t} is not available"
                );
            }
            if let Mode::SlowBackend(sb) = &s.mode {
                assert_eq!(slow_backend_phases(sb).len(), 4);
                assert!(sb.routes.iter().any(|r| r.uses_changed));
                assert!(sb.routes.iter().any(|r| !r.uses_changed));
            }
        }
        assert!(builtin("nope").is_none());
    }
}
