//! The lab's runner: what a run is made of ([`Lab`]: the stubs, the targets, the trials so far)
//! and the one interface through which a scenario's mode measures and reports ([`Measure`],
//! implemented once per mode in `crate::measure`). `start.rs` prepares and starts a run and
//! collects it into the report; `trials.rs` is the load every mode uses (trials, the capacity
//! search, waits); `direct.rs` the stub calls measured without a target.

pub(crate) mod direct;
pub(crate) mod start;
pub(crate) mod trials;

use crate::model::{LabError, LabOptions, Scenario, Trial};
use crate::process::Proc;
use crate::report::pools;
use crate::report::{self, LabReport};
use crate::{antispam, http, procstat};
use fanout_load::RequestTemplate;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A boxed future of a [`Measure`] method (the trait is used as `dyn Measure`).
pub(crate) type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Each target's capacity (req/s) as the search found it (or `--capacity` gave it), and the base
/// rate of the levels: the lowest capacity found, else 100 req/s.
pub(crate) struct Caps {
    /// Per target; empty when the mode does not search.
    pub(crate) by_target: BTreeMap<String, f64>,
    /// The lowest positive capacity, else 100.
    pub(crate) base: f64,
}

impl Caps {
    /// The capacity of `name`, else the base rate.
    pub(crate) fn of(&self, name: &str) -> f64 {
        self.by_target
            .get(name)
            .copied()
            .filter(|c| *c > 0.0)
            .unwrap_or(self.base)
    }
}

/// What a target needs prepared before it starts: executables found or built, the Python
/// baseline's venv and server.
#[derive(Default)]
pub(crate) struct Prepared {
    /// `hyper-baseline`, `grpc-baseline`, `pg-baseline` executables.
    pub(crate) hyper: Option<PathBuf>,
    /// `grpc-baseline`.
    pub(crate) grpc: Option<PathBuf>,
    /// `pg-baseline`.
    pub(crate) pg: Option<PathBuf>,
    /// The compiled Java baseline's classes directory.
    pub(crate) java_classes: Option<PathBuf>,
    /// A Java runtime ≥ 21 (`java-virtual`, `java-blocking`).
    pub(crate) jdk21: Option<crate::java::Jdk>,
    /// `antispam-py`: (its venv's python, the server script, its generated stubs).
    pub(crate) python: Option<(PathBuf, PathBuf, PathBuf)>,
}

/// How one mode of the lab measures and reports — one implementation per mode
/// (`crate::measure::of`). The runner does what every mode shares (start the stubs and targets,
/// warm up, search each target's capacity, stop, measure the direct path, build the report) and
/// asks the mode for the rest.
pub(crate) trait Measure {
    /// Whether the runner warms up the targets and searches their capacity before
    /// [`Measure::measure`] (open-model load). `false`: the mode warms up and measures in its
    /// own way (the closed loop).
    fn open_model(&self) -> bool {
        true
    }

    /// Whether each target's capacity is searched (or `--capacity` taken) before the measured
    /// trials; `false`: the mode runs at its own fixed rate.
    fn searches_capacity(&self) -> bool {
        true
    }

    /// The generator's settings of a trial.
    fn load_opts(&self) -> LoadOpts {
        LoadOpts::default()
    }

    /// Sample the targets' `/proc` without the per-thread files (targets with thousands of
    /// threads: reading them would stall the generator).
    fn light_sampling(&self) -> bool {
        false
    }

    /// Accept capacity-search steps whose generator lagged up to
    /// [`crate::OVERLOAD_SEARCH_LAG_MS`] when the target met the SLO (a heavy generator on the
    /// target's machine: its lag is the machine's).
    fn lag_tolerated(&self) -> bool {
        false
    }

    /// Search for the highest rate the target *sustains*: wait until it is idle after a failed
    /// step, and confirm the rate found with a step as long as a trial.
    fn sustained_capacity(&self) -> bool {
        false
    }

    /// Prepare what the mode's own targets need before anything starts (the Python baseline);
    /// a target that cannot run is removed from `opts.targets` and listed in `not_run`.
    fn prepare<'a>(
        &'a self,
        _opts: &'a mut LabOptions,
        _prepared: &'a mut Prepared,
        _not_run: &'a mut BTreeMap<String, String>,
    ) -> Fut<'a, Result<(), LabError>> {
        Box::pin(async { Ok(()) })
    }

    /// The targets are up: start what runs beside the measurement (the models' swapper).
    fn started(&self, _lab: &mut Lab) {}

    /// The measured trials, after the warm-up and capacity search of an open-model mode.
    fn measure<'a>(&'a self, lab: &'a mut Lab, caps: &'a Caps) -> Fut<'a, Result<(), LabError>>;

    /// The measurement ended (the targets still run): stop what ran beside it.
    fn measured(&self, _lab: &mut Lab) {}

    /// The targets stopped, the stubs still run: measure what needs the stubs alone (the closed
    /// loop's floor).
    fn targets_stopped<'a>(&'a self, _lab: &'a mut Lab) -> Fut<'a, ()> {
        Box::pin(async {})
    }

    /// Add the scenario's acceptance lines (the product's acceptance criteria) for each target
    /// in `order` to a report [`report::build`] made, and the warnings about them after the
    /// report's own; the comparisons accept nothing.
    fn accept(&self, _rep: &mut LabReport, _order: &[String]) {}

    /// Add the mode's own part to the report (after its acceptance lines).
    fn report(&self, _lab: &mut Lab, _rep: &mut LabReport) {}
}

/// One generator run inside a trial.
pub(crate) struct Load {
    pub(crate) route: Option<String>,
    pub(crate) requests: Vec<RequestTemplate>,
    pub(crate) schedule: String,
}

/// Generator settings of a trial.
#[derive(Clone, Copy)]
pub(crate) struct LoadOpts {
    pub(crate) timeout: Duration,
    pub(crate) max_connections: usize,
    /// HTTP/2 and gRPC: connections opened before the run and used in turn (0: on demand).
    pub(crate) open_connections: usize,
    pub(crate) drain: Duration,
    /// Sample the target's /proc during the run (per-phase threads and RSS).
    pub(crate) sample: bool,
}

impl Default for LoadOpts {
    fn default() -> Self {
        LoadOpts {
            timeout: Duration::from_secs(2),
            max_connections: 512,
            open_connections: 0,
            drain: Duration::from_secs(2),
            sample: false,
        }
    }
}

pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    pub(crate) proc: Proc,
    pub(crate) sampler: procstat::Sampler,
    /// A fanout target's admin listener (`/__fanout/status`), when the lab chose its address.
    pub(crate) admin: Option<SocketAddr>,
    /// When the sampler started, seconds since the lab started.
    pub(crate) started_at: f64,
    /// It listens with TLS (a variant naming the lab's certificate): clients speak `https://`.
    pub(crate) tls: bool,
}

pub(crate) struct Stubs {
    pub(crate) services: Vec<(String, SocketAddr)>,
    /// The `fanout stub` process (none for a scenario without stub services).
    pub(crate) proc: Option<Proc>,
}

impl Stubs {
    pub(crate) async fn reset(&self) -> Result<(), LabError> {
        for (_, a) in &self.services {
            http::call(::http::Method::POST, *a, "/__stub/reset", None).await?;
        }
        Ok(())
    }

    /// (total requests, max overshoot p99 µs)
    pub(crate) async fn totals(&self) -> Result<(u64, Option<f64>), LabError> {
        let (mut total, mut over): (u64, Option<f64>) = (0, None);
        for (_, a) in &self.services {
            let (_, body) = http::get(*a, "/__stub/stats").await?;
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if let Some(routes) = v["routes"].as_object() {
                for r in routes.values() {
                    total += r["requests"].as_u64().unwrap_or(0);
                    if let Some(o) = r["overshoot_p99_us"].as_f64() {
                        over = Some(over.map_or(o, |x: f64| x.max(o)));
                    }
                }
            }
        }
        Ok((total, over))
    }
}

/// Durations and sizes of a run.
pub(crate) struct Plan {
    pub(crate) step_s: f64,
    pub(crate) trial_s: f64,
    pub(crate) bisect: usize,
    pub(crate) rounds: usize,
    /// Overload phases: 0.5×, ramp to 3×, 3×, 0.7× (seconds).
    pub(crate) overload: [f64; 4],
    /// Length of each slow-backend phase.
    pub(crate) slow_phase_s: f64,
    /// Length of each hedging trial.
    pub(crate) hedge_trial_s: f64,
    /// Warm-up of the JVM target (at 200 req/s).
    pub(crate) jvm_warmup_s: f64,
    /// Closed-loop cells: (warm-up, measured window), seconds.
    pub(crate) closed: (f64, f64),
    /// `hh-pools`: (trial length s, rounds, longest wait for a target's backlog to drain s).
    pub(crate) pools: (f64, usize, f64),
}

/// The lab run.
pub(crate) struct Lab {
    pub(crate) opts: LabOptions,
    pub(crate) scenario: Scenario,
    /// gRPC scenarios: the direct critical path's calls (service, request).
    pub(crate) grpc_direct: Vec<(&'static str, RequestTemplate)>,
    pub(crate) plan: Plan,
    pub(crate) t0: Instant,
    pub(crate) stubs: Stubs,
    pub(crate) targets: Vec<Target>,
    pub(crate) trials: Vec<Trial>,
    pub(crate) warnings: Vec<String>,
    /// Closed-loop cells measured (`parallel-calls`).
    pub(crate) closed_runs: Vec<report::ClosedRun>,
    /// When the warm-up ended, seconds since the lab started.
    pub(crate) warmup_end: f64,
    /// `hh-pools`: how long each trial's backend calls went on after its load ended.
    pub(crate) drains: Vec<pools::Drain>,
    /// How this scenario's mode measures and reports.
    pub(crate) kind: Arc<dyn Measure>,
    /// Targets asked for that do not run, and why (no Java, no Python venv).
    pub(crate) not_run: BTreeMap<String, String>,
    /// The Java runtime of each Java target, described.
    pub(crate) jvm: BTreeMap<String, String>,
    /// When each target's sampler started, seconds since the lab started.
    pub(crate) started_at: BTreeMap<String, f64>,
    /// Each fanout target's models status at the end (`antispam-py`: from its log).
    pub(crate) model_status: BTreeMap<String, serde_json::Value>,
    /// The models scenario's file swapper while it runs, then when each swap happened.
    pub(crate) swapper: Option<antispam::Swapper>,
    /// When each swap happened, seconds since the lab started (once the swapper finished).
    pub(crate) swaps: Option<Vec<f64>>,
    /// The closed loop's floor: the stub call measured directly.
    pub(crate) floor: Option<report::Floor>,
}

/// Replace a stub route's behaviour through the stub's admin API (`PUT /__stub/routes`); the
/// error is the call's outcome when it was not a 200.
pub(crate) async fn put_stub_route(
    addr: SocketAddr,
    body: &serde_json::Value,
) -> Result<(), String> {
    match http::call(
        ::http::Method::PUT,
        addr,
        "/__stub/routes",
        Some(body.to_string()),
    )
    .await
    {
        Ok((200, _)) => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// The order of the targets in `round`: A B, B A, A B, …
pub(crate) fn order(targets: usize, round: usize) -> Vec<usize> {
    // A B, B A, A B, … (ABBA interleaving).
    let mut v: Vec<usize> = (0..targets).collect();
    if round % 2 == 1 {
        v.reverse();
    }
    v
}

/// The error for a target whose executable was not prepared (a bug).
pub(crate) fn unreachable_target(name: &str) -> Result<(PathBuf, Vec<String>), LabError> {
    Err(LabError::Load(format!(
        "internal: target `{name}` was not prepared"
    )))
}
