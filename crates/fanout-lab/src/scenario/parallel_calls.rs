//! `parallel-calls`: the Kotlin article's HTTP experiment (seed 002) — an operation makes 100
//! calls to a stub that answers after 1.5 ms, one after the other (`GET /sequential`) or all in
//! flight at once (`GET /parallel`), driven by 1 and 6 closed-loop clients (like the article's
//! JMH threads). fanout (`for_each` with `concurrency: 1` / `100`) against the article's sync
//! version (`java-blocking`: blocking `HttpClient.send`, the parallel calls on a pool of as many
//! threads as cores) and the same code on virtual threads (`java-virtual`, Java 21+). No
//! acceptance lines: the table is the result, beside the article's own figures.

use super::{ClosedLoop, Mode, Scenario};
use fanout_load::RequestTemplate;
use serde::Serialize;

/// The stub: one route, a fixed 1.5 ms.
pub const PARALLEL_STUBS: &str = include_str!("../scenarios/parallel-calls.stubs.yaml");
/// The fanout config: `/sequential` and `/parallel`.
pub const PARALLEL_GATEWAY: &str = include_str!("../scenarios/parallel-calls.yaml");

/// Calls per operation.
pub const CALLS: u64 = 100;

/// One row of the article's table (avg ms per operation ± JMH's error, 99.9 % CI).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ArticleRow {
    /// CPU cores of the article's machine.
    pub cores: usize,
    /// Concurrent JMH threads (closed-loop clients).
    pub clients: usize,
    /// Sequential, sync (blocking): (mean, error) ms.
    pub sequential_sync: (f64, f64),
    /// Sequential, async (coroutines).
    pub sequential_async: (f64, f64),
    /// Parallel, sync (the 100 blocking calls on a pool sized by the CPU count).
    pub parallel_sync: (f64, f64),
    /// Parallel, async (coroutines).
    pub parallel_async: (f64, f64),
}

impl ArticleRow {
    /// (sync, async) figures of `route` (`sequential` or `parallel`).
    pub fn of(&self, route: &str) -> ((f64, f64), (f64, f64)) {
        if route == "sequential" {
            (self.sequential_sync, self.sequential_async)
        } else {
            (self.parallel_sync, self.parallel_async)
        }
    }
}

/// The article's table (seed 002, lines ~108–125), as published.
pub const ARTICLE: [ArticleRow; 6] = [
    row(
        1,
        1,
        [(160.3, 1.8), (154.1, 1.0), (163.9, 2.4), (10.7, 0.3)],
    ),
    row(2, 1, [(159.3, 1.0), (156.3, 0.7), (57.6, 0.5), (15.4, 0.2)]),
    row(4, 1, [(159.0, 1.1), (157.4, 1.3), (25.7, 0.2), (14.8, 0.3)]),
    row(
        1,
        6,
        [(146.8, 2.5), (146.3, 2.5), (984.8, 34.2), (79.3, 3.7)],
    ),
    row(
        2,
        6,
        [(151.3, 1.6), (143.8, 1.9), (343.9, 17.2), (86.7, 3.7)],
    ),
    row(
        4,
        6,
        [(152.3, 1.5), (144.7, 1.2), (135.0, 3.0), (81.7, 4.8)],
    ),
];

const fn row(cores: usize, clients: usize, v: [(f64, f64); 4]) -> ArticleRow {
    ArticleRow {
        cores,
        clients,
        sequential_sync: v[0],
        sequential_async: v[1],
        parallel_sync: v[2],
        parallel_async: v[3],
    }
}

/// The article's row to put beside ours: the same core count when the article has it (1, 2, 4),
/// else its 2-core row; `false` when the cores differ from `cpus`.
pub fn article_row(cpus: usize, clients: usize) -> Option<(ArticleRow, bool)> {
    let same = ARTICLE
        .iter()
        .find(|r| r.cores == cpus && r.clients == clients);
    match same {
        Some(r) => Some((*r, true)),
        None => ARTICLE
            .iter()
            .find(|r| r.cores == 2 && r.clients == clients)
            .map(|r| (*r, false)),
    }
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "parallel-calls",
        about: "the Kotlin article's experiment: 100 calls to a 1.5 ms stub per operation, sequential (one after the other) or parallel (all at once), 1 and 6 closed-loop clients; fanout vs Java blocking threads and Java virtual threads",
        stubs: PARALLEL_STUBS,
        gateway: PARALLEL_GATEWAY,
        requests: vec![
            RequestTemplate::get("/sequential"),
            RequestTemplate::get("/parallel"),
        ],
        mode: Mode::ClosedLoop(ClosedLoop {
            routes: &[("sequential", "/sequential"), ("parallel", "/parallel")],
            clients: &[1, 6],
            calls_per_op: CALLS,
            service: "items",
            call_path: "/item/0",
        }),
        // Not used: no capacity search in a closed-loop scenario.
        slo_p99_ms: 1000.0,
        critical_path: vec![],
        variants: vec![],
        baselines: &["java-threads", "java-blocking", "java-virtual"],
        default_targets: &["fanout", "java-blocking", "java-virtual"],
        grpc: None,
        database: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_article_row_matches_the_cores_or_falls_back_to_two() {
        let (r, same) = article_row(2, 6).unwrap_or_else(|| panic!("2 cores, 6 clients"));
        assert!(same);
        assert_eq!(r.of("parallel").0, (343.9, 17.2));
        assert_eq!(r.of("sequential").1, (143.8, 1.9));
        let (r, same) = article_row(1, 1).unwrap_or_else(|| panic!("1 core"));
        assert!(same);
        assert_eq!(r.of("parallel").1, (10.7, 0.3));
        let (r, same) = article_row(8, 1).unwrap_or_else(|| panic!("8 cores"));
        assert!(!same, "the article has no 8-core row");
        assert_eq!(r.cores, 2);
        assert!(article_row(2, 3).is_none());
    }
}
