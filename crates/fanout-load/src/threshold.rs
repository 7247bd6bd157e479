//! k6-style pass/fail thresholds checked against a finished [`LoadReport`].
//!
//! Syntax: `METRIC OP VALUE`, e.g. `p99<50ms`, `p50<=10ms`, `errors<1%`, `rate>=950`.
//!
//! | metric                                           | value                                              |
//! |--------------------------------------------------|----------------------------------------------------|
//! | `p50` `p90` `p95` `p99` `p999` (`p99.9`) `max` `mean` | latency from the intended send: `50ms`, `1.5s`, `800us`, `1m30s`; a bare number is ms |
//! | `errors` (`error_rate`)                          | `1%` or a fraction `0.01` of offered requests      |
//! | `rate` (`rps`)                                   | achieved completed requests per second (`950`, `950/s`) |
//!
//! Operators: `<`, `<=`, `>`, `>=`.

use crate::report::{LoadReport, fmt_ms};
use fanout_config::{BareNumber, DurationError};
use std::fmt;

/// Which report figure a threshold checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Latency percentile (ms) from `latency_ms`; the field name (`p50` … `p999`).
    Latency(LatencyField),
    /// `error_rate` (fraction).
    ErrorRate,
    /// `achieved_rps` (completed per second).
    Rate,
}

/// A field of `latency_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyField {
    /// Median.
    P50,
    /// 90th percentile.
    P90,
    /// 95th percentile.
    P95,
    /// 99th percentile.
    P99,
    /// 99.9th percentile.
    P999,
    /// Maximum.
    Max,
    /// Mean.
    Mean,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Op {
    fn holds(self, actual: f64, limit: f64) -> bool {
        match self {
            Op::Lt => actual < limit,
            Op::Le => actual <= limit,
            Op::Gt => actual > limit,
            Op::Ge => actual >= limit,
        }
    }

    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// A pass/fail condition on a report, e.g. `p99<50ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// What is checked.
    pub metric: Metric,
    /// How it is compared.
    pub op: Op,
    /// The limit, in the metric's unit: milliseconds, a fraction, or requests per second.
    pub value: f64,
    text: String,
}

/// Why a threshold string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    /// No operator found.
    #[error("threshold `{0}`: expected METRIC OP VALUE, e.g. `p99<50ms`, `errors<1%`, `rate>=950`")]
    Syntax(String),
    /// Unknown metric name.
    #[error(
        "threshold `{text}`: unknown metric `{metric}`; expected p50, p90, p95, p99, p999, max, mean, errors or rate"
    )]
    Metric {
        /// The whole threshold.
        text: String,
        /// The metric as written.
        metric: String,
    },
    /// A latency limit that is not a duration.
    #[error(
        "threshold `{text}`: invalid value `{value}`: {}; {}",
        .error.problem,
        .error.bare.accepted_forms()
    )]
    Latency {
        /// The whole threshold.
        text: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        error: DurationError,
    },
    /// The value does not parse for this metric.
    #[error("threshold `{text}`: invalid value `{value}`: {hint}")]
    Value {
        /// The whole threshold.
        text: String,
        /// The value as written.
        value: String,
        /// What was expected.
        hint: &'static str,
    },
}

impl Threshold {
    /// Parse `p99<50ms`, `p50<=10ms`, `errors<1%`, `rate>=950` (whitespace allowed).
    pub fn parse(s: &str) -> Result<Threshold, ThresholdError> {
        let text: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        let Some(op_at) = text.find(['<', '>']) else {
            return Err(ThresholdError::Syntax(s.to_string()));
        };
        let (name, rest) = text.split_at(op_at);
        let (op, value) = if let Some(v) = rest.strip_prefix("<=") {
            (Op::Le, v)
        } else if let Some(v) = rest.strip_prefix(">=") {
            (Op::Ge, v)
        } else if let Some(v) = rest.strip_prefix('<') {
            (Op::Lt, v)
        } else if let Some(v) = rest.strip_prefix('>') {
            (Op::Gt, v)
        } else {
            return Err(ThresholdError::Syntax(s.to_string()));
        };
        if name.is_empty() || value.is_empty() {
            return Err(ThresholdError::Syntax(s.to_string()));
        }
        let metric = match name.to_ascii_lowercase().as_str() {
            "p50" | "median" => Metric::Latency(LatencyField::P50),
            "p90" => Metric::Latency(LatencyField::P90),
            "p95" => Metric::Latency(LatencyField::P95),
            "p99" => Metric::Latency(LatencyField::P99),
            "p999" | "p99.9" => Metric::Latency(LatencyField::P999),
            "max" => Metric::Latency(LatencyField::Max),
            "mean" | "avg" => Metric::Latency(LatencyField::Mean),
            "errors" | "error_rate" => Metric::ErrorRate,
            "rate" | "rps" => Metric::Rate,
            _ => {
                return Err(ThresholdError::Metric {
                    text: s.to_string(),
                    metric: name.to_string(),
                });
            }
        };
        let bad = |hint| ThresholdError::Value {
            text: s.to_string(),
            value: value.to_string(),
            hint,
        };
        let num = |v: &str, hint| -> Result<f64, ThresholdError> {
            match v.parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
                _ => Err(bad(hint)),
            }
        };
        let value = match metric {
            Metric::Latency(_) => latency_ms(value).map_err(|error| ThresholdError::Latency {
                text: s.to_string(),
                value: value.to_string(),
                error,
            })?,
            Metric::ErrorRate => {
                const HINT: &str =
                    "expected a percentage such as `1%` or a fraction such as `0.01`";
                match value.strip_suffix('%') {
                    Some(p) => num(p, HINT)? / 100.0,
                    None => {
                        let f = num(value, HINT)?;
                        if f > 1.0 {
                            return Err(bad(
                                "a bare number is a fraction (0–1); write a percentage as `5%`",
                            ));
                        }
                        f
                    }
                }
            }
            Metric::Rate => {
                let v = value
                    .strip_suffix("/s")
                    .or_else(|| value.strip_suffix("rps"))
                    .unwrap_or(value);
                num(v, "expected requests per second such as `950` or `950/s`")?
            }
        };
        Ok(Threshold {
            metric,
            op,
            value,
            text: s.trim().to_string(),
        })
    }

    /// The figure this threshold checks, from a report.
    pub fn actual(&self, r: &LoadReport) -> f64 {
        match self.metric {
            Metric::Latency(f) => {
                let l = &r.latency_ms;
                match f {
                    LatencyField::P50 => l.p50,
                    LatencyField::P90 => l.p90,
                    LatencyField::P95 => l.p95,
                    LatencyField::P99 => l.p99,
                    LatencyField::P999 => l.p999,
                    LatencyField::Max => l.max,
                    LatencyField::Mean => l.mean,
                }
            }
            Metric::ErrorRate => r.error_rate,
            Metric::Rate => r.achieved_rps,
        }
    }

    /// `None` when the threshold holds, else a message such as `p99<50ms failed: p99 was 73.2 ms`.
    pub fn check(&self, r: &LoadReport) -> Option<String> {
        let actual = self.actual(r);
        if self.op.holds(actual, self.value) {
            return None;
        }
        let (name, shown) = match self.metric {
            Metric::Latency(f) => (latency_name(f), fmt_ms(actual)),
            Metric::ErrorRate => ("error rate", format!("{:.3}%", actual * 100.0)),
            Metric::Rate => ("achieved rate", format!("{actual:.1}/s")),
        };
        Some(format!("{} failed: {name} was {shown}", self.text))
    }
}

fn latency_name(f: LatencyField) -> &'static str {
    match f {
        LatencyField::P50 => "p50",
        LatencyField::P90 => "p90",
        LatencyField::P95 => "p95",
        LatencyField::P99 => "p99",
        LatencyField::P999 => "p99.9",
        LatencyField::Max => "max",
        LatencyField::Mean => "mean",
    }
}

impl std::str::FromStr for Threshold {
    type Err = ThresholdError;
    fn from_str(s: &str) -> Result<Threshold, ThresholdError> {
        Threshold::parse(s)
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A latency limit in milliseconds: [`fanout_config::parse_millis_f64`] with a bare number of
/// milliseconds (`50ms`, `1.5s`, `800us`, `3`).
fn latency_ms(value: &str) -> Result<f64, DurationError> {
    fanout_config::parse_millis_f64(value, BareNumber::Millis)
}

/// Check thresholds against a report; returns one message per failed threshold (empty = pass).
pub fn check_thresholds(report: &LoadReport, thresholds: &[Threshold]) -> Vec<String> {
    thresholds.iter().filter_map(|t| t.check(report)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{LatencyStats, empty_histogram};
    use crate::{ErrorCounts, LagStats, Protocol, StatusClasses};

    fn t(s: &str) -> Threshold {
        match Threshold::parse(s) {
            Ok(t) => t,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    fn report() -> LoadReport {
        LoadReport {
            target: "http://x".into(),
            protocol: Protocol::Http1,
            schedule: "const(1000,1s)".into(),
            duration_s: 1.0,
            elapsed_s: 1.0,
            offered: 1000,
            sent: 1000,
            completed: 990,
            ok: 985,
            rejected: 0,
            partial: 0,
            offered_rps: 1000.0,
            achieved_rps: 990.0,
            status_classes: StatusClasses::default(),
            errors: ErrorCounts {
                timeout: 10,
                ..ErrorCounts::default()
            },
            grpc_status: None,
            grpc_missing_status: None,
            error_rate: 0.015,
            latency_ms: LatencyStats {
                p50: 10.0,
                p90: 20.0,
                p95: 30.0,
                p99: 49.0,
                p999: 80.0,
                max: 100.0,
                mean: 12.0,
            },
            ok_latency_ms: LatencyStats::default(),
            rejected_latency_ms: LatencyStats::default(),
            service_ms: LatencyStats::default(),
            lag_ms: LagStats::default(),
            late_fraction: 0.0,
            valid: true,
            invalid_reason: None,
            connections_opened: 1,
            max_connections_used: 1,
            bytes_received: 0,
            events: None,
            seconds: vec![],
            by_send_second: vec![],
            second_histograms: vec![],
            latency_hist: empty_histogram(),
            service_hist: empty_histogram(),
            lag_hist: empty_histogram(),
        }
    }

    #[test]
    fn parses() {
        let p = t("p99<50ms");
        assert_eq!(
            (p.metric, p.op, p.value),
            (Metric::Latency(LatencyField::P99), Op::Lt, 50.0)
        );
        let p = t("p50 <= 10ms");
        assert_eq!((p.op, p.value), (Op::Le, 10.0));
        assert_eq!(t("p99.9<1.5s").value, 1500.0);
        assert_eq!(t("max<800us").value, 0.8);
        assert_eq!(t("mean<3").value, 3.0);
        assert_eq!(t("mean<3.25").value, 3.25);
        assert_eq!(t("p99<1m").value, 60_000.0);
        assert_eq!(t("p99<1min").value, 60_000.0);
        // Forms of the shared duration grammar that thresholds did not take before.
        assert_eq!(t("p99<1h").value, 3_600_000.0);
        assert_eq!(t("p99<1m30s").value, 90_000.0);
        assert_eq!(t("p99<250ns").value, 0.00025);
        let e = t("errors<1%");
        assert_eq!((e.metric, e.op), (Metric::ErrorRate, Op::Lt));
        assert!((e.value - 0.01).abs() < 1e-12);
        assert!((t("error_rate<0.05").value - 0.05).abs() < 1e-12);
        let r = t("rate>=950");
        assert_eq!((r.metric, r.op, r.value), (Metric::Rate, Op::Ge, 950.0));
        assert_eq!(t("rps>900/s").value, 900.0);
        assert_eq!(t("p99<50ms").to_string(), "p99<50ms");
    }

    #[test]
    fn rejects_with_clear_messages() {
        let msg = |s: &str| match Threshold::parse(s) {
            Ok(t) => panic!("{s} parsed as {t:?}"),
            Err(e) => e.to_string(),
        };
        assert!(msg("p99 50ms").contains("expected METRIC OP VALUE"));
        assert!(msg("p98<5ms").contains("unknown metric `p98`"));
        assert!(msg("p99<5parsecs").contains("invalid value `5parsecs`"));
        assert!(msg("errors<5").contains("fraction"));
        assert!(msg("rate>=fast").contains("requests per second"));
        assert!(msg("p99<").contains("expected METRIC OP VALUE"));
        assert!(msg("<5ms").contains("expected METRIC OP VALUE"));
        assert!(msg("p99<-5ms").contains("invalid value"));
        let e = msg("p99<5parsecs");
        assert!(e.contains("unknown unit `parsecs`"), "{e}");
        assert!(e.contains("bare number of milliseconds"), "{e}");
        assert!(msg("p99<1m30").contains("missing unit after `30`"));
        assert!(msg("p99<99999999999999999999999h").contains("too long"));
    }

    #[test]
    fn evaluates() {
        let r = report();
        let ths: Vec<Threshold> = [
            "p99<50ms",
            "p50<=10ms",
            "errors<2%",
            "rate>=950",
            "max<=0.1s",
        ]
        .iter()
        .map(|s| t(s))
        .collect();
        assert!(check_thresholds(&r, &ths).is_empty());
        let fails = check_thresholds(
            &r,
            &[
                t("p99<40ms"),
                t("errors<1%"),
                t("rate>=1000"),
                t("p50<10ms"),
            ],
        );
        assert_eq!(fails.len(), 4, "{fails:?}");
        assert_eq!(fails[0], "p99<40ms failed: p99 was 49.0 ms");
        assert!(fails[1].contains("error rate was 1.500%"), "{}", fails[1]);
        assert!(
            fails[2].contains("achieved rate was 990.0/s"),
            "{}",
            fails[2]
        );
    }
}
