//! The result of a run: [`LoadReport`] (the `--json` schema) and its human summary.
//!
//! All latencies are in milliseconds (f64, from microsecond-resolution HdrHistograms with 3
//! significant digits). The raw histograms stay on the report (not serialised) so the lab can
//! merge trials without averaging percentiles.

use crate::Protocol;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl LatencyStats {
    /// Percentiles of a histogram of microseconds, in milliseconds (all 0 when empty).
    pub fn from_histogram(h: &Histogram<u64>) -> LatencyStats {
        if h.is_empty() {
            return LatencyStats::default();
        }
        LatencyStats {
            p50: quantile_ms(h, 0.50),
            p90: quantile_ms(h, 0.90),
            p95: quantile_ms(h, 0.95),
            p99: quantile_ms(h, 0.99),
            p999: quantile_ms(h, 0.999),
            max: us_to_ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

/// Scheduling-lag percentiles in milliseconds (actual dispatch − intended send time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LagStats {
    /// Median lag.
    pub p50: f64,
    /// 99th percentile lag; the run is invalid when it exceeds the spec's `lag_threshold`.
    pub p99: f64,
    /// Largest lag.
    pub max: f64,
}

impl LagStats {
    /// Lag percentiles of a histogram of microseconds, in milliseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> LagStats {
        if h.is_empty() {
            return LagStats::default();
        }
        LagStats {
            p50: quantile_ms(h, 0.50),
            p99: quantile_ms(h, 0.99),
            max: us_to_ms(h.max()),
        }
    }
}

/// Responses by HTTP status class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusClasses {
    /// Informational (100–199).
    #[serde(rename = "1xx")]
    pub s1xx: u64,
    /// Success (200–299).
    #[serde(rename = "2xx")]
    pub s2xx: u64,
    /// Redirection (300–399).
    #[serde(rename = "3xx")]
    pub s3xx: u64,
    /// Client error (400–499).
    #[serde(rename = "4xx")]
    pub s4xx: u64,
    /// Server error (500–599).
    #[serde(rename = "5xx")]
    pub s5xx: u64,
}

impl StatusClasses {
    pub(crate) fn add(&mut self, status: u16) {
        match status / 100 {
            1 => self.s1xx += 1,
            2 => self.s2xx += 1,
            3 => self.s3xx += 1,
            4 => self.s4xx += 1,
            _ => self.s5xx += 1,
        }
    }

    /// `(class name, count)` pairs in order.
    pub fn iter(&self) -> [(&'static str, u64); 5] {
        [
            ("1xx", self.s1xx),
            ("2xx", self.s2xx),
            ("3xx", self.s3xx),
            ("4xx", self.s4xx),
            ("5xx", self.s5xx),
        ]
    }
}

/// Requests that got no HTTP response, by cause. Every offered request ends up either
/// `completed` or in exactly one of these classes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    /// No complete response within the per-request timeout (latency recorded at the timeout).
    pub timeout: u64,
    /// The target refused the TCP connection (ECONNREFUSED).
    pub connect_refused: u64,
    /// The TCP connection was not established within the timeout.
    pub connect_timeout: u64,
    /// The connection was reset or closed mid-exchange (ECONNRESET, broken pipe, incomplete
    /// message, HTTP/2 RST_STREAM or GOAWAY).
    pub reset: u64,
    /// Any other network or protocol error.
    pub other_network: u64,
    /// Sent, but still in flight when the drain period after the schedule ended.
    pub aborted_at_end: u64,
    /// Never sent: still queued in the generator (connection pool exhausted, generator too
    /// slow) when the drain period ended. Never silently dropped.
    pub not_sent: u64,
}

impl ErrorCounts {
    /// Sum of all classes.
    pub fn total(&self) -> u64 {
        self.iter().iter().map(|(_, n)| n).sum()
    }

    /// `(class name, count)` pairs in schema order.
    pub fn iter(&self) -> [(&'static str, u64); 7] {
        [
            ("timeout", self.timeout),
            ("connect_refused", self.connect_refused),
            ("connect_timeout", self.connect_timeout),
            ("reset", self.reset),
            ("other_network", self.other_network),
            ("aborted_at_end", self.aborted_at_end),
            ("not_sent", self.not_sent),
        ]
    }
}

/// Statistics of one second of the run (`t` = seconds since the start of the schedule).
///
/// `offered` counts requests *intended* in the second; `sent` counts actual sends in it;
/// `completed`, `ok`, `errors` and the latency figures count requests that *finished* in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondStats {
    /// Second index since the start (0, 1, 2, …).
    pub t: u64,
    /// Requests the schedule intended to send in this second.
    pub offered: u64,
    /// Requests actually sent in this second.
    pub sent: u64,
    /// Responses (any status) received in this second.
    pub completed: u64,
    /// 2xx responses received in this second.
    pub ok: u64,
    /// Requests that ended without a response in this second (timeouts and network errors;
    /// non-2xx responses are `completed − ok`).
    pub errors: u64,
    /// Median latency (from the intended send time) of requests finished in this second.
    pub p50_ms: f64,
    /// 99th percentile latency of requests finished in this second.
    pub p99_ms: f64,
    /// Largest latency of requests finished in this second.
    pub max_ms: f64,
    /// 99th percentile scheduling lag of the dispatches in this second.
    pub lag_p99_ms: f64,
    /// Rejections (503 and 429 responses, counted in `completed`) received in this second.
    #[serde(default)]
    pub rejected: u64,
    /// Timeouts (counted in `errors`) that ended in this second.
    #[serde(default)]
    pub timeouts: u64,
    /// 2xx responses carrying `x-fanout-partial` (optional steps fell back to their defaults).
    #[serde(default)]
    pub partial: u64,
    /// Median latency of the 2xx responses received in this second.
    #[serde(default)]
    pub ok_p50_ms: f64,
    /// 99th percentile latency of the 2xx responses received in this second.
    #[serde(default)]
    pub ok_p99_ms: f64,
    /// 99th percentile latency of the rejections received in this second.
    #[serde(default)]
    pub rejected_p99_ms: f64,
}

/// Raw per-second histograms (µs) behind [`SecondStats`]' `ok_*` and `rejected_*` figures, so
/// a window of seconds can be merged without averaging percentiles.
#[derive(Debug, Clone)]
pub struct SecondHistograms {
    /// Latency of 2xx responses received in the second.
    pub ok: Histogram<u64>,
    /// Latency of rejections (503/429) received in the second.
    pub rejected: Histogram<u64>,
}

/// Outcomes of the requests *scheduled* in one second (by intended send time, not by when they
/// ended): what a client that sent in that second experienced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendSecond {
    /// Second index since the start.
    pub t: u64,
    /// Requests scheduled in the second.
    pub offered: u64,
    /// Of those, 2xx responses.
    pub ok: u64,
    /// Of those, rejections (503/429).
    pub rejected: u64,
    /// Of those, everything else: other statuses, timeouts, network errors, aborted or never
    /// sent (`offered − ok − rejected`).
    pub failed: u64,
}

/// The result of [`crate::run`]; serialised as-is by `fanout load --json`.
///
/// Accounting: `offered = completed + errors.total()`; `sent` counts requests written to a
/// connection (it excludes `connect_refused`, `connect_timeout` and `not_sent`). Latency
/// statistics cover every response (any status), timeouts and connect timeouts (those two
/// recorded at the timeout value), so fast errors do not flatter the percentiles and slow
/// failures are not hidden.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadReport {
    /// Where the load was sent: the base URL (`fanout load` puts the whole URL given here).
    pub target: String,
    /// `http1`, `http2` or `grpc`.
    pub protocol: Protocol,
    /// The schedule in Tank syntax (normalised).
    pub schedule: String,
    /// Length of the schedule in seconds (rates are per this window).
    pub duration_s: f64,
    /// Wall time of the run in seconds, including the drain after the schedule.
    pub elapsed_s: f64,
    /// Requests the schedule asked for.
    pub offered: u64,
    /// Requests written to a connection.
    pub sent: u64,
    /// Requests that got a complete HTTP response (any status).
    pub completed: u64,
    /// Responses with a 2xx status (gRPC: and `grpc-status: 0`).
    pub ok: u64,
    /// Rejections: 503 and 429 responses (explicit load shedding; counted in `completed`);
    /// for gRPC also `RESOURCE_EXHAUSTED` and `UNAVAILABLE` answers.
    #[serde(default)]
    pub rejected: u64,
    /// 2xx responses carrying `x-fanout-partial` (optional steps fell back to their defaults).
    #[serde(default)]
    pub partial: u64,
    /// `offered / duration_s`.
    pub offered_rps: f64,
    /// `completed / duration_s` (what the `rate` threshold checks).
    pub achieved_rps: f64,
    /// Responses by status class.
    pub status_classes: StatusClasses,
    /// Requests without a response, by cause.
    pub errors: ErrorCounts,
    /// gRPC runs ([`Protocol::Grpc`]): completed answers by gRPC code name (`OK` included;
    /// codes never seen left out), e.g. `{"OK": 985, "UNAVAILABLE": 12}`. An answer without
    /// `grpc-status` is counted under the code a gRPC client reports for its HTTP status (200:
    /// `UNKNOWN`; see [`crate::grpc`]). `None` for HTTP runs (and then absent from the JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<BTreeMap<String, u64>>,
    /// gRPC runs: answers that carried no `grpc-status` at all (a protocol error of the
    /// target, also counted in `grpc_status`). `None` for HTTP runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_missing_status: Option<u64>,
    /// `(completed − ok + errors.total()) / offered`: everything that was not a 2xx (for gRPC:
    /// not a 2xx with `grpc-status: 0`), over what the schedule asked for (0 when nothing was
    /// offered).
    pub error_rate: f64,
    /// Latency from the *intended* send time to the end of the response body
    /// (coordinated-omission free; the headline figure).
    pub latency_ms: LatencyStats,
    /// Latency of the 2xx responses only (from the intended send time).
    #[serde(default)]
    pub ok_latency_ms: LatencyStats,
    /// Latency of the rejections (503/429) only (from the intended send time).
    #[serde(default)]
    pub rejected_latency_ms: LatencyStats,
    /// Latency from the *actual* dispatch (a worker with a connection slot picked the request
    /// up; a new connection's connect time is included) to the end of the body — what a
    /// closed-loop tool reports. `latency = lag + service` per request.
    pub service_ms: LatencyStats,
    /// Scheduling lag: actual dispatch − intended send time (pacer overshoot, worker wake-up,
    /// and queueing for a free connection when the pool is exhausted).
    pub lag_ms: LagStats,
    /// Share of dispatches more than `lag_threshold` (default 1 ms) behind schedule.
    pub late_fraction: f64,
    /// `false` when the generator could not keep the schedule (lag p99 above the threshold,
    /// or requests left unsent); the latency figures then describe the generator, not the target.
    pub valid: bool,
    /// Why the run is invalid (`None` when valid).
    pub invalid_reason: Option<String>,
    /// TCP connections opened during the run.
    pub connections_opened: u64,
    /// Most connections open at the same time.
    pub max_connections_used: u64,
    /// Response body bytes received (bodies are read fully).
    pub bytes_received: u64,
    /// Server-Sent Events received (blank lines ending an event, counted across every answer),
    /// when [`crate::LoadSpec::count_events`] asked for them; `None` (absent from the JSON)
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// Per-second statistics, in order.
    pub seconds: Vec<SecondStats>,
    /// Outcomes by intended send second, one entry per second of the schedule.
    #[serde(default)]
    pub by_send_second: Vec<SendSecond>,
    /// Raw per-second histograms of 2xx and rejection latency, parallel to `seconds` (not
    /// serialised).
    #[serde(skip)]
    pub second_histograms: Vec<SecondHistograms>,
    /// Raw histogram behind `latency_ms`, in microseconds (not serialised).
    #[serde(skip, default = "empty_histogram")]
    pub latency_hist: Histogram<u64>,
    /// Raw histogram behind `service_ms`, in microseconds (not serialised).
    #[serde(skip, default = "empty_histogram")]
    pub service_hist: Histogram<u64>,
    /// Raw histogram behind `lag_ms`, in microseconds (not serialised).
    #[serde(skip, default = "empty_histogram")]
    pub lag_hist: Histogram<u64>,
}

/// An empty auto-resizing microsecond histogram with 3 significant digits (what the report's
/// raw histograms are; merge trials into one of these with `Histogram::add`).
pub fn empty_histogram() -> Histogram<u64> {
    new_histogram(1_000_000)
}

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

fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    us_to_ms(h.value_at_quantile(q))
}

/// Format milliseconds with a precision that suits the magnitude.
pub(crate) fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// `OK 985, UNAVAILABLE 12  (3 without grpc-status)`: codes in numeric order.
fn grpc_line(codes: &BTreeMap<String, u64>, missing: Option<u64>) -> String {
    let mut by_number: Vec<(i32, &str, u64)> = codes
        .iter()
        .map(|(name, n)| {
            let num = fanout_grpc::Code::from_name(name).map_or(i32::MAX, |c| c.as_i32());
            (num, name.as_str(), *n)
        })
        .collect();
    by_number.sort_unstable();
    let mut line = if by_number.is_empty() {
        "no answers".to_string()
    } else {
        by_number
            .iter()
            .map(|(_, name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(m) = missing.filter(|m| *m > 0) {
        let _ = write!(line, "  ({m} without grpc-status)");
    }
    line
}

/// A human summary: offered vs achieved rate, percentiles, errors by class, and a loud
/// WARNING line when the run is invalid.
pub fn summary_text(r: &LoadReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "target     {} ({}), schedule {}, {:.1} s (+{:.1} s drain)",
        r.target,
        r.protocol,
        r.schedule,
        r.duration_s,
        (r.elapsed_s - r.duration_s).max(0.0)
    );
    let _ = writeln!(
        s,
        "rate       offered {} req ({:.1}/s), sent {}, completed {} ({:.1}/s), ok {}",
        r.offered, r.offered_rps, r.sent, r.completed, r.achieved_rps, r.ok
    );
    let lat = |l: &LatencyStats| {
        format!(
            "p50 {}  p90 {}  p95 {}  p99 {}  p99.9 {}  max {}  mean {}",
            fmt_ms(l.p50),
            fmt_ms(l.p90),
            fmt_ms(l.p95),
            fmt_ms(l.p99),
            fmt_ms(l.p999),
            fmt_ms(l.max),
            fmt_ms(l.mean)
        )
    };
    let _ = writeln!(s, "latency    {}  (from intended send)", lat(&r.latency_ms));
    let _ = writeln!(
        s,
        "service    {}  (from actual dispatch)",
        lat(&r.service_ms)
    );
    let _ = writeln!(
        s,
        "lag        p50 {}  p99 {}  max {}  late {:.2}%",
        fmt_ms(r.lag_ms.p50),
        fmt_ms(r.lag_ms.p99),
        fmt_ms(r.lag_ms.max),
        r.late_fraction * 100.0
    );
    let statuses: Vec<String> = r
        .status_classes
        .iter()
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    let mut extra = String::new();
    if r.rejected > 0 {
        let _ = write!(
            extra,
            "  (rejected {}: {}, p99 {})",
            if r.grpc_status.is_some() {
                "503/429/RESOURCE_EXHAUSTED/UNAVAILABLE"
            } else {
                "503/429"
            },
            r.rejected,
            fmt_ms(r.rejected_latency_ms.p99)
        );
    }
    if r.partial > 0 {
        let _ = write!(extra, "  (partial 2xx: {})", r.partial);
    }
    let _ = writeln!(
        s,
        "status     {}{extra}",
        if statuses.is_empty() {
            "no responses".to_string()
        } else {
            statuses.join(", ")
        }
    );
    if let Some(codes) = &r.grpc_status {
        let _ = writeln!(s, "grpc       {}", grpc_line(codes, r.grpc_missing_status));
    }
    let errors: Vec<String> = r
        .errors
        .iter()
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    let _ = writeln!(
        s,
        "errors     {}  (error rate {:.2}%)",
        if errors.is_empty() {
            "none".to_string()
        } else {
            errors.join(", ")
        },
        r.error_rate * 100.0
    );
    let _ = writeln!(
        s,
        "conns      opened {}, max open {}, {} bytes received",
        r.connections_opened, r.max_connections_used, r.bytes_received
    );
    if !r.valid {
        let _ = writeln!(
            s,
            "WARNING: INVALID RUN: {}. The figures above describe the load generator, not the target.",
            r.invalid_reason
                .as_deref()
                .unwrap_or("generator fell behind schedule")
        );
    }
    s
}
