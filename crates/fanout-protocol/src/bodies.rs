//! Request bodies before admission: how many may be read at once, and the memory budget of
//! in-flight request data.
//!
//! A body is read completely before its request asks for an admission slot, so a body that
//! trickles in holds a *reader* permit (bounded by `server.bodies.max_readers`), never a flow
//! slot. Every body byte read is counted against the memory budget at the estimated size of the
//! parsed value ([`parsed_size_estimate`]) until the request ends. The same budget holds the rows
//! of database statements as they arrive and the backend answers parsed for a request
//! ([`fanout_runtime::memory`]).

use fanout_config::BodyLimits;
use fanout_runtime::memory::MemoryBudget;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The reader cap and the memory budget, with their counters.
pub struct BodyGate {
    max_readers: usize,
    budget: usize,
    readers: AtomicUsize,
    in_use: AtomicUsize,
    peak: AtomicUsize,
    bodies_read: AtomicU64,
    refused_readers: AtomicU64,
    refused_memory: AtomicU64,
    timeouts: AtomicU64,
}

pub use fanout_runtime::memory::{parsed_size_estimate, value_overhead};

impl BodyGate {
    /// A gate with the limits of `server.bodies`.
    pub fn new(cfg: &BodyLimits) -> BodyGate {
        BodyGate {
            max_readers: cfg.max_readers,
            budget: cfg.memory_budget_bytes,
            readers: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            bodies_read: AtomicU64::new(0),
            refused_readers: AtomicU64::new(0),
            refused_memory: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
        }
    }

    /// The reader cap.
    pub fn max_readers(&self) -> usize {
        self.max_readers
    }

    /// The memory budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// A permit to read one body, or `None` when `max_readers` bodies are being read.
    pub fn reader(self: &Arc<Self>) -> Option<ReaderPermit> {
        let ok = self
            .readers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_readers).then_some(n + 1)
            })
            .is_ok();
        if ok {
            self.bodies_read.fetch_add(1, Ordering::Relaxed);
            Some(ReaderPermit(self.clone()))
        } else {
            self.refused_readers.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// An empty reservation of request memory, grown as the body arrives.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            gate: self.clone(),
            bytes: 0,
        }
    }

    /// Count a body that did not arrive in time.
    pub fn timed_out(&self) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// `bodies` on `/__fanout/status`.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "reading": self.readers.load(Ordering::Relaxed),
            "max_readers": self.max_readers,
            "read": self.bodies_read.load(Ordering::Relaxed),
            "refused_readers_full": self.refused_readers.load(Ordering::Relaxed),
            "timeouts": self.timeouts.load(Ordering::Relaxed),
            "memory": {
                "budget_bytes": self.budget,
                "in_use_bytes": self.in_use.load(Ordering::Relaxed),
                "peak_bytes": self.peak.load(Ordering::Relaxed),
                "refused": self.refused_memory.load(Ordering::Relaxed),
            },
        })
    }
}

/// One body being read; dropped when the body is complete (or the request ends).
pub struct ReaderPermit(Arc<BodyGate>);

impl Drop for ReaderPermit {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Request memory held until the request ends.
pub struct Reservation {
    gate: Arc<BodyGate>,
    bytes: usize,
}

/// The memory budget has no room for this much more.
#[derive(Debug)]
pub struct BudgetExhausted;

impl Reservation {
    /// Take `n` more bytes of the budget, or fail without taking any.
    pub fn grow(&mut self, n: usize) -> Result<(), BudgetExhausted> {
        if !self.gate.take(n) {
            return Err(BudgetExhausted);
        }
        self.bytes += n;
        Ok(())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.gate.give(self.bytes);
        }
    }
}

/// Backend answers parsed for a request are held in the same budget
/// ([`fanout_runtime::memory::RequestMemory`]).
impl MemoryBudget for BodyGate {
    fn take(&self, n: usize) -> bool {
        match self
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&t| t <= self.budget)
            }) {
            Ok(before) => {
                self.peak.fetch_max(before + n, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.refused_memory.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    fn give(&self, n: usize) {
        self.in_use.fetch_sub(n, Ordering::AcqRel);
    }

    fn limit(&self) -> usize {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(readers: usize, budget: usize) -> Arc<BodyGate> {
        Arc::new(BodyGate::new(&BodyLimits {
            max_readers: readers,
            memory_budget_bytes: budget,
            ..BodyLimits::default()
        }))
    }

    #[test]
    fn readers_are_capped_and_released() {
        let g = gate(2, 100);
        let a = g.reader().expect("first");
        let _b = g.reader().expect("second");
        assert!(g.reader().is_none(), "third refused");
        drop(a);
        assert!(g.reader().is_some(), "a released permit is reusable");
        assert_eq!(g.status()["refused_readers_full"], 1);
    }

    #[test]
    fn budget_refuses_without_taking_and_releases_on_drop() {
        let g = gate(10, 100);
        let mut r1 = g.reservation();
        r1.grow(60).unwrap();
        let mut r2 = g.reservation();
        assert!(r2.grow(50).is_err(), "60 + 50 > 100");
        r2.grow(40).unwrap();
        assert_eq!(g.status()["memory"]["in_use_bytes"], 100);
        drop(r1);
        drop(r2);
        assert_eq!(g.status()["memory"]["in_use_bytes"], 0);
        assert_eq!(g.status()["memory"]["refused"], 1);
        assert_eq!(g.status()["memory"]["peak_bytes"], 100);
    }

    #[test]
    fn estimate_counts_values_not_just_bytes() {
        assert_eq!(parsed_size_estimate(b"\"xxxx\""), 12);
        assert_eq!(parsed_size_estimate(b"[{},{}]"), 14 + 4 * 96);
    }
}
