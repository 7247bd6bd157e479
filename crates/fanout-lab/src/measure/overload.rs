//! The overload mode (`overload`, `pool-overload`): after the capacity search, one continuous
//! run per target — 0.5× of its capacity, a ramp to 3×, 3×, then back down — for goodput,
//! rejections, accepted latency per phase and the time to recover.

use crate::model::{LabError, PhaseBound};
use crate::report::LabReport;
use crate::runner::{Caps, Fut, Lab, Load, LoadOpts, Measure, order};
use std::time::Duration;

/// [`crate::model::Mode::Overload`]: the last phase at `tail`× capacity.
pub(crate) struct Overload {
    /// The last phase's rate, as a fraction of capacity.
    pub(crate) tail: f64,
    /// Seconds after the drop within which full service must be back (acceptance).
    pub(crate) recover_s: f64,
}

impl Measure for Overload {
    fn lag_tolerated(&self) -> bool {
        true
    }

    fn accept(&self, rep: &mut LabReport, order: &[String]) {
        rep.warnings
            .extend(crate::scenario::overload::warnings(&rep.targets));
        rep.acceptance = order
            .iter()
            .filter_map(|n| rep.targets.get(n).map(|t| (n, t)))
            .flat_map(|(n, t)| crate::scenario::overload::acceptance(n, t, self.recover_s))
            .collect();
    }

    fn measure<'a>(&'a self, lab: &'a mut Lab, caps: &'a Caps) -> Fut<'a, Result<(), LabError>> {
        Box::pin(async move {
            for ti in order(lab.targets.len(), 0) {
                let c = caps.of(&lab.targets[ti].name);
                overload(lab, ti, c, self.tail).await?;
            }
            Ok(())
        })
    }
}

/// One continuous run: 0.5× capacity, ramp to 3×, 3×, 0.7×. The generator's timeout is the
/// client's deadline (1 s, twice the route's): a later answer is a failure, not goodput.
/// Connections may grow to 8192, so a target that queues instead of rejecting sees the
/// open-model load it would see from real clients.
async fn overload(lab: &mut Lab, ti: usize, c: f64, tail: f64) -> Result<(), LabError> {
    let [d1, d2, d3, d4] = lab.plan.overload;
    let tail_name = if tail == 0.5 {
        "back to 0.5x".to_string()
    } else {
        format!("{tail}x")
    };
    let ms = |d: f64| (d * 1000.0) as u64;
    let schedule = format!(
        "const({:.1},{}ms) line({:.1},{:.1},{}ms) const({:.1},{}ms) const({:.1},{}ms)",
        0.5 * c,
        ms(d1),
        0.5 * c,
        3.0 * c,
        ms(d2),
        3.0 * c,
        ms(d3),
        tail * c,
        ms(d4)
    );
    let mut at = 0.0;
    let bounds: Vec<PhaseBound> = [
        ("0.5x", d1),
        ("ramp to 3x", d2),
        ("3x", d3),
        (tail_name.as_str(), d4),
    ]
    .into_iter()
    .map(|(name, d)| {
        let b = PhaseBound {
            name: name.into(),
            from_s: at,
            to_s: at + d,
        };
        at += d;
        b
    })
    .collect();
    let load = Load {
        route: None,
        requests: lab.scenario.requests.clone(),
        schedule,
    };
    let opts = LoadOpts {
        timeout: Duration::from_secs(1),
        max_connections: 8192,
        open_connections: 0,
        drain: Duration::from_secs(1),
        sample: true,
    };
    lab.run_loads(ti, "overload", 0, None, vec![load], opts)
        .await?;
    if let Some(t) = lab.trials.last_mut() {
        t.phase_bounds = bounds;
    }
    Ok(())
}
