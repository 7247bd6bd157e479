//! The `fanout-lab` executable's command line: its help, and arguments it refuses before it
//! starts anything. (Being an integration test, this also makes `cargo test --workspace` build
//! the executable that `fanout lab` runs.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code

use std::process::Command;

fn lab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fanout-lab"));
    c.env_remove("FANOUT_LAB_FANOUT_BIN")
        .env_remove("FANOUT_LAB_COMMAND");
    c
}

#[test]
fn help_lists_the_scenarios_and_options() {
    let o = lab().arg("--help").output().expect("run fanout-lab --help");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        stdout.contains("Usage: fanout-lab [OPTIONS] <SCENARIO>"),
        "{stdout}"
    );
    for s in [
        "hh-vacancies",
        "seeds",
        "--targets",
        "--quick",
        "--baseline-bin",
    ] {
        assert!(stdout.contains(s), "{s}: {stdout}");
    }
}

#[test]
fn bad_arguments_are_refused_before_anything_starts() {
    let out = std::env::temp_dir().join(format!("fanout-lab-cli-{}", std::process::id()));
    // clap's usage error: exit 2.
    let o = lab()
        .args(["hh-vacancies", "--trials", "many", "--out"])
        .arg(&out)
        .output()
        .expect("run fanout-lab");
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--trials"),
        "{o:?}"
    );
    // The lab's own refusal: exit 1, with the reason.
    let o = lab()
        .args(["seeds", "--targets", "fanout", "--quick", "--out"])
        .arg(&out)
        .output()
        .expect("run fanout-lab");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("lab seeds takes only"), "{stderr}");
    assert!(!out.exists(), "nothing written");
}
