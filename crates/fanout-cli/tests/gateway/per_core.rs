//! `server.runtime: per_core`: one single-threaded runtime per core, a listener each on one port
//! (`SO_REUSEPORT`). Real gateway, real sockets: both protocols answer, connections are balanced
//! over the cores whatever the kernel's hash chose, one HTTP/2 connection's many streams are
//! handed to the other core when theirs is busy, in-flight requests finish on shutdown, a port
//! another socket holds is refused. States and counters (the status endpoint's
//! `runtime.cores`), never timings.

use fanout::testing::{RunOptions, Suite, report, run};
use fanout::{RunningGateway, load_gateway, start_gateway_on};
use fanout_testkit::*;
use futures_util::future::join_all;
use http::Method;
use std::time::Duration;

/// Overall bound of every wait in this file.
const PATIENCE: Duration = Duration::from_secs(30);

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - { path: /fast, body: '{ok: true}' }
      - { path: /slow, latency: 1s, body: '{ok: true}' }
"#;

fn config(extra: &str) -> String {
    format!(
        r#"
server:
  runtime: per_core
{extra}
backends:
  a: {{ url: "http://${{A_ADDR}}", dedup: false }}
defaults: {{ coalesce: false }}
routes:
  - path: /fast
    flow:
      s: {{ http: {{ backend: a, path: '"/fast"' }} }}
    respond: {{ body: '$s' }}
  - path: /slow
    deadline: 20s
    flow:
      s: {{ http: {{ backend: a, path: '"/slow"' }}, timeout: 10s }}
    respond: {{ body: '$s' }}
"#
    )
}

/// A per-core gateway on 2 cores in front of `stubs`.
async fn per_core_gateway(stubs: &fanout_stub::StubServer, extra: &str) -> RunningGateway {
    let vars = crate::support::stub_vars(stubs);
    let lookup = |n: &str| vars.get(n).cloned();
    let gw = load_gateway("fanout.yaml", &config(extra), &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    start_gateway_on(gw, "127.0.0.1:0", Some("127.0.0.1:0"), Some(2))
        .await
        .expect("per-core gateway starts")
}

/// The status endpoint's `runtime.cores`: per core (connections, streams, connections handed
/// off, streams handed off).
fn cores(gw: &RunningGateway) -> Vec<[u64; 4]> {
    let s = gw.gateway.status_json();
    assert_eq!(s["runtime"]["kind"], "per_core", "{s}");
    s["runtime"]["cores"]
        .as_array()
        .expect("runtime.cores")
        .iter()
        .map(|c| {
            [
                "connections",
                "streams",
                "connections_handed_off",
                "streams_handed_off",
            ]
            .map(|k| c[k].as_u64().expect(k))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_protocols_answer_and_two_connections_get_a_core_each() {
    let s = stubs(STUBS).await;
    let gw = per_core_gateway(&s, "").await;
    assert_eq!(cores(&gw).len(), 2);

    // HTTP/1.1 and h2c on the one port.
    let url = format!("http://{}/fast", gw.addr);
    for h2 in [false, true] {
        let r = send(&client(h2), Method::GET, &url, &[], "").await;
        assert_eq!(r.status, 200, "h2={h2}: {}", r.text());
        assert_eq!(r.json()["ok"], true);
    }
    wait_until("the test connections closed", || {
        cores(&gw).iter().all(|c| c[0] == 0)
    })
    .await;

    // Two kept connections: one per core, whichever listener the kernel gave them to.
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut c = h1::conn(gw.addr).await;
        let r = c
            .send_request(h1::request(Method::GET, "/fast", ""))
            .await
            .expect("answer");
        let r = Resp::read(r).await;
        assert_eq!(r.status, 200, "{}", r.text());
        conns.push(c);
    }
    wait_within("each core serves one connection", PATIENCE, || {
        cores(&gw).iter().map(|c| c[0]).collect::<Vec<_>>() == [1, 1]
    })
    .await;
    // Both keep answering on their cores.
    for c in &mut conns {
        c.ready().await.expect("connection ready");
        let r = c
            .send_request(h1::request(Method::GET, "/fast", ""))
            .await
            .expect("answer");
        assert_eq!(Resp::read(r).await.status, 200);
    }
    drop(conns);
    wait_until("the connections closed", || {
        cores(&gw).iter().all(|c| c[0] == 0)
    })
    .await;
    gw.shutdown().await.expect("shutdown");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_h2_connection_with_many_streams_uses_both_cores() {
    let s = stubs(STUBS).await;
    let gw = per_core_gateway(&s, "").await;
    // One h2c connection (hyper's client keeps one per host) carrying 64 slow requests at once:
    // the core it landed on runs more streams than twice the other's plus the slack, so the
    // later streams run on the other core.
    let c = client(true);
    let url = format!("http://{}/slow", gw.addr);
    let answers = join_all((0..64).map(|_| send(&c, Method::GET, &url, &[], ""))).await;
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["ok"], true);
    }
    let st = cores(&gw);
    assert_eq!(
        st.iter().map(|c| c[0]).sum::<u64>(),
        1,
        "one connection: {st:?}"
    );
    let handed: u64 = st.iter().map(|c| c[3]).sum();
    assert!(handed >= 1, "streams were handed to the other core: {st:?}");
    assert!(
        st.iter().all(|c| c[1] == 0),
        "no stream left running: {st:?}"
    );
    drop(c);
    gw.shutdown().await.expect("shutdown");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn few_h2_streams_stay_on_their_core() {
    let s = stubs(STUBS).await;
    let gw = per_core_gateway(&s, "").await;
    // Sequential requests on one h2c connection: never more than one stream in flight, so
    // none is handed off.
    let c = client(true);
    let url = format!("http://{}/fast", gw.addr);
    for _ in 0..20 {
        assert_eq!(send(&c, Method::GET, &url, &[], "").await.status, 200);
    }
    let st = cores(&gw);
    assert_eq!(st.iter().map(|c| c[3]).sum::<u64>(), 0, "{st:?}");
    drop(c);
    gw.shutdown().await.expect("shutdown");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_requests_finish_on_shutdown() {
    let s = stubs(STUBS).await;
    let gw = per_core_gateway(&s, "  shutdown_grace: 15s").await;
    let url = format!("http://{}/slow", gw.addr);
    let slow = tokio::spawn(async move { get(&url).await });
    wait_within("the slow request is in flight", PATIENCE, || {
        calls(&s, "a") >= 1
    })
    .await;
    let stopped = tokio::time::timeout(PATIENCE, gw.shutdown())
        .await
        .expect("shutdown within its bound");
    stopped.expect("shutdown");
    let r = slow.await.expect("request task");
    assert_eq!(r.status, 200, "{}", r.text());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_another_socket_listens_on_is_refused() {
    let s = stubs(STUBS).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let vars = crate::support::stub_vars(&s);
    let lookup = |n: &str| vars.get(n).cloned();
    let gw = load_gateway("fanout.yaml", &config(""), &lookup).expect("config");
    let err = start_gateway_on(gw, &addr, None, Some(2))
        .await
        .err()
        .expect("a taken port is refused");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_answer_the_same_per_core() {
    // The examples without a database, Redis or files beside their config, each served per core
    // through `fanout test`'s runner: every case's answer and backend calls as documented.
    let logs = capture_logs();
    let lines = |needle: &str| logs.lines_with(needle);
    for name in [
        "hh-vacancies",
        "order-page",
        "product-page",
        "product-page-merged",
    ] {
        let dir = repo_root().join("examples").join(name);
        let tmp = TempDir::new("per-core-example");
        let config = std::fs::read_to_string(dir.join("fanout.yaml")).expect("config");
        let config_file = tmp.path().join("fanout.yaml");
        std::fs::write(
            &config_file,
            format!("{config}\nserver:\n  runtime: per_core\n"),
        )
        .expect("write config");
        let mut suite = Suite::beside(&dir);
        suite.config = config_file;
        let report = run(
            &suite,
            RunOptions {
                filter: &[],
                logs: Some(&lines),
                coverage: false,
                schemas: false,
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
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn each_core_runs_its_statements_on_connections_of_its_own() {
    // A connection's task runs on the core that opened it: a core that borrowed another core's
    // idle connection would wake that core twice per statement. Each core opens its own while the
    // pool has room, and the pool never passes `max_size`.
    let pg = crate::postgres::cluster().await;
    crate::postgres::psql(
        &pg,
        "CREATE TABLE users (id int4 PRIMARY KEY, name text NOT NULL); \
         INSERT INTO users SELECT g, 'user ' || g FROM generate_series(1, 100) g;",
    )
    .await;
    let yaml = r#"
server: { runtime: per_core }
backends:
  db:
    protocol: postgres
    url: "${DB_URL}"
    timeout: 5s
    dedup: false
    postgres: { max_size: 3 }
defaults: { coalesce: false }
routes:
  - path: /users/{id}
    flow:
      user:
        sql:
          backend: db
          mode: one
          query: "SELECT id, name FROM users WHERE id = $1"
          params: ['$request.params.id | tonumber']
    respond: { body: '$user' }
"#;
    let url = pg.url();
    let lookup = move |n: &str| (n == "DB_URL").then(|| url.clone());
    let gw = load_gateway("fanout.yaml", yaml, &lookup).unwrap_or_else(|e| panic!("{e}"));
    let gw = start_gateway_on(gw, "127.0.0.1:0", Some("127.0.0.1:0"), Some(2))
        .await
        .expect("per-core gateway starts");
    let pool = |gw: &RunningGateway| gw.gateway.status_json()["backends"]["db"].clone();

    // One kept connection per core (the gateway balances them), each asking in turn, one
    // statement at a time: a core that finds only the other core's connection idle opens its own.
    let mut conns = Vec::new();
    for _ in 0..2 {
        conns.push(h1::conn(gw.addr).await);
    }
    for round in 0..3 {
        for (i, c) in conns.iter_mut().enumerate() {
            let path = format!("/users/{}", 1 + i + 2 * round);
            // The client's connection task takes the previous answer's end before it can send
            // again: wait for it, not for luck.
            c.ready().await.expect("connection ready");
            let r = c
                .send_request(h1::request(Method::GET, &path, ""))
                .await
                .expect("answer");
            let r = Resp::read(r).await;
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["name"], format!("user {}", 1 + i + 2 * round));
        }
        if round == 0 {
            wait_within("each core serves one connection", PATIENCE, || {
                cores(&gw).iter().map(|c| c[0]).collect::<Vec<_>>() == [1, 1]
            })
            .await;
        }
    }
    // Both cores have a connection of their own; all are idle between statements.
    let p = pool(&gw);
    let by_core: Vec<u64> = p["idle_by_core"]
        .as_array()
        .unwrap_or_else(|| panic!("idle_by_core: {p}"))
        .iter()
        .map(|n| n.as_u64().expect("count"))
        .collect();
    assert_eq!(by_core.len(), 2, "{p}");
    assert!(by_core.iter().all(|&n| n >= 1), "{p}");
    assert_eq!(p["idle"], p["open"], "{p}");

    // Many statements at once from both cores: never more than max_size connections, every
    // request answered.
    let many = (0..60).map(|i| {
        let url = format!("http://{}/users/{}", gw.addr, 1 + i % 100);
        async move {
            send(&client(false), Method::GET, &url, &[], "")
                .await
                .status
        }
    });
    let statuses = join_all(many).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let p = pool(&gw);
    assert!(p["open"].as_u64().expect("open") <= 3, "{p}");
    let sessions = crate::postgres::psql(
        &pg,
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname = current_database()",
    )
    .await;
    let sessions: u64 = sessions
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{sessions}"));
    assert!(sessions <= 3, "{sessions} sessions");
    drop(conns);
    gw.shutdown().await.expect("shutdown");
}
