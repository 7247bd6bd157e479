//! The adaptive concurrency limit of admission control (R2): a gradient control law in the style of
//! Netflix's Gradient2, as a pure struct with an injected clock (every method that needs the time
//! takes `now`), so the law is unit-tested without sleeping.
//!
//! Each `window` the limit is recomputed from the latency samples of the requests that finished in
//! that window:
//!
//! ```text
//! short    = mean latency of the window's samples        (no samples → no change)
//! long     = the baseline: an average of the windows' `short` (plain mean of the first 10 it
//!            learns, then an EMA over `long_window` windows), fed only by windows whose latency
//!            our own concurrency cannot have raised: the first window, windows with
//!            short ≤ long, app-limited windows, windows with the limit at `min`
//! if long / short > 2: long ×= 0.95                     (forget a past baseline quickly)
//! if max in-flight during the window < limit / 2: no change   (app-limited: no evidence)
//! gradient = clamp(tolerance × long / short, 0.5, 1.0)
//! new      = limit + queue_size     if gradient = 1     (queue_size 0 → sqrt(limit))
//!            limit × gradient       otherwise
//! limit    = limit × (1 − smoothing) + new × smoothing, clamped to [min, max_concurrency]
//! ```
//!
//! So one window moves the limit up by at most `smoothing × queue_size` and down by at most
//! `smoothing × 50 %` of it. As in Gradient2, a "sample" of the long average is one window's mean
//! (not one request), so its horizon is `long_window × window` whatever the throughput.
//!
//! Two departures from Gradient2, both so that a sustained overload cannot move the latency of the
//! admitted requests away from the baseline:
//! - Gradient2 feeds every window into the long average. Under an overload that lasts, the long
//!   average then learns the overloaded latency as normal and the limit — and the latency — creep
//!   up for as long as it lasts (+50 % in 20 s with the defaults, measured in the `overload` lab).
//!   Here the baseline only learns upward from windows where the latency cannot be ours: when few
//!   requests ran (app-limited) or the limit is already at `min` (the backend itself got slower:
//!   the baseline follows it there, so a slower backend is not shed for ever).
//! - Gradient2 always adds the headroom, so under overload the limit settles where
//!   `gradient × limit + queue_size = limit`, i.e. latency = `tolerance × long × L / (L − q)`: with
//!   a small limit (a backend that takes 4 requests at once) that is 2–3× the baseline. Here the
//!   headroom is added only while latency is within tolerance; beyond it the limit only shrinks,
//!   so the mean latency of admitted requests settles at ≈ `tolerance × long`.
//!
//! Epochs: samples are **not** discarded when they come from requests admitted under an earlier
//! limit. Envoy discards samples older than its minRTT epoch because it probes minRTT at a pinned
//! low concurrency; Gradient2 has no such probe, and discarding would starve the controller
//! whenever requests last longer than a window (every sample would be "old").

use std::time::{Duration, Instant};

/// Windows plain-averaged before the long RTT becomes an exponential average (Gradient2's
/// `ExpAvgMeasurement(600, 10)`).
const WARMUP: u32 = 10;

/// Latencies are floored at 1 µs so the ratios below are always finite.
const MIN_RTT_S: f64 = 1e-6;

/// Parameters of the control law (from `server.admission.adaptive`, with `max_concurrency`).
#[derive(Debug, Clone)]
pub struct GradientParams {
    /// Limit at start.
    pub initial: usize,
    /// Lowest limit.
    pub min: usize,
    /// Highest limit (`server.admission.max_concurrency`).
    pub max: usize,
    /// How often the limit is recomputed.
    pub window: Duration,
    /// Latency growth tolerated before the limit shrinks (≥ 1).
    pub tolerance: f64,
    /// Weight of a new limit, in (0, 1].
    pub smoothing: f64,
    /// Windows in the long-term latency average.
    pub long_window: u32,
    /// Headroom added each window; 0 means `sqrt(limit)`.
    pub queue_size: usize,
}

impl GradientParams {
    /// Parameters from the config; out-of-range values (rejected by `fanout validate` anyway) are
    /// clamped into range so the law stays well defined.
    pub fn from_config(cfg: &fanout_config::AdaptiveLimit, max_concurrency: usize) -> Self {
        let max = max_concurrency.max(1);
        let min = cfg.min.clamp(1, max);
        GradientParams {
            initial: cfg.initial.clamp(min, max),
            min,
            max,
            window: cfg.window.0.max(Duration::from_millis(1)),
            tolerance: if cfg.tolerance.is_finite() {
                cfg.tolerance.max(1.0)
            } else {
                1.5
            },
            smoothing: if cfg.smoothing.is_finite() {
                cfg.smoothing.clamp(0.01, 1.0)
            } else {
                0.2
            },
            long_window: cfg.long_window.max(1),
            queue_size: cfg.queue_size,
        }
    }
}

/// The long-term latency: a plain mean during warm-up, then an EMA with `α = 2 / (n + 1)`.
#[derive(Debug, Clone)]
struct LongRtt {
    value: f64,
    count: u32,
    warmup: u32,
    alpha: f64,
}

impl LongRtt {
    fn new(long_window: u32) -> Self {
        LongRtt {
            value: 0.0,
            count: 0,
            warmup: WARMUP.min(long_window),
            alpha: 2.0 / (f64::from(long_window) + 1.0),
        }
    }

    fn add(&mut self, x: f64) -> f64 {
        if self.count < self.warmup {
            self.count += 1;
            self.value += (x - self.value) / f64::from(self.count);
        } else {
            self.value += self.alpha * (x - self.value);
        }
        self.value
    }
}

/// A gradient concurrency limit fed with request latencies (see the module docs for the law).
#[derive(Debug, Clone)]
pub struct GradientLimit {
    p: GradientParams,
    /// The limit as a real number; [`GradientLimit::limit`] is its integer part.
    estimated: f64,
    long: LongRtt,
    window_start: Instant,
    sum_s: f64,
    samples: u64,
    max_in_flight: usize,
    last_short_s: Option<f64>,
    updates: u64,
}

impl GradientLimit {
    /// A limit at `p.initial`; its first window starts at `now`.
    pub fn new(p: GradientParams, now: Instant) -> Self {
        GradientLimit {
            estimated: p.initial as f64,
            long: LongRtt::new(p.long_window),
            window_start: now,
            sum_s: 0.0,
            samples: 0,
            max_in_flight: 0,
            last_short_s: None,
            updates: 0,
            p,
        }
    }

    /// The current limit (integer part of the estimate, within `[min, max]`).
    pub fn limit(&self) -> usize {
        (self.estimated.floor() as usize).clamp(self.p.min, self.p.max)
    }

    /// The estimate before rounding (for tests and the status endpoint).
    pub fn estimated(&self) -> f64 {
        self.estimated
    }

    /// The long-term latency average in seconds (0 before the first window with samples).
    pub fn long_rtt_s(&self) -> f64 {
        self.long.value
    }

    /// The mean latency of the last window that had samples, in seconds.
    pub fn short_rtt_s(&self) -> Option<f64> {
        self.last_short_s
    }

    /// Windows that changed the estimate.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The parameters.
    pub fn params(&self) -> &GradientParams {
        &self.p
    }

    /// A request was admitted and `in_flight` requests now run (tracks the window's maximum).
    pub fn on_admit(&mut self, in_flight: usize) {
        self.max_in_flight = self.max_in_flight.max(in_flight);
    }

    /// An admitted request finished after `rtt`.
    pub fn on_sample(&mut self, rtt: Duration) {
        self.sum_s += rtt.as_secs_f64();
        self.samples += 1;
    }

    /// If the window has elapsed at `now`, apply the law to its samples and start a new window
    /// (in which `in_flight` requests already run). Returns whether [`GradientLimit::limit`]
    /// changed.
    pub fn tick(&mut self, now: Instant, in_flight: usize) -> bool {
        if now.saturating_duration_since(self.window_start) < self.p.window {
            return false;
        }
        let before = self.limit();
        if self.samples > 0 {
            let short = self.sum_s / self.samples as f64;
            self.update(short, self.max_in_flight);
        }
        self.window_start = now;
        self.sum_s = 0.0;
        self.samples = 0;
        self.max_in_flight = in_flight;
        self.limit() != before
    }

    /// What a window within tolerance adds: `queue_size`, or `sqrt(limit)` when it is 0.
    fn headroom(&self) -> f64 {
        match self.p.queue_size {
            0 => self.estimated.sqrt(),
            q => q as f64,
        }
    }

    /// The control law for one window: `short_s` is the window's mean latency in seconds,
    /// `max_in_flight` the most requests that ran at once during it.
    pub fn update(&mut self, short_s: f64, max_in_flight: usize) {
        let short = if short_s.is_finite() {
            short_s.max(MIN_RTT_S)
        } else {
            return;
        };
        self.last_short_s = Some(short);
        let app_limited = (max_in_flight as f64) < self.estimated / 2.0;
        let at_min = self.estimated <= self.p.min as f64;
        let learn = self.long.count == 0 || short <= self.long.value || app_limited || at_min;
        let long = if learn {
            self.long.add(short)
        } else {
            self.long.value
        }
        .max(MIN_RTT_S);
        if long / short > 2.0 {
            self.long.value *= 0.95;
        }
        if app_limited {
            return;
        }
        let gradient = (self.p.tolerance * long / short).clamp(0.5, 1.0);
        let new = if gradient >= 1.0 {
            self.estimated + self.headroom()
        } else {
            self.estimated * gradient
        };
        let smoothed = self.estimated * (1.0 - self.p.smoothing) + new * self.p.smoothing;
        let clamped = smoothed.clamp(self.p.min as f64, self.p.max as f64);
        if clamped != self.estimated {
            self.updates += 1;
        }
        self.estimated = clamped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> GradientParams {
        GradientParams::from_config(&fanout_config::AdaptiveLimit::default(), 100)
    }

    const MS: Duration = Duration::from_millis(1);

    /// A fake clock: windows of 100 ms from a fixed origin.
    struct Clock {
        t: Instant,
    }

    impl Clock {
        fn new() -> Self {
            Clock { t: Instant::now() }
        }
        fn advance(&mut self, d: Duration) -> Instant {
            self.t += d;
            self.t
        }
    }

    /// One window with `n` samples of `rtt` and `busy` requests in flight at most.
    fn window(l: &mut GradientLimit, c: &mut Clock, rtt: Duration, n: usize, busy: usize) -> bool {
        l.on_admit(busy);
        for _ in 0..n {
            l.on_sample(rtt);
        }
        let now = c.advance(100 * MS);
        l.tick(now, busy)
    }

    #[test]
    fn grows_while_latency_stays_at_the_long_term_average_and_the_window_is_busy() {
        let mut c = Clock::new();
        let mut l = GradientLimit::new(params(), c.t);
        let mut prev = l.estimated();
        for i in 0..30 {
            let busy = l.limit();
            window(&mut l, &mut c, 10 * MS, 50, busy);
            let now = l.estimated();
            assert!(now > prev, "window {i}: {prev} → {now} should grow");
            // Growth per window is at most smoothing × queue_size (gradient ≤ 1).
            assert!(now - prev <= 0.2 * 4.0 + 1e-9, "window {i}: {prev} → {now}");
            prev = now;
        }
        assert!(l.limit() > 20, "{}", l.limit());
        assert!(l.updates() >= 30);
    }

    #[test]
    fn never_above_max_concurrency() {
        let mut p = params();
        p.max = 25;
        let mut c = Clock::new();
        let mut l = GradientLimit::new(p, c.t);
        for _ in 0..200 {
            let busy = l.limit();
            window(&mut l, &mut c, 5 * MS, 20, busy);
            assert!(l.limit() <= 25 && l.estimated() <= 25.0);
        }
        assert_eq!(l.limit(), 25);
    }

    #[test]
    fn shrinks_at_most_by_half_times_smoothing_per_window_and_never_below_min() {
        let mut c = Clock::new();
        let mut p = params();
        p.initial = 80;
        let mut l = GradientLimit::new(p, c.t);
        // A long history at 10 ms ...
        for _ in 0..20 {
            let busy = l.limit();
            window(&mut l, &mut c, 10 * MS, 50, busy);
        }
        let mut prev = l.estimated();
        // ... then latency ×10.
        let mut shrank = 0;
        // (Not much longer: the long-term average would slowly accept 100 ms as the new normal.)
        for i in 0..60 {
            let busy = l.limit();
            window(&mut l, &mut c, 100 * MS, 50, busy);
            let now = l.estimated();
            assert!(now >= 8.0, "window {i}: below min: {now}");
            assert!(
                now >= prev * (1.0 - 0.2 * 0.5) - 1e-9,
                "window {i}: {prev} → {now} shrank more than 10 %"
            );
            if now < prev {
                shrank += 1;
            }
            prev = now;
        }
        assert!(shrank >= 10, "the limit shrank in only {shrank} windows");
        assert_eq!(l.limit(), 8, "settles at min while latency stays high");
    }

    #[test]
    fn no_samples_no_change() {
        let mut c = Clock::new();
        let mut l = GradientLimit::new(params(), c.t);
        for _ in 0..20 {
            let changed = window(&mut l, &mut c, 10 * MS, 0, 20);
            assert!(!changed);
            assert_eq!(l.estimated(), 20.0);
        }
        assert_eq!(l.updates(), 0);
    }

    #[test]
    fn app_limited_windows_do_not_change_the_limit() {
        let mut c = Clock::new();
        let mut l = GradientLimit::new(params(), c.t);
        // At most 9 in flight with a limit of 20: no evidence either way, low or high latency.
        for rtt in [1, 1, 1, 500, 500, 500] {
            window(&mut l, &mut c, rtt * MS, 50, 9);
            assert_eq!(l.estimated(), 20.0);
        }
    }

    #[test]
    fn no_change_before_the_window_ends() {
        let mut c = Clock::new();
        let mut l = GradientLimit::new(params(), c.t);
        l.on_admit(20);
        for _ in 0..10 {
            l.on_sample(MS);
        }
        assert!(!l.tick(c.advance(99 * MS), 20));
        assert_eq!(l.estimated(), 20.0);
        // The window ends: 20 × 0.8 + (20 + 4) × 0.2 = 20.8 (still limit 20).
        assert!(!l.tick(c.advance(MS), 20));
        assert!((l.estimated() - 20.8).abs() < 1e-9, "{}", l.estimated());
    }

    #[test]
    fn recovers_after_an_overload_ends() {
        let mut c = Clock::new();
        let mut l = GradientLimit::new(params(), c.t);
        for _ in 0..50 {
            let busy = l.limit();
            window(&mut l, &mut c, 10 * MS, 50, busy);
        }
        let before = l.limit();
        for _ in 0..100 {
            let busy = l.limit();
            window(&mut l, &mut c, 200 * MS, 50, busy);
        }
        assert!(l.limit() < before);
        // Latency back to normal: the long average is pulled down (×0.95 while long/short > 2)
        // and the limit grows again.
        let low = l.estimated();
        for _ in 0..100 {
            let busy = l.limit();
            window(&mut l, &mut c, 10 * MS, 50, busy);
        }
        assert!(l.estimated() > low + 10.0, "{low} → {}", l.estimated());
    }

    /// Mean latency of a backend that works on 4 requests at once, 10 ms unloaded, with `limit`
    /// requests in flight: from 7 on, every further request queues 1.5 ms.
    fn saturated(limit: usize) -> Duration {
        Duration::from_micros(10_000 + 1_500 * limit.saturating_sub(7) as u64)
    }

    #[test]
    fn a_sustained_overload_does_not_become_the_baseline() {
        let mut c = Clock::new();
        let mut l = GradientLimit::new(params(), c.t);
        // Normal load: few requests in flight, 10 ms.
        for _ in 0..20 {
            window(&mut l, &mut c, 10 * MS, 50, 3);
        }
        // 60 s of overload: the limit is always full, latency is what the limit lets queue.
        let mut late = Vec::new();
        for i in 0..600 {
            let busy = l.limit();
            let rtt = saturated(busy);
            window(&mut l, &mut c, rtt, 50, busy);
            if i >= 500 {
                late.push(rtt.as_secs_f64());
            }
        }
        // The baseline did not learn the overload…
        assert!(l.long_rtt_s() <= 0.0101, "long {} ms", l.long_rtt_s() * 1e3);
        // …so a minute in, admitted requests still see ≈ tolerance × baseline (15 ms; the limit
        // hovers one request above the point, +1.5 ms), not more.
        let worst = late.iter().copied().fold(0.0, f64::max);
        assert!(worst <= 0.0165, "latency crept to {} ms", worst * 1e3);
    }

    #[test]
    fn a_slower_backend_becomes_the_baseline_once_the_limit_is_at_min() {
        let mut c = Clock::new();
        let mut l = GradientLimit::new(params(), c.t);
        for _ in 0..20 {
            let busy = l.limit();
            window(&mut l, &mut c, 10 * MS, 50, busy);
        }
        // The backend is now 30 ms whatever the concurrency: the limit falls to min, where the
        // baseline learns the new latency…
        let mut reached_min = false;
        for _ in 0..400 {
            let busy = l.limit();
            window(&mut l, &mut c, 30 * MS, 50, busy);
            reached_min |= l.limit() == 8;
        }
        assert!(reached_min);
        assert!(l.long_rtt_s() > 0.020, "long {} ms", l.long_rtt_s() * 1e3);
        // …until 30 ms is within tolerance, and the limit grows again.
        assert!(l.limit() > 8, "limit {}", l.limit());
    }

    #[test]
    fn queue_size_zero_means_sqrt_of_the_limit() {
        let mut p = params();
        p.queue_size = 0;
        p.initial = 64;
        p.smoothing = 1.0;
        let mut l = GradientLimit::new(p, Instant::now());
        l.update(0.010, 64);
        assert!((l.estimated() - 72.0).abs() < 1e-9, "{}", l.estimated());
    }

    #[test]
    fn the_law_on_known_numbers() {
        let mut p = params();
        p.initial = 50;
        let mut l = GradientLimit::new(p, Instant::now());
        // First window: long = short → gradient = min(1.5, 1) = 1 → new = 54 → 50.8.
        l.update(0.010, 50);
        assert!((l.estimated() - 50.8).abs() < 1e-9, "{}", l.estimated());
        // Latency ×4 with 50 in flight: not a window the baseline learns from (long stays 10 ms),
        // gradient = clamp(1.5 × 10 / 40) = 0.5, no headroom while shrinking → new = 25.4.
        l.update(0.040, 50);
        assert!((l.long_rtt_s() - 0.010).abs() < 1e-12, "{}", l.long_rtt_s());
        let new = 50.8 * 0.5;
        let want = 50.8 * 0.8 + new * 0.2;
        assert!(
            (l.estimated() - want).abs() < 1e-9,
            "{} vs {want}",
            l.estimated()
        );
    }

    #[test]
    fn bad_config_values_are_clamped() {
        let cfg = fanout_config::AdaptiveLimit {
            initial: 0,
            min: 0,
            smoothing: f64::NAN,
            tolerance: 0.1,
            long_window: 0,
            ..Default::default()
        };
        let p = GradientParams::from_config(&cfg, 0);
        assert_eq!((p.min, p.initial, p.max), (1, 1, 1));
        assert!(p.smoothing > 0.0 && p.tolerance >= 1.0 && p.long_window >= 1);
        let mut l = GradientLimit::new(p, Instant::now());
        l.update(f64::NAN, 1);
        l.update(0.0, 1);
        assert_eq!(l.limit(), 1);
    }
}
