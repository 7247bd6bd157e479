//! `sql` steps against a real PostgreSQL: each test has a database of its own in the test binary's
//! one cluster (`fanout_lab::postgres::PgCluster::database`: initdb once in a temporary directory,
//! a free port), or a cluster of its own when it stops the server or needs TLS, and a gateway in
//! this process. Every wait is for a state (an answer, a row of `pg_stat_activity`), never a
//! time.

use fanout::{RunningGateway, load_gateway, start_gateway};
use fanout_lab::postgres::{PgCluster, PgDatabase};
use fanout_testkit::*;
use serde_json::{Value, json};
use std::time::Duration;

/// A database of this test's own in the binary's shared cluster.
pub(crate) async fn cluster() -> PgDatabase {
    tokio::task::spawn_blocking(|| PgCluster::database().unwrap_or_else(|e| panic!("{e}")))
        .await
        .unwrap()
}

/// A cluster of this test's own (it stops the server, changes roles or authentication).
pub(crate) async fn own_cluster() -> PgDatabase {
    tokio::task::spawn_blocking(|| {
        PgCluster::start()
            .unwrap_or_else(|e| panic!("{e}"))
            .into_database()
    })
    .await
    .unwrap()
}

pub(crate) async fn psql(pg: &PgDatabase, sql: &str) -> String {
    // psql is a short child process: run it off the runtime's scheduling.
    tokio::task::block_in_place(|| pg.psql(sql).unwrap_or_else(|e| panic!("{e}")))
}

fn load(yaml: &str, pg: &PgDatabase) -> Result<fanout_proxy::Gateway, String> {
    let url = pg.url();
    let lookup = move |n: &str| (n == "DB_URL").then(|| url.clone());
    load_gateway("fanout.yaml", yaml, &lookup).map_err(|e| e.to_string())
}

async fn start(yaml: &str, pg: &PgDatabase) -> RunningGateway {
    let gw = load(yaml, pg).unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .unwrap_or_else(|e| panic!("start: {e}"))
}

const SCHEMA: &str = r#"
CREATE TABLE things (
  id serial PRIMARY KEY,
  name text NOT NULL UNIQUE,
  qty int4 CHECK (qty >= 0),
  small int2, big int8, f4 float4, f8 float8, price numeric(20, 6), ok bool,
  uid uuid, doc jsonb, j json, day date, at timestamp, atz timestamptz, blob bytea,
  tags text[], nums int4[]
);
"#;

const CONFIG: &str = r#"
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    timeout: 5s
routes:
  - path: /things
    method: POST
    flow:
      ins:
        sql:
          backend: db
          mode: exec
          query: >-
            INSERT INTO things (name, qty, small, big, f4, f8, price, ok, uid, doc, j, day, at, atz, blob, tags, nums)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
            RETURNING id
          params:
            - $request.body.name
            - $request.body.qty
            - $request.body.small
            - $request.body.big
            - $request.body.f4
            - $request.body.f8
            - $request.body.price
            - $request.body.ok
            - $request.body.uid
            - $request.body.doc
            - $request.body.j
            - $request.body.day
            - $request.body.at
            - $request.body.atz
            - $request.body.blob
            - $request.body.tags
            - $request.body.nums
    respond: { body: '$ins' }
  - path: /things/{name}
    flow:
      one:
        sql:
          backend: db
          mode: one
          query: "SELECT name, qty, small, big, f4, f8, price, ok, uid, doc, j, day, at, atz, blob, tags, nums FROM things WHERE name = $1"
          params: [$request.params.name]
    respond: { body: '$one' }
  - path: /maybe/{name}
    flow:
      row:
        sql: { backend: db, mode: optional, query: "SELECT id FROM things WHERE name = $1", params: [$request.params.name] }
    respond: { body: '{row: $row}' }
  - path: /all
    flow:
      rows:
        sql: { backend: db, query: "SELECT name FROM things ORDER BY name" }
    respond: { body: '$rows | map(.name)' }
  - path: /two/one
    flow:
      one:
        sql: { backend: db, mode: one, query: "SELECT g AS n FROM generate_series(1, 2) g" }
    respond: { body: '$one' }
  - path: /two/optional
    flow:
      maybe:
        sql: { backend: db, mode: optional, query: "SELECT g AS n FROM generate_series(1, 2) g" }
    respond: { body: '$maybe' }
  - path: /dup
    flow:
      row:
        sql: { backend: db, mode: one, query: "SELECT 1 AS a, 2 AS b, 3 AS a" }
    respond: { body: '$row' }
  - path: /qty/{id}
    flow:
      q:
        sql: { backend: db, mode: one, query: "SELECT qty FROM things WHERE id = $1", params: ['$request.params.id'] }
    respond: { body: '$q' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn values_of_every_type_go_in_and_come_back_out() {
    let pg = cluster().await;
    psql(&pg, SCHEMA).await;
    let gw = start(CONFIG, &pg).await;
    let base = format!("http://{}", gw.addr);
    let inject = "x'); DROP TABLE things; --";
    let thing = json!({
        "name": inject, "qty": 3, "small": -7, "big": 9007199254740993_i64, "f4": 1.5, "f8": 0.1,
        "price": 7.25, "ok": true,
        "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "doc": {"a": [1, {"b": null}]}, "j": [1, "x"],
        "day": "2024-02-29", "at": "2024-02-29T12:34:56.5", "atz": "2024-02-29T12:34:56.123456+02:00",
        "blob": "AAEC/w==", "tags": ["a", null, "c"], "nums": [1, 2, 3]
    });
    // The price as literal text, so its digits are exact (serde_json would round it).
    let body = thing.to_string().replace("7.25", "12345678901234.123456");
    let r = post(&format!("{base}/things"), &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let ins = r.json();
    assert_eq!(ins["rows_affected"], 1, "{ins}");
    assert!(ins["rows"][0]["id"].is_i64(), "{ins}");

    let name = percent(inject);
    let r = get(&format!("{base}/things/{name}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("\"price\":12345678901234.123456"),
        "numeric keeps its digits: {}",
        r.text()
    );
    let got = r.json();
    assert_eq!(got["name"], inject, "stored and returned verbatim");
    assert_eq!(got["qty"], 3);
    assert_eq!(got["small"], -7);
    assert_eq!(got["big"], json!(9007199254740993_i64));
    assert_eq!(got["f4"], 1.5);
    assert_eq!(got["f8"], 0.1);
    assert_eq!(got["ok"], true);
    assert_eq!(got["uid"], "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
    assert_eq!(got["doc"], json!({"a": [1, {"b": null}]}));
    assert_eq!(got["j"], json!([1, "x"]));
    assert_eq!(got["day"], "2024-02-29");
    assert_eq!(got["at"], "2024-02-29T12:34:56.5");
    assert_eq!(got["atz"], "2024-02-29T10:34:56.123456Z");
    assert_eq!(got["blob"], "AAEC/w==");
    assert_eq!(got["tags"], json!(["a", null, "c"]));
    assert_eq!(got["nums"], json!([1, 2, 3]));
    assert_eq!(
        psql(&pg, "SELECT count(*) FROM things").await,
        "1",
        "the table is still there"
    );

    // NULLs both ways.
    let r = post(&format!("{base}/things"), r#"{"name": "nulls"}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = get(&format!("{base}/things/nulls")).await.json();
    assert_eq!(got["qty"], Value::Null);
    assert_eq!(got["tags"], Value::Null);

    // Modes: optional, many; one with no row is 404 naming the step.
    assert_eq!(
        get(&format!("{base}/maybe/nope")).await.json(),
        json!({"row": null})
    );
    assert!(get(&format!("{base}/maybe/nulls")).await.json()["row"]["id"].is_i64());
    assert_eq!(
        get(&format!("{base}/all")).await.json(),
        json!(["nulls", inject])
    );
    // Two columns with one name: the later value, as in an object built key by key.
    assert_eq!(
        get(&format!("{base}/dup")).await.json(),
        json!({"a": 3, "b": 2})
    );
    let r = get(&format!("{base}/things/nope")).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "not_found");
    assert_eq!(r.json()["error"]["step"], "one", "{}", r.text());
    // `one` and `optional` given two rows: the database's answer does not fit the step.
    for (mode, step) in [("one", "one"), ("optional", "maybe")] {
        let r = get(&format!("{base}/two/{mode}")).await;
        assert_eq!(r.status, 502, "{mode}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "bad_backend_answer", "{mode}");
        assert_eq!(r.json()["error"]["step"], step, "{mode}");
    }
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn rows_larger_than_max_response_bytes_fail_the_call_and_the_pool_goes_on() {
    let pg = cluster().await;
    // Generous time: the point is the refusal, and the call after a refused answer waits for a
    // new connection (the one with unread rows is closed), which a loaded machine makes slow.
    let yaml = r#"
defaults: { deadline: 15s, timeout: 10s }
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    max_response_bytes: 2000
    postgres: { max_size: 1, max_wait: 10s }
routes:
  - path: /rows/{n}
    flow:
      s: { sql: { backend: db, mode: many, query: "SELECT g AS i, repeat('x', 100) AS pad FROM generate_series(1, $1::int) g", params: ['$request.params.n | tonumber'] } }
    respond: { body: '$s | length' }
  - path: /wide
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT repeat('y', 100000) AS big" } }
    respond: { body: '$s.big | length' }
"#;
    let gw = start(yaml, &pg).await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(get(&format!("{base}/rows/5")).await.json(), json!(5));
    // Many rows past the limit, and one column alone past it: refused before they are built.
    for path in ["/rows/1000", "/wide"] {
        let r = get(&format!("{base}{path}")).await;
        assert_eq!(r.status, 502, "{path}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "bad_backend_answer", "{path}");
    }
    // The one connection was closed with its unread rows; the next call gets a fresh one.
    assert_eq!(get(&format!("{base}/rows/3")).await.json(), json!(3));
}

/// `bodies.memory` of `/__fanout/status`.
async fn memory_status(gw: &RunningGateway) -> Value {
    let st = get(&format!(
        "http://{}/__fanout/status",
        gw.admin_addr.expect("admin listener")
    ))
    .await
    .json();
    st["bodies"]["memory"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn ten_million_rows_stop_at_the_cap_as_they_arrive_and_the_statement_is_cancelled() {
    let pg = cluster().await;
    let yaml = r#"
defaults: { deadline: 60s, timeout: 50s }
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    max_response_bytes: 1048576
    postgres: { max_size: 1, max_wait: 30s }
routes:
  - path: /series/{n}
    flow:
      s: { sql: { backend: db, mode: many, query: "SELECT g FROM generate_series(1, $1::int) g", params: ['$request.params.n | tonumber'] } }
    respond: { body: '$s | length' }
  - path: /wide/{n}
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT repeat('y', $1::int) AS big", params: ['$request.params.n | tonumber'] } }
    respond: { body: '$s.big | length' }
"#;
    let gw = start(yaml, &pg).await;
    let base = format!("http://{}", gw.addr);
    let r = get(&format!("{base}/series/10000000")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "bad_backend_answer");
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("max_response_bytes (1048576 bytes)"),
        "the message names the cap: {msg}"
    );
    // Stopped at the cap, not run to its end: the statement is gone from the server.
    wait_for_async("the refused statement to end", Duration::from_secs(30), || async {
        (psql(&pg, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT g FROM generate_series%' AND state = 'active'").await == "0").then_some(())
    })
    .await;
    // The answer took its share of the memory budget while it grew — about its JSON size,
    // never much more than the cap — and gave it back.
    let mem = memory_status(&gw).await;
    let peak = mem["peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        ((1 << 20)..=(4 << 20)).contains(&peak),
        "the answer counted against the memory budget at its JSON size: {mem}"
    );
    assert_eq!(mem["in_use_bytes"], 0, "{mem}");
    // Under the cap, past the rows kept as values: the answer is whole and right (after the
    // peak above is read: their parsed values are held in the budget too).
    assert_eq!(
        get(&format!("{base}/series/50000")).await.json(),
        json!(50000)
    );
    assert_eq!(
        get(&format!("{base}/wide/500000")).await.json(),
        json!(500000)
    );
    // One value alone larger than the cap: refused before it is converted, with the cap named.
    let r = get(&format!("{base}/wide/4000000")).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_response_bytes (1048576 bytes)")),
        "{}",
        r.text()
    );
    // The pool goes on.
    assert_eq!(get(&format!("{base}/series/3")).await.json(), json!(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_statements_answer_takes_from_the_memory_budget_and_is_refused_when_it_is_full() {
    let pg = cluster().await;
    let yaml = r#"
defaults: { deadline: 60s, timeout: 50s }
server: { bodies: { memory_budget_bytes: 4194304 } }
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    postgres: { max_size: 1, max_wait: 30s }
routes:
  - path: /series/{n}
    flow:
      s: { sql: { backend: db, mode: many, query: "SELECT g, 'row ' || g AS name FROM generate_series(1, $1::int) g", params: ['$request.params.n | tonumber'] } }
    respond: { body: '[($s | length), ($s | map(.g) | add), $s[-1].name]' }
  - path: /exec/{n}
    flow:
      s: { sql: { backend: db, mode: exec, query: "SELECT g FROM generate_series(1, $1::int) g", params: ['$request.params.n | tonumber'] } }
    respond: { body: '[($s.rows | length), $s.rows_affected]' }
"#;
    let gw = start(yaml, &pg).await;
    let base = format!("http://{}", gw.addr);
    // Within the budget: whole and right (written as text past the first rows, then parsed).
    assert_eq!(
        get(&format!("{base}/series/5000")).await.json(),
        json!([5000, 12502500, "row 5000"])
    );
    assert_eq!(
        get(&format!("{base}/exec/8000")).await.json(),
        json!([8000, 8000])
    );
    let refused = |r: &Resp, what: &str| {
        assert_eq!(r.status, 503, "{what}: {}", r.text());
        assert_eq!(
            r.json()["error"]["code"],
            "memory_budget_exhausted",
            "{what}"
        );
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("server.bodies.memory_budget_bytes")),
            "{what}: {}",
            r.text()
        );
    };
    // About 6 MiB of JSON with a 4 MiB budget: refused as the rows arrive.
    refused(&get(&format!("{base}/series/200000")).await, "rows");
    // About 1.2 MiB of JSON: the text fits, the value it would be parsed into (~25 MiB) does
    // not: refused before it is parsed, with the sizes named.
    let r = get(&format!("{base}/series/40000")).await;
    refused(&r, "parsed value");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("once parsed")),
        "{}",
        r.text()
    );
    let mem = memory_status(&gw).await;
    assert!(mem["refused"].as_u64().unwrap_or(0) >= 1, "{mem}");
    assert_eq!(mem["in_use_bytes"], 0, "given back: {mem}");
    // The refused statement is cancelled at the server, and the budget serves the next one.
    wait_for_async("the refused statement to end", Duration::from_secs(30), || async {
        (psql(&pg, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT g, %' AND state = 'active'").await == "0").then_some(())
    })
    .await;
    assert_eq!(
        get(&format!("{base}/series/3")).await.json(),
        json!([3, 6, "row 3"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn sql_errors_become_answers_a_client_can_act_on() {
    let pg = cluster().await;
    psql(&pg, SCHEMA).await;
    let gw = start(CONFIG, &pg).await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(
        post(&format!("{base}/things"), r#"{"name": "a", "qty": 1}"#)
            .await
            .status,
        200
    );
    // Unique violation → 409, no SQL text or constraint name in the body.
    let r = post(&format!("{base}/things"), r#"{"name": "a", "qty": 1}"#).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "conflict");
    assert!(
        !r.text().contains("things_name_key") && !r.text().contains("INSERT"),
        "{}",
        r.text()
    );
    // Check violation → 422.
    let r = post(&format!("{base}/things"), r#"{"name": "b", "qty": -1}"#).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "constraint_violation");
    // A parameter of the wrong type from the request → 400 naming the parameter.
    let r = post(&format!("{base}/things"), r#"{"name": "c", "qty": "many"}"#).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "bad_parameter");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("$2"),
        "{}",
        r.text()
    );
    // A path parameter is text; the column is an integer.
    let r = get(&format!("{base}/qty/1")).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("tonumber"),
        "the message says how to fix it: {}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn statements_are_checked_against_the_database_at_start() {
    let pg = cluster().await;
    psql(&pg, SCHEMA).await;
    let bad = r#"
backends:
  db: { protocol: postgres, url: "${DB_URL}" }
routes:
  - path: /x
    flow:
      a:
        sql: { backend: db, query: "SELECT nme FROM things WHERE id = $1", params: ['1'] }
      b:
        sql: { backend: db, query: "SELECT name FROM things WHERE id = $1", params: ['1', '2'] }
    respond: { body: '[$a, $b]' }
"#;
    let gw = load(bad, &pg).expect("loads (statements are checked at start)");
    let e = match start_gateway(gw, "127.0.0.1:0", None).await {
        Ok(_) => panic!("started with a bad statement"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("fanout.yaml:8:"),
        "FILE:LINE of the statement: {e}"
    );
    assert!(
        e.contains("column \"nme\" does not exist"),
        "Postgres's message: {e}"
    );
    assert!(
        e.contains("1 parameter(s)") && e.contains("passes 2"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_full_pool_refuses_at_once_and_a_deadline_cancels_the_statement_at_the_server() {
    let pg = cluster().await;
    let yaml = r#"
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    timeout: 60s
    postgres: { max_size: 1, max_waiters: 0, max_wait: 30s, statement_timeout: 60s }
routes:
  - path: /sleep
    deadline: 60s
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT pg_sleep(30) IS NULL AS slept" } }
    respond: { body: '$s' }
  - path: /short
    deadline: 300ms
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT pg_sleep(10) IS NULL AS slept" } }
    respond: { body: '$s' }
  - path: /one
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT 1 AS n" } }
    respond: { body: '$s' }
"#;
    let gw = start(yaml, &pg).await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(get(&format!("{base}/one")).await.json(), json!({"n": 1}));
    // The one connection busy: the next call is refused at once (no waiters allowed).
    let sleeper = tokio::spawn(get(format!("{base}/sleep").leak()));
    wait_for_async("the sleep to run", Duration::from_secs(30), || async {
        (psql(
            &pg,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(30)%'",
        )
        .await
            == "1")
            .then_some(())
    })
    .await;
    let r = get(&format!("{base}/one")).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "pool_exhausted");
    assert!(r.header("retry-after").is_some());
    sleeper.abort();
    // The client went away: its statement is cancelled at the server, and the connection serves
    // the next call once it is known idle.
    wait_for_async("the abandoned sleep to be cancelled", Duration::from_secs(30), || async {
        (psql(&pg, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(30)%' AND state = 'active'").await == "0").then_some(())
    })
    .await;
    wait_for_async(
        "the pool to serve again",
        Duration::from_secs(30),
        || async { (get(&format!("{base}/one")).await.status == 200).then_some(()) },
    )
    .await;
    // A deadline shorter than the statement: 504, and the statement is gone from the server.
    let r = get(&format!("{base}/short")).await;
    assert_eq!(r.status, 504, "{}", r.text());
    let answered = std::time::Instant::now();
    wait_for_async("the cancelled statement to end", Duration::from_secs(30), || async {
        (psql(&pg, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(10)%' AND state = 'active'").await == "0").then_some(())
    })
    .await;
    // Reported, not asserted (timings are the benchmarks' business): docs/benchmarks.md.
    eprintln!(
        "cancelled statement gone from pg_stat_activity {:.1} ms after the 504",
        answered.elapsed().as_secs_f64() * 1000.0
    );
    let st = get(&format!(
        "http://{}/__fanout/status",
        gw.admin_addr.unwrap()
    ))
    .await
    .json();
    let pool = &st["backends"]["db"];
    assert!(pool["cancelled"].as_u64().unwrap() >= 2, "{pool}");
    assert!(pool["rejected_full"].as_u64().unwrap() >= 1, "{pool}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_database_that_goes_away_fails_fast_and_is_used_again_when_back() {
    let pg = own_cluster().await;
    let yaml = r#"
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    postgres: { reconnect_min: 50ms, reconnect_max: 200ms }
routes:
  - path: /one
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT 1 AS n" } }
    respond: { body: '$s' }
"#;
    let gw = start(yaml, &pg).await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(get(&format!("{base}/one")).await.status, 200);
    assert!(gw.gateway.readiness().is_ok());
    tokio::task::block_in_place(|| pg.cluster().kill().unwrap());
    wait_for_async(
        "503 database_unavailable",
        Duration::from_secs(30),
        || async {
            let r = get(&format!("{base}/one")).await;
            (r.status == 503 && r.json()["error"]["code"] == "database_unavailable").then_some(())
        },
    )
    .await;
    assert!(
        gw.gateway.readiness().is_err(),
        "not ready while the database is down"
    );
    tokio::task::block_in_place(|| pg.cluster().restart().unwrap());
    wait_for_async(
        "the database to be used again",
        Duration::from_secs(60),
        || async { (get(&format!("{base}/one")).await.status == 200).then_some(()) },
    )
    .await;
    wait_for("ready again", Duration::from_secs(30), || {
        gw.gateway.readiness().is_ok().then_some(())
    })
    .await;
}

fn config_of(yaml: &str, pg: &PgDatabase) -> fanout_config::Config {
    let url = pg.url();
    let lookup = move |n: &str| (n == "DB_URL").then(|| url.clone());
    fanout_config::Config::from_yaml("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("config:\n{e}"))
}

async fn pool_status(gw: &RunningGateway) -> Value {
    let st = get(&format!(
        "http://{}/__fanout/status",
        gw.admin_addr.expect("admin listener")
    ))
    .await
    .json();
    st["backends"]["db"].clone()
}

/// The value of the series `name{labels}` (labels exactly as exposed, in order) on `/metrics`.
async fn metric(gw: &RunningGateway, series: &str) -> Option<f64> {
    let text = get(&format!(
        "http://{}/metrics",
        gw.admin_addr.expect("admin listener")
    ))
    .await
    .text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn read_only_statements_are_shared_and_cached_writes_never() {
    let pg = cluster().await;
    psql(&pg, "CREATE TABLE log (id serial PRIMARY KEY, v text)").await;
    let yaml = r#"
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    timeout: 5s
    cache: { ttl: 60s }
routes:
  # The steps' time (5s) is below the deadline, so both calls have the same budget and share.
  - path: /read/{k}
    deadline: 30s
    flow:
      a: { sql: { backend: db, mode: one, query: "SELECT count(*) AS n, $1::text AS k FROM log", params: [$request.params.k] } }
      b: { sql: { backend: db, mode: one, query: "SELECT count(*) AS n, $1::text AS k FROM log", params: [$request.params.k] } }
    respond: { body: '[$a, $b]' }
  - path: /write/{v}
    method: POST
    flow:
      a: { sql: { backend: db, mode: exec, query: "INSERT INTO log (v) VALUES ($1)", params: [$request.params.v] } }
      b: { sql: { backend: db, mode: exec, query: "INSERT INTO log (v) VALUES ($1)", params: [$request.params.v] } }
    respond: { body: '[$a.rows_affected, $b.rows_affected]' }
"#;
    let gw = start(yaml, &pg).await;
    let base = format!("http://{}", gw.addr);
    let statements = |v: &Value| v["statements"].as_u64().unwrap();
    let before = statements(&pool_status(&gw).await);
    // Two identical reads in one request, then the same request again: one statement in all
    // (the second step shares the first's call, the second request is a cache hit).
    let r = get(&format!("{base}/read/x")).await;
    assert_eq!(r.json(), json!([{"n": 0, "k": "x"}, {"n": 0, "k": "x"}]));
    let r2 = get(&format!("{base}/read/x")).await;
    assert_eq!(r2.json(), r.json());
    assert_eq!(statements(&pool_status(&gw).await) - before, 1);
    // A different parameter is a different call.
    assert_eq!(get(&format!("{base}/read/y")).await.json()[0]["k"], "y");
    assert_eq!(statements(&pool_status(&gw).await) - before, 2);
    // Writes: every step runs, every time.
    for _ in 0..2 {
        let r = post(&format!("{base}/write/w"), "").await;
        assert_eq!(r.json(), json!([1, 1]), "{}", r.text());
    }
    assert_eq!(psql(&pg, "SELECT count(*) FROM log").await, "4");
    assert_eq!(statements(&pool_status(&gw).await) - before, 6);
    // Rows: the database returned two (one per read statement; the inserts return none); each
    // step counts the rows it received, shared and cached answers included (a and b of three
    // reads).
    assert_eq!(
        metric(&gw, r#"fanout_db_rows_total{backend="db"}"#).await,
        Some(2.0)
    );
    for step in ["a", "b"] {
        let series = format!(r#"fanout_db_step_rows_total{{backend="db",step="{step}"}}"#);
        assert_eq!(metric(&gw, &series).await, Some(3.0), "{series}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_reload_checks_its_statements_before_it_takes_effect() {
    let pg = cluster().await;
    let yaml = |q: &str| {
        format!(
            r#"
backends:
  db: {{ protocol: postgres, url: "${{DB_URL}}" }}
routes:
  - path: /q
    flow:
      s: {{ sql: {{ backend: db, mode: one, query: "{q}" }} }}
    respond: {{ body: '$s' }}
"#
        )
    };
    let gw = start(&yaml("SELECT 1 AS n"), &pg).await;
    let base = format!("http://{}", gw.addr);
    assert_eq!(get(&format!("{base}/q")).await.json(), json!({"n": 1}));
    gw.gateway
        .reload(config_of(&yaml("SELECT 2 AS n"), &pg))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(get(&format!("{base}/q")).await.json(), json!({"n": 2}));
    // The step is kept by the new config: its counters go on across the reload.
    assert_eq!(
        metric(&gw, r#"fanout_db_step_rows_total{backend="db",step="s"}"#).await,
        Some(2.0)
    );
    let e = gw
        .gateway
        .reload(config_of(&yaml("SELEC 3 AS n"), &pg))
        .await
        .expect_err("a statement Postgres refuses is refused by the reload");
    let e = e.to_string();
    assert!(
        e.contains("fanout.yaml:") && e.contains("syntax error"),
        "{e}"
    );
    assert_eq!(
        get(&format!("{base}/q")).await.json(),
        json!({"n": 2}),
        "the running config stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_serialization_failure_is_retried_only_when_the_step_is_idempotent() {
    let pg = cluster().await;
    // `flaky(s)` fails with SQLSTATE 40001 (serialization_failure) the first time it is called
    // with sequence `s` (sequences are not transactional: the failure does not undo the count).
    psql(
        &pg,
        "CREATE SEQUENCE first_try; CREATE SEQUENCE second_try;
         CREATE FUNCTION flaky(s regclass) RETURNS int4 LANGUAGE plpgsql AS $$
         BEGIN
           IF nextval(s) = 1 THEN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END IF;
           RETURN 1;
         END $$;",
    )
    .await;
    let yaml = r#"
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    timeout: 5s
    retry: { attempts: 2, backoff: 1ms }
routes:
  - path: /idempotent
    deadline: 30s
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT flaky('first_try') AS ok", read_only: false, idempotent: true } }
    respond: { body: '$s' }
  - path: /once
    deadline: 30s
    flow:
      s: { sql: { backend: db, mode: one, query: "SELECT flaky('second_try') AS ok", read_only: false } }
    respond: { body: '$s' }
"#;
    let gw = start(yaml, &pg).await;
    let base = format!("http://{}", gw.addr);
    let r = get(&format!("{base}/idempotent")).await;
    assert_eq!(r.status, 200, "retried: {}", r.text());
    assert_eq!(r.json(), json!({"ok": 1}));
    let r = get(&format!("{base}/once")).await;
    assert_eq!(r.status, 503, "not retried: {}", r.text());
    assert_eq!(r.json()["error"]["code"], "database_busy");
    assert_eq!(
        psql(&pg, "SELECT last_value FROM second_try").await,
        "1",
        "sent once"
    );
    let m = get(&format!(
        "http://{}/metrics",
        gw.admin_addr.expect("admin listener")
    ))
    .await
    .text();
    assert!(
        m.lines().any(|l| l.starts_with("fanout_db_errors_total{")
            && l.contains("class=\"transaction_rollback\"")
            && l.ends_with(" 2")),
        "both serialization failures counted:\n{m}"
    );
    // The step saw one of them: the other was retried below it, and it received the answer.
    let series = |class: &str| {
        format!(r#"fanout_db_step_errors_total{{backend="db",step="s",class="{class}"}}"#)
    };
    assert_eq!(
        metric(&gw, &series("transaction_rollback")).await,
        Some(1.0)
    );
    assert_eq!(metric(&gw, &series("other")).await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn sslmode_require_and_verify_full_speak_tls_and_verify_full_checks_the_certificate() {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (ck.cert.pem(), ck.signing_key.serialize_pem());
    let pg = tokio::task::spawn_blocking(move || {
        PgCluster::start_with_tls(&cert, &key)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_database()
    })
    .await
    .unwrap();
    let ca = pg.cluster().dir().join("ca.pem");
    std::fs::write(&ca, ck.cert.pem()).unwrap();
    let yaml = |mode: &str, ca_file: &str| {
        format!(
            r#"
backends:
  db:
    protocol: postgres
    url: "${{DB_URL}}"
    {ca_file}
    postgres: {{ {mode} reconnect_min: 1s, reconnect_max: 1s }}
routes:
  - path: /ssl
    flow:
      s: {{ sql: {{ backend: db, mode: one, query: "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()" }} }}
    respond: {{ body: '$s.ssl' }}
"#
        )
    };
    async fn ssl_of(gw: &RunningGateway) -> (u16, String) {
        let r = get(&format!("http://{}/ssl", gw.addr)).await;
        (r.status.as_u16(), r.text())
    }
    // A loopback host: plain TCP by default.
    let plain = start(&yaml("", ""), &pg).await;
    assert_eq!(ssl_of(&plain).await, (200, "false".to_string()));
    let require = start(&yaml("sslmode: require,", ""), &pg).await;
    assert_eq!(ssl_of(&require).await, (200, "true".to_string()));
    let ca_line = format!("tls: {{ ca_file: \"{}\" }}", ca.display());
    let verified = start(&yaml("sslmode: verify-full,", &ca_line), &pg).await;
    assert_eq!(ssl_of(&verified).await, (200, "true".to_string()));
    // The web PKI roots do not know the self-signed certificate: no connection is made.
    let untrusted = start(&yaml("sslmode: verify-full,", ""), &pg).await;
    assert!(untrusted.gateway.readiness().is_err());
    let r = get(&format!("http://{}/ssl", untrusted.addr)).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "database_unavailable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_row_longer_than_the_cap_is_refused_from_its_header_over_tcp_and_tls() {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (ck.cert.pem(), ck.signing_key.serialize_pem());
    let pg = tokio::task::spawn_blocking(move || {
        PgCluster::start_with_tls(&cert, &key)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_database()
    })
    .await
    .unwrap();
    for mode in ["", "sslmode: require,"] {
        let gw = start(&wide_row_config(mode), &pg).await;
        let base = format!("http://{}", gw.addr);
        a_huge_row_is_refused_from_its_header(&base, mode).await;
        // Not a lost database: ready, and the next call gets a new connection.
        assert!(gw.gateway.readiness().is_ok(), "{mode}");
        assert_eq!(
            get(&format!("{base}/wide/10")).await.json(),
            json!(10),
            "{mode}"
        );
        let pool = pool_status(&gw).await;
        assert!(
            pool["discarded"].as_u64().unwrap_or(0) >= 1,
            "{mode}: {pool}"
        );
    }
}

/// The row guard covers every plain connection, not only a URL naming one TCP host: a Unix
/// socket, several hosts (the first one closed: the next is tried, as the driver would), and
/// `target_session_attrs=read-write` (checked on our connection as the driver checks it). An
/// 8 MB row is refused from its header each time, and the pool goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_huge_row_is_refused_from_its_header_over_a_unix_socket_and_several_hosts() {
    let pg = cluster().await;
    let port = pg.addr().port();
    let db = pg.name();
    let closed = free_addr().port();
    let urls = [
        format!(
            "postgres://postgres@/{db}?host={}&port={port}",
            pg.cluster().dir().display()
        ),
        format!("postgres://postgres@127.0.0.1:{closed},127.0.0.1:{port}/{db}"),
        format!("postgres://postgres@127.0.0.1:{port}/{db}?target_session_attrs=read-write"),
    ];
    let yaml = wide_row_config("");
    for url in urls {
        let lookup = {
            let url = url.clone();
            move |n: &str| (n == "DB_URL").then(|| url.clone())
        };
        let gw = load_gateway("fanout.yaml", &yaml, &lookup)
            .unwrap_or_else(|e| panic!("{url}: gateway config:\n{e}"));
        let gw = start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
            .await
            .unwrap_or_else(|e| panic!("start: {e}"));
        let base = format!("http://{}", gw.addr);
        a_huge_row_is_refused_from_its_header(&base, &url).await;
        assert!(gw.gateway.readiness().is_ok(), "{url}");
        assert_eq!(
            get(&format!("{base}/wide/10")).await.json(),
            json!(10),
            "{url}"
        );
    }
}

/// A gateway whose `GET /wide/{n}` reads one row of `n` bytes from `${DB_URL}`, answers capped at
/// 1 MiB; `mode` is the start of the backend's `postgres:` settings (e.g. `sslmode: require,`).
fn wide_row_config(mode: &str) -> String {
    format!(
        r#"
defaults: {{ deadline: 60s, timeout: 50s }}
server: {{ expose_error_details: true }}
backends:
  db:
    protocol: postgres
    url: "${{DB_URL}}"
    max_response_bytes: 1048576
    postgres: {{ {mode} max_size: 1, max_wait: 30s }}
routes:
  - path: /wide/{{n}}
    flow:
      s: {{ sql: {{ backend: db, mode: one, query: "SELECT repeat('y', $1::int) AS big", params: ['$request.params.n | tonumber'] }} }}
    respond: {{ body: '$s.big | length' }}
"#
    )
}

/// `/wide/1000` answers; an 8 MB row is refused from its DataRow header (the guard closes the
/// connection before the driver buffers the row: the detail says "a row of", where a refusal
/// counted on arrival says "the rows"); the next call gets a new connection. `what` names the case.
async fn a_huge_row_is_refused_from_its_header(base: &str, what: &str) {
    assert_eq!(
        get(&format!("{base}/wide/1000")).await.json(),
        json!(1000),
        "{what}"
    );
    let r = get(&format!("{base}/wide/8000000")).await;
    assert_eq!(r.status, 502, "{what}: {}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "bad_backend_answer", "{what}");
    let detail = e["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("a row of 8000")
            && detail.contains("larger than max_response_bytes (1048576)"),
        "{what}: {e}"
    );
}
