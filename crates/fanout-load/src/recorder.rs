//! Accumulates per-request outcomes into HdrHistograms (whole run and per second).
//!
//! One `Recorder` sits behind a mutex shared by all workers; it is locked twice per request
//! (at send and at finish) for a few hundred nanoseconds. Seconds are keyed by the time of the
//! event (send or finish) relative to the start; a second is closed once the clock has passed
//! it, and an event that races past the close lands in the oldest open second.

use crate::report::{ErrorCounts, SecondStats, StatusClasses};
use crate::schedule::Schedule;
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::time::Duration;

/// A microsecond histogram with 3 significant digits covering at least `high_us`, resizing
/// itself beyond that (so merging and outliers never fail).
pub(crate) fn new_histogram(high_us: u64) -> Histogram<u64> {
    let high = high_us.max(1_000_000);
    let mut h = Histogram::new_with_bounds(1, high, 3)
        .or_else(|_| Histogram::new(3))
        .unwrap_or_else(|_| unreachable_histogram());
    h.auto(true);
    h
}

#[cold]
fn unreachable_histogram() -> Histogram<u64> {
    // `Histogram::new(3)` only fails for sigfig > 5; keep a valid fallback anyway.
    match Histogram::new(2) {
        Ok(h) => h,
        Err(_) => panic!("hdrhistogram rejected sigfig 2"),
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A complete response with this status and body size.
    Response { status: u16, bytes: u64 },
    /// Per-request timeout after the send.
    Timeout,
    /// Connect refused (never sent).
    ConnectRefused,
    /// Connect timed out (never sent).
    ConnectTimeout,
    /// Reset / closed mid-exchange.
    Reset,
    /// Anything else.
    Other,
}

#[derive(Debug)]
struct SecondAcc {
    sent: u64,
    completed: u64,
    ok: u64,
    errors: u64,
    latency: Histogram<u64>,
    lag: Histogram<u64>,
}

impl SecondAcc {
    fn new(high_us: u64) -> SecondAcc {
        SecondAcc {
            sent: 0,
            completed: 0,
            ok: 0,
            errors: 0,
            latency: new_histogram(high_us),
            lag: new_histogram(high_us),
        }
    }
}

/// Run-wide accumulators.
#[derive(Debug)]
pub(crate) struct Recorder {
    high_us: u64,
    late_us: u64,
    pub latency: Histogram<u64>,
    pub service: Histogram<u64>,
    pub lag: Histogram<u64>,
    /// Requests picked up by a worker (each has a lag sample).
    pub dispatched: u64,
    pub sent: u64,
    /// Finished requests that had been sent.
    pub sent_finished: u64,
    /// All finished requests (with an outcome).
    pub finished: u64,
    pub completed: u64,
    pub ok: u64,
    pub late: u64,
    pub bytes: u64,
    pub classes: StatusClasses,
    pub errors: ErrorCounts,
    open: VecDeque<SecondAcc>,
    first_open: u64,
}

impl Recorder {
    /// `high_us`: the largest latency expected (values above still record; histograms grow).
    pub fn new(high_us: u64, late_threshold: Duration) -> Recorder {
        Recorder {
            high_us,
            late_us: u64::try_from(late_threshold.as_micros()).unwrap_or(u64::MAX),
            latency: new_histogram(high_us),
            service: new_histogram(high_us),
            lag: new_histogram(high_us),
            dispatched: 0,
            sent: 0,
            sent_finished: 0,
            finished: 0,
            completed: 0,
            ok: 0,
            late: 0,
            bytes: 0,
            classes: StatusClasses::default(),
            errors: ErrorCounts::default(),
            open: VecDeque::new(),
            first_open: 0,
        }
    }

    fn second(&mut self, sec: u64) -> &mut SecondAcc {
        let sec = sec.max(self.first_open);
        let idx = usize::try_from(sec - self.first_open).unwrap_or(usize::MAX);
        while self.open.len() <= idx {
            self.open.push_back(SecondAcc::new(self.high_us));
        }
        let last = self.open.len() - 1;
        &mut self.open[idx.min(last)]
    }

    /// A worker picked up a request `lag_us` after its intended time.
    pub fn on_dispatch(&mut self, sec: u64, lag_us: u64) {
        self.dispatched += 1;
        self.lag.saturating_record(lag_us);
        if lag_us > self.late_us {
            self.late += 1;
        }
        self.second(sec).lag.saturating_record(lag_us);
    }

    /// A request was written to a connection.
    pub fn on_send(&mut self, sec: u64) {
        self.sent += 1;
        self.second(sec).sent += 1;
    }

    /// A request ended. `latency_us` (from the intended time) and `service_us` (from the
    /// actual send) are recorded when given. Returns the number of finished requests.
    pub fn on_finish(
        &mut self,
        sec: u64,
        outcome: Outcome,
        was_sent: bool,
        latency_us: Option<u64>,
        service_us: Option<u64>,
    ) -> u64 {
        self.finished += 1;
        if was_sent {
            self.sent_finished += 1;
        }
        if let Some(l) = latency_us {
            self.latency.saturating_record(l);
        }
        if let Some(s) = service_us {
            self.service.saturating_record(s);
        }
        let is_response = match outcome {
            Outcome::Response { status, bytes } => {
                self.completed += 1;
                self.bytes += bytes;
                self.classes.add(status);
                if (200..300).contains(&status) {
                    self.ok += 1;
                }
                true
            }
            Outcome::Timeout => {
                self.errors.timeout += 1;
                false
            }
            Outcome::ConnectRefused => {
                self.errors.connect_refused += 1;
                false
            }
            Outcome::ConnectTimeout => {
                self.errors.connect_timeout += 1;
                false
            }
            Outcome::Reset => {
                self.errors.reset += 1;
                false
            }
            Outcome::Other => {
                self.errors.other_network += 1;
                false
            }
        };
        let s = self.second(sec);
        if is_response {
            s.completed += 1;
            if let Outcome::Response { status, .. } = outcome
                && (200..300).contains(&status)
            {
                s.ok += 1;
            }
        } else {
            s.errors += 1;
        }
        if let Some(l) = latency_us {
            s.latency.saturating_record(l);
        }
        self.finished
    }

    /// One past the last second that has data.
    pub fn open_end(&self) -> u64 {
        self.first_open + self.open.len() as u64
    }

    /// Close every second before `upto` and return their statistics.
    pub fn close_seconds(&mut self, upto: u64, schedule: &Schedule) -> Vec<SecondStats> {
        let mut out = Vec::new();
        while self.first_open < upto {
            let t = self.first_open;
            let acc = self
                .open
                .pop_front()
                .unwrap_or_else(|| SecondAcc::new(1_000_000));
            self.first_open += 1;
            let offered = schedule
                .requests_before(Duration::from_secs(t + 1))
                .saturating_sub(schedule.requests_before(Duration::from_secs(t)));
            let ms = |us: u64| us as f64 / 1000.0;
            let q = |h: &Histogram<u64>, q: f64| {
                if h.is_empty() {
                    0.0
                } else {
                    ms(h.value_at_quantile(q))
                }
            };
            out.push(SecondStats {
                t,
                offered,
                sent: acc.sent,
                completed: acc.completed,
                ok: acc.ok,
                errors: acc.errors,
                p50_ms: q(&acc.latency, 0.5),
                p99_ms: q(&acc.latency, 0.99),
                max_ms: if acc.latency.is_empty() {
                    0.0
                } else {
                    ms(acc.latency.max())
                },
                lag_p99_ms: q(&acc.lag, 0.99),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_totals() {
        let sch = match Schedule::parse("const(10,2s)") {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let mut r = Recorder::new(10_000_000, Duration::from_millis(1));
        r.on_dispatch(0, 50);
        r.on_send(0);
        r.on_dispatch(0, 5_000);
        r.on_send(0);
        r.on_finish(
            0,
            Outcome::Response {
                status: 200,
                bytes: 10,
            },
            true,
            Some(2_000),
            Some(1_900),
        );
        r.on_finish(1, Outcome::Timeout, true, Some(200_000), Some(195_000));
        r.on_finish(1, Outcome::ConnectRefused, false, None, None);
        let secs = r.close_seconds(1, &sch);
        assert_eq!(secs.len(), 1);
        assert_eq!((secs[0].offered, secs[0].sent, secs[0].ok), (10, 2, 1));
        assert!((secs[0].p50_ms - 2.0).abs() < 0.01);
        assert!((secs[0].lag_p99_ms - 5.0).abs() < 0.01);
        // A late event for a closed second lands in the oldest open one.
        r.on_send(0);
        let secs = r.close_seconds(r.open_end(), &sch);
        assert_eq!(secs.len(), 1);
        assert_eq!((secs[0].t, secs[0].sent, secs[0].errors), (1, 1, 2));
        assert_eq!((r.finished, r.sent_finished, r.late), (3, 2, 1));
        assert_eq!(
            (r.errors.timeout, r.errors.connect_refused, r.completed),
            (1, 1, 1)
        );
    }
}
