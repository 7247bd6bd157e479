//! The lab's long runs, as the test suite ran them until 2026-11-29: every comparison with all
//! its targets, three interleaved rounds (ABBA), the JVM targets, the full `--quick` thread
//! benchmark. Not part of `cargo test` (`test = false` in Cargo.toml): `scripts/lab-long` runs
//! them (`cargo test -p fanout --test lab_long`), one at a time; tier 2 (`./scripts/test`) runs
//! one short smoke run per scenario instead (`tests/lab.rs`). Needs what tier 2 needs (a JDK,
//! PostgreSQL, Chromium is not used here). Counts and shapes only, never performance figures.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod lab_common;

use lab_common::*;

#[test]
fn lab_product_page_quick_compares_fanout_and_the_hyper_baseline() {
    let _one_at_a_time = serial();
    let out = out_dir("pp");
    let rep = run_lab_with(
        "product-page",
        "fanout,hyper-baseline",
        &out,
        &["--capacity", GIVEN_CAPACITY],
    );
    // Three interleaved rounds (ABBA): round 2 reverses round 1.
    assert_product_page(&rep, &out, 3);
    assert_report_files(&out);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn lab_n_plus_one_quick_compares_equal_work_at_a_fixed_rate_and_two_levels() {
    let _one_at_a_time = serial();
    let out = out_dir("n1");
    let rep = run_lab_with(
        "n-plus-one",
        "fanout,hyper-baseline",
        &out,
        &["--capacity", GIVEN_CAPACITY],
    );
    for target in ["fanout", "hyper-baseline"] {
        assert_n_plus_one_target(&rep, target, 3);
    }
    assert!(
        out.join("fanout.status.json").exists(),
        "the fanout target's status at the end of the run"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn lab_n_plus_one_identical_quick_counts_flow_runs_with_and_without_coalescing() {
    let _one_at_a_time = serial();
    let out = out_dir("n1-identical");
    let rep = run_lab_with(
        "n-plus-one-identical",
        "fanout,coalesce",
        &out,
        &["--capacity", GIVEN_CAPACITY],
    );
    assert_n_plus_one_identical(&rep, &out);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn lab_pool_overload_quick_runs_against_a_real_postgres() {
    let _one_at_a_time = serial();
    let out = out_dir("pool");
    let rep = run_lab("pool-overload", "fanout,java-threads", &out);
    for target in ["fanout", "java-threads"] {
        assert_pool_overload_target(&rep, target);
    }
    assert_pool_overload_rejects(&rep);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn lab_overload_quick_reports_goodput_rejections_and_recovery() {
    let _one_at_a_time = serial();
    let out = out_dir("ov");
    let rep = run_lab("overload", "fanout,java-threads", &out);
    for target in ["fanout", "java-threads"] {
        assert_overload_target(&rep, target);
    }
    assert_overload_series(&rep);
    assert_report_files(&out);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn lab_hedging_quick_compares_no_hedge_and_hedge() {
    let _one_at_a_time = serial();
    let out = out_dir("hedge");
    let rep = run_lab("hedging", "no-hedge,hedge", &out);
    assert_hedging(&rep, 3);
    assert_report_files(&out);
    let _ = std::fs::remove_dir_all(&out);
}

/// The Java targets of `parallel-calls` this machine can run: `java-blocking` with a `javac` ≥ 17
/// (the lab compiles the baseline with it), `java-virtual` besides with a Java runtime ≥ 21 (found
/// as the lab finds it). A missing one is printed, not failed.
fn parallel_calls_java_targets() -> Vec<&'static str> {
    let mut out = Vec::new();
    match fanout_lab::java::javac_version() {
        Some((major, _)) if major >= 17 => out.push("java-blocking"),
        other => {
            eprintln!(
                "note: java-blocking and java-virtual skipped: no javac ≥ 17 ({other:?}; Debian: apt-get install default-jdk-headless)"
            );
            return out;
        }
    }
    match fanout_lab::java::find_jdk(
        &fanout_lab::java::JdkSearch::from_env(),
        fanout_lab::java::VIRTUAL_THREADS,
    ) {
        Ok(_) => out.push("java-virtual"),
        Err(why) => eprintln!("note: java-virtual skipped: {why}"),
    }
    out
}

/// Whether a Java runtime ≥ 21 is found as the lab finds it (`java-virtual` runs).
fn have_java_21() -> bool {
    fanout_lab::java::find_jdk(
        &fanout_lab::java::JdkSearch::from_env(),
        fanout_lab::java::VIRTUAL_THREADS,
    )
    .is_ok()
}

/// One live `parallel-calls --quick` run, shared by the tests that read it: fanout and the Java
/// targets this machine can run, `java-virtual` always asked for (without a Java ≥ 21 the report
/// says why it did not run). (targets run, report.json); `Err` if the run failed. Take
/// [`serial`] first: the run must not overlap another.
type SharedRun = Result<(Vec<&'static str>, serde_json::Value), String>;
fn parallel_calls_run() -> &'static SharedRun {
    static RUN: std::sync::OnceLock<SharedRun> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let mut targets = vec!["fanout"];
        targets.extend(parallel_calls_java_targets());
        let mut asked = targets.clone();
        if !asked.contains(&"java-virtual") && asked.contains(&"java-blocking") {
            asked.push("java-virtual");
        }
        let out = out_dir("parallel");
        let run = std::panic::catch_unwind(|| {
            let rep = run_lab("parallel-calls", &asked.join(","), &out);
            assert_report_files(&out);
            rep
        });
        let _ = std::fs::remove_dir_all(&out);
        match run {
            Ok(rep) => Ok((targets, rep)),
            Err(e) => Err(e
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "the parallel-calls run failed".into())),
        }
    })
}

/// `parallel-calls`: every cell (sequential and parallel × 1 and 6 closed-loop clients) of every
/// target measured, no operation failed, and each operation made exactly 100 stub calls (the
/// stub's counters over the measured window, every operation whole). Counts and shapes only.
/// (The printed summary and report.html: `crates/fanout-lab/tests/recorded.rs`.)
#[test]
fn lab_parallel_calls_quick_measures_every_cell_closed_loop() {
    let _one_at_a_time = serial();
    let (targets, rep) = match parallel_calls_run() {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    assert_parallel_calls(rep, targets);
}

/// Without a Java runtime ≥ 21, `java-virtual` does not run and the report says why; the run
/// itself succeeds. On a machine without one, the shared `parallel-calls` run (which asks for
/// `java-virtual`) is that run; with one, the lab runs again with it hidden.
#[test]
fn lab_parallel_calls_without_java_21_reports_java_virtual_not_run() {
    let _one_at_a_time = serial();
    let hidden;
    let (rep, stdout) = if have_java_21()
        || fanout_lab::java::javac_version().is_none_or(|(major, _)| major < 17)
    {
        let out = out_dir("parallel-nojdk");
        let (rep, stdout) = parallel_calls_without_java_21(&out);
        let _ = std::fs::remove_dir_all(&out);
        hidden = rep;
        (&hidden, Some(stdout))
    } else {
        match parallel_calls_run() {
            Ok((_, rep)) => (rep, None),
            Err(e) => panic!("{e}"),
        }
    };
    assert_java_virtual_not_run(rep);
    assert_eq!(
        rep["targets"]["fanout"]["cells"].as_array().map(Vec::len),
        Some(4)
    );
    // The summary's warning line is printed from the report (recorded.rs checks it from a
    // recorded run); it is checked here where this test ran the lab itself.
    if let Some(stdout) = stdout {
        assert!(
            stdout.contains("WARNING: java-virtual: not run — no Java 21"),
            "{stdout}"
        );
    } else {
        let warnings = rep["warnings"].as_array().expect("warnings");
        assert!(
            warnings.iter().any(|w| w
                .as_str()
                .is_some_and(|w| w.starts_with("java-virtual: not run — no Java 21"))),
            "{warnings:?}"
        );
    }
}

/// `fanout lab hop --quick`: both paths in every round (ABBA), every request answered, the
/// added latency paired per round and both acceptance lines reported — counts and shapes only,
/// never the figures (a loaded machine decides those).
#[test]
fn lab_hop_quick_measures_direct_and_through_fanout_in_every_round() {
    let _one_at_a_time = serial();
    let out = out_dir("hop");
    let (rep, _, _) = lab_report(
        &mut lab_command(&["hop", "--quick", "--duration", "2s"], &out),
        &out,
    );
    // 2 s at 2 000 req/s a trial, two rounds.
    assert_hop(&rep, &["direct", "fanout", "fanout", "direct"], 4000);
    let trials = rep["trials"].as_array().expect("trials");
    if trials.iter().all(|t| t["generator_on_schedule"] == true) {
        assert_eq!(rep["failed"], 0);
    }
    assert_report_files(&out);
    let _ = std::fs::remove_dir_all(&out);
}

/// `fanout lab threads --quick`: HeadHunter's thread benchmark ran once per pool size (1, 2, 4,
/// 64, 1024 threads; 1024 tasks, 2 timed runs each), its table beside the article's 13 rows in
/// report.json. Counts and shapes only (the printed tables and report.html:
/// `crates/fanout-lab/tests/recorded.rs`). Skipped (with a note) only without `javac`.
#[test]
fn lab_threads_quick_prints_both_tables() {
    if skip_without_javac("threads") {
        return;
    }
    let _one_at_a_time = serial();
    let out = out_dir("threads");
    let (rep, _, _) = lab_report(&mut lab_command(&["threads", "--quick"], &out), &out);
    assert_threads(&rep, 1024);
    assert_report_files(&out);
    let _ = std::fs::remove_dir_all(&out);
}

/// `fanout lab hh-pools --quick`: fanout and the Java baseline with pools of 8, 64, 512 and 4 096
/// threads, healthy then with the vacancy backend 10× slower: one row per target and phase in
/// report.json, every offered request either a 2xx or counted as failed. Counts and shapes
/// only, never timings (the printed table and report.html: `crates/fanout-lab/tests/recorded.rs`).
/// Skipped (with a note) only without `javac`.
#[test]
fn lab_hh_pools_quick_has_a_row_per_target_and_phase() {
    if skip_without_javac("hh-pools") {
        return;
    }
    let _one_at_a_time = serial();
    let out = out_dir("hh-pools");
    // The smallest and the largest pool: every row's shape without two more JVM warm-ups (the
    // recorded runs of `crates/fanout-lab/tests/recorded.rs` have all four).
    let targets = ["fanout", "java-threads-8", "java-threads-4096"];
    let (rep, _, _) = lab_report(
        &mut lab_command(
            &["hh-pools", "--quick", "--targets", &targets.join(",")],
            &out,
        ),
        &out,
    );
    assert_hh_pools(&rep, &targets);
    assert_report_files(&out);
    let _ = std::fs::remove_dir_all(&out);
}

/// gRPC in, three gRPC backends, fanout beside the hand-written tonic aggregator: every measured
/// answer is `OK`, three backend calls per request, the direct path made over gRPC.
#[test]
fn lab_grpc_aggregate_quick_compares_fanout_and_the_grpc_baseline() {
    let _one_at_a_time = serial();
    let out = out_dir("grpc");
    let rep = run_lab_with(
        "grpc-aggregate",
        "fanout,grpc-baseline",
        &out,
        &["--capacity", GIVEN_CAPACITY],
    );
    assert_grpc_aggregate(&rep, &out, 3);
    for target in ["fanout", "grpc-baseline"] {
        assert!(
            rep["targets"][target]["max_rate"]
                .as_f64()
                .is_some_and(|r| r >= 0.0),
            "{target}.max_rate"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// `antispam-models` without Python: fanout alone serves 10 models per gRPC call over 1 000
/// client connections while one model's file is replaced every 3 s (`--quick`).
#[test]
fn lab_antispam_models_quick_serves_ten_models_through_swaps() {
    let _one_at_a_time = serial();
    let out = out_dir("antispam");
    let rep = run_lab("antispam-models", "fanout", &out);
    assert_antispam_models(&rep, &out);
    assert!(out.join("models/spam_swap.onnx").is_file());
    // Threads constant once started (a start-up thread of tokio's blocking pool leaves after 10 s).
    let t = &rep["models"]["targets"]["fanout"];
    assert_eq!(t["threads_steady_min"], t["threads_steady_max"], "{t}");
    assert_report_files(&out);
    let _ = std::fs::remove_dir_all(&out);
}
