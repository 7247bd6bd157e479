//! gRPC end to end (docs/grpc.md): the grpc-gateway example served to a real gRPC client (tonic,
//! hand-written prost messages), server reflection and health as grpcurl and Kubernetes use
//! them, statuses of failures, and hostile input on the wire — every bad frame answered with a
//! gRPC status, the gateway serving on.

use crate::support::gateway;
use bytes::Bytes;
use fanout_testkit::*;
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::path::Path;
use std::time::Duration;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProfileRequest {
    #[prost(string, tag = "1")]
    pub user_id: String,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct User {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(int32, tag = "3")]
    pub tier: i32,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct Order {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int64, tag = "2")]
    pub total_cents: i64,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct Recommendation {
    #[prost(string, tag = "1")]
    pub sku: String,
    #[prost(double, tag = "2")]
    pub score: f64,
}
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, optional, tag = "1")]
    pub user: Option<User>,
    #[prost(message, repeated, tag = "2")]
    pub orders: Vec<Order>,
    #[prost(message, repeated, tag = "3")]
    pub recommendations: Vec<Recommendation>,
}

const GET_PROFILE: &str = "/demo.v1.ProfileGateway/GetProfile";

/// The example's configs, with its `protos` include directory made absolute (the tests load
/// config text, not the file, so relative directories would be the test's working directory).
pub fn example(file: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grpc-gateway");
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let protos = dir.join("protos");
    text.replace(
        "include: [protos]",
        &format!("include: [\"{}\"]", protos.display()),
    )
}

type H2 = Client<HttpConnector, tonic::body::Body>;

fn h2() -> H2 {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

async fn unary<Req, Resp>(
    addr: std::net::SocketAddr,
    path: &'static str,
    msg: Req,
    metadata: &[(&'static str, &str)],
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let origin: Uri = format!("http://{addr}").parse().unwrap();
    let mut grpc = tonic::client::Grpc::with_origin(h2(), origin);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(msg);
    for (k, v) in metadata {
        req.metadata_mut().insert(*k, v.parse().unwrap());
    }
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    grpc.unary(req, http::uri::PathAndQuery::from_static(path), codec)
        .await
        .map(|r| r.into_inner())
}

pub(crate) async fn get_profile(
    addr: std::net::SocketAddr,
    user: &str,
    metadata: &[(&'static str, &str)],
) -> Result<Profile, tonic::Status> {
    let req = ProfileRequest {
        user_id: user.into(),
    };
    unary(addr, GET_PROFILE, req, metadata).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_gets_the_merged_profile() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let gw = gateway(&example("fanout.yaml"), &stubs).await;
    let p = get_profile(gw.addr, "u1", &[]).await.unwrap();
    assert_eq!(
        p.user,
        Some(User {
            id: "u1".into(),
            name: "User u1".into(),
            tier: 2
        })
    );
    assert_eq!(
        p.orders,
        vec![
            Order {
                id: "u1-o1".into(),
                total_cents: 1250
            },
            Order {
                id: "u1-o2".into(),
                total_cents: 2500
            }
        ]
    );
    assert_eq!(p.recommendations.len(), 2);
    for s in ["users", "orders", "recs"] {
        assert_eq!(calls(&stubs, s), 1, "{s}");
    }

    // An optional HTTP step failing: the profile without it, the step named in the metadata.
    let origin: Uri = format!("http://{}", gw.addr).parse().unwrap();
    let mut grpc = tonic::client::Grpc::with_origin(h2(), origin);
    grpc.ready().await.unwrap();
    let resp = grpc
        .unary(
            tonic::Request::new(ProfileRequest {
                user_id: "u-norecs".into(),
            }),
            http::uri::PathAndQuery::from_static(GET_PROFILE),
            tonic_prost::ProstCodec::<ProfileRequest, Profile>::default(),
        )
        .await
        .unwrap();
    assert_eq!(resp.metadata().get("x-fanout-partial").unwrap(), "recs");
    assert!(resp.into_inner().recommendations.is_empty());

    // A `fail` guard: INVALID_ARGUMENT with the config's message; no backend called.
    stubs.reset_stats();
    let e = get_profile(gw.addr, "", &[]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(e.message(), "user_id is required");
    assert_eq!(
        e.metadata().get("x-fanout-error-code").unwrap(),
        "missing_user_id"
    );
    assert_eq!(calls(&stubs, "users"), 0);

    // A method the gateway does not serve (a backend's, or none at all): UNIMPLEMENTED.
    let e = unary::<_, User>(
        gw.addr,
        "/demo.v1.Users/GetUser",
        ProfileRequest::default(),
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    let e = unary::<_, User>(gw.addr, "/nope.Svc/Nope", ProfileRequest::default(), &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_and_backend_failures_map_to_grpc_codes() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let gw = gateway(&example("fanout.yaml"), &stubs).await;

    // The orders backend stalls: a short grpc-timeout ends the call with DEADLINE_EXCEEDED.
    let update =
        |v: serde_json::Value| -> fanout_stub::RouteUpdate { serde_json::from_value(v).unwrap() };
    stubs
        .update_route(
            "orders",
            "POST /demo.v1.Orders/ListOrders",
            update(serde_json::json!({"latency": "2s"})),
        )
        .unwrap();
    let e = get_profile(gw.addr, "u1", &[("grpc-timeout", "50m")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");

    // The orders backend answers UNAVAILABLE: the required step fails, the client sees
    // UNAVAILABLE with a safe message (no backend text).
    stubs
        .update_route(
            "orders",
            "POST /demo.v1.Orders/ListOrders",
            update(serde_json::json!({"latency": "1ms", "grpc_status": "UNAVAILABLE", "grpc_message": "db-7.internal down"})),
        )
        .unwrap();
    let e = get_profile(gw.addr, "u1", &[]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(!e.message().contains("db-7"), "{e:?}");

    // A bad grpc-timeout is INVALID_ARGUMENT.
    let e = get_profile(gw.addr, "u1", &[("grpc-timeout", "soon")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_served_services_and_health_follows_readiness() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let stubs = stubs(&example("stubs.yaml")).await;
    let gw = gateway(&example("fanout.yaml"), &stubs).await;
    let origin: Uri = format!("http://{}", gw.addr).parse().unwrap();

    let mut client = ServerReflectionClient::with_origin(h2(), origin.clone());
    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let requests = futures_util::stream::iter(vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "demo.v1.ProfileGateway".into(),
        )),
    ]);
    let mut answers = client
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let first = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else {
        panic!("{first:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert!(
        names.contains(&"demo.v1.ProfileGateway".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"demo.v1.Users".to_string()),
        "a backend's service is not served here: {names:?}"
    );
    let second = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::FileDescriptorResponse(files)) = second.message_response else {
        panic!("{second:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());

    // Health: SERVING while ready; an unknown service is NOT_FOUND.
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let mut health = HealthClient::with_origin(h2(), origin);
    let r = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, 1, "SERVING");
    let r = health
        .check(HealthCheckRequest {
            service: "demo.v1.ProfileGateway".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, 1, "SERVING");
    let e = health
        .check(HealthCheckRequest {
            service: "nope.Svc".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    gw.gateway.health().set_draining();
    let r = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, 2, "NOT_SERVING while draining");
}

/// One raw HTTP/2 exchange: the answer's HTTP status, headers and trailers.
async fn raw(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, HeaderMap, Option<HeaderMap>) {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut req = Request::post(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        client.request(req.body(Full::new(Bytes::from(body))).unwrap()),
    )
    .await
    .expect("no hang")
    .unwrap();
    let status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    let collected = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("no hang")
        .unwrap();
    (status, parts.headers, collected.trailers().cloned())
}

fn grpc_code(headers: &HeaderMap, trailers: &Option<HeaderMap>) -> i32 {
    let v = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .expect("a grpc-status");
    v.to_str().unwrap().parse().unwrap()
}

fn framed(flag: u8, len: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![flag];
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_get_a_grpc_status_and_the_gateway_serves_on() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let config = example("fanout.yaml").replace(
        "routes:",
        "server:\n  grpc: { max_message_bytes: 1024 }\nroutes:",
    );
    let gw = gateway(&config, &stubs).await;
    let grpc = [("content-type", "application/grpc"), ("te", "trailers")];
    // A valid message: `user_id: "u1"`.
    let ok_msg = [0x0a, 0x02, b'u', b'1'];
    let (s, h, t) = raw(gw.addr, GET_PROFILE, &grpc, framed(0, 4, &ok_msg)).await;
    assert_eq!((s, grpc_code(&h, &t)), (200, 0), "a valid raw call works");
    // Like every gRPC server, no `content-length`: the message is framed with its length, and
    // trailers follow the data.
    assert!(h.get("content-length").is_none(), "{h:?}");

    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<u8>, i32);
    let cases: Vec<Case> = vec![
        ("empty body", grpc.to_vec(), vec![], 3),
        ("truncated header", grpc.to_vec(), vec![0, 0, 0], 3),
        (
            "length prefix beyond the body",
            grpc.to_vec(),
            framed(0, 100, &ok_msg),
            3,
        ),
        (
            "two messages to a unary method",
            grpc.to_vec(),
            {
                let mut v = framed(0, 4, &ok_msg);
                v.extend(framed(0, 4, &ok_msg));
                v
            },
            3,
        ),
        (
            "over the size limit",
            grpc.to_vec(),
            framed(0, 5000, &[0u8; 5000]),
            8,
        ),
        (
            "announced 4 GiB",
            grpc.to_vec(),
            framed(0, u32::MAX, &ok_msg),
            8,
        ),
        (
            "compressed flag without compression",
            grpc.to_vec(),
            framed(1, 4, &ok_msg),
            12,
        ),
        ("invalid flag", grpc.to_vec(), framed(9, 4, &ok_msg), 3),
        (
            "invalid protobuf",
            grpc.to_vec(),
            framed(0, 3, &[0xff, 0xff, 0xff]),
            3,
        ),
        (
            "wrong wire type for a field",
            grpc.to_vec(),
            framed(0, 2, &[0x08, 0x01]),
            3,
        ),
        (
            "unknown compression",
            vec![
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-encoding", "snappy"),
            ],
            framed(0, 4, &ok_msg),
            12,
        ),
        (
            "a JSON subtype",
            vec![
                ("content-type", "application/grpc+json"),
                ("te", "trailers"),
            ],
            b"{\"user_id\":\"u1\"}".to_vec(),
            12,
        ),
        (
            "a bad grpc-timeout",
            vec![
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", "99999999999S"),
            ],
            framed(0, 4, &ok_msg),
            3,
        ),
    ];
    for (what, headers, body, want) in cases {
        let (s, h, t) = raw(gw.addr, GET_PROFILE, &headers, body).await;
        assert_eq!(s, 200, "{what}: gRPC failures are HTTP 200");
        assert_eq!(grpc_code(&h, &t), want, "{what}: {h:?} {t:?}");
    }
    // Random frames (a fixed seed): each gets a gRPC status, none hangs or panics.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    for _ in 0..200 {
        let len = rng.random_range(0..48usize);
        let mut body: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if rng.random_bool(0.7) && body.len() >= 5 {
            // Mostly plausible headers: flag 0, a length near the truth.
            body[0] = 0;
            let claimed = (len - 5) as i64 + rng.random_range(-3..=3i64);
            body[1..5].copy_from_slice(&(claimed.max(0) as u32).to_be_bytes());
        }
        let (s, h, t) = raw(gw.addr, GET_PROFILE, &grpc, body.clone()).await;
        assert_eq!(s, 200, "{body:?}");
        let _ = grpc_code(&h, &t);
    }
    let st = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    assert_eq!(st["panics"], 0, "{st}");

    // Still serving.
    let p = get_profile(gw.addr, "u1", &[]).await.unwrap();
    assert_eq!(p.user.unwrap().id, "u1");
}

/// Two replicas of the Users service (one always UNAVAILABLE) and the example's `.proto`.
fn layer_stubs() -> String {
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grpc-gateway/protos");
    format!(
        r#"
protos: {{ files: [demo/v1/profile.proto], include: ["{}"] }}
services:
  good:
    listen: "${{GOOD_ADDR}}"
    routes:
      - grpc: demo.v1.Users/GetUser
        latency: 1ms
        body: '{{id: $request.body.id, name: (($request.headers["grpc-timeout"] // "none") + " " + ($request.headers["content-length"] // "no-length"))}}'
  bad:
    listen: "${{BAD_ADDR}}"
    routes:
      - grpc: demo.v1.Users/GetUser
        grpc_status: UNAVAILABLE
        grpc_message: replica is restarting
  slow:
    listen: "${{SLOW_ADDR}}"
    routes:
      - grpc: demo.v1.Users/GetUser
        latency: 2s
        body: '{{id: $request.body.id}}'
"#,
        protos.display()
    )
}

fn layer_gateway() -> String {
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grpc-gateway/protos");
    format!(
        r#"
protos: {{ files: [demo/v1/profile.proto], include: ["{}"] }}
server:
  admission: {{ max_concurrency: 1, queue: 0 }}
backends:
  users:
    urls: ["http://${{GOOD_ADDR}}", "http://${{BAD_ADDR}}"]
    protocol: grpc
    balance: {{ strategy: round_robin }}
    retry: {{ attempts: 2 }}
    outlier: {{ enabled: false }}
  cached: {{ url: "http://${{GOOD_ADDR}}", protocol: grpc, cache: {{ ttl: 60s }} }}
  slow: {{ url: "http://${{SLOW_ADDR}}", protocol: grpc, timeout: 10s }}
routes:
  - path: /user/{{id}}
    flow:
      user: {{ grpc: {{ backend: users, method: demo.v1.Users/GetUser, message: '{{id: $request.params.id}}' }} }}
    respond: {{ body: '$user' }}
  - path: /once/{{id}}
    flow:
      user:
        grpc: {{ backend: users, method: demo.v1.Users/GetUser, message: '{{id: $request.params.id}}', idempotent: false }}
    respond: {{ body: '$user' }}
  - path: /cached/{{id}}
    flow:
      user: {{ grpc: {{ backend: cached, method: demo.v1.Users/GetUser, message: '{{id: $request.params.id}}' }} }}
    respond: {{ body: '{{id: $user.id}}' }}
  - grpc: demo.v1.ProfileGateway/GetProfile
    deadline: 10s
    flow:
      user: {{ grpc: {{ backend: slow, method: demo.v1.Users/GetUser, message: '{{id: $request.body.user_id}}' }} }}
    respond: {{ body: '{{user: $user}}' }}
"#,
        protos.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_caches_deadlines_and_admission_apply_to_grpc_calls() {
    let stubs = stubs(&layer_stubs()).await;
    let gw = gateway(&layer_gateway(), &stubs).await;
    let c = client(false);
    let url = |p: &str| format!("http://{}{p}", gw.addr);

    // NO_SIDE_EFFECTS: every call the bad replica refuses (UNAVAILABLE) is retried on the good
    // one; the good one was told the attempt's time in grpc-timeout.
    for i in 0..10 {
        let r = send(&c, Method::GET, &url(&format!("/user/u{i}")), &[], "").await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let sent = r.json()["name"].as_str().unwrap().to_string();
        let (name, length) = sent.split_once(' ').unwrap();
        let unit = name.chars().last().unwrap();
        assert!(
            "numSMH".contains(unit) && name.len() >= 2,
            "grpc-timeout sent: {name}"
        );
        // A gRPC message is framed with its length: like gRPC clients, no `content-length`.
        assert_eq!(length, "no-length");
    }
    assert_eq!(calls(&stubs, "good"), 10);
    // Round robin counts retries too: after the first request every first attempt is the bad
    // replica's, and every one of them was retried.
    assert!(calls(&stubs, "bad") >= 5, "{}", calls(&stubs, "bad"));

    // The same method called as not idempotent: never retried, so the bad replica's answers
    // fail their requests (502, the backend's UNAVAILABLE named only in the log).
    stubs.reset_stats();
    let mut failed = 0;
    for i in 0..10 {
        let r = send(&c, Method::GET, &url(&format!("/once/u{i}")), &[], "").await;
        if r.status != 200 {
            assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
            assert!(!String::from_utf8_lossy(&r.body).contains("restarting"));
            failed += 1;
        }
    }
    assert_eq!(failed, calls(&stubs, "bad"));
    assert_eq!(failed + calls(&stubs, "good"), 10, "no retries");
    assert!(failed > 0);

    // Calls without side effects are cached like GETs (keyed by method and message).
    stubs.reset_stats();
    for _ in 0..3 {
        let r = send(&c, Method::GET, &url("/cached/u1"), &[], "").await;
        assert_eq!(r.json(), serde_json::json!({"id": "u1"}));
    }
    let r = send(&c, Method::GET, &url("/cached/u2"), &[], "").await;
    assert_eq!(r.json(), serde_json::json!({"id": "u2"}));
    assert_eq!(calls(&stubs, "good"), 2, "one call per distinct message");

    // Admission: with the only slot taken, a gRPC call is RESOURCE_EXHAUSTED at once.
    let held = tokio::spawn(get_profile(gw.addr, "held", &[]));
    let in_flight = || {
        stubs
            .stats("slow")
            .map(|s| s.routes.values().map(|r| r.in_flight).sum::<u64>())
            .unwrap_or(0)
    };
    wait_until("the slow call is in flight", || in_flight() == 1).await;
    let e = get_profile(gw.addr, "refused", &[]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(held.await.unwrap().unwrap().user.unwrap().id, "held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_recompiles_the_proto_files_and_refuses_broken_ones() {
    let dir = std::env::temp_dir().join(format!("fanout-grpc-reload-{}", std::process::id()));
    let file = dir.join("demo/v1/profile.proto");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grpc-gateway/protos");
    let original = std::fs::read_to_string(protos.join("demo/v1/profile.proto")).unwrap();
    std::fs::write(&file, &original).unwrap();
    let stubs = stubs(&example("stubs.yaml")).await;
    let yaml = example("fanout.yaml").replace(
        &format!("include: [\"{}\"]", protos.display()),
        &format!("include: [\"{}\"]", dir.display()),
    );
    assert!(yaml.contains(&dir.display().to_string()), "{yaml}");
    let gw = gateway(&yaml, &stubs).await;
    assert_eq!(
        get_profile(gw.addr, "u1", &[])
            .await
            .unwrap()
            .user
            .unwrap()
            .id,
        "u1"
    );

    // A syntax error: refused with the .proto file's line and column; the old config serves.
    std::fs::write(&file, original.replace("message User {", "message User {{")).unwrap();
    let e = gw
        .gateway
        .reload(crate::support::config(&yaml, &stubs))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("profile.proto:"), "{e}");
    assert_eq!(
        get_profile(gw.addr, "u1", &[])
            .await
            .unwrap()
            .user
            .unwrap()
            .id,
        "u1"
    );

    // A method the config names is gone: refused at the config's line, with a hint.
    std::fs::write(&file, original.replace("rpc GetUser(", "rpc FetchUser(")).unwrap();
    let e = gw
        .gateway
        .reload(crate::support::config(&yaml, &stubs))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no method `GetUser`"), "{e}");
    assert!(e.contains("fanout.yaml:"), "{e}");

    // A compatible change (a new field) is taken.
    std::fs::write(
        &file,
        original.replace(
            "message ProfileRequest { string user_id = 1; }",
            "message ProfileRequest { string user_id = 1; string locale = 2; }",
        ),
    )
    .unwrap();
    gw.gateway
        .reload(crate::support::config(&yaml, &stubs))
        .await
        .unwrap();
    assert_eq!(
        get_profile(gw.addr, "u1", &[])
            .await
            .unwrap()
            .user
            .unwrap()
            .id,
        "u1"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_errors_point_at_the_config_and_the_proto() {
    let base = example("fanout.yaml");
    let err = |yaml: &str| {
        fanout::load_gateway("fanout.yaml", yaml, &|_| None)
            .err()
            .unwrap_or_else(|| panic!("accepted:\n{yaml}"))
            .to_string()
    };
    // A misspelt method, service, message field (in a step's message and in the answer).
    let e = err(&base.replace("demo.v1.Users/GetUser", "demo.v1.Users/GetUsr"));
    assert!(
        e.contains("fanout.yaml:") && e.contains("has no method `GetUsr`"),
        "{e}"
    );
    assert!(e.contains("did you mean `GetUser`"), "{e}");
    let e = err(&base.replace(
        "grpc: demo.v1.ProfileGateway/GetProfile",
        "grpc: demo.v1.ProfileGatewy/GetProfile",
    ));
    assert!(e.contains("no service `demo.v1.ProfileGatewy`"), "{e}");
    let e = err(&base.replace(
        "'{id: $request.body.user_id}'",
        "'{idd: $request.body.user_id}'",
    ));
    assert!(
        e.contains("message demo.v1.GetUserRequest has no field `idd`"),
        "{e}"
    );
    assert!(e.contains("did you mean `id`"), "{e}");
    let e = err(&base.replace("orders: $orders,", "order: $orders,"));
    assert!(
        e.contains("respond.body: message demo.v1.Profile has no field `order`"),
        "{e}"
    );
    // An HTTP step calling a gRPC backend and the reverse.
    let e = err(&base.replace("http: { backend: recs,", "http: { backend: users,"));
    assert!(e.contains("backend `users` speaks gRPC"), "{e}");
    let e = err(&base.replace("backend: orders", "backend: recs"));
    assert!(e.contains("backend `recs` does not speak gRPC"), "{e}");
    // No .proto files at all; a .proto file that does not compile.
    let no_protos: String = base
        .lines()
        .filter(|l| {
            !l.starts_with("protos:") && !l.contains("files: [demo") && !l.contains("include: [")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let e = err(&no_protos);
    assert!(e.contains("needs `.proto` files"), "{e}");
    let dir = std::env::temp_dir().join(format!("fanout-grpc-bad-proto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("bad.proto"),
        "syntax = \"proto3\";\npackage x;\nmessage A {\n  strin name = 1;\n}\n",
    )
    .unwrap();
    let yaml = format!(
        "protos: {{ files: [bad.proto], include: [\"{}\"] }}\nroutes: []\n",
        dir.display()
    );
    let e = err(&yaml);
    assert!(e.contains("bad.proto:4:"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn explain_describes_grpc_steps() {
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grpc-gateway/fanout.yaml");
    let text = fanout::explain::explain_file(
        &file.display().to_string(),
        &|_| None,
        None,
        fanout::explain::Format::Text,
    )
    .unwrap();
    assert!(
        text.contains("POST /demo.v1.ProfileGateway/GetProfile"),
        "{text}"
    );
    assert!(
        text.contains("grpc demo.v1.Users/GetUser on users"),
        "{text}"
    );
}

/// A rate limit on a gRPC route: over it, RESOURCE_EXHAUSTED (429 `rate_limited`), before any
/// backend call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_grpc_call_is_resource_exhausted() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let limits = "rate_limits:\n  per-user:\n    rate: 1/min\n    burst: 1\n    key: '$request.headers[\"x-user\"]'\ndefaults:\n  rate_limit: [per-user]\n";
    let gw = gateway(&format!("{limits}{}", example("fanout.yaml")), &stubs).await;
    get_profile(gw.addr, "u1", &[("x-user", "ann")])
        .await
        .unwrap();
    stubs.reset_stats();
    let e = get_profile(gw.addr, "u1", &[("x-user", "ann")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        e.metadata().get("x-fanout-error-code").unwrap(),
        "rate_limited"
    );
    assert_eq!(calls(&stubs, "users"), 0);
    // another key has its own budget
    get_profile(gw.addr, "u1", &[("x-user", "bob")])
        .await
        .unwrap();
}
