//! Address choice for a backend with several `urls` (R3): power-of-two-choices over a peak-EWMA
//! latency (Finagle/Linkerd) or round robin, and outlier ejection of addresses that keep failing
//! (Envoy's consecutive-5xx, Finagle's failure accrual with one probe).
//!
//! Everything here is a plain state machine, [`BalanceState`], with time passed in (`now`), so
//! it is unit-tested with a synthetic clock; `HttpBackend` keeps one behind a mutex, picks an
//! address per call ([`BalanceState::pick`]) and reports how the call ended
//! ([`BalanceState::record`]).
//!
//! - **Cost** of an address: its peak-EWMA latency × (calls in flight + 1). A sample above the
//!   current estimate replaces it at once (peak); otherwise it is averaged in with weight
//!   `α = 1 − exp(−Δt/decay)`; between samples the estimate decays as `exp(−Δt/decay)`. An
//!   address without samples costs `default_rtt`; its first sample replaces that.
//! - **Failures** (5xx, connect error, reset, timeout) are recorded as a *penalty latency*,
//!   `max(rtt, min(max(2 × estimate, default_rtt), max(timeout, default_rtt)))`, where `estimate`
//!   is the stored (decay-free) value: each failure in a row doubles the address's cost up to
//!   the call timeout, so a replica answering fast 503s loses P2C comparisons instead of
//!   looking fast.
//! - **Cancelled** calls (a hedge loser, a client gone) only raise the estimate: their elapsed
//!   time is a lower bound of the latency, recorded if above the current estimate.
//! - **Ejection**: `consecutive_failures` failures in a row eject the address for
//!   `base_ejection × times ejected`, capped at `max_ejection`, unless that would take out more
//!   than `max_ejected_percent` of the addresses (at least one may always be out while another
//!   remains; the last eligible address is never ejected). When the time is over the address is
//!   on *probation*: the next call goes to it as the one probe (no other call does meanwhile);
//!   success makes it healthy again, failure ejects it again for longer. `times ejected` is kept
//!   after a successful probe and forgotten once the address has stayed healthy for
//!   `max_ejection`.
//! - Local rejections never reach this layer (bulkhead/breaker sit above the client), so they
//!   never eject an address.

use fanout_config::{BalanceConfig, BalanceStrategy, OutlierConfig};
use rand::Rng;
use std::time::Duration;
use tokio::time::Instant;

/// Balancing and ejection settings at run time.
#[derive(Debug, Clone, Copy)]
pub struct BalancePolicy {
    /// P2C peak-EWMA or round robin.
    pub strategy: BalanceStrategy,
    /// Time constant of the EWMA.
    pub decay: Duration,
    /// Cost of an address without samples.
    pub default_rtt: Duration,
    /// Outlier ejection, if enabled.
    pub outlier: Option<OutlierPolicy>,
}

/// Outlier ejection settings.
#[derive(Debug, Clone, Copy)]
pub struct OutlierPolicy {
    /// Failures in a row that eject an address.
    pub consecutive_failures: u32,
    /// First ejection time; the n-th ejection lasts n times as long…
    pub base_ejection: Duration,
    /// …up to this.
    pub max_ejection: Duration,
    /// Most addresses out at once, in percent (at least one).
    pub max_ejected_percent: u32,
}

impl BalancePolicy {
    /// From a backend's `balance` and `outlier` settings.
    pub fn from_config(b: &BalanceConfig, o: &OutlierConfig) -> BalancePolicy {
        BalancePolicy {
            strategy: b.strategy,
            decay: b.decay.0.max(Duration::from_millis(1)),
            default_rtt: b.default_rtt.0,
            outlier: o.enabled.then(|| OutlierPolicy {
                consecutive_failures: o.consecutive_failures.max(1),
                base_ejection: o.base_ejection.0,
                max_ejection: o.max_ejection.0.max(o.base_ejection.0),
                max_ejected_percent: o.max_ejected_percent.min(100),
            }),
        }
    }
}

/// How a call to an address ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An answer that is not 5xx.
    Success,
    /// A 5xx answer, a connect error, a reset or a timeout.
    Failure,
    /// Dropped before it ended (a hedge loser, a caller gone, a deadline shorter than the
    /// address could be blamed for).
    Cancelled,
}

/// The address chosen for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Index into the backend's addresses.
    pub index: usize,
    /// This call is the probe of an address on probation.
    pub probe: bool,
}

/// A peak-sensitive, time-weighted moving average of latency, in seconds.
#[derive(Debug, Clone, Copy)]
struct PeakEwma {
    value: f64,
    at: Instant,
    sampled: bool,
}

impl PeakEwma {
    fn current(&self, now: Instant, p: &BalancePolicy) -> f64 {
        if !self.sampled {
            return p.default_rtt.as_secs_f64();
        }
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.value * (-dt / p.decay.as_secs_f64()).exp()
    }

    /// The stored value without decay (`default_rtt` before any sample).
    fn raw(&self, p: &BalancePolicy) -> f64 {
        if self.sampled {
            self.value
        } else {
            p.default_rtt.as_secs_f64()
        }
    }

    fn observe(&mut self, rtt: f64, now: Instant, p: &BalancePolicy) {
        let current = self.current(now, p);
        self.value = if !self.sampled || rtt > current {
            rtt
        } else {
            let dt = now.saturating_duration_since(self.at).as_secs_f64();
            let alpha = 1.0 - (-dt / p.decay.as_secs_f64()).exp();
            current + rtt * alpha
        };
        self.at = now;
        self.sampled = true;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Healthy { since: Instant },
    Ejected { until: Instant },
    Probation { probe_in_flight: bool },
}

#[derive(Debug, Clone)]
struct Addr {
    in_flight: u32,
    ewma: PeakEwma,
    health: Health,
    consecutive: u32,
    times_ejected: u32,
    calls: u64,
    failures: u64,
    ejections: u64,
}

/// What `/__fanout/status` shows per address (a type of the protocols' shared crate: every
/// protocol's addresses are read alike).
pub use fanout_protocol::AddressSnapshot;

/// The balancer of one backend: per-address load, latency and health.
#[derive(Debug, Clone)]
pub struct BalanceState {
    policy: BalancePolicy,
    addrs: Vec<Addr>,
    next_rr: usize,
}

impl BalanceState {
    /// `n` unknown, healthy addresses.
    pub fn new(n: usize, policy: BalancePolicy, now: Instant) -> BalanceState {
        let addr = Addr {
            in_flight: 0,
            ewma: PeakEwma {
                value: 0.0,
                at: now,
                sampled: false,
            },
            health: Health::Healthy { since: now },
            consecutive: 0,
            times_ejected: 0,
            calls: 0,
            failures: 0,
            ejections: 0,
        };
        BalanceState {
            policy,
            addrs: vec![addr; n],
            next_rr: 0,
        }
    }

    /// The settings.
    pub fn policy(&self) -> &BalancePolicy {
        &self.policy
    }

    /// Expired ejections become probations.
    fn expire(&mut self, now: Instant) {
        for a in &mut self.addrs {
            if let Health::Ejected { until } = a.health
                && now >= until
            {
                a.health = Health::Probation {
                    probe_in_flight: false,
                };
            }
        }
    }

    /// The P2C cost of address `i` at `now`.
    pub fn cost(&self, i: usize, now: Instant) -> f64 {
        self.addrs
            .get(i)
            .map(|a| a.ewma.current(now, &self.policy) * (f64::from(a.in_flight) + 1.0))
            .unwrap_or(f64::INFINITY)
    }

    /// Choose the address for a call starting at `now` (counted in flight until
    /// [`BalanceState::record`]). `None` only without addresses.
    pub fn pick(&mut self, now: Instant, rng: &mut impl Rng) -> Option<Pick> {
        if self.addrs.is_empty() {
            return None;
        }
        self.expire(now);
        // An address whose ejection is over gets the next call as its probe.
        let probe = self.addrs.iter().position(|a| {
            a.health
                == Health::Probation {
                    probe_in_flight: false,
                }
        });
        if let Some(i) = probe {
            self.addrs[i].health = Health::Probation {
                probe_in_flight: true,
            };
            self.addrs[i].in_flight += 1;
            return Some(Pick {
                index: i,
                probe: true,
            });
        }
        // Healthy addresses; if none (cannot happen while ejection keeps one), any.
        let healthy = |a: &Addr| matches!(a.health, Health::Healthy { .. });
        let eligible: Vec<usize> = if self.addrs.iter().any(healthy) {
            (0..self.addrs.len())
                .filter(|&i| healthy(&self.addrs[i]))
                .collect()
        } else {
            (0..self.addrs.len()).collect()
        };
        let index = match (self.policy.strategy, eligible.len()) {
            (_, 1) => eligible[0],
            (BalanceStrategy::RoundRobin, n) => {
                let n_all = self.addrs.len();
                let start = self.next_rr % n_all;
                let chosen = (0..n_all)
                    .map(|k| (start + k) % n_all)
                    .find(|i| eligible.contains(i))
                    .unwrap_or(eligible[start % n]);
                self.next_rr = chosen + 1;
                chosen
            }
            (BalanceStrategy::P2cPeakEwma, n) => {
                let a = rng.random_range(0..n);
                let mut b = rng.random_range(0..n - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (eligible[a], eligible[b]);
                if self.cost(b, now) < self.cost(a, now) {
                    b
                } else {
                    a
                }
            }
        };
        self.addrs[index].in_flight += 1;
        Some(Pick {
            index,
            probe: false,
        })
    }

    /// Most addresses that may be out (ejected or on probation) at once.
    fn max_out(&self, o: &OutlierPolicy) -> usize {
        let n = self.addrs.len();
        let by_percent = n * o.max_ejected_percent as usize / 100;
        by_percent.max(1).min(n.saturating_sub(1))
    }

    fn out(&self) -> usize {
        self.addrs
            .iter()
            .filter(|a| !matches!(a.health, Health::Healthy { .. }))
            .count()
    }

    fn eject(&mut self, i: usize, now: Instant, o: &OutlierPolicy) {
        let a = &mut self.addrs[i];
        if let Health::Healthy { since } = a.health
            && now.saturating_duration_since(since) >= o.max_ejection
        {
            a.times_ejected = 0; // healthy long enough: start over
        }
        a.times_ejected = a.times_ejected.saturating_add(1);
        a.ejections += 1;
        let time = o
            .base_ejection
            .saturating_mul(a.times_ejected)
            .min(o.max_ejection);
        a.health = Health::Ejected { until: now + time };
        a.consecutive = 0;
    }

    /// A call picked with `pick`, started at `started`, ended at `now` with `outcome`.
    /// `timeout` was the call's timeout (it caps the failure penalty).
    pub fn record(
        &mut self,
        pick: Pick,
        started: Instant,
        now: Instant,
        timeout: Duration,
        outcome: Outcome,
    ) {
        let p = self.policy;
        let Some(a) = self.addrs.get_mut(pick.index) else {
            return;
        };
        a.in_flight = a.in_flight.saturating_sub(1);
        let rtt = now.saturating_duration_since(started).as_secs_f64();
        match outcome {
            Outcome::Success => {
                a.calls += 1;
                a.ewma.observe(rtt, now, &p);
                a.consecutive = 0;
                if pick.probe {
                    a.health = Health::Healthy { since: now };
                }
            }
            Outcome::Failure => {
                a.calls += 1;
                a.failures += 1;
                let default = p.default_rtt.as_secs_f64();
                let cap = timeout.as_secs_f64().max(default);
                let penalty = rtt.max((2.0 * a.ewma.raw(&p)).max(default).min(cap));
                a.ewma.observe(penalty, now, &p);
                a.consecutive = a.consecutive.saturating_add(1);
                let Some(o) = p.outlier else { return };
                let reached = a.consecutive >= o.consecutive_failures;
                let healthy = matches!(a.health, Health::Healthy { .. });
                if pick.probe {
                    self.eject(pick.index, now, &o); // failed probe: out again, for longer
                } else if reached && healthy && self.out() < self.max_out(&o) {
                    self.eject(pick.index, now, &o);
                }
            }
            Outcome::Cancelled => {
                if rtt > a.ewma.current(now, &p) {
                    a.ewma.observe(rtt, now, &p);
                }
                if pick.probe {
                    // No verdict: the next call probes again.
                    a.health = Health::Probation {
                        probe_in_flight: false,
                    };
                }
            }
        }
    }

    /// Per-address state at `now`, for status pages.
    pub fn snapshot(&self, now: Instant) -> Vec<AddressSnapshot> {
        self.addrs
            .iter()
            .enumerate()
            .map(|(index, a)| {
                let (state, ejected_for) = match a.health {
                    Health::Healthy { .. } => ("healthy", Duration::ZERO),
                    Health::Ejected { until } if now >= until => ("probation", Duration::ZERO),
                    Health::Ejected { until } => ("ejected", until - now),
                    Health::Probation { .. } => ("probation", Duration::ZERO),
                };
                AddressSnapshot {
                    index,
                    in_flight: a.in_flight,
                    ewma_ms: a.ewma.current(now, &self.policy) * 1000.0,
                    state,
                    ejected: state != "healthy",
                    ejected_for_ms: ejected_for.as_millis() as u64,
                    times_ejected: a.times_ejected,
                    consecutive_failures: a.consecutive,
                    calls: a.calls,
                    failures: a.failures,
                    ejections: a.ejections,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy(strategy: BalanceStrategy) -> BalancePolicy {
        let mut p =
            BalancePolicy::from_config(&BalanceConfig::default(), &OutlierConfig::default());
        p.strategy = strategy;
        p
    }

    const T: Duration = Duration::from_secs(1);

    /// One call with `outcome`, taking no time.
    fn call(b: &mut BalanceState, now: Instant, outcome: Outcome) -> Pick {
        let mut rng = SmallRng::seed_from_u64(1);
        let p = b.pick(now, &mut rng).unwrap();
        b.record(p, now, now, T, outcome);
        p
    }

    /// Fail address `i` once (round robin: picks the others successfully on the way).
    fn fail(b: &mut BalanceState, i: usize, now: Instant) -> u32 {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut picks = 0;
        loop {
            let p = b.pick(now, &mut rng).unwrap();
            picks += 1;
            let outcome = if p.index == i {
                Outcome::Failure
            } else {
                Outcome::Success
            };
            b.record(p, now, now, T, outcome);
            if p.index == i || picks > 10 {
                return picks;
            }
        }
    }

    fn state(b: &BalanceState, i: usize, now: Instant) -> &'static str {
        b.snapshot(now)[i].state
    }

    #[test]
    fn ejection_after_exactly_n_failures_with_growing_capped_times() {
        let t0 = Instant::now();
        let mut b = BalanceState::new(3, policy(BalanceStrategy::RoundRobin), t0);
        for k in 1..5 {
            fail(&mut b, 1, t0);
            assert_eq!(state(&b, 1, t0), "healthy", "{k} failures < 5");
        }
        // A success in between resets the run.
        let mut rng = SmallRng::seed_from_u64(1);
        loop {
            let p = b.pick(t0, &mut rng).unwrap();
            b.record(p, t0, t0, T, Outcome::Success);
            if p.index == 1 {
                break;
            }
        }
        for _ in 0..4 {
            fail(&mut b, 1, t0);
        }
        assert_eq!(state(&b, 1, t0), "healthy");
        fail(&mut b, 1, t0);
        let s = &b.snapshot(t0)[1];
        assert_eq!(
            (s.state, s.times_ejected, s.ejected_for_ms),
            ("ejected", 1, 30_000)
        );
        // While ejected it gets no calls.
        for _ in 0..20 {
            assert_ne!(call(&mut b, t0 + ms(10), Outcome::Success).index, 1);
        }
        // After 30 s: the next call is the probe; it fails → ejected for 60 s, then 90 s, …
        let mut now = t0 + Duration::from_secs(30);
        let mut expected = 30;
        for times in 2..=12 {
            let p = call(&mut b, now, Outcome::Failure);
            assert_eq!(
                p,
                Pick {
                    index: 1,
                    probe: true
                }
            );
            expected = (expected + 30).min(300);
            let s = &b.snapshot(now)[1];
            assert_eq!(s.times_ejected, times);
            assert_eq!(s.ejected_for_ms, expected * 1000, "capped at max_ejection");
            now += Duration::from_secs(expected);
        }
        assert_eq!(expected, 300);
    }

    #[test]
    fn the_probe_goes_alone_and_a_success_readmits() {
        let t0 = Instant::now();
        let mut b = BalanceState::new(3, policy(BalanceStrategy::P2cPeakEwma), t0);
        let o = b.policy.outlier.unwrap();
        for _ in 0..5 {
            b.addrs[2].in_flight += 1;
            b.record(
                Pick {
                    index: 2,
                    probe: false,
                },
                t0,
                t0,
                T,
                Outcome::Failure,
            );
        }
        assert_eq!(state(&b, 2, t0), "ejected");
        let later = t0 + o.base_ejection;
        let mut rng = SmallRng::seed_from_u64(7);
        let probe = b.pick(later, &mut rng).unwrap();
        assert_eq!(
            probe,
            Pick {
                index: 2,
                probe: true
            }
        );
        // While the probe is in flight, no other call goes there.
        for _ in 0..50 {
            let p = b.pick(later, &mut rng).unwrap();
            assert_ne!(p.index, 2);
            b.record(p, later, later + ms(1), T, Outcome::Success);
        }
        // A cancelled probe gives no verdict: the next call probes again.
        b.record(probe, later, later + ms(1), T, Outcome::Cancelled);
        let probe = b.pick(later, &mut rng).unwrap();
        assert_eq!(
            probe,
            Pick {
                index: 2,
                probe: true
            }
        );
        b.record(probe, later, later + ms(1), T, Outcome::Success);
        let s = &b.snapshot(later)[2];
        assert_eq!(
            (s.state, s.times_ejected, s.consecutive_failures),
            ("healthy", 1, 0)
        );
        // Healthy for max_ejection: the next ejection starts from base_ejection again.
        let much_later = later + o.max_ejection + ms(1);
        for _ in 0..5 {
            b.addrs[2].in_flight += 1;
            let p = Pick {
                index: 2,
                probe: false,
            };
            b.record(p, much_later, much_later, T, Outcome::Failure);
        }
        let s = &b.snapshot(much_later)[2];
        assert_eq!((s.times_ejected, s.ejected_for_ms), (1, 30_000));
    }

    #[test]
    fn never_more_than_max_percent_out_and_never_the_last() {
        let t0 = Instant::now();
        let fail_n = |b: &mut BalanceState, i: usize, n: u32| {
            for _ in 0..n {
                b.addrs[i].in_flight += 1;
                let p = Pick {
                    index: i,
                    probe: false,
                };
                b.record(p, t0, t0, T, Outcome::Failure);
            }
        };
        // 4 addresses at 50 %: two may be out, not three.
        let mut b = BalanceState::new(4, policy(BalanceStrategy::P2cPeakEwma), t0);
        for i in 0..4 {
            fail_n(&mut b, i, 5);
        }
        let out = b.snapshot(t0).iter().filter(|s| s.ejected).count();
        assert_eq!(out, 2);
        // 3 addresses at 10 %: still one may be out.
        let mut p = policy(BalanceStrategy::P2cPeakEwma);
        if let Some(o) = &mut p.outlier {
            o.max_ejected_percent = 10;
        }
        let mut b = BalanceState::new(3, p, t0);
        for i in 0..3 {
            fail_n(&mut b, i, 5);
        }
        assert_eq!(b.snapshot(t0).iter().filter(|s| s.ejected).count(), 1);
        // 2 addresses at 100 %: the last one stays.
        if let Some(o) = &mut p.outlier {
            o.max_ejected_percent = 100;
        }
        let mut b = BalanceState::new(2, p, t0);
        fail_n(&mut b, 0, 5);
        fail_n(&mut b, 1, 50);
        let s = b.snapshot(t0);
        assert_eq!((s[0].ejected, s[1].ejected), (true, false));
        // A single address is never ejected.
        let mut b = BalanceState::new(1, p, t0);
        fail_n(&mut b, 0, 50);
        assert!(!b.snapshot(t0)[0].ejected);
        // Disabled: nothing is ejected.
        p.outlier = None;
        let mut b = BalanceState::new(3, p, t0);
        fail_n(&mut b, 0, 50);
        assert!(!b.snapshot(t0)[0].ejected);
    }

    #[test]
    fn peak_jumps_up_at_once_and_decays() {
        let t0 = Instant::now();
        let p = policy(BalanceStrategy::P2cPeakEwma); // decay 10 s, default 30 ms
        let mut e = PeakEwma {
            value: 0.0,
            at: t0,
            sampled: false,
        };
        assert_eq!(e.current(t0, &p), 0.030, "unknown: default_rtt");
        e.observe(0.010, t0, &p);
        assert_eq!(
            e.current(t0, &p),
            0.010,
            "first sample replaces the default"
        );
        e.observe(0.200, t0 + ms(1), &p);
        assert_eq!(e.current(t0 + ms(1), &p), 0.200, "a peak is taken at once");
        // Decays as exp(−t/decay) between samples: after 10 s, 1/e.
        let d = e.current(t0 + ms(1) + Duration::from_secs(10), &p);
        assert!((d - 0.200 / std::f64::consts::E).abs() < 1e-9, "{d}");
        // A lower sample is averaged in with α = 1 − exp(−Δt/decay): after 10 s,
        // 0.2/e + 0.01 × (1 − 1/e).
        e.observe(0.010, t0 + ms(1) + Duration::from_secs(10), &p);
        let inv_e = 1.0 / std::f64::consts::E;
        let want = 0.200 * inv_e + 0.010 * (1.0 - inv_e);
        let got = e.current(t0 + ms(1) + Duration::from_secs(10), &p);
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }

    #[test]
    fn p2c_prefers_the_lower_cost_and_failures_are_not_attractive() {
        let t0 = Instant::now();
        let mut b = BalanceState::new(2, policy(BalanceStrategy::P2cPeakEwma), t0);
        let mut rng = SmallRng::seed_from_u64(42);
        // Address 0 answers in 5 ms, address 1 in 50 ms.
        for (i, rtt) in [(0, 5), (1, 50)] {
            b.addrs[i].in_flight += 1;
            let p = Pick {
                index: i,
                probe: false,
            };
            b.record(p, t0, t0 + ms(rtt), T, Outcome::Success);
        }
        let now = t0 + ms(100);
        for _ in 0..100 {
            let p = b.pick(now, &mut rng).unwrap();
            assert_eq!(p.index, 0, "two of two: always the cheaper");
            b.record(p, now, now, T, Outcome::Cancelled);
        }
        // Load counts: 0 with 10 in flight costs 5 × 11 = 55 ms > 50 ms.
        b.addrs[0].in_flight = 10;
        assert_eq!(b.pick(now, &mut rng).unwrap().index, 1);

        // A replica failing fast (1 ms 503s) becomes more expensive with each failure.
        let mut b = BalanceState::new(2, policy(BalanceStrategy::P2cPeakEwma), t0);
        for (i, outcome) in [(0, Outcome::Success), (1, Outcome::Failure)] {
            b.addrs[i].in_flight += 1;
            let p = Pick {
                index: i,
                probe: false,
            };
            b.record(p, t0, t0 + ms(1), T, outcome);
        }
        let c1 = b.cost(1, t0 + ms(1));
        assert!((c1 - 0.060).abs() < 1e-9, "2 × default_rtt, not 1 ms: {c1}");
        b.addrs[1].in_flight += 1;
        let p = Pick {
            index: 1,
            probe: false,
        };
        b.record(p, t0 + ms(1), t0 + ms(2), T, Outcome::Failure);
        assert!((b.cost(1, t0 + ms(2)) - 0.120).abs() < 1e-6, "doubles");
        for _ in 0..20 {
            b.addrs[1].in_flight += 1;
            b.record(p, t0 + ms(2), t0 + ms(3), T, Outcome::Failure);
        }
        assert!(
            (b.cost(1, t0 + ms(3)) - 1.0).abs() < 1e-6,
            "capped at the timeout"
        );
        let now = t0 + ms(10);
        for _ in 0..100 {
            let p = b.pick(now, &mut rng).unwrap();
            assert_eq!(p.index, 0);
            b.record(p, now, now, T, Outcome::Cancelled);
        }
    }

    #[test]
    fn round_robin_skips_ejected_addresses() {
        let t0 = Instant::now();
        let mut b = BalanceState::new(3, policy(BalanceStrategy::RoundRobin), t0);
        let order: Vec<usize> = (0..6)
            .map(|_| call(&mut b, t0, Outcome::Success).index)
            .collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
        for _ in 0..5 {
            fail(&mut b, 0, t0);
        }
        assert_eq!(state(&b, 0, t0), "ejected");
        let order: Vec<usize> = (0..4)
            .map(|_| call(&mut b, t0, Outcome::Success).index)
            .collect();
        assert!(order.iter().all(|&i| i != 0), "{order:?}");
    }
}
