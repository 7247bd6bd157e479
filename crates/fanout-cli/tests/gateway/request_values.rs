//! Request values are handled as a browser and curl would: path parameters are percent-decoded
//! like query parameters (400 `bad_path` when they do not decode); a value with characters a URI
//! may not hold, built into a backend call's path, is percent-encoded and reaches the backend; a
//! call that still cannot be built is 500 `invalid_call`, the flow's fault — never retried, never
//! counted against the backend, never opening its breaker. Proven against a real stub, whose
//! `$request.path` is the path exactly as it arrived.

use crate::support::gateway;
use fanout_testkit::*;
use http::Method;
use serde_json::json;
use std::net::SocketAddr;

const STUBS: &str = r#"
services:
  a:
    listen: "${A_ADDR}"
    routes:
      - path: /echo/{*rest}
        body: '{path: $request.path, q: $request.query.q, note: $request.headers["x-note"]}'
"#;

const GATEWAY: &str = r#"
backends:
  a:
    url: "http://${A_ADDR}"
    breaker: { consecutive_failures: 2, open_for: 60s }
    retry: { attempts: 3, backoff: 1ms }
  based:
    url: "http://${A_ADDR}/echo"
    breaker: { consecutive_failures: 2, open_for: 60s }
    retry: { attempts: 3, backoff: 1ms }
routes:
  - path: /x/{id}
    flow: {}
    respond: { body: '{id: $request.params.id, path: $request.path}' }
  - path: /files/{*rest}
    flow: {}
    respond: { body: '{rest: $request.params.rest}' }
  - path: /text
    flow: {}
    respond: { body: '{q: $request.query.q, name: $request.headers["x-name"]}' }
  - path: /built/{id}
    flow:
      e: { http: { backend: a, path: '"/echo/\($request.params.id)"', query: { q: '$request.params.id' } } }
    respond: { body: '$e' }
  - path: /built-query/{id}
    flow:
      e: { http: { backend: a, path: '"/echo/q?q=\($request.params.id)"' } }
    respond: { body: '$e' }
  - path: /const
    flow:
      e: { http: { backend: a, path: '"/echo/a b|\u00e9"' } }
      f: { http: { backend: a, path: '"echo/no-slash"', query: { q: '"x y"' } } }
    respond: { body: '[$e.path, $f.path, $f.q]' }
  - path: /header
    method: POST
    flow:
      note: { http: { backend: a, path: '"/echo/note"', headers: { x-note: '$request.body.note' } } }
    respond: { body: '$note' }
  - path: /long
    method: POST
    flow:
      long: { http: { backend: a, path: '"/echo/\($request.body.p)"' } }
    respond: { body: '$long' }
  - path: /based
    method: POST
    flow:
      based: { http: { backend: based, path: '"/\($request.body.p)"' } }
    respond: { body: '$based' }
"#;

/// The sum of the samples of `name` whose labels include every one of `labels`; `None` when
/// there is none.
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (set, value) = rest.split_once("} ")?;
            labels
                .iter()
                .all(|(k, v)| set.split(',').any(|p| p == format!("{k}=\"{v}\"")))
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

async fn metrics(admin: Option<SocketAddr>) -> String {
    let admin = admin.expect("the admin listener runs");
    let r = get(&format!("http://{admin}/metrics")).await;
    assert_eq!(r.status, 200);
    r.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_parameters_are_percent_decoded() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let get = |path: &str| {
        let (c, url) = (c.clone(), format!("http://{}{path}", gw.addr));
        async move { send(&c, Method::GET, &url, &[], "").await }
    };
    // (path sent, `$request.params.id`)
    let cases = [
        ("/x/a%20b", "a b"),
        ("/x/a+b", "a+b"), // `+` is a space only in a query
        ("/x/%D0%BF%D1%80%D0%B8", "при"),
        ("/x/100%25", "100%"),
        // Routing matched the raw path: `%2F` is part of the one segment, then a `/`.
        ("/x/a%2Fb", "a/b"),
    ];
    for (path, id) in cases {
        let r = get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.json(), json!({"id": id, "path": path}), "{path}");
    }
    let r = get("/files/a%20b/c%2Fd").await;
    assert_eq!(r.json(), json!({"rest": "a b/c/d"}));
    // The query was decoded already; it still is.
    let r = get("/x/7?q=a%20b").await;
    assert_eq!(r.json()["id"], "7");

    for (path, why) in [
        ("/x/%ZZ", "invalid percent-encoding"),
        ("/x/a%4", "invalid percent-encoding"),
        ("/x/%", "invalid percent-encoding"),
        ("/x/%FF", "not UTF-8"),
        ("/x/ok%C3", "not UTF-8"),
        ("/files/a/%zz", "invalid percent-encoding"),
    ] {
        let r = get(path).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.code(), "bad_path", "{path}");
        let e = &r.json()["error"];
        let msg = e["message"].as_str().unwrap();
        let param = if path.starts_with("/files") {
            "`rest`"
        } else {
            "`id`"
        };
        assert!(msg.contains(param) && msg.contains(why), "{path}: {msg}");
        assert_eq!(e["request_id"], r.header("x-request-id").unwrap(), "{path}");
        assert_eq!(e["step"], serde_json::Value::Null, "{path}");
    }
    let m = metrics(gw.admin_addr).await;
    let bad_path = sample(&m, "fanout_errors_total", &[("code", "bad_path")]);
    assert_eq!(bad_path, Some(6.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_or_header_the_flow_reads_that_is_not_utf8_is_refused_like_a_path() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    // Raw header bytes: a request with a header value that is not UTF-8 (obs-text).
    let send = |path: &str, name: &[u8]| {
        let mut req = h1::request(Method::GET, path, "");
        req.headers_mut().insert(
            "x-name",
            http::HeaderValue::from_bytes(name).expect("obs-text is a valid header value"),
        );
        h1::exchange(gw.addr, req)
    };
    let r = send("/text?q=a%20b%D0%BF", "при".as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"q": "a bп", "name": "при"}));
    // Never U+FFFD in place of the bytes sent: refused, naming the part.
    for (path, name, code, names) in [
        ("/text?q=a%FFb", &b"ok"[..], "bad_query", "`q`"),
        ("/text?ok=1&%C3=1", b"ok", "bad_query", "`%C3`"),
        ("/text?q=fine", b"a\xffb", "bad_header", "x-name"),
    ] {
        let r = send(path, name).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.code(), code, "{path}");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            msg.contains(names) && msg.contains("not UTF-8"),
            "{path}: {msg}"
        );
    }
    // A part the flow does not read is not looked at.
    let r = send("/x/7?q=a%FFb", b"a\xffb").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn characters_a_uri_may_not_hold_are_percent_encoded_on_the_way_to_the_backend() {
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    // (the value, as sent in the gateway's path; what the backend's path then holds)
    let cases = [
        ("a%20b", "a%20b", "a b"),
        (
            "%22%3C%3E%7B%7C%7D%5E%60%5C",
            "%22%3C%3E%7B%7C%7D%5E%60%5C",
            "\"<>{|}^`\\",
        ),
        ("%D0%BF%D1%80", "%D0%BF%D1%80", "пр"),
        ("tab%09nl%0A", "tab%09nl%0A", "tab\tnl\n"),
        ("a%23b", "a%23b", "a#b"),
        ("100%25", "100%25", "100%"),
        // Already valid characters are left as they are (`%2F` decoded to `/` stays a `/`).
        ("a%2Fb:c@d", "a/b:c@d", "a/b:c@d"),
    ];
    for (sent, arrived, value) in cases {
        let r = send(
            &c,
            Method::GET,
            &format!("http://{}/built/{sent}", gw.addr),
            &[],
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{sent}: {}", r.text());
        // The path as the stub received it; the query (form-encoded by `query:`) decodes back.
        assert_eq!(
            r.json(),
            json!({"path": format!("/echo/{arrived}"), "q": value, "note": null}),
            "{sent}"
        );
        // A query built inside `path` is encoded the same way.
        let r = send(
            &c,
            Method::GET,
            &format!("http://{}/built-query/{sent}", gw.addr),
            &[],
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{sent}: {}", r.text());
        assert_eq!(r.json()["q"], value, "{sent}");
    }
    assert_eq!(calls(&s, "a"), 2 * cases.len() as u64);
    // A constant path (made once, when the config is compiled) is encoded the same way, gets
    // its leading `/`, and takes query parameters.
    let r = send(
        &c,
        Method::GET,
        &format!("http://{}/const", gw.addr),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!(["/echo/a%20b%7C%C3%A9", "/echo/no-slash", "x y"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_cannot_be_built_is_the_flows_fault_never_the_backends() {
    let logs = capture_logs();
    let s = stubs(STUBS).await;
    let gw = gateway(GATEWAY, &s).await;
    let c = client(false);
    let post = |path: &str, body: serde_json::Value, rid: String| {
        let (c, url) = (c.clone(), format!("http://{}{path}", gw.addr));
        async move {
            let headers = [("x-request-id", rid.as_str())];
            send(&c, Method::POST, &url, &headers, body.to_string()).await
        }
    };
    // A header value with a newline and a path longer than any URI (both rejected while the
    // call is built), and a path that becomes too long only behind the backend's base path
    // (rejected by the HTTP client): 5 of each, more than the breakers' threshold of 2.
    let long = "a".repeat(70_000);
    let almost = "a".repeat(65_530);
    for i in 0..5 {
        for (path, body, step, detail) in [
            (
                "/header",
                json!({"note": "a\nb"}),
                "note",
                "is not a valid header value",
            ),
            ("/long", json!({ "p": long }), "long", "uri too long"),
            ("/based", json!({ "p": almost }), "based", "uri too long"),
        ] {
            let rid = format!("reqvalues-{step}-{i}");
            let r = post(path, body, rid.clone()).await;
            assert_eq!(r.status, 500, "{path}: {}", r.text());
            assert_eq!(r.code(), "invalid_call", "{path}");
            let e = &r.json()["error"];
            assert_eq!(e["step"], step, "{path}");
            assert_eq!(e["request_id"], rid.as_str(), "{path}");
            let msg = e["message"].as_str().unwrap();
            assert!(!msg.contains("aaaa") && !msg.contains('\n'), "{msg}");
            if i == 0 {
                // The detail is in the request's log line.
                let lines = logs.lines_with(&rid);
                assert!(
                    lines
                        .iter()
                        .any(|l| l.contains("invalid_call") && l.contains(detail)),
                    "{path}: {lines:?}"
                );
            }
        }
    }
    // Nothing reached the backend, nothing was retried, nothing counted against it.
    assert_eq!(calls(&s, "a"), 0);
    let m = metrics(gw.admin_addr).await;
    let invalid = sample(&m, "fanout_errors_total", &[("code", "invalid_call")]);
    assert_eq!(invalid, Some(15.0));
    for backend in ["a", "based"] {
        let retries = sample(&m, "fanout_retries_total", &[("backend", backend)]);
        assert_eq!(retries, Some(0.0), "no retry of {backend}");
        let breaker = sample(&m, "fanout_breaker_state", &[("backend", backend)]);
        assert_eq!(breaker, Some(0.0), "the breaker of {backend} is closed");
    }
    let class = |backend: &str, step: &str, outcome: &str| {
        sample(
            &m,
            "fanout_backend_calls_total",
            &[("backend", backend), ("step", step), ("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    // The call the HTTP client refused is counted in its own class; the ones refused while
    // they were built were never calls.
    assert_eq!(class("based", "based", "invalid_call"), 5.0);
    assert_eq!(class("a", "long", "invalid_call"), 0.0);
    assert_eq!(class("a", "note", "invalid_call"), 0.0);
    for (backend, step) in [("a", "long"), ("a", "note"), ("based", "based")] {
        for outcome in [
            "ok",
            "timeout",
            "refused",
            "reset",
            "bad_answer",
            "status_4xx",
            "status_5xx",
            "rejected_breaker",
            "other",
        ] {
            assert_eq!(class(backend, step, outcome), 0.0, "{step} {outcome}");
        }
    }
    // The breaker is closed: the next good call goes through.
    let r = get(&format!("http://{}/built/ok", gw.addr)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["path"], "/echo/ok");
    assert_eq!(calls(&s, "a"), 1);
}
