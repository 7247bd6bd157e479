//! fanout's load lab: `fanout lab SCENARIO` starts the stubs and every system under test as child
//! processes, drives open-model load from this process (`fanout-load`), samples each target's
//! CPU time, RSS and threads from `/proc`, and writes `report.json` and a self-contained
//! `report.html`. Targets are compared **interleaved** (A B B A …) over several trials, and
//! reported as medians with min–max.

pub mod http;
pub mod process;
pub mod procstat;
pub mod report;
pub mod scenario;
pub mod svg;

use fanout_load::{LoadReport, LoadSpec, Protocol, Schedule};
use fanout_stub::addr_var;
use process::{Proc, free_addr};
use scenario::{Mode, Scenario};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

/// A trial is invalid when the generator's send lag p99 exceeds this. 2 ms: on a shared 2-core
/// machine 1 ms flags trials whose latencies (≥ 10 ms here) it barely affects; the lag of every
/// trial is reported anyway.
pub const LAG_THRESHOLD: Duration = Duration::from_millis(2);

/// Target names the lab knows.
pub const TARGETS: [&str; 2] = ["fanout", "hyper-baseline"];

/// Options of one lab run.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Scenario name.
    pub scenario: String,
    /// Targets, in the order of the first round.
    pub targets: Vec<String>,
    /// Reduced version (< 60 s) for CI and smoke tests.
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// Rounds of interleaved trials (default 3 quick, 5 full).
    pub trials: Option<usize>,
    /// The `fanout` executable (for `serve` and `stub`).
    pub fanout_bin: PathBuf,
    /// The hand-written baseline executable.
    pub baseline_bin: PathBuf,
    /// The command line, for the report.
    pub command: String,
}

/// Why a lab run failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Unknown scenario.
    #[error("unknown scenario `{0}`; available: {list}", list = scenario::NAMES.join(", "))]
    UnknownScenario(String),
    /// Unknown target.
    #[error("unknown target `{0}`; available: {list} and the scenario's variants (product-page-merging: naive, variant1, variant2)", list = TARGETS.join(", "))]
    UnknownTarget(String),
    /// The baseline executable is missing.
    #[error(
        "the hyper baseline is not built at {0}; run `cargo build --release -p hyper-aggregator` (or pass --baseline-bin)"
    )]
    NoBaseline(String),
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
    /// The generator's full report.
    pub load: LoadReport,
}

struct Target {
    name: String,
    addr: SocketAddr,
    proc: Proc,
    sampler: procstat::Sampler,
}

struct Stubs {
    services: Vec<(String, SocketAddr)>,
    proc: Proc,
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
    overload_phase_s: f64,
}

/// The lab run.
struct Lab {
    opts: LabOptions,
    scenario: Scenario,
    plan: Plan,
    t0: Instant,
    stubs: Stubs,
    targets: Vec<Target>,
    trials: Vec<Trial>,
    warnings: Vec<String>,
}

/// Run the lab and write `report.json` and `report.html` into `opts.out`.
pub async fn run(opts: LabOptions) -> Result<report::LabReport, LabError> {
    let scenario = scenario::builtin(&opts.scenario)
        .ok_or_else(|| LabError::UnknownScenario(opts.scenario.clone()))?;
    for t in &opts.targets {
        if !TARGETS.contains(&t.as_str()) && !scenario.variants.iter().any(|(n, _)| n == t) {
            return Err(LabError::UnknownTarget(t.clone()));
        }
    }
    if opts.targets.iter().any(|t| t == "hyper-baseline") && !opts.baseline_bin.exists() {
        return Err(LabError::NoBaseline(
            opts.baseline_bin.display().to_string(),
        ));
    }
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
            overload_phase_s: 2.0,
        }
    } else {
        Plan {
            step_s: 3.0,
            trial_s: 5.0,
            bisect: 4,
            rounds: opts.trials.unwrap_or(5),
            overload_phase_s: 10.0,
        }
    };

    // Addresses for the stub services and the targets, published as NAME_ADDR like the examples.
    let names: Vec<String> = {
        let any = |n: &str| n.ends_with("_ADDR").then(|| "127.0.0.1:0".to_string());
        fanout_stub::load("stubs.yaml", scenario.stubs, &any)
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
    let stubs_file = opts.out.join("stubs.yaml");
    let gw_file = opts.out.join("fanout.yaml");
    std::fs::write(&stubs_file, scenario.stubs).map_err(io(&stubs_file))?;
    std::fs::write(&gw_file, scenario.gateway).map_err(io(&gw_file))?;

    let mut stub_proc = Proc::spawn(
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
        stub_proc
            .wait_ready(*a, "/__stub/stats", Duration::from_secs(15))
            .await?;
    }
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
        let variant = lab_variant(&scenario, name);
        if let Some(yaml) = &variant {
            let f = opts.out.join(format!("{name}.yaml"));
            std::fs::write(&f, yaml).map_err(io(&f))?;
        }
        let (bin, args) = match name.as_str() {
            _ if variant.is_some() => (
                opts.fanout_bin.clone(),
                vec![
                    "serve".into(),
                    "--config".into(),
                    opts.out.join(format!("{name}.yaml")).display().to_string(),
                    "--listen".into(),
                    addr.to_string(),
                ],
            ),
            "fanout" => (
                opts.fanout_bin.clone(),
                vec![
                    "serve".into(),
                    "--config".into(),
                    gw_file.display().to_string(),
                    "--listen".into(),
                    addr.to_string(),
                ],
            ),
            _ => (
                opts.baseline_bin.clone(),
                vec!["--listen".into(), addr.to_string()],
            ),
        };
        let mut p = Proc::spawn(
            name,
            &bin,
            &args,
            &env,
            &opts.out.join(format!("{name}.log")),
        )?;
        p.wait_ready(addr, &probe, Duration::from_secs(15)).await?;
        let pid = p.pid().unwrap_or(0);
        targets.push(Target {
            name: name.clone(),
            addr,
            proc: p,
            sampler: procstat::Sampler::start(pid, Duration::from_millis(200)),
        });
    }

    let mut lab = Lab {
        opts: opts.clone(),
        scenario,
        plan,
        t0,
        stubs,
        targets,
        trials: Vec::new(),
        warnings: Vec::new(),
    };
    let result = lab.measure().await;
    let direct = lab.direct().await;
    // Stop everything before writing (timelines end here).
    let mut timelines = BTreeMap::new();
    for t in lab.targets.drain(..) {
        timelines.insert(t.name.clone(), t.sampler.finish());
        t.proc.stop().await;
    }
    lab.stubs.proc.stop().await;
    let capacities = result?;
    let rep = report::build(
        &lab.opts,
        &lab.scenario,
        direct,
        capacities,
        std::mem::take(&mut lab.trials),
        timelines,
        std::mem::take(&mut lab.warnings),
    );
    report::write(&lab.opts.out, &rep).map_err(io(&lab.opts.out))?;
    Ok(rep)
}

fn lab_variant(s: &Scenario, target: &str) -> Option<String> {
    s.variants
        .iter()
        .find(|(n, _)| *n == target)
        .map(|(_, y)| y.clone())
}

fn order(targets: usize, round: usize) -> Vec<usize> {
    // A B, B A, A B, … (ABBA interleaving).
    let mut v: Vec<usize> = (0..targets).collect();
    if round % 2 == 1 {
        v.reverse();
    }
    v
}

impl Lab {
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
        let target = &self.targets[ti];
        self.stubs.reset().await?;
        let pid = target.proc.pid().unwrap_or(0);
        let me = std::process::id();
        let before = procstat::sample(pid).unwrap_or_default();
        let gen_before = procstat::sample(me).unwrap_or_default();
        let t_start = self.t0.elapsed().as_secs_f64();
        let sched = Schedule::parse(&schedule).map_err(|e| LabError::Load(e.to_string()))?;
        let spec = LoadSpec {
            target: format!("http://{}", target.addr),
            requests: self.scenario.requests.clone(),
            schedule: sched,
            protocol: Protocol::Http1,
            max_connections: 512,
            timeout: Duration::from_secs(2),
            lag_threshold: LAG_THRESHOLD,
            drain: Duration::from_secs(2),
        };
        let rep = fanout_load::run(&spec, None)
            .await
            .map_err(|e| LabError::Load(e.to_string()))?;
        let after = procstat::sample(pid).unwrap_or_default();
        let gen_after = procstat::sample(me).unwrap_or_default();
        let (backend_total, overshoot) = self.stubs.totals().await?;
        let completed = rep.completed.max(1) as f64;
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
            schedule,
            offered_rate,
            achieved_rate,
            p50_ms: rep.latency_ms.p50,
            p99_ms: p99,
            error_rate: rep.error_rate,
            cpu_us_per_request: after.cpu_us.saturating_sub(before.cpu_us) as f64 / completed,
            generator_cpu_us_per_request: gen_after.cpu_us.saturating_sub(gen_before.cpu_us) as f64
                / completed,
            backend_calls_per_request: backend_total as f64 / completed,
            ctx_switches_per_request: after.ctx_switches.saturating_sub(before.ctx_switches) as f64
                / completed,
            stub_overshoot_p99_us: overshoot,
            threads: after.threads,
            rss_mb: after.rss_bytes as f64 / 1e6,
            valid: rep.valid,
            invalid_reason: rep.invalid_reason.clone(),
            passed_slo,
            lag_p99_ms: rep.lag_ms.p99,
            load: rep,
        };
        tracing::info!(target = %t.target, phase, rate = t.offered_rate, p99 = t.p99_ms, cpu_us = t.cpu_us_per_request, valid = t.valid, "trial");
        self.trials.push(t.clone());
        Ok(t)
    }

    /// Step up (doubling) then bisect to the highest rate meeting the SLO.
    async fn capacity(&mut self, ti: usize) -> Result<f64, LabError> {
        let (mut pass, mut fail) = (0.0f64, None::<f64>);
        let mut rate = 250.0;
        for _ in 0..8 {
            let t = self
                .trial(ti, "search", 0, Self::schedule(rate, self.plan.step_s))
                .await?;
            if t.passed_slo {
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
        if let Some(mut hi) = fail {
            for _ in 0..self.plan.bisect {
                let mid = (pass + hi) / 2.0;
                let t = self
                    .trial(ti, "search", 0, Self::schedule(mid, self.plan.step_s))
                    .await?;
                if t.passed_slo {
                    pass = mid;
                } else {
                    hi = mid;
                }
            }
        }
        Ok(pass)
    }

    async fn measure(&mut self) -> Result<BTreeMap<String, f64>, LabError> {
        // Warm up every target (connections, caches) without recording.
        for ti in 0..self.targets.len() {
            self.trial(ti, "warmup", 0, Self::schedule(100.0, 1.0))
                .await?;
        }
        self.trials.retain(|t| t.phase != "warmup");
        let mut caps = BTreeMap::new();
        for ti in 0..self.targets.len() {
            let c = self.capacity(ti).await?;
            caps.insert(self.targets[ti].name.clone(), c);
        }
        let min_cap = caps.values().copied().fold(f64::INFINITY, f64::min);
        let base = if min_cap.is_finite() && min_cap > 0.0 {
            min_cap
        } else {
            100.0
        };
        match self.scenario.mode.clone() {
            Mode::Compare => {
                for round in 0..self.plan.rounds {
                    for ti in order(self.targets.len(), round) {
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
            Mode::Overload => {
                let d = self.plan.overload_phase_s;
                for ti in order(self.targets.len(), 0) {
                    let c = caps
                        .get(&self.targets[ti].name)
                        .copied()
                        .filter(|c| *c > 0.0)
                        .unwrap_or(base);
                    let ms = (d * 1000.0) as u64;
                    let s = format!(
                        "const({:.1},{ms}ms) line({:.1},{:.1},{ms}ms) const({:.1},{ms}ms) const({:.1},{ms}ms)",
                        0.5 * c,
                        0.5 * c,
                        3.0 * c,
                        3.0 * c,
                        0.7 * c
                    );
                    self.trial(ti, "overload", 0, s).await?;
                }
            }
            Mode::SlowBackend {
                service,
                route,
                base_ms,
                factor,
            } => {
                let addr = self
                    .stubs
                    .services
                    .iter()
                    .find(|(n, _)| n == service)
                    .map(|(_, a)| *a);
                let d = self.plan.overload_phase_s;
                for ti in order(self.targets.len(), 0) {
                    let Some(addr) = addr else { break };
                    let sched = Self::schedule(base * 0.5, 3.0 * d);
                    let slow = serde_json::json!({"route": route, "latency": format!("{}ms", base_ms * factor)}).to_string();
                    let normal =
                        serde_json::json!({"route": route, "latency": format!("{base_ms}ms")})
                            .to_string();
                    let switch = tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs_f64(d)).await;
                        let a = http::call(::http::Method::PUT, addr, "/__stub/routes", Some(slow))
                            .await;
                        tokio::time::sleep(Duration::from_secs_f64(d)).await;
                        let b =
                            http::call(::http::Method::PUT, addr, "/__stub/routes", Some(normal))
                                .await;
                        (a.map(|r| r.0), b.map(|r| r.0))
                    });
                    self.trial(ti, "slow-backend", 0, sched).await?;
                    match switch.await {
                        Ok((Ok(200), Ok(200))) => {}
                        other => self
                            .warnings
                            .push(format!("switching the stub's latency failed: {other:?}")),
                    }
                }
            }
        }
        Ok(caps)
    }

    /// Latency of calling the critical path's stub routes directly, one after the other.
    async fn direct(&self) -> Option<report::Direct> {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let n = if self.opts.quick { 100 } else { 500 };
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            for (svc, path) in &self.scenario.critical_path {
                let addr = self.stubs.services.iter().find(|(s, _)| s == svc)?.1;
                let uri: ::http::Uri = format!("http://{addr}{path}").parse().ok()?;
                let resp = client.get(uri).await.ok()?;
                http_body_util::BodyExt::collect(resp.into_body())
                    .await
                    .ok()?;
            }
            samples.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        samples.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            samples
                .get(((samples.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        Some(report::Direct {
            path: self
                .scenario
                .critical_path
                .iter()
                .map(|(s, p)| format!("{s}{p}"))
                .collect(),
            p50_ms: pick(0.5),
            p99_ms: pick(0.99),
        })
    }
}
