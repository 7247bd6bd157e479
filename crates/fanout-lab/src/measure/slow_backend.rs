//! The slow-backend mode: after the capacity search, every route at once at half of the
//! target's capacity while one stub route is normal, slower, failing, normal again (switched
//! through the stub's admin API).

use crate::model::{LabError, SlowBackend};
use crate::report::LabReport;
use crate::runner::{Caps, Fut, Lab, Load, LoadOpts, Measure, order, put_stub_route};
use crate::scenario::slow_backend_phases;

/// [`crate::model::Mode::SlowBackend`].
pub(crate) struct SlowBackendRun(pub(crate) SlowBackend);

impl Measure for SlowBackendRun {
    fn accept(&self, rep: &mut LabReport, order: &[String]) {
        rep.acceptance = order
            .iter()
            .filter_map(|n| rep.targets.get(n).map(|t| (n, t)))
            .flat_map(|(n, t)| crate::scenario::slow_backend::acceptance(n, t))
            .collect();
    }

    fn measure<'a>(&'a self, lab: &'a mut Lab, caps: &'a Caps) -> Fut<'a, Result<(), LabError>> {
        Box::pin(async move {
            for ti in order(lab.targets.len(), 0) {
                let c = caps.of(&lab.targets[ti].name);
                slow_backend(lab, ti, &self.0, c).await?;
            }
            Ok(())
        })
    }
}

/// Each phase: switch the stub route through the admin API, then drive every route at once,
/// each with its own generator, at half the capacity in total.
async fn slow_backend(lab: &mut Lab, ti: usize, sb: &SlowBackend, c: f64) -> Result<(), LabError> {
    let Some(addr) = lab
        .stubs
        .services
        .iter()
        .find(|(n, _)| n == sb.service)
        .map(|(_, a)| *a)
    else {
        return Err(LabError::Load(format!(
            "the scenario's stubs have no service `{}`",
            sb.service
        )));
    };
    let per_route = 0.5 * c / sb.routes.len().max(1) as f64;
    for (stage, update) in slow_backend_phases(sb) {
        let mut body = update;
        body["route"] = serde_json::Value::from(sb.route);
        if let Err(e) = put_stub_route(addr, &body).await {
            lab.warnings.push(format!(
                "switching {} `{}` to `{stage}` failed: {e}",
                sb.service, sb.route
            ));
        }
        let loads = sb
            .routes
            .iter()
            .map(|r| Load {
                route: Some(r.name.to_string()),
                requests: r.requests.clone(),
                schedule: Lab::schedule(per_route, lab.plan.slow_phase_s),
            })
            .collect();
        lab.run_loads(
            ti,
            "slow-backend",
            0,
            Some(stage),
            loads,
            LoadOpts::default(),
        )
        .await?;
    }
    Ok(())
}
