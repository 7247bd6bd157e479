//! `fanout explain` as a command: it prints the same descriptions as the engine's snapshots
//! (crates/fanout-flow/tests/explain/), selects routes by path or `METHOD /path`, and exits 1 on
//! an unknown route (listing the routes) or a config error (FILE:LINE:COL like `validate`).

use fanout_testkit::repo_root as root;
use std::process::{Command, Output, Stdio};

fn explain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("explain")
        .args(args)
        .env_remove("LISTEN")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run fanout explain: {e}"))
}

fn snapshot(name: &str) -> String {
    std::fs::read_to_string(root().join("crates/fanout-flow/tests/explain").join(name)).unwrap()
}

fn stdout(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn prints_the_plan_as_text_and_mermaid() {
    let cfg = root().join("examples/order-page/fanout.yaml");
    let cfg = cfg.to_str().unwrap();
    assert_eq!(
        stdout(&explain(&["--config", cfg])),
        snapshot("order-page.txt")
    );
    let out = explain(&[
        "-c",
        cfg,
        "--route",
        "GET /orders/{id}",
        "--format",
        "mermaid",
    ]);
    assert_eq!(stdout(&out), snapshot("order-page.mmd"));
}

#[test]
fn selects_routes_by_path_or_method_and_path() {
    let cfg = root().join("crates/fanout-flow/tests/explain/layers.yaml");
    let cfg = cfg.to_str().unwrap();
    let both = stdout(&explain(&["-c", cfg, "--route", "/users/{id}"]));
    assert!(both.starts_with("GET /users/{id}\n"), "{both}");
    assert!(both.contains("\nDELETE /users/{id}\n"), "{both}");
    assert!(!both.contains("/health"), "{both}");
    let one = stdout(&explain(&["-c", cfg, "--route", "DELETE /users/{id}"]));
    assert!(one.starts_with("DELETE /users/{id}\n"), "{one}");
    assert!(!one.contains("GET /users"), "{one}");
}

#[test]
fn an_unknown_route_exits_1_listing_the_routes() {
    let cfg = root().join("crates/fanout-flow/tests/explain/layers.yaml");
    let out = explain(&["-c", cfg.to_str().unwrap(), "--route", "/users/42"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert_eq!(
        err,
        "no route `/users/42` in the config; give a path pattern or `METHOD /path`. Routes:\n  \
         GET /users/{id}\n  DELETE /users/{id}\n  GET /health\n"
    );
}

#[test]
fn a_config_error_exits_1_with_its_position() {
    let path = std::env::temp_dir().join(format!("fanout-explain-{}.yaml", std::process::id()));
    let text = "routes:\n  - path: /x\n    flow:\n      a: { value: '$nope' }\n    respond: { body: '$a' }\n";
    std::fs::write(&path, text).unwrap();
    let out = explain(&["-c", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(".yaml:4:"), "{err}");
    assert!(out.stdout.is_empty());
}

/// `--rate R`: Little's law per route after the plan — hh-vacancies' critical path is 150 ms +
/// 100 ms, so 1000 req/s hold 250 requests in flight (500 at the 500 ms deadline); a
/// thread-per-request server needs ≥ 250 request threads, and 8 × 250 more for the `for_each`
/// calls if each blocks a thread; fanout's threads do not depend on the rate.
#[test]
fn rate_states_littles_law_per_route() {
    let cfg = root().join("examples/hh-vacancies/fanout.yaml");
    let cfg = cfg.to_str().unwrap();
    let plain = stdout(&explain(&["-c", cfg]));
    let text = stdout(&explain(&["-c", cfg, "--rate", "1000"]));
    assert!(
        text.starts_with(&plain),
        "the plan first, unchanged:\n{text}"
    );
    let law = &text[plain.len()..];
    assert!(law.contains("Little's law at 1000 req/s"), "{law}");
    assert!(law.contains("critical path's worst case"), "{law}");
    assert!(
        law.contains("GET /vacancies: W = 250ms → L = 1000 × 0.25 s = 250 requests in flight (500 if every request ran to the deadline 500ms)"),
        "{law}"
    );
    assert!(law.contains("≥ 250 request threads"), "{law}");
    assert!(law.contains("up to 8 parallel calls"), "{law}");
    assert!(law.contains("up to 2000 call threads"), "{law}");
    assert!(
        law.contains("fanout: the same threads at any rate"),
        "{law}"
    );
    // The rate must be positive, and the law is text.
    for bad in [
        &["-c", cfg, "--rate", "0"][..],
        &["-c", cfg, "--rate", "100", "--format", "mermaid"],
    ] {
        let out = explain(bad);
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--rate"));
    }
}
