//! Edge stages are components (issue 70): a stage written outside the gateway — here, in this
//! test crate — plugs in through the public registry alone (`Registry::with_stage`), reads its
//! own section under `stages:`, and runs on HTTP and gRPC routes alike, in the same place of the
//! lifecycle; its refusal is answered in each kind's own way, its status section and metric
//! family appear beside the built-in ones, and an unknown stage name is a config error. A second
//! throw-away stage shows the other phases: on arrival (before routing: an early answer, headers
//! noted for every answer), on the request body, and on the answer.

use crate::support::config;
use fanout_edge::{
    Arrival, BuildCx, Early, EdgeStage, Registration, Rejection, RequestHead, RouteKind, Step,
};
use fanout_proxy::registry::Registry;
use fanout_testkit::*;
use http::StatusCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Requests the throw-away stage saw, by kind (HTTP, gRPC). Process-wide: only the test below
/// registers the stage.
static SEEN: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The throw-away stage: on the routes whose section names a header, a request carrying that
/// header is refused (403 `tagged`).
struct Tag {
    /// By route index: the header that refuses, if the route has the stage.
    routes: Vec<Option<http::HeaderName>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TagConfig {
    refuse_header: String,
}

fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, fanout_config::ConfigErrors> {
    let mut routes = Vec::new();
    for i in 0..cx.config.routes.len() {
        let header = match cx.section("tag", i) {
            Some((v, path)) => {
                let c: TagConfig = cx
                    .read(v, &path)
                    .map_err(|e| fanout_config::ConfigErrors(vec![e]))?;
                Some(http::HeaderName::from_bytes(c.refuse_header.as_bytes()).unwrap())
            }
            None => None,
        };
        routes.push(header);
    }
    Ok(Some(Arc::new(Tag { routes })))
}

impl EdgeStage for Tag {
    fn applies(&self, route: usize, _: RouteKind) -> bool {
        self.routes.get(route).is_some_and(Option::is_some)
    }

    fn on_request<'a>(&'a self, head: &'a mut RequestHead<'_>) -> Step<'a> {
        let kind = match head.kind {
            RouteKind::Http => 0,
            RouteKind::Grpc => 1,
        };
        SEEN[kind].fetch_add(1, Ordering::Relaxed);
        let refuse = self.routes.get(head.route.index).and_then(Option::as_ref);
        match refuse {
            Some(h) if head.parts.headers.contains_key(h) => Step::Refuse(Rejection::new(
                StatusCode::FORBIDDEN,
                "tagged",
                "refused by the tag stage",
            )),
            _ => Step::Next,
        }
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        Some(
            serde_json::json!({ "seen": SEEN[0].load(Ordering::Relaxed) + SEEN[1].load(Ordering::Relaxed) }),
        )
    }

    fn metrics(&self, out: &mut fanout_edge::metrics::Out<'_>) -> std::fmt::Result {
        out.single(
            "test_tag_seen",
            "Requests the tag stage saw",
            fanout_edge::metrics::Value::Counter(
                SEEN[0].load(Ordering::Relaxed) + SEEN[1].load(Ordering::Relaxed),
            ),
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

const TAG: Registration = Registration {
    name: "tag",
    section: true,
    codes: &["tagged"],
    build,
    schema: None,
};

/// The grpc-gateway example plus one HTTP route; the stage's section in `defaults` applies to
/// both routes.
fn yaml(stages: &str) -> String {
    crate::grpc::example("fanout.yaml").replace(
        "routes:\n",
        "routes:\n  - path: /hello\n    respond: { body: '{hi: 1}' }\n",
    ) + &format!("defaults: {{stages: {stages}}}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_from_outside_runs_on_http_and_grpc_routes_through_the_registry() {
    let s = stubs(&crate::grpc::example("stubs.yaml")).await;
    let cfg = config(&yaml("{tag: {refuse_header: x-block}}"), &s);
    let gw = fanout_proxy::Gateway::build_in(&cfg, Registry::standard().with_stage(TAG))
        .unwrap_or_else(|e| panic!("{e}"));
    let gw = fanout::start_gateway(gw, "127.0.0.1:0", Some("127.0.0.1:0"))
        .await
        .unwrap();
    let url = format!("http://{}/hello", gw.addr);

    // HTTP: passes without the header, refused with it (the contract's error body).
    let ok = get(&url).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let c = client(false);
    let refused = send(&c, http::Method::GET, &url, &[("x-block", "1")], "").await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "tagged");
    assert_eq!(SEEN[0].load(Ordering::Relaxed), 2);

    // gRPC: the same stage, the refusal as a gRPC status.
    let ok = crate::grpc::get_profile(gw.addr, "u1", &[]).await;
    assert!(ok.is_ok(), "{ok:?}");
    let e = crate::grpc::get_profile(gw.addr, "u1", &[("x-block", "1")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(e.metadata().get("x-fanout-error-code").unwrap(), "tagged");
    assert_eq!(SEEN[1].load(Ordering::Relaxed), 2);
    assert_eq!(calls(&s, "users"), 1, "the refused call reached no backend");

    // Its status section and its metric family beside the built-in ones.
    let admin = gw.admin_addr.unwrap();
    let status = get(&format!("http://{admin}/__fanout/status")).await.json();
    assert_eq!(status["tag"]["seen"], 4);
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    assert!(metrics.contains("test_tag_seen_total 4"), "{metrics}");
}

#[test]
fn an_unknown_stage_name_is_a_config_error_with_a_suggestion() {
    let vars = std::collections::HashMap::<String, String>::new();
    let lookup = |n: &str| vars.get(n).cloned();
    let cfg = fanout_config::Config::from_yaml(
        "fanout.yaml",
        &yaml("{tagg: {refuse_header: x}}"),
        &lookup,
    )
    .unwrap();
    let err = fanout_proxy::Gateway::build_in(&cfg, Registry::standard().with_stage(TAG))
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(text.contains("unknown edge stage `tagg`"), "{text}");
    assert!(text.contains("did you mean `tag`"), "{text}");
    assert!(text.contains("fanout.yaml:"), "a position: {text}");
    // A section the stage does not accept is an error at its place, in the stage's own words.
    let cfg =
        fanout_config::Config::from_yaml("fanout.yaml", &yaml("{tag: {refuse_headr: x}}"), &lookup)
            .unwrap();
    let text = fanout_proxy::Gateway::build_in(&cfg, Registry::standard().with_stage(TAG))
        .err()
        .expect("refused")
        .to_string();
    assert!(text.contains("defaults.stages.tag"), "{text}");
    assert!(text.contains("refuse_headr"), "{text}");
}

/// Requests the arrival stage saw (before routing, every route kind). Process-wide: only the
/// test below registers the stage.
static ARRIVED: AtomicU64 = AtomicU64::new(0);

/// What the logging phase saw of each request: `METHOD path status route error`.
static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A throw-away stage of the arrival, body and answer phases: every answer carries `x-stamp`,
/// whatever made it; a request with `x-early` is answered 204 before routing; a body reading
/// `shout` reaches the flow as `"SHOUT"`; the answer of a request that sent `x-note: N` gets
/// `x-noted: N` from the answer phase (the note kept on arrival); the logging phase notes every
/// request once done.
struct Stamp;

impl EdgeStage for Stamp {
    fn applies(&self, _: usize, _: RouteKind) -> bool {
        false
    }

    fn on_request<'a>(&'a self, _: &'a mut RequestHead<'_>) -> Step<'a> {
        Step::Next
    }

    fn arrives(&self) -> bool {
        true
    }

    fn on_arrival(&self, a: &mut Arrival<'_>) -> Early {
        ARRIVED.fetch_add(1, Ordering::Relaxed);
        let routes = a.routes().len();
        a.answer_header(
            http::HeaderName::from_static("x-stamp"),
            http::HeaderValue::from(routes),
            false,
        );
        assert!(
            !a.headers.contains_key("x-panic-on-arrival"),
            "a stage that panics on arrival"
        );
        if let Some(n) = a
            .headers
            .get("x-note")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        {
            a.keep(n);
        }
        if a.headers.contains_key("x-early") {
            let mut headers = http::HeaderMap::new();
            headers.insert("x-answered", http::HeaderValue::from_static("early"));
            return Early::Answer {
                status: StatusCode::NO_CONTENT,
                headers,
            };
        }
        Early::Next
    }

    fn reads_body(&self) -> bool {
        true
    }

    fn on_body<'a>(
        &'a self,
        _: &'a http::HeaderMap,
        body: bytes::Bytes,
        _: usize,
        _: fanout_edge::Tools<'a>,
    ) -> fanout_edge::BodyStep<'a> {
        fanout_edge::BodyStep::Done(Ok(match &body[..] {
            b"\"shout\"" => bytes::Bytes::from_static(b"\"SHOUT\""),
            _ => body,
        }))
    }

    fn on_answer<'a>(
        &'a self,
        note: u64,
        answer: &'a mut fanout_edge::Answer,
        _: fanout_edge::Tools<'a>,
    ) -> fanout_edge::Later<'a> {
        assert_ne!(note, 13, "a stage that panics on the answer");
        answer
            .headers_mut()
            .insert("x-noted", http::HeaderValue::from(note));
        fanout_edge::Later::Done
    }

    fn logs(&self) -> bool {
        true
    }

    fn log_want(&self) -> fanout_edge::LogWant {
        fanout_edge::LogWant {
            line: true,
            if_degraded: true,
        }
    }

    fn on_logged(&self, want: fanout_edge::LogWant, done: &fanout_edge::Done<'_>) {
        assert!(want.takes(done));
        let line = format!(
            "{} {} {} {} {}",
            done.method,
            done.path,
            done.status.as_u16(),
            done.route.unwrap_or("-"),
            done.error.unwrap_or("-")
        );
        LOGGED.lock().unwrap().push(line);
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

const STAMP: Registration = Registration {
    name: "stamp",
    section: false,
    codes: &[],
    build: |_| Ok(Some(Arc::new(Stamp))),
    schema: None,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arrival_body_and_answer_phases_answer_early_rewrite_bodies_and_see_every_answer() {
    let s = stubs(&crate::grpc::example("stubs.yaml")).await;
    let yaml = yaml("{}").replace(
        "routes:\n",
        "routes:\n  - path: /echo\n    method: POST\n    respond: { body: '{got: $request.body}' }\n",
    );
    let cfg = config(&yaml, &s);
    let gw = fanout_proxy::Gateway::build_in(&cfg, Registry::standard().with_stage(STAMP))
        .unwrap_or_else(|e| panic!("{e}"));
    let gw = fanout::start_gateway(gw, "127.0.0.1:0", None)
        .await
        .unwrap();
    let c = client(false);
    // The flow's answer and a 404 both carry the noted header (the routes at the path: 1, 0).
    let ok = get(&format!("http://{}/hello", gw.addr)).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.header("x-stamp"), Some("1"));
    let missing = get(&format!("http://{}/nowhere", gw.addr)).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "not_found");
    assert_eq!(missing.header("x-stamp"), Some("0"));
    // Answered on arrival: before routing (a path no route has) and without a flow.
    let early = send(
        &c,
        http::Method::GET,
        &format!("http://{}/nowhere", gw.addr),
        &[("x-early", "1")],
        "",
    )
    .await;
    assert_eq!(early.status, 204, "{}", early.text());
    assert_eq!(early.header("x-answered"), Some("early"));
    assert_eq!(early.header("x-stamp"), Some("0"));
    // The body phase: what the flow reads is what the stage left.
    let echoed = send(
        &c,
        http::Method::POST,
        &format!("http://{}/echo", gw.addr),
        &[("content-type", "application/json"), ("x-note", "7")],
        "\"shout\"",
    )
    .await;
    assert_eq!(echoed.status, 200, "{}", echoed.text());
    assert_eq!(echoed.json(), serde_json::json!({"got": "SHOUT"}));
    // The answer phase, with the note kept on arrival.
    assert_eq!(echoed.header("x-noted"), Some("7"));
    assert_eq!(ok.header("x-noted"), None, "no note kept, no answer phase");
    // A stage that panics on arrival or on the answer: 500 for that request only.
    for h in [("x-panic-on-arrival", "1"), ("x-note", "13")] {
        let r = send(
            &c,
            http::Method::GET,
            &format!("http://{}/hello", gw.addr),
            &[h],
            "",
        )
        .await;
        assert_eq!(r.status, 500, "{h:?}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "internal_error", "{h:?}");
        assert!(r.header("x-request-id").is_some(), "{h:?}");
    }
    assert_eq!(get(&format!("http://{}/hello", gw.addr)).await.status, 200);
    // gRPC goes through the same phase.
    let p = crate::grpc::get_profile(gw.addr, "u1", &[]).await;
    assert!(p.is_ok(), "{p:?}");
    let early = crate::grpc::get_profile(gw.addr, "u1", &[("x-early", "1")]).await;
    assert!(early.is_err(), "answered before the method ran: {early:?}");
    assert_eq!(ARRIVED.load(Ordering::Relaxed), 9);
    // The logging phase saw every request once, whatever answered it (the gRPC answers with
    // the HTTP status their `grpc-status` implies).
    let logged = LOGGED.lock().unwrap().clone();
    assert_eq!(
        logged,
        [
            "GET /hello 200 /hello -",
            "GET /nowhere 404 - not_found",
            "GET /nowhere 204 - -",
            "POST /echo 200 /echo -",
            "GET /hello 500 - internal_error",
            "GET /hello 500 /hello internal_error",
            "GET /hello 200 /hello -",
            "POST /demo.v1.ProfileGateway/GetProfile 200 /demo.v1.ProfileGateway/GetProfile -",
            "POST /demo.v1.ProfileGateway/GetProfile 204 - -",
        ]
    );
    assert_eq!(
        calls(&s, "users"),
        1,
        "only the first gRPC call reached a backend"
    );
}
