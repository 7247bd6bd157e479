//! One model's slot: the version serving (swapped by [`ModelSlot::offer`] when a file loads and
//! fits), its bounded queue of rows, evaluation on the caller's thread when the model is idle and
//! fast ([`InlineTurn`]), batches on the compute pool through the [`Scheduler`], and its counters
//! ([`ModelStatus`]).

mod scheduler;

use super::{
    Evaluator, Format, ModelKind, Output, RunError, Version, kind_name, lock, output_value,
    panic_text,
};
use arc_swap::ArcSwapOption;
use fanout_config::{ModelBatch, ModelsConfig};
use fanout_expr::Val;
use fanout_runtime::compute::ComputePool;
use fanout_runtime::hist::{AtomicHistogram, HistogramSnapshot, NS_PER_S};
use scheduler::Reply;
pub(super) use scheduler::Scheduler;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
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

/// The file identity that decides whether a file changed: size, modification time, inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileSig {
    pub(super) len: u64,
    pub(super) modified: Option<SystemTime>,
    pub(super) inode: u64,
}

impl FileSig {
    pub(super) fn of(meta: &std::fs::Metadata) -> FileSig {
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
pub(super) struct LoadState {
    /// The file of the version serving (or of the last failure when none serves).
    pub(super) sig: Option<FileSig>,
    /// A file that failed to load: not tried again until it changes.
    pub(super) failed_sig: Option<FileSig>,
    /// A changed file waiting to settle: its identity and when it was first seen so.
    pub(super) settling: Option<(FileSig, Instant)>,
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
    pub(super) load: Mutex<LoadState>,
    stats: Stats,
    /// Nanoseconds per row, a moving average of the last evaluations (0: not measured yet):
    /// sizes the batches to `batch.slice`.
    row_ns: AtomicU64,
    sched: Arc<Scheduler>,
}

impl ModelSlot {
    pub(super) fn new(name: &str, batch: ModelBatch, sched: Arc<Scheduler>) -> ModelSlot {
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
    pub(super) fn offer(
        &self,
        format: &Format,
        bytes: &[u8],
        sig: FileSig,
        cfg: &ModelsConfig,
    ) -> bool {
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

    pub(super) fn fail(&self, sig: FileSig, error: String) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::testing::{later, loaded, rows, test_slot, test_version, version};
    use fanout_config::Dur;

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
}
