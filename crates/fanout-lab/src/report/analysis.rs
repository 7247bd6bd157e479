//! Analysis: the recorded trials → per-target summaries. Medians with min–max over interleaved
//! trials, per-phase figures and recovery of an overload run, per-route figures of a
//! slow-backend run, merged latency of hedging trials; then the report (the runner adds the
//! scenario's acceptance lines: `crate::scenario::accept`).

use super::max_rate::max_rate_reason;
use super::{
    Direct, HedgingSummary, LabReport, Level, Phase, Recovery, Relative, RoutePhase, RouteSummary,
    Stat, TargetSummary,
};
use crate::model::Trial;
use crate::model::{Mode, Scenario};
use crate::procstat::ProcSample;
use crate::{LabOptions, RECOVERED_SUCCESS};
use fanout_load::hdrhistogram::Histogram;
use std::collections::BTreeMap;

impl Stat {
    /// Median, min and max of the finite values of `v`.
    pub(crate) fn of(mut v: Vec<f64>) -> Stat {
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
        let timeline = timelines.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let summary = target_summary(
            scenario,
            &mine,
            timeline,
            caps.get(name).copied(),
            direct.as_ref(),
        );
        if !summary.generator_valid {
            warnings.push(generator_warning(name, &mine));
        }
        targets.insert(name.clone(), summary);
    }
    let compares = matches!(scenario.mode, Mode::Compare | Mode::CompareAt { .. });
    if compares && scenario.equal_work() {
        warnings.extend(unequal_work(&targets));
    }
    let relative = if compares {
        relative(scenario.baselines, &opts.targets, &targets, &trials)
    } else {
        Vec::new()
    };
    LabReport {
        version: 3,
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
        // The scenario's own lines, added by the runner (`crate::scenario::accept`).
        acceptance: Vec::new(),
        trials,
        timelines,
        warnings,
        closed_loop: None,
        models: None,
        pools: None,
        relative,
    }
}

/// Every target's CPU per request beside the first of `baselines` that ran, per level of the
/// baseline's: the ratio of the two medians, and the median of the per-round ratios (each
/// target trial ÷ the baseline's trial of the same phase and round). None without a baseline
/// among `names`.
pub(crate) fn relative(
    baselines: &[&str],
    names: &[String],
    targets: &BTreeMap<String, TargetSummary>,
    trials: &[Trial],
) -> Vec<Relative> {
    let Some(base) = baselines
        .iter()
        .find(|b| names.iter().any(|n| n.as_str() == **b))
    else {
        return Vec::new();
    };
    let Some(b) = targets.get(*base) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names.iter().filter(|n| n.as_str() != *base) {
        let Some(t) = targets.get(name) else { continue };
        for bl in &b.levels {
            let Some(tl) = t.levels.iter().find(|l| l.name == bl.name) else {
                continue;
            };
            let per_round: Vec<f64> = trials
                .iter()
                .filter(|x| &x.target == name && x.phase == bl.name)
                .filter_map(|x| {
                    let y = trials
                        .iter()
                        .find(|y| y.target == *base && y.phase == x.phase && y.round == x.round)?;
                    (y.cpu_us_per_request > 0.0)
                        .then(|| x.cpu_us_per_request / y.cpu_us_per_request)
                })
                .collect();
            let (tm, bm) = (tl.cpu_us_per_request.median, bl.cpu_us_per_request.median);
            out.push(Relative {
                target: name.clone(),
                baseline: (*base).to_string(),
                level: bl.name.clone(),
                ratio_of_medians: (bm > 0.0).then(|| tm / bm),
                per_round: Stat::of(per_round),
            });
        }
    }
    out
}

/// Targets compared at a level must do the same work: the same backend calls per request. One
/// that shares calls between requests (dedup, caches, coalescing) does less, and its CPU and
/// latency describe other work — what sharing saves is its own figure. A warning per level
/// whose targets' medians differ by more than 2 % (and 0.02 calls).
pub(crate) fn unequal_work(targets: &BTreeMap<String, TargetSummary>) -> Vec<String> {
    let mut names: Vec<&String> = Vec::new();
    for t in targets.values() {
        for l in &t.levels {
            if !names.contains(&&l.name) {
                names.push(&l.name);
            }
        }
    }
    let mut out = Vec::new();
    for level in names {
        let calls: Vec<(&String, f64)> = targets
            .iter()
            .filter_map(|(n, t)| {
                t.levels
                    .iter()
                    .find(|l| &l.name == level)
                    .map(|l| (n, l.backend_calls_per_request.median))
            })
            .filter(|(_, c)| c.is_finite())
            .collect();
        let lo = calls.iter().map(|(_, c)| *c).fold(f64::INFINITY, f64::min);
        let hi = calls.iter().map(|(_, c)| *c).fold(0.0, f64::max);
        if calls.len() >= 2 && hi - lo > 0.02 && hi - lo > 0.02 * hi {
            let each: Vec<String> = calls.iter().map(|(n, c)| format!("{n} {c:.2}")).collect();
            out.push(format!(
                "unequal work at {level}: backend calls per request differ ({}) — the CPU and latency figures compare different work; vary the request data per request or turn sharing off (`defaults: {{coalesce: false}}`, no dedup or caches) to compare equal work",
                each.join(", ")
            ));
        }
    }
    out
}

/// One target's summary from its recorded trials (`mine`) and its `/proc` timeline.
fn target_summary(
    scenario: &Scenario,
    mine: &[&Trial],
    timeline: &[ProcSample],
    max_rate: Option<f64>,
    direct: Option<&Direct>,
) -> TargetSummary {
    let levels = levels(mine);
    let main = mine
        .iter()
        .copied()
        .find(|t| t.phase == "overload" || t.phase == "slow-backend" || t.phase == "hedging");
    let (phases, recovery) = match main {
        Some(t) if t.phase == "overload" => (overload_phases(t), recovery(t)),
        _ => (vec![], None),
    };
    let routes = route_summaries(scenario, mine);
    let hedging = hedging_summary(mine);
    let head = headline(mine, &levels, main, hedging.as_ref());
    TargetSummary {
        cpu_us_per_request: head.cpu_us_per_request,
        p50_ms: head.p50_ms,
        p99_ms: head.p99_ms,
        error_rate: head.error_rate,
        max_rate,
        max_rate_reason: max_rate_reason(mine, max_rate, scenario.slo_p99_ms),
        threads_max: timeline.iter().map(|s| s.threads).max().unwrap_or(0),
        rss_max_mb: timeline.iter().map(|s| s.rss_bytes).max().unwrap_or(0) as f64 / 1e6,
        backend_calls_per_request: head.backend_calls_per_request,
        // Only a target that made every call of the direct path did the same work: one that
        // shared calls between requests (dedup, caches) answered some requests faster than the
        // floor, which is its own line (backend calls per request), not latency it removed.
        added_p50_ms: direct
            .filter(|d| head.backend_calls_per_request + 0.05 >= d.path.len() as f64)
            .map(|d| head.p50_ms - d.p50_ms),
        generator_valid: measured(mine).all(|t| t.valid),
        levels,
        phases,
        recovery,
        routes,
        hedging,
        cells: vec![],
    }
}

/// Medians over the interleaved trials of each load level.
fn levels(mine: &[&Trial]) -> Vec<Level> {
    let mut levels = Vec::new();
    for level in ["fixed-rate", "level-50", "level-80"] {
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
    levels
}

/// The headline figures of a target's summary row.
struct Headline {
    cpu_us_per_request: f64,
    p50_ms: f64,
    p99_ms: f64,
    error_rate: f64,
    backend_calls_per_request: f64,
}

/// The headline figures: merged hedging trials, else the first level's medians, else the main
/// (overload / slow-backend) run.
fn headline(
    mine: &[&Trial],
    levels: &[Level],
    main: Option<&Trial>,
    hedging: Option<&HedgingSummary>,
) -> Headline {
    let (cpu, p50, p99, err, calls) = match (levels.first(), main, hedging) {
        (None, _, Some(h)) => {
            let ts: Vec<&&Trial> = mine.iter().filter(|t| t.phase == "hedging").collect();
            (
                Stat::of(ts.iter().map(|t| t.cpu_us_per_request).collect()).median,
                h.p50_ms,
                h.p99_ms,
                Stat::of(ts.iter().map(|t| t.error_rate).collect()).median,
                h.backend_calls_per_request.median,
            )
        }
        (Some(l), _, _) => (
            l.cpu_us_per_request.median,
            l.p50_ms.median,
            l.p99_ms.median,
            l.error_rate.median,
            l.backend_calls_per_request.median,
        ),
        (None, Some(t), _) => (
            t.cpu_us_per_request,
            t.p50_ms,
            t.p99_ms,
            t.error_rate,
            t.backend_calls_per_request,
        ),
        (None, None, _) => (0.0, 0.0, 0.0, 0.0, 0.0),
    };
    Headline {
        cpu_us_per_request: cpu,
        p50_ms: p50,
        p99_ms: p99,
        error_rate: err,
        backend_calls_per_request: calls,
    }
}

/// The measured trials: search steps probe limits on purpose, so validity is judged on the
/// others.
fn measured<'a>(mine: &'a [&'a Trial]) -> impl Iterator<Item = &'a Trial> {
    mine.iter().copied().filter(|t| t.phase != "search")
}

/// The warning for a target whose generator fell behind in some measured trials.
fn generator_warning(name: &str, mine: &[&Trial]) -> String {
    format!(
        "{name}: the generator fell behind its schedule in {} of {} measured trials (see the lag chart); those figures describe the machine's limit, not the target's",
        measured(mine).filter(|t| !t.valid).count(),
        measured(mine).count()
    )
}

/// Per-phase figures of a continuous run from its per-second series and histograms.
fn overload_phases(t: &Trial) -> Vec<Phase> {
    let secs = &t.load.seconds;
    let hists = &t.load.second_histograms;
    t.phase_bounds
        .iter()
        .map(|b| {
            let idx: Vec<usize> = (0..secs.len())
                .filter(|&i| (secs[i].t as f64) >= b.from_s && (secs[i].t as f64) < b.to_s)
                .collect();
            let len = (b.to_s - b.from_s).max(1e-9);
            let sum = |f: &dyn Fn(&fanout_load::SecondStats) -> u64| -> u64 {
                idx.iter().map(|&i| f(&secs[i])).sum()
            };
            let mut ok_h = fanout_load::empty_histogram();
            let mut rej_h = fanout_load::empty_histogram();
            for &i in &idx {
                if let Some(h) = hists.get(i) {
                    let _ = ok_h.add(&h.ok);
                    let _ = rej_h.add(&h.rejected);
                }
            }
            let ok = sum(&|s| s.ok);
            let completed = sum(&|s| s.completed);
            let rejected = sum(&|s| s.rejected);
            let net = sum(&|s| s.errors);
            let timeouts = sum(&|s| s.timeouts);
            let window: Vec<&ProcSample> = t
                .samples
                .iter()
                .filter(|x| x.t >= b.from_s && x.t < b.to_s)
                .collect();
            Phase {
                name: b.name.clone(),
                from_s: b.from_s,
                to_s: b.to_s,
                offered_rate: sum(&|s| s.offered) as f64 / len,
                ok_rate: ok as f64 / len,
                p99_ms_max_per_second: idx.iter().map(|&i| secs[i].p99_ms).fold(0.0, f64::max),
                error_rate_per_s: (completed - ok.min(completed) + net) as f64 / len,
                accepted_p50_ms: quantile_ms(&ok_h, 0.5),
                accepted_p99_ms: quantile_ms(&ok_h, 0.99),
                rejected,
                rejected_rate: rejected as f64 / len,
                rejected_p99_ms: quantile_ms(&rej_h, 0.99),
                timeouts,
                errors: completed.saturating_sub(ok + rejected) + net.saturating_sub(timeouts),
                threads_max: window.iter().map(|x| x.threads).max().unwrap_or(0),
                rss_max_mb: window.iter().map(|x| x.rss_bytes).max().unwrap_or(0) as f64 / 1e6,
            }
        })
        .collect()
}

/// Time to recover after the last phase began: the first second from which every second (by
/// intended send time) to the end of the run has success ≥ 99.9 %.
fn recovery(t: &Trial) -> Option<Recovery> {
    let b = t.phase_bounds.last()?;
    Some(recovery_after(&t.load.by_send_second, b.from_s))
}

/// [`Recovery`] from outcomes by send second, the load having dropped at `drop_at_s`.
fn recovery_after(by_send_second: &[fanout_load::SendSecond], drop_at_s: f64) -> Recovery {
    let from = drop_at_s.round().max(0.0) as u64;
    let per_second: Vec<(u64, f64)> = by_send_second
        .iter()
        .filter(|s| s.t >= from && s.offered > 0)
        .map(|s| (s.t, s.ok as f64 / s.offered as f64))
        .collect();
    let mut first_good = None;
    for (i, (_, r)) in per_second.iter().enumerate().rev() {
        if *r >= RECOVERED_SUCCESS {
            first_good = Some(i);
        } else {
            break;
        }
    }
    let time = first_good
        .and_then(|i| per_second.get(i))
        .map(|(t, _)| (t - from) as f64);
    Recovery {
        drop_at_s,
        recovered: time.is_some(),
        time_to_recover_s: time,
        success_by_second: per_second.iter().map(|(_, r)| *r).collect(),
    }
}

/// Per route and phase of a slow-backend run.
fn route_summaries(scenario: &Scenario, mine: &[&Trial]) -> Vec<RouteSummary> {
    let Mode::SlowBackend(sb) = &scenario.mode else {
        return vec![];
    };
    sb.routes
        .iter()
        .map(|r| {
            let phases = mine
                .iter()
                .filter(|t| t.phase == "slow-backend" && t.route.as_deref() == Some(r.name))
                .map(|t| {
                    let l = &t.load;
                    RoutePhase {
                        name: t.stage.clone().unwrap_or_default(),
                        offered_rate: t.offered_rate,
                        p50_ms: l.latency_ms.p50,
                        p99_ms: l.latency_ms.p99,
                        max_ms: l.latency_ms.max,
                        success_pct: if l.offered > 0 {
                            l.ok as f64 * 100.0 / l.offered as f64
                        } else {
                            0.0
                        },
                        default_share: if l.ok > 0 {
                            l.partial as f64 / l.ok as f64
                        } else {
                            0.0
                        },
                        within_deadline: l.completed == l.offered
                            && l.latency_ms.max <= r.deadline_ms,
                        backend_calls_per_request: t.backend_calls_per_request,
                    }
                })
                .collect();
            RouteSummary {
                route: r.name.into(),
                about: r.about.into(),
                deadline_ms: r.deadline_ms,
                uses_changed_backend: r.uses_changed,
                phases,
            }
        })
        .collect()
}

/// Latency of a target's hedging trials, their histograms merged.
fn hedging_summary(mine: &[&Trial]) -> Option<HedgingSummary> {
    let ts: Vec<&&Trial> = mine.iter().filter(|t| t.phase == "hedging").collect();
    if ts.is_empty() {
        return None;
    }
    let mut h = fanout_load::empty_histogram();
    for t in &ts {
        let _ = h.add(&t.load.latency_hist);
    }
    Some(HedgingSummary {
        trials: ts.len(),
        requests: h.len(),
        p50_ms: quantile_ms(&h, 0.5),
        p99_ms: quantile_ms(&h, 0.99),
        p999_ms: quantile_ms(&h, 0.999),
        backend_calls_per_request: Stat::of(
            ts.iter().map(|t| t.backend_calls_per_request).collect(),
        ),
        p99_ms_per_trial: Stat::of(ts.iter().map(|t| t.p99_ms).collect()),
    })
}

/// The `q` quantile of `h` (µs) in ms; 0 for an empty histogram.
fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_load::SendSecond;

    fn seconds(ok: &[u64]) -> Vec<SendSecond> {
        ok.iter()
            .enumerate()
            .map(|(t, &ok)| SendSecond {
                t: t as u64,
                offered: 1000,
                ok,
                rejected: 0,
                failed: 1000 - ok,
            })
            .collect()
    }

    #[test]
    fn recovery_is_the_first_second_that_stays_good() {
        // Drop at 2 s; seconds 2, 3 bad, 4 good, 5 bad again, 6 and 7 good: recovered at 6.
        let r = recovery_after(&seconds(&[1000, 0, 10, 500, 1000, 990, 1000, 1000]), 2.0);
        assert!(r.recovered);
        assert_eq!(r.time_to_recover_s, Some(4.0));
        assert_eq!(r.success_by_second.len(), 6);
        // 999 of 1000 is 99.9 %: good.
        let r = recovery_after(&seconds(&[1000, 999, 999]), 1.0);
        assert_eq!(r.time_to_recover_s, Some(0.0));
        // The last second is bad: not recovered.
        let r = recovery_after(&seconds(&[1000, 1000, 1000, 998]), 1.0);
        assert!(!r.recovered);
        assert_eq!(r.time_to_recover_s, None);
        // Nothing offered after the drop: not recovered (nothing shows it).
        assert!(!recovery_after(&seconds(&[1000]), 3.0).recovered);
    }
}
