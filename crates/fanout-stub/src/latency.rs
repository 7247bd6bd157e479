//! Latency models of a route: how long the stub waits before answering.
//!
//! A [`Latency`] is compiled from a [`LatencyConfig`] and sampled once per request with
//! [`Latency::delay_at`], given the time since the service started (periodic stalls are aligned
//! to it) and a random number generator. The server draws from a per-thread [`SmallRng`]
//! ([`with_rng`]): no lock is shared between requests.

use crate::config::{
    LatencyConfig, LatencyModel, LognormalLatency, MixtureArm, NormalLatency, StallLatency,
    UniformLatency,
};
use fanout_config::Dur;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use std::cell::RefCell;
use std::time::Duration;

/// The longest delay the stub sleeps; longer draws (e.g. from a wide log-normal) are capped.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// How far the probabilities of a mixture may sum away from 1.
pub const PROBABILITY_TOLERANCE: f64 = 1e-6;

/// A latency model, sampled once per request.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Latency {
    /// Answer at once.
    #[default]
    None,
    /// Always the same delay.
    Fixed(Duration),
    /// Uniformly distributed in `[min, max]`.
    Uniform {
        /// Shortest delay.
        min: Duration,
        /// Longest delay.
        max: Duration,
    },
    /// Normally distributed, truncated at 0: negative draws are drawn again (after 16 negative
    /// draws in a row the delay is 0).
    Normal {
        /// Mean before truncation.
        mean: Duration,
        /// Standard deviation.
        sd: Duration,
    },
    /// Log-normal: `median · e^(sigma · Z)` with `Z` standard normal (WireMock's parameters).
    LogNormal {
        /// Median delay.
        median: Duration,
        /// Standard deviation of the delay's natural logarithm.
        sigma: f64,
    },
    /// One of several models, picked per request with its probability.
    Mixture(Vec<WeightedLatency>),
    /// Periodic stalls: windows `[k·every, k·every + duration)` for k ≥ 1 (time since the
    /// service started). A request whose response is due inside a window (after `base`) is held
    /// until the window ends.
    Stall {
        /// Period of the stall windows.
        every: Duration,
        /// Length of each window.
        duration: Duration,
        /// Latency outside the stalls.
        base: Box<Latency>,
    },
}

/// One arm of a [`Latency::Mixture`].
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedLatency {
    /// Probability of this arm.
    pub p: f64,
    /// Its latency.
    pub latency: Latency,
}

thread_local! {
    static RNG: RefCell<SmallRng> = RefCell::new(SmallRng::from_rng(&mut rand::rng()));
}

/// Run `f` with this thread's fast random number generator (seeded once per thread from the
/// OS-seeded thread RNG).
pub fn with_rng<T>(f: impl FnOnce(&mut SmallRng) -> T) -> T {
    RNG.with_borrow_mut(f)
}

/// Seconds as a duration, clamped to `[0, MAX_DELAY]` (NaN is 0).
fn secs(x: f64) -> Duration {
    if x.is_nan() || x <= 0.0 {
        Duration::ZERO
    } else if x >= MAX_DELAY.as_secs_f64() {
        MAX_DELAY
    } else {
        Duration::try_from_secs_f64(x).unwrap_or(MAX_DELAY)
    }
}

/// How long a response due at `due` (time since the service started) is held by stall windows
/// `[k·every, k·every + duration)`, k ≥ 1: until the end of the window it falls in, or zero.
pub fn stall_hold(due: Duration, every: Duration, duration: Duration) -> Duration {
    if every.is_zero() || due < every {
        return Duration::ZERO;
    }
    let phase = due.as_nanos() % every.as_nanos();
    let phase = Duration::from_nanos(u64::try_from(phase).unwrap_or(u64::MAX));
    duration.saturating_sub(phase)
}

impl Latency {
    /// Draw a delay from the thread's RNG, as for a request arriving when the service started.
    pub fn sample(&self) -> Duration {
        with_rng(|rng| self.delay_at(Duration::ZERO, rng))
    }

    /// Draw a delay from `rng`, as for a request arriving when the service started.
    pub fn sample_with<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        self.delay_at(Duration::ZERO, rng)
    }

    /// The delay for a request arriving `since_start` after the service started (stall windows
    /// are aligned to the start), drawn from `rng`. Not capped; the server caps at
    /// [`MAX_DELAY`].
    pub fn delay_at<R: Rng + ?Sized>(&self, since_start: Duration, rng: &mut R) -> Duration {
        match self {
            Latency::None => Duration::ZERO,
            Latency::Fixed(d) => *d,
            Latency::Uniform { min, max } => {
                if max <= min {
                    *min
                } else {
                    rng.random_range(*min..=*max)
                }
            }
            Latency::Normal { mean, sd } => {
                let (mean, sd) = (mean.as_secs_f64(), sd.as_secs_f64());
                if sd <= 0.0 {
                    return secs(mean);
                }
                for _ in 0..16 {
                    let z: f64 = rng.sample(StandardNormal);
                    let x = mean + sd * z;
                    if x >= 0.0 {
                        return secs(x);
                    }
                }
                Duration::ZERO
            }
            Latency::LogNormal { median, sigma } => {
                let z: f64 = rng.sample(StandardNormal);
                secs(median.as_secs_f64() * (sigma * z).exp())
            }
            Latency::Mixture(arms) => {
                let u: f64 = rng.random();
                let mut acc = 0.0;
                for arm in arms {
                    acc += arm.p;
                    if u < acc {
                        return arm.latency.delay_at(since_start, rng);
                    }
                }
                // Rounding: the probabilities sum to 1 within the tolerance.
                arms.last()
                    .map_or(Duration::ZERO, |a| a.latency.delay_at(since_start, rng))
            }
            Latency::Stall {
                every,
                duration,
                base,
            } => {
                let d = base.delay_at(since_start, rng);
                d.saturating_add(stall_hold(since_start.saturating_add(d), *every, *duration))
            }
        }
    }

    /// From the config form; the message says what is wrong (bounds, probabilities, stall
    /// windows).
    pub fn from_config(c: &LatencyConfig) -> Result<Latency, String> {
        Ok(match c {
            LatencyConfig::Fixed(d) | LatencyConfig::Model(LatencyModel::Fixed(d)) => {
                Latency::Fixed(d.0)
            }
            LatencyConfig::Model(LatencyModel::Uniform(u)) => {
                if u.min > u.max {
                    return Err(format!(
                        "uniform latency has min {} greater than max {}",
                        u.min, u.max
                    ));
                }
                Latency::Uniform {
                    min: u.min.0,
                    max: u.max.0,
                }
            }
            LatencyConfig::Model(LatencyModel::Normal(n)) => Latency::Normal {
                mean: n.mean.0,
                sd: n.sd.0,
            },
            LatencyConfig::Model(LatencyModel::Lognormal(l)) => {
                if !(l.sigma.is_finite() && l.sigma >= 0.0) {
                    return Err(format!(
                        "lognormal latency needs a finite sigma >= 0, got {}",
                        l.sigma
                    ));
                }
                Latency::LogNormal {
                    median: l.median.0,
                    sigma: l.sigma,
                }
            }
            LatencyConfig::Model(LatencyModel::Mixture(arms)) => {
                if arms.is_empty() {
                    return Err("a mixture needs at least one arm".into());
                }
                let mut out = Vec::with_capacity(arms.len());
                let mut sum = 0.0;
                for (i, arm) in arms.iter().enumerate() {
                    if !(arm.p.is_finite() && (0.0..=1.0).contains(&arm.p)) {
                        return Err(format!(
                            "mixture arm {}: probability {} is not within 0..1",
                            i + 1,
                            arm.p
                        ));
                    }
                    sum += arm.p;
                    let latency = Latency::from_config(&arm.latency)
                        .map_err(|e| format!("mixture arm {}: {e}", i + 1))?;
                    out.push(WeightedLatency { p: arm.p, latency });
                }
                if (sum - 1.0).abs() > PROBABILITY_TOLERANCE {
                    // Rounded to hide float noise (0.9500000000000001).
                    let shown = (sum * 1e9).round() / 1e9;
                    return Err(format!(
                        "mixture probabilities sum to {shown}, not 1 (tolerance \
                         {PROBABILITY_TOLERANCE})"
                    ));
                }
                Latency::Mixture(out)
            }
            LatencyConfig::Model(LatencyModel::Stall(s)) => {
                if s.every.0.is_zero() {
                    return Err("stall `every` must be longer than 0".into());
                }
                if s.duration >= s.every {
                    return Err(format!(
                        "stall `duration` {} must be shorter than `every` {} (or nothing \
                         would ever be answered)",
                        s.duration, s.every
                    ));
                }
                let base = match &s.base {
                    None => Latency::None,
                    Some(b) => Latency::from_config(b).map_err(|e| format!("stall base: {e}"))?,
                };
                Latency::Stall {
                    every: s.every.0,
                    duration: s.duration.0,
                    base: Box::new(base),
                }
            }
        })
    }

    /// The config form of this model (what `GET /__stub/routes` shows); [`Latency::None`] is
    /// a fixed 0.
    pub fn to_config(&self) -> LatencyConfig {
        let model = match self {
            Latency::None => return LatencyConfig::Fixed(Dur(Duration::ZERO)),
            Latency::Fixed(d) => return LatencyConfig::Fixed(Dur(*d)),
            Latency::Uniform { min, max } => LatencyModel::Uniform(UniformLatency {
                min: Dur(*min),
                max: Dur(*max),
            }),
            Latency::Normal { mean, sd } => LatencyModel::Normal(NormalLatency {
                mean: Dur(*mean),
                sd: Dur(*sd),
            }),
            Latency::LogNormal { median, sigma } => LatencyModel::Lognormal(LognormalLatency {
                median: Dur(*median),
                sigma: *sigma,
            }),
            Latency::Mixture(arms) => LatencyModel::Mixture(
                arms.iter()
                    .map(|a| MixtureArm {
                        p: a.p,
                        latency: a.latency.to_config(),
                    })
                    .collect(),
            ),
            Latency::Stall {
                every,
                duration,
                base,
            } => LatencyModel::Stall(StallLatency {
                every: Dur(*every),
                duration: Dur(*duration),
                base: (**base != Latency::None).then(|| Box::new(base.to_config())),
            }),
        };
        LatencyConfig::Model(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 20_000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn seeded() -> SmallRng {
        SmallRng::seed_from_u64(7)
    }

    fn samples(l: &Latency) -> Vec<f64> {
        let mut rng = seeded();
        let mut v: Vec<f64> = (0..N)
            .map(|_| l.sample_with(&mut rng).as_secs_f64() * 1000.0)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len() as f64
    }

    fn quantile(sorted: &[f64], q: f64) -> f64 {
        sorted[((sorted.len() - 1) as f64 * q) as usize]
    }

    #[test]
    fn uniform_samples_stay_within_bounds() {
        let l = Latency::Uniform {
            min: ms(1),
            max: ms(10),
        };
        let mut seen_distinct = std::collections::HashSet::new();
        for _ in 0..1000 {
            let d = l.sample();
            assert!(d >= ms(1) && d <= ms(10));
            seen_distinct.insert(d);
        }
        assert!(seen_distinct.len() > 1, "uniform latency never varied");
    }

    #[test]
    fn fixed_and_none() {
        assert_eq!(Latency::None.sample(), Duration::ZERO);
        let d = ms(5);
        assert_eq!(Latency::Fixed(d).sample(), d);
        let degenerate = Latency::Uniform { min: d, max: d };
        assert_eq!(degenerate.sample(), d);
    }

    #[test]
    fn normal_has_its_mean_and_sd_and_no_negative_delay() {
        let v = samples(&Latency::Normal {
            mean: ms(50),
            sd: ms(10),
        });
        let m = mean(&v);
        let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        assert!((48.0..52.0).contains(&m), "mean {m}");
        assert!((9.0..11.0).contains(&sd), "sd {sd}");

        // Truncated at 0: a mean of 0 gives only non-negative delays, about half near 0.
        let v = samples(&Latency::Normal {
            mean: ms(0),
            sd: ms(10),
        });
        assert!(v[0] >= 0.0);
        let m = mean(&v);
        // The half-normal's mean is sd·√(2/π) ≈ 7.98 ms.
        assert!((7.0..9.0).contains(&m), "half-normal mean {m}");
    }

    #[test]
    fn lognormal_has_its_median_and_a_right_tail() {
        let v = samples(&Latency::LogNormal {
            median: ms(100),
            sigma: 0.5,
        });
        let med = quantile(&v, 0.5);
        assert!((95.0..105.0).contains(&med), "median {med}");
        // p84 of a log-normal is median·e^sigma ≈ 164.9 ms; p16 is median/e^sigma ≈ 60.7 ms.
        let p84 = quantile(&v, 0.8413);
        let p16 = quantile(&v, 0.1587);
        assert!((150.0..180.0).contains(&p84), "p84 {p84}");
        assert!((55.0..67.0).contains(&p16), "p16 {p16}");
        assert!(mean(&v) > med, "right-skewed");
    }

    #[test]
    fn mixture_picks_arms_with_their_probabilities() {
        let l = Latency::Mixture(vec![
            WeightedLatency {
                p: 0.9,
                latency: Latency::Fixed(ms(1)),
            },
            WeightedLatency {
                p: 0.1,
                latency: Latency::Fixed(ms(100)),
            },
        ]);
        let v = samples(&l);
        let slow = v.iter().filter(|&&x| x > 50.0).count() as f64 / N as f64;
        assert!((0.08..0.12).contains(&slow), "slow share {slow}");
        assert!(v.iter().all(|&x| x == 1.0 || x == 100.0));
    }

    #[test]
    fn stall_windows_hold_responses_due_inside_them() {
        let (every, duration) = (ms(1000), ms(200));
        // Before the first period nothing stalls.
        assert_eq!(stall_hold(ms(0), every, duration), Duration::ZERO);
        assert_eq!(stall_hold(ms(150), every, duration), Duration::ZERO);
        // Inside a window: held until its end.
        assert_eq!(stall_hold(ms(1000), every, duration), ms(200));
        assert_eq!(stall_hold(ms(1050), every, duration), ms(150));
        assert_eq!(stall_hold(ms(3199), every, duration), ms(1));
        // At the window's end and after it: not held.
        assert_eq!(stall_hold(ms(1200), every, duration), Duration::ZERO);
        assert_eq!(stall_hold(ms(1999), every, duration), Duration::ZERO);

        let l = Latency::Stall {
            every,
            duration,
            base: Box::new(Latency::Fixed(ms(10))),
        };
        let mut rng = seeded();
        // Arriving at 2.1 s: due at 2.11 s, inside the window [2 s, 2.2 s): answered at 2.2 s.
        assert_eq!(l.delay_at(ms(2100), &mut rng), ms(100));
        // Arriving at 1.995 s: due at 2.005 s, inside the window: answered at 2.2 s.
        assert_eq!(l.delay_at(ms(1995), &mut rng), ms(205));
        // Arriving at 2.5 s: due at 2.51 s, outside: the base latency only.
        assert_eq!(l.delay_at(ms(2500), &mut rng), ms(10));
        // Every request arriving during a window completes at the window's end or later.
        for arrival_ms in (2000..2200).step_by(7) {
            let arrival = ms(arrival_ms);
            let done = arrival + l.delay_at(arrival, &mut rng);
            assert!(done >= ms(2200), "arrived {arrival:?}, done {done:?}");
        }
    }

    #[test]
    fn config_validation_and_round_trip() {
        let parse = |s: &str| -> LatencyConfig { serde_json::from_str(s).expect("parses") };
        let bad_sum =
            parse(r#"{"mixture": [{"p": 0.5, "latency": "1ms"}, {"p": 0.4, "latency": "2ms"}]}"#);
        let e = Latency::from_config(&bad_sum).expect_err("sum 0.9");
        assert!(e.contains("sum to 0.9"), "{e}");
        let near = parse(
            r#"{"mixture": [{"p": 0.3333333, "latency": "1ms"}, {"p": 0.6666667, "latency": "2ms"}]}"#,
        );
        assert!(Latency::from_config(&near).is_ok());
        let e = Latency::from_config(&parse(
            r#"{"stall": {"every": "100ms", "duration": "100ms"}}"#,
        ))
        .expect_err("duration = every");
        assert!(e.contains("shorter"), "{e}");
        let e = Latency::from_config(&parse(r#"{"lognormal": {"median": "5ms", "sigma": -1}}"#))
            .expect_err("negative sigma");
        assert!(e.contains("sigma"), "{e}");

        for src in [
            r#""5ms""#,
            r#"{"uniform": {"min": "1ms", "max": "2ms"}}"#,
            r#"{"normal": {"mean": "10ms", "sd": "250us"}}"#,
            r#"{"lognormal": {"median": "20ms", "sigma": 0.3}}"#,
            r#"{"stall": {"every": "1s", "duration": "200ms", "base": {"mixture": [{"p": 1, "latency": "1ms"}]}}}"#,
        ] {
            let l = Latency::from_config(&parse(src)).expect("valid");
            let again = Latency::from_config(&l.to_config()).expect("round trip");
            assert_eq!(again, l, "{src}");
        }
    }
}
