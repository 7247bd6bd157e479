//! The text summary the CLI prints after a lab run.

use super::format::recovery_text;
use super::{LabReport, Phase, RouteSummary, TargetSummary};
use std::fmt::Write;

/// The text summary the CLI prints: one line per target, the phases, routes and hedging
/// figures, the acceptance lines and the warnings.
pub fn text_summary(rep: &LabReport) -> String {
    let mut s = String::new();
    if rep.closed_loop.is_some() {
        closed_loop_lines(&mut s, rep);
    }
    if let Some(m) = &rep.models {
        s.push_str(&super::models::text(m));
    }
    if let Some(p) = &rep.pools {
        s.push_str(&super::pools::text(p));
    }
    let own_lines = rep.closed_loop.is_none() && rep.models.is_none() && rep.pools.is_none();
    for (name, t) in rep.targets.iter().filter(|_| own_lines) {
        target_line(&mut s, name, t);
        if let Some(why) = &t.max_rate_reason {
            let _ = writeln!(s, "  max_rate: {why}");
        }
        for p in &t.phases {
            phase_line(&mut s, p);
        }
        if let Some(r) = &t.recovery {
            let _ = writeln!(s, "  recovery: {}", recovery_text(r));
        }
        for r in &t.routes {
            route_lines(&mut s, r);
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
    relative_lines(&mut s, &rep.relative);
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

/// A closed-loop run: the floor, one line per target and cell, the article's rows.
fn closed_loop_lines(s: &mut String, rep: &LabReport) {
    let Some(cl) = &rep.closed_loop else { return };
    if let Some(fl) = &cl.floor {
        let _ = writeln!(
            s,
            "floor (the lab calling {} itself): one call {:.2} ms mean (p99 {:.2}) → sequential {:.1} ms, parallel {:.2} ms",
            fl.path, fl.one_call_mean_ms, fl.one_call_p99_ms, fl.sequential_ms, fl.parallel_ms
        );
    }
    for (name, t) in &rep.targets {
        for c in &t.cells {
            let _ = writeln!(
                s,
                "{name:<14} {:<10} ×{:<2} ops {:>6}  {:>7.1}/s  mean {:>8.2} ± {:<7} ms  p50 {:>8.2}  p99 {:>8.2} ms  errors {}  calls/op {:.2}  CPU {:>6.2} ms/op  threads {:>4}  RSS {:.0} MB",
                c.route,
                c.clients,
                c.ops,
                c.ops_per_s,
                c.mean_ms,
                c.error_ms
                    .map_or_else(|| "n/a".into(), |e| format!("{e:.2}")),
                c.p50_ms,
                c.p99_ms,
                c.errors,
                c.stub_calls_per_op,
                c.cpu_ms_per_op.median,
                c.threads_max,
                c.rss_max_mb
            );
        }
    }
    for (t, v) in &cl.jvm {
        let _ = writeln!(s, "{t}: Java {v}");
    }
    let clients: std::collections::BTreeSet<usize> = cl.runs.iter().map(|r| r.clients).collect();
    for c in clients {
        if let Some((a, same)) = crate::model::article_row(rep.cpus, c) {
            let _ = writeln!(
                s,
                "article, {} cores{} / {} JMH thread(s): sequential sync {} ± {}, async {} ± {}; parallel sync {} ± {}, async {} ± {} ms",
                a.cores,
                if same { "" } else { " (not this machine's)" },
                a.clients,
                a.sequential_sync.0,
                a.sequential_sync.1,
                a.sequential_async.0,
                a.sequential_async.1,
                a.parallel_sync.0,
                a.parallel_sync.1,
                a.parallel_async.0,
                a.parallel_async.1
            );
        }
    }
}

/// Each target's CPU per request beside the baseline's, per level: the median per-round ratio
/// with its range, and the ratio of the medians.
fn relative_lines(s: &mut String, rel: &[super::Relative]) {
    let Some(first) = rel.first() else { return };
    let _ = writeln!(
        s,
        "CPU per request beside {} (per round: median of each round's ratio, its range; then the ratio of the medians):",
        first.baseline
    );
    let mut names: Vec<&str> = Vec::new();
    for r in rel {
        if !names.contains(&r.target.as_str()) {
            names.push(&r.target);
        }
    }
    for name in names {
        let levels: Vec<String> = rel
            .iter()
            .filter(|r| r.target == name)
            .map(|r| format!("{} {}", r.level, relative_text(r)))
            .collect();
        let _ = writeln!(s, "  {name:<16} {}", levels.join("   "));
    }
}

/// `1.00× (0.91–1.22, 5 rounds; of medians 1.08×)`.
pub(crate) fn relative_text(r: &super::Relative) -> String {
    let of_medians = r
        .ratio_of_medians
        .map_or_else(|| "-".to_string(), |x| format!("{x:.2}×"));
    if r.per_round.n == 0 {
        return format!("- (no round with both; of medians {of_medians})");
    }
    format!(
        "{:.2}× ({:.2}–{:.2}, {} round{}; of medians {of_medians})",
        r.per_round.median,
        r.per_round.min,
        r.per_round.max,
        r.per_round.n,
        if r.per_round.n == 1 { "" } else { "s" }
    )
}

/// A target's headline figures on one line.
fn target_line(s: &mut String, name: &str, t: &TargetSummary) {
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
}

/// One phase of an overload run.
fn phase_line(s: &mut String, p: &Phase) {
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

/// One line per phase of a slow-backend route.
fn route_lines(s: &mut String, r: &RouteSummary) {
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
