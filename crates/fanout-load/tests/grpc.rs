//! Unary gRPC targets: a real HTTP/2 gRPC server (the testkit's hand-written one, hand-framed
//! messages and trailers) answers by method — OK, UNAVAILABLE in the trailers, NOT_FOUND trailers-only, and
//! no grpc-status at all — and the report counts each by its code. The server decodes every
//! request with hand-written prost structs (not the generator's reflection codec), so the
//! encoding of the JSON message is checked independently.
//!
//! Counts and states only, no timings: these run on a loaded 2-core machine.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use fanout_load::{
    GrpcTemplateError, LoadError, LoadReport, LoadSpec, Protocol, RequestTemplate, Schedule,
    Threshold, check_thresholds, grpc_request, load_protos, run, summary_text,
};
use fanout_testkit::TempDir;
use fanout_testkit::grpc::{
    GrpcRequest, GrpcServer, grpc_answer, grpc_trailers, grpc_trailers_only, grpc_unframe,
    http_answer,
};
use prost::Message;
use std::path::{Path, PathBuf};

const PROTO: &str = r#"syntax = "proto3";
package test.v1;

service Echo {
  rpc Hello(EchoRequest) returns (EchoReply);
  rpc Busy(EchoRequest) returns (EchoReply);
  rpc Missing(EchoRequest) returns (EchoReply);
  rpc Bare(EchoRequest) returns (EchoReply);
  rpc Watch(EchoRequest) returns (stream EchoReply);
}
message Inner { string note = 1; }
message EchoRequest {
  string name = 1;
  int32 count = 2;
  repeated string tags = 3;
  Inner inner = 4;
  int64 big = 5;
}
message EchoReply { string message = 1; }
"#;

/// The request message, written by hand (independent of the reflection codec under test).
#[derive(Clone, PartialEq, prost::Message)]
struct EchoRequest {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int32, tag = "2")]
    count: i32,
    #[prost(string, repeated, tag = "3")]
    tags: Vec<String>,
    #[prost(message, optional, tag = "4")]
    inner: Option<Inner>,
    #[prost(int64, tag = "5")]
    big: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Inner {
    #[prost(string, tag = "1")]
    note: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EchoReply {
    #[prost(string, tag = "1")]
    message: String,
}

const JSON: &str = r#"{"name": "ann", "count": 7, "tags": ["a", "b"], "inner": {"note": "n"}, "big": "9007199254740993"}"#;

fn expected() -> EchoRequest {
    EchoRequest {
        name: "ann".into(),
        count: 7,
        tags: vec!["a".into(), "b".into()],
        inner: Some(Inner { note: "n".into() }),
        big: 9_007_199_254_740_993,
    }
}

/// A temp directory holding `test.proto`, removed on drop.
struct ProtoDir(TempDir);

impl ProtoDir {
    fn new(tag: &str) -> ProtoDir {
        let d = TempDir::new(&format!("load-grpc-{tag}"));
        d.write("test.proto", PROTO);
        ProtoDir(d)
    }

    fn file(&self) -> PathBuf {
        self.0.join("test.proto")
    }
}

/// The request message of a request the server saw, decoded by hand.
fn message(r: &GrpcRequest) -> Option<EchoRequest> {
    unframe(&r.body)
}

fn unframe(body: &[u8]) -> Option<EchoRequest> {
    EchoRequest::decode(grpc_unframe(body)?).ok()
}

/// Whether a request carried gRPC's headers.
fn grpc_headers(r: &GrpcRequest) -> bool {
    r.header("content-type") == Some("application/grpc") && r.header("te") == Some("trailers")
}

/// An h2c gRPC server on 127.0.0.1:0, answering by method.
async fn server() -> GrpcServer {
    GrpcServer::start(|req| {
        let name = unframe(&req.body).map(|m| m.name).unwrap_or_default();
        let reply = EchoReply {
            message: format!("hi {name}"),
        }
        .encode_to_vec();
        match req.path.as_str() {
            // A message, then `grpc-status: 0` in the trailers.
            "/test.v1.Echo/Hello" => grpc_answer(Some(&reply), Some(grpc_trailers("0", None))),
            // No message, UNAVAILABLE in the trailers.
            "/test.v1.Echo/Busy" => grpc_answer(None, Some(grpc_trailers("14", Some("try later")))),
            // Trailers-only: the status in the headers, which end the stream.
            "/test.v1.Echo/Missing" => {
                grpc_trailers_only(grpc_trailers("5", Some("no such thing")))
            }
            // A message and no grpc-status at all (a broken server).
            "/test.v1.Echo/Bare" => grpc_answer(Some(&reply), None),
            _ => http_answer(http::StatusCode::NOT_FOUND),
        }
    })
    .await
}

fn protos(dir: &ProtoDir) -> fanout_load::grpc::ProtoSet {
    load_protos(&[dir.file()], &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn template(set: &fanout_load::grpc::ProtoSet, method: &str) -> RequestTemplate {
    let meta = [("X-Tenant".to_string(), "t1".to_string())];
    grpc_request(set, method, JSON, &meta).unwrap_or_else(|e| panic!("{method}: {e}"))
}

async fn go(spec: &LoadSpec) -> LoadReport {
    let r = run(spec, None).await.unwrap_or_else(|e| panic!("run: {e}"));
    eprintln!("{}", summary_text(&r));
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_counted_by_grpc_code() {
    let dir = ProtoDir::new("codes");
    let set = protos(&dir);
    let server = server().await;
    let mut spec = LoadSpec::new(server.url(), Schedule::parse("const(200,1s)").unwrap());
    spec.protocol = Protocol::Grpc;
    // Round robin: 50 requests each.
    spec.requests = ["Hello", "Busy", "Missing", "Bare"]
        .iter()
        .map(|m| template(&set, &format!("test.v1.Echo/{m}")))
        .collect();
    let r = go(&spec).await;

    assert_eq!(r.protocol, Protocol::Grpc);
    assert_eq!((r.offered, r.completed), (200, 200), "{:?}", r.errors);
    assert_eq!(r.errors.total(), 0);
    assert_eq!(r.ok, 50, "only Hello is OK");
    assert_eq!(r.status_classes.s2xx, 200, "every answer was HTTP 200");
    let codes = r.grpc_status.clone().expect("gRPC runs have grpc_status");
    let want: std::collections::BTreeMap<String, u64> = [
        ("OK", 50),
        ("UNAVAILABLE", 50),
        ("NOT_FOUND", 50),
        ("UNKNOWN", 50),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(codes, want);
    assert_eq!(r.grpc_missing_status, Some(50), "Bare sends no grpc-status");
    assert_eq!(r.rejected, 50, "UNAVAILABLE is a rejection");
    assert!((r.error_rate - 0.75).abs() < 1e-9, "{}", r.error_rate);
    let by_send: u64 = r.by_send_second.iter().map(|s| s.ok).sum();
    assert_eq!(by_send, 50);
    let per_second: u64 = r.seconds.iter().map(|s| s.ok).sum();
    assert_eq!(per_second, 50);

    // Thresholds count non-OK codes as errors.
    let failed = check_thresholds(
        &r,
        &[
            Threshold::parse("errors<1%").unwrap(),
            Threshold::parse("errors<80%").unwrap(),
        ],
    );
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].starts_with("errors<1%"), "{failed:?}");

    let text = summary_text(&r);
    assert!(
        text.contains(
            "grpc       OK 50, UNKNOWN 50, NOT_FOUND 50, UNAVAILABLE 50  (50 without grpc-status)"
        ),
        "{text}"
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["protocol"], "grpc");
    assert_eq!(v["grpc_status"]["UNAVAILABLE"], 50);
    assert_eq!(v["grpc_status"]["OK"], 50);
    assert_eq!(v["grpc_missing_status"], 50);
    let back: LoadReport = serde_json::from_value(v).unwrap();
    assert_eq!(back.grpc_status, r.grpc_status);

    // The server decoded exactly the message the JSON described, with the gRPC headers and
    // the metadata, on every request.
    let seen = server.requests();
    assert_eq!(seen.len(), 200);
    for s in &seen {
        assert_eq!(message(s), Some(expected()), "{}", s.path);
        assert!(grpc_headers(s), "{}: content-type/te", s.path);
        assert_eq!(s.header("x-tenant"), Some("t1"));
    }
    for m in ["Hello", "Busy", "Missing", "Bare"] {
        let path = format!("/test.v1.Echo/{m}");
        assert_eq!(seen.iter().filter(|s| s.path == path).count(), 50, "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_runs_ignore_grpc_status_and_keep_their_json() {
    let dir = ProtoDir::new("h2");
    let set = protos(&dir);
    let server = server().await;
    let mut spec = LoadSpec::new(server.url(), Schedule::parse("const(40,1s)").unwrap());
    // The same gRPC requests over plain HTTP/2: judged by HTTP status, every 200 is ok.
    spec.protocol = Protocol::Http2;
    spec.requests = vec![
        template(&set, "test.v1.Echo/Hello"),
        template(&set, "test.v1.Echo/Busy"),
    ];
    let r = go(&spec).await;
    assert_eq!((r.completed, r.ok, r.rejected), (40, 40, 0));
    assert_eq!(r.grpc_status, None);
    let v = serde_json::to_value(&r).unwrap();
    assert!(v.get("grpc_status").is_none(), "HTTP reports are unchanged");
    assert!(v.get("grpc_missing_status").is_none());
    assert!(!summary_text(&r).contains("grpc "));

    // Over HTTP/1.1 a gRPC request cannot work: refused before the run.
    spec.protocol = Protocol::Http1;
    match run(&spec, None).await {
        Err(LoadError::Request { index: 0, reason }) => {
            assert!(reason.contains("protocol grpc"), "{reason}")
        }
        other => panic!("{:?}", other.map(|r| r.completed)),
    }
}

fn err(set: &fanout_load::grpc::ProtoSet, method: &str, json: &str) -> GrpcTemplateError {
    match grpc_request(set, method, json, &[]) {
        Ok(t) => panic!("{method} {json}: accepted as {} {:?}", t.path, t.body),
        Err(e) => {
            eprintln!("{method} {json}: {e}");
            e
        }
    }
}

#[test]
fn templates_and_their_errors() {
    let dir = ProtoDir::new("errors");
    let set = protos(&dir);

    let t = grpc_request(&set, "/test.v1.Echo/Hello", "{}", &[]).unwrap();
    assert_eq!(t.method, http::Method::POST);
    assert_eq!(t.path, "/test.v1.Echo/Hello");
    assert_eq!(
        t.body.as_ref(),
        &[0, 0, 0, 0, 0],
        "an empty message, framed"
    );
    assert!(
        t.headers
            .contains(&("content-type".into(), "application/grpc".into()))
    );
    assert!(t.headers.contains(&("te".into(), "trailers".into())));
    let full = template(&set, "test.v1.Echo/Hello");
    assert_eq!(unframe(&full.body), Some(expected()));
    // lowerCamelCase names are accepted too.
    let camel = grpc_request(
        &set,
        "test.v1.Echo/Hello",
        r#"{"name": "x", "count": 1}"#,
        &[],
    )
    .unwrap();
    assert_eq!(unframe(&camel.body).map(|m| m.count), Some(1));

    let e = err(&set, "test.v1.Echo/Helo", "{}").to_string();
    assert!(e.contains("has no method `Helo`"), "{e}");
    assert!(e.contains("did you mean `Hello`?"), "{e}");
    assert!(
        e.contains("methods: Hello, Busy, Missing, Bare, Watch"),
        "{e}"
    );
    let e = err(&set, "test.v1.Ecoh/Hello", "{}").to_string();
    assert!(e.contains("did you mean `test.v1.Echo`?"), "{e}");
    let e = err(&set, "Echo/Hello", "{}").to_string();
    assert!(e.contains("did you mean `test.v1.Echo`?"), "{e}");
    let e = err(&set, "Hello", "{}").to_string();
    assert!(e.contains("package.Service/Method"), "{e}");
    assert!(e.contains("services: test.v1.Echo"), "{e}");
    assert!(matches!(
        err(&set, "test.v1.Echo/Nope", "{}"),
        GrpcTemplateError::Method { .. }
    ));

    let e = err(&set, "test.v1.Echo/Watch", "{}");
    assert!(matches!(e, GrpcTemplateError::Streaming { .. }), "{e}");
    assert!(e.to_string().contains("unary calls only"), "{e}");

    let e = err(&set, "test.v1.Echo/Hello", r#"{"nmae": "x"}"#);
    assert!(matches!(e, GrpcTemplateError::Json { .. }), "{e}");
    let e = e.to_string();
    assert!(e.contains("test.v1.EchoRequest at `nmae`"), "{e}");
    assert!(e.contains("did you mean `name`?"), "{e}");
    match err(
        &set,
        "test.v1.Echo/Hello",
        r#"{"name": "x", "count": "many"}"#,
    ) {
        GrpcTemplateError::Json { field, .. } => assert_eq!(field.as_deref(), Some("count")),
        e => panic!("{e}"),
    }
    let e = err(&set, "test.v1.Echo/Hello", r#"{"count": "many"}"#).to_string();
    assert!(e.contains("test.v1.EchoRequest at `count`: "), "{e}");
    let e = err(&set, "test.v1.Echo/Hello", r#"{"inner": {"nope": 1}}"#).to_string();
    assert!(e.contains("at `inner.nope`"), "{e}");
    let e = err(&set, "test.v1.Echo/Hello", r#"{"tags": ["a", 1]}"#).to_string();
    assert!(e.contains("at `tags`"), "{e}");
    let e = err(&set, "test.v1.Echo/Hello", r#"{"name": "x""#).to_string();
    assert!(e.contains("does not fit test.v1.EchoRequest: "), "{e}");

    for (name, value, msg) in [
        ("content-type", "application/json", "set by gRPC itself"),
        ("bad name", "v", "not a valid header name"),
        ("x-ok", "bad\nvalue", "not a valid header value"),
    ] {
        match grpc_request(
            &set,
            "test.v1.Echo/Hello",
            "{}",
            &[(name.to_string(), value.to_string())],
        ) {
            Ok(_) => panic!("metadata {name} accepted"),
            Err(e) => assert!(e.to_string().contains(msg), "{e}"),
        }
    }
}

#[test]
fn proto_files_are_found_next_to_themselves() {
    let dir = ProtoDir::new("paths");
    // A file importing a sibling needs no import path.
    std::fs::write(
        dir.0.join("svc.proto"),
        "syntax = \"proto3\";\npackage svc.v1;\nimport \"test.proto\";\n\
         service S { rpc Call(test.v1.EchoRequest) returns (test.v1.EchoReply); }\n",
    )
    .unwrap();
    let set = load_protos(&[dir.0.join("svc.proto")], &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(grpc_request(&set, "svc.v1.S/Call", JSON, &[]).is_ok());
    // With an import path, a file may be named relative to it.
    let set = load_protos(&[PathBuf::from("svc.proto")], &[dir.0.path().to_path_buf()])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(set.method("svc.v1.S/Call").is_ok());
    // A broken file is reported with its line.
    std::fs::write(dir.0.join("bad.proto"), "syntax = \"proto3\";\nmessage {\n").unwrap();
    let e = load_protos(&[dir.0.join("bad.proto")], &[]).unwrap_err();
    assert!(e.to_string().contains("bad.proto:2:"), "{e}");
    assert!(!Path::new(&dir.0.join("nope.proto")).exists());
    let e = load_protos(&[dir.0.join("nope.proto")], &[]).unwrap_err();
    assert!(e.to_string().contains("nope.proto: no such file"), "{e}");
    let e = load_protos(
        &[PathBuf::from("nope.proto")],
        &[dir.0.path().to_path_buf()],
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("nope.proto: no such file (nor in the import path: /"),
        "{e}"
    );
}
