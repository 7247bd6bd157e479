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

/// [`CORE`]'s value on a thread that is no core's and not the control thread.
const NONE: usize = usize::MAX;
/// [`CORE`]'s value on the control thread of a per-core process ([`enter_control`]).
const CONTROL: usize = usize::MAX - 1;

/// Mark this thread as the control thread of a per-core process (`fanout serve` with
/// `server.runtime: per_core`: the admin listener, reloads, reference loads, probes and
/// reconnects run there). It has no shard ([`shard`] is `None`), so what it connects is never
/// kept for a core — a core's call on it would wake this thread.
pub fn enter_control() {
    CORE.with(|c| c.set(CONTROL));
}

thread_local! {
    static CORE: Cell<usize> = const { Cell::new(NONE) };
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
    (c != NONE && c != CONTROL).then_some(c)
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

/// This thread's shard of a structure with `n` shards: its core's index modulo `n`; `None` on
/// the control thread of a per-core process; 0 on any other thread (the work-stealing runtime's
/// workers, tests).
pub fn shard(n: usize) -> Option<usize> {
    match CORE.with(Cell::get) {
        CONTROL => None,
        NONE => Some(0),
        c if n > 0 => Some(c % n),
        _ => Some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_thread_has_its_shard_and_others_share_shard_0() {
        assert_eq!(current(), None);
        assert_eq!(shard(4), Some(0));
        std::thread::spawn(|| {
            enter(5);
            assert_eq!(current(), Some(5));
            assert_eq!(shard(4), Some(1));
            assert_eq!(shard(8), Some(5));
            assert_eq!(shard(0), Some(0));
        })
        .join()
        .unwrap();
        std::thread::spawn(|| {
            enter_control();
            assert_eq!(current(), None);
            assert_eq!(shard(4), None);
        })
        .join()
        .unwrap();
        assert!((1..=MAX_SHARDS).contains(&shard_count()));
    }
}
