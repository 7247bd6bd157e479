//! The compute pool (R1): a fixed set of OS threads, started with the server, for CPU-heavy work
//! — parsing large backend answers, `compute: true` step transforms — so a tokio worker never
//! spends milliseconds on one request while the others on it wait. The queue is bounded: when it
//! is full the job is refused (the step fails with 503 `overloaded`), memory never grows with load.

use crate::hist::{AtomicHistogram, HistogramSnapshot, NS_PER_S};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Why a job did not run on the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ComputeError {
    /// Every thread busy and the queue full.
    #[error(
        "the compute pool is saturated ({0} jobs queued); raise server.compute.queue or threads, or lower the load"
    )]
    QueueFull(usize),
    /// The pool stopped (server shutting down) or the job panicked.
    #[error("the compute pool stopped before the job finished")]
    Stopped,
}

/// A bounded pool of compute threads. Until [`ComputePool::start`] runs (plans built for tests
/// and benchmarks), jobs run inline on the caller.
pub struct ComputePool {
    threads: usize,
    queue: usize,
    /// Answers at least this large are parsed on the pool.
    pub offload_bytes: usize,
    tx: OnceLock<SyncSender<Job>>,
    queued: Arc<AtomicUsize>,
    done: Arc<AtomicU64>,
    skipped: Arc<AtomicU64>,
    running: Arc<AtomicU64>,
    refused: AtomicU64,
    /// How long jobs ran on a pool thread (not counting their wait in the queue).
    run_time: Arc<AtomicHistogram>,
}

impl ComputePool {
    /// A pool of `threads` threads (at least 1) and `queue` waiting jobs; not started yet.
    pub fn new(threads: usize, queue: usize, offload_bytes: usize) -> ComputePool {
        ComputePool {
            threads: threads.max(1),
            queue: queue.max(1),
            offload_bytes,
            tx: OnceLock::new(),
            queued: Arc::new(AtomicUsize::new(0)),
            done: Arc::new(AtomicU64::new(0)),
            skipped: Arc::new(AtomicU64::new(0)),
            running: Arc::new(AtomicU64::new(0)),
            refused: AtomicU64::new(0),
            run_time: Arc::new(AtomicHistogram::new(crate::hist::WORK_NS, NS_PER_S)),
        }
    }

    /// From the server config (threads default: half the cores, at least 1).
    pub fn from_config(cfg: &fanout_config::ComputeConfig) -> ComputePool {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ComputePool::new(
            cfg.threads.unwrap_or((cores / 2).max(1)),
            cfg.queue,
            cfg.offload_bytes,
        )
    }

    /// Start the threads (once; later calls do nothing). Threads end when the pool is dropped.
    pub fn start(&self) -> std::io::Result<()> {
        if self.tx.get().is_some() {
            return Ok(());
        }
        let (tx, rx) = sync_channel::<Job>(self.queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..self.threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("fanout-compute-{i}"))
                .spawn(move || worker(&rx))?;
        }
        // A racing start keeps the first sender; the second set of threads exits at once.
        let _ = self.tx.set(tx);
        Ok(())
    }

    /// Threads of the pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether the threads run.
    pub fn started(&self) -> bool {
        self.tx.get().is_some()
    }

    /// Run `f` on the pool and await its result (inline if the pool is not started).
    pub async fn run<T, F>(&self, f: F) -> Result<T, ComputeError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let Some(tx) = self.tx.get() else {
            return Ok(f());
        };
        let (done_tx, done_rx) = oneshot::channel();
        let queued = self.queued.clone();
        let done = self.done.clone();
        queued.fetch_add(1, Relaxed);
        let skipped = self.skipped.clone();
        let running = self.running.clone();
        let run_time = self.run_time.clone();
        let job: Job = Box::new(move || {
            queued.fetch_sub(1, Relaxed);
            // A job whose caller has gone (deadline, client gone) is not run at all: later jobs
            // must not queue behind work nobody waits for.
            if done_tx.is_closed() {
                skipped.fetch_add(1, Relaxed);
                return;
            }
            running.fetch_add(1, Relaxed);
            let t = std::time::Instant::now();
            let out = f();
            run_time.record_duration(t.elapsed());
            running.fetch_sub(1, Relaxed);
            // Counted before the answer is sent, so whoever sees the answer sees the count.
            done.fetch_add(1, Relaxed);
            let _ = done_tx.send(out);
        });
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.queued.fetch_sub(1, Relaxed);
                self.refused.fetch_add(1, Relaxed);
                return Err(ComputeError::QueueFull(self.queue));
            }
            Err(TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(1, Relaxed);
                return Err(ComputeError::Stopped);
            }
        }
        done_rx.await.map_err(|_| ComputeError::Stopped)
    }

    /// Queue `f` on the pool without waiting for it (run inline if the pool is not started).
    /// Refused when the queue is full; `f` then never runs.
    pub fn spawn<F>(&self, f: F) -> Result<(), ComputeError>
    where
        F: FnOnce() + Send + 'static,
    {
        let Some(tx) = self.tx.get() else {
            f();
            return Ok(());
        };
        let (queued, done, running) =
            (self.queued.clone(), self.done.clone(), self.running.clone());
        let run_time = self.run_time.clone();
        queued.fetch_add(1, Relaxed);
        let job: Job = Box::new(move || {
            queued.fetch_sub(1, Relaxed);
            running.fetch_add(1, Relaxed);
            let t = std::time::Instant::now();
            f();
            run_time.record_duration(t.elapsed());
            running.fetch_sub(1, Relaxed);
            done.fetch_add(1, Relaxed);
        });
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.queued.fetch_sub(1, Relaxed);
                self.refused.fetch_add(1, Relaxed);
                Err(ComputeError::QueueFull(self.queue))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(1, Relaxed);
                Err(ComputeError::Stopped)
            }
        }
    }

    /// Jobs waiting in the queue now.
    pub fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }

    /// Jobs refused because the queue was full, so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// How long jobs ran on the pool's threads (seconds).
    pub fn run_times(&self) -> HistogramSnapshot {
        self.run_time.snapshot()
    }

    /// Counters for the status endpoint.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "threads": self.threads,
            "started": self.started(),
            "queue": self.queue,
            "queued": self.queued.load(Relaxed),
            "done": self.done.load(Relaxed),
            "refused_queue_full": self.refused.load(Relaxed),
            "skipped_caller_gone": self.skipped.load(Relaxed),
            "running": self.running.load(Relaxed),
        })
    }
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only while taking the next job, never while running it.
        let job = match rx.lock() {
            Ok(r) => r.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok(job) = job else { return };
        // A panicking job must not take the thread with it (the caller sees `Stopped`).
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

/// Occupy the pool's only thread until the returned sender is used; returns once it runs (for
/// tests: here and, with the `test-util` feature, the engine's).
#[cfg(any(test, feature = "test-util"))]
pub async fn block_the_thread(
    pool: &Arc<ComputePool>,
) -> (
    std::sync::mpsc::Sender<()>,
    tokio::task::JoinHandle<Result<(), ComputeError>>,
) {
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let blocker = tokio::spawn({
        let pool = pool.clone();
        async move {
            pool.run(move || {
                let _ = started_tx.send(());
                let _ = release_rx.recv();
            })
            .await
        }
    });
    let _ = started_rx.await;
    (release_tx, blocker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_off_the_caller_thread_and_bounds_the_queue() {
        let pool = ComputePool::new(1, 2, 0);
        // Not started: inline.
        let here = std::thread::current().id();
        assert_eq!(
            pool.run(move || std::thread::current().id()).await,
            Ok(here)
        );
        pool.start().unwrap();
        let there = pool.run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(there, here);

        // Block the only thread, fill the queue (2), the next job is refused.
        let pool = Arc::new(pool);
        let (release_tx, blocker) = block_the_thread(&pool).await;
        let queued: Vec<_> = (0..2)
            .map(|i| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.run(move || i * 10).await })
            })
            .collect();
        while pool.queued.load(Relaxed) < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(pool.run(|| 0).await, Err(ComputeError::QueueFull(2)));
        release_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        let mut got = Vec::new();
        for q in queued {
            got.push(q.await.unwrap().unwrap());
        }
        assert_eq!(got, vec![0, 10]);
        assert_eq!(pool.status()["refused_queue_full"], 1);
    }

    #[tokio::test]
    async fn a_job_whose_caller_has_gone_is_not_run() {
        let pool = Arc::new(ComputePool::new(1, 4, 0));
        pool.start().unwrap();
        let (release_tx, blocker) = block_the_thread(&pool).await;
        let ran = Arc::new(AtomicU64::new(0));
        let gone = tokio::spawn({
            let (pool, ran) = (pool.clone(), ran.clone());
            async move { pool.run(move || ran.fetch_add(1, Relaxed)).await }
        });
        while pool.queued.load(Relaxed) < 1 {
            tokio::task::yield_now().await;
        }
        gone.abort(); // the caller goes away while its job waits
        let _ = gone.await;
        release_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        assert_eq!(pool.run(|| 7).await, Ok(7), "the pool goes on");
        assert_eq!(ran.load(Relaxed), 0, "the abandoned job never ran");
        assert_eq!(pool.status()["skipped_caller_gone"], 1);
    }

    #[tokio::test]
    async fn a_panicking_job_reports_stopped_and_the_thread_survives() {
        let pool = ComputePool::new(1, 4, 0);
        pool.start().unwrap();
        let r: Result<(), _> = pool.run(|| panic!("boom")).await;
        assert_eq!(r, Err(ComputeError::Stopped));
        assert_eq!(pool.run(|| 7).await, Ok(7));
    }
}
