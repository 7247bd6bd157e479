//! `antispam-models`: the Mail.ru antispam service of seed 004 (issue 24 §6). One gRPC call
//! (`lab.v1.Antispam/Check`) carries a message's 20 features; 10 ONNX models score them in
//! parallel and one verdict merges them. A model file is replaced every 10 s during the whole run
//! (`crate::antispam`), 1 000 client connections carry the load. fanout against the seed's
//! architecture in Python (`antispam-py`: grpcio + onnxruntime, bench/baselines/antispam-py).
//! The acceptance lines (issue 24) are computed with the run's models report
//! (`crate::antispam::acceptance`).

use crate::model::{Grpc, Mode, Models, Scenario};

/// The scenario's `.proto` file: its name in the run directory, and its text.
pub const ANTISPAM_PROTO: (&str, &str) = (
    "antispam.proto",
    include_str!("../scenarios/antispam.proto"),
);
/// The gRPC route running the 10 models.
pub const ANTISPAM_GATEWAY: &str = include_str!("../scenarios/antispam-models.yaml");

/// 64 messages of 20 features each, made by a fixed generator (values in [-3, 3), three
/// decimals), so concurrent requests carry different rows.
pub fn messages() -> Vec<String> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..64)
        .map(|_| {
            let features: Vec<String> = (0..20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let v = (x % 6000) as f64 / 1000.0 - 3.0;
                    format!("{v:.3}")
                })
                .collect();
            format!(r#"{{"features":[{}]}}"#, features.join(","))
        })
        .collect()
}

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "antispam-models",
        about: "gRPC in → 10 ONNX models in parallel → one verdict (Antispam/Check); a model file replaced every 10 s; 1000 client connections",
        stubs: "",
        gateway: ANTISPAM_GATEWAY,
        requests: vec![],
        mode: Mode::Models(Models {
            swap_every_s: 10.0,
            quick_swap_every_s: 3.0,
            connections: 1000,
        }),
        slo_p99_ms: 10.0,
        critical_path: vec![],
        variants: vec![],
        baselines: &["antispam-py"],
        default_targets: &["fanout", "antispam-py"],
        grpc: Some(Grpc {
            protos: &[ANTISPAM_PROTO],
            method: "lab.v1.Antispam/Check",
            messages: messages(),
            critical_path: vec![],
        }),
        database: None,
    }
}
