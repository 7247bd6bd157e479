//! How each mode of the lab measures and reports: one implementation of
//! [`crate::runner::Measure`] per [`Mode`], one module each. [`of`] is the only place that looks
//! at which mode a scenario has.

mod closed_loop;
mod compare;
mod hedging;
mod models;
mod overload;
mod pools;
mod slow_backend;

pub use closed_loop::{Conn, ITERATION_S, Op, Window, drive, iteration_means};

use crate::model::Mode;
use crate::runner::Measure;
use std::sync::Arc;

/// The implementation of `mode`.
pub(crate) fn of(mode: &Mode) -> Arc<dyn Measure> {
    match mode {
        Mode::Compare => Arc::new(compare::Compare { fixed: None }),
        Mode::CompareAt { rate } => Arc::new(compare::Compare { fixed: Some(*rate) }),
        Mode::Overload { tail, recover_s } => Arc::new(overload::Overload {
            tail: *tail,
            recover_s: *recover_s,
        }),
        Mode::SlowBackend(sb) => Arc::new(slow_backend::SlowBackendRun(sb.clone())),
        Mode::Hedging { rate } => Arc::new(hedging::Hedging { rate: *rate }),
        Mode::ClosedLoop(cl) => Arc::new(closed_loop::ClosedLoopRun(cl.clone())),
        Mode::Models(m) => Arc::new(models::ModelsRun(*m)),
        Mode::Pools(p) => Arc::new(pools::PoolsRun(*p)),
    }
}
