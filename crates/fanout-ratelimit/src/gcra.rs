//! GCRA (the generic cell rate algorithm): one theoretical arrival time (TAT) per key, in
//! nanoseconds of the limiter's clock. A request is allowed when the TAT it would leave is at
//! most `burst` emission intervals ahead of now; each allowed request moves the TAT one interval
//! on. `burst` requests may arrive at once, then one per interval.

use std::time::Duration;

/// A rate and a burst as GCRA's emission interval and tolerance (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Nanoseconds between requests at the sustained rate (at least 1).
    interval: u64,
    /// The burst: requests that may arrive at once.
    burst: u64,
}

/// What one decision says, for the answer's headers and for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is within the limit.
    pub allowed: bool,
    /// Requests that could still arrive at once after this one.
    pub remaining: u64,
    /// Time until the budget is whole again (the bucket empty).
    pub reset: Duration,
    /// When refused: time until a request would be allowed.
    pub retry_after: Duration,
}

impl Gcra {
    /// `per_second` requests per second (positive) with bursts of `burst` (at least 1).
    pub fn new(per_second: f64, burst: u64) -> Gcra {
        let interval = (1e9 / per_second.max(1e-9)).round();
        let interval = if interval.is_finite() && interval >= 1.0 {
            interval.min(u64::MAX as f64 / 4.0) as u64
        } else {
            1
        };
        Gcra {
            interval,
            burst: burst.max(1),
        }
    }

    /// This rate and burst times `share` (in (0, 1]): what one instance of a fleet enforces
    /// alone. The burst is rounded up, to at least 1.
    pub fn scaled(&self, share: f64) -> Gcra {
        let share = if share > 0.0 && share <= 1.0 {
            share
        } else {
            1.0
        };
        let interval = ((self.interval as f64) / share).round() as u64;
        Gcra {
            interval: interval.max(1),
            burst: ((self.burst as f64 * share).ceil() as u64).max(1),
        }
    }

    /// Nanoseconds between requests at the sustained rate.
    pub fn interval_ns(&self) -> u64 {
        self.interval
    }

    /// The burst.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The tolerance: how far ahead of now the TAT may be after an allowed request.
    pub fn tolerance_ns(&self) -> u64 {
        self.interval.saturating_mul(self.burst)
    }

    /// The time the whole burst takes to refill (the `w` of `RateLimit-Policy`).
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.tolerance_ns())
    }

    /// Reserve a slot for a request at `now` that may wait up to `max_wait`: the new TAT and
    /// how long to wait before going (zero when within the burst), or `Err` with the wait it
    /// would have needed when that is longer than `max_wait` (nothing reserved).
    pub fn reserve(&self, tat: u64, now: u64, max_wait: u64) -> Result<(u64, u64), u64> {
        let tat = tat.max(now);
        let new_tat = tat.saturating_add(self.interval);
        let wait = (new_tat - now).saturating_sub(self.tolerance_ns());
        if wait > max_wait {
            return Err(wait);
        }
        Ok((new_tat, wait))
    }

    /// Decide a request that costs `n` units (at least 1; `decide` is `n` = 1) at `now`: the
    /// TAT moves `n` intervals on when it is allowed. A cost above the burst is never allowed.
    pub fn decide_n(&self, tat: u64, now: u64, n: u64) -> (Option<u64>, Decision) {
        let tat = tat.max(now);
        let new_tat = tat.saturating_add(self.interval.saturating_mul(n.max(1)));
        let ahead = new_tat - now;
        let tolerance = self.tolerance_ns();
        if ahead > tolerance {
            let spare = tolerance.saturating_sub(tat - now);
            return (
                None,
                Decision {
                    allowed: false,
                    remaining: spare / self.interval,
                    reset: Duration::from_nanos(tat - now),
                    retry_after: Duration::from_nanos(ahead - tolerance),
                },
            );
        }
        (
            Some(new_tat),
            Decision {
                allowed: true,
                remaining: (tolerance - ahead) / self.interval,
                reset: Duration::from_nanos(ahead),
                retry_after: Duration::ZERO,
            },
        )
    }

    /// Decide a request at `now` for a key whose TAT is `tat` (0 or past: a full budget).
    /// Returns the new TAT when the request is allowed (the caller stores it).
    pub fn decide(&self, tat: u64, now: u64) -> (Option<u64>, Decision) {
        self.decide_n(tat, now, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// Allowed requests of `n` sent at `now`, with the TAT carried.
    fn run(g: &Gcra, tat: &mut u64, now: u64, n: u64) -> u64 {
        let mut ok = 0;
        for _ in 0..n {
            let (t, d) = g.decide(*tat, now);
            if let Some(t) = t {
                *tat = t;
                ok += 1;
            }
            assert_eq!(d.allowed, t.is_some());
        }
        ok
    }

    #[test]
    fn a_burst_passes_at_once_then_one_per_interval() {
        let g = Gcra::new(10.0, 5);
        let mut tat = 0;
        assert_eq!(run(&g, &mut tat, S, 20), 5);
        let (_, d) = g.decide(tat, S);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(100));
        assert_eq!(d.remaining, 0);
        // 100 ms later: exactly one more
        assert_eq!(run(&g, &mut tat, S + S / 10, 3), 1);
        // after the whole window the burst is back
        assert_eq!(run(&g, &mut tat, 3 * S, 10), 5);
    }

    #[test]
    fn the_sustained_rate_is_the_configured_one() {
        let g = Gcra::new(100.0, 10);
        let mut tat = 0;
        let mut ok = 0;
        // 1000 requests/s offered for 10 s, in 1 ms steps
        for ms in 1..=10_000u64 {
            ok += run(&g, &mut tat, ms * 1_000_000, 1);
        }
        // 100/s for 10 s, plus the burst
        assert!((1000..=1010).contains(&ok), "{ok}");
    }

    #[test]
    fn remaining_and_reset_count_down() {
        let g = Gcra::new(1.0, 3);
        let (t, d) = g.decide(0, S);
        assert_eq!((d.remaining, d.reset), (2, Duration::from_secs(1)));
        let (_, d) = g.decide(t.unwrap(), S);
        assert_eq!((d.remaining, d.reset), (1, Duration::from_secs(2)));
    }

    #[test]
    fn a_reservation_waits_within_its_limit_or_is_refused() {
        let g = Gcra::new(10.0, 1);
        let (tat, wait) = g.reserve(0, S, 0).unwrap();
        assert_eq!(wait, 0);
        // the next slot is 100 ms away: refused with 50 ms, reserved with 100 ms
        assert_eq!(g.reserve(tat, S, S / 20), Err(S / 10));
        let (tat2, wait) = g.reserve(tat, S, S / 10).unwrap();
        assert_eq!((tat2, wait), (tat + S / 10, S / 10));
    }

    #[test]
    fn a_share_scales_rate_and_burst() {
        let g = Gcra::new(100.0, 20).scaled(0.5);
        assert_eq!(g.burst(), 10);
        assert_eq!(g.interval_ns(), 20_000_000);
        assert_eq!(Gcra::new(1.0, 1).scaled(0.1).burst(), 1);
    }

    #[test]
    fn a_cost_of_n_spends_n_units_of_the_burst() {
        // 1 unit per second, 25 at once: 21 fit, then 4 remain; a cost of 5 waits 1s.
        let g = Gcra::new(1.0, 25);
        let (t, d) = g.decide_n(0, S, 21);
        assert!(d.allowed);
        assert_eq!(d.remaining, 4);
        let tat = t.unwrap();
        let (t2, d) = g.decide_n(tat, S, 5);
        assert!(!d.allowed && t2.is_none());
        assert_eq!(d.retry_after, Duration::from_secs(1));
        let (_, d) = g.decide_n(tat, S, 4);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        // More than the burst never fits.
        assert!(!g.decide_n(0, S, 26).1.allowed);
    }
}
