//! `fanout lab graphql-posts | graphql-posts-identical` (issue 72, acceptance 1): Tailcall's own
//! benchmark query, `{ posts { id title user { id name } } }` — 100 posts, each with one of 10
//! users, from jsonplaceholder-shaped stubs — served by fanout's `graphql:` route and by
//! **Tailcall 1.0.0** (the npm package `@tailcallhq/core-linux-x64-gnu@1.0.0`, installed with npm
//! into a cache directory under the cargo target directory at lab time) in the same run, with
//! the same schema and the same upstream calls written the way each system spells them.
//!
//! - `graphql-posts` (**distinct**): every request asks for another page through a variable
//!   (`query Posts($page: Int) { posts(page: $page) { … } }`, pages 1 … 1 024 in turn), each page
//!   with its own 10 users, so nothing one request fetches can serve another. `fanout` shares
//!   nothing between requests (coalescing and in-flight dedup off); `tailcall` is Tailcall without
//!   `dedupe` (what the brief asks for: nothing shared, and Tailcall then makes one user call per
//!   post); `tailcall-dedupe` is Tailcall with `dedupe: true` on both fields as the benchmark
//!   ships it — with distinct pages that only merges the calls within one request, the same
//!   1 + 10 calls fanout makes (equal work).
//! - `graphql-posts-identical`: the benchmark's fixed query, every request the same bytes (same
//!   headers too: both gateways key shared work by every header), each target with the sharing
//!   it ships: `fanout-coalesce` (whole-request coalescing and in-flight dedup, the gateway's
//!   defaults) and `tailcall-dedupe` (the benchmark's config).
//!
//! Before measuring, the lab checks the answers: the same query to every target (the fixed query
//! and three pages) must give **byte-identical** bodies, and it counts each target's stub calls
//! per request (stub admin API). Then interleaved trials (round r: the targets in order, reversed
//! on odd rounds) at one open-model rate: per trial the target's CPU (user+sys from `/proc`),
//! requests per CPU-second, latency from the intended send time, the generator's lag, and the
//! stub calls per request. The acceptance lines (`fanout` ≥ 2× the best Tailcall target on
//! distinct requests, the best fanout target ≥ 4× the best Tailcall target on identical ones) are
//! medians of the per-round ratios.
//!
//! A Tailcall target that cannot run (no npm, no network, another platform) **fails**: the report
//! lists it under `failed` with the reason and the lab exits with status 1 after writing it.

use crate::process::{Proc, ProcessError, free_addr};
use crate::procstat;
use crate::svg::esc;
use fanout_load::{LoadReport, LoadSpec, RequestTemplate, Schedule};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod tailcall;
pub use tailcall::{ensure_tailcall, npm_args, tailcall_bin_in, tailcall_dir, tailcall_sdl};

/// `fanout lab graphql-posts`: distinct requests.
pub const DISTINCT: &str = "graphql-posts";
/// `fanout lab graphql-posts-identical`: the benchmark's fixed query.
pub const IDENTICAL: &str = "graphql-posts-identical";
/// The scenarios of this module.
pub const NAMES: [&str; 2] = [DISTINCT, IDENTICAL];

/// fanout sharing nothing between requests.
pub const FANOUT: &str = "fanout";
/// fanout with coalescing and in-flight dedup (its defaults).
pub const FANOUT_COALESCE: &str = "fanout-coalesce";
/// Tailcall without `dedupe`.
pub const TAILCALL: &str = "tailcall";
/// Tailcall with `dedupe: true` on both fields (the benchmark's config).
pub const TAILCALL_DEDUPE: &str = "tailcall-dedupe";
/// The targets these scenarios take.
pub const TARGETS: [&str; 4] = [FANOUT, FANOUT_COALESCE, TAILCALL, TAILCALL_DEDUPE];

/// The Tailcall release compared.
pub const TAILCALL_VERSION: &str = "1.0.0";
/// The npm package that carries its Linux x86-64 binary.
pub const TAILCALL_PACKAGE: &str = "@tailcallhq/core-linux-x64-gnu";
/// The environment variable naming a Tailcall executable to use instead of installing one.
pub const TAILCALL_BIN_ENV: &str = "FANOUT_LAB_TAILCALL";

/// The stubs: `posts` (`GET /posts?page=N`) and `users` (`GET /users/{id}`).
pub const STUBS: &str = include_str!("scenarios/graphql-posts.stubs.yaml");
/// fanout's route `POST|GET /graphql` (the lab appends `defaults:` per target).
pub const GATEWAY: &str = include_str!("scenarios/graphql-posts.yaml");

/// The benchmark's query (tailcallhq/graphql-benchmarks).
pub const QUERY: &str = "{ posts { id title user { id name } } }";
/// The same selection for one page, through a variable.
pub const PAGE_QUERY: &str =
    "query Posts($page: Int) { posts(page: $page) { id title user { id name } } }";
/// Pages cycled by the distinct requests.
pub const PAGES: u32 = 1024;
/// The pages asked in the answer checks (with the fixed query).
pub const CHECK_PAGES: [u32; 3] = [1, 512, 1024];

/// Which of the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// [`DISTINCT`].
    Distinct,
    /// [`IDENTICAL`].
    Identical,
}

impl Mode {
    /// The scenario named `name`, if it is one of these.
    pub fn of(name: &str) -> Option<Mode> {
        match name {
            DISTINCT => Some(Mode::Distinct),
            IDENTICAL => Some(Mode::Identical),
            _ => None,
        }
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Distinct => DISTINCT,
            Mode::Identical => IDENTICAL,
        }
    }

    /// The targets run when `--targets` is not given.
    pub fn default_targets(self) -> &'static [&'static str] {
        match self {
            Mode::Distinct => &[FANOUT, TAILCALL, TAILCALL_DEDUPE],
            Mode::Identical => &[FANOUT_COALESCE, TAILCALL_DEDUPE],
        }
    }

    /// The requests the generator sends in turn.
    pub fn requests(self) -> Vec<RequestTemplate> {
        match self {
            Mode::Distinct => (1..=PAGES).map(|p| post(&page_body(p))).collect(),
            Mode::Identical => vec![post(&query_body())],
        }
    }

    /// The least ratio of requests per CPU-second (fanout ÷ Tailcall) the issue asks for.
    pub fn wanted_ratio(self) -> f64 {
        match self {
            Mode::Distinct => 2.0,
            Mode::Identical => 4.0,
        }
    }
}

/// The JSON body of the fixed query.
pub fn query_body() -> String {
    serde_json::json!({ "query": QUERY }).to_string()
}

/// The JSON body of page `page`'s query.
pub fn page_body(page: u32) -> String {
    serde_json::json!({ "query": PAGE_QUERY, "variables": { "page": page } }).to_string()
}

fn post(body: &str) -> RequestTemplate {
    RequestTemplate {
        method: http::Method::POST,
        path: "/graphql".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: bytes::Bytes::from(body.to_string()),
    }
}

/// fanout's config for `target`: [`GATEWAY`] with coalescing and dedup off (`fanout`) or on
/// (`fanout-coalesce`), stated.
pub fn fanout_yaml(target: &str) -> String {
    let on = target == FANOUT_COALESCE;
    format!("{GATEWAY}defaults:\n  coalesce: {on}\n  dedup: {on}\n")
}

/// What to run.
#[derive(Debug, Clone)]
pub struct GraphqlOptions {
    /// Which scenario.
    pub mode: Mode,
    /// Requests per second offered to each target (open model).
    pub rate: f64,
    /// Rounds (each: every target once, in turn).
    pub rounds: usize,
    /// Length of each trial's schedule.
    pub trial: Duration,
    /// Most client connections.
    pub connections: usize,
    /// The targets, in order.
    pub targets: Vec<String>,
    /// The Tailcall executable given (`--baseline-bin`); `None`: `$FANOUT_LAB_TAILCALL` or the
    /// one installed in [`tailcall_dir`].
    pub tailcall_bin: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
    /// The fanout executable (stub and gateway).
    pub fanout_bin: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
}

/// The default rate, req/s: Tailcall without dedupe makes 101 stub calls per request, and the
/// stubs share the machine's two cores with both gateways and the generator.
pub const RATE: f64 = 200.0;

impl GraphqlOptions {
    /// The defaults: 3 rounds of 10 s (`--quick`: 1 of 3 s) at [`RATE`], the mode's targets.
    pub fn new(
        mode: Mode,
        quick: bool,
        out: PathBuf,
        fanout_bin: PathBuf,
        command: String,
    ) -> GraphqlOptions {
        GraphqlOptions {
            mode,
            rate: RATE,
            rounds: if quick { 1 } else { 3 },
            trial: Duration::from_secs(if quick { 3 } else { 10 }),
            connections: 128,
            targets: mode
                .default_targets()
                .iter()
                .map(|t| t.to_string())
                .collect(),
            tailcall_bin: None,
            out,
            fanout_bin,
            command,
            quick,
        }
    }
}

/// One target's answer to one check request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    /// The target.
    pub target: String,
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub bytes: usize,
    /// `GET /posts` calls the stubs got for it.
    pub posts_calls: u64,
    /// `GET /users/{id}` calls the stubs got for it.
    pub users_calls: u64,
}

/// One check: the same request to every target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    /// The request body.
    pub request: String,
    /// Every target's answer, in order.
    pub answers: Vec<Answer>,
    /// Whether every body is byte-identical to the first target's.
    pub identical: bool,
    /// Where the first body that differs departs from the first target's: the target, the byte
    /// offset and 80 bytes of each from a little before it.
    pub difference: Option<Difference>,
    /// The first target's body (the fixed query's check only; others: `null`).
    pub body: Option<String>,
}

/// Where two answers part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Difference {
    /// The target whose body differs from the first target's.
    pub target: String,
    /// The first byte that differs (or the shorter length).
    pub offset: usize,
    /// The first target's bytes around it.
    pub first: String,
    /// This target's bytes around it.
    pub other: String,
}

/// Compare `b` with `a`: `None` when equal.
pub fn difference(target: &str, a: &[u8], b: &[u8]) -> Option<Difference> {
    if a == b {
        return None;
    }
    let offset = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let from = offset.saturating_sub(20);
    let around = |s: &[u8]| {
        String::from_utf8_lossy(&s[from.min(s.len())..(from + 80).min(s.len())]).into_owned()
    };
    Some(Difference {
        target: target.to_string(),
        offset,
        first: around(a),
        other: around(b),
    })
}

/// One trial of one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GqlTrial {
    /// Round number (0-based).
    pub round: usize,
    /// The target.
    pub target: String,
    /// Requests the schedule asked for.
    pub offered: u64,
    /// 2xx answers.
    pub ok: u64,
    /// Requests without a 2xx answer.
    pub failed: u64,
    /// The target's CPU over the trial (user+sys, µs).
    pub cpu_us: u64,
    /// CPU-µs per 2xx answer.
    pub cpu_us_per_request: Option<f64>,
    /// 2xx answers per CPU-second of the target.
    pub requests_per_cpu_s: Option<f64>,
    /// Latency p50 from the intended send time, ms.
    pub p50_ms: f64,
    /// p99 of the same, ms.
    pub p99_ms: f64,
    /// Whether the generator kept its schedule (its lag p99 under 1 ms).
    pub generator_on_schedule: bool,
    /// The generator's lag p99, ms.
    pub lag_p99_ms: f64,
    /// `GET /posts` calls per 2xx answer.
    pub posts_calls_per_request: Option<f64>,
    /// `GET /users/{id}` calls per 2xx answer.
    pub users_calls_per_request: Option<f64>,
}

/// A target's figures over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetFigures {
    /// The target.
    pub target: String,
    /// Median requests per CPU-second over its trials.
    pub requests_per_cpu_s: f64,
    /// Lowest trial.
    pub min: f64,
    /// Highest trial.
    pub max: f64,
    /// Median CPU-µs per request.
    pub cpu_us_per_request: f64,
    /// Median p50, ms.
    pub p50_ms: f64,
    /// Median p99, ms.
    pub p99_ms: f64,
    /// Median user calls per request.
    pub users_calls_per_request: f64,
    /// Trials measured.
    pub n: usize,
    /// Failed requests over all trials.
    pub failed: u64,
    /// Trials whose generator fell behind.
    pub generator_behind: usize,
}

/// A fanout target beside a Tailcall target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ratio {
    /// The fanout target.
    pub fanout: String,
    /// The Tailcall target.
    pub tailcall: String,
    /// Median over the rounds of fanout's requests per CPU-second ÷ Tailcall's in that round.
    pub median_of_ratios: f64,
    /// fanout's median ÷ Tailcall's median.
    pub ratio_of_medians: f64,
    /// Rounds with both.
    pub rounds: usize,
}

/// `report.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GraphqlReport {
    /// `graphql-posts` or `graphql-posts-identical`.
    pub scenario: String,
    /// In words.
    pub about: String,
    /// The command line.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
    /// Requests per second offered to each target.
    pub rate: f64,
    /// Seconds per trial's schedule.
    pub trial_s: f64,
    /// Most client connections.
    pub connections: usize,
    /// Cores the machine offers (fanout's and Tailcall's worker threads).
    pub cores: usize,
    /// The Tailcall executable and its version, when it ran.
    pub tailcall: Option<String>,
    /// Targets asked for that could not run, with why (the lab then exits with status 1).
    pub failed: BTreeMap<String, String>,
    /// The answer checks made before measuring.
    pub checks: Vec<Check>,
    /// Every trial, in the order run.
    pub trials: Vec<GqlTrial>,
    /// Per target that ran.
    pub figures: Vec<TargetFigures>,
    /// Every fanout target beside every Tailcall target.
    pub ratios: Vec<Ratio>,
    /// The acceptance lines, with whether each held.
    pub acceptance: Vec<(String, bool)>,
}

/// What can stop the run.
#[derive(Debug, thiserror::Error)]
pub enum GraphqlError {
    /// A process did not start or become ready.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A file could not be written, or a port found.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The load generator refused the spec.
    #[error("load: {0}")]
    Load(String),
    /// A stub admin call failed.
    #[error("stubs: {0}")]
    Stubs(String),
    /// A target the scenario does not take.
    #[error(
        "unknown target `{0}` for this scenario: it takes fanout, fanout-coalesce, tailcall and tailcall-dedupe"
    )]
    Target(String),
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> GraphqlError + '_ {
    move |e| GraphqlError::Io(p.display().to_string(), e)
}

struct Running {
    name: String,
    addr: SocketAddr,
    proc: Proc,
}

/// The stubs' call counters: (`GET /posts`, `GET /users/{id}`) since the last reset.
async fn stub_calls(posts: SocketAddr, users: SocketAddr) -> Result<(u64, u64), GraphqlError> {
    let count = |body: &[u8], route: &str| -> u64 {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["routes"][route]["requests"].as_u64())
            .unwrap_or(0)
    };
    let (_, p) = crate::http::get(posts, "/__stub/stats")
        .await
        .map_err(|e| GraphqlError::Stubs(e.to_string()))?;
    let (_, u) = crate::http::get(users, "/__stub/stats")
        .await
        .map_err(|e| GraphqlError::Stubs(e.to_string()))?;
    Ok((count(&p, "GET /posts"), count(&u, "GET /users/{id}")))
}

async fn reset_stubs(posts: SocketAddr, users: SocketAddr) -> Result<(), GraphqlError> {
    for a in [posts, users] {
        crate::http::call(http::Method::POST, a, "/__stub/reset", None)
            .await
            .map_err(|e| GraphqlError::Stubs(e.to_string()))?;
    }
    Ok(())
}

/// Run the scenario and write `report.json` and `report.html` into `opts.out`.
pub async fn run(opts: GraphqlOptions) -> Result<GraphqlReport, GraphqlError> {
    if let Some(t) = opts.targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
        return Err(GraphqlError::Target(t.clone()));
    }
    std::fs::create_dir_all(&opts.out).map_err(io(&opts.out))?;
    let posts = free_addr().map_err(io(&opts.out))?;
    let users = free_addr().map_err(io(&opts.out))?;
    let mut env = HashMap::new();
    env.insert("POSTS_ADDR".to_string(), posts.to_string());
    env.insert("USERS_ADDR".to_string(), users.to_string());
    let stubs_file = opts.out.join("stubs.yaml");
    std::fs::write(&stubs_file, STUBS).map_err(io(&stubs_file))?;
    let s = |v: &str| v.to_string();
    let mut stub = Proc::spawn(
        "stubs",
        &opts.fanout_bin,
        &[s("stub"), s("--config"), stubs_file.display().to_string()],
        &env,
        &opts.out.join("stubs.log"),
    )?;
    stub.wait_ready(posts, "/__stub/stats", Duration::from_secs(15))
        .await?;
    stub.wait_ready(users, "/__stub/stats", Duration::from_secs(15))
        .await?;

    // Tailcall, installed once for both of its targets.
    let wants_tailcall = opts.targets.iter().any(|t| t.starts_with("tailcall"));
    let tailcall = if wants_tailcall {
        Some(ensure_tailcall(opts.tailcall_bin.clone(), &tailcall_dir(&opts.fanout_bin)).await)
    } else {
        None
    };

    let mut running: Vec<Running> = Vec::new();
    let mut failed = BTreeMap::new();
    let mut tailcall_version = None;
    for t in &opts.targets {
        let addr = free_addr().map_err(io(&opts.out))?;
        let p = if t.starts_with("fanout") {
            let mut env = env.clone();
            env.insert("LISTEN".to_string(), addr.to_string());
            let f = opts.out.join(format!("{t}.yaml"));
            std::fs::write(&f, fanout_yaml(t)).map_err(io(&f))?;
            Proc::spawn(
                t,
                &opts.fanout_bin,
                &[
                    s("serve"),
                    s("--config"),
                    f.display().to_string(),
                    s("--admin-listen"),
                    s("127.0.0.1:0"),
                ],
                &env,
                &opts.out.join(format!("{t}.log")),
            )?
        } else {
            let bin = match &tailcall {
                Some(Ok((bin, v))) => {
                    tailcall_version = Some(format!("{v} ({})", bin.display()));
                    bin
                }
                Some(Err(why)) => {
                    failed.insert(t.clone(), why.clone());
                    continue;
                }
                None => continue,
            };
            let f = opts.out.join(format!("{t}.graphql"));
            std::fs::write(&f, tailcall_sdl(addr, posts, users, t == TAILCALL_DEDUPE))
                .map_err(io(&f))?;
            let mut env = HashMap::new();
            // No usage reports to Tailcall's tracker; errors only in its log, as fanout's.
            env.insert("TC_TRACKER".to_string(), "false".to_string());
            env.insert("TAILCALL_LOG_LEVEL".to_string(), "error".to_string());
            Proc::spawn(
                t,
                bin,
                &[s("start"), f.display().to_string()],
                &env,
                &opts.out.join(format!("{t}.log")),
            )?
        };
        let mut p = p;
        p.wait_ready(addr, "/graphql", Duration::from_secs(20))
            .await?;
        running.push(Running {
            name: t.clone(),
            addr,
            proc: p,
        });
    }

    // The answers, before anything is measured.
    let mut checks = Vec::new();
    let mut bodies = vec![query_body()];
    bodies.extend(CHECK_PAGES.iter().map(|&p| page_body(p)));
    for (i, body) in bodies.iter().enumerate() {
        let mut answers = Vec::new();
        let mut raw: Vec<bytes::Bytes> = Vec::new();
        for r in &running {
            reset_stubs(posts, users).await?;
            let (status, b) =
                crate::http::call(http::Method::POST, r.addr, "/graphql", Some(body.clone()))
                    .await
                    .map_err(|e| GraphqlError::Stubs(format!("{}: {e}", r.name)))?;
            let (posts_calls, users_calls) = stub_calls(posts, users).await?;
            answers.push(Answer {
                target: r.name.clone(),
                status,
                bytes: b.len(),
                posts_calls,
                users_calls,
            });
            raw.push(b);
        }
        let diff = raw
            .iter()
            .zip(&answers)
            .skip(1)
            .find_map(|(b, a)| difference(&a.target, &raw[0], b));
        checks.push(Check {
            request: body.clone(),
            identical: diff.is_none() && answers.iter().all(|a| a.status == 200),
            difference: diff,
            body: (i == 0)
                .then(|| raw.first().map(|b| String::from_utf8_lossy(b).into_owned()))
                .flatten(),
            answers,
        });
    }

    // Warm-up: connections, plan caches; not measured.
    for r in &running {
        load(&opts, r.addr, Duration::from_secs(1)).await?;
    }
    let mut trials = Vec::new();
    for round in 0..opts.rounds {
        let mut order: Vec<usize> = (0..running.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let r = &running[i];
            reset_stubs(posts, users).await?;
            let pid = r.proc.pid();
            let cpu0 = pid.and_then(procstat::cpu_total_us);
            let rep = load(&opts, r.addr, opts.trial).await?;
            let cpu1 = pid.and_then(procstat::cpu_total_us);
            let cpu_us = match (cpu0, cpu1) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => 0,
            };
            let calls = stub_calls(posts, users).await?;
            trials.push(trial(round, &r.name, &rep, cpu_us, calls));
        }
    }
    for r in running {
        r.proc.stop().await;
    }
    stub.stop().await;

    let rep = summarise(&opts, checks, trials, failed, tailcall_version);
    let json = serde_json::to_string_pretty(&rep).unwrap_or_default();
    let jf = opts.out.join("report.json");
    std::fs::write(&jf, &json).map_err(io(&jf))?;
    let hf = opts.out.join("report.html");
    std::fs::write(&hf, html(&rep, &json)).map_err(io(&hf))?;
    Ok(rep)
}

async fn load(
    opts: &GraphqlOptions,
    addr: SocketAddr,
    len: Duration,
) -> Result<LoadReport, GraphqlError> {
    let schedule = Schedule::parse(&format!("const({},{}ms)", opts.rate, len.as_millis()))
        .map_err(|e| GraphqlError::Load(e.to_string()))?;
    let mut spec = LoadSpec::new(format!("http://{addr}"), schedule);
    spec.requests = opts.mode.requests();
    spec.max_connections = opts.connections;
    spec.timeout = Duration::from_secs(5);
    spec.drain = Duration::from_secs(5);
    fanout_load::run(&spec, None)
        .await
        .map_err(|e| GraphqlError::Load(e.to_string()))
}

/// The trial's figures from the load report, the target's CPU and the stubs' calls.
pub fn trial(
    round: usize,
    target: &str,
    r: &LoadReport,
    cpu_us: u64,
    calls: (u64, u64),
) -> GqlTrial {
    let per = |n: u64| (r.ok > 0).then(|| n as f64 / r.ok as f64);
    GqlTrial {
        round,
        target: target.to_string(),
        offered: r.offered,
        ok: r.ok,
        failed: r.offered.saturating_sub(r.ok),
        cpu_us,
        cpu_us_per_request: per(cpu_us),
        requests_per_cpu_s: (cpu_us > 0).then(|| r.ok as f64 / (cpu_us as f64 / 1e6)),
        p50_ms: r.latency_ms.p50,
        p99_ms: r.latency_ms.p99,
        generator_on_schedule: r.valid,
        lag_p99_ms: r.lag_ms.p99,
        posts_calls_per_request: per(calls.0),
        users_calls_per_request: per(calls.1),
    }
}

fn stat(v: Vec<f64>) -> crate::report::Stat {
    crate::report::Stat::of(v)
}

/// About the scenario, in words.
fn about(opts: &GraphqlOptions) -> String {
    let what = match opts.mode {
        Mode::Distinct => format!(
            "Tailcall's benchmark query for a different page per request (`posts(page: $page)`, {PAGES} pages in turn, each with its own 10 users: nothing can be shared between requests)"
        ),
        Mode::Identical => "Tailcall's benchmark query `{ posts { id title user { id name } } }`, every request the same bytes (each target shares what it ships sharing)".to_string(),
    };
    format!(
        "{what}: 100 posts with their users from jsonplaceholder-shaped stubs, through fanout's graphql: route and Tailcall {TAILCALL_VERSION}, {} req/s open model each, interleaved",
        opts.rate
    )
}

fn is_fanout(t: &str) -> bool {
    t.starts_with("fanout")
}

/// Medians per target, the ratios, the acceptance lines.
pub fn summarise(
    opts: &GraphqlOptions,
    checks: Vec<Check>,
    trials: Vec<GqlTrial>,
    failed: BTreeMap<String, String>,
    tailcall: Option<String>,
) -> GraphqlReport {
    let mut names: Vec<String> = Vec::new();
    for t in &trials {
        if !names.contains(&t.target) {
            names.push(t.target.clone());
        }
    }
    let figures: Vec<TargetFigures> = names
        .iter()
        .map(|n| {
            let mine: Vec<&GqlTrial> = trials.iter().filter(|t| &t.target == n).collect();
            let rps = stat(mine.iter().filter_map(|t| t.requests_per_cpu_s).collect());
            TargetFigures {
                target: n.clone(),
                requests_per_cpu_s: rps.median,
                min: rps.min,
                max: rps.max,
                cpu_us_per_request: stat(
                    mine.iter().filter_map(|t| t.cpu_us_per_request).collect(),
                )
                .median,
                p50_ms: stat(mine.iter().map(|t| t.p50_ms).collect()).median,
                p99_ms: stat(mine.iter().map(|t| t.p99_ms).collect()).median,
                users_calls_per_request: stat(
                    mine.iter()
                        .filter_map(|t| t.users_calls_per_request)
                        .collect(),
                )
                .median,
                n: rps.n,
                failed: mine.iter().map(|t| t.failed).sum(),
                generator_behind: mine.iter().filter(|t| !t.generator_on_schedule).count(),
            }
        })
        .collect();
    let of = |n: &str| figures.iter().find(|f| f.target == n && f.n > 0);
    let mut ratios = Vec::new();
    for f in figures.iter().filter(|f| is_fanout(&f.target) && f.n > 0) {
        for t in figures.iter().filter(|t| !is_fanout(&t.target) && t.n > 0) {
            let per_round: Vec<f64> = (0..opts.rounds)
                .filter_map(|round| {
                    let c = |n: &str| {
                        trials
                            .iter()
                            .find(|x| x.round == round && x.target == n)
                            .and_then(|x| x.requests_per_cpu_s)
                    };
                    match (c(&f.target), c(&t.target)) {
                        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                        _ => None,
                    }
                })
                .collect();
            if per_round.is_empty() || t.requests_per_cpu_s <= 0.0 {
                continue;
            }
            ratios.push(Ratio {
                fanout: f.target.clone(),
                tailcall: t.target.clone(),
                rounds: per_round.len(),
                median_of_ratios: stat(per_round).median,
                ratio_of_medians: f.requests_per_cpu_s / t.requests_per_cpu_s,
            });
        }
    }

    let mut acceptance = Vec::new();
    // The answers: byte-identical, and fanout's calls per request.
    if running_more_than_one(&checks) {
        let same = checks.iter().all(|c| c.identical);
        acceptance.push((
            format!(
                "answers byte-identical across the targets ({} requests checked)",
                checks.len()
            ),
            same,
        ));
    }
    let fanout_targets: Vec<String> = checks
        .first()
        .map(|c| {
            c.answers
                .iter()
                .filter(|a| is_fanout(&a.target))
                .map(|a| a.target.clone())
                .collect()
        })
        .unwrap_or_default();
    for t in &fanout_targets {
        let calls: Vec<(u64, u64)> = checks
            .iter()
            .flat_map(|c| c.answers.iter().filter(|a| &a.target == t))
            .map(|a| (a.posts_calls, a.users_calls))
            .collect();
        acceptance.push((
            format!("{t}: one /posts call and 10 deduplicated /users calls per request (checked: {calls:?})"),
            calls.iter().all(|&c| c == (1, 10)),
        ));
    }
    // Requests per CPU-second: the fanout target that answers the mode against the best Tailcall.
    let best_tailcall = figures
        .iter()
        .filter(|f| !is_fanout(&f.target) && f.n > 0)
        .max_by(|a, b| a.requests_per_cpu_s.total_cmp(&b.requests_per_cpu_s));
    let mine = match opts.mode {
        Mode::Distinct => of(FANOUT),
        Mode::Identical => figures
            .iter()
            .filter(|f| is_fanout(&f.target) && f.n > 0)
            .max_by(|a, b| a.requests_per_cpu_s.total_cmp(&b.requests_per_cpu_s)),
    };
    if let (Some(f), Some(t)) = (mine, best_tailcall)
        && let Some(r) = ratios
            .iter()
            .find(|r| r.fanout == f.target && r.tailcall == t.target)
    {
        let want = opts.mode.wanted_ratio();
        acceptance.push((
            format!(
                "{} ≥ {want}× {}'s requests per CPU-second: {:.0} vs {:.0} (×{:.2} median of {} per-round ratios; ×{:.2} of the medians)",
                f.target, t.target, f.requests_per_cpu_s, t.requests_per_cpu_s, r.median_of_ratios, r.rounds, r.ratio_of_medians
            ),
            r.median_of_ratios >= want,
        ));
    }
    GraphqlReport {
        scenario: opts.mode.name().to_string(),
        about: about(opts),
        command: opts.command.clone(),
        quick: opts.quick,
        rate: opts.rate,
        trial_s: opts.trial.as_secs_f64(),
        connections: opts.connections,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        tailcall,
        failed,
        checks,
        trials,
        figures,
        ratios,
        acceptance,
    }
}

fn running_more_than_one(checks: &[Check]) -> bool {
    checks.first().is_some_and(|c| c.answers.len() > 1)
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "—".to_string(), |c| format!("{c:.prec$}"))
}

/// The text printed at the end of a run.
pub fn text_summary(rep: &GraphqlReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}: {}", rep.scenario, rep.about);
    for (t, why) in &rep.failed {
        let _ = writeln!(s, "FAILED: {t}: not run — {why}");
    }
    if let Some(v) = &rep.tailcall {
        let _ = writeln!(s, "tailcall: {v}");
    }
    let _ = writeln!(s, "answer checks (status, bytes, /posts and /users calls):");
    for c in &rep.checks {
        let who: Vec<String> = c
            .answers
            .iter()
            .map(|a| {
                format!(
                    "{} {} {}B {}+{}",
                    a.target, a.status, a.bytes, a.posts_calls, a.users_calls
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "  {} {}: {}",
            if c.identical { "same" } else { "DIFFER" },
            c.request,
            who.join(", ")
        );
        if let Some(d) = &c.difference {
            let _ = writeln!(
                s,
                "    {} differs at byte {}: {:?} vs {:?}",
                d.target, d.offset, d.first, d.other
            );
        }
    }
    let _ = writeln!(
        s,
        "{:>5} {:>16} {:>7} {:>6} {:>6} {:>9} {:>10} {:>8} {:>8} {:>10}",
        "round",
        "target",
        "offered",
        "ok",
        "failed",
        "CPU µs/r",
        "req/CPU-s",
        "p50 ms",
        "p99 ms",
        "users/req"
    );
    for t in &rep.trials {
        let _ = writeln!(
            s,
            "{:>5} {:>16} {:>7} {:>6} {:>6} {:>9} {:>10} {:>8.2} {:>8.2} {:>10}{}",
            t.round,
            t.target,
            t.offered,
            t.ok,
            t.failed,
            opt(t.cpu_us_per_request, 0),
            opt(t.requests_per_cpu_s, 0),
            t.p50_ms,
            t.p99_ms,
            opt(t.users_calls_per_request, 1),
            if t.generator_on_schedule {
                String::new()
            } else {
                format!(
                    "  (generator behind schedule: lag p99 {:.1} ms)",
                    t.lag_p99_ms
                )
            }
        );
    }
    for f in &rep.figures {
        let _ = writeln!(
            s,
            "{}: {:.0} requests per CPU-second (median of {}; {:.0}–{:.0}), {:.0} CPU-µs per request, p50 {:.2} ms, p99 {:.2} ms, {:.1} user calls per request, failed {}, generator behind in {} trial(s)",
            f.target,
            f.requests_per_cpu_s,
            f.n,
            f.min,
            f.max,
            f.cpu_us_per_request,
            f.p50_ms,
            f.p99_ms,
            f.users_calls_per_request,
            f.failed,
            f.generator_behind
        );
    }
    for r in &rep.ratios {
        let _ = writeln!(
            s,
            "{} ÷ {}: ×{:.2} (median of {} per-round ratios), ×{:.2} (ratio of medians)",
            r.fanout, r.tailcall, r.median_of_ratios, r.rounds, r.ratio_of_medians
        );
    }
    for (line, ok) in &rep.acceptance {
        let _ = writeln!(s, "{} {line}", if *ok { "PASS" } else { "FAIL" });
    }
    s
}

pub(crate) fn html(rep: &GraphqlReport, json: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fanout lab: {name}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1100px}}table{{border-collapse:collapse;margin:12px 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f0f0f0}}.warn{{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}}code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>
<h1>fanout lab — {name}</h1><p>{about}.</p><p>Command: <code>{cmd}</code></p>"#,
        name = esc(&rep.scenario),
        about = esc(&rep.about),
        cmd = esc(&rep.command),
    );
    for (t, why) in &rep.failed {
        let _ = write!(
            h,
            r#"<div class="warn">FAILED: {}: not run — {}</div>"#,
            esc(t),
            esc(why)
        );
    }
    h.push_str("<h2>Acceptance</h2><ul>");
    for (line, ok) in &rep.acceptance {
        let _ = write!(
            h,
            "<li>{} {}</li>",
            if *ok { "PASS" } else { "FAIL" },
            esc(line)
        );
    }
    h.push_str("</ul><h2>Answer checks</h2><table><tr><th>request</th><th>identical</th><th>target: status, bytes, /posts + /users calls</th></tr>");
    for c in &rep.checks {
        let who: Vec<String> = c
            .answers
            .iter()
            .map(|a| {
                format!(
                    "{}: {}, {} B, {} + {}",
                    a.target, a.status, a.bytes, a.posts_calls, a.users_calls
                )
            })
            .collect();
        let _ = write!(
            h,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            esc(&c.request),
            c.identical,
            esc(&who.join("; "))
        );
    }
    h.push_str("</table><h2>Requests per CPU-second</h2><table><tr><th>target</th><th>median</th><th>min</th><th>max</th><th>CPU µs / request</th><th>p50 ms</th><th>p99 ms</th><th>user calls / request</th><th>trials</th><th>failed</th><th>generator behind</th></tr>");
    for f in &rep.figures {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.2}</td><td>{:.2}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&f.target),
            f.requests_per_cpu_s,
            f.min,
            f.max,
            f.cpu_us_per_request,
            f.p50_ms,
            f.p99_ms,
            f.users_calls_per_request,
            f.n,
            f.failed,
            f.generator_behind
        );
    }
    h.push_str("</table><h2>Ratios</h2><table><tr><th>fanout target</th><th>Tailcall target</th><th>median of per-round ratios</th><th>ratio of medians</th><th>rounds</th></tr>");
    for r in &rep.ratios {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td></tr>",
            esc(&r.fanout),
            esc(&r.tailcall),
            r.median_of_ratios,
            r.ratio_of_medians,
            r.rounds
        );
    }
    h.push_str("</table><h2>Trials</h2><table><tr><th>round</th><th>target</th><th>offered</th><th>ok</th><th>failed</th><th>CPU ms</th><th>req / CPU-s</th><th>p50 ms</th><th>p99 ms</th><th>/posts per request</th><th>/users per request</th><th>generator on schedule</th></tr>");
    for t in &rep.trials {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.round,
            esc(&t.target),
            t.offered,
            t.ok,
            t.failed,
            t.cpu_us as f64 / 1e3,
            opt(t.requests_per_cpu_s, 0),
            t.p50_ms,
            t.p99_ms,
            opt(t.posts_calls_per_request, 2),
            opt(t.users_calls_per_request, 2),
            t.generator_on_schedule
        );
    }
    let _ = write!(
        h,
        "</table><details><summary>report.json</summary><pre>{}</pre></details></body></html>",
        esc(json)
    );
    h
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn opts(mode: Mode) -> GraphqlOptions {
        GraphqlOptions::new(mode, true, "x".into(), "f".into(), "c".into())
    }

    fn t(round: usize, target: &str, rps: f64) -> GqlTrial {
        GqlTrial {
            round,
            target: target.into(),
            offered: 10,
            ok: 10,
            failed: 0,
            cpu_us: 100,
            cpu_us_per_request: Some(1e6 / rps),
            requests_per_cpu_s: Some(rps),
            p50_ms: 1.0,
            p99_ms: 2.0,
            generator_on_schedule: true,
            lag_p99_ms: 0.1,
            posts_calls_per_request: Some(1.0),
            users_calls_per_request: Some(10.0),
        }
    }

    fn check(calls: &[(&str, u64, u64)], identical: bool) -> Check {
        Check {
            request: query_body(),
            answers: calls
                .iter()
                .map(|&(target, p, u)| Answer {
                    target: target.into(),
                    status: 200,
                    bytes: 9612,
                    posts_calls: p,
                    users_calls: u,
                })
                .collect(),
            identical,
            difference: None,
            body: None,
        }
    }

    #[test]
    fn the_stubs_load_and_the_requests_ask_the_benchmark_query() {
        fanout_stub::load_in("stubs.yaml", STUBS, &|_| None, None).expect("stubs");
        let d = Mode::Distinct.requests();
        assert_eq!(d.len(), PAGES as usize);
        let bodies: std::collections::BTreeSet<_> = d.iter().map(|r| &r.body).collect();
        assert_eq!(bodies.len(), PAGES as usize, "every request another page");
        let first: serde_json::Value = serde_json::from_slice(&d[0].body).unwrap();
        assert_eq!(first["variables"]["page"], 1);
        assert_eq!(first["query"], PAGE_QUERY);
        let i = Mode::Identical.requests();
        assert_eq!(
            i.len(),
            1,
            "one template: every request the same bytes and headers"
        );
        let q: serde_json::Value = serde_json::from_slice(&i[0].body).unwrap();
        assert_eq!(q["query"], "{ posts { id title user { id name } } }");
        for r in d.iter().chain(&i) {
            assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/graphql"));
        }
    }

    #[test]
    fn fanout_states_what_it_shares_and_tailcall_gets_the_benchmark_config() {
        assert!(fanout_yaml(FANOUT).ends_with("defaults:\n  coalesce: false\n  dedup: false\n"));
        assert!(
            fanout_yaml(FANOUT_COALESCE).ends_with("defaults:\n  coalesce: true\n  dedup: true\n")
        );
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let off = tailcall_sdl(a(1), a(2), a(3), false);
        for line in [
            r#"@server(hostname: "127.0.0.1", port: 1)"#,
            "@upstream(poolMaxIdlePerHost: 200, tcpKeepAlive: 60)",
            r#"@http(url: "http://127.0.0.1:2/posts", query: [{key: "page", value: "{{.args.page}}", skipEmpty: true}])"#,
            r#"user: User @http(url: "http://127.0.0.1:3/users/{{.value.userId}}")"#,
        ] {
            assert!(off.contains(line), "{line}:\n{off}");
        }
        assert!(!off.contains("dedupe") && !off.contains("httpCache"));
        let on = tailcall_sdl(a(1), a(2), a(3), true);
        assert_eq!(on.matches("dedupe: true").count(), 2, "{on}");
    }

    #[test]
    fn tailcall_is_installed_under_the_cargo_target_directory() {
        let d = tailcall_dir(Path::new("/src/fanout/target/release/fanout"));
        if std::env::var_os("FANOUT_LAB_TAILCALL_DIR").is_none() {
            assert_eq!(d, Path::new("/src/fanout/target/lab-cache/tailcall-1.0.0"));
        }
        assert_eq!(
            tailcall_bin_in(Path::new("/c")),
            Path::new("/c/node_modules/@tailcallhq/core-linux-x64-gnu/bin/tailcall")
        );
        assert_eq!(
            npm_args(Path::new("/c")).last().map(String::as_str),
            Some("@tailcallhq/core-linux-x64-gnu@1.0.0")
        );
    }

    #[test]
    fn a_difference_names_the_byte_and_shows_both_sides() {
        assert!(difference("t", b"{\"a\":1}", b"{\"a\":1}").is_none());
        let d = difference("tailcall", b"{\"id\":1,\"n\":2}", b"{\"id\":1.0,\"n\":2}").unwrap();
        assert_eq!(d.offset, 7);
        assert_eq!(d.target, "tailcall");
        assert!(d.first.contains("\"id\":1,") && d.other.contains("\"id\":1.0"));
        // One a prefix of the other: the shorter length.
        assert_eq!(difference("t", b"ab", b"abc").unwrap().offset, 2);
    }

    #[test]
    fn the_acceptance_is_the_median_of_per_round_ratios_against_the_best_tailcall() {
        let trials = vec![
            t(0, FANOUT, 3000.0),
            t(0, TAILCALL, 500.0),
            t(0, TAILCALL_DEDUPE, 1000.0),
            t(1, TAILCALL_DEDUPE, 1500.0),
            t(1, TAILCALL, 600.0),
            t(1, FANOUT, 2400.0),
            t(2, FANOUT, 2500.0),
            t(2, TAILCALL, 550.0),
            t(2, TAILCALL_DEDUPE, 1000.0),
        ];
        let checks = vec![check(
            &[
                (FANOUT, 1, 10),
                (TAILCALL, 1, 100),
                (TAILCALL_DEDUPE, 1, 10),
            ],
            true,
        )];
        let mut o = opts(Mode::Distinct);
        o.rounds = 3;
        let rep = summarise(&o, checks, trials, BTreeMap::new(), None);
        assert_eq!(rep.figures.len(), 3);
        assert_eq!(rep.ratios.len(), 2, "fanout beside each Tailcall target");
        let r = rep
            .ratios
            .iter()
            .find(|r| r.tailcall == TAILCALL_DEDUPE)
            .unwrap();
        // Per round: 3.0, 1.6, 2.5 → median 2.5.
        assert!((r.median_of_ratios - 2.5).abs() < 1e-9, "{r:?}");
        assert_eq!(r.rounds, 3);
        let lines: Vec<&str> = rep.acceptance.iter().map(|(l, _)| l.as_str()).collect();
        assert!(rep.acceptance.iter().all(|(_, ok)| *ok), "{lines:?}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("fanout ≥ 2× tailcall-dedupe's")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("answers byte-identical")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("fanout: one /posts call")),
            "{lines:?}"
        );
        let text = text_summary(&rep);
        assert!(text.contains("PASS fanout ≥ 2×"), "{text}");
        assert!(html(&rep, "{}").contains("<h2>Answer checks</h2>"));
        // report.json reads back as this kind of report (the lab's tests check every run's).
        let back =
            crate::recorded::Recorded::parse("r.json", &serde_json::to_string(&rep).unwrap())
                .unwrap();
        assert!(matches!(back, crate::recorded::Recorded::Graphql(_)));
        assert_eq!(back.text(), text);

        // Identical requests: the best fanout target against the best Tailcall, 4×.
        let rep = summarise(
            &opts(Mode::Identical),
            vec![check(&[(FANOUT_COALESCE, 1, 11)], true)],
            vec![t(0, FANOUT_COALESCE, 3000.0), t(0, TAILCALL_DEDUPE, 1000.0)],
            BTreeMap::new(),
            None,
        );
        let (line, ok) = rep.acceptance.last().unwrap();
        assert!(
            line.starts_with("fanout-coalesce ≥ 4× tailcall-dedupe's") && !ok,
            "{line}"
        );
        assert!(
            !rep.acceptance[0].1,
            "11 user calls is not 10: {:?}",
            rep.acceptance
        );
    }

    #[test]
    fn a_tailcall_that_could_not_run_is_a_failure_in_the_report() {
        let mut failed = BTreeMap::new();
        failed.insert(TAILCALL.to_string(), "no npm".to_string());
        let rep = summarise(
            &opts(Mode::Distinct),
            vec![check(&[(FANOUT, 1, 10)], true)],
            vec![t(0, FANOUT, 1.0)],
            failed,
            None,
        );
        assert!(rep.ratios.is_empty());
        assert!(text_summary(&rep).contains("FAILED: tailcall: not run — no npm"));
        assert!(html(&rep, "{}").contains("FAILED: tailcall"));
    }
}
