//! A fixed amount of JSON parsing and writing, for instruction counts (no timing: run it under
//! `valgrind --tool=callgrind`, before and after a change; docs/benchmarks.md, "Exact numbers").
//! Run: `cargo build --release -p fanout-expr --example json_cost`, then
//! `valgrind --tool=callgrind target/release/examples/json_cost 1000`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // measuring code: a failed unwrap is a failed run
use fanout_expr::json;
use std::hint::black_box;

#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

#[path = "../benches/json_docs/mod.rs"]
mod json_docs;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1000, |a| a.parse().expect("a count"));
    let what = std::env::args().nth(2).unwrap_or_else(|| "all".into());
    let docs = [
        ("plain", json_docs::plain()),
        ("numbers", json_docs::numbers()),
    ];
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
