//! Models (M1): the ONNX models of `models.dir`, each behind a [`ModelSlot`] — its current
//! version, swapped atomically when its file is replaced, and its batch queue on the compute pool.
//!
//! - **Loading.** [`ModelSet::open`] reads every `NAME.onnx` of the directory once (the flow
//!   compiler reads no file: the caller opens the set and hands it to the compiler in
//!   [`crate::Carry`]). [`ModelSet::watch`] starts one thread that rescans the directory every
//!   `models.poll`; a file whose size, modification time and inode stayed the same for
//!   `models.settle` is loaded (decoded, planned and run once on zeros by
//!   [`fanout_model::Model::load`]) and swapped in. A file that fails to load, or whose input
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

use crate::compute::ComputePool;
use crate::hist::{AtomicHistogram, HistogramSnapshot, NS_PER_S};
use arc_swap::ArcSwapOption;
use fanout_config::{ConfigError, ModelBatch, ModelsConfig};
use fanout_expr::{Map, Val};
pub use fanout_model::{ModelKind, Output};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

/// Bounds of the batch-size histogram (rows per evaluation).
const BATCH_ROWS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

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

/// A format's loader: (file bytes, model name) → the planned model, or why not.
pub type Load = fn(&[u8], &str) -> Result<Box<dyn Evaluator>, String>;

/// A model file format: files `NAME.EXTENSION` of `models.dir` are loaded by `load` (bytes,
/// name), which plans the model and runs it once (a model that loads runs).
pub struct Format {
    /// The file name's extension, without the dot.
    pub extension: &'static str,
    /// Decode and plan a file.
    pub load: Load,
}

/// Every format `models.dir` reads. A new format or runtime: a module with its [`Format`], and
/// its line here.
pub const FORMATS: &[Format] = &[onnx::FORMAT];

/// ONNX files, evaluated by `fanout-model` (pure Rust).
mod onnx {
    use super::{Evaluator, Format, ModelKind, Output};

    pub(super) const FORMAT: Format = Format {
        extension: "onnx",
        load: |bytes, name| {
            let m = fanout_model::Model::load(bytes, name).map_err(|e| e.to_string())?;
            Ok(Box::new(m))
        },
    };

    impl Evaluator for fanout_model::Model {
        fn input_width(&self) -> usize {
            fanout_model::Model::input_width(self)
        }
        fn kind(&self) -> &ModelKind {
            fanout_model::Model::kind(self)
        }
        fn run(&self, rows: &[f32]) -> Result<Output, String> {
            fanout_model::Model::run(self, rows).map_err(|e| e.to_string())
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
    refused: AtomicU64,
    expired: AtomicU64,
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
    /// Rows refused because the queue was full.
    pub refused: u64,
    /// Rows dropped from the queue because their deadline passed.
    pub expired: u64,
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
    Pool(crate::compute::ComputeError),
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
    trace: Option<crate::trace::CallTrace>,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    rows: usize,
    /// A drain job is queued or running on the compute pool.
    running: bool,
    /// A `max_delay` timer is armed for this generation.
    timer: Option<u64>,
    generation: u64,
}

/// One model: the version serving, its batch queue and counters.
pub struct ModelSlot {
    name: Arc<str>,
    current: ArcSwapOption<Version>,
    batch: ModelBatch,
    queue: Mutex<Queue>,
    load: Mutex<LoadState>,
    stats: Stats,
    sched: Arc<Scheduler>,
}

/// The models' shared run list: slots with waiting rows, taken in turn (one batch each) by at
/// most one compute job per compute thread — so the ten model steps of one request cost one
/// wake-up of a compute thread, not ten, and a busy model does not starve the others.
#[derive(Default)]
pub(crate) struct Scheduler {
    /// (slots with rows waiting, compute jobs running now).
    state: Mutex<(VecDeque<Arc<ModelSlot>>, usize)>,
}

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
        let sched = self.clone();
        if let Err(e) = compute.spawn(move || sched.run()) {
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
                    q.items.drain(..).collect()
                };
                for it in items {
                    let _ = it.tx.send(Err(RunError::Pool(e)));
                }
            }
        }
    }

    /// A compute job: run one batch of each listed slot in turn, until the list is empty.
    fn run(&self) {
        // Answers are sent when the list is empty (or many are ready): the steps of one request
        // that ran in this job wake their request once, not once per model.
        let mut replies: Vec<Reply> = Vec::new();
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
            // A panicking evaluation must not leave the slot "running" with nobody to run it.
            let more =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slot.turn(&mut replies)))
                    .unwrap_or_else(|_| {
                        lock(&slot.queue).running = false;
                        false
                    });
            if more {
                lock(&self.state).0.push_back(slot);
            }
            if replies.len() >= MAX_HELD_REPLIES {
                send(std::mem::take(&mut replies));
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
            },
            queue: Mutex::new(Queue::default()),
            load: Mutex::new(LoadState::default()),
            stats: Stats {
                rows: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                expired: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                batch_rows: AtomicHistogram::new(BATCH_ROWS, 1.0),
                queue_time: AtomicHistogram::new(crate::hist::WORK_NS, NS_PER_S),
                compute_time: AtomicHistogram::new(crate::hist::WORK_NS, NS_PER_S),
            },
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
        trace: Option<crate::trace::CallTrace>,
    ) -> Result<oneshot::Receiver<Result<Vec<Val>, RunError>>, RunError> {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let start = {
            let mut q = lock(&self.queue);
            if q.rows + n > self.batch.queue {
                drop(q);
                self.stats.refused.fetch_add(n as u64, Relaxed);
                return Err(RunError::QueueFull(self.batch.queue));
            }
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
            if q.running {
                Start::Nothing
            } else if self.batch.max_delay.0.is_zero() || q.rows >= self.batch.max_batch {
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
        };
        match start {
            Start::Nothing => {}
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

    /// Put the slot on the scheduler's ready list (its rows are run by a compute job).
    fn start_drain(self: &Arc<Self>, compute: &Arc<ComputePool>) {
        self.sched.ready(self.clone(), compute);
    }

    /// On the compute pool: evaluate one batch of waiting rows, their answers added to
    /// `replies`. `false` (and the queue idle again) when none wait.
    fn turn(&self, replies: &mut Vec<Reply>) -> bool {
        let Some((version, batch)) = self.next_batch() else {
            return false;
        };
        let now = Instant::now();
        let rows: usize = batch.iter().map(|it| it.n).sum();
        let mut input = Vec::with_capacity(rows * version.model.input_width());
        for it in &batch {
            self.stats
                .queue_time
                .record_duration(now.saturating_duration_since(it.enqueued));
            input.extend_from_slice(&it.rows);
        }
        // One span per evaluation, linked to the steps of the traced requests in the batch.
        let traces: Vec<&crate::trace::CallTrace> =
            batch.iter().filter_map(|it| it.trace.as_ref()).collect();
        let span = traces.first().and_then(|t| {
            t.tracer.shared(
                &format!("model {}", self.name),
                vec![
                    ("fanout.model", self.name.to_string()),
                    ("fanout.model.version", version.hash.clone()),
                    ("fanout.batch_rows", rows.to_string()),
                ],
                &traces,
            )
        });
        let out = version.model.run(&input);
        if let Some(span) = span {
            let status = match out {
                Ok(_) => http::StatusCode::OK,
                Err(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            };
            span.end(Ok(status));
        }
        self.stats.compute_time.record_duration(now.elapsed());
        self.stats.batches.fetch_add(1, Relaxed);
        self.stats.rows.fetch_add(rows as u64, Relaxed);
        self.stats.batch_rows.record(rows as u64);
        match out {
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
        true
    }

    /// Take the next batch: waiting rows of the version at the head of the queue, up to
    /// `max_batch` (at least one item), dropping those whose request has gone or whose deadline
    /// passed. `None` (and the queue idle again) when nothing waits.
    fn next_batch(&self) -> Option<(Arc<Version>, Vec<Item>)> {
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut q = lock(&self.queue);
        let mut batch: Vec<Item> = Vec::new();
        let mut rows = 0;
        while let Some(head) = q.items.front() {
            if head.tx.is_closed() || head.deadline <= now {
                if let Some(it) = q.items.pop_front() {
                    q.rows -= it.n;
                    if !it.tx.is_closed() {
                        expired.push(it);
                    }
                }
                continue;
            }
            if let Some(first) = batch.first()
                && (!Arc::ptr_eq(&first.version, &head.version)
                    || rows + head.n > self.batch.max_batch)
            {
                break;
            }
            if let Some(it) = q.items.pop_front() {
                q.rows -= it.n;
                rows += it.n;
                batch.push(it);
            }
        }
        let version = batch.first().map(|it| it.version.clone());
        if version.is_none() {
            q.running = false;
        }
        drop(q);
        for it in expired {
            self.stats.expired.fetch_add(it.n as u64, Relaxed);
            let _ = it.tx.send(Err(RunError::Expired));
        }
        Some((version?, batch))
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
            refused: self.stats.refused.load(Relaxed),
            expired: self.stats.expired.load(Relaxed),
            failed: self.stats.failed.load(Relaxed),
            pending: self.pending(),
            batch_rows: self.stats.batch_rows.snapshot(),
            queue_time: self.stats.queue_time.snapshot(),
            compute_time: self.stats.compute_time.snapshot(),
        }
    }

    /// Load `bytes` (the file `sig`) as the next version, unless it does not load or does not
    /// fit the version serving. Returns whether it was swapped in.
    fn offer(&self, format: &Format, bytes: &[u8], sig: FileSig) -> bool {
        let loaded = (format.load)(bytes, &self.name).and_then(|model| {
            if let Some(cur) = self.current() {
                compatible(&*cur.model, &*model)?;
            }
            Ok(model)
        });
        let mut l = lock(&self.load);
        l.settling = None;
        match loaded {
            Ok(model) => {
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

enum Start {
    Nothing,
    Drain,
    Timer(u64),
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
        ModelKind::Classifier { labels } => ("classifier", labels.len()),
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

/// Row `r` of `out` as the step's value: a classifier's `{label, probabilities: {LABEL: p}}`,
/// a regressor's `{value}` (one target) or `{values: [...]}`.
pub fn output_value(model: &dyn Evaluator, out: &Output, r: usize) -> Val {
    let mut m = Map::default();
    let keys = &*KEYS;
    match (model.kind(), out) {
        (ModelKind::Classifier { labels }, Output::Classifier { .. }) => {
            let label = out.label(r).unwrap_or_default();
            m.insert(keys.label.clone(), Val::from(label as isize));
            let mut p = Map::default();
            for (l, v) in labels.iter().zip(out.row(r)) {
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
}

impl Default for ModelSet {
    fn default() -> Self {
        ModelSet {
            cfg: ModelsConfig::default(),
            sched: Arc::default(),
            dir: None,
            slots: Mutex::new(BTreeMap::new()),
            watching: AtomicBool::new(false),
            scans: AtomicU64::new(0),
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
        let _ = set.scan(true);
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
        std::thread::Builder::new()
            .name("fanout-models".into())
            .spawn(move || {
                let _events = events; // dropped (unwatched) when the thread ends
                let mut wait = poll;
                loop {
                    match rx.recv_timeout(wait) {
                        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                            std::thread::sleep(wait)
                        }
                    }
                    let Some(set) = weak.upgrade() else { return };
                    let settling = set.scan(false);
                    wait = if settling { settle.min(poll) } else { poll };
                }
            })?;
        Ok(())
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
            if sig.len > self.cfg.max_file_bytes {
                slot.fail(
                    sig,
                    format!(
                        "the file has {} bytes, more than models.max_file_bytes ({})",
                        sig.len, self.cfg.max_file_bytes
                    ),
                );
                continue;
            }
            match std::fs::read(&path) {
                Ok(bytes) => {
                    slot.offer(format, &bytes, sig);
                }
                Err(e) => slot.fail(sig, format!("the file cannot be read: {e}")),
            }
        }
        self.scans.fetch_add(1, Relaxed);
        settling
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
pub(crate) fn slots(set: &ModelSet) -> HashMap<String, Arc<ModelSlot>> {
    lock(&set.slots)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ComputePool;
    use fanout_config::Dur;

    const MODEL: &[u8] = include_bytes!("../../fanout-model/testdata/dense_ops.onnx");

    fn version() -> Arc<Version> {
        Arc::new(Version {
            model: Box::new(fanout_model::Model::load(MODEL, "d").unwrap()),
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
            },
            Arc::default(),
        ))
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
