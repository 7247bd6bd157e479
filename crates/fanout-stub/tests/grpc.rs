//! gRPC routes end to end: a stub loaded from a `stubs.yaml` next to its `.proto` files, called by
//! a real gRPC client (tonic over a hyper HTTP/2 client) and by hand-made HTTP/2 requests for
//! what a well-behaved client never sends; config errors with their positions.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use fanout_stub::{RouteStats, RouteUpdate, StubServer};
use fanout_testkit::h1::{get, put_json};
use fanout_testkit::{PATIENCE, capture_logs, no_vars, wait_until};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use tokio::net::TcpStream;
use tonic::Code;

const USERS_PROTO: &str = r#"syntax = "proto3";
package demo.v1;

service Users {
  rpc GetUser(GetUserRequest) returns (User);
  rpc Delete(GetUserRequest) returns (User);
  rpc Find(GetUserRequest) returns (User);
  rpc Broken(GetUserRequest) returns (User);
  rpc Slow(GetUserRequest) returns (User);
  rpc Watch(GetUserRequest) returns (stream User);
}
message GetUserRequest {
  string id = 1;
  int32 page = 2;
}
message User {
  string id = 1;
  string name = 2;
  int64 karma = 3;
  repeated string tags = 4;
}
"#;

const STUBS: &str = r#"protos:
  files: [demo/v1/users.proto]
  include: [protos]
services:
  users:
    listen: 127.0.0.1:0
    routes:
      - grpc: demo.v1.Users/GetUser
        latency: 2ms
        headers: {x-served-by: stub}
        body: >-
          {id: $request.body.id, name: "User \($request.body.id)",
           karma: ($request.body.id | length),
           tags: [$request.method, $request.path, ($request.headers["x-tenant"] // "none"),
                  ($request.body | keys | join(","))]}
      - grpc: demo.v1.Users/Delete
        grpc_status: UNAVAILABLE
        grpc_message: "down for maintenance: ремонт 100%"
      - grpc: demo.v1.Users/Find
        grpc_status: 5
      - grpc: demo.v1.Users/Broken
        body: '{id: "x", nmae: "typo"}'
      - grpc: demo.v1.Users/Slow
        body: '{id: $request.body.id}'
      - path: /health
        body: '"ok"'
"#;

#[derive(Clone, PartialEq, prost::Message)]
struct GetUserRequest {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int32, tag = "2")]
    page: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct User {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(int64, tag = "3")]
    karma: i64,
    #[prost(string, repeated, tag = "4")]
    tags: Vec<String>,
}

/// A fresh directory holding `stubs.yaml` and `protos/demo/v1/users.proto`; the path of the
/// `stubs.yaml`.
fn stub_dir(yaml: &str, proto: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "fanout-stub-grpc-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let proto_path = dir.join("protos/demo/v1/users.proto");
    std::fs::create_dir_all(proto_path.parent().unwrap()).unwrap();
    std::fs::write(&proto_path, proto).unwrap();
    let file = dir.join("stubs.yaml");
    std::fs::write(&file, yaml).unwrap();
    file
}

async fn start(yaml: &str) -> StubServer {
    let file = stub_dir(yaml, USERS_PROTO);
    match fanout_stub::load_file(file.to_str().unwrap(), &no_vars) {
        Ok(c) => c.start().await.expect("stub starts"),
        Err(e) => panic!("config should load:\n{e}"),
    }
}

fn load_err(yaml: &str, proto: &str) -> (String, PathBuf) {
    let file = stub_dir(yaml, proto);
    let name = file.to_str().unwrap().to_string();
    match fanout_stub::load_file(&name, &no_vars) {
        Ok(_) => panic!("config should not load:\n{yaml}"),
        Err(e) => (e.to_string(), file),
    }
}

type Grpc = tonic::client::Grpc<Client<HttpConnector, tonic::body::Body>>;

/// A gRPC client for `addr` (HTTP/2 prior knowledge, pooled connections).
fn client(addr: SocketAddr) -> Grpc {
    let http = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    tonic::client::Grpc::with_origin(http, format!("http://{addr}").parse().unwrap())
}

async fn call(
    c: &mut Grpc,
    method: &str,
    req: tonic::Request<GetUserRequest>,
) -> Result<User, tonic::Status> {
    c.ready().await.expect("client ready");
    let path = http::uri::PathAndQuery::try_from(method).unwrap();
    let codec = tonic_prost::ProstCodec::<GetUserRequest, User>::default();
    let fut = c.unary(req, path, codec);
    tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("answered in time")
        .map(tonic::Response::into_inner)
}

async fn get_user(c: &mut Grpc, id: &str) -> Result<User, tonic::Status> {
    let req = tonic::Request::new(GetUserRequest {
        id: id.into(),
        page: 0,
    });
    call(c, "/demo.v1.Users/GetUser", req).await
}

fn route(s: &StubServer, key: &str) -> RouteStats {
    s.stats("users").expect("service").routes[key]
}

const GET_USER: &str = "POST /demo.v1.Users/GetUser";

#[tokio::test]
async fn answers_messages_built_from_the_request() {
    let s = start(STUBS).await;
    let addr = s.addr("users").unwrap();
    let mut c = client(addr);

    let mut req = tonic::Request::new(GetUserRequest {
        id: "u42".into(),
        page: 0,
    });
    req.metadata_mut()
        .insert("x-tenant", "acme".parse().unwrap());
    c.ready().await.unwrap();
    let resp = tokio::time::timeout(
        PATIENCE,
        c.unary(
            req,
            http::uri::PathAndQuery::from_static("/demo.v1.Users/GetUser"),
            tonic_prost::ProstCodec::<GetUserRequest, User>::default(),
        ),
    )
    .await
    .unwrap()
    .expect("OK");
    assert_eq!(
        resp.metadata()
            .get("x-served-by")
            .map(|v| v.to_str().unwrap()),
        Some("stub")
    );
    assert_eq!(
        resp.into_inner(),
        User {
            id: "u42".into(),
            name: "User u42".into(),
            karma: 3,
            // $request.method, .path, .headers (the metadata), and the request message's
            // fields: proto names, defaults included (`page` was not sent).
            tags: vec![
                "POST".into(),
                "/demo.v1.Users/GetUser".into(),
                "acme".into(),
                "id,page".into()
            ],
        }
    );
    for i in 0..4 {
        let u = get_user(&mut c, &format!("n{i}")).await.expect("OK");
        assert_eq!(u.name, format!("User n{i}"));
        assert_eq!(u.tags[2], "none");
    }

    // Counted like an HTTP route; every call slept its latency (2ms).
    let r = route(&s, GET_USER);
    assert_eq!((r.requests, r.completed, r.aborted), (5, 5, 0));
    assert_eq!(r.overshoot_count, 5, "latency applied to every call: {r:?}");
    let stats = get(addr, "/__stub/stats").await.json();
    assert_eq!(stats["routes"][GET_USER]["completed"], 5);
    // HTTP/1.1 on the same port.
    assert_eq!(get(addr, "/health").await.json(), "ok");
}

#[tokio::test]
async fn grpc_status_routes_answer_trailers_only() {
    let s = start(STUBS).await;
    let addr = s.addr("users").unwrap();
    let mut c = client(addr);
    let req = || tonic::Request::new(GetUserRequest::default());

    let e = call(&mut c, "/demo.v1.Users/Delete", req())
        .await
        .expect_err("UNAVAILABLE");
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(e.message(), "down for maintenance: ремонт 100%");
    let e = call(&mut c, "/demo.v1.Users/Find", req())
        .await
        .expect_err("NOT_FOUND");
    assert_eq!((e.code(), e.message()), (Code::NotFound, ""));

    // Trailers-only: the status is in the headers, with nothing after them.
    let r = raw(
        addr,
        "/demo.v1.Users/Delete",
        "application/grpc",
        frame(&[]),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["grpc-status"], "14");
    assert_eq!(
        r.headers["grpc-message"],
        "down for maintenance: %D1%80%D0%B5%D0%BC%D0%BE%D0%BD%D1%82 100%25"
    );
    assert!(r.body.is_empty() && r.trailers.is_none(), "{r:?}");
    // A normal answer: one message, then the status in trailers.
    let r = raw(addr, "/demo.v1.Users/Slow", "application/grpc", frame(&[])).await;
    assert_eq!(r.headers["content-type"], "application/grpc");
    assert!(r.headers.get("grpc-status").is_none(), "{r:?}");
    assert_eq!(r.trailers.as_ref().unwrap()["grpc-status"], "0");
    assert_eq!(&r.body[..], &[0, 0, 0, 0, 0], "an empty User, framed");

    let delete = route(&s, "POST /demo.v1.Users/Delete");
    assert_eq!((delete.requests, delete.completed), (2, 2));
}

#[tokio::test]
async fn an_answer_that_does_not_fit_the_message_is_internal_and_logged() {
    let logs = capture_logs();
    let s = start(STUBS).await;
    let mut c = client(s.addr("users").unwrap());
    let e = call(
        &mut c,
        "/demo.v1.Users/Broken",
        tonic::Request::new(GetUserRequest::default()),
    )
    .await
    .expect_err("INTERNAL");
    assert_eq!(e.code(), Code::Internal);
    assert!(e.message().contains("nmae"), "{}", e.message());
    assert!(e.message().contains("demo.v1.User"), "{}", e.message());
    let lines = logs.lines_with("POST /demo.v1.Users/Broken");
    assert!(lines.iter().any(|l| l.contains("nmae")), "{lines:?}");
    assert_eq!(route(&s, "POST /demo.v1.Users/Broken").completed, 1);
}

/// A request body that yields `first` and then never ends.
struct Stuck(Option<Bytes>);

impl Body for Stuck {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.0.take() {
            Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
            None => Poll::Pending,
        }
    }
    fn is_end_stream(&self) -> bool {
        false
    }
    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[derive(Debug)]
struct Raw {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl Raw {
    /// `grpc-status`, from the trailers or (trailers-only) the headers.
    fn grpc_status(&self) -> Option<String> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .map(|v| v.to_str().unwrap().to_string())
    }
    fn grpc_message(&self) -> String {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .or_else(|| self.headers.get("grpc-message"))
            .map(|v| fanout_grpc::status::decode_message(v.as_bytes()))
            .unwrap_or_default()
    }
}

/// One HTTP/2 request (prior knowledge) on a fresh connection; the whole answer is read.
async fn raw<B>(addr: SocketAddr, path: &str, content_type: &str, body: B) -> Raw
where
    B: Body<Data = Bytes, Error = Infallible> + Send + Unpin + 'static,
{
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::post(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(body)
        .unwrap();
    let answer = async {
        let resp = send.send_request(req).await.expect("answer");
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        Raw {
            status: parts.status,
            headers: parts.headers,
            body: collected.to_bytes(),
            trailers,
        }
    };
    tokio::time::timeout(PATIENCE, answer)
        .await
        .expect("answered, no hang")
}

fn frame(msg: &[u8]) -> Full<Bytes> {
    Full::new(fanout_grpc::frame::encode(msg))
}

#[tokio::test]
async fn unknown_methods_and_bad_requests_get_grpc_statuses() {
    let s = start(STUBS).await;
    let addr = s.addr("users").unwrap();
    let grpc = "application/grpc";
    let status = |r: &Raw| {
        r.grpc_status()
            .unwrap_or_else(|| panic!("no grpc-status: {r:?}"))
    };

    // Methods not served: unknown, streaming (in the .proto, not servable), an HTTP route's path.
    for path in [
        "/demo.v1.Users/Nope",
        "/demo.v1.Users/Watch",
        "/other.Svc/M",
        "/health",
    ] {
        let r = raw(addr, path, grpc, frame(&[])).await;
        assert_eq!(
            (r.status, status(&r)),
            (StatusCode::OK, "12".into()),
            "{path}"
        );
        assert!(r.grpc_message().contains(path), "{r:?}");
    }

    let method = "/demo.v1.Users/GetUser";
    // A truncated frame, an empty body, two messages, a bad flag: INVALID_ARGUMENT.
    let bodies: [&[u8]; 4] = [
        &[0, 0, 0, 0, 9, 1, 2],
        &[],
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[7, 0, 0, 0, 0],
    ];
    for b in bodies {
        let r = raw(addr, method, grpc, Full::new(Bytes::from_static(b))).await;
        assert_eq!(status(&r), "3", "{b:?}: {r:?}");
    }
    // Not protobuf of the request type (field 1 announced 100 bytes long, then nothing).
    let r = raw(addr, method, grpc, frame(&[0x0a, 100])).await;
    assert_eq!(status(&r), "3", "{r:?}");
    assert!(r.grpc_message().contains("demo.v1.GetUserRequest"), "{r:?}");
    // Compressed: UNIMPLEMENTED, and what is accepted.
    let r = raw(
        addr,
        method,
        grpc,
        Full::new(Bytes::from_static(&[1, 0, 0, 0, 1, 0])),
    )
    .await;
    assert_eq!(status(&r), "12", "{r:?}");
    assert_eq!(r.headers["grpc-accept-encoding"], "identity");
    // Oversized: refused as soon as the frame header announces it, while the body is still
    // being sent (it never ends).
    let huge = Bytes::from_static(&[0, 0x7f, 0xff, 0xff, 0xff, 1, 2, 3]);
    let r = raw(addr, method, grpc, Stuck(Some(huge))).await;
    assert_eq!(status(&r), "8", "{r:?}");
    // A gRPC subtype fanout does not speak, and a request that is not gRPC at all.
    let r = raw(addr, method, "application/grpc+json", frame(b"{}")).await;
    assert_eq!(status(&r), "12", "{r:?}");
    let r = raw(
        addr,
        method,
        "application/json",
        Full::new(Bytes::from("{}")),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{r:?}");

    // An oversized message from a real client.
    let mut c = client(addr);
    let e = get_user_big(&mut c).await.expect_err("too large");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");

    // Still serving; the refusals reached the route and were answered, the unknown methods did
    // not reach any route.
    assert_eq!(get_user(&mut c, "ok").await.expect("OK").name, "User ok");
    let r = route(&s, GET_USER);
    assert_eq!((r.requests, r.completed, r.in_flight), (11, 11, 0), "{r:?}");
    assert_eq!(r.overshoot_count, 1, "only the valid call slept: {r:?}");
    let stats = s.stats("users").unwrap();
    assert!(
        !stats.routes.keys().any(|k| k.contains("Nope")),
        "{stats:?}"
    );
}

async fn get_user_big(c: &mut Grpc) -> Result<User, tonic::Status> {
    let req = tonic::Request::new(GetUserRequest {
        id: "x".repeat(fanout_stub::MAX_GRPC_MESSAGE_BYTES + 1),
        page: 0,
    });
    call(c, "/demo.v1.Users/GetUser", req).await
}

#[tokio::test]
async fn faults_and_statuses_change_at_run_time() {
    let s = start(STUBS).await;
    let addr = s.addr("users").unwrap();
    let mut c = client(addr);
    let update = |v: serde_json::Value| -> RouteUpdate { serde_json::from_value(v).unwrap() };

    // A gRPC status fault, in process.
    s.update_route(
        "users",
        GET_USER,
        update(
            json!({"faults": [{"grpc_status": "RESOURCE_EXHAUSTED", "grpc_message": "slow down"}]}),
        ),
    )
    .unwrap();
    let e = get_user(&mut c, "a").await.expect_err("fault");
    assert_eq!(
        (e.code(), e.message()),
        (Code::ResourceExhausted, "slow down")
    );
    assert_eq!(route(&s, GET_USER).faults.grpc_status, 1);

    // An HTTP status fault over the admin API: the code it maps to.
    let r = put_json(
        addr,
        "/__stub/routes",
        &json!({"route": GET_USER, "faults": [{"status": 503, "body": "\"busy\""}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let e = get_user(&mut c, "a").await.expect_err("fault");
    assert_eq!((e.code(), e.message()), (Code::Unavailable, "busy"));
    assert_eq!(route(&s, GET_USER).faults.status, 1);

    // The route's own status, over the admin API; the view shows it.
    let r = put_json(
        addr,
        "/__stub/routes",
        &json!({"route": GET_USER, "faults": [], "grpc_status": "PERMISSION_DENIED",
                "grpc_message": "no"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["grpc_status"], "PERMISSION_DENIED");
    let e = get_user(&mut c, "a").await.expect_err("status");
    assert_eq!((e.code(), e.message()), (Code::PermissionDenied, "no"));
    let views = get(addr, "/__stub/routes").await.json();
    assert_eq!(views["routes"][0]["route"], GET_USER);
    assert_eq!(views["routes"][0]["grpc_message"], "no");
    assert!(
        views["routes"][5].get("grpc_status").is_none(),
        "HTTP route: {views}"
    );
    // Not for an HTTP route.
    let r = put_json(
        addr,
        "/__stub/routes",
        &json!({"route": "GET /health", "grpc_status": "INTERNAL"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());

    // A whole behaviour swapped in process.
    let mut b = (*s.behaviour("users", GET_USER).unwrap()).clone();
    b.grpc_status = fanout_grpc::Code::Ok;
    b.status = StatusCode::GATEWAY_TIMEOUT;
    assert!(s.set_behaviour("users", GET_USER, b));
    let e = get_user(&mut c, "a").await.expect_err("status");
    assert_eq!(e.code(), Code::DeadlineExceeded);

    // Healed.
    s.update_route(
        "users",
        GET_USER,
        update(json!({"status": 200, "grpc_status": "OK", "grpc_message": ""})),
    )
    .unwrap();
    assert_eq!(get_user(&mut c, "b").await.expect("OK").name, "User b");
}

#[tokio::test]
async fn connection_and_body_faults_on_grpc_routes() {
    let s = start(STUBS).await;
    let addr = s.addr("users").unwrap();
    let slow = "POST /demo.v1.Users/Slow";
    let set = |faults: serde_json::Value| {
        let u: RouteUpdate = serde_json::from_value(json!({ "faults": faults })).unwrap();
        s.update_route("users", slow, u).unwrap();
    };
    let req = |id: &str| {
        tonic::Request::new(GetUserRequest {
            id: id.into(),
            page: 0,
        })
    };
    let path = "/demo.v1.Users/Slow";

    // slow_body: the framed message arrives in pieces, intact, then the trailers.
    set(json!([{"slow_body": {"chunks": 4, "duration": "20ms"}}]));
    let u = call(&mut client(addr), path, req("dribbled"))
        .await
        .expect("OK");
    assert_eq!(u.id, "dribbled");
    // malformed: a message no decoder accepts.
    set(json!([{"malformed": {}}]));
    let e = call(&mut client(addr), path, req("m"))
        .await
        .expect_err("malformed");
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    // close_after_headers and reset: the call fails at the connection level.
    set(json!([{"close_after_headers": {}}]));
    call(&mut client(addr), path, req("c"))
        .await
        .expect_err("closed");
    set(json!([{"reset": {}}]));
    call(&mut client(addr), path, req("r"))
        .await
        .expect_err("reset");
    // hang: no answer until the client gives up.
    set(json!([{"hang": {}}]));
    let pending = tokio::spawn(async move { call(&mut client(addr), path, req("h")).await });
    wait_until("the hanging call reached the route", || {
        route(&s, slow).in_flight == 1
    })
    .await;
    pending.abort();
    wait_until("the hanging call counted as aborted", || {
        route(&s, slow).aborted == 1
    })
    .await;

    let r = route(&s, slow);
    let f = r.faults;
    assert_eq!(
        (
            f.slow_body,
            f.malformed,
            f.close_after_headers,
            f.reset,
            f.hang
        ),
        (1, 1, 1, 1, 1),
        "{r:?}"
    );
    set(json!([]));
    let u = call(&mut client(addr), path, req("fine"))
        .await
        .expect("OK");
    assert_eq!(u.id, "fine");
}

fn proto_with_error() -> String {
    USERS_PROTO.replace("  int32 page = 2;", "  int32 page = 2\n  strin x = 3;")
}

#[test]
fn config_errors_point_at_their_place() {
    let head = "protos:\n  files: [demo/v1/users.proto]\n  include: [protos]\nservices:\n  users:\n    listen: 127.0.0.1:0\n    routes:\n";

    // An unknown method: line:col of the `grpc` value, and the closest name.
    let (e, file) = load_err(
        &format!("{head}      - grpc: demo.v1.Users/GetUsr\n"),
        USERS_PROTO,
    );
    let at = format!("{}:8:15: ", file.display());
    assert!(e.starts_with(&at), "{e}");
    assert!(e.contains("has no method `GetUsr`"), "{e}");
    assert!(e.contains("did you mean `demo.v1.Users/GetUser`?"), "{e}");
    // An unknown service.
    let (e, _) = load_err(
        &format!("{head}      - grpc: demo.v1.User/GetUser\n"),
        USERS_PROTO,
    );
    assert!(e.contains(":8:15: "), "{e}");
    assert!(e.contains("did you mean `demo.v1.Users/GetUser`?"), "{e}");
    // Streaming methods are not served.
    let (e, _) = load_err(
        &format!("{head}      - grpc: demo.v1.Users/Watch\n"),
        USERS_PROTO,
    );
    assert!(e.contains(":8:15: ") && e.contains("streaming"), "{e}");
    // `grpc` with `path`, or `method`, or an HTTP `status`; gRPC fields on an HTTP route.
    let cases = [
        (
            "      - {path: /x, grpc: demo.v1.Users/GetUser}\n",
            ":8:",
            "either `path` or `grpc`",
        ),
        (
            "      - grpc: demo.v1.Users/GetUser\n        method: GET\n",
            ":9:17: ",
            "no `method`",
        ),
        (
            "      - grpc: demo.v1.Users/GetUser\n        status: 503\n",
            ":9:17: ",
            "no HTTP `status`",
        ),
        (
            "      - path: /x\n        grpc_status: UNAVAILABLE\n",
            ":9:22: ",
            "for `grpc` routes",
        ),
        (
            "      - grpc: demo.v1.Users/GetUser\n        grpc_status: UNAVAILBLE\n",
            ":9:",
            "did you mean `UNAVAILABLE`?",
        ),
        (
            "      - grpc: demo.v1.Users/GetUser\n        raw_body: x\n",
            ":9:",
            "no `raw_body`",
        ),
        ("      - method: GET\n", ":8:", "needs `path`"),
    ];
    for (route, pos, words) in cases {
        let (e, _) = load_err(&format!("{head}{route}"), USERS_PROTO);
        assert!(e.contains(pos) && e.contains(words), "{route}: {e}");
    }

    // `grpc` without `protos`.
    let (e, file) = load_err(
        "services:\n  users:\n    listen: 127.0.0.1:0\n    routes:\n      - grpc: demo.v1.Users/GetUser\n",
        USERS_PROTO,
    );
    assert!(e.starts_with(&format!("{}:5:15: ", file.display())), "{e}");
    assert!(e.contains("hint: add a top-level `protos:`"), "{e}");

    // A .proto error: at its own place in the .proto file, once (not again for each route).
    let (e, file) = load_err(
        &format!("{head}      - grpc: demo.v1.Users/GetUser\n"),
        &proto_with_error(),
    );
    let proto = file.parent().unwrap().join("protos/demo/v1/users.proto");
    assert!(e.starts_with(&format!("{}:15:", proto.display())), "{e}");
    assert_eq!(e.matches("hint:").count(), 1, "{e}");
    // A .proto file that is not there: at its entry in `files`.
    let (e, file) = load_err(
        "protos:\n  files: [demo/v1/nope.proto]\n  include: [protos]\nservices:\n  users:\n    listen: 127.0.0.1:0\n",
        USERS_PROTO,
    );
    assert!(e.starts_with(&format!("{}:2:11: ", file.display())), "{e}");
    assert!(e.contains("nope.proto"), "{e}");
}

#[test]
fn protos_resolve_against_the_directory_given() {
    let file = stub_dir("", USERS_PROTO);
    let dir: &Path = file.parent().unwrap();
    let yaml = "protos: {files: [demo/v1/users.proto], include: [protos]}\nservices:\n  users:\n    listen: 127.0.0.1:0\n    routes:\n      - grpc: demo.v1.Users/GetUser\n";
    let c = fanout_stub::load_in("<embedded>", yaml, &no_vars, Some(dir)).expect("loads");
    assert_eq!(c.routes("users").unwrap(), [GET_USER]);
    // Without a directory, relative to the current one (where there is no `protos/`).
    let e = fanout_stub::load_in("<embedded>", yaml, &no_vars, None)
        .expect_err("not found")
        .to_string();
    assert!(e.contains("users.proto"), "{e}");
}

/// The block of `doc` that follows the fence line `fence`.
fn doc_block(doc: &str, fence: &str) -> String {
    let start = doc
        .lines()
        .position(|l| l.trim_end() == fence)
        .unwrap_or_else(|| panic!("no {fence} block"));
    doc.lines()
        .skip(start + 1)
        .take_while(|l| l.trim_end() != "```")
        .map(|l| format!("{l}\n"))
        .collect()
}

#[derive(Clone, PartialEq, prost::Message)]
struct DocUser {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(string, repeated, tag = "3")]
    tags: Vec<String>,
}

/// The gRPC example of docs/stubs.md (its `.proto` and its `stubs.yaml`) loads and answers as
/// the page says.
#[tokio::test]
async fn the_documented_example_serves() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/stubs.md"))
        .unwrap();
    let file = stub_dir(
        &doc_block(&doc, "```yaml grpc-example"),
        &doc_block(&doc, "```proto"),
    );
    let stubs = fanout_stub::load_file(file.to_str().unwrap(), &no_vars)
        .unwrap_or_else(|e| panic!("docs/stubs.md gRPC example:\n{e}"));
    let s = stubs.start().await.unwrap();
    // Its faults are random: off for this test.
    let none: RouteUpdate = serde_json::from_value(json!({"faults": []})).unwrap();
    s.update_route("users", GET_USER, none).unwrap();

    let mut c = client(s.addr("users").unwrap());
    c.ready().await.unwrap();
    let mut req = tonic::Request::new(GetUserRequest {
        id: "7".into(),
        page: 0,
    });
    req.metadata_mut()
        .insert("x-tenant", "acme".parse().unwrap());
    let codec = tonic_prost::ProstCodec::<GetUserRequest, DocUser>::default();
    let path = http::uri::PathAndQuery::from_static("/demo.v1.Users/GetUser");
    let u = c.unary(req, path, codec).await.expect("OK").into_inner();
    assert_eq!(
        u,
        DocUser {
            id: "7".into(),
            name: "User 7".into(),
            tags: vec!["acme".into()]
        }
    );
    let e = call(
        &mut c,
        "/demo.v1.Users/Delete",
        tonic::Request::new(GetUserRequest::default()),
    )
    .await
    .expect_err("PERMISSION_DENIED");
    assert_eq!(
        (e.code(), e.message()),
        (Code::PermissionDenied, "read-only stub")
    );
}
