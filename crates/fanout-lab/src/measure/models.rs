//! The models mode (`antispam-models`): a capacity search that looks for the rate each target
//! *sustains*, then interleaved trials at the baseline's capacity and at half and all of
//! fanout's (or one long run per target with `--duration`), while one model's file is replaced
//! every few seconds; the Python baseline prepared first, the models report at the end.

use crate::antispam;
use crate::model::{LabError, LabOptions, Models};
use crate::report::LabReport;
use crate::runner::{Caps, Fut, Lab, Load, LoadOpts, Measure, Prepared, order};
use std::collections::BTreeMap;
use std::time::Duration;

/// [`crate::model::Mode::Models`].
pub(crate) struct ModelsRun(pub(crate) Models);

impl ModelsRun {
    /// Seconds between two swaps in this run.
    fn swap_every_s(&self, quick: bool) -> f64 {
        if quick {
            self.0.quick_swap_every_s
        } else {
            self.0.swap_every_s
        }
    }
}

impl Measure for ModelsRun {
    /// The defaults, with the client connections opened before each trial.
    fn load_opts(&self) -> LoadOpts {
        LoadOpts {
            open_connections: self.0.connections,
            ..LoadOpts::default()
        }
    }

    // 1 000 gRPC connections put a heavy generator on the machine with the target: its lag is
    // the machine's, not the target's.
    fn lag_tolerated(&self) -> bool {
        true
    }

    fn sustained_capacity(&self) -> bool {
        true
    }

    fn prepare<'a>(
        &'a self,
        opts: &'a mut LabOptions,
        prepared: &'a mut Prepared,
        not_run: &'a mut BTreeMap<String, String>,
    ) -> Fut<'a, Result<(), LabError>> {
        Box::pin(prepare_python(opts, prepared, not_run))
    }

    /// A models run replaces one model's file every few seconds from now to the end.
    fn started(&self, lab: &mut Lab) {
        lab.swapper = Some(antispam::Swapper::start(
            lab.opts.out.join("models"),
            Duration::from_secs_f64(self.swap_every_s(lab.opts.quick)),
            lab.t0,
        ));
    }

    fn measure<'a>(&'a self, lab: &'a mut Lab, caps: &'a Caps) -> Fut<'a, Result<(), LabError>> {
        Box::pin(models_levels(lab, &caps.by_target))
    }

    fn measured(&self, lab: &mut Lab) {
        lab.swaps = lab.swapper.take().map(antispam::Swapper::finish);
    }

    fn report(&self, lab: &mut Lab, rep: &mut LabReport) {
        let Some(swaps) = lab.swaps.take() else {
            return;
        };
        let mut targets = BTreeMap::new();
        for (name, timeline) in &rep.timelines {
            let run = antispam::TargetRun {
                max_rate: rep.targets.get(name).and_then(|t| t.max_rate),
                trials: &rep.trials,
                timeline,
                started_at: lab.started_at.get(name).copied().unwrap_or(0.0),
                warmup_end: lab.warmup_end,
                model_status: lab.model_status.remove(name).unwrap_or_default(),
                slo_p99_ms: lab.scenario.slo_p99_ms,
            };
            targets.insert(name.clone(), antispam::summarize(name, &run, &swaps));
        }
        let models = antispam::ModelsReport {
            swap_model: antispam::SWAP_MODEL.into(),
            swap_files: vec!["gbdt_bin".into(), "logreg_bin".into()],
            swap_every_s: self.swap_every_s(lab.opts.quick),
            swaps_at_s: swaps,
            swap_window_s: antispam::SWAP_WINDOW_S,
            connections: self.0.connections,
            models: antispam::MODELS
                .iter()
                .map(|(n, what, _)| (n.to_string(), what.to_string()))
                .collect(),
            long_run_s: lab.opts.duration.map(|d| d.as_secs_f64()),
            not_run: std::mem::take(&mut lab.not_run),
            targets,
        };
        rep.acceptance
            .extend(antispam::acceptance(&models, lab.scenario.slo_p99_ms));
        rep.models = Some(models);
    }
}

/// The Python baseline's venv and stubs, when `antispam-py` is a target (the models are written
/// with the scenario's files) — without them it does not run, and the report says why (never a
/// failed run).
async fn prepare_python(
    opts: &mut LabOptions,
    prepared: &mut Prepared,
    not_run: &mut BTreeMap<String, String>,
) -> Result<(), LabError> {
    if !opts.targets.iter().any(|t| t == "antispam-py") {
        return Ok(());
    }
    let proto = opts.out.join(crate::scenario::ANTISPAM_PROTO.0);
    let stubs = opts.out.join("antispam-py");
    let server = stubs.join("server.py");
    let found = tokio::task::spawn_blocking(move || {
        let py = antispam::ensure_python(&proto, &stubs)?;
        std::fs::write(&server, antispam::PY_SERVER)
            .map_err(|e| format!("{}: {e}", server.display()))?;
        Ok::<_, String>((py, server, stubs))
    })
    .await
    .map_err(|e| LabError::Load(format!("preparing antispam-py: {e}")))?;
    match found {
        Ok(p) => prepared.python = Some(p),
        Err(why) => {
            tracing::warn!("antispam-py will not run: {why}");
            not_run.insert("antispam-py".to_string(), why);
            opts.targets.retain(|t| t != "antispam-py");
        }
    }
    Ok(())
}

/// The measured trials of a models run, interleaved (A B, B A, …) over the rounds: every
/// target at the baseline's capacity (when it ran and has one: the highest rate both serve,
/// where requests per CPU-second compare), at half of fanout's and at all of it (the highest
/// rate fanout sustains with p99 within the SLO; the baseline at the same rates). With
/// `--duration`: one long trial per target at half of fanout's capacity instead.
async fn models_levels(lab: &mut Lab, caps: &BTreeMap<String, f64>) -> Result<(), LabError> {
    let fanout_cap = caps
        .iter()
        .filter(|(n, _)| *n != "antispam-py")
        .map(|(_, c)| *c)
        .fold(0.0, f64::max);
    let fanout_cap = if fanout_cap > 0.0 { fanout_cap } else { 100.0 };
    if let Some(d) = lab.opts.duration {
        for ti in order(lab.targets.len(), 0) {
            let load = Load {
                route: None,
                requests: lab.scenario.requests.clone(),
                schedule: Lab::schedule(0.5 * fanout_cap, d.as_secs_f64()),
            };
            let opts = LoadOpts {
                sample: true,
                ..lab.kind.load_opts()
            };
            lab.run_loads(ti, "long", 0, None, vec![load], opts).await?;
        }
        return Ok(());
    }
    let mut levels = Vec::new();
    if let Some(b) = caps.get("antispam-py").copied().filter(|c| *c > 0.0) {
        levels.push(("at-baseline-max", b));
    }
    levels.push(("at-fanout-half", 0.5 * fanout_cap));
    levels.push(("at-fanout-max", fanout_cap));
    for round in 0..lab.plan.rounds {
        for ti in order(lab.targets.len(), round) {
            for (phase, rate) in &levels {
                lab.trial(ti, phase, round, Lab::schedule(*rate, lab.plan.trial_s))
                    .await?;
                // An overloaded target may still work off a backlog (calls the client gave up
                // on): the next trial, maybe of another target, must not share the CPU with it.
                lab.wait_idle(ti, Duration::from_secs(30)).await;
            }
        }
    }
    Ok(())
}
