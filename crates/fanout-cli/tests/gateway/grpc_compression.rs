//! gRPC per-message compression (docs/grpc.md#compression), both ways, on the wire: a client
//! sending gzip messages and asking for gzip answers (frames built and read by hand, gzip by
//! flate2 — not by the gateway's own code), the refusals (an unknown encoding, a bomb, a
//! corrupt stream), and `grpc` steps to a backend that requires gzip and answers gzip.

use super::grpc::{Profile, ProfileRequest, User, example};
use crate::support::{gateway, gateway_with};
use bytes::Bytes;
use fanout_testkit::grpc::{GrpcBody, GrpcRequest, GrpcServer, grpc_trailers, grpc_trailers_only};
use fanout_testkit::*;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost::Message;
use std::io::{Read, Write};
use std::time::Duration;

const GET_PROFILE: &str = "/demo.v1.ProfileGateway/GetProfile";

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn frame(flag: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![flag];
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// The one message of a framed body: (compressed flag, message bytes as sent).
fn unframe(body: &[u8]) -> (bool, Vec<u8>) {
    assert!(body.len() >= 5, "a frame: {body:?}");
    let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
    assert_eq!(body.len(), 5 + len, "exactly one frame");
    (body[0] == 1, body[5..].to_vec())
}

struct Answer {
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn code(&self) -> i32 {
        let v = self
            .trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .expect("a grpc-status");
        v.to_str().unwrap().parse().unwrap()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// The answer message, inflated when the frame says it is compressed (then `grpc-encoding`
    /// must say gzip).
    fn message(&self) -> Vec<u8> {
        let (compressed, msg) = unframe(&self.body);
        if compressed {
            assert_eq!(self.header("grpc-encoding"), Some("gzip"));
            gunzip(&msg)
        } else {
            msg
        }
    }
}

/// One raw HTTP/2 gRPC exchange.
async fn call(addr: std::net::SocketAddr, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut req = Request::post(format!("http://{addr}{GET_PROFILE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
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
    assert_eq!(resp.status(), 200, "gRPC answers are HTTP 200");
    let (parts, body) = resp.into_parts();
    let collected = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("no hang")
        .unwrap();
    let trailers = collected.trailers().cloned();
    Answer {
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

fn profile_request(user: &str) -> Vec<u8> {
    ProfileRequest {
        user_id: user.into(),
    }
    .encode_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sends_gzip_and_gets_gzip_answers() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let config = example("fanout.yaml").replace(
        "routes:",
        "server:\n  grpc: { max_message_bytes: 1024, compress_min_bytes: 16 }\nroutes:",
    );
    let gw = gateway(&config, &stubs).await;
    let want_user = User {
        id: "u1".into(),
        name: "User u1".into(),
        tier: 2,
    };

    // A gzip request, gzip answers asked for: the answer is compressed, `grpc-encoding: gzip`,
    // never HTTP `content-encoding`; what is accepted is advertised.
    let gz = frame(1, &gzip(&profile_request("u1")));
    let a = call(
        gw.addr,
        &[
            ("grpc-encoding", "gzip"),
            ("grpc-accept-encoding", "identity, deflate, gzip"),
        ],
        gz.clone(),
    )
    .await;
    assert_eq!(a.code(), 0, "{:?} {:?}", a.headers, a.trailers);
    assert_eq!(a.header("grpc-encoding"), Some("gzip"));
    assert_eq!(a.header("grpc-accept-encoding"), Some("gzip, identity"));
    assert!(a.header("content-encoding").is_none(), "{:?}", a.headers);
    assert_eq!(a.body[0], 1, "the answer's compressed flag");
    let p = Profile::decode(&a.message()[..]).unwrap();
    assert_eq!(p.user, Some(want_user.clone()));
    assert_eq!(p.orders.len(), 2);

    // A gzip request from a client that does not take gzip: an uncompressed answer.
    let a = call(gw.addr, &[("grpc-encoding", "gzip")], gz.clone()).await;
    assert_eq!(a.code(), 0);
    assert_eq!(a.body[0], 0, "uncompressed");
    assert!(a.header("grpc-encoding").is_none(), "{:?}", a.headers);
    assert_eq!(
        Profile::decode(&a.message()[..]).unwrap().user,
        Some(want_user.clone())
    );

    // An identity request whose client takes gzip: the answer compressed all the same.
    let a = call(
        gw.addr,
        &[("grpc-accept-encoding", "gzip")],
        frame(0, &profile_request("u1")),
    )
    .await;
    assert_eq!(a.code(), 0);
    assert_eq!(a.body[0], 1);
    assert_eq!(
        Profile::decode(&a.message()[..]).unwrap().user,
        Some(want_user)
    );

    // An encoding the gateway does not have: UNIMPLEMENTED, saying what it accepts.
    let a = call(gw.addr, &[("grpc-encoding", "snappy")], gz.clone()).await;
    assert_eq!(a.code(), 12);
    assert_eq!(a.header("grpc-accept-encoding"), Some("gzip, identity"));
    assert_eq!(
        a.header("x-fanout-error-code"),
        Some("unsupported_compression")
    );

    // A bomb: ½ KiB on the wire, 512 KiB inflated, the limit 1 KiB — RESOURCE_EXHAUSTED.
    let bomb = gzip(&vec![0u8; 512 << 10]);
    assert!(bomb.len() < 1024 - 5, "{}", bomb.len());
    let a = call(gw.addr, &[("grpc-encoding", "gzip")], frame(1, &bomb)).await;
    assert_eq!(a.code(), 8, "{:?}", a.headers);
    assert_eq!(a.header("x-fanout-error-code"), Some("message_too_large"));

    // A compressed flag on bytes that are not gzip: INTERNAL (as grpc-go answers).
    let a = call(
        gw.addr,
        &[("grpc-encoding", "gzip")],
        frame(1, b"definitely not gzip"),
    )
    .await;
    assert_eq!(a.code(), 13, "{:?}", a.headers);

    // A compressed flag without `grpc-encoding`: UNIMPLEMENTED, as before.
    let a = call(gw.addr, &[], gz).await;
    assert_eq!(a.code(), 12);

    // The gateway serves on.
    let a = call(gw.addr, &[], frame(0, &profile_request("u2"))).await;
    assert_eq!(a.code(), 0);
}

/// A message of several gzip members is inflated whole (as an HTTP body is), and bytes after
/// the last member are corrupt: INTERNAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gzip_member_of_a_message_is_inflated_and_trailing_bytes_are_refused() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let gw = gateway(&example("fanout.yaml"), &stubs).await;
    let msg = profile_request("u1");
    let (head, tail) = msg.split_at(msg.len() - 1);
    let members = [gzip(head), gzip(tail)].concat();
    let a = call(gw.addr, &[("grpc-encoding", "gzip")], frame(1, &members)).await;
    assert_eq!(a.code(), 0, "{:?} {:?}", a.headers, a.trailers);
    let p = Profile::decode(&a.message()[..]).unwrap();
    assert_eq!(p.user.unwrap().id, "u1");
    for junk in [&b"junk"[..], &[0u8; 8]] {
        let with_junk = [&gzip(&msg)[..], junk].concat();
        let a = call(gw.addr, &[("grpc-encoding", "gzip")], frame(1, &with_junk)).await;
        assert_eq!(a.code(), 13, "{junk:?}: {:?} {:?}", a.headers, a.trailers);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_compression_has_an_off_switch_and_a_minimum_size() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let gz_headers = [("grpc-accept-encoding", "gzip")];
    let req = frame(0, &profile_request("u1"));
    for (server, compressed) in [
        ("{ compress_answers: false, compress_min_bytes: 0 }", false),
        // The profile is ~60 bytes: under the default minimum (1 KiB).
        ("{}", false),
        ("{ compress_min_bytes: 10 }", true),
    ] {
        let config = example("fanout.yaml")
            .replace("routes:", &format!("server:\n  grpc: {server}\nroutes:"));
        let gw = gateway(&config, &stubs).await;
        let a = call(gw.addr, &gz_headers, req.clone()).await;
        assert_eq!(a.code(), 0, "{server}");
        assert_eq!(a.body[0] == 1, compressed, "{server}");
        assert_eq!(a.header("grpc-encoding").is_some(), compressed, "{server}");
        let p = Profile::decode(&a.message()[..]).unwrap();
        assert_eq!(p.user.unwrap().id, "u1", "{server}");
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetUserRequest {
    #[prost(string, tag = "1")]
    id: String,
}

/// A Users backend that takes only gzip requests (UNIMPLEMENTED otherwise, as a server without
/// identity would answer) and answers gzip — or, with `bomb`, answers a message that inflates
/// to 1 MiB. The user's name has `pad` more `x`s.
async fn gzip_users(bomb: bool, pad: usize) -> GrpcServer {
    GrpcServer::start(move |req: &GrpcRequest| -> Response<GrpcBody> {
        let (compressed, msg) = unframe(&req.body);
        if req.header("grpc-encoding") != Some("gzip") || !compressed {
            let mut t = grpc_trailers("12", Some("gzip only"));
            t.insert("grpc-accept-encoding", HeaderValue::from_static("gzip"));
            return grpc_trailers_only(t);
        }
        let id = GetUserRequest::decode(&gunzip(&msg)[..]).unwrap().id;
        let answer = if bomb {
            vec![0u8; 1 << 20]
        } else {
            User {
                id: id.clone(),
                name: format!("User {id} (gzip){}", "x".repeat(pad)),
                tier: 1,
            }
            .encode_to_vec()
        };
        let body = Full::new(Bytes::from(frame(1, &gzip(&answer))))
            .with_trailers(std::future::ready(Some(Ok(grpc_trailers("0", None)))))
            .boxed();
        let mut r = Response::new(body);
        let h = r.headers_mut();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        h.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        r
    })
    .await
}

fn with_users(config: &str, users: &str) -> String {
    let old = r#"users:  { url: "http://${USERS_ADDR:-127.0.0.1:9201}", protocol: grpc, timeout: 200ms }"#;
    assert!(config.contains(old));
    config.replace(old, &format!("users: {users}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_step_sends_gzip_to_a_backend_that_requires_it_and_reads_gzip_answers() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let users = gzip_users(false, 0).await;
    let base = example("fanout.yaml");

    // Without `grpc_compression`: the backend refuses the identity message.
    let plain = with_users(
        &base,
        &format!(
            "{{ url: \"{}\", protocol: grpc, timeout: 5s }}",
            users.url()
        ),
    );
    let gw = gateway(&plain, &stubs).await;
    let a = call(gw.addr, &[], frame(0, &profile_request("u1"))).await;
    assert_ne!(a.code(), 0, "the backend takes gzip only");
    assert_eq!(users.count(), 1);
    let seen = users.requests();
    assert_eq!(
        seen[0].header("grpc-accept-encoding"),
        Some("gzip, identity")
    );
    assert!(seen[0].header("grpc-encoding").is_none());
    assert_eq!(seen[0].body[0], 0);
    drop(gw);

    // With `grpc_compression: gzip`: the message is sent compressed, the compressed answer read.
    let gzipped = with_users(
        &base,
        &format!(
            "{{ url: \"{}\", protocol: grpc, grpc_compression: gzip, timeout: 5s }}",
            users.url()
        ),
    );
    let gw = gateway(&gzipped, &stubs).await;
    let a = call(gw.addr, &[], frame(0, &profile_request("u7"))).await;
    assert_eq!(a.code(), 0, "{:?} {:?}", a.headers, a.trailers);
    let p = Profile::decode(&a.message()[..]).unwrap();
    assert_eq!(
        p.user,
        Some(User {
            id: "u7".into(),
            name: "User u7 (gzip)".into(),
            tier: 1
        })
    );
    let seen = users.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].header("grpc-encoding"), Some("gzip"));
    assert_eq!(
        seen[1].header("grpc-accept-encoding"),
        Some("gzip, identity")
    );
    assert!(seen[1].header("content-encoding").is_none());
    let (compressed, msg) = unframe(&seen[1].body);
    assert!(compressed);
    assert_eq!(GetUserRequest::decode(&gunzip(&msg)[..]).unwrap().id, "u7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_bomb_from_a_backend_is_a_bad_backend_answer() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let users = gzip_users(true, 0).await;
    let config = with_users(
        &example("fanout.yaml"),
        &format!(
            "{{ url: \"{}\", protocol: grpc, grpc_compression: gzip, max_message_bytes: 4096, timeout: 5s }}",
            users.url()
        ),
    );
    let gw = gateway_with(&config, &stubs, &[]).await;
    let a = call(gw.addr, &[], frame(0, &profile_request("u1"))).await;
    assert_ne!(a.code(), 0);
    assert_eq!(
        a.header("x-fanout-error-code"),
        Some("bad_backend_answer"),
        "{:?}",
        a.headers
    );
    assert_eq!(users.count(), 1);
    // The gateway serves on (the next call is refused the same way, not hung).
    let a = call(gw.addr, &[], frame(0, &profile_request("u2"))).await;
    assert_eq!(a.header("x-fanout-error-code"), Some("bad_backend_answer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inflated_message_counts_in_the_memory_budget() {
    let stubs = stubs(&example("stubs.yaml")).await;
    let config = example("fanout.yaml").replace(
        "routes:",
        "server:\n  bodies: { memory_budget_bytes: 2048 }\nroutes:",
    );
    let gw = gateway(&config, &stubs).await;
    // 3 KB inflated from ~60 bytes: the body fits the budget, the message does not.
    let big = gzip(&profile_request(&"u1".repeat(1500)));
    assert!(big.len() < 200, "{}", big.len());
    let a = call(gw.addr, &[("grpc-encoding", "gzip")], frame(1, &big)).await;
    assert_eq!(
        a.header("x-fanout-error-code"),
        Some("memory_budget_exhausted"),
        "{:?}",
        a.headers
    );
    // A small compressed message fits, and its memory is given back: the next one fits too.
    for user in ["u1", "u2"] {
        let small = gzip(&profile_request(user));
        let a = call(gw.addr, &[("grpc-encoding", "gzip")], frame(1, &small)).await;
        assert_eq!(a.code(), 0, "{user}: {:?}", a.headers);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_compressed_messages_inflate_and_compress_off_the_worker_whole() {
    // A 600 KB answer from the backend, compressed: inflated past `OFFLOAD_BYTES` (256 KiB) on
    // the blocking pool; the gateway's answer (600 KB) compressed on the compute pool; a 300 KB
    // compressed request inflated past `offload_bytes` there too.
    let stubs = stubs(&example("stubs.yaml")).await;
    let users = gzip_users(false, 600_000).await;
    let config = with_users(
        &example("fanout.yaml"),
        &format!(
            "{{ url: \"{}\", protocol: grpc, grpc_compression: gzip, timeout: 10s }}",
            users.url()
        ),
    )
    .replace("deadline: 500ms", "deadline: 20s")
    .replace(
        "routes:",
        "server:\n  compute: { threads: 1 }\n  grpc: { max_message_bytes: 1000000 }\nroutes:",
    );
    let gw = gateway(&config, &stubs).await;
    let mut req = profile_request("u1");
    // An unknown field (number 15, length-delimited) of 300 KB: the message is still a valid
    // ProfileRequest for the gateway, and large.
    req.extend_from_slice(&[0x7a, 0xe0, 0xa7, 0x12]); // tag 15/2, length 300_000
    req.extend(std::iter::repeat_n(b'y', 300_000));
    let gz = gzip(&req);
    assert!(gz.len() < 10_000);
    let a = call(
        gw.addr,
        &[("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip")],
        frame(1, &gz),
    )
    .await;
    assert_eq!(a.code(), 0, "{:?} {:?}", a.headers, a.trailers);
    assert_eq!(a.body[0], 1, "compressed");
    assert!(a.body.len() < 20_000, "{}", a.body.len());
    let p = Profile::decode(&a.message()[..]).unwrap();
    let user = p.user.unwrap();
    assert_eq!(user.id, "u1");
    assert_eq!(user.name.len(), "User u1 (gzip)".len() + 600_000);
    assert_eq!(users.count(), 1);
    let st = get(&format!("http://{}/__fanout/status", gw.addr))
        .await
        .json();
    // The compute pool ran the request's inflating, the step's decoding (a large answer) and the
    // answer's compressing.
    let done = st["runtime"]["compute"]["done"].as_u64().unwrap();
    assert!(done >= 3, "{st}");
}
