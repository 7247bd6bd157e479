//! The comparison mode (`hh-vacancies`, `product-page`, `product-page-merging`, `grpc-aggregate`,
//! `pg-one-query`, `n-plus-one`, `n-plus-one-identical`): after the capacity search,
//! interleaved trials (A B, B A, …) of every target at 50 % and 80 % of the lowest capacity,
//! and at a fixed rate when the scenario has one.

use crate::model::LabError;
use crate::runner::{Caps, Fut, Lab, Measure, order};

/// [`crate::model::Mode::Compare`] (`fixed: None`) and [`crate::model::Mode::CompareAt`].
pub(crate) struct Compare {
    /// A trial per target and round at this offered rate (phase `fixed-rate`) before the levels.
    pub(crate) fixed: Option<f64>,
}

impl Measure for Compare {
    fn measure<'a>(&'a self, lab: &'a mut Lab, caps: &'a Caps) -> Fut<'a, Result<(), LabError>> {
        Box::pin(async move {
            let base = caps.base;
            // `--quick` (a debug build in the test suite) caps the fixed rate at the 80 % level:
            // its trials check the shape, and an overloaded target answers nothing.
            let fixed = self.fixed.map(|rate| {
                if lab.opts.quick {
                    rate.min(base * 0.8)
                } else {
                    rate
                }
            });
            for round in 0..lab.plan.rounds {
                for ti in order(lab.targets.len(), round) {
                    if let Some(rate) = fixed {
                        let s = Lab::schedule(rate, lab.plan.trial_s);
                        lab.trial(ti, "fixed-rate", round, s).await?;
                    }
                    for (phase, f) in [("level-50", 0.5), ("level-80", 0.8)] {
                        let s = Lab::schedule(base * f, lab.plan.trial_s);
                        lab.trial(ti, phase, round, s).await?;
                    }
                }
            }
            Ok(())
        })
    }
}
