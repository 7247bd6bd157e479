//! The hand-written Rust baselines: [`HYPER`] (`bench/baselines/hyper-aggregator`, target
//! `hyper-baseline`) and [`GRPC`] (`bench/baselines/grpc-aggregator`, target `grpc-baseline`).
//! Each is `--baseline-bin PATH` if given, else its binary next to the `fanout` binary, else built
//! on demand with `cargo build --release -p PACKAGE` in the workspace the lab was built from
//! (they are workspace members, not default members, so a plain `cargo build` skips them).
//!
//! [`plan`] decides (a pure function of the paths and what exists); [`ensure`] carries it out.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// One hand-written baseline: which crate, and what the lab calls it in its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Baseline {
    /// The package and binary name.
    pub package: &'static str,
    /// Its directory in the workspace (as listed in the workspace's `members`).
    pub member: &'static str,
    /// How messages name it (`hyper baseline`).
    pub what: &'static str,
}

/// `hyper-baseline`: the examples' two flows on tokio + hyper.
pub const HYPER: Baseline = Baseline {
    package: "hyper-aggregator",
    member: "bench/baselines/hyper-aggregator",
    what: "hyper baseline",
};

/// `grpc-baseline`: the `grpc-aggregate` flow on tonic's codec + hyper.
pub const GRPC: Baseline = Baseline {
    package: "grpc-aggregator",
    member: "bench/baselines/grpc-aggregator",
    what: "gRPC baseline",
};

/// `pg-baseline`: a one-query Postgres route on hyper + tokio-postgres.
pub const PG: Baseline = Baseline {
    package: "pg-query",
    member: "bench/baselines/pg-query",
    what: "Postgres baseline",
};

/// Lines of cargo's output kept for the error message of a failed build.
const TAIL_LINES: usize = 40;

/// What [`plan`] needs to know about the file system.
pub trait Files {
    /// Whether `p` is a regular file (following symlinks).
    fn is_file(&self, p: &Path) -> bool;
    /// The contents of `p`, if it is a readable text file.
    fn read_to_string(&self, p: &Path) -> Option<String>;
}

/// The real file system.
pub struct RealFiles;

impl Files for RealFiles {
    fn is_file(&self, p: &Path) -> bool {
        p.is_file()
    }

    fn read_to_string(&self, p: &Path) -> Option<String> {
        std::fs::read_to_string(p).ok()
    }
}

/// The facts the decision depends on.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// Which baseline.
    pub baseline: Baseline,
    /// `--baseline-bin`, if given: used as is, never built.
    pub explicit: Option<PathBuf>,
    /// The running `fanout` executable.
    pub fanout_bin: PathBuf,
    /// `CARGO_TARGET_DIR` of the environment, if set (relative: to the workspace root, where
    /// cargo runs).
    pub env_target_dir: Option<PathBuf>,
    /// The workspace this crate was compiled in (from `CARGO_MANIFEST_DIR`): where to build when
    /// the `fanout` binary does not live inside its workspace (e.g. `CARGO_TARGET_DIR` elsewhere).
    pub compiled_workspace: Option<PathBuf>,
}

impl Inputs {
    /// The inputs of this process for `baseline`: `explicit`, `fanout_bin`, the environment's
    /// `CARGO_TARGET_DIR` and the workspace this crate was compiled in.
    pub fn from_env(baseline: Baseline, explicit: Option<PathBuf>, fanout_bin: PathBuf) -> Inputs {
        Inputs {
            baseline,
            explicit,
            fanout_bin,
            env_target_dir: std::env::var_os("CARGO_TARGET_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            compiled_workspace: compiled_workspace(),
        }
    }
}

/// The workspace root this crate was compiled in: `CARGO_MANIFEST_DIR` is `<root>/crates/fanout-lab`.
pub fn compiled_workspace() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
}

/// A cargo build of the baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// Which baseline.
    pub baseline: Baseline,
    /// The workspace root (cargo runs there).
    pub workspace: PathBuf,
    /// The cargo target directory to build into (always passed as `CARGO_TARGET_DIR`, so the
    /// binary lands where the lab looks for it).
    pub target_dir: PathBuf,
    /// Whether the command shown to the user needs `CARGO_TARGET_DIR=…` (the target directory
    /// is not the workspace's `target`).
    pub shows_target_dir: bool,
    /// Where the binary will be: `<target_dir>/release/<package>`.
    pub bin: PathBuf,
}

impl Build {
    /// The cargo arguments.
    pub fn args(&self) -> [&'static str; 4] {
        ["build", "--release", "-p", self.baseline.package]
    }

    /// The command as a user would type it: `cd ROOT && [CARGO_TARGET_DIR=DIR ]cargo build
    /// --release -p PACKAGE`.
    pub fn command_line(&self) -> String {
        let env = if self.shows_target_dir {
            format!("CARGO_TARGET_DIR={} ", self.target_dir.display())
        } else {
            String::new()
        };
        format!(
            "cd {} && {env}cargo {}",
            self.workspace.display(),
            self.args().join(" ")
        )
    }
}

/// What to do about the baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Run this executable.
    Use(PathBuf),
    /// Build it first.
    Build(Build),
    /// Neither possible: why, and what to do instead.
    Error(String),
}

/// Decide where the baseline comes from:
///
/// 1. `--baseline-bin PATH` → that file (an error if it does not exist; never built);
/// 2. the baseline's binary next to the `fanout` binary → that file;
/// 3. else build it in the workspace: the nearest ancestor of the `fanout` binary whose
///    `Cargo.toml` lists the baseline as a member, else the workspace the lab was compiled in.
///    The target directory is the cargo target directory the `fanout` binary lives in (marked by
///    `CACHEDIR.TAG`; so the baseline lands next to it when it is a release build), else
///    `CARGO_TARGET_DIR`, else `<root>/target`.
pub fn plan(inputs: &Inputs, files: &dyn Files) -> Plan {
    let Baseline {
        package,
        member,
        what,
    } = inputs.baseline;
    let by_hand = format!("cargo build --release -p {package}");
    if let Some(p) = &inputs.explicit {
        return if files.is_file(p) {
            Plan::Use(p.clone())
        } else {
            Plan::Error(format!(
                "the {what} is not at {} (--baseline-bin): build it with `{by_hand}` in a fanout checkout and pass <checkout>/target/release/{package}, or leave --baseline-bin out and the lab builds it",
                p.display()
            ))
        };
    }
    let next = inputs.fanout_bin.with_file_name(package);
    if files.is_file(&next) {
        return Plan::Use(next);
    }
    let is_workspace = |d: &Path| {
        files
            .read_to_string(&d.join("Cargo.toml"))
            .is_some_and(|m| m.contains("[workspace]") && m.contains(member))
            && files.is_file(&d.join(member).join("Cargo.toml"))
    };
    let root = inputs
        .fanout_bin
        .ancestors()
        .skip(1)
        .find(|d| is_workspace(d))
        .map(Path::to_path_buf)
        .or_else(|| {
            inputs
                .compiled_workspace
                .clone()
                .filter(|d| is_workspace(d))
        });
    let Some(root) = root else {
        return Plan::Error(format!(
            "the {what} ({package}) is not next to {} and there is no fanout workspace to build it in (looked in the directories above that binary{}); build it with `{by_hand}` in a fanout checkout and pass --baseline-bin <checkout>/target/release/{package}",
            inputs.fanout_bin.display(),
            inputs
                .compiled_workspace
                .as_ref()
                .map(|d| format!(" and in {}, where the lab was built", d.display()))
                .unwrap_or_default()
        ));
    };
    let exe_target = inputs
        .fanout_bin
        .ancestors()
        .skip(1)
        .take(4)
        .find(|d| files.is_file(&d.join("CACHEDIR.TAG")))
        .map(Path::to_path_buf);
    let env_target = inputs.env_target_dir.as_ref().map(|d| root.join(d));
    let target_dir = exe_target
        .or(env_target)
        .unwrap_or_else(|| root.join("target"));
    Plan::Build(Build {
        baseline: inputs.baseline,
        shows_target_dir: target_dir != root.join("target"),
        bin: target_dir.join("release").join(package),
        workspace: root,
        target_dir,
    })
}

/// Why the baseline is not available.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// Not found and not buildable (the message says what to do).
    #[error("{0}")]
    NotFound(String),
    /// cargo could not be started.
    #[error(
        "building the {what}: `{cargo}` could not be started ({source}); install Rust (https://rustup.rs) and run `{command}`, or pass --baseline-bin PATH"
    )]
    NoCargo {
        /// Which baseline (`hyper baseline`).
        what: &'static str,
        /// The cargo executable tried.
        cargo: String,
        /// The command to run by hand.
        command: String,
        /// Cause.
        source: std::io::Error,
    },
    /// cargo failed.
    #[error(
        "building the {what} failed ({status}); run `{command}` by hand to see why, or pass --baseline-bin PATH. The end of cargo's output:\n{tail}"
    )]
    BuildFailed {
        /// Which baseline (`hyper baseline`).
        what: &'static str,
        /// Exit status.
        status: String,
        /// The command to run by hand.
        command: String,
        /// The last lines cargo printed.
        tail: String,
    },
    /// cargo succeeded but the binary is not where it should be.
    #[error(
        "`{command}` succeeded but {bin} does not exist; build the baseline by hand and pass --baseline-bin PATH"
    )]
    Missing {
        /// The command that ran.
        command: String,
        /// Where the binary was expected.
        bin: String,
    },
}

/// The cargo executable: `$CARGO` (set when the lab runs under cargo), else `cargo` from `PATH`.
pub fn cargo_bin() -> PathBuf {
    std::env::var_os("CARGO")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("cargo"))
}

/// Find or build the baseline (see [`plan`]); returns the executable. Nothing runs unless the
/// plan says to build; the build is an async child process (it never blocks a runtime worker).
pub async fn ensure(inputs: &Inputs) -> Result<PathBuf, BaselineError> {
    match plan(inputs, &RealFiles) {
        Plan::Use(p) => Ok(p),
        Plan::Error(m) => Err(BaselineError::NotFound(m)),
        Plan::Build(b) => build(&b, &cargo_bin()).await,
    }
}

/// Run `cargo build --release -p PACKAGE` for `b` with `cargo`, streaming its output to stderr
/// (indented) and keeping the end of it for the error message.
pub async fn build(b: &Build, cargo: &Path) -> Result<PathBuf, BaselineError> {
    let command = b.command_line();
    let Baseline { package, what, .. } = b.baseline;
    eprintln!("building the {what} ({package} is not next to the fanout binary): {command}");
    let mut child = tokio::process::Command::new(cargo)
        .args(b.args())
        .current_dir(&b.workspace)
        .env("CARGO_TARGET_DIR", &b.target_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| BaselineError::NoCargo {
            what,
            cargo: cargo.display().to_string(),
            command: command.clone(),
            source,
        })?;
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let (mut tail, err_tail) = tokio::join!(relay(out), relay(err));
    tail.extend(err_tail);
    let status = child.wait().await;
    let failed = |status: String| BaselineError::BuildFailed {
        what,
        status,
        command: command.clone(),
        tail: tail
            .iter()
            .skip(tail.len().saturating_sub(TAIL_LINES))
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
    };
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(failed(s.to_string())),
        Err(e) => return Err(failed(format!("waiting for cargo: {e}"))),
    }
    if !b.bin.is_file() {
        return Err(BaselineError::Missing {
            command,
            bin: b.bin.display().to_string(),
        });
    }
    eprintln!("built the {what}: {}", b.bin.display());
    Ok(b.bin.clone())
}

/// Copy `r` line by line to stderr (indented); return the last [`TAIL_LINES`] lines.
async fn relay<R: AsyncRead + Unpin>(r: Option<R>) -> Vec<String> {
    let mut tail = std::collections::VecDeque::new();
    let Some(r) = r else {
        return Vec::new();
    };
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("    {line}");
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    tail.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A file system of listed files (path → contents).
    #[derive(Default)]
    struct Fake(BTreeMap<PathBuf, String>);

    impl Fake {
        fn with(mut self, p: &str, body: &str) -> Fake {
            self.0.insert(PathBuf::from(p), body.to_string());
            self
        }

        /// A fanout checkout at `root` (workspace manifest listing the baseline).
        fn workspace(self, root: &str) -> Fake {
            self.with(
                &format!("{root}/Cargo.toml"),
                "[workspace]\nmembers = [\"crates/*\", \"bench/baselines/hyper-aggregator\", \"bench/baselines/grpc-aggregator\"]\n",
            )
            .with(&format!("{root}/{}/Cargo.toml", HYPER.member), "[package]")
            .with(&format!("{root}/{}/Cargo.toml", GRPC.member), "[package]")
        }
    }

    impl Files for Fake {
        fn is_file(&self, p: &Path) -> bool {
            self.0.contains_key(p)
        }
        fn read_to_string(&self, p: &Path) -> Option<String> {
            self.0.get(p).cloned()
        }
    }

    fn inputs(explicit: Option<&str>, exe: &str) -> Inputs {
        Inputs {
            baseline: HYPER,
            explicit: explicit.map(PathBuf::from),
            fanout_bin: PathBuf::from(exe),
            env_target_dir: None,
            compiled_workspace: Some(PathBuf::from("/src/fanout")),
        }
    }

    fn build_of(p: Plan) -> Build {
        match p {
            Plan::Build(b) => b,
            other => panic!("expected a build, got {other:?}"),
        }
    }

    #[test]
    fn an_explicit_baseline_is_used_as_is_and_never_built() {
        let fs = Fake::default()
            .workspace("/w")
            .with("/w/target/CACHEDIR.TAG", "")
            .with("/tmp/hb", "");
        let exe = "/w/target/release/fanout";
        assert_eq!(
            plan(&inputs(Some("/tmp/hb"), exe), &fs),
            Plan::Use(PathBuf::from("/tmp/hb"))
        );
        // Missing: an error naming the path and the command, not a build.
        let Plan::Error(m) = plan(&inputs(Some("/tmp/nope"), exe), &fs) else {
            panic!("a missing --baseline-bin is an error");
        };
        assert!(
            m.contains("/tmp/nope") && m.contains("--baseline-bin"),
            "{m}"
        );
        assert!(
            m.contains("cargo build --release -p hyper-aggregator"),
            "{m}"
        );
    }

    #[test]
    fn a_baseline_next_to_the_binary_is_used() {
        let fs = Fake::default()
            .workspace("/w")
            .with("/w/target/CACHEDIR.TAG", "")
            .with("/w/target/release/hyper-aggregator", "");
        assert_eq!(
            plan(&inputs(None, "/w/target/release/fanout"), &fs),
            Plan::Use(PathBuf::from("/w/target/release/hyper-aggregator"))
        );
        // Even with no workspace around (an installed copy with its baseline beside it).
        let fs = Fake::default().with("/opt/fanout/hyper-aggregator", "");
        assert_eq!(
            plan(&inputs(None, "/opt/fanout/fanout"), &fs),
            Plan::Use(PathBuf::from("/opt/fanout/hyper-aggregator"))
        );
    }

    #[test]
    fn a_missing_baseline_is_built_in_the_binarys_workspace_and_target_dir() {
        let fs = Fake::default()
            .workspace("/w")
            .workspace("/src/fanout")
            .with("/w/target/CACHEDIR.TAG", "");
        let b = build_of(plan(&inputs(None, "/w/target/release/fanout"), &fs));
        assert_eq!(
            b,
            Build {
                baseline: HYPER,
                workspace: PathBuf::from("/w"),
                target_dir: PathBuf::from("/w/target"),
                shows_target_dir: false,
                bin: PathBuf::from("/w/target/release/hyper-aggregator"),
            }
        );
        assert_eq!(
            b.command_line(),
            "cd /w && cargo build --release -p hyper-aggregator"
        );
        // A debug `fanout` still gets a release baseline, in the same target directory.
        let b = build_of(plan(&inputs(None, "/w/target/debug/fanout"), &fs));
        assert_eq!(b.bin, PathBuf::from("/w/target/release/hyper-aggregator"));
        // The binary's target directory wins over CARGO_TARGET_DIR: the baseline lands next to it.
        let mut i = inputs(None, "/w/target/release/fanout");
        i.env_target_dir = Some(PathBuf::from("/elsewhere"));
        assert_eq!(
            build_of(plan(&i, &fs)).target_dir,
            PathBuf::from("/w/target")
        );
    }

    #[test]
    fn a_target_dir_outside_the_workspace_builds_in_the_compiled_workspace() {
        // CARGO_TARGET_DIR=/tb cargo build --release: /tb/release/fanout, no workspace above it.
        let fs = Fake::default()
            .workspace("/src/fanout")
            .with("/tb/CACHEDIR.TAG", "");
        let b = build_of(plan(&inputs(None, "/tb/release/fanout"), &fs));
        assert_eq!(b.workspace, PathBuf::from("/src/fanout"));
        assert_eq!(b.target_dir, PathBuf::from("/tb"));
        assert_eq!(b.bin, PathBuf::from("/tb/release/hyper-aggregator"));
        assert_eq!(
            b.command_line(),
            "cd /src/fanout && CARGO_TARGET_DIR=/tb cargo build --release -p hyper-aggregator"
        );
    }

    #[test]
    fn a_binary_outside_any_target_dir_uses_cargo_target_dir_or_the_workspace_target() {
        let fs = Fake::default().workspace("/src/fanout");
        let b = build_of(plan(&inputs(None, "/usr/local/bin/fanout"), &fs));
        assert_eq!(b.target_dir, PathBuf::from("/src/fanout/target"));
        assert!(!b.shows_target_dir);
        let mut i = inputs(None, "/usr/local/bin/fanout");
        i.env_target_dir = Some(PathBuf::from("/ct"));
        let b = build_of(plan(&i, &fs));
        assert_eq!(b.bin, PathBuf::from("/ct/release/hyper-aggregator"));
        assert!(b.command_line().contains("CARGO_TARGET_DIR=/ct cargo"));
        // Relative: to the workspace root, where cargo runs.
        i.env_target_dir = Some(PathBuf::from("tgt"));
        assert_eq!(
            build_of(plan(&i, &fs)).target_dir,
            PathBuf::from("/src/fanout/tgt")
        );
    }

    #[test]
    fn no_workspace_is_an_error_with_the_command_to_run_by_hand() {
        // The compiled-in workspace is gone, or is not fanout's (no baseline member).
        let fs = Fake::default().with("/tb/CACHEDIR.TAG", "").with(
            "/src/fanout/Cargo.toml",
            "[workspace]\nmembers = [\"crates/*\"]",
        );
        let Plan::Error(m) = plan(&inputs(None, "/tb/release/fanout"), &fs) else {
            panic!("no workspace: an error");
        };
        assert!(
            m.contains("cargo build --release -p hyper-aggregator") && m.contains("--baseline-bin"),
            "{m}"
        );
        assert!(m.contains("/tb/release/fanout"), "{m}");
    }

    #[test]
    fn the_grpc_baseline_is_found_and_built_like_the_hyper_baseline() {
        let grpc = |explicit: Option<&str>, exe: &str| Inputs {
            baseline: GRPC,
            ..inputs(explicit, exe)
        };
        // Next to the binary (the hyper baseline beside it is not taken for it).
        let fs = Fake::default()
            .workspace("/w")
            .with("/w/target/CACHEDIR.TAG", "")
            .with("/w/target/release/hyper-aggregator", "")
            .with("/w/target/release/grpc-aggregator", "");
        assert_eq!(
            plan(&grpc(None, "/w/target/release/fanout"), &fs),
            Plan::Use(PathBuf::from("/w/target/release/grpc-aggregator"))
        );
        // Missing: built with its own package name.
        let fs = Fake::default()
            .workspace("/w")
            .with("/w/target/CACHEDIR.TAG", "")
            .with("/w/target/release/hyper-aggregator", "");
        let b = build_of(plan(&grpc(None, "/w/target/release/fanout"), &fs));
        assert_eq!(b.bin, PathBuf::from("/w/target/release/grpc-aggregator"));
        assert_eq!(
            b.command_line(),
            "cd /w && cargo build --release -p grpc-aggregator"
        );
        // A missing --baseline-bin names the gRPC baseline and its build command.
        let Plan::Error(m) = plan(&grpc(Some("/tmp/nope"), "/w/target/release/fanout"), &fs) else {
            panic!("a missing --baseline-bin is an error");
        };
        assert!(
            m.contains("gRPC baseline") && m.contains("cargo build --release -p grpc-aggregator"),
            "{m}"
        );
        // A workspace without the gRPC baseline's member cannot build it.
        let fs = Fake::default()
            .with(
                "/w/Cargo.toml",
                "[workspace]\nmembers = [\"bench/baselines/hyper-aggregator\"]",
            )
            .with("/w/bench/baselines/hyper-aggregator/Cargo.toml", "")
            .with("/w/target/CACHEDIR.TAG", "");
        let mut i = grpc(None, "/w/target/release/fanout");
        i.compiled_workspace = None;
        assert!(matches!(plan(&i, &fs), Plan::Error(_)));
    }

    fn a_build(dir: &Path) -> Build {
        Build {
            baseline: HYPER,
            workspace: dir.to_path_buf(),
            target_dir: dir.join("target"),
            shows_target_dir: false,
            bin: dir.join("target/release/hyper-aggregator"),
        }
    }

    #[tokio::test]
    async fn build_failures_name_the_command_to_run_by_hand() {
        let dir = std::env::temp_dir().join(format!("fanout-baseline-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let b = a_build(&dir);
        // No cargo.
        let e = build(&b, Path::new("/nonexistent/cargo"))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("could not be started"), "{e}");
        assert!(
            e.contains("cargo build --release -p hyper-aggregator"),
            "{e}"
        );
        // cargo fails (`false` stands in for it: no real build in the test suite).
        let e = build(&b, Path::new("false"))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("failed") && e.contains(&b.command_line()), "{e}");
        // cargo succeeds (`true`) but produced nothing where the lab looks.
        let e = build(&b, Path::new("true"))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("does not exist"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
