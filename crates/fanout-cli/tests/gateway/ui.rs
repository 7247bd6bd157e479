//! The live page (`/ui` on the admin listener, `admin.ui`): its data endpoint describes every
//! route's flow graph with per-step numbers and keeps the last failed and slow requests with
//! their step waterfalls (bounded, the failing step named, no backend body); the page is never on
//! the client port; in headless Chromium (driven over WebDriver by chromedriver) it draws every
//! route of the examples, its step numbers change under load, and a failed request appears with
//! its failing step marked.

use crate::support::{gateway, gateway_with};
use fanout_testkit::*;
use http::Method;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn example(name: &str, file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The hh-vacancies example's stubs, with one way to fail: `text=fail` finds vacancy 666, whose
/// backend answers 500 with a body the page must never show.
fn hh_stubs() -> String {
    let stubs = example("hh-vacancies", "stubs.yaml");
    let from = r#"then {total: 0, ids: []}"#;
    assert!(stubs.contains(from), "the example's search stub changed");
    let mut stubs = stubs.replace(
        from,
        r#"then {total: 0, ids: []}
          elif ($request.query.text // "") == "fail" then {total: 1, ids: [666]}"#,
    );
    // The vacancies service's routes are the file's last list.
    stubs.push_str(
        "      - path: /vacancies/666\n        status: 500\n        body: '{secret: \"SECRET-BODY-666\"}'\n",
    );
    stubs
}

async fn state(admin: std::net::SocketAddr) -> Value {
    let r = get(&format!("http://{admin}/ui/api/state")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json()
}

fn route<'a>(state: &'a Value, name: &str) -> &'a Value {
    state["routes"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("no route {name} in {:#}", state["routes"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_has_every_route_of_hh_vacancies_as_a_graph_with_step_numbers() {
    let s = stubs(&hh_stubs()).await;
    let gw = gateway(&example("hh-vacancies", "fanout.yaml"), &s).await;
    let admin = gw.admin_addr.expect("admin listener");
    for _ in 0..5 {
        let r = get(&format!("http://{}/vacancies?text=rust", gw.addr)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let st = state(admin).await;
    assert_eq!(st["routes"].as_array().map(Vec::len), Some(1), "{st:#}");
    let r = route(&st, "GET /vacancies");
    assert_eq!(r["path"], "/vacancies");
    let steps = r["steps"].as_array().unwrap();
    let names: Vec<&str> = steps.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["found", "details"]);
    // `details` reads `$found`: it waits for it, one level down, under a `when`, per element.
    assert_eq!(steps[0]["waits_for"], json!([]));
    assert_eq!(steps[0]["level"], 1);
    assert_eq!(steps[0]["backend"], "search");
    assert_eq!(steps[1]["waits_for"], json!([0]));
    assert_eq!(steps[1]["level"], 2);
    assert_eq!(steps[1]["when"], true);
    assert_eq!(steps[1]["for_each"], true);
    assert_eq!(steps[1]["backend"], "vacancies");
    // Cumulative numbers: five runs, each step five times, none failed; buckets per bound.
    let stats = &r["stats"];
    assert_eq!(stats["count"], 5, "{stats:#}");
    assert_eq!(stats["failed"], 0);
    let bounds = st["bounds_s"].as_array().unwrap().len();
    for s in stats["steps"].as_array().unwrap() {
        assert_eq!(s["count"], 5, "{stats:#}");
        assert_eq!(s["failed"], 0);
        assert_eq!(s["buckets"].as_array().unwrap().len(), bounds);
        assert!(s["sum_s"].as_f64().unwrap() > 0.0);
    }
    // The status sections and the config generation come along.
    assert!(st["status"]["backends"]["search"].is_object(), "{st:#}");
    assert!(st["status"]["admission"].is_object());
    assert_eq!(st["config"]["generation"], 1);
    assert_eq!(st["recent"]["failed"]["requests"], json!([]));
    gw.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_is_kept_with_its_failing_step_and_without_the_backend_body() {
    let s = stubs(&hh_stubs()).await;
    let mut config = example("hh-vacancies", "fanout.yaml");
    config.push_str("admin:\n  ui: { failed_requests: 3, record_per_second: 1000 }\n");
    let gw = gateway(&config, &s).await;
    let admin = gw.admin_addr.expect("admin listener");
    let c = client(false);
    for i in 0..6 {
        let rid = format!("ui-failed-{i}");
        let r = send(
            &c,
            Method::GET,
            &format!("http://{}/vacancies?text=fail&token=hunter2", gw.addr),
            &[("x-request-id", rid.as_str())],
            "",
        )
        .await;
        assert_eq!(r.status, 502, "{}", r.text());
    }
    let ok = get(&format!("http://{}/vacancies?text=rust", gw.addr)).await;
    assert_eq!(ok.status, 200);
    let st = state(admin).await;
    let failed = &st["recent"]["failed"];
    assert_eq!(failed["capacity"], 3);
    assert_eq!(failed["seen"], 6, "{failed:#}");
    let reqs = failed["requests"].as_array().unwrap();
    let ids: Vec<&str> = reqs
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["ui-failed-5", "ui-failed-4", "ui-failed-3"],
        "the newest three"
    );
    let r = &reqs[0];
    assert_eq!(r["route"], "GET /vacancies");
    assert_eq!(r["path"], "/vacancies", "never the query string");
    assert_eq!(r["status"], 502);
    assert_eq!(r["failed_step"], "details");
    assert_eq!(r["code"], "backend_status");
    assert!(
        r["error"].as_str().unwrap().contains("vacancies"),
        "names the backend: {r:#}"
    );
    // The waterfall: `found` then `details`, which failed, in order, within the request.
    let steps = r["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{r:#}");
    assert_eq!(steps[0]["name"], "found");
    assert_eq!(steps[0]["outcome"], "ok");
    assert_eq!(steps[1]["name"], "details");
    assert_eq!(steps[1]["outcome"], "failed");
    assert!(steps[1]["calls"].as_u64() >= Some(1), "{r:#}");
    let (s0, e0) = (steps[0]["start_us"].as_u64(), steps[0]["end_us"].as_u64());
    let (s1, e1) = (steps[1]["start_us"].as_u64(), steps[1]["end_us"].as_u64());
    assert!(s0 <= e0 && e0 <= s1 && s1 <= e1, "{r:#}");
    assert!(e1 <= r["total_us"].as_u64(), "{r:#}");
    // Step numbers count the failure; nothing on the page carries the backend's body or the
    // query string.
    let details = &route(&st, "GET /vacancies")["stats"]["steps"][1];
    assert_eq!(details["failed"], 6, "{details:#}");
    let text = st.to_string();
    assert!(
        !text.contains("SECRET-BODY"),
        "a backend body leaked: {text}"
    );
    assert!(!text.contains("hunter2"), "the query string leaked: {text}");
    gw.shutdown().await.unwrap();
}

/// Issue 69 §19: a poll sends the recorded requests that changed, not the whole lists: with
/// `?after=<the last cursor>` only those recorded since, and `oldest_seq` to drop what left the
/// ring — so a poll's cost does not grow with the lists' sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_gets_only_the_requests_recorded_since_the_last_one() {
    let s = stubs(&hh_stubs()).await;
    let mut config = example("hh-vacancies", "fanout.yaml");
    config.push_str("admin:\n  ui: { failed_requests: 4, record_per_second: 1000 }\n");
    let gw = gateway(&config, &s).await;
    let admin = gw.admin_addr.expect("admin listener");
    let c = client(false);
    let fail = |i: usize| {
        let (c, addr) = (c.clone(), gw.addr);
        async move {
            let rid = format!("ui-delta-{i}");
            let r = send(
                &c,
                Method::GET,
                &format!("http://{addr}/vacancies?text=fail"),
                &[("x-request-id", rid.as_str())],
                "",
            )
            .await;
            assert_eq!(r.status, 502);
        }
    };
    for i in 0..6 {
        fail(i).await;
    }
    let at = |after: u64| {
        let url = format!("http://{admin}/ui/api/state?after={after}");
        async move {
            let r = get(&url).await;
            assert_eq!(r.status, 200);
            r.json()["recent"].clone()
        }
    };
    let ids = |rec: &Value| -> Vec<String> {
        rec["failed"]["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["request_id"].as_str().unwrap().to_string())
            .collect()
    };
    let all = at(0).await;
    assert_eq!(
        ids(&all),
        ["ui-delta-5", "ui-delta-4", "ui-delta-3", "ui-delta-2"]
    );
    let cursor = all["cursor"].as_u64().unwrap();
    assert_eq!(cursor, 6);
    assert_eq!(all["failed"]["oldest_seq"], 3);
    // Nothing new: nothing sent.
    let none = at(cursor).await;
    assert!(ids(&none).is_empty(), "{none:#}");
    assert_eq!(none["cursor"], cursor);
    // Two more: only those two; the oldest kept moves on.
    fail(6).await;
    fail(7).await;
    let two = at(cursor).await;
    assert_eq!(ids(&two), ["ui-delta-7", "ui-delta-6"]);
    assert_eq!(two["cursor"], 8);
    assert_eq!(two["failed"]["oldest_seq"], 5);
    assert_eq!(two["failed"]["requests"][0]["seq"], 8);
    // A cursor that is no number is 0: everything kept.
    let r = get(&format!("http://{admin}/ui/api/state?after=x")).await;
    assert_eq!(
        r.json()["recent"]["failed"]["requests"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_error_detail_the_page_shows_what_the_log_line_has() {
    let s = stubs(&hh_stubs()).await;
    let mut config = example("hh-vacancies", "fanout.yaml");
    config.push_str("admin:\n  ui: { error_detail: true }\n");
    let gw = gateway(&config, &s).await;
    let r = get(&format!("http://{}/vacancies?text=fail", gw.addr)).await;
    assert_eq!(r.status, 502);
    let st = state(gw.admin_addr.unwrap()).await;
    let error = st["recent"]["failed"]["requests"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("SECRET-BODY-666"), "{st:#}");
    gw.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_are_kept_past_the_threshold() {
    let s = stubs(&hh_stubs()).await;
    let mut config = example("hh-vacancies", "fanout.yaml");
    // Every request takes at least the search stub's 5 ms.
    config.push_str("admin:\n  ui: { slow_threshold: 1ms, slow_requests: 2 }\n");
    let gw = gateway(&config, &s).await;
    for _ in 0..3 {
        let r = get(&format!("http://{}/vacancies?text=rust", gw.addr)).await;
        assert_eq!(r.status, 200);
    }
    let st = state(gw.admin_addr.unwrap()).await;
    let slow = &st["recent"]["slow"];
    assert_eq!(slow["threshold_ms"], 1.0);
    assert_eq!(slow["seen"], 3, "{slow:#}");
    let reqs = slow["requests"].as_array().unwrap();
    assert_eq!(reqs.len(), 2, "bounded: {slow:#}");
    assert_eq!(reqs[0]["status"], 200);
    assert_eq!(reqs[0]["failed_step"], Value::Null);
    assert!(reqs[0]["total_us"].as_u64() >= Some(1000));
    assert_eq!(st["recent"]["failed"]["seen"], 0);
    gw.shutdown().await.unwrap();
}

/// A backend that always answers 503 (retried) and one slower than the hedge delay (hedged).
const RETRY_HEDGE_STUBS: &str = r#"
services:
  svc:
    listen: "${SVC_ADDR}"
    routes:
      - { path: /down, status: 503, body: '{down: true}' }
      - { path: /slow, latency: 300ms, body: '{ok: true}' }
"#;

/// Routes on a backend with `retry` (three attempts) and one with `hedge` (after 20 ms, a budget
/// that grants the first hedge); `telemetry` inserted. Requests over 100 ms are kept as slow.
fn retry_hedge_config(telemetry: &str) -> String {
    format!(
        r#"
telemetry: {telemetry}
backends:
  down:
    url: "http://${{SVC_ADDR}}"
    retry: {{ attempts: 3, backoff: 1ms }}
  tail:
    url: "http://${{SVC_ADDR}}"
    hedge: {{ delay: 20ms, max_extra: 1.0 }}
routes:
  - path: /down
    coalesce: false
    flow:
      d: {{ http: {{ backend: down, path: '"/down"' }} }}
    respond: {{ body: '$d' }}
  - path: /slow
    coalesce: false
    flow:
      s: {{ http: {{ backend: tail, path: '"/slow"' }} }}
    respond: {{ body: '$s' }}
admin:
  ui: {{ slow_threshold: 100ms }}
"#
    )
}

/// The one step of the newest request in `list` (`failed` or `slow`) with id `rid`.
fn recorded_step(st: &Value, list: &str, rid: &str) -> Value {
    let reqs = st["recent"][list]["requests"].as_array().cloned();
    let r = reqs
        .unwrap_or_default()
        .into_iter()
        .find(|r| r["request_id"] == rid)
        .unwrap_or_else(|| panic!("{rid} not in the {list} list: {st:#}"));
    let steps = r["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), 1, "{r:#}");
    steps[0].clone()
}

async fn get_with_id(url: &str, rid: &str) -> Resp {
    send(
        &client(false),
        Method::GET,
        url,
        &[("x-request-id", rid)],
        "",
    )
    .await
}

/// A failed request's step says how many of its attempts were retries: 503 three times with
/// `retry: {attempts: 3}` is one call, three attempts, two retries, no hedge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_step_counts_its_retries() {
    let s = stubs(RETRY_HEDGE_STUBS).await;
    let gw = gateway(&retry_hedge_config("{}"), &s).await;
    let r = get_with_id(&format!("http://{}/down", gw.addr), "ui-retried").await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(
        route_calls(&s, "svc", "GET /down"),
        3,
        "three attempts sent"
    );
    let st = state(gw.admin_addr.unwrap()).await;
    let step = recorded_step(&st, "failed", "ui-retried");
    assert_eq!(step["name"], "d");
    assert_eq!(step["outcome"], "failed");
    assert_eq!(
        (
            &step["calls"],
            &step["attempts"],
            &step["retries"],
            &step["hedges"]
        ),
        (&json!(1), &json!(3), &json!(2), &json!(0)),
        "{step:#}"
    );
    gw.shutdown().await.unwrap();
}

/// A slow request's step says its call was hedged: a 300 ms backend, hedged after 20 ms, is one
/// call, two attempts, one hedged copy, no retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_step_counts_its_hedged_copy() {
    let s = stubs(RETRY_HEDGE_STUBS).await;
    let gw = gateway(&retry_hedge_config("{}"), &s).await;
    let r = get_with_id(&format!("http://{}/slow", gw.addr), "ui-hedged").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let st = state(gw.admin_addr.unwrap()).await;
    let step = recorded_step(&st, "slow", "ui-hedged");
    assert_eq!(step["outcome"], "ok");
    assert_eq!(
        (
            &step["calls"],
            &step["attempts"],
            &step["retries"],
            &step["hedges"]
        ),
        (&json!(1), &json!(2), &json!(0), &json!(1)),
        "{step:#}"
    );
    let hedge = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json()["backends"]["tail"]["hedge"]
        .clone();
    assert_eq!(hedge["hedges"], 1, "{hedge}");
    gw.shutdown().await.unwrap();
}

/// With tracing on, the steps are counted the same and the trace is unchanged: a span per
/// attempt, numbered, the hedged copy marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_on_retries_and_hedges_are_counted_and_traced() {
    let otlp = OtlpReceiver::start().await;
    let s = stubs(RETRY_HEDGE_STUBS).await;
    let telemetry = format!(
        r#"{{ tracing: {{ otlp_endpoint: "{}", sampling_ratio: 1.0, batch_delay: 10ms }} }}"#,
        otlp.endpoint()
    );
    let gw = gateway(&retry_hedge_config(&telemetry), &s).await;
    let r = get_with_id(&format!("http://{}/down", gw.addr), "ui-traced-retried").await;
    assert_eq!(r.status, 502, "{}", r.text());
    let r = get_with_id(&format!("http://{}/slow", gw.addr), "ui-traced-hedged").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let st = state(gw.admin_addr.unwrap()).await;
    let step = recorded_step(&st, "failed", "ui-traced-retried");
    assert_eq!(
        (
            &step["calls"],
            &step["attempts"],
            &step["retries"],
            &step["hedges"]
        ),
        (&json!(1), &json!(3), &json!(2), &json!(0)),
        "{step:#}"
    );
    let step = recorded_step(&st, "slow", "ui-traced-hedged");
    assert_eq!(
        (
            &step["calls"],
            &step["attempts"],
            &step["retries"],
            &step["hedges"]
        ),
        (&json!(1), &json!(2), &json!(0), &json!(1)),
        "{step:#}"
    );
    // The trace of each: its call spans (kind 3), one per attempt.
    let calls_of = |rid: &str, n: usize| {
        let server = otlp
            .spans()
            .into_iter()
            .find(|s| s.kind == 2 && s.attr("fanout.request_id") == Some(rid))?;
        let mut calls: Vec<(String, String)> = otlp
            .trace(&server.trace_id)
            .into_iter()
            .filter(|s| s.kind == 3)
            .map(|s| {
                let a = |k| s.attr(k).unwrap_or_default().to_string();
                (a("fanout.attempt"), a("fanout.hedge"))
            })
            .collect();
        calls.sort();
        (calls.len() >= n).then_some(calls)
    };
    wait_until("the retried request's three call spans", || {
        calls_of("ui-traced-retried", 3).is_some()
    })
    .await;
    assert_eq!(
        calls_of("ui-traced-retried", 3).unwrap_or_default(),
        [("1", "false"), ("2", "false"), ("3", "false")].map(|(a, h)| (a.into(), h.into()))
    );
    wait_until("the hedged request's two call spans", || {
        calls_of("ui-traced-hedged", 2).is_some()
    })
    .await;
    assert_eq!(
        calls_of("ui-traced-hedged", 2).unwrap_or_default(),
        [("1", "false"), ("1", "true")].map(|(a, h)| (a.into(), h.into()))
    );
    gw.shutdown().await.unwrap();
}

/// Requests of a matched route refused before their flow ran (401 authentication, 429 rate
/// limit, 413 body limit) are listed with the failed ones: status, code, no steps. A path
/// without a route (404) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_before_their_flow_are_listed_with_their_status_and_code() {
    let s = stubs(RETRY_HEDGE_STUBS).await;
    let gw = gateway(
        r#"
server: { max_body_bytes: 64 }
auth:
  providers:
    corp: { issuer: https://idp.test, hmac_secret: 0123456789abcdef0123456789abcdef }
rate_limits:
  once: { rate: 1/min, burst: 1 }
routes:
  - path: /private
    auth: { provider: corp }
    respond: { body: '{ok: true}' }
  - path: /limited
    rate_limit: [once]
    respond: { body: '{ok: true}' }
  - path: /echo
    method: POST
    respond: { body: '$request.body' }
admin:
  ui: { record_per_second: 1000 }
"#,
        &s,
    )
    .await;
    let c = client(false);
    let url = |p: &str| format!("http://{}{p}", gw.addr);
    let ask = |m: Method, p: &str, rid: &'static str, body: &'static str| {
        let (c, u) = (c.clone(), url(p));
        async move { send(&c, m, &u, &[("x-request-id", rid)], body).await }
    };
    let r = ask(Method::GET, "/private?token=hunter2", "ui-refused-401", "").await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        ask(Method::GET, "/limited", "ui-limited-ok", "")
            .await
            .status,
        200
    );
    let r = ask(Method::GET, "/limited", "ui-refused-429", "").await;
    assert_eq!(r.status, 429, "{}", r.text());
    let big: &'static str =
        r#"{"text": "a body well over the sixty-four bytes of server.max_body_bytes"}"#;
    let r = ask(Method::POST, "/echo", "ui-refused-413", big).await;
    assert_eq!(r.status, 413, "{}", r.text());
    let r = ask(Method::GET, "/nowhere", "ui-not-found", "").await;
    assert_eq!(r.status, 404);
    let st = state(gw.admin_addr.unwrap()).await;
    let failed = &st["recent"]["failed"];
    let reqs = failed["requests"].as_array().cloned().unwrap_or_default();
    let listed: Vec<(String, String, u64, String, usize)> = reqs
        .iter()
        .map(|r| {
            (
                r["request_id"].as_str().unwrap_or_default().to_string(),
                r["route"].as_str().unwrap_or_default().to_string(),
                r["status"].as_u64().unwrap_or_default(),
                r["code"].as_str().unwrap_or_default().to_string(),
                r["steps"].as_array().map_or(usize::MAX, Vec::len),
            )
        })
        .collect();
    let want = |rid: &str, route: &str, status: u64, code: &str| {
        (
            rid.to_string(),
            route.to_string(),
            status,
            code.to_string(),
            0,
        )
    };
    assert_eq!(listed.len(), 3, "{failed:#}");
    assert_eq!(listed[0].0, "ui-refused-413", "newest first: {failed:#}");
    assert_eq!(
        listed[0],
        want("ui-refused-413", "POST /echo", 413, &listed[0].3)
    );
    assert_eq!(
        listed[1],
        want("ui-refused-429", "GET /limited", 429, "rate_limited")
    );
    assert_eq!(
        listed[2],
        want("ui-refused-401", "GET /private", 401, &listed[2].3)
    );
    assert!(listed[0].3.contains("too_large"), "{failed:#}");
    assert!(!listed[2].3.is_empty(), "{failed:#}");
    assert_eq!(reqs[2]["path"], "/private", "never the query string");
    assert!(
        reqs.iter()
            .all(|r| r["error"].as_str().is_some_and(|e| !e.is_empty()))
    );
    assert!(!st.to_string().contains("hunter2"));
    gw.shutdown().await.unwrap();
}

/// A request refused by admission (503 `overloaded`: the one slot is taken, no queue) is listed
/// with the failed ones, without steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_admission_is_listed_without_steps() {
    let s = stubs(
        "services:\n  svc:\n    listen: \"${SVC_ADDR}\"\n    routes: [{ path: /slow, latency: 2s, body: '{ok: true}' }]\n",
    )
    .await;
    let gw = gateway(
        r#"
server:
  admission: { max_concurrency: 1, queue: 0 }
backends:
  svc: { url: "http://${SVC_ADDR}", timeout: 10s }
routes:
  - path: /slow
    coalesce: false
    deadline: 10s
    flow:
      s: { http: { backend: svc, path: '"/slow"' } }
    respond: { body: '$s' }
"#,
        &s,
    )
    .await;
    let url = format!("http://{}/slow", gw.addr);
    let first = {
        let url = url.clone();
        tokio::spawn(async move { get_with_id(&url, "ui-admitted").await })
    };
    let status = format!("http://{}/__fanout/status", gw.addr);
    wait_until_async("the first request holds the slot", || {
        let status = status.clone();
        async move { get(&status).await.json()["admission"]["in_flight"] == 1 }
    })
    .await;
    let r = get_with_id(&url, "ui-refused-503").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.code(), "overloaded");
    let st = state(gw.admin_addr.unwrap()).await;
    let reqs = st["recent"]["failed"]["requests"].as_array().cloned();
    let reqs = reqs.unwrap_or_default();
    assert_eq!(reqs.len(), 1, "{st:#}");
    let r = &reqs[0];
    assert_eq!(r["request_id"], "ui-refused-503", "{r:#}");
    assert_eq!(
        (&r["status"], &r["code"]),
        (&json!(503), &json!("overloaded")),
        "{r:#}"
    );
    assert_eq!(r["route"], "GET /slow");
    assert_eq!(r["steps"], json!([]), "{r:#}");
    assert_eq!(first.await.unwrap().status, 200);
    gw.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_on_the_admin_listener_only() {
    let s = stubs(&hh_stubs()).await;
    let gw = gateway(&example("hh-vacancies", "fanout.yaml"), &s).await;
    let admin = gw.admin_addr.unwrap();
    let page = get(&format!("http://{admin}/ui")).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = page.header("content-security-policy").unwrap_or_default();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    // Issue 69 §2: no 'unsafe-inline': the page's one script and style carry a nonce made for
    // this answer.
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    let nonce = csp
        .split("script-src 'nonce-")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap_or_else(|| panic!("a script nonce in {csp}"));
    assert!(nonce.len() >= 22, "128 bits: {nonce}");
    assert!(csp.contains(&format!("style-src 'nonce-{nonce}'")), "{csp}");
    let html = page.text();
    assert!(html.contains(&format!("<script nonce=\"{nonce}\">")));
    assert!(html.contains(&format!("<style nonce=\"{nonce}\">")));
    let again = get(&format!("http://{admin}/ui")).await;
    let again = again.header("content-security-policy").unwrap_or_default();
    assert!(!again.contains(nonce), "a nonce per answer: {again}");
    assert!(html.contains("/ui/api/state"));
    // Nothing loaded from elsewhere: no script or style files, no URL but the SVG namespace.
    for needle in ["<script src", "<link", "@import", "url("] {
        assert!(!html.contains(needle), "the page has {needle}");
    }
    let urls = html.replace("http://www.w3.org/2000/svg", "");
    assert!(!urls.contains("http://") && !urls.contains("https://"));
    for path in ["/ui", "/ui/", "/ui/api/state"] {
        let r = get(&format!("http://{}{path}", gw.addr)).await;
        assert_eq!(r.status, 404, "{path} on the client port: {}", r.text());
        assert_eq!(r.code(), "not_found");
    }
    let post = post(&format!("http://{admin}/ui/api/state"), "").await;
    assert_eq!(post.status, 405, "read-only");
    gw.shutdown().await.unwrap();

    // Turned off: not served, nothing recorded.
    let mut config = example("hh-vacancies", "fanout.yaml");
    config.push_str("admin:\n  ui: { enabled: false }\n");
    let gw = gateway(&config, &s).await;
    let admin = gw.admin_addr.unwrap();
    for path in ["/ui", "/ui/api/state"] {
        let r = get(&format!("http://{admin}{path}")).await;
        assert_eq!(r.status, 404, "{path} with admin.ui.enabled: false");
    }
    gw.shutdown().await.unwrap();
}

/// `GET url` with `headers`.
async fn get_h(url: &str, headers: &[(&str, &str)]) -> Resp {
    send(&client(false), Method::GET, url, headers, "").await
}

/// Issue 69 §2: the admin listener answers a `Host` that is an IP address, `localhost` or a
/// name of `admin.hosts` — a page on another site that rebinds its own name to this address is
/// refused (403) — and, with `admin.token`, only requests that carry the token (401 with the
/// challenges a browser answers otherwise); `/healthz` and `/readyz` answer anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_answers_only_its_own_names_and_its_token() {
    let s = stubs(&hh_stubs()).await;
    let mut yaml = example("hh-vacancies", "fanout.yaml");
    yaml.push_str("admin:\n  hosts: [fanout-admin.internal, \"*.corp.example\"]\n");
    let gw = gateway(&yaml, &s).await;
    let admin = gw.admin_addr.unwrap();
    let port = admin.port();
    let paths = ["/ui", "/ui/api/state", "/metrics", "/__fanout/status"];
    let allowed = [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LOCALHOST".to_string(),
        format!("[::1]:{port}"),
        format!("10.1.2.3:{port}"),
        format!("fanout-admin.internal:{port}"),
        "a.b.corp.example".to_string(),
    ];
    for host in &allowed {
        for path in paths {
            let r = get_h(&format!("http://{admin}{path}"), &[("host", host)]).await;
            assert_eq!(r.status, 200, "Host {host} {path}: {}", r.text());
        }
    }
    for host in [
        format!("evil.example:{port}"),
        "corp.example".to_string(),
        "xcorp.example".to_string(),
        "127.0.0.1.evil.example".to_string(),
        "fanout-admin.internal.evil.example".to_string(),
    ] {
        for path in paths {
            let r = get_h(&format!("http://{admin}{path}"), &[("host", &host)]).await;
            assert_eq!(r.status, 403, "Host {host} {path}: {}", r.text());
            assert!(r.text().contains("admin.hosts"), "{}", r.text());
        }
        for path in ["/healthz", "/readyz"] {
            let r = get_h(&format!("http://{admin}{path}"), &[("host", &host)]).await;
            assert_eq!(r.status, 200, "Host {host} {path}");
        }
    }
    gw.shutdown().await.unwrap();

    // admin.token.
    let token = "t0k3n-0123456789abcdef";
    let mut yaml = example("hh-vacancies", "fanout.yaml");
    yaml.push_str(&format!("admin:\n  token: {token}\n"));
    let gw = gateway(&yaml, &s).await;
    let admin = gw.admin_addr.unwrap();
    let basic = |user: &str, pass: &str| {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
    };
    let bearer = format!("Bearer {token}");
    for path in paths {
        let url = format!("http://{admin}{path}");
        let r = get(&url).await;
        assert_eq!(r.status, 401, "{path} without the token");
        let challenges: Vec<&str> = r
            .headers
            .get_all("www-authenticate")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert!(
            challenges.iter().any(|c| c.starts_with("Basic ")),
            "{challenges:?}"
        );
        assert!(
            challenges.iter().any(|c| c.starts_with("Bearer ")),
            "{challenges:?}"
        );
        for wrong in [
            "Bearer t0k3n-0123456789abcdeX".to_string(),
            format!("Bearer {token}x"),
            basic("admin", "nope"),
            basic(token, ""),
            token.to_string(),
        ] {
            let r = get_h(&url, &[("authorization", &wrong)]).await;
            assert_eq!(r.status, 401, "{path} with {wrong}");
        }
        let r = get_h(&url, &[("authorization", &bearer)]).await;
        assert_eq!(r.status, 200, "{path} with the bearer token");
        let r = get_h(&url, &[("authorization", &basic("anyone", token))]).await;
        assert_eq!(r.status, 200, "{path} with Basic credentials");
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(get(&format!("http://{admin}{path}")).await.status, 200);
    }
    gw.shutdown().await.unwrap();

    // A short token is refused at its line.
    let e = fanout::load_gateway(
        "f.yaml",
        "admin:\n  token: short\nroutes: []\n",
        &|_: &str| None,
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(
        e.starts_with("f.yaml:2:10: admin.token is shorter than 16"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_are_listed_with_the_config_generation_and_the_refusals_error() {
    let s = stubs(&hh_stubs()).await;
    let yaml = example("hh-vacancies", "fanout.yaml");
    let gw = gateway(&yaml, &s).await;
    let admin = gw.admin_addr.unwrap();
    // A refused reload (a step naming a backend that does not exist), then an applied one that
    // adds a route.
    let broken = yaml.replace("backend: search", "backend: nope");
    assert_ne!(broken, yaml);
    gw.gateway
        .reload(crate::support::config(&broken, &s))
        .await
        .unwrap_err();
    let more = format!(
        "{yaml}  - path: /ping\n    flow: {{}}\n    respond: {{ body: '{{pong: true}}' }}\n"
    );
    gw.gateway
        .reload(crate::support::config(&more, &s))
        .await
        .unwrap();
    let st = state(admin).await;
    let cfg = &st["config"];
    assert_eq!(cfg["generation"], 2, "{cfg:#}");
    assert_eq!(cfg["reloads"], 1);
    assert_eq!(cfg["failed"], 1);
    let h = cfg["history"].as_array().unwrap();
    assert_eq!(h.len(), 2, "{cfg:#}");
    assert_eq!(h[0]["ok"], true, "newest first: {cfg:#}");
    assert_eq!(h[1]["ok"], false);
    assert!(
        h[1]["error"].as_str().unwrap_or_default().contains("nope"),
        "{cfg:#}"
    );
    // The new config's routes are drawn.
    let names: Vec<&str> = st["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["GET /vacancies", "GET /ping"]);
    gw.shutdown().await.unwrap();

    // `admin.ui.reload_history` bounds the list; the counts go on.
    let capped = format!("{yaml}admin:\n  ui: {{ reload_history: 1 }}\n");
    let gw = gateway(&capped, &s).await;
    for _ in 0..2 {
        gw.gateway
            .reload(crate::support::config(&capped, &s))
            .await
            .unwrap();
    }
    let cfg = state(gw.admin_addr.unwrap()).await["config"].clone();
    assert_eq!(cfg["generation"], 3, "{cfg:#}");
    assert_eq!(cfg["history"].as_array().map(Vec::len), Some(1), "{cfg:#}");
    gw.shutdown().await.unwrap();
}

// ---- in headless Chromium, over WebDriver ----

/// A headless Chromium session driven by chromedriver (W3C WebDriver: HTTP and JSON); the
/// event-stream tests (`sse.rs`) use it too.
pub(crate) struct Browser {
    driver: tokio::process::Child,
    base: String,
    session: String,
    c: TestClient,
    profile: PathBuf,
}

impl Browser {
    pub(crate) async fn start() -> Browser {
        let chrome = crate::support::find_tool(
            &["chromium", "chromium-browser", "google-chrome"],
            "chromium",
        );
        let chromedriver = crate::support::find_tool(&["chromedriver"], "chromium-driver");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = tokio::process::Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let c = client(false);
        wait_until_async("chromedriver answers /status", || {
            let (c, url) = (c.clone(), format!("{base}/status"));
            async move {
                let req = http::Request::get(&url)
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                matches!(
                    tokio::time::timeout(Duration::from_secs(2), c.request(req)).await,
                    Ok(Ok(r)) if r.status() == 200
                )
            }
        })
        .await;
        let profile = std::env::temp_dir().join(format!("fanout-ui-chromium-{port}"));
        let binary = which_path(chrome);
        let caps = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": binary,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1100",
                format!("--user-data-dir={}", profile.display()),
            ]
        }}}});
        let r = send(
            &c,
            Method::POST,
            &format!("{base}/session"),
            &[("content-type", "application/json")],
            caps.to_string(),
        )
        .await;
        assert_eq!(r.status, 200, "new WebDriver session: {}", r.text());
        let session = r.json()["value"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        Browser {
            driver,
            base,
            session,
            c,
            profile,
        }
    }

    async fn cmd(&self, method: Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let r = send(
            &self.c,
            method,
            &url,
            &[("content-type", "application/json")],
            match body {
                Value::Null => String::new(),
                b => b.to_string(),
            },
        )
        .await;
        assert_eq!(r.status, 200, "WebDriver {path}: {}", r.text());
        r.json()["value"].clone()
    }

    pub(crate) async fn open(&self, url: &str) {
        self.cmd(Method::POST, "/url", json!({ "url": url })).await;
    }

    /// Run `body` (a function body ending in `return …`) in the page.
    pub(crate) async fn js(&self, body: &str) -> Value {
        self.cmd(
            Method::POST,
            "/execute/sync",
            json!({"script": body, "args": []}),
        )
        .await
    }

    /// Poll `body` in the page until it returns a non-null value (or panic after `limit`).
    pub(crate) async fn wait_js(
        &self,
        what: &str,
        limit: Duration,
        body: &str,
    ) -> (Value, Duration) {
        let start = Instant::now();
        loop {
            let v = self.js(body).await;
            if !v.is_null() && v != json!(false) {
                return (v, start.elapsed());
            }
            assert!(
                start.elapsed() < limit,
                "{what}: not within {limit:?}; page: {}",
                self.js("return document.body.innerText.slice(0, 3000)")
                    .await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn screenshot(&self) -> Vec<u8> {
        let v = self.cmd(Method::GET, "/screenshot", Value::Null).await;
        base64_decode(v.as_str().expect("base64 PNG"))
    }

    pub(crate) async fn close(mut self) {
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = send(&self.c, Method::DELETE, &url, &[], "").await;
        let _ = self.driver.kill().await;
        // `Drop` ends any browser process the session left behind.
    }
}

impl Drop for Browser {
    /// The browser's processes are chromedriver's children: on a failed test (or a session that
    /// did not end them) they would outlive it. They are found by their own profile directory,
    /// which nothing else uses, and killed by id.
    fn drop(&mut self) {
        let _ = self.driver.start_kill();
        let flag = format!("--user-data-dir={}", self.profile.display());
        let pids: Vec<String> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid = e.file_name().to_string_lossy().into_owned();
                pid.parse::<u32>().ok()?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                cmd.split(|&b| b == 0)
                    .any(|arg| arg == flag.as_bytes())
                    .then_some(pid)
            })
            .collect();
        if !pids.is_empty() {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .args(&pids)
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn which_path(name: &str) -> String {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|f| f.is_file())
        })
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| name.to_string())
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The names of every route the page drew, with their step boxes.
const DRAWN: &str = r#"
const routes = [...document.querySelectorAll('[data-route]')];
if (!routes.length) return null;
return routes.map(r => ({
  route: r.getAttribute('data-route'),
  steps: [...r.querySelectorAll('svg g[data-step]')].map(g => g.getAttribute('data-step')),
  edges: r.querySelectorAll('svg path.edge').length,
}));
"#;

fn drawn_routes(v: &Value) -> Vec<(String, Vec<String>, u64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["route"].as_str().unwrap().to_string(),
                r["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect(),
                r["edges"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Every route of the state endpoint, with its steps and how many edges its graph has.
fn routes_of(st: &Value) -> Vec<(String, Vec<String>, u64)> {
    st["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let steps = r["steps"].as_array().unwrap();
            (
                r["name"].as_str().unwrap().to_string(),
                steps
                    .iter()
                    .map(|s| s["name"].as_str().unwrap().to_string())
                    .collect(),
                steps
                    .iter()
                    .map(|s| s["waits_for"].as_array().unwrap().len() as u64)
                    .sum(),
            )
        })
        .collect()
}

/// hh-vacancies in Chromium: every route drawn with its graph; under load the step numbers
/// change (the delay from the load's start is printed); a request made to fail appears in the
/// failed list with its failing step marked. With `FANOUT_UI_SCREENSHOT=PATH` the page is saved
/// there as PNG (docs/img/ui.png).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs Chromium and chromedriver"]
async fn in_chromium_the_page_draws_hh_vacancies_and_follows_load_and_failures() {
    let s = stubs(&hh_stubs()).await;
    let gw = gateway(&example("hh-vacancies", "fanout.yaml"), &s).await;
    let admin = gw.admin_addr.unwrap();
    let browser = Browser::start().await;
    browser.open(&format!("http://{admin}/ui")).await;
    let (drawn, _) = browser
        .wait_js("the routes are drawn", Duration::from_secs(20), DRAWN)
        .await;
    let st = state(admin).await;
    assert_eq!(
        drawn_routes(&drawn),
        routes_of(&st),
        "every route, every step"
    );

    // Load: a steady stream of requests until told to stop.
    let found_rate = r#"const t = document.querySelector('[data-route="GET /vacancies"] g[data-step="found"] [data-stat="rate"]');
return t ? t.textContent : null;"#;
    let before = browser.js(found_rate).await;
    // The page's own clock: it polls once a second and counts its updates, so "within 2 s" is
    // "by the second update after", whatever a loaded machine does to WebDriver's round trips.
    let updates = "return +document.body.dataset.updates;";
    let u0 = browser.js(updates).await.as_u64().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, url) = (
            stop.clone(),
            format!("http://{}/vacancies?text=rust", gw.addr),
        );
        tokio::spawn(async move {
            let c = client(false);
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Any answer counts: on a loaded machine one may miss the example's deadline.
                let _ = send(&c, Method::GET, &url, &[], "").await;
                n += 1;
            }
            n
        })
    };
    let changed = format!(
        r#"const t = document.querySelector('[data-route="GET /vacancies"] g[data-step="found"] [data-stat="rate"]');
const v = t && t.textContent;
return v && v !== {before} && !v.startsWith("0.00") && v !== "–"
  ? {{ v, u: +document.body.dataset.updates }} : null;"#
    );
    let (seen, delay) = browser
        .wait_js(
            "the step numbers move under load",
            Duration::from_secs(10),
            &changed,
        )
        .await;
    let after = seen["u"].as_u64().unwrap() - u0;
    println!(
        "step numbers changed {delay:?} ({after} page updates) after the load started (rate {})",
        seen["v"]
    );
    assert!(
        after <= 2,
        "the step numbers changed only {after} updates (~{after} s) after the load started"
    );
    // They keep moving: the run count in the route's line changes at the next update.
    let sum = r#"const t = document.querySelector('[data-route="GET /vacancies"] [data-route-sum]');
return t ? t.textContent : null;"#;
    let sum1 = browser.js(sum).await;
    let (sum2, again) = browser
        .wait_js(
            "the numbers change again",
            Duration::from_secs(10),
            &format!("const v = (() => {{ {sum} }})(); return v !== {sum1} ? v : null;"),
        )
        .await;
    println!("and again {again:?} later ({sum1} → {sum2})");
    let p50 = browser
        .js(r#"return document.querySelector('[data-route="GET /vacancies"] g[data-step="found"] [data-stat="p50"]').textContent;"#)
        .await;
    assert!(p50.as_str().is_some_and(|t| t.ends_with("ms")), "{p50}");

    // A request made to fail: in the failed list, its failing step marked.
    let rid = "ui-chromium-fail-1";
    let c = client(false);
    let sent = Instant::now();
    let r = send(
        &c,
        Method::GET,
        &format!("http://{}/vacancies?text=fail", gw.addr),
        &[("x-request-id", rid)],
        "",
    )
    .await;
    assert_eq!(r.status, 502);
    let u0 = browser.js(updates).await.as_u64().unwrap();
    let (marked, delay) = browser
        .wait_js(
            "the failed request is listed",
            Duration::from_secs(10),
            &format!(
                r#"const e = document.querySelector('#failed [data-request-id="{rid}"]');
if (!e) return null;
const row = e.querySelector('.wf .row.failed');
return {{ step: e.getAttribute('data-failed-step'), row: row && row.getAttribute('data-wf-step'),
  text: e.innerText, u: +document.body.dataset.updates }};"#
            ),
        )
        .await;
    let listed_after = sent.elapsed();
    let after = marked["u"].as_u64().unwrap() - u0;
    println!(
        "the failed request was listed {listed_after:?} after it was sent ({after} page updates after its answer; polled for {delay:?})"
    );
    assert!(
        after <= 2,
        "the failed request appeared only {after} updates (~{after} s) after its answer"
    );
    assert_eq!(marked["step"], "details", "{marked:#}");
    assert_eq!(marked["row"], "details", "{marked:#}");
    assert!(
        !browser
            .js("return document.body.innerText")
            .await
            .to_string()
            .contains("SECRET-BODY"),
        "a backend body on the page"
    );
    if let Some(path) = std::env::var_os("FANOUT_UI_SCREENSHOT") {
        let png = browser.screenshot().await;
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(&path, png).expect("write the screenshot");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = load.await.unwrap();
    assert!(n > 0);
    browser.close().await;
    gw.shutdown().await.unwrap();
}

/// user-orders (PostgreSQL) in Chromium: every route drawn with its graph.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs Chromium, chromedriver and PostgreSQL"]
async fn in_chromium_the_page_draws_every_route_of_user_orders() {
    let s = stubs(&example("user-orders", "stubs.yaml")).await;
    let pg = tokio::task::spawn_blocking(|| {
        fanout_lab::postgres::PgCluster::database().unwrap_or_else(|e| panic!("{e}"))
    })
    .await
    .unwrap();
    let schema = example("user-orders", "schema.sql");
    tokio::task::block_in_place(|| pg.psql(&schema)).unwrap_or_else(|e| panic!("schema.sql: {e}"));
    let gw = gateway_with(
        &example("user-orders", "fanout.yaml"),
        &s,
        &[("DATABASE_URL", pg.url())],
    )
    .await;
    let admin = gw.admin_addr.unwrap();
    let browser = Browser::start().await;
    browser.open(&format!("http://{admin}/ui")).await;
    let (drawn, _) = browser
        .wait_js("the routes are drawn", Duration::from_secs(20), DRAWN)
        .await;
    let st = state(admin).await;
    let want = routes_of(&st);
    assert!(want.len() >= 2, "{st:#}");
    assert_eq!(drawn_routes(&drawn), want, "every route, every step");
    // The database and its cache: a read twice (the second from the cache), then the page's
    // tables show the pool and the cache's hit ratio.
    for _ in 0..2 {
        let r = get(&format!("http://{}/users/1", gw.addr)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let (tables, _) = browser
        .wait_js(
            "the database and cache tables",
            Duration::from_secs(20),
            r#"const db = document.querySelector('#databases [data-row="db"]');
const cache = document.querySelector('#caches [data-row="db"]');
return db && cache && /hit_ratio=\d/.test(cache.innerText)
  ? { db: db.innerText, cache: cache.innerText } : null;"#,
        )
        .await;
    assert!(
        tables["db"].as_str().unwrap().contains("max_size=4"),
        "{tables:#}"
    );
    browser.close().await;
    gw.shutdown().await.unwrap();
}

/// In Chromium, a waterfall bar says its step's retries and hedged copies ("1 call · 2
/// retries"); a step with neither says nothing more than before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs Chromium and chromedriver"]
async fn in_chromium_a_waterfall_says_its_retries_and_hedges() {
    let s = stubs(RETRY_HEDGE_STUBS).await;
    let gw = gateway(&retry_hedge_config("{}"), &s).await;
    let admin = gw.admin_addr.unwrap();
    let r = get_with_id(&format!("http://{}/down", gw.addr), "ui-wf-retried").await;
    assert_eq!(r.status, 502);
    let r = get_with_id(&format!("http://{}/slow", gw.addr), "ui-wf-hedged").await;
    assert_eq!(r.status, 200);
    let browser = Browser::start().await;
    browser.open(&format!("http://{admin}/ui")).await;
    let label = |list: &str, rid: &str| {
        format!(
            r#"const e = document.querySelector('#{list} [data-request-id="{rid}"]');
if (!e) return null;
const a = e.querySelector('.wf [data-attempts]');
const bar = e.querySelector('.wf .bar');
return {{ label: a && a.textContent, tip: bar && bar.title }};"#
        )
    };
    let (retried, _) = browser
        .wait_js(
            "the retried request is listed",
            Duration::from_secs(20),
            &label("failed", "ui-wf-retried"),
        )
        .await;
    assert_eq!(retried["label"], "1 call · 2 retries", "{retried:#}");
    assert!(
        retried["tip"]
            .as_str()
            .is_some_and(|t| t.contains("1 call · 2 retries")),
        "{retried:#}"
    );
    let (hedged, _) = browser
        .wait_js(
            "the hedged request is listed",
            Duration::from_secs(20),
            &label("slow", "ui-wf-hedged"),
        )
        .await;
    assert_eq!(hedged["label"], "1 call · 1 hedge", "{hedged:#}");
    if let Some(path) = std::env::var_os("FANOUT_UI_WATERFALL_SCREENSHOT") {
        let png = browser.screenshot().await;
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(&path, png).expect("write the screenshot");
    }
    browser.close().await;
    gw.shutdown().await.unwrap();
}
