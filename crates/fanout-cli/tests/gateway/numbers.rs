//! Numbers pass through unchanged (docs/config.md, "Numbers"; docs/grpc.md, 64-bit integers): an
//! id above 2^63, a 30-digit integer, a decimal with more digits than a float holds and `1.50`
//! come back byte for byte — from the request to `respond`, through an HTTP backend (raw and
//! echoed), a batch form, the answer cache, Redis (L2) and gRPC in and out.

use crate::support::{gateway, gateway_with};
use fanout_testkit::*;
use http::Method;
use std::collections::HashMap;

/// A body with every kind of number that a float would change.
const BODY: &str = r#"{"id":18446744073709551615,"n":123456789012345678901234567890,"neg":-123456789012345678901234567890,"d":0.1000000000000000055511151231257827,"p":1.50,"e":1e400,"z":-0,"small":42,"f":2.5}"#;

fn text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// `raw_body` answers BODY as written; `/echo` answers the request's body; `/prices` is a batch
/// endpoint whose ids are numbers (`tonumber` of the query's ids).
fn stubs_yaml() -> String {
    format!(
        r#"
services:
  svc:
    listen: "${{SVC_ADDR}}"
    routes:
      - path: /raw
        headers: {{ content-type: application/json }}
        raw_body: '{BODY}'
      - path: /echo
        method: POST
        body: '$request.body'
      - path: /prices
        body: '{{items: ($request.query.ids | split(",") | map({{id: tonumber, price: 1.50}}))}}'
"#
    )
}

fn gateway_yaml(cache: &str) -> String {
    format!(
        r#"
backends:
  svc:
    url: "http://${{SVC_ADDR}}"
    {cache}
  prices:
    url: "http://${{SVC_ADDR}}"
    batch:
      path: '"/prices"'
      query: {{ ids: '$keys | join(",")' }}
      split: '.items | map({{key: (.id | tostring), value: .}}) | from_entries'
      max: 10
routes:
  - path: /mirror
    method: POST
    respond: {{ body: '$request.body' }}
  - path: /pick
    method: POST
    respond: {{ body: '{{id: $request.body.id, n: $request.body.n, d: $request.body.d, p: $request.body.p, same: ($request.body.id == 18446744073709551615), next: ($request.body.id == 18446744073709551614)}}' }}
  - path: /raw
    flow:
      it: {{ http: {{ backend: svc, path: '"/raw"' }} }}
    respond: {{ body: '$it' }}
  - path: /echo
    method: POST
    flow:
      it: {{ http: {{ backend: svc, method: POST, path: '"/echo"', body: '$request.body' }} }}
    respond: {{ body: '$it' }}
  - path: /prices
    method: POST
    flow:
      prices:
        for_each: '$request.body.ids'
        http: {{ backend: prices, key: '$item' }}
    respond: {{ body: '$prices' }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_comes_back_byte_for_byte() {
    let s = stubs(&stubs_yaml()).await;
    let gw = gateway(&gateway_yaml(""), &s).await;
    let c = client(false);
    let url = |p: &str| format!("http://{}{p}", gw.addr);

    let r = send(&c, Method::POST, &url("/mirror"), &[], BODY).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(text(&r), BODY);
    for bare in [
        "18446744073709551615",
        "123456789012345678901234567890",
        "0.1000000000000000055511151231257827",
        "1.50",
    ] {
        let r = send(&c, Method::POST, &url("/mirror"), &[], bare).await;
        assert_eq!(text(&r), bare);
    }

    // picked out by expressions, and compared exactly
    let r = send(&c, Method::POST, &url("/pick"), &[], BODY).await;
    assert_eq!(
        text(&r),
        r#"{"id":18446744073709551615,"n":123456789012345678901234567890,"d":0.1000000000000000055511151231257827,"p":1.50,"same":true,"next":false}"#
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answer_comes_back_byte_for_byte() {
    let s = stubs(&stubs_yaml()).await;
    let gw = gateway(&gateway_yaml(""), &s).await;
    let c = client(false);
    let url = |p: &str| format!("http://{}{p}", gw.addr);

    let r = send(&c, Method::GET, &url("/raw"), &[], "").await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(text(&r), BODY);

    // sent to a backend as the call's body, echoed, answered
    let r = send(&c, Method::POST, &url("/echo"), &[], BODY).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(text(&r), BODY);

    // ids as batch keys and back through `split`: each item found under its exact id
    let r = send(
        &c,
        Method::POST,
        &url("/prices"),
        &[],
        r#"{"ids":[18446744073709551615,18446744073709551614]}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(
        text(&r),
        r#"[{"id":18446744073709551615,"price":1.50},{"id":18446744073709551614,"price":1.50}]"#
    );
    assert_eq!(calls(&s, "svc"), 3, "one batch call for both ids");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_answer_comes_back_byte_for_byte() {
    let s = stubs(&stubs_yaml()).await;
    let gw = gateway(&gateway_yaml("cache: { ttl: 60s }"), &s).await;
    let url = format!("http://{}/raw", gw.addr);
    for _ in 0..2 {
        let r = get(&url).await;
        assert_eq!(r.status, 200, "{}", text(&r));
        assert_eq!(text(&r), BODY);
    }
    assert_eq!(calls(&s, "svc"), 1, "the second answer came from the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "tier 2 (./scripts/test): needs redis-server"]
async fn an_answer_from_redis_comes_back_byte_for_byte() {
    let redis = RedisServer::start().await;
    let s = stubs(&stubs_yaml()).await;
    let yaml = format!(
        "redis: {{ url: \"${{REDIS_URL}}\", key_prefix: \"n:\", timeout: 5s }}\n{}",
        gateway_yaml("cache: { ttl: 60s, l2: true }")
    );
    let extra = [("REDIS_URL", redis.url())];
    let (a, b) = tokio::join!(
        gateway_with(&yaml, &s, &extra),
        gateway_with(&yaml, &s, &extra)
    );

    let first = get(&format!("http://{}/raw", a.addr)).await;
    assert_eq!(text(&first), BODY);
    let status = |addr: std::net::SocketAddr| async move {
        get(&format!("http://{addr}/__fanout/status")).await.json()["caches"]["svc"]["answers"]
            ["l2"]
            .clone()
    };
    wait_until_async("the answer written to redis", || async {
        status(a.addr).await["writes"] == 1
    })
    .await;

    // B has nothing in memory: it reads Redis
    let second = get(&format!("http://{}/raw", b.addr)).await;
    assert_eq!(second.status, 200, "{}", text(&second));
    assert_eq!(text(&second), BODY);
    assert_eq!(calls(&s, "svc"), 1, "B answered from redis");
    assert_eq!(status(b.addr).await["hits"], 1);
}

// A message with every 64-bit integer kind (hand-written prost, as the client of `grpc.rs`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ids {
    #[prost(uint64, tag = "1")]
    pub u: u64,
    #[prost(int64, tag = "2")]
    pub i: i64,
    #[prost(sint64, tag = "3")]
    pub s: i64,
    #[prost(fixed64, tag = "4")]
    pub f: u64,
    #[prost(sfixed64, tag = "5")]
    pub sf: i64,
    #[prost(uint64, repeated, tag = "6")]
    pub us: Vec<u64>,
    #[prost(map = "uint64, string", tag = "7")]
    pub by_id: HashMap<u64, String>,
}

const PROTO: &str = r#"
syntax = "proto3";
package num.v1;
message Ids {
  uint64 u = 1;
  int64 i = 2;
  sint64 s = 3;
  fixed64 f = 4;
  sfixed64 sf = 5;
  repeated uint64 us = 6;
  map<uint64, string> by_id = 7;
}
service Echo { rpc Echo(Ids) returns (Ids); }
service Front { rpc Get(Ids) returns (Ids); }
"#;

/// A directory holding `num/v1/ids.proto`, removed on drop.
struct Protos(std::path::PathBuf);

impl Protos {
    fn write() -> Protos {
        let dir = std::env::temp_dir().join(format!("fanout-numbers-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("num/v1")).unwrap();
        std::fs::write(dir.join("num/v1/ids.proto"), PROTO).unwrap();
        Protos(dir)
    }
}

impl Drop for Protos {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_64_bit_integers_keep_all_their_bits_both_ways() {
    let protos = Protos::write();
    let section = format!(
        "protos: {{ files: [num/v1/ids.proto], include: [\"{}\"] }}",
        protos.0.display()
    );
    let s = stubs(&format!(
        r#"
{section}
services:
  echo:
    listen: "${{ECHO_ADDR}}"
    routes:
      - grpc: num.v1.Echo/Echo
        body: '$request.body'
"#
    ))
    .await;
    let gw = gateway(
        &format!(
            r#"
{section}
backends:
  echo: {{ url: "http://${{ECHO_ADDR}}", protocol: grpc }}
routes:
  - grpc: num.v1.Front/Get
    flow:
      e: {{ grpc: {{ backend: echo, method: num.v1.Echo/Echo, message: '$request.body' }} }}
    respond: {{ body: '$e' }}
  - path: /ids
    method: POST
    flow:
      e: {{ grpc: {{ backend: echo, method: num.v1.Echo/Echo, message: '$request.body' }} }}
    respond: {{ body: '$e' }}
"#
        ),
        &s,
    )
    .await;

    // gRPC in → a gRPC backend → gRPC out
    let sent = Ids {
        u: u64::MAX,
        i: i64::MIN,
        s: i64::MIN + 1,
        f: u64::MAX - 1,
        sf: i64::MAX,
        us: vec![u64::MAX, 1 << 63, 0],
        by_id: HashMap::from([(u64::MAX, "max".to_string()), (1, "one".to_string())]),
    };
    let origin: http::Uri = format!("http://{}", gw.addr).parse().unwrap();
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<tonic::body::Body>();
    let mut grpc = tonic::client::Grpc::with_origin(h2, origin);
    grpc.ready().await.unwrap();
    let got: Ids = grpc
        .unary(
            tonic::Request::new(sent.clone()),
            http::uri::PathAndQuery::from_static("/num.v1.Front/Get"),
            tonic_prost::ProstCodec::<Ids, Ids>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, sent);

    // JSON in → a gRPC backend → JSON out: the same digits
    let json = r#"{"u":18446744073709551615,"i":-9223372036854775808,"s":-9223372036854775807,"f":18446744073709551614,"sf":9223372036854775807,"us":[18446744073709551615,9223372036854775808,0],"by_id":{"1":"one","18446744073709551615":"max"}}"#;
    let r = post(&format!("http://{}/ids", gw.addr), json).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(text(&r), json);

    // out of range for the field: an error, never a changed number
    let r = post(
        &format!("http://{}/ids", gw.addr),
        r#"{"u":18446744073709551616}"#,
    )
    .await;
    assert_eq!(r.status, 500, "{}", text(&r));
    assert_eq!(calls(&s, "echo"), 2);
}
