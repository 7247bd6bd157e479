//! Telemetry end to end: OpenTelemetry spans received by an OTLP/HTTP receiver inside the test
//! (request → step → backend call, linked by parent span ids; the client's `traceparent`
//! continued; backends given the trace context; sampling), the JSON access log (one line per
//! request, degraded steps named with their cause, sampling) and `Server-Timing` (per route and
//! by the trusted header). Export is batched: tests wait for spans, never sleep.

use crate::support::gateway;
use fanout_testkit::*;
use http::Method;
use std::collections::HashSet;

const STUBS: &str = r#"
services:
  svc:
    listen: "${SVC_ADDR}"
    routes:
      # Each answer says which trace context the backend received.
      - path: /a
        body: '{tp: ($request.headers.traceparent // null)}'
      - path: /b
        body: '{tp: ($request.headers.traceparent // null)}'
      - path: /slow
        latency: 200ms
        body: '{tp: ($request.headers.traceparent // null)}'
      - path: /profiles
        body: '($request.query.ids | split(",")) | map({key: ., value: {id: ., tp: $request.headers.traceparent}}) | from_entries'
      - path: /broken
        status: 500
        body: '{error: "db down"}'
"#;

/// A gateway config with `telemetry` and `server` sections inserted, the OTLP receiver at
/// `${OTLP}`.
fn config(telemetry: &str, server: &str, otlp: &OtlpReceiver) -> String {
    format!(
        r#"
server: {server}
telemetry: {telemetry}
backends:
  svc: {{ url: "http://${{SVC_ADDR}}", timeout: 2s }}
  cached: {{ url: "http://${{SVC_ADDR}}", timeout: 2s, cache: {{ ttl: 60s }} }}
  flaky:
    urls: ["http://127.0.0.1:1", "http://${{SVC_ADDR}}"]
    timeout: 2s
    balance: {{ strategy: round_robin }}
    retry: {{ attempts: 3, backoff: 1ms }}
  profiles:
    url: "http://${{SVC_ADDR}}"
    timeout: 2s
    batch: {{ path: '"/profiles"', query: {{ ids: '$keys | join(",")' }}, split: '.' }}
defaults: {{ deadline: 5s }}
routes:
  - path: /page
    server_timing: true
    flow:
      a: {{ http: {{ backend: svc, path: '"/a"' }} }}
      b: {{ http: {{ backend: svc, path: '"/b"', query: {{ after: '$a.tp' }} }} }}
    respond: {{ body: '{{a: $a.tp, b: $b.tp}}' }}
  - path: /plain
    flow:
      a: {{ http: {{ backend: svc, path: '"/a"' }} }}
    respond: {{ body: '$a' }}
  - path: /degraded
    flow:
      a: {{ http: {{ backend: svc, path: '"/a"' }} }}
      broken: {{ http: {{ backend: svc, path: '"/broken"' }}, optional: true, default: null }}
    respond: {{ body: '{{a: $a.tp}}' }}
  - path: /cached
    flow:
      c: {{ http: {{ backend: cached, path: '"/a"' }} }}
    respond: {{ body: '$c' }}
  - path: /slow
    coalesce: false
    flow:
      s: {{ http: {{ backend: svc, path: '"/slow"' }} }}
    respond: {{ body: '$s' }}
  - path: /keyed
    flow:
      p: {{ http: {{ backend: profiles, key: '$request.query.id' }} }}
    respond: {{ body: '$p' }}
  - path: /flaky
    flow:
      f: {{ http: {{ backend: flaky, path: '"/a"' }} }}
    respond: {{ body: '$f' }}
"#
    )
    .replace("${OTLP}", &otlp.endpoint())
}

fn tracing_on(ratio: f64) -> String {
    format!(
        r#"{{ tracing: {{ otlp_endpoint: "${{OTLP}}", sampling_ratio: {ratio}, batch_delay: 10ms, service_name: fanout-test }} }}"#
    )
}

async fn request(url: &str, headers: &[(&str, &str)]) -> Resp {
    send(
        &client(false),
        Method::GET,
        url,
        headers,
        bytes::Bytes::new(),
    )
    .await
}

/// The server span of the request with id `rid`, once received.
async fn server_span(otlp: &OtlpReceiver, rid: &str) -> RecvSpan {
    let find = || {
        otlp.spans()
            .into_iter()
            .find(|s| s.kind == 2 && s.attr("fanout.request_id") == Some(rid))
    };
    wait_until(&format!("the request span of {rid}"), || find().is_some()).await;
    find().unwrap()
}

/// Wait until the trace `trace_id` has `n` spans; returns them.
async fn trace_of(otlp: &OtlpReceiver, trace_id: &str, n: usize) -> Vec<RecvSpan> {
    wait_until(&format!("{n} spans of trace {trace_id}"), || {
        otlp.trace(trace_id).len() >= n
    })
    .await;
    otlp.trace(trace_id)
}

async fn status(url: &str) -> serde_json::Value {
    get(&format!("{url}/__fanout/status")).await.json()
}

#[tokio::test]
async fn spans_link_request_steps_and_backend_calls_and_backends_get_the_context() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let gw = gateway(&config(&tracing_on(1.0), "{}", &otlp), &stubs).await;
    let url = format!("http://{}", gw.addr);

    let r = request(&format!("{url}/page"), &[("x-request-id", "trace-links-1")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let server = server_span(&otlp, "trace-links-1").await;
    assert_eq!(server.name, "GET /page");
    assert_eq!(server.parent_span_id, "", "no client context: a root span");
    assert_eq!(server.attr("http.route"), Some("/page"));
    assert_eq!(server.attr("http.response.status_code"), Some("200"));
    assert_eq!(server.attr("fanout.outcome"), Some("ok"));
    assert_eq!(server.service_name, "fanout-test");

    // request + 2 steps + 2 calls
    let spans = trace_of(&otlp, &server.trace_id, 5).await;
    assert_eq!(spans.len(), 5, "{spans:#?}");
    let steps: Vec<&RecvSpan> = spans.iter().filter(|s| s.kind == 1).collect();
    let calls: Vec<&RecvSpan> = spans.iter().filter(|s| s.kind == 3).collect();
    assert_eq!((steps.len(), calls.len()), (2, 2), "{spans:#?}");
    for step in &steps {
        assert_eq!(
            step.parent_span_id, server.span_id,
            "a step is the request's child"
        );
        assert_eq!(step.attr("fanout.backend"), Some("svc"));
        assert_eq!(step.attr("fanout.outcome"), Some("ok"));
    }
    let body = r.json();
    for call in &calls {
        let step = call.attr("fanout.step").unwrap();
        let parent = steps
            .iter()
            .find(|s| s.attr("fanout.step") == Some(step))
            .unwrap();
        assert_eq!(
            call.parent_span_id, parent.span_id,
            "a call is its step's child"
        );
        assert_eq!(call.attr("fanout.backend"), Some("svc"));
        assert_eq!(call.attr("http.response.status_code"), Some("200"));
        assert_eq!(call.attr("fanout.attempt"), Some("1"));
        assert_eq!(call.attr("fanout.hedge"), Some("false"));
        let addr = call.attr("server.address").unwrap();
        assert!(addr.starts_with("http://127.0.0.1:"), "{addr}");
        // The backend received this call's own context, sampled.
        let tp = body[step].as_str().unwrap();
        assert_eq!(
            tp,
            format!("00-{}-{}-01", server.trace_id, call.span_id),
            "step {step}"
        );
    }
    let st = status(&url).await;
    assert_eq!(st["telemetry"]["tracing"]["dropped"], 0);
    assert!(st["access_log"].is_null(), "off: null");
}

#[tokio::test]
async fn a_client_traceparent_is_continued_and_a_malformed_one_starts_a_new_trace() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let gw = gateway(&config(&tracing_on(1.0), "{}", &otlp), &stubs).await;
    let url = format!("http://{}/plain", gw.addr);

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let tp = format!("00-{trace}-{parent}-01");
    let r = request(
        &url,
        &[
            ("x-request-id", "trace-continue-1"),
            ("traceparent", &tp),
            ("tracestate", "vendor=abc"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let server = server_span(&otlp, "trace-continue-1").await;
    assert_eq!(server.trace_id, trace);
    assert_eq!(
        server.parent_span_id, parent,
        "the client's span is the parent"
    );
    let sent = r.json()["tp"].as_str().unwrap().to_string();
    assert!(sent.starts_with(&format!("00-{trace}-")), "{sent}");

    for (i, bad) in [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // uppercase
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
        "garbage",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
    ]
    .iter()
    .enumerate()
    {
        let rid = format!("trace-malformed-{i}");
        let r = request(&url, &[("x-request-id", &rid), ("traceparent", bad)]).await;
        assert_eq!(r.status, 200, "a malformed traceparent is ignored: {bad}");
        let server = server_span(&otlp, &rid).await;
        assert_ne!(server.trace_id, trace);
        assert_ne!(server.trace_id, "00000000000000000000000000000000");
        assert_eq!(server.parent_span_id, "", "a new trace for {bad}");
    }
}

#[tokio::test]
async fn sampling_ratio_zero_exports_nothing_but_follows_a_sampled_client() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let gw = gateway(&config(&tracing_on(0.0), "{}", &otlp), &stubs).await;
    let url = format!("http://{}", gw.addr);

    for i in 0..5 {
        let rid = format!("trace-unsampled-{i}");
        let r = request(&format!("{url}/page"), &[("x-request-id", &rid)]).await;
        assert_eq!(r.status, 200);
        // Backends still get the context, marked not sampled.
        let tp = r.json()["a"].as_str().unwrap().to_string();
        assert!(tp.starts_with("00-") && tp.ends_with("-00"), "{tp}");
        // One trace per request, a span id per call.
        let tp_b = r.json()["b"].as_str().unwrap().to_string();
        assert_eq!(tp[..35], tp_b[..35], "same trace: {tp} {tp_b}");
        assert_ne!(tp, tp_b, "each call its own span id");
    }
    // Spans are queued when they end, before the answer is sent: none was.
    let st = status(&url).await;
    assert_eq!(st["telemetry"]["tracing"]["queued"], 0, "{st}");
    assert!(otlp.spans().is_empty());

    // Parent-based: a client that sampled its trace gets it recorded.
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = request(
        &format!("{url}/plain"),
        &[
            ("x-request-id", "trace-sampled-parent"),
            ("traceparent", tp),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let server = server_span(&otlp, "trace-sampled-parent").await;
    assert_eq!(server.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert!(
        otlp.spans()
            .iter()
            .all(|s| s.trace_id == "0af7651916cd43dd8448eb211c80319c"),
        "only the sampled trace was exported"
    );
}

#[tokio::test]
async fn call_spans_say_how_the_call_was_served_cache_and_retries() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let gw = gateway(&config(&tracing_on(1.0), "{}", &otlp), &stubs).await;
    let url = format!("http://{}", gw.addr);

    for rid in ["trace-cache-1", "trace-cache-2"] {
        assert_eq!(
            request(&format!("{url}/cached"), &[("x-request-id", rid)])
                .await
                .status,
            200
        );
    }
    let first = server_span(&otlp, "trace-cache-1").await;
    let second = server_span(&otlp, "trace-cache-2").await;
    let call = |spans: Vec<RecvSpan>| spans.into_iter().find(|s| s.kind == 3).unwrap();
    let miss = call(trace_of(&otlp, &first.trace_id, 3).await);
    assert_eq!(miss.attr("fanout.cache"), Some("miss"));
    assert!(miss.attr("server.address").is_some(), "a miss is sent");
    let hit = call(trace_of(&otlp, &second.trace_id, 3).await);
    assert_eq!(hit.attr("fanout.cache"), Some("hit"));
    assert_eq!(hit.attr("server.address"), None, "a hit sends nothing");

    // Round robin over a dead address and a live one, 3 attempts: two requests start on
    // different addresses, so one of them fails over to a second attempt.
    let mut attempts = Vec::new();
    for rid in ["trace-retry-1", "trace-retry-2"] {
        assert_eq!(
            request(&format!("{url}/flaky"), &[("x-request-id", rid)])
                .await
                .status,
            200
        );
        let server = server_span(&otlp, rid).await;
        let spans = trace_of(&otlp, &server.trace_id, 3).await;
        attempts.extend(spans.into_iter().filter(|s| s.kind == 3));
    }
    // Both traces complete (the retried one has 4 spans).
    wait_until("the retried attempt's span", || {
        otlp.spans()
            .iter()
            .any(|s| s.kind == 3 && s.attr("fanout.attempt") == Some("2"))
    })
    .await;
    let all = otlp.spans();
    let failed = all
        .iter()
        .find(|s| s.kind == 3 && s.attr("fanout.outcome") == Some("refused"))
        .expect("the attempt on the dead address");
    assert_eq!(failed.attr("fanout.attempt"), Some("1"));
    let retried = all
        .iter()
        .find(|s| s.kind == 3 && s.attr("fanout.attempt") == Some("2"))
        .unwrap();
    assert_eq!(retried.trace_id, failed.trace_id);
    assert_eq!(retried.parent_span_id, failed.parent_span_id, "same step");
    assert_eq!(retried.attr("http.response.status_code"), Some("200"));
    assert!(attempts.len() >= 2, "{attempts:#?}");
}

#[tokio::test]
async fn a_caller_that_joined_a_shared_call_gets_a_span_saying_so() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let gw = gateway(&config(&tracing_on(1.0), "{}", &otlp), &stubs).await;
    let url = format!("http://{}", gw.addr);
    let slow = format!("{url}/slow");
    let (a, b) = tokio::join!(
        request(&slow, &[("x-request-id", "trace-dedup-1")]),
        request(&slow, &[("x-request-id", "trace-dedup-2")]),
    );
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (200, 200));
    // Usually the second joins the first's call (both are sent at once, the call takes 200 ms);
    // the spans must agree with the dedup counter either way.
    let joined = status(&url).await["backends"]["svc"]["dedup"]["joined"]
        .as_u64()
        .unwrap() as usize;
    let calls = |role: &str| {
        otlp.spans()
            .into_iter()
            .filter(|s| s.kind == 3 && s.attr("fanout.dedup") == Some(role))
            .collect::<Vec<_>>()
    };
    wait_until("both requests' call spans", || {
        calls("joined").len() + calls("leader").len() == 2
    })
    .await;
    assert_eq!(calls("joined").len(), joined);
    for j in calls("joined") {
        assert_eq!(
            j.attr("server.address"),
            None,
            "a joined caller sends nothing"
        );
    }
    for l in calls("leader") {
        assert!(l.attr("server.address").is_some());
    }
    // A shared call carries its first caller's context: both answers name the leader's trace.
    let leader = &calls("leader")[0];
    if joined == 1 {
        let tp = format!("00-{}-{}-01", leader.trace_id, leader.span_id);
        assert_eq!(a.json()["tp"], tp.as_str());
        assert_eq!(b.json()["tp"], tp.as_str());
    }
}

#[tokio::test]
async fn a_batch_call_made_for_one_request_is_a_child_of_its_step() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let gw = gateway(&config(&tracing_on(1.0), "{}", &otlp), &stubs).await;
    let url = format!("http://{}/keyed?id=u7", gw.addr);
    let r = request(&url, &[("x-request-id", "trace-batch-1")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let server = server_span(&otlp, "trace-batch-1").await;
    let spans = trace_of(&otlp, &server.trace_id, 3).await;
    let step = spans.iter().find(|s| s.kind == 1).unwrap();
    let call = spans.iter().find(|s| s.kind == 3).unwrap();
    assert_eq!(step.attr("fanout.step"), Some("p"));
    assert_eq!(call.parent_span_id, step.span_id);
    assert_eq!(call.attr("fanout.batch"), Some("true"));
    assert_eq!(call.attr("fanout.backend"), Some("profiles"));
    let tp = format!("00-{}-{}-01", server.trace_id, call.span_id);
    assert_eq!(
        r.json()["tp"],
        tp.as_str(),
        "the batch call carried the context"
    );
}

/// A file for one test's access log.
fn log_file(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("fanout-access-{name}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[tokio::test]
async fn the_access_log_has_one_json_line_per_request_naming_degraded_steps() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let path = log_file("all");
    let telemetry = format!(
        r#"{{ access_log: {{ enabled: true, output: "{}" }} }}"#,
        path.display()
    );
    let gw = gateway(&config(&telemetry, "{}", &otlp), &stubs).await;
    let url = format!("http://{}", gw.addr);

    let ok = request(&format!("{url}/plain"), &[("x-request-id", "log-ok")]).await;
    assert_eq!(ok.status, 200);
    let degraded = request(
        &format!("{url}/degraded"),
        &[("x-request-id", "log-partial")],
    )
    .await;
    assert_eq!(degraded.status, 200);
    assert_eq!(degraded.header("x-fanout-partial"), Some("broken"));
    let missing = request(&format!("{url}/nowhere"), &[("x-request-id", "log-404")]).await;
    assert_eq!(missing.status, 404);

    wait_until("three access log lines", || lines(&path).len() >= 3).await;
    let all = lines(&path);
    assert_eq!(all.len(), 3, "{all:#?}");
    let by_id = |id: &str| {
        all.iter()
            .find(|l| l["request_id"] == id)
            .unwrap_or_else(|| panic!("no line for {id}: {all:#?}"))
            .clone()
    };
    let l = by_id("log-ok");
    assert_eq!(l["method"], "GET");
    assert_eq!(l["route"], "/plain");
    assert_eq!(l["path"], "/plain");
    assert_eq!(l["client"], "127.0.0.1", "the connection's peer");
    assert_eq!(l["status"], 200);
    assert!(l["duration_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(l["bytes_in"], 0);
    assert_eq!(l["bytes_out"].as_u64().unwrap(), ok.body.len() as u64);
    assert_eq!(l["partial"], serde_json::json!([]));
    let time = l["time"].as_str().unwrap();
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );

    let l = by_id("log-partial");
    assert_eq!(l["partial"][0]["step"], "broken");
    assert_eq!(l["partial"][0]["code"], "backend_status");
    let cause = l["partial"][0]["cause"].as_str().unwrap();
    assert!(
        cause.contains("500"),
        "the cause names the failure: {cause}"
    );

    let l = by_id("log-404");
    assert_eq!(l["status"], 404);
    assert_eq!(l["route"], serde_json::Value::Null);
    assert_eq!(l["error"], "not_found");

    let st = status(&url).await;
    assert_eq!(st["access_log"]["dropped"], 0);
    assert!(st["telemetry"]["tracing"].is_null());
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn access_log_sampling_zero_writes_nothing() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let path = log_file("none");
    let telemetry = format!(
        r#"{{ access_log: {{ enabled: true, sample_ratio: 0.0, always_log_degraded: false, output: "{}" }} }}"#,
        path.display()
    );
    let gw = gateway(&config(&telemetry, "{}", &otlp), &stubs).await;
    let url = format!("http://{}", gw.addr);
    for route in ["plain", "degraded", "plain"] {
        assert_eq!(request(&format!("{url}/{route}"), &[]).await.status, 200);
    }
    // Lines are queued before the answer is sent: none was.
    let st = status(&url).await;
    assert_eq!(st["access_log"]["queued"], 0, "{st}");
    assert!(lines(&path).is_empty());

    // With always_log_degraded (the default), a degraded answer is logged anyway.
    let path2 = log_file("degraded-only");
    let telemetry = format!(
        r#"{{ access_log: {{ enabled: true, sample_ratio: 0.0, output: "{}" }} }}"#,
        path2.display()
    );
    let gw2 = gateway(&config(&telemetry, "{}", &otlp), &stubs).await;
    let url2 = format!("http://{}", gw2.addr);
    assert_eq!(request(&format!("{url2}/plain"), &[]).await.status, 200);
    let d = request(
        &format!("{url2}/degraded"),
        &[("x-request-id", "log-d-only")],
    )
    .await;
    assert_eq!(d.status, 200);
    let st = status(&url2).await;
    assert_eq!(st["access_log"]["queued"], 1, "{st}");
    wait_until("the degraded answer's line", || lines(&path2).len() == 1).await;
    assert_eq!(lines(&path2)[0]["request_id"], "log-d-only");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&path2);
}

#[tokio::test]
async fn server_timing_for_opted_in_routes_and_the_trusted_header_only() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let server = r#"{ server_timing: { header: x-fanout-timing, token: "s3cret-token" } }"#;
    let gw = gateway(&config("{}", server, &otlp), &stubs).await;
    let url = format!("http://{}", gw.addr);

    let r = request(&format!("{url}/page"), &[]).await;
    assert_eq!(r.status, 200);
    let st = r
        .header("server-timing")
        .expect("the opted-in route has it");
    let names: HashSet<&str> = st
        .split(", ")
        .map(|e| e.split(';').next().unwrap())
        .collect();
    assert_eq!(names, HashSet::from(["a", "b", "total"]), "{st}");
    assert!(st.contains(r#"desc="backend svc""#), "{st}");
    for entry in st.split(", ") {
        let dur = entry
            .split(";dur=")
            .nth(1)
            .unwrap()
            .split(';')
            .next()
            .unwrap();
        assert!(dur.parse::<f64>().unwrap() >= 0.0, "{entry}");
    }

    let plain = request(&format!("{url}/plain"), &[]).await;
    assert_eq!(plain.header("server-timing"), None, "not opted in");
    let with_token = request(
        &format!("{url}/plain"),
        &[("x-fanout-timing", "s3cret-token")],
    )
    .await;
    let st = with_token.header("server-timing").expect("the right token");
    assert!(
        st.starts_with("a;dur=") && st.contains("total;dur="),
        "{st}"
    );
    let wrong = request(
        &format!("{url}/plain"),
        &[("x-fanout-timing", "s3cret-tokeN")],
    )
    .await;
    assert_eq!(wrong.header("server-timing"), None, "a wrong token");
    let empty = request(&format!("{url}/plain"), &[("x-fanout-timing", "")]).await;
    assert_eq!(empty.header("server-timing"), None);
}

#[tokio::test]
async fn telemetry_config_errors_point_at_the_field() {
    let yaml = r#"
telemetry:
  tracing: { otlp_endpoint: "udp://collector:4317", sampling_ratio: 1.5 }
  access_log: { sample_ratio: -1 }
routes: []
"#;
    let err = match fanout::load_gateway("fanout.yaml", yaml, &|_: &str| None) {
        Ok(_) => panic!("should not load"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("fanout.yaml:3:"), "{err}");
    assert!(err.contains("otlp_endpoint"), "{err}");
    assert!(err.contains("telemetry.tracing.sampling_ratio"), "{err}");
    assert!(err.contains("telemetry.access_log.sample_ratio"), "{err}");
    // Every error has its place in the file.
    assert!(!err.contains(":0:0:"), "{err}");
    assert!(err.contains("fanout.yaml:4:"), "{err}");
}

#[tokio::test]
async fn a_model_batch_has_a_span_linked_to_the_steps_of_its_requests() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let models = TempDir::new("telemetry-models");
    std::fs::copy(
        repo_root().join("crates/fanout-model/testdata/dense_ops.onnx"),
        models.join("d.onnx"),
    )
    .unwrap();
    let yaml = format!(
        r#"
telemetry: {}
models: {{ dir: "{}" }}
routes:
  - path: /score
    flow:
      s: {{ for_each: '[[1,2,3,4],[5,6,7,8]]', model: {{ name: d, input: '$item' }} }}
    respond: {{ body: '$s' }}
"#,
        tracing_on(1.0),
        models.path().display()
    )
    .replace("${OTLP}", &otlp.endpoint());
    let gw = gateway(&yaml, &stubs).await;
    let r = request(
        &format!("http://{}/score", gw.addr),
        &[("x-request-id", "model-span-1")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let server = server_span(&otlp, "model-span-1").await;
    // The request's trace: its server span and the model step's span.
    let trace = trace_of(&otlp, &server.trace_id, 2).await;
    let step = trace
        .iter()
        .find(|s| s.attr("fanout.step") == Some("s"))
        .unwrap_or_else(|| panic!("no step span in {trace:?}"))
        .clone();
    // The batch's own span (a root of its own trace), linked to that step.
    let find = || {
        otlp.spans().into_iter().find(|s| {
            s.name == "model d"
                && s.links
                    .contains(&(server.trace_id.clone(), step.span_id.clone()))
        })
    };
    wait_until("the model batch span", || find().is_some()).await;
    let batch = find().unwrap();
    assert_eq!(batch.parent_span_id, "", "a root span");
    assert_eq!(batch.attr("fanout.model"), Some("d"));
    assert_eq!(batch.attr("fanout.batch_rows"), Some("2"));
    assert_eq!(batch.attr("fanout.model.version").map(str::len), Some(16));
}

/// The access log's `client` is the address the rate limits see: the connection's peer, or what
/// a trusted proxy forwarded — never a header from anyone else.
#[tokio::test]
async fn the_access_log_names_the_client_a_trusted_proxy_forwarded() {
    let otlp = OtlpReceiver::start().await;
    let stubs = stubs(STUBS).await;
    let path = log_file("client");
    let telemetry = format!(
        r#"{{ access_log: {{ enabled: true, output: "{}" }} }}"#,
        path.display()
    );
    let server = r#"{ trusted_proxies: ["127.0.0.1"] }"#;
    let gw = gateway(&config(&telemetry, server, &otlp), &stubs).await;
    let url = format!("http://{}/plain", gw.addr);
    for (id, xff) in [("fwd", Some("198.51.100.9, 203.0.113.7")), ("direct", None)] {
        let mut h = vec![("x-request-id", id)];
        h.extend(xff.map(|v| ("x-forwarded-for", v)));
        assert_eq!(request(&url, &h).await.status, 200);
    }
    wait_until("two access log lines", || lines(&path).len() >= 2).await;
    let all = lines(&path);
    let client = |id: &str| {
        all.iter()
            .find(|l| l["request_id"] == id)
            .map(|l| l["client"].clone())
            .unwrap_or_else(|| panic!("no line for {id}: {all:#?}"))
    };
    assert_eq!(
        client("fwd"),
        "203.0.113.7",
        "the hop the trusted proxy saw"
    );
    assert_eq!(client("direct"), "127.0.0.1");
    let _ = std::fs::remove_file(&path);
}

/// A statement's span names the database system and carries the statement as written (never its
/// parameters); the live page counts the statement as the step's one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
async fn a_statement_span_has_the_database_and_the_statement_as_written() {
    let pg = crate::postgres::cluster().await;
    let otlp = OtlpReceiver::start().await;
    let query = "SELECT 10 / $1::int4 AS n";
    let yaml = format!(
        r#"
telemetry: {{ tracing: {{ otlp_endpoint: "{otlp}", sampling_ratio: 1.0, batch_delay: 10ms }} }}
backends:
  db: {{ protocol: postgres, url: "${{DB_URL}}", timeout: 5s }}
routes:
  - path: /div
    flow:
      row: {{ sql: {{ backend: db, mode: one, query: "{query}", params: ['$request.query.by | tonumber'] }} }}
    respond: {{ body: '$row' }}
"#,
        otlp = otlp.endpoint()
    );
    let url = pg.url();
    let lookup = move |n: &str| (n == "DB_URL").then(|| url.clone());
    let gw = fanout::load_gateway("fanout.yaml", &yaml, &lookup)
        .unwrap_or_else(|e| panic!("gateway config:\n{e}"));
    let gw = fanout::start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let ok = request(
        &format!("http://{}/div?by=5", gw.addr),
        &[("x-request-id", "pg-ok")],
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json(), serde_json::json!({"n": 2}));
    // Division by zero fails the request: recorded by the live page.
    let failed = request(
        &format!("http://{}/div?by=0", gw.addr),
        &[("x-request-id", "pg-failed")],
    )
    .await;
    assert!(failed.status.as_u16() >= 400, "{}", failed.text());
    let server = server_span(&otlp, "pg-ok").await;
    let spans = trace_of(&otlp, &server.trace_id, 3).await;
    let call = spans
        .iter()
        .find(|s| s.kind == 3)
        .unwrap_or_else(|| panic!("no call span: {spans:#?}"));
    assert_eq!(call.attr("db.system.name"), Some("postgresql"), "{call:#?}");
    assert_eq!(call.attr("db.system"), Some("postgresql"), "{call:#?}");
    assert_eq!(call.attr("db.query.text"), Some(query), "{call:#?}");
    assert_eq!(call.attr("fanout.attempt"), Some("1"), "{call:#?}");
    let st = get(&format!("http://{}/ui/api/state", gw.admin_addr.unwrap()))
        .await
        .json();
    let step = &st["recent"]["failed"]["requests"][0]["steps"][0];
    assert_eq!(step["name"], "row", "{st:#}");
    assert_eq!(
        (&step["calls"], &step["attempts"]),
        (&serde_json::json!(1), &serde_json::json!(1)),
        "{step:#}"
    );
    gw.shutdown().await.unwrap();
}

/// The access log is the logging phase of the edge stages: it sees every answer — those the
/// arrival phase makes before routing (a CORS preflight, its refusal) as well as the flow's —
/// after the answer phase, so `bytes_out` is what the client is sent (compressed).
#[tokio::test]
async fn the_access_log_sees_answers_made_before_routing_and_the_compressed_bytes() {
    let stubs = stubs(STUBS).await;
    let path = log_file("edge");
    let yaml = format!(
        r#"
telemetry: {{ access_log: {{ enabled: true, output: "{}" }} }}
compression: {{ response: {{ enabled: true, algorithms: [gzip], min_bytes: 16 }} }}
defaults: {{ cors: {{ origins: ["https://app.example.com"] }} }}
routes:
  - path: /big
    respond: {{ body: '[range(0; 500)]' }}
"#,
        path.display()
    );
    let gw = gateway(&yaml, &stubs).await;
    let url = format!("http://{}", gw.addr);

    let gz = request(
        &format!("{url}/big"),
        &[("x-request-id", "log-gzip"), ("accept-encoding", "gzip")],
    )
    .await;
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    let c = client(false);
    let preflight = [
        ("origin", "https://app.example.com"),
        ("access-control-request-method", "GET"),
    ];
    let ok = send(
        &c,
        Method::OPTIONS,
        &format!("{url}/big"),
        &[
            preflight[0],
            preflight[1],
            ("x-request-id", "log-preflight"),
        ],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(ok.status, 204);
    let refused = send(
        &c,
        Method::OPTIONS,
        &format!("{url}/big"),
        &[
            ("origin", "https://evil.example"),
            preflight[1],
            ("x-request-id", "log-cors-refused"),
        ],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(refused.status, 403);

    wait_until("three access log lines", || lines(&path).len() >= 3).await;
    let all = lines(&path);
    let by_id = |id: &str| {
        all.iter()
            .find(|l| l["request_id"] == id)
            .unwrap_or_else(|| panic!("no line for {id}: {all:#?}"))
            .clone()
    };
    let l = by_id("log-gzip");
    assert_eq!(l["route"], "/big");
    assert_eq!(
        l["bytes_out"].as_u64().unwrap(),
        gz.body.len() as u64,
        "the bytes sent, compressed"
    );
    let plain = serde_json::to_vec(&(0..500).collect::<Vec<_>>()).unwrap();
    assert!(gz.body.len() < plain.len() / 2, "{} bytes", gz.body.len());

    let l = by_id("log-preflight");
    assert_eq!(
        (l["method"].clone(), l["status"].clone()),
        ("OPTIONS".into(), 204.into())
    );
    assert_eq!(l["path"], "/big");
    assert_eq!(
        l["route"],
        serde_json::Value::Null,
        "answered before routing"
    );
    assert_eq!(l["bytes_out"], 0);
    assert_eq!(l["client"], "127.0.0.1");

    let l = by_id("log-cors-refused");
    assert_eq!(l["status"], 403);
    assert_eq!(l["error"], "cors_refused");
    let _ = std::fs::remove_file(&path);
}
