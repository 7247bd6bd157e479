//! Which core a thread serves (`server.runtime: per_core`).
//!
//! With one current-thread runtime per core, each serving thread marks itself with its core's
//! index ([`enter`]) before it runs anything. State that is cheaper kept per core than shared
//! — the idle connections of an HTTP/1 backend pool, whose connection tasks live on the runtime
//! that made them — is sharded by [`shard`]: a core's requests take and give back connections of
//! its own shard only, so a call never wakes another core's thread. Threads that are not a
//! core's (the work-stealing runtime's workers, the control thread, tests) all use shard 0, which
//! is the shared pool of the work-stealing runtime.

use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    static CORE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The most shards any per-core structure has (a machine with more cores shares shards).
pub const MAX_SHARDS: usize = 64;

/// Mark this thread as serving core `index` (its runtime's only thread).
pub fn enter(index: usize) {
    CORE.with(|c| c.set(index));
}

/// The core this thread serves, when it is a core's thread.
pub fn current() -> Option<usize> {
    let c = CORE.with(Cell::get);
    (c != usize::MAX).then_some(c)
}

/// How many shards a per-core structure keeps: the machine's cores (its available
/// parallelism), at least 1 and at most [`MAX_SHARDS`]. Fixed for the process.
pub fn shard_count() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_SHARDS)
    })
}

/// This thread's shard of a structure with `n` shards: its core's index modulo `n`, 0 on a
/// thread that is not a core's.
pub fn shard(n: usize) -> usize {
    match current() {
        Some(c) if n > 0 => c % n,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_thread_has_its_shard_and_others_share_shard_0() {
        assert_eq!(current(), None);
        assert_eq!(shard(4), 0);
        std::thread::spawn(|| {
            enter(5);
            assert_eq!(current(), Some(5));
            assert_eq!(shard(4), 1);
            assert_eq!(shard(8), 5);
            assert_eq!(shard(0), 0);
        })
        .join()
        .unwrap();
        assert!((1..=MAX_SHARDS).contains(&shard_count()));
    }
}
