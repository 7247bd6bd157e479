//! The self-contained HTML report: tables per section, the charts (`charts.rs`) and the JSON
//! report embedded for tools.

use super::charts::charts;
use super::format::{f, recovery_text};
use super::{LabReport, Stat};
use crate::Trial;
use crate::svg::esc;
use std::fmt::Write;

/// Render the HTML report.
pub fn html(rep: &LabReport, json: &str) -> String {
    let mut h = String::new();
    head(&mut h, rep);
    summary_table(&mut h, rep);
    acceptance_table(&mut h, rep);
    direct_line(&mut h, rep);
    levels_table(&mut h, rep);
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

/// Every trial, in the order run.
fn trials_table(h: &mut String, rep: &LabReport) {
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
