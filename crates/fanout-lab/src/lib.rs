//! fanout's load lab: `fanout lab SCENARIO` starts the stubs and every system under test as child
//! processes, drives open-model load from this process (`fanout-load`), samples each target's
//! CPU time, RSS and threads from `/proc`, and writes `report.json` and a self-contained
//! `report.html`. Targets are compared **interleaved** (A B B A …) over several trials, and
//! reported as medians with min–max.

pub mod antispam;
pub mod baseline;
pub mod closed_loop;
pub mod hop;
pub mod http;
pub mod java;
pub mod pools;
pub mod postgres;
pub mod process;
pub mod procstat;
pub mod report;
pub mod scenario;
pub mod seeds;
pub mod svg;
pub mod threads;

use fanout_load::{LoadReport, LoadSpec, RequestTemplate, Schedule};
use fanout_stub::addr_var;
use process::{Proc, free_addr};
use procstat::ProcSample;
use scenario::{Mode, Scenario};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

/// The environment variable through which `fanout lab` (the launcher in the gateway binary)
/// names the `fanout` executable the lab runs as system under test, stub and load generator.
pub const FANOUT_BIN_ENV: &str = "FANOUT_LAB_FANOUT_BIN";

/// The environment variable through which `fanout lab` passes the command line the user typed,
/// for the report's `command` field.
pub const COMMAND_ENV: &str = "FANOUT_LAB_COMMAND";

/// A trial is invalid when the generator's send lag p99 exceeds this. 2 ms: on a shared 2-core
/// machine 1 ms flags trials whose latencies (≥ 10 ms here) it barely affects; the lag of every
/// trial is reported anyway.
pub const LAG_THRESHOLD: Duration = Duration::from_millis(2);

/// Target names the lab knows (besides a scenario's variants). A scenario lists the baselines
/// that serve its routes in `Scenario::baselines`.
pub const TARGETS: [&str; 8] = [
    "fanout",
    "antispam-py",
    "hyper-baseline",
    "java-threads",
    "grpc-baseline",
    "pg-baseline",
    "java-blocking",
    "java-virtual",
];

/// The targets that run the Java baseline (`bench/baselines/java-threads`), each in its own
/// style: `java-threads` (200 request threads, parallel calls on a 200-thread pool),
/// `java-blocking` (parallel calls on a pool of as many threads as cores: the Kotlin article's
/// sync version), `java-virtual` (virtual threads, Java 21+).
pub const JAVA_TARGETS: [&str; 3] = ["java-threads", "java-blocking", "java-virtual"];

/// Whether `target` runs the Java baseline: one of [`JAVA_TARGETS`] or a `java-threads-N` pool
/// target ([`java::pool_size`]).
pub fn is_java_target(target: &str) -> bool {
    JAVA_TARGETS.contains(&target) || java::pool_size(target).is_some()
}

/// Whether `target` may run in scenario `s`: a `java-threads-N` target wherever `java-threads`
/// serves the routes.
pub(crate) fn pool_target_available(s: &Scenario, target: &str) -> bool {
    java::pool_size(target).is_some() && s.baselines.contains(&"java-threads")
}

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
    #[error("unknown scenario `{0}`; available: {list}, {own}", list = scenario::NAMES.join(", "), own = scenario::OWN_ENTRY.join(", "))]
    UnknownScenario(String),
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
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
pub struct PhaseBound {
    /// `0.5x`, `ramp to 3x`, `3x`, `0.7x`.
    pub name: String,
    /// Start, seconds into the schedule.
    pub from_s: f64,
    /// End.
    pub to_s: f64,
}

/// One generator run inside a trial.
struct Load {
    route: Option<String>,
    requests: Vec<RequestTemplate>,
    schedule: String,
}

/// Generator settings of a trial.
#[derive(Clone, Copy)]
struct LoadOpts {
    timeout: Duration,
    max_connections: usize,
    /// HTTP/2 and gRPC: connections opened before the run and used in turn (0: on demand).
    open_connections: usize,
    drain: Duration,
    /// Sample the target's /proc during the run (per-phase threads and RSS).
    sample: bool,
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

struct Target {
    name: String,
    addr: SocketAddr,
    proc: Proc,
    sampler: procstat::Sampler,
    /// A fanout target's admin listener (`/__fanout/status`), when the lab chose its address.
    admin: Option<SocketAddr>,
    /// When the sampler started, seconds since the lab started.
    started_at: f64,
}

struct Stubs {
    services: Vec<(String, SocketAddr)>,
    /// The `fanout stub` process (none for a scenario without stub services).
    proc: Option<Proc>,
}

impl Stubs {
    async fn reset(&self) -> Result<(), LabError> {
        for (_, a) in &self.services {
            http::call(::http::Method::POST, *a, "/__stub/reset", None).await?;
        }
        Ok(())
    }

    /// (total requests, max overshoot p99 µs)
    async fn totals(&self) -> Result<(u64, Option<f64>), LabError> {
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
struct Plan {
    step_s: f64,
    trial_s: f64,
    bisect: usize,
    rounds: usize,
    /// Overload phases: 0.5×, ramp to 3×, 3×, 0.7× (seconds).
    overload: [f64; 4],
    /// Length of each slow-backend phase.
    slow_phase_s: f64,
    /// Length of each hedging trial.
    hedge_trial_s: f64,
    /// Warm-up of the JVM target (at 200 req/s).
    jvm_warmup_s: f64,
    /// Closed-loop cells: (warm-up, measured window), seconds.
    closed: (f64, f64),
    /// `hh-pools`: (trial length s, rounds, longest wait for a target's backlog to drain s).
    pools: (f64, usize, f64),
}

/// The lab run.
struct Lab {
    opts: LabOptions,
    scenario: Scenario,
    /// gRPC scenarios: the direct critical path's calls (service, request).
    grpc_direct: Vec<(&'static str, RequestTemplate)>,
    plan: Plan,
    t0: Instant,
    stubs: Stubs,
    targets: Vec<Target>,
    trials: Vec<Trial>,
    warnings: Vec<String>,
    /// Closed-loop cells measured (`parallel-calls`).
    closed_runs: Vec<report::ClosedRun>,
    /// When the warm-up ended, seconds since the lab started.
    warmup_end: f64,
    /// `hh-pools`: how long each trial's backend calls went on after its load ended.
    drains: Vec<pools::Drain>,
}

/// Run the lab and write `report.json` and `report.html` into `opts.out`.
pub async fn run(mut opts: LabOptions) -> Result<report::LabReport, LabError> {
    let mut scenario = scenario::builtin(&opts.scenario)
        .ok_or_else(|| LabError::UnknownScenario(opts.scenario.clone()))?;
    if opts.targets.is_empty() {
        opts.targets = scenario
            .default_targets
            .iter()
            .map(|t| t.to_string())
            .collect();
    }
    let available = available_targets(&scenario);
    for t in &opts.targets {
        if let Some((_, bin)) = external_fanout(t) {
            if !std::path::Path::new(bin).exists() {
                return Err(LabError::NoBinary {
                    target: t.clone(),
                    bin: bin.to_string(),
                });
            }
            continue;
        }
        if !available.contains(t) && !pool_target_available(&scenario, t) {
            return Err(LabError::UnknownTarget {
                target: t.clone(),
                scenario: scenario.name.into(),
                available: format!(
                    "{}{}",
                    available.join(", "),
                    if scenario.baselines.contains(&"java-threads") {
                        ", java-threads-N (pools of N threads)"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    // Find (or build) what the targets need before anything starts: a failed build should not
    // cost a started lab. A target that needs nothing built triggers nothing.
    let hyper_bin = rust_baseline(&opts, "hyper-baseline", baseline::HYPER).await?;
    let grpc_bin = rust_baseline(&opts, "grpc-baseline", baseline::GRPC).await?;
    let pg_bin = rust_baseline(&opts, "pg-baseline", baseline::PG).await?;
    let io = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |source| LabError::Io { path, source }
    };
    std::fs::create_dir_all(&opts.out).map_err(io(&opts.out))?;
    let plan = if opts.quick {
        Plan {
            step_s: 1.0,
            trial_s: 1.5,
            bisect: 2,
            rounds: opts.trials.unwrap_or(3),
            overload: [2.0, 1.0, 3.0, 3.0],
            slow_phase_s: 3.0,
            hedge_trial_s: 3.0,
            jvm_warmup_s: 4.0,
            closed: (0.5, 1.5),
            pools: (2.5, opts.trials.unwrap_or(1), 5.0),
        }
    } else {
        Plan {
            step_s: 3.0,
            trial_s: 5.0,
            bisect: 4,
            rounds: opts.trials.unwrap_or(5),
            overload: [10.0, 10.0, 20.0, 20.0],
            slow_phase_s: 15.0,
            hedge_trial_s: 15.0,
            jvm_warmup_s: 20.0,
            closed: (3.0, 10.0),
            pools: (10.0, opts.trials.unwrap_or(3), 60.0),
        }
    };
    // `java-virtual` needs a Java runtime with virtual threads (21+); without one it does not
    // run, and the report says why — it never fails the run. `java-blocking` runs on the same
    // runtime when there is one (the two then differ only in their threads), else on `java`.
    let mut not_run = BTreeMap::new();
    let mut jvm = BTreeMap::new();
    // `java-threads-N` targets need `javac` and `java`; without them they do not run, and the
    // report says why (`not run: no java …`) — never a failed run.
    if opts.targets.iter().any(|t| java::pool_size(t).is_some()) {
        let missing = tokio::task::spawn_blocking(|| {
            if java::javac_version().is_none() {
                Some(
                    "no java: no javac (a JDK ≥ 17; Debian: apt-get install default-jdk-headless)"
                        .to_string(),
                )
            } else {
                let bin = java::java_bin();
                java::java_version(&bin)
                    .is_none()
                    .then(|| format!("no java: `{}` does not run", bin.display()))
            }
        })
        .await
        .map_err(|e| LabError::Load(format!("looking for Java: {e}")))?;
        if let Some(why) = missing {
            for t in opts.targets.iter().filter(|t| java::pool_size(t).is_some()) {
                tracing::warn!("{t} will not run: {why}");
                not_run.insert(t.clone(), why.clone());
            }
            opts.targets.retain(|t| java::pool_size(t).is_none());
        }
    }
    let jdk21 = if opts
        .targets
        .iter()
        .any(|t| t == "java-virtual" || t == "java-blocking")
    {
        let found = tokio::task::spawn_blocking(|| {
            java::find_jdk(&java::JdkSearch::from_env(), java::VIRTUAL_THREADS)
        })
        .await
        .map_err(|e| LabError::Load(format!("looking for a JDK: {e}")))?;
        match found {
            Ok(j) => Some(j),
            Err(why) => {
                if opts.targets.iter().any(|t| t == "java-virtual") {
                    tracing::warn!("java-virtual will not run: {why}");
                    not_run.insert("java-virtual".to_string(), why);
                    opts.targets.retain(|t| t != "java-virtual");
                }
                None
            }
        }
    } else {
        None
    };
    for t in &opts.targets {
        let described = match (t.as_str(), &jdk21) {
            ("java-virtual" | "java-blocking", Some(j)) => j.describe(),
            (n, _)
                if n == "java-threads" || n == "java-blocking" || java::pool_size(n).is_some() =>
            {
                let bin = java::java_bin();
                let b = bin.clone();
                tokio::task::spawn_blocking(move || java::java_version(&b))
                    .await
                    .ok()
                    .flatten()
                    .map_or_else(
                        || format!("unknown ({})", bin.display()),
                        |(_, v)| format!("{v} ({})", bin.display()),
                    )
            }
            _ => continue,
        };
        jvm.insert(t.clone(), described);
    }
    // Build the Java baseline first: a compile error should not cost a started lab. `javac`
    // runs on the blocking pool, not on a runtime worker.
    let java_classes = if opts.targets.iter().any(|t| is_java_target(t)) {
        let dir = java::build_dir(&opts.fanout_bin, &opts.out);
        let built =
            tokio::task::spawn_blocking(move || java::ensure_built(&java::source_dir(), &dir))
                .await
                .map_err(|e| LabError::Load(format!("building the Java baseline: {e}")))?;
        Some(built?)
    } else {
        None
    };

    // The scenario's other files (a gRPC scenario's `.proto`) go next to the configs, which name
    // them relative to their own directory; a gRPC scenario's requests are built from them.
    scenario.write_files(&opts.out).map_err(io(&opts.out))?;
    let grpc_direct = scenario.prepare(&opts.out).map_err(LabError::Scenario)?;
    // A models scenario: its models next to the configs (both targets read the same directory),
    // and the Python baseline's venv and stubs — without them it does not run, and the report
    // says why (never a failed run).
    let models_dir = opts.out.join("models");
    let mut python = None;
    if let Mode::Models(_) = scenario.mode {
        // (`write_files` wrote the models.)
        if opts.targets.iter().any(|t| t == "antispam-py") {
            let proto = opts.out.join(scenario::ANTISPAM_PROTO.0);
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
                Ok(p) => python = Some(p),
                Err(why) => {
                    tracing::warn!("antispam-py will not run: {why}");
                    not_run.insert("antispam-py".to_string(), why);
                    opts.targets.retain(|t| t != "antispam-py");
                }
            }
        }
    }

    // Addresses for the stub services and the targets, published as NAME_ADDR like the examples.
    let names: Vec<String> = if scenario.stubs.trim().is_empty() {
        Vec::new()
    } else {
        let any = |n: &str| n.ends_with("_ADDR").then(|| "127.0.0.1:0".to_string());
        fanout_stub::load_in("stubs.yaml", scenario.stubs, &any, Some(&opts.out))
            .map_err(|e| LabError::Load(e.to_string()))?
            .services()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    };
    let mut env = HashMap::new();
    let mut services = Vec::new();
    for n in &names {
        let a = free_addr().map_err(io(&opts.out))?;
        env.insert(addr_var(n), a.to_string());
        services.push((n.clone(), a));
    }
    // A scenario with a database gets a PostgreSQL cluster of its own, with its schema and data,
    // published to the targets as DB_URL (postgres://) and DB_JDBC_URL (jdbc:postgresql://).
    let database = match scenario.database {
        Some(db) => Some(start_database(db).await?),
        None => None,
    };
    if let Some(pg) = &database {
        env.insert("DB_URL".to_string(), pg.url("postgres"));
        env.insert(
            "DB_JDBC_URL".to_string(),
            format!("jdbc:postgresql://{}/postgres?user=postgres", pg.addr()),
        );
    }
    let stubs_file = opts.out.join("stubs.yaml");
    let gw_file = opts.out.join("fanout.yaml");
    std::fs::write(&stubs_file, scenario.stubs).map_err(io(&stubs_file))?;
    std::fs::write(
        &gw_file,
        equal_work(scenario.gateway, !scenario.baselines.is_empty()),
    )
    .map_err(io(&gw_file))?;

    let stub_proc = if services.is_empty() {
        None
    } else {
        let mut p = Proc::spawn(
            "stubs",
            &opts.fanout_bin,
            &[
                "stub".into(),
                "--config".into(),
                stubs_file.display().to_string(),
            ],
            &env,
            &opts.out.join("stubs.log"),
        )?;
        for (_, a) in &services {
            p.wait_ready(*a, "/__stub/stats", Duration::from_secs(15))
                .await?;
        }
        Some(p)
    };
    let stubs = Stubs {
        services,
        proc: stub_proc,
    };

    let t0 = Instant::now();
    let mut targets = Vec::new();
    let probe = scenario
        .requests
        .first()
        .map(|r| r.path.clone())
        .unwrap_or_else(|| "/".into());
    for name in &opts.targets {
        let addr = free_addr().map_err(io(&opts.out))?;
        let mut admin = None;
        let variant = lab_variant(&scenario, name);
        if let Some(yaml) = &variant {
            let f = opts.out.join(format!("{name}.yaml"));
            std::fs::write(&f, yaml).map_err(io(&f))?;
        }
        let (bin, args) = match name.as_str() {
            _ if variant.is_some() => {
                // Targets run side by side: each admin listener on a port of its own (read for
                // `NAME.status.json` at the end).
                let a = free_addr().map_err(io(&opts.out))?;
                admin = Some(a);
                (
                    opts.fanout_bin.clone(),
                    vec![
                        "serve".into(),
                        "--config".into(),
                        opts.out.join(format!("{name}.yaml")).display().to_string(),
                        "--listen".into(),
                        addr.to_string(),
                        "--admin-listen".into(),
                        a.to_string(),
                    ],
                )
            }
            "java-threads" => match &java_classes {
                Some(classes) => (java::java_bin(), java::args(classes, addr)),
                None => unreachable_target(name)?,
            },
            // Both pools of N threads (`hh-pools`).
            n if java::pool_size(n).is_some() => match (&java_classes, java::pool_size(n)) {
                (Some(classes), Some(size)) => {
                    let mut a = java::args(classes, addr);
                    a.extend(java::pool_args(size));
                    (java::java_bin(), a)
                }
                _ => unreachable_target(name)?,
            },
            // The article's sync version: parallel calls on a pool of as many threads as cores.
            "java-blocking" => match &java_classes {
                Some(classes) => {
                    let mut a = java::args(classes, addr);
                    a.extend(["--call-threads".into(), "cpus".into()]);
                    let bin = jdk21
                        .as_ref()
                        .map_or_else(java::java_bin, |j| j.java.clone());
                    (bin, a)
                }
                None => unreachable_target(name)?,
            },
            // Request threads and parallel calls on virtual threads.
            "java-virtual" => match (&java_classes, &jdk21) {
                (Some(classes), Some(j)) => {
                    let mut a = java::args(classes, addr);
                    a.push("--virtual".into());
                    (j.java.clone(), a)
                }
                _ => unreachable_target(name)?,
            },
            "hyper-baseline" => match &hyper_bin {
                Some(b) => (b.clone(), vec!["--listen".into(), addr.to_string()]),
                None => unreachable_target(name)?,
            },
            // Its backends come from USERS_ADDR, ORDERS_ADDR, RECS_ADDR (in `env`, like every
            // stub service's address). It also answers HTTP/1.1, so the probe below works.
            "grpc-baseline" => match &grpc_bin {
                Some(b) => (b.clone(), vec!["--listen".into(), addr.to_string()]),
                None => unreachable_target(name)?,
            },
            // Its database comes from DB_URL (in `env`), like fanout's.
            "pg-baseline" => match &pg_bin {
                Some(b) => (b.clone(), vec!["--listen".into(), addr.to_string()]),
                None => unreachable_target(name)?,
            },
            // The Python baseline of antispam-models: its venv's python, the server written into
            // the run directory, the models directory fanout reads too.
            "antispam-py" => match &python {
                Some((py, server, stubs)) => (
                    py.clone(),
                    vec![
                        server.display().to_string(),
                        "--listen".into(),
                        addr.to_string(),
                        "--models".into(),
                        models_dir.display().to_string(),
                        "--stubs".into(),
                        stubs.display().to_string(),
                        "--workers".into(),
                        antispam::PY_WORKERS.to_string(),
                    ],
                ),
                None => unreachable_target(name)?,
            },
            // `fanout`, or another fanout build given as `NAME=PATH` (which may predate
            // `--admin-listen`: it gets only the flags every build knows).
            n => {
                let mut args: Vec<String> = vec![
                    "serve".into(),
                    "--config".into(),
                    gw_file.display().to_string(),
                    "--listen".into(),
                    addr.to_string(),
                ];
                match external_fanout(n) {
                    Some((_, b)) => (PathBuf::from(b), args),
                    None => {
                        // The lab reads the status from the admin listener at the end (a
                        // models run: the models'; every run: `NAME.status.json`).
                        let a = free_addr().map_err(io(&opts.out))?;
                        admin = Some(a);
                        args.extend(["--admin-listen".into(), a.to_string()]);
                        (opts.fanout_bin.clone(), args)
                    }
                }
            }
        };
        let mut p = Proc::spawn(
            name,
            &bin,
            &args,
            &env,
            // `NAME=PATH` targets log to NAME.log.
            &opts.out.join(format!(
                "{}.log",
                external_fanout(name).map_or(name.as_str(), |(n, _)| n)
            )),
        )?;
        if name == "antispam-py" {
            // A grpcio server answers no HTTP/1.1 probe; it listens once its models are loaded.
            p.wait_listening(addr, Duration::from_secs(60)).await?;
        } else {
            // A `java-threads-N` target starts its 2 × N pool threads before it listens
            // (`--prestart`): 8 192 threads for N = 4 096 take well over 15 s on a loaded
            // 2-core machine.
            let within = if java::pool_size(name).is_some() {
                Duration::from_secs(120)
            } else {
                Duration::from_secs(15)
            };
            p.wait_ready(addr, &probe, within).await?;
        }
        let pid = p.pid().unwrap_or(0);
        targets.push(Target {
            name: name.clone(),
            addr,
            proc: p,
            // A pools run's JVMs have thousands of threads: sample them without the per-thread
            // files, or the lab (which runs the generator) spends its time reading /proc.
            sampler: if matches!(scenario.mode, Mode::Pools(_)) {
                procstat::Sampler::start_light(pid, Duration::from_millis(200))
            } else {
                procstat::Sampler::start(pid, Duration::from_millis(200))
            },
            admin,
            started_at: t0.elapsed().as_secs_f64(),
        });
    }

    let mut lab = Lab {
        opts: opts.clone(),
        scenario,
        grpc_direct,
        plan,
        t0,
        stubs,
        targets,
        trials: Vec::new(),
        warnings: Vec::new(),
        closed_runs: Vec::new(),
        warmup_end: 0.0,
        drains: Vec::new(),
    };
    // A models run replaces one model's file every few seconds from now to the end.
    let swapper = match lab.scenario.mode {
        Mode::Models(m) => Some(antispam::Swapper::start(
            models_dir.clone(),
            Duration::from_secs_f64(if opts.quick {
                m.quick_swap_every_s
            } else {
                m.swap_every_s
            }),
            t0,
        )),
        _ => None,
    };
    let result = lab.measure().await;
    let swaps = swapper.map(antispam::Swapper::finish);
    // Stop the targets first (timelines end here): a target still working off a backlog would
    // disturb the direct measurement of the stubs.
    let mut timelines = BTreeMap::new();
    let mut model_status = BTreeMap::new();
    let mut started_at = BTreeMap::new();
    for t in lab.targets.drain(..) {
        timelines.insert(t.name.clone(), t.sampler.finish());
        started_at.insert(t.name.clone(), t.started_at);
        if let Some(a) = t.admin
            && let Ok((200, body)) = http::get(a, "/__fanout/status").await
        {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            model_status.insert(t.name.clone(), v["models"].clone());
            // The whole status as the run left it (coalescing's flow runs, dedup, backends);
            // best effort: the measurements are done.
            let f = opts.out.join(format!("{}.status.json", t.name));
            if let Err(e) = std::fs::write(&f, &body) {
                tracing::warn!("writing {}: {e}", f.display());
            }
        }
        t.proc.stop().await;
        if t.name == "antispam-py" {
            let log = std::fs::read_to_string(opts.out.join("antispam-py.log")).unwrap_or_default();
            model_status.insert(t.name.clone(), antispam::python_loads(&log));
        }
    }
    let direct = lab.direct().await;
    let floor = match &lab.scenario.mode {
        Mode::ClosedLoop(cl) => lab.closed_floor(cl).await,
        _ => None,
    };
    if let Some(p) = lab.stubs.proc.take() {
        p.stop().await;
    }
    drop(database);
    let capacities = result?;
    let mut rep = report::build(
        &lab.opts,
        &lab.scenario,
        direct,
        capacities,
        std::mem::take(&mut lab.trials),
        timelines,
        std::mem::take(&mut lab.warnings),
    );
    if let Mode::ClosedLoop(cl) = &lab.scenario.mode {
        let (warmup_s, measure_s) = lab.plan.closed;
        report::attach_closed_loop(
            &mut rep,
            report::ClosedLoopReport {
                warmup_s,
                measure_s,
                iteration_s: closed_loop::ITERATION_S,
                rounds: lab.closed_rounds(),
                calls_per_op: cl.calls_per_op,
                error_method: report::CLOSED_ERROR_METHOD.to_string(),
                floor,
                jvm: std::mem::take(&mut jvm),
                not_run: std::mem::take(&mut not_run),
                article: scenario::ARTICLE.to_vec(),
                runs: std::mem::take(&mut lab.closed_runs),
            },
        );
    }
    if let (Mode::Models(m), Some(swaps)) = (&lab.scenario.mode, swaps) {
        let mut targets = BTreeMap::new();
        for (name, timeline) in &rep.timelines {
            let run = antispam::TargetRun {
                max_rate: rep.targets.get(name).and_then(|t| t.max_rate),
                trials: &rep.trials,
                timeline,
                started_at: started_at.get(name).copied().unwrap_or(0.0),
                warmup_end: lab.warmup_end,
                model_status: model_status.remove(name).unwrap_or_default(),
                slo_p99_ms: lab.scenario.slo_p99_ms,
            };
            targets.insert(name.clone(), antispam::summarize(name, &run, &swaps));
        }
        let models = antispam::ModelsReport {
            swap_model: antispam::SWAP_MODEL.into(),
            swap_files: vec!["gbdt_bin".into(), "logreg_bin".into()],
            swap_every_s: if lab.opts.quick {
                m.quick_swap_every_s
            } else {
                m.swap_every_s
            },
            swaps_at_s: swaps,
            swap_window_s: antispam::SWAP_WINDOW_S,
            connections: m.connections,
            models: antispam::MODELS
                .iter()
                .map(|(n, what, _)| (n.to_string(), what.to_string()))
                .collect(),
            long_run_s: lab.opts.duration.map(|d| d.as_secs_f64()),
            not_run: std::mem::take(&mut not_run),
            targets,
        };
        rep.acceptance
            .extend(antispam::acceptance(&models, lab.scenario.slo_p99_ms));
        rep.models = Some(models);
    }
    if let Mode::Pools(p) = &lab.scenario.mode {
        let (trial_s, rounds, _) = lab.plan.pools;
        let pools = pools::summarize(
            p,
            &rep,
            trial_s,
            rounds,
            &lab.opts.targets,
            std::mem::take(&mut lab.drains),
            std::mem::take(&mut not_run),
            jvm,
        );
        rep.warnings.extend(pools.warnings());
        rep.pools = Some(pools);
    }
    report::write(&lab.opts.out, &rep).map_err(io(&lab.opts.out))?;
    Ok(rep)
}

/// Start a scenario's database: a throw-away cluster (`postgres::PgCluster`) with `db.schema`
/// run in it, off the runtime's workers.
async fn start_database(db: scenario::Database) -> Result<postgres::PgCluster, LabError> {
    tokio::task::spawn_blocking(move || {
        let pg = postgres::PgCluster::start().map_err(|e| LabError::Load(e.to_string()))?;
        pg.psql("postgres", db.schema)
            .map_err(|e| LabError::Load(format!("the scenario's schema: {e}")))?;
        Ok(pg)
    })
    .await
    .map_err(|e| LabError::Load(format!("starting the database: {e}")))?
}

/// The executable of `which` when `target` is among the targets (found or built, see
/// [`baseline::plan`]), else `None`: a run without it builds nothing.
async fn rust_baseline(
    opts: &LabOptions,
    target: &str,
    which: baseline::Baseline,
) -> Result<Option<PathBuf>, LabError> {
    if !opts.targets.iter().any(|t| t == target) {
        return Ok(None);
    }
    let inputs =
        baseline::Inputs::from_env(which, opts.baseline_bin.clone(), opts.fanout_bin.clone());
    Ok(Some(baseline::ensure(&inputs).await?))
}

/// A target `NAME=PATH`: another fanout binary (e.g. a build of an earlier commit) serving the
/// scenario's config, to compare two builds interleaved in one run.
fn external_fanout(target: &str) -> Option<(&str, &str)> {
    target
        .split_once('=')
        .filter(|(name, bin)| !name.is_empty() && !bin.is_empty())
}

/// Targets that can run `s`: `fanout`, the baselines that serve its routes, its variants.
pub fn available_targets(s: &Scenario) -> Vec<String> {
    let mut v = vec!["fanout".to_string()];
    v.extend(
        TARGETS[1..]
            .iter()
            .filter(|t| s.baselines.contains(t))
            .map(|t| t.to_string()),
    );
    v.extend(s.variants.iter().map(|(n, _)| n.to_string()));
    // A scenario's own `java-threads-N` targets (`hh-pools`); any other N runs too.
    v.extend(
        s.default_targets
            .iter()
            .filter(|t| pool_target_available(s, t))
            .map(|t| t.to_string()),
    );
    v
}

fn unreachable_target(name: &str) -> Result<(PathBuf, Vec<String>), LabError> {
    Err(LabError::Load(format!(
        "internal: target `{name}` was not prepared"
    )))
}

fn lab_variant(s: &Scenario, target: &str) -> Option<String> {
    s.variants
        .iter()
        .find(|(n, _)| *n == target)
        .map(|(_, y)| equal_work(y, !s.baselines.is_empty()))
}

/// A fanout config as the lab runs it: whole-request coalescing off (`defaults.coalesce:
/// false`), so fanout computes every request as the baselines do; and, in a scenario compared
/// with hand-written baselines (`dedup_off`), in-flight dedup off too (`defaults.dedup: false`),
/// so fanout makes every backend call the baselines make — what sharing saves is not mixed into
/// a comparison of CPU per request (it has scenarios of its own). Scenarios that compare fanout
/// configs with each other (product-page-merging, hedging, slow-backend) keep dedup. A backend
/// or route that states `dedup`/`coalesce` itself keeps its setting. (The lab's configs have no
/// top-level `defaults:`; one in block style gets the lines inserted.)
///
/// A config that turns coalescing on itself (a top-level `defaults:` with `coalesce: true`) is
/// kept as it is: it is a scenario's "what sharing saves" target (`n-plus-one-identical`).
pub fn equal_work(yaml: &str, dedup_off: bool) -> String {
    if states_coalescing(yaml) {
        return yaml.to_string();
    }
    let mut add = vec!["  coalesce: false"];
    if dedup_off {
        add.push("  dedup: false");
    }
    match yaml.lines().position(|l| l.trim_end() == "defaults:") {
        Some(i) => {
            let mut lines: Vec<&str> = yaml.lines().collect();
            for (k, l) in add.into_iter().enumerate() {
                lines.insert(i + 1 + k, l);
            }
            lines.join("\n") + "\n"
        }
        None => format!("{yaml}\ndefaults:\n{}\n", add.join("\n")),
    }
}

/// Whether `yaml`'s top-level `defaults:` (block style) says `coalesce: true`.
fn states_coalescing(yaml: &str) -> bool {
    let mut lines = yaml.lines().skip_while(|l| l.trim_end() != "defaults:");
    lines.next().is_some()
        && lines
            .take_while(|l| l.is_empty() || l.starts_with(' '))
            .any(|l| l.trim() == "coalesce: true")
}

/// Replace a stub route's behaviour through the stub's admin API (`PUT /__stub/routes`); the
/// error is the call's outcome when it was not a 200.
async fn put_stub_route(addr: SocketAddr, body: &serde_json::Value) -> Result<(), String> {
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

pub(crate) fn order(targets: usize, round: usize) -> Vec<usize> {
    // A B, B A, A B, … (ABBA interleaving).
    let mut v: Vec<usize> = (0..targets).collect();
    if round % 2 == 1 {
        v.reverse();
    }
    v
}

impl Lab {
    /// The generator's settings of a trial: the defaults, with a models scenario's client
    /// connections opened before it.
    fn load_opts(&self) -> LoadOpts {
        match self.scenario.mode {
            Mode::Models(m) => LoadOpts {
                open_connections: m.connections,
                ..LoadOpts::default()
            },
            _ => LoadOpts::default(),
        }
    }

    fn schedule(rate: f64, secs: f64) -> String {
        format!("const({:.1},{}ms)", rate.max(1.0), (secs * 1000.0) as u64)
    }

    async fn trial(
        &mut self,
        ti: usize,
        phase: &str,
        round: usize,
        schedule: String,
    ) -> Result<Trial, LabError> {
        let load = Load {
            route: None,
            requests: self.scenario.requests.clone(),
            schedule,
        };
        let opts = self.load_opts();
        let mut v = self
            .run_loads(ti, phase, round, None, vec![load], opts)
            .await?;
        v.pop()
            .ok_or_else(|| LabError::Load("internal: a trial produced no result".into()))
    }

    /// Run `loads` against target `ti` at the same time (one generator each) and record one
    /// trial per load. CPU time and stub calls are per request over all loads together.
    async fn run_loads(
        &mut self,
        ti: usize,
        phase: &str,
        round: usize,
        stage: Option<&str>,
        loads: Vec<Load>,
        opts: LoadOpts,
    ) -> Result<Vec<Trial>, LabError> {
        let target = &self.targets[ti];
        self.stubs.reset().await?;
        let pid = target.proc.pid().unwrap_or(0);
        let me = std::process::id();
        let t_start = self.t0.elapsed().as_secs_f64();
        let mut runs = Vec::new();
        let mut meta = Vec::new();
        // With pre-opened connections, CPU counts from the moment they are open (the schedule's
        // start), not from their handshakes.
        let mut started = Vec::new();
        for load in loads {
            let on_start = (opts.open_connections > 0).then(|| {
                let n = std::sync::Arc::new(tokio::sync::Notify::new());
                started.push(n.clone());
                n
            });
            let sched =
                Schedule::parse(&load.schedule).map_err(|e| LabError::Load(e.to_string()))?;
            let spec = LoadSpec {
                target: format!("http://{}", target.addr),
                requests: load.requests,
                schedule: sched,
                protocol: self.scenario.protocol(),
                max_connections: opts.max_connections,
                open_connections: opts.open_connections,
                on_start,
                timeout: opts.timeout,
                lag_threshold: LAG_THRESHOLD,
                drain: opts.drain,
            };
            meta.push((load.route, load.schedule));
            runs.push(tokio::spawn(
                async move { fanout_load::run(&spec, None).await },
            ));
        }
        for n in &started {
            // (A run that failed to start never notifies: its error comes from its task below.)
            let _ = tokio::time::timeout(Duration::from_secs(30), n.notified()).await;
        }
        let before = procstat::sample(pid).unwrap_or_default();
        let gen_before = procstat::sample(me).unwrap_or_default();
        let sampler = opts.sample.then(|| {
            if matches!(self.scenario.mode, Mode::Pools(_)) {
                procstat::Sampler::start_light(pid, Duration::from_millis(100))
            } else {
                procstat::Sampler::start(pid, Duration::from_millis(100))
            }
        });
        let mut reports = Vec::new();
        for r in runs {
            let rep = r
                .await
                .map_err(|e| LabError::Load(format!("generator task: {e}")))?
                .map_err(|e| LabError::Load(e.to_string()))?;
            reports.push(rep);
        }
        let samples = sampler.map(procstat::Sampler::finish).unwrap_or_default();
        let t_end = self.t0.elapsed().as_secs_f64();
        let after = procstat::sample(pid).unwrap_or_default();
        let gen_after = procstat::sample(me).unwrap_or_default();
        let (backend_total, overshoot) = self.stubs.totals().await?;
        let completed_all = reports.iter().map(|r| r.completed).sum::<u64>().max(1) as f64;
        let cpu = after.cpu_us.saturating_sub(before.cpu_us) as f64 / completed_all;
        let gen_cpu = gen_after.cpu_us.saturating_sub(gen_before.cpu_us) as f64 / completed_all;
        let ctx = after.ctx_switches.saturating_sub(before.ctx_switches) as f64 / completed_all;
        let mut out = Vec::new();
        for ((route, schedule), rep) in meta.into_iter().zip(reports) {
            let dur = rep.duration_s.max(1e-9);
            let offered_rate = rep.offered as f64 / dur;
            let achieved_rate = rep.ok as f64 / dur;
            let p99 = rep.latency_ms.p99;
            let passed_slo = rep.valid
                && rep.error_rate <= 0.01
                && p99 <= self.scenario.slo_p99_ms
                && achieved_rate >= 0.95 * offered_rate;
            let t = Trial {
                target: target.name.clone(),
                phase: phase.into(),
                round,
                t_start,
                t_end,
                schedule,
                offered_rate,
                achieved_rate,
                p50_ms: rep.latency_ms.p50,
                p99_ms: p99,
                error_rate: rep.error_rate,
                cpu_us_per_request: cpu,
                generator_cpu_us_per_request: gen_cpu,
                backend_calls_per_request: backend_total as f64 / completed_all,
                ctx_switches_per_request: ctx,
                stub_overshoot_p99_us: overshoot,
                threads: after.threads,
                rss_mb: after.rss_bytes as f64 / 1e6,
                valid: rep.valid,
                invalid_reason: rep.invalid_reason.clone(),
                passed_slo,
                lag_p99_ms: rep.lag_ms.p99,
                route,
                stage: stage.map(str::to_string),
                phase_bounds: Vec::new(),
                samples: samples.clone(),
                load: rep,
            };
            tracing::info!(target = %t.target, phase, stage, rate = t.offered_rate, p99 = t.p99_ms, cpu_us = t.cpu_us_per_request, valid = t.valid, "trial");
            out.push(t);
        }
        self.trials.extend(out.iter().cloned());
        Ok(out)
    }

    /// Step up (doubling) then bisect to the highest rate meeting the SLO.
    /// One step of the capacity search: the trial and whether it passed. A step that missed the
    /// SLO only because the generator fell behind (the target met latency, errors and rate) is
    /// repeated once: on a shared machine that is usually a moment of contention.
    ///
    /// The overload and models scenarios accept a step whose generator lagged up to
    /// [`OVERLOAD_SEARCH_LAG_MS`] if the target met the SLO: latency counts from the intended
    /// send time, so the lag is charged to the target, never in its favour — and a capacity
    /// understated by the generator would make "3×" no overload at all.
    async fn search_step(&mut self, ti: usize, rate: f64) -> Result<(Trial, bool), LabError> {
        self.search_step_of(ti, rate, self.plan.step_s).await
    }

    /// [`Self::search_step`] lasting `secs`.
    async fn search_step_of(
        &mut self,
        ti: usize,
        rate: f64,
        secs: f64,
    ) -> Result<(Trial, bool), LabError> {
        let mut t = self
            .trial(ti, "search", 0, Self::schedule(rate, secs))
            .await?;
        let slo = self.scenario.slo_p99_ms;
        let target_ok = |t: &Trial| {
            t.error_rate <= 0.01 && t.p99_ms <= slo && t.achieved_rate >= 0.95 * t.offered_rate
        };
        // Overload and models scenarios put a heavy generator (1 000 gRPC connections for the
        // models) on the machine with the target: its lag is the machine's, not the target's.
        let lag_tolerated = matches!(self.scenario.mode, Mode::Overload { .. } | Mode::Models(_));
        let tolerable = |t: &Trial| lag_tolerated && t.lag_p99_ms <= OVERLOAD_SEARCH_LAG_MS;
        if !t.passed_slo && !t.valid && target_ok(&t) && !tolerable(&t) {
            t = self
                .trial(ti, "search", 0, Self::schedule(rate, secs))
                .await?;
        }
        let tolerated = !t.passed_slo && target_ok(&t) && tolerable(&t);
        if tolerated {
            let note = format!(
                "{}: capacity search steps were accepted with generator lag up to {OVERLOAD_SEARCH_LAG_MS} ms (lag p99 {:.1} ms at {rate:.0} req/s; the lag counts in the latency)",
                t.target, t.lag_p99_ms
            );
            if !self
                .warnings
                .iter()
                .any(|w| w.starts_with(&format!("{}: capacity search steps", t.target)))
            {
                self.warnings.push(note);
            }
        }
        let passed = t.passed_slo || tolerated;
        if !passed && matches!(self.scenario.mode, Mode::Models(_)) {
            self.wait_idle(ti, Duration::from_secs(30)).await;
        }
        Ok((t, passed))
    }

    async fn capacity(&mut self, ti: usize) -> Result<f64, LabError> {
        let (mut pass, mut fail) = (0.0f64, None::<f64>);
        let mut rate = 250.0;
        for _ in 0..8 {
            let (t, passed) = self.search_step(ti, rate).await?;
            if passed {
                pass = rate;
                rate *= 2.0;
            } else {
                if !t.valid {
                    self.warnings.push(format!(
                        "{}: the generator could not keep {rate:.0} req/s ({}); capacity is a lower bound",
                        t.target,
                        t.invalid_reason.clone().unwrap_or_default()
                    ));
                }
                fail = Some(rate);
                break;
            }
        }
        // A capacity below the first step: halve until a step passes (database-bound scenarios
        // serve tens of requests per second, not hundreds).
        if pass == 0.0 {
            let mut lo = fail.unwrap_or(rate);
            for _ in 0..6 {
                lo /= 2.0;
                let (_, passed) = self.search_step(ti, lo).await?;
                if passed {
                    pass = lo;
                    break;
                }
                fail = Some(lo);
            }
        }
        if let Some(mut hi) = fail {
            for _ in 0..self.plan.bisect {
                let mid = (pass + hi) / 2.0;
                let (_, passed) = self.search_step(ti, mid).await?;
                if passed {
                    pass = mid;
                } else {
                    hi = mid;
                }
            }
        }
        // Models: the highest rate the machine *sustains* — the rate found must pass once more,
        // for as long as a measured trial lasts (one short step passing at the edge is luck on a
        // shared machine), else 10 % lower.
        if matches!(self.scenario.mode, Mode::Models(_)) && pass > 0.0 {
            let mut confirmed = false;
            for _ in 0..4 {
                let (_, passed) = self.search_step_of(ti, pass, self.plan.trial_s).await?;
                if passed {
                    confirmed = true;
                    break;
                }
                pass *= 0.9;
            }
            if !confirmed {
                let name = self.targets[ti].name.clone();
                self.warnings.push(format!(
                    "{name}: no capacity-search rate passed twice; {pass:.0} req/s is not confirmed"
                ));
            }
        }
        Ok(pass)
    }

    async fn measure(&mut self) -> Result<BTreeMap<String, f64>, LabError> {
        // A closed-loop scenario warms up and measures in its own way: no capacity search.
        if let Mode::ClosedLoop(cl) = self.scenario.mode.clone() {
            self.closed_loop(&cl).await?;
            return Ok(BTreeMap::new());
        }
        // Warm up every target (connections, caches) without recording. The JVM gets longer:
        // its JIT compiles the hot paths during the first thousands of requests, and the
        // compiler threads would otherwise compete with the first search steps.
        for ti in 0..self.targets.len() {
            let name = &self.targets[ti].name;
            let (rate, secs) = if name == "java-threads" || java::pool_size(name).is_some() {
                (200.0, self.plan.jvm_warmup_s)
            } else {
                (100.0, 1.0)
            };
            // A database-bound scenario serves tens of requests per second: a warm-up above that
            // would leave a backlog behind in a target that queues.
            let rate = if self.scenario.database.is_some() {
                10.0
            } else {
                rate
            };
            self.trial(ti, "warmup", 0, Self::schedule(rate, secs))
                .await?;
        }
        self.trials.retain(|t| t.phase != "warmup");
        self.warmup_end = self.t0.elapsed().as_secs_f64();
        let mut caps = BTreeMap::new();
        let searches = !matches!(self.scenario.mode, Mode::Hedging { .. } | Mode::Pools(_));
        if let Some(c) = self.opts.capacity.filter(|_| searches) {
            self.warnings.push(format!(
                "capacity given (--capacity {c:.0}): no capacity search; the levels are fractions of {c:.0} req/s for every target"
            ));
            for t in &self.targets {
                caps.insert(t.name.clone(), c);
            }
        } else if searches {
            for ti in 0..self.targets.len() {
                let c = self.capacity(ti).await?;
                caps.insert(self.targets[ti].name.clone(), c);
            }
        }
        let min_cap = caps.values().copied().fold(f64::INFINITY, f64::min);
        let base = if min_cap.is_finite() && min_cap > 0.0 {
            min_cap
        } else {
            100.0
        };
        let cap_of = |name: &str| caps.get(name).copied().filter(|c| *c > 0.0).unwrap_or(base);
        match self.scenario.mode.clone() {
            Mode::Compare | Mode::CompareAt { .. } => {
                // `--quick` (a debug build in the test suite) caps the fixed rate at the 80 %
                // level: its trials check the shape, and an overloaded target answers nothing.
                let fixed = match self.scenario.mode {
                    Mode::CompareAt { rate } if self.opts.quick => Some(rate.min(base * 0.8)),
                    Mode::CompareAt { rate } => Some(rate),
                    _ => None,
                };
                for round in 0..self.plan.rounds {
                    for ti in order(self.targets.len(), round) {
                        if let Some(rate) = fixed {
                            self.trial(
                                ti,
                                "fixed-rate",
                                round,
                                Self::schedule(rate, self.plan.trial_s),
                            )
                            .await?;
                        }
                        for (phase, f) in [("level-50", 0.5), ("level-80", 0.8)] {
                            self.trial(
                                ti,
                                phase,
                                round,
                                Self::schedule(base * f, self.plan.trial_s),
                            )
                            .await?;
                        }
                    }
                }
            }
            Mode::Overload { .. } => {
                for ti in order(self.targets.len(), 0) {
                    let c = cap_of(&self.targets[ti].name);
                    self.overload(ti, c).await?;
                }
            }
            Mode::SlowBackend(sb) => {
                for ti in order(self.targets.len(), 0) {
                    let c = cap_of(&self.targets[ti].name);
                    self.slow_backend(ti, &sb, c).await?;
                }
            }
            Mode::ClosedLoop(_) => {}
            Mode::Pools(p) => self.pools(&p).await?,
            Mode::Models(_) => self.models_levels(&caps).await?,
            Mode::Hedging { rate } => {
                for round in 0..self.plan.rounds {
                    for ti in order(self.targets.len(), round) {
                        self.trial(
                            ti,
                            "hedging",
                            round,
                            Self::schedule(rate, self.plan.hedge_trial_s),
                        )
                        .await?;
                    }
                }
            }
        }
        Ok(caps)
    }

    /// The measured trials of a models run, interleaved (A B, B A, …) over the rounds: every
    /// target at the baseline's capacity (when it ran and has one: the highest rate both serve,
    /// where requests per CPU-second compare), at half of fanout's and at all of it (the highest
    /// rate fanout sustains with p99 within the SLO; the baseline at the same rates). With
    /// `--duration`: one long trial per target at half of fanout's capacity instead.
    async fn models_levels(&mut self, caps: &BTreeMap<String, f64>) -> Result<(), LabError> {
        let fanout_cap = caps
            .iter()
            .filter(|(n, _)| *n != "antispam-py")
            .map(|(_, c)| *c)
            .fold(0.0, f64::max);
        let fanout_cap = if fanout_cap > 0.0 { fanout_cap } else { 100.0 };
        if let Some(d) = self.opts.duration {
            for ti in order(self.targets.len(), 0) {
                let load = Load {
                    route: None,
                    requests: self.scenario.requests.clone(),
                    schedule: Self::schedule(0.5 * fanout_cap, d.as_secs_f64()),
                };
                let opts = LoadOpts {
                    sample: true,
                    ..self.load_opts()
                };
                self.run_loads(ti, "long", 0, None, vec![load], opts)
                    .await?;
            }
            return Ok(());
        }
        let mut levels = Vec::new();
        if let Some(b) = caps.get("antispam-py").copied().filter(|c| *c > 0.0) {
            levels.push(("at-baseline-max", b));
        }
        levels.push(("at-fanout-half", 0.5 * fanout_cap));
        levels.push(("at-fanout-max", fanout_cap));
        for round in 0..self.plan.rounds {
            for ti in order(self.targets.len(), round) {
                for (phase, rate) in &levels {
                    self.trial(ti, phase, round, Self::schedule(*rate, self.plan.trial_s))
                        .await?;
                    // An overloaded target may still work off a backlog (calls the client gave up
                    // on): the next trial, maybe of another target, must not share the CPU with it.
                    self.wait_idle(ti, Duration::from_secs(30)).await;
                }
            }
        }
        Ok(())
    }

    /// `hh-pools`: per phase (the stub route healthy, then `factor`× slower), every target at
    /// the same fixed rate, interleaved (A B, B A, …) over the rounds; after each trial, wait
    /// until the target's backend calls stop (a thread pool's queue drains: its requests are
    /// still served after their clients gave up) and record how long that took. The route is
    /// healthy again at the end (for the direct measurement).
    async fn pools(&mut self, p: &scenario::Pools) -> Result<(), LabError> {
        let Some(addr) = self
            .stubs
            .services
            .iter()
            .find(|(n, _)| n == p.service)
            .map(|(_, a)| *a)
        else {
            return Err(LabError::Load(format!(
                "the scenario's stubs have no service `{}`",
                p.service
            )));
        };
        let (trial_s, rounds, drain_cap) = self.plan.pools;
        let phases = scenario::pools_phases(p);
        for (stage, latency_ms) in phases.iter().copied().chain([("restore", p.base_ms)]) {
            let body = serde_json::json!({
                "route": p.route,
                "latency": format!("{latency_ms}ms"),
                "faults": [],
            });
            if let Err(e) = put_stub_route(addr, &body).await {
                self.warnings.push(format!(
                    "switching {} `{}` to {latency_ms} ms failed: {e}",
                    p.service, p.route
                ));
            }
            if stage == "restore" {
                break;
            }
            for round in 0..rounds {
                for ti in order(self.targets.len(), round) {
                    let load = Load {
                        route: None,
                        requests: self.scenario.requests.clone(),
                        schedule: Self::schedule(p.rate, trial_s),
                    };
                    let opts = LoadOpts {
                        sample: true,
                        ..LoadOpts::default()
                    };
                    self.run_loads(ti, "pools", round, Some(stage), vec![load], opts)
                        .await?;
                    let (drain_s, calls, capped) =
                        self.wait_quiet(Duration::from_secs_f64(drain_cap)).await?;
                    self.drains.push(pools::Drain {
                        target: self.targets[ti].name.clone(),
                        phase: stage.to_string(),
                        round,
                        drain_s,
                        backend_calls: calls,
                        capped,
                    });
                }
            }
        }
        Ok(())
    }

    /// Wait (up to `within`) until the stubs receive no call for 500 ms: (seconds waited, calls
    /// received meanwhile, whether `within` ran out first).
    async fn wait_quiet(&self, within: Duration) -> Result<(f64, u64, bool), LabError> {
        let start = Instant::now();
        let (first, _) = self.stubs.totals().await?;
        let mut last = first;
        let mut still = 0;
        while start.elapsed() < within {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let (now, _) = self.stubs.totals().await?;
            if now == last {
                still += 1;
                if still >= 2 {
                    // The calls stopped at the first of the two quiet polls.
                    let waited = (start.elapsed().as_secs_f64() - 0.5).max(0.0);
                    return Ok((waited, now.saturating_sub(first), false));
                }
            } else {
                still = 0;
                last = now;
            }
        }
        Ok((
            start.elapsed().as_secs_f64(),
            last.saturating_sub(first),
            true,
        ))
    }

    /// Wait (up to `within`) until target `ti` used less than 5 % of a core over 250 ms.
    async fn wait_idle(&self, ti: usize, within: Duration) {
        let pid = self.targets[ti].proc.pid().unwrap_or(0);
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let a = procstat::sample(pid).map_or(0, |s| s.cpu_us);
            tokio::time::sleep(Duration::from_millis(250)).await;
            let b = procstat::sample(pid).map_or(0, |s| s.cpu_us);
            if b.saturating_sub(a) < 12_500 {
                return;
            }
        }
    }

    /// One continuous run: 0.5× capacity, ramp to 3×, 3×, 0.7×. The generator's timeout is the
    /// client's deadline (1 s, twice the route's): a later answer is a failure, not goodput.
    /// Connections may grow to 8192, so a target that queues instead of rejecting sees the
    /// open-model load it would see from real clients.
    async fn overload(&mut self, ti: usize, c: f64) -> Result<(), LabError> {
        let [d1, d2, d3, d4] = self.plan.overload;
        let tail = match self.scenario.mode {
            Mode::Overload { tail, .. } => tail,
            _ => 0.7,
        };
        let tail_name = if tail == 0.5 {
            "back to 0.5x".to_string()
        } else {
            format!("{tail}x")
        };
        let ms = |d: f64| (d * 1000.0) as u64;
        let schedule = format!(
            "const({:.1},{}ms) line({:.1},{:.1},{}ms) const({:.1},{}ms) const({:.1},{}ms)",
            0.5 * c,
            ms(d1),
            0.5 * c,
            3.0 * c,
            ms(d2),
            3.0 * c,
            ms(d3),
            tail * c,
            ms(d4)
        );
        let mut at = 0.0;
        let bounds: Vec<PhaseBound> = [
            ("0.5x", d1),
            ("ramp to 3x", d2),
            ("3x", d3),
            (tail_name.as_str(), d4),
        ]
        .into_iter()
        .map(|(name, d)| {
            let b = PhaseBound {
                name: name.into(),
                from_s: at,
                to_s: at + d,
            };
            at += d;
            b
        })
        .collect();
        let load = Load {
            route: None,
            requests: self.scenario.requests.clone(),
            schedule,
        };
        let opts = LoadOpts {
            timeout: Duration::from_secs(1),
            max_connections: 8192,
            open_connections: 0,
            drain: Duration::from_secs(1),
            sample: true,
        };
        self.run_loads(ti, "overload", 0, None, vec![load], opts)
            .await?;
        if let Some(t) = self.trials.last_mut() {
            t.phase_bounds = bounds;
        }
        Ok(())
    }

    /// Each phase: switch the stub route through the admin API, then drive every route at once,
    /// each with its own generator, at half the capacity in total.
    async fn slow_backend(
        &mut self,
        ti: usize,
        sb: &scenario::SlowBackend,
        c: f64,
    ) -> Result<(), LabError> {
        let Some(addr) = self
            .stubs
            .services
            .iter()
            .find(|(n, _)| n == sb.service)
            .map(|(_, a)| *a)
        else {
            return Err(LabError::Load(format!(
                "the scenario's stubs have no service `{}`",
                sb.service
            )));
        };
        let per_route = 0.5 * c / sb.routes.len().max(1) as f64;
        for (stage, update) in scenario::slow_backend_phases(sb) {
            let mut body = update;
            body["route"] = serde_json::Value::from(sb.route);
            if let Err(e) = put_stub_route(addr, &body).await {
                self.warnings.push(format!(
                    "switching {} `{}` to `{stage}` failed: {e}",
                    sb.service, sb.route
                ));
            }
            let loads = sb
                .routes
                .iter()
                .map(|r| Load {
                    route: Some(r.name.to_string()),
                    requests: r.requests.clone(),
                    schedule: Self::schedule(per_route, self.plan.slow_phase_s),
                })
                .collect();
            self.run_loads(
                ti,
                "slow-backend",
                0,
                Some(stage),
                loads,
                LoadOpts::default(),
            )
            .await?;
        }
        Ok(())
    }

    /// Latency of calling the critical path's stub routes directly, one after the other (HTTP/1.1
    /// GETs; a gRPC scenario's calls over one h2c connection per stub, every answer checked for
    /// `grpc-status: 0`). `None` when a call fails.
    ///
    /// HTTP paths are measured like the targets: sequences started on an open-model schedule at
    /// the lowest rate the targets' 50 % level offered (so the stubs are as busy as in the
    /// trials: an idle stub wakes up later for each timer and would make the floor look higher),
    /// latency from each sequence's intended start, after a warm-up.
    async fn direct(&self) -> Option<report::Direct> {
        if self.scenario.critical_path.is_empty() && self.grpc_direct.is_empty() {
            return None;
        }
        let n = if self.opts.quick { 300 } else { 1500 };
        let addr_of = |svc: &str| {
            self.stubs
                .services
                .iter()
                .find(|(s, _)| s == svc)
                .map(|(_, a)| *a)
        };
        let mut samples = Vec::with_capacity(n);
        let path: Vec<String>;
        if self.grpc_direct.is_empty() {
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Empty<bytes::Bytes>>();
            let mut uris = Vec::new();
            for (svc, path) in &self.scenario.critical_path {
                let addr = addr_of(svc)?;
                uris.push(format!("http://{addr}{path}").parse::<::http::Uri>().ok()?);
            }
            let uris = std::sync::Arc::new(uris);
            let rate = self
                .trials
                .iter()
                .filter(|t| t.phase == "level-50" && t.offered_rate > 0.0)
                .map(|t| t.offered_rate)
                .fold(f64::INFINITY, f64::min);
            let rate = if rate.is_finite() {
                rate.min(1000.0)
            } else {
                100.0
            };
            // A quick run (a debug build whose 50 % level may be a few requests per second) takes
            // its direct samples at 50/s at least, so it ends in seconds, not minutes.
            let rate = if self.opts.quick {
                rate.max(50.0)
            } else {
                rate
            };
            let warmup = n / 10;
            let every = Duration::from_secs_f64(1.0 / rate);
            let t0 = tokio::time::Instant::now();
            let mut runs = tokio::task::JoinSet::new();
            for i in 0..warmup + n {
                let intended = t0 + every * i as u32;
                tokio::time::sleep_until(intended).await;
                let (client, uris) = (client.clone(), uris.clone());
                runs.spawn(async move {
                    for uri in uris.iter() {
                        let resp = client.get(uri.clone()).await.ok()?;
                        http_body_util::BodyExt::collect(resp.into_body())
                            .await
                            .ok()?;
                    }
                    let ms = intended.elapsed().as_secs_f64() * 1000.0;
                    Some((i >= warmup).then_some(ms))
                });
            }
            while let Some(r) = runs.join_next().await {
                if let Some(ms) = r.ok()?? {
                    samples.push(ms);
                }
            }
            path = self
                .scenario
                .critical_path
                .iter()
                .map(|(s, p)| format!("{s} {p}"))
                .collect();
        } else {
            // TCP_NODELAY: HTTP/2 writes a request's HEADERS and DATA frames separately; with
            // Nagle on, the second waits for the peer's delayed ACK (~40 ms).
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            connector.set_nodelay(true);
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .http2_only(true)
                    .build::<_, http_body_util::Full<bytes::Bytes>>(connector);
            for _ in 0..n {
                let start = Instant::now();
                for (svc, r) in &self.grpc_direct {
                    let addr = addr_of(svc)?;
                    let mut req = ::http::Request::builder()
                        .method(r.method.clone())
                        .uri(format!("http://{addr}{}", r.path));
                    for (k, v) in &r.headers {
                        req = req.header(k.as_str(), v.as_str());
                    }
                    let req = req.body(http_body_util::Full::new(r.body.clone())).ok()?;
                    let (parts, body) = client.request(req).await.ok()?.into_parts();
                    let got = http_body_util::BodyExt::collect(body).await.ok()?;
                    let status = got
                        .trailers()
                        .and_then(|t| t.get("grpc-status"))
                        .or_else(|| parts.headers.get("grpc-status"))
                        .map(|v| v.as_bytes().to_vec());
                    if status.as_deref() != Some(b"0".as_slice()) {
                        return None;
                    }
                }
                samples.push(start.elapsed().as_secs_f64() * 1000.0);
            }
            path = self
                .grpc_direct
                .iter()
                .map(|(s, r)| format!("{s} {}", r.path))
                .collect();
        }
        samples.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            samples
                .get(((samples.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        Some(report::Direct {
            path,
            p50_ms: pick(0.5),
            p99_ms: pick(0.99),
        })
    }
}

#[cfg(test)]
mod equal_work_tests {
    use super::equal_work;

    #[test]
    fn the_lab_turns_whole_request_coalescing_off() {
        let appended = equal_work("routes: []\n", false);
        assert!(
            appended.ends_with("\ndefaults:\n  coalesce: false\n"),
            "{appended}"
        );
        let inserted = equal_work("defaults:\n  timeout: 2s\nroutes: []\n", false);
        assert_eq!(
            inserted,
            "defaults:\n  coalesce: false\n  timeout: 2s\nroutes: []\n"
        );
        // A config that turns coalescing on itself is kept (a "what sharing saves" target).
        let on = "routes: []\ndefaults:\n  timeout: 2s\n  coalesce: true\n";
        assert_eq!(equal_work(on, true), on);
        // ... but not a route's own `coalesce: true` (only the top-level defaults count).
        let route = "routes:\n  - path: /x\n    coalesce: true\n";
        assert!(equal_work(route, false).ends_with("\ndefaults:\n  coalesce: false\n"));
    }

    #[test]
    fn against_baselines_the_lab_turns_dedup_off_too() {
        let appended = equal_work("routes: []\n", true);
        assert!(
            appended.ends_with("\ndefaults:\n  coalesce: false\n  dedup: false\n"),
            "{appended}"
        );
        let inserted = equal_work("defaults:\n  timeout: 2s\nroutes: []\n", true);
        assert_eq!(
            inserted,
            "defaults:\n  coalesce: false\n  dedup: false\n  timeout: 2s\nroutes: []\n"
        );
    }
}
