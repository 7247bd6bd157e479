//! The client-facing contract, through real stubs and a real gateway: flows that answer 4xx
//! (`fail` steps, `respond.status` expressions), backend statuses mapped per step (`on_status`
//! and its defaults), keyed lookups that miss keys (`missing`), request ids, and — on every
//! error path — no backend text, backend name or address in the body, with the detail in the
//! log line of the request.

use crate::support::gateway;
use fanout_testkit::*;
use http::Method;

/// Texts only backends and the config know: none may reach a client.
const SECRETS: [&str; 4] = ["SECRET", "svc_internal", "127.0.0.1", "10.9.8.7"];

const STUBS: &str = r#"
services:
  svc:
    listen: "${SVC_ADDR}"
    routes:
      - path: /ok/{id}
        body: '{id: $request.params.id}'
      - path: /missing
        status: 404
        body: '{error: "SECRET-404: row missing in shard db-7"}'
      - path: /conflict
        status: 409
        body: '{error: "SECRET-409"}'
      - path: /fail
        status: 500
        body: '{error: "SECRET-500 at 10.9.8.7:5432"}'
      - path: /unavailable
        status: 503
        body: '{error: "SECRET-503"}'
      - path: /notjson
        raw_body: 'SECRET-notjson {'
      - path: /data
        body: '{value: "SECRET-data"}'
      - path: /hang
        latency: 5s
        body: '{}'
      - path: /items
        body: |
          $request.query.ids | split(",") | map(select(startswith("gone") | not))
          | map({key: ., value: {id: .}}) | from_entries
      - path: /each/{id}
        body: '{id: $request.params.id}'
      - path: /each/gone
        status: 404
        body: '{error: "SECRET-each"}'
"#;

const GATEWAY: &str = r#"
backends:
  svc_internal:
    url: "http://${SVC_ADDR}"
    batch: { path: '"/items"', query: { ids: '$keys | join(",")' }, split: . }
  svc_dead: { url: "http://127.0.0.1:1", connect_timeout: 200ms }
routes:
  - path: /validate/{id}
    flow:
      check:
        when: '$request.params.id | test("^[0-9]+$") | not'
        fail:
          status: 422
          code: invalid_id
          message: '"id must be digits"'
          details: '{field: "id", got: $request.params.id}'
      got: { http: { backend: svc_internal, path: '"/ok/\($request.params.id)"' } }
    respond: { body: '$got' }
  - path: /refuse
    flow:
      no: { fail: { status: 403, code: not_allowed } }
    respond: { body: '{}' }
  - path: /created/{n}
    respond:
      status: '$request.params.n | tonumber'
      body: '{n: $request.params.n}'
  - path: /default-404
    flow: { order: { http: { backend: svc_internal, path: '"/missing"' } } }
    respond: { body: '$order' }
  - path: /fail
    flow: { order: { http: { backend: svc_internal, path: '"/fail"' } } }
    respond: { body: '$order' }
  - path: /conflict
    flow: { order: { http: { backend: svc_internal, path: '"/conflict"' } } }
    respond: { body: '$order' }
  - path: /mapped-409
    flow:
      order: { on_status: { 409: 409 }, http: { backend: svc_internal, path: '"/conflict"' } }
    respond: { body: '$order' }
  - path: /mapped-class
    flow:
      order: { on_status: { 5xx: 503 }, http: { backend: svc_internal, path: '"/fail"' } }
    respond: { body: '$order' }
  - path: /mapped-pass
    flow:
      order: { on_status: { 4xx: pass }, http: { backend: svc_internal, path: '"/conflict"' } }
    respond: { body: '$order' }
  - path: /mapped-full
    flow:
      order:
        on_status: { 404: { status: 410, code: order_gone, message: the order was archived }, 4xx: 400 }
        http: { backend: svc_internal, path: '"/missing"' }
    respond: { body: '$order' }
  - path: /mapped-default
    flow:
      order:
        on_status: { 404: default }
        default: { none: true }
        http: { backend: svc_internal, path: '"/missing"' }
    respond: { body: '$order' }
  - path: /optional-404
    flow:
      extra: { optional: true, default: [], http: { backend: svc_internal, path: '"/missing"' } }
    respond: { body: '{extra: $extra}' }
  - path: /optional-explicit
    flow:
      extra:
        optional: true
        on_status: { 409: 409 }
        http: { backend: svc_internal, path: '"/conflict"' }
    respond: { body: '{extra: $extra}' }
  - path: /unavailable
    flow: { order: { http: { backend: svc_internal, path: '"/unavailable"' } } }
    respond: { body: '$order' }
  - path: /timeout
    deadline: 3s
    flow: { order: { timeout: 100ms, http: { backend: svc_internal, path: '"/hang"' } } }
    respond: { body: '$order' }
  - path: /deadline
    deadline: 100ms
    flow: { order: { http: { backend: svc_internal, path: '"/hang"' } } }
    respond: { body: '$order' }
  - path: /refused
    flow: { order: { http: { backend: svc_dead, path: '"/"' } } }
    respond: { body: '$order' }
  - path: /notjson
    flow: { order: { http: { backend: svc_internal, path: '"/notjson"' } } }
    respond: { body: '$order' }
  - path: /result-fail
    flow:
      d: { http: { backend: svc_internal, path: '"/data"' }, result: '.value | tonumber' }
    respond: { body: '$d' }
  - path: /expr-fail
    flow:
      d: { http: { backend: svc_internal, path: '"/data"' } }
      n: { value: '$d.value | tonumber' }
    respond: { body: '$n' }
  - path: /respond-fail
    flow:
      d: { http: { backend: svc_internal, path: '"/data"' } }
    respond: { body: '{n: ($d.value | tonumber)}' }
  - path: /bad-status
    flow:
      d: { http: { backend: svc_internal, path: '"/data"' } }
    respond: { status: '$d.value', body: '{}' }
  - path: /keys/fail
    flow:
      items: { for_each: '["a", "gone-1", "b"]', http: { backend: svc_internal, key: '$item' } }
    respond: { body: '$items' }
  - path: /keys/skip
    flow:
      items:
        for_each: '["a", "gone-1", "b"]'
        missing: skip
        http: { backend: svc_internal, key: '$item' }
    respond: { body: '{items: $items}' }
  - path: /keys/null
    flow:
      items:
        for_each: '["a", "gone-1", "b"]'
        missing: null
        http: { backend: svc_internal, key: '$item' }
    respond: { body: '{items: $items}' }
  - path: /keys/value
    flow:
      items:
        for_each: '["a", "gone-1", "b"]'
        missing: { value: '{id: $item, position: $index, unavailable: true}' }
        http: { backend: svc_internal, key: '$item' }
        result: '. + {found: true}'
    respond: { body: '{items: $items}' }
  - path: /keys/one
    flow:
      one: { missing: skip, http: { backend: svc_internal, key: '"gone-2"' } }
    respond: { body: '{one: $one}' }
  - path: /each/skip
    flow:
      items:
        for_each: '["x", "gone", "y"]'
        missing: skip
        http: { backend: svc_internal, path: '"/each/\($item)"' }
    respond: { body: '{items: $items}' }
  - path: /each/fail
    flow:
      items:
        for_each: '["x", "gone", "y"]'
        http: { backend: svc_internal, path: '"/each/\($item)"' }
    respond: { body: '{items: $items}' }
"#;

/// The error body carries no backend text, backend name or address; its request id is the
/// header's.
fn assert_safe(r: &Resp, what: &str) {
    let body = String::from_utf8_lossy(&r.body);
    for s in SECRETS {
        assert!(!body.contains(s), "{what}: the body leaks {s:?}: {body}");
    }
    let rid = r.headers["x-request-id"].to_str().unwrap();
    assert_eq!(r.json()["error"]["request_id"], rid, "{what}");
    assert!(r.json()["error"].get("detail").is_none(), "{what}");
    assert!(r.json()["error"].get("backend").is_none(), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_answer_has_its_status_and_code_and_no_backend_text() {
    let logs = capture_logs();
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    // (path, status, code, step, a text the request's log line must contain)
    let cases: &[(&str, u16, &str, Option<&str>, &str)] = &[
        (
            "/validate/abc",
            422,
            "invalid_id",
            Some("check"),
            "code=invalid_id",
        ),
        (
            "/refuse",
            403,
            "not_allowed",
            Some("no"),
            "code=not_allowed",
        ),
        (
            "/default-404",
            404,
            "not_found",
            Some("order"),
            "SECRET-404",
        ),
        ("/fail", 502, "backend_status", Some("order"), "SECRET-500"),
        (
            "/conflict",
            502,
            "backend_status",
            Some("order"),
            "SECRET-409",
        ),
        ("/mapped-409", 409, "conflict", Some("order"), "SECRET-409"),
        (
            "/mapped-class",
            503,
            "backend_status",
            Some("order"),
            "SECRET-500",
        ),
        ("/mapped-pass", 409, "conflict", Some("order"), "SECRET-409"),
        (
            "/mapped-full",
            410,
            "order_gone",
            Some("order"),
            "SECRET-404",
        ),
        (
            "/optional-explicit",
            409,
            "conflict",
            Some("extra"),
            "SECRET-409",
        ),
        (
            "/unavailable",
            502,
            "backend_status",
            Some("order"),
            "SECRET-503",
        ),
        (
            "/timeout",
            504,
            "backend_timeout",
            Some("order"),
            "svc_internal",
        ),
        (
            "/deadline",
            504,
            "deadline_exceeded",
            Some("order"),
            "deadline",
        ),
        (
            "/refused",
            502,
            "backend_unavailable",
            Some("order"),
            "127.0.0.1:1",
        ),
        (
            "/notjson",
            502,
            "bad_backend_answer",
            Some("order"),
            "invalid JSON",
        ),
        (
            "/result-fail",
            502,
            "bad_backend_answer",
            Some("d"),
            "SECRET-data",
        ),
        (
            "/expr-fail",
            500,
            "expression_failed",
            Some("n"),
            "SECRET-data",
        ),
        (
            "/respond-fail",
            500,
            "expression_failed",
            None,
            "SECRET-data",
        ),
        ("/bad-status", 500, "expression_failed", None, "SECRET-data"),
        ("/keys/fail", 404, "key_not_found", Some("items"), "gone-1"),
        ("/each/fail", 404, "not_found", Some("items"), "SECRET-each"),
    ];
    for (i, (path, status, code, step, logged)) in cases.iter().enumerate() {
        let rid = format!("contract-{i}");
        let r = send(
            &c,
            Method::GET,
            &format!("http://{}{path}", gw.addr),
            &[("x-request-id", &rid)],
            "",
        )
        .await;
        let body = String::from_utf8_lossy(&r.body).to_string();
        assert_eq!(r.status.as_u16(), *status, "{path}: {body}");
        assert_eq!(r.code(), *code, "{path}: {body}");
        assert_eq!(r.json()["error"]["step"].as_str(), *step, "{path}: {body}");
        assert!(
            !r.json()["error"]["message"]
                .as_str()
                .unwrap_or("")
                .is_empty(),
            "{path}: a message"
        );
        assert_eq!(r.headers["x-request-id"], rid.as_str(), "{path}");
        assert_safe(&r, path);
        let lines = logs.lines_with(&format!("request_id={rid} "));
        assert!(
            lines
                .iter()
                .any(|l| l.contains(logged) && l.contains(&format!("status={status}"))),
            "{path}: no log line of {rid} with {logged:?}: {lines:#?}"
        );
    }
    // `fail` answers before any backend call, and with its details.
    s.reset_stats();
    let r = get(&format!("http://{}/validate/12x", gw.addr)).await;
    assert_eq!(
        r.json()["error"]["details"],
        serde_json::json!({"field": "id", "got": "12x"})
    );
    assert_eq!(r.json()["error"]["message"], "id must be digits");
    assert_eq!(calls(&s, "svc"), 0, "a refused request calls no backend");
    let r = get(&format!("http://{}/refuse", gw.addr)).await;
    assert_eq!(r.json()["error"]["message"], "Forbidden");
    // The same route passes when the guard does not fire.
    let r = get(&format!("http://{}/validate/42", gw.addr)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({"id": "42"}));
    gw.shutdown().await.unwrap();
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_mapped_to_values_and_computed_statuses() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let url = |p: &str| format!("http://{}{p}", gw.addr);
    // `on_status: {404: default}`: not a failure, not partial.
    let r = get(&url("/mapped-default")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({"none": true}));
    assert!(r.headers.get("x-fanout-partial").is_none());
    // An optional step's 404 (the default mapping) falls back and is partial.
    let r = get(&url("/optional-404")).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        serde_json::json!({"extra": [], "_partial": ["extra"]})
    );
    // `respond.status` as an expression.
    let r = get(&url("/created/201")).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json(), serde_json::json!({"n": "201"}));
    let r = get(&url("/created/999")).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.code(), "expression_failed");
    gw.shutdown().await.unwrap();
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_keys_follow_the_step_policy_and_make_the_answer_partial() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let url = |p: &str| format!("http://{}{p}", gw.addr);
    let cases = [
        (
            "/keys/skip",
            serde_json::json!({"items": [{"id": "a"}, {"id": "b"}], "_partial": ["items"]}),
        ),
        (
            "/keys/null",
            serde_json::json!({"items": [{"id": "a"}, null, {"id": "b"}], "_partial": ["items"]}),
        ),
        (
            "/keys/value",
            serde_json::json!({"items": [
                {"id": "a", "found": true},
                {"id": "gone-1", "position": 1, "unavailable": true},
                {"id": "b", "found": true}
            ], "_partial": ["items"]}),
        ),
        (
            "/keys/one",
            serde_json::json!({"one": null, "_partial": ["one"]}),
        ),
        (
            "/each/skip",
            serde_json::json!({"items": [{"id": "x"}, {"id": "y"}], "_partial": ["items"]}),
        ),
    ];
    for (path, want) in cases {
        s.reset_stats();
        let r = get(&url(path)).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        assert_eq!(r.json(), want, "{path}");
        let step = want["_partial"][0].as_str().unwrap();
        assert_eq!(r.headers["x-fanout-partial"], step, "{path}");
    }
    gw.shutdown().await.unwrap();
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_taken_when_valid_generated_otherwise_and_always_returned() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let url = format!("http://{}/validate/7", gw.addr);
    // A valid client id is kept, on success too.
    let r = send(
        &c,
        Method::GET,
        &url,
        &[("x-request-id", "abc-123.X:y@z")],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-request-id"], "abc-123.X:y@z");
    // An invalid one (spaces, too long) is replaced by a generated id.
    let long = "a".repeat(129);
    for bad in ["has space", long.as_str(), "quote\"d"] {
        let r = send(&c, Method::GET, &url, &[("x-request-id", bad)], "").await;
        let id = r.headers["x-request-id"].to_str().unwrap().to_string();
        assert_ne!(id, bad);
        assert_eq!(id.len(), 16, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    // Without one, every answer gets a distinct generated id — errors of the server itself too.
    let a = get(&url).await;
    let b = get(&format!("http://{}/no-such-route", gw.addr)).await;
    assert_eq!(b.status, 404);
    let (ida, idb) = (&a.headers["x-request-id"], &b.headers["x-request-id"]);
    assert_ne!(ida, idb);
    assert_eq!(b.json()["error"]["request_id"], idb.to_str().unwrap());
    gw.shutdown().await.unwrap();
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn details_are_exposed_only_when_the_server_says_so() {
    let s = stubs(STUBS).await;
    let dev = format!(
        "server: {{ expose_error_details: true, request_id_header: x-correlation-id }}\n{GATEWAY}"
    );
    let gw = gateway(&dev, &s).await;
    let r = get(&format!("http://{}/fail", gw.addr)).await;
    assert_eq!(r.status, 502);
    let e = &r.json()["error"];
    assert_eq!(e["backend"], "svc_internal");
    assert!(
        e["detail"].as_str().unwrap_or("").contains("SECRET-500"),
        "{e}"
    );
    assert_eq!(
        e["request_id"],
        r.headers["x-correlation-id"].to_str().unwrap()
    );
    assert!(r.headers.get("x-request-id").is_none());
    gw.shutdown().await.unwrap();
    s.shutdown().await;
}

/// An optional step that fails leaves a log line (info, with the request id, step, backend and
/// cause): a partial answer is what users ask about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_optional_step_is_logged_with_its_request_id() {
    let logs = capture_logs();
    let s = stubs(STUBS).await;
    let gw = gateway(
        r#"
backends:
  svc: { url: "http://${SVC_ADDR}" }
routes:
  - path: /partial
    flow:
      main: { http: { backend: svc, path: '"/ok/1"' } }
      extra:
        optional: true
        default: []
        http: { backend: svc, path: '"/fail"' }
    respond: { body: '{main: $main, extra: $extra}' }
"#,
        &s,
    )
    .await;
    let c = client(false);
    let rid = "optional-step-log-1";
    let r = send(
        &c,
        Method::GET,
        &format!("http://{}/partial", gw.addr),
        &[("x-request-id", rid)],
        "",
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
    assert_eq!(r.json()["_partial"], serde_json::json!(["extra"]));
    let lines = logs.lines_with(&format!("request_id={rid} "));
    let line = lines
        .iter()
        .find(|l| l.contains("optional step failed"))
        .unwrap_or_else(|| panic!("no optional-step line for {rid}: {lines:#?}"));
    for part in [" INFO ", "step=extra", "backend=svc", "code=backend_status"] {
        assert!(line.contains(part), "`{part}` missing: {line}");
    }
}
