//! What the lab's test binaries share (`tests/lab.rs`, the smoke runs of tier 2, and
//! `tests/lab_long.rs`, the long runs of `scripts/lab-long`): the executables, one lab run at a
//! time, running `fanout lab …` and reading its report back.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Lab runs measure the machine; two at once would measure each other. Run them one at a time.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `fanout` executable; `fanout lab` runs the `fanout-lab` beside it, which this test binary
/// does not build (`cargo test -p fanout`) and would leave stale: it is built once per test run
/// (cargo's no-op when it is up to date).
pub fn bin() -> &'static str {
    static FRESH_LAB: std::sync::Once = std::sync::Once::new();
    FRESH_LAB.call_once(build_lab);
    env!("CARGO_BIN_EXE_fanout")
}

/// `cargo build [--release] -p fanout-lab` into the target directory of this test's `fanout`;
/// not when `FANOUT_LAB_BUILT=1` says the run that built this test (`./scripts/test`'s
/// `cargo test --workspace`, which builds `fanout-lab` for its own tests) built it too: `cargo
/// build -p fanout-lab` resolves features without the workspace's dev-dependencies and would
/// compile the gateway's crates a second time.
pub fn build_lab() {
    if std::env::var_os("FANOUT_LAB_BUILT").is_some_and(|v| v == "1") {
        return;
    }
    let fanout = Path::new(env!("CARGO_BIN_EXE_fanout"));
    let profile_dir = fanout.parent().expect("fanout is in a profile directory");
    let target_dir = profile_dir.parent().expect("in a target directory");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .args(["build", "-p", "fanout-lab"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .env("CARGO_TARGET_DIR", target_dir);
    if profile_dir.file_name() == Some("release".as_ref()) {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("run cargo build -p fanout-lab");
    assert!(status.success(), "cargo build -p fanout-lab: {status}");
}

/// A hard link of `from` at `to`, else a copy.
pub fn link_or_copy(from: &Path, to: &Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).expect("copy the executable");
    }
}

/// The `fanout-lab` executable beside `fanout` (built by [`bin`]).
pub fn lab_bin() -> PathBuf {
    let p = Path::new(bin()).with_file_name("fanout-lab");
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

pub fn baseline() -> PathBuf {
    let p = Path::new(bin()).with_file_name("hyper-aggregator");
    assert!(
        p.exists(),
        "{} is missing: run the workspace tests (`cargo test --workspace`) or `cargo build -p hyper-aggregator`",
        p.display()
    );
    p
}

/// The hand-written gRPC baseline, next to the test binary like the hyper baseline.
pub fn grpc_baseline() -> PathBuf {
    let p = Path::new(bin()).with_file_name("grpc-aggregator");
    assert!(
        p.exists(),
        "{} is missing: run the workspace tests (`cargo test --workspace`) or `cargo build -p grpc-aggregator`",
        p.display()
    );
    p
}

pub fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fanout-lab-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// What the lab prints when it builds the hyper baseline.
pub const BUILDING: &str = "building the hyper baseline";

/// The capacity the comparisons' and `slow-backend`'s tests give the lab (`--capacity`): levels
/// at 50 % and 80 % of it (5 and 8 req/s; slow-backend's phases at half), well under what a debug
/// build on a loaded 2-core machine serves. What they check — equal work, calls per request,
/// ABBA rounds, counts that agree, the fallback while a backend fails — does not need the
/// capacity search, which takes a third to a half of such a run; the search stays live where
/// the rates are its point: `overload` (3× the capacity found; `pool-overload` and
/// `antispam-models` too in their long runs, tests/lab_long.rs).
pub const GIVEN_CAPACITY: &str = "10";

/// Run the lab; return report.json. `--baseline-bin` is passed only when `hyper-baseline` is a
/// target: the other runs show that a target needing nothing built triggers nothing.
pub fn run_lab(scenario: &str, targets: &str, out: &Path) -> serde_json::Value {
    run_lab_with(scenario, targets, out, &[])
}

/// [`run_lab`] with more arguments.
pub fn run_lab_with(scenario: &str, targets: &str, out: &Path, more: &[&str]) -> serde_json::Value {
    let mut cmd = Command::new(bin());
    cmd.args(["lab", scenario, "--targets", targets, "--quick", "--out"])
        .arg(out)
        .args(more);
    if targets.split(',').any(|t| t == "hyper-baseline") {
        cmd.arg("--baseline-bin").arg(baseline());
    }
    if targets.split(',').any(|t| t == "grpc-baseline") {
        cmd.arg("--baseline-bin").arg(grpc_baseline());
    }
    let (rep, _, stderr) = lab_report(&mut cmd, out);
    assert!(
        !stderr.contains(BUILDING),
        "nothing to build for {targets}:\n{stderr}"
    );
    rep
}

/// Run a `fanout lab …` command writing into `out`; it must succeed. Returns report.json, the
/// text it printed and its stderr.
pub fn lab_report(cmd: &mut Command, out: &Path) -> (serde_json::Value, String, String) {
    let o = cmd.output().expect("run fanout lab");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "fanout lab failed:\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let text = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    (
        serde_json::from_str(&text).expect("report.json is JSON"),
        stdout,
        stderr,
    )
}

/// Acceptance lines of a report for one target: (check, pass).
pub fn acceptance(rep: &serde_json::Value, target: &str) -> Vec<(String, bool)> {
    fanout_lab::recorded::Recorded::parse("report.json", &rep.to_string())
        .expect("report.json reads back into the lab's report types")
        .acceptance(target)
}

/// The run wrote its report: `report.json` reads back into the lab's report types (what the
/// recorded-run tests of `crates/fanout-lab/tests/recorded.rs` render the text and page from)
/// and `report.html` is there. The page's shape is checked on recorded runs, not here.
pub fn assert_report_files(out: &Path) {
    if let Err(e) = fanout_lab::recorded::Recorded::load(out) {
        panic!("{e}");
    }
    let html = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", out.display());
}
