//! The hedging mode: no capacity search; interleaved trials (A B, B A, …) of every target at the
//! scenario's fixed rate.

use crate::model::LabError;
use crate::report::LabReport;
use crate::runner::{Caps, Fut, Lab, Measure, order};

/// [`crate::model::Mode::Hedging`].
pub(crate) struct Hedging {
    /// Offered rate, req/s.
    pub(crate) rate: f64,
}

impl Measure for Hedging {
    fn searches_capacity(&self) -> bool {
        false
    }

    fn accept(&self, rep: &mut LabReport, order: &[String]) {
        let targets = &rep.targets;
        rep.acceptance = order
            .iter()
            .filter_map(|n| targets.get(n).map(|t| (n, t)))
            .flat_map(|(n, t)| crate::scenario::hedging::acceptance(n, t, targets))
            .collect();
    }

    fn measure<'a>(&'a self, lab: &'a mut Lab, _caps: &'a Caps) -> Fut<'a, Result<(), LabError>> {
        Box::pin(async move {
            for round in 0..lab.plan.rounds {
                for ti in order(lab.targets.len(), round) {
                    let s = Lab::schedule(self.rate, lab.plan.hedge_trial_s);
                    lab.trial(ti, "hedging", round, s).await?;
                }
            }
            Ok(())
        })
    }
}
