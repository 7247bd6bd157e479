//! Admission control (R2): a concurrency limit with a small bounded queue in front. A request
//! either gets a slot at once, waits in the queue at most `queue_timeout` (and never past its own
//! deadline), or is rejected immediately with 503 + `Retry-After` — before any flow work, so a
//! rejection costs almost nothing and overload never turns into a queue of requests that time out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The limiter of one listener.
pub struct Admission {
    slots: Arc<Semaphore>,
    max: usize,
    queue_max: usize,
    queue_timeout: Duration,
    queued: AtomicUsize,
    admitted: AtomicU64,
    rejected_full: AtomicU64,
    rejected_waited: AtomicU64,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Every slot busy and the queue full.
    QueueFull,
    /// Waited in the queue longer than allowed (or past its deadline).
    Waited,
}

impl Admission {
    /// A limiter from the config.
    pub fn new(cfg: &fanout_config::Admission) -> Admission {
        let max = cfg.max_concurrency.max(1);
        Admission {
            slots: Arc::new(Semaphore::new(max)),
            max,
            queue_max: cfg.queue,
            queue_timeout: cfg.queue_timeout.0,
            queued: AtomicUsize::new(0),
            admitted: AtomicU64::new(0),
            rejected_full: AtomicU64::new(0),
            rejected_waited: AtomicU64::new(0),
        }
    }

    /// Get a slot (held until the permit is dropped), or the reason for rejecting.
    pub async fn admit(&self, deadline: Instant) -> Result<OwnedSemaphorePermit, Rejection> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            self.admitted.fetch_add(1, Relaxed);
            return Ok(p);
        }
        // Join the queue only if there is room.
        let joined = self
            .queued
            .fetch_update(Relaxed, Relaxed, |q| (q < self.queue_max).then_some(q + 1));
        if joined.is_err() {
            self.rejected_full.fetch_add(1, Relaxed);
            return Err(Rejection::QueueFull);
        }
        let until = (Instant::now() + self.queue_timeout).min(deadline);
        let got = tokio::time::timeout_at(until, self.slots.clone().acquire_owned()).await;
        self.queued.fetch_sub(1, Relaxed);
        match got {
            Ok(Ok(p)) => {
                self.admitted.fetch_add(1, Relaxed);
                Ok(p)
            }
            _ => {
                self.rejected_waited.fetch_add(1, Relaxed);
                Err(Rejection::Waited)
            }
        }
    }

    /// Counters for the status endpoint.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "max_concurrency": self.max,
            "in_flight": self.max - self.slots.available_permits(),
            "queued": self.queued.load(Relaxed),
            "admitted": self.admitted.load(Relaxed),
            "rejected_queue_full": self.rejected_full.load(Relaxed),
            "rejected_waited_too_long": self.rejected_waited.load(Relaxed),
        })
    }
}
