//! A fixed amount of JSON parsing and writing, for instruction counts (no timing: run it under
//! `valgrind --tool=callgrind`, before and after a change; docs/benchmarks.md, "Exact numbers").
//! Run: `cargo build --release -p fanout-expr --example json_cost`, then
//! `valgrind --tool=callgrind target/release/examples/json_cost 1000`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // measuring code: a failed unwrap is a failed run
use fanout_expr::json;
use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The 8 KiB document of `benches/expr.rs` (ids, names, `x.5` prices, tags).
fn plain_doc() -> String {
    let items: Vec<String> = (0..100)
        .map(|i| {
            format!(
                r#"{{"id":{i},"name":"item {i}","price":{}.5,"tags":["a","b"]}}"#,
                i * 3
            )
        })
        .collect();
    format!(
        r#"{{"total":100,"items":[{}],"meta":{{"page":{{"n":1}}}}}}"#,
        items.join(",")
    )
}

/// The numbers document of `benches/expr.rs`.
fn numbers_doc() -> String {
    let items: Vec<String> = (0..100)
        .map(|i| {
            format!(
                r#"{{"id":{i},"big":{},"price":{}.25,"amount":"x","rate":0.000{},"lat":55.75{},"cents":{}.50,"long":0.10000000000000000{},"e":1e{}}}"#,
                18446744073709551515u64 + i,
                i * 7,
                i + 1,
                i + 10,
                i,
                i + 10,
                i % 300
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1000, |a| a.parse().expect("a count"));
    let what = std::env::args().nth(2).unwrap_or_else(|| "all".into());
    let docs = [("plain", plain_doc()), ("numbers", numbers_doc())];
    let mut out = Vec::with_capacity(16 << 10);
    let mut total = 0;
    for (name, doc) in &docs {
        if what != "all" && what != *name {
            continue;
        }
        for _ in 0..n {
            let v = json::parse(black_box(doc.as_bytes())).unwrap();
            out.clear();
            json::write(&v, &mut out);
            total += black_box(&out).len();
        }
    }
    println!("{total}");
}
