//! The log line of a failed request: request id, route, status, code, step, backend and the
//! internal detail that the client does not see. At most `server.error_log_per_second` lines a
//! second; the rest are counted and the count is logged when the next second starts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A per-second cap on log lines.
pub struct LogThrottle {
    per_second: u64,
    start: Instant,
    /// The second (since `start`) the counts are for.
    second: AtomicU64,
    /// Lines written this second.
    written: AtomicU64,
    /// Lines suppressed since the last report.
    suppressed: AtomicU64,
}

impl LogThrottle {
    /// At most `per_second` lines a second; 0: no limit.
    pub fn new(per_second: u32) -> LogThrottle {
        LogThrottle {
            per_second: per_second as u64,
            start: Instant::now(),
            second: AtomicU64::new(0),
            written: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether to write a line now, at `now`; and the number of lines suppressed in earlier
    /// seconds, to report once (non-zero only for the first line of a new second).
    pub fn admit(&self, now: Instant) -> (bool, u64) {
        if self.per_second == 0 {
            return (true, 0);
        }
        let sec = now.saturating_duration_since(self.start).as_secs();
        let mut reported = 0;
        let cur = self.second.load(Ordering::Relaxed);
        if sec > cur
            && self
                .second
                .compare_exchange(cur, sec, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.written.store(0, Ordering::Relaxed);
            reported = self.suppressed.swap(0, Ordering::Relaxed);
        }
        if self.written.fetch_add(1, Ordering::Relaxed) < self.per_second {
            (true, reported)
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            (false, reported)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn lines_past_the_cap_are_counted_and_reported_in_the_next_second() {
        let t = LogThrottle::new(3);
        let t0 = t.start;
        let admitted: Vec<bool> = (0..10).map(|_| t.admit(t0).0).collect();
        assert_eq!(admitted.iter().filter(|a| **a).count(), 3);
        let (ok, reported) = t.admit(t0 + Duration::from_millis(1500));
        assert!(ok);
        assert_eq!(reported, 7);
        assert_eq!(t.admit(t0 + Duration::from_millis(1600)), (true, 0));
    }

    #[test]
    fn zero_means_no_limit() {
        let t = LogThrottle::new(0);
        assert!((0..10_000).all(|_| t.admit(t.start).0));
    }
}
