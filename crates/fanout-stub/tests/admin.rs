//! The admin API for changing routes mid-run (`GET`/`PUT /__stub/routes`, and
//! `StubServer::update_route` in process), and the batch-endpoint pattern from docs/stubs.md.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use fanout_stub::{
    FaultAction, FaultConfig, LatencyConfig, RouteUpdate, RouteUpdateError, RouteView,
};
use fanout_testkit::h1::{get, put_json, send};
use fanout_testkit::start_stubs;
use http::{Method, StatusCode};
use serde_json::json;

const ROUTES: &str = r#"
services:
  api:
    listen: 127.0.0.1:0
    routes:
      - path: /search
        latency: {uniform: {min: 1ms, max: 2ms}}
        body: '{hits: 3}'
        faults: [{status: 503, p: 0.001}]
      - path: /items
        body: '$request.query.ids | split(",") | map({id: ., name: "item \(.)"})'
"#;

#[tokio::test]
async fn get_routes_lists_current_latency_and_faults() {
    let s = start_stubs(ROUTES).await;
    let addr = s.addr("api").expect("addr");
    let r = get(addr, "/__stub/routes").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({"routes": [
            {"route": "GET /search", "status": 200,
             "latency": {"uniform": {"min": "1ms", "max": "2ms"}},
             "faults": [{"status": 503, "p": 0.001}]},
            {"route": "GET /items", "status": 200, "latency": "0ms", "faults": []},
        ]})
    );
    // The same in process.
    let views = s.routes("api").expect("service");
    assert_eq!(views.len(), 2);
    assert_eq!(
        serde_json::to_value(&views).expect("serialize"),
        r.json()["routes"]
    );
    assert!(s.routes("nope").is_none());
}

#[tokio::test]
async fn put_changes_latency_faults_and_status() {
    let s = start_stubs(ROUTES).await;
    let addr = s.addr("api").expect("addr");

    let r = put_json(
        addr,
        "/__stub/routes",
        &json!({"route": "GET /search",
                "latency": {"mixture": [{"p": 0.5, "latency": "1ms"},
                                        {"p": 0.5, "latency": {"lognormal": {"median": "2ms", "sigma": 0.2}}}]},
                "faults": [{"status": 418, "p": 1, "body": "{teapot: $request.query.q}"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.json()["route"], "GET /search");
    assert_eq!(r.json()["faults"][0]["status"], 418);

    let listed = get(addr, "/__stub/routes").await.json();
    let search = &listed["routes"][0];
    assert_eq!(
        search["latency"]["mixture"][1]["latency"]["lognormal"]["sigma"],
        0.2
    );
    assert_eq!(
        search["faults"],
        json!([{"status": 418, "p": 1.0, "body": "{teapot: $request.query.q}"}])
    );
    assert_eq!(search["status"], 200, "status was not given: unchanged");

    let r = get(addr, "/search?q=earl").await;
    assert_eq!(r.status, StatusCode::IM_A_TEAPOT);
    assert_eq!(r.json(), json!({"teapot": "earl"}));

    // Only the status: latency and faults stay; then clear the faults.
    let r = put_json(
        addr,
        "/__stub/routes",
        &json!({"route": "GET /search", "status": 202}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["faults"][0]["status"], 418);
    assert!(r.json()["latency"]["mixture"].is_array());
    let r = put_json(
        addr,
        "/__stub/routes",
        &json!({"route": "GET /search", "faults": []}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = get(addr, "/search").await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.json(), json!({"hits": 3}));

    // Every listed entry is a valid PUT body (GET, edit, PUT back).
    for entry in get(addr, "/__stub/routes").await.json()["routes"]
        .as_array()
        .expect("array")
    {
        let r = put_json(addr, "/__stub/routes", entry).await;
        assert_eq!(r.status, StatusCode::OK, "{entry}");
        assert_eq!(&r.json(), entry);
    }
}

#[tokio::test]
async fn bad_put_is_400_with_a_message() {
    let s = start_stubs(ROUTES).await;
    let addr = s.addr("api").expect("addr");
    let bad = [
        (
            json!({"route": "GET /search", "latency": {"mixture": [{"p": 0.5, "latency": "1ms"}]}}),
            "sum to 0.5",
        ),
        (
            json!({"route": "GET /search", "faults": [{"explode": {}}]}),
            "unknown fault kind `explode`",
        ),
        (
            json!({"route": "GET /search", "faults": [{"hang": {}, "p": 3}]}),
            "faults[0]: fault probability 3",
        ),
        (
            json!({"route": "GET /search", "faults": [{"status": 503, "body": "{a: $nope}"}]}),
            "$nope",
        ),
        (
            json!({"route": "GET /search", "status": 42}),
            "invalid status 42",
        ),
        (
            json!({"route": "GET /search", "latency": "5 parsecs"}),
            "parsecs",
        ),
        (
            json!({"route": "GET /search", "colour": "red"}),
            "unknown field `colour`",
        ),
        (json!({"latency": "5ms"}), "missing field `route`"),
    ];
    for (body, needle) in bad {
        let r = put_json(addr, "/__stub/routes", &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        let msg = r.json()["error"]
            .as_str()
            .expect("error message")
            .to_string();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    let r = send(addr, Method::PUT, "/__stub/routes", "{not json").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("invalid route update"))
    );

    let r = put_json(
        addr,
        "/__stub/routes",
        &json!({"route": "GET /nope", "status": 200}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("GET /nope"))
    );

    let r = send(addr, Method::POST, "/__stub/routes", Bytes::new()).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "GET, PUT");

    // Nothing changed.
    let r = get(addr, "/__stub/routes").await.json();
    assert_eq!(
        r["routes"][0]["faults"],
        json!([{"status": 503, "p": 0.001}])
    );
}

#[tokio::test]
async fn update_route_in_process() {
    let s = start_stubs(ROUTES).await;
    let addr = s.addr("api").expect("addr");
    let update = RouteUpdate {
        faults: Some(vec![FaultConfig {
            p: 1.0,
            action: FaultAction::Status {
                status: 500,
                body: None,
            },
        }]),
        latency: Some(LatencyConfig::Fixed(fanout_config::Dur::millis(1))),
        ..RouteUpdate::default()
    };
    s.update_route("api", "GET /items", update.clone())
        .expect("update applies");
    assert_eq!(
        get(addr, "/items?ids=1").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let view: &RouteView = &s.routes("api").expect("service")[1];
    assert_eq!(
        view.latency,
        LatencyConfig::Fixed(fanout_config::Dur::millis(1))
    );

    assert_eq!(
        s.update_route("nope", "GET /items", update.clone()),
        Err(RouteUpdateError::NoService("nope".into()))
    );
    assert!(matches!(
        s.update_route("api", "POST /items", update),
        Err(RouteUpdateError::NoRoute { .. })
    ));
    // The lab may write updates in YAML too.
    let from_yaml: RouteUpdate =
        serde_saphyr::from_str("latency: {normal: {mean: 5ms, sd: 1ms}}\nfaults: []\n")
            .expect("yaml update");
    s.update_route("api", "GET /items", from_yaml)
        .expect("applies");
    let bad: RouteUpdate =
        serde_json::from_value(json!({"latency": {"stall": {"every": "1s", "duration": "2s"}}}))
            .expect("parses");
    match s.update_route("api", "GET /items", bad) {
        Err(RouteUpdateError::Invalid(msg)) => assert!(msg.contains("shorter"), "{msg}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(
        get(addr, "/items?ids=7").await.json(),
        json!([{"id": "7", "name": "item 7"}])
    );
}

#[tokio::test]
async fn batch_endpoint_answers_one_item_per_id() {
    let s = start_stubs(ROUTES).await;
    let addr = s.addr("api").expect("addr");
    let r = get(addr, "/items?ids=1,2,3").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!([
            {"id": "1", "name": "item 1"},
            {"id": "2", "name": "item 2"},
            {"id": "3", "name": "item 3"},
        ])
    );
}
