//! `hedging`: one stub service with a bimodal latency (95 % ~2 ms, 5 % ~40 ms), fanout without
//! (`no-hedge`) and with hedged calls (`hedge`, delay 4 ms ≈ p95), interleaved at a fixed rate.
//! What the scenario accepts, per target other than `no-hedge`: p99 ≥ 50 % lower than
//! `no-hedge`'s at ≤ 10 % extra backend calls.

use crate::model::{Mode, Scenario, id_requests};
use crate::report::format::f;
use crate::report::{Acceptance, TargetSummary};
use std::collections::BTreeMap;

/// One service with a bimodal latency.
pub const HEDGE_STUBS: &str = include_str!("../scenarios/hedging.stubs.yaml");
/// One step, no hedging.
pub const HEDGE_OFF: &str = include_str!("../scenarios/hedging.no-hedge.yaml");
/// The same with `hedge: {delay: 4ms}`.
pub const HEDGE_ON: &str = include_str!("../scenarios/hedging.hedge.yaml");

/// The target every other one is compared with.
const BASELINE: &str = "no-hedge";

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "hedging",
        about: "one backend with a bimodal latency (95 % ~2 ms, 5 % ~40 ms): fanout without and with hedged calls (delay 4 ms ≈ p95)",
        stubs: HEDGE_STUBS,
        gateway: HEDGE_OFF,
        requests: id_requests("/item", 1),
        mode: Mode::Hedging { rate: 200.0 },
        slo_p99_ms: 50.0,
        critical_path: vec![("catalog", "/items/1")],
        variants: vec![
            ("no-hedge", HEDGE_OFF.to_string()),
            ("hedge", HEDGE_ON.to_string()),
        ],
        baselines: &[],
        grpc: None,
        database: None,
        default_targets: &["no-hedge", "hedge"],
    }
}

/// The acceptance line of target `name` against `no-hedge` (none for `no-hedge` itself, or
/// without merged hedging figures of both).
pub(crate) fn acceptance(
    name: &str,
    t: &TargetSummary,
    targets: &BTreeMap<String, TargetSummary>,
) -> Option<Acceptance> {
    if name == BASELINE {
        return None;
    }
    let h = t.hedging.as_ref()?;
    let base = targets.get(BASELINE).and_then(|b| b.hedging.as_ref())?;
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
    Some(Acceptance::new(
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
    ))
}
