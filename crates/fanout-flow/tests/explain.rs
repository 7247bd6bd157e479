//! `fanout explain` snapshots: for each config (the examples and `tests/explain/*.yaml`), the
//! text and Mermaid descriptions of every route must match `tests/explain/<name>.txt` / `.mmd`.
//! `UPDATE_SNAPSHOTS=1 cargo test -p fanout-flow --test explain` rewrites them; review the diff.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fanout_config::Config;
use fanout_flow::explain::{Explanation, StepIo, TimeoutFrom, explain_config};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// (snapshot name, config path relative to this crate).
const CASES: &[(&str, &str)] = &[
    ("hh-vacancies", "../../examples/hh-vacancies/fanout.yaml"),
    ("order-page", "../../examples/order-page/fanout.yaml"),
    ("product-page", "../../examples/product-page/fanout.yaml"),
    (
        "product-page-merged",
        "../../examples/product-page-merged/fanout.yaml",
    ),
    ("layers", "tests/explain/layers.yaml"),
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn explain_file(rel: &str) -> Explanation {
    let path = dir().join(rel);
    let cfg = Config::from_file(path.to_str().unwrap(), &|_| None)
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    explain_config(&cfg).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Compare `actual` with the snapshot file (or write it with UPDATE_SNAPSHOTS=1); returns a
/// failure message instead of panicking so every mismatch is reported at once.
fn check_snapshot(file: &str, actual: &str) -> Option<String> {
    fanout_testkit::snapshot_mismatch(
        &format!("crates/fanout-flow/tests/explain/{file}"),
        actual,
        "cargo test -p fanout-flow --test explain",
    )
}

#[test]
fn text_and_mermaid_match_the_snapshots() {
    let mut failures = Vec::new();
    for (name, rel) in CASES {
        let e = explain_file(rel);
        failures.extend(check_snapshot(&format!("{name}.txt"), &e.text()));
        failures.extend(check_snapshot(&format!("{name}.mmd"), &e.mermaid()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn levels_and_critical_path_follow_the_dependencies() {
    let e = explain_file("../../examples/product-page/fanout.yaml");
    let r = &e.routes[0];
    let names =
        |ix: &[usize]| -> Vec<String> { ix.iter().map(|&i| r.steps[i].name.clone()).collect() };
    assert_eq!(names(&r.levels[0]), ["mask", "rmask", "recs"]);
    assert_eq!(
        names(&r.levels[1]),
        ["price", "stock", "media", "rprice", "rstock", "rmedia"]
    );
    // mask (100ms) → price (100ms) is longer than recs (50ms) → rprice (100ms).
    assert_eq!(names(&r.critical), ["mask", "price"]);
    assert_eq!(r.worst, Duration::from_millis(200));
    assert_eq!(r.deadline, Duration::from_millis(300));
}

#[test]
fn timeouts_name_their_source_and_keyed_lookups_use_the_batch_timeout() {
    let e = explain_file("tests/explain/layers.yaml");
    let r = &e.routes[0];
    let step = |n: &str| r.steps.iter().find(|s| s.name == n).unwrap();
    assert_eq!(step("user").timeout.unwrap().from, TimeoutFrom::Backend);
    assert_eq!(step("orders").timeout.unwrap().from, TimeoutFrom::Step);
    assert_eq!(step("audit").timeout.unwrap().from, TimeoutFrom::Defaults);
    let prices = step("prices");
    assert!(matches!(prices.work.io, StepIo::Keyed { max_keys: 50, .. }));
    assert_eq!(prices.timeout.unwrap().value, Duration::from_millis(100));
    assert_eq!(prices.unused_timeout, Some(Duration::from_millis(10)));
    // A step's worst case never exceeds the deadline; the chain's sum can.
    assert_eq!(step("audit").worst, r.deadline);
    assert!(r.worst > r.deadline);
    // The POST is not idempotent: the backend's retries and hedging do not apply to it.
    let audit = step("audit").backend.as_ref().unwrap();
    assert!(audit.retry.is_none() && audit.hedge.is_none() && audit.not_idempotent);
    assert!(step("check").timeout.is_none() && step("total").timeout.is_none());
}

#[test]
fn routes_are_selected_by_path_or_method_and_path() {
    let e = explain_file("tests/explain/layers.yaml");
    assert_eq!(e.select("/users/{id}").len(), 2);
    let del = e.select("delete /users/{id}");
    assert_eq!(del.len(), 1);
    assert_eq!(del[0].method, "DELETE");
    assert!(e.select("/users/1").is_empty());
    assert!(e.select("POST /health").is_empty());
    assert_eq!(
        e.route_list(),
        "  GET /users/{id}\n  DELETE /users/{id}\n  GET /health\n"
    );
}
