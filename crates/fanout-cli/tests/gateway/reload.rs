//! Config reload (hot, in process): under load no request fails while the config is swapped every
//! 100 ms; requests in flight finish on the plan they started with; backends whose config did not
//! change keep their state (their cache here); a broken config is refused with its FILE:LINE:COL
//! messages while the old one keeps serving. The SIGHUP / file-watch triggers and memory over
//! 200 reloads are tested on a real process in `signals.rs`.

use crate::support::{config, gateway};
use fanout_proxy::reload::ReloadError;
use fanout_testkit::*;
use http::Method;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - path: /n
        latency: 2ms
        body: '{n: 1}'
      - path: /slow
        latency: 1500ms
        body: '{slow: true}'
  b:
    listen: "${B_ADDR}"
    routes:
      - path: /c
        body: '{c: 1}'
"#;

/// Config `v` (`"a"` or `"b"`): the answer says which config served it; `a_timeout` changes
/// backend `a` (so its stack is rebuilt when it differs).
fn gateway_config(v: &str, a_timeout: &str, cache_ttl: &str) -> String {
    format!(
        r#"
backends:
  a: {{ url: "http://${{A_ADDR}}", timeout: {a_timeout} }}
  b: {{ url: "http://${{B_ADDR}}", cache: {{ ttl: {cache_ttl} }} }}
routes:
  - path: /v
    flow:
      x: {{ http: {{ backend: a, path: '"/n"' }} }}
    respond: {{ body: '{{v: "{v}", n: $x.n}}' }}
  - path: /slow
    deadline: 10s
    flow:
      s: {{ http: {{ backend: a, path: '"/slow"' }} }}
    respond: {{ body: '{{v: "{v}"}}' }}
  - path: /c
    flow:
      c: {{ http: {{ backend: b, path: '"/c"' }} }}
    respond: {{ body: '{{v: "{v}", c: $c.c}}' }}
"#
    )
}

/// Clients sending `GET /v` in a loop until `stop`: (answers 200 by config version, failures).
struct Load {
    stop: Arc<AtomicBool>,
    a: Arc<AtomicU64>,
    b: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: std::net::SocketAddr, clients: usize) -> Load {
        let (stop, a, b, failed) = Default::default();
        let mut load = Load {
            stop,
            a,
            b,
            failed,
            tasks: Vec::new(),
        };
        for _ in 0..clients {
            let (stop, a, b, failed) = (
                load.stop.clone(),
                load.a.clone(),
                load.b.clone(),
                load.failed.clone(),
            );
            let url = format!("http://{addr}/v");
            load.tasks.push(tokio::spawn(async move {
                let c = client(false);
                while !stop.load(Ordering::Relaxed) {
                    let r = send(&c, Method::GET, &url, &[], "").await;
                    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap_or_default();
                    match (r.status.as_u16(), v["v"].as_str()) {
                        (200, Some("a")) => a.fetch_add(1, Ordering::Relaxed),
                        (200, Some("b")) => b.fetch_add(1, Ordering::Relaxed),
                        _ => {
                            eprintln!("failed request: {} {}", r.status, r.text());
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            }));
        }
        load
    }

    fn answered(&self) -> u64 {
        self.a.load(Ordering::Relaxed) + self.b.load(Ordering::Relaxed)
    }

    /// Stop the clients; (answers by config a, by config b, failures).
    async fn finish(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        (
            self.a.load(Ordering::Relaxed),
            self.b.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_every_100ms_for_10s_under_load_fails_no_request() {
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_config("a", "2s", "10s"), &s).await;
    let configs = [
        config(&gateway_config("b", "3s", "10s"), &s),
        config(&gateway_config("a", "2s", "10s"), &s),
    ];
    let load = Load::start(gw.addr, 4);
    wait_until("the first answers", || load.answered() > 0).await;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    for i in 0..100 {
        tick.tick().await;
        let report = gw
            .gateway
            .reload(configs[i % 2].clone())
            .await
            .unwrap_or_else(|e| panic!("reload {i}: {e}"));
        assert_eq!(report.rebuilt, vec!["a".to_string()], "only `a` changed");
        assert_eq!(report.kept, vec!["b".to_string()]);
    }
    let (a, b, failed) = load.finish().await;
    assert_eq!(
        failed, 0,
        "no request may fail during reloads ({a} + {b} answered)"
    );
    assert!(a > 0 && b > 0, "both configs served: a={a} b={b}");
    assert_eq!(gw.gateway.reload_counts().0, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_on_the_config_it_started_with() {
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_config("a", "5s", "10s"), &s).await;
    let url = format!("http://{}/slow", gw.addr);
    let slow = tokio::spawn(async move { get(&url).await });
    // The stub counts a request when it answers; the gateway's backend counts it when sent.
    let st = gw.gateway.clone();
    wait_until("the slow call in flight", move || {
        st.status_json()["backends"]["a"]["addresses"][0]["in_flight"] == 1
    })
    .await;
    gw.gateway
        .reload(config(&gateway_config("b", "5s", "10s"), &s))
        .await
        .unwrap();
    let now = get(&format!("http://{}/v", gw.addr)).await;
    assert_eq!(now.json()["v"], "b", "new requests use the new config");
    let old = slow.await.unwrap();
    assert_eq!(old.status.as_u16(), 200, "{}", old.text());
    assert_eq!(
        old.json()["v"],
        "a",
        "the request in flight kept its config"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_whose_config_did_not_change_keep_their_state() {
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_config("a", "2s", "10s"), &s).await;
    let url = format!("http://{}/c", gw.addr);
    assert_eq!(get(&url).await.json()["c"], 1);
    assert_eq!(calls(&s, "b"), 1);

    // `a` changes, `b` (with the cache) does not: its cache still answers.
    let report = gw
        .gateway
        .reload(config(&gateway_config("b", "3s", "10s"), &s))
        .await
        .unwrap();
    assert_eq!(report.kept, vec!["b".to_string()]);
    let r = get(&url).await;
    assert_eq!(r.json()["v"], "b");
    assert_eq!(calls(&s, "b"), 1, "served from the cache the reload kept");
    let hits = &gw.gateway.status_json()["caches"]["b"]["answers"];
    assert_eq!(hits["hits"], 1, "{hits}");

    // `b` changes: a new stack, an empty cache.
    let report = gw
        .gateway
        .reload(config(&gateway_config("b", "3s", "11s"), &s))
        .await
        .unwrap();
    assert_eq!(report.rebuilt, vec!["b".to_string()]);
    get(&url).await;
    assert_eq!(
        calls(&s, "b"),
        2,
        "the changed backend starts with an empty cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_during_load_is_refused_and_the_old_one_keeps_serving() {
    let s = stubs(STUBS).await;
    let gw = gateway(&gateway_config("a", "2s", "10s"), &s).await;
    let load = Load::start(gw.addr, 3);
    wait_until("the first answers", || load.answered() > 0).await;

    // A step naming a backend that does not exist: a compile error with its position.
    let broken = gateway_config("b", "2s", "10s").replace("backend: a,", "backend: nope,");
    let cfg = config(&broken, &s);
    let err = gw.gateway.reload(cfg).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ReloadError::Config(_)), "{text}");
    assert!(
        text.contains("fanout.yaml:") && text.contains("nope"),
        "{text}"
    );

    // A file that does not parse, through the file path.
    let file = std::env::temp_dir().join(format!("fanout-reload-{}.yaml", std::process::id()));
    std::fs::write(&file, "routes: [ {path: /x, flow: ").unwrap();
    let err = gw
        .gateway
        .reload_file(file.to_str().unwrap(), |_| None)
        .await
        .unwrap_err();
    let _ = std::fs::remove_file(&file);
    assert!(err.to_string().contains("fanout-reload-"), "{err}");

    let seen = load.answered();
    let l = &load;
    wait_until("more answers after the refusals", || {
        l.answered() > seen + 10
    })
    .await;
    let (a, b, failed) = load.finish().await;
    assert_eq!(failed, 0);
    assert_eq!(b, 0, "the refused config never served");
    assert!(a > 0);
    let status = gw.gateway.status_json();
    assert_eq!(status["config"]["failed"], 2, "{status}");
    assert_eq!(status["config"]["reloads"], 0, "{status}");
    let last = status["config"]["last_error"].as_str().unwrap_or("");
    assert!(last.contains("fanout-reload-"), "the last refusal: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_data_is_kept_loaded_anew_or_its_failure_refuses_the_reload() {
    let s = stubs(
        r#"
services:
  r:
    listen: "${R_ADDR}"
    routes:
      - path: /one
        body: '{n: 1}'
      - path: /two
        body: '{n: 2}'
"#,
    )
    .await;
    let cfg = |path: &str, backend_url: &str| {
        format!(
            r#"
backends:
  r: {{ url: "{backend_url}" }}
reference:
  d: {{ http: {{ backend: r, path: '"{path}"' }}, refresh: 1h }}
routes:
  - path: /d
    respond: {{ body: '$ref.d' }}
"#
        )
    };
    let gw = gateway(&cfg("/one", "http://${R_ADDR}"), &s).await;
    let url = format!("http://{}/d", gw.addr);
    assert_eq!(get(&url).await.json()["n"], 1);
    let loads = calls(&s, "r");

    // Unchanged datasets and backend: kept, not fetched again.
    let mut other_route = cfg("/one", "http://${R_ADDR}");
    other_route += "  - path: /extra\n    respond: { body: '1' }\n";
    let report = gw.gateway.reload(config(&other_route, &s)).await.unwrap();
    assert!(report.reference_kept);
    assert_eq!(calls(&s, "r"), loads);

    // A changed dataset is loaded before the new config serves.
    let report = gw
        .gateway
        .reload(config(&cfg("/two", "http://${R_ADDR}"), &s))
        .await
        .unwrap();
    assert!(!report.reference_kept);
    assert_eq!(get(&url).await.json()["n"], 2);

    // A required dataset that cannot load: refused, the old data keeps serving.
    let err = gw
        .gateway
        .reload(config(&cfg("/one", "http://127.0.0.1:9"), &s))
        .await
        .unwrap_err();
    assert!(matches!(err, ReloadError::Reference(_)), "{err}");
    assert_eq!(get(&url).await.json()["n"], 2);
}
