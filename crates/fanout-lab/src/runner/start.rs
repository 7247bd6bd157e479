//! A run from start to report: check the targets, find or build what they need, start the stubs
//! (and a database) and the targets, measure (the mode's [`Measure`]), stop everything and write
//! the report. One function per step.

use super::{Lab, Measure, Plan, Prepared, Stubs, Target, unreachable_target};
use crate::model::{LabError, LabOptions, Scenario};
use crate::process::{Proc, free_addr};
use crate::report::{self, LabReport};
use crate::targets::{
    available_targets, external_fanout, is_java_target, lab_variant, pool_target_available,
};
use crate::{antispam, baseline, equal_work, http, java, postgres, procstat};
use fanout_stub::addr_var;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The error of a file operation on `path`.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LabError + use<> {
    let path = path.display().to_string();
    move |source| LabError::Io { path, source }
}

/// Run `scenario` as `opts` says, measuring with `kind`, and write `report.json` and
/// `report.html` into `opts.out`.
pub(crate) async fn run(
    mut opts: LabOptions,
    mut scenario: Scenario,
    kind: Arc<dyn Measure>,
) -> Result<LabReport, LabError> {
    if opts.targets.is_empty() {
        opts.targets = scenario
            .default_targets
            .iter()
            .map(|t| t.to_string())
            .collect();
    }
    check_targets(&opts, &scenario)?;
    // Find (or build) what the targets need before anything starts: a failed build should not
    // cost a started lab. A target that needs nothing built triggers nothing.
    let mut prepared = Prepared {
        hyper: rust_baseline(&opts, "hyper-baseline", baseline::HYPER).await?,
        grpc: rust_baseline(&opts, "grpc-baseline", baseline::GRPC).await?,
        pg: rust_baseline(&opts, "pg-baseline", baseline::PG).await?,
        ..Prepared::default()
    };
    std::fs::create_dir_all(&opts.out).map_err(io(&opts.out))?;
    let plan = Plan::new(opts.quick, opts.trials);
    let mut not_run = BTreeMap::new();
    let jvm = prepare_java(&mut opts, &mut prepared, &mut not_run).await?;
    // The scenario's other files (a gRPC scenario's `.proto`) go next to the configs, which name
    // them relative to their own directory; a gRPC scenario's requests are built from them.
    scenario.write_files(&opts.out).map_err(io(&opts.out))?;
    let grpc_direct = scenario.prepare(&opts.out).map_err(LabError::Scenario)?;
    kind.prepare(&mut opts, &mut prepared, &mut not_run).await?;
    let (stubs, env, database) = start_stubs(&opts, &scenario).await?;
    let t0 = Instant::now();
    let mut lab = Lab {
        opts,
        scenario,
        grpc_direct,
        plan,
        t0,
        stubs,
        targets: Vec::new(),
        trials: Vec::new(),
        warnings: Vec::new(),
        closed_runs: Vec::new(),
        warmup_end: 0.0,
        drains: Vec::new(),
        kind: kind.clone(),
        not_run,
        jvm,
        started_at: BTreeMap::new(),
        model_status: BTreeMap::new(),
        swapper: None,
        swaps: None,
        floor: None,
    };
    start_targets(&mut lab, &prepared, &env).await?;
    kind.started(&mut lab);
    let result = lab.measure().await;
    kind.measured(&mut lab);
    // Stop the targets first (timelines end here): a target still working off a backlog would
    // disturb the direct measurement of the stubs.
    let timelines = stop_targets(&mut lab).await;
    let direct = lab.direct().await;
    kind.targets_stopped(&mut lab).await;
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
    kind.accept(&mut rep, &lab.opts.targets);
    kind.report(&mut lab, &mut rep);
    report::write(&lab.opts.out, &rep).map_err(io(&lab.opts.out))?;
    Ok(rep)
}

/// Every target is one the scenario can run (or a `NAME=PATH` fanout build that exists).
fn check_targets(opts: &LabOptions, scenario: &Scenario) -> Result<(), LabError> {
    let available = available_targets(scenario);
    for t in &opts.targets {
        if let Some((_, bin)) = external_fanout(t) {
            if !Path::new(bin).exists() {
                return Err(LabError::NoBinary {
                    target: t.clone(),
                    bin: bin.to_string(),
                });
            }
            continue;
        }
        if !available.contains(t) && !pool_target_available(scenario, t) {
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
    Ok(())
}

impl Plan {
    /// The durations and sizes of a run: `quick` (< 60 s) or full; `trials` rounds if given.
    fn new(quick: bool, trials: Option<usize>) -> Plan {
        if quick {
            Plan {
                step_s: 1.0,
                trial_s: 1.5,
                bisect: 2,
                rounds: trials.unwrap_or(3),
                overload: [2.0, 1.0, 3.0, 3.0],
                slow_phase_s: 3.0,
                hedge_trial_s: 3.0,
                jvm_warmup_s: 4.0,
                closed: (0.5, 1.5),
                pools: (2.5, trials.unwrap_or(1), 5.0),
            }
        } else {
            Plan {
                step_s: 3.0,
                trial_s: 5.0,
                bisect: 4,
                rounds: trials.unwrap_or(5),
                overload: [10.0, 10.0, 20.0, 20.0],
                slow_phase_s: 15.0,
                hedge_trial_s: 15.0,
                jvm_warmup_s: 20.0,
                closed: (3.0, 10.0),
                pools: (10.0, trials.unwrap_or(3), 60.0),
            }
        }
    }
}

/// The Java targets' runtimes: `java-threads-N` targets without `javac`/`java` and
/// `java-virtual` without a Java runtime ≥ 21 do not run (the report says why, in `not_run`;
/// never a failed run); the Java baseline compiled (a compile error should not cost a started
/// lab; `javac` runs on the blocking pool). Returns each Java target's runtime, described.
async fn prepare_java(
    opts: &mut LabOptions,
    prepared: &mut Prepared,
    not_run: &mut BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, LabError> {
    // `java-virtual` needs a Java runtime with virtual threads (21+); without one it does not
    // run, and the report says why — it never fails the run. `java-blocking` runs on the same
    // runtime when there is one (the two then differ only in their threads), else on `java`.
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
    prepared.jdk21 = if opts
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
        let described = match (t.as_str(), &prepared.jdk21) {
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
    prepared.java_classes = if opts.targets.iter().any(|t| is_java_target(t)) {
        let dir = java::build_dir(&opts.fanout_bin, &opts.out);
        let built =
            tokio::task::spawn_blocking(move || java::ensure_built(&java::source_dir(), &dir))
                .await
                .map_err(|e| LabError::Load(format!("building the Java baseline: {e}")))?;
        Some(built?)
    } else {
        None
    };
    Ok(jvm)
}

/// The stub services on free ports (published as NAME_ADDR, like the examples), the scenario's
/// database if it has one (DB_URL, DB_JDBC_URL), the configs written; `fanout stub` started and
/// ready. Returns the stubs, the targets' environment and the database (dropped: stopped).
async fn start_stubs(
    opts: &LabOptions,
    scenario: &Scenario,
) -> Result<(Stubs, HashMap<String, String>, Option<postgres::PgCluster>), LabError> {
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
    Ok((stubs, env, database))
}

/// Start a scenario's database: a throw-away cluster (`postgres::PgCluster`) with `db.schema`
/// run in it, off the runtime's workers.
async fn start_database(db: crate::model::Database) -> Result<postgres::PgCluster, LabError> {
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

/// Start every target (its config written, its executable from [`target_command`]) and wait
/// until it answers; its `/proc` sampled from then on.
async fn start_targets(
    lab: &mut Lab,
    prepared: &Prepared,
    env: &HashMap<String, String>,
) -> Result<(), LabError> {
    let probe = lab
        .scenario
        .requests
        .first()
        .map(|r| r.path.clone())
        .unwrap_or_else(|| "/".into());
    let names = lab.opts.targets.clone();
    for name in &names {
        let addr = free_addr().map_err(io(&lab.opts.out))?;
        let variant = lab_variant(&lab.scenario, name);
        let tls = variant.as_deref().is_some_and(crate::certs::speaks_tls);
        if let Some(yaml) = &variant {
            let f = lab.opts.out.join(format!("{name}.yaml"));
            let yaml = if tls {
                let dir = crate::certs::ensure(&lab.opts.out).map_err(LabError::Load)?;
                yaml.replace(crate::certs::TLS_DIR, &dir.display().to_string())
            } else {
                yaml.clone()
            };
            std::fs::write(&f, yaml).map_err(io(&f))?;
        }
        let (bin, args, admin) =
            target_command(&lab.opts, prepared, name, addr, variant.is_some())?;
        let mut p = Proc::spawn(
            name,
            &bin,
            &args,
            env,
            // `NAME=PATH` targets log to NAME.log.
            &lab.opts.out.join(format!(
                "{}.log",
                external_fanout(name).map_or(name.as_str(), |(n, _)| n)
            )),
        )?;
        if name == "antispam-py" || tls {
            // (A TLS listener answers no plain HTTP/1.1 probe.)
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
        lab.targets.push(Target {
            name: name.clone(),
            addr,
            proc: p,
            sampler: if lab.kind.light_sampling() {
                procstat::Sampler::start_light(pid, Duration::from_millis(200))
            } else {
                procstat::Sampler::start(pid, Duration::from_millis(200))
            },
            admin,
            started_at: lab.t0.elapsed().as_secs_f64(),
            tls,
        });
    }
    Ok(())
}

/// The executable and arguments of target `name` listening on `addr` (`variant`: it serves its
/// own config), and the admin listener the lab chose for a fanout target.
fn target_command(
    opts: &LabOptions,
    prepared: &Prepared,
    name: &str,
    addr: std::net::SocketAddr,
    variant: bool,
) -> Result<(PathBuf, Vec<String>, Option<std::net::SocketAddr>), LabError> {
    let mut admin = None;
    let (bin, args) = match name {
        _ if variant => {
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
        "java-threads" => match &prepared.java_classes {
            Some(classes) => (java::java_bin(), java::args(classes, addr)),
            None => unreachable_target(name)?,
        },
        // Both pools of N threads (`hh-pools`).
        n if java::pool_size(n).is_some() => match (&prepared.java_classes, java::pool_size(n)) {
            (Some(classes), Some(size)) => {
                let mut a = java::args(classes, addr);
                a.extend(java::pool_args(size));
                (java::java_bin(), a)
            }
            _ => unreachable_target(name)?,
        },
        // The article's sync version: parallel calls on a pool of as many threads as cores.
        "java-blocking" => match &prepared.java_classes {
            Some(classes) => {
                let mut a = java::args(classes, addr);
                a.extend(["--call-threads".into(), "cpus".into()]);
                let bin = prepared
                    .jdk21
                    .as_ref()
                    .map_or_else(java::java_bin, |j| j.java.clone());
                (bin, a)
            }
            None => unreachable_target(name)?,
        },
        // Request threads and parallel calls on virtual threads.
        "java-virtual" => match (&prepared.java_classes, &prepared.jdk21) {
            (Some(classes), Some(j)) => {
                let mut a = java::args(classes, addr);
                a.push("--virtual".into());
                (j.java.clone(), a)
            }
            _ => unreachable_target(name)?,
        },
        "hyper-baseline" => match &prepared.hyper {
            Some(b) => (b.clone(), vec!["--listen".into(), addr.to_string()]),
            None => unreachable_target(name)?,
        },
        // Its backends come from USERS_ADDR, ORDERS_ADDR, RECS_ADDR (in `env`, like every
        // stub service's address). It also answers HTTP/1.1, so the probe below works.
        "grpc-baseline" => match &prepared.grpc {
            Some(b) => (b.clone(), vec!["--listen".into(), addr.to_string()]),
            None => unreachable_target(name)?,
        },
        // Its database comes from DB_URL (in `env`), like fanout's.
        "pg-baseline" => match &prepared.pg {
            Some(b) => (b.clone(), vec!["--listen".into(), addr.to_string()]),
            None => unreachable_target(name)?,
        },
        // The Python baseline of antispam-models: its venv's python, the server written into
        // the run directory, the models directory fanout reads too.
        "antispam-py" => match &prepared.python {
            Some((py, server, stubs)) => (
                py.clone(),
                vec![
                    server.display().to_string(),
                    "--listen".into(),
                    addr.to_string(),
                    "--models".into(),
                    opts.out.join("models").display().to_string(),
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
                opts.out.join("fanout.yaml").display().to_string(),
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
    Ok((bin, args, admin))
}

/// Stop every target; returns its `/proc` timeline. A fanout target's status at the end goes
/// to `NAME.status.json` (its models' status, and `antispam-py`'s loads from its log, to
/// `lab.model_status`).
async fn stop_targets(lab: &mut Lab) -> BTreeMap<String, Vec<procstat::ProcSample>> {
    let mut timelines = BTreeMap::new();
    for t in lab.targets.drain(..) {
        timelines.insert(t.name.clone(), t.sampler.finish());
        lab.started_at.insert(t.name.clone(), t.started_at);
        if let Some(a) = t.admin
            && let Ok((200, body)) = http::get(a, "/__fanout/status").await
        {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            lab.model_status.insert(t.name.clone(), v["models"].clone());
            // The whole status as the run left it (coalescing's flow runs, dedup, backends);
            // best effort: the measurements are done.
            let f = lab.opts.out.join(format!("{}.status.json", t.name));
            if let Err(e) = std::fs::write(&f, &body) {
                tracing::warn!("writing {}: {e}", f.display());
            }
        }
        t.proc.stop().await;
        if t.name == "antispam-py" {
            let log =
                std::fs::read_to_string(lab.opts.out.join("antispam-py.log")).unwrap_or_default();
            lab.model_status
                .insert(t.name.clone(), antispam::python_loads(&log));
        }
    }
    timelines
}
