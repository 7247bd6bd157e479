//! Accumulates per-request outcomes into HdrHistograms (whole run and per second).
//!
//! One `Recorder` sits behind a mutex shared by all workers; it is locked twice per request
//! (at send and at finish) for a few hundred nanoseconds. Seconds are keyed by the time of the
//! event (send or finish) relative to the start; a second is closed once the clock has passed
//! it, and an event that races past the close lands in the oldest open second.

use crate::report::{
    ErrorCounts, SecondHistograms, SecondStats, SendSecond, StatusClasses, new_histogram,
};
use crate::schedule::Schedule;
use fanout_grpc::Code;
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::time::Duration;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A complete response with this status and body size; `partial` when it carried the
    /// `x-fanout-partial` header (optional steps fell back to their defaults).
    Response {
        /// HTTP status.
        status: u16,
        /// Body bytes.
        bytes: u64,
        /// `x-fanout-partial` was present.
        partial: bool,
        /// The gRPC verdict ([`crate::Protocol::Grpc`] runs only).
        grpc: Option<GrpcAnswer>,
    },
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

/// Whether a status is an explicit rejection (load shedding): 503 or 429.
pub(crate) fn is_rejection(status: u16) -> bool {
    status == 503 || status == 429
}

/// The gRPC status of an answer: its `grpc-status`, or, when it had none (`missing`), the code
/// a gRPC client reports for its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrpcAnswer {
    /// The code.
    pub code: Code,
    /// The answer carried no `grpc-status`.
    pub missing: bool,
}

/// Number of gRPC codes (0–16).
pub(crate) const GRPC_CODES: usize = 17;

#[derive(Debug)]
struct SecondAcc {
    sent: u64,
    completed: u64,
    ok: u64,
    errors: u64,
    rejected: u64,
    timeouts: u64,
    partial: u64,
    latency: Histogram<u64>,
    ok_latency: Histogram<u64>,
    rejected_latency: Histogram<u64>,
    lag: Histogram<u64>,
}

impl SecondAcc {
    fn new(high_us: u64) -> SecondAcc {
        SecondAcc {
            sent: 0,
            completed: 0,
            ok: 0,
            errors: 0,
            rejected: 0,
            timeouts: 0,
            partial: 0,
            latency: new_histogram(high_us),
            ok_latency: new_histogram(high_us),
            rejected_latency: new_histogram(high_us),
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
    /// Latency of 2xx responses.
    pub ok_latency: Histogram<u64>,
    /// Latency of rejections (503/429).
    pub rejected_latency: Histogram<u64>,
    /// Requests picked up by a worker (each has a lag sample).
    pub dispatched: u64,
    pub sent: u64,
    /// Finished requests that had been sent.
    pub sent_finished: u64,
    /// All finished requests (with an outcome).
    pub finished: u64,
    pub completed: u64,
    pub ok: u64,
    /// 503/429 responses.
    pub rejected: u64,
    /// 2xx responses with `x-fanout-partial`.
    pub partial: u64,
    pub late: u64,
    pub bytes: u64,
    pub classes: StatusClasses,
    pub errors: ErrorCounts,
    /// gRPC answers by code (index = code number).
    pub grpc_codes: [u64; GRPC_CODES],
    /// gRPC answers without a `grpc-status`.
    pub grpc_missing: u64,
    open: VecDeque<SecondAcc>,
    first_open: u64,
    /// Raw histograms of the closed seconds, in order.
    pub closed_histograms: Vec<SecondHistograms>,
    /// Outcomes by the second of the *intended* send time: `[ok, rejected, other ended]`.
    by_send: Vec<[u64; 3]>,
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
            ok_latency: new_histogram(high_us),
            rejected_latency: new_histogram(high_us),
            dispatched: 0,
            sent: 0,
            sent_finished: 0,
            finished: 0,
            completed: 0,
            ok: 0,
            rejected: 0,
            partial: 0,
            late: 0,
            bytes: 0,
            classes: StatusClasses::default(),
            errors: ErrorCounts::default(),
            grpc_codes: [0; GRPC_CODES],
            grpc_missing: 0,
            open: VecDeque::new(),
            first_open: 0,
            closed_histograms: Vec::new(),
            by_send: Vec::new(),
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

    /// A request ended. `sec` is the second it ended in, `intended_sec` the second it was
    /// scheduled for. `latency_us` (from the intended time) and `service_us` (from the actual
    /// send) are recorded when given. Returns the number of finished requests.
    pub fn on_finish(
        &mut self,
        sec: u64,
        intended_sec: u64,
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
        // 0 = ok, 1 = rejected, 2 = anything else.
        let mut kind = 2;
        let mut partial = false;
        match outcome {
            Outcome::Response {
                status,
                bytes,
                partial: p,
                grpc,
            } => {
                self.completed += 1;
                self.bytes += bytes;
                self.classes.add(status);
                let success = (200..300).contains(&status);
                // gRPC: success needs `grpc-status: 0` too; RESOURCE_EXHAUSTED and UNAVAILABLE
                // (the codes of 429 and 503) are rejections like those statuses.
                let (ok, rejection) = match grpc {
                    None => (success, is_rejection(status)),
                    Some(g) => {
                        if let Some(n) = self.grpc_codes.get_mut(g.code as usize) {
                            *n += 1;
                        }
                        if g.missing {
                            self.grpc_missing += 1;
                        }
                        (
                            success && g.code == Code::Ok,
                            is_rejection(status) || is_rejection(g.code.http_status().as_u16()),
                        )
                    }
                };
                if ok {
                    self.ok += 1;
                    kind = 0;
                    if p {
                        self.partial += 1;
                        partial = true;
                    }
                } else if rejection {
                    self.rejected += 1;
                    kind = 1;
                }
            }
            Outcome::Timeout => self.errors.timeout += 1,
            Outcome::ConnectRefused => self.errors.connect_refused += 1,
            Outcome::ConnectTimeout => self.errors.connect_timeout += 1,
            Outcome::Reset => self.errors.reset += 1,
            Outcome::Other => self.errors.other_network += 1,
        }
        if let Ok(i) = usize::try_from(intended_sec)
            && i < 1 << 24
        {
            if self.by_send.len() <= i {
                self.by_send.resize(i + 1, [0; 3]);
            }
            self.by_send[i][kind] += 1;
        }
        match (kind, latency_us) {
            (0, Some(l)) => self.ok_latency.saturating_record(l),
            (1, Some(l)) => self.rejected_latency.saturating_record(l),
            _ => {}
        }
        let s = self.second(sec);
        match outcome {
            Outcome::Response { .. } => s.completed += 1,
            Outcome::Timeout => {
                s.errors += 1;
                s.timeouts += 1;
            }
            _ => s.errors += 1,
        }
        match kind {
            0 => {
                s.ok += 1;
                if partial {
                    s.partial += 1;
                }
            }
            1 => s.rejected += 1,
            _ => {}
        }
        if let Some(l) = latency_us {
            s.latency.saturating_record(l);
            match kind {
                0 => s.ok_latency.saturating_record(l),
                1 => s.rejected_latency.saturating_record(l),
                _ => {}
            }
        }
        self.finished
    }

    /// Outcomes by intended send second, `0..seconds`, with `offered` from the schedule (what
    /// never ended — aborted at the end, never sent — counts as `failed`).
    pub fn by_send_second(&self, seconds: u64, schedule: &Schedule) -> Vec<SendSecond> {
        (0..seconds)
            .map(|t| {
                let offered = schedule
                    .requests_before(Duration::from_secs(t + 1))
                    .saturating_sub(schedule.requests_before(Duration::from_secs(t)));
                let [ok, rejected, _] = usize::try_from(t)
                    .ok()
                    .and_then(|i| self.by_send.get(i))
                    .copied()
                    .unwrap_or([0; 3]);
                SendSecond {
                    t,
                    offered,
                    ok,
                    rejected,
                    failed: offered.saturating_sub(ok + rejected),
                }
            })
            .collect()
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
                rejected: acc.rejected,
                timeouts: acc.timeouts,
                partial: acc.partial,
                p50_ms: q(&acc.latency, 0.5),
                p99_ms: q(&acc.latency, 0.99),
                ok_p50_ms: q(&acc.ok_latency, 0.5),
                ok_p99_ms: q(&acc.ok_latency, 0.99),
                rejected_p99_ms: q(&acc.rejected_latency, 0.99),
                max_ms: if acc.latency.is_empty() {
                    0.0
                } else {
                    ms(acc.latency.max())
                },
                lag_p99_ms: q(&acc.lag, 0.99),
            });
            self.closed_histograms.push(SecondHistograms {
                ok: acc.ok_latency,
                rejected: acc.rejected_latency,
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
            0,
            Outcome::Response {
                status: 200,
                bytes: 10,
                partial: false,
                grpc: None,
            },
            true,
            Some(2_000),
            Some(1_900),
        );
        r.on_finish(1, 0, Outcome::Timeout, true, Some(200_000), Some(195_000));
        r.on_finish(1, 0, Outcome::ConnectRefused, false, None, None);
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

    #[test]
    fn rejections_partials_and_outcomes_by_send_second() {
        let sch = match Schedule::parse("const(4,2s)") {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let mut r = Recorder::new(10_000_000, Duration::from_millis(1));
        let resp = |status, partial| Outcome::Response {
            status,
            bytes: 1,
            partial,
            grpc: None,
        };
        r.on_finish(0, 0, resp(200, false), true, Some(1_000), None);
        r.on_finish(0, 0, resp(200, true), true, Some(3_000), None);
        r.on_finish(0, 0, resp(503, false), true, Some(500), None);
        r.on_finish(1, 0, resp(429, false), true, Some(700), None);
        r.on_finish(1, 1, resp(500, false), true, Some(900), None);
        r.on_finish(1, 1, Outcome::Timeout, true, Some(1_000_000), None);
        let secs = r.close_seconds(2, &sch);
        assert_eq!(
            (
                secs[0].ok,
                secs[0].partial,
                secs[0].rejected,
                secs[0].timeouts
            ),
            (2, 1, 1, 0)
        );
        assert_eq!(
            (secs[1].rejected, secs[1].timeouts, secs[1].errors),
            (1, 1, 1)
        );
        assert!((secs[0].ok_p99_ms - 3.0).abs() < 0.01);
        assert!((secs[0].rejected_p99_ms - 0.5).abs() < 0.01);
        assert_eq!(r.closed_histograms.len(), 2);
        assert_eq!(r.closed_histograms[0].ok.len(), 2);
        assert_eq!((r.rejected, r.partial, r.ok), (2, 1, 2));
        let by = r.by_send_second(2, &sch);
        assert_eq!(by.len(), 2);
        assert_eq!(
            (by[0].offered, by[0].ok, by[0].rejected, by[0].failed),
            (4, 2, 2, 0)
        );
        // Second 1: 4 offered, 2 ended badly, 2 never ended — all failed.
        assert_eq!((by[1].ok, by[1].rejected, by[1].failed), (0, 0, 4));
    }

    #[test]
    fn grpc_answers_are_judged_by_their_code() {
        let mut r = Recorder::new(10_000_000, Duration::from_millis(1));
        let resp = |status, code, missing| Outcome::Response {
            status,
            bytes: 0,
            partial: false,
            grpc: Some(GrpcAnswer { code, missing }),
        };
        r.on_finish(0, 0, resp(200, Code::Ok, false), true, Some(1), None);
        r.on_finish(
            0,
            0,
            resp(200, Code::Unavailable, false),
            true,
            Some(1),
            None,
        );
        r.on_finish(
            0,
            0,
            resp(200, Code::ResourceExhausted, false),
            true,
            Some(1),
            None,
        );
        r.on_finish(0, 0, resp(200, Code::NotFound, false), true, Some(1), None);
        r.on_finish(0, 0, resp(200, Code::Unknown, true), true, Some(1), None);
        // HTTP 500 with grpc-status 0 is not a success.
        r.on_finish(0, 0, resp(500, Code::Ok, false), true, Some(1), None);
        assert_eq!((r.completed, r.ok, r.rejected), (6, 1, 2));
        assert_eq!(r.classes.s2xx, 5);
        assert_eq!(r.grpc_codes[0], 2);
        assert_eq!(r.grpc_codes[Code::Unavailable as usize], 1);
        assert_eq!(r.grpc_codes[Code::Unknown as usize], 1);
        assert_eq!(r.grpc_missing, 1);
    }
}
