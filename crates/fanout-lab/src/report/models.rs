//! The `antispam-models` part of a report (`report.json` → `models`): failed requests, failures
//! while a swap was being picked up, threads and RSS over the run, each model's status, the
//! issue's acceptance lines and the text summary. The scenario's models, swapper and Python
//! baseline are `crate::antispam`.

use super::{Acceptance, Stat};
use crate::model::Trial;
use crate::procstat::ProcSample;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A failure counts as "during a swap" when it ended within this many seconds after a rename:
/// fanout looks every second and waits 200 ms for the file to settle, the baseline every second.
pub const SWAP_WINDOW_S: f64 = 3.0;

/// Threads are compared from this many seconds after the target was ready: a thread fanout's
/// start-up took from tokio's blocking pool (reading the config) exits after the pool's 10 s
/// keep-alive; `threads_min`/`threads_max` cover the whole run.
pub const STARTUP_S: f64 = 12.0;

/// The models part of a run (`report.json` → `models`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelsReport {
    /// The model whose file is replaced.
    pub swap_model: String,
    /// What it alternates between.
    pub swap_files: Vec<String>,
    /// Seconds between replacements.
    pub swap_every_s: f64,
    /// When each replacement happened, seconds since the lab started.
    pub swaps_at_s: Vec<f64>,
    /// A failure ending within this many seconds after a swap counts as during it.
    pub swap_window_s: f64,
    /// Client connections opened before every trial.
    pub connections: usize,
    /// The models and what they are.
    pub models: Vec<(String, String)>,
    /// The long run's length (`--duration`), s.
    pub long_run_s: Option<f64>,
    /// Targets asked for that did not run, and why.
    pub not_run: BTreeMap<String, String>,
    /// Per target.
    pub targets: BTreeMap<String, ModelsTarget>,
}

/// One target's figures in a models run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelsTarget {
    /// Highest rate found with p99 < 10 ms, req/s.
    pub max_rate: Option<f64>,
    /// The interleaved levels.
    pub levels: Vec<ModelsLevel>,
    /// The long run (`--duration`).
    pub long_run: Option<ModelsLevel>,
    /// Requests of the measured trials (levels, long run).
    pub requests: u64,
    /// Of which failed (anything but grpc-status 0: errors, timeouts, not sent).
    pub failed: u64,
    /// Requests of every trial (search steps included) that ended within a swap window.
    pub requests_in_swap_windows: u64,
    /// Of which failed.
    pub failed_in_swap_windows: u64,
    /// The same, only in trials the target was not overloaded in (p99 within the SLO).
    pub failed_in_swap_windows_within_slo: u64,
    /// Fewest and most threads over the run (from start-up to the end).
    pub threads_min: u64,
    /// Most threads.
    pub threads_max: u64,
    /// Fewest threads from [`STARTUP_S`] after start to the end (idle, load, swaps).
    pub threads_steady_min: u64,
    /// Most threads over the same samples.
    pub threads_steady_max: u64,
    /// RSS when the target was ready, MB.
    pub rss_start_mb: f64,
    /// RSS at the end of the warm-up (the long run: its first fifth, at least 30 s), MB.
    pub rss_after_warmup_mb: f64,
    /// RSS at the end, MB.
    pub rss_end_mb: f64,
    /// (end − after warm-up) ÷ after warm-up, %.
    pub rss_growth_pct: f64,
    /// Most client connections open at once in a trial.
    pub connections_used: u64,
    /// fanout: `/__fanout/status` → `models` at the end; antispam-py: loads per model from its
    /// log.
    pub model_status: serde_json::Value,
}

/// One load level of one target over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelsLevel {
    /// `at-baseline-max`, `at-fanout-half`, `at-fanout-max`, `long`.
    pub name: String,
    /// Offered req/s.
    pub offered_rate: f64,
    /// 2xx (grpc-status 0) answers per second.
    pub achieved_rate: Stat,
    /// Answered requests per CPU-second of the target (1e6 ÷ CPU-µs per request).
    pub requests_per_cpu_s: Stat,
    /// CPU-µs per request.
    pub cpu_us_per_request: Stat,
    /// p50, ms (from the intended send time).
    pub p50_ms: Stat,
    /// p99, ms.
    pub p99_ms: Stat,
    /// Failed requests over the rounds.
    pub failed: u64,
    /// Most threads at the end of a trial.
    pub threads_max: u64,
    /// Largest RSS at the end of a trial, MB.
    pub rss_max_mb: f64,
    /// Highest generator lag p99 of the trials, ms.
    pub lag_p99_ms_max: f64,
    /// Every trial's generator kept its schedule.
    pub all_valid: bool,
}

fn failed(t: &Trial) -> u64 {
    t.load.offered.saturating_sub(t.load.ok)
}

fn level(name: &str, ts: &[&Trial]) -> ModelsLevel {
    let f = |g: &dyn Fn(&Trial) -> f64| Stat::of(ts.iter().map(|t| g(t)).collect());
    ModelsLevel {
        name: name.into(),
        offered_rate: ts.first().map_or(0.0, |t| t.offered_rate),
        achieved_rate: f(&|t| t.achieved_rate),
        requests_per_cpu_s: f(&|t| {
            if t.cpu_us_per_request > 0.0 {
                1e6 / t.cpu_us_per_request
            } else {
                f64::NAN
            }
        }),
        cpu_us_per_request: f(&|t| t.cpu_us_per_request),
        p50_ms: f(&|t| t.p50_ms),
        p99_ms: f(&|t| t.p99_ms),
        failed: ts.iter().map(|t| failed(t)).sum(),
        threads_max: ts.iter().map(|t| t.threads).max().unwrap_or(0),
        rss_max_mb: ts.iter().map(|t| t.rss_mb).fold(0.0, f64::max),
        lag_p99_ms_max: ts.iter().map(|t| t.lag_p99_ms).fold(0.0, f64::max),
        all_valid: ts.iter().all(|t| t.valid),
    }
}

/// Phases of the measured trials, in the order they are reported.
pub const LEVELS: [&str; 3] = ["at-baseline-max", "at-fanout-half", "at-fanout-max"];

/// What the run measured for one target.
pub struct TargetRun<'a> {
    /// Capacity found.
    pub max_rate: Option<f64>,
    /// Every trial of the run (all targets; filtered here).
    pub trials: &'a [Trial],
    /// /proc samples over the run, `t` from `started_at`.
    pub timeline: &'a [ProcSample],
    /// When the target's sampler started, seconds since the lab started.
    pub started_at: f64,
    /// When the warm-up ended, seconds since the lab started.
    pub warmup_end: f64,
    /// The model status.
    pub model_status: serde_json::Value,
    /// The SLO, ms.
    pub slo_p99_ms: f64,
}

/// A target's figures.
pub fn summarize(name: &str, run: &TargetRun<'_>, swaps: &[f64]) -> ModelsTarget {
    let mine: Vec<&Trial> = run.trials.iter().filter(|t| t.target == name).collect();
    let levels = LEVELS
        .iter()
        .filter_map(|l| {
            let ts: Vec<&Trial> = mine.iter().copied().filter(|t| t.phase == *l).collect();
            (!ts.is_empty()).then(|| level(l, &ts))
        })
        .collect();
    let long: Vec<&Trial> = mine.iter().copied().filter(|t| t.phase == "long").collect();
    let measured: Vec<&Trial> = mine
        .iter()
        .copied()
        .filter(|t| t.phase == "long" || LEVELS.contains(&t.phase.as_str()))
        .collect();
    let (mut in_win, mut failed_win, mut failed_win_slo) = (0u64, 0u64, 0u64);
    for t in &mine {
        // The generator's time zero, in lab seconds: it ended `elapsed_s` after it.
        let zero = t.t_end - t.load.elapsed_s;
        let within_slo = t.p99_ms <= run.slo_p99_ms;
        for s in &t.load.seconds {
            let (from, to) = (zero + s.t as f64, zero + s.t as f64 + 1.0);
            if swaps.iter().any(|w| from < w + SWAP_WINDOW_S && to > *w) {
                let bad = s.completed.saturating_sub(s.ok) + s.errors;
                in_win += s.completed + s.errors;
                failed_win += bad;
                if within_slo {
                    failed_win_slo += bad;
                }
            }
        }
    }
    let tl = run.timeline;
    let threads_min = tl.iter().map(|s| s.threads).min().unwrap_or(0);
    let threads_max = tl.iter().map(|s| s.threads).max().unwrap_or(0);
    let steady: Vec<u64> = tl
        .iter()
        .filter(|s| s.t >= STARTUP_S)
        .map(|s| s.threads)
        .collect();
    let (threads_steady_min, threads_steady_max) = match (steady.iter().min(), steady.iter().max())
    {
        (Some(a), Some(b)) => (*a, *b),
        _ => (threads_min, threads_max),
    };
    let mb = |s: Option<&ProcSample>| s.map_or(0.0, |s| s.rss_bytes as f64 / 1e6);
    // The long run's warm-up is its first fifth (at least 30 s); else the lab's warm-up.
    let warm = match long.first() {
        Some(t) => t.t_start + (0.2 * t.load.duration_s).max(30.0).min(t.load.duration_s),
        None => run.warmup_end,
    };
    let after_warmup = tl
        .iter()
        .find(|s| run.started_at + s.t >= warm)
        .or(tl.last());
    let (rss_after_warmup_mb, rss_end_mb) = (mb(after_warmup), mb(tl.last()));
    ModelsTarget {
        max_rate: run.max_rate,
        levels,
        long_run: (!long.is_empty()).then(|| level("long", &long)),
        requests: measured.iter().map(|t| t.load.offered).sum(),
        failed: measured.iter().map(|t| failed(t)).sum(),
        requests_in_swap_windows: in_win,
        failed_in_swap_windows: failed_win,
        failed_in_swap_windows_within_slo: failed_win_slo,
        threads_min,
        threads_max,
        threads_steady_min,
        threads_steady_max,
        rss_start_mb: mb(tl.first()),
        rss_after_warmup_mb,
        rss_end_mb,
        rss_growth_pct: if rss_after_warmup_mb > 0.0 {
            (rss_end_mb - rss_after_warmup_mb) / rss_after_warmup_mb * 100.0
        } else {
            0.0
        },
        connections_used: mine
            .iter()
            .map(|t| t.load.max_connections_used)
            .max()
            .unwrap_or(0),
        model_status: run.model_status.clone(),
    }
}

/// The acceptance lines, checked on this run: fanout's p99 at its highest sustained rate,
/// requests per CPU-second against the baseline's (at the baseline's capacity, the highest rate
/// both serve), threads constant, no failed request (and none during swaps), RSS growth of the
/// long run.
pub fn acceptance(rep: &ModelsReport, slo_p99_ms: f64) -> Vec<Acceptance> {
    let mut out = Vec::new();
    let base = rep.targets.get("antispam-py");
    for (name, t) in rep.targets.iter().filter(|(n, _)| *n != "antispam-py") {
        if let Some(l) = t.levels.iter().find(|l| l.name == "at-fanout-max") {
            out.push(Acceptance::new(
                name,
                "p99 at the highest rate sustained",
                &format!("p99 < {slo_p99_ms} ms"),
                format!(
                    "{:.2} ms at {:.0} req/s (median of {})",
                    l.p99_ms.median, l.offered_rate, l.p99_ms.n
                ),
                l.p99_ms.median < slo_p99_ms,
            ));
        }
        if let Some(b) = base {
            let level = |t: &ModelsTarget, n: &str| t.levels.iter().find(|l| l.name == n).cloned();
            let ratio_line = |check: &str, f: &ModelsLevel, p: &ModelsLevel, at: String| {
                let ratio = f.requests_per_cpu_s.median / p.requests_per_cpu_s.median.max(1e-9);
                Acceptance::new(
                    name,
                    check,
                    "≥ 5×",
                    format!("{ratio:.1}× ({at})"),
                    ratio >= 5.0,
                )
            };
            // Capacity per CPU (what sizing a fleet asks): each target at the highest rate it
            // sustains within the SLO — fanout's max, the baseline's max.
            if let (Some(f), Some(p)) = (level(t, "at-fanout-max"), level(b, "at-baseline-max")) {
                let at = format!(
                    "{:.0} at {:.0} req/s vs {:.0} at {:.0} req/s",
                    f.requests_per_cpu_s.median,
                    f.offered_rate,
                    p.requests_per_cpu_s.median,
                    p.offered_rate
                );
                out.push(ratio_line(
                    "requests per CPU-second vs antispam-py, each at the highest rate it sustains",
                    &f,
                    &p,
                    at,
                ));
            }
            // The same rate for both: the baseline's capacity (else half of fanout's). At a
            // low share of fanout's capacity its CPU per request holds the wake-ups of threads
            // that sleep between requests; shown beside, as its own line.
            let pick = |t: &ModelsTarget| {
                level(t, "at-baseline-max").or_else(|| level(t, "at-fanout-half"))
            };
            if let (Some(f), Some(p)) = (pick(t), pick(b)) {
                let at = format!(
                    "{:.0} vs {:.0} at {:.0} req/s",
                    f.requests_per_cpu_s.median, p.requests_per_cpu_s.median, f.offered_rate
                );
                out.push(ratio_line(
                    "requests per CPU-second vs antispam-py, both at the same rate",
                    &f,
                    &p,
                    at,
                ));
            }
        }
        out.push(Acceptance::new(
            name,
            "threads constant (idle to peak, across swaps)",
            &format!("min = max from {STARTUP_S} s after start"),
            format!(
                "{}–{} (whole run {}–{})",
                t.threads_steady_min, t.threads_steady_max, t.threads_min, t.threads_max
            ),
            t.threads_steady_min == t.threads_steady_max,
        ));
        out.push(Acceptance::new(
            name,
            "failed requests (every measured trial)",
            "0",
            format!("{} of {}", t.failed, t.requests),
            t.failed == 0,
        ));
        out.push(Acceptance::new(
            name,
            "failed requests during swaps",
            "0",
            format!(
                "{} of {} within {SWAP_WINDOW_S} s of {} swaps ({} in trials within the SLO)",
                t.failed_in_swap_windows,
                t.requests_in_swap_windows,
                rep.swaps_at_s.len(),
                t.failed_in_swap_windows_within_slo
            ),
            t.failed_in_swap_windows_within_slo == 0 && !rep.swaps_at_s.is_empty(),
        ));
        if t.long_run.is_some() {
            out.push(Acceptance::new(
                name,
                "RSS growth after warm-up (long run)",
                "< 5 %",
                format!(
                    "{:.1} → {:.1} MB ({:+.1} %)",
                    t.rss_after_warmup_mb, t.rss_end_mb, t.rss_growth_pct
                ),
                t.rss_growth_pct < 5.0,
            ));
        }
    }
    out
}

/// Text lines for the CLI summary.
pub fn text(rep: &ModelsReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "models: {} swapped every {} s ({} swaps), {} client connections",
        rep.swap_model,
        rep.swap_every_s,
        rep.swaps_at_s.len(),
        rep.connections
    );
    for (name, t) in &rep.targets {
        let _ = writeln!(
            s,
            "{name:<12} max rate (p99 < 10 ms) {}  failed {} of {}  during swaps {} of {}  threads {}–{} (whole run {}–{})  RSS {:.0} → {:.0} MB ({:+.1} %)  connections {}",
            t.max_rate
                .map_or_else(|| "n/a".into(), |r| format!("{r:.0}/s")),
            t.failed,
            t.requests,
            t.failed_in_swap_windows,
            t.requests_in_swap_windows,
            t.threads_steady_min,
            t.threads_steady_max,
            t.threads_min,
            t.threads_max,
            t.rss_after_warmup_mb,
            t.rss_end_mb,
            t.rss_growth_pct,
            t.connections_used
        );
        for l in t.levels.iter().chain(t.long_run.iter()) {
            let _ = writeln!(
                s,
                "  {:<16} {:>7.0} req/s  ok {:>7.0}/s  {:>7.0} req/CPU-s  p50 {:>7.2} ms  p99 {:>8.2} ms  failed {}  threads {}  RSS {:.0} MB  lag p99 ≤ {:.1} ms{}",
                l.name,
                l.offered_rate,
                l.achieved_rate.median,
                l.requests_per_cpu_s.median,
                l.p50_ms.median,
                l.p99_ms.median,
                l.failed,
                l.threads_max,
                l.rss_max_mb,
                l.lag_p99_ms_max,
                if l.all_valid {
                    ""
                } else {
                    "  (generator behind)"
                }
            );
        }
    }
    for (name, t) in &rep.targets {
        for (model, lat) in model_latencies(&t.model_status) {
            let _ = writeln!(s, "  {name} model {model:<12} {lat}");
        }
    }
    for (name, why) in &rep.not_run {
        let _ = writeln!(s, "{name:<12} not run: {why}");
    }
    s
}

/// Per model, from fanout's status: `queue p50 ≤ … p99 ≤ … ms, compute p50 ≤ … p99 ≤ … ms`
/// (histogram bucket bounds). Nothing for a target without them.
pub fn model_latencies(status: &serde_json::Value) -> Vec<(String, String)> {
    let Some(models) = status.as_object() else {
        return vec![];
    };
    let ms = |m: &serde_json::Value, k: &str| {
        m[k].as_f64()
            .map_or_else(|| "–".to_string(), |v| format!("{v}"))
    };
    models
        .iter()
        .filter(|(_, m)| m.get("compute_p99_ms").is_some())
        .map(|(n, m)| {
            (
                n.clone(),
                format!(
                    "queue p50 ≤ {} ms p99 ≤ {} ms, compute p50 ≤ {} ms p99 ≤ {} ms, mean batch {:.2}",
                    ms(m, "queue_p50_ms"),
                    ms(m, "queue_p99_ms"),
                    ms(m, "compute_p50_ms"),
                    ms(m, "compute_p99_ms"),
                    m["mean_batch"].as_f64().unwrap_or(0.0)
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_latencies_come_from_fanouts_status_only() {
        let status = serde_json::json!({
            "spam_lr": {"queue_p50_ms": 0.01, "queue_p99_ms": 0.1, "compute_p50_ms": 0.025,
                        "compute_p99_ms": null, "mean_batch": 1.5},
            "old": {"loads": 2}
        });
        let l = model_latencies(&status);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].0, "spam_lr");
        assert_eq!(
            l[0].1,
            "queue p50 ≤ 0.01 ms p99 ≤ 0.1 ms, compute p50 ≤ 0.025 ms p99 ≤ – ms, mean batch 1.50"
        );
        assert!(model_latencies(&serde_json::json!({"spam_lr": 3})).is_empty());
        assert!(model_latencies(&serde_json::Value::Null).is_empty());
    }
}
