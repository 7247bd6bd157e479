//! Memory held while refusing models that declare huge shapes (its own test binary: nothing else
//! runs in the process while it measures).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use fanout_model::Model;
use fanout_model::onnx::{
    Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    TypeProtoTensor, ValueInfoProto,
};
use prost::Message;

fn info(name: &str, dims: &[Option<i64>]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            dim_value: *d,
                            dim_param: d.is_none().then(|| "N".into()),
                        })
                        .collect(),
                }),
            }),
        }),
    }
}

/// X[dims] → Relu → Y.
fn relu(dims: &[Option<i64>]) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        producer_name: None,
        producer_version: None,
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["X".into()],
                output: vec!["Y".into()],
                name: None,
                op_type: Some("Relu".into()),
                domain: None,
                attribute: vec![],
            }],
            name: None,
            initializer: vec![],
            input: vec![info("X", dims)],
            output: vec![info("Y", dims)],
        }),
    }
    .encode_to_vec()
}

/// `VmRSS` and `VmHWM` (peak) of this process, in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn refusing_huge_declared_shapes_holds_under_16_mib() {
    let files = [
        relu(&[Some(1), Some(1 << 62)]),
        relu(&[None, Some(1_000_000_000)]),
        relu(&[Some(1), Some(100_000_000)]),
    ];
    let (rss0, hwm0) = memory_kib();
    for (i, bytes) in files.iter().enumerate() {
        assert!(Model::load(bytes, "hostile").is_err(), "file {i} loaded");
    }
    let (rss1, hwm1) = memory_kib();
    println!("VmRSS {rss0} → {rss1} KiB, VmHWM {hwm0} → {hwm1} KiB");
    assert!(
        rss1.saturating_sub(rss0) < 16 << 10,
        "RSS {rss0} → {rss1} KiB"
    );
    assert!(
        hwm1.saturating_sub(hwm0) < 16 << 10,
        "peak {hwm0} → {hwm1} KiB"
    );
}
