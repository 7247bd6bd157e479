//! The precise timer (`timer: precise` in a stub config): delays that end within tens of
//! microseconds of their deadline instead of on tokio's next millisecond tick.
//!
//! tokio's timer has 1 ms granularity, so a `latency: 1ms` route answers after 1–2 ms, and
//! *when* in that range depends on the arrival phase — which makes sub-millisecond comparisons
//! (the latency one gateway hop adds) meaningless. Here one thread per process (started on the
//! first precise delay) keeps the deadlines in a heap and sleeps on a condition variable until
//! the earliest one, with its timer slack set to 1 ns (Linux rounds a sleeping thread's timeout
//! up by its slack, 50 µs by default); at each deadline it completes the waiting request's
//! channel. The request's task is woken by tokio as for any other channel.
//!
//! Bounds: only delays up to [`PRECISE_MAX`] use it (longer ones keep tokio's timer, whose
//! granularity is then under 0.1 %), so the heap holds at most the requests that started in the
//! last [`PRECISE_MAX`]; a request that goes away leaves an entry that is dropped at its
//! deadline. The thread is one more thread of the stub process, never of the system under test.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Delays longer than this are slept on tokio's timer.
pub const PRECISE_MAX: Duration = Duration::from_secs(1);

/// Sleep until `deadline`: on the precise timer when `precise` and the delay is at most
/// [`PRECISE_MAX`] (and the timer thread could be started), else on tokio's.
pub async fn sleep_until(deadline: Instant, precise: bool) {
    if precise
        && deadline.saturating_duration_since(Instant::now()) <= PRECISE_MAX
        && let Some(timer) = timer()
    {
        let (tx, rx) = oneshot::channel();
        timer.add(deadline.into_std(), tx);
        // The sender is only dropped by the timer thread after sending, or when the thread is
        // gone (it never returns): either way the delay is over or cannot end, and tokio's
        // timer takes over.
        if rx.await.is_ok() {
            return;
        }
    }
    tokio::time::sleep_until(deadline).await;
}

struct Entry {
    at: std::time::Instant,
    seq: u64,
    done: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    // Reversed: `BinaryHeap` is a max-heap and the earliest deadline must be on top.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

struct Timer {
    state: Mutex<State>,
    wake: Condvar,
}

impl Timer {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic (a heap of entries): take it over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, at: std::time::Instant, done: oneshot::Sender<()>) {
        let mut st = self.lock();
        st.seq = st.seq.wrapping_add(1);
        let seq = st.seq;
        let earliest = st.heap.peek().is_none_or(|top| at < top.at);
        st.heap.push(Entry { at, seq, done });
        drop(st);
        if earliest {
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        set_timer_slack();
        let mut due = Vec::new();
        let mut st = self.lock();
        loop {
            let now = std::time::Instant::now();
            while st.heap.peek().is_some_and(|top| top.at <= now) {
                if let Some(e) = st.heap.pop() {
                    due.push(e.done);
                }
            }
            if !due.is_empty() {
                // Complete them without holding the lock (a send wakes a task).
                drop(st);
                for done in due.drain(..) {
                    // The request may have gone away: nothing to wake then.
                    let _ = done.send(());
                }
                st = self.lock();
                continue;
            }
            st = match st
                .heap
                .peek()
                .map(|top| top.at.saturating_duration_since(now))
            {
                Some(wait) => {
                    self.wake
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.wake.wait(st).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

/// The process's timer, its thread started on first use; `None` if the thread could not be
/// started (then delays use tokio's timer).
fn timer() -> Option<&'static Arc<Timer>> {
    static TIMER: OnceLock<Option<Arc<Timer>>> = OnceLock::new();
    TIMER
        .get_or_init(|| {
            let t = Arc::new(Timer {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
            });
            let run = t.clone();
            match std::thread::Builder::new()
                .name("stub-timer".into())
                .spawn(move || run.run())
            {
                Ok(_) => Some(t),
                Err(e) => {
                    tracing::warn!(
                        "the precise timer's thread did not start ({e}): delays use tokio's timer"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// Linux rounds a sleeping thread's timeout up by its timer slack (50 µs by default): 1 ns here.
#[cfg(target_os = "linux")]
fn set_timer_slack() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer and changes only this thread's slack.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

#[cfg(not(target_os = "linux"))]
fn set_timer_slack() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn precise_delays_end_at_or_after_their_deadline_and_in_order() {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for i in (0..20u64).rev() {
            let at = start + Duration::from_micros(200 * i);
            tasks.push(tokio::spawn(async move {
                sleep_until(at, true).await;
                (i, Instant::now() >= at)
            }));
        }
        for t in tasks {
            let (i, on_time) = t.await.expect("task");
            assert!(on_time, "delay {i} ended before its deadline");
        }
    }

    #[tokio::test]
    async fn a_dropped_delay_does_not_stop_the_others() {
        let now = Instant::now();
        let dropped = tokio::spawn(sleep_until(now + Duration::from_millis(500), true));
        dropped.abort();
        sleep_until(now + Duration::from_millis(2), true).await;
        assert!(Instant::now() >= now + Duration::from_millis(2));
        // Longer than PRECISE_MAX: tokio's timer (paused clocks work there as well).
        assert!(Duration::from_secs(2) > PRECISE_MAX);
    }
}
