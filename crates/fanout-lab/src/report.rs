//! `report.json` (schema in docs/lab.md) and a self-contained `report.html` with SVG charts.

use crate::procstat::ProcSample;
use crate::scenario::Scenario;
use crate::svg::{Series, esc, line_chart};
use crate::{LabOptions, Trial};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// Median with min and max over trials.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Stat {
    /// Median.
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Number of trials.
    pub n: usize,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Stat {
        v.retain(|x| x.is_finite());
        if v.is_empty() {
            return Stat::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stat {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        }
    }
}

/// Figures at one load level (a fraction of capacity), over the interleaved trials.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    /// `level-50` / `level-80`.
    pub name: String,
    /// Offered rate, req/s.
    pub offered_rate: f64,
    /// CPU-µs per request of the target.
    pub cpu_us_per_request: Stat,
    /// p50 latency, ms.
    pub p50_ms: Stat,
    /// p99 latency, ms.
    pub p99_ms: Stat,
    /// Error rate.
    pub error_rate: Stat,
    /// Achieved 2xx rate, req/s.
    pub achieved_rate: Stat,
    /// Backend (stub) calls per inbound request.
    pub backend_calls_per_request: Stat,
    /// Whether the generator kept its schedule in every trial.
    pub all_valid: bool,
}

/// A phase of an overload or slow-backend run (from per-second figures).
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Phase name.
    pub name: String,
    /// Start and end, seconds into the run.
    pub from_s: f64,
    /// End.
    pub to_s: f64,
    /// Offered requests/s.
    pub offered_rate: f64,
    /// 2xx responses/s (goodput).
    pub ok_rate: f64,
    /// Highest per-second p99 in the phase, ms (an upper bound of the phase's p99).
    pub p99_ms_max_per_second: f64,
    /// Errors (non-2xx and network) per second.
    pub error_rate_per_s: f64,
}

/// Headline figures of one target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetSummary {
    /// CPU-µs per request (median of the 50 % level trials, or the main run).
    pub cpu_us_per_request: f64,
    /// p50 latency, ms (same trials).
    pub p50_ms: f64,
    /// p99 latency, ms (same trials).
    pub p99_ms: f64,
    /// Error rate (same trials).
    pub error_rate: f64,
    /// Highest rate meeting the SLO found by the search, req/s.
    pub max_rate: Option<f64>,
    /// Peak threads over the run.
    pub threads_max: u64,
    /// Peak RSS over the run, MB.
    pub rss_max_mb: f64,
    /// Stub calls per inbound request.
    pub backend_calls_per_request: f64,
    /// p50 minus the direct critical-path p50, ms.
    pub added_p50_ms: Option<f64>,
    /// Whether every measured trial (levels, phased runs; not search probes) had a valid generator.
    pub generator_valid: bool,
    /// Per level.
    pub levels: Vec<Level>,
    /// Per phase (overload, slow-backend).
    pub phases: Vec<Phase>,
}

/// Calling the critical path's stubs directly.
#[derive(Debug, Clone, Serialize)]
pub struct Direct {
    /// The calls, in order.
    pub path: Vec<String>,
    /// p50, ms.
    pub p50_ms: f64,
    /// p99, ms.
    pub p99_ms: f64,
}

/// The whole report (`report.json`).
#[derive(Debug, Clone, Serialize)]
pub struct LabReport {
    /// Schema version.
    pub version: u32,
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub about: String,
    /// The command that produced it.
    pub command: String,
    /// Reduced run.
    pub quick: bool,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The latency SLO of the capacity search, ms.
    pub slo_p99_ms: f64,
    /// Direct critical-path latency.
    pub direct: Option<Direct>,
    /// Per target.
    pub targets: BTreeMap<String, TargetSummary>,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// /proc samples of every target over the run.
    pub timelines: BTreeMap<String, Vec<ProcSample>>,
    /// Things to know when reading the figures (generator lag, …).
    pub warnings: Vec<String>,
}

fn phases_of(t: &Trial, names: &[&str]) -> Vec<Phase> {
    let secs = &t.load.seconds;
    // Phases have equal lengths in the schedules the lab builds; the drain after them is not a phase.
    let total = t.load.duration_s;
    let n = names.len() as f64;
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let (from, to) = (total * i as f64 / n, total * (i + 1) as f64 / n);
            let in_phase: Vec<_> = secs
                .iter()
                .filter(|s| (s.t as f64) >= from && (s.t as f64) < to)
                .collect();
            let k = in_phase.len().max(1) as f64;
            Phase {
                name: name.to_string(),
                from_s: from,
                to_s: to,
                offered_rate: in_phase.iter().map(|s| s.offered as f64).sum::<f64>() / k,
                ok_rate: in_phase.iter().map(|s| s.ok as f64).sum::<f64>() / k,
                p99_ms_max_per_second: in_phase.iter().map(|s| s.p99_ms).fold(0.0, f64::max),
                error_rate_per_s: in_phase.iter().map(|s| s.errors as f64).sum::<f64>() / k,
            }
        })
        .collect()
}

/// Assemble the report from the trials.
pub fn build(
    opts: &LabOptions,
    scenario: &Scenario,
    direct: Option<Direct>,
    caps: BTreeMap<String, f64>,
    trials: Vec<Trial>,
    timelines: BTreeMap<String, Vec<ProcSample>>,
    mut warnings: Vec<String>,
) -> LabReport {
    let mut targets = BTreeMap::new();
    for name in &opts.targets {
        let mine: Vec<&Trial> = trials.iter().filter(|t| &t.target == name).collect();
        let mut levels = Vec::new();
        for level in ["level-50", "level-80"] {
            let ts: Vec<&&Trial> = mine.iter().filter(|t| t.phase == level).collect();
            if ts.is_empty() {
                continue;
            }
            let stat = |f: &dyn Fn(&Trial) -> f64| Stat::of(ts.iter().map(|t| f(t)).collect());
            levels.push(Level {
                name: level.into(),
                offered_rate: ts[0].offered_rate,
                cpu_us_per_request: stat(&|t| t.cpu_us_per_request),
                p50_ms: stat(&|t| t.p50_ms),
                p99_ms: stat(&|t| t.p99_ms),
                error_rate: stat(&|t| t.error_rate),
                achieved_rate: stat(&|t| t.achieved_rate),
                backend_calls_per_request: stat(&|t| t.backend_calls_per_request),
                all_valid: ts.iter().all(|t| t.valid),
            });
        }
        let main = mine
            .iter()
            .find(|t| t.phase == "overload" || t.phase == "slow-backend");
        let phases = match main {
            Some(t) if t.phase == "overload" => phases_of(t, &["0.5x", "ramp to 3x", "3x", "0.7x"]),
            Some(t) => phases_of(t, &["normal", "backend 10x slower", "restored"]),
            None => vec![],
        };
        let (cpu, p50, p99, err, calls) = match (levels.first(), main) {
            (Some(l), _) => (
                l.cpu_us_per_request.median,
                l.p50_ms.median,
                l.p99_ms.median,
                l.error_rate.median,
                l.backend_calls_per_request.median,
            ),
            (None, Some(t)) => (
                t.cpu_us_per_request,
                t.p50_ms,
                t.p99_ms,
                t.error_rate,
                t.backend_calls_per_request,
            ),
            (None, None) => (0.0, 0.0, 0.0, 0.0, 0.0),
        };
        let tl = timelines.get(name).map(Vec::as_slice).unwrap_or(&[]);
        // Search steps probe limits on purpose; validity is judged on the measured trials.
        let measured: Vec<&&Trial> = mine.iter().filter(|t| t.phase != "search").collect();
        let valid = measured.iter().all(|t| t.valid);
        if !valid {
            warnings.push(format!(
                "{name}: the generator fell behind its schedule in {} of {} measured trials (see the lag chart); those figures describe the machine's limit, not the target's",
                measured.iter().filter(|t| !t.valid).count(),
                measured.len()
            ));
        }
        targets.insert(
            name.clone(),
            TargetSummary {
                cpu_us_per_request: cpu,
                p50_ms: p50,
                p99_ms: p99,
                error_rate: err,
                max_rate: caps.get(name).copied(),
                threads_max: tl.iter().map(|s| s.threads).max().unwrap_or(0),
                rss_max_mb: tl.iter().map(|s| s.rss_bytes).max().unwrap_or(0) as f64 / 1e6,
                backend_calls_per_request: calls,
                added_p50_ms: direct.as_ref().map(|d| p50 - d.p50_ms),
                generator_valid: valid,
                levels,
                phases,
            },
        );
    }
    LabReport {
        version: 1,
        scenario: scenario.name.into(),
        about: scenario.about.into(),
        command: opts.command.clone(),
        quick: opts.quick,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        slo_p99_ms: scenario.slo_p99_ms,
        direct,
        targets,
        trials,
        timelines,
        warnings,
    }
}

/// Write `report.json` and `report.html` into `dir`.
pub fn write(dir: &Path, rep: &LabReport) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(rep).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), &json)?;
    std::fs::write(dir.join("report.html"), html(rep, &json))
}

fn sorted(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// The trial whose per-second series represents a target over time.
fn representative<'a>(rep: &'a LabReport, target: &str) -> Option<&'a Trial> {
    let mine = rep.trials.iter().filter(|t| t.target == target);
    mine.clone()
        .find(|t| t.phase == "overload" || t.phase == "slow-backend")
        .or_else(|| mine.clone().rfind(|t| t.phase == "level-80"))
        .or_else(|| mine.clone().next_back())
}

/// One line per target of a `/proc` figure over the run.
fn timeline_chart(
    rep: &LabReport,
    id: &str,
    title: &str,
    y_label: &str,
    f: fn(&ProcSample) -> f64,
) -> String {
    let s: Vec<Series> = rep
        .timelines
        .iter()
        .map(|(n, tl)| Series::new(n.clone(), tl.iter().map(|x| (x.t, f(x))).collect()))
        .collect();
    line_chart(id, title, "seconds since targets started", y_label, &s)
}

fn charts(rep: &LabReport) -> Vec<String> {
    let names: Vec<&String> = rep.targets.keys().collect();
    let mut out = Vec::new();
    let over_time = rep
        .trials
        .iter()
        .any(|t| t.phase == "overload" || t.phase == "slow-backend");

    // 1. Achieved vs offered rate.
    let mut s = Vec::new();
    for n in &names {
        if over_time {
            if let Some(t) = representative(rep, n) {
                s.push(Series::dashed(
                    format!("{n} offered"),
                    t.load
                        .seconds
                        .iter()
                        .map(|x| (x.t as f64, x.offered as f64))
                        .collect(),
                ));
                s.push(Series::new(
                    format!("{n} achieved (2xx)"),
                    t.load
                        .seconds
                        .iter()
                        .map(|x| (x.t as f64, x.ok as f64))
                        .collect(),
                ));
            }
        } else {
            let pts = rep
                .trials
                .iter()
                .filter(|t| &t.target == *n)
                .map(|t| (t.offered_rate, t.achieved_rate))
                .collect();
            s.push(Series::new(n.to_string(), sorted(pts)));
        }
    }
    if over_time {
        out.push(line_chart(
            "rate",
            "Achieved vs offered rate",
            "seconds into the run",
            "requests/s",
            &s,
        ));
    } else {
        let max = rep
            .trials
            .iter()
            .map(|t| t.offered_rate)
            .fold(0.0, f64::max);
        s.push(Series::dashed(
            "offered = achieved",
            vec![(0.0, 0.0), (max, max)],
        ));
        out.push(line_chart(
            "rate",
            "Achieved vs offered rate (every trial)",
            "offered requests/s",
            "achieved 2xx/s",
            &s,
        ));
    }

    // 2. Latency percentiles over time.
    let mut s = Vec::new();
    for n in &names {
        if let Some(t) = representative(rep, n) {
            s.push(Series::new(
                format!("{n} p99"),
                t.load
                    .seconds
                    .iter()
                    .map(|x| (x.t as f64, x.p99_ms))
                    .collect(),
            ));
            s.push(Series::dashed(
                format!("{n} p50"),
                t.load
                    .seconds
                    .iter()
                    .map(|x| (x.t as f64, x.p50_ms))
                    .collect(),
            ));
        }
    }
    out.push(line_chart(
        "latency-time",
        "Latency percentiles over time (per second, from intended send time)",
        "seconds into the trial",
        "ms",
        &s,
    ));

    // 3. Latency vs throughput (capacity search steps and level trials).
    let mut s = Vec::new();
    for n in &names {
        let ts: Vec<&Trial> = rep
            .trials
            .iter()
            .filter(|t| &t.target == *n && (t.phase == "search" || t.phase.starts_with("level")))
            .collect();
        s.push(Series::new(
            format!("{n} p99"),
            sorted(ts.iter().map(|t| (t.achieved_rate, t.p99_ms)).collect()),
        ));
        s.push(Series::dashed(
            format!("{n} p50"),
            sorted(ts.iter().map(|t| (t.achieved_rate, t.p50_ms)).collect()),
        ));
    }
    out.push(line_chart(
        "latency-throughput",
        "Latency vs throughput",
        "achieved 2xx/s",
        "ms",
        &s,
    ));

    // 4. CPU-µs per request vs load.
    let s: Vec<Series> = names
        .iter()
        .map(|n| {
            let pts = rep
                .trials
                .iter()
                .filter(|t| &t.target == *n && t.offered_rate > 0.0)
                .map(|t| (t.offered_rate, t.cpu_us_per_request))
                .collect();
            Series::new(n.to_string(), sorted(pts))
        })
        .collect();
    out.push(line_chart(
        "cpu-per-request",
        "CPU-µs per request vs load (target process, user+sys)",
        "offered requests/s",
        "CPU-µs per request",
        &s,
    ));

    // 5. Threads and RSS over time.
    out.push(timeline_chart(
        rep,
        "threads",
        "Threads over time",
        "threads",
        |x| x.threads as f64,
    ));
    out.push(timeline_chart(rep, "rss", "RSS over time", "MB", |x| {
        x.rss_bytes as f64 / 1e6
    }));

    // 6. Generator lag.
    let s: Vec<Series> = names
        .iter()
        .map(|n| {
            Series::new(
                format!("{n} trials"),
                rep.trials
                    .iter()
                    .filter(|t| &t.target == *n)
                    .map(|t| (t.t_start, t.lag_p99_ms))
                    .collect(),
            )
        })
        .collect();
    out.push(line_chart(
        "lag",
        "Generator lag p99 per trial (actual send − intended send)",
        "seconds since targets started",
        "ms",
        &s,
    ));
    out
}

fn f(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn stat(s: &Stat) -> String {
    format!(
        "{} <span class=\"mm\">({}–{})</span>",
        f(s.median),
        f(s.min),
        f(s.max)
    )
}

/// Render the HTML report.
pub fn html(rep: &LabReport, json: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fanout lab: {s}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1100px}}table{{border-collapse:collapse;margin:12px 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f0f0f0}}td:first-child,th:first-child{{text-align:left}}.mm{{color:#777;font-size:90%}}.warn{{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}}figure{{margin:16px 0}}figcaption{{font-weight:600;margin-bottom:4px}}code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>
<h1>fanout lab — {s}</h1><p>{about}</p><p>Command: <code>{cmd}</code> · {cpus} CPUs · {quick} · capacity SLO: p99 ≤ {slo} ms, errors ≤ 1 %, achieved ≥ 95 % of offered</p>"#,
        s = esc(&rep.scenario),
        about = esc(&rep.about),
        cmd = esc(&rep.command),
        cpus = rep.cpus,
        quick = if rep.quick {
            "quick run (reduced; figures are indicative)"
        } else {
            "full run"
        },
        slo = rep.slo_p99_ms
    );
    for w in &rep.warnings {
        let _ = write!(h, r#"<div class="warn">⚠ {}</div>"#, esc(w));
    }
    h.push_str("<h2>Summary</h2><table><tr><th>target</th><th>max rate at SLO (req/s)</th><th>CPU-µs / request</th><th>p50 ms</th><th>p99 ms</th><th>added p50 ms</th><th>errors</th><th>backend calls / request</th><th>threads max</th><th>RSS max MB</th><th>generator</th></tr>");
    for (n, t) in &rep.targets {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2} %</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(n),
            t.max_rate.map(f).unwrap_or_else(|| "—".into()),
            f(t.cpu_us_per_request),
            f(t.p50_ms),
            f(t.p99_ms),
            t.added_p50_ms.map(f).unwrap_or_else(|| "—".into()),
            t.error_rate * 100.0,
            f(t.backend_calls_per_request),
            t.threads_max,
            f(t.rss_max_mb),
            if t.generator_valid {
                "valid"
            } else {
                "<b>lagged</b>"
            }
        );
    }
    h.push_str("</table>");
    if let Some(d) = &rep.direct {
        let _ = write!(
            h,
            "<p>Direct critical path ({}): p50 {} ms, p99 {} ms — the floor any orchestrator adds to.</p>",
            esc(&d.path.join(" → ")),
            f(d.p50_ms),
            f(d.p99_ms)
        );
    }
    if rep.targets.values().any(|t| !t.levels.is_empty()) {
        h.push_str("<h2>Interleaved trials (median, min–max)</h2><table><tr><th>target / level</th><th>offered req/s</th><th>CPU-µs / request</th><th>p50 ms</th><th>p99 ms</th><th>achieved 2xx/s</th><th>errors</th><th>trials</th></tr>");
        for (n, t) in &rep.targets {
            for l in &t.levels {
                let _ = write!(
                    h,
                    "<tr><td>{} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2} %</td><td>{}{}</td></tr>",
                    esc(n),
                    esc(&l.name),
                    f(l.offered_rate),
                    stat(&l.cpu_us_per_request),
                    stat(&l.p50_ms),
                    stat(&l.p99_ms),
                    stat(&l.achieved_rate),
                    l.error_rate.median * 100.0,
                    l.cpu_us_per_request.n,
                    if l.all_valid { "" } else { " (lagged)" }
                );
            }
        }
        h.push_str("</table>");
    }
    if rep.targets.values().any(|t| !t.phases.is_empty()) {
        h.push_str("<h2>Phases</h2><table><tr><th>target / phase</th><th>seconds</th><th>offered req/s</th><th>goodput 2xx/s</th><th>errors/s</th><th>max per-second p99 ms</th></tr>");
        for (n, t) in &rep.targets {
            for p in &t.phases {
                let _ = write!(
                    h,
                    "<tr><td>{} {}</td><td>{:.0}–{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(n),
                    esc(&p.name),
                    p.from_s,
                    p.to_s,
                    f(p.offered_rate),
                    f(p.ok_rate),
                    f(p.error_rate_per_s),
                    f(p.p99_ms_max_per_second)
                );
            }
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Charts</h2>");
    for c in charts(rep) {
        h.push_str(&c);
    }
    h.push_str("<h2>All trials</h2><table><tr><th>#</th><th>target</th><th>phase</th><th>round</th><th>offered</th><th>achieved</th><th>p50 ms</th><th>p99 ms</th><th>CPU-µs/req</th><th>gen CPU-µs/req</th><th>calls/req</th><th>ctx sw/req</th><th>lag p99 ms</th><th>valid</th></tr>");
    for (i, t) in rep.trials.iter().enumerate() {
        let _ = write!(
            h,
            "<tr><td>{i}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&t.target),
            esc(&t.phase),
            t.round,
            f(t.offered_rate),
            f(t.achieved_rate),
            f(t.p50_ms),
            f(t.p99_ms),
            f(t.cpu_us_per_request),
            f(t.generator_cpu_us_per_request),
            f(t.backend_calls_per_request),
            f(t.lag_p99_ms),
            if t.valid {
                "yes".to_string()
            } else {
                format!("no: {}", esc(t.invalid_reason.as_deref().unwrap_or("")))
            }
        );
    }
    h.push_str("</table>");
    let _ = write!(
        h,
        r#"<script type="application/json" id="report-data">{}</script></body></html>"#,
        json.replace("</", "<\\/")
    );
    h
}
