//! Evaluation time of every committed test model: one row, a batch of 32, and the load.
//! `cargo bench -p fanout-model` (figures in docs/benchmarks.md when quoted).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // bench code: a missing test file is a failed run
use criterion::{Criterion, criterion_group, criterion_main};
use fanout_model::Model;
use std::hint::black_box;
use std::path::PathBuf;

const MODELS: &[&str] = &[
    "logreg",
    "logreg_bin",
    "mlp",
    "gbdt_clf",
    "gbdt_bin",
    "rf_clf",
    "gbdt_reg",
    "rf_reg",
    "linreg",
    "dense_ops",
];

fn testdata(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(file)
}

/// The model's file and its reference input rows (flattened) with their width.
fn model(name: &str) -> (Vec<u8>, Vec<f32>, usize) {
    let bytes = std::fs::read(testdata(&format!("{name}.onnx"))).expect("model file");
    let reference: serde_json::Value = serde_json::from_slice(
        &std::fs::read(testdata(&format!("{name}.ref.json"))).expect("reference file"),
    )
    .expect("reference JSON");
    let rows = reference["inputs"].as_array().cloned().unwrap_or_default();
    let width = rows.first().and_then(|r| r.as_array()).map_or(0, Vec::len);
    let values = rows
        .iter()
        .flat_map(|r| r.as_array().cloned().unwrap_or_default())
        .map(|v| v.as_f64().map_or(f32::NAN, |v| v as f32))
        .collect();
    (bytes, values, width)
}

fn bench(c: &mut Criterion) {
    for name in MODELS {
        let (bytes, rows, width) = model(name);
        let m = Model::load(&bytes, name).expect("model loads");
        let one = &rows[..width];
        let batch = &rows[..(32 * width).min(rows.len())];
        c.bench_function(&format!("{name}/1 row"), |b| {
            b.iter(|| m.run(black_box(one)))
        });
        c.bench_function(&format!("{name}/32 rows"), |b| {
            b.iter(|| m.run(black_box(batch)))
        });
        c.bench_function(&format!("{name}/load"), |b| {
            b.iter(|| Model::load(black_box(&bytes), name))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
