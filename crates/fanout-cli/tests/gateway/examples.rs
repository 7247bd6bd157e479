//! Every example under `examples/` runs end to end through `fanout test`'s runner
//! (`fanout::testing`: real stubs + gateway, a throw-away PostgreSQL database from its
//! `schema.sql`) and gives the answers in its `cases.yaml`, including how many calls each
//! backend received. An example whose config reads `${REDIS_URL…}` gets a `redis-server` of
//! its own.

use fanout::testing::{RunOptions, Suite, report, run};
use fanout_testkit::*;
use std::path::Path;

fn example_dirs() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("fanout.yaml").exists())
        .collect();
    dirs.sort();
    dirs
}

/// Whether an example needs a service the fast tier does not have (a database, Redis).
fn needs_services(dir: &std::path::Path) -> bool {
    let config = std::fs::read_to_string(dir.join("fanout.yaml")).unwrap();
    config.contains("${DATABASE_URL") || config.contains("${REDIS_URL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_answer_as_documented() {
    let dirs: Vec<_> = example_dirs()
        .into_iter()
        .filter(|d| !needs_services(d))
        .collect();
    assert!(dirs.len() >= 2, "expected the examples, found {dirs:?}");
    check_examples(dirs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL and redis-server"]
async fn examples_with_a_database_or_redis_answer_as_documented() {
    let dirs: Vec<_> = example_dirs()
        .into_iter()
        .filter(|d| needs_services(d))
        .collect();
    assert!(!dirs.is_empty(), "expected examples with a database");
    check_examples(dirs).await;
}

async fn check_examples(dirs: Vec<std::path::PathBuf>) {
    let logs = capture_logs();
    let lines = |needle: &str| logs.lines_with(needle);
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for f in ["fanout.yaml", "stubs.yaml", "cases.yaml", "README.md"] {
            assert!(dir.join(f).exists(), "{name}: missing {f}");
        }
        let config = std::fs::read_to_string(dir.join("fanout.yaml")).unwrap();
        let redis = if config.contains("${REDIS_URL") {
            Some(RedisServer::start().await)
        } else {
            None
        };
        let mut suite = Suite::beside(&dir);
        suite
            .vars
            .extend(redis.iter().map(|r| ("REDIS_URL".to_string(), r.url())));
        let report = run(
            &suite,
            RunOptions {
                filter: &[],
                logs: Some(&lines),
                coverage: false,
                // every example's cases also match the schemas its routes declare
                schemas: true,
                propose_schemas: false,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!report.results.is_empty(), "{name}: no cases");
        assert!(report.passed(), "{name}:\n{}", report::human(&report));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_serves_the_embedded_example() {
    let d = fanout::demo::start("127.0.0.1:0")
        .await
        .expect("demo starts");
    let r = get(&format!("http://{}/vacancies?text=rust", d.gateway.addr)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["total"], 3);
    assert_eq!(r.json()["items"].as_array().map(|a| a.len()), Some(3));
}
