//! `fanout lab hop`: the latency one gateway hop adds (issue 25 §4). The same open-model load
//! (default 2 000 req/s) is sent to a stub route that answers after 1 ms — once directly, once
//! through fanout (a route with one `http` step to that stub and `respond: $step`) — in
//! interleaved trials (ABBA); per round, the added latency is fanout's percentile minus the
//! direct one at the same percentile, and the report gives the median over the rounds.
//!
//! The stub sleeps on its precise timer (`timer: precise`): tokio's timer ends a 1 ms delay on
//! the next millisecond tick, 1–2 ms later depending on when the request arrived, which would
//! swamp a difference of ~100 µs (and can even make the longer path look faster). Nothing is
//! shared between requests through fanout (per-backend `dedup: false`, `coalesce: false`): every
//! request makes its own backend call, as the direct path does.

use crate::process::{Proc, ProcessError, free_addr};
use crate::procstat;
use crate::svg::esc;
use fanout_load::{LoadReport, LoadSpec, RequestTemplate, Schedule};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The scenario's name on the command line.
pub const NAME: &str = "hop";

/// The issue's acceptance: added latency p50 at most this (ms) …
pub const MAX_ADDED_P50_MS: f64 = 0.1;
/// … and p99 at most this (ms).
pub const MAX_ADDED_P99_MS: f64 = 1.0;

/// The hand-written hop's path name (`--targets …,hyper-baseline`).
pub const BASELINE: &str = "hyper-baseline";

/// The stub: one route, 1 ms, on the precise timer.
pub const HOP_STUBS: &str = r#"# `fanout lab hop`: a backend that answers after exactly 1 ms (precise timer).
timer: precise
services:
  item:
    listen: "${ITEM_ADDR:-127.0.0.1:9501}"
    routes:
      - path: /items/{id}
        latency: 1ms
        body: '{id: $request.params.id, name: "item", price: 12.5}'
"#;

/// fanout: one call to the stub, its answer returned as it came; nothing shared between
/// requests, so every request makes its own call.
pub const HOP_GATEWAY: &str = r#"# `fanout lab hop`: one hop — a route that calls the stub once and answers with its body.
listen: "${LISTEN:-127.0.0.1:8080}"
backends:
  item:
    url: "http://${ITEM_ADDR:-127.0.0.1:9501}"
    timeout: 1s
    dedup: false
routes:
  - path: /items/{id}
    flow:
      got:
        http:
          backend: item
          path: '"/items/\($request.params.id)"'
    respond:
      body: '$got'
defaults:
  coalesce: false
"#;

/// What to run.
#[derive(Debug, Clone)]
pub struct HopOptions {
    /// Offered rate, req/s.
    pub rate: f64,
    /// Rounds (each: direct and fanout, ABBA order).
    pub rounds: usize,
    /// Length of each trial.
    pub trial: Duration,
    /// Client connections (HTTP/1.1 keep-alive, one request in flight each).
    pub connections: usize,
    /// Output directory.
    pub out: PathBuf,
    /// The fanout executable (stub and gateway).
    pub fanout_bin: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
    /// The gateway's `server.runtime` when the target names one (`--targets fanout-percore`:
    /// `per_core`, `fanout-ws`: `work_stealing`); `None`: the config's default.
    pub runtime: Option<&'static str>,
    /// The hand-written hop to run as a third path (`--targets …,hyper-baseline`): the
    /// `hyper-aggregator` executable, whose `GET /items/{id}` makes the same one call.
    pub baseline: Option<PathBuf>,
}

impl HopOptions {
    /// The defaults: 2 000 req/s, 5 rounds of 10 s (`--quick`: 2 rounds of 3 s), 64 connections.
    pub fn new(quick: bool, out: PathBuf, fanout_bin: PathBuf, command: String) -> HopOptions {
        HopOptions {
            rate: 2000.0,
            rounds: if quick { 2 } else { 5 },
            trial: Duration::from_secs(if quick { 3 } else { 10 }),
            connections: 64,
            out,
            fanout_bin,
            command,
            quick,
            runtime: None,
            baseline: None,
        }
    }
}

/// One trial of one path.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trial {
    /// Round number (0-based).
    pub round: usize,
    /// `direct`, `fanout` or `hyper-baseline`.
    pub path: String,
    /// Requests offered / answered 2xx.
    pub offered: u64,
    /// 2xx answers.
    pub ok: u64,
    /// Latency percentiles from the intended send time, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// The generator's scheduling lag p99, ms.
    pub lag_p99_ms: f64,
    /// Whether the generator kept its schedule (lag p99 ≤ 1 ms, nothing left unsent).
    pub generator_on_schedule: bool,
    /// CPU per request of the process the path goes through, µs (fanout's, or the hand-written
    /// baseline's; none for the direct path).
    pub fanout_cpu_us_per_req: Option<f64>,
}

/// The added latency of one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Added {
    /// Round number.
    pub round: usize,
    /// fanout's p50 − direct p50, ms.
    pub p50_ms: f64,
    /// fanout's p90 − direct p90, ms.
    pub p90_ms: f64,
    /// fanout's p99 − direct p99, ms.
    pub p99_ms: f64,
}

/// `report.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HopReport {
    /// `hop`.
    pub scenario: String,
    /// The command line.
    pub command: String,
    /// Offered rate, req/s.
    pub rate: f64,
    /// Seconds per trial.
    pub trial_s: f64,
    /// Client connections.
    pub connections: usize,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// Added latency per round.
    pub added: Vec<Added>,
    /// Medians over the rounds of the added latency, ms.
    pub median_added_p50_ms: f64,
    /// Median added p90, ms.
    pub median_added_p90_ms: f64,
    /// Median added p99, ms.
    pub median_added_p99_ms: f64,
    /// Median of the direct trials' p50, ms (the stub's own latency as the generator sees it).
    pub median_direct_p50_ms: f64,
    /// Median CPU of fanout per request, µs.
    pub median_fanout_cpu_us_per_req: f64,
    /// What the hand-written hop (`hyper-baseline`) adds per round, when it ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline_added: Vec<Added>,
    /// Median of the baseline's added p50, ms (when it ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_baseline_added_p50_ms: Option<f64>,
    /// Median of the baseline's added p99, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_baseline_added_p99_ms: Option<f64>,
    /// Median CPU of the baseline per request, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_baseline_cpu_us_per_req: Option<f64>,
    /// Trials in which the generator fell behind its schedule (their figures describe the
    /// generator as much as the target).
    pub generator_behind: usize,
    /// Failed (non-2xx or no answer) requests over all trials.
    pub failed: u64,
    /// The acceptance lines, each with whether it held.
    pub acceptance: Vec<(String, bool)>,
}

/// What can stop the run.
#[derive(Debug, thiserror::Error)]
pub enum HopError {
    /// A process did not start or become ready.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A file could not be written, or a port found.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The load generator refused the spec.
    #[error("load: {0}")]
    Load(String),
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> HopError + '_ {
    move |e| HopError::Io(p.display().to_string(), e)
}

/// Run the scenario and write `report.json` and `report.html` into `opts.out`.
pub async fn run(opts: HopOptions) -> Result<HopReport, HopError> {
    std::fs::create_dir_all(&opts.out).map_err(io(&opts.out))?;
    let stub_addr = free_addr().map_err(io(&opts.out))?;
    let gw_addr = free_addr().map_err(io(&opts.out))?;
    let mut env = HashMap::new();
    env.insert("ITEM_ADDR".to_string(), stub_addr.to_string());
    env.insert("LISTEN".to_string(), gw_addr.to_string());
    let stubs_file = opts.out.join("stubs.yaml");
    let gw_file = opts.out.join("fanout.yaml");
    std::fs::write(&stubs_file, HOP_STUBS).map_err(io(&stubs_file))?;
    let gateway = match opts.runtime {
        Some(r) => format!("{HOP_GATEWAY}server:\n  runtime: {r}\n"),
        None => HOP_GATEWAY.to_string(),
    };
    std::fs::write(&gw_file, gateway).map_err(io(&gw_file))?;
    let s = |v: &str| v.to_string();
    let mut stub = Proc::spawn(
        "stubs",
        &opts.fanout_bin,
        &[s("stub"), s("--config"), stubs_file.display().to_string()],
        &env,
        &opts.out.join("stubs.log"),
    )?;
    stub.wait_ready(stub_addr, "/__stub/stats", Duration::from_secs(15))
        .await?;
    let mut gw = Proc::spawn(
        "fanout",
        &opts.fanout_bin,
        &[
            s("serve"),
            s("--config"),
            gw_file.display().to_string(),
            s("--admin-listen"),
            s("127.0.0.1:0"),
        ],
        &env,
        &opts.out.join("fanout.log"),
    )?;
    gw.wait_ready(gw_addr, "/items/1", Duration::from_secs(15))
        .await?;
    let gw_pid = gw.pid().unwrap_or(0);
    let mut paths = vec![("direct", stub_addr, 0), ("fanout", gw_addr, gw_pid)];
    let mut base = None;
    if let Some(bin) = &opts.baseline {
        let base_addr = free_addr().map_err(io(&opts.out))?;
        let mut base_env = env.clone();
        base_env.insert("LISTEN".to_string(), base_addr.to_string());
        let mut b = Proc::spawn(
            BASELINE,
            bin,
            &[],
            &base_env,
            &opts.out.join("hyper-baseline.log"),
        )?;
        b.wait_ready(base_addr, "/items/1", Duration::from_secs(15))
            .await?;
        paths.push((BASELINE, base_addr, b.pid().unwrap_or(0)));
        base = Some(b);
    }
    // Warm-up: connections, caches, the stub's timer thread.
    for &(_, addr, _) in &paths {
        load(&opts, addr, Duration::from_secs(2)).await?;
    }
    let mut trials = Vec::new();
    for round in 0..opts.rounds {
        // ABBA (ABCCBA with the baseline): each path as often early as late.
        let mut order: Vec<usize> = (0..paths.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (name, addr, pid) = paths[i];
            let cpu0 = procstat::cpu_total_us(pid);
            let r = load(&opts, addr, opts.trial).await?;
            let cpu1 = procstat::cpu_total_us(pid);
            let cpu = match (pid, cpu0, cpu1) {
                (1.., Some(a), Some(b)) if r.completed > 0 => {
                    Some(b.saturating_sub(a) as f64 / r.completed as f64)
                }
                _ => None,
            };
            trials.push(trial(round, name, &r, cpu));
        }
    }
    if let Some(b) = base {
        b.stop().await;
    }
    gw.stop().await;
    stub.stop().await;

    let rep = summarise(&opts, trials);
    let json = serde_json::to_string_pretty(&rep).unwrap_or_default();
    let jf = opts.out.join("report.json");
    std::fs::write(&jf, &json).map_err(io(&jf))?;
    let hf = opts.out.join("report.html");
    std::fs::write(&hf, html(&rep, &json)).map_err(io(&hf))?;
    Ok(rep)
}

async fn load(
    opts: &HopOptions,
    addr: std::net::SocketAddr,
    len: Duration,
) -> Result<LoadReport, HopError> {
    let schedule = Schedule::parse(&format!("const({},{}ms)", opts.rate, len.as_millis()))
        .map_err(|e| HopError::Load(e.to_string()))?;
    let mut spec = LoadSpec::new(format!("http://{addr}"), schedule);
    spec.requests = vec![RequestTemplate::get("/items/7")];
    spec.max_connections = opts.connections;
    spec.timeout = Duration::from_secs(2);
    spec.drain = Duration::from_secs(2);
    fanout_load::run(&spec, None)
        .await
        .map_err(|e| HopError::Load(e.to_string()))
}

fn trial(round: usize, path: &str, r: &LoadReport, cpu: Option<f64>) -> Trial {
    Trial {
        round,
        path: path.to_string(),
        offered: r.offered,
        ok: r.ok,
        p50_ms: r.latency_ms.p50,
        p90_ms: r.latency_ms.p90,
        p99_ms: r.latency_ms.p99,
        p999_ms: r.latency_ms.p999,
        lag_p99_ms: r.lag_ms.p99,
        generator_on_schedule: r.valid,
        fanout_cpu_us_per_req: cpu,
    }
}

/// The median of `v` (0 when empty).
fn median(v: Vec<f64>) -> f64 {
    crate::report::Stat::of(v).median
}

/// Pair each round's trials, take the medians, check the acceptance lines.
pub fn summarise(opts: &HopOptions, trials: Vec<Trial>) -> HopReport {
    let added_by = |path: &str| {
        let mut added = Vec::new();
        for round in 0..opts.rounds {
            let of = |p: &str| trials.iter().find(|t| t.round == round && t.path == p);
            if let (Some(d), Some(f)) = (of("direct"), of(path)) {
                added.push(Added {
                    round,
                    p50_ms: f.p50_ms - d.p50_ms,
                    p90_ms: f.p90_ms - d.p90_ms,
                    p99_ms: f.p99_ms - d.p99_ms,
                });
            }
        }
        added
    };
    let added = added_by("fanout");
    let baseline_added = added_by(BASELINE);
    let ran = !baseline_added.is_empty();
    let base_med =
        |f: fn(&Added) -> f64| ran.then(|| median(baseline_added.iter().map(f).collect()));
    let (median_baseline_added_p50_ms, median_baseline_added_p99_ms) =
        (base_med(|a| a.p50_ms), base_med(|a| a.p99_ms));
    let cpu_of = |path: &str| {
        median(
            trials
                .iter()
                .filter(|t| t.path == path)
                .filter_map(|t| t.fanout_cpu_us_per_req)
                .collect(),
        )
    };
    let median_baseline_cpu_us_per_req = ran.then(|| cpu_of(BASELINE));
    let med = |f: fn(&Added) -> f64| median(added.iter().map(f).collect());
    let (p50, p90, p99) = (med(|a| a.p50_ms), med(|a| a.p90_ms), med(|a| a.p99_ms));
    let failed = trials.iter().map(|t| t.offered.saturating_sub(t.ok)).sum();
    let acceptance = vec![
        (
            format!(
                "added latency p50 ≤ {:.0} µs: {:.0} µs (median of {} rounds)",
                MAX_ADDED_P50_MS * 1000.0,
                p50 * 1000.0,
                added.len()
            ),
            !added.is_empty() && p50 <= MAX_ADDED_P50_MS,
        ),
        (
            format!(
                "added latency p99 ≤ {:.0} ms: {:.2} ms",
                MAX_ADDED_P99_MS, p99
            ),
            !added.is_empty() && p99 <= MAX_ADDED_P99_MS,
        ),
    ];
    HopReport {
        scenario: NAME.to_string(),
        command: opts.command.clone(),
        rate: opts.rate,
        trial_s: opts.trial.as_secs_f64(),
        connections: opts.connections,
        median_direct_p50_ms: median(
            trials
                .iter()
                .filter(|t| t.path == "direct")
                .map(|t| t.p50_ms)
                .collect(),
        ),
        median_fanout_cpu_us_per_req: cpu_of("fanout"),
        baseline_added,
        median_baseline_added_p50_ms,
        median_baseline_added_p99_ms,
        median_baseline_cpu_us_per_req,
        generator_behind: trials.iter().filter(|t| !t.generator_on_schedule).count(),
        failed,
        trials,
        added,
        median_added_p50_ms: p50,
        median_added_p90_ms: p90,
        median_added_p99_ms: p99,
        acceptance,
    }
}

/// The text printed at the end of a run.
pub fn text_summary(rep: &HopReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "hop: {} req/s, {} s per trial, {} connections, a 1 ms stub (precise timer) — direct vs through fanout",
        rep.rate, rep.trial_s, rep.connections
    );
    let _ = writeln!(
        s,
        "{:>5} {:>14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "round", "path", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "lag p99", "CPU µs/req"
    );
    for t in &rep.trials {
        let _ = writeln!(
            s,
            "{:>5} {:>14} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.2} {:>10}{}",
            t.round,
            t.path,
            t.p50_ms,
            t.p90_ms,
            t.p99_ms,
            t.p999_ms,
            t.lag_p99_ms,
            t.fanout_cpu_us_per_req
                .map_or_else(|| "—".to_string(), |c| format!("{c:.1}")),
            if t.generator_on_schedule {
                ""
            } else {
                "  (generator behind schedule)"
            }
        );
    }
    let _ = writeln!(
        s,
        "added by the hop (median over rounds): p50 {:.0} µs, p90 {:.0} µs, p99 {:.0} µs; fanout CPU {:.1} µs/request; failed {}",
        rep.median_added_p50_ms * 1000.0,
        rep.median_added_p90_ms * 1000.0,
        rep.median_added_p99_ms * 1000.0,
        rep.median_fanout_cpu_us_per_req,
        rep.failed
    );
    if let (Some(p50), Some(p99), Some(cpu)) = (
        rep.median_baseline_added_p50_ms,
        rep.median_baseline_added_p99_ms,
        rep.median_baseline_cpu_us_per_req,
    ) {
        let _ = writeln!(
            s,
            "added by the hand-written hop ({BASELINE}, median over rounds): p50 {:.0} µs, p99 {:.0} µs; its CPU {cpu:.1} µs/request",
            p50 * 1000.0,
            p99 * 1000.0,
        );
    }
    if rep.generator_behind > 0 {
        let _ = writeln!(
            s,
            "WARNING: the generator fell behind its schedule in {} of {} trials",
            rep.generator_behind,
            rep.trials.len()
        );
    }
    for (line, ok) in &rep.acceptance {
        let _ = writeln!(s, "{} {line}", if *ok { "PASS" } else { "FAIL" });
    }
    s
}

pub(crate) fn html(rep: &HopReport, json: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fanout lab: hop</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1100px}}table{{border-collapse:collapse;margin:12px 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f0f0f0}}.warn{{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}}code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>
<h1>fanout lab — hop</h1><p>The latency one gateway hop adds: {rate} req/s to a stub route that answers after 1 ms (precise timer), directly and through fanout, interleaved (ABBA), {trial} s per trial, {conns} connections.</p><p>Command: <code>{cmd}</code></p>"#,
        rate = rep.rate,
        trial = rep.trial_s,
        conns = rep.connections,
        cmd = esc(&rep.command),
    );
    if rep.generator_behind > 0 {
        let _ = write!(
            h,
            r#"<div class="warn">The generator fell behind its schedule in {} of {} trials.</div>"#,
            rep.generator_behind,
            rep.trials.len()
        );
    }
    h.push_str("<h2>Acceptance</h2><ul>");
    for (line, ok) in &rep.acceptance {
        let _ = write!(
            h,
            "<li>{} {}</li>",
            if *ok { "PASS" } else { "FAIL" },
            esc(line)
        );
    }
    h.push_str("</ul><h2>Trials</h2><table><tr><th>round</th><th>path</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>lag p99 ms</th><th>CPU µs/req (fanout or the baseline)</th></tr>");
    for t in &rep.trials {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.2}</td><td>{}</td></tr>",
            t.round,
            esc(&t.path),
            t.p50_ms,
            t.p90_ms,
            t.p99_ms,
            t.p999_ms,
            t.lag_p99_ms,
            t.fanout_cpu_us_per_req
                .map_or_else(|| "—".to_string(), |c| format!("{c:.1}"))
        );
    }
    h.push_str("</table>");
    added_table(
        &mut h,
        "fanout",
        &rep.added,
        [
            Some(rep.median_added_p50_ms),
            Some(rep.median_added_p90_ms),
            Some(rep.median_added_p99_ms),
        ],
    );
    if let (Some(p50), Some(p99)) = (
        rep.median_baseline_added_p50_ms,
        rep.median_baseline_added_p99_ms,
    ) {
        let title = format!("the hand-written hop ({BASELINE})");
        added_table(
            &mut h,
            &title,
            &rep.baseline_added,
            [Some(p50), None, Some(p99)],
        );
    }
    let _ = write!(
        h,
        "<details><summary>report.json</summary><pre>{}</pre></details></body></html>",
        esc(json)
    );
    h
}

/// The table of what `path` added per round (its percentiles minus the direct path's), with the
/// medians in its last row (`None`: not reported).
fn added_table(h: &mut String, path: &str, rounds: &[Added], medians: [Option<f64>; 3]) {
    let _ = write!(
        h,
        "<h2>Added by {} (− direct, per round)</h2><table><tr><th>round</th><th>p50 µs</th><th>p90 µs</th><th>p99 µs</th></tr>",
        esc(path)
    );
    for a in rounds {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td></tr>",
            a.round,
            a.p50_ms * 1000.0,
            a.p90_ms * 1000.0,
            a.p99_ms * 1000.0
        );
    }
    h.push_str("<tr><th>median</th>");
    for m in medians {
        let _ = match m {
            Some(ms) => write!(h, "<th>{:.0}</th>", ms * 1000.0),
            None => write!(h, "<th></th>"),
        };
    }
    h.push_str("</tr></table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(round: usize, path: &str, p50: f64, p99: f64) -> Trial {
        Trial {
            round,
            path: path.into(),
            offered: 100,
            ok: 100,
            p50_ms: p50,
            p90_ms: p50,
            p99_ms: p99,
            p999_ms: p99,
            lag_p99_ms: 0.1,
            generator_on_schedule: true,
            fanout_cpu_us_per_req: (path == "fanout").then_some(50.0),
        }
    }

    #[test]
    fn added_latency_is_paired_per_round_and_the_median_is_checked() {
        let opts = HopOptions::new(true, PathBuf::from("x"), PathBuf::from("f"), "c".into());
        let rep = summarise(
            &opts,
            vec![
                t(0, "direct", 1.10, 1.5),
                t(0, "fanout", 1.18, 1.9),
                t(1, "fanout", 1.35, 2.0),
                t(1, "direct", 1.20, 1.6),
            ],
        );
        assert_eq!(rep.added.len(), 2);
        assert!((rep.median_added_p50_ms - 0.115).abs() < 1e-9);
        assert!((rep.median_added_p99_ms - 0.4).abs() < 1e-9);
        assert!(!rep.acceptance[0].1, "115 µs > 100 µs");
        assert!(rep.acceptance[1].1);
        assert_eq!(rep.failed, 0);
    }

    #[test]
    fn the_hand_written_hop_is_paired_with_the_direct_path_of_its_round() {
        let opts = HopOptions::new(true, PathBuf::from("x"), PathBuf::from("f"), "c".into());
        let base = |round, p50, p99| {
            let mut b = t(round, BASELINE, p50, p99);
            b.fanout_cpu_us_per_req = Some(40.0);
            b
        };
        let rep = summarise(
            &opts,
            vec![
                t(0, "direct", 1.10, 1.5),
                t(0, "fanout", 1.18, 1.9),
                base(0, 1.17, 1.7),
                base(1, 1.26, 1.9),
                t(1, "fanout", 1.35, 2.0),
                t(1, "direct", 1.20, 1.6),
            ],
        );
        assert!((rep.median_added_p50_ms - 0.115).abs() < 1e-9);
        assert_eq!(rep.baseline_added.len(), 2);
        let p50 = rep.median_baseline_added_p50_ms.unwrap();
        assert!((p50 - 0.065).abs() < 1e-9, "{p50}");
        let p99 = rep.median_baseline_added_p99_ms.unwrap();
        assert!((p99 - 0.25).abs() < 1e-9, "{p99}");
        assert_eq!(rep.median_baseline_cpu_us_per_req, Some(40.0));
        assert_eq!(rep.median_fanout_cpu_us_per_req, 50.0);
        assert!(text_summary(&rep).contains("hand-written hop"));
        let page = html(&rep, "{}");
        assert!(page.contains("Added by fanout") && page.contains("Added by the hand-written hop"));
        // Without the baseline the report has none of its fields.
        let alone = summarise(
            &opts,
            vec![t(0, "direct", 1.1, 1.5), t(0, "fanout", 1.2, 1.6)],
        );
        assert_eq!(alone.median_baseline_added_p50_ms, None);
        let json = serde_json::to_string(&alone).unwrap();
        assert!(!json.contains("baseline"), "{json}");
    }

    #[test]
    fn the_configs_are_valid() {
        fanout_stub::load_in("stubs.yaml", HOP_STUBS, &|_| None, None).expect("stubs");
        assert!(HOP_GATEWAY.contains("dedup: false"));
    }
}
