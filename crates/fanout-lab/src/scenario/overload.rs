//! `overload`: hh-vacancies with a search backend of fixed capacity, each target offered 0.5× of
//! its measured capacity, a ramp to 3×, 3×, then 0.7×. Fanout runs with adaptive admission
//! control. What the scenario accepts, per target:
//! - goodput at 3× ≥ 90 % of the measured capacity;
//! - accepted p99 at 3× ≤ 2× the accepted p99 at 0.5×;
//! - rejections at 3× answered at once (p99 ≤ 10 ms), rather than timeouts or errors;
//! - after the drop to 0.7×: ≥ 99.9 % success per second within 10 s, and staying there.

use super::hh_vacancies::hh_requests;
use crate::model::{Mode, Scenario};
use crate::report::format::{f, pct};
use crate::report::{Acceptance, Phase, Recovery, TargetSummary};
use std::collections::BTreeMap;

/// hh-vacancies stubs whose search service has a fixed capacity (4 requests at once).
pub const OVERLOAD_STUBS: &str = include_str!("../scenarios/overload.stubs.yaml");
/// hh-vacancies with adaptive admission control.
pub const OVERLOAD_GATEWAY: &str = include_str!("../scenarios/overload.yaml");

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "overload",
        about: "hh-vacancies with a search backend of fixed capacity (4 at once, like a pool of 4 connections), offered 0.5× → 3× of each target's measured capacity, then 0.7×; fanout with adaptive admission control",
        stubs: OVERLOAD_STUBS,
        gateway: OVERLOAD_GATEWAY,
        requests: hh_requests(),
        mode: Mode::Overload {
            tail: 0.7,
            recover_s: 10.0,
        },
        slo_p99_ms: 50.0,
        critical_path: vec![
            ("search", "/search?text=rust"),
            ("vacancies", "/vacancies/101"),
        ],
        variants: vec![],
        baselines: &["hyper-baseline", "java-threads"],
        grpc: None,
        database: None,
        default_targets: &["fanout", "java-threads"],
    }
}

/// The acceptance lines of target `name` (none without its 0.5× and 3× phases).
pub(crate) fn acceptance(name: &str, t: &TargetSummary, recover_s: f64) -> Vec<Acceptance> {
    let phase = |n: &str| t.phases.iter().find(|p| p.name == n);
    let (Some(low), Some(high)) = (phase("0.5x"), phase("3x")) else {
        return vec![];
    };
    let mut out = vec![
        goodput(name, t, high),
        accepted_p99(name, low, high),
        rejections(name, high),
    ];
    if let Some(r) = &t.recovery {
        out.push(recovery(name, t, r, recover_s));
    }
    out
}

/// Goodput at 3× against the measured capacity.
fn goodput(name: &str, t: &TargetSummary, high: &Phase) -> Acceptance {
    let cap = t.max_rate.unwrap_or(0.0);
    Acceptance::new(
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
    )
}

/// Accepted p99 at 3× against the one at 0.5×.
fn accepted_p99(name: &str, low: &Phase, high: &Phase) -> Acceptance {
    Acceptance::new(
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
    )
}

/// How the excess at 3× was turned away: fast rejections, else timeouts and errors.
fn rejections(name: &str, high: &Phase) -> Acceptance {
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
    Acceptance::new(
        name,
        "overload: rejection p99 at 3×",
        "≤ 10 ms (503/429 answered at once)",
        measured,
        pass,
    )
}

/// Recovery after the drop to the last phase's rate.
fn recovery(name: &str, t: &TargetSummary, r: &Recovery, within_s: f64) -> Acceptance {
    let last = t.phases.last();
    let phase = last.map_or("last", |p| p.name.as_str());
    Acceptance::new(
        name,
        &format!("overload: recovery after the drop ({phase})"),
        &format!("≥ 99.9 % success (per 1-s window) within {within_s:.0} s, and staying there"),
        match r.time_to_recover_s {
            Some(s) => format!("recovered after {s:.0} s"),
            None => format!(
                "not recovered within the {:.0} s of the last phase (last second {:.1} % success)",
                last.map(|p| p.to_s - p.from_s).unwrap_or(0.0),
                r.success_by_second.last().copied().unwrap_or(0.0) * 100.0
            ),
        },
        r.time_to_recover_s.is_some_and(|s| s <= within_s),
    )
}

/// Targets whose 3× phase did not overload them (the capacity search stopped early): their
/// acceptance lines are not meaningful in this run.
pub(crate) fn warnings(targets: &BTreeMap<String, TargetSummary>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, t) in targets {
        let (Some(cap), Some(high)) = (t.max_rate, t.phases.iter().find(|p| p.name == "3x")) else {
            continue;
        };
        if high.ok_rate > 1.2 * cap && high.rejected + high.timeouts + high.errors == 0 {
            out.push(format!(
                "{name}: the 3× phase did not overload it ({:.0} req/s served, all of them, against a measured capacity of {cap:.0} req/s): the capacity search stopped early (see its warnings), so the overload acceptance lines are not meaningful in this run",
                high.ok_rate
            ));
        }
    }
    out
}
