//! The lab's shared types, a leaf every other part reads: what a scenario is made of
//! ([`Scenario`], [`Mode`] and the modes' settings), one measured run ([`Trial`]), and the seed
//! article's table the `parallel-calls` report shows beside ours ([`ArticleRow`]), a run's
//! options and errors ([`LabOptions`], [`LabError`]). The scenario
//! definitions (`crate::scenario`), the runner and the report (`crate::report`) all build on
//! these; nothing here imports them.

use crate::procstat::ProcSample;
use crate::{baseline, http, java, process};
use fanout_load::{LoadReport, Protocol, RequestTemplate};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// A trial is invalid when the generator's send lag p99 exceeds this. 2 ms: on a shared 2-core
/// machine 1 ms flags trials whose latencies (≥ 10 ms here) it barely affects; the lag of every
/// trial is reported anyway.
pub const LAG_THRESHOLD: Duration = Duration::from_millis(2);

/// Generator lag (p99, ms) the overload scenario's capacity search tolerates in a step whose
/// target met the SLO (see `Lab::search_step`).
pub const OVERLOAD_SEARCH_LAG_MS: f64 = 10.0;

/// Success share a second must reach for an overload run to count as recovered.
pub const RECOVERED_SUCCESS: f64 = 0.999;

/// Options of one lab run.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Scenario name.
    pub scenario: String,
    /// Targets, in the order of the first round; empty = the scenario's default targets.
    pub targets: Vec<String>,
    /// Reduced version (< 60 s) for CI and smoke tests.
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// Rounds of interleaved trials (default 3 quick, 5 full).
    pub trials: Option<usize>,
    /// The `fanout` executable (for `serve` and `stub`).
    pub fanout_bin: PathBuf,
    /// The hand-written Rust baseline's executable (`--baseline-bin`): `hyper-aggregator` for
    /// `hyper-baseline`, `grpc-aggregator` for `grpc-baseline` (no scenario has both). `None`:
    /// the binary next to `fanout_bin`, else built with cargo in the workspace the lab was built
    /// from (see [`baseline::plan`]). Only looked at when one of those is a target.
    pub baseline_bin: Option<PathBuf>,
    /// The command line, for the report.
    pub command: String,
    /// `antispam-models`: one long run per target of this length instead of the levels.
    pub duration: Option<Duration>,
    /// `--capacity`: no capacity search; the levels (50 %, 80 %, the overload ramp) are taken
    /// from this rate, in requests per second, for every target. For a machine whose noise
    /// stops the search short (a generator that lags its schedule at low rates); the report
    /// says the capacity was given.
    pub capacity: Option<f64>,
}

/// Why a lab run failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Unknown scenario.
    #[error("unknown scenario `{0}`; available: {1}")]
    UnknownScenario(String, String),
    /// Unknown target, or one that does not serve the scenario's routes.
    #[error("target `{target}` is not available in scenario `{scenario}`; available: {available}")]
    UnknownTarget {
        /// The target asked for.
        target: String,
        /// The scenario.
        scenario: String,
        /// What would work.
        available: String,
    },
    /// The executable of a `NAME=PATH` target is missing.
    #[error("target `{target}`: there is no executable at {bin}")]
    NoBinary {
        /// The target as given.
        target: String,
        /// Its executable.
        bin: String,
    },
    /// A Rust baseline (hyper, gRPC) is missing and could not be built.
    #[error(transparent)]
    Baseline(#[from] baseline::BaselineError),
    /// The scenario could not be prepared (its `.proto` files did not compile, a message does
    /// not fit its method).
    #[error("{0}")]
    Scenario(String),
    /// The Java baseline could not be built.
    #[error(transparent)]
    Java(#[from] java::JavaError),
    /// A child process failed.
    #[error(transparent)]
    Process(#[from] process::ProcessError),
    /// The load generator failed.
    #[error("load generator: {0}")]
    Load(String),
    /// Writing the report failed.
    #[error("writing {path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A control call to a stub failed.
    #[error(transparent)]
    Http(#[from] http::HttpError),
}

/// One measured run of load against one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trial {
    /// Target name.
    pub target: String,
    /// `search`, `level-50`, `level-80`, `overload`, `slow-backend`.
    pub phase: String,
    /// Interleaving round (0-based).
    pub round: usize,
    /// Seconds since the lab started.
    pub t_start: f64,
    /// When the generator returned, seconds since the lab started.
    pub t_end: f64,
    /// The schedule (Tank syntax).
    pub schedule: String,
    /// Offered rate (requests/s; the mean over the schedule).
    pub offered_rate: f64,
    /// Completed 2xx responses per second.
    pub achieved_rate: f64,
    /// p50 latency from the intended send time, ms.
    pub p50_ms: f64,
    /// p99 latency from the intended send time, ms.
    pub p99_ms: f64,
    /// Errors and non-2xx over offered.
    pub error_rate: f64,
    /// The target's CPU time (user+sys) during the trial divided by completed requests, µs.
    pub cpu_us_per_request: f64,
    /// The generator's (this process's) CPU time per request, µs.
    pub generator_cpu_us_per_request: f64,
    /// Stub requests during the trial divided by completed inbound requests.
    pub backend_calls_per_request: f64,
    /// Stub sleep overshoot p99 (µs), max over routes, if the stub reports it.
    pub stub_overshoot_p99_us: Option<f64>,
    /// Context switches of the target (all threads) during the trial per completed request.
    pub ctx_switches_per_request: f64,
    /// Threads of the target at the end of the trial.
    pub threads: u64,
    /// RSS of the target at the end of the trial, MB.
    pub rss_mb: f64,
    /// Whether the generator kept to its schedule.
    pub valid: bool,
    /// Why not.
    pub invalid_reason: Option<String>,
    /// Whether this trial met the SLO (search phase).
    pub passed_slo: bool,
    /// Generator lag p99, ms.
    pub lag_p99_ms: f64,
    /// Which of the scenario's routes the load went to (slow-backend; `None` = all requests).
    pub route: Option<String>,
    /// The scenario phase the trial ran in (slow-backend: normal, slow, failing, restored).
    pub stage: Option<String>,
    /// Phases of a continuous run (overload), seconds into the schedule.
    pub phase_bounds: Vec<PhaseBound>,
    /// `/proc` samples of the target during the trial (overload; `t` = seconds into the run).
    #[serde(skip)]
    pub samples: Vec<ProcSample>,
    /// The generator's full report.
    pub load: LoadReport,
}

/// A named part `[from_s, to_s)` of a continuous run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseBound {
    /// `0.5x`, `ramp to 3x`, `3x`, `0.7x`.
    pub name: String,
    /// Start, seconds into the schedule.
    pub from_s: f64,
    /// End.
    pub to_s: f64,
}

/// What a scenario measures.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Capacity search per target, then interleaved fixed-rate trials at fractions of capacity.
    Compare,
    /// [`Mode::Compare`], plus an interleaved trial per target and round at a fixed offered
    /// `rate` (phase `fixed-rate`) before the two levels (`--quick`: at most the 80 % level).
    CompareAt {
        /// Offered rate, req/s.
        rate: f64,
    },
    /// Capacity search, then one continuous run per target: 0.5× of its capacity, a ramp to 3×,
    /// 3×, then `tail`× — goodput, rejections, accepted latency per phase and time to recover.
    Overload {
        /// The rate of the last phase, as a fraction of capacity (0.7 for `overload`, 0.5 for
        /// `pool-overload`: back to where it started).
        tail: f64,
        /// Seconds after the drop within which full service must be back (acceptance).
        recover_s: f64,
    },
    /// Capacity search, then fixed rate (half of capacity) over several routes at once while one
    /// stub route is normal, `factor`× slower, failing (503), normal again.
    SlowBackend(SlowBackend),
    /// No capacity search: interleaved fixed-rate trials (ABBA) of every target at `rate`;
    /// reports p50/p99/p99.9 and backend calls per request.
    Hedging {
        /// Offered rate, req/s.
        rate: f64,
    },
    /// No capacity search, no open-model load: `clients` closed-loop clients per cell (each sends
    /// its next request when the previous answer arrived, on its own keep-alive connection), for
    /// every route × client count × target, interleaved (ABBA across targets) over rounds; mean
    /// ms per operation ± error, percentiles, CPU per operation, threads, RSS.
    ClosedLoop(ClosedLoop),
    /// Models swapped while they serve (`antispam-models`): a capacity search per target (the
    /// SLO is p99 < 10 ms), then interleaved fixed-rate trials at the baseline's capacity and at
    /// half and all of fanout's; a model file replaced every `swap_every_s` the whole time;
    /// `connections` client connections opened before every trial (see `crate::antispam`).
    Models(Models),
    /// One fixed rate for every target (`hh-pools`), no capacity search: interleaved trials
    /// (ABBA) of every target with the stub route healthy, then `factor`× slower; /proc sampled
    /// during each trial (threads and RSS at their peak), and after each trial the lab waits
    /// until the target's backend calls stop (a queue left behind drains before the next trial).
    Pools(Pools),
}

/// The `hh-pools` mode (see [`Mode::Pools`]).
#[derive(Debug, Clone, Copy)]
pub struct Pools {
    /// Stub service that becomes slower.
    pub service: &'static str,
    /// Route key at that stub (`GET /vacancies/{id}`).
    pub route: &'static str,
    /// Its normal latency, ms.
    pub base_ms: f64,
    /// Slowdown factor of the `slow` phase.
    pub factor: f64,
    /// Offered rate of every trial, req/s.
    pub rate: f64,
}

/// The `antispam-models` mode (see [`Mode::Models`]).
#[derive(Debug, Clone, Copy)]
pub struct Models {
    /// Seconds between two replacements of the swapped model's file.
    pub swap_every_s: f64,
    /// The same with `--quick` (a short run still sees swaps).
    pub quick_swap_every_s: f64,
    /// Client connections (gRPC), opened before every trial and used in turn.
    pub connections: usize,
}

/// The closed-loop mode (`parallel-calls`): the routes driven and how many clients drive them.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    /// (name, path) of each route, `GET`.
    pub routes: &'static [(&'static str, &'static str)],
    /// Client counts, one cell each.
    pub clients: &'static [usize],
    /// Stub calls every operation makes; an answer is correct when its `count` is this.
    pub calls_per_op: u64,
    /// The stub service the calls go to.
    pub service: &'static str,
    /// One call's path at that service, for the floor the lab measures directly.
    pub call_path: &'static str,
}

/// The `slow-backend` mode: which stub route changes, and the routes measured separately.
#[derive(Debug, Clone)]
pub struct SlowBackend {
    /// Stub service that changes.
    pub service: &'static str,
    /// Route key at that stub (`GET /reviews/{id}`).
    pub route: &'static str,
    /// Its normal latency, ms.
    pub base_ms: f64,
    /// Slowdown factor of the `slow` phase.
    pub factor: f64,
    /// The gateway routes, each driven by its own generator at the same time.
    pub routes: Vec<RouteLoad>,
}

/// One gateway route under load, measured on its own.
#[derive(Debug, Clone)]
pub struct RouteLoad {
    /// Short name (`A`, `B`).
    pub name: &'static str,
    /// What it calls.
    pub about: &'static str,
    /// Requests sent (round robin).
    pub requests: Vec<RequestTemplate>,
    /// The route's deadline, ms.
    pub deadline_ms: f64,
    /// Whether the route calls the stub route that changes.
    pub uses_changed: bool,
}

/// A scenario: stubs, the gateway config, the requests and what to measure.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name on the command line.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// `fanout stub` config (addresses as `${NAME_ADDR}`).
    pub stubs: &'static str,
    /// `fanout serve` config.
    pub gateway: &'static str,
    /// Requests sent (round robin).
    pub requests: Vec<RequestTemplate>,
    /// What to measure.
    pub mode: Mode,
    /// Latency SLO used by the capacity search (p99, ms).
    pub slo_p99_ms: f64,
    /// The stub calls on the flow's critical path, for the "direct" baseline: (service, path).
    pub critical_path: Vec<(&'static str, &'static str)>,
    /// Extra targets: other `fanout serve` configs of the same flow, by name.
    pub variants: Vec<(&'static str, String)>,
    /// The hand-written baselines that serve this scenario's routes: `hyper-baseline` and
    /// `java-threads` implement the examples' two flows (and `java-threads` `pool-overload`'s),
    /// `grpc-baseline` the `grpc-aggregate` flow, `pg-baseline` `pg-one-query`'s; none serve the
    /// others.
    pub baselines: &'static [&'static str],
    /// Targets when none are given.
    pub default_targets: &'static [&'static str],
    /// A gRPC scenario: its requests are unary gRPC calls (`requests` is empty until
    /// [`Scenario::prepare`] builds them from the `.proto` files), sent over h2c.
    pub grpc: Option<Grpc>,
    /// A scenario with a database: the lab starts a PostgreSQL cluster, runs `schema` in it and
    /// gives the targets `DB_URL` and `DB_JDBC_URL`.
    pub database: Option<Database>,
}

/// A scenario's database (see [`Scenario::database`]).
#[derive(Debug, Clone, Copy)]
pub struct Database {
    /// SQL run once in database `postgres` before the targets start: tables and their data.
    pub schema: &'static str,
}

/// What a gRPC scenario needs besides its configs.
#[derive(Debug, Clone)]
pub struct Grpc {
    /// `.proto` files written next to the configs (their `protos: {files: [...]}` name them
    /// relative to the config's directory): (file name, text).
    pub protos: &'static [(&'static str, &'static str)],
    /// The method every request calls, `package.Service/Method`.
    pub method: &'static str,
    /// The request messages as JSON (proto3 JSON mapping), sent round robin.
    pub messages: Vec<String>,
    /// The stub calls on the flow's critical path for the direct baseline, made one after the
    /// other over h2c: (service, `package.Service/Method`, JSON message).
    pub critical_path: Vec<(&'static str, &'static str, &'static str)>,
}

/// Variants that make exactly the backend calls the example's config makes (they change what
/// each request costs, not what it asks for): a scenario with only these still gets the
/// "unequal work" check. Others (coalescing, hedging, merging) differ in work by design.
pub const EQUAL_WORK_VARIANTS: &[&str] = &[
    "fanout-nometrics",
    "fanout-auth",
    "fanout-tls",
    "fanout-schema",
    "fanout-gzip",
    "fanout-br",
    PER_CORE,
    WORK_STEALING,
];

/// A target every scenario has: its `fanout` config with `server.runtime: per_core` (one
/// single-threaded runtime per core, the default), the same work as `fanout`.
pub const PER_CORE: &str = "fanout-percore";

/// A target every scenario has: its `fanout` config with `server.runtime: work_stealing` (one
/// multi-threaded runtime whose workers take each other's tasks), the same work as `fanout`.
pub const WORK_STEALING: &str = "fanout-ws";

impl Scenario {
    /// Whether every target of the scenario is meant to do the same backend work per request:
    /// no variant, or only [`EQUAL_WORK_VARIANTS`].
    pub fn equal_work(&self) -> bool {
        self.variants
            .iter()
            .all(|(n, _)| EQUAL_WORK_VARIANTS.contains(n))
    }

    /// How the load generator talks to the targets: gRPC (h2c) for a gRPC scenario, else
    /// HTTP/1.1.
    pub fn protocol(&self) -> Protocol {
        if self.grpc.is_some() {
            Protocol::Grpc
        } else {
            Protocol::Http1
        }
    }

    /// The files besides the configs a run writes into its directory: (file name, text).
    pub fn files(&self) -> Vec<(&'static str, &'static str)> {
        self.grpc
            .as_ref()
            .map(|g| g.protos.to_vec())
            .unwrap_or_default()
    }
}

/// The phases, in order: (name, the vacancy route's latency in ms).
pub fn pools_phases(p: &Pools) -> [(&'static str, f64); 2] {
    [("healthy", p.base_ms), ("slow", p.base_ms * p.factor)]
}

/// One row of the article's table (avg ms per operation ± JMH's error, 99.9 % CI).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ArticleRow {
    /// CPU cores of the article's machine.
    pub cores: usize,
    /// Concurrent JMH threads (closed-loop clients).
    pub clients: usize,
    /// Sequential, sync (blocking): (mean, error) ms.
    pub sequential_sync: (f64, f64),
    /// Sequential, async (coroutines).
    pub sequential_async: (f64, f64),
    /// Parallel, sync (the 100 blocking calls on a pool sized by the CPU count).
    pub parallel_sync: (f64, f64),
    /// Parallel, async (coroutines).
    pub parallel_async: (f64, f64),
}

impl ArticleRow {
    /// (sync, async) figures of `route` (`sequential` or `parallel`).
    pub fn of(&self, route: &str) -> ((f64, f64), (f64, f64)) {
        if route == "sequential" {
            (self.sequential_sync, self.sequential_async)
        } else {
            (self.parallel_sync, self.parallel_async)
        }
    }
}

/// The article's table (seed 002, lines ~108–125), as published.
pub const ARTICLE: [ArticleRow; 6] = [
    row(
        1,
        1,
        [(160.3, 1.8), (154.1, 1.0), (163.9, 2.4), (10.7, 0.3)],
    ),
    row(2, 1, [(159.3, 1.0), (156.3, 0.7), (57.6, 0.5), (15.4, 0.2)]),
    row(4, 1, [(159.0, 1.1), (157.4, 1.3), (25.7, 0.2), (14.8, 0.3)]),
    row(
        1,
        6,
        [(146.8, 2.5), (146.3, 2.5), (984.8, 34.2), (79.3, 3.7)],
    ),
    row(
        2,
        6,
        [(151.3, 1.6), (143.8, 1.9), (343.9, 17.2), (86.7, 3.7)],
    ),
    row(
        4,
        6,
        [(152.3, 1.5), (144.7, 1.2), (135.0, 3.0), (81.7, 4.8)],
    ),
];

const fn row(cores: usize, clients: usize, v: [(f64, f64); 4]) -> ArticleRow {
    ArticleRow {
        cores,
        clients,
        sequential_sync: v[0],
        sequential_async: v[1],
        parallel_sync: v[2],
        parallel_async: v[3],
    }
}

/// The article's row to put beside ours: the same core count when the article has it (1, 2, 4),
/// else its 2-core row; `false` when the cores differ from `cpus`.
pub fn article_row(cpus: usize, clients: usize) -> Option<(ArticleRow, bool)> {
    let same = ARTICLE
        .iter()
        .find(|r| r.cores == cpus && r.clients == clients);
    match same {
        Some(r) => Some((*r, true)),
        None => ARTICLE
            .iter()
            .find(|r| r.cores == 2 && r.clients == clients)
            .map(|r| (*r, false)),
    }
}

/// `GET {path}?id=N` for 64 different ids from `first`, so concurrent requests rarely make
/// identical calls (fanout's in-flight dedup would merge those).
pub(crate) fn id_requests(path: &str, first: u32) -> Vec<RequestTemplate> {
    (first..first + 64)
        .map(|i| RequestTemplate::get(format!("{path}?id={i}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_article_row_matches_the_cores_or_falls_back_to_two() {
        let (r, same) = article_row(2, 6).unwrap_or_else(|| panic!("2 cores, 6 clients"));
        assert!(same);
        assert_eq!(r.of("parallel").0, (343.9, 17.2));
        assert_eq!(r.of("sequential").1, (143.8, 1.9));
        let (r, same) = article_row(1, 1).unwrap_or_else(|| panic!("1 core"));
        assert!(same);
        assert_eq!(r.of("parallel").1, (10.7, 0.3));
        let (r, same) = article_row(8, 1).unwrap_or_else(|| panic!("8 cores"));
        assert!(!same, "the article has no 8-core row");
        assert_eq!(r.cores, 2);
        assert!(article_row(2, 3).is_none());
    }
}
