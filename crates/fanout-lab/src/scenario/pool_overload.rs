//! `pool-overload`: the Kotlin article's experiment (seed 002) with a real PostgreSQL — a pool of
//! 4 connections, three sequential statements per request, each a scan of a table without
//! indexes (~25 ms), so the database's capacity is set by the pool and the statements' cost.
//! Each target is offered 0.5× of its measured capacity, a ramp to 3×, 3×, then 0.5× again.
//! fanout: `sql` steps, the route limited to 4 requests at once by admission control; the
//! baseline: the article's architecture — the Java thread-per-request server (200 threads),
//! blocking JDBC through a pool of 4 with a 1 s connection wait. The acceptance lines are the
//! `overload` scenario's (goodput at 3×, accepted p99, rejections at once, recovery).

use crate::model::{Database, Mode, Scenario};
use fanout_load::RequestTemplate;

/// The fanout config.
pub const POOL_GATEWAY: &str = include_str!("../scenarios/pool-overload.yaml");
/// The database: one table, no index.
pub const POOL_SCHEMA: &str = include_str!("../scenarios/pool-overload.sql");

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "pool-overload",
        about: "the Kotlin article's experiment: PostgreSQL pool of 4, three sequential ~25 ms statements per request; 0.5× → 3× of each target's capacity, then 0.5×; fanout (sql steps + admission) vs the Java thread-per-request baseline (blocking JDBC, 200 threads)",
        stubs: "",
        gateway: POOL_GATEWAY,
        requests: (0..64)
            .map(|i| RequestTemplate::get(format!("/report/{i}")))
            .collect(),
        // The acceptance: full service within 1 s after the load drops.
        mode: Mode::Overload {
            tail: 0.5,
            recover_s: 1.0,
        },
        // Three ~25 ms statements: an unloaded request takes ~80 ms.
        slo_p99_ms: 250.0,
        critical_path: vec![],
        variants: vec![],
        baselines: &["java-threads"],
        default_targets: &["fanout", "java-threads"],
        grpc: None,
        database: Some(Database {
            schema: POOL_SCHEMA,
        }),
    }
}
