//! The `pg-query` baseline keeps fanout's contract for the lab's `pg-one-query` route (so the lab
//! compares equal work): the row as fanout writes it, fanout's error codes and body shape, the
//! client's `x-request-timeout`, and a route deadline that ends a request that cannot finish.
//! Against a real PostgreSQL (a throw-away cluster with the lab's schema) and the real binary.

use fanout_pgtemp::PgCluster;
use fanout_testkit::client::{Resp, client, send};
use fanout_testkit::files::free_addr;
use http::{Method, StatusCode};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The lab's `pg-one-query` schema (`fanout_lab::scenario::PG_ONE_SCHEMA`), read from its file:
/// the throw-away cluster alone is a dependency, not the lab.
const PG_ONE_SCHEMA: &str =
    include_str!("../../../../crates/fanout-lab/src/scenarios/pg-one-query.sql");

/// The baseline's process, killed when the test ends.
struct Baseline(Child);

impl Drop for Baseline {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn get(base: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    send(
        &client(false),
        Method::GET,
        &format!("{base}{path}"),
        headers,
        "",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn the_baseline_answers_like_fanout() {
    let pg = PgCluster::start().expect("a throw-away PostgreSQL (initdb, pg_ctl)");
    pg.psql("postgres", PG_ONE_SCHEMA)
        .expect("the lab's schema");
    let addr = free_addr();
    let _baseline = Baseline(
        Command::new(env!("CARGO_BIN_EXE_pg-query"))
            .args(["--listen", &addr.to_string(), "--workers", "2"])
            .env("DB_URL", pg.url("postgres"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start pg-query"),
    );
    let base = format!("http://{addr}");
    // Ready when it answers (it connects and prepares before it listens).
    let mut ready = false;
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "pg-query did not listen on {addr} within 30 s");

    let ok = get(&base, "/users/1", &[]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.header("content-type"), Some("application/json"));
    assert_eq!(
        ok.text(),
        r#"{"id":1,"name":"user 1","email":"user1@example.com"}"#
    );

    let missing = get(&base, "/users/99999", &[]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.code(), "not_found");
    assert_eq!(missing.json()["error"]["step"], "user");

    let not_a_number = get(&base, "/users/ada", &[]).await;
    assert_eq!(not_a_number.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_a_number.code(), "bad_parameter");
    assert_eq!(not_a_number.json()["error"]["step"], "user");

    let bad = get(&base, "/users/1", &[("x-request-timeout", "soon")]).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.code(), "bad_header");

    // A client that allows no time at all: the deadline has passed when the request is routed,
    // and it is answered without a query.
    let late = get(&base, "/users/1", &[("x-request-timeout", "0")]).await;
    assert_eq!(late.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(late.code(), "deadline_exceeded");

    // A client's generous budget does not lengthen the route's deadline, and the answer is
    // unchanged.
    let generous = get(&base, "/users/2", &[("x-request-timeout", "60000")]).await;
    assert_eq!(generous.status, StatusCode::OK);
    assert_eq!(generous.json()["id"], 2);

    let other = get(&base, "/nothing", &[]).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    assert_eq!(other.code(), "not_found");

    let wrong = send(
        &client(false),
        Method::POST,
        &format!("{base}/users/1"),
        &[],
        "",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong.code(), "method_not_allowed");
}
