//! Latency models of a route: how long the stub waits before answering.
//!
//! The load lab will add more models (normal, lognormal, mixtures, periodic stalls); each is a
//! variant of [`Latency`] with a `sample` arm.

use crate::config::{LatencyConfig, LatencyModel};
use rand::Rng;
use std::time::Duration;

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
}

impl Latency {
    /// Draw the delay for one request (from the thread-local RNG).
    pub fn sample(&self) -> Duration {
        self.sample_with(&mut rand::rng())
    }

    /// Draw the delay for one request from `rng`.
    pub fn sample_with<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            Latency::None => Duration::ZERO,
            Latency::Fixed(d) => d,
            Latency::Uniform { min, max } => {
                if max <= min {
                    min
                } else {
                    rng.random_range(min..=max)
                }
            }
        }
    }

    /// From the config form. Errors when a uniform range has `min > max`.
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_samples_stay_within_bounds() {
        let l = Latency::Uniform {
            min: Duration::from_millis(1),
            max: Duration::from_millis(10),
        };
        let mut seen_distinct = std::collections::HashSet::new();
        for _ in 0..1000 {
            let d = l.sample();
            assert!(d >= Duration::from_millis(1) && d <= Duration::from_millis(10));
            seen_distinct.insert(d);
        }
        assert!(seen_distinct.len() > 1, "uniform latency never varied");
    }

    #[test]
    fn fixed_and_none() {
        assert_eq!(Latency::None.sample(), Duration::ZERO);
        let d = Duration::from_millis(5);
        assert_eq!(Latency::Fixed(d).sample(), d);
        let degenerate = Latency::Uniform { min: d, max: d };
        assert_eq!(degenerate.sample(), d);
    }
}
