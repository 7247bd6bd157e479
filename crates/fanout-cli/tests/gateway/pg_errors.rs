//! Postgres errors and values that must keep their cause or their numbers: why a connection
//! failed (in `/readyz`'s readiness, the status endpoint and the log), a statement stopped by the
//! server's own `statement_timeout`, and `numeric`/`real` values as exactly as Postgres writes
//! them. A test has a database of its own in the binary's one cluster
//! (`fanout_lab::postgres::PgCluster::database`), or its own cluster when it changes roles and
//! authentication or restarts the server; every wait is for a state, never a time.

use crate::postgres::{cluster, own_cluster, psql};
use fanout::{RunningGateway, load_gateway, start_gateway};
use fanout_testkit::*;
use serde_json::Value;
use std::time::Duration;

/// A gateway whose `${DB_URL}` is `url`.
async fn start_with(yaml: &str, url: &str) -> RunningGateway {
    let url = url.to_string();
    let lookup = move |n: &str| (n == "DB_URL").then(|| url.clone());
    let gw = load_gateway("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .unwrap_or_else(|e| panic!("start: {e}"))
}

async fn pool_status(gw: &RunningGateway, db: &str) -> Value {
    let st = get(&format!(
        "http://{}/__fanout/status",
        gw.admin_addr.expect("admin listener")
    ))
    .await
    .json();
    st["backends"][db].clone()
}

/// One database `name` at `${DB_URL}` and a route reading it.
fn one_db(name: &str, extra: &str) -> String {
    format!(
        r#"
backends:
  {name}:
    protocol: postgres
    url: "${{DB_URL}}"
    postgres: {{ {extra} reconnect_min: 50ms, reconnect_max: 200ms }}
routes:
  - path: /one
    flow:
      s: {{ sql: {{ backend: {name}, mode: one, query: "SELECT 1 AS n" }} }}
    respond: {{ body: '$s' }}
"#
    )
}

/// Wait until the gateway's readiness, its pool's `error` on the status endpoint and the log
/// all say `why` about database `db`; none of them holds `secret`.
async fn says_why(gw: &RunningGateway, db: &str, why: &str, secret: &str) {
    let logs = capture_logs();
    let ready = wait_for(
        "readiness naming the cause",
        Duration::from_secs(60),
        || match gw.gateway.readiness() {
            Err(e) if e.contains(why) => Some(e),
            _ => None,
        },
    )
    .await;
    assert!(ready.contains(&format!("`{db}`")), "{ready}");
    let status = wait_for_async(
        "the status endpoint naming the cause",
        Duration::from_secs(60),
        || async {
            let st = pool_status(gw, db).await;
            st["error"]
                .as_str()
                .is_some_and(|e| e.contains(why))
                .then_some(st)
        },
    )
    .await;
    assert_eq!(status["up"], false, "{status}");
    let line = wait_for(
        "a log line naming the cause",
        Duration::from_secs(60),
        || {
            logs.lines_with(&format!("database={db}"))
                .into_iter()
                .find(|l| l.contains(why))
        },
    )
    .await;
    let r = get(&format!("http://{}/one", gw.addr)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "database_unavailable");
    for text in [&ready, &status.to_string(), &line, &r.text()] {
        assert!(!text.contains(secret), "the password leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_connection_that_fails_says_why_and_never_the_password() {
    // Before any gateway starts: a cause is logged when it first appears.
    capture_logs();
    let pg = own_cluster().await;
    // A role with a password, and password authentication for it (the cluster trusts the rest).
    let hba = psql(&pg, "SHOW hba_file").await;
    let hba = hba.trim();
    let old = std::fs::read_to_string(hba).unwrap();
    std::fs::write(
        hba,
        format!("host all pw_user 127.0.0.1/32 scram-sha-256\n{old}"),
    )
    .unwrap();
    // Restarted rather than reloaded: a reload is applied a moment after it is asked for.
    tokio::task::block_in_place(|| {
        pg.cluster().kill().unwrap();
        pg.cluster().restart().unwrap();
    });
    psql(
        &pg,
        "CREATE ROLE pw_user LOGIN PASSWORD 'right-horse-battery'",
    )
    .await;
    let port = pg.addr().port();

    // A wrong password: the server's 28P01, not "db error".
    let secret = "wrong-staple-secret";
    let url = format!("postgres://pw_user:{secret}@127.0.0.1:{port}/postgres");
    let gw = start_with(&one_db("pwdb", ""), &url).await;
    says_why(&gw, "pwdb", "authentication failed", secret).await;
    let ready = gw.gateway.readiness().unwrap_err();
    assert!(
        ready.contains("28P01") && ready.contains("pw_user"),
        "{ready}"
    );

    // The right one works (the role and pg_hba are as meant).
    let url = format!("postgres://pw_user:right-horse-battery@127.0.0.1:{port}/postgres");
    let good = start_with(&one_db("pwgood", ""), &url).await;
    let r = get(&format!("http://{}/one", good.addr)).await;
    assert_eq!(r.status, 200, "{} {:?}", r.text(), good.gateway.readiness());

    // A host name that does not resolve.
    let url = format!("postgres://postgres:{secret}@nonexistent.invalid:{port}/postgres");
    let gw = start_with(&one_db("nohostdb", ""), &url).await;
    says_why(&gw, "nohostdb", "host not found", secret).await;

    // A closed port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres:{secret}@127.0.0.1:{closed}/postgres");
    let gw = start_with(&one_db("closeddb", ""), &url).await;
    says_why(&gw, "closeddb", "connection refused", secret).await;

    // TLS required by the gateway, not offered by the server.
    let url = format!("postgres://postgres:{secret}@127.0.0.1:{port}/postgres");
    let gw = start_with(&one_db("tlsdb", "sslmode: require,"), &url).await;
    says_why(&gw, "tlsdb", "TLS failed", secret).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_statement_stopped_by_the_servers_statement_timeout_says_so() {
    let pg = cluster().await;
    let yaml = r#"
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    timeout: 5s
    postgres: { statement_timeout: 300ms }
routes:
  - path: /slow
    deadline: 60s
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT pg_sleep(30) IS NULL AS slept" } }
    respond: { body: '$s' }
"#;
    let gw = start_with(yaml, &pg.url()).await;
    let r = get(&format!("http://{}/slow", gw.addr)).await;
    assert_eq!(r.status, 504, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "backend_timeout", "{}", r.text());
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("statement_timeout") && message.contains("300 ms"),
        "{message}"
    );
    // Neither the route's deadline (60 s away) nor the backend's timeout (5 s, not waited).
    assert!(
        !message.contains("deadline") && !message.contains("5000"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn numeric_and_real_values_keep_their_exact_text() {
    let pg = cluster().await;
    let yaml = r#"
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
routes:
  - path: /numbers
    flow:
      n:
        sql:
          backend: db
          mode: one
          query: >-
            SELECT '1e1000'::numeric AS big, '-1e-1000'::numeric AS tiny,
                   ('-' || repeat('9', 1200) || '.' || repeat('0', 999) || '1')::numeric AS long,
                   '12345678901234567890.123456789012345678900'::numeric AS exact,
                   '-0.000'::numeric AS zero, 'NaN'::numeric AS nan,
                   'Infinity'::numeric AS inf, '-Infinity'::numeric AS ninf,
                   0.1::real AS r1, '3.4028235e38'::real AS rmax, '1e-45'::real AS rmin,
                   (-2.5)::real AS rneg, 1::real AS rone, 16777216::real AS rbig,
                   0.1::float8 AS d1
    respond: { body: '$n' }
  - path: /sum
    flow:
      n:
        sql: { backend: db, mode: one, query: "SELECT '-1e-1000'::numeric AS tiny, 0.1::real AS r" }
    respond: { body: '{negative: ($n.tiny < 0), r: ($n.r + 0)}' }
  - path: /arrays
    flow:
      n:
        sql:
          backend: db
          mode: one
          query: >-
            SELECT ARRAY['1e1000', '1.50']::numeric[] AS one,
                   ARRAY[['-1e-1000', NULL], ['NaN', '2']]::numeric[] AS two
    respond: { body: '$n' }
"#;
    let gw = start_with(yaml, &pg.url()).await;
    let r = get(&format!("http://{}/numbers", gw.addr)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let want = format!(
        concat!(
            r#"{{"big":1{},"tiny":-0.{}1,"long":-{}.{}1,"#,
            r#""exact":12345678901234567890.123456789012345678900,"zero":0.000,"#,
            r#""nan":"NaN","inf":"Infinity","ninf":"-Infinity","#,
            r#""r1":0.1,"rmax":3.4028235e38,"rmin":1e-45,"rneg":-2.5,"rone":1,"rbig":16777216,"#,
            r#""d1":0.1}}"#
        ),
        "0".repeat(1000),
        "0".repeat(999),
        "9".repeat(1200),
        "0".repeat(999),
    );
    assert_eq!(r.text(), want);
    // The value is the number, not only its text: its sign holds in the flow.
    let r = get(&format!("http://{}/sum", gw.addr)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), r#"{"negative":true,"r":0.1}"#);
    // In arrays too, of any dimension (a long one was `null`: `[null,1.50]`).
    let r = get(&format!("http://{}/arrays", gw.addr)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let want = format!(
        r#"{{"one":[1{},1.50],"two":[[-0.{}1,null],["NaN",2]]}}"#,
        "0".repeat(1000),
        "0".repeat(999),
    );
    assert_eq!(r.text(), want);
}
