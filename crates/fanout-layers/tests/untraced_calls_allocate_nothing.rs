//! A call whose attempts are only counted (the live page on, tracing off — every request of a
//! default config) allocates nothing for it: its trace context is inline in the call, cloned
//! per attempt with an `Arc` clone, and each attempt is a count under a lock. Counted with a
//! global allocator that counts this thread's allocations.

use fanout_layers::backend::{Call, CallRequest, SqlCall};
use fanout_layers::trace::{AttemptCounts, CallTrace};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to `System` unchanged; the count is a thread-local cell with
// a const initialiser (no allocation, no destructor).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract is `System::realloc`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn a_counted_untraced_call_allocates_nothing_per_call_or_attempt() {
    // The counter counts.
    let at = allocations();
    let boxed = std::hint::black_box(Box::new(7u64));
    assert_eq!(allocations(), at + 1, "{boxed}");
    let counts = Arc::new(AttemptCounts::default());
    let req = CallRequest::new(Call::Sql(SqlCall {
        statement: Arc::from("SELECT 1"),
        params: Default::default(),
        read_only: true,
        rows_only: true,
        single_row: true,
        max_depth: 64,
    }));
    // Warm: the first count of each step index sizes the inline list once.
    let mut warm = CallTrace::new(3);
    warm.counter = Some(counts.clone());
    let _ = warm.sent(|| "unused");
    let before = allocations();
    for _ in 0..100 {
        // What the executor does per call, the retry and hedge layers per attempt, and the
        // protocol client at each attempt sent.
        let mut trace = CallTrace::new(3);
        trace.counter = Some(counts.clone());
        let mut call = req.clone();
        call.trace = Some(trace);
        for attempt in 1..=3u16 {
            let mut r = call.clone();
            if let Some(t) = &mut r.trace {
                t.attempt = attempt;
                t.hedge = attempt == 3;
                assert!(t.sent(|| "unused").is_none(), "no tracer: no span");
            }
        }
    }
    let spent = allocations() - before;
    assert_eq!(spent, 0, "allocations for 100 counted calls of 3 attempts");
    let s = counts.step(3);
    assert_eq!((s.attempts, s.retries, s.hedges), (301, 200, 100));
}
