//! The models' shared run list: which model's batch a compute job evaluates next.

use super::{Item, ModelSlot};
use crate::runtime::{RunError, lock};
use fanout_expr::Val;
use fanout_runtime::compute::ComputePool;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The models' shared run list: slots with waiting rows, taken in turn (one batch each) by at
/// most one compute job per compute thread — so the ten model steps of one request cost one
/// wake-up of a compute thread, not ten, and a busy model does not starve the others: a slot is
/// on the list once, so one model is evaluated by one thread at a time, and it goes to the back
/// of the list after each batch, which is cut to `batch.slice` (a large request in chunks).
#[derive(Default)]
pub(crate) struct Scheduler {
    /// (slots with rows waiting, compute jobs running now).
    state: Mutex<(VecDeque<Arc<ModelSlot>>, usize)>,
}

/// How long a compute job runs models' batches before it lets the pool's other waiting jobs
/// (parsing, `compute: true` expressions) have the thread: it goes on as a new job at the back of
/// the pool's queue.
const YIELD_AFTER: Duration = Duration::from_millis(10);

impl Scheduler {
    /// `slot` has rows to run (it is marked running: it is on the list or in a job's hands).
    pub(super) fn ready(self: &Arc<Self>, slot: Arc<ModelSlot>, compute: &Arc<ComputePool>) {
        let start = {
            let mut st = lock(&self.state);
            st.0.push_back(slot);
            let start = st.1 < compute.threads();
            if start {
                st.1 += 1;
            }
            start
        };
        if !start {
            return;
        }
        let (sched, pool) = (self.clone(), compute.clone());
        if let Err(e) = compute.spawn(move || sched.run(&pool)) {
            // Nothing would run the listed slots: their rows fail with the pool's error.
            let slots: Vec<Arc<ModelSlot>> = {
                let mut st = lock(&self.state);
                st.1 -= 1;
                if st.1 > 0 {
                    return; // another job runs and will take them
                }
                st.0.drain(..).collect()
            };
            for slot in slots {
                let items: Vec<Item> = {
                    let mut q = lock(&slot.queue);
                    q.running = false;
                    q.rows = 0;
                    let head = q.head.take().map(|p| p.item);
                    head.into_iter().chain(q.items.drain(..)).collect()
                };
                for it in items {
                    let _ = it.tx.send(Err(RunError::Pool(e)));
                }
            }
        }
    }

    /// A compute job: run one batch of each listed slot in turn, until the list is empty.
    fn run(self: &Arc<Self>, compute: &Arc<ComputePool>) {
        // Answers are held for one round of the list (or until many are ready): the steps of one
        // request that ran in this round wake their request once, not once per model. A slot
        // that comes round again (a busy model's next batch or chunk) sends them first: no
        // answer waits for more than one batch of each model.
        let mut replies: Vec<Reply> = Vec::new();
        let mut round: Vec<usize> = Vec::new();
        let started = Instant::now();
        loop {
            let slot = {
                let mut st = lock(&self.state);
                match st.0.pop_front() {
                    Some(s) => s,
                    None => {
                        st.1 -= 1;
                        drop(st);
                        send(replies);
                        return;
                    }
                }
            };
            let id = Arc::as_ptr(&slot) as usize;
            if round.contains(&id) {
                send(std::mem::take(&mut replies));
                round.clear();
            }
            round.push(id);
            // A panicking evaluation must not leave the slot "running" with nobody to run it.
            let more =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slot.turn(&mut replies)))
                    .unwrap_or_else(|_| slot.recover());
            if more {
                lock(&self.state).0.push_back(slot);
            }
            if replies.len() >= MAX_HELD_REPLIES {
                send(std::mem::take(&mut replies));
                round.clear();
            }
            if started.elapsed() >= YIELD_AFTER && compute.queued() > 0 {
                // Other jobs wait for the pool: go on behind them (this job's count carries
                // over to the new one). When the queue is full, go on here.
                send(std::mem::take(&mut replies));
                let (sched, pool) = (self.clone(), compute.clone());
                if compute.spawn(move || sched.run(&pool)).is_ok() {
                    return;
                }
            }
        }
    }
}

/// Most answers a compute job holds before sending them.
const MAX_HELD_REPLIES: usize = 256;

/// An answer for the rows of one request, and where it goes.
pub(super) type Reply = (
    oneshot::Sender<Result<Vec<Val>, RunError>>,
    Result<Vec<Val>, RunError>,
);

fn send(replies: Vec<Reply>) {
    for (tx, r) in replies {
        let _ = tx.send(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::testing::{later, test_slot, test_version, values};
    #[cfg(feature = "bench-tools")]
    use {
        crate::runtime::testing::loaded,
        fanout_config::{Dur, ModelBatch},
        std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    };

    #[tokio::test]
    async fn a_large_request_is_evaluated_in_chunks_and_another_models_rows_run_between_them() {
        let pool = Arc::new(ComputePool::new(1, 64, 0));
        pool.start().unwrap();
        let sched = Arc::new(Scheduler::default());
        let (heavy, light) = (
            test_slot("heavy", 2, &sched),
            test_slot("light", 64, &sched),
        );
        let (gate_tx, gate) = std::sync::mpsc::channel::<()>();
        let (calls_tx, calls) = std::sync::mpsc::channel::<usize>();
        let hv = test_version(Duration::ZERO, Some(gate), Some(calls_tx));
        let lv = test_version(Duration::ZERO, None, None);
        // Ten rows on the heavy model (two per evaluation): its first chunk starts and waits.
        let big = heavy
            .submit(
                hv,
                (0..10).map(|i| i as f32).collect(),
                10,
                later(),
                &pool,
                None,
            )
            .unwrap();
        assert_eq!(
            calls.recv().unwrap(),
            2,
            "the first chunk is max_batch rows"
        );
        // A light model's row arrives while the heavy request runs.
        let mut small = light
            .submit(lv, vec![42.0], 1, later(), &pool, None)
            .unwrap();
        // One chunk of the heavy model ends: the light row runs next, before the heavy
        // request's other chunks.
        gate_tx.send(()).unwrap();
        let got = loop {
            tokio::task::yield_now().await;
            if let Ok(r) = small.try_recv() {
                break r;
            }
        };
        assert_eq!(values(&got.unwrap()), vec![42.0]);
        // Its third chunk at least was not taken yet (the second may just have been).
        let pending = heavy.status().pending;
        assert!(
            pending >= 6,
            "the heavy request's other chunks wait: {pending}"
        );
        // The next chunks (sized from the time measured: the first one's, gate included).
        for _ in 0..10 {
            let _ = gate_tx.send(()); // refused once the request is done and the model dropped
        }
        let vals = big.await.unwrap().unwrap();
        assert_eq!(
            values(&vals),
            (0..10).map(f64::from).collect::<Vec<_>>(),
            "one value per row, in order"
        );
        let st = heavy.status();
        assert_eq!((st.rows, st.pending), (10, 0));
        assert!(st.batches >= 5, "{} evaluations", st.batches);
    }

    #[tokio::test]
    async fn batches_are_cut_to_the_slice_from_the_measured_time_per_row() {
        let pool = Arc::new(ComputePool::new(1, 64, 0));
        pool.start().unwrap();
        let sched = Arc::new(Scheduler::default());
        let s = test_slot("slow", 64, &sched);
        // 3 ms a row, a slice of 2 ms: once measured, one row per evaluation.
        let v = test_version(Duration::from_millis(3), None, None);
        let first = s
            .submit(v.clone(), vec![0.0; 4], 4, later(), &pool, None)
            .unwrap();
        assert_eq!(first.await.unwrap().unwrap().len(), 4);
        assert_eq!(s.status().batches, 1, "not measured yet: max_batch");
        let second = s.submit(v, vec![0.0; 4], 4, later(), &pool, None).unwrap();
        assert_eq!(second.await.unwrap().unwrap().len(), 4);
        assert_eq!(s.status().batches, 5, "then one row per evaluation");
    }

    /// A dense MLP regressor as ONNX: `width` inputs, two hidden layers of `hidden` (ReLU), one
    /// output — with `hidden` 3072, about 1 ms a row in release: the heavy MLP of the issue.
    #[cfg(feature = "bench-tools")]
    fn mlp(width: usize, hidden: usize) -> Vec<u8> {
        use crate::onnx::*;
        use prost::Message;
        let info = |name: &str, cols: usize| ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type: Some(1),
                    shape: Some(TensorShapeProto {
                        dim: vec![
                            Dimension {
                                dim_value: None,
                                dim_param: Some("N".into()),
                            },
                            Dimension {
                                dim_value: Some(cols as i64),
                                dim_param: None,
                            },
                        ],
                    }),
                }),
            }),
        };
        let weights = |name: &str, rows: usize, cols: usize| TensorProto {
            dims: vec![rows as i64, cols as i64],
            data_type: Some(1),
            float_data: (0..rows * cols)
                .map(|i| ((i % 17) as f32 - 8.0) / (8.0 * rows as f32))
                .collect(),
            name: Some(name.into()),
            ..Default::default()
        };
        let node = |op: &str, input: &[&str], out: &str| NodeProto {
            input: input.iter().map(|s| s.to_string()).collect(),
            output: vec![out.into()],
            name: Some(out.into()),
            op_type: Some(op.into()),
            domain: None,
            attribute: vec![],
        };
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(13),
            }],
            producer_name: None,
            producer_version: None,
            graph: Some(GraphProto {
                node: vec![
                    node("MatMul", &["X", "W1"], "H1"),
                    node("Relu", &["H1"], "R1"),
                    node("MatMul", &["R1", "W2"], "H2"),
                    node("Relu", &["H2"], "R2"),
                    node("MatMul", &["R2", "W3"], "Y"),
                ],
                name: None,
                initializer: vec![
                    weights("W1", width, hidden),
                    weights("W2", hidden, hidden),
                    weights("W3", hidden, 1),
                ],
                input: vec![info("X", width)],
                output: vec![info("Y", 1)],
            }),
        }
        .encode_to_vec()
    }

    /// Writes the isolation benchmark's heavy MLP (256 inputs, two hidden layers of 3 072) to
    /// the file named by `FANOUT_HEAVY_MLP`, for the end-to-end run through a gateway
    /// (`scripts/model-isolation-e2e`). Run:
    /// `FANOUT_HEAVY_MLP=/tmp/heavy.onnx cargo test -p fanout-model --features bench-tools --lib write_heavy_mlp -- --ignored`
    /// (a tool, not a test: compiled only with the `bench-tools` feature, so the test tiers'
    /// `--include-ignored` never runs it).
    #[cfg(feature = "bench-tools")]
    #[test]
    #[ignore = "writes a file for scripts/model-isolation-e2e"]
    fn write_heavy_mlp() {
        let path = std::env::var("FANOUT_HEAVY_MLP").expect("FANOUT_HEAVY_MLP names the file");
        std::fs::write(path, mlp(256, 3072)).unwrap();
    }

    /// The isolation benchmark (docs/benchmarks.md, "Model isolation"): one compute thread (2
    /// cores' default), a heavy MLP kept busy by 1 000-row requests one after another, and a
    /// light model's single rows, one at a time every millisecond, timed from submit to
    /// answer. Run in release:
    /// `cargo test --release -p fanout-model --features bench-tools --lib model_isolation -- --ignored --nocapture`.
    #[cfg(feature = "bench-tools")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a benchmark: run in release with --ignored --nocapture"]
    async fn model_isolation_benchmark() {
        let heavy_bytes = mlp(256, 3072);
        let light_bytes = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fanout-model/testdata/logreg_bin.onnx"),
        )
        .unwrap();
        let runs: [(&str, ModelBatch); 2] = [
            ("default (max_batch 64, slice 2ms)", ModelBatch::default()),
            (
                "unsplit (max_batch 1000, slice 60s: as before chunking)",
                ModelBatch {
                    max_batch: 1000,
                    slice: Dur::secs(60),
                    ..ModelBatch::default()
                },
            ),
        ];
        for (what, heavy_batch) in runs {
            let pool = Arc::new(ComputePool::new(1, 1024, 0));
            pool.start().unwrap();
            let sched = Arc::new(Scheduler::default());
            let heavy = loaded("heavy", &heavy_bytes, heavy_batch, &sched);
            let light = loaded("light", &light_bytes, ModelBatch::default(), &sched);
            let stop = Arc::new(AtomicBool::new(false));
            let heavy_done = Arc::new(AtomicU64::new(0));
            let driver = tokio::spawn({
                let (heavy, pool, stop, done) = (
                    heavy.clone(),
                    pool.clone(),
                    stop.clone(),
                    heavy_done.clone(),
                );
                async move {
                    let v = heavy.current().unwrap();
                    let mut took = Vec::new();
                    while !stop.load(Relaxed) {
                        let t = Instant::now();
                        let rx = heavy
                            .submit(v.clone(), vec![0.5; 1000 * 256], 1000, later(), &pool, None)
                            .unwrap();
                        assert_eq!(rx.await.unwrap().unwrap().len(), 1000);
                        took.push(t.elapsed());
                        done.fetch_add(1, Relaxed);
                    }
                    took
                }
            });
            // Wait for the heavy model to be busy, then time the light rows.
            while heavy.status().batches == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let v = light.current().unwrap();
            let mut lat: Vec<Duration> = Vec::new();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(20) && lat.len() < 3000 {
                let t = Instant::now();
                let rx = light
                    .submit(v.clone(), vec![0.1; 20], 1, later(), &pool, None)
                    .unwrap();
                rx.await.unwrap().unwrap();
                lat.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            stop.store(true, Relaxed);
            let heavy_took = driver.await.unwrap();
            lat.sort();
            let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
            let hs = heavy.status();
            println!(
                "{what}: light rows {} — p50 {:?}, p99 {:?}, max {:?}; heavy 1000-row requests {} (mean {:?}), {} evaluations, mean {:.1} rows",
                lat.len(),
                q(0.5),
                q(0.99),
                lat[lat.len() - 1],
                heavy_took.len(),
                heavy_took.iter().sum::<Duration>() / heavy_took.len().max(1) as u32,
                hs.batches,
                hs.rows as f64 / hs.batches.max(1) as f64
            );
        }
    }
}
