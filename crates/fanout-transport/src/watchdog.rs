//! The stall watchdog (R1): a heartbeat task that should wake every tick (a quarter of the
//! threshold, 10–250 ms: [`tick_for`]); when it wakes late by
//! more than the threshold, either some worker held the runtime without yielding (blocking I/O,
//! heavy CPU on a worker) — a *stall*, logged and counted, because every request on that worker
//! waited too — or the whole process got no CPU (a busy host, a container's CPU limit, a paused
//! VM) — *CPU starvation*, which no change to the gateway fixes and which must not be reported as
//! a blocking worker.
//!
//! # Telling the two apart
//!
//! The CPU time the process used over the gap does not separate them: a worker blocked in a
//! syscall (`std::thread::sleep`, blocking file I/O, a synchronous DNS lookup — the classic
//! stall) uses no CPU either, exactly like a process that gets none. What separates them is
//! whether the process *wanted* CPU and did not get it. A **canary** measures that: a plain OS
//! thread outside the runtime that sleeps in tick steps and adds up how late it wakes. It
//! competes for the CPU like every other thread of the process, so when the process is starved
//! the canary is late as well; when a worker blocks, the canary — on its own thread, needing a
//! few microseconds per tick — wakes on time (even on one core: the scheduler runs a thread
//! that just woke from sleep promptly).
//!
//! On a late heartbeat the canary's delay over the same window is the lateness it reported in
//! the window plus how overdue it is right now (when the process resumes, either thread may run
//! first). If the canary was delayed for at least half of the heartbeat's lateness, the event is
//! starvation ([`classify`]); otherwise a stall. Without a canary (its thread could not be
//! started), every late wake counts as a stall, as before.
//!
//! Cost: per tick, the heartbeat reads two atomics; the canary wakes once a tick (40 times a second at the default threshold) and does
//! two atomic writes. Nothing reads `/proc`. One limit: a worker starved while the canary runs
//! (workers pinned to CPUs the canary is not pinned to) still reads as a stall.
//!
//! # Logging
//!
//! At most one line per kind per [`LOG_EVERY`]; the next line says how many events of its kind
//! were not logged since the previous one, and the longest of them. The counters count every
//! event.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// The shortest tick (the heartbeat's and the canary's period).
const TICK: Duration = Duration::from_millis(10);
/// The longest tick.
const MAX_TICK: Duration = Duration::from_millis(250);

/// The tick for a threshold: a quarter of it, from [`TICK`] to [`MAX_TICK`]. A stall longer than
/// the threshold plus one tick is always seen (the heartbeat's lateness is the stall minus what
/// was left of its sleep when the stall began); every tick wakes an idle core's thread, so the
/// default 100 ms threshold costs 40 wake-ups a second per runtime, not 100.
fn tick_for(threshold: Duration) -> Duration {
    (threshold / 4).clamp(TICK, MAX_TICK)
}
/// At most one log line per kind of event in this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Stall and starvation counters.
#[derive(Debug, Default)]
pub struct Watchdog {
    stalls: AtomicU64,
    max_stall_us: AtomicU64,
    starvations: AtomicU64,
    max_starvation_us: AtomicU64,
    /// The canary and the threshold, for heartbeats on further runtimes ([`Watchdog::watch`]).
    beat: std::sync::OnceLock<(Option<Canary>, Duration)>,
}

/// What a late heartbeat means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// A worker held the runtime: blocking work on a worker.
    Stall,
    /// The process got no CPU: the canary outside the runtime was late too.
    Starvation,
}

/// Classify a heartbeat that woke `late`, when the canary thread was delayed by `canary` over
/// the same window (`None`: no canary). `None` when `late` is within `threshold`.
pub fn classify(late: Duration, canary: Option<Duration>, threshold: Duration) -> Option<Late> {
    if late <= threshold {
        return None;
    }
    match canary {
        Some(c) if c.saturating_mul(2) >= late => Some(Late::Starvation),
        _ => Some(Late::Stall),
    }
}

impl Watchdog {
    /// Start watching the current runtime; a wake-up later than `threshold` counts as a stall, or
    /// as CPU starvation when the canary thread was late too (see the module doc).
    pub fn spawn(threshold: Duration) -> Arc<Watchdog> {
        let w = Arc::new(Watchdog::default());
        let canary = Canary::start(Arc::downgrade(&w), tick_for(threshold));
        let _ = w.beat.set((canary.clone(), threshold));
        tokio::spawn(heartbeat(Arc::downgrade(&w), canary, threshold));
        w
    }

    /// Watch a serving core's runtime too (`server.runtime: per_core`, core `core` of `cores`):
    /// a heartbeat of its own there, sharing the counters and the canary. It beats while the
    /// core serves a connection or runs a stream, and sleeps without a timer while the core has
    /// neither (nothing runs there to stall), so an idle core's thread is not woken.
    pub fn watch_core(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        cores: Arc<crate::cores::Cores>,
        core: usize,
    ) {
        if let Some((canary, threshold)) = self.beat.get() {
            runtime.spawn(heartbeat_gated(
                Arc::downgrade(self),
                canary.clone(),
                *threshold,
                Some((cores, core)),
            ));
        }
    }

    /// Stalls seen so far: late heartbeats while the process had CPU (a worker did not yield).
    pub fn stalls(&self) -> u64 {
        self.stalls.load(Relaxed)
    }

    /// The longest stall, ms.
    pub fn max_stall_ms(&self) -> f64 {
        self.max_stall_us.load(Relaxed) as f64 / 1000.0
    }

    /// Late heartbeats because the process got no CPU (not counted as stalls).
    pub fn starvations(&self) -> u64 {
        self.starvations.load(Relaxed)
    }

    /// The longest CPU starvation, ms.
    pub fn max_starvation_ms(&self) -> f64 {
        self.max_starvation_us.load(Relaxed) as f64 / 1000.0
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// " (N more since the last report, the longest M ms)" or nothing.
fn suppressed_note(s: &Suppressed) -> String {
    if s.count == 0 {
        return String::new();
    }
    format!(
        " ({} more since the last report, the longest {} ms)",
        s.count,
        ms(s.max)
    )
}

fn log_stall(late: Duration, s: &Suppressed) {
    tracing::warn!(
        stalled_ms = ms(late),
        not_logged = s.count,
        "a worker thread did not yield for {} ms (the runtime's heartbeat woke {} ms late while a \
         thread outside the runtime ran on time): blocking work on a worker delays every request \
         on it{}",
        ms(late),
        ms(late),
        suppressed_note(s)
    );
}

fn log_starvation(late: Duration, canary: Duration, s: &Suppressed) {
    tracing::warn!(
        starved_ms = ms(late),
        canary_late_ms = ms(canary),
        not_logged = s.count,
        "the process got no CPU for about {} ms: the runtime's heartbeat woke {} ms late and a \
         thread outside the runtime was {} ms late too; the host (or the container's CPU limit) \
         is starving the gateway of CPU, not a blocking worker{}",
        ms(late),
        ms(late),
        ms(canary),
        suppressed_note(s)
    );
}

/// Events of one kind not logged since the last line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Suppressed {
    /// How many.
    pub count: u64,
    /// The longest lateness among them.
    pub max: Duration,
}

/// At most one log line per `every`; counts what it holds back.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
    held: Suppressed,
}

impl Throttle {
    pub(crate) fn new(every: Duration) -> Self {
        Throttle {
            every,
            last: None,
            held: Suppressed::default(),
        }
    }

    /// An event at `now`: `Some(what was held back since the last line)` when it is to be
    /// logged, `None` when it is held back.
    pub(crate) fn admit(&mut self, now: Instant, late: Duration) -> Option<Suppressed> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.held.count += 1;
                self.held.max = self.held.max.max(late);
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

/// A heartbeat on the runtime it runs on: wakes every tick ([`tick_for`] the threshold),
/// classifies a late wake-up.
async fn heartbeat(weak: Weak<Watchdog>, canary: Option<Canary>, threshold: Duration) {
    heartbeat_gated(weak, canary, threshold, None).await
}

/// [`heartbeat`], which with `gate` (a serving core) beats only while that core is busy.
async fn heartbeat_gated(
    weak: Weak<Watchdog>,
    canary: Option<Canary>,
    threshold: Duration,
    gate: Option<(Arc<crate::cores::Cores>, usize)>,
) {
    let mut stall_log = Throttle::new(LOG_EVERY);
    let mut starvation_log = Throttle::new(LOG_EVERY);
    let tick = tick_for(threshold);
    let mut expected = Instant::now() + tick;
    let mut canary_base = canary.as_ref().map(|c| c.late_total_us());
    loop {
        if let Some((cores, core)) = &gate
            && cores.idle(*core)
        {
            cores.until_busy(*core).await;
            if weak.strong_count() == 0 {
                return;
            }
            // Time spent idle is not lateness: the next beat is a tick from now.
            expected = Instant::now() + tick;
            canary_base = canary.as_ref().map(|c| c.late_total_us());
            continue;
        }
        tokio::time::sleep_until(expected).await;
        let now = Instant::now();
        let late = now.saturating_duration_since(expected);
        let Some(w) = weak.upgrade() else { return };
        let canary_late = match (&canary, canary_base) {
            (Some(c), Some(base)) => Some(c.delay_since(base)),
            _ => None,
        };
        match classify(late, canary_late, threshold) {
            Some(Late::Stall) => {
                w.stalls.fetch_add(1, Relaxed);
                w.max_stall_us.fetch_max(late.as_micros() as u64, Relaxed);
                if let Some(s) = stall_log.admit(now, late) {
                    log_stall(late, &s);
                }
            }
            Some(Late::Starvation) => {
                w.starvations.fetch_add(1, Relaxed);
                w.max_starvation_us
                    .fetch_max(late.as_micros() as u64, Relaxed);
                if let Some(s) = starvation_log.admit(now, late) {
                    log_starvation(late, canary_late.unwrap_or_default(), &s);
                }
            }
            None => {}
        }
        canary_base = canary.as_ref().map(|c| c.late_total_us());
        expected = now + tick;
    }
}

/// The canary: a plain thread that sleeps in ticks and adds up how late it wakes.
#[derive(Clone, Debug)]
struct Canary {
    state: Arc<CanaryState>,
}

#[derive(Debug)]
struct CanaryState {
    /// Real time origin of `due_us`.
    origin: std::time::Instant,
    /// Sum of the canary's wake-up delays, µs.
    late_total_us: AtomicU64,
    /// When the canary is next due to wake, µs since `origin`.
    due_us: AtomicU64,
}

impl Canary {
    /// Start the canary thread; it ends when `watchdog` is dropped. `None` if no thread could be
    /// started.
    fn start(watchdog: Weak<Watchdog>, tick: Duration) -> Option<Canary> {
        let origin = std::time::Instant::now();
        let state = Arc::new(CanaryState {
            origin,
            late_total_us: AtomicU64::new(0),
            due_us: AtomicU64::new(micros(tick)),
        });
        let s = state.clone();
        let started = std::thread::Builder::new()
            .name("fanout-canary".into())
            .spawn(move || {
                let mut due = origin + tick;
                while watchdog.strong_count() > 0 {
                    let now = std::time::Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let woke = std::time::Instant::now();
                    s.late_total_us
                        .fetch_add(micros(woke.saturating_duration_since(due)), Relaxed);
                    due = woke + tick;
                    s.due_us
                        .store(micros(due.saturating_duration_since(origin)), Relaxed);
                }
            });
        match started {
            Ok(_) => Some(Canary { state }),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "could not start the watchdog's canary thread: every late heartbeat counts as a stall"
                );
                None
            }
        }
    }

    /// The canary's accumulated lateness, µs (a base for [`Canary::delay_since`]).
    fn late_total_us(&self) -> u64 {
        self.state.late_total_us.load(Relaxed)
    }

    /// How much the canary was delayed since its total was `base`, including how overdue it is
    /// now.
    fn delay_since(&self, base: u64) -> Duration {
        let now_us = micros(self.state.origin.elapsed());
        canary_delay(
            base,
            self.state.late_total_us.load(Relaxed),
            self.state.due_us.load(Relaxed),
            now_us,
        )
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The canary's delay over a window: the lateness it reported since `base` (its total was `base`
/// when the window began, `total` now), plus how far past its due time `due_us` it is at `now_us`
/// (a starved canary may not have run yet).
fn canary_delay(base: u64, total: u64, due_us: u64, now_us: u64) -> Duration {
    let reported = total.saturating_sub(base);
    let overdue = now_us.saturating_sub(due_us);
    Duration::from_micros(reported.saturating_add(overdue))
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
        assert_eq!(w.starvations(), 0, "the canary thread ran on time");
        assert!(w.max_stall_ms() >= 90.0, "{}", w.max_stall_ms());
    }

    #[test]
    fn late_heartbeats_are_classified_by_the_canary() {
        let ms = Duration::from_millis;
        let t = ms(100);
        // on time, or late within the threshold: nothing
        assert_eq!(classify(ms(0), Some(ms(0)), t), None);
        assert_eq!(classify(ms(100), Some(ms(100)), t), None);
        // the canary ran on time: a worker held the runtime
        assert_eq!(classify(ms(134), Some(ms(1)), t), Some(Late::Stall));
        assert_eq!(classify(ms(134), Some(ms(66)), t), Some(Late::Stall));
        // the canary was late too: the process got no CPU
        assert_eq!(classify(ms(134), Some(ms(67)), t), Some(Late::Starvation));
        assert_eq!(classify(ms(134), Some(ms(130)), t), Some(Late::Starvation));
        assert_eq!(classify(ms(134), Some(ms(500)), t), Some(Late::Starvation));
        // no canary: every late wake is a stall
        assert_eq!(classify(ms(134), None, t), Some(Late::Stall));
    }

    #[test]
    fn canary_delay_counts_reported_and_pending_lateness() {
        let us = Duration::from_micros;
        // woke on time all along, next due in the future
        assert_eq!(canary_delay(500, 520, 10_000, 9_000), us(20));
        // reported 130 ms of lateness in the window
        assert_eq!(canary_delay(500, 130_500, 10_000, 9_000), us(130_000));
        // has not run yet: 120 ms overdue
        assert_eq!(canary_delay(500, 500, 10_000, 130_000), us(120_000));
        // counters never go backwards, but stay sane if they did
        assert_eq!(canary_delay(600, 500, 10_000, 0), us(0));
    }

    #[tokio::test(start_paused = true)]
    async fn log_lines_are_throttled_and_count_what_they_held_back() {
        let ms = Duration::from_millis;
        let mut t = Throttle::new(LOG_EVERY);
        let none = Suppressed::default();
        assert_eq!(
            t.admit(Instant::now(), ms(134)),
            Some(none),
            "first: logged"
        );
        for late in [ms(120), ms(300), ms(150)] {
            tokio::time::advance(ms(1000)).await;
            assert_eq!(t.admit(Instant::now(), late), None, "held back");
        }
        tokio::time::advance(LOG_EVERY).await;
        assert_eq!(
            t.admit(Instant::now(), ms(110)),
            Some(Suppressed {
                count: 3,
                max: ms(300)
            }),
            "the next line counts the three held back"
        );
        tokio::time::advance(ms(1)).await;
        assert_eq!(t.admit(Instant::now(), ms(110)), None);
        tokio::time::advance(LOG_EVERY).await;
        assert_eq!(
            t.admit(Instant::now(), ms(110)),
            Some(Suppressed {
                count: 1,
                max: ms(110)
            })
        );
        tokio::time::advance(LOG_EVERY * 3).await;
        assert_eq!(t.admit(Instant::now(), ms(110)), Some(none), "nothing held");
    }

    #[test]
    fn the_note_names_what_was_held_back() {
        assert_eq!(suppressed_note(&Suppressed::default()), "");
        assert_eq!(
            suppressed_note(&Suppressed {
                count: 4,
                max: Duration::from_millis(250)
            }),
            " (4 more since the last report, the longest 250 ms)"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_canary_ends_with_the_watchdog() {
        let w = Arc::new(Watchdog::default());
        let c = Canary::start(Arc::downgrade(&w), TICK).expect("canary thread");
        let weak_state = Arc::downgrade(&c.state);
        drop(c);
        drop(w);
        // the thread holds the state until it sees the watchdog gone (within a tick)
        let give_up = std::time::Instant::now() + Duration::from_secs(30);
        while weak_state.strong_count() > 0 {
            assert!(
                std::time::Instant::now() < give_up,
                "the canary thread still runs"
            );
            tokio::time::sleep(TICK).await;
        }
    }
}
