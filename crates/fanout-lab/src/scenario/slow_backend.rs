//! `slow-backend`: two routes over three stub services at half capacity; service 3 (`reviews`,
//! an optional step with a default in route B only) becomes 10× slower, then fails with 503, then
//! recovers. What the scenario accepts, per target:
//! - a route that does not call the changed backend: p99 within +10 % of its normal-phase p99 in
//!   every phase;
//! - a route that does: while the backend is slow / failing, ≥ 99.9 % answered, every answer
//!   within the route's deadline, ≥ 99 % of them with the default.

use crate::model::{Mode, RouteLoad, Scenario, SlowBackend, id_requests};
use crate::report::format::{f, pct};
use crate::report::{Acceptance, RoutePhase, RouteSummary, TargetSummary};
use fanout_load::RequestTemplate;

/// Three stub services, the third one changed at run time.
pub const SLOW_STUBS: &str = include_str!("../scenarios/slow-backend.stubs.yaml");
/// Routes A (services 1, 2) and B (1, 2 and optional 3).
pub const SLOW_GATEWAY: &str = include_str!("../scenarios/slow-backend.yaml");

/// Routes A and B interleaved (the capacity search drives both).
fn slow_requests() -> Vec<RequestTemplate> {
    id_requests("/a", 1)
        .into_iter()
        .zip(id_requests("/b", 101))
        .flat_map(|(a, b)| [a, b])
        .collect()
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
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
        baselines: &[],
        grpc: None,
        database: None,
        default_targets: &["fanout"],
    }
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

/// The acceptance lines of target `name`: one per route that has a normal phase.
pub(crate) fn acceptance(name: &str, t: &TargetSummary) -> Vec<Acceptance> {
    let mut out = Vec::new();
    for r in &t.routes {
        let Some(normal) = r.phases.iter().find(|p| p.name == "normal") else {
            continue;
        };
        out.push(if r.uses_changed_backend {
            answers_with_the_default(name, r)
        } else {
            unaffected(name, r, normal)
        });
    }
    out
}

/// A route that does not call the changed backend keeps its normal-phase p99.
fn unaffected(name: &str, r: &RouteSummary, normal: &RoutePhase) -> Acceptance {
    let others: Vec<&RoutePhase> = r.phases.iter().filter(|p| p.name != "normal").collect();
    let measured = std::iter::once(format!("normal {} ms", f(normal.p99_ms)))
        .chain(others.iter().map(|p| {
            format!(
                "{} {} ms ({:+.0} %)",
                p.name,
                f(p.p99_ms),
                if normal.p99_ms > 0.0 {
                    (p.p99_ms / normal.p99_ms - 1.0) * 100.0
                } else {
                    0.0
                }
            )
        }))
        .collect::<Vec<_>>()
        .join("; ");
    Acceptance::new(
        name,
        &format!("slow-backend: route {} p99 unaffected", r.route),
        "p99 ≤ +10 % of its normal-phase p99 in every phase",
        measured,
        normal.p99_ms > 0.0 && others.iter().all(|p| p.p99_ms <= 1.1 * normal.p99_ms),
    )
}

/// A route that calls the changed backend answers in time, with the default, while the backend
/// is slow or failing.
fn answers_with_the_default(name: &str, r: &RouteSummary) -> Acceptance {
    let bad: Vec<&RoutePhase> = r
        .phases
        .iter()
        .filter(|p| p.name == "slow" || p.name == "failing")
        .collect();
    let measured = bad
        .iter()
        .map(|p| {
            format!(
                "{}: {:.1} % ok, {} with the default, max {} ms",
                p.name,
                p.success_pct,
                pct(p.default_share),
                f(p.max_ms)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Acceptance::new(
        name,
        &format!(
            "slow-backend: route {} answers with the default in time",
            r.route
        ),
        &format!(
            "while the backend is slow / failing: ≥ 99.9 % answered, every answer within the {} ms deadline, ≥ 99 % with the default",
            f(r.deadline_ms)
        ),
        measured,
        !bad.is_empty()
            && bad
                .iter()
                .all(|p| p.success_pct >= 99.9 && p.within_deadline && p.default_share >= 0.99),
    )
}
