//! The live page on the admin listener (`admin.ui`): `GET /ui` is one HTML page with its
//! script and style inline (no CDN, nothing to build), `GET /ui/api/state` the JSON it polls
//! about once a second: every route with its flow as a graph (the compiled plan's steps,
//! dependencies, conditions, levels) and each step's cumulative numbers (the page turns two
//! reads into rates, p50/p99, error shares and shares of the route's time), the status sections
//! (backends, caches, databases, models, admission, config and its reload history), and the
//! last slow and failed requests with their step waterfalls ([`fanout_ops::record`]).
//! Read-only; never on the client port.

use crate::{Gateway, Live};
use fanout_flow::RoutePlan;

/// The page (HTML, inline script and style).
pub const PAGE: &str = include_str!("page.html");

/// The page's Content-Security-Policy: nothing from elsewhere, only its own inline script and
/// style (the `<script>` and `<style>` carrying `nonce`, made anew for each answer), its data
/// from the same origin only.
pub fn csp(nonce: &str) -> String {
    format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
         connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    )
}

/// `GET /ui/api/state`: what the page shows; of the recorded requests, those recorded after
/// `after` (`?after=N`, the `recent.cursor` of the last poll; 0: all kept).
pub fn state_json(gw: &Gateway, after: u64) -> serde_json::Value {
    let live = gw.live();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    serde_json::json!({
        "now_unix_ms": now_ms,
        "bounds_s": fanout_ops::record::bounds_json(),
        "routes": routes_json(&live),
        "recent": gw.recent.as_ref().map(|r| r.json(after)),
        "config": gw.reloads.history_json(),
        "status": gw.status_json(),
    })
}

/// Every route: `{name, method, path, deadline_ms, steps: [...], stats}` (steps in config
/// order, each with the indices it waits for and its level; stats cumulative).
fn routes_json(live: &Live) -> serde_json::Value {
    live.routes
        .iter()
        .map(|r| {
            let mut v = route_json(r);
            v["name"] = live.route_name(r.index).into();
            v["stats"] = live
                .ui_stats
                .as_ref()
                .and_then(|s| s.route(r.index))
                .map_or(serde_json::Value::Null, |s| s.json());
            v
        })
        .collect()
}

/// One route's plan as a graph.
fn route_json(r: &RoutePlan) -> serde_json::Value {
    let levels = levels(r);
    let steps: Vec<serde_json::Value> = r
        .steps
        .iter()
        .map(|s| {
            let work = s.work();
            serde_json::json!({
                "name": &*s.name,
                "label": work.label,
                "kind": work.text,
                "backend": s.backend().map(|b| b.to_string()),
                "waits_for": s.deps,
                "level": levels.get(s.index).copied().unwrap_or(1),
                "when": s.when.is_some(),
                "for_each": s.for_each.is_some(),
                "optional": s.optional,
                "timeout_ms": s.timeout.as_secs_f64() * 1000.0,
            })
        })
        .collect();
    serde_json::json!({
        "method": r.method.as_str(),
        "path": r.path,
        "deadline_ms": r.deadline.as_secs_f64() * 1000.0,
        "steps": steps,
    })
}

/// Each step's level: 1 when it waits for nothing, else one more than the deepest step it
/// waits for (as `fanout explain` counts them).
fn levels(r: &RoutePlan) -> Vec<usize> {
    let n = r.steps.len();
    let mut level = vec![0usize; n];
    // The plan has no cycles: n passes settle every level.
    for _ in 0..n.max(1) {
        let mut changed = false;
        for s in &r.steps {
            let l = 1 + s
                .deps
                .iter()
                .filter_map(|&d| level.get(d).copied())
                .max()
                .unwrap_or(0);
            if let Some(slot) = level.get_mut(s.index)
                && *slot != l
            {
                *slot = l;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    level
}
