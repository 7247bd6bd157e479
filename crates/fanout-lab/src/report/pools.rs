//! `fanout lab hh-pools` (issue 26 §1, second part): the table of a pools run — per phase
//! (healthy, the vacancy backend 10× slower) and target (fanout, `java-threads-N`): CPU µs per
//! request, p50/p99, goodput (2xx answers within the SLO per second), failed requests, threads
//! and RSS at their peak, backend calls per request, and how long the target's backend calls
//! went on after the load stopped (a pool's queue draining). Read from the run's trials; this
//! module measures nothing itself.

use super::{LabReport, Stat};
use crate::java;
use crate::model::{Pools, Trial, pools_phases};
use crate::svg::esc;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// How long one trial's backend calls went on after its load ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Drain {
    /// Target.
    pub target: String,
    /// `healthy` / `slow`.
    pub phase: String,
    /// Round (0-based).
    pub round: usize,
    /// Seconds from the generator's return to the last backend call.
    pub drain_s: f64,
    /// Backend calls made meanwhile (requests whose clients were gone).
    pub backend_calls: u64,
    /// Whether the lab stopped waiting before the calls stopped.
    pub capped: bool,
}

/// One target in one phase, over its trials.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolRow {
    /// `healthy` / `slow`.
    pub phase: String,
    /// Target.
    pub target: String,
    /// Threads in each of its two pools (`java-threads-N`); `None` for fanout.
    pub pool: Option<u32>,
    /// Trials (one per round).
    pub trials: usize,
    /// Offered rate, req/s (the mean over its trials).
    pub offered_rate: f64,
    /// CPU µs per completed request (the target's user + system time).
    pub cpu_us_per_request: Stat,
    /// p50 latency from the intended send time, ms (all answers).
    pub p50_ms: Stat,
    /// p99 latency, ms (all answers; a request without an answer is not in it: see `failed`).
    pub p99_ms: Stat,
    /// 2xx answers within the SLO per second of schedule.
    pub goodput_rps: Stat,
    /// Requests offered, all trials.
    pub offered: u64,
    /// 2xx answers, all trials.
    pub ok: u64,
    /// 2xx answers within the SLO, all trials.
    pub within_slo: u64,
    /// Requests without a 2xx answer (errors, timeouts at the client's 2 s, never sent), all
    /// trials.
    pub failed: u64,
    /// Most threads of the target during its trials.
    pub threads_max: u64,
    /// Largest RSS of the target during its trials, MB.
    pub rss_max_mb: f64,
    /// Backend (stub) calls per completed request.
    pub backend_calls_per_request: Stat,
    /// Context switches of the target per completed request.
    pub ctx_switches_per_request: Stat,
    /// Longest time its backend calls went on after a trial's load ended, s.
    pub drain_s_max: f64,
    /// Whether the lab stopped waiting for a drain.
    pub drain_capped: bool,
    /// Whether the generator kept its schedule in every trial.
    pub all_valid: bool,
}

/// `report.json` → `pools`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolsReport {
    /// Offered rate of every trial, req/s.
    pub rate: f64,
    /// Trial length, s.
    pub trial_s: f64,
    /// Rounds of interleaved trials per phase.
    pub rounds: usize,
    /// The latency an answer must meet to count as goodput, ms.
    pub slo_ms: f64,
    /// The stub route made slower, and its latency per phase (ms).
    pub slowed: String,
    /// (phase, latency ms of the slowed route).
    pub phases: Vec<(String, f64)>,
    /// How the Java pools are sized.
    pub sizing: String,
    /// Targets that ran, in order.
    pub targets: Vec<String>,
    /// Targets that were asked for but did not run, and why (`no java: …`).
    pub not_run: BTreeMap<String, String>,
    /// The Java runtime of each Java target.
    pub jvm: BTreeMap<String, String>,
    /// Per phase, per target.
    pub rows: Vec<PoolRow>,
    /// Every trial's drain.
    pub drains: Vec<Drain>,
}

/// What a team sizing by Little's law does with the two pools (see [`java::pool_args`]).
pub const SIZING: &str = "java-threads-N: a request pool of N threads and a calls pool of N threads (the search call on the request thread, the 3 vacancy calls on the calls pool); both fixed, unbounded queues, every thread started at once";

fn goodput(t: &Trial, slo_ms: f64) -> u64 {
    let slo_us = (slo_ms * 1000.0) as u64;
    t.load
        .second_histograms
        .iter()
        .map(|h| h.ok.count_between(0, slo_us))
        .sum()
}

/// The table of a pools run from its report's trials.
#[allow(clippy::too_many_arguments)]
pub fn summarize(
    p: &Pools,
    rep: &LabReport,
    trial_s: f64,
    rounds: usize,
    targets: &[String],
    drains: Vec<Drain>,
    not_run: BTreeMap<String, String>,
    jvm: BTreeMap<String, String>,
) -> PoolsReport {
    let slo_ms = rep.slo_p99_ms;
    let mut rows = Vec::new();
    for (phase, _) in pools_phases(p) {
        for name in targets {
            let ts: Vec<&Trial> = rep
                .trials
                .iter()
                .filter(|t| {
                    &t.target == name && t.phase == "pools" && t.stage.as_deref() == Some(phase)
                })
                .collect();
            if ts.is_empty() {
                continue;
            }
            let of = |f: &dyn Fn(&Trial) -> f64| Stat::of(ts.iter().map(|t| f(t)).collect());
            let mine: Vec<&Drain> = drains
                .iter()
                .filter(|d| &d.target == name && d.phase == phase)
                .collect();
            let within: Vec<u64> = ts.iter().map(|t| goodput(t, slo_ms)).collect();
            rows.push(PoolRow {
                phase: phase.into(),
                target: name.clone(),
                pool: java::pool_size(name),
                trials: ts.len(),
                offered_rate: ts.iter().map(|t| t.offered_rate).sum::<f64>() / ts.len() as f64,
                cpu_us_per_request: of(&|t| t.cpu_us_per_request),
                p50_ms: of(&|t| t.p50_ms),
                p99_ms: of(&|t| t.p99_ms),
                goodput_rps: Stat::of(
                    ts.iter()
                        .zip(&within)
                        .map(|(t, w)| *w as f64 / t.load.duration_s.max(1e-9))
                        .collect(),
                ),
                offered: ts.iter().map(|t| t.load.offered).sum(),
                ok: ts.iter().map(|t| t.load.ok).sum(),
                within_slo: within.iter().sum(),
                failed: ts
                    .iter()
                    .map(|t| t.load.offered.saturating_sub(t.load.ok))
                    .sum(),
                threads_max: ts
                    .iter()
                    .flat_map(|t| t.samples.iter().map(|s| s.threads).chain([t.threads]))
                    .max()
                    .unwrap_or(0),
                rss_max_mb: ts
                    .iter()
                    .flat_map(|t| {
                        t.samples
                            .iter()
                            .map(|s| s.rss_bytes as f64 / 1e6)
                            .chain([t.rss_mb])
                    })
                    .fold(0.0, f64::max),
                backend_calls_per_request: of(&|t| t.backend_calls_per_request),
                ctx_switches_per_request: of(&|t| t.ctx_switches_per_request),
                drain_s_max: mine.iter().map(|d| d.drain_s).fold(0.0, f64::max),
                drain_capped: mine.iter().any(|d| d.capped),
                all_valid: ts.iter().all(|t| t.valid),
            });
        }
    }
    PoolsReport {
        rate: p.rate,
        trial_s,
        rounds,
        slo_ms,
        slowed: format!("{} `{}`", p.service, p.route),
        phases: pools_phases(p)
            .iter()
            .map(|(n, ms)| (n.to_string(), *ms))
            .collect(),
        sizing: SIZING.into(),
        targets: targets.to_vec(),
        not_run,
        jvm,
        rows,
        drains,
    }
}

impl PoolsReport {
    /// Things to know when reading the table: unequal work in the healthy phase (the targets
    /// must make the same backend calls per request), drains the lab stopped waiting for.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        let healthy: Vec<&PoolRow> = self.rows.iter().filter(|r| r.phase == "healthy").collect();
        let calls: Vec<f64> = healthy
            .iter()
            .map(|r| r.backend_calls_per_request.median)
            .collect();
        if let (Some(lo), Some(hi)) = (
            calls.iter().copied().reduce(f64::min),
            calls.iter().copied().reduce(f64::max),
        ) && hi - lo > 0.02
            && hi > 1.02 * lo
        {
            w.push(format!(
                "unequal work in the healthy phase: backend calls per request differ ({}) — the CPU figures compare different work",
                healthy
                    .iter()
                    .map(|r| format!("{} {:.2}", r.target, r.backend_calls_per_request.median))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for d in self.drains.iter().filter(|d| d.capped) {
            w.push(format!(
                "{} {} round {}: backend calls still went on {:.1} s after the load ended ({} calls); the lab stopped waiting — the next trial shared the machine with that backlog",
                d.target, d.phase, d.round, d.drain_s, d.backend_calls
            ));
        }
        w
    }

    fn header(&self) -> String {
        format!(
            "hh-pools: {} for {:.0} s × {} round(s) per phase; {} at {} ms; goodput = 2xx answers within {:.0} ms per second; {}",
            format_args!("{:.0} req/s", self.rate),
            self.trial_s,
            self.rounds,
            self.slowed,
            self.phases
                .iter()
                .map(|(n, ms)| format!("{ms:.0} ({n})"))
                .collect::<Vec<_>>()
                .join(" → "),
            self.slo_ms,
            self.sizing
        )
    }
}

/// The table as text (the CLI prints it).
pub fn text(r: &PoolsReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", r.header());
    let _ = writeln!(
        s,
        "{:<8} {:<18} {:>14} {:>8} {:>9} {:>10} {:>7} {:>7} {:>7} {:>9} {:>8}",
        "phase",
        "target",
        "CPU µs/req",
        "p50 ms",
        "p99 ms",
        "goodput/s",
        "failed",
        "threads",
        "RSS MB",
        "calls/req",
        "drain s"
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "{:<8} {:<18} {:>14} {:>8.2} {:>9.2} {:>10.1} {:>7} {:>7} {:>7.0} {:>9.2} {:>8}{}",
            row.phase,
            row.target,
            format!(
                "{:.0} ({:.0}–{:.0})",
                row.cpu_us_per_request.median,
                row.cpu_us_per_request.min,
                row.cpu_us_per_request.max
            ),
            row.p50_ms.median,
            row.p99_ms.median,
            row.goodput_rps.median,
            row.failed,
            row.threads_max,
            row.rss_max_mb,
            row.backend_calls_per_request.median,
            format!(
                "{}{:.1}",
                if row.drain_capped { ">" } else { "" },
                row.drain_s_max
            ),
            if row.all_valid {
                ""
            } else {
                "  (generator behind schedule in a trial)"
            }
        );
    }
    for (t, why) in &r.not_run {
        let _ = writeln!(s, "{t}: not run: {why}");
    }
    s
}

/// The table as HTML (`report.html`).
pub fn html(h: &mut String, r: &PoolsReport) {
    let _ = write!(
        h,
        "<h2>Pools: fanout and the Java thread-per-request baseline</h2><p>{}</p><table><tr><th>phase</th><th>target</th><th>pool</th><th>CPU µs / request (min–max)</th><th>p50 ms</th><th>p99 ms</th><th>goodput / s</th><th>offered</th><th>2xx</th><th>within SLO</th><th>failed</th><th>threads max</th><th>RSS max MB</th><th>calls / request</th><th>ctx switches / request</th><th>drain s</th></tr>",
        esc(&r.header())
    );
    for row in &r.rows {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.0} ({:.0}–{:.0})</td><td>{:.2}</td><td>{:.2}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.2}</td><td>{:.1}</td><td>{}{:.1}</td></tr>",
            esc(&row.phase),
            esc(&row.target),
            row.pool.map_or("—".to_string(), |n| format!("{n} + {n}")),
            row.cpu_us_per_request.median,
            row.cpu_us_per_request.min,
            row.cpu_us_per_request.max,
            row.p50_ms.median,
            row.p99_ms.median,
            row.goodput_rps.median,
            row.offered,
            row.ok,
            row.within_slo,
            row.failed,
            row.threads_max,
            row.rss_max_mb,
            row.backend_calls_per_request.median,
            row.ctx_switches_per_request.median,
            if row.drain_capped { "&gt;" } else { "" },
            row.drain_s_max
        );
    }
    h.push_str("</table>");
    for (t, why) in &r.not_run {
        let _ = write!(
            h,
            r#"<div class="warn">{}: not run: {}</div>"#,
            esc(t),
            esc(why)
        );
    }
    if !r.jvm.is_empty() {
        let _ = write!(
            h,
            "<p>Java: {}</p>",
            esc(&r
                .jvm
                .iter()
                .map(|(t, v)| format!("{t}: {v}"))
                .collect::<Vec<_>>()
                .join("; "))
        );
    }
}
