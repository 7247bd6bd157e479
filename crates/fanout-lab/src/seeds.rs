//! `fanout lab seeds`: every scenario that reproduces a seed article (`../shared/seeds/000…004`),
//! run in turn through the same entry points as `fanout lab SCENARIO` ([`crate::run`],
//! [`crate::threads::run`]), each into its own subdirectory; then one `report.json` and
//! `report.html` at the top that put each article's figures (as data, below) beside this
//! machine's, with links to each scenario's own report. A scenario that cannot run here (no Java,
//! no PostgreSQL, or it failed) is listed as `not run: why`, never a failed command. The figures
//! are read from each scenario's report; this module measures nothing itself.

use crate::report::LabReport;
use crate::svg::{Series, esc, line_chart};
use crate::threads::{self, ThreadsReport};
use crate::{LabOptions, antispam, java, postgres, scenario};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Its name on the command line.
pub const NAME: &str = "seeds";

/// One scenario of an article: which targets answer it, full and `--quick`.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Index into [`ARTICLES`].
    pub article: usize,
    /// Scenario name (`fanout lab SCENARIO`).
    pub scenario: &'static str,
    /// Targets of the full run (empty: the scenario's defaults, or none for `threads`).
    pub full: &'static [&'static str],
    /// Targets of the `--quick` run: the fewest that still answer the article.
    pub quick: &'static [&'static str],
}

/// Every seed scenario, in the order run.
pub const ENTRIES: [Entry; 9] = [
    Entry {
        article: 0,
        scenario: threads::NAME,
        full: &[],
        quick: &[],
    },
    Entry {
        article: 0,
        scenario: "hh-vacancies",
        full: &["fanout"],
        quick: &["fanout"],
    },
    Entry {
        article: 0,
        scenario: "slow-backend",
        full: &["fanout"],
        quick: &["fanout"],
    },
    // Issue 26 §1, second part: the Java pools of 8 … 4 096 threads beside fanout, healthy and
    // with the vacancy backend 10× slower.
    Entry {
        article: 0,
        scenario: "hh-pools",
        full: &scenario::POOL_TARGETS,
        quick: &scenario::POOL_TARGETS,
    },
    Entry {
        article: 1,
        scenario: "pool-overload",
        full: &["fanout", "java-threads"],
        quick: &["fanout", "java-threads"],
    },
    Entry {
        article: 1,
        scenario: "parallel-calls",
        full: &["fanout", "java-blocking", "java-virtual"],
        quick: &["fanout", "java-blocking"],
    },
    Entry {
        article: 1,
        scenario: "pg-one-query",
        full: &["fanout", "pg-baseline"],
        quick: &["fanout"],
    },
    Entry {
        article: 2,
        scenario: "product-page-merging",
        full: &["naive", "variant1", "variant2"],
        quick: &["naive", "variant1", "variant2"],
    },
    Entry {
        article: 3,
        scenario: "antispam-models",
        full: &["fanout", "antispam-py"],
        quick: &["fanout", "antispam-py"],
    },
];

/// An article: who, what it claims, and its figures as data.
#[derive(Debug, Clone, Copy)]
pub struct ArticleData {
    /// Seed numbers.
    pub id: &'static str,
    /// Who and what.
    pub title: &'static str,
    /// Its setup and claim, in two sentences.
    pub claim: &'static str,
    /// Its figures: (what, value), quoted from the article.
    pub figures: &'static [(&'static str, &'static str)],
    /// What answers it outside this command.
    pub also: &'static [&'static str],
}

/// The four articles. HeadHunter's thread table and the Kotlin article's JMH table are added
/// from [`threads::ARTICLE`] and [`scenario::ARTICLE`] (the same data those scenarios print).
pub const ARTICLES: [ArticleData; 4] = [
    ArticleData {
        id: "000+001",
        title: "HeadHunter: 600 threads — a lot or a little?",
        claim: "A blocking Java rewrite of the service that collects data from backends was sized \
                with Little's law at 600 threads per server, and a CPU benchmark (a fixed pool of \
                1 … 4 096 threads, 16 384 tasks of 600 000 random additions) showed the threads \
                cost nothing to switch. So they chose blocking calls, accepting that a backend \
                2, 4 or 10× slower can leave every thread blocked.",
        figures: &[
            ("machine", "4-core i7-3820, HyperThreading off"),
            (
                "sizing",
                "> 150 s of requests per second × 4 × 2 × 2 / 4 servers = 600 threads per server",
            ),
            (
                "threads in use (python logic)",
                "up to 54 at once, 2–4× the theoretical minimum",
            ),
            (
                "stack per thread",
                "1 MB (600 threads = 600 MB of address space)",
            ),
            ("4 → 4 096 threads", "28 153 → 28 160 ms (+0.02 %)"),
            (
                "a slowed backend",
                "argued (threads hang blocked), not measured",
            ),
        ],
        also: &[],
    },
    ArticleData {
        id: "002",
        title: "Kotlin: coroutines vs blocking — pool overload and 100 parallel calls",
        claim: "A Spring service with three sequential ~30 ms statements per request on a pool of 4 \
                PostgreSQL connections, and a service making 100 HTTP calls per operation (stub at \
                ~1.5 ms), each in a blocking and a coroutine version. The blocking one dies under \
                pool overload and cannot run parallel calls cheaply; the coroutine one serves what \
                the database allows and rejects the rest at once.",
        figures: &[
            ("pool overload: both versions", "alike up to 50 rps"),
            (
                "pool overload: sync (Tomcat, 200 threads, 1 s pool wait)",
                "11 s at 66 rps, then only timeouts, even after the load was removed",
            ),
            (
                "pool overload: async",
                "730 ms at 54 rps, served what the database allowed, the rest 500 at once",
            ),
        ],
        also: &[],
    },
    ArticleData {
        id: "003",
        title: "Leroy Merlin: fewer calls, fewer threads",
        claim: "A product-page orchestrator held 200 rps while its domain services held 2 000+; \
                they cached reference data (masks), merged the main and recommended products' \
                attribute calls (variant 2: half the calls of variant 1) and moved from blocking \
                calls on a custom pool to a non-blocking client on as many threads as CPUs.",
        figures: &[
            ("custom pool threads", "1 000+ → 4"),
            ("calls, variant 2 vs variant 1", "half"),
            (
                "latency after the change",
                "0 errors, 80 ms at p75 on 4 instances; 60 ms at p95 with one more",
            ),
        ],
        also: &[],
    },
    ArticleData {
        id: "004",
        title: "Mail.ru antispam: a gRPC model service — threads, memory, keepalive",
        claim: "An antispam service running ~10 ML models per request on gRPC C++ at ~3 million \
                requests per minute. Under > 1 000 connections the server kept creating poller \
                threads, glibc's per-thread arenas grew memory to 20 GB until the OOM killer, and \
                clients hung ~20 s on a restarted server until keepalive was tuned.",
        figures: &[
            ("load", "~3 M requests per minute (fleet)"),
            ("per model", "≤ 10 ms"),
            (
                "threads under > 1 000 connections",
                "~50, most waiting; created and destroyed",
            ),
            (
                "memory",
                "20 GB peak (models: 2 GB) → 2–2.5 GB constant with tcmalloc",
            ),
            (
                "client hang on a frozen server",
                "~20 s (GRPC_ARG_KEEPALIVE_TIMEOUT_MS)",
            ),
        ],
        also: &[
            "keepalive: `cargo test -p fanout --test gateway grpc_keepalive` (a frozen gRPC replica is left within the PING timeout, 2 s by default) — a test, not run by this command",
        ],
    },
];

/// A (what, value) pair.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    /// What.
    pub label: String,
    /// Value, as text.
    pub value: String,
}

fn fig(label: impl Into<String>, value: impl Into<String>) -> Figure {
    Figure {
        label: label.into(),
        value: value.into(),
    }
}

/// One scenario of the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeedRun {
    /// Scenario name.
    pub scenario: String,
    /// Targets run (after the ones that cannot run here were left out).
    pub targets: Vec<String>,
    /// The equivalent `fanout lab` command.
    pub command: String,
    /// Its directory, relative to the top report.
    pub dir: String,
    /// Whether it ran.
    pub ran: bool,
    /// Why not.
    pub not_run: Option<String>,
    /// Targets of the scenario that did not run, and why.
    pub targets_not_run: BTreeMap<String, String>,
    /// Wall time, s.
    pub wall_s: f64,
    /// This machine's figures, read from the scenario's report.
    pub ours: Vec<Figure>,
    /// Acceptance lines of the scenario (`target: check`, pass).
    pub acceptance: Vec<(String, bool)>,
    /// `threads`: (pool size, % above the fastest pool) of this machine's table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads_vs_best: Vec<(u32, f64)>,
}

/// One article's section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArticleSection {
    /// Seed numbers.
    pub id: String,
    /// Who and what.
    pub title: String,
    /// Setup and claim.
    pub claim: String,
    /// The article's figures.
    pub article: Vec<Figure>,
    /// What answers it outside this command.
    pub also: Vec<String>,
    /// Its scenarios.
    pub runs: Vec<SeedRun>,
}

/// `report.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeedsReport {
    /// Always `seeds`.
    pub scenario: String,
    /// The command line.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
    /// CPUs this process may use.
    pub cpus: usize,
    /// When the run started, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// Wall time of the whole run, s.
    pub wall_s: f64,
    /// One section per article.
    pub articles: Vec<ArticleSection>,
}

/// Options of `fanout lab seeds`.
#[derive(Debug, Clone)]
pub struct SeedsOptions {
    /// `--quick`.
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// Only these scenarios (empty: all).
    pub only: Vec<String>,
    /// The `fanout` executable.
    pub fanout_bin: PathBuf,
    /// The command line.
    pub command: String,
}

/// Why `fanout lab seeds` failed (not: a scenario that could not run).
#[derive(Debug, thiserror::Error)]
pub enum SeedsError {
    /// `--scenarios` named something that is not a seed scenario.
    #[error("`{0}` is not a seed scenario; seed scenarios: {list}", list = ENTRIES.iter().map(|e| e.scenario).collect::<Vec<_>>().join(", "))]
    Unknown(String),
    /// Writing the report failed.
    #[error("writing {0}: {1}")]
    Io(String, std::io::Error),
}

/// Run every seed scenario (or those in `opts.only`) and write the top report.
pub async fn run(opts: SeedsOptions) -> Result<SeedsReport, SeedsError> {
    for s in &opts.only {
        if !ENTRIES.iter().any(|e| e.scenario == s) {
            return Err(SeedsError::Unknown(s.clone()));
        }
    }
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e| SeedsError::Io(p, e)
    };
    std::fs::create_dir_all(&opts.out).map_err(io(&opts.out))?;
    let started = Instant::now();
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut articles: Vec<ArticleSection> = ARTICLES
        .iter()
        .enumerate()
        .map(|(i, a)| ArticleSection {
            id: a.id.into(),
            title: a.title.into(),
            claim: a.claim.split_whitespace().collect::<Vec<_>>().join(" "),
            article: article_figures(i),
            also: a.also.iter().map(|s| s.to_string()).collect(),
            runs: vec![],
        })
        .collect();
    let have_javac = java::javac_version().is_some();
    let have_pg = postgres::PgCluster::available();
    let have_venv = antispam::venv_dir().join("bin/python").exists();
    for e in ENTRIES {
        if !opts.only.is_empty() && !opts.only.iter().any(|s| s == e.scenario) {
            continue;
        }
        let run = run_one(&opts, e, have_javac, have_pg, have_venv).await;
        articles[e.article].runs.push(run);
    }
    let rep = SeedsReport {
        scenario: NAME.into(),
        command: opts.command.clone(),
        quick: opts.quick,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        started_unix_s,
        wall_s: started.elapsed().as_secs_f64(),
        articles,
    };
    let json = serde_json::to_string_pretty(&rep)
        .map_err(|e| SeedsError::Io("report.json".into(), std::io::Error::other(e.to_string())))?;
    let p = opts.out.join("report.json");
    std::fs::write(&p, &json).map_err(io(&p))?;
    let p = opts.out.join("report.html");
    std::fs::write(&p, html(&rep, &json)).map_err(io(&p))?;
    Ok(rep)
}

fn article_figures(i: usize) -> Vec<Figure> {
    let mut v: Vec<Figure> = ARTICLES[i]
        .figures
        .iter()
        .map(|(l, x)| fig(*l, *x))
        .collect();
    match i {
        0 => v.extend(threads::ARTICLE.iter().map(|&(n, ms, sd, pct)| {
            fig(
                format!("pool of {n} threads"),
                format!("{ms:.0} ms ± {sd:.1} ({pct:+.2} % vs 4 threads)"),
            )
        })),
        1 => {
            for r in scenario::ARTICLE {
                let name = |route: &str, style: &str| {
                    format!(
                        "{route}, {} client(s), {style}, {} core(s)",
                        r.clients, r.cores
                    )
                };
                let ms = |(m, e): (f64, f64)| format!("{m:.1} ± {e:.1} ms per operation");
                v.push(fig(name("sequential", "sync"), ms(r.sequential_sync)));
                v.push(fig(name("sequential", "async"), ms(r.sequential_async)));
                v.push(fig(name("parallel", "sync"), ms(r.parallel_sync)));
                v.push(fig(name("parallel", "async"), ms(r.parallel_async)));
            }
        }
        _ => {}
    }
    v
}

async fn run_one(
    opts: &SeedsOptions,
    e: Entry,
    have_javac: bool,
    have_pg: bool,
    have_venv: bool,
) -> SeedRun {
    let dir = opts.out.join(e.scenario);
    let mut targets_not_run = BTreeMap::new();
    let wanted = if opts.quick { e.quick } else { e.full };
    let mut targets: Vec<String> = vec![];
    for t in wanted {
        if t.starts_with("java-") && !have_javac {
            targets_not_run.insert(
                t.to_string(),
                "no javac (a JDK ≥ 17; Debian: default-jdk-headless)".to_string(),
            );
        } else if *t == "antispam-py" && opts.quick && !have_venv {
            targets_not_run.insert(
                t.to_string(),
                format!(
                    "no Python venv at {} (--quick does not create it: run `fanout lab antispam-models` once)",
                    antispam::venv_dir().display()
                ),
            );
        } else {
            targets.push(t.to_string());
        }
    }
    let quick = if opts.quick { " --quick" } else { "" };
    let command = if targets.is_empty() {
        format!("fanout lab {}{quick} --out {}", e.scenario, dir.display())
    } else {
        format!(
            "fanout lab {} --targets {}{quick} --out {}",
            e.scenario,
            targets.join(","),
            dir.display()
        )
    };
    let mut run = SeedRun {
        scenario: e.scenario.into(),
        targets: targets.clone(),
        command: command.clone(),
        dir: e.scenario.into(),
        ran: false,
        not_run: None,
        targets_not_run,
        wall_s: 0.0,
        ours: vec![],
        acceptance: vec![],
        threads_vs_best: vec![],
    };
    let needs_pg = matches!(e.scenario, "pool-overload" | "pg-one-query");
    if needs_pg && !have_pg {
        run.not_run = Some("no PostgreSQL server binaries (initdb, postgres)".into());
        return run;
    }
    if e.scenario != threads::NAME && targets.is_empty() {
        run.not_run = Some("none of its targets can run here".into());
        return run;
    }
    eprintln!("lab seeds: {command}");
    let t0 = Instant::now();
    if e.scenario == threads::NAME {
        let (quick, out, cmd) = (opts.quick, dir.clone(), command.clone());
        let res = tokio::task::spawn_blocking(move || threads::run(quick, &out, &cmd)).await;
        run.wall_s = t0.elapsed().as_secs_f64();
        match res {
            Ok(Ok(rep)) => match &rep.not_run {
                Some(why) => run.not_run = Some(why.clone()),
                None => {
                    run.ran = true;
                    run.ours = threads_figures(&rep);
                    run.threads_vs_best = rep
                        .rows
                        .iter()
                        .map(|r| (r.threads, r.vs_best_pct))
                        .collect();
                }
            },
            Ok(Err(err)) => run.not_run = Some(format!("failed: {err}")),
            Err(err) => run.not_run = Some(format!("failed: {err}")),
        }
        return run;
    }
    let lab = LabOptions {
        scenario: e.scenario.into(),
        targets,
        quick: opts.quick,
        out: dir,
        trials: None,
        fanout_bin: opts.fanout_bin.clone(),
        baseline_bin: None,
        command,
        duration: None,
        capacity: None,
    };
    let res = crate::run(lab).await;
    run.wall_s = t0.elapsed().as_secs_f64();
    match res {
        Ok(rep) => {
            run.ran = true;
            run.ours = lab_figures(&rep);
            run.acceptance = rep
                .acceptance
                .iter()
                .map(|a| (format!("{}: {}", a.target, a.check), a.pass))
                .collect();
            if let Some(c) = &rep.closed_loop {
                run.targets_not_run
                    .extend(c.not_run.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            if let Some(m) = &rep.models {
                run.targets_not_run
                    .extend(m.not_run.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            if let Some(p) = &rep.pools {
                run.targets_not_run
                    .extend(p.not_run.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        Err(err) => run.not_run = Some(format!("failed: {err}")),
    }
    run
}

fn threads_figures(rep: &ThreadsReport) -> Vec<Figure> {
    let mut v = vec![fig(
        "parameters",
        format!(
            "{} tasks of {} additions, {} warm-up(s), {} run(s), {} CPUs",
            rep.params.tasks, rep.params.iterations, rep.params.warmups, rep.params.tests, rep.cpus
        ),
    )];
    let cpu: Vec<f64> = rep.rows.iter().map(|r| r.cpu_ms).collect();
    if let (Some(lo), Some(hi)) = (
        cpu.iter().copied().reduce(f64::min),
        cpu.iter().copied().reduce(f64::max),
    ) {
        v.push(fig(
            "JVM CPU per run, over the pool sizes",
            format!(
                "{lo:.0}–{hi:.0} ms (spread {:.1} %)",
                if lo > 0.0 {
                    (hi / lo - 1.0) * 100.0
                } else {
                    0.0
                }
            ),
        ));
    }
    v.extend(rep.rows.iter().map(|r| {
        fig(
            format!("pool of {} threads", r.threads),
            format!(
                "{:.0} ms ± {:.1} ({:+.2} % vs fastest), JVM CPU {:.0} ms per run",
                r.mean_ms, r.stddev_ms, r.vs_best_pct, r.cpu_ms
            ),
        )
    }));
    v
}

fn lab_figures(rep: &LabReport) -> Vec<Figure> {
    let mut v = vec![];
    for (name, t) in &rep.targets {
        if !t.cells.is_empty() {
            for c in &t.cells {
                v.push(fig(
                    format!("{name}: {}, {} client(s)", c.route, c.clients),
                    format!(
                        "{:.1}{} ms per operation, CPU {:.1} ms per operation, {} threads, {:.0} MB, {} errors",
                        c.mean_ms,
                        c.error_ms.map(|e| format!(" ± {e:.1}")).unwrap_or_default(),
                        c.cpu_ms_per_op.median,
                        c.threads_max,
                        c.rss_max_mb,
                        c.errors
                    ),
                ));
            }
            continue;
        }
        if !t.phases.is_empty() {
            for p in &t.phases {
                v.push(fig(
                    format!("{name}: phase {}", p.name),
                    format!(
                        "offered {:.0}/s, goodput {:.1}/s, accepted p99 {:.1} ms, {} rejected (p99 {:.1} ms), {} timeouts, {} other errors, {} threads",
                        p.offered_rate,
                        p.ok_rate,
                        p.accepted_p99_ms,
                        p.rejected,
                        p.rejected_p99_ms,
                        p.timeouts,
                        p.errors,
                        p.threads_max
                    ),
                ));
            }
        }
        for r in &t.routes {
            let phases: Vec<String> = r
                .phases
                .iter()
                .map(|p| format!("{} {:.1} ms ({:.0} % ok)", p.name, p.p99_ms, p.success_pct))
                .collect();
            v.push(fig(
                format!("{name}: route {} p99 by phase", r.route),
                phases.join(", "),
            ));
        }
        if rep.models.is_none() && rep.pools.is_none() {
            v.push(fig(
                name.clone(),
                format!(
                    "CPU {:.0} µs per request, p50 {:.2} ms, p99 {:.2} ms, {}capacity {}, {} threads, {:.0} MB",
                    t.cpu_us_per_request,
                    t.p50_ms,
                    t.p99_ms,
                    if t.backend_calls_per_request > 0.0 {
                        format!("{:.1} backend calls per request, ", t.backend_calls_per_request)
                    } else {
                        String::new()
                    },
                    t.max_rate
                        .map(|r| format!("{r:.0}/s"))
                        .unwrap_or_else(|| "—".into()),
                    t.threads_max,
                    t.rss_max_mb
                ),
            ));
        }
    }
    if let Some(p) = &rep.pools {
        for r in &p.rows {
            v.push(fig(
                format!("{} @ {:.0}/s, {}", r.target, p.rate, r.phase),
                format!(
                    "CPU {:.0} µs per request, p50 {:.2} ms, p99 {:.2} ms, goodput {:.1}/s (2xx within {:.0} ms), {} failed, {} threads, {:.0} MB",
                    r.cpu_us_per_request.median,
                    r.p50_ms.median,
                    r.p99_ms.median,
                    r.goodput_rps.median,
                    p.slo_ms,
                    r.failed,
                    r.threads_max,
                    r.rss_max_mb
                ),
            ));
        }
    }
    if let Some(m) = &rep.models {
        for (name, t) in &m.targets {
            for l in &t.levels {
                v.push(fig(
                    format!("{name} @ {} ({:.0}/s)", l.name, l.offered_rate),
                    format!(
                        "{:.0} requests per CPU-second, p99 {:.2} ms, {} failed, {} threads, {:.0} MB",
                        l.requests_per_cpu_s.median,
                        l.p99_ms.median,
                        l.failed,
                        l.threads_max,
                        l.rss_max_mb
                    ),
                ));
            }
            v.push(fig(
                format!("{name}: over the run"),
                format!(
                    "{} failed of {} ({} during swaps), threads {}–{}, RSS {:.0} → {:.0} MB",
                    t.failed,
                    t.requests,
                    t.failed_in_swap_windows,
                    t.threads_min,
                    t.threads_max,
                    t.rss_start_mb,
                    t.rss_end_mb
                ),
            ));
        }
    }
    v
}

/// The text printed at the end: one line per scenario.
pub fn text_summary(rep: &SeedsReport) -> String {
    let mut s = format!(
        "lab seeds{}: {:.0} s on {} CPUs\n",
        if rep.quick { " --quick" } else { "" },
        rep.wall_s,
        rep.cpus
    );
    for a in &rep.articles {
        let _ = writeln!(s, "{} {}", a.id, a.title);
        for r in &a.runs {
            match &r.not_run {
                None => {
                    let _ = writeln!(
                        s,
                        "  {:<22} ran in {:>4.0} s  {}/report.html",
                        r.scenario, r.wall_s, r.dir
                    );
                }
                Some(why) => {
                    let _ = writeln!(s, "  {:<22} not run: {why}", r.scenario);
                }
            }
            for (t, why) in &r.targets_not_run {
                let _ = writeln!(s, "  {:<22}   {t} not run: {why}", "");
            }
        }
    }
    s
}

pub(crate) fn html(rep: &SeedsReport, json: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fanout lab: seeds</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1300px}}table{{border-collapse:collapse;margin:8px 0;width:100%}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;font-size:13px}}th{{background:#f0f0f0}}.side{{display:flex;gap:16px}}.side>div{{flex:1;min-width:0}}.notrun{{background:#fff3cd;border:1px solid #e0c060;padding:6px;margin:6px 0}}.pass{{color:#2a7d2a}}.fail{{color:#b02020}}figure{{margin:16px 0}}figcaption{{font-weight:600;margin-bottom:4px}}code{{background:#f4f4f4;padding:1px 4px}}section{{border-top:2px solid #333;margin-top:24px}}</style></head><body>
<h1>fanout lab — seeds</h1><p>Each seed article's figures beside this machine's. Command: <code>{cmd}</code> · {cpus} CPUs · {quick} · {wall:.0} s. The figures here are read from each scenario's own report (linked); see docs/seeds.md for the full runs.</p>"#,
        cmd = esc(&rep.command),
        cpus = rep.cpus,
        quick = if rep.quick {
            "--quick (smoke-test figures: short trials)"
        } else {
            "full run"
        },
        wall = rep.wall_s,
    );
    for a in &rep.articles {
        let _ = write!(
            h,
            r#"<section class="article" id="seed-{id}"><h2>{id} — {title}</h2><p>{claim}</p><div class="side"><div><h3>The article</h3><table><tr><th>what</th><th>figure</th></tr>"#,
            id = esc(&a.id),
            title = esc(&a.title),
            claim = esc(&a.claim),
        );
        for f in &a.article {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td></tr>",
                esc(&f.label),
                esc(&f.value)
            );
        }
        h.push_str("</table>");
        for x in &a.also {
            let _ = write!(h, "<p>{}</p>", esc(x));
        }
        h.push_str("</div><div><h3>This machine</h3>");
        if a.runs.is_empty() {
            h.push_str(
                r#"<p class="notrun">no scenario of this article in this run (--scenarios)</p>"#,
            );
        }
        for r in &a.runs {
            let _ = write!(
                h,
                r#"<div class="run" data-scenario="{s}"><h4>{s}</h4><p><code>{cmd}</code></p>"#,
                s = esc(&r.scenario),
                cmd = esc(&r.command)
            );
            match &r.not_run {
                Some(why) => {
                    let _ = write!(h, r#"<p class="notrun">not run: {}</p>"#, esc(why));
                }
                None => {
                    let _ = write!(
                        h,
                        r#"<p>ran in {:.0} s · <a href="{d}/report.html">its report</a> · <a href="{d}/report.json">report.json</a></p><table><tr><th>what</th><th>measured</th></tr>"#,
                        r.wall_s,
                        d = esc(&r.dir)
                    );
                    for f in &r.ours {
                        let _ = write!(
                            h,
                            "<tr><td>{}</td><td>{}</td></tr>",
                            esc(&f.label),
                            esc(&f.value)
                        );
                    }
                    h.push_str("</table>");
                }
            }
            for (t, why) in &r.targets_not_run {
                let _ = write!(
                    h,
                    r#"<p class="notrun">{} not run: {}</p>"#,
                    esc(t),
                    esc(why)
                );
            }
            if !r.acceptance.is_empty() {
                h.push_str("<ul>");
                for (check, pass) in &r.acceptance {
                    let _ = write!(
                        h,
                        r#"<li class="{c}">{p} {}</li>"#,
                        esc(check),
                        c = if *pass { "pass" } else { "fail" },
                        p = if *pass { "PASS" } else { "FAIL" }
                    );
                }
                h.push_str("</ul>");
            }
            h.push_str("</div>");
        }
        h.push_str("</div></div>");
        if a.id == ARTICLES[0].id {
            h.push_str(&threads_chart(a));
        }
        h.push_str("</section>");
    }
    let _ = write!(
        h,
        r#"<script type="application/json" id="report-data">{}</script></body></html>"#,
        json.replace("</", "<\\/")
    );
    h
}

/// HeadHunter's table beside the threads run's, when it ran: % above the reference pool.
fn threads_chart(a: &ArticleSection) -> String {
    let Some(run) = a.runs.iter().find(|r| r.scenario == threads::NAME && r.ran) else {
        return String::new();
    };
    let log2 = |n: u32| f64::from(n).log2();
    let article = Series::new(
        "article (vs 4 threads)",
        threads::ARTICLE.iter().map(|a| (log2(a.0), a.3)).collect(),
    );
    let here = Series::new(
        "here (vs fastest)",
        run.threads_vs_best
            .iter()
            .map(|&(n, pct)| (log2(n), pct))
            .collect(),
    );
    line_chart(
        "seeds-threads",
        "HeadHunter's thread benchmark: time above the reference pool, % (x: log2 of the pool size)",
        "log2(threads)",
        "%",
        &[article, here],
    )
}

/// The figures `seeds` reads from a scenario's report, from recorded runs (`tests/data`): what
/// the live seeds run shows per scenario that ran.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorded::Recorded;

    fn recorded(name: &str) -> Recorded {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        match Recorded::load(&dir) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn figures_are_read_from_each_kind_of_recorded_report() {
        let Recorded::Threads(t) = recorded("threads") else {
            panic!("threads is a threads report");
        };
        let figs = threads_figures(&t);
        assert!(
            figs.len() > t.rows.len(),
            "parameters and a row per pool: {figs:?}"
        );
        for (name, per_target) in [
            ("parallel-calls", 4),
            ("overload", 4),
            ("hh-pools", 0),
            ("antispam-models", 0),
            ("product-page", 0),
        ] {
            let Recorded::Lab(rep) = recorded(name) else {
                panic!("{name} is a lab report");
            };
            let figs = lab_figures(&rep);
            assert!(!figs.is_empty(), "{name}: figures");
            for target in rep.targets.keys().filter(|_| per_target > 0) {
                let n = figs
                    .iter()
                    .filter(|f| f.label.starts_with(&format!("{target}: ")))
                    .count();
                assert_eq!(n, per_target, "{name} {target}: {figs:?}");
            }
        }
    }
}
