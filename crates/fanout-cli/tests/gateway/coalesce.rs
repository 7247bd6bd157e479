//! Whole-request coalescing (docs/config.md#coalescing), end to end: a real gateway and a backend
//! on 127.0.0.1 that holds every answer until the test opens its gate, so which requests overlap
//! is decided by the test (it waits for the gateway's counters and the backend's call count,
//! never for a fixed time).
//!
//! Isolation first: requests share a run only when they are equal in every part of the request
//! the flow reads.

use fanout::{RunningGateway, load_gateway, start_gateway};
use fanout_testkit::*;
use http::{Method, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// A backend that answers only while its gate is open: `{user, path, call}` (`authorization`,
/// the path, the call's number), or 503 for paths under `/fail`. Counts the calls it received.
struct Gate {
    addr: SocketAddr,
    calls: Arc<AtomicU64>,
    open: watch::Sender<bool>,
}

impl Gate {
    async fn start() -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let (open, _) = watch::channel(false);
        let (c, o) = (calls.clone(), open.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (c, o) = (c.clone(), o.clone());
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let (c, mut gate) = (c.clone(), o.subscribe());
                    async move {
                        let call = c.fetch_add(1, SeqCst) + 1;
                        let _ = gate.wait_for(|open| *open).await;
                        let user = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let path = req.uri().path().to_string();
                        let status = if path.starts_with("/fail") {
                            StatusCode::SERVICE_UNAVAILABLE
                        } else {
                            StatusCode::OK
                        };
                        let body = serde_json::json!({"user": user, "path": path, "call": call});
                        let mut resp =
                            http::Response::new(Full::new(bytes::Bytes::from(body.to_string())));
                        *resp.status_mut() = status;
                        resp.headers_mut()
                            .insert("content-type", "application/json".parse().unwrap());
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        Gate { addr, calls, open }
    }

    fn calls(&self) -> u64 {
        self.calls.load(SeqCst)
    }

    fn set(&self, open: bool) {
        self.open.send_replace(open);
    }
}

async fn gateway_at(yaml: &str, gate: &Gate) -> RunningGateway {
    let addr = gate.addr.to_string();
    let lookup = |n: &str| (n == "GATE_ADDR").then(|| addr.clone());
    let gw = load_gateway("fanout.yaml", yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .expect("bind gateway")
}

/// The gateway's `coalesce` status of `route` (`"GET /path"`): `{runs, coalesced, reruns,
/// in_flight}`, `null` when the route does not coalesce.
fn status(gw: &RunningGateway, route: &str) -> serde_json::Value {
    gw.gateway.status_json()["coalesce"]["routes"][route].clone()
}

fn count(gw: &RunningGateway, route: &str, what: &str) -> u64 {
    status(gw, route)[what].as_u64().unwrap_or(0)
}

const GATEWAY: &str = r#"
backends:
  gate: { url: "http://${GATE_ADDR}", timeout: 10s }
  gate_nodedup: { url: "http://${GATE_ADDR}", timeout: 10s, dedup: false }
defaults: { deadline: 10s }
routes:
  - path: /items/{id}
    flow:
      it: { http: { backend: gate, path: '"/items/\($request.params.id)"' } }
    respond:
      headers: { x-item: '$request.params.id' }
      body: '{item: $it.path, call: $it.call}'
  - path: /me
    flow:
      me:
        http:
          backend: gate
          path: '"/me"'
          headers: { authorization: '$request.headers.authorization' }
    respond: { body: '{user: $me.user, call: $me.call}' }
  - path: /slow
    flow:
      s: { http: { backend: gate_nodedup, path: '"/slow"' } }
    respond: { body: '{call: $s.call}' }
  - path: /fail
    flow:
      f: { http: { backend: gate, path: '"/fail"' } }
    respond: { body: '$f' }
  - path: /partial
    flow:
      ok: { http: { backend: gate, path: '"/ok"' } }
      extra: { http: { backend: gate, path: '"/fail/extra"' }, optional: true, default: null }
    respond: { body: '{call: $ok.call, extra: $extra}' }
"#;

/// `n` concurrent GETs of `path`, each with the headers `headers(i)`, spawned now.
fn spawn_all(
    gw: &RunningGateway,
    path: &str,
    n: usize,
    headers: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<tokio::task::JoinHandle<Resp>> {
    spawn_some(gw, path, 0..n, headers)
}

/// Concurrent GETs of `path` for the indices `ids`, each with the headers `headers(i)`, spawned
/// now. Tests that count joins start the leaders first and the joiners once the leaders' runs
/// are in flight: a request's deadline is fixed on arrival, so a joiner that arrived a moment
/// before the leader but reached the run table after it has the earlier deadline and rightly
/// runs on its own — an ordering a loaded machine produces, not the behaviour under test.
fn spawn_some(
    gw: &RunningGateway,
    path: &str,
    ids: std::ops::Range<usize>,
    headers: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<tokio::task::JoinHandle<Resp>> {
    let c = client(false);
    ids.map(|i| {
        let (c, url, h) = (c.clone(), format!("http://{}{path}", gw.addr), headers(i));
        tokio::spawn(async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            send(&c, Method::GET, &url, &h, "").await
        })
    })
    .collect()
}

async fn answers(tasks: Vec<tokio::task::JoinHandle<Resp>>) -> Vec<Resp> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_whose_flow_reads_authorization_never_share_a_run() {
    let gate = Gate::start().await;
    let gw = gateway_at(GATEWAY, &gate).await;
    // Two users, four requests each: one per user first, then the other six at once.
    let headers = |i: usize| {
        vec![
            ("authorization".into(), format!("user-{}", i % 2)),
            ("x-request-id".into(), format!("coalesce-users-{i}")),
        ]
    };
    let mut tasks = spawn_some(&gw, "/me", 0..2, headers);
    wait_until("one run per user", || gate.calls() == 2).await;
    tasks.extend(spawn_some(&gw, "/me", 2..8, headers));
    wait_until("one run per user, the others joined", || {
        gate.calls() == 2 && count(&gw, "GET /me", "joined") == 6
    })
    .await;
    gate.set(true);
    for (i, r) in answers(tasks).await.into_iter().enumerate() {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.json()["user"], format!("user-{}", i % 2), "request {i}");
    }
    assert_eq!(gate.calls(), 2, "one backend call per user");
    let s = status(&gw, "GET /me");
    assert_eq!(
        (s["runs"].as_u64(), s["coalesced"].as_u64()),
        (Some(2), Some(6))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_the_flow_does_not_read_never_splits_a_run() {
    let gate = Gate::start().await;
    let gw = gateway_at(GATEWAY, &gate).await;
    const N: usize = 16;
    let headers = |i: usize| {
        vec![
            ("x-request-id".into(), format!("coalesce-rid-{i}")),
            (
                "traceparent".into(),
                format!("00-{:032x}-{:016x}-01", i + 1, i + 1),
            ),
            ("cookie".into(), format!("session={i}")),
        ]
    };
    let mut tasks = spawn_some(&gw, "/items/7", 0..1, headers);
    wait_until("the first request's run is in flight", || gate.calls() == 1).await;
    tasks.extend(spawn_some(&gw, "/items/7", 1..N, headers));
    wait_until("one run, every other request joined it", || {
        gate.calls() == 1 && count(&gw, "GET /items/{id}", "joined") == N as u64 - 1
    })
    .await;
    gate.set(true);
    let answers = answers(tasks).await;
    for (i, r) in answers.iter().enumerate() {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.json(), serde_json::json!({"item": "/items/7", "call": 1}));
        assert_eq!(r.header("x-item"), Some("7"), "respond.headers are shared");
        assert_eq!(
            r.header("x-request-id"),
            Some(format!("coalesce-rid-{i}").as_str()),
            "each answer carries its own request id"
        );
    }
    assert_eq!(gate.calls(), 1, "one backend call for {N} requests");
    let s = status(&gw, "GET /items/{id}");
    assert_eq!(s["runs"], 1);
    assert_eq!(s["in_flight"], 0, "nothing is kept after the run");
    // Another id is another answer; and the metric counts joined requests per route.
    gate.set(true);
    let r = get(&format!("http://{}/items/8", gw.addr)).await;
    assert_eq!(r.json()["item"], "/items/8");
    let admin = gw.admin_addr.unwrap();
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    assert!(
        metrics.contains(&format!(
            "fanout_requests_coalesced_total{{route=\"/items/{{id}}\"}} {}",
            N - 1
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_with_a_shorter_deadline_shares_the_run_and_answers_by_its_own_deadline() {
    let gate = Gate::start().await;
    let gw = gateway_at(GATEWAY, &gate).await;
    let url = format!("http://{}/slow", gw.addr);
    let c = client(false);
    // The first request's run ends at its deadline, 10 s from now.
    let first = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { send(&c, Method::GET, &url, &[], "").await })
    };
    wait_until("the first run called the backend", || gate.calls() == 1).await;
    // A request that may wait 300 ms joins that run, and answers its own 504 at its own
    // deadline, quoting its own wait.
    let short = send(&c, Method::GET, &url, &[("x-request-timeout", "300")], "").await;
    assert_eq!(
        short.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        short.text()
    );
    assert_eq!(short.code(), "deadline_exceeded");
    let message = short.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("run of an identical request"), "{message}");
    assert_eq!(
        gate.calls(),
        1,
        "it joined the run rather than start its own"
    );
    let s = status(&gw, "GET /slow");
    assert_eq!(
        (s["runs"].as_u64(), s["joined"].as_u64()),
        (Some(1), Some(1))
    );
    gate.set(true);
    let a = first.await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(gate.calls(), 1);
    let s = status(&gw, "GET /slow");
    assert_eq!(
        (s["runs"].as_u64(), s["coalesced"].as_u64()),
        (Some(1), Some(0))
    );
}

/// Issue 46: a client whose short deadline leads a run must not fail the requests with more
/// time that joined it — with whole-request coalescing (`/slow`) and with in-flight dedup alone
/// (`/dedup`, a route that does not coalesce, on a backend that dedups).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_with_more_time_than_a_run_cut_short_by_its_leaders_deadline_runs_again() {
    let gate = Gate::start().await;
    let yaml = format!(
        "{GATEWAY}  - path: /dedup\n    coalesce: false\n    flow:\n      d: {{ http: {{ backend: gate_dedup, path: '\"/dedup\"' }} }}\n    respond: {{ body: '{{call: $d.call}}' }}\n"
    )
    // A backend of its own for `/dedup`: its shared calls know nothing of `/slow`'s.
    .replace(
        "defaults:",
        "  gate_dedup: { url: \"http://${GATE_ADDR}\", timeout: 10s }\ndefaults:",
    );
    let gw = gateway_at(&yaml, &gate).await;
    let c = client(false);
    for path in ["/slow", "/dedup"] {
        gate.set(false);
        let before = gate.calls();
        let url = format!("http://{}{path}", gw.addr);
        // The leader may wait 2 s; the joiner has the route's 10 s.
        let leader = {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                send(&c, Method::GET, &url, &[("x-request-timeout", "2000")], "").await
            })
        };
        wait_until("the leader called the backend", || {
            gate.calls() == before + 1
        })
        .await;
        let joiner = {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { send(&c, Method::GET, &url, &[], "").await })
        };
        // The leader's run (or call) ends at its 2 s; the joiner, with ~8 s left, runs again.
        let l = leader.await.unwrap();
        assert_eq!(
            l.status,
            StatusCode::GATEWAY_TIMEOUT,
            "{path}: {}",
            l.text()
        );
        wait_until("the joiner ran again", || gate.calls() == before + 2).await;
        gate.set(true);
        let j = joiner.await.unwrap();
        assert_eq!(j.status, StatusCode::OK, "{path}: {}", j.text());
        assert_eq!(j.json()["call"], before + 2, "{path}: its own run's call");
    }
    let s = status(&gw, "GET /slow");
    assert_eq!(
        (
            s["runs"].as_u64(),
            s["joined"].as_u64(),
            s["reruns"].as_u64(),
            s["coalesced"].as_u64()
        ),
        (Some(2), Some(1), Some(1), Some(0)),
        "{s}"
    );
    let dedup = &gw.gateway.status_json()["backends"]["gate_dedup"]["dedup"];
    assert_eq!(
        (dedup["joined"].as_u64(), dedup["reruns"].as_u64()),
        (Some(1), Some(1)),
        "{dedup}"
    );
}

/// A backend that answers `{"call": n}` 300 ms after each call (a real delay: the requests
/// overlap as they would in production).
async fn slow_backend() -> (SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let c = c.clone();
            let svc = hyper::service::service_fn(move |_req: http::Request<Incoming>| {
                let call = c.fetch_add(1, SeqCst) + 1;
                async move {
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                    let body = serde_json::json!({ "call": call }).to_string();
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        bytes::Bytes::from(body),
                    )))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    (addr, calls)
}

/// Issue 46's attack: one client sends a hot path with `x-request-timeout: 100` every 40 ms
/// while six clients with the full budget ask for the same path; not one of theirs fails —
/// with coalescing (`/hot`), and with in-flight dedup alone (`/hot-dedup`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_short_deadlines_on_a_hot_path_fails_no_one_else() {
    let (addr, calls) = slow_backend().await;
    let yaml = r#"
backends:
  slow: { url: "http://${GATE_ADDR}", timeout: 10s }
defaults: { deadline: 10s }
routes:
  - path: /hot
    flow:
      h: { http: { backend: slow, path: '"/hot"' } }
    respond: { body: '$h' }
  - path: /hot-dedup
    coalesce: false
    flow:
      h: { http: { backend: slow, path: '"/hot-dedup"' } }
    respond: { body: '$h' }
"#;
    let a = addr.to_string();
    let lookup = |n: &str| (n == "GATE_ADDR").then(|| a.clone());
    let gw = start_gateway(
        load_gateway("fanout.yaml", yaml, &lookup).unwrap(),
        "127.0.0.1:0",
        Some("127.0.0.1:0"),
    )
    .await
    .unwrap();
    for path in ["/hot", "/hot-dedup"] {
        let url = format!("http://{}{path}", gw.addr);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let attacker = {
            let (url, stop) = (url.clone(), stop.clone());
            tokio::spawn(async move {
                let c = client(false);
                let mut tick = tokio::time::interval(std::time::Duration::from_millis(40));
                let mut sent = Vec::new();
                while !stop.load(SeqCst) && sent.len() < 200 {
                    tick.tick().await;
                    let (c, url) = (c.clone(), url.clone());
                    sent.push(tokio::spawn(async move {
                        send(&c, Method::GET, &url, &[("x-request-timeout", "100")], "").await
                    }));
                }
                for s in sent {
                    let _ = s.await;
                }
            })
        };
        let clients: Vec<_> = (0..6)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    let c = client(false);
                    let mut statuses = Vec::new();
                    for _ in 0..4 {
                        let r = send(&c, Method::GET, &url, &[], "").await;
                        statuses.push((r.status, r.text()));
                    }
                    statuses
                })
            })
            .collect();
        let mut failed = Vec::new();
        for c in clients {
            for (status, text) in c.await.unwrap() {
                if status != StatusCode::OK {
                    failed.push(format!("{status}: {text}"));
                }
            }
        }
        stop.store(true, SeqCst);
        attacker.await.unwrap();
        assert!(
            failed.is_empty(),
            "{path}: full-budget requests failed: {failed:?}"
        );
    }
    assert!(calls.load(SeqCst) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_partial_answers_are_shared_and_not_kept_after_the_run() {
    let gate = Gate::start().await;
    let gw = gateway_at(GATEWAY, &gate).await;
    const N: usize = 4;
    let ids = |i: usize| vec![("x-request-id".into(), format!("coalesce-fail-{i}"))];
    // The leader first, the joiners once its run is in flight (see `spawn_some`).
    let mut tasks = spawn_some(&gw, "/fail", 0..1, ids);
    wait_until("the failing run called the backend", || gate.calls() == 1).await;
    tasks.extend(spawn_some(&gw, "/fail", 1..N, ids));
    wait_until("one failing run, joined", || {
        gate.calls() == 1 && count(&gw, "GET /fail", "joined") == N as u64 - 1
    })
    .await;
    gate.set(true);
    for (i, r) in answers(tasks).await.into_iter().enumerate() {
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["code"], "backend_status");
        assert_eq!(e["step"], "f");
        assert_eq!(
            e["request_id"],
            format!("coalesce-fail-{i}"),
            "each error body names its own request"
        );
        assert_eq!(
            r.header("x-request-id"),
            Some(format!("coalesce-fail-{i}").as_str())
        );
    }
    assert_eq!(gate.calls(), 1);
    // The failure is not kept: the next request runs the flow again.
    let r = get(&format!("http://{}/fail", gw.addr)).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(gate.calls(), 2, "a new run after the failed one");

    // A partial answer is partial for every request that shares it.
    gate.set(false);
    let before = gate.calls();
    let mut tasks = spawn_some(&gw, "/partial", 0..1, |_| Vec::new());
    wait_until("the partial run called the backend twice", || {
        gate.calls() == before + 2
    })
    .await;
    tasks.extend(spawn_some(&gw, "/partial", 1..N, |_| Vec::new()));
    wait_until("one partial run, joined", || {
        gate.calls() == before + 2 && count(&gw, "GET /partial", "joined") == N as u64 - 1
    })
    .await;
    gate.set(true);
    for r in answers(tasks).await {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(
            r.json()["_partial"],
            serde_json::json!(["extra"]),
            "{}",
            r.text()
        );
        assert_eq!(r.header("x-fanout-partial"), Some("extra"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiners_of_a_request_whose_client_went_away_run_again_once() {
    let gate = Gate::start().await;
    let gw = gateway_at(GATEWAY, &gate).await;
    // The first request on a connection of its own, which the test then closes.
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    conn.write_all(b"GET /items/1 HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    wait_until("the first run called the backend", || gate.calls() == 1).await;
    const N: usize = 5;
    let joiners = spawn_all(&gw, "/items/1", N, |_| Vec::new());
    wait_until("the others joined", || {
        count(&gw, "GET /items/{id}", "joined") == N as u64
    })
    .await;
    drop(conn);
    // One of them runs the flow again; the others join that run.
    wait_until("one joiner ran again, the others joined it", || {
        count(&gw, "GET /items/{id}", "reruns") == 1
            && gate.calls() == 2
            && count(&gw, "GET /items/{id}", "joined") == 2 * N as u64 - 1
    })
    .await;
    gate.set(true);
    for r in answers(joiners).await {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.json()["call"], 2, "answered by the one rerun");
    }
    assert_eq!(
        gate.calls(),
        2,
        "backend calls: the first run and one rerun"
    );
    let s = status(&gw, "GET /items/{id}");
    assert_eq!(
        (
            s["runs"].as_u64(),
            s["reruns"].as_u64(),
            s["coalesced"].as_u64()
        ),
        (Some(2), Some(1), Some(N as u64 - 1)),
        "{s}"
    );
    // The metric agrees with the status: requests answered by another request's run.
    let admin = gw.admin_addr.unwrap();
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    assert!(
        metrics.contains(&format!(
            "fanout_requests_coalesced_total{{route=\"/items/{{id}}\"}} {}",
            N - 1
        )),
        "{metrics}"
    );
}

const WRITES: &str = r#"
backends:
  gate: { url: "http://${GATE_ADDR}", timeout: 10s }
defaults: { deadline: 10s }
routes:
  - path: /save
    flow:
      read: { http: { backend: gate, path: '"/read"' } }
      save: { http: { backend: gate, method: POST, path: '"/save"', body: '{}' } }
    respond: { body: '$save' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_a_step_that_writes_is_never_coalesced() {
    let gate = Gate::start().await;
    let gw = gateway_at(WRITES, &gate).await;
    const N: usize = 4;
    let tasks = spawn_all(&gw, "/save", N, |_| Vec::new());
    // Every request makes its own calls (the GETs are shared by dedup; the POSTs never are).
    wait_until("every request runs the flow", || gate.calls() > N as u64).await;
    gate.set(true);
    for r in answers(tasks).await {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    assert!(status(&gw, "GET /save").is_null(), "not a coalescing route");
    // `coalesce: true` on it is an error at its line, naming the step that writes.
    let yaml = WRITES.replace("  - path: /save\n", "  - path: /save\n    coalesce: true\n");
    let e = load_gateway("fanout.yaml", &yaml, &|_| Some("127.0.0.1:1".into()))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("fanout.yaml:7:"), "{e}");
    assert!(e.contains("step `save`") && e.contains("POST"), "{e}");
    // And `coalesce: false` turns it off on a route that is eligible.
    let off = GATEWAY.replace("  - path: /me\n", "  - path: /me\n    coalesce: false\n");
    let gw = gateway_at(&off, &gate).await;
    assert!(status(&gw, "GET /me").is_null());
    assert!(!status(&gw, "GET /slow").is_null());
    // `defaults: {coalesce: false}` turns it off for every route that does not say (the lab's
    // equal-work setting); a route's own `coalesce: true` still turns it on.
    let on = "  - path: /slow\n    coalesce: true\n";
    let defaults_off = GATEWAY
        .replace(
            "defaults: { deadline: 10s }",
            "defaults: { deadline: 10s, coalesce: false }",
        )
        .replace("  - path: /slow\n", on);
    let gw = gateway_at(&defaults_off, &gate).await;
    assert!(status(&gw, "GET /me").is_null());
    assert!(!status(&gw, "GET /slow").is_null());
}
