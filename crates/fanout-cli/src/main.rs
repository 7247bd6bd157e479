//! `fanout` binary: argument parsing only; see the library for the commands.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use fanout::{
    ReloadTriggers, config_digest, demo, explain, load_gateway_file, run_until_stopped,
    shutdown_signal, start_gateway_on,
};
use fanout_config::BareNumber;
use fanout_config::env_lookup;
use std::process::ExitCode;

// glibc malloc spends a quarter of the engine's time in the flow benchmark and grows per-thread
// arenas under load (the Mail.ru seed); mimalloc is faster and returns memory. `fanout-alloc`
// calls it without its aligned entry points where they would only cost (see that crate).
#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "fanout",
    version,
    about = "A high-load API orchestrator: declarative fan-out of one request to many backends"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log format: `text` or `json`.
    #[arg(long, global = true, default_value = "text")]
    log_format: String,
}

/// The config file of a command: `fanout CMD FILE` or `fanout CMD --config FILE`, alike in every
/// command that reads one.
#[derive(Args)]
#[group(required = true, multiple = false)]
struct ConfigFile {
    /// The config file (YAML).
    #[arg(value_name = "FILE")]
    file: Option<String>,
    /// The config file (YAML), the same as FILE.
    #[arg(long, short, value_name = "FILE")]
    config: Option<String>,
}

impl ConfigFile {
    fn path(self) -> String {
        // the group is required: clap refuses a command line with neither
        self.file.or(self.config).unwrap_or_default()
    }
}

/// Write to stdout, ignoring a closed pipe (`fanout schema | head -1`): the reader has what it
/// wanted, and a command must not panic on it. Other write errors are as unreportable.
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

#[derive(Subcommand)]
enum Cmd {
    /// Run the gateway.
    Serve {
        #[command(flatten)]
        config: ConfigFile,
        /// Listen address; overrides `listen:` of the config.
        #[arg(long)]
        listen: Option<String>,
        /// Admin listener address (`/metrics`, `/healthz`, `/readyz`), or `off`; overrides
        /// `admin.listen` of the config (default 127.0.0.1:9901).
        #[arg(long)]
        admin_listen: Option<String>,
        /// Serving cores (default: one per core), each a single-threaded runtime; with
        /// `server.runtime: work_stealing`, the runtime's worker threads.
        #[arg(long)]
        workers: Option<usize>,
        /// Reload the config when the file's content changes (SIGHUP always reloads).
        #[arg(long)]
        watch: bool,
        /// How often --watch looks at the file, e.g. `2s`, `500ms`.
        #[arg(long, default_value = "2s")]
        watch_interval: String,
    },
    /// Check a gateway or stubs config: exits 1 and prints FILE:LINE:COL: message for each error.
    Validate {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Describe a route's plan: its steps, what each waits for, which run in parallel, their
    /// timeouts and the worst case of the critical path against the deadline.
    Explain {
        #[command(flatten)]
        config: ConfigFile,
        /// The route: its path pattern (`/orders/{id}`) or method and path pattern
        /// (`'POST /orders/{id}'`). Default: every route.
        #[arg(long)]
        route: Option<String>,
        /// Output: `text`, or `mermaid` (a flowchart for docs).
        #[arg(long, value_enum, default_value_t = ExplainFormat::Text)]
        format: ExplainFormat,
        /// Also state Little's law at this rate (req/s) for each route: requests in flight at
        /// the critical path's worst case, the threads a thread-per-request server would need
        /// for them, and fanout's fixed threads (text only).
        #[arg(long)]
        rate: Option<f64>,
    },
    /// Print the JSON Schema of the gateway config (or, with --stubs, of the stubs config; with
    /// --cases, of the cases file of `fanout test`).
    Schema {
        /// Print the schema of `fanout stub` configs instead.
        #[arg(long, conflicts_with = "cases")]
        stubs: bool,
        /// Print the schema of `fanout test` cases files instead.
        #[arg(long)]
        cases: bool,
    },
    /// Run test cases against a config, its backends simulated by a stubs file: exit 0 only when
    /// every case passes. FILE is a directory (its fanout.yaml) or a config file; stubs.yaml,
    /// cases.yaml and schema.sql are taken from beside it. See docs/testing.md.
    Test {
        /// A directory holding fanout.yaml, or a gateway config file.
        #[arg(value_name = "FILE", required_unless_present = "config")]
        file: Option<String>,
        /// The gateway config file, the same as FILE (then every positional argument is a
        /// case name).
        #[arg(long, short, value_name = "FILE")]
        config: Option<String>,
        /// Run only the cases whose name contains one of these.
        #[arg(value_name = "CASES")]
        names: Vec<String>,
        /// The stubs file (default: stubs.yaml beside the config, if any).
        #[arg(long, value_name = "FILE")]
        stubs: Option<String>,
        /// The cases file (default: cases.yaml beside the config).
        #[arg(long, value_name = "FILE")]
        cases: Option<String>,
        /// Also write the results as JUnit XML to this file.
        #[arg(long, value_name = "FILE")]
        junit: Option<String>,
        /// Rewrite the expected `response:` of each case whose answer differs with the actual
        /// answer, in place (comments and layout of the rest of the file kept).
        #[arg(long)]
        update: bool,
        /// The database the config's ${DATABASE_URL} points at, used as it is (default: a
        /// throw-away PostgreSQL database created from schema.sql, when initdb is installed).
        #[arg(long, value_name = "URL")]
        database_url: Option<String>,
        /// The SQL run in the throw-away database (default: schema.sql beside the config).
        #[arg(long, value_name = "FILE")]
        schema_sql: Option<String>,
        /// How long one request may take before its case fails, e.g. `10s`, `500ms`.
        #[arg(long, default_value = "10s")]
        timeout: String,
        /// Calls kept per stub service and case for `backend_calls.*.calls` checks.
        #[arg(long, value_name = "N", default_value_t = 1000)]
        max_recorded_calls: usize,
        /// After the results, list the routes and flow branches (`when`, `for_each`, optional
        /// defaults, `on_status` entries, `fail`) that no case went through, with FILE:LINE:COL.
        /// The exit status is unchanged.
        #[arg(long)]
        coverage: bool,
        /// Write the coverage as JSON to this file (total, exercised, missing lines).
        #[arg(long, value_name = "FILE")]
        coverage_json: Option<String>,
        /// Also check each case's request and answer against its route's declared schemas
        /// (`request_schema`, `answer_schema`; an error answer against the error object): a
        /// mismatch fails the case (docs/openapi.md).
        #[arg(long)]
        schemas: bool,
        /// After the results, print a draft answer schema (JSON Schema 2020-12, as YAML) for
        /// each flow route, from its cases' success answers, to review before declaring it as
        /// the route's `answer_schema`; nothing is written (docs/openapi.md).
        #[arg(long)]
        propose_schemas: bool,
    },
    /// Print the OpenAPI 3.1 document of a config's routes: operations, parameters, schemas,
    /// every error answer, security schemes (docs/openapi.md). Exits 1 with FILE:LINE:COL for
    /// a config that does not load. `fanout openapi import SPEC` prints a starting config.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Openapi {
        #[command(subcommand)]
        action: Option<OpenapiAction>,
        #[command(flatten)]
        config: ConfigFile,
        /// Output: `json` or `yaml`.
        #[arg(long, value_enum, default_value_t = DocFormat::Json)]
        format: DocFormat,
    },
    /// Run simulated backends from a stubs config.
    Stub {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Open-model load generator: latency from the intended send time, schedules in Tank syntax.
    Load {
        /// Target URL, e.g. http://127.0.0.1:8080/vacancies?text=rust (with --grpc:
        /// http://127.0.0.1:8080 or 127.0.0.1:8080).
        url: String,
        /// Schedule: `const(RPS,DUR)`, `line(FROM,TO,DUR)`, `step(FROM,TO,STEP,DUR)`, in sequence.
        /// DUR is `500ms`, `10s`, `2m`, `1m30s`, … or a bare number of SECONDS (Tank's
        /// convention: `const(100,10)` lasts 10 s), unlike --timeout and thresholds.
        #[arg(long, short, default_value = "const(100,10s)")]
        schedule: String,
        /// HTTP method.
        #[arg(long, short = 'X', default_value = "GET")]
        method: String,
        /// Header `name: value` (repeatable).
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Request body (with --grpc: the request message as JSON, default `{}`).
        #[arg(long, short = 'd', visible_alias = "data")]
        body: Option<String>,
        /// Use HTTP/2 (h2c prior knowledge; over https://, h2 chosen by ALPN).
        #[arg(long)]
        http2: bool,
        /// https:// targets: PEM file of the CA certificates to trust (default: the web PKI
        /// roots).
        #[arg(long, value_name = "FILE")]
        cacert: Option<std::path::PathBuf>,
        /// https:// targets: accept any server certificate (a self-signed test gateway).
        #[arg(long, short = 'k')]
        insecure: bool,
        /// https:// targets: never resume a TLS session, so every new connection makes a full
        /// handshake (with `-H 'connection: close'`: one per request).
        #[arg(long)]
        no_tls_resumption: bool,
        /// Call this unary gRPC method (`package.Service/Method`) over h2c: the --data JSON is
        /// encoded with the --proto files, -H headers are metadata, and an answer succeeds only
        /// with grpc-status OK (others are counted by code name).
        #[arg(long, value_name = "METHOD", requires = "proto")]
        grpc: Option<String>,
        /// A .proto file defining the --grpc method (repeatable).
        #[arg(long, value_name = "FILE", requires = "grpc")]
        proto: Vec<String>,
        /// Directory to resolve .proto imports in (repeatable). Default: each --proto file's
        /// directory, then the current directory.
        #[arg(long, value_name = "DIR", requires = "grpc")]
        import_path: Vec<String>,
        /// Maximum connections (HTTP/1.1: one request in flight per connection).
        #[arg(long, default_value_t = 512)]
        connections: usize,
        /// HTTP/2 and gRPC: open N connections before the run and send the requests over them
        /// in turn (N clients, each on a connection of its own; default: connections open on
        /// demand, up to 100 streams each).
        #[arg(long, value_name = "N", default_value_t = 0)]
        open_connections: usize,
        /// Per-request timeout, e.g. `10s`, `500ms`, `1m30s`; a bare number is milliseconds.
        #[arg(long, default_value = "10s")]
        timeout: String,
        /// Give every request its own `x-request-id` (`load-0001` … `load-1024`, in turn), as
        /// distinct clients would: a gateway that keys shared work by all headers cannot share.
        #[arg(long)]
        distinct_request_ids: bool,
        /// Pass/fail threshold, e.g. `p99<50ms`, `errors<1%`, `rate>=950` (repeatable; exit 2 on
        /// failure). A latency limit without a unit is in milliseconds.
        #[arg(long)]
        threshold: Vec<String>,
        /// Write the full report as JSON (schema: crates/fanout-load/README.md).
        #[arg(long)]
        json: Option<String>,
    },
    /// Run a lab scenario against one or more targets and write report.html / report.json.
    ///
    /// `fanout lab --help` lists the scenarios and options. The lab is the `fanout-lab`
    /// executable next to this one, built from the workspace when it is missing; it runs this
    /// `fanout` as the system under test, stubs and load generator.
    #[command(disable_help_flag = true)]
    Lab {
        /// The lab's arguments, passed on as they are: SCENARIO [--targets …] [--quick] …
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
    /// Quick start: example stubs + gateway in one process, with a ready curl line.
    Demo {
        /// Gateway listen address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
    },
}

/// `fanout openapi import`.
#[derive(Subcommand)]
enum OpenapiAction {
    /// Print a starting config from an OpenAPI 3.0/3.1 document (JSON or YAML): one route per
    /// operation, to a backend made from its first server; an operation's schemas (request
    /// body, path and query parameters, success answer) are carried into a proxy flow route,
    /// the others are pass-through routes.
    Import {
        /// The OpenAPI document.
        #[arg(value_name = "SPEC")]
        spec: String,
        /// Carry no schema: every operation a pass-through route.
        #[arg(long)]
        no_schemas: bool,
    },
}

/// `fanout openapi --format`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DocFormat {
    /// JSON, indented.
    Json,
    /// YAML.
    Yaml,
}

/// `fanout explain --format`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ExplainFormat {
    /// Steps by level, timeouts, backend layers, critical path.
    Text,
    /// A Mermaid flowchart.
    Mermaid,
}

/// Logs go to stderr, one line per event (`logline.rs`), coloured only when it is a terminal (a file or a pipe gets plain text, so
/// `grep request_id=…` finds the line) and `NO_COLOR` is unset or empty (<https://no-color.org>);
/// never in JSON.
fn init_logs(format: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let ansi = format != "json" && !no_color && std::io::stderr().is_terminal();
    // One event, one line: whatever a request or a backend put in a field is escaped.
    let writer = fanout::logline::OneLine {
        ansi,
        json: format == "json",
    };
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    if format == "json" {
        b.json().init();
    } else {
        b.init();
    }
}

/// The runtime: a fixed number of workers (default one per core) and a small bounded pool for
/// blocking work (DNS lookups of host names, file reads), so the thread count cannot grow with load.
fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(w) = workers {
        b.worker_threads(w.max(1));
    }
    b.max_blocking_threads(4)
        .thread_name("fanout-worker")
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// The control thread's runtime of a per-core gateway (`server.runtime: per_core`): one thread
/// for the admin listener, reloads and background refreshes, a small blocking pool.
fn control_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // The runtime runs on this thread (`block_on`): what it connects is kept for no core.
    fanout_runtime::cores::enter_control();
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(4)
        .thread_name("fanout-control")
        .on_thread_start(fanout_runtime::cores::enter_control)
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Schema { stubs, cases } => {
            let schema = if stubs {
                fanout_stub::schema()
            } else if cases {
                fanout::testing::schema()
            } else {
                fanout_proxy::registry::schema()
            };
            outln!(
                "{}",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Cmd::Validate { config } => {
            let file = config.path();
            let (kind, checked) = if fanout::looks_like_stubs_config(&file) {
                (
                    " (stubs config)",
                    fanout_stub::load_file(&file, &env_lookup).map(drop),
                )
            } else {
                // Warnings (a valid config that may not mean what it says) before the verdict.
                let loaded = load_gateway_file(&file, &env_lookup).map(|gw| {
                    for w in gw.config_warnings() {
                        errln!("{w}");
                    }
                });
                ("", loaded)
            };
            match checked {
                Ok(()) => {
                    outln!("{file}: ok{kind}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    errln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Openapi {
            action: Some(OpenapiAction::Import { spec, no_schemas }),
            ..
        } => {
            let text = match fanout_config::read_limited(&spec, fanout_config::MAX_CONFIG_BYTES) {
                Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                Err(e) => {
                    errln!("{spec}: {e}");
                    return ExitCode::from(1);
                }
            };
            match fanout_openapi::import(&text, &spec, !no_schemas) {
                Ok(cfg) => {
                    out!("{cfg}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    errln!("{spec}: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Openapi { config, format, .. } => {
            let file = config.path();
            match fanout::openapi::export(&file, &env_lookup, format == DocFormat::Yaml) {
                Ok(text) => {
                    out!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    errln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Explain {
            config,
            route,
            format,
            rate,
        } => {
            let format = match format {
                ExplainFormat::Text => explain::Format::Text,
                ExplainFormat::Mermaid => explain::Format::Mermaid,
            };
            if let Some(r) = rate
                && (!(r.is_finite() && r > 0.0) || format == explain::Format::Mermaid)
            {
                errln!("--rate takes a rate above 0 (req/s), with --format text");
                return ExitCode::from(1);
            }
            match explain::explain_file_at(
                &config.path(),
                &env_lookup,
                route.as_deref(),
                format,
                rate,
            ) {
                Ok(text) => {
                    out!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    errln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Test {
            file,
            config,
            names,
            stubs,
            cases,
            junit,
            update,
            database_url,
            schema_sql,
            timeout,
            max_recorded_calls,
            coverage,
            coverage_json,
            schemas,
            propose_schemas,
        } => {
            let timeout = match fanout_config::parse_duration(&timeout, BareNumber::Millis) {
                Ok(t) => t,
                Err(e) => {
                    errln!("--timeout: {e}");
                    return ExitCode::from(2);
                }
            };
            // with --config, a first positional argument is a case name, not the config
            let (target, filter) = match (config, file) {
                (Some(c), Some(first)) => (c, std::iter::once(first).chain(names).collect()),
                (Some(c), None) => (c, names),
                (None, f) => (f.unwrap_or_default(), names),
            };
            let args = fanout::testing::TestArgs {
                target: target.into(),
                filter,
                stubs: stubs.map(Into::into),
                cases: cases.map(Into::into),
                junit: junit.map(Into::into),
                update,
                database_url,
                schema_sql: schema_sql.map(Into::into),
                timeout: Some(timeout),
                max_recorded_calls,
                coverage,
                coverage_json: coverage_json.map(Into::into),
                schemas,
                propose_schemas,
            };
            // the gateway's log goes to memory (for `log:` checks), not to the terminal
            let done = runtime(None).and_then(|rt| rt.block_on(fanout::testing::cli(args)));
            match done {
                Ok(fanout::testing::Outcome::Passed) => ExitCode::SUCCESS,
                Ok(fanout::testing::Outcome::Failed) => ExitCode::from(1),
                Err(e) => {
                    errln!("{e:#}");
                    ExitCode::from(2)
                }
            }
        }
        // The lab is a binary of its own: run it (no logs, no runtime here).
        Cmd::Lab { args } => {
            let format = (cli.log_format != "text").then_some(cli.log_format.as_str());
            fanout::lab::launch(args, format)
        }
        cmd => {
            init_logs(&cli.log_format);
            let in_use_hint = addr_in_use_hint(&cmd);
            match run(cmd) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    errln!("error: {e:#}");
                    // the admin listener's error keeps its kind too (fanout::start_gateway)
                    let in_use = e.chain().any(|c| {
                        c.downcast_ref::<std::io::Error>()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
                    });
                    if in_use && let Some(hint) = in_use_hint {
                        errln!("hint: {hint}");
                    }
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// What to say when a command cannot bind its address: another process (often a second fanout:
/// the demo and every example use 8080 and 9901) has it.
fn addr_in_use_hint(cmd: &Cmd) -> Option<&'static str> {
    match cmd {
        Cmd::Serve { .. } => Some(
            "another process listens there (a second fanout?): choose free addresses with \
             `--listen 127.0.0.1:8081` and `--admin-listen 127.0.0.1:9902` (or `--admin-listen off`)",
        ),
        Cmd::Demo { .. } => Some(
            "another process listens there (a second fanout?): choose a free address with \
             `--listen 127.0.0.1:8081`; the demo's admin listener is on port 0 (any free port)",
        ),
        Cmd::Stub { .. } => Some(
            "another process listens there: change the service's `listen:` in the stubs config \
             (or use `127.0.0.1:0` for any free port)",
        ),
        _ => None,
    }
}

/// Ignore SIGHUP from the first instruction on (its default action ends the process): until the
/// runtime installs its handler (which logs it), a `kill -HUP` during config loading or start-up
/// must not stop the gateway either.
fn ignore_sighup_until_handled() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code; it is done
    // before any thread is started.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
}

fn run(cmd: Cmd) -> anyhow::Result<()> {
    if matches!(cmd, Cmd::Serve { .. } | Cmd::Stub { .. } | Cmd::Demo { .. }) {
        ignore_sighup_until_handled();
    }
    match cmd {
        Cmd::Serve {
            config,
            listen,
            admin_listen,
            workers,
            watch,
            watch_interval,
        } => {
            let config = config.path();
            if fanout::looks_like_stubs_config(&config) {
                anyhow::bail!(
                    "{config} is a stubs config (top-level `services:`): run it with `fanout stub {config}`"
                );
            }
            // Before reading the config: a change made from here on is seen by the watch.
            let loaded = watch.then(|| config_digest(&config)).flatten();
            let gw = load_gateway_file(&config, &env_lookup).map_err(|e| anyhow::anyhow!("{e}"))?;
            for w in gw.config_warnings() {
                tracing::warn!(warning = %w, "config warning");
            }
            let addr = listen.unwrap_or_else(|| gw.listen.clone());
            let admin = match admin_listen {
                Some(a) => fanout_config::AdminConfig {
                    listen: Some(a),
                    ..Default::default()
                }
                .listen_addr()
                .map(str::to_string),
                None => gw.admin.listen_addr().map(str::to_string),
            };
            let every = fanout_config::parse_duration(&watch_interval, BareNumber::Millis)
                .map_err(|e| anyhow::anyhow!("--watch-interval: {e}"))?;
            let triggers = ReloadTriggers {
                path: config,
                watch: watch.then_some(every.max(std::time::Duration::from_millis(10))),
                loaded,
            };
            // Per core, the runtime started here is the control thread's (admin listener,
            // reloads, signals); the serving cores get one single-threaded runtime each.
            let rt = match gw.runtime_kind() {
                fanout_config::RuntimeKind::WorkStealing => runtime(workers)?,
                fanout_config::RuntimeKind::PerCore => control_runtime()?,
            };
            rt.block_on(async move {
                let running = start_gateway_on(gw, &addr, admin.as_deref(), workers)
                    .await
                    .with_context(|| format!("starting the gateway on {addr}"))?;
                let admin = running.admin_addr.map_or("off".into(), |a| a.to_string());
                tracing::info!(addr = %running.addr, %admin, "fanout serving");
                run_until_stopped(running.gateway.clone(), triggers).await;
                running.drain_and_stop().await?;
                Ok(())
            })
        }
        Cmd::Stub { config } => {
            let stubs = fanout_stub::load_file(&config.path(), &env_lookup)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            runtime(None)?.block_on(async move {
                // each service logs `stub service listening` with its address as it binds
                let server = stubs.start().await.context("starting stubs")?;
                shutdown_signal().await;
                server.shutdown().await;
                Ok(())
            })
        }
        Cmd::Demo { listen } => runtime(None)?.block_on(async move {
            let d = demo::start(&listen).await?;
            for (name, addr) in d.stubs.services() {
                outln!("stub {name:<10} http://{addr}");
            }
            outln!("gateway    http://{}", d.gateway.addr);
            if let Some(a) = d.gateway.admin_addr {
                outln!("admin      http://{a}/metrics  /healthz  /readyz");
                outln!("live page  http://{a}/ui");
            }
            outln!();
            outln!(
                "try:  curl -s 'http://{}/vacancies?text=rust'",
                d.gateway.addr
            );
            outln!(
                "      curl -s 'http://{}/vacancies?text=nothing'",
                d.gateway.addr
            );
            outln!("Ctrl-C to stop.");
            shutdown_signal().await;
            d.gateway.shutdown().await?;
            Ok(())
        }),
        Cmd::Load {
            url,
            schedule,
            method,
            headers,
            body,
            http2,
            cacert,
            insecure,
            no_tls_resumption,
            grpc,
            proto,
            import_path,
            connections,
            open_connections,
            timeout,
            distinct_request_ids,
            threshold,
            json,
        } => {
            let code = runtime(None)?.block_on(fanout::load::run_cli(fanout::load::LoadArgs {
                url,
                schedule,
                method,
                headers,
                body,
                http2,
                grpc,
                protos: proto,
                import_paths: import_path,
                connections,
                open_connections,
                timeout,
                distinct_request_ids,
                thresholds: threshold,
                json,
                tls: fanout_load::TlsOptions {
                    ca_file: cacert,
                    insecure,
                    no_resumption: no_tls_resumption,
                },
            }))?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Cmd::Schema { .. }
        | Cmd::Openapi { .. }
        | Cmd::Validate { .. }
        | Cmd::Explain { .. }
        | Cmd::Lab { .. }
        | Cmd::Test { .. } => Ok(()),
    }
}
