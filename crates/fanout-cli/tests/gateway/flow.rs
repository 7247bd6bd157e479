//! Flow behaviour through the public interface: real stubs, a real gateway, real sockets.
//! Concurrency and cancellation are proven by what the stubs observe, never by timing.

use crate::support::gateway;
use fanout_testkit::*;
use http::Method;

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - path: /slow
        latency: 300ms
        body: '{token: $request.query.x}'
      - path: /after/{both}
        body: '{seen: $request.params.both}'
      - path: /hang
        latency: 5s
        body: '{}'
      - path: /fail
        status: 500
        body: '{oops: true}'
      - path: /teapot
        status: 418
        body: '{short: "and stout"}'
      - path: /notjson
        raw_body: '{"unterminated'
      - path: /echo
        method: "*"
        body: '{method: $request.method, query: $request.query, body: $request.body, hdr: $request.headers["x-user"], budget: ($request.headers["x-request-timeout"] | tonumber)}'
"#;

const GATEWAY: &str = r#"
backends:
  a: { url: "http://${A_ADDR}" }
  a_pass: { url: "http://${A_ADDR}", status_passthrough: true }
  dead: { url: "http://127.0.0.1:1", connect_timeout: 200ms }
routes:
  - path: /parallel
    deadline: 3s
    flow:
      left:  { http: { backend: a, path: '"/slow"', query: { x: '"L"' } } }
      right: { http: { backend: a, path: '"/slow"', query: { x: '"R"' } } }
      joined:
        http: { backend: a, path: '"/after/\($left.token)-\($right.token)"' }
    respond:
      body: '{joined: $joined.seen}'
  - path: /cancel
    deadline: 150ms
    flow:
      h: { http: { backend: a, path: '"/hang"' } }
    respond: { body: '$h' }
  - path: /optional-hang
    deadline: 2s
    flow:
      h: { timeout: 100ms, optional: true, default: {fallback: true}, http: { backend: a, path: '"/hang"' } }
      ok: { http: { backend: a, path: '"/after/x"' } }
    respond: { body: '{h: $h, ok: $ok.seen}' }
  - path: /quick
    flow: { q: { http: { backend: a, path: '"/after/now"' } } }
    respond: { body: '$q' }
  - path: /fail
    flow: { f: { http: { backend: a, path: '"/fail"' } } }
    respond: { body: '$f' }
  - path: /teapot
    flow: { f: { http: { backend: a_pass, path: '"/teapot"' } } }
    respond: { body: '$f' }
  - path: /refused
    flow: { f: { http: { backend: dead, path: '"/"' } } }
    respond: { body: '$f' }
  - path: /notjson
    flow: { f: { http: { backend: a, path: '"/notjson"' } } }
    respond: { body: '$f' }
  - path: /timeout
    deadline: 3s
    flow: { f: { timeout: 100ms, http: { backend: a, path: '"/hang"' } } }
    respond: { body: '$f' }
  - path: /echo/{id}
    method: POST
    deadline: 900ms
    flow:
      e:
        http:
          backend: a
          method: PUT
          path: '"/echo"'
          query: { id: '$request.params.id', tags: '["x", "y"]', skip: 'null' }
          headers: { x-user: '$request.headers["x-user"]' }
          body: '{got: $request.body.n}'
    respond:
      status: 201
      headers: { x-id: '$request.params.id' }
      body: '$e'
  - path: /each
    flow:
      ids: { value: '[3, 1, 2]' }
      each:
        for_each: '$ids'
        concurrency: 2
        http: { backend: a, path: '"/echo"', query: { i: '$item', k: '$index' } }
        result: '.query.i'
    respond: { body: '$each' }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_steps_overlap_and_dependent_step_waits_for_both() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let r = get(&format!("http://{}/parallel", gw.addr)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // The dependent step's call was built from both answers, so it started after both.
    assert_eq!(r.json(), serde_json::json!({"joined": "L-R"}));
    let st = s.stats("a").unwrap();
    assert_eq!(st.routes["GET /slow"].requests, 2);
    assert_eq!(
        st.routes["GET /slow"].max_in_flight, 2,
        "left and right were in flight together"
    );
    assert_eq!(st.routes["GET /after/{both}"].requests, 1);
    assert_eq!(st.routes["GET /after/{both}"].max_in_flight, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_cancels_outstanding_calls_without_leaks() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    // Warm up so the client pool and runtime are in steady state, then count.
    let _ = send(
        &c,
        Method::GET,
        &format!("http://{}/fail", gw.addr),
        &[],
        "",
    )
    .await;
    wait_until("stub connections settle", || {
        s.stats("a").unwrap().routes["GET /fail"].in_flight == 0
    })
    .await;
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let conns_before = s.stats("a").unwrap().connections_open;

    for _ in 0..3 {
        let r = send(
            &c,
            Method::GET,
            &format!("http://{}/cancel", gw.addr),
            &[],
            "",
        )
        .await;
        assert_eq!(r.status, 504);
        assert_eq!(r.code(), "deadline_exceeded");
        assert_eq!(r.json()["error"]["step"], "h");
        assert!(
            r.json()["error"].get("backend").is_none(),
            "backend names stay in the log"
        );
    }
    // The stub saw each hanging request go away, nothing is in flight, connections are closed.
    wait_until("3 aborted at the stub", || {
        s.stats("a").unwrap().routes["GET /hang"].aborted == 3
    })
    .await;
    let st = s.stats("a").unwrap();
    assert_eq!(st.routes["GET /hang"].in_flight, 0);
    assert_eq!(st.routes["GET /hang"].completed, 0);
    wait_until("stub connections back to the baseline", || {
        s.stats("a").unwrap().connections_open <= conns_before
    })
    .await;
    wait_until("no task leaked", || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
            <= tasks_before
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_step_falls_back_and_is_reported() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let r = get(&format!("http://{}/optional-hang", gw.addr)).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        serde_json::json!({"h": {"fallback": true}, "ok": "x", "_partial": ["h"]})
    );
    assert_eq!(r.headers["x-fanout-partial"], "h");
    wait_until("hung call cancelled", || {
        s.stats("a").unwrap().routes["GET /hang"].aborted == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_trouble_maps_to_specific_statuses() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let cases = [
        ("/fail", 502, "backend_status"),
        ("/teapot", 418, "backend_status"),
        ("/refused", 502, "backend_unavailable"),
        ("/notjson", 502, "bad_backend_answer"),
        ("/timeout", 504, "backend_timeout"),
        ("/cancel", 504, "deadline_exceeded"),
    ];
    for (path, status, code) in cases {
        let r = get(&format!("http://{}{path}", gw.addr)).await;
        assert_eq!(
            r.status.as_u16(),
            status,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.code(), code, "{path}");
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(!msg.is_empty(), "{path}: message");
        let step = if path == "/cancel" { "h" } else { "f" };
        assert_eq!(r.json()["error"]["step"], step, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_built_from_expressions_and_budget_is_forwarded() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    for h2 in [false, true] {
        let r = send(
            &client(h2),
            Method::POST,
            &format!("http://{}/echo/42", gw.addr),
            &[("x-user", "u-7"), ("x-request-timeout", "400")],
            r#"{"n": 5}"#,
        )
        .await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        assert_eq!(r.headers["x-id"], "42");
        let j = r.json();
        assert_eq!(j["method"], "PUT");
        assert_eq!(
            j["query"],
            serde_json::json!({"id": "42", "tags": ["x", "y"]})
        );
        assert_eq!(j["body"], serde_json::json!({"got": 5}));
        assert_eq!(j["hdr"], "u-7");
        // The client shortened the 900 ms route deadline to 400 ms; the backend got what remained.
        let budget = j["budget"].as_u64().unwrap();
        assert!(budget > 0 && budget <= 400, "forwarded budget {budget}");
    }
}

/// A client that leaves no time (`x-request-timeout: 0`) is answered 504 `deadline_exceeded`
/// every time, and no backend call is made for it (a zero-length timer raced against a fast
/// backend used to let some of them through). The same route answers normally with time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_time_left_is_a_504_without_a_backend_call() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let url = format!("http://{}/quick", gw.addr);
    let before = calls(&s, "a");
    for h2 in [false, true] {
        for _ in 0..20 {
            let r = send(
                &client(h2),
                Method::GET,
                &url,
                &[("x-request-timeout", "0")],
                "",
            )
            .await;
            assert_eq!(r.status, 504, "{}", r.text());
            assert_eq!(r.code(), "deadline_exceeded");
            assert_eq!(r.json()["error"]["step"], "q");
        }
    }
    assert_eq!(
        calls(&s, "a"),
        before,
        "no call was made for a request without time"
    );
    let r = send(
        &client(false),
        Method::GET,
        &url,
        &[("x-request-timeout", "5000")],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["seen"], "now");
    assert_eq!(calls(&s, "a"), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_each_keeps_input_order_within_its_bound() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let r = get(&format!("http://{}/each", gw.addr)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json(), serde_json::json!(["3", "1", "2"]));
    let st = s.stats("a").unwrap();
    assert_eq!(st.routes["* /echo"].requests, 3);
    assert!(st.routes["* /echo"].max_in_flight <= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_addresses_are_used_round_robin_and_grpc_timeout_shortens_the_budget() {
    let s = stubs(
        r#"
services:
  one:
    listen: "${ONE_ADDR}"
    routes:
      - { path: /who, body: '{who: "one", budget: ($request.headers["x-request-timeout"] | tonumber)}' }
  two:
    listen: "${TWO_ADDR}"
    routes:
      - { path: /who, body: '{who: "two", budget: ($request.headers["x-request-timeout"] | tonumber)}' }
"#,
    )
    .await;
    let gw = gateway(
        r#"
backends:
  pair: { urls: ["http://${ONE_ADDR}", "http://${TWO_ADDR}"], balance: { strategy: round_robin } }
routes:
  - path: /who
    deadline: 5s
    flow: { w: { http: { backend: pair, path: '"/who"' } } }
    respond: { body: '$w' }
"#,
        &s,
    )
    .await;
    let c = client(false);
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..6 {
        let r = send(
            &c,
            Method::GET,
            &format!("http://{}/who", gw.addr),
            &[("grpc-timeout", "300m")],
            "",
        )
        .await;
        assert_eq!(r.status, 200);
        let budget = r.json()["budget"].as_u64().unwrap();
        assert!(
            budget > 0 && budget <= 300,
            "grpc-timeout 300m caps the 5 s route deadline: {budget}"
        );
        *seen
            .entry(r.json()["who"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(seen.get("one"), Some(&3), "{seen:?}");
    assert_eq!(seen.get("two"), Some(&3), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests_and_stops_accepting() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let addr = gw.addr;
    let in_flight = tokio::spawn(async move { get(&format!("http://{addr}/parallel")).await });
    wait_until("request reached the stub", || {
        s.stats("a").unwrap().routes["GET /slow"].in_flight == 2
    })
    .await;
    gw.shutdown().await.expect("clean shutdown");
    let r = in_flight.await.unwrap();
    assert_eq!(
        r.status, 200,
        "the in-flight request completed during the drain"
    );
    assert_eq!(r.json(), serde_json::json!({"joined": "L-R"}));
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}
