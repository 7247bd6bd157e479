//! Why a target's `max_rate` is 0 (`TargetSummary::max_rate_reason`): every trial was flagged,
//! every capacity-search step was flagged, or no valid step met the SLO — with the causes and
//! figures that say which.

use crate::LAG_THRESHOLD;
use crate::model::Trial;

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

/// Why a target's `max_rate` is 0 (see [`TargetSummary::max_rate_reason`](super::TargetSummary::max_rate_reason)); `mine` are its
/// recorded trials.
pub(super) fn max_rate_reason(
    mine: &[&Trial],
    max_rate: Option<f64>,
    slo_p99_ms: f64,
) -> Option<String> {
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
