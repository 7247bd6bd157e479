//! `fanout test`: run a cases file against a gateway config, its backends simulated by a stubs
//! file started in process. The examples' `cases.yaml` files and the project's own example test
//! run through this runner. The user guide is `docs/testing.md`.

pub mod cases;
pub mod coverage;
mod database;
pub mod diff;
pub mod report;
pub mod run;
pub mod schemas;
mod stream;
pub mod update;

pub use cases::{Case, Cases, schema};
pub use run::{CaseResult, Report, RunOptions, Suite, TestError, run};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The arguments of `fanout test`.
#[derive(Debug, Clone, Default)]
pub struct TestArgs {
    /// A directory (its `fanout.yaml`) or a gateway config file.
    pub target: PathBuf,
    /// Run only the cases whose name contains one of these.
    pub filter: Vec<String>,
    /// The stubs file, instead of `stubs.yaml` beside the config.
    pub stubs: Option<PathBuf>,
    /// The cases file, instead of `cases.yaml` beside the config.
    pub cases: Option<PathBuf>,
    /// Write JUnit XML here.
    pub junit: Option<PathBuf>,
    /// Rewrite the expected answers of failing `response:` checks with the actual answers.
    pub update: bool,
    /// The database `${DATABASE_URL}` points at, instead of a throw-away one.
    pub database_url: Option<String>,
    /// The SQL for the throw-away database, instead of `schema.sql` beside the config.
    pub schema_sql: Option<PathBuf>,
    /// How long one request may take (default 10 s).
    pub timeout: Option<std::time::Duration>,
    /// Calls kept per stub service and case for `calls` checks.
    pub max_recorded_calls: usize,
    /// Print the routes and branches of the flows that no case went through.
    pub coverage: bool,
    /// Write the coverage as JSON here (implies `coverage`).
    pub coverage_json: Option<PathBuf>,
    /// Check each case's request and answer against its route's declared schemas.
    pub schemas: bool,
    /// Print a draft answer schema for each route, from its cases' success answers.
    pub propose_schemas: bool,
}

/// The log of this process, kept in memory for `log:` assertions (level info and above).
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// The lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        let buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&buf)
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Send this process's log (info and above, plain text) to a [`LogBuffer`] instead of stderr:
/// `fanout test` shows the gateway's log only through `log:` assertions. Once per process.
pub fn capture_logs() -> &'static LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = LogBuffer::default();
        let w = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || w.clone())
            .try_init();
        buf
    })
}

/// What `fanout test` ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every case passed.
    Passed,
    /// A case failed.
    Failed,
}

/// `fanout test`: run, print the report to stdout, write `--junit`, apply `--update`. A target
/// directory without `fanout.yaml` whose subdirectories have one runs each of them.
pub async fn cli(args: TestArgs) -> anyhow::Result<Outcome> {
    if let Some(dirs) = suite_dirs(&args.target)? {
        return cli_dirs(&args, &dirs).await;
    }
    let suite = suite_of(&args, &args.target);
    let report = match run_suite(&args, &suite).await {
        Ok(r) => r,
        Err(e) => {
            // CI still gets a report: the suite as one error
            if let Some(path) = &args.junit {
                let xml = report::junit_error(&suite.cases.display().to_string(), &e.to_string());
                tokio::fs::write(path, xml)
                    .await
                    .map_err(|w| anyhow::anyhow!("--junit {}: {w}", path.display()))?;
            }
            return Err(e.into());
        }
    };
    show(&args, &report);
    if let (Some(path), Some(c)) = (&args.coverage_json, &report.coverage) {
        let text = serde_json::to_string_pretty(&coverage::json(c))?;
        tokio::fs::write(path, text + "\n")
            .await
            .map_err(|e| anyhow::anyhow!("--coverage-json {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.junit {
        tokio::fs::write(path, report::junit(&[&report]))
            .await
            .map_err(|e| anyhow::anyhow!("--junit {}: {e}", path.display()))?;
    }
    if args.update {
        update_answers(&suite, &report).await?;
    }
    Ok(if report.passed() {
        Outcome::Passed
    } else {
        Outcome::Failed
    })
}

/// The suites of a directory of suites (`examples/`): when `target` is a directory without
/// `fanout.yaml`, the subdirectories right under it that have one, in name order (`None`: the
/// target is one suite). An error when there is none.
fn suite_dirs(target: &Path) -> anyhow::Result<Option<Vec<PathBuf>>> {
    if !target.is_dir() || target.join("fanout.yaml").exists() {
        return Ok(None);
    }
    let entries =
        std::fs::read_dir(target).map_err(|e| anyhow::anyhow!("{}: {e}", target.display()))?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && p.join("fanout.yaml").is_file())
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        anyhow::bail!(
            "{}: no fanout.yaml in it, nor in any directory right under it; pass a directory \
             holding fanout.yaml (with cases.yaml beside it), or a config file",
            target.display()
        );
    }
    Ok(Some(dirs))
}

/// The suite of one target, with the command line's files and settings.
fn suite_of(args: &TestArgs, target: &Path) -> Suite {
    let mut suite = Suite::beside(target);
    if let Some(s) = &args.stubs {
        suite.stubs = Some(s.clone());
    }
    if let Some(c) = &args.cases {
        suite.cases = c.clone();
    }
    if let Some(s) = &args.schema_sql {
        suite.schema_sql = Some(s.clone());
    }
    if let Some(u) = &args.database_url {
        suite.vars.push(("DATABASE_URL".into(), u.clone()));
    }
    if let Some(t) = args.timeout {
        suite.request_timeout = t;
    }
    suite.max_recorded_calls = args.max_recorded_calls;
    suite
}

async fn run_suite(args: &TestArgs, suite: &Suite) -> Result<Report, TestError> {
    let logs = capture_logs();
    let lines = |needle: &str| logs.lines_with(needle);
    run(
        suite,
        RunOptions {
            filter: &args.filter,
            logs: Some(&lines),
            coverage: args.coverage || args.coverage_json.is_some(),
            schemas: args.schemas,
            propose_schemas: args.propose_schemas,
        },
    )
    .await
}

/// Print a suite's report (and its coverage with `--coverage`).
fn show(args: &TestArgs, report: &Report) {
    say(&report::human(report));
    if let (true, Some(c)) = (args.coverage, &report.coverage) {
        say(&coverage::human(c));
    }
    if args.propose_schemas {
        say(&schemas::proposals_text(&report.config, &report.proposals));
    }
}

/// `fanout test DIR` for a directory of suites: each suite in turn, its report and summary, then
/// a total; a suite that cannot run is reported and the others still run.
async fn cli_dirs(args: &TestArgs, dirs: &[PathBuf]) -> anyhow::Result<Outcome> {
    let one_suite_only = [
        ("--stubs", args.stubs.is_some()),
        ("--cases", args.cases.is_some()),
        ("--schema-sql", args.schema_sql.is_some()),
        ("--database-url", args.database_url.is_some()),
        ("--coverage-json", args.coverage_json.is_some()),
    ];
    if let Some((flag, _)) = one_suite_only.iter().find(|(_, given)| *given) {
        anyhow::bail!(
            "{flag} is for one suite, and {} holds {} suites (directories with a fanout.yaml); \
             pass one of them",
            args.target.display(),
            dirs.len()
        );
    }
    let mut ran: Vec<(Suite, Report)> = Vec::new();
    let mut broken: Vec<(String, String)> = Vec::new();
    // in directory order, for JUnit: Ok(index in `ran`) or Err(index in `broken`)
    let mut order: Vec<Result<usize, usize>> = Vec::new();
    let mut unmatched = 0;
    for dir in dirs {
        let suite = suite_of(args, dir);
        match run_suite(args, &suite).await {
            Ok(r) => {
                show(args, &r);
                if args.update
                    && let Err(e) = update_answers(&suite, &r).await
                {
                    complain(&format!("{e:#}"));
                    broken.push((suite.cases.display().to_string(), format!("{e:#}")));
                }
                order.push(Ok(ran.len()));
                ran.push((suite, r));
            }
            // a case filter need only match in one of the suites
            Err(TestError::NoMatch(_)) => unmatched += 1,
            Err(e) => {
                complain(&e.to_string());
                order.push(Err(broken.len()));
                broken.push((suite.cases.display().to_string(), e.to_string()));
            }
        }
    }
    if unmatched == dirs.len() {
        return Err(TestError::NoMatch(args.filter.clone()).into());
    }
    let cases: usize = ran.iter().map(|(_, r)| r.results.len()).sum();
    let failed: usize = ran
        .iter()
        .map(|(_, r)| r.results.iter().filter(|c| !c.passed()).count())
        .sum();
    let mut total = format!(
        "{} suites: {cases} cases, {} passed, {failed} failed",
        dirs.len() - unmatched,
        cases - failed
    );
    if !broken.is_empty() {
        let files: Vec<&str> = broken.iter().map(|(f, _)| f.as_str()).collect();
        total.push_str(&format!(
            "; {} {} could not run: {}",
            broken.len(),
            if broken.len() == 1 { "suite" } else { "suites" },
            files.join(", ")
        ));
    }
    say(&format!("{total}\n"));
    if let Some(path) = &args.junit {
        let suites: Vec<report::JunitSuite<'_>> = order
            .iter()
            .filter_map(|o| match o {
                Ok(i) => ran.get(*i).map(|(_, r)| report::JunitSuite::Ran(r)),
                Err(i) => broken
                    .get(*i)
                    .map(|(file, message)| report::JunitSuite::Error { file, message }),
            })
            .collect();
        tokio::fs::write(path, report::junit_suites(&suites))
            .await
            .map_err(|e| anyhow::anyhow!("--junit {}: {e}", path.display()))?;
    }
    if !broken.is_empty() {
        anyhow::bail!(
            "{} of {} suites could not run",
            broken.len(),
            dirs.len() - unmatched
        );
    }
    Ok(if failed == 0 {
        Outcome::Passed
    } else {
        Outcome::Failed
    })
}

/// `--update`: rewrite the `response:` of each case whose answer differed, where it can be
/// placed; say which were updated and which were not, and why.
async fn update_answers(suite: &Suite, report: &Report) -> anyhow::Result<()> {
    let file = suite.cases.display().to_string();
    let mut edits: Vec<(usize, serde_json::Value)> = Vec::new();
    let mut refused: Vec<(usize, String)> = Vec::new();
    for r in report.results.iter().filter(|r| r.response_differs) {
        match &r.actual {
            Some(a) => edits.push((r.index, a.clone())),
            None => refused.push((r.index, "the answer is not JSON".into())),
        }
    }
    let mut updated = 0;
    if !edits.is_empty() {
        let text = tokio::fs::read_to_string(&suite.cases)
            .await
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        let done = update::rewrite(&text, &edits).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        refused.extend(done.refused);
        if !done.updated.is_empty() {
            // the rewritten file must still parse before it replaces the old one
            Cases::parse(&file, &done.text).map_err(|e| {
                anyhow::anyhow!("--update would break the file, left as it was:\n{e}")
            })?;
            tokio::fs::write(&suite.cases, &done.text)
                .await
                .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
            updated = done.updated.len();
        }
    }
    refused.sort_by_key(|(i, _)| *i);
    for (i, why) in refused {
        let case = report.results.iter().find(|r| r.index == i);
        let (name, line) = case.map_or((String::new(), 0), |c| (c.name.clone(), c.line));
        say(&format!(
            "not updated: case {name:?} ({file}:{line}): {why}\n"
        ));
    }
    if updated > 0 {
        say(&format!("updated {updated} expected answer(s) in {file}\n"));
    }
    Ok(())
}

/// Write a line to stderr, ignoring a closed one.
fn complain(text: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Write to stdout, ignoring a closed pipe (`fanout test … | head`).
fn say(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
