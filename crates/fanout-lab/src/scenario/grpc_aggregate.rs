//! `grpc-aggregate`: one gRPC call in (`lab.v1.Aggregator/GetPage`) fans out to three gRPC
//! backends in parallel (`Users/GetUser`, `Orders/ListOrders`, `Recs/GetRecs`) and merges their
//! answers — fanout against the hand-written tonic aggregator (`grpc-baseline`,
//! bench/baselines/grpc-aggregator). No acceptance lines: the comparison is the result (the
//! target, fanout's CPU per request within 1.5× of the baseline's, is read off the report; see
//! docs/benchmarks.md).

use crate::model::{Grpc, Mode, Scenario};

/// The scenario's `.proto` file: its name in the run directory, and its text.
pub const GRPC_PROTO: (&str, &str) = (
    "grpc-aggregate.proto",
    include_str!("../scenarios/grpc-aggregate.proto"),
);
/// Three gRPC stub services.
pub const GRPC_STUBS: &str = include_str!("../scenarios/grpc-aggregate.stubs.yaml");
/// The gRPC route calling them in parallel.
pub const GRPC_GATEWAY: &str = include_str!("../scenarios/grpc-aggregate.yaml");

/// Appended to the config for the `fanout-nometrics` target.
const NO_METRICS: &str = "\nadmin:\n  metrics: false\n";

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "grpc-aggregate",
        about: "gRPC in → 3 gRPC backend calls in parallel → one merged message (Aggregator/GetPage)",
        stubs: GRPC_STUBS,
        gateway: GRPC_GATEWAY,
        // Built from the `.proto` once it is written into the run directory (Scenario::grpc).
        requests: vec![],
        mode: Mode::Compare,
        slo_p99_ms: 50.0,
        // The HTTP direct path has no gRPC calls: `grpc.critical_path` says what to call.
        critical_path: vec![],
        variants: vec![("fanout-nometrics", format!("{GRPC_GATEWAY}{NO_METRICS}"))],
        baselines: &["grpc-baseline"],
        default_targets: &["fanout", "grpc-baseline"],
        grpc: Some(Grpc {
            protos: &[GRPC_PROTO],
            method: "lab.v1.Aggregator/GetPage",
            // 64 different users: concurrent requests never make identical backend calls, so
            // fanout's in-flight dedup cannot merge them (the baseline has none).
            messages: (1..=64)
                .map(|i| format!(r#"{{"user_id":"u{i}"}}"#))
                .collect(),
            // The three calls run in parallel: the slowest (orders, 3 ms) is the critical path.
            critical_path: vec![(
                "orders",
                "lab.v1.Orders/ListOrders",
                r#"{"user_id":"u1","limit":3}"#,
            )],
        }),
        database: None,
    }
}
