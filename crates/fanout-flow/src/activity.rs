//! Which route and step a worker thread is busy with (R1 watchdog): every poll of a request's flow
//! is timed; a poll that held the worker longer than the threshold is counted and logged with the
//! route and the step that was running, so a blocking transform is found by name.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// No step: the executor itself (scheduling, the response).
pub(crate) const NONE: usize = usize::MAX;
/// Building the response.
pub(crate) const RESPOND: usize = usize::MAX - 1;

thread_local! {
    static STEP: Cell<usize> = const { Cell::new(NONE) };
}

static THRESHOLD_US: AtomicU64 = AtomicU64::new(100_000);
static STALLS: AtomicU64 = AtomicU64::new(0);
static MAX_STALL_US: AtomicU64 = AtomicU64::new(0);

/// Mark the step the current thread evaluates (index into the route's steps).
pub(crate) fn enter(step: usize) {
    STEP.set(step);
}

/// Set the stall threshold (default 100 ms).
pub fn set_threshold(d: Duration) {
    THRESHOLD_US.store(d.as_micros().max(1) as u64, Relaxed);
}

/// Polls of a flow that held a worker longer than the threshold, since start.
pub fn stalls() -> u64 {
    STALLS.load(Relaxed)
}

/// The longest such poll, ms.
pub fn max_stall_ms() -> f64 {
    MAX_STALL_US.load(Relaxed) as f64 / 1000.0
}

/// Thresholds from which polls are timed on the kernel's coarse clock: its resolution is one
/// scheduler tick (1–10 ms), and reading it costs a few nanoseconds instead of a time-stamp
/// counter read — twice per poll of every request.
const COARSE_ENOUGH_US: u64 = 50_000;

/// Nanoseconds on the kernel's monotonic clock (`CLOCK_MONOTONIC`, the clock of
/// `std::time::Instant` on Linux), or its coarse variant when `coarse`; `None` where the clock
/// cannot be read directly (not Linux). One vDSO call: cheaper than `Instant::now` and the
/// `Duration` arithmetic around it, for the hot paths that only need a number.
pub fn monotonic_ns(coarse: bool) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let clock = if coarse {
            libc::CLOCK_MONOTONIC_COARSE
        } else {
            libc::CLOCK_MONOTONIC
        };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
        if unsafe { libc::clock_gettime(clock, &mut ts) } == 0 {
            return Some((ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64);
        }
    }
    let _ = coarse;
    None
}

/// Microseconds on the monotonic clock, the coarse one when `coarse` (Linux; elsewhere always
/// the precise one).
fn now_us(coarse: bool) -> u64 {
    if let Some(ns) = monotonic_ns(coarse) {
        return ns / 1_000;
    }
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Time one poll of route `route`'s flow; `step_name` names a step index.
pub(crate) fn poll_timed<T>(
    route: &str,
    step_name: impl Fn(usize) -> Option<String>,
    poll: impl FnOnce() -> T,
) -> T {
    STEP.set(NONE);
    let threshold = THRESHOLD_US.load(Relaxed);
    let coarse = threshold >= COARSE_ENOUGH_US;
    let t = now_us(coarse);
    let out = poll();
    let us = now_us(coarse).saturating_sub(t);
    if us > threshold {
        STALLS.fetch_add(1, Relaxed);
        MAX_STALL_US.fetch_max(us, Relaxed);
        let step = match STEP.get() {
            NONE => "(scheduling)".to_string(),
            RESPOND => "(respond)".to_string(),
            i => step_name(i).unwrap_or_else(|| format!("#{i}")),
        };
        tracing::warn!(
            route,
            step = step.as_str(),
            held_ms = us / 1000,
            "route {route}, step {step}: held a worker thread for {} ms without yielding; move heavy transforms to the compute pool (`compute: true`)",
            us / 1000
        );
    }
    STEP.set(NONE);
    out
}
