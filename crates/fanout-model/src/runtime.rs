//! Models (M1): the ONNX models of `models.dir`, each behind a [`ModelSlot`] — its current
//! version, swapped atomically when its file is replaced, and its batch queue on the compute pool.
//!
//! - **Loading.** [`ModelSet::open`] reads every `NAME.onnx` of the directory once (the flow
//!   compiler reads no file: the caller opens the set and hands it to the compiler in
//!   [`crate::Carry`]). [`ModelSet::watch`] starts one thread that rescans the directory every
//!   `models.poll`; a file whose size, modification time and inode stayed the same for
//!   `models.settle` is loaded (decoded, planned and run once on zeros by
//!   [`crate::Model::load_with`], under `models.limits`) and swapped in. A file that fails to load, or whose input
//!   width or kind (classifier, regressor) differs from the version serving, never replaces it:
//!   the error is kept in the slot's status and the file is tried again when it changes. A
//!   removed file changes nothing (the model keeps serving until a config without the steps that
//!   use it is loaded).
//! - **Batching.** A `model` step [`ModelSlot::submit`]s its rows with the version it read when
//!   it started. Rows wait in the slot's bounded queue (full: 503 `model_queue_full`); one
//!   drain job at a time runs on the compute pool and evaluates the waiting rows of one version
//!   together, up to `max_batch`, so rows that arrive while the model is busy share one
//!   evaluation without any added delay (`max_delay` may add one). A row whose deadline passed
//!   or whose request has gone is dropped from the queue, never evaluated.
//! - **Lifetime.** A version is an `Arc`: requests in flight finish on the version they started
//!   with, and the old version is freed when the last of them ends.

pub use crate::{ModelKind, Output};
use arc_swap::ArcSwapOption;
use fanout_config::{ConfigError, ModelBatch, ModelsConfig};
use fanout_expr::{Map, Val};
use fanout_runtime::compute::ComputePool;
use fanout_runtime::hist::{AtomicHistogram, HistogramSnapshot, NS_PER_S};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

/// Bounds of the batch-size histogram (rows per evaluation).
const BATCH_ROWS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Bounds of a model's queue-time and compute-time histograms, in nanoseconds: 10 µs … 60 s (an
/// evaluation of a large model, or a row waiting behind one, can take seconds; a quantile past
/// the last bound has no upper bound to show).
const MODEL_NS: &[u64] = &[
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
];

/// A panic's message (its payload when it is a string).
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A loaded model of some format: what evaluates its rows. Implementations are immutable and
/// shared by the threads of the compute pool.
pub trait Evaluator: Send + Sync + std::fmt::Debug + 'static {
    /// Features per row.
    fn input_width(&self) -> usize;
    /// What the model computes (its outputs' shape).
    fn kind(&self) -> &ModelKind;
    /// Evaluate `rows` (`n × input_width()` values, row-major) as one batch.
    fn run(&self, rows: &[f32]) -> Result<Output, String>;
}

/// A format's loader: (file bytes, model name, the `models:` config whose limits apply) → the
/// planned model, or why not.
pub type Load = fn(&[u8], &str, &ModelsConfig) -> Result<Box<dyn Evaluator>, String>;

/// A model file format: files `NAME.EXTENSION` of `models.dir` are loaded by `load` (bytes,
/// name, config), which plans the model under `models.limits` and runs it once (a model that
/// loads runs).
pub struct Format {
    /// The file name's extension, without the dot.
    pub extension: &'static str,
    /// Decode and plan a file.
    pub load: Load,
}

/// Every format `models.dir` reads. A new format or runtime: a module with its [`Format`], and
/// its line here.
#[cfg(not(any(test, feature = "test-hooks")))]
pub const FORMATS: &[Format] = &[onnx::FORMAT];

/// Every format `models.dir` reads; with the `test-hooks` feature (tests only), also
/// `NAME.panics`, whose loader panics.
#[cfg(any(test, feature = "test-hooks"))]
pub const FORMATS: &[Format] = &[onnx::FORMAT, hooks::PANICS];

/// What tests use to break the loading (feature `test-hooks`, never in a release build).
#[cfg(any(test, feature = "test-hooks"))]
mod hooks {
    use super::Format;

    /// `NAME.panics`: a loader that panics, as a bug in a format's code would on a hostile file.
    pub(super) const PANICS: Format = Format {
        extension: "panics",
        load: |_, name, _| panic!("test hook: the loader of `{name}` panics"),
    };

    /// While `models.dir` holds this file, the watcher panics before each scan (outside any
    /// load).
    pub(super) const WATCHER_PANICS: &str = ".fanout-test-watcher-panics";

    /// While `models.dir` holds this file, the watcher's scan blocks (as a read on a hung file
    /// system would).
    pub(super) const WATCHER_HANGS: &str = ".fanout-test-watcher-hangs";
}

/// ONNX files, evaluated by `fanout-model` (pure Rust).
mod onnx {
    use super::{Evaluator, Format, ModelKind, ModelsConfig, Output};

    pub(super) const FORMAT: Format = Format {
        extension: "onnx",
        load: |bytes, name, cfg| {
            let m =
                crate::Model::load_with(bytes, name, &limits(cfg)).map_err(|e| e.to_string())?;
            Ok(Box::new(m))
        },
    };

    /// The runtime's limits from `models:` — errors name them as config fields
    /// (`models.limits.max_input_width`). The file's size is `models.max_file_bytes`, checked
    /// by the scan before (and after) the file is read, so the runtime's own file limit never
    /// refuses a file that limit allows.
    pub(super) fn limits(cfg: &ModelsConfig) -> crate::Limits {
        let l = &cfg.limits;
        crate::Limits {
            max_model_bytes: usize::try_from(cfg.max_file_bytes).unwrap_or(usize::MAX),
            max_graph_nodes: l.max_graph_nodes,
            max_trees: l.max_trees,
            max_tree_nodes: l.max_tree_nodes,
            max_tree_depth: l.max_tree_depth,
            max_tensor_elements: l.max_tensor_elements,
            max_input_width: l.max_input_width,
            max_row_elements: l.max_row_elements,
            named_as: Some("models.limits"),
        }
    }

    impl Evaluator for crate::Model {
        fn input_width(&self) -> usize {
            crate::Model::input_width(self)
        }
        fn kind(&self) -> &ModelKind {
            crate::Model::kind(self)
        }
        fn run(&self, rows: &[f32]) -> Result<Output, String> {
            crate::Model::run(self, rows).map_err(|e| e.to_string())
        }
    }
}

/// One loaded version of a model.
#[derive(Debug)]
pub struct Version {
    /// The evaluation plan.
    pub model: Box<dyn Evaluator>,
    /// The first 16 hex digits of the file's SHA-256.
    pub hash: String,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// The file's size.
    pub bytes: u64,
}

/// The file identity that decides whether a file changed: size, modification time, inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileSig {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl FileSig {
    fn of(meta: &std::fs::Metadata) -> FileSig {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        FileSig {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        }
    }
}

/// Loads of one model: what the status endpoint shows.
#[derive(Debug, Default)]
struct LoadState {
    /// The file of the version serving (or of the last failure when none serves).
    sig: Option<FileSig>,
    /// A file that failed to load: not tried again until it changes.
    failed_sig: Option<FileSig>,
    /// A changed file waiting to settle: its identity and when it was first seen so.
    settling: Option<(FileSig, Instant)>,
    last_error: Option<String>,
    loads: u64,
    failures: u64,
}

/// Counters of one model's inferences.
struct Stats {
    rows: AtomicU64,
    batches: AtomicU64,
    /// Evaluations run on the request's own thread (`batch.inline_below`).
    inline: AtomicU64,
    refused: AtomicU64,
    expired: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    batch_rows: AtomicHistogram,
    queue_time: AtomicHistogram,
    compute_time: AtomicHistogram,
}

/// A snapshot of one model, for the status endpoint, metrics and `explain`.
#[derive(Debug, Clone)]
pub struct ModelStatus {
    /// The model's name.
    pub name: Arc<str>,
    /// The version serving: (hash, loaded at, input width, kind), if any.
    pub version: Option<(String, SystemTime, usize, &'static str)>,
    /// The last load error, if the last attempt failed.
    pub last_error: Option<String>,
    /// Successful loads (the first one and swaps).
    pub loads: u64,
    /// Failed loads.
    pub load_failures: u64,
    /// Rows evaluated.
    pub rows: u64,
    /// Evaluations (batches): `rows / batches` is the mean batch.
    pub batches: u64,
    /// Evaluations of them run on the request's own thread (`batch.inline_below`).
    pub inline: u64,
    /// Rows refused because the queue was full.
    pub refused: u64,
    /// Rows dropped from the queue because their deadline passed.
    pub expired: u64,
    /// Rows dropped from the queue because their request ended before (client gone, another
    /// step failed).
    pub cancelled: u64,
    /// Rows whose evaluation failed.
    pub failed: u64,
    /// Rows waiting now.
    pub pending: u64,
    /// Rows per evaluation.
    pub batch_rows: HistogramSnapshot,
    /// Seconds rows waited in the queue.
    pub queue_time: HistogramSnapshot,
    /// Seconds per evaluation.
    pub compute_time: HistogramSnapshot,
}

/// What became of submitted rows.
#[derive(Debug)]
pub enum RunError {
    /// The queue was full (rows waiting: the queue's size).
    QueueFull(usize),
    /// The deadline passed while the rows waited.
    Expired,
    /// The compute pool refused the drain job or stopped.
    Pool(fanout_runtime::compute::ComputeError),
    /// The model failed on the batch.
    Failed(String),
}

/// Rows of one request waiting in a queue.
struct Item {
    version: Arc<Version>,
    rows: Vec<f32>,
    n: usize,
    deadline: Instant,
    enqueued: Instant,
    tx: oneshot::Sender<Result<Vec<Val>, RunError>>,
    /// The step's trace context, when its request is traced (the batch's span links to it).
    trace: Option<fanout_layers::trace::CallTrace>,
}

/// A request with more rows than one evaluation takes, evaluated in chunks: the rows done so
/// far and their values. It is the head of its model's queue until its last chunk ran.
struct Partial {
    item: Item,
    done: usize,
    vals: Vec<Val>,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    /// Rows waiting: those of `items`, and those of the request being chunked not taken yet.
    rows: usize,
    /// The request being evaluated in chunks, between two of its chunks.
    head: Option<Partial>,
    /// A drain job is queued or running on the compute pool.
    running: bool,
    /// A `max_delay` timer is armed for this generation.
    timer: Option<u64>,
    generation: u64,
}

/// What a compute job evaluates next for one model.
enum Work {
    /// Whole requests' rows, of one version.
    Items(Arc<Version>, Vec<Item>),
    /// Rows `from..to` of a request too large for one evaluation.
    Chunk(Partial, usize, usize),
}

/// One model: the version serving, its batch queue and counters.
pub struct ModelSlot {
    name: Arc<str>,
    current: ArcSwapOption<Version>,
    batch: ModelBatch,
    queue: Mutex<Queue>,
    load: Mutex<LoadState>,
    stats: Stats,
    /// Nanoseconds per row, a moving average of the last evaluations (0: not measured yet):
    /// sizes the batches to `batch.slice`.
    row_ns: AtomicU64,
    sched: Arc<Scheduler>,
}

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
    fn ready(self: &Arc<Self>, slot: Arc<ModelSlot>, compute: &Arc<ComputePool>) {
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
type Reply = (
    oneshot::Sender<Result<Vec<Val>, RunError>>,
    Result<Vec<Val>, RunError>,
);

fn send(replies: Vec<Reply>) {
    for (tx, r) in replies {
        let _ = tx.send(r);
    }
}

impl ModelSlot {
    fn new(name: &str, batch: ModelBatch, sched: Arc<Scheduler>) -> ModelSlot {
        ModelSlot {
            sched,
            name: name.into(),
            current: ArcSwapOption::empty(),
            batch: ModelBatch {
                queue: batch.queue.max(1),
                max_batch: batch.max_batch.max(1),
                max_delay: batch.max_delay,
                slice: batch.slice,
                inline_below: batch.inline_below,
            },
            queue: Mutex::new(Queue::default()),
            load: Mutex::new(LoadState::default()),
            stats: Stats {
                rows: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                inline: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                expired: AtomicU64::new(0),
                cancelled: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                batch_rows: AtomicHistogram::new(BATCH_ROWS, 1.0),
                queue_time: AtomicHistogram::new(MODEL_NS, NS_PER_S),
                compute_time: AtomicHistogram::new(MODEL_NS, NS_PER_S),
            },
            row_ns: AtomicU64::new(0),
        }
    }

    /// The model's name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The version serving, if one loaded.
    pub fn current(&self) -> Option<Arc<Version>> {
        self.current.load_full()
    }

    /// The last load error, if the last attempt failed.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.load).last_error.clone()
    }

    /// Queue `n` rows (`rows`: `n × width` values) for `version`; the answer is one value per
    /// row (see [`output_value`]). Refused at once when the queue cannot take them.
    pub fn submit(
        self: &Arc<Self>,
        version: Arc<Version>,
        rows: Vec<f32>,
        n: usize,
        deadline: Instant,
        compute: &Arc<ComputePool>,
        trace: Option<fanout_layers::trace::CallTrace>,
    ) -> Result<oneshot::Receiver<Result<Vec<Val>, RunError>>, RunError> {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let inline = self.inline_fits(n);
        let start = {
            let mut q = lock(&self.queue);
            if q.rows + n > self.batch.queue {
                // The queue's bound holds for rows evaluated here too: a step with more rows
                // than it takes is refused whether or not the model is idle.
                drop(q);
                self.stats.refused.fetch_add(n as u64, Relaxed);
                return Err(RunError::QueueFull(self.batch.queue));
            } else if inline && !q.running && q.timer.is_none() && q.rows == 0 {
                // Nothing waits for the model and none of its evaluations runs: this one is
                // cheaper here than handed to a compute thread and back.
                q.running = true;
                Start::Inline(version, rows, tx, trace)
            } else {
                q.items.push_back(Item {
                    version,
                    rows,
                    n,
                    deadline,
                    enqueued: now,
                    tx,
                    trace,
                });
                q.rows += n;
                Self::queued(&mut q, &self.batch)
            }
        };
        match start {
            Start::Nothing => {}
            Start::Inline(version, rows, tx, trace) => {
                // Given back when it ends, even by a panic: the model is never left "running"
                // with nobody to run the rows that came meanwhile.
                let _turn = InlineTurn {
                    slot: self,
                    compute,
                };
                self.evaluate_inline(&version, &rows, n, tx, trace.as_ref());
            }
            Start::Drain => self.start_drain(compute),
            Start::Timer(generation) => {
                let (slot, pool) = (self.clone(), compute.clone());
                let delay = self.batch.max_delay.0;
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let go = {
                        let mut q = lock(&slot.queue);
                        if q.timer == Some(generation) && !q.running {
                            q.timer = None;
                            q.running = true;
                            true
                        } else {
                            false
                        }
                    };
                    if go {
                        slot.start_drain(&pool);
                    }
                });
            }
        }
        Ok(rx)
    }

    /// What starts after rows were queued: nothing (an evaluation runs, or the batch timer is
    /// set), a drain, or the batch timer.
    fn queued(q: &mut Queue, batch: &ModelBatch) -> Start {
        if q.running {
            Start::Nothing
        } else if batch.max_delay.0.is_zero() || q.rows >= batch.max_batch {
            q.running = true;
            q.timer = None;
            Start::Drain
        } else if q.timer.is_none() {
            q.generation += 1;
            q.timer = Some(q.generation);
            Start::Timer(q.generation)
        } else {
            Start::Nothing
        }
    }

    /// Whether `n` rows are evaluated on the caller's thread when the model is idle: with
    /// `max_delay: 0`, once the model's time per row is measured (at load, then by every
    /// evaluation), when they take less than `inline_below`.
    fn inline_fits(&self, n: usize) -> bool {
        let per_row = self.row_ns.load(Relaxed);
        let below = u64::try_from(self.batch.inline_below.0.as_nanos()).unwrap_or(u64::MAX);
        self.batch.max_delay.0.is_zero() && per_row != 0 && per_row.saturating_mul(n as u64) < below
    }

    /// Evaluate `n` rows on this thread and answer them (counted as a batch that waited 0).
    fn evaluate_inline(
        &self,
        version: &Version,
        rows: &[f32],
        n: usize,
        tx: oneshot::Sender<Result<Vec<Val>, RunError>>,
        trace: Option<&fanout_layers::trace::CallTrace>,
    ) {
        self.stats.inline.fetch_add(1, Relaxed);
        self.stats.queue_time.record(0);
        // Traced requests only (a trace that only counts attempts has no span).
        let traces: Vec<&fanout_layers::trace::CallTrace> =
            trace.into_iter().filter(|t| t.is_traced()).collect();
        let answer = match self.evaluate(version, rows, n, &traces) {
            Ok(out) => Ok((0..n)
                .map(|r| output_value(&*version.model, &out, r))
                .collect()),
            Err(msg) => {
                self.stats.failed.fetch_add(n as u64, Relaxed);
                Err(RunError::Failed(msg))
            }
        };
        let _ = tx.send(answer);
    }

    /// Put the slot on the scheduler's ready list (its rows are run by a compute job).
    fn start_drain(self: &Arc<Self>, compute: &Arc<ComputePool>) {
        self.sched.ready(self.clone(), compute);
    }

    /// On the compute pool: evaluate one batch of waiting rows (or one chunk of a large
    /// request), their answers added to `replies`. `false` (and the queue idle again) when none
    /// wait.
    fn turn(&self, replies: &mut Vec<Reply>) -> bool {
        let Some(work) = self.next_batch() else {
            return false;
        };
        match work {
            Work::Items(version, batch) => {
                let rows: usize = batch.iter().map(|it| it.n).sum();
                let mut input = Vec::with_capacity(rows * version.model.input_width());
                for it in &batch {
                    input.extend_from_slice(&it.rows);
                }
                // Traced requests only (a trace that only counts attempts has no span).
                let traces: Vec<&fanout_layers::trace::CallTrace> = batch
                    .iter()
                    .filter_map(|it| it.trace.as_ref())
                    .filter(|t| t.is_traced())
                    .collect();
                match self.evaluate(&version, &input, rows, &traces) {
                    Ok(out) => {
                        let mut at = 0;
                        for it in batch {
                            let vals = (at..at + it.n)
                                .map(|r| output_value(&*version.model, &out, r))
                                .collect();
                            at += it.n;
                            replies.push((it.tx, Ok(vals)));
                        }
                    }
                    Err(msg) => {
                        self.stats.failed.fetch_add(rows as u64, Relaxed);
                        for it in batch {
                            replies.push((it.tx, Err(RunError::Failed(msg.clone()))));
                        }
                    }
                }
            }
            Work::Chunk(mut p, from, to) => {
                let version = p.item.version.clone();
                let width = version.model.input_width();
                let input = p
                    .item
                    .rows
                    .get(from * width..to * width)
                    .unwrap_or_default();
                let traces: Vec<&fanout_layers::trace::CallTrace> =
                    p.item.trace.iter().filter(|t| t.is_traced()).collect();
                match self.evaluate(&version, input, to - from, &traces) {
                    Ok(out) => {
                        p.vals
                            .extend((0..to - from).map(|r| output_value(&*version.model, &out, r)));
                        p.done = to;
                        if to >= p.item.n {
                            replies.push((p.item.tx, Ok(p.vals)));
                        } else {
                            lock(&self.queue).head = Some(p);
                        }
                    }
                    Err(msg) => {
                        // The request's rows not evaluated yet are not evaluated at all.
                        let left = p.item.n - to;
                        lock(&self.queue).rows -= left;
                        self.stats
                            .failed
                            .fetch_add((p.item.n - from) as u64, Relaxed);
                        replies.push((p.item.tx, Err(RunError::Failed(msg))));
                    }
                }
            }
        }
        true
    }

    /// Evaluate `rows` rows (`input`) on `version`, counted: one evaluation, its time (which
    /// also updates the time per row that sizes the next batches), its span when requests in it
    /// are traced. A panicking model is a failed evaluation.
    fn evaluate(
        &self,
        version: &Version,
        input: &[f32],
        rows: usize,
        traces: &[&fanout_layers::trace::CallTrace],
    ) -> Result<Output, String> {
        // One span per evaluation, linked to the steps of the traced requests in the batch.
        let span = traces.first().and_then(|t| {
            t.tracer.as_ref()?.shared(
                &format!("model {}", self.name),
                vec![
                    ("fanout.model", self.name.to_string()),
                    ("fanout.model.version", version.hash.clone()),
                    ("fanout.batch_rows", rows.to_string()),
                ],
                traces,
            )
        });
        let t = Instant::now();
        let out =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| version.model.run(input)))
                .unwrap_or_else(|p| Err(format!("the model panicked: {}", panic_text(&*p))));
        let took = t.elapsed();
        if let Some(span) = span {
            let status = match out {
                Ok(_) => http::StatusCode::OK,
                Err(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            };
            span.end(Ok(status));
        }
        self.stats.compute_time.record_duration(took);
        self.stats.batches.fetch_add(1, Relaxed);
        self.stats.rows.fetch_add(rows as u64, Relaxed);
        self.stats.batch_rows.record(rows as u64);
        self.measured(took, rows);
        out
    }

    /// Update the time per row (a moving average; one job runs the slot at a time).
    fn measured(&self, took: Duration, rows: usize) {
        let per_row = u64::try_from(took.as_nanos() / rows.max(1) as u128)
            .unwrap_or(u64::MAX)
            .max(1);
        let old = self.row_ns.load(Relaxed);
        let new = if old == 0 {
            per_row
        } else {
            (old / 4).saturating_mul(3).saturating_add(per_row / 4)
        };
        self.row_ns.store(new.max(1), Relaxed);
    }

    /// Most rows of one evaluation: those the model evaluates in about `batch.slice` (from its
    /// time per row), at least one, at most `max_batch` (`max_batch` until it is measured).
    fn batch_limit(&self) -> usize {
        let max = self.batch.max_batch;
        let per_row = self.row_ns.load(Relaxed);
        if per_row == 0 {
            return max;
        }
        let slice = u64::try_from(self.batch.slice.0.as_nanos()).unwrap_or(u64::MAX);
        usize::try_from(slice / per_row)
            .unwrap_or(max)
            .clamp(1, max)
    }

    /// After a panic in a compute job's turn: the rows it held are gone (their callers see the
    /// pool stopped); count what still waits. Returns whether rows wait (the slot stays running).
    fn recover(&self) -> bool {
        let mut q = lock(&self.queue);
        let head = q.head.as_ref().map_or(0, |p| p.item.n - p.done);
        q.rows = q.items.iter().map(|it| it.n).sum::<usize>() + head;
        let more = q.rows > 0;
        if !more {
            q.running = false;
        }
        more
    }

    /// Take the next work: the next chunk of the request being chunked; or waiting rows of the
    /// version at the head of the queue, up to [`ModelSlot::batch_limit`] — a request with more
    /// rows than that is chunked. Requests whose caller has gone or whose deadline passed are
    /// dropped and counted (`expired` when the deadline passed, whether or not the caller still
    /// waits; `cancelled` when the caller left before). `None` (and the queue idle again) when
    /// nothing waits.
    fn next_batch(&self) -> Option<Work> {
        let now = Instant::now();
        let limit = self.batch_limit();
        let mut dropped: Vec<(Item, usize)> = Vec::new();
        let mut taken: Vec<Instant> = Vec::new();
        let mut q = lock(&self.queue);
        let mut work = None;
        if let Some(p) = q.head.take() {
            let left = p.item.n - p.done;
            if p.item.tx.is_closed() || p.item.deadline <= now {
                q.rows -= left;
                dropped.push((p.item, left));
            } else {
                let k = left.min(limit);
                q.rows -= k;
                let from = p.done;
                work = Some(Work::Chunk(p, from, from + k));
            }
        }
        if work.is_none() {
            let mut batch: Vec<Item> = Vec::new();
            let mut rows = 0;
            while let Some(head) = q.items.front() {
                if head.tx.is_closed() || head.deadline <= now {
                    if let Some(it) = q.items.pop_front() {
                        q.rows -= it.n;
                        let n = it.n;
                        dropped.push((it, n));
                    }
                    continue;
                }
                if let Some(first) = batch.first()
                    && (!Arc::ptr_eq(&first.version, &head.version) || rows + head.n > limit)
                {
                    break;
                }
                let Some(it) = q.items.pop_front() else { break };
                taken.push(it.enqueued);
                if batch.is_empty() && it.n > limit {
                    // More rows than one evaluation takes: in chunks, the other models'
                    // rows evaluated between them.
                    q.rows -= limit;
                    let vals = Vec::with_capacity(it.n);
                    let p = Partial {
                        item: it,
                        done: 0,
                        vals,
                    };
                    work = Some(Work::Chunk(p, 0, limit));
                    break;
                }
                q.rows -= it.n;
                rows += it.n;
                batch.push(it);
            }
            if work.is_none()
                && let Some(version) = batch.first().map(|it| it.version.clone())
            {
                work = Some(Work::Items(version, batch));
            }
        }
        if work.is_none() {
            q.running = false;
        }
        drop(q);
        for at in taken {
            self.stats
                .queue_time
                .record_duration(now.saturating_duration_since(at));
        }
        for (it, n) in dropped {
            if it.deadline <= now {
                self.stats.expired.fetch_add(n as u64, Relaxed);
                let _ = it.tx.send(Err(RunError::Expired));
            } else {
                self.stats.cancelled.fetch_add(n as u64, Relaxed);
            }
        }
        work
    }

    /// Rows waiting now.
    fn pending(&self) -> u64 {
        lock(&self.queue).rows as u64
    }

    /// The slot's state for the status endpoint and metrics.
    pub fn status(&self) -> ModelStatus {
        let v = self.current();
        let l = lock(&self.load);
        ModelStatus {
            name: self.name.clone(),
            version: v.map(|v| {
                (
                    v.hash.clone(),
                    v.loaded_at,
                    v.model.input_width(),
                    kind_name(v.model.kind()),
                )
            }),
            last_error: l.last_error.clone(),
            loads: l.loads,
            load_failures: l.failures,
            rows: self.stats.rows.load(Relaxed),
            batches: self.stats.batches.load(Relaxed),
            inline: self.stats.inline.load(Relaxed),
            refused: self.stats.refused.load(Relaxed),
            expired: self.stats.expired.load(Relaxed),
            cancelled: self.stats.cancelled.load(Relaxed),
            failed: self.stats.failed.load(Relaxed),
            pending: self.pending(),
            batch_rows: self.stats.batch_rows.snapshot(),
            queue_time: self.stats.queue_time.snapshot(),
            compute_time: self.stats.compute_time.snapshot(),
        }
    }

    /// Load `bytes` (the file `sig`) as the next version under the limits of `cfg`, unless it
    /// does not load or does not fit the version serving. Returns whether it was swapped in.
    /// A loader that panics (a bug in a format's code on a hostile file) refuses the file like
    /// any load error: the watcher goes on.
    fn offer(&self, format: &Format, bytes: &[u8], sig: FileSig, cfg: &ModelsConfig) -> bool {
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let model = (format.load)(bytes, &self.name, cfg)?;
            if let Some(cur) = self.current() {
                compatible(&*cur.model, &*model)?;
            }
            // One row timed: the first batches are sized to `batch.slice` from it.
            let t = Instant::now();
            model.run(&vec![0.0; model.input_width()])?;
            Ok((model, t.elapsed()))
        }))
        .unwrap_or_else(|p| Err(format!("the loader panicked: {}", panic_text(&*p))));
        let mut l = lock(&self.load);
        l.settling = None;
        match loaded {
            Ok((model, row_time)) => {
                self.row_ns.store(0, Relaxed);
                self.measured(row_time, 1);
                let hash = Sha256::digest(bytes);
                let hash: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
                self.current.store(Some(Arc::new(Version {
                    model,
                    hash,
                    loaded_at: SystemTime::now(),
                    bytes: bytes.len() as u64,
                })));
                l.sig = Some(sig);
                l.failed_sig = None;
                l.last_error = None;
                l.loads += 1;
                tracing::info!(model = %self.name, "model loaded");
                true
            }
            Err(e) => {
                tracing::warn!(model = %self.name, error = %e, "model file not loaded; the version serving (if any) goes on");
                l.failed_sig = Some(sig);
                l.last_error = Some(e);
                l.failures += 1;
                false
            }
        }
    }

    fn fail(&self, sig: FileSig, error: String) {
        let mut l = lock(&self.load);
        tracing::warn!(model = %self.name, error = %error, "model file not loaded; the version serving (if any) goes on");
        l.settling = None;
        l.failed_sig = Some(sig);
        l.last_error = Some(error);
        l.failures += 1;
    }
}

/// A model's evaluation on a caller's thread ([`Start::Inline`]): when it ends, the rows that
/// came meanwhile go to the compute pool, or the model is idle again.
struct InlineTurn<'a> {
    slot: &'a Arc<ModelSlot>,
    compute: &'a Arc<ComputePool>,
}

impl Drop for InlineTurn<'_> {
    fn drop(&mut self) {
        let drain = {
            let mut q = lock(&self.slot.queue);
            q.running = q.rows > 0;
            q.running
        };
        if drain {
            self.slot.start_drain(self.compute);
        }
    }
}

enum Start {
    Nothing,
    Drain,
    Timer(u64),
    /// Evaluate on the caller's thread (the slot is marked running for it).
    Inline(
        Arc<Version>,
        Vec<f32>,
        oneshot::Sender<Result<Vec<Val>, RunError>>,
        Option<fanout_layers::trace::CallTrace>,
    ),
}

/// `classifier` or `regressor`.
pub fn kind_name(k: &ModelKind) -> &'static str {
    match k {
        ModelKind::Classifier { .. } => "classifier",
        ModelKind::Regressor { .. } => "regressor",
    }
}

/// Whether `new` may replace `old`: same input width, same kind, same number of outputs.
fn compatible(old: &dyn Evaluator, new: &dyn Evaluator) -> Result<(), String> {
    if old.input_width() != new.input_width() {
        return Err(format!(
            "the new file takes {} features where the version serving takes {}: refused (the steps using the model give {})",
            new.input_width(),
            old.input_width(),
            old.input_width()
        ));
    }
    let shape = |k: &ModelKind| match k {
        ModelKind::Classifier { columns, .. } => ("classifier", columns.len()),
        ModelKind::Regressor { targets } => ("regressor", *targets),
    };
    let (a, b) = (shape(old.kind()), shape(new.kind()));
    if a != b {
        return Err(format!(
            "the new file is a {} with {} outputs where the version serving is a {} with {}: refused",
            b.0, b.1, a.0, a.1
        ));
    }
    Ok(())
}

/// A number as JSON: the shortest text that reads back as the same `f32` (`null` for NaN and
/// infinities).
fn num(x: f32) -> Val {
    if !x.is_finite() {
        return Val::Null;
    }
    let mut b = ryu::Buffer::new();
    Val::from(b.format_finite(x).parse::<f64>().unwrap_or(f64::from(x)))
}

/// The keys of a step's value, made once (a `Val` string is shared, not copied).
struct Keys {
    label: Val,
    probabilities: Val,
    value: Val,
    values: Val,
    /// `"0"` … `"15"`: the usual class labels.
    small: Vec<Val>,
}

static KEYS: std::sync::LazyLock<Keys> = std::sync::LazyLock::new(|| Keys {
    label: Val::from("label".to_string()),
    probabilities: Val::from("probabilities".to_string()),
    value: Val::from("value".to_string()),
    values: Val::from("values".to_string()),
    small: (0..16).map(|i: i64| Val::from(i.to_string())).collect(),
});

fn label_key(l: i64) -> Val {
    usize::try_from(l)
        .ok()
        .and_then(|i| KEYS.small.get(i).cloned())
        .unwrap_or_else(|| Val::from(l.to_string()))
}

/// Row `r` of `out` as the step's value: a classifier's `{label, probabilities: {LABEL: p}}`
/// (one entry per column: a binary classifier of one score column has one, its class's),
/// a regressor's `{value}` (one target) or `{values: [...]}`.
pub fn output_value(model: &dyn Evaluator, out: &Output, r: usize) -> Val {
    // Each map made at its final size: no growth, no rehash.
    let mut m = Map::with_capacity_and_hasher(2, Default::default());
    let keys = &*KEYS;
    match (model.kind(), out) {
        (ModelKind::Classifier { columns, .. }, Output::Classifier { .. }) => {
            let label = out.label(r).unwrap_or_default();
            m.insert(keys.label.clone(), Val::from(label as isize));
            let mut p = Map::with_capacity_and_hasher(columns.len(), Default::default());
            for (l, v) in columns.iter().zip(out.row(r)) {
                p.insert(label_key(*l), num(*v));
            }
            m.insert(keys.probabilities.clone(), Val::obj(p));
        }
        (_, out) => {
            let row = out.row(r);
            if let [v] = row {
                m.insert(keys.value.clone(), num(*v));
            } else {
                let vals = row.iter().map(|v| num(*v)).collect::<Vec<_>>();
                m.insert(keys.values.clone(), Val::Arr(vals.into()));
            }
        }
    }
    Val::obj(m)
}

/// Every model of `models.dir`, by name.
pub struct ModelSet {
    cfg: ModelsConfig,
    sched: Arc<Scheduler>,
    dir: Option<PathBuf>,
    slots: Mutex<BTreeMap<String, Arc<ModelSlot>>>,
    watching: AtomicBool,
    scans: AtomicU64,
    watcher: Mutex<WatcherStatus>,
    /// When the watcher last finished a scan or started to wait, and what it does since.
    beat: Mutex<(Instant, &'static str)>,
}

/// The state of the thread that watches `models.dir`, for `/readyz` and the status endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatcherStatus {
    /// Whether the watcher was started (a set without `models.dir`, or not serving, has none).
    pub started: bool,
    /// Whether it watches now: `false` from a panic until its restart.
    pub running: bool,
    /// Times it was restarted after a panic.
    pub restarts: u64,
    /// The message of its last panic, if any.
    pub last_panic: Option<String>,
}

/// The first wait before a panicked watcher is restarted; it doubles on each panic in a row, up
/// to [`RESTART_MAX`], and is back to this after a scan that completes.
const RESTART_FIRST: Duration = Duration::from_millis(100);
/// The longest wait before a panicked watcher is restarted.
const RESTART_MAX: Duration = Duration::from_secs(5);

impl Default for ModelSet {
    fn default() -> Self {
        ModelSet {
            cfg: ModelsConfig::default(),
            sched: Arc::default(),
            dir: None,
            slots: Mutex::new(BTreeMap::new()),
            watching: AtomicBool::new(false),
            scans: AtomicU64::new(0),
            watcher: Mutex::new(WatcherStatus::default()),
            beat: Mutex::new((Instant::now(), "starting")),
        }
    }
}

impl ModelSet {
    /// Load every model of `cfg.dir` (relative to `base`, the config file's directory). A file
    /// that does not load is kept as a slot without a version (its error in the status; a step
    /// naming it is a config error). An unreadable directory is a config error.
    pub fn open(cfg: &ModelsConfig, base: Option<&Path>) -> Result<ModelSet, ConfigError> {
        let mut set = ModelSet {
            cfg: cfg.clone(),
            ..ModelSet::default()
        };
        let Some(dir) = &cfg.dir else {
            return Ok(set);
        };
        let path = base.map_or_else(|| PathBuf::from(&dir.value), |b| b.join(&dir.value));
        if let Err(e) = std::fs::read_dir(&path) {
            return Err(ConfigError::at(
                dir.pos,
                format!("models.dir `{}` cannot be read: {e}", dir.value),
            )
            .hint("a directory of NAME.onnx files, relative to the config file"));
        }
        set.dir = Some(path);
        // A load that panics is a refused file (`offer`); this is a panic anywhere else.
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| set.scan(true))) {
            return Err(ConfigError::at(
                dir.pos,
                format!(
                    "models.dir `{}` could not be scanned: {}",
                    dir.value,
                    panic_text(&*p)
                ),
            ));
        }
        Ok(set)
    }

    /// The model `name`, if its file exists (loaded or not).
    pub fn get(&self, name: &str) -> Option<Arc<ModelSlot>> {
        lock(&self.slots).get(name).cloned()
    }

    /// Every model's state, by name.
    pub fn status(&self) -> Vec<ModelStatus> {
        lock(&self.slots).values().map(|s| s.status()).collect()
    }

    /// Directory scans so far (tests wait for one to pass).
    pub fn scans(&self) -> u64 {
        self.scans.load(Relaxed)
    }

    /// The watcher's state.
    pub fn watcher(&self) -> WatcherStatus {
        lock(&self.watcher).clone()
    }

    /// `Err` (why) while the watcher, once started, is stopped or stalled: no added or replaced
    /// model file would be loaded (`/readyz` answers not ready). A stopped (panicked) watcher is
    /// restarted on its own; a stalled one is waited for — it is blocked in the system (a hung
    /// file system), where a replacement would block too.
    pub fn readiness(&self) -> Result<(), String> {
        let w = lock(&self.watcher);
        if !w.started {
            return Ok(());
        }
        if w.running {
            let (at, doing) = *lock(&self.beat);
            let quiet = at.elapsed();
            if quiet > self.cfg.poll.0 + self.cfg.stall_timeout.0 {
                return Err(format!(
                    "the models.dir watcher has not finished a scan for {:.0} s (models.poll + \
                     models.stall_timeout: {:.0} s); it is {doing}",
                    quiet.as_secs_f64(),
                    (self.cfg.poll.0 + self.cfg.stall_timeout.0).as_secs_f64()
                ));
            }
            return Ok(());
        }
        Err(format!(
            "the models.dir watcher stopped ({}); it is being restarted (restarts so far: {})",
            w.last_panic.as_deref().unwrap_or("it panicked"),
            w.restarts
        ))
    }

    /// Start the thread that watches the directory (once; it ends when the set is dropped):
    /// it rescans on file-system events (inotify on Linux) and every `models.poll` whatever
    /// happens (events can be missing: network file systems, some volume mounts), and sooner
    /// while a changed file settles.
    pub fn watch(self: &Arc<Self>) -> std::io::Result<()> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        if self.watching.swap(true, Relaxed) {
            return Ok(());
        }
        let weak: Weak<ModelSet> = Arc::downgrade(self);
        let poll = self.cfg.poll.0.max(Duration::from_millis(10));
        let settle = self.cfg.settle.0.max(Duration::from_millis(10));
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        // Events only wake the thread; a full channel means a wake-up is pending already.
        // Accesses are not changes — and the scan's own reads of the directory are accesses.
        let events = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if e.is_ok_and(|e| matches!(e.kind, notify::EventKind::Access(_))) {
                return;
            }
            let _ = tx.try_send(());
        })
        .and_then(|mut w| {
            notify::Watcher::watch(&mut w, &dir, notify::RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        let events = match events {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "models.dir: no file-system events; polling every models.poll");
                None
            }
        };
        {
            let mut w = lock(&self.watcher);
            w.started = true;
            w.running = true;
        }
        let spawned = std::thread::Builder::new()
            .name("fanout-models".into())
            .spawn(move || {
                let _events = events; // dropped (unwatched) when the thread ends
                // Supervised: a panic ends the watch loop, not the thread; the loop is restarted
                // (at once scanning) after a wait that grows while it keeps panicking.
                let mut backoff = RESTART_FIRST;
                let mut first_wait = poll;
                loop {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        watch_loop(&weak, &rx, first_wait, poll, settle, &mut backoff)
                    }));
                    let Err(panic) = run else { return }; // the set was dropped
                    let message = panic_text(&*panic);
                    match weak.upgrade() {
                        Some(set) => {
                            tracing::error!(error = %message, restart_in = ?backoff, "the models.dir watcher panicked; restarting it");
                            let mut w = lock(&set.watcher);
                            w.running = false;
                            w.last_panic = Some(message);
                        }
                        None => return,
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(RESTART_MAX);
                    let Some(set) = weak.upgrade() else { return };
                    let mut w = lock(&set.watcher);
                    w.running = true;
                    w.restarts += 1;
                    first_wait = Duration::ZERO;
                }
            });
        if let Err(e) = spawned {
            let mut w = lock(&self.watcher);
            w.started = false;
            w.running = false;
            self.watching.store(false, Relaxed);
            return Err(e);
        }
        Ok(())
    }

    /// The watcher is alive and about to do `what` (reading files, waiting).
    fn beat(&self, what: &'static str) {
        *lock(&self.beat) = (Instant::now(), what);
    }

    /// Look at every `*.onnx` file of the directory and load what is new or changed (at start:
    /// at once; later: once settled). Returns whether a changed file is still settling.
    fn scan(&self, at_start: bool) -> bool {
        let Some(dir) = &self.dir else { return false };
        let files = match list(dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "models.dir cannot be read");
                self.scans.fetch_add(1, Relaxed);
                return false;
            }
        };
        let mut settling = false;
        let settle = self.cfg.settle.0;
        for (name, path, format, meta) in files {
            let sig = FileSig::of(&meta);
            let slot = {
                let mut slots = lock(&self.slots);
                match slots.get(&name) {
                    Some(s) => s.clone(),
                    None => {
                        if slots.len() >= self.cfg.max_models {
                            tracing::warn!(model = %name, max = self.cfg.max_models, "models.max_models reached: file ignored");
                            continue;
                        }
                        let s = Arc::new(ModelSlot::new(
                            &name,
                            self.cfg.batch_of(&name),
                            self.sched.clone(),
                        ));
                        slots.insert(name.clone(), s.clone());
                        s
                    }
                }
            };
            let ready = {
                let mut l = lock(&slot.load);
                if l.sig == Some(sig) || l.failed_sig == Some(sig) {
                    l.settling = None;
                    false
                } else if at_start || settle.is_zero() {
                    true
                } else {
                    match l.settling {
                        Some((s, since)) if s == sig => since.elapsed() >= settle,
                        _ => {
                            l.settling = Some((sig, Instant::now()));
                            false
                        }
                    }
                }
            };
            if !ready {
                settling |= lock(&slot.load).settling.is_some();
                continue;
            }
            let too_large = |len: u64| {
                format!(
                    "the file has {len} bytes, more than models.max_file_bytes ({})",
                    self.cfg.max_file_bytes
                )
            };
            if sig.len > self.cfg.max_file_bytes {
                slot.fail(sig, too_large(sig.len));
                continue;
            }
            self.beat("reading and loading a model file");
            match std::fs::read(&path) {
                // The file grew between its metadata and its reading.
                Ok(bytes) if bytes.len() as u64 > self.cfg.max_file_bytes => {
                    slot.fail(sig, too_large(bytes.len() as u64));
                }
                Ok(bytes) => {
                    slot.offer(format, &bytes, sig, &self.cfg);
                }
                Err(e) => slot.fail(sig, format!("the file cannot be read: {e}")),
            }
        }
        self.scans.fetch_add(1, Relaxed);
        settling
    }
}

/// The watcher's loop: scan on file-system events (`rx`) and every `poll`, sooner while a file
/// settles; the first scan after `first_wait`. Returns when the set is dropped.
fn watch_loop(
    weak: &Weak<ModelSet>,
    rx: &std::sync::mpsc::Receiver<()>,
    first_wait: Duration,
    poll: Duration,
    settle: Duration,
    backoff: &mut Duration,
) {
    let mut wait = first_wait;
    loop {
        if let Some(set) = weak.upgrade() {
            set.beat("waiting for a change or the next poll");
        }
        match rx.recv_timeout(wait) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
        }
        let Some(set) = weak.upgrade() else { return };
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(dir) = &set.dir
            && dir.join(hooks::WATCHER_PANICS).exists()
        {
            panic!("test hook: {} is in models.dir", hooks::WATCHER_PANICS);
        }
        set.beat("scanning the directory");
        #[cfg(any(test, feature = "test-hooks"))]
        while let Some(dir) = &set.dir
            && dir.join(hooks::WATCHER_HANGS).exists()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let settling = set.scan(false);
        *backoff = RESTART_FIRST;
        wait = if settling { settle.min(poll) } else { poll };
    }
}

/// The model files of `dir` — `NAME.EXT` for each extension of [`FORMATS`]; hidden files, such
/// as a temporary file being written, are not models — with their format and metadata.
fn list(dir: &Path) -> std::io::Result<Vec<(String, PathBuf, &'static Format, std::fs::Metadata)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((stem, format)) = FORMATS.iter().find_map(|f| {
            let stem = name.strip_suffix(f.extension)?.strip_suffix('.')?;
            Some((stem, f))
        }) else {
            continue;
        };
        if stem.is_empty() || stem.starts_with('.') {
            continue;
        }
        // Follows symlinks (Kubernetes mounts ConfigMaps and volumes through them).
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_file() {
            out.push((stem.to_string(), path, format, meta));
        }
    }
    // One file per name (another extension of the same name is ignored).
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    out.dedup_by(|b, a| a.0 == b.0);
    Ok(out)
}

/// Slots by name for the compiler (a plain map: compiling touches no lock per step).
pub fn slots(set: &ModelSet) -> HashMap<String, Arc<ModelSlot>> {
    lock(&set.slots)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The model set as a runtime of the gateway ([`crate::runtime`]): its line in the registry.
pub const RUNTIME: fanout_runtime::runtime::Registration = fanout_runtime::runtime::Registration {
    open: |cfg, prev| {
        if let Some((prev_cfg, prev)) = prev {
            // The same `models:` keeps the set: its versions, queues, counters and watcher.
            if prev_cfg.models == cfg.models && prev_cfg.file == cfg.file {
                return Ok(prev.clone());
            }
        }
        let set = ModelSet::open(&cfg.models, fanout_config::config_dir(&cfg.file).as_deref())
            .map_err(|e| e.in_file(&cfg.file))?;
        Ok(Arc::new(set))
    },
};

impl fanout_runtime::runtime::Runtime for ModelSet {
    fn start(self: Arc<Self>) -> Result<(), String> {
        self.watch()
            .map_err(|e| format!("starting the models.dir watcher: {e}"))
    }

    fn readiness(&self) -> Result<(), String> {
        ModelSet::readiness(self)
    }

    /// `models` (each model's version, loads and inference counters) and `models_watcher`.
    fn status(&self, now: SystemTime) -> Vec<(&'static str, serde_json::Value)> {
        let models: serde_json::Map<String, serde_json::Value> = ModelSet::status(self)
            .into_iter()
            .map(|m| (m.name.to_string(), model_json(&m, now)))
            .collect();
        let w = self.watcher();
        let watcher = serde_json::json!({
            "started": w.started,
            "running": w.running,
            "restarts": w.restarts,
            "last_panic": w.last_panic,
            "scans": self.scans(),
            // Why it is not ready (stopped, or stalled and what it is doing), else null.
            "problem": ModelSet::readiness(self).err(),
        });
        vec![
            ("models", serde_json::Value::Object(models)),
            ("models_watcher", watcher),
        ]
    }

    fn metrics(&self, now: SystemTime) -> Vec<fanout_runtime::runtime::Family> {
        use fanout_runtime::runtime::{Family, FamilyKind, Sample};
        let status = ModelSet::status(self);
        let model = |m: &ModelStatus| vec![("model", m.name.to_string())];
        let per_model = |name, help, kind, value: &dyn Fn(&ModelStatus) -> Sample| Family {
            name,
            help,
            kind,
            samples: status.iter().map(|m| (model(m), value(m))).collect(),
        };
        let by = |name,
                  help,
                  label: &'static str,
                  values: &dyn Fn(&ModelStatus) -> Vec<(&'static str, u64)>| {
            Family {
                name,
                help,
                kind: FamilyKind::Counter,
                samples: status
                    .iter()
                    .flat_map(|m| {
                        values(m).into_iter().map(move |(r, v)| {
                            (
                                vec![("model", m.name.to_string()), (label, r.to_string())],
                                Sample::Counter(v),
                            )
                        })
                    })
                    .collect(),
            }
        };
        vec![
            per_model(
                "fanout_model_rows",
                "Rows (one per request, or per for_each element) evaluated by a model",
                FamilyKind::Counter,
                &|m| Sample::Counter(m.rows),
            ),
            per_model(
                "fanout_model_batches",
                "Evaluations (batches) of a model: rows / batches is the mean batch",
                FamilyKind::Counter,
                &|m| Sample::Counter(m.batches),
            ),
            per_model(
                "fanout_model_batch_rows",
                "Rows per evaluation of a model",
                FamilyKind::Histogram,
                &|m| Sample::Histogram(m.batch_rows.clone()),
            ),
            per_model(
                "fanout_model_queue_seconds",
                "Time rows waited in a model's queue before their evaluation started",
                FamilyKind::Histogram,
                &|m| Sample::Histogram(m.queue_time.clone()),
            ),
            per_model(
                "fanout_model_compute_seconds",
                "Time one evaluation (a batch) of a model took on a compute pool thread",
                FamilyKind::Histogram,
                &|m| Sample::Histogram(m.compute_time.clone()),
            ),
            per_model(
                "fanout_model_pending_rows",
                "Rows waiting in a model's queue now",
                FamilyKind::Gauge,
                &|m| Sample::Gauge(m.pending as f64),
            ),
            by(
                "fanout_model_dropped_rows",
                "Rows not evaluated, by reason: queue_full (refused, 503 model_queue_full), expired (their deadline passed while waiting), cancelled (their request ended before: client gone, another step failed), failed (the evaluation failed)",
                "reason",
                &|m| {
                    vec![
                        ("queue_full", m.refused),
                        ("expired", m.expired),
                        ("cancelled", m.cancelled),
                        ("failed", m.failed),
                    ]
                },
            ),
            by(
                "fanout_model_loads",
                "Loads of a model file, by result (ok: swapped in; error: refused, the version serving goes on)",
                "result",
                &|m| vec![("ok", m.loads), ("error", m.load_failures)],
            ),
            Family {
                name: "fanout_model_version_age_seconds",
                help: "Seconds since the version of a model serving now was loaded (absent: none loaded)",
                kind: FamilyKind::Gauge,
                samples: status
                    .iter()
                    .filter_map(|m| {
                        let (_, at, _, _) = m.version.as_ref()?;
                        let age = now.duration_since(*at).unwrap_or_default();
                        Some((model(m), Sample::Gauge(age.as_secs_f64())))
                    })
                    .collect(),
            },
        ]
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// One model in `/__fanout/status`: its version, loads and inference counters.
fn model_json(m: &ModelStatus, now: SystemTime) -> serde_json::Value {
    let (version, age, width, kind) = match &m.version {
        Some((hash, at, width, kind)) => (
            Some(hash.clone()),
            Some(now.duration_since(*at).unwrap_or_default().as_secs_f64()),
            Some(*width),
            Some(*kind),
        ),
        None => (None, None, None, None),
    };
    serde_json::json!({
        "version": version,
        "age_s": age,
        "input_width": width,
        "kind": kind,
        "loads": m.loads,
        "load_failures": m.load_failures,
        "last_error": m.last_error,
        "rows": m.rows,
        "batches": m.batches,
        "inline": m.inline,
        "mean_batch": if m.batches > 0 { m.rows as f64 / m.batches as f64 } else { 0.0 },
        "pending": m.pending,
        "refused_queue_full": m.refused,
        "expired": m.expired,
        "cancelled": m.cancelled,
        "failed": m.failed,
        // At most (a bucket's upper bound), ms; null before the first row, or past 60 s.
        "queue_p50_ms": ms_bound(&m.queue_time, 0.5),
        "queue_p99_ms": ms_bound(&m.queue_time, 0.99),
        "compute_p50_ms": ms_bound(&m.compute_time, 0.5),
        "compute_p99_ms": ms_bound(&m.compute_time, 0.99),
    })
}

/// The `q`-quantile's bucket bound of a seconds histogram, in ms (`None`: empty or unbounded).
fn ms_bound(h: &HistogramSnapshot, q: f64) -> Option<f64> {
    h.quantile_bound(q)
        .filter(|b| b.is_finite())
        .map(|b| b * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_config::Dur;
    use fanout_runtime::compute::ComputePool;

    const MODEL: &[u8] = include_bytes!("../../fanout-model/testdata/dense_ops.onnx");

    fn version() -> Arc<Version> {
        Arc::new(Version {
            model: Box::new(crate::Model::load(MODEL, "d").unwrap()),
            hash: "h".into(),
            loaded_at: SystemTime::now(),
            bytes: MODEL.len() as u64,
        })
    }

    fn slot(queue: usize, max_delay: Dur) -> Arc<ModelSlot> {
        Arc::new(ModelSlot::new(
            "d",
            ModelBatch {
                queue,
                max_batch: 64,
                max_delay,
                slice: Dur::millis(2),
                // These tests are of the queue: never inline.
                inline_below: Dur::millis(0),
            },
            Arc::default(),
        ))
    }

    /// A one-feature regressor for the scheduling tests: each row's value is its feature; an
    /// evaluation reports its rows on `calls`, then waits for one message on `gate` (if any),
    /// then sleeps `per_row` per row.
    #[derive(Debug)]
    struct TestModel {
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

    fn test_version(
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

    fn test_slot(name: &str, max_batch: usize, sched: &Arc<Scheduler>) -> Arc<ModelSlot> {
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

    fn values(vals: &[Val]) -> Vec<f64> {
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

    #[tokio::test]
    async fn rows_dropped_at_their_deadline_are_counted_expired_even_when_the_caller_left() {
        let pool = Arc::new(ComputePool::new(1, 8, 0));
        pool.start().unwrap();
        let s = slot(64, Dur::millis(0));
        let release = block(&pool).await;
        let v = version();
        // As a request does at its deadline: the step's future (and its receiver) is dropped.
        let deadline = Instant::now() + Duration::from_millis(1);
        for _ in 0..10 {
            drop(
                s.submit(v.clone(), rows(1), 1, deadline, &pool, None)
                    .unwrap(),
            );
        }
        // A caller that left before its deadline: not expired.
        drop(
            s.submit(v.clone(), rows(2), 2, later(), &pool, None)
                .unwrap(),
        );
        while Instant::now() <= deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        release.send(()).unwrap();
        let ok = s.submit(v, rows(1), 1, later(), &pool, None).unwrap();
        assert_eq!(ok.await.unwrap().unwrap().len(), 1);
        let st = s.status();
        assert_eq!((st.expired, st.cancelled, st.rows), (10, 2, 1));
    }

    #[tokio::test]
    async fn an_evaluation_longer_than_a_second_has_a_compute_time_quantile() {
        let pool = Arc::new(ComputePool::new(1, 8, 0));
        pool.start().unwrap();
        let s = test_slot("slow", 64, &Arc::default());
        let v = test_version(Duration::from_millis(1100), None, None);
        let r = s.submit(v, vec![1.0], 1, later(), &pool, None).unwrap();
        assert_eq!(r.await.unwrap().unwrap().len(), 1);
        let st = s.status();
        for q in [0.5, 0.99] {
            let b = st.compute_time.quantile_bound(q);
            assert!(b.is_some_and(|b| b.is_finite() && b >= 1.1), "q{q}: {b:?}");
        }
    }

    #[tokio::test]
    async fn a_panicking_model_fails_its_rows_and_the_slot_goes_on() {
        #[derive(Debug)]
        struct Panics(ModelKind);
        impl Evaluator for Panics {
            fn input_width(&self) -> usize {
                1
            }
            fn kind(&self) -> &ModelKind {
                &self.0
            }
            fn run(&self, _: &[f32]) -> Result<Output, String> {
                panic!("boom")
            }
        }
        let pool = Arc::new(ComputePool::new(1, 8, 0));
        pool.start().unwrap();
        let s = test_slot("p", 64, &Arc::default());
        let v = Arc::new(Version {
            model: Box::new(Panics(ModelKind::Regressor { targets: 1 })),
            hash: "p".into(),
            loaded_at: SystemTime::now(),
            bytes: 0,
        });
        let r = s
            .submit(v.clone(), vec![1.0], 1, later(), &pool, None)
            .unwrap();
        assert!(matches!(r.await.unwrap(), Err(RunError::Failed(m)) if m.contains("boom")));
        let ok = test_version(Duration::ZERO, None, None);
        let r = s.submit(ok, vec![1.0], 1, later(), &pool, None).unwrap();
        assert_eq!(r.await.unwrap().unwrap().len(), 1);
        assert_eq!(s.status().failed, 1);

        // The same on the caller's thread (a model measured fast, nothing waiting): the panic
        // fails its rows there and the model is not left busy.
        let s = Arc::new(ModelSlot::new("q", ModelBatch::default(), Arc::default()));
        s.row_ns.store(1, Relaxed);
        let mut r = s
            .submit(v.clone(), vec![1.0], 1, later(), &pool, None)
            .unwrap();
        assert!(matches!(r.try_recv(), Ok(Err(RunError::Failed(m))) if m.contains("boom")));
        assert!(!lock(&s.queue).running, "the model is idle again");
        s.row_ns.store(1, Relaxed);
        let ok = test_version(Duration::ZERO, None, None);
        let r = s.submit(ok, vec![1.0], 1, later(), &pool, None).unwrap();
        assert_eq!(r.await.unwrap().unwrap().len(), 1);
        let st = s.status();
        assert_eq!((st.failed, st.inline), (1, 2), "{st:?}");
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

    fn loaded(
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

    fn watched_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fanout-models-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn watched(dir: &Path) -> Arc<ModelSet> {
        let cfg = ModelsConfig {
            dir: Some(fanout_config::Located::unknown(dir.display().to_string())),
            poll: Dur::millis(20),
            settle: Dur::millis(20),
            ..ModelsConfig::default()
        };
        let set = Arc::new(ModelSet::open(&cfg, None).unwrap());
        set.watch().unwrap();
        set
    }

    /// Wait for a condition (a watcher thread's doing), failing after 30 s.
    fn wait(what: &str, mut ok: impl FnMut() -> bool) {
        let give_up = Instant::now() + Duration::from_secs(30);
        while !ok() {
            if Instant::now() > give_up {
                panic!("timed out waiting for: {what}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_loader_that_panics_refuses_its_file_and_the_next_file_loads() {
        let dir = watched_dir("loader-panics");
        // At open: refused, counted.
        std::fs::write(dir.join("a.panics"), b"x").unwrap();
        let set = watched(&dir);
        let a = set.get("a").unwrap().status();
        assert_eq!((a.loads, a.load_failures), (0, 1));
        assert!(
            a.last_error
                .as_deref()
                .unwrap_or_default()
                .contains("panicked"),
            "{a:?}"
        );
        // In the watcher: refused, and a good file dropped after it is loaded.
        std::fs::write(dir.join("b.panics"), b"x").unwrap();
        wait("b refused", || {
            set.get("b").is_some_and(|s| s.status().load_failures == 1)
        });
        std::fs::write(dir.join("c.onnx"), MODEL).unwrap();
        wait("c loaded", || {
            set.get("c").and_then(|s| s.current()).is_some()
        });
        assert_eq!(set.watcher().restarts, 0);
        assert_eq!(set.readiness(), Ok(()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_watcher_blocked_in_a_scan_is_not_ready_until_it_finishes_one() {
        let dir = watched_dir("watcher-hangs");
        let cfg = ModelsConfig {
            dir: Some(fanout_config::Located::unknown(dir.display().to_string())),
            poll: Dur::millis(20),
            settle: Dur::millis(10),
            stall_timeout: Dur::millis(300),
            ..ModelsConfig::default()
        };
        let set = Arc::new(ModelSet::open(&cfg, None).unwrap());
        set.watch().unwrap();
        let scans = set.scans();
        wait("a scan", || set.scans() > scans);
        assert_eq!(set.readiness(), Ok(()));
        std::fs::write(dir.join(hooks::WATCHER_HANGS), b"").unwrap();
        wait("not ready", || set.readiness().is_err());
        let why = set.readiness().unwrap_err();
        assert!(why.contains("has not finished a scan"), "{why}");
        assert!(why.contains("scanning the directory"), "{why}");
        assert_eq!(
            set.watcher().restarts,
            0,
            "a blocked watcher is not replaced"
        );
        std::fs::remove_file(dir.join(hooks::WATCHER_HANGS)).unwrap();
        wait("ready again", || set.readiness().is_ok());
        std::fs::write(dir.join("m.onnx"), MODEL).unwrap();
        wait("m loaded", || {
            set.get("m").and_then(|s| s.current()).is_some()
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_watcher_that_panics_is_not_ready_until_it_is_restarted() {
        let dir = watched_dir("watcher-panics");
        let set = watched(&dir);
        assert_eq!(set.readiness(), Ok(()));
        std::fs::write(dir.join(hooks::WATCHER_PANICS), b"").unwrap();
        wait("not ready", || set.readiness().is_err());
        let why = set.readiness().unwrap_err();
        assert!(why.contains("models.dir watcher"), "{why}");
        assert!(why.contains("test hook"), "{why}");
        std::fs::remove_file(dir.join(hooks::WATCHER_PANICS)).unwrap();
        wait("ready again", || set.readiness().is_ok());
        assert!(set.watcher().restarts >= 1);
        // It loads files again.
        std::fs::write(dir.join("m.onnx"), MODEL).unwrap();
        wait("m loaded", || {
            set.get("m").and_then(|s| s.current()).is_some()
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn rows(n: usize) -> Vec<f32> {
        (0..n * 4).map(|i| i as f32).collect()
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// Occupy the pool's only thread until the returned sender is used.
    async fn block(pool: &Arc<ComputePool>) -> std::sync::mpsc::Sender<()> {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = oneshot::channel::<()>();
        pool.spawn(move || {
            let _ = started_tx.send(());
            let _ = wait.recv();
        })
        .unwrap();
        started.await.unwrap();
        release
    }

    #[tokio::test]
    async fn rows_that_wait_while_the_model_is_busy_run_as_one_batch_and_a_full_queue_refuses() {
        let pool = Arc::new(ComputePool::new(1, 8, 0));
        pool.start().unwrap();
        let s = slot(3, Dur::millis(0));
        let release = block(&pool).await;
        let v = version();
        let a = s
            .submit(v.clone(), rows(1), 1, later(), &pool, None)
            .unwrap();
        let b = s
            .submit(v.clone(), rows(2), 2, later(), &pool, None)
            .unwrap();
        assert!(matches!(
            s.submit(v.clone(), rows(1), 1, later(), &pool, None),
            Err(RunError::QueueFull(3))
        ));
        assert_eq!(s.status().pending, 3);
        release.send(()).unwrap();
        assert_eq!(a.await.unwrap().unwrap().len(), 1);
        assert_eq!(b.await.unwrap().unwrap().len(), 2);
        let st = s.status();
        assert_eq!((st.rows, st.batches, st.refused, st.pending), (3, 1, 1, 0));
        // Idle again: the next row runs at once.
        let c = s.submit(v, rows(1), 1, later(), &pool, None).unwrap();
        assert_eq!(c.await.unwrap().unwrap().len(), 1);
        assert_eq!(s.status().batches, 2);
    }

    fn logreg() -> Vec<u8> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/logreg_bin.onnx"),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn an_idle_fast_model_is_evaluated_on_the_callers_thread_and_rows_that_wait_still_batch()
    {
        let pool = Arc::new(ComputePool::new(1, 8, 0));
        pool.start().unwrap();
        // The pool's only thread is busy: an answer given now came from this thread.
        let release = block(&pool).await;
        let s = loaded("fast", &logreg(), ModelBatch::default(), &Arc::default());
        let v = s.current().unwrap();
        let width = v.model.input_width();
        let mut a = s
            .submit(v.clone(), vec![0.5; width], 1, later(), &pool, None)
            .unwrap();
        assert_eq!(a.try_recv().unwrap().unwrap().len(), 1);
        let st = s.status();
        assert_eq!((st.inline, st.batches, st.rows, st.pending), (1, 1, 1, 0));

        // While an evaluation of the model runs (marked as another thread's would be), rows wait
        // for the pool and run there as one batch.
        lock(&s.queue).running = true;
        let b = s
            .submit(v.clone(), vec![0.5; width], 1, later(), &pool, None)
            .unwrap();
        let c = s
            .submit(v.clone(), vec![0.5; width * 2], 2, later(), &pool, None)
            .unwrap();
        assert_eq!(s.status().pending, 3);
        s.start_drain(&pool);
        release.send(()).unwrap();
        assert_eq!(b.await.unwrap().unwrap().len(), 1);
        assert_eq!(c.await.unwrap().unwrap().len(), 2);
        let st = s.status();
        assert_eq!((st.inline, st.batches, st.rows, st.pending), (1, 2, 4, 0));

        // Idle again: inline again.
        let mut d = s
            .submit(v, vec![0.5; width], 1, later(), &pool, None)
            .unwrap();
        assert_eq!(d.try_recv().unwrap().unwrap().len(), 1);
        assert_eq!(s.status().inline, 2);
    }

    #[tokio::test]
    async fn a_model_slower_than_inline_below_or_with_it_off_runs_on_the_pool() {
        for below in [Dur::millis(0), Dur(Duration::from_nanos(1))] {
            let pool = Arc::new(ComputePool::new(1, 8, 0));
            pool.start().unwrap();
            let release = block(&pool).await;
            let batch = ModelBatch {
                inline_below: below,
                ..ModelBatch::default()
            };
            let s = loaded("fast", &logreg(), batch, &Arc::default());
            let v = s.current().unwrap();
            let width = v.model.input_width();
            let mut a = s
                .submit(v, vec![0.5; width], 1, later(), &pool, None)
                .unwrap();
            assert!(a.try_recv().is_err(), "{below:?}: answered on the caller");
            assert_eq!(s.status().pending, 1, "{below:?}");
            release.send(()).unwrap();
            assert_eq!(a.await.unwrap().unwrap().len(), 1);
            let st = s.status();
            assert_eq!((st.inline, st.batches), (0, 1), "{below:?}");
        }
    }

    #[tokio::test]
    async fn a_row_whose_deadline_passed_or_whose_caller_left_is_never_computed() {
        let pool = Arc::new(ComputePool::new(1, 8, 0));
        pool.start().unwrap();
        let s = slot(16, Dur::millis(0));
        let release = block(&pool).await;
        let v = version();
        let late = s
            .submit(v.clone(), rows(1), 1, Instant::now(), &pool, None)
            .unwrap();
        let gone = s
            .submit(v.clone(), rows(2), 2, later(), &pool, None)
            .unwrap();
        drop(gone);
        let ok = s.submit(v, rows(1), 1, later(), &pool, None).unwrap();
        release.send(()).unwrap();
        assert!(matches!(late.await.unwrap(), Err(RunError::Expired)));
        assert_eq!(ok.await.unwrap().unwrap().len(), 1);
        let st = s.status();
        assert_eq!((st.rows, st.batches, st.expired, st.pending), (1, 1, 1, 0));
    }

    #[tokio::test]
    async fn a_batch_holds_rows_of_one_version() {
        let pool = Arc::new(ComputePool::new(1, 8, 0));
        pool.start().unwrap();
        let s = slot(16, Dur::millis(0));
        let release = block(&pool).await;
        let (v1, v2) = (version(), version());
        let waits = [
            s.submit(v1.clone(), rows(1), 1, later(), &pool, None)
                .unwrap(),
            s.submit(v1.clone(), rows(1), 1, later(), &pool, None)
                .unwrap(),
            s.submit(v2, rows(1), 1, later(), &pool, None).unwrap(),
            s.submit(v1, rows(1), 1, later(), &pool, None).unwrap(),
        ];
        release.send(()).unwrap();
        for w in waits {
            assert_eq!(w.await.unwrap().unwrap().len(), 1);
        }
        let st = s.status();
        assert_eq!((st.rows, st.batches), (4, 3), "[v1 v1] [v2] [v1]");
    }

    #[tokio::test(start_paused = true)]
    async fn max_delay_holds_the_first_row_for_the_others() {
        let pool = Arc::new(ComputePool::new(1, 8, 0)); // not started: jobs run inline
        let s = slot(16, Dur::millis(5));
        let v = version();
        let a = s
            .submit(v.clone(), rows(1), 1, later(), &pool, None)
            .unwrap();
        let b = s.submit(v, rows(1), 1, later(), &pool, None).unwrap();
        assert_eq!(s.status().batches, 0, "nothing runs before max_delay");
        assert_eq!(a.await.unwrap().unwrap().len(), 1);
        assert_eq!(b.await.unwrap().unwrap().len(), 1);
        assert_eq!((s.status().rows, s.status().batches), (2, 1));
    }

    #[test]
    fn the_watcher_rescans_on_changes_only_not_on_reads_of_the_directory() {
        let dir = std::env::temp_dir().join(format!("fanout-models-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.onnx"), MODEL).unwrap();
        let cfg = ModelsConfig {
            dir: Some(fanout_config::Located::unknown(dir.display().to_string())),
            poll: Dur::secs(3600),
            settle: Dur::millis(0),
            ..ModelsConfig::default()
        };
        let set = Arc::new(ModelSet::open(&cfg, None).unwrap());
        set.watch().unwrap();
        // Reads of the directory (as every scan makes) are no change.
        for _ in 0..50 {
            let _ = std::fs::read_dir(&dir).unwrap().count();
            let _ = std::fs::read(dir.join("a.onnx")).unwrap();
        }
        // A change is: the new model is loaded on its event (the poll is an hour away).
        std::fs::write(dir.join(".b.tmp"), MODEL).unwrap();
        std::fs::rename(dir.join(".b.tmp"), dir.join("b.onnx")).unwrap();
        let t = Instant::now();
        while set.get("b").and_then(|s| s.current()).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "b.onnx was not loaded"
            );
            std::thread::yield_now();
        }
        let scans = set.scans();
        // The scan at open, and a few for the temporary file's events and the rename (events
        // that arrive while a scan runs are merged into one wake-up): never one per read, and
        // never a scan woken by the previous scan's own reads (that loop makes dozens here).
        assert!(scans <= 8, "{scans} scans");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn outputs_are_json_in_their_documented_shape() {
        let v = version();
        let out = v.model.run(&rows(1)).unwrap();
        let val = output_value(&*v.model, &out, 0);
        let text = fanout_expr::json::to_string(&val);
        assert!(text.starts_with("{\"values\":["), "{text}");
        assert_eq!(num(0.1), Val::from(0.1f64), "the shortest exact form");
        assert_eq!(num(f32::NAN), Val::Null);
    }
}
