//! Runtimes the engine hosts for step kinds — the model set of `model` steps, the `sql` steps'
//! counters. A runtime is opened from the config by the gateway (and kept by a reload that does
//! not change what it reads), handed to the flow compiler in
//! `fanout_flow::plan::Carry::runtimes`, found there by its step kind's compiler by type
//! ([`Runtimes::get`]), and asked by the gateway — without knowing what it is — for readiness,
//! its sections of the status endpoint and its metric families. A new runtime is a type
//! implementing [`Runtime`] with a [`Registration`], plus its line in the gateway's list
//! (`fanout-proxy`'s `RUNTIMES`).

use crate::hist::HistogramSnapshot;
use fanout_config::{Config, ConfigError};
use std::any::Any;
use std::sync::Arc;
use std::time::SystemTime;

/// A runtime the gateway hosts for a step kind.
pub trait Runtime: Any + Send + Sync {
    /// Start its background work (a directory watcher): when the gateway starts serving, and
    /// when a reload swaps in a new runtime. Starting one that runs already does nothing.
    fn start(self: Arc<Self>) -> Result<(), String>;
    /// `Err(why)` while the gateway must not report ready (`/readyz`).
    fn readiness(&self) -> Result<(), String> {
        Ok(())
    }
    /// Its sections of `/__fanout/status`: (top-level key, value).
    fn status(&self, now: SystemTime) -> Vec<(&'static str, serde_json::Value)>;
    /// Its metric families, every series from the start (`/metrics`).
    fn metrics(&self, now: SystemTime) -> Vec<Family>;
    /// Itself as `Any`, for its step kind's compiler ([`Runtimes::get`]).
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// Opens a runtime for `cfg` (files are read, nothing is started); `prev`, the one the running
/// config opened (with that config), is kept when what it reads did not change.
pub type Open = fn(
    cfg: &Config,
    prev: Option<(&Config, &Arc<dyn Runtime>)>,
) -> Result<Arc<dyn Runtime>, ConfigError>;

/// How a runtime is opened from a config.
pub struct Registration {
    /// Open it ([`Open`]).
    pub open: Open,
}

/// The runtimes opened for one config, in the order of the list they were opened from.
#[derive(Clone, Default)]
pub struct Runtimes(Vec<Arc<dyn Runtime>>);

impl Runtimes {
    /// Open every runtime of `registered` for `cfg`, keeping those of `prev` (the running
    /// config and its runtimes, opened from the same list) whose inputs did not change. A
    /// runtime that cannot be opened is a config error.
    pub fn open(
        registered: &[Registration],
        cfg: &Config,
        prev: Option<(&Config, &Runtimes)>,
    ) -> Result<Runtimes, ConfigError> {
        let mut out = Vec::with_capacity(registered.len());
        for (i, r) in registered.iter().enumerate() {
            let kept = prev.and_then(|(c, rs)| rs.0.get(i).map(|r| (c, r)));
            out.push((r.open)(cfg, kept)?);
        }
        Ok(Runtimes(out))
    }

    /// The runtime of type `T`, if one was opened.
    pub fn get<T: Runtime>(&self) -> Option<Arc<T>> {
        self.0
            .iter()
            .find_map(|r| r.clone().as_any().downcast::<T>().ok())
    }

    /// Every runtime.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Runtime>> {
        self.0.iter()
    }

    /// Start each one's background work ([`Runtime::start`]).
    pub fn start(&self) -> Result<(), String> {
        self.0.iter().try_for_each(|r| r.clone().start())
    }

    /// `Err(why)` when one of them is not ready.
    pub fn readiness(&self) -> Result<(), String> {
        self.0.iter().try_for_each(|r| r.readiness())
    }
}

/// A metric family a runtime exports, in a form that does not depend on the exposition format
/// (the gateway writes it as Prometheus text).
pub struct Family {
    /// The metric's name (`fanout_…`; counters without `_total`).
    pub name: &'static str,
    /// Its help text.
    pub help: &'static str,
    /// Its type.
    pub kind: FamilyKind,
    /// Its series: labels and value.
    pub samples: Vec<(Vec<(&'static str, String)>, Sample)>,
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyKind {
    /// A monotonic count.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution.
    Histogram,
}

/// One series' value.
pub enum Sample {
    /// A counter's count.
    Counter(u64),
    /// A gauge's value.
    Gauge(f64),
    /// A histogram's buckets, sum and count.
    Histogram(HistogramSnapshot),
}
