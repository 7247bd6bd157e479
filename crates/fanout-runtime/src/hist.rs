//! A lock-free histogram with fixed buckets, for distributions recorded where a lock would be
//! contended or where the crate has no metrics library (the compute pool's run times, batch
//! sizes; the gateway's request and call latencies). Recording is a search over a few bucket
//! bounds and two relaxed atomic additions; [`AtomicHistogram::snapshot`] gives what a
//! Prometheus histogram shows.
//!
//! Values are integers in the histogram's own unit (nanoseconds for times, keys for batch
//! sizes); `divisor` turns them into the exposed unit (1e9: seconds), by a division so that
//! bounds such as 0.0005 print exactly.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Latency bounds in nanoseconds: 0.5 ms … 10 s (exposed in seconds with divisor 1e9).
pub const LATENCY_NS: &[u64] = &[
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
];

/// Bounds of CPU work in nanoseconds: 10 µs … 1 s (the compute pool's jobs, model batches and
/// their queue time; exposed in seconds with divisor 1e9).
pub const WORK_NS: &[u64] = &[
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
    1_000_000_000,
];

/// Nanoseconds per second: the divisor of [`LATENCY_NS`] histograms.
pub const NS_PER_S: f64 = 1e9;

/// A histogram with fixed upper bounds (inclusive) and a `+Inf` bucket.
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [u64],
    divisor: f64,
    /// One per bound, then `+Inf`.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

/// What a histogram holds at one moment, in the exposed unit.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Sum of the recorded values.
    pub sum: f64,
    /// Values recorded.
    pub count: u64,
    /// (upper bound, values in this bucket — not cumulative); the last bound is `+Inf`.
    pub buckets: Vec<(f64, u64)>,
}

impl HistogramSnapshot {
    /// The upper bound of the bucket holding the `q`-quantile (0 < q ≤ 1): the value is at most
    /// this (`+Inf` past the last bound); `None` when empty.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let want = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bound, n) in &self.buckets {
            seen += n;
            if seen >= want {
                return Some(*bound);
            }
        }
        self.buckets.last().map(|(b, _)| *b)
    }
}

impl AtomicHistogram {
    /// An empty histogram with these ascending upper `bounds`, exposed divided by `divisor`.
    pub fn new(bounds: &'static [u64], divisor: f64) -> AtomicHistogram {
        AtomicHistogram {
            bounds,
            divisor,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// A latency histogram ([`LATENCY_NS`], exposed in seconds).
    pub fn latency() -> AtomicHistogram {
        AtomicHistogram::new(LATENCY_NS, NS_PER_S)
    }

    /// Record `v` (in the histogram's unit).
    #[inline]
    pub fn record(&self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Relaxed);
        }
        self.sum.fetch_add(v, Relaxed);
    }

    /// Record a duration (for histograms in nanoseconds).
    #[inline]
    pub fn record_duration(&self, d: Duration) {
        self.record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The counts now (each bucket read once; the count is their total).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut buckets = Vec::with_capacity(self.counts.len());
        let mut count = 0;
        for (i, c) in self.counts.iter().enumerate() {
            let n = c.load(Relaxed);
            count += n;
            let bound = self
                .bounds
                .get(i)
                .map_or(f64::INFINITY, |&b| b as f64 / self.divisor);
            buckets.push((bound, n));
        }
        HistogramSnapshot {
            sum: self.sum.load(Relaxed) as f64 / self.divisor,
            count,
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_that_holds_them() {
        static B: &[u64] = &[1, 2, 5];
        let h = AtomicHistogram::new(B, 1.0);
        for v in [0, 1, 2, 3, 5, 6, 100] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 7);
        assert_eq!(s.sum, 117.0);
        assert_eq!(
            s.buckets,
            vec![(1.0, 2), (2.0, 1), (5.0, 2), (f64::INFINITY, 2)]
        );
    }

    #[test]
    fn quantile_bounds_are_the_bucket_holding_the_quantile() {
        static B: &[u64] = &[1, 2, 5];
        let h = AtomicHistogram::new(B, 1.0);
        assert_eq!(h.snapshot().quantile_bound(0.5), None);
        for v in [1, 1, 2, 3, 4, 5, 5, 5, 5, 100] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.quantile_bound(0.2), Some(1.0));
        assert_eq!(s.quantile_bound(0.5), Some(5.0));
        assert_eq!(s.quantile_bound(0.9), Some(5.0));
        assert_eq!(s.quantile_bound(0.99), Some(f64::INFINITY));
    }

    #[test]
    fn latency_bounds_are_exact_seconds() {
        let h = AtomicHistogram::latency();
        h.record_duration(Duration::from_micros(700));
        let s = h.snapshot();
        assert_eq!(s.buckets[0], (0.0005, 0));
        assert_eq!(s.buckets[1], (0.001, 1));
        assert_eq!(s.buckets[2].0, 0.0025);
        assert!((s.sum - 0.0007).abs() < 1e-12);
    }
}
