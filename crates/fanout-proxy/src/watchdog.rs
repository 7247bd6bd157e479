//! The stall watchdog (R1): a heartbeat task that should wake every `TICK`; when it wakes late by
//! more than the threshold, some worker held the runtime without yielding (blocking I/O, heavy CPU
//! on a worker) — it is logged and counted, because every request on that worker waited too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::Instant;

const TICK: Duration = Duration::from_millis(10);

/// Stall counters.
#[derive(Debug, Default)]
pub struct Watchdog {
    stalls: AtomicU64,
    max_stall_us: AtomicU64,
}

impl Watchdog {
    /// Start watching the current runtime; a wake-up later than `threshold` counts as a stall.
    pub fn spawn(threshold: Duration) -> Arc<Watchdog> {
        let w = Arc::new(Watchdog::default());
        let weak = Arc::downgrade(&w);
        tokio::spawn(async move {
            let mut expected = Instant::now() + TICK;
            loop {
                tokio::time::sleep_until(expected).await;
                let now = Instant::now();
                let late = now.saturating_duration_since(expected);
                let Some(w) = weak.upgrade() else { return };
                if late > threshold {
                    w.stalls.fetch_add(1, Relaxed);
                    w.max_stall_us.fetch_max(late.as_micros() as u64, Relaxed);
                    tracing::warn!(
                        stalled_ms = late.as_millis() as u64,
                        "a worker thread did not yield for {} ms: blocking work on a worker delays every request on it",
                        late.as_millis()
                    );
                }
                expected = now + TICK;
            }
        });
        w
    }

    /// Stalls seen so far.
    pub fn stalls(&self) -> u64 {
        self.stalls.load(Relaxed)
    }

    /// The longest stall, ms.
    pub fn max_stall_ms(&self) -> f64 {
        self.max_stall_us.load(Relaxed) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_worker_is_detected() {
        let w = Watchdog::spawn(Duration::from_millis(50));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(w.stalls(), 0);
        // Block the only worker thread for 150 ms (what a misbehaving step would do).
        std::thread::sleep(Duration::from_millis(150));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(w.stalls(), 1);
        assert!(w.max_stall_ms() >= 90.0, "{}", w.max_stall_ms());
    }
}
