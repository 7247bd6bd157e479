//! The flow engine through its public API — `compile` a YAML config, `RoutePlan::run` a request —
//! against scripted in-memory backends, in virtual time (`start_paused`): every assertion is about
//! states, counts, order and exact virtual instants, never wall time.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod support;

use fanout_flow::{CallErrorKind, ErrorKind, PARTIAL_HEADER};
use serde_json::json;
use support::*;

// Backend URLs are placeholders: scripted backends never connect anywhere.

const SCHEDULING: &str = r#"
backends:
  a: { url: "http://127.0.0.1:1" }
routes:
  - path: /parallel
    deadline: 3s
    flow:
      left:  { http: { backend: a, path: '"/left"' } }
      right: { http: { backend: a, path: '"/right"' } }
      after_left:
        http: { backend: a, path: '"/after-left/\($left.token)"' }
      joined:
        http: { backend: a, path: '"/joined/\($left.token)-\($right.token)"' }
    respond:
      body: '{joined: $joined.seen, after_left: $after_left.seen}'
"#;

#[tokio::test(start_paused = true)]
async fn independent_steps_start_together_and_dependents_start_on_their_inputs() {
    let f = Flow::new(SCHEDULING);
    f.script("a", "/left", ok(r#"{"token": "L"}"#).after(ms(30)))
        .script("a", "/right", ok(r#"{"token": "R"}"#).after(ms(50)))
        .script(
            "a",
            "/after-left/*",
            ok(r#"{"seen": "after"}"#).after(ms(5)),
        )
        .script("a", "/joined/*", ok(r#"{"seen": "joined"}"#).after(ms(10)));
    let out = f.run(Req::get("/parallel")).await.unwrap();
    assert_eq!(out.status, 200);
    assert_eq!(
        body(&out),
        json!({"joined": "joined", "after_left": "after"})
    );
    assert_eq!(
        f.world.timeline(),
        vec![
            // Independent: both at the first instant.
            (ms(0), "a /left".to_string()),
            (ms(0), "a /right".to_string()),
            // Reads `left` only: starts with left's answer, before right's.
            (ms(30), "a /after-left/L".to_string()),
            // Reads both: starts with the later answer, built from both.
            (ms(50), "a /joined/L-R".to_string()),
        ]
    );
    assert_eq!(f.world.max_in_flight("a"), 2);
    assert_eq!(
        f.world.now(),
        ms(60),
        "answered with the last call's answer"
    );
    assert!(f.world.calls().iter().all(|c| c.end == End::Answered));
}

const DEADLINES: &str = r#"
backends:
  a: { url: "http://127.0.0.1:1" }
routes:
  - path: /one-slow
    deadline: 100ms
    flow:
      fast: { http: { backend: a, path: '"/fast"' } }
      slow: { http: { backend: a, path: '"/hang"' } }
    respond: { body: '{fast: $fast, slow: $slow}' }
  - path: /two-slow
    deadline: 100ms
    flow:
      x: { http: { backend: a, path: '"/hang?x"' } }
      y: { http: { backend: a, path: '"/hang?y"' } }
    respond: { body: '{x: $x, y: $y}' }
  - path: /chain
    deadline: 100ms
    flow:
      first: { http: { backend: a, path: '"/fast"' } }
      second: { http: { backend: a, path: '"/hang?after=\($first.n)"' } }
    respond: { body: '$second' }
  - path: /step-timeout
    deadline: 3s
    flow:
      f: { timeout: 100ms, http: { backend: a, path: '"/hang"' } }
    respond: { body: '$f' }
"#;

fn deadline_flow() -> Flow {
    let f = Flow::new(DEADLINES);
    f.script("a", "/fast", ok(r#"{"n": 1}"#).after(ms(40)))
        .script("a", "/hang", ok("{}").after(ms(5000)));
    f
}

#[tokio::test(start_paused = true)]
async fn the_route_deadline_fails_the_request_at_the_deadline_and_drops_the_call() {
    let f = deadline_flow();
    let e = f.run(Req::get("/one-slow")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::DeadlineExceeded);
    assert_eq!(
        error_of(&e),
        (504, "deadline_exceeded".into(), Some("slow".into()))
    );
    assert_eq!(e.backend.as_deref(), Some("a"));
    assert_eq!(f.world.now(), ms(100), "failed exactly at the deadline");

    let fast = f.world.call("/fast");
    assert_eq!((fast.end, fast.ended), (End::Answered, Some(ms(40))));
    let slow = f.world.call("/hang");
    assert_eq!((slow.end, slow.ended), (End::Dropped, Some(ms(100))));
    // Each call gets min(step timeout (defaults: 1s), remaining budget).
    assert_eq!((fast.timeout, slow.timeout), (ms(100), ms(100)));
}

#[tokio::test(start_paused = true)]
async fn at_the_deadline_every_call_in_flight_is_dropped() {
    let f = deadline_flow();
    let e = f.run(Req::get("/two-slow")).await.unwrap_err();
    assert_eq!((e.status(), e.code()), (504, "deadline_exceeded"));
    // Both steps time out at the same instant; the one settled first is named.
    let step = e.step.as_deref().unwrap_or_default();
    assert!(["x", "y"].contains(&step), "{e}");
    assert_eq!(f.world.now(), ms(100));
    let calls = f.world.calls();
    assert_eq!(calls.len(), 2);
    for c in calls {
        assert_eq!((c.end, c.ended), (End::Dropped, Some(ms(100))), "{c:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_later_step_gets_the_remaining_budget() {
    let f = deadline_flow();
    let e = f.run(Req::get("/chain")).await.unwrap_err();
    assert_eq!(
        error_of(&e),
        (504, "deadline_exceeded".into(), Some("second".into()))
    );
    let second = f.world.call("/hang?after=1");
    assert_eq!(second.started, ms(40));
    assert_eq!(second.timeout, ms(60), "what is left of 100ms after 40ms");
    assert_eq!((second.end, second.ended), (End::Dropped, Some(ms(100))));
}

#[tokio::test(start_paused = true)]
async fn a_step_timeout_shorter_than_the_backend_is_a_backend_timeout() {
    let f = deadline_flow();
    let e = f.run(Req::get("/step-timeout")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::BackendTimeout);
    assert_eq!(
        error_of(&e),
        (504, "backend_timeout".into(), Some("f".into()))
    );
    assert_eq!(f.world.now(), ms(100));
    let c = f.world.call("/hang");
    assert_eq!(c.timeout, ms(100));
    assert_eq!((c.end, c.ended), (End::Dropped, Some(ms(100))));
}

const FAILURES: &str = r#"
backends:
  a: { url: "http://127.0.0.1:1" }
routes:
  - path: /optional
    flow:
      h: { optional: true, default: {fallback: true}, http: { backend: a, path: '"/broken"' } }
      t: { optional: true, timeout: 50ms, default: [], http: { backend: a, path: '"/hang"' } }
      ok: { http: { backend: a, path: '"/ok"' } }
    respond: { body: '{h: $h, t: $t, ok: $ok}' }
  - path: /required
    flow:
      broken: { http: { backend: a, path: '"/broken"' } }
      other: { http: { backend: a, path: '"/hang"' } }
      later: { http: { backend: a, path: '"/later/\($other.n)"' } }
    respond: { body: '{broken: $broken, later: $later}' }
"#;

fn failures_flow() -> Flow {
    let f = Flow::new(FAILURES);
    f.script(
        "a",
        "/broken",
        status(500, r#"{"oops": true}"#).after(ms(10)),
    )
    .script("a", "/hang", ok(r#"{"n": 1}"#).after(ms(5000)))
    .script("a", "/ok", ok(r#"{"fine": true}"#).after(ms(20)));
    f
}

#[tokio::test(start_paused = true)]
async fn an_optional_step_that_fails_takes_its_default_and_is_listed_as_partial() {
    let f = failures_flow();
    let out = f.run(Req::get("/optional")).await.unwrap();
    assert_eq!(out.status, 200);
    assert_eq!(
        body(&out),
        json!({"h": {"fallback": true}, "t": [], "ok": {"fine": true}, "_partial": ["h", "t"]})
    );
    assert_eq!(header(&out, PARTIAL_HEADER).as_deref(), Some("h,t"));
    let partial: Vec<&str> = out.partial.iter().map(|s| &**s).collect();
    assert_eq!(partial, ["h", "t"], "in the order the steps failed");
    assert_eq!(
        f.world.now(),
        ms(50),
        "the optional timeout is the last to settle"
    );
    let hang = f.world.call("/hang");
    assert_eq!((hang.end, hang.ended), (End::Dropped, Some(ms(50))));
}

#[tokio::test(start_paused = true)]
async fn a_required_step_that_fails_fails_the_request_and_drops_the_other_calls() {
    let f = failures_flow();
    let e = f.run(Req::get("/required")).await.unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::BackendStatus {
            status: 500,
            passthrough: false
        }
    );
    assert_eq!(
        error_of(&e),
        (502, "backend_status".into(), Some("broken".into()))
    );
    assert_eq!(e.backend.as_deref(), Some("a"));
    assert_eq!(f.world.now(), ms(10), "failed with the failing answer");
    let other = f.world.call("/hang");
    assert_eq!((other.end, other.ended), (End::Dropped, Some(ms(10))));
    assert_eq!(f.world.calls().len(), 2, "the dependent step never ran");
}

const ONE_STEP: &str = r#"
backends:
  a: { url: "http://127.0.0.1:1" }
routes:
  - path: /one
    flow:
      f: { http: { backend: a, path: '"/f"' } }
    respond: { body: '$f' }
"#;

#[tokio::test(start_paused = true)]
async fn each_kind_of_backend_trouble_has_its_status_and_code() {
    let cases = [
        (status(500, "{}"), 502, "backend_status"),
        (status(503, "{}"), 502, "backend_status"),
        (status(400, "{}"), 502, "backend_status"),
        (status(404, "{}"), 404, "not_found"),
        (ok(r#"{"unterminated"#), 502, "bad_backend_answer"),
        (
            transport(CallErrorKind::Connect),
            502,
            "backend_unavailable",
        ),
        (transport(CallErrorKind::Reset), 502, "backend_reset"),
        (
            transport(CallErrorKind::BodyTooLarge),
            502,
            "bad_backend_answer",
        ),
        (
            transport(CallErrorKind::Rejected(
                fanout_layers::backend::RejectReason::Bulkhead,
            )),
            503,
            "backend_rejected",
        ),
        // A timeout reported by an inner layer is classified like the step's own timer.
        (transport(CallErrorKind::Timeout), 504, "backend_timeout"),
    ];
    for (reply, want_status, want_code) in cases {
        let f = Flow::new(ONE_STEP);
        f.script("a", "/f", reply.clone());
        let e = f.run(Req::get("/one")).await.unwrap_err();
        assert_eq!(
            error_of(&e),
            (want_status, want_code.to_string(), Some("f".to_string())),
            "{reply:?}: {e}"
        );
        assert_eq!(f.world.calls().len(), 1);
    }
    // An empty 2xx answer is `null`.
    let f = Flow::new(ONE_STEP);
    f.script("a", "/f", status(204, ""));
    let out = f.run(Req::get("/one")).await.unwrap();
    assert_eq!(body(&out), json!(null));
}

const GUARDS: &str = r#"
backends:
  a: { url: "http://127.0.0.1:1" }
  items: { url: "http://127.0.0.1:1" }
routes:
  - path: /when
    flow:
      maybe:
        when: '$request.query.go == "yes"'
        default: skipped
        http: { backend: a, path: '"/maybe"' }
    respond: { body: '{maybe: $maybe}' }
  - path: /each
    flow:
      ids: { value: '[1, 2, 3, 4, 5]' }
      each:
        for_each: '$ids'
        concurrency: 2
        http: { backend: items, path: '"/items/\($item)"' }
        result: '{id: .id, index: $index}'
    respond: { body: '$each' }
"#;

#[tokio::test(start_paused = true)]
async fn when_false_gives_the_default_without_a_call() {
    let cases = [
        ("go=no", json!({"maybe": "skipped"}), 0),
        ("go=yes", json!({"maybe": {"called": true}}), 1),
    ];
    for (query, want, calls) in cases {
        let f = Flow::new(GUARDS);
        f.script("a", "/maybe", ok(r#"{"called": true}"#));
        let out = f.run(Req::get("/when").query(query)).await.unwrap();
        assert_eq!(body(&out), want, "{query}");
        assert!(out.partial.is_empty(), "a skipped step is not partial");
        assert_eq!(f.world.calls().len(), calls, "{query}");
    }
}

#[tokio::test(start_paused = true)]
async fn for_each_stays_within_its_concurrency_and_keeps_input_order() {
    let f = Flow::new(GUARDS);
    for (id, latency) in [(1, 30), (2, 10), (3, 20), (4, 10), (5, 5)] {
        let answer = format!(r#"{{"id": {id}}}"#);
        f.script(
            "items",
            &format!("/items/{id}"),
            ok(&answer).after(ms(latency)),
        );
    }
    let out = f.run(Req::get("/each")).await.unwrap();
    assert_eq!(
        body(&out),
        json!([
            {"id": 1, "index": 0},
            {"id": 2, "index": 1},
            {"id": 3, "index": 2},
            {"id": 4, "index": 3},
            {"id": 5, "index": 4}
        ])
    );
    assert_eq!(f.world.max_in_flight("items"), 2);
    // `concurrency` bounds the calls running, not the answers kept for an earlier one: 3 starts
    // when 2 answers (10ms) although 1 is still running; 4 and 5 when 1 and 3 answer (30ms).
    let starts: Vec<_> = f.world.calls().iter().map(|c| c.started).collect();
    assert_eq!(starts, [ms(0), ms(0), ms(10), ms(30), ms(30)]);
    assert_eq!(f.world.now(), ms(40));
}

const FAIL_STEPS: &str = r#"
backends:
  orders: { url: "http://127.0.0.1:1" }
routes:
  - path: /orders/{id}
    flow:
      valid_id:
        when: '$request.params.id | test("^o-[0-9]+$") | not'
        fail:
          status: 400
          code: invalid_id
          message: '"order ids look like o-123"'
          details: '{field: "id"}'
      order:
        http: { backend: orders, path: '"/orders/\($request.params.id)"' }
      gone:
        when: '$order.deleted'
        fail: { status: 410, code: order_deleted }
    respond: { body: '$order' }
  - path: /guarded
    flow:
      guard: { when: '$request.query.ok != "1"', fail: { status: 400, code: refused } }
      boom: { value: 'error("boom")' }
      call: { http: { backend: orders, path: '"/orders/x"' } }
    respond: { body: '$call' }
"#;

#[tokio::test(start_paused = true)]
async fn a_fail_step_answers_before_any_call_of_its_round_is_sent() {
    let f = Flow::new(FAIL_STEPS);
    f.script("orders", "/orders/*", ok(r#"{"deleted": false}"#));
    let e = f
        .run(Req::get("/orders/{id}").param("id", "abc"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Answered);
    assert_eq!(
        error_of(&e),
        (400, "invalid_id".into(), Some("valid_id".into()))
    );
    assert_eq!(e.message, "order ids look like o-123");
    let details = e.answer.as_ref().and_then(|a| a.details.clone());
    assert_eq!(details.as_deref(), Some(&br#"{"field":"id"}"#[..]));
    assert_eq!(f.world.calls().len(), 0, "the order call was not sent");
    assert_eq!(f.world.now(), ms(0));

    // In the same round a failing `value` step would answer 500: the guard goes first.
    let e = f.run(Req::get("/guarded")).await.unwrap_err();
    assert_eq!(error_of(&e), (400, "refused".into(), Some("guard".into())));
    let e = f.run(Req::get("/guarded").query("ok=1")).await.unwrap_err();
    assert_eq!(
        error_of(&e),
        (500, "expression_failed".into(), Some("boom".into()))
    );
    assert_eq!(f.world.calls().len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fail_step_that_reads_a_step_runs_after_it() {
    let f = Flow::new(FAIL_STEPS);
    f.script(
        "orders",
        "/orders/*",
        ok(r#"{"deleted": true}"#).after(ms(10)),
    );
    let e = f
        .run(Req::get("/orders/{id}").param("id", "o-7"))
        .await
        .unwrap_err();
    assert_eq!(
        error_of(&e),
        (410, "order_deleted".into(), Some("gone".into()))
    );
    assert_eq!(
        e.message, "Gone",
        "the default message is the reason phrase"
    );
    assert_eq!(f.world.call("/orders/o-7").end, End::Answered);

    f.script("orders", "/orders/*", ok(r#"{"deleted": false}"#));
    let out = f
        .run(Req::get("/orders/{id}").param("id", "o-8"))
        .await
        .unwrap();
    assert_eq!(body(&out), json!({"deleted": false}));
}

const ON_STATUS: &str = r#"
backends:
  orders: { url: "http://127.0.0.1:1" }
  loyalty: { url: "http://127.0.0.1:1" }
routes:
  - path: /page
    flow:
      order:
        http: { backend: orders, path: '"/order"' }
        on_status:
          409: 409
          410: { status: 404, code: order_archived, message: "the order was archived" }
          5xx: 503
      points:
        http: { backend: loyalty, path: '"/points"' }
        on_status: { 404: default }
        default: { points: 0 }
      plain:
        http: { backend: loyalty, path: '"/plain"' }
      extra:
        optional: true
        default: none
        http: { backend: loyalty, path: '"/extra"' }
        on_status: { 409: 409 }
    respond: { body: '{order: $order, points: $points.points, plain: $plain, extra: $extra}' }
"#;

/// What `/page` gives: a body, or an error (kind, status, code, step).
enum Want {
    Body(serde_json::Value),
    Error(ErrorKind, u16, &'static str, &'static str),
}

/// `/page`'s body when `points` is this and `extra` that (the others answer `{"ok": 1}`).
fn page(points: i64, extra: serde_json::Value) -> serde_json::Value {
    json!({"order": {"ok": 1}, "points": points, "plain": {"ok": 1}, "extra": extra})
}

/// The backend of a path of `/page`.
fn page_backend(path: &str) -> &'static str {
    if path == "/order" {
        "orders"
    } else {
        "loyalty"
    }
}

#[tokio::test(start_paused = true)]
async fn on_status_maps_backend_statuses_and_404_is_not_found_by_default() {
    use ErrorKind::{Answered, NotFound};
    use Want::{Body, Error};
    let ok_1 = || json!({"ok": 1});
    let mut fell_back = page(7, json!("none"));
    fell_back["_partial"] = json!(["extra"]);
    // (path answering `status` instead of 200, status, what the client gets)
    let cases = [
        ("/none", 200, Body(page(7, ok_1()))),
        // `default`: a success with the step's default, not partial.
        ("/points", 404, Body(page(0, ok_1()))),
        ("/order", 409, Error(Answered, 409, "conflict", "order")),
        (
            "/order",
            410,
            Error(Answered, 404, "order_archived", "order"),
        ),
        (
            "/order",
            502,
            Error(Answered, 503, "backend_status", "order"),
        ),
        ("/order", 404, Error(NotFound, 404, "not_found", "order")),
        ("/plain", 404, Error(NotFound, 404, "not_found", "plain")),
        // An explicit answer of an optional step wins over its default…
        ("/extra", 409, Error(Answered, 409, "conflict", "extra")),
        // …an unmapped failure falls back to it.
        ("/extra", 500, Body(fell_back)),
    ];
    for (path, code, want) in cases {
        let f = Flow::new(ON_STATUS);
        // Every call takes 10ms, so all four are sent before any answer settles the request.
        for p in ["/order", "/plain", "/extra"] {
            f.script(page_backend(p), p, ok(r#"{"ok": 1}"#).after(ms(10)));
        }
        f.script("loyalty", "/points", ok(r#"{"points": 7}"#).after(ms(10)));
        if path != "/none" {
            let reply = status(code, r#"{"backend": "text"}"#).after(ms(10));
            f.script(page_backend(path), path, reply);
        }
        match (want, f.run(Req::get("/page")).await) {
            (Body(want), Ok(out)) => assert_eq!(body(&out), want, "{path} {code}"),
            (Error(kind, status, err_code, step), Err(e)) => {
                assert_eq!(e.kind, kind, "{path} {code}: {e}");
                let want = (status, err_code.to_string(), Some(step.to_string()));
                assert_eq!(error_of(&e), want, "{path} {code}: {e}");
            }
            (_, got) => panic!("{path} {code}: unexpected {got:?}"),
        }
        assert_eq!(f.world.calls().len(), 4, "{path} {code}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_on_status_message_replaces_the_default_one() {
    let f = Flow::new(ON_STATUS);
    f.script("orders", "/order", status(410, "{}"))
        .script("loyalty", "/*", ok("{}"));
    let e = f.run(Req::get("/page")).await.unwrap_err();
    assert_eq!(e.message, "the order was archived");
}

const BATCHES: &str = r#"
backends:
  attrs:
    url: "http://127.0.0.1:1"
    batch:
      path: '"/attrs"'
      query: { ids: '$keys | join(",")' }
      split: '.'
  small:
    url: "http://127.0.0.1:1"
    batch:
      path: '"/small"'
      query: { ids: '$keys | join(",")' }
      split: '.'
      max: 2
routes:
  - path: /page
    flow:
      main: { for_each: '["k2", "k1"]', http: { backend: attrs, key: '$item' } }
      extra: { http: { backend: attrs, key: '"k3"' } }
      dup: { http: { backend: attrs, key: '"k1"' } }
      later:
        when: '$extra != null'
        http: { backend: attrs, key: '"k4"' }
    respond: { body: '{main: $main, extra: $extra, dup: $dup, later: $later}' }
  - path: /chunks
    flow:
      all: { for_each: '["k1", "k2", "k3"]', http: { backend: small, key: '$item' } }
    respond: { body: '$all' }
  - path: /missing
    flow:
      a: { http: { backend: attrs, key: '"k1"' } }
      b: { optional: true, default: none, http: { backend: attrs, key: '"nope"' } }
      c: { for_each: '["k1", "nope"]', missing: skip, http: { backend: attrs, key: '$item' } }
    respond: { body: '{a: $a, b: $b, c: $c}' }
  - path: /missing-required
    flow:
      a: { http: { backend: attrs, key: '"nope"' } }
    respond: { body: '$a' }
"#;

const VALUES: &str = r#"{"k1": "v1", "k2": "v2", "k3": "v3", "k4": "v4"}"#;

fn batch_flow() -> Flow {
    let f = Flow::new(BATCHES);
    f.script("attrs", "/attrs", ok(VALUES).after(ms(10)))
        .script("small", "/small", ok(VALUES).after(ms(10)));
    f
}

#[tokio::test(start_paused = true)]
async fn keyed_lookups_of_a_round_share_one_batch_call() {
    let f = batch_flow();
    let out = f.run(Req::get("/page")).await.unwrap();
    assert_eq!(
        body(&out),
        json!({"main": ["v2", "v1"], "extra": "v3", "dup": "v1", "later": "v4"})
    );
    assert_eq!(
        f.world.timeline(),
        vec![
            // Three steps, four lookups, three distinct keys: one call, keys sorted.
            (ms(0), "attrs /attrs?ids=k1%2Ck2%2Ck3".to_string()),
            // A step of the next round: its own call.
            (ms(10), "attrs /attrs?ids=k4".to_string()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_larger_than_max_is_split_into_concurrent_calls() {
    let f = batch_flow();
    let out = f.run(Req::get("/chunks")).await.unwrap();
    assert_eq!(body(&out), json!(["v1", "v2", "v3"]));
    assert_eq!(
        f.world.timeline(),
        vec![
            (ms(0), "small /small?ids=k1%2Ck2".to_string()),
            (ms(0), "small /small?ids=k3".to_string()),
        ]
    );
    assert_eq!(f.world.max_in_flight("small"), 2);
}

#[tokio::test(start_paused = true)]
async fn keys_missing_from_the_batch_answer_follow_the_step_policy() {
    let f = batch_flow();
    let out = f.run(Req::get("/missing")).await.unwrap();
    let mut partial: Vec<&str> = out.partial.iter().map(|s| &**s).collect();
    // Both settle at the same instant: their order in `_partial` is not pinned.
    partial.sort_unstable();
    assert_eq!(partial, ["b", "c"]);
    let mut got = body(&out);
    got["_partial"] = json!(partial);
    assert_eq!(
        got,
        json!({"a": "v1", "b": "none", "c": ["v1"], "_partial": ["b", "c"]})
    );
    assert_eq!(f.world.calls().len(), 1, "one call for the three steps");

    let e = f.run(Req::get("/missing-required")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::KeyNotFound);
    assert_eq!(
        error_of(&e),
        (404, "key_not_found".into(), Some("a".into()))
    );
}

const CYCLE: &str = r#"
backends:
  a: { url: "http://127.0.0.1:1" }
routes:
  - path: /cycle
    flow:
      first: { value: '$second' }
      second: { value: '$first' }
    respond: { body: '$first' }
"#;

const UNKNOWN_BACKEND: &str = r#"
backends:
  orders: { url: "http://127.0.0.1:1" }
routes:
  - path: /x
    flow:
      f: { http: { backend: order, path: '"/x"' } }
    respond: { body: '$f' }
"#;

#[test]
fn a_cycle_and_an_unknown_backend_are_config_errors_with_their_position() {
    let text = CYCLE;
    let at = line_col(text, "first: {");
    assert_eq!(
        compile_errors(text),
        format!(
            "{FILE}:{at}: dependency cycle: $first → $second → $first\n  hint: a step cannot \
             read (directly or indirectly) its own result; remove one reference"
        )
    );
    let text = UNKNOWN_BACKEND;
    let at = line_col(text, "order, path");
    assert_eq!(
        compile_errors(text),
        format!("{FILE}:{at}: unknown backend `order`\n  hint: did you mean `orders`?")
    );
}

#[tokio::test(start_paused = true)]
async fn a_backend_with_status_passthrough_passes_its_error_statuses() {
    const PASS: &str = r#"
backends:
  a: { url: "http://127.0.0.1:1", status_passthrough: true }
routes:
  - path: /one
    flow:
      f: { http: { backend: a, path: '"/f"' } }
    respond: { body: '$f' }
"#;
    for (code, want) in [(503, 503), (429, 429), (500, 500)] {
        let f = Flow::new(PASS);
        f.script("a", "/f", status(code, "{}"));
        let e = f.run(Req::get("/one")).await.unwrap_err();
        assert_eq!(
            error_of(&e),
            (want, "backend_status".to_string(), Some("f".to_string())),
            "{code}: {e}"
        );
    }
}
