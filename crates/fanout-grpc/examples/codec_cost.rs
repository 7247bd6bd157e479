//! How long the JSON ⇄ protobuf conversions of one grpc-aggregate request take (the lab
//! scenario's messages): `cargo run --release -p fanout-grpc --example codec_cost`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use fanout_grpc::{ProtoLimits, ProtoSet};
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fanout-lab/src/scenarios");
    let set = ProtoSet::compile(
        &[PathBuf::from("grpc-aggregate.proto")],
        &[dir],
        ProtoLimits::default(),
    )
    .unwrap();
    let page = set.method("lab.v1.Aggregator/GetPage").unwrap();
    let json = br#"{"user":{"id":"u17","name":"User u17","email":"u17@example.com","level":3},
        "orders":[{"id":"o-u17-1","amount_cents":1000,"status":"paid"},{"id":"o-u17-2","amount_cents":2000,"status":"paid"},{"id":"o-u17-3","amount_cents":3000,"status":"paid"}],
        "recs":[{"sku":"sku-1","score":0.9},{"sku":"sku-2","score":0.8},{"sku":"sku-3","score":0.7}]}"#;
    let n = 200_000;
    let t = Instant::now();
    let mut bytes = Vec::new();
    for _ in 0..n {
        bytes.clear();
        page.output.json_to_proto_into(json, &mut bytes).unwrap();
    }
    let enc = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t = Instant::now();
    let mut out = 0;
    for _ in 0..n {
        out += page.output.proto_to_json(&bytes).unwrap().len();
    }
    let dec = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let val = fanout_expr::json::parse(json).unwrap();
    let t = Instant::now();
    let mut b2 = Vec::new();
    for _ in 0..n {
        b2.clear();
        page.output.encode_val(&val, &mut b2).unwrap();
    }
    let enc_val = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t = Instant::now();
    for _ in 0..n {
        out += usize::from(page.output.decode_val(&bytes, 64).unwrap() != val);
    }
    let dec_val = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t = Instant::now();
    for _ in 0..n {
        let j = page.output.proto_to_json(&bytes).unwrap();
        out += usize::from(fanout_expr::json::parse(&j).unwrap() != val);
    }
    let dec_json_val = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "Page ({} bytes protobuf, {} bytes JSON) ({out}):\n  JSON text→protobuf {enc:.2} µs, value→protobuf {enc_val:.2} µs\n  protobuf→JSON text {dec:.2} µs, protobuf→JSON text→value {dec_json_val:.2} µs, protobuf→value {dec_val:.2} µs",
        bytes.len(),
        json.len()
    );
}
