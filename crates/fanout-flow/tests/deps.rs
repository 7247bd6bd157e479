//! The engine stays an engine (docs/ARCHITECTURE.md, "Crates"): `fanout-flow` compiles plans and
//! runs them over `dyn Backend`s; the HTTP server and clients, the database driver, the Redis
//! client, TLS and telemetry exporters are the gateway's (`fanout-proxy` and the protocol
//! crates). This test fails the day one of them becomes a (normal or build) dependency of the
//! engine, directly or through another crate.

use std::collections::BTreeSet;
use std::process::Command;

/// Crates the engine must never link.
const NOT_IN_THE_ENGINE: &[&str] = &[
    "hyper",
    "hyper-util",
    "h2",
    "tonic",
    "tokio-postgres",
    "postgres-protocol",
    "redis",
    "rustls",
    "opentelemetry",
    "opentelemetry_sdk",
    "prometheus-client",
];

#[test]
fn the_engine_depends_on_no_http_stack_database_driver_or_exporter() {
    // `cargo` runs this test, so it is here; the tree is read from the lock file (no network).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            "fanout-flow",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let names: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    // The tree was really read: the engine's own dependencies are in it.
    for dep in ["fanout-flow", "fanout-layers", "fanout-expr", "tokio"] {
        assert!(names.contains(dep), "`{dep}` missing from:\n{text}");
    }
    let found: Vec<&&str> = NOT_IN_THE_ENGINE
        .iter()
        .filter(|n| names.contains(**n))
        .collect();
    assert!(
        found.is_empty(),
        "fanout-flow depends on {found:?} (`cargo tree -p fanout-flow -e normal,build -i {}` says \
         through what); the engine runs plans over `dyn Backend` and must not link them",
        found[0]
    );
}
