//! Every example under `examples/` runs end to end (real stubs + gateway) and gives the answers in
//! its `cases.yaml`, including how many calls each backend received. An example whose config
//! reads `${REDIS_URL…}` gets a `redis-server` of its own; one that reads `${DATABASE_URL…}` a
//! PostgreSQL cluster of its own, created from its `schema.sql`.

use crate::support::gateway_with;
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
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for f in ["fanout.yaml", "stubs.yaml", "cases.yaml", "README.md"] {
            assert!(dir.join(f).exists(), "{name}: missing {f}");
        }
        // Configs are loaded as text: their `.proto` include and models directories are made
        // absolute.
        let protos = dir.join("protos");
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .unwrap()
                .replace(
                    "include: [protos]",
                    &format!("include: [\"{}\"]", protos.display()),
                )
                .replace(
                    "dir: models",
                    &format!("dir: \"{}\"", dir.join("models").display()),
                )
        };
        let stubs = stubs(&read("stubs.yaml")).await;
        let config = read("fanout.yaml");
        let redis = if config.contains("${REDIS_URL") {
            Some(RedisServer::start().await)
        } else {
            None
        };
        // An example with a database gets a database of its own, created from its schema.sql.
        let pg = if config.contains("${DATABASE_URL") {
            let pg = tokio::task::spawn_blocking(|| {
                fanout_lab::postgres::PgCluster::database().unwrap_or_else(|e| panic!("{e}"))
            })
            .await
            .unwrap();
            let schema = read("schema.sql");
            tokio::task::block_in_place(|| pg.psql(&schema))
                .unwrap_or_else(|e| panic!("{name}: schema.sql: {e}"));
            Some(pg)
        } else {
            None
        };
        let mut vars: Vec<(&str, String)> = redis.iter().map(|r| ("REDIS_URL", r.url())).collect();
        vars.extend(pg.iter().map(|p| ("DATABASE_URL", p.url())));
        let gw = gateway_with(&config, &stubs, &vars).await;
        let cases = Cases::parse(&read("cases.yaml"));
        let c = client(false);
        for case in cases.cases {
            stubs.reset_stats();
            let url = format!("http://{}{}", gw.addr, case.request.path);
            let headers = case.request.header_pairs();
            let resp = send(
                &c,
                case.request.method(),
                &url,
                &headers,
                case.request.body_text(),
            )
            .await;
            let ctx = format!("{name} / {}", case.name);
            assert_eq!(
                resp.status.as_u16(),
                case.status,
                "{ctx}: {}",
                String::from_utf8_lossy(&resp.body)
            );
            assert_eq!(resp.json(), case.response, "{ctx}");
            for (k, v) in &case.headers {
                assert_eq!(
                    resp.headers.get(k.as_str()).and_then(|h| h.to_str().ok()),
                    Some(v.as_str()),
                    "{ctx}: header {k}"
                );
            }
            for (service, n) in &case.backend_calls {
                assert_eq!(calls(&stubs, service), *n, "{ctx}: calls to {service}");
            }
            if !case.log.is_empty() {
                let rid = case
                    .request
                    .headers
                    .get("x-request-id")
                    .unwrap_or_else(|| panic!("{ctx}: `log` needs the request's x-request-id"));
                assert_eq!(resp.headers["x-request-id"], rid.as_str(), "{ctx}");
                let lines = logs.lines_with(&format!("request_id={rid}"));
                for text in &case.log {
                    assert!(
                        lines.iter().any(|l| l.contains(text.as_str())),
                        "{ctx}: no log line of request {rid} contains {text:?}: {lines:#?}"
                    );
                }
            }
        }
        gw.shutdown().await.unwrap();
        stubs.shutdown().await;
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
