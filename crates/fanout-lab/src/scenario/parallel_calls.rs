//! `parallel-calls`: the Kotlin article's HTTP experiment (seed 002) — an operation makes 100
//! calls to a stub that answers after 1.5 ms, one after the other (`GET /sequential`) or all in
//! flight at once (`GET /parallel`), driven by 1 and 6 closed-loop clients (like the article's
//! JMH threads). fanout (`for_each` with `concurrency: 1` / `100`) against the article's sync
//! version (`java-blocking`: blocking `HttpClient.send`, the parallel calls on a pool of as many
//! threads as cores) and the same code on virtual threads (`java-virtual`, Java 21+). No
//! acceptance lines: the table is the result, beside the article's own figures.

use crate::model::{ClosedLoop, Mode, Scenario};
use fanout_load::RequestTemplate;

/// The stub: one route, a fixed 1.5 ms.
pub const PARALLEL_STUBS: &str = include_str!("../scenarios/parallel-calls.stubs.yaml");
/// The fanout config: `/sequential` and `/parallel`.
pub const PARALLEL_GATEWAY: &str = include_str!("../scenarios/parallel-calls.yaml");

/// Calls per operation.
pub const CALLS: u64 = 100;

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
