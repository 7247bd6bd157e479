//! The HTML report's SVG charts, one function per chart.

use super::LabReport;
use crate::model::Trial;
use crate::procstat::ProcSample;
use crate::svg::{Series, line_chart};

/// Every chart of the report, in page order.
pub(super) fn charts(rep: &LabReport) -> Vec<String> {
    if rep.closed_loop.is_some() {
        return closed_loop_charts(rep);
    }
    let c = Charts::new(rep);
    let mut out = vec![c.rate(), c.latency_over_time(), c.latency_vs_throughput()];
    if c.over_time {
        out.push(c.rejections());
        out.push(c.success());
    }
    if rep.trials.iter().any(|t| t.phase == "hedging") {
        out.push(c.hedging());
    }
    out.push(c.cpu_per_request());
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
    out.push(c.lag());
    out
}

/// What the charts of one report are drawn from.
struct Charts<'a> {
    rep: &'a LabReport,
    /// Target names.
    names: Vec<&'a String>,
    /// Whether an overload run is in the report (per-second series of one continuous run).
    over_time: bool,
    /// Whether slow-backend runs are in the report (per-route series, stitched over phases).
    slow: bool,
    /// Route names of a slow-backend run.
    routes: Vec<String>,
}

impl<'a> Charts<'a> {
    fn new(rep: &'a LabReport) -> Charts<'a> {
        Charts {
            rep,
            names: rep.targets.keys().collect(),
            over_time: rep.trials.iter().any(|t| t.phase == "overload"),
            slow: rep.trials.iter().any(|t| t.phase == "slow-backend"),
            routes: rep
                .targets
                .values()
                .flat_map(|t| t.routes.iter().map(|r| r.route.clone()))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        }
    }

    /// 1. Achieved vs offered rate: over time (overload, slow-backend) or per trial.
    fn rate(&self) -> String {
        let rep = self.rep;
        let mut s = self.rate_series();
        if self.over_time || self.slow {
            line_chart(
                "rate",
                "Achieved vs offered rate",
                if self.slow {
                    "seconds since the first phase (normal → slow → failing → restored)"
                } else {
                    "seconds into the run"
                },
                "requests/s",
                &s,
            )
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
            line_chart(
                "rate",
                "Achieved vs offered rate (every trial)",
                "offered requests/s",
                "achieved 2xx/s",
                &s,
            )
        }
    }

    /// The series of the rate chart, per target (and route).
    fn rate_series(&self) -> Vec<Series> {
        let rep = self.rep;
        let mut s = Vec::new();
        for n in &self.names {
            if self.slow {
                for r in &self.routes {
                    s.push(Series::dashed(
                        format!("{n} {r} offered"),
                        stitched(rep, n, r, |x| x.offered as f64),
                    ));
                    s.push(Series::new(
                        format!("{n} {r} 2xx"),
                        stitched(rep, n, r, |x| x.ok as f64),
                    ));
                }
            } else if self.over_time {
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
        s
    }

    /// 2. Latency percentiles over time.
    fn latency_over_time(&self) -> String {
        let rep = self.rep;
        let mut s = Vec::new();
        for n in &self.names {
            if self.slow {
                for r in &self.routes {
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
        line_chart(
            "latency-time",
            "Latency percentiles over time (per second, from intended send time)",
            if self.slow {
                "seconds since the first phase (normal → slow → failing → restored)"
            } else {
                "seconds into the trial"
            },
            "ms",
            &s,
        )
    }

    /// 3. Latency vs throughput (capacity search steps and level trials).
    fn latency_vs_throughput(&self) -> String {
        let rep = self.rep;
        let mut s = Vec::new();
        for n in &self.names {
            let ts: Vec<&Trial> = rep
                .trials
                .iter()
                .filter(|t| {
                    &t.target == *n
                        && (t.phase == "search"
                            || t.phase.starts_with("level")
                            || t.phase == "hedging")
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
        line_chart(
            "latency-throughput",
            "Latency vs throughput",
            "achieved 2xx/s",
            "ms",
            &s,
        )
    }

    /// Overload: where the excess went.
    fn rejections(&self) -> String {
        let rep = self.rep;
        let mut s = Vec::new();
        for n in &self.names {
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
        line_chart(
            "rejections",
            "Rejections and failures per second",
            "seconds into the run",
            "requests/s",
            &s,
        )
    }

    /// Overload: success per second of intended send time, and so the recovery.
    fn success(&self) -> String {
        let rep = self.rep;
        let s: Vec<Series> = self
            .names
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
        line_chart(
            "success",
            "Success share per second of intended send time (recovery: ≥ 99.9 % after the drop)",
            "seconds into the run",
            "% of offered answered 2xx",
            &s,
        )
    }

    /// Hedging: tail latency per interleaved trial.
    fn hedging(&self) -> String {
        let rep = self.rep;
        let mut s = Vec::new();
        for n in &self.names {
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
        line_chart(
            "hedging",
            "Tail latency per trial (interleaved)",
            "seconds since targets started",
            "ms",
            &s,
        )
    }

    /// 4. CPU-µs per request vs load.
    fn cpu_per_request(&self) -> String {
        let rep = self.rep;
        let s: Vec<Series> = self
            .names
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
        line_chart(
            "cpu-per-request",
            "CPU-µs per request vs load (target process, user+sys)",
            "offered requests/s",
            "CPU-µs per request",
            &s,
        )
    }

    /// 6. Generator lag per trial.
    fn lag(&self) -> String {
        let rep = self.rep;
        let s: Vec<Series> = self
            .names
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
        line_chart(
            "lag",
            "Generator lag p99 per trial (actual send − intended send)",
            "seconds since targets started",
            "ms",
            &s,
        )
    }
}

/// A closed-loop run's charts: ms and CPU per operation against the number of clients (one line
/// per target and route), threads and RSS over the run.
fn closed_loop_charts(rep: &LabReport) -> Vec<String> {
    let per_clients = |f: fn(&super::ClosedCell) -> f64| -> Vec<Series> {
        let mut s = Vec::new();
        for (n, t) in &rep.targets {
            let mut routes: Vec<&str> = Vec::new();
            for c in &t.cells {
                if !routes.contains(&c.route.as_str()) {
                    routes.push(&c.route);
                }
            }
            for r in routes {
                let pts = sorted(
                    t.cells
                        .iter()
                        .filter(|c| c.route == r)
                        .map(|c| (c.clients as f64, f(c)))
                        .collect(),
                );
                let name = format!("{n} {r}");
                s.push(if r == "sequential" {
                    Series::dashed(name, pts)
                } else {
                    Series::new(name, pts)
                });
            }
        }
        s
    };
    vec![
        line_chart(
            "closed-mean",
            "Mean ms per operation vs closed-loop clients (dashed: sequential)",
            "clients",
            "ms per operation",
            &per_clients(|c| c.mean_ms),
        ),
        line_chart(
            "closed-cpu",
            "Target CPU ms per operation vs clients (dashed: sequential)",
            "clients",
            "CPU ms per operation",
            &per_clients(|c| c.cpu_ms_per_op.median),
        ),
        timeline_chart(rep, "threads", "Threads over time", "threads", |x| {
            x.threads as f64
        }),
        timeline_chart(rep, "rss", "RSS over time", "MB", |x| {
            x.rss_bytes as f64 / 1e6
        }),
    ]
}

/// 5. One line per target of a `/proc` figure over the run (threads, RSS).
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

/// Points sorted by x.
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
