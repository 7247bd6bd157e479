//! What the runtime's tests share: a model file, versions and slots made for them.

use super::slot::{FileSig, ModelSlot, Scheduler};
use super::{Evaluator, ModelKind, Output, Version, lock, onnx};
use fanout_config::{Dur, ModelBatch, ModelsConfig};
use fanout_expr::Val;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub(super) const MODEL: &[u8] = include_bytes!("../../testdata/dense_ops.onnx");

pub(super) fn version() -> Arc<Version> {
    Arc::new(Version {
        model: Box::new(crate::Model::load(MODEL, "d").unwrap()),
        hash: "h".into(),
        loaded_at: SystemTime::now(),
        bytes: MODEL.len() as u64,
    })
}

/// A one-feature regressor for the scheduling tests: each row's value is its feature; an
/// evaluation reports its rows on `calls`, then waits for one message on `gate` (if any),
/// then sleeps `per_row` per row.
#[derive(Debug)]
pub(super) struct TestModel {
    kind: ModelKind,
    per_row: Duration,
    gate: Option<Mutex<std::sync::mpsc::Receiver<()>>>,
    calls: Mutex<Option<std::sync::mpsc::Sender<usize>>>,
}

impl Evaluator for TestModel {
    fn input_width(&self) -> usize {
        1
    }
    fn kind(&self) -> &ModelKind {
        &self.kind
    }
    fn run(&self, rows: &[f32]) -> Result<Output, String> {
        if let Some(tx) = &*lock(&self.calls) {
            let _ = tx.send(rows.len());
        }
        if let Some(gate) = &self.gate {
            let _ = lock(gate).recv();
        }
        std::thread::sleep(self.per_row * rows.len() as u32);
        Ok(Output::Regressor {
            values: rows.to_vec(),
            targets: 1,
        })
    }
}

pub(super) fn test_version(
    per_row: Duration,
    gate: Option<std::sync::mpsc::Receiver<()>>,
    calls: Option<std::sync::mpsc::Sender<usize>>,
) -> Arc<Version> {
    Arc::new(Version {
        model: Box::new(TestModel {
            kind: ModelKind::Regressor { targets: 1 },
            per_row,
            gate: gate.map(Mutex::new),
            calls: Mutex::new(calls),
        }),
        hash: "t".into(),
        loaded_at: SystemTime::now(),
        bytes: 0,
    })
}

pub(super) fn test_slot(name: &str, max_batch: usize, sched: &Arc<Scheduler>) -> Arc<ModelSlot> {
    Arc::new(ModelSlot::new(
        name,
        ModelBatch {
            queue: 10_000,
            max_batch,
            max_delay: Dur::millis(0),
            slice: Dur::millis(2),
            // These tests are of the scheduler: never inline.
            inline_below: Dur::millis(0),
        },
        sched.clone(),
    ))
}

pub(super) fn values(vals: &[Val]) -> Vec<f64> {
    vals.iter()
        .map(|v| match v {
            Val::Obj(m) => m
                .get(&Val::from("value".to_string()))
                .and_then(|x| fanout_expr::json::to_string(x).parse().ok())
                .unwrap_or(f64::NAN),
            _ => f64::NAN,
        })
        .collect()
}

pub(super) fn loaded(
    name: &str,
    bytes: &[u8],
    batch: ModelBatch,
    sched: &Arc<Scheduler>,
) -> Arc<ModelSlot> {
    let slot = Arc::new(ModelSlot::new(name, batch, sched.clone()));
    let sig = FileSig {
        len: bytes.len() as u64,
        modified: None,
        inode: 0,
    };
    assert!(
        slot.offer(&onnx::FORMAT, bytes, sig, &ModelsConfig::default()),
        "{:?}",
        slot.last_error()
    );
    slot
}

pub(super) fn rows(n: usize) -> Vec<f32> {
    (0..n * 4).map(|i| i as f32).collect()
}

pub(super) fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}
