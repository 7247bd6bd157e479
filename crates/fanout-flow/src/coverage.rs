//! Which parts of the flows requests went through: the routes run, and per step whether it ran,
//! which way its `when` went, whether its `for_each` list was empty, whether it fell back to its
//! `default`, which `on_status` entries matched (`fanout test --coverage`).
//!
//! The executor reports branches through [`crate::observe::Observer::branch`]; a gateway that
//! records coverage forwards them to a [`Coverage`] with the route they belong to
//! ([`RouteCoverage`]). A gateway that does not record it never builds one: the hooks stay the
//! observer's empty defaults.

use crate::plan::{RoutePlan, StepPlan};
use fanout_config::StatusPattern;
use std::collections::HashSet;
use std::sync::Mutex;

/// One way through a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Branch {
    /// The step started (its `when`, if any, is evaluated after this).
    Ran,
    /// Its `when` was true (`true`: the step did its work; a `fail` step fired) or false
    /// (skipped: its value is its `default`).
    When(bool),
    /// Its `for_each` list had elements (`false`) or none (`true`).
    ForEachEmpty(bool),
    /// The optional step failed and took its `default`.
    Defaulted,
    /// The `on_status` entry for this status or class matched the backend's status.
    OnStatus(StatusPattern),
}

/// Something a request went through: a route (by its index in the plan, config order) or a
/// branch of one of its steps (by index in the route's steps, config order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hit {
    /// The route's flow ran.
    Route(usize),
    /// A step of a route took a branch.
    Step {
        /// The route's index.
        route: usize,
        /// The step's index.
        step: usize,
        /// The branch.
        branch: Branch,
    },
}

/// The hits of a gateway's requests, kept for as long as it records (a test run).
#[derive(Debug, Default)]
pub struct Coverage(Mutex<HashSet<Hit>>);

impl Coverage {
    /// A recorder with nothing hit yet.
    pub fn new() -> Coverage {
        Coverage::default()
    }

    /// Record `hit`.
    pub fn record(&self, hit: Hit) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(hit);
    }

    /// Whether `hit` was recorded.
    pub fn has(&self, hit: &Hit) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(hit)
    }

    /// The recorder of one run of `route`.
    pub fn route<'a>(&'a self, route: &'a RoutePlan) -> RouteCoverage<'a> {
        RouteCoverage { cov: self, route }
    }
}

/// A [`Coverage`] for one run of one route: records the route as run, and its steps' branches.
#[derive(Clone, Copy)]
pub struct RouteCoverage<'a> {
    cov: &'a Coverage,
    route: &'a RoutePlan,
}

impl RouteCoverage<'_> {
    /// The route's flow runs.
    pub fn ran(&self) {
        self.cov.record(Hit::Route(self.route.index));
    }

    /// `step` took `branch`.
    pub fn step(&self, step: &StepPlan, branch: Branch) {
        self.cov.record(Hit::Step {
            route: self.route.index,
            step: step.index,
            branch,
        });
    }
}
