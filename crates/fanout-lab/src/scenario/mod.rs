//! Built-in scenarios: the examples' flows under load, compared across targets.
//!
//! This file holds what every scenario is made of (`Scenario`, `Mode`), the list of built-in
//! ones and the one interface through which the report asks what a scenario accepts
//! (`Mode::acceptance`). Each scenario has its own module: its definition, and the acceptance
//! criteria it checks on a run, if any (`overload.rs`, `slow_backend.rs`, `hedging.rs`). Their
//! configs are in `../scenarios/` and `../variants/`.

mod hedging;
mod hh_vacancies;
mod overload;
mod product_page;
mod product_page_merging;
mod slow_backend;

pub use hedging::{HEDGE_OFF, HEDGE_ON, HEDGE_STUBS};
pub use overload::{OVERLOAD_GATEWAY, OVERLOAD_STUBS};
pub use slow_backend::{SLOW_GATEWAY, SLOW_STUBS, slow_backend_phases};

use crate::report::{Acceptance, TargetSummary};
use bytes::Bytes;
use fanout_load::RequestTemplate;
use http::Method;
use std::collections::BTreeMap;

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
        "hh-vacancies" => hh_vacancies::scenario(),
        "product-page-merging" => product_page_merging::scenario(),
        "product-page" => product_page::scenario(),
        "slow-backend" => slow_backend::scenario(),
        "overload" => overload::scenario(),
        "hedging" => hedging::scenario(),
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

impl Mode {
    /// The acceptance lines (the product's acceptance criteria) this mode's scenario checks on a
    /// run, for each target in `order`: the `overload`, `slow-backend` and `hedging` scenarios
    /// have some, the comparisons none.
    pub(crate) fn acceptance(
        &self,
        targets: &BTreeMap<String, TargetSummary>,
        order: &[String],
    ) -> Vec<Acceptance> {
        let mut out = Vec::new();
        for name in order {
            let Some(t) = targets.get(name) else { continue };
            match self {
                Mode::Overload => out.extend(overload::acceptance(name, t)),
                Mode::SlowBackend(_) => out.extend(slow_backend::acceptance(name, t)),
                Mode::Hedging { .. } => out.extend(hedging::acceptance(name, t, targets)),
                Mode::Compare => {}
            }
        }
        out
    }

    /// Reasons this run's acceptance lines may not mean much (an overload phase that did not
    /// overload its target), for the report's warnings.
    pub(crate) fn acceptance_warnings(
        &self,
        targets: &BTreeMap<String, TargetSummary>,
    ) -> Vec<String> {
        match self {
            Mode::Overload => overload::warnings(targets),
            _ => vec![],
        }
    }
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
