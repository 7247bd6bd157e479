//! `server.drain_spread`: on shutdown, long-lived streams (Server-Sent Events, WebSockets) end
//! at times spread evenly over a window instead of all at once, so their clients reconnect to the
//! other instances gradually (Envoy's "gradual" drain strategy) rather than in one burst.
//!
//! Each stream takes the next offset of a low-discrepancy sequence (the golden-ratio sequence
//! `frac(n · φ⁻¹)`), so any number of streams covers the window evenly with no randomness to
//! seed and no coordination between them beyond one counter.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The window, and how many offsets were handed out.
#[derive(Debug, Default)]
pub struct Spread {
    window: Duration,
    taken: AtomicU64,
}

/// 2⁶⁴ / φ, the golden ratio's fractional step in 64-bit fixed point.
const STEP: u64 = 0x9E37_79B9_7F4A_7C15;

impl Spread {
    /// Offsets within `window` (zero: every stream at once).
    pub fn new(window: Duration) -> Spread {
        Spread {
            window,
            taken: AtomicU64::new(0),
        }
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The next stream's delay after the drain starts: in `[0, window)`.
    pub fn offset(&self) -> Duration {
        if self.window.is_zero() {
            return Duration::ZERO;
        }
        let n = self.taken.fetch_add(1, Relaxed);
        let frac = n.wrapping_mul(STEP);
        // window × frac / 2⁶⁴, in nanoseconds (u128: no overflow for any window).
        let nanos = (self.window.as_nanos() * u128::from(frac)) >> 64;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_window_no_delay() {
        let s = Spread::new(Duration::ZERO);
        assert!((0..10).all(|_| s.offset().is_zero()));
    }

    #[test]
    fn offsets_cover_the_window_evenly() {
        let w = Duration::from_secs(10);
        let s = Spread::new(w);
        let mut buckets = [0u32; 10];
        for _ in 0..1000 {
            let o = s.offset();
            assert!(o < w, "{o:?}");
            buckets[(o.as_secs_f64()) as usize] += 1;
        }
        // 1000 offsets in ten one-second buckets: each gets 100 ± a few.
        assert!(
            buckets.iter().all(|&b| (95..=105).contains(&b)),
            "{buckets:?}"
        );
        // The first stream goes at once; the second near the window's 62 %.
        let s = Spread::new(w);
        assert_eq!(s.offset(), Duration::ZERO);
        assert_eq!(s.offset().as_secs(), 6);
    }
}
