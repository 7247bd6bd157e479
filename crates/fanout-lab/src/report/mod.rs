//! `report.json` (schema in docs/lab.md) and a self-contained `report.html` with SVG charts.
//!
//! This file holds the report's model (the types serialized to `report.json`) and the module's
//! public surface. The work is split by job:
//! - `analysis.rs` — trials → per-target summaries (medians, phases, recovery, routes, hedging);
//! - `closed_loop.rs` — closed-loop cells over rounds → mean ± error (JMH-like), percentiles;
//! - `max_rate.rs` — why a target has no measured capacity;
//! - `html.rs` — the HTML page, `charts.rs` — its SVG charts;
//! - `text.rs` — the text summary the CLI prints;
//! - `format.rs` — number and recovery wording shared by the renderers and the acceptance lines;
//! - `models.rs` — the `antispam-models` part (`models`), `pools.rs` the `hh-pools` part (`pools`).
//!
//! What each scenario accepts lives with the scenario (`crate::scenario`, `Mode::acceptance`);
//! the runner adds those lines to the report. Nothing here imports a scenario module: the report
//! reads the scenario's description from `crate::model`.

mod analysis;
mod charts;
mod closed_loop;
pub(crate) mod format;
mod html;
mod max_rate;
pub mod models;
pub mod pools;
#[cfg(test)]
mod tests;
mod text;

pub use analysis::build;
pub use closed_loop::{ERROR_METHOD as CLOSED_ERROR_METHOD, attach_closed_loop, t999};
pub use html::html;
pub use text::text_summary;

use crate::model::Trial;
use crate::procstat::ProcSample;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Median with min and max over trials.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default)]
pub struct Stat {
    /// Median.
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Number of trials.
    pub n: usize,
}

/// Figures at one load level (a fraction of capacity), over the interleaved trials.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Level {
    /// `level-50` / `level-80`.
    pub name: String,
    /// Offered rate, req/s.
    pub offered_rate: f64,
    /// CPU-µs per request of the target.
    pub cpu_us_per_request: Stat,
    /// p50 latency, ms.
    pub p50_ms: Stat,
    /// p99 latency, ms.
    pub p99_ms: Stat,
    /// Error rate.
    pub error_rate: Stat,
    /// Achieved 2xx rate, req/s.
    pub achieved_rate: Stat,
    /// Backend (stub) calls per inbound request.
    pub backend_calls_per_request: Stat,
    /// Whether the generator kept its schedule in every trial.
    pub all_valid: bool,
}

/// A phase of an overload run, from the run's per-second figures (requests are counted in the
/// second they ended).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    /// Phase name.
    pub name: String,
    /// Start, seconds into the run.
    pub from_s: f64,
    /// End.
    pub to_s: f64,
    /// Offered requests/s.
    pub offered_rate: f64,
    /// 2xx responses/s (goodput).
    pub ok_rate: f64,
    /// Highest per-second p99 (all answers) in the phase, ms.
    pub p99_ms_max_per_second: f64,
    /// Everything that was not a 2xx, per second (rejections, timeouts, errors).
    pub error_rate_per_s: f64,
    /// p50 of the successful (2xx) requests, ms, from the intended send time.
    pub accepted_p50_ms: f64,
    /// p99 of the successful (2xx) requests, ms.
    pub accepted_p99_ms: f64,
    /// Rejections (503/429 answers).
    pub rejected: u64,
    /// Rejections per second.
    pub rejected_rate: f64,
    /// p99 latency of the rejections, ms (0 when there were none).
    pub rejected_p99_ms: f64,
    /// Requests that got no answer within the generator's timeout (the client's deadline).
    pub timeouts: u64,
    /// Other failures: non-2xx answers other than 503/429 and network errors.
    pub errors: u64,
    /// Most threads of the target during the phase.
    pub threads_max: u64,
    /// Largest RSS of the target during the phase, MB.
    pub rss_max_mb: f64,
}

/// How an overload run recovered after the load dropped to 0.7×.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recovery {
    /// When the load dropped, seconds into the run.
    pub drop_at_s: f64,
    /// Whether success reached ≥ 99.9 % and stayed there to the end of the run.
    pub recovered: bool,
    /// Seconds from the drop to the first 1-s window (by intended send time) from which every
    /// window has success ≥ 99.9 %; `None`: not recovered.
    pub time_to_recover_s: Option<f64>,
    /// Success share (2xx ÷ offered) of each second from the drop on.
    pub success_by_second: Vec<f64>,
}

/// A route in one slow-backend phase (its own generator run).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoutePhase {
    /// `normal`, `slow`, `failing`, `restored`.
    pub name: String,
    /// Offered requests/s to this route.
    pub offered_rate: f64,
    /// p50 latency (all answers), ms.
    pub p50_ms: f64,
    /// p99 latency (all answers), ms.
    pub p99_ms: f64,
    /// Slowest answer, ms.
    pub max_ms: f64,
    /// 2xx answers ÷ offered, %.
    pub success_pct: f64,
    /// Share of the 2xx answers that carried a default (listed a step in `_partial`).
    pub default_share: f64,
    /// Every request answered, none later than the route's deadline.
    pub within_deadline: bool,
    /// Stub calls per inbound request (all routes of the phase together).
    pub backend_calls_per_request: f64,
}

/// One route of a slow-backend run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteSummary {
    /// `A`, `B`.
    pub route: String,
    /// What it calls.
    pub about: String,
    /// Its deadline, ms.
    pub deadline_ms: f64,
    /// Whether it calls the backend that is made slow / failing.
    pub uses_changed_backend: bool,
    /// Per phase, in order.
    pub phases: Vec<RoutePhase>,
}

/// Latency of a hedging comparison target over all its trials (histograms merged).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HedgingSummary {
    /// Trials merged.
    pub trials: usize,
    /// Requests measured.
    pub requests: u64,
    /// p50, ms.
    pub p50_ms: f64,
    /// p99, ms.
    pub p99_ms: f64,
    /// p99.9, ms.
    pub p999_ms: f64,
    /// Backend calls per inbound request, over the trials.
    pub backend_calls_per_request: Stat,
    /// p99 per trial.
    pub p99_ms_per_trial: Stat,
}

/// One acceptance line: one of the product's acceptance criteria (overload, slow backend,
/// hedging) checked on this run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Acceptance {
    /// Target checked.
    pub target: String,
    /// What is checked.
    pub check: String,
    /// The pass condition.
    pub criterion: String,
    /// What was measured.
    pub measured: String,
    /// Whether it held in this run.
    pub pass: bool,
}

impl Acceptance {
    /// A line for `target`: `check` measured as `measured` against `criterion`.
    pub(crate) fn new(
        target: &str,
        check: &str,
        criterion: &str,
        measured: String,
        pass: bool,
    ) -> Acceptance {
        Acceptance {
            target: target.into(),
            check: check.into(),
            criterion: criterion.into(),
            measured,
            pass,
        }
    }
}

/// Headline figures of one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetSummary {
    /// CPU-µs per request (median of the 50 % level trials, or the main run).
    pub cpu_us_per_request: f64,
    /// p50 latency, ms (same trials).
    pub p50_ms: f64,
    /// p99 latency, ms (same trials).
    pub p99_ms: f64,
    /// Error rate (same trials).
    pub error_rate: f64,
    /// Highest rate meeting the SLO found by the search, req/s.
    pub max_rate: Option<f64>,
    /// Why `max_rate` is 0 (`None` when it is a measured capacity, or there was no search):
    /// every trial was flagged (`no valid trial: all N flagged — generator behind schedule (lag
    /// p99 4.1 ms > 2 ms)`), every search step was flagged, or no valid step met the SLO.
    pub max_rate_reason: Option<String>,
    /// Peak threads over the run.
    pub threads_max: u64,
    /// Peak RSS over the run, MB.
    pub rss_max_mb: f64,
    /// Stub calls per inbound request.
    pub backend_calls_per_request: f64,
    /// p50 minus the direct critical-path p50, ms; `None` without a direct measurement or when
    /// the target made fewer backend calls per request than the direct path has (it shared calls
    /// between requests: not the same work).
    pub added_p50_ms: Option<f64>,
    /// Whether every measured trial (levels, phased runs; not search probes) had a valid generator.
    pub generator_valid: bool,
    /// Per level.
    pub levels: Vec<Level>,
    /// Per phase (overload).
    pub phases: Vec<Phase>,
    /// Recovery after the overload (overload).
    pub recovery: Option<Recovery>,
    /// Per route and phase (slow-backend).
    pub routes: Vec<RouteSummary>,
    /// Merged latency over the trials (hedging).
    pub hedging: Option<HedgingSummary>,
    /// Per route and client count, the rounds together (closed loop: `parallel-calls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cells: Vec<ClosedCell>,
}

/// One closed-loop cell of one round: a target, a route and a number of clients for the measured
/// window (`report.json` → `closed_loop.runs[]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClosedRun {
    /// Target.
    pub target: String,
    /// Route name (`sequential`, `parallel`).
    pub route: String,
    /// Closed-loop clients, each on its own connection.
    pub clients: usize,
    /// Round (0-based).
    pub round: usize,
    /// Seconds since the lab started.
    pub t_start: f64,
    /// The measured window, s (no operation starts after it).
    pub measure_s: f64,
    /// From the window's start until the last operation ended, s.
    pub elapsed_s: f64,
    /// Operations started in the window (every one ended).
    pub ops: u64,
    /// Operations that failed: a status other than 200, a connection error, a timeout or an
    /// answer without the expected `count`.
    pub errors: u64,
    /// Failures by kind.
    pub error_kinds: BTreeMap<String, u64>,
    /// The first failure.
    pub first_error: Option<String>,
    /// Operations per second (`ops` ÷ `elapsed_s`).
    pub ops_per_s: f64,
    /// Mean ms per operation.
    pub mean_ms: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Slowest operation, ms.
    pub max_ms: f64,
    /// Mean ms of the operations that ended in each 1-s iteration of the window.
    pub iterations_ms: Vec<f64>,
    /// The target's CPU time (user+sys, threads that exited included) over the window ÷ `ops`, ms.
    pub cpu_ms_per_op: f64,
    /// Requests the stub received during the window.
    pub stub_calls: u64,
    /// `stub_calls` ÷ `ops`.
    pub stub_calls_per_op: f64,
    /// The stub process's CPU time ÷ `ops`, ms.
    pub stub_cpu_ms_per_op: Option<f64>,
    /// The lab's (the clients') CPU time ÷ `ops`, ms.
    pub lab_cpu_ms_per_op: f64,
    /// Busy share of the whole machine (all cores) during the window, %.
    pub machine_busy_pct: Option<f64>,
    /// The part of `machine_busy_pct` that was not the target, the stub or the clients (other
    /// tenants of the machine, the other targets at rest), %.
    pub others_busy_pct: Option<f64>,
    /// Context switches of the target (all threads) ÷ `ops`.
    pub ctx_switches_per_op: f64,
    /// Most threads of the target during the window.
    pub threads_max: u64,
    /// Largest RSS of the target during the window, MB.
    pub rss_max_mb: f64,
    /// Every operation's latency, µs, sorted (merged over rounds for the percentiles).
    #[serde(skip)]
    pub latencies_us: Vec<u64>,
}

/// A target's cell (route × clients) over every round (`targets.<name>.cells[]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClosedCell {
    /// Route name.
    pub route: String,
    /// Closed-loop clients.
    pub clients: usize,
    /// Rounds measured.
    pub rounds: usize,
    /// Operations over the rounds.
    pub ops: u64,
    /// Failed operations over the rounds.
    pub errors: u64,
    /// Operations per second, over the rounds.
    pub ops_per_s: f64,
    /// Mean ms per operation: the mean of the iterations' means (JMH's score).
    pub mean_ms: f64,
    /// Half-width of the 99.9 % confidence interval of `mean_ms`: t(0.9995, n−1) · s / √n over
    /// the n iterations (JMH's `Error`); `None` with fewer than 2 iterations.
    pub error_ms: Option<f64>,
    /// Iterations (1-s windows with at least one operation) over the rounds.
    pub iterations: usize,
    /// Median over every operation of the rounds, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// The target's CPU ms per operation, over the rounds.
    pub cpu_ms_per_op: Stat,
    /// Stub calls ÷ operations over the rounds (100 for a target that made every call).
    pub stub_calls_per_op: f64,
    /// The stub's CPU ms per operation (median over the rounds).
    pub stub_cpu_ms_per_op: Option<f64>,
    /// The lab's CPU ms per operation (median over the rounds).
    pub lab_cpu_ms_per_op: f64,
    /// Machine busy share (median over the rounds), %.
    pub machine_busy_pct: Option<f64>,
    /// Of which other processes (median over the rounds), %.
    pub others_busy_pct: Option<f64>,
    /// Most threads of the target.
    pub threads_max: u64,
    /// Largest RSS of the target, MB.
    pub rss_max_mb: f64,
}

/// The floor the lab measures itself: one stub call at a time on one keep-alive connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Floor {
    /// `service path`.
    pub path: String,
    /// Calls measured.
    pub calls: u64,
    /// One call: mean, ms.
    pub one_call_mean_ms: f64,
    /// One call: median, ms.
    pub one_call_p50_ms: f64,
    /// One call: 99th percentile, ms.
    pub one_call_p99_ms: f64,
    /// The sequential route's floor: calls per operation × the mean call, ms.
    pub sequential_ms: f64,
    /// The parallel route's floor: one call, ms.
    pub parallel_ms: f64,
}

/// A closed-loop run (`report.json` → `closed_loop`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClosedLoopReport {
    /// Warm-up of every cell, s.
    pub warmup_s: f64,
    /// Measured window of every cell, s.
    pub measure_s: f64,
    /// Iteration length, s.
    pub iteration_s: f64,
    /// Rounds.
    pub rounds: usize,
    /// Stub calls per operation.
    pub calls_per_op: u64,
    /// How `mean_ms ± error_ms` is computed.
    pub error_method: String,
    /// The stub-call floor, measured by the lab.
    pub floor: Option<Floor>,
    /// The Java runtime each Java target ran on.
    pub jvm: BTreeMap<String, String>,
    /// Targets that were asked for (or are the default) but did not run, and why.
    pub not_run: BTreeMap<String, String>,
    /// The article's table.
    pub article: Vec<crate::model::ArticleRow>,
    /// Every cell of every round, in the order run.
    pub runs: Vec<ClosedRun>,
}

/// Calling the critical path's stubs directly.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Direct {
    /// The calls, in order.
    pub path: Vec<String>,
    /// p50, ms.
    pub p50_ms: f64,
    /// p99, ms.
    pub p99_ms: f64,
}

/// The whole report (`report.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabReport {
    /// Schema version.
    pub version: u32,
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub about: String,
    /// The command that produced it.
    pub command: String,
    /// Reduced run.
    pub quick: bool,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The latency SLO of the capacity search, ms.
    pub slo_p99_ms: f64,
    /// Direct critical-path latency.
    pub direct: Option<Direct>,
    /// Per target.
    pub targets: BTreeMap<String, TargetSummary>,
    /// Acceptance lines (overload, slow-backend, hedging), each pass/fail per target.
    pub acceptance: Vec<Acceptance>,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// /proc samples of every target over the run.
    pub timelines: BTreeMap<String, Vec<ProcSample>>,
    /// Things to know when reading the figures (generator lag, …).
    pub warnings: Vec<String>,
    /// The closed-loop run (`parallel-calls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_loop: Option<ClosedLoopReport>,
    /// The models run (`antispam-models`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<models::ModelsReport>,
    /// The pools run (`hh-pools`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<pools::PoolsReport>,
    /// Comparison runs with a hand-written baseline among the targets: every other target's CPU
    /// per request beside the baseline's, per level.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relative: Vec<Relative>,
}

/// One target's CPU per request beside the hand-written baseline's at one level of an
/// interleaved comparison, read two ways. The per-round ratios pair the two trials of the same
/// round, run minutes apart instead of across the whole run, so the machine's drift between
/// rounds (a busy neighbour, another process's burst) falls on both sides of each ratio.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Relative {
    /// The target.
    pub target: String,
    /// The baseline it is read against: the first of the scenario's hand-written baselines that
    /// ran.
    pub baseline: String,
    /// `level-50`, `level-80`, `fixed-rate`.
    pub level: String,
    /// The target's median CPU-µs per request over its trials at the level ÷ the baseline's
    /// (`None` when the baseline's is 0).
    pub ratio_of_medians: Option<f64>,
    /// Per round, the target's trial ÷ the baseline's trial of the same round: median, min,
    /// max and the rounds that had both.
    pub per_round: Stat,
}

/// Write `report.json` and `report.html` into `dir`.
pub fn write(dir: &Path, rep: &LabReport) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(rep).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), &json)?;
    std::fs::write(dir.join("report.html"), html(rep, &json))
}
