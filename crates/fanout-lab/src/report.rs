//! `report.json` (schema in docs/lab.md) and a self-contained `report.html` with SVG charts.

use crate::procstat::ProcSample;
use crate::scenario::{Mode, Scenario};
use crate::svg::{Series, esc, line_chart};
use crate::{LAG_THRESHOLD, LabOptions, RECOVERED_SUCCESS, Trial};
use fanout_load::hdrhistogram::Histogram;
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

/// A phase of an overload run, from the run's per-second figures (requests are counted in the
/// second they ended).
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Phase name.
    pub name: String,
    /// Start, seconds into the run.
    pub from_s: f64,
    /// End.
    pub to_s: f64,
    /// Offered requests/s.
    pub offered_rate: f64,
    /// 2xx responses/s (goodput).
    pub ok_rate: f64,
    /// Highest per-second p99 (all answers) in the phase, ms.
    pub p99_ms_max_per_second: f64,
    /// Everything that was not a 2xx, per second (rejections, timeouts, errors).
    pub error_rate_per_s: f64,
    /// p50 of the successful (2xx) requests, ms, from the intended send time.
    pub accepted_p50_ms: f64,
    /// p99 of the successful (2xx) requests, ms.
    pub accepted_p99_ms: f64,
    /// Rejections (503/429 answers).
    pub rejected: u64,
    /// Rejections per second.
    pub rejected_rate: f64,
    /// p99 latency of the rejections, ms (0 when there were none).
    pub rejected_p99_ms: f64,
    /// Requests that got no answer within the generator's timeout (the client's deadline).
    pub timeouts: u64,
    /// Other failures: non-2xx answers other than 503/429 and network errors.
    pub errors: u64,
    /// Most threads of the target during the phase.
    pub threads_max: u64,
    /// Largest RSS of the target during the phase, MB.
    pub rss_max_mb: f64,
}

/// How an overload run recovered after the load dropped to 0.7×.
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    /// When the load dropped, seconds into the run.
    pub drop_at_s: f64,
    /// Whether success reached ≥ 99.9 % and stayed there to the end of the run.
    pub recovered: bool,
    /// Seconds from the drop to the first 1-s window (by intended send time) from which every
    /// window has success ≥ 99.9 %; `None`: not recovered.
    pub time_to_recover_s: Option<f64>,
    /// Success share (2xx ÷ offered) of each second from the drop on.
    pub success_by_second: Vec<f64>,
}

/// A route in one slow-backend phase (its own generator run).
#[derive(Debug, Clone, Serialize)]
pub struct RoutePhase {
    /// `normal`, `slow`, `failing`, `restored`.
    pub name: String,
    /// Offered requests/s to this route.
    pub offered_rate: f64,
    /// p50 latency (all answers), ms.
    pub p50_ms: f64,
    /// p99 latency (all answers), ms.
    pub p99_ms: f64,
    /// Slowest answer, ms.
    pub max_ms: f64,
    /// 2xx answers ÷ offered, %.
    pub success_pct: f64,
    /// Share of the 2xx answers that carried a default (listed a step in `_partial`).
    pub default_share: f64,
    /// Every request answered, none later than the route's deadline.
    pub within_deadline: bool,
    /// Stub calls per inbound request (all routes of the phase together).
    pub backend_calls_per_request: f64,
}

/// One route of a slow-backend run.
#[derive(Debug, Clone, Serialize)]
pub struct RouteSummary {
    /// `A`, `B`.
    pub route: String,
    /// What it calls.
    pub about: String,
    /// Its deadline, ms.
    pub deadline_ms: f64,
    /// Whether it calls the backend that is made slow / failing.
    pub uses_changed_backend: bool,
    /// Per phase, in order.
    pub phases: Vec<RoutePhase>,
}

/// Latency of a hedging comparison target over all its trials (histograms merged).
#[derive(Debug, Clone, Serialize)]
pub struct HedgingSummary {
    /// Trials merged.
    pub trials: usize,
    /// Requests measured.
    pub requests: u64,
    /// p50, ms.
    pub p50_ms: f64,
    /// p99, ms.
    pub p99_ms: f64,
    /// p99.9, ms.
    pub p999_ms: f64,
    /// Backend calls per inbound request, over the trials.
    pub backend_calls_per_request: Stat,
    /// p99 per trial.
    pub p99_ms_per_trial: Stat,
}

/// One acceptance line: one of the product's acceptance criteria (overload, slow backend,
/// hedging) checked on this run.
#[derive(Debug, Clone, Serialize)]
pub struct Acceptance {
    /// Target checked.
    pub target: String,
    /// What is checked.
    pub check: String,
    /// The pass condition.
    pub criterion: String,
    /// What was measured.
    pub measured: String,
    /// Whether it held in this run.
    pub pass: bool,
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
    /// Why `max_rate` is 0 (`None` when it is a measured capacity, or there was no search):
    /// every trial was flagged (`no valid trial: all N flagged — generator behind schedule (lag
    /// p99 4.1 ms > 2 ms)`), every search step was flagged, or no valid step met the SLO.
    pub max_rate_reason: Option<String>,
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
    /// Per phase (overload).
    pub phases: Vec<Phase>,
    /// Recovery after the overload (overload).
    pub recovery: Option<Recovery>,
    /// Per route and phase (slow-backend).
    pub routes: Vec<RouteSummary>,
    /// Merged latency over the trials (hedging).
    pub hedging: Option<HedgingSummary>,
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
    /// Acceptance lines (overload, slow-backend, hedging), each pass/fail per target.
    pub acceptance: Vec<Acceptance>,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// /proc samples of every target over the run.
    pub timelines: BTreeMap<String, Vec<ProcSample>>,
    /// Things to know when reading the figures (generator lag, …).
    pub warnings: Vec<String>,
}

fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
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

fn pct(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

/// The acceptance lines (the product's acceptance criteria) that this scenario measures.
fn acceptance(
    scenario: &Scenario,
    targets: &BTreeMap<String, TargetSummary>,
    order: &[String],
) -> Vec<Acceptance> {
    let mut out = Vec::new();
    let line =
        |target: &str, check: &str, criterion: &str, measured: String, pass: bool| Acceptance {
            target: target.into(),
            check: check.into(),
            criterion: criterion.into(),
            measured,
            pass,
        };
    for name in order {
        let Some(t) = targets.get(name) else { continue };
        match &scenario.mode {
            Mode::Overload => {
                let phase = |n: &str| t.phases.iter().find(|p| p.name == n);
                let (Some(low), Some(high)) = (phase("0.5x"), phase("3x")) else {
                    continue;
                };
                let cap = t.max_rate.unwrap_or(0.0);
                out.push(line(
                    name,
                    "overload: goodput at 3×",
                    "≥ 90 % of the measured capacity",
                    format!(
                        "{} req/s = {} of {} req/s",
                        f(high.ok_rate),
                        if cap > 0.0 {
                            pct(high.ok_rate / cap)
                        } else {
                            "—".into()
                        },
                        f(cap)
                    ),
                    cap > 0.0 && high.ok_rate >= 0.9 * cap,
                ));
                out.push(line(
                    name,
                    "overload: accepted p99 at 3×",
                    "≤ 2× the accepted p99 at 0.5×",
                    format!(
                        "{} ms vs {} ms at 0.5× ({:.1}×)",
                        f(high.accepted_p99_ms),
                        f(low.accepted_p99_ms),
                        if low.accepted_p99_ms > 0.0 {
                            high.accepted_p99_ms / low.accepted_p99_ms
                        } else {
                            0.0
                        }
                    ),
                    high.ok_rate > 0.0
                        && low.accepted_p99_ms > 0.0
                        && high.accepted_p99_ms <= 2.0 * low.accepted_p99_ms,
                ));
                let failures = high.timeouts + high.errors;
                let (measured, pass) = if high.rejected > 0 {
                    (
                        format!(
                            "{} ms over {} rejections ({} timeouts, {} errors)",
                            f(high.rejected_p99_ms),
                            high.rejected,
                            high.timeouts,
                            high.errors
                        ),
                        high.rejected_p99_ms <= 10.0,
                    )
                } else if failures > 0 {
                    (
                        format!(
                            "no rejections: the excess ended as {} timeouts and {} errors",
                            high.timeouts, high.errors
                        ),
                        false,
                    )
                } else {
                    (
                        "no rejections needed (every request succeeded)".into(),
                        true,
                    )
                };
                out.push(line(
                    name,
                    "overload: rejection p99 at 3×",
                    "≤ 10 ms (503/429 answered at once)",
                    measured,
                    pass,
                ));
                if let Some(r) = &t.recovery {
                    out.push(line(
                        name,
                        "overload: recovery after the drop to 0.7×",
                        "≥ 99.9 % success (per 1-s window) within 10 s, and staying there",
                        match r.time_to_recover_s {
                            Some(s) => format!("recovered after {s:.0} s"),
                            None => format!(
                                "not recovered within the {:.0} s of the 0.7× phase (last second {:.1} % success)",
                                t.phases.last().map(|p| p.to_s - p.from_s).unwrap_or(0.0),
                                r.success_by_second.last().copied().unwrap_or(0.0) * 100.0
                            ),
                        },
                        r.time_to_recover_s.is_some_and(|s| s <= 10.0),
                    ));
                }
            }
            Mode::SlowBackend(_) => {
                for r in &t.routes {
                    let Some(normal) = r.phases.iter().find(|p| p.name == "normal") else {
                        continue;
                    };
                    if !r.uses_changed_backend {
                        let others: Vec<&RoutePhase> =
                            r.phases.iter().filter(|p| p.name != "normal").collect();
                        let measured = std::iter::once(format!("normal {} ms", f(normal.p99_ms)))
                            .chain(others.iter().map(|p| {
                                format!(
                                    "{} {} ms ({:+.0} %)",
                                    p.name,
                                    f(p.p99_ms),
                                    if normal.p99_ms > 0.0 {
                                        (p.p99_ms / normal.p99_ms - 1.0) * 100.0
                                    } else {
                                        0.0
                                    }
                                )
                            }))
                            .collect::<Vec<_>>()
                            .join("; ");
                        out.push(line(
                            name,
                            &format!("slow-backend: route {} p99 unaffected", r.route),
                            "p99 ≤ +10 % of its normal-phase p99 in every phase",
                            measured,
                            normal.p99_ms > 0.0
                                && others.iter().all(|p| p.p99_ms <= 1.1 * normal.p99_ms),
                        ));
                    } else {
                        let bad: Vec<&RoutePhase> = r
                            .phases
                            .iter()
                            .filter(|p| p.name == "slow" || p.name == "failing")
                            .collect();
                        let measured = bad
                            .iter()
                            .map(|p| {
                                format!(
                                    "{}: {:.1} % ok, {} with the default, max {} ms",
                                    p.name,
                                    p.success_pct,
                                    pct(p.default_share),
                                    f(p.max_ms)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("; ");
                        out.push(line(
                            name,
                            &format!(
                                "slow-backend: route {} answers with the default in time",
                                r.route
                            ),
                            &format!(
                                "while the backend is slow / failing: ≥ 99.9 % answered, every answer within the {} ms deadline, ≥ 99 % with the default",
                                f(r.deadline_ms)
                            ),
                            measured,
                            !bad.is_empty()
                                && bad.iter().all(|p| {
                                    p.success_pct >= 99.9
                                        && p.within_deadline
                                        && p.default_share >= 0.99
                                }),
                        ));
                    }
                }
            }
            Mode::Hedging { .. } if name != "no-hedge" => {
                let (Some(h), Some(base)) = (
                    t.hedging.as_ref(),
                    targets.get("no-hedge").and_then(|b| b.hedging.as_ref()),
                ) else {
                    continue;
                };
                let cut = if base.p99_ms > 0.0 {
                    1.0 - h.p99_ms / base.p99_ms
                } else {
                    0.0
                };
                let base_calls = base.backend_calls_per_request.median;
                let extra = if base_calls > 0.0 {
                    h.backend_calls_per_request.median / base_calls - 1.0
                } else {
                    0.0
                };
                out.push(line(
                    name,
                    "hedging: p99 cut vs no-hedge",
                    "p99 ≥ 50 % lower at ≤ 10 % extra backend calls",
                    format!(
                        "p99 {} ms vs {} ms ({:.0} % lower); {:.3} vs {:.3} calls/request ({:+.1} %)",
                        f(h.p99_ms),
                        f(base.p99_ms),
                        cut * 100.0,
                        h.backend_calls_per_request.median,
                        base_calls,
                        extra * 100.0
                    ),
                    cut >= 0.5 && extra <= 0.10,
                ));
            }
            _ => {}
        }
    }
    out
}

/// What flagged `flagged` (trials with `valid == false`), grouped by cause: `generator behind
/// schedule (lag p99 4.1 ms > 2 ms)`, `requests left unsent …`, else the generator's own words.
fn flag_causes(flagged: &[&Trial]) -> String {
    let limit_ms = LAG_THRESHOLD.as_secs_f64() * 1000.0;
    let n = flagged.len();
    let share = |k: usize| {
        if k == n {
            String::new()
        } else {
            format!(" in {k} of {n}")
        }
    };
    let mut causes = Vec::new();
    let lagged: Vec<f64> = flagged
        .iter()
        .map(|t| t.lag_p99_ms)
        .filter(|l| *l > limit_ms)
        .collect();
    if !lagged.is_empty() {
        let lo = lagged.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = lagged.iter().copied().fold(0.0, f64::max);
        let range = if format!("{lo:.1}") == format!("{hi:.1}") {
            format!("{hi:.1}")
        } else {
            format!("{lo:.1}–{hi:.1}")
        };
        causes.push(format!(
            "generator behind schedule{} (lag p99 {range} ms > {limit_ms} ms)",
            share(lagged.len())
        ));
    }
    let unsent: Vec<u64> = flagged
        .iter()
        .map(|t| t.load.errors.not_sent)
        .filter(|u| *u > 0)
        .collect();
    if !unsent.is_empty() {
        causes.push(format!(
            "requests left unsent when the drain ended{} ({} in total)",
            share(unsent.len()),
            unsent.iter().sum::<u64>()
        ));
    }
    let mut other: Vec<&str> = flagged
        .iter()
        .filter(|t| t.lag_p99_ms <= limit_ms && t.load.errors.not_sent == 0)
        .map(|t| {
            t.invalid_reason
                .as_deref()
                .unwrap_or("flagged by the generator")
        })
        .collect();
    other.sort_unstable();
    other.dedup();
    causes.extend(other.into_iter().map(str::to_string));
    causes.join("; ")
}

/// How a valid trial missed the SLO (`p99 80.1 ms > 50 ms`, …).
fn slo_misses(t: &Trial, slo_p99_ms: f64) -> String {
    let mut v = Vec::new();
    if t.p99_ms > slo_p99_ms {
        v.push(format!("p99 {:.1} ms > {slo_p99_ms} ms", t.p99_ms));
    }
    if t.error_rate > 0.01 {
        v.push(format!("errors {:.1} % > 1 %", t.error_rate * 100.0));
    }
    if t.achieved_rate < 0.95 * t.offered_rate {
        v.push(format!(
            "achieved {:.0} < 95 % of {:.0} req/s",
            t.achieved_rate, t.offered_rate
        ));
    }
    if v.is_empty() {
        "missed the SLO".into()
    } else {
        v.join(", ")
    }
}

/// Why a target's `max_rate` is 0 (see [`TargetSummary::max_rate_reason`]); `mine` are its
/// recorded trials.
fn max_rate_reason(mine: &[&Trial], max_rate: Option<f64>, slo_p99_ms: f64) -> Option<String> {
    if !max_rate.is_some_and(|r| r <= 0.0) {
        return None;
    }
    let search: Vec<&Trial> = mine
        .iter()
        .copied()
        .filter(|t| t.phase == "search")
        .collect();
    if !mine.is_empty() && mine.iter().all(|t| !t.valid) {
        return Some(format!(
            "no valid trial: all {} flagged — {}",
            mine.len(),
            flag_causes(mine)
        ));
    }
    let bad: Vec<&Trial> = search.iter().copied().filter(|t| !t.valid).collect();
    if search.is_empty() {
        return Some("no capacity-search step ran".into());
    }
    if bad.len() == search.len() {
        return Some(format!(
            "no valid capacity-search step: all {} flagged — {}",
            search.len(),
            flag_causes(&bad)
        ));
    }
    let lowest = search
        .iter()
        .filter(|t| t.valid)
        .min_by(|a, b| a.offered_rate.total_cmp(&b.offered_rate));
    let mut s = format!(
        "no capacity-search step met the SLO (p99 ≤ {slo_p99_ms} ms, errors ≤ 1 %, achieved ≥ 95 % of offered)"
    );
    if let Some(t) = lowest {
        s.push_str(&format!(
            "; at {:.0} req/s: {}",
            t.offered_rate,
            slo_misses(t, slo_p99_ms)
        ));
    }
    if !bad.is_empty() {
        s.push_str(&format!(
            "; {} of {} steps flagged — {}",
            bad.len(),
            search.len(),
            flag_causes(&bad)
        ));
    }
    Some(s)
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
            .find(|t| t.phase == "overload" || t.phase == "slow-backend" || t.phase == "hedging");
        let (phases, recovery) = match main {
            Some(t) if t.phase == "overload" => (overload_phases(t), recovery(t)),
            _ => (vec![], None),
        };
        let routes = route_summaries(scenario, &mine);
        let hedging = hedging_summary(&mine);
        let (cpu, p50, p99, err, calls) = match (levels.first(), main, &hedging) {
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
                max_rate_reason: max_rate_reason(
                    &mine,
                    caps.get(name).copied(),
                    scenario.slo_p99_ms,
                ),
                threads_max: tl.iter().map(|s| s.threads).max().unwrap_or(0),
                rss_max_mb: tl.iter().map(|s| s.rss_bytes).max().unwrap_or(0) as f64 / 1e6,
                backend_calls_per_request: calls,
                added_p50_ms: direct.as_ref().map(|d| p50 - d.p50_ms),
                generator_valid: valid,
                levels,
                phases,
                recovery,
                routes,
                hedging,
            },
        );
    }
    for (name, t) in &targets {
        let (Some(cap), Some(high)) = (t.max_rate, t.phases.iter().find(|p| p.name == "3x")) else {
            continue;
        };
        if high.ok_rate > 1.2 * cap && high.rejected + high.timeouts + high.errors == 0 {
            warnings.push(format!(
                "{name}: the 3× phase did not overload it ({:.0} req/s served, all of them, against a measured capacity of {cap:.0} req/s): the capacity search stopped early (see its warnings), so the overload acceptance lines are not meaningful in this run",
                high.ok_rate
            ));
        }
    }
    let acceptance = acceptance(scenario, &targets, &opts.targets);
    LabReport {
        version: 2,
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
        acceptance,
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
        .find(|t| t.phase == "overload")
        .or_else(|| mine.clone().rfind(|t| t.phase == "level-80"))
        .or_else(|| mine.clone().next_back())
}

/// Per-second points of a target's slow-backend runs of one route, in time order.
fn stitched(
    rep: &LabReport,
    target: &str,
    route: &str,
    f: fn(&fanout_load::SecondStats) -> f64,
) -> Vec<(f64, f64)> {
    let ts: Vec<&Trial> = rep
        .trials
        .iter()
        .filter(|t| {
            t.target == target && t.phase == "slow-backend" && t.route.as_deref() == Some(route)
        })
        .collect();
    let Some(t0) = ts.first().map(|t| t.t_start) else {
        return vec![];
    };
    ts.iter()
        .flat_map(|t| {
            t.load
                .seconds
                .iter()
                .map(move |x| (t.t_start - t0 + x.t as f64, f(x)))
        })
        .collect()
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
    let over_time = rep.trials.iter().any(|t| t.phase == "overload");
    let slow = rep.trials.iter().any(|t| t.phase == "slow-backend");
    let routes: Vec<String> = rep
        .targets
        .values()
        .flat_map(|t| t.routes.iter().map(|r| r.route.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();

    // 1. Achieved vs offered rate.
    let mut s = Vec::new();
    for n in &names {
        if slow {
            for r in &routes {
                s.push(Series::dashed(
                    format!("{n} {r} offered"),
                    stitched(rep, n, r, |x| x.offered as f64),
                ));
                s.push(Series::new(
                    format!("{n} {r} 2xx"),
                    stitched(rep, n, r, |x| x.ok as f64),
                ));
            }
        } else if over_time {
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
    if over_time || slow {
        out.push(line_chart(
            "rate",
            "Achieved vs offered rate",
            if slow {
                "seconds since the first phase (normal → slow → failing → restored)"
            } else {
                "seconds into the run"
            },
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
        if slow {
            for r in &routes {
                s.push(Series::new(
                    format!("{n} {r} p99"),
                    stitched(rep, n, r, |x| x.p99_ms),
                ));
                s.push(Series::dashed(
                    format!("{n} {r} p50"),
                    stitched(rep, n, r, |x| x.p50_ms),
                ));
            }
        } else if let Some(t) = representative(rep, n) {
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
        if slow {
            "seconds since the first phase (normal → slow → failing → restored)"
        } else {
            "seconds into the trial"
        },
        "ms",
        &s,
    ));

    // 3. Latency vs throughput (capacity search steps and level trials).
    let mut s = Vec::new();
    for n in &names {
        let ts: Vec<&Trial> = rep
            .trials
            .iter()
            .filter(|t| {
                &t.target == *n
                    && (t.phase == "search" || t.phase.starts_with("level") || t.phase == "hedging")
            })
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

    // Overload: where the excess went, and the recovery.
    if over_time {
        let mut s = Vec::new();
        for n in &names {
            if let Some(t) = representative(rep, n) {
                let secs = &t.load.seconds;
                s.push(Series::new(
                    format!("{n} rejected (503/429)"),
                    secs.iter()
                        .map(|x| (x.t as f64, x.rejected as f64))
                        .collect(),
                ));
                s.push(Series::dashed(
                    format!("{n} timeouts + errors"),
                    secs.iter()
                        .map(|x| {
                            let other = x.completed.saturating_sub(x.ok + x.rejected);
                            (x.t as f64, (x.errors + other) as f64)
                        })
                        .collect(),
                ));
            }
        }
        out.push(line_chart(
            "rejections",
            "Rejections and failures per second",
            "seconds into the run",
            "requests/s",
            &s,
        ));
        let s: Vec<Series> = names
            .iter()
            .filter_map(|n| representative(rep, n).map(|t| (n, t)))
            .map(|(n, t)| {
                Series::new(
                    format!("{n} success %"),
                    t.load
                        .by_send_second
                        .iter()
                        .filter(|x| x.offered > 0)
                        .map(|x| (x.t as f64, x.ok as f64 * 100.0 / x.offered as f64))
                        .collect(),
                )
            })
            .collect();
        out.push(line_chart(
            "success",
            "Success share per second of intended send time (recovery: ≥ 99.9 % after the drop)",
            "seconds into the run",
            "% of offered answered 2xx",
            &s,
        ));
    }
    if rep.trials.iter().any(|t| t.phase == "hedging") {
        let mut s = Vec::new();
        for n in &names {
            let ts: Vec<&Trial> = rep
                .trials
                .iter()
                .filter(|t| &t.target == *n && t.phase == "hedging")
                .collect();
            s.push(Series::new(
                format!("{n} p99"),
                ts.iter().map(|t| (t.t_start, t.p99_ms)).collect(),
            ));
            s.push(Series::dashed(
                format!("{n} p99.9"),
                ts.iter()
                    .map(|t| (t.t_start, t.load.latency_ms.p999))
                    .collect(),
            ));
        }
        out.push(line_chart(
            "hedging",
            "Tail latency per trial (interleaved)",
            "seconds since targets started",
            "ms",
            &s,
        ));
    }

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

fn stat3(s: &Stat) -> String {
    format!(
        "{:.3} <span class=\"mm\">({:.3}–{:.3})</span>",
        s.median, s.min, s.max
    )
}

/// `phase`, plus the route and stage of a slow-backend trial.
fn trial_label(t: &Trial) -> String {
    let mut s = t.phase.clone();
    if let Some(st) = &t.stage {
        s.push_str(&format!(" {st}"));
    }
    if let Some(r) = &t.route {
        s.push_str(&format!(" route {r}"));
    }
    s
}

fn recovery_text(r: &Recovery) -> String {
    match r.time_to_recover_s {
        Some(s) => format!(
            "{s:.0} s after the drop at {:.0} s (≥ 99.9 % success per second from then on)",
            r.drop_at_s
        ),
        None => format!(
            "not recovered: success per second after the drop at {:.0} s: {}",
            r.drop_at_s,
            r.success_by_second
                .iter()
                .map(|x| format!("{:.1} %", x * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The text summary the CLI prints: one line per target, the phases, routes and hedging
/// figures, the acceptance lines and the warnings.
pub fn text_summary(rep: &LabReport) -> String {
    let mut s = String::new();
    for (name, t) in &rep.targets {
        let _ = writeln!(
            s,
            "{name:<16} max_rate {:>8} req/s   CPU {:>7.1} µs/req   p50 {:>6.2} ms   p99 {:>6.2} ms   errors {:.2}%   calls/req {:.2}   threads {}   RSS {:.1} MB{}",
            match (t.max_rate, &t.max_rate_reason) {
                (Some(r), None) => format!("{r:.0}"),
                _ => "-".into(),
            },
            t.cpu_us_per_request,
            t.p50_ms,
            t.p99_ms,
            t.error_rate * 100.0,
            t.backend_calls_per_request,
            t.threads_max,
            t.rss_max_mb,
            if t.generator_valid {
                ""
            } else {
                "   (generator lagged)"
            }
        );
        if let Some(why) = &t.max_rate_reason {
            let _ = writeln!(s, "  max_rate: {why}");
        }
        for p in &t.phases {
            let _ = writeln!(
                s,
                "  {:<11} offered {:>7.0}/s  goodput {:>7.0}/s  accepted p50 {:>7.2} ms p99 {:>7.2} ms  rejected {:>6} (p99 {:.2} ms)  timeouts {:>6}  errors {:>5}  threads {:>4}  RSS {:.0} MB",
                p.name,
                p.offered_rate,
                p.ok_rate,
                p.accepted_p50_ms,
                p.accepted_p99_ms,
                p.rejected,
                p.rejected_p99_ms,
                p.timeouts,
                p.errors,
                p.threads_max,
                p.rss_max_mb
            );
        }
        if let Some(r) = &t.recovery {
            let _ = writeln!(s, "  recovery: {}", recovery_text(r));
        }
        for r in &t.routes {
            for p in &r.phases {
                let _ = writeln!(
                    s,
                    "  route {} {:<9} p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>7.2} ms  ok {:>6.2} %  default {:>5.1} %  within {} ms deadline: {}",
                    r.route,
                    p.name,
                    p.p50_ms,
                    p.p99_ms,
                    p.max_ms,
                    p.success_pct,
                    p.default_share * 100.0,
                    r.deadline_ms,
                    if p.within_deadline { "yes" } else { "NO" }
                );
            }
        }
        if let Some(x) = &t.hedging {
            let _ = writeln!(
                s,
                "  hedging: {} trials, {} requests: p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  calls/request {:.3}",
                x.trials,
                x.requests,
                x.p50_ms,
                x.p99_ms,
                x.p999_ms,
                x.backend_calls_per_request.median
            );
        }
    }
    for a in &rep.acceptance {
        let _ = writeln!(
            s,
            "{}  {:<14} {} — {} (criterion: {})",
            if a.pass { "PASS" } else { "FAIL" },
            a.target,
            a.check,
            a.measured,
            a.criterion
        );
    }
    for w in &rep.warnings {
        let _ = writeln!(s, "WARNING: {w}");
    }
    s
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
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1100px}}table{{border-collapse:collapse;margin:12px 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f0f0f0}}td:first-child,th:first-child{{text-align:left}}.mm{{color:#777;font-size:90%}}tr.pass td:last-child{{background:#d4edda}}tr.fail td:last-child{{background:#f8d7da}}.acceptance td,.acceptance th,td.note{{text-align:left}}.why{{text-align:left;font-size:90%;color:#842029;max-width:320px}}.warn{{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}}figure{{margin:16px 0}}figcaption{{font-weight:600;margin-bottom:4px}}code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>
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
            match (t.max_rate, &t.max_rate_reason) {
                (_, Some(why)) => format!("— <div class=\"why\">{}</div>", esc(why)),
                (Some(r), None) => f(r),
                (None, None) => "—".into(),
            },
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
    if !rep.acceptance.is_empty() {
        h.push_str("<h2>Acceptance</h2><p>The product's acceptance criteria for this scenario, checked on this run (a quick run is indicative only).</p><table class=\"acceptance\"><tr><th>target</th><th>check</th><th>measured</th><th>criterion</th><th>result</th></tr>");
        for a in &rep.acceptance {
            let _ = write!(
                h,
                "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><b>{}</b></td></tr>",
                if a.pass { "pass" } else { "fail" },
                esc(&a.target),
                esc(&a.check),
                esc(&a.measured),
                esc(&a.criterion),
                if a.pass { "PASS" } else { "FAIL" }
            );
        }
        h.push_str("</table>");
    }
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
        h.push_str("<h2>Overload phases</h2><p>Requests are counted in the second they ended; accepted = 2xx; rejected = 503/429; timeouts = no answer within the client's 1 s deadline.</p><table><tr><th>target / phase</th><th>seconds</th><th>offered req/s</th><th>goodput 2xx/s</th><th>accepted p50 ms</th><th>accepted p99 ms</th><th>rejected (/s)</th><th>rejection p99 ms</th><th>timeouts</th><th>errors</th><th>threads max</th><th>RSS max MB</th></tr>");
        for (n, t) in &rep.targets {
            for p in &t.phases {
                let _ = write!(
                    h,
                    "<tr><td>{} {}</td><td>{:.0}–{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(n),
                    esc(&p.name),
                    p.from_s,
                    p.to_s,
                    f(p.offered_rate),
                    f(p.ok_rate),
                    f(p.accepted_p50_ms),
                    f(p.accepted_p99_ms),
                    p.rejected,
                    f(p.rejected_rate),
                    f(p.rejected_p99_ms),
                    p.timeouts,
                    p.errors,
                    p.threads_max,
                    f(p.rss_max_mb)
                );
            }
            if let Some(r) = &t.recovery {
                let _ = write!(
                    h,
                    "<tr><td>{} time to recover</td><td colspan=\"11\" class=\"note\">{}</td></tr>",
                    esc(n),
                    esc(&recovery_text(r))
                );
            }
        }
        h.push_str("</table>");
    }
    if rep.targets.values().any(|t| !t.routes.is_empty()) {
        h.push_str("<h2>Routes per phase</h2><table><tr><th>target / route / phase</th><th>offered req/s</th><th>p50 ms</th><th>p99 ms</th><th>max ms</th><th>success</th><th>answers with the default</th><th>within deadline</th><th>calls / request (all routes)</th></tr>");
        for (n, t) in &rep.targets {
            for r in &t.routes {
                for p in &r.phases {
                    let _ = write!(
                        h,
                        "<tr><td>{} {} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2} %</td><td>{:.1} %</td><td>{}</td><td>{}</td></tr>",
                        esc(n),
                        esc(&r.route),
                        esc(&p.name),
                        f(p.offered_rate),
                        f(p.p50_ms),
                        f(p.p99_ms),
                        f(p.max_ms),
                        p.success_pct,
                        p.default_share * 100.0,
                        if p.within_deadline {
                            format!("yes (≤ {} ms)", f(r.deadline_ms))
                        } else {
                            format!("<b>no</b> (deadline {} ms)", f(r.deadline_ms))
                        },
                        f(p.backend_calls_per_request)
                    );
                }
            }
        }
        h.push_str("</table><ul>");
        if let Some(t) = rep.targets.values().next() {
            for r in &t.routes {
                let _ = write!(h, "<li>route {}: {}</li>", esc(&r.route), esc(&r.about));
            }
        }
        h.push_str("</ul>");
    }
    if rep.targets.values().any(|t| t.hedging.is_some()) {
        h.push_str("<h2>Hedging (all trials merged)</h2><table><tr><th>target</th><th>trials</th><th>requests</th><th>p50 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>p99 per trial</th><th>backend calls / request</th></tr>");
        for (n, t) in &rep.targets {
            if let Some(x) = &t.hedging {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(n),
                    x.trials,
                    x.requests,
                    f(x.p50_ms),
                    f(x.p99_ms),
                    f(x.p999_ms),
                    stat(&x.p99_ms_per_trial),
                    stat3(&x.backend_calls_per_request)
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
            "<tr><td>{i}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&t.target),
            esc(&trial_label(t)),
            t.round,
            f(t.offered_rate),
            f(t.achieved_rate),
            f(t.p50_ms),
            f(t.p99_ms),
            f(t.cpu_us_per_request),
            f(t.generator_cpu_us_per_request),
            f(t.backend_calls_per_request),
            f(t.ctx_switches_per_request),
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

    /// A recorded trial of `target` (LoadReport with the figures the summary reads).
    fn trial(target: &str, phase: &str, rate: f64, p99_ms: f64, lag_p99_ms: f64) -> Trial {
        let limit_ms = LAG_THRESHOLD.as_secs_f64() * 1000.0;
        let valid = lag_p99_ms <= limit_ms;
        let invalid_reason = (!valid).then(|| {
            format!(
                "generator lagged behind schedule: lag p99 {lag_p99_ms:.2} ms > {limit_ms:.2} ms"
            )
        });
        let stats = fanout_load::LatencyStats {
            p50: p99_ms / 2.0,
            p99: p99_ms,
            ..Default::default()
        };
        let load = fanout_load::LoadReport {
            target: "http://127.0.0.1:9".into(),
            protocol: fanout_load::Protocol::Http1,
            schedule: format!("const({rate},1000ms)"),
            duration_s: 1.0,
            elapsed_s: 1.0,
            offered: rate as u64,
            sent: rate as u64,
            completed: rate as u64,
            ok: rate as u64,
            rejected: 0,
            partial: 0,
            offered_rps: rate,
            achieved_rps: rate,
            status_classes: Default::default(),
            errors: Default::default(),
            error_rate: 0.0,
            latency_ms: stats,
            ok_latency_ms: stats,
            rejected_latency_ms: Default::default(),
            service_ms: stats,
            lag_ms: Default::default(),
            late_fraction: 0.0,
            valid,
            invalid_reason: invalid_reason.clone(),
            connections_opened: 1,
            max_connections_used: 1,
            bytes_received: 0,
            seconds: vec![],
            by_send_second: vec![],
            second_histograms: vec![],
            latency_hist: fanout_load::empty_histogram(),
            service_hist: fanout_load::empty_histogram(),
            lag_hist: fanout_load::empty_histogram(),
        };
        Trial {
            target: target.into(),
            phase: phase.into(),
            round: 0,
            t_start: 0.0,
            schedule: load.schedule.clone(),
            offered_rate: rate,
            achieved_rate: rate,
            p50_ms: stats.p50,
            p99_ms,
            error_rate: 0.0,
            cpu_us_per_request: 100.0,
            generator_cpu_us_per_request: 10.0,
            backend_calls_per_request: 8.0,
            stub_overshoot_p99_us: None,
            ctx_switches_per_request: 1.0,
            threads: 4,
            rss_mb: 10.0,
            valid,
            invalid_reason,
            passed_slo: valid && p99_ms <= 50.0,
            lag_p99_ms,
            route: None,
            stage: None,
            phase_bounds: vec![],
            samples: vec![],
            load,
        }
    }

    fn report(targets: &[&str], caps: &[(&str, f64)], trials: Vec<Trial>) -> LabReport {
        let Some(scenario) = crate::scenario::builtin("product-page") else {
            panic!("the product-page scenario exists");
        };
        let opts = LabOptions {
            scenario: "product-page".into(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
            quick: true,
            out: std::env::temp_dir(),
            trials: None,
            fanout_bin: "fanout".into(),
            baseline_bin: None,
            command: "fanout lab product-page --quick".into(),
        };
        let caps = caps.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        build(
            &opts,
            &scenario,
            None,
            caps,
            trials,
            BTreeMap::new(),
            vec![],
        )
    }

    #[test]
    fn an_all_flagged_row_says_why_it_has_no_max_rate() {
        // fanout: every trial (search steps and levels) flagged; hyper-baseline: a real capacity.
        let mut trials = vec![
            trial("fanout", "search", 250.0, 12.0, 3.2),
            trial("fanout", "search", 250.0, 12.0, 4.1),
            trial("fanout", "search", 125.0, 11.0, 2.6),
        ];
        for round in 0..3 {
            let mut t = trial("fanout", "level-50", 50.0, 10.0, 3.0);
            t.round = round;
            trials.push(t);
            trials.push(trial("hyper-baseline", "level-50", 50.0, 9.0, 0.2));
        }
        trials.push(trial("hyper-baseline", "search", 250.0, 9.0, 0.3));
        let rep = report(
            &["fanout", "hyper-baseline"],
            &[("fanout", 0.0), ("hyper-baseline", 250.0)],
            trials,
        );
        let why = rep.targets["fanout"]
            .max_rate_reason
            .clone()
            .unwrap_or_default();
        assert_eq!(
            why,
            "no valid trial: all 6 flagged — generator behind schedule (lag p99 2.6–4.1 ms > 2 ms)"
        );
        assert_eq!(rep.targets["hyper-baseline"].max_rate_reason, None);

        let text = text_summary(&rep);
        assert!(text.contains(&format!("  max_rate: {why}")), "{text}");
        let fanout_line = text
            .lines()
            .find(|l| l.starts_with("fanout "))
            .unwrap_or_default();
        assert!(
            fanout_line.contains("max_rate        - req/s"),
            "no bare 0: {fanout_line}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("hyper-baseline") && l.contains("max_rate      250 req/s")),
            "{text}"
        );

        let json = serde_json::to_value(&rep).unwrap_or_default();
        assert_eq!(json["targets"]["fanout"]["max_rate_reason"], why.as_str());
        assert_eq!(json["targets"]["fanout"]["max_rate"], 0.0);
        assert!(json["targets"]["hyper-baseline"]["max_rate_reason"].is_null());

        let page = html(&rep, "{}");
        assert!(page.contains(&esc(&why)), "the summary row says why");
        assert!(
            !page.contains("<td>fanout</td><td>0.00</td>"),
            "no bare 0.00 in the summary row"
        );
    }

    #[test]
    fn a_zero_max_rate_names_its_cause() {
        // Only the search steps flagged (the levels at a low rate were fine).
        let mut trials = vec![
            trial("fanout", "search", 250.0, 12.0, 4.1),
            trial("fanout", "search", 250.0, 12.0, 4.1),
        ];
        trials.push(trial("fanout", "level-50", 50.0, 10.0, 0.1));
        let rep = report(&["fanout"], &[("fanout", 0.0)], trials);
        assert_eq!(
            rep.targets["fanout"].max_rate_reason.as_deref(),
            Some(
                "no valid capacity-search step: all 2 flagged — generator behind schedule (lag p99 4.1 ms > 2 ms)"
            )
        );
        // A valid step that missed the SLO: a finding, with its figures.
        let trials = vec![
            trial("fanout", "search", 250.0, 80.0, 0.1),
            trial("fanout", "search", 125.0, 60.0, 3.5),
        ];
        let rep = report(&["fanout"], &[("fanout", 0.0)], trials);
        let why = rep.targets["fanout"]
            .max_rate_reason
            .clone()
            .unwrap_or_default();
        assert!(
            why.starts_with("no capacity-search step met the SLO"),
            "{why}"
        );
        assert!(why.contains("at 250 req/s: p99 80.0 ms > 50 ms"), "{why}");
        assert!(why.contains("1 of 2 steps flagged"), "{why}");
        // A measured capacity needs no reason.
        let rep = report(
            &["fanout"],
            &[("fanout", 250.0)],
            vec![trial("fanout", "search", 250.0, 10.0, 0.1)],
        );
        assert_eq!(rep.targets["fanout"].max_rate_reason, None);
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
