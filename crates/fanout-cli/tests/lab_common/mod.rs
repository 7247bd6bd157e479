//! What the lab's test binaries share (`tests/lab.rs`, the smoke runs of tier 2, and
//! `tests/lab_long.rs`, the long runs of `scripts/lab-long`): the executables, one lab run at a
//! time, running `fanout lab …` and reading its report back, and what a scenario's report holds
//! (`assert_<scenario>…`: one function for the smoke and the long run, given what differs —
//! the rounds, the targets, the counts).
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

/// `fanout` (a hard link of the executable, else a copy) in a directory of its own, `name`-PID
/// inside the cargo target directory: nothing next to it, the workspace and target directory
/// as usual. (The directory, to remove when done; the executable in it.)
pub fn fanout_alone(fanout: &Path, name: &str) -> (PathBuf, PathBuf) {
    let Some(target_dir) = fanout
        .ancestors()
        .skip(1)
        .find(|d| d.join("CACHEDIR.TAG").is_file())
    else {
        panic!("{} is not in a cargo target directory", fanout.display());
    };
    let dir = target_dir.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory in the target dir");
    let exe = dir.join("fanout");
    link_or_copy(fanout, &exe);
    (dir, exe)
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

/// `fanout lab ARGS… --out OUT`, to run with [`lab_report`] (after any `env` of the caller's).
pub fn lab_command(args: &[&str], out: &Path) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("lab").args(args).arg("--out").arg(out);
    cmd
}

/// [`lab_report`] of `fanout lab ARGS… --out OUT` with no Java to be found (`JAVA_HOME` unset,
/// an empty `PATH`): (report.json, stdout).
pub fn lab_report_without_java(args: &[&str], out: &Path) -> (serde_json::Value, String) {
    let empty = out.join("empty-path");
    std::fs::create_dir_all(&empty).expect("an empty PATH directory");
    let (rep, stdout, _) = lab_report(
        lab_command(args, out)
            .env_remove("JAVA_HOME")
            .env("PATH", &empty),
        out,
    );
    (rep, stdout)
}

/// [`lab_report`] of `fanout lab parallel-calls --quick` with fanout and `java-virtual`, no Java
/// runtime ≥ 21 to be found (`JAVA21_HOME`, `JAVA_HOME` unset, an empty JVM directory):
/// (report.json, stdout).
pub fn parallel_calls_without_java_21(out: &Path) -> (serde_json::Value, String) {
    let (rep, stdout, _) = lab_report(
        lab_command(
            &[
                "parallel-calls",
                "--targets",
                "fanout,java-virtual",
                "--quick",
            ],
            out,
        )
        .env_remove("JAVA21_HOME")
        .env_remove("JAVA_HOME")
        .env("FANOUT_LAB_JVM_DIR", out.join("no-jdks-here")),
        out,
    );
    (rep, stdout)
}

/// Whether the JVM scenario `scenario` must be skipped: no `javac` here (a note says so).
pub fn skip_without_javac(scenario: &str) -> bool {
    let skip = fanout_lab::java::javac_version().is_none();
    if skip {
        eprintln!(
            "note: lab {scenario} skipped: no javac (Debian: apt-get install default-jdk-headless)"
        );
    }
    skip
}

// ---- a scenario's report, as both the smoke runs (tests/lab.rs) and the long runs
// (tests/lab_long.rs) check it. `rounds` is the interleaved (ABBA) rounds of the run: 1 in the
// smoke runs (`--trials 1`), 3 in the long ones (`--quick`'s). Counts and shapes only.

/// Whether `n` trials stand behind a median of a run of `rounds` rounds: exactly one in a
/// one-round run, at least `rounds` in a longer one.
fn trials_of_rounds(n: Option<u64>, rounds: u64) -> bool {
    if rounds == 1 {
        n == Some(1)
    } else {
        n.is_some_and(|n| n >= rounds)
    }
}

/// Each of `fields` of `target`'s summary (report.json's `targets`) was measured: a number > 0.
pub fn assert_measured(rep: &serde_json::Value, target: &str, fields: &[&str]) {
    let t = &rep["targets"][target];
    for field in fields {
        let v = t[field].as_f64().unwrap_or(-1.0);
        assert!(v > 0.0, "{target}.{field} = {v}");
    }
}

/// `target`'s backend calls per request (its summary's) lie in `expected`.
pub fn assert_calls_per_request(
    rep: &serde_json::Value,
    target: &str,
    expected: std::ops::RangeInclusive<f64>,
) {
    let calls = rep["targets"][target]["backend_calls_per_request"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        expected.contains(&calls),
        "{target} backend calls per request: {calls}"
    );
}

/// `target`'s requests failed under 5 % (its summary's error rate).
pub fn assert_few_errors(rep: &serde_json::Value, target: &str) {
    let t = &rep["targets"][target];
    assert!(
        t["error_rate"].as_f64().is_some_and(|e| e < 0.05),
        "{target} errors: {}",
        t["error_rate"]
    );
}

/// The trials of `phase` took turns between two targets, ABBA: `rounds` rounds of one trial
/// each, every round the reverse of the one before.
pub fn assert_turns(rep: &serde_json::Value, phase: &str, rounds: u64) {
    let order: Vec<&str> = rep["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .filter(|t| t["phase"] == phase)
        .map(|t| t["target"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(order.len() as u64, 2 * rounds, "{phase}: {order:?}");
    assert_ne!(order[0], order[1], "{phase}: targets take turns: {order:?}");
    for r in order.chunks(2).collect::<Vec<_>>().windows(2) {
        assert_eq!(
            (r[1][0], r[1][1]),
            (r[0][1], r[0][0]),
            "{phase}: ABBA, a round reverses the one before: {order:?}"
        );
    }
}

/// `product-page`, fanout beside the hyper baseline at the capacity given (10 req/s): each
/// measured at both levels over `rounds` rounds, few errors, 8 backend calls per request (fewer
/// for fanout, whose in-flight dedup merges overlapping identical calls), the warning that the
/// capacity was given, the level-50 trials in turn, fanout's CPU ratio to the baseline per
/// level (the ratio of the medians and one per round), the direct path named call by call (no
/// added p50 for a target that shared calls), the children's start-up lines in their logs.
pub fn assert_product_page(rep: &serde_json::Value, out: &Path, rounds: u64) {
    for target in ["fanout", "hyper-baseline"] {
        let t = &rep["targets"][target];
        assert_measured(
            rep,
            target,
            &["cpu_us_per_request", "p50_ms", "p99_ms", "rss_max_mb"],
        );
        // The capacity given (no search): every target's.
        assert_eq!(t["max_rate"].as_f64(), Some(10.0), "{target}.max_rate");
        assert_few_errors(rep, target);
        assert!(t["threads_max"].as_u64().is_some_and(|n| n > 0));
        // masks ×2, recommendations, price/stock/media for products, price/media for
        // recommendations. The lab sends identical requests: when they overlap, fanout's
        // in-flight dedup merges their identical calls (fewer than 8); the hand-written
        // baseline has no dedup (exactly 8).
        let expected = if target == "fanout" {
            1.0..=8.5
        } else {
            7.5..=8.5
        };
        assert_calls_per_request(rep, target, expected);
        let levels = t["levels"].as_array().expect("levels");
        assert_eq!(levels.len(), 2, "50 % and 80 % levels");
        for l in levels {
            assert!(
                trials_of_rounds(l["cpu_us_per_request"]["n"].as_u64(), rounds),
                "{target}: trials of {rounds} round(s): {l}"
            );
        }
    }
    assert!(
        rep["warnings"].as_array().is_some_and(|w| w
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains("capacity given")))),
        "{}",
        rep["warnings"]
    );
    assert_turns(rep, "level-50", rounds);
    // fanout's CPU beside the baseline's, per level: the ratio of the medians and each round's.
    let relative = rep["relative"].as_array().expect("relative");
    let levels: Vec<&str> = relative
        .iter()
        .filter(|r| r["target"] == "fanout" && r["baseline"] == "hyper-baseline")
        .filter_map(|r| r["level"].as_str())
        .collect();
    assert_eq!(levels, ["level-50", "level-80"], "{relative:?}");
    for r in relative {
        assert_eq!(
            r["per_round"]["n"].as_u64(),
            Some(rounds),
            "a ratio per round: {r}"
        );
        assert!(
            r["ratio_of_medians"].as_f64().is_some_and(|x| x > 0.0),
            "{r}"
        );
    }
    // The direct path names each call as `service path`; a target that shared calls between
    // requests (fewer backend calls than the direct path has) gets no added p50.
    let direct = rep["direct"]["path"].as_array().expect("direct path");
    assert!(
        direct
            .iter()
            .all(|p| p.as_str().is_some_and(|p| p.contains(" /"))),
        "{direct:?}"
    );
    for target in ["fanout", "hyper-baseline"] {
        let t = &rep["targets"][target];
        let calls = t["backend_calls_per_request"].as_f64().unwrap_or(0.0);
        if calls + 0.05 < direct.len() as f64 {
            assert!(t["added_p50_ms"].is_null(), "{target}: {t}");
        }
    }
    // The children's logs hold their start-up lines.
    let log = |f: &str| std::fs::read_to_string(out.join(f)).unwrap_or_default();
    assert!(
        log("fanout.log").contains("fanout serving"),
        "{}",
        log("fanout.log")
    );
    assert!(
        log("stubs.log").contains("stub service listening"),
        "{}",
        log("stubs.log")
    );
}

/// `n-plus-one`, one target (`fanout` or `hyper-baseline`) over `rounds` rounds: its figures
/// measured, the fixed-rate phase (at most 300 req/s) then both levels, few errors at 50 %, and
/// its backend calls per request: 1 posts call + one per distinct user (10), nothing shared
/// between requests (never fewer than 11); fanout's dedup merges the 100 per-post calls into
/// about 10 (a few more on a loaded machine; without dedup: 101).
pub fn assert_n_plus_one_target(rep: &serde_json::Value, target: &str, rounds: u64) {
    let t = &rep["targets"][target];
    assert_measured(rep, target, &["cpu_us_per_request", "p50_ms", "rss_max_mb"]);
    let names: Vec<&str> = t["levels"]
        .as_array()
        .expect("levels")
        .iter()
        .map(|l| l["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["fixed-rate", "level-50", "level-80"], "{target}");
    // 300 req/s in a full run; `--quick` caps it at the 80 % level (a debug build).
    let fixed = &t["levels"][0];
    assert!(
        fixed["offered_rate"]
            .as_f64()
            .is_some_and(|r| r > 0.0 && r <= 300.0),
        "{target}: {fixed}"
    );
    assert!(
        trials_of_rounds(fixed["cpu_us_per_request"]["n"].as_u64(), rounds),
        "{target}: trials of {rounds} round(s) at the fixed rate: {fixed}"
    );
    // A user's call that ends before a later post asks for it makes one more, which on a
    // loaded machine (this debug build, CI's busy cores) happens a few times per request (14
    // seen under stress-tests). How many is the lab's figure, not this test's; the bound only
    // says dedup is in effect.
    let level50 = &t["levels"][1];
    assert!(
        level50["error_rate"]["median"]
            .as_f64()
            .is_some_and(|e| e < 0.05),
        "{target}: {level50}"
    );
    let calls = level50["backend_calls_per_request"]["median"]
        .as_f64()
        .unwrap_or(0.0);
    let expected = if target == "fanout" {
        10.5..=40.0
    } else {
        10.5..=11.5
    };
    assert!(
        expected.contains(&calls),
        "{target} backend calls per request: {calls}"
    );
}

/// `n-plus-one-identical`: both targets measured with few errors; coalescing off in `fanout`
/// (the lab's equal-work rule: no route coalesces), on in `coalesce` (its flow runs counted;
/// how many requests joined one depends on timing).
pub fn assert_n_plus_one_identical(rep: &serde_json::Value, out: &Path) {
    for target in ["fanout", "coalesce"] {
        let t = &rep["targets"][target];
        assert!(
            t["cpu_us_per_request"].as_f64().is_some_and(|v| v > 0.0),
            "{target}: {t}"
        );
        assert_few_errors(rep, target);
    }
    let status = |target: &str| -> serde_json::Value {
        let f = out.join(format!("{target}.status.json"));
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        serde_json::from_str(&text).expect("status is JSON")
    };
    let off = status("fanout");
    assert_eq!(off["coalesce"]["coalesced"], 0, "{}", off["coalesce"]);
    assert!(
        off["coalesce"]["routes"]
            .as_object()
            .is_some_and(|r| r.is_empty()),
        "{}",
        off["coalesce"]
    );
    let on = status("coalesce");
    let route = &on["coalesce"]["routes"]["GET /posts"];
    assert!(route["runs"].as_u64().is_some_and(|n| n > 0), "{route}");
    assert!(route["coalesced"].as_u64().is_some(), "{route}");
}

/// The names and offered rates of `target`'s phases in an overload scenario (`overload`,
/// `pool-overload`): `names` in order, the third (3×) offering over 4× the first (0.5×).
fn overload_phases(rep: &serde_json::Value, target: &str, names: [&str; 4]) -> Vec<f64> {
    let phases = rep["targets"][target]["phases"].as_array().expect("phases");
    let got: Vec<&str> = phases
        .iter()
        .map(|p| p["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(got, names, "{target}");
    let offered: Vec<f64> = phases
        .iter()
        .map(|p| p["offered_rate"].as_f64().unwrap_or(0.0))
        .collect();
    assert!(
        offered[2] > offered[0] * 4.0,
        "{target}: the 3x phase offers ~6× the 0.5x phase: {offered:?}"
    );
    offered
}

/// `target` printed each of the acceptance lines `wanted` (pass or not).
pub fn assert_acceptance_lines(rep: &serde_json::Value, target: &str, wanted: &[&str]) {
    let checks = acceptance(rep, target);
    for want in wanted {
        assert!(
            checks.iter().any(|(c, _)| c.contains(want)),
            "{target}: acceptance line `{want}` in {checks:?}"
        );
    }
}

/// `overload`, one target: the four phases (0.5×, ramp, 3×, 0.7×), goodput, threads and memory
/// at 3×, the success series after the drop, the four acceptance lines.
pub fn assert_overload_target(rep: &serde_json::Value, target: &str) {
    overload_phases(rep, target, ["0.5x", "ramp to 3x", "3x", "0.7x"]);
    let t = &rep["targets"][target];
    let three = &t["phases"][2];
    assert!(
        three["ok_rate"].as_f64().is_some_and(|g| g > 0.0),
        "{target}: goodput at 3x"
    );
    assert!(three["threads_max"].as_u64().is_some_and(|n| n > 0));
    assert!(three["rss_max_mb"].as_f64().is_some_and(|m| m > 0.0));
    assert!(
        t["recovery"]["success_by_second"]
            .as_array()
            .is_some_and(|v| !v.is_empty()),
        "{target}: success per second after the drop"
    );
    assert_acceptance_lines(
        rep,
        target,
        &[
            "goodput at 3×",
            "accepted p99 at 3×",
            "rejection p99 at 3×",
            "recovery",
        ],
    );
}

/// `overload`'s per-second series behind the phases (the first overload trial's): offered,
/// answered, rejected and timed out per second and failures by send time, 8 s or more, and the
/// four phase bounds.
pub fn assert_overload_series(rep: &serde_json::Value) {
    let overload = rep["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .find(|t| t["phase"] == "overload")
        .expect("overload trial");
    let seconds = overload["load"]["seconds"].as_array().expect("per second");
    assert!(seconds.len() >= 8);
    assert!(seconds.iter().all(|s| {
        s["offered"].is_u64()
            && s["ok"].is_u64()
            && s["rejected"].is_u64()
            && s["timeouts"].is_u64()
    }));
    let by_send = overload["load"]["by_send_second"]
        .as_array()
        .expect("by send second");
    assert!(by_send.len() >= 8 && by_send.iter().all(|s| s["failed"].is_u64()));
    assert_eq!(overload["phase_bounds"].as_array().map(Vec::len), Some(4));
}

/// `pool-overload` against PostgreSQL, one target: the four phases (0.5×, ramp, 3×, back to
/// 0.5×), the database answered (fanout at 3×, what the scenario shows; the thread-per-request
/// baseline in the first phase: on a loaded machine its threads may all wait past their time at
/// 3×), the three acceptance lines.
pub fn assert_pool_overload_target(rep: &serde_json::Value, target: &str) {
    let names = ["0.5x", "ramp to 3x", "3x", "back to 0.5x"];
    let offered = overload_phases(rep, target, names);
    assert!(
        offered[3] < offered[2] / 4.0,
        "{target}: 0.5x, 3x, then 0.5x again: {offered:?}"
    );
    let phases = &rep["targets"][target]["phases"];
    let phase = if target == "fanout" { 2 } else { 0 };
    assert!(
        phases[phase]["ok_rate"].as_f64().is_some_and(|g| g > 0.0),
        "{target}: goodput at {} (the database answered): {phases}",
        names[phase]
    );
    assert_acceptance_lines(
        rep,
        target,
        &["goodput at 3×", "rejection p99 at 3×", "recovery"],
    );
}

/// `pool-overload` at 3× of fanout's capacity: fanout refuses the excess (counted), it does not
/// queue it — or 3× was no overload and the phase shows it: everything answered, nothing waited
/// out the client's deadline. (On a machine loaded by other work the capacity search can find
/// far less than the database can do later, its statements slowed by the load.)
pub fn assert_pool_overload_rejects(rep: &serde_json::Value) {
    let three = &rep["targets"]["fanout"]["phases"][2];
    let rejected = three["rejected"].as_u64().unwrap_or(0);
    let f = |k: &str| three[k].as_f64().unwrap_or(0.0);
    // (Every request answered, counted by outcome: rates over the phase's 3 s lose the answers
    // that arrive just after it, so a slow machine's 8 of 9 is still "all answered".)
    let no_excess = three["timeouts"].as_u64() == Some(0)
        && three["errors"].as_u64() == Some(0)
        && f("offered_rate") > 0.0
        && f("ok_rate") >= 0.5 * f("offered_rate");
    assert!(
        rejected > 0 || no_excess,
        "fanout rejects at 3x (or 3x was no overload and all was answered): {three}"
    );
}

/// `hedging` over `rounds` rounds: both targets' merged latency and calls per request (the
/// stub's counters per trial), the p99 line for the hedged target only, the trials in turn.
pub fn assert_hedging(rep: &serde_json::Value, rounds: u64) {
    for target in ["no-hedge", "hedge"] {
        let h = &rep["targets"][target]["hedging"];
        for field in ["p50_ms", "p99_ms", "p999_ms"] {
            assert!(
                h[field].as_f64().is_some_and(|v| v > 0.0),
                "{target}.hedging.{field}: {h}"
            );
        }
        assert!(trials_of_rounds(h["trials"].as_u64(), rounds), "{h}");
        assert!(
            h["backend_calls_per_request"]["median"]
                .as_f64()
                .is_some_and(|c| c >= 0.9),
            "stub counters per trial: {h}"
        );
    }
    let checks = acceptance(rep, "hedge");
    assert!(
        checks.iter().any(|(c, _)| c.contains("p99 cut")),
        "{checks:?}"
    );
    assert!(acceptance(rep, "no-hedge").is_empty());
    assert_turns(rep, "hedging", rounds);
}

/// `parallel-calls --quick` (one round) with `targets` run: every cell (sequential and
/// parallel × 1 and 6 closed-loop clients) of each measured, no operation failed, each exactly
/// 100 stub calls (the stub's counters over the measured window, every operation whole); with
/// two targets or more, the targets in turn (ABBA across targets); the floor the lab measured
/// (one call, and 100 of them); the article's table; each Java target's JVM named.
pub fn assert_parallel_calls(rep: &serde_json::Value, targets: &[&str]) {
    let cl = &rep["closed_loop"];
    assert_eq!(cl["calls_per_op"], 100);
    assert_eq!(cl["rounds"], 1, "quick: one round");
    for t in targets {
        let cells = rep["targets"][t]["cells"].as_array().expect("cells");
        let shape: Vec<(&str, u64)> = cells
            .iter()
            .map(|c| {
                (
                    c["route"].as_str().unwrap_or(""),
                    c["clients"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("sequential", 1),
                ("sequential", 6),
                ("parallel", 1),
                ("parallel", 6)
            ],
            "{t}"
        );
        for c in cells {
            let what = format!("{t} {} × {}", c["route"], c["clients"]);
            assert!(c["ops"].as_u64().is_some_and(|n| n > 0), "{what}: {c}");
            assert_eq!(c["errors"], 0, "{what}: {c}");
            assert_eq!(c["stub_calls_per_op"].as_f64(), Some(100.0), "{what}: {c}");
            for field in ["mean_ms", "p50_ms", "p99_ms", "ops_per_s", "rss_max_mb"] {
                assert!(
                    c[field].as_f64().is_some_and(|v| v > 0.0),
                    "{what}.{field}: {c}"
                );
            }
            assert!(
                c["cpu_ms_per_op"]["median"]
                    .as_f64()
                    .is_some_and(|v| v >= 0.0)
            );
            assert!(c["threads_max"].as_u64().is_some_and(|n| n > 0), "{what}");
        }
    }
    // Every run: whole operations only, so the stub's counter is exactly 100 per operation.
    let runs = cl["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 4 * targets.len());
    for r in runs {
        let ops = r["ops"].as_u64().unwrap_or(0);
        assert_eq!(r["stub_calls"].as_u64(), Some(100 * ops), "{r}");
        assert_eq!(r["errors"], 0, "{r}");
    }
    // Interleaved: within a cell the targets take turns, the next cell the other way round.
    if targets.len() > 1 {
        let order = |i: usize| -> Vec<&str> {
            runs[i * targets.len()..(i + 1) * targets.len()]
                .iter()
                .map(|r| r["target"].as_str().unwrap_or(""))
                .collect()
        };
        let mut reversed = order(1);
        reversed.reverse();
        assert_eq!(order(0), reversed, "ABBA across targets");
    }
    let floor = &cl["floor"];
    let one = floor["one_call_mean_ms"].as_f64().unwrap_or(0.0);
    assert!(one > 0.0, "{floor}");
    assert_eq!(floor["parallel_ms"].as_f64(), Some(one));
    assert!(
        floor["sequential_ms"]
            .as_f64()
            .is_some_and(|s| (s - 100.0 * one).abs() < 1e-6),
        "{floor}"
    );
    assert_eq!(cl["article"].as_array().map(Vec::len), Some(6));
    for t in targets.iter().filter(|t| t.starts_with("java-")) {
        assert!(cl["jvm"][t].is_string(), "{t}: {}", cl["jvm"]);
    }
}

/// `parallel-calls` without a Java runtime ≥ 21: the report says why `java-virtual` did not
/// run, and has no figures for it.
pub fn assert_java_virtual_not_run(rep: &serde_json::Value) {
    let why = rep["closed_loop"]["not_run"]["java-virtual"]
        .as_str()
        .unwrap_or("");
    assert!(why.contains("no Java 21 or later found"), "{why}");
    assert!(rep["targets"]["java-virtual"].is_null());
}

/// `fanout lab hop`: the trials' paths are `paths` (direct and fanout, ABBA), each offered
/// `offered` requests (2 000 req/s for the trial's length), every one answered when the
/// generator kept its schedule (a generator starved of CPU sends late and leaves requests
/// unsent at the drain's end: the trial says so, `generator_on_schedule: false`, and its counts
/// describe the machine), the stub's 1 ms in the median, fanout's CPU on fanout's trials only;
/// the added latency paired per round, both acceptance lines.
pub fn assert_hop(rep: &serde_json::Value, paths: &[&str], offered: u64) {
    let trials = rep["trials"].as_array().expect("trials");
    let got: Vec<&str> = trials.iter().filter_map(|t| t["path"].as_str()).collect();
    assert_eq!(got, paths, "ABBA");
    for t in trials {
        assert_eq!(
            t["offered"].as_u64(),
            Some(offered),
            "{offered} offered: {t}"
        );
        if t["generator_on_schedule"] == true {
            assert_eq!(t["ok"], t["offered"], "every request answered: {t}");
        } else {
            assert!(t["ok"].as_u64().is_some_and(|n| n > 0), "answers: {t}");
        }
        assert!(
            t["p50_ms"].as_f64().is_some_and(|v| v >= 1.0),
            "the stub's 1 ms: {t}"
        );
        assert_eq!(
            t["fanout_cpu_us_per_req"].is_null(),
            t["path"] == "direct",
            "CPU is fanout's: {t}"
        );
    }
    assert_eq!(
        rep["added"].as_array().map(Vec::len),
        Some(paths.len() / 2),
        "a round: a direct and a fanout trial"
    );
    let lines = rep["acceptance"].as_array().expect("acceptance");
    assert_eq!(lines.len(), 2);
}

/// `fanout lab threads --quick` with `tasks` tasks: HeadHunter's benchmark ran once per pool
/// size (1, 2, 4, 64, 1024 threads; 2 timed runs each), the fastest pool the reference (one row
/// at 0 %, none below), its table beside the article's 13 rows.
pub fn assert_threads(rep: &serde_json::Value, tasks: u64) {
    assert!(rep["not_run"].is_null(), "{}", rep["not_run"]);
    assert_eq!(rep["quick"], true);
    let sizes = [1u64, 2, 4, 64, 1024];
    let rows = rep["rows"].as_array().expect("rows");
    let threads: Vec<u64> = rows.iter().filter_map(|r| r["threads"].as_u64()).collect();
    assert_eq!(threads, sizes, "one row per pool size");
    for r in rows {
        assert_eq!(r["runs_ms"].as_array().map(Vec::len), Some(2), "{r}");
        assert!(r["mean_ms"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        assert!(r["cpu_ms"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    }
    assert!(rows.iter().any(|r| r["vs_best_pct"].as_f64() == Some(0.0)));
    assert!(rows.iter().all(|r| r["vs_best_pct"].as_f64() >= Some(0.0)));
    let params = &rep["params"];
    assert_eq!(
        (params["tasks"].as_u64(), params["tests"].as_u64()),
        (Some(tasks), Some(2))
    );
    let article = rep["article"]["rows"].as_array().expect("article rows");
    assert_eq!(article.len(), 13, "the article's table");
    assert_eq!(article[2]["mean_ms"].as_f64(), Some(28153.0));
    assert_eq!(rep["article"]["params"]["tasks"], 16384);
    assert_eq!(
        rep["side_by_side"].as_array().map(Vec::len),
        Some(sizes.len())
    );
}

/// `fanout lab hh-pools --quick` with `targets` (fanout, `java-threads-N`), healthy then with
/// the vacancy backend 10× slower: all ran, at 200 req/s; a row per phase and target, in order,
/// of one trial, every offered request a 2xx or counted as failed, a Java row naming its pool; a
/// drain per trial (targets × 2 phases × 1 round); the JVM of every Java target named.
pub fn assert_hh_pools(rep: &serde_json::Value, targets: &[&str]) {
    let pools = &rep["pools"];
    assert_eq!(pools["not_run"].as_object().map(|m| m.len()), Some(0));
    assert_eq!(pools["rate"].as_f64(), Some(200.0));
    let rows = pools["rows"].as_array().expect("rows");
    let keys: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["phase"].as_str().unwrap_or(""),
                r["target"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let expected: Vec<(&str, &str)> = ["healthy", "slow"]
        .into_iter()
        .flat_map(|p| targets.iter().map(move |t| (p, *t)))
        .collect();
    assert_eq!(keys, expected, "a row per phase and target, in order");
    for r in rows {
        let n = |f: &str| r[f].as_u64().unwrap_or(u64::MAX);
        assert_eq!(n("trials"), 1, "{r}");
        assert!(n("offered") > 0, "{r}");
        assert_eq!(n("failed"), n("offered") - n("ok").min(n("offered")), "{r}");
        assert!(n("within_slo") <= n("ok"), "{r}");
        assert!(n("threads_max") > 0 && n("threads_max") < u64::MAX, "{r}");
        assert!(r["rss_max_mb"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        for f in ["cpu_us_per_request", "p50_ms", "p99_ms", "goodput_rps"] {
            assert_eq!(r[f]["n"].as_u64(), Some(1), "{f}: {r}");
        }
        let pool = r["pool"].as_u64();
        match r["target"].as_str() {
            Some("fanout") => assert_eq!(pool, None),
            Some(t) => assert_eq!(
                pool.map(|n| format!("java-threads-{n}")).as_deref(),
                Some(t)
            ),
            None => panic!("{r}"),
        }
    }
    assert_eq!(
        pools["drains"].as_array().map(Vec::len),
        Some(2 * targets.len())
    );
    let java = targets.iter().filter(|t| t.starts_with("java-")).count();
    assert_eq!(pools["jvm"].as_object().map(|m| m.len()), Some(java));
}

/// `grpc-aggregate` over `rounds` rounds: the .proto written next to the configs; fanout and
/// the tonic aggregator measured, three backend calls per request (users, orders, recs: 64
/// different users, nothing deduplicated); every answer of the measured trials a gRPC OK
/// (nothing failed, nothing left unanswered); the direct path made over gRPC.
pub fn assert_grpc_aggregate(rep: &serde_json::Value, out: &Path, rounds: u64) {
    assert!(
        out.join("grpc-aggregate.proto").is_file(),
        "the .proto is written next to the configs"
    );
    for target in ["fanout", "grpc-baseline"] {
        assert_measured(
            rep,
            target,
            &["cpu_us_per_request", "p50_ms", "p99_ms", "rss_max_mb"],
        );
        let t = &rep["targets"][target];
        assert!(t["threads_max"].as_u64().is_some_and(|n| n > 0));
        assert_calls_per_request(rep, target, 2.9..=3.1);
    }
    let levels: Vec<&serde_json::Value> = rep["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .filter(|t| t["phase"] == "level-50" || t["phase"] == "level-80")
        .collect();
    assert_eq!(
        levels.len() as u64,
        2 * 2 * rounds,
        "2 targets × 2 levels × {rounds} round(s)"
    );
    for t in levels {
        let load = &t["load"];
        let what = format!("{} {}", t["target"], t["phase"]);
        assert_eq!(load["error_rate"].as_f64(), Some(0.0), "{what}: {load}");
        assert!(load["ok"].as_u64().is_some_and(|n| n > 0), "{what}");
        assert_eq!(load["ok"], load["completed"], "{what}");
        assert_eq!(load["ok"], load["offered"], "{what}");
        let codes = load["grpc_status"].as_object().expect("grpc_status");
        assert_eq!(
            codes.keys().collect::<Vec<_>>(),
            ["OK"],
            "{what}: {codes:?}"
        );
        assert_eq!(load["grpc_missing_status"].as_u64(), Some(0), "{what}");
    }
    let direct = &rep["direct"];
    assert!(
        direct["p50_ms"].as_f64().is_some_and(|v| v > 0.0),
        "direct over gRPC: {direct}"
    );
    assert_eq!(direct["path"][0], "orders /lab.v1.Orders/ListOrders");
}

/// `antispam-models`, fanout alone: 10 models (no temp file left behind) per gRPC call over
/// 1 000 client connections while one model's file is replaced (at least one swap): requests
/// answered, none failed, none during the swaps; fanout picked the new files up (loads > 1 for
/// the swapped model, none failed; the others loaded once); threads counted; every answer at
/// half fanout's rate a gRPC OK; both levels measured; the acceptance line about failures during
/// the swaps passed (the others' pass depends on the machine).
pub fn assert_antispam_models(rep: &serde_json::Value, out: &Path) {
    assert!(out.join("antispam.proto").is_file());
    assert_eq!(
        std::fs::read_dir(out.join("models")).unwrap().count(),
        10,
        "10 models, no temp file left behind"
    );
    let m = &rep["models"];
    assert_eq!(m["connections"], 1000);
    assert!(
        m["swaps_at_s"].as_array().is_some_and(|s| !s.is_empty()),
        "at least one swap: {m}"
    );
    let t = &m["targets"]["fanout"];
    assert!(t["requests"].as_u64().is_some_and(|n| n > 0), "{t}");
    assert_eq!(t["failed"], 0, "{t}");
    assert_eq!(t["failed_in_swap_windows_within_slo"], 0, "{t}");
    assert!(
        t["requests_in_swap_windows"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{t}"
    );
    assert_eq!(t["connections_used"], 1000, "{t}");
    let st = &t["model_status"];
    assert_eq!(st.as_object().map(|o| o.len()), Some(10), "{st}");
    let swapped = &st["spam_swap"];
    assert!(
        swapped["loads"].as_u64().is_some_and(|n| n > 1),
        "{swapped}"
    );
    assert_eq!(swapped["load_failures"], 0, "{swapped}");
    assert_eq!(st["spam_lr"]["loads"], 1, "{st}");
    assert!(t["threads_steady_max"].as_u64().is_some_and(|n| n > 0));
    for tr in rep["trials"].as_array().expect("trials") {
        if tr["phase"] == "at-fanout-half" {
            let codes = tr["load"]["grpc_status"].as_object().expect("grpc_status");
            assert_eq!(codes.keys().collect::<Vec<_>>(), ["OK"], "{codes:?}");
        }
    }
    let levels = t["levels"].as_array().expect("levels");
    let names: Vec<&str> = levels.iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(names, ["at-fanout-half", "at-fanout-max"]);
    for l in levels {
        assert!(
            l["requests_per_cpu_s"]["median"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{l}"
        );
        assert!(
            l["p99_ms"]["median"].as_f64().is_some_and(|v| v > 0.0),
            "{l}"
        );
    }
    let checks = acceptance(rep, "fanout");
    assert!(
        checks
            .iter()
            .any(|(c, pass)| c == "failed requests during swaps" && *pass),
        "{checks:?}"
    );
}

/// A `pass-small` / `pass-bulk` / `sse-events` report of one round: fanout then nginx (nginx
/// must have run), every answer complete (bytes, and events for `sse-events`), a cost measured
/// for each, the comparison line there.
pub fn assert_streams(rep: &serde_json::Value, scenario: &str) {
    assert_eq!(rep["scenario"], scenario);
    assert_eq!(
        rep["not_run"],
        serde_json::json!({}),
        "{scenario}: every target ran (install nginx: apt-get install nginx)"
    );
    let trials = rep["trials"].as_array().expect("trials");
    let got: Vec<&str> = trials.iter().filter_map(|t| t["target"].as_str()).collect();
    assert_eq!(got, ["fanout", "nginx"], "{scenario}: one round");
    let answer = rep["answer_bytes"].as_u64().expect("answer_bytes");
    for t in trials {
        let ok = t["ok"].as_u64().expect("ok");
        assert!(ok > 0, "{scenario}: answers: {t}");
        assert_eq!(
            t["ok"], t["offered"],
            "{scenario}: every request answered: {t}"
        );
        assert_eq!(t["failed"], 0, "{scenario}: {t}");
        assert_eq!(
            t["bytes"].as_u64(),
            Some(ok * answer),
            "{scenario}: every byte: {t}"
        );
        if scenario == "sse-events" {
            assert_eq!(
                t["events"].as_u64(),
                Some(ok * 1000),
                "{scenario}: every event: {t}"
            );
        } else {
            assert!(t["events"].is_null(), "{scenario}: {t}");
        }
        assert_eq!(t["complete"], true, "{scenario}: {t}");
        assert!(
            t["cost"].as_f64().is_some_and(|c| c >= 0.0),
            "{scenario}: the cost measured: {t}"
        );
    }
    let costs = rep["costs"].as_array().expect("costs");
    assert_eq!(costs.len(), 2, "{scenario}: {costs:?}");
    assert!(rep["ratio_of_medians"].is_number() || costs.iter().any(|c| c["median"] == 0.0));
    assert_eq!(
        rep["acceptance"].as_array().map(Vec::len),
        Some(1),
        "{scenario}: the comparison line"
    );
}
