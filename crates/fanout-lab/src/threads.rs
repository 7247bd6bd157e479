//! `fanout lab threads`: HeadHunter's thread benchmark (`bench/baselines/hh-threads`, the code of
//! the seed article "600 потоков — это много или мало?") run on this machine, its table printed
//! beside the article's. No stubs, no targets, no load: a CPU-bound Java program with a fixed
//! pool of 1 … 4 096 threads, so it has its own entry point instead of a [`crate::scenario`]
//! entry (like the closed-loop runner, it writes its own report).

use crate::java;
use crate::svg::{Series, esc, line_chart};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Its name on the command line.
pub const NAME: &str = "threads";

/// The article's machine.
pub const ARTICLE_MACHINE: &str =
    "4-core Intel i7-3820, HyperThreading off, Ubuntu Linux 64-bit (HeadHunter, seed 000)";

/// The article's table: (threads, mean ms, standard deviation ms, difference from the pool of 4
/// threads in %).
pub const ARTICLE: [(u32, f64, f64, f64); 13] = [
    (1, 109152.0, 9.6, 287.70),
    (2, 55072.0, 35.6, 95.61),
    (4, 28153.0, 3.8, 0.00),
    (8, 28142.0, 2.8, -0.04),
    (16, 28141.0, 3.6, -0.04),
    (32, 28152.0, 3.7, 0.00),
    (64, 28149.0, 6.6, -0.01),
    (128, 28146.0, 2.3, -0.02),
    (256, 28146.0, 4.1, -0.03),
    (512, 28148.0, 2.7, -0.02),
    (1024, 28146.0, 2.8, -0.03),
    (2048, 28157.0, 5.0, 0.01),
    (4096, 28160.0, 3.0, 0.02),
];

/// The benchmark's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Tasks per run.
    pub tasks: u32,
    /// `Random.nextInt()` additions per task.
    pub iterations: u32,
    /// Untimed runs per pool size.
    pub warmups: u32,
    /// Timed runs per pool size.
    pub tests: u32,
    /// Pool sizes, in order.
    pub threads: Vec<u32>,
}

impl Params {
    /// The article's: 16 384 tasks of 600 000 additions, 2 warm-ups, 5 runs, 1 … 4 096 threads.
    pub fn article() -> Params {
        Params {
            tasks: 16_384,
            iterations: 600_000,
            warmups: 2,
            tests: 5,
            threads: ARTICLE.iter().map(|r| r.0).collect(),
        }
    }

    /// `--quick`: the article's task, 1/16 of the tasks, 1 warm-up, 2 runs, 5 pool sizes (≈ 10 s
    /// of CPU).
    pub fn quick() -> Params {
        Params {
            tasks: 1_024,
            iterations: 600_000,
            warmups: 1,
            tests: 2,
            threads: vec![1, 2, 4, 64, 1024],
        }
    }

    fn args(&self) -> Vec<String> {
        let threads: Vec<String> = self.threads.iter().map(u32::to_string).collect();
        vec![
            "--tasks".into(),
            self.tasks.to_string(),
            "--iterations".into(),
            self.iterations.to_string(),
            "--warmups".into(),
            self.warmups.to_string(),
            "--tests".into(),
            self.tests.to_string(),
            "--threads".into(),
            threads.join(","),
        ]
    }
}

/// One pool size's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Pool size.
    pub threads: u32,
    /// Mean of the timed runs, ms.
    pub mean_ms: f64,
    /// Their standard deviation (sample), ms.
    pub stddev_ms: f64,
    /// Difference of the mean from the fastest pool's, %.
    pub vs_best_pct: f64,
    /// CPU time of the JVM (all threads, user + system) per timed run, ms: the work plus what
    /// switching costs, whatever else runs on the machine (the wall time depends on that).
    pub cpu_ms: f64,
    /// The timed runs, ms.
    pub runs_ms: Vec<u64>,
}

/// One row of the article's table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArticleRow {
    /// Pool size.
    pub threads: u32,
    /// Mean, ms.
    pub mean_ms: f64,
    /// Standard deviation, ms.
    pub stddev_ms: f64,
    /// Difference from the pool of 4 threads (its cores), %.
    pub vs_4_pct: f64,
}

/// The article's table and machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Article {
    /// Where it ran.
    pub machine: String,
    /// Its parameters.
    pub params: Params,
    /// Its rows.
    pub rows: Vec<ArticleRow>,
}

/// A pool size in both tables.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SideBySide {
    /// Pool size.
    pub threads: u32,
    /// The article's mean, ms.
    pub article_ms: f64,
    /// The article's difference from its 4-thread pool, %.
    pub article_pct: f64,
    /// This machine's mean, ms.
    pub here_ms: f64,
    /// This machine's difference from its fastest pool, %.
    pub here_pct: f64,
}

/// `report.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadsReport {
    /// Always `threads`.
    pub scenario: String,
    /// The command line.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
    /// CPUs this process may use.
    pub cpus: usize,
    /// When the run started, seconds since the Unix epoch (UTC).
    pub started_unix_s: u64,
    /// `uname -srm` and the CPU model, when readable.
    pub machine: String,
    /// The Java runtime (`java -version`'s version), when there is one.
    pub java: Option<String>,
    /// Why the benchmark did not run (`no java: …`); `None` when it ran.
    pub not_run: Option<String>,
    /// The parameters of this run.
    pub params: Params,
    /// This machine's table (empty when not run).
    pub rows: Vec<Row>,
    /// The article's table.
    pub article: Article,
    /// The pool sizes in both tables.
    pub side_by_side: Vec<SideBySide>,
    /// Wall time of the Java program, s.
    pub wall_s: f64,
    /// The program's output, as printed (also in `hh-threads.txt`).
    pub output_file: String,
}

/// Why `fanout lab threads` failed (not: Java missing — that is a report with `not_run`).
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    /// Compilation failed, or a file could not be written.
    #[error(transparent)]
    Java(java::JavaError),
    /// The program failed or printed no table.
    #[error("hh-threads: {0}")]
    Run(String),
    /// Writing the report failed.
    #[error("writing {0}: {1}")]
    Io(String, std::io::Error),
}

/// `bench/baselines/hh-threads/src` of the repository this crate was built from.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/baselines/hh-threads/src")
}

/// Parse the program's `RESULT` lines (tab-separated: threads, mean, deviation, % vs the best,
/// CPU ms per run, runs).
pub fn parse_results(out: &str) -> Vec<Row> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.strip_prefix("RESULT\t")?.split('\t');
            Some(Row {
                threads: f.next()?.parse().ok()?,
                mean_ms: f.next()?.parse().ok()?,
                stddev_ms: f.next()?.parse().ok()?,
                vs_best_pct: f.next()?.parse().ok()?,
                cpu_ms: f.next()?.parse().ok()?,
                runs_ms: f
                    .next()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?,
            })
        })
        .collect()
}

fn machine() -> String {
    let uname = Command::new("uname")
        .arg("-srm")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_default();
    [uname, cpu]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Run the benchmark (compiled with `javac` into `<out>/hh-threads/classes`), write
/// `report.json`, `report.html` and `hh-threads.txt` into `out`. Without `javac` or `java` the
/// report says `not run: no java` and the article's table only.
pub fn run(quick: bool, out: &Path, command: &str) -> Result<ThreadsReport, ThreadsError> {
    run_tasks(quick, None, out, command)
}

/// [`run`] with `tasks` per run instead of the article's (or `--quick`'s) when given
/// (`--tasks`): the same program and pool sizes, shorter (the test suite's smoke run).
pub fn run_tasks(
    quick: bool,
    tasks: Option<u32>,
    out: &Path,
    command: &str,
) -> Result<ThreadsReport, ThreadsError> {
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e| ThreadsError::Io(p, e)
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut params = if quick {
        Params::quick()
    } else {
        Params::article()
    };
    if let Some(n) = tasks {
        params.tasks = n;
    }
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let output_file = out.join("hh-threads.txt");
    let mut rep = ThreadsReport {
        scenario: NAME.into(),
        command: command.into(),
        quick,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        started_unix_s,
        machine: machine(),
        java: None,
        not_run: None,
        params: params.clone(),
        rows: vec![],
        article: Article {
            machine: ARTICLE_MACHINE.into(),
            params: Params::article(),
            rows: ARTICLE
                .iter()
                .map(|&(threads, mean_ms, stddev_ms, vs_4_pct)| ArticleRow {
                    threads,
                    mean_ms,
                    stddev_ms,
                    vs_4_pct,
                })
                .collect(),
        },
        side_by_side: vec![],
        wall_s: 0.0,
        output_file: output_file.display().to_string(),
    };
    let java_bin = java::java_bin();
    let built = match java::java_version(&java_bin) {
        None => Err(format!("no java: `{}` does not run", java_bin.display())),
        Some((_, v)) => {
            rep.java = Some(v);
            match java::ensure_built(&source_dir(), &out.join("hh-threads")) {
                Ok(classes) => Ok(classes),
                Err(java::JavaError::NoJavac(javac, e)) => {
                    Err(format!("no java: `{javac}` could not be started ({e})"))
                }
                Err(e) => return Err(ThreadsError::Java(e)),
            }
        }
    };
    match built {
        Err(why) => rep.not_run = Some(why),
        Ok(classes) => {
            let t0 = Instant::now();
            let text = run_program(&java_bin, &classes, &params)?;
            rep.wall_s = t0.elapsed().as_secs_f64();
            std::fs::write(&output_file, &text).map_err(io(&output_file))?;
            rep.rows = parse_results(&text);
            if rep.rows.len() != params.threads.len() {
                return Err(ThreadsError::Run(format!(
                    "expected {} RESULT lines, found {} (output in {})",
                    params.threads.len(),
                    rep.rows.len(),
                    output_file.display()
                )));
            }
        }
    }
    rep.side_by_side = rep
        .rows
        .iter()
        .filter_map(|r| {
            let a = ARTICLE.iter().find(|a| a.0 == r.threads)?;
            Some(SideBySide {
                threads: r.threads,
                article_ms: a.1,
                article_pct: a.3,
                here_ms: r.mean_ms,
                here_pct: r.vs_best_pct,
            })
        })
        .collect();
    let json = serde_json::to_string_pretty(&rep).map_err(|e| {
        ThreadsError::Io(
            out.join("report.json").display().to_string(),
            std::io::Error::other(e),
        )
    })?;
    let p = out.join("report.json");
    std::fs::write(&p, &json).map_err(io(&p))?;
    let p = out.join("report.html");
    std::fs::write(&p, html(&rep, &json)).map_err(io(&p))?;
    Ok(rep)
}

/// Start the program, echo its pool sizes and runs to stderr as they come, return its stdout.
fn run_program(java_bin: &Path, classes: &Path, params: &Params) -> Result<String, ThreadsError> {
    let mut child = Command::new(java_bin)
        .arg("-cp")
        .arg(classes)
        .arg(java::MAIN_CLASS)
        .args(params.args())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| ThreadsError::Run(format!("{}: {e}", java_bin.display())))?;
    let mut text = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.map_err(|e| ThreadsError::Run(e.to_string()))?;
            if line.ends_with(" threads.") {
                eprint!("hh-threads: {line}");
            } else if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) {
                eprint!(" {line} ms");
            } else if line.is_empty() {
                eprintln!();
            }
            text.push_str(&line);
            text.push('\n');
        }
    }
    let status = child.wait().map_err(|e| ThreadsError::Run(e.to_string()))?;
    if !status.success() {
        return Err(ThreadsError::Run(format!("exited with {status}")));
    }
    Ok(text)
}

/// Both tables as text: one line per pool size of either.
pub fn text_summary(rep: &ThreadsReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "HeadHunter's thread benchmark — {} tasks × {} additions, {} warm-up(s), {} run(s){}",
        rep.params.tasks,
        rep.params.iterations,
        rep.params.warmups,
        rep.params.tests,
        if rep.quick {
            " (--quick; the article: 16384 tasks, 2 warm-ups, 5 runs)"
        } else {
            ""
        }
    );
    if let Some(why) = &rep.not_run {
        let _ = writeln!(s, "not run: {why}");
    } else {
        let _ = writeln!(
            s,
            "here: {} CPUs, {}, Java {} — {:.0} s",
            rep.cpus,
            rep.machine,
            rep.java.as_deref().unwrap_or("?"),
            rep.wall_s
        );
    }
    let _ = writeln!(s, "article: {}", rep.article.machine);
    let _ = writeln!(
        s,
        "{:>7} | {:>10} {:>8} {:>9} | {:>10} {:>8} {:>10} {:>10}",
        "threads", "article ms", "± ms", "vs 4 thr", "here ms", "± ms", "vs best", "CPU ms/run"
    );
    let mut sizes: Vec<u32> = rep
        .article
        .rows
        .iter()
        .map(|r| r.threads)
        .chain(rep.rows.iter().map(|r| r.threads))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    for n in sizes {
        let a = rep.article.rows.iter().find(|r| r.threads == n);
        let h = rep.rows.iter().find(|r| r.threads == n);
        let _ = writeln!(
            s,
            "{:>7} | {} | {}",
            n,
            a.map(|a| format!(
                "{:>10.0} {:>8.1} {:>8.2}%",
                a.mean_ms, a.stddev_ms, a.vs_4_pct
            ))
            .unwrap_or_else(|| format!("{:>29}", "—")),
            h.map(|h| format!(
                "{:>10.0} {:>8.1} {:>9.2}% {:>10.0}",
                h.mean_ms, h.stddev_ms, h.vs_best_pct, h.cpu_ms
            ))
            .unwrap_or_else(|| format!("{:>41}", "—")),
        );
    }
    s
}

pub(crate) fn html(rep: &ThreadsReport, json: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fanout lab: threads</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1100px}}table{{border-collapse:collapse;margin:12px 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f0f0f0}}.warn{{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}}figure{{margin:16px 0}}figcaption{{font-weight:600;margin-bottom:4px}}code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>
<h1>fanout lab — threads</h1><p>HeadHunter's thread benchmark (<code>bench/baselines/hh-threads</code>): a fixed pool of N threads, {tasks} tasks of {it} <code>Random.nextInt()</code> additions, {w} warm-up(s) and {t} timed run(s) per pool size.</p><p>Command: <code>{cmd}</code> · {cpus} CPUs · {machine} · Java {java} · {quick}</p>"#,
        tasks = rep.params.tasks,
        it = rep.params.iterations,
        w = rep.params.warmups,
        t = rep.params.tests,
        cmd = esc(&rep.command),
        cpus = rep.cpus,
        machine = esc(&rep.machine),
        java = esc(rep.java.as_deref().unwrap_or("—")),
        quick = if rep.params == Params::article() {
            "the article's parameters".to_string()
        } else {
            format!(
                "{} run ({} of the article's {} tasks; figures are indicative)",
                if rep.quick { "quick" } else { "reduced" },
                rep.params.tasks,
                rep.article.params.tasks
            )
        }
    );
    if let Some(why) = &rep.not_run {
        let _ = write!(h, r#"<div class="warn">not run: {}</div>"#, esc(why));
    }
    h.push_str("<h2>This machine beside the article</h2><table><tr><th rowspan=2>threads</th><th colspan=3>article (4 cores, 16 384 tasks)</th><th colspan=5>here</th></tr><tr><th>mean ms</th><th>± ms</th><th>vs 4 threads</th><th>mean ms</th><th>± ms</th><th>vs fastest</th><th>CPU ms / run</th><th>runs ms</th></tr>");
    let mut sizes: Vec<u32> = ARTICLE
        .iter()
        .map(|r| r.0)
        .chain(rep.rows.iter().map(|r| r.threads))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    for n in sizes {
        let a = ARTICLE.iter().find(|r| r.0 == n);
        let r = rep.rows.iter().find(|r| r.threads == n);
        let _ = write!(
            h,
            "<tr><td>{n}</td>{}{}</tr>",
            a.map(|a| format!(
                "<td>{:.0}</td><td>{:.1}</td><td>{:+.2} %</td>",
                a.1, a.2, a.3
            ))
            .unwrap_or_else(|| "<td>—</td><td>—</td><td>—</td>".into()),
            r.map(|r| format!(
                "<td>{:.0}</td><td>{:.1}</td><td>{:+.2} %</td><td>{:.0}</td><td>{}</td>",
                r.mean_ms,
                r.stddev_ms,
                r.vs_best_pct,
                r.cpu_ms,
                r.runs_ms
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .unwrap_or_else(|| "<td>—</td><td>—</td><td>—</td><td>—</td><td>—</td>".into()),
        );
    }
    h.push_str("</table>");
    let log2 = |n: u32| f64::from(n).log2();
    let series = [
        Series::new(
            "article (vs 4 threads)",
            ARTICLE.iter().map(|a| (log2(a.0), a.3)).collect(),
        ),
        Series::new(
            "here (vs fastest)",
            rep.rows
                .iter()
                .map(|r| (log2(r.threads), r.vs_best_pct))
                .collect(),
        ),
    ];
    h.push_str(&line_chart(
        "threads-overhead",
        "Time above the reference pool, % (x: log2 of the pool size)",
        "log2(threads)",
        "%",
        &series,
    ));
    let _ = write!(
        h,
        r#"<script type="application/json" id="report-data">{}</script></body></html>"#,
        json.replace("</", "<\\/")
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_programs_result_lines() {
        let out = "1 threads.\nWarming up...\nTesting...\n678\n\nthreads\tmean_ms\tstddev_ms\tvs_best_%\truns_ms\nRESULT\t1\t664.5\t19.1\t6.75\t1320\t678,651\nRESULT\t64\t622.5\t16.3\t0.00\t1290\t634,611\n";
        let rows = parse_results(out);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].threads, 1);
        assert_eq!(rows[0].runs_ms, [678, 651]);
        assert_eq!(rows[1].vs_best_pct, 0.0);
        assert_eq!(rows[1].cpu_ms, 1290.0);
    }

    #[test]
    fn the_article_table_is_its_own() {
        assert_eq!(Params::article().threads.len(), 13);
        assert_eq!(ARTICLE[2], (4, 28153.0, 3.8, 0.0));
        assert_eq!(ARTICLE[12].3, 0.02);
        assert!(
            Params::quick()
                .threads
                .iter()
                .all(|n| ARTICLE.iter().any(|a| a.0 == *n))
        );
    }
}
