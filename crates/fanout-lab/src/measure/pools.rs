//! The pools mode (`hh-pools`): no capacity search; per phase (the stub route healthy, then
//! slower) every target at one fixed rate, interleaved, with the backlog each trial leaves
//! behind drained and timed before the next.

use crate::model::{LabError, Pools, pools_phases};
use crate::report::LabReport;
use crate::report::pools::Drain;
use crate::runner::{Caps, Fut, Lab, Load, LoadOpts, Measure, order, put_stub_route};
use std::time::Duration;
use tokio::time::Instant;

/// [`crate::model::Mode::Pools`].
pub(crate) struct PoolsRun(pub(crate) Pools);

impl Measure for PoolsRun {
    fn searches_capacity(&self) -> bool {
        false
    }

    // A pools run's JVMs have thousands of threads: sample them without the per-thread files, or
    // the lab (which runs the generator) spends its time reading /proc.
    fn light_sampling(&self) -> bool {
        true
    }

    fn measure<'a>(&'a self, lab: &'a mut Lab, _caps: &'a Caps) -> Fut<'a, Result<(), LabError>> {
        Box::pin(pools(lab, &self.0))
    }

    fn report(&self, lab: &mut Lab, rep: &mut LabReport) {
        let (trial_s, rounds, _) = lab.plan.pools;
        let pools = crate::report::pools::summarize(
            &self.0,
            rep,
            trial_s,
            rounds,
            &lab.opts.targets,
            std::mem::take(&mut lab.drains),
            std::mem::take(&mut lab.not_run),
            std::mem::take(&mut lab.jvm),
        );
        rep.warnings.extend(pools.warnings());
        rep.pools = Some(pools);
    }
}

/// `hh-pools`: per phase (the stub route healthy, then `factor`× slower), every target at
/// the same fixed rate, interleaved (A B, B A, …) over the rounds; after each trial, wait
/// until the target's backend calls stop (a thread pool's queue drains: its requests are
/// still served after their clients gave up) and record how long that took. The route is
/// healthy again at the end (for the direct measurement).
async fn pools(lab: &mut Lab, p: &Pools) -> Result<(), LabError> {
    let Some(addr) = lab
        .stubs
        .services
        .iter()
        .find(|(n, _)| n == p.service)
        .map(|(_, a)| *a)
    else {
        return Err(LabError::Load(format!(
            "the scenario's stubs have no service `{}`",
            p.service
        )));
    };
    let (trial_s, rounds, drain_cap) = lab.plan.pools;
    let phases = pools_phases(p);
    for (stage, latency_ms) in phases.iter().copied().chain([("restore", p.base_ms)]) {
        let body = serde_json::json!({
            "route": p.route,
            "latency": format!("{latency_ms}ms"),
            "faults": [],
        });
        if let Err(e) = put_stub_route(addr, &body).await {
            lab.warnings.push(format!(
                "switching {} `{}` to {latency_ms} ms failed: {e}",
                p.service, p.route
            ));
        }
        if stage == "restore" {
            break;
        }
        for round in 0..rounds {
            for ti in order(lab.targets.len(), round) {
                let load = Load {
                    route: None,
                    requests: lab.scenario.requests.clone(),
                    schedule: Lab::schedule(p.rate, trial_s),
                };
                let opts = LoadOpts {
                    sample: true,
                    ..LoadOpts::default()
                };
                lab.run_loads(ti, "pools", round, Some(stage), vec![load], opts)
                    .await?;
                let (drain_s, calls, capped) =
                    wait_quiet(lab, Duration::from_secs_f64(drain_cap)).await?;
                lab.drains.push(Drain {
                    target: lab.targets[ti].name.clone(),
                    phase: stage.to_string(),
                    round,
                    drain_s,
                    backend_calls: calls,
                    capped,
                });
            }
        }
    }
    Ok(())
}

/// Wait (up to `within`) until the stubs receive no call for 500 ms: (seconds waited, calls
/// received meanwhile, whether `within` ran out first).
async fn wait_quiet(lab: &Lab, within: Duration) -> Result<(f64, u64, bool), LabError> {
    let start = Instant::now();
    let (first, _) = lab.stubs.totals().await?;
    let mut last = first;
    let mut still = 0;
    while start.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (now, _) = lab.stubs.totals().await?;
        if now == last {
            still += 1;
            if still >= 2 {
                // The calls stopped at the first of the two quiet polls.
                let waited = (start.elapsed().as_secs_f64() - 0.5).max(0.0);
                return Ok((waited, now.saturating_sub(first), false));
            }
        } else {
            still = 0;
            last = now;
        }
    }
    Ok((
        start.elapsed().as_secs_f64(),
        last.saturating_sub(first),
        true,
    ))
}
