//! `hh-pools`: issue 26 §1, second part — the hh-vacancies flow under the same open-model load,
//! served by fanout and by the Java thread-per-request baseline with pools of 8, 64, 512 and
//! 4 096 threads (`java-threads-N`: request pool and calls pool of N), first with healthy
//! backends, then with the vacancy backend 10× slower. No acceptance lines: the table is the
//! result (`crate::pools`).

use super::hh_vacancies::HH_STUBS;
use crate::model::{Mode, Pools, Scenario};
use fanout_load::RequestTemplate;

/// The example's gateway config with in-flight dedup off on both backends (equal work).
pub const POOLS_GATEWAY: &str = include_str!("../scenarios/hh-pools.yaml");

/// The targets compared: fanout and the four pool sizes.
pub const POOL_TARGETS: [&str; 5] = [
    "fanout",
    "java-threads-8",
    "java-threads-64",
    "java-threads-512",
    "java-threads-4096",
];

/// `GET /vacancies?text=q{i}` for 64 different texts: every request is another search (the
/// vacancy calls are the same ids for every text; fanout's dedup is off for those).
fn pools_requests() -> Vec<RequestTemplate> {
    (1..=64)
        .map(|i| RequestTemplate::get(format!("/vacancies?text=q{i}")))
        .collect()
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "hh-pools",
        about: "hh-vacancies at one fixed rate on fanout and on the Java thread-per-request baseline with pools of 8, 64, 512 and 4 096 threads; healthy backends, then the vacancy backend 10× slower",
        stubs: HH_STUBS,
        gateway: POOLS_GATEWAY,
        requests: pools_requests(),
        mode: Mode::Pools(Pools {
            service: "vacancies",
            route: "GET /vacancies/{id}",
            base_ms: 3.0,
            factor: 10.0,
            rate: 200.0,
        }),
        slo_p99_ms: 50.0,
        critical_path: vec![
            ("search", "/search?text=q1"),
            ("vacancies", "/vacancies/101"),
        ],
        variants: vec![],
        baselines: &["java-threads"],
        grpc: None,
        database: None,
        default_targets: &POOL_TARGETS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::hh_vacancies::HH_GATEWAY;

    #[test]
    fn the_gateway_is_the_example_with_dedup_off() {
        let without: Vec<&str> = POOLS_GATEWAY
            .lines()
            .filter(|l| l.trim() != "dedup: false")
            .collect();
        assert_eq!(
            without[without.len() - HH_GATEWAY.lines().count()..].join("\n"),
            HH_GATEWAY.lines().collect::<Vec<_>>().join("\n")
        );
        assert_eq!(
            POOLS_GATEWAY
                .lines()
                .filter(|l| l.trim() == "dedup: false")
                .count(),
            2
        );
    }

    #[test]
    fn every_request_is_another_search() {
        let r = pools_requests();
        let paths: std::collections::BTreeSet<_> = r.iter().map(|r| &r.path).collect();
        assert_eq!(paths.len(), 64);
    }
}
