//! The self-contained HTML report: tables per section, the charts (`charts.rs`) and the JSON
//! report embedded for tools.

use super::charts::charts;
use super::format::{f, recovery_text};
use super::{ClosedCell, ClosedLoopReport, LabReport, Stat};
use crate::model::{Trial, article_row};
use crate::svg::esc;
use std::fmt::Write;

/// Render the HTML report.
pub fn html(rep: &LabReport, json: &str) -> String {
    let mut h = String::new();
    head(&mut h, rep);
    if rep.closed_loop.is_some() {
        closed_loop_tables(&mut h, rep);
    } else if let Some(p) = &rep.pools {
        super::pools::html(&mut h, p);
    } else {
        summary_table(&mut h, rep);
    }
    acceptance_table(&mut h, rep);
    models_tables(&mut h, rep);
    direct_line(&mut h, rep);
    levels_table(&mut h, rep);
    relative_table(&mut h, rep);
    phases_table(&mut h, rep);
    routes_table(&mut h, rep);
    hedging_table(&mut h, rep);
    h.push_str("<h2>Charts</h2>");
    for c in charts(rep) {
        h.push_str(&c);
    }
    trials_table(&mut h, rep);
    let _ = write!(
        h,
        r#"<script type="application/json" id="report-data">{}</script></body></html>"#,
        json.replace("</", "<\\/")
    );
    h
}

/// The page head, the title block and the warnings.
fn head(h: &mut String, rep: &LabReport) {
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fanout lab: {s}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1100px}}table{{border-collapse:collapse;margin:12px 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f0f0f0}}td:first-child,th:first-child{{text-align:left}}.mm{{color:#777;font-size:90%}}tr.pass td:last-child{{background:#d4edda}}tr.fail td:last-child{{background:#f8d7da}}.acceptance td,.acceptance th,td.note{{text-align:left}}.why{{text-align:left;font-size:90%;color:#842029;max-width:320px}}.warn{{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}}figure{{margin:16px 0}}figcaption{{font-weight:600;margin-bottom:4px}}code{{background:#f4f4f4;padding:1px 4px}}table.small{{font-size:85%}}</style></head><body>
<h1>fanout lab — {s}</h1><p>{about}</p><p>Command: <code>{cmd}</code> · {cpus} CPUs · {quick}{slo}</p>"#,
        s = esc(&rep.scenario),
        about = esc(&rep.about),
        cmd = esc(&rep.command),
        cpus = rep.cpus,
        quick = if rep.quick {
            "quick run (reduced; figures are indicative)"
        } else {
            "full run"
        },
        // A closed-loop run has no capacity search.
        slo = if rep.closed_loop.is_some() {
            String::new()
        } else {
            format!(
                " · capacity SLO: p99 ≤ {} ms, errors ≤ 1 %, achieved ≥ 95 % of offered",
                rep.slo_p99_ms
            )
        }
    );
    for w in &rep.warnings {
        let _ = write!(h, r#"<div class="warn">⚠ {}</div>"#, esc(w));
    }
}

/// One row per target: the headline figures, or why there is no capacity.
fn summary_table(h: &mut String, rep: &LabReport) {
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
            match (t.added_p50_ms, &rep.direct) {
                (Some(a), _) => f(a),
                (None, Some(d)) if t.backend_calls_per_request + 0.05 < d.path.len() as f64 =>
                    "— <div class=\"why\">shared calls between requests: not the same work as the direct path</div>".into(),
                (None, _) => "—".into(),
            },
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
}

/// The acceptance lines, if the scenario has any.
fn acceptance_table(h: &mut String, rep: &LabReport) {
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
}

/// The direct critical-path latency, if it was measured.
fn direct_line(h: &mut String, rep: &LabReport) {
    if let Some(d) = &rep.direct {
        let _ = write!(
            h,
            "<p>Direct critical path ({}): p50 {} ms, p99 {} ms — the floor any orchestrator adds to.</p>",
            esc(&d.path.join(" → ")),
            f(d.p50_ms),
            f(d.p99_ms)
        );
    }
}

/// Medians (min–max) per target and load level.
fn levels_table(h: &mut String, rep: &LabReport) {
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
}

/// Each target's CPU per request beside the hand-written baseline's, per level.
fn relative_table(h: &mut String, rep: &LabReport) {
    let Some(first) = rep.relative.first() else {
        return;
    };
    let _ = write!(
        h,
        "<h2>CPU per request beside {}</h2><p>Per round: each round's trial of the target ÷ the baseline's trial of the same round (minutes apart, so the machine's drift between rounds falls on both sides), the median and range over the rounds. Of medians: the target's median over its trials ÷ the baseline's.</p><table><tr><th>target / level</th><th>per round (min–max)</th><th>rounds</th><th>of medians</th></tr>",
        esc(&first.baseline)
    );
    for r in &rep.relative {
        let _ = write!(
            h,
            "<tr><td>{} {}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.target),
            esc(&r.level),
            if r.per_round.n == 0 {
                "-".to_string()
            } else {
                stat3(&r.per_round)
            },
            r.per_round.n,
            r.ratio_of_medians
                .map_or_else(|| "-".to_string(), |x| format!("{x:.3}"))
        );
    }
    h.push_str("</table>");
}

/// Per target and phase of an overload run, and its recovery.
fn phases_table(h: &mut String, rep: &LabReport) {
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
}

/// Per target, route and phase of a slow-backend run.
fn routes_table(h: &mut String, rep: &LabReport) {
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
}

/// Merged latency of the hedging trials per target.
fn hedging_table(h: &mut String, rep: &LabReport) {
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
}

/// `mean ± error` of a closed-loop cell, ms.
fn mean_err(c: &ClosedCell) -> String {
    match c.error_ms {
        Some(e) => format!("{} ± {}", f(c.mean_ms), f(e)),
        None => format!("{} <span class=\"mm\">(± n/a)</span>", f(c.mean_ms)),
    }
}

/// The closed-loop run: the article-shaped table, the article's own rows, every cell in detail,
/// the floor, the runtimes and every round.
fn closed_loop_tables(h: &mut String, rep: &LabReport) {
    let Some(cl) = &rep.closed_loop else { return };
    let names: Vec<&String> = rep.targets.keys().collect();
    // Routes and client counts in the order run.
    let mut routes: Vec<&str> = Vec::new();
    let mut clients: Vec<usize> = Vec::new();
    for r in &cl.runs {
        if !routes.contains(&r.route.as_str()) {
            routes.push(&r.route);
        }
        if !clients.contains(&r.clients) {
            clients.push(r.clients);
        }
    }
    let cell = |t: &str, route: &str, c: usize| {
        rep.targets
            .get(t)
            .and_then(|s| s.cells.iter().find(|x| x.route == route && x.clients == c))
    };
    let _ = write!(
        h,
        "<h2>Closed loop: ms per operation</h2><p>Each operation makes {calls} stub calls: <code>sequential</code> one after the other, <code>parallel</code> all at once. C clients, each on its own keep-alive HTTP/1.1 connection, send their next request as soon as the previous answer arrived (the article's JMH threads). Per cell: {w} s warm-up, {m} s measured, {r} round(s), targets interleaved (A B, B A, …). {err}.</p>",
        calls = cl.calls_per_op,
        w = f(cl.warmup_s),
        m = f(cl.measure_s),
        r = cl.rounds,
        err = esc(&cl.error_method)
    );
    if let Some(fl) = &cl.floor {
        let _ = write!(
            h,
            "<p>Stub-call floor, measured by the lab (one call at a time on one connection, {n} calls to <code>{p}</code>): one call {mean} ms mean (p50 {p50}, p99 {p99}) → <b>sequential floor {seq} ms</b> ({calls} × the mean), <b>parallel floor {par} ms</b> (one call).</p>",
            n = fl.calls,
            p = esc(&fl.path),
            mean = f(fl.one_call_mean_ms),
            p50 = f(fl.one_call_p50_ms),
            p99 = f(fl.one_call_p99_ms),
            seq = f(fl.sequential_ms),
            calls = cl.calls_per_op,
            par = f(fl.parallel_ms)
        );
    }
    // Ours, shaped like the article's table.
    h.push_str("<table class=\"closed\"><tr><th></th>");
    for route in &routes {
        for (i, n) in names.iter().enumerate() {
            let _ = write!(
                h,
                "<th>{}{}</th>",
                if i == 0 {
                    format!("{}: ", esc(route))
                } else {
                    String::new()
                },
                esc(n)
            );
        }
    }
    h.push_str("</tr>");
    for c in &clients {
        let _ = write!(
            h,
            "<tr><td>this machine: {} cores / {} client{}</td>",
            rep.cpus,
            c,
            if *c == 1 { "" } else { "s" }
        );
        for route in &routes {
            for n in &names {
                let _ = write!(
                    h,
                    "<td>{}</td>",
                    cell(n, route, *c).map_or_else(|| "—".to_string(), mean_err)
                );
            }
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    article_rows(h, rep, &clients);
    // Every cell in detail.
    h.push_str("<h3>Every cell (all rounds)</h3><table class=\"small\"><tr><th>route / clients / target</th><th>operations</th><th>ops/s</th><th>mean ms ± error</th><th>iterations</th><th>p50 ms</th><th>p99 ms</th><th>errors</th><th>stub calls / op</th><th>CPU ms / op (target)</th><th>CPU ms / op (stub)</th><th>CPU ms / op (clients)</th><th>machine busy (others)</th><th>threads max</th><th>RSS max MB</th></tr>");
    for route in &routes {
        for c in &clients {
            for n in &names {
                let Some(x) = cell(n, route, *c) else {
                    continue;
                };
                let _ = write!(
                    h,
                    "<tr><td>{} × {} — {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(route),
                    c,
                    esc(n),
                    x.ops,
                    f(x.ops_per_s),
                    mean_err(x),
                    x.iterations,
                    f(x.p50_ms),
                    f(x.p99_ms),
                    if x.errors == 0 {
                        "0".to_string()
                    } else {
                        format!("<b>{}</b>", x.errors)
                    },
                    f(x.stub_calls_per_op),
                    stat(&x.cpu_ms_per_op),
                    x.stub_cpu_ms_per_op.map_or_else(|| "—".into(), f),
                    f(x.lab_cpu_ms_per_op),
                    match (x.machine_busy_pct, x.others_busy_pct) {
                        (Some(b), Some(o)) => format!("{b:.0} % ({o:.0} %)"),
                        _ => "—".into(),
                    },
                    x.threads_max,
                    f(x.rss_max_mb)
                );
            }
        }
    }
    h.push_str("</table>");
    if !cl.jvm.is_empty() || !cl.not_run.is_empty() {
        h.push_str("<ul>");
        for (t, v) in &cl.jvm {
            let _ = write!(h, "<li>{}: Java {}</li>", esc(t), esc(v));
        }
        for (t, why) in &cl.not_run {
            let _ = write!(h, "<li><b>{}: not run</b> — {}</li>", esc(t), esc(why));
        }
        h.push_str("</ul>");
    }
    closed_rounds_table(h, cl);
}

/// The article's rows (seed 002) beside ours, one per client count run.
fn article_rows(h: &mut String, rep: &LabReport, clients: &[usize]) {
    // The article's rows beside ours.
    h.push_str("<p>The article (seed 002, JMH, avg ms per operation ± its error; sync = blocking calls — parallel ones on a pool sized by the CPU count; async = Kotlin coroutines):</p><table class=\"closed\"><tr><th></th><th>sequential: sync</th><th>async</th><th>parallel: sync</th><th>async</th></tr>");
    let mut differ = false;
    for c in clients {
        if let Some((a, same)) = article_row(rep.cpus, *c) {
            differ |= !same;
            // As published: one decimal.
            let pm = |v: (f64, f64)| format!("{:.1} ± {:.1}", v.0, v.1);
            let _ = write!(
                h,
                "<tr><td>article: {} core{} / {} JMH thread{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                a.cores,
                if a.cores == 1 { "" } else { "s" },
                a.clients,
                if a.clients == 1 { "" } else { "s" },
                pm(a.sequential_sync),
                pm(a.sequential_async),
                pm(a.parallel_sync),
                pm(a.parallel_async)
            );
        }
    }
    h.push_str("</table>");
    if differ {
        let _ = write!(
            h,
            "<p class=\"warn\">The cores differ: this machine has {} CPUs, the article has no such row; its 2-core rows are shown.</p>",
            rep.cpus
        );
    }
}

/// Every round of every closed-loop cell.
fn closed_rounds_table(h: &mut String, cl: &ClosedLoopReport) {
    h.push_str("<h3>Every round</h3><table><tr><th>#</th><th>target</th><th>route</th><th>clients</th><th>round</th><th>ops</th><th>mean ms</th><th>p50 ms</th><th>p99 ms</th><th>errors</th><th>stub calls / op</th><th>CPU ms / op</th><th>threads</th><th>RSS MB</th></tr>");
    for (i, r) in cl.runs.iter().enumerate() {
        let _ = write!(
            h,
            "<tr><td>{i}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.target),
            esc(&r.route),
            r.clients,
            r.round,
            r.ops,
            f(r.mean_ms),
            f(r.p50_ms),
            f(r.p99_ms),
            r.errors,
            f(r.stub_calls_per_op),
            f(r.cpu_ms_per_op),
            r.threads_max,
            f(r.rss_max_mb)
        );
    }
    h.push_str("</table>");
}

/// Every trial, in the order run.
fn trials_table(h: &mut String, rep: &LabReport) {
    if rep.trials.is_empty() && rep.closed_loop.is_some() {
        return;
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
}

/// A models run (`antispam-models`): the swaps, per target its levels side by side, threads,
/// RSS and failures around swaps, and each model's figures at the end.
fn models_tables(h: &mut String, rep: &LabReport) {
    let Some(m) = &rep.models else { return };
    let _ = write!(
        h,
        "<h2>Models</h2><p><code>{}</code> replaced every {} s ({} swaps: {}); {} client connections opened before every trial; {}.</p>",
        esc(&m.swap_model),
        f(m.swap_every_s),
        m.swaps_at_s.len(),
        esc(&m.swap_files.join(" ↔ ")),
        m.connections,
        m.long_run_s.map_or_else(
            || "interleaved levels".to_string(),
            |s| format!("one long run of {} s per target", f(s))
        )
    );
    h.push_str("<table><tr><th>target / level</th><th>offered req/s</th><th>ok req/s</th><th>requests per CPU-second</th><th>CPU-µs / request</th><th>p50 ms</th><th>p99 ms</th><th>failed</th><th>threads</th><th>RSS MB</th><th>generator lag p99 ms</th></tr>");
    for (name, t) in &m.targets {
        for l in t.levels.iter().chain(t.long_run.iter()) {
            let _ = write!(
                h,
                "<tr><td>{} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td></tr>",
                esc(name),
                esc(&l.name),
                f(l.offered_rate),
                stat(&l.achieved_rate),
                stat(&l.requests_per_cpu_s),
                stat(&l.cpu_us_per_request),
                stat(&l.p50_ms),
                stat(&l.p99_ms),
                l.failed,
                l.threads_max,
                f(l.rss_max_mb),
                f(l.lag_p99_ms_max),
                if l.all_valid { "" } else { " (behind)" }
            );
        }
    }
    h.push_str("</table><table><tr><th>target</th><th>max rate (p99 &lt; SLO)</th><th>failed / requests</th><th>failed during swaps</th><th>threads steady (whole run)</th><th>RSS after warm-up → end</th><th>connections</th></tr>");
    for (name, t) in &m.targets {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{} / {}</td><td>{} / {}</td><td>{}–{} ({}–{})</td><td>{} → {} MB ({:+.1} %)</td><td>{}</td></tr>",
            esc(name),
            t.max_rate
                .map_or_else(|| "n/a".to_string(), |r| format!("{} req/s", f(r))),
            t.failed,
            t.requests,
            t.failed_in_swap_windows,
            t.requests_in_swap_windows,
            t.threads_steady_min,
            t.threads_steady_max,
            t.threads_min,
            t.threads_max,
            f(t.rss_after_warmup_mb),
            f(t.rss_end_mb),
            t.rss_growth_pct,
            t.connections_used
        );
    }
    h.push_str("</table>");
    if !m.models.is_empty() {
        h.push_str("<table class=\"small\"><tr><th>model</th><th>what</th></tr>");
        for (n, what) in &m.models {
            let _ = write!(
                h,
                "<tr><td>{}</td><td class=\"note\">{}</td></tr>",
                esc(n),
                esc(what)
            );
        }
        h.push_str("</table>");
    }
    for (name, t) in &m.targets {
        let lat = super::models::model_latencies(&t.model_status);
        if !lat.is_empty() {
            let _ = write!(
                h,
                "<table class=\"small\"><tr><th>{} model</th><th>latency (histogram bucket bounds)</th></tr>",
                esc(name)
            );
            for (model, l) in lat {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td class=\"note\">{}</td></tr>",
                    esc(&model),
                    esc(&l)
                );
            }
            h.push_str("</table>");
        }
        if !t.model_status.is_null() {
            let _ = write!(
                h,
                "<details><summary>{}: models at the end</summary><pre>{}</pre></details>",
                esc(name),
                esc(&serde_json::to_string_pretty(&t.model_status).unwrap_or_default())
            );
        }
    }
    for (name, why) in &m.not_run {
        let _ = write!(
            h,
            "<p class=\"warn\">{} not run: {}</p>",
            esc(name),
            esc(why)
        );
    }
}

/// A median with its min–max, 0–2 decimals.
fn stat(s: &Stat) -> String {
    format!(
        "{} <span class=\"mm\">({}–{})</span>",
        f(s.median),
        f(s.min),
        f(s.max)
    )
}

/// A median with its min–max, 3 decimals.
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
