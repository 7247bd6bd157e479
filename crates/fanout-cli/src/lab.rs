//! `fanout lab ARGS…`: a launcher, not the lab. The lab (`crates/fanout-lab`: Java, `initdb`,
//! cargo builds of baselines, report rendering) is a binary of its own, `fanout-lab`, so the
//! binary that serves traffic does not link it (docs/ARCHITECTURE.md). This runs the `fanout-lab`
//! executable next to the current one with the arguments as given, naming this `fanout` as the
//! system under test, stub and load generator (`FANOUT_LAB_FANOUT_BIN`) and passing the command
//! line for the report (`FANOUT_LAB_COMMAND`); on Unix it replaces this process, so the exit
//! status and signals are the lab's.
//!
//! When `fanout-lab` is not next to this binary (`cargo build -p fanout` builds only the
//! gateway) and the workspace this binary was built from is still there, it is built first with
//! `cargo build [--release] -p fanout-lab`, in the profile of this binary, into its target
//! directory; otherwise the launcher fails naming the command that builds it. Asked for help
//! (`--help`, `-h`) without `fanout-lab` next to it, it builds nothing: it prints the usage and
//! the command that builds the lab, whose own help lists the scenarios.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `eprintln!` that ignores a closed stderr.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

/// The lab's package and executable.
pub const LAB_PACKAGE: &str = "fanout-lab";

/// The variable naming the `fanout` executable for the lab (`fanout_lab::FANOUT_BIN_ENV`).
pub const FANOUT_BIN_ENV: &str = "FANOUT_LAB_FANOUT_BIN";

/// The variable carrying the command line for the report (`fanout_lab::COMMAND_ENV`).
pub const COMMAND_ENV: &str = "FANOUT_LAB_COMMAND";

/// A cargo build of the lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabBuild {
    /// The workspace root (cargo runs there).
    pub workspace: PathBuf,
    /// The cargo target directory (always passed as `CARGO_TARGET_DIR`).
    pub target_dir: PathBuf,
    /// `--release` (this `fanout` is a release build) or the dev profile.
    pub release: bool,
    /// Where the executable will be.
    pub bin: PathBuf,
}

impl LabBuild {
    /// The cargo arguments.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["build"];
        if self.release {
            a.push("--release");
        }
        a.extend(["-p", LAB_PACKAGE]);
        a.into_iter().map(str::to_string).collect()
    }

    /// The command as a user would type it (with `CARGO_TARGET_DIR=…` when the target
    /// directory is not the workspace's `target`).
    pub fn command_line(&self) -> String {
        let env = if self.target_dir == self.workspace.join("target") {
            String::new()
        } else {
            format!("CARGO_TARGET_DIR={} ", self.target_dir.display())
        };
        format!(
            "cd {} && {env}cargo {}",
            self.workspace.display(),
            self.args().join(" ")
        )
    }
}

/// Where the lab comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabPlan {
    /// Run this executable.
    Use(PathBuf),
    /// Build it first.
    Build(LabBuild),
    /// Neither possible: what to do instead.
    Error(String),
}

/// The `fanout-lab` executable next to `fanout`.
fn lab_next_to(fanout: &Path) -> PathBuf {
    fanout.with_file_name(format!("{LAB_PACKAGE}{}", std::env::consts::EXE_SUFFIX))
}

/// Whether `d` is a fanout workspace with the lab's crate in it.
fn is_workspace(d: &Path) -> bool {
    std::fs::read_to_string(d.join("Cargo.toml")).is_ok_and(|m| m.contains("[workspace]"))
        && d.join("crates/fanout-lab/Cargo.toml").is_file()
}

/// Decide where the lab comes from, for the `fanout` executable `fanout`: the `fanout-lab` next
/// to it; else a build in the workspace above it or the one this binary was compiled in
/// (`compiled`), into the target directory `fanout` is in (else `env_target_dir`, relative to the
/// workspace, else its `target`); else an error naming the command that builds it.
pub fn plan(fanout: &Path, compiled: Option<&Path>, env_target_dir: Option<&Path>) -> LabPlan {
    let next = lab_next_to(fanout);
    if next.is_file() {
        return LabPlan::Use(next);
    }
    let root = fanout
        .ancestors()
        .skip(1)
        .find(|d| is_workspace(d))
        .or(compiled.filter(|d| is_workspace(d)));
    let Some(root) = root else {
        return LabPlan::Error(format!(
            "`fanout lab` runs the {LAB_PACKAGE} executable, which is not next to {} (the production build leaves the lab out), and there is no fanout workspace to build it in; in a fanout checkout, build it with `cargo build --release -p {LAB_PACKAGE}` and put target/release/{LAB_PACKAGE} next to this fanout (or run it directly)",
            fanout.display()
        ));
    };
    // The profile of this `fanout`: its directory's name in a target directory, else the one it
    // was compiled with (a copy elsewhere).
    let release = match fanout
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
    {
        Some("release") => true,
        Some("debug") => false,
        _ => !cfg!(debug_assertions),
    };
    // The cargo target directory this `fanout` lives in (so the lab lands next to it), else
    // `CARGO_TARGET_DIR`, else the workspace's `target`.
    let target_dir = fanout
        .ancestors()
        .skip(1)
        .take(4)
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
        .or_else(|| env_target_dir.map(|d| root.join(d)))
        .unwrap_or_else(|| root.join("target"));
    let exe = format!("{LAB_PACKAGE}{}", std::env::consts::EXE_SUFFIX);
    LabPlan::Build(LabBuild {
        workspace: root.to_path_buf(),
        bin: target_dir
            .join(if release { "release" } else { "debug" })
            .join(exe),
        target_dir,
        release,
    })
}

/// The workspace root this crate was compiled in (`<root>/crates/fanout-cli`).
fn compiled_workspace() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
}

/// The cargo executable: `$CARGO`, else `cargo` from `PATH`.
fn cargo_bin() -> OsString {
    std::env::var_os("CARGO")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "cargo".into())
}

/// Build the lab as `b` says (cargo's output goes to stderr as it comes).
fn build(b: &LabBuild) -> Result<PathBuf, String> {
    let command = b.command_line();
    say!("building the lab ({LAB_PACKAGE} is not next to this fanout): {command}");
    let mut cargo = std::process::Command::new(cargo_bin());
    cargo
        .args(b.args())
        .current_dir(&b.workspace)
        .stdin(std::process::Stdio::null());
    cargo.env("CARGO_TARGET_DIR", &b.target_dir);
    match cargo.status() {
        Ok(s) if s.success() && b.bin.is_file() => Ok(b.bin.clone()),
        Ok(s) if s.success() => Err(format!(
            "`{command}` succeeded but {} does not exist",
            b.bin.display()
        )),
        Ok(s) => Err(format!(
            "building the lab failed ({s}); run `{command}` by hand to see why"
        )),
        Err(e) => Err(format!(
            "building the lab: cargo could not be started ({e}); install Rust (https://rustup.rs) and run `{command}`"
        )),
    }
}

/// `fanout lab ARGS…`: find (or build) `fanout-lab` and run it with `args`; `log_format` is
/// passed on when it is not the default. Returns only when the lab could not be run, or (not on
/// Unix) with the lab's exit status.
pub fn launch(args: Vec<OsString>, log_format: Option<&str>) -> ExitCode {
    let fanout = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            say!("error: locating the fanout executable: {e}");
            return ExitCode::from(1);
        }
    };
    let env_target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let plan = plan(
        &fanout,
        compiled_workspace().as_deref(),
        env_target_dir.as_deref(),
    );
    // help must not wait minutes for a build
    if asks_for_help(&args) && !matches!(plan, LabPlan::Use(_)) {
        use std::io::Write as _;
        let _ = std::io::stdout()
            .lock()
            .write_all(help_without_lab(&fanout, &plan).as_bytes());
        return ExitCode::SUCCESS;
    }
    let lab = match plan {
        LabPlan::Use(p) => p,
        LabPlan::Build(b) => match build(&b) {
            Ok(p) => p,
            Err(e) => {
                say!("error: {e}");
                return ExitCode::from(1);
            }
        },
        LabPlan::Error(e) => {
            say!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let mut cmd = std::process::Command::new(&lab);
    if let Some(f) = log_format {
        cmd.args(["--log-format", f]);
    }
    cmd.args(&args)
        .env(FANOUT_BIN_ENV, &fanout)
        .env(COMMAND_ENV, std::env::args().collect::<Vec<_>>().join(" "));
    run(cmd, &lab)
}

/// Whether the lab's arguments ask for help (`--help` or `-h` before any `--`).
pub fn asks_for_help(args: &[OsString]) -> bool {
    args.iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "--help" || a == "-h")
}

/// What `fanout lab --help` prints when the lab is not next to `fanout`: the usage, and how to
/// get the lab (whose help lists the scenarios and options) — without building it.
pub fn help_without_lab(fanout: &Path, plan: &LabPlan) -> String {
    let how = match plan {
        LabPlan::Use(p) => format!("Its help: {} --help\n", p.display()),
        LabPlan::Build(b) => format!(
            "`fanout lab SCENARIO …` builds it first (minutes, once) with\n\n  {}\n\nRun that \
             command, then `fanout lab --help` again for the scenarios and every option.\n",
            b.command_line()
        ),
        LabPlan::Error(e) => format!("{e}.\n"),
    };
    format!(
        "Run a lab scenario against one or more targets and write report.html / report.json.\n\n\
         Usage: fanout lab [OPTIONS] <SCENARIO>\n\n\
         The scenarios and options are the lab's: the {LAB_PACKAGE} executable, which is not \
         next to this fanout ({}).\n{how}",
        fanout.display()
    )
}

#[cfg(unix)]
fn run(mut cmd: std::process::Command, lab: &Path) -> ExitCode {
    use std::os::unix::process::CommandExt;
    // Only returns on failure.
    let e = cmd.exec();
    say!("error: running {}: {e}", lab.display());
    ExitCode::from(1)
}

#[cfg(not(unix))]
fn run(mut cmd: std::process::Command, lab: &Path) -> ExitCode {
    match cmd.status() {
        Ok(s) => ExitCode::from(s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
        Err(e) => {
            say!("error: running {}: {e}", lab.display());
            ExitCode::from(1)
        }
    }
}
