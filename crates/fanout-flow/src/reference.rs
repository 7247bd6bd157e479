//! Reference data (E2): small datasets loaded at start, refreshed in the background, served from
//! memory as `$ref.NAME`.
//!
//! All datasets live in one immutable snapshot (an object name → data) behind an `ArcSwap`; a
//! refresh builds a new snapshot and swaps it in whole, and a request reads the snapshot once when
//! it starts — so no request ever sees a half-updated dataset, or two datasets from different
//! moments mid-request. A failed refresh keeps the last good copy and records the error; the age of
//! each dataset is visible in [`ReferenceSet::status`].

use crate::call::HttpPlan;
use crate::call::{BuildError, Env, build_call, fetch_json, invalid_call};
use crate::error::FlowError;
use arc_swap::ArcSwap;
use fanout_expr::{Expr, Map, Val, json};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// One compiled dataset.
pub struct Dataset {
    /// Name (`$ref.NAME`).
    pub name: Arc<str>,
    /// How to fetch it.
    pub call: HttpPlan,
    /// Maps the answer.
    pub result: Option<Expr>,
    /// Refresh period.
    pub refresh: Duration,
    /// Startup continues without it.
    pub optional: bool,
    /// Per-fetch timeout.
    pub timeout: Duration,
}

/// The state of one dataset.
#[derive(Debug, Clone, Default)]
pub struct DatasetStatus {
    /// When the current copy was loaded.
    pub loaded_at: Option<SystemTime>,
    /// The last refresh error, if the last refresh failed.
    pub last_error: Option<String>,
    /// Successful loads.
    pub loads: u64,
    /// Failed loads.
    pub failures: u64,
}

struct Snapshot {
    value: Val,
    status: Vec<DatasetStatus>,
}

/// All reference datasets of a config.
pub struct ReferenceSet {
    datasets: Vec<Dataset>,
    current: ArcSwap<Snapshot>,
    /// When the set was made (from its config).
    created_at: SystemTime,
}

impl ReferenceSet {
    /// A set with nothing loaded yet.
    pub fn new(datasets: Vec<Dataset>) -> ReferenceSet {
        let n = datasets.len();
        let names: Map = datasets
            .iter()
            .map(|d| (json::str_val(&d.name), Val::Null))
            .collect();
        ReferenceSet {
            datasets,
            current: ArcSwap::from_pointee(Snapshot {
                value: Val::obj(names),
                status: vec![DatasetStatus::default(); n],
            }),
            created_at: SystemTime::now(),
        }
    }

    /// When the set was made from its config (a reload that keeps the set keeps this time).
    pub fn created_at(&self) -> SystemTime {
        self.created_at
    }

    /// Whether there are datasets at all.
    pub fn is_empty(&self) -> bool {
        self.datasets.is_empty()
    }

    /// The `$ref` value for a request starting now (cheap: one atomic load, one `Arc` clone).
    pub fn snapshot(&self) -> Val {
        self.current.load().value.clone()
    }

    /// Per dataset: (name, status).
    pub fn status(&self) -> Vec<(Arc<str>, DatasetStatus)> {
        let snap = self.current.load();
        self.datasets
            .iter()
            .zip(snap.status.iter())
            .map(|(d, s)| (d.name.clone(), s.clone()))
            .collect()
    }

    /// The required (not `optional`) datasets that have never loaded: while there are any,
    /// the gateway is not ready.
    pub fn missing_required(&self) -> Vec<Arc<str>> {
        let snap = self.current.load();
        self.datasets
            .iter()
            .zip(snap.status.iter())
            .filter(|(d, s)| !d.optional && s.loaded_at.is_none())
            .map(|(d, _)| d.name.clone())
            .collect()
    }

    async fn fetch(&self, d: &Dataset) -> Result<Val, FlowError> {
        let deadline = Instant::now() + d.timeout;
        let env = Env::empty();
        let req = build_call(&d.call, &env, None, deadline).map_err(|e| match e {
            BuildError::Eval(m) => {
                FlowError::new(crate::ErrorKind::Expression, "building the call failed")
                    .with_detail(format!("reference `{}`: {}", d.name, m.0))
            }
            BuildError::Invalid(detail) => {
                invalid_call(format!("reference `{}`: {detail}", d.name))
            }
        })?;
        let answer = fetch_json(
            &d.name,
            &d.call,
            req,
            d.timeout,
            deadline,
            // Refreshed in the background, held by the snapshot: in no request's account.
            crate::memory::RequestMemory::unlimited(),
        )
        .await?;
        match &d.result {
            None => Ok(answer),
            Some(r) => r.eval(&answer, |_| Val::Null).map_err(|e| {
                FlowError::new(
                    crate::ErrorKind::BadBackendAnswer,
                    "`result` failed on the answer",
                )
                .with_detail(format!("reference `{}`: {}", d.name, e.0))
            }),
        }
    }

    /// Record the outcome of a load of dataset `i`, swapping in a new snapshot.
    fn store(&self, i: usize, outcome: Result<Val, String>) {
        self.current.rcu(|old| {
            let mut status = old.status.clone();
            let mut value = old.value.clone();
            match &outcome {
                Ok(v) => {
                    if let (Val::Obj(m), Some(d)) = (&mut value, self.datasets.get(i)) {
                        Arc::make_mut(m).insert(json::str_val(&d.name), v.clone());
                    }
                    if let Some(s) = status.get_mut(i) {
                        s.loaded_at = Some(SystemTime::now());
                        s.last_error = None;
                        s.loads += 1;
                    }
                }
                Err(e) => {
                    if let Some(s) = status.get_mut(i) {
                        s.last_error = Some(e.clone());
                        s.failures += 1;
                    }
                }
            }
            Arc::new(Snapshot { value, status })
        });
    }

    /// Load every dataset once. A required dataset that fails makes this fail, naming it.
    pub async fn load_all(&self) -> Result<(), String> {
        let results =
            futures_util::future::join_all(self.datasets.iter().map(|d| self.fetch(d))).await;
        let mut errors = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            let d = &self.datasets[i];
            match r {
                Ok(v) => self.store(i, Ok(v)),
                Err(e) => {
                    self.store(i, Err(e.to_string()));
                    if !d.optional {
                        errors.push(format!(
                            "reference data `{}`: first load failed: {}",
                            d.name, e
                        ));
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Refresh every dataset on its period in background tasks, until the set is dropped.
    pub fn spawn_refresh(self: &Arc<Self>) {
        for i in 0..self.datasets.len() {
            let weak: Weak<ReferenceSet> = Arc::downgrade(self);
            let period = self.datasets[i].refresh.max(Duration::from_millis(10));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(Instant::now() + period, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(set) = weak.upgrade() else { return };
                    let Some(d) = set.datasets.get(i) else { return };
                    let outcome = set.fetch(d).await.map_err(|e| e.to_string());
                    if let Err(e) = &outcome {
                        tracing::warn!(dataset = %d.name, error = %e, "reference data refresh failed; serving the last good copy");
                    }
                    set.store(i, outcome);
                }
            });
        }
    }
}
