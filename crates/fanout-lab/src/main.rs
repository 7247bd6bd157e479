//! `fanout-lab` binary: the load lab, a program of its own so the gateway binary that serves
//! traffic does not link it (docs/ARCHITECTURE.md). `fanout lab ARGS…` runs this executable
//! (the launcher in the gateway, `fanout::lab`); run on its own, it uses the `fanout` next to it.

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser};
use std::path::PathBuf;
use std::process::ExitCode;

// The same allocator as the `fanout` binary: the lab's generator CPU per request is reported,
// and it was measured with mimalloc when the lab lived in that binary.
#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

/// `fanout lab`'s arguments.
#[derive(Parser)]
#[command(
    name = "fanout-lab",
    version,
    about = "Run a lab scenario against one or more targets and write report.html / report.json."
)]
struct Cli {
    /// Scenario: hh-vacancies, hh-pools (hh-vacancies at 200 req/s on fanout and Java pools
    /// of 8, 64, 512, 4096 threads, healthy then the vacancy backend 10× slower),
    /// product-page, product-page-merging, slow-backend, overload,
    /// hedging, grpc-aggregate, pool-overload, pg-one-query (these two start their own
    /// PostgreSQL), parallel-calls (closed-loop clients), antispam-models (10 ONNX models
    /// per gRPC call, a model file swapped every 10 s, 1000 client connections), threads
    /// (HeadHunter's thread benchmark in Java, 1 … 4096 threads, beside the article's
    /// table; takes only --quick, --tasks and --out), hop (the latency one gateway hop
    /// adds: a 1 ms stub at 2 000 req/s, directly and through fanout, and with --targets
    /// fanout,hyper-baseline through the same hop written by hand; takes --quick, --trials,
    /// --duration, --targets and --out), seeds (every seed article's scenarios in turn,
    /// one report beside the articles' figures; takes only --quick, --out and --scenarios),
    /// pass-small, pass-bulk, sse-events (1 KiB answers, 64 MiB downloads, event streams
    /// through a pass-through route: fanout beside nginx, CPU per request / per GB / per
    /// 1 000 events; take --quick, --trials, --duration, --targets and --out),
    /// graphql-posts, graphql-posts-identical (Tailcall's benchmark query through fanout's
    /// graphql: route beside Tailcall 1.0.0, installed with npm on first use: answers compared
    /// byte for byte, then requests per CPU-second; take --quick, --trials, --duration, --rate,
    /// --targets, --baseline-bin (a tailcall executable) and --out).
    scenario: String,
    /// Targets, comma-separated: fanout, hyper-baseline, java-threads, java-blocking,
    /// java-virtual, java-threads-N (both Java pools of N threads), grpc-baseline,
    /// pg-baseline, antispam-py, or the scenario's variants. Default: the
    /// scenario's own (overload, pool-overload: fanout,java-threads; hedging:
    /// no-hedge,hedge; product-page-merging: naive,variant1,variant2; grpc-aggregate:
    /// fanout,grpc-baseline; pg-one-query: fanout,pg-baseline; parallel-calls:
    /// fanout,java-blocking,java-virtual; antispam-models: fanout,antispam-py; hh-pools:
    /// fanout,java-threads-8,java-threads-64,java-threads-512,java-threads-4096; others:
    /// fanout).
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// Reduced run (< 60 s).
    #[arg(long)]
    quick: bool,
    /// Rounds of interleaved trials (default 3 with --quick, else 5; parallel-calls: 1 with
    /// --quick, else 3).
    #[arg(long)]
    trials: Option<usize>,
    /// Output directory.
    #[arg(long, default_value = "lab-out")]
    out: String,
    /// The hand-written baseline executable: `hyper-aggregator` (hyper-baseline) or
    /// `grpc-aggregator` (grpc-baseline). Default: that binary next to this one; when it is
    /// not there, the lab builds it with `cargo build --release -p PACKAGE` in the workspace
    /// this binary was built from.
    #[arg(long)]
    baseline_bin: Option<String>,
    /// antispam-models: instead of the interleaved levels, one long run per target at half
    /// of fanout's capacity, e.g. `10m` (RSS after its warm-up and at the end).
    #[arg(long)]
    duration: Option<String>,
    /// seeds: run only these seed scenarios, comma-separated (default: all of them).
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Skip the capacity search and take this rate (requests per second) as every
    /// target's capacity: the levels are fractions of it. For a machine whose noise cuts
    /// the search short; the report says the capacity was given.
    #[arg(long)]
    capacity: Option<f64>,
    /// graphql-posts, graphql-posts-identical: requests per second offered to each target
    /// (default 200).
    #[arg(long)]
    rate: Option<f64>,
    /// threads: tasks per run instead of the article's 16 384 (`--quick`: 1 024); the same
    /// program and pool sizes, shorter.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    tasks: Option<u32>,
    /// Log format: `text` or `json`.
    #[arg(long, default_value = "text")]
    log_format: String,
}

/// Write to stdout, ignoring a closed pipe.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($t)*);
    }};
}
/// [`out!`] with a newline.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}
/// `eprintln!` that ignores a closed stderr.
macro_rules! errln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

fn main() -> ExitCode {
    // Launched as `fanout lab`: the help and usage name that command.
    let launched = std::env::var_os(fanout_lab::FANOUT_BIN_ENV).is_some();
    let mut cmd = Cli::command();
    if launched {
        cmd = cmd.bin_name("fanout lab");
    }
    let cli = match Cli::from_arg_matches_mut(&mut cmd.get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    init_logs(&cli.log_format);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Logs go to stderr, coloured only when it is a terminal and `NO_COLOR` is unset or empty; never
/// in JSON (as the `fanout` binary's).
fn init_logs(format: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let ansi = format != "json" && !no_color && std::io::stderr().is_terminal();
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if format == "json" {
        b.json().init();
    } else {
        b.init();
    }
}

/// The runtime: one worker per core, a small bounded blocking pool (as `fanout`'s).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(4)
        .thread_name("fanout-worker")
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// The `fanout` executable the lab runs as system under test, stub and load generator: the one
/// that launched it (`fanout lab`), else the `fanout` next to this executable.
fn fanout_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(fanout_lab::FANOUT_BIN_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().context("locating the fanout-lab executable")?;
    let next = me.with_file_name(format!("fanout{}", std::env::consts::EXE_SUFFIX));
    if next.is_file() {
        Ok(next)
    } else {
        anyhow::bail!(
            "there is no `fanout` executable next to {} (the lab runs it as the system under test, the stubs and the load generator): build it with `cargo build --release -p fanout` in the same workspace, or run the lab as `fanout lab …`",
            me.display()
        )
    }
}

/// The command line for the report's `command` field: the one the user typed (`fanout lab …`,
/// passed on by the launcher), else this process's.
fn command_line() -> String {
    std::env::var(fanout_lab::COMMAND_ENV)
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "))
}

/// `--duration D` as a duration (`10m`, `30s`, a bare number of seconds).
fn parse_duration(d: &str) -> anyhow::Result<std::time::Duration> {
    fanout_load::Schedule::parse(&format!("const(1,{d})"))
        .map(|s| s.duration())
        .map_err(|e| anyhow::anyhow!("--duration {d}: {e}"))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let Cli {
        scenario,
        targets,
        quick,
        trials,
        out,
        baseline_bin,
        duration,
        scenarios,
        capacity,
        tasks,
        rate,
        log_format: _,
    } = cli;
    if rate.is_some() && fanout_lab::graphql_posts::Mode::of(&scenario).is_none() {
        anyhow::bail!(
            "--rate is for `fanout lab graphql-posts` and `graphql-posts-identical` only"
        );
    }
    if tasks.is_some() && scenario != fanout_lab::threads::NAME {
        anyhow::bail!("--tasks is for `fanout lab threads` only");
    }
    if scenario == fanout_lab::seeds::NAME {
        if !targets.is_empty()
            || trials.is_some()
            || baseline_bin.is_some()
            || duration.is_some()
            || capacity.is_some()
        {
            anyhow::bail!(
                "lab seeds takes only --quick, --out and --scenarios (each scenario runs with the targets that answer its article)"
            );
        }
        let opts = fanout_lab::seeds::SeedsOptions {
            quick,
            out: out.clone().into(),
            only: scenarios,
            fanout_bin: fanout_bin()?,
            command: command_line(),
        };
        let rep = runtime()?.block_on(fanout_lab::seeds::run(opts))?;
        out!("{}", fanout_lab::seeds::text_summary(&rep));
    } else if scenario == fanout_lab::hop::NAME {
        // One gateway target, and optionally the hand-written hop beside it.
        let with_baseline = targets.iter().any(|t| t == fanout_lab::hop::BASELINE);
        let gateways: Vec<&String> = targets
            .iter()
            .filter(|t| *t != fanout_lab::hop::BASELINE)
            .collect();
        let gateway_runtime = match gateways.as_slice() {
            [] => None,
            [t] if *t == "fanout" => None,
            [t] if fanout_lab::targets::runtime_of(t).is_some() => {
                fanout_lab::targets::runtime_of(t)
            }
            _ => anyhow::bail!(
                "lab hop takes one gateway target: fanout (the default), {} (the gateway with server.runtime: per_core) or {} (server.runtime: work_stealing), and optionally {} (the same hop written by hand with tokio and hyper)",
                fanout_lab::model::PER_CORE,
                fanout_lab::model::WORK_STEALING,
                fanout_lab::hop::BASELINE
            ),
        };
        if !scenarios.is_empty() || capacity.is_some() || (baseline_bin.is_some() && !with_baseline)
        {
            anyhow::bail!(
                "lab hop takes only --quick, --trials, --duration, --targets, --out and (with the {} target) --baseline-bin",
                fanout_lab::hop::BASELINE
            );
        }
        let mut opts = fanout_lab::hop::HopOptions::new(
            quick,
            out.clone().into(),
            fanout_bin()?,
            command_line(),
        );
        opts.runtime = gateway_runtime;
        if with_baseline {
            let inputs = fanout_lab::baseline::Inputs::from_env(
                fanout_lab::baseline::HYPER,
                baseline_bin.map(Into::into),
                fanout_bin()?,
            );
            opts.baseline = Some(runtime()?.block_on(fanout_lab::baseline::ensure(&inputs))?);
        }
        if let Some(t) = trials {
            opts.rounds = t.max(1);
        }
        if let Some(d) = duration {
            opts.trial = parse_duration(&d)?;
        }
        let rep = runtime()?.block_on(fanout_lab::hop::run(opts))?;
        out!("{}", fanout_lab::hop::text_summary(&rep));
    } else if let Some(kind) = fanout_lab::streams::Kind::of(&scenario) {
        // fanout beside nginx on a pass-through route.
        if !scenarios.is_empty() || capacity.is_some() || baseline_bin.is_some() || tasks.is_some()
        {
            anyhow::bail!(
                "lab {scenario} takes only --quick, --trials, --duration, --targets (fanout, nginx) and --out"
            );
        }
        let mut opts = fanout_lab::streams::StreamsOptions::new(
            kind,
            quick,
            out.clone().into(),
            fanout_bin()?,
            command_line(),
        );
        if !targets.is_empty() {
            opts.targets = targets;
        }
        if let Some(t) = trials {
            opts.rounds = t.max(1);
        }
        if let Some(d) = duration {
            opts.trial = parse_duration(&d)?;
        }
        let rep = runtime()?.block_on(fanout_lab::streams::run(opts))?;
        out!("{}", fanout_lab::streams::text_summary(&rep));
    } else if let Some(mode) = fanout_lab::graphql_posts::Mode::of(&scenario) {
        // fanout's GraphQL route beside Tailcall.
        if !scenarios.is_empty() || capacity.is_some() || tasks.is_some() {
            anyhow::bail!(
                "lab {scenario} takes only --quick, --trials, --duration, --rate, --targets (fanout, fanout-coalesce, tailcall, tailcall-dedupe), --baseline-bin (a tailcall executable) and --out"
            );
        }
        let mut opts = fanout_lab::graphql_posts::GraphqlOptions::new(
            mode,
            quick,
            out.clone().into(),
            fanout_bin()?,
            command_line(),
        );
        if !targets.is_empty() {
            opts.targets = targets;
        }
        if let Some(t) = trials {
            opts.rounds = t.max(1);
        }
        if let Some(d) = duration {
            opts.trial = parse_duration(&d)?;
        }
        if let Some(r) = rate {
            if !(r.is_finite() && r > 0.0) {
                anyhow::bail!("--rate must be a positive number of requests per second");
            }
            opts.rate = r;
        }
        opts.tailcall_bin = baseline_bin.map(Into::into);
        let rep = runtime()?.block_on(fanout_lab::graphql_posts::run(opts))?;
        out!("{}", fanout_lab::graphql_posts::text_summary(&rep));
        outln!("report: {out}/report.html  {out}/report.json");
        if !rep.failed.is_empty() {
            let names: Vec<&str> = rep.failed.keys().map(String::as_str).collect();
            anyhow::bail!(
                "target(s) {} could not run (see FAILED above); the report has the others' figures",
                names.join(", ")
            );
        }
        return Ok(());
    } else if scenario == fanout_lab::threads::NAME {
        if !targets.is_empty()
            || trials.is_some()
            || baseline_bin.is_some()
            || duration.is_some()
            || !scenarios.is_empty()
            || capacity.is_some()
        {
            anyhow::bail!(
                "lab threads takes only --quick, --tasks and --out (it runs one Java program, no targets)"
            );
        }
        let rep = fanout_lab::threads::run_tasks(
            quick,
            tasks,
            std::path::Path::new(&out),
            &command_line(),
        )?;
        out!("{}", fanout_lab::threads::text_summary(&rep));
    } else {
        if let Some(c) = capacity
            && !(c.is_finite() && c > 0.0)
        {
            anyhow::bail!("--capacity must be a positive number of requests per second");
        }
        if !scenarios.is_empty() {
            anyhow::bail!("--scenarios is for `fanout lab seeds` only");
        }
        let duration = duration.as_deref().map(parse_duration).transpose()?;
        let opts = fanout_lab::LabOptions {
            scenario,
            targets,
            quick,
            out: out.clone().into(),
            trials,
            fanout_bin: fanout_bin()?,
            baseline_bin: baseline_bin.map(Into::into),
            command: command_line(),
            duration,
            capacity,
        };
        let rep = runtime()?.block_on(fanout_lab::run(opts))?;
        out!("{}", fanout_lab::report::text_summary(&rep));
    }
    outln!("report: {out}/report.html  {out}/report.json");
    Ok(())
}
