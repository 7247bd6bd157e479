//! The engine stays an engine (docs/ARCHITECTURE.md, "Crates"): `fanout-flow` compiles plans and
//! runs them over `dyn Backend`s; the HTTP server and clients, the database driver, the Redis
//! client, TLS and telemetry exporters are the gateway's (`fanout-proxy`, `fanout-transport`,
//! `fanout-ops` and the protocol crates), and the step kinds that need a capability of their own
//! live with it (`sql` in `fanout-postgres`, `model` in `fanout-model`). These tests fail the
//! day one of them becomes a (normal or build) dependency of the engine, directly or through
//! another crate — or the day the HTTP client reaches the engine or the models again, or the
//! gateway's transport or operations crate links the gateway.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::process::Command;

/// Crates the engine must never link.
const NOT_IN_THE_ENGINE: &[&str] = &[
    "fanout-model",
    "fanout-postgres",
    "fanout-client",
    "fanout-protocol",
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

/// The names of the packages `package` depends on (normal and build dependencies), itself
/// included, read from the lock file (no network).
fn tree(package: &str) -> BTreeSet<String> {
    // `cargo` runs this test, so it is here.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            package,
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
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    // The tree was really read: the package itself is in it.
    assert!(names.contains(package), "`{package}` missing from:\n{text}");
    names
}

#[test]
fn the_engine_depends_on_no_http_stack_database_driver_or_exporter() {
    let names = tree("fanout-flow");
    for dep in ["fanout-layers", "fanout-expr", "tokio"] {
        assert!(names.contains(dep), "`{dep}` missing from {names:?}");
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

/// The HTTP client is a protocol crate: below the engine (`fanout-client` → `fanout-protocol` →
/// layers, runtime), so an edit to the engine or the models does not rebuild it.
#[test]
fn the_http_client_links_neither_the_engine_nor_the_models() {
    let names = tree("fanout-client");
    for dep in ["fanout-protocol", "fanout-layers"] {
        assert!(names.contains(dep), "`{dep}` missing from {names:?}");
    }
    for above in ["fanout-flow", "fanout-model", "fanout-postgres"] {
        assert!(
            !names.contains(above),
            "fanout-client depends on `{above}` (`cargo tree -p fanout-client -e normal,build -i \
             {above}` says through what): protocol crates sit below the engine"
        );
    }
}

/// The gateway's connections and overload (`fanout-transport`) and its operations (`fanout-ops`)
/// sit below the gateway (`fanout-proxy`) and beside each other: neither links the proxy, the
/// binary or the other, so an edit to the gateway rebuilds neither.
#[test]
fn transport_and_ops_link_neither_the_proxy_nor_each_other() {
    for (package, own, other) in [
        ("fanout-transport", "tokio-rustls", "fanout-ops"),
        ("fanout-ops", "prometheus-client", "fanout-transport"),
    ] {
        let names = tree(package);
        assert!(names.contains(own), "`{own}` missing from {names:?}");
        for above in ["fanout-proxy", "fanout", other] {
            assert!(
                !names.contains(above),
                "{package} depends on `{above}` (`cargo tree -p {package} -e normal,build -i \
                 {above}` says through what): it sits below the gateway"
            );
        }
    }
}
