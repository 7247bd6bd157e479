//! The gateway's memory budget for in-flight data as the executor sees it: one request's
//! account ([`RequestMemory`]) of the backend answers parsed for it.
//!
//! A backend's answer is parsed into a value that costs many times its JSON (a map, its table,
//! an `Arc`, a number or a string per field: 10–30× for rows of short fields). The answer's bytes
//! are bounded by the backend's `max_response_bytes`, but without an account four answers at a
//! 16 MiB cap, parsed, hold over a gigabyte. So before an answer is parsed, the estimate of what
//! its value will hold ([`parsed_size_estimate`]) is taken from the budget
//! (`server.bodies.memory_budget_bytes`, shared with request bodies and the rows of database
//! statements as they arrive) and held until the request's run ends; no room refuses the call's
//! answer with 503 `memory_budget_exhausted` instead of parsing it.
//!
//! The budget itself is the gateway's ([`MemoryBudget`]); a run without one (tests, `fanout
//! test`) holds nothing ([`RequestMemory::unlimited`]).

use std::sync::atomic::{AtomicUsize, Ordering};

/// A budget of bytes shared by every request (the gateway's `server.bodies` gate).
pub trait MemoryBudget: Send + Sync {
    /// Take `n` bytes, or take none and answer `false` when the budget has no room for them.
    fn take(&self, n: usize) -> bool;
    /// Give back `n` bytes taken before.
    fn give(&self, n: usize);
    /// The budget in bytes (for messages).
    fn limit(&self) -> usize;
}

/// One request's account in a [`MemoryBudget`]: the bytes it holds are given back when the
/// account is dropped (the request's run ended, its values with it).
pub struct RequestMemory<'a> {
    budget: Option<&'a dyn MemoryBudget>,
    held: AtomicUsize,
}

/// The account of a run without a budget.
static UNLIMITED: RequestMemory<'static> = RequestMemory {
    budget: None,
    held: AtomicUsize::new(0),
};

impl<'a> RequestMemory<'a> {
    /// A new, empty account in `budget`.
    pub fn new(budget: &'a dyn MemoryBudget) -> Self {
        RequestMemory {
            budget: Some(budget),
            held: AtomicUsize::new(0),
        }
    }

    /// The account of a run without a budget: holding always succeeds and counts nothing.
    pub fn unlimited() -> &'static RequestMemory<'static> {
        &UNLIMITED
    }

    /// Bytes held.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Hold `n` more bytes until the account is dropped; `Err(limit)` (the budget's size) when
    /// the budget has no room for them, holding nothing more.
    pub fn hold(&self, n: usize) -> Result<(), usize> {
        let Some(budget) = self.budget else {
            return Ok(());
        };
        if !budget.take(n) {
            return Err(budget.limit());
        }
        self.held.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for RequestMemory<'_> {
    fn drop(&mut self) {
        let n = *self.held.get_mut();
        if let (Some(budget), true) = (self.budget, n > 0) {
            budget.give(n);
        }
    }
}

/// Estimated memory of a JSON text once parsed (the text itself included while it is parsed):
/// every byte twice (the raw buffer and the strings it becomes) and [`PER_VALUE`] bytes per `,`
/// `:` `[` `{` (each marks one more value, array or object entry).
///
/// Measured with the workspace's parser on 1 MiB texts, the real size (raw buffer + parsed value)
/// is 2× to 36× the text depending on its shape (`[1,1,…]` 17×, objects of short fields 13×,
/// `[{},{},…]` 36×, one long string 2×; a database answer's rows `{"g":N}` ~23×): this estimate is
/// 1.0× to 2.6× of it, never below.
pub fn parsed_size_estimate(data: &[u8]) -> usize {
    data.len()
        .saturating_mul(2)
        .saturating_add(value_overhead(data))
}

/// Bytes counted per value-marking byte (`,` `:` `[` `{`) by [`parsed_size_estimate`]: a 16-byte
/// value, its slot in a growing vector, map and `Arc` overhead.
pub const PER_VALUE: usize = 96;

/// The per-value part of [`parsed_size_estimate`].
///
/// Counted in runs of 255 bytes into a byte-wide counter (at most one per byte, so it cannot
/// overflow): the compiler turns that into vector compares, 16 or 32 bytes an instruction,
/// where counting byte by byte into a `usize` costs ~5 instructions a byte — every backend
/// answer and request body is counted before it is parsed.
pub fn value_overhead(data: &[u8]) -> usize {
    let mut n = 0usize;
    for run in data.chunks(255) {
        let mut c = 0u8;
        for &b in run {
            c = c.wrapping_add(
                u8::from(b == b',')
                    + u8::from(b == b':')
                    + u8::from(b == b'[')
                    + u8::from(b == b'{'),
            );
        }
        n += usize::from(c);
    }
    n.saturating_mul(PER_VALUE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Counted {
        limit: usize,
        used: Mutex<usize>,
    }

    impl MemoryBudget for Counted {
        fn take(&self, n: usize) -> bool {
            let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
            if *used + n > self.limit {
                return false;
            }
            *used += n;
            true
        }
        fn give(&self, n: usize) {
            *self.used.lock().unwrap_or_else(|p| p.into_inner()) -= n;
        }
        fn limit(&self) -> usize {
            self.limit
        }
    }

    #[test]
    fn an_account_holds_until_dropped_and_refuses_past_the_budget() {
        let b = Counted {
            limit: 100,
            used: Mutex::new(0),
        };
        let a = RequestMemory::new(&b);
        assert_eq!(a.hold(60), Ok(()));
        let other = RequestMemory::new(&b);
        assert_eq!(other.hold(50), Err(100), "no room: refused whole");
        assert_eq!(other.held(), 0);
        assert_eq!(a.hold(40), Ok(()));
        assert_eq!(a.held(), 100);
        drop(a);
        assert_eq!(*b.used.lock().unwrap(), 0, "given back at the end");
        assert_eq!(other.hold(100), Ok(()));
    }

    #[test]
    fn the_unlimited_account_holds_anything_and_counts_nothing() {
        let a = RequestMemory::unlimited();
        assert_eq!(a.hold(usize::MAX), Ok(()));
        assert_eq!(a.held(), 0);
    }

    #[test]
    fn every_value_marking_byte_is_counted_whatever_the_text_length() {
        let naive = |d: &[u8]| {
            d.iter()
                .filter(|&&b| matches!(b, b',' | b':' | b'[' | b'{'))
                .count()
                * PER_VALUE
        };
        // Runs of markers longer than a counting run (255 bytes), and texts around its edges.
        let mut texts: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"[{},{}]".to_vec(),
            vec![b','; 255],
            vec![b'{'; 256],
            vec![b':'; 1000],
            b"[1,2,3]".repeat(300),
            br#"{"a":"x,y:[z{"}"#.repeat(97),
        ];
        texts.push((0..=255u8).cycle().take(5000).collect());
        for t in &texts {
            assert_eq!(value_overhead(t), naive(t), "{} bytes", t.len());
        }
        assert_eq!(value_overhead(&vec![b','; 255]), 255 * PER_VALUE);
    }

    #[test]
    fn the_estimate_of_database_rows_is_not_below_what_they_cost() {
        // `{"g":1234567}` per row: 14 bytes of text, ~230 bytes as a value (measured: the
        // journal's entry on memory per statement, docs/benchmarks-journal.md).
        let rows: String = (0..1000)
            .map(|i| format!(r#"{{"g":{}}}"#, 1_000_000 + i))
            .collect::<Vec<_>>()
            .join(",");
        let text = format!("[{rows}]");
        let per_row = parsed_size_estimate(text.as_bytes()) / 1000;
        assert!(per_row >= 230, "{per_row} bytes per row");
    }
}
