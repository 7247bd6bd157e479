//! Expression cost: native plain-path evaluation vs the jaq interpreter on the same input.
//! Run: `cargo bench -p fanout-expr --bench expr`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use criterion::{Criterion, criterion_group, criterion_main};
use fanout_expr::{Expr, Val, json};
use std::hint::black_box;

// The production allocator (see crates/fanout-cli/src/main.rs).
#[global_allocator]
static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;

mod json_docs;

fn doc() -> Val {
    json::parse(json_docs::plain().as_bytes()).unwrap()
}

fn bench(c: &mut Criterion) {
    let scope = ["request", "search"];
    let vals = [json::parse(br#"{"query":{"q":"x"}}"#).unwrap(), doc()];
    let lookup = |i: usize| vals[i].clone();
    let cases = [
        ("path_3_segments", "$search.meta.page.n"),
        ("path_index", "$search.items[42].name"),
    ];
    let mut g = c.benchmark_group("expr");
    for (name, src) in cases {
        let native = Expr::compile(src, &scope).unwrap();
        assert!(native.is_native());
        let jaq = Expr::compile_interpreted(src, &scope).unwrap();
        g.bench_function(format!("{name}/native"), |b| {
            b.iter(|| black_box(native.eval(&Val::Null, lookup).unwrap()))
        });
        g.bench_function(format!("{name}/jaq"), |b| {
            b.iter(|| black_box(jaq.eval(&Val::Null, lookup).unwrap()))
        });
    }
    let ids = Expr::compile("[$search.items[].id]", &scope).unwrap();
    g.bench_function("collect_100_ids/jaq", |b| {
        b.iter(|| black_box(ids.eval(&Val::Null, lookup).unwrap()))
    });
    let shape = Expr::compile(
        r#"{total: $search.total, q: $request.query.q, items: [$search.items[] | select(.price > 100) | {id, name}]}"#,
        &scope,
    )
    .unwrap();
    g.bench_function("reshape_object/jaq", |b| {
        b.iter(|| black_box(shape.eval(&Val::Null, lookup).unwrap()))
    });
    let cases = [
        (
            "build_url",
            r#""/vacancies/\($search.items[0].id)?q=\($request.query.q)""#,
        ),
        (
            "build_object",
            r#"{total: $search.total, page: $search.meta.page.n, first: $search.items[0], q: ($request.query.q // "")}"#,
        ),
    ];
    for (name, src) in cases {
        let native = Expr::compile(src, &scope).unwrap();
        assert!(native.is_native());
        let jaq = Expr::compile_interpreted(src, &scope).unwrap();
        g.bench_function(format!("{name}/native"), |b| {
            b.iter(|| black_box(native.eval(&Val::Null, lookup).unwrap()))
        });
        g.bench_function(format!("{name}/jaq"), |b| {
            b.iter(|| black_box(jaq.eval(&Val::Null, lookup).unwrap()))
        });
    }
    // The antispam merge (crates/fanout-lab/src/scenarios/antispam-models.yaml, three models):
    // a definition, arithmetic, `as` bindings, `[$s[]] | add / length`, a comparison.
    let models = ["lr", "gbdt", "score"];
    let outs = [
        json::parse(br#"{"label":1,"probabilities":{"0":0.25,"1":0.75}}"#).unwrap(),
        json::parse(br#"{"label":0,"probabilities":{"0":0.875,"1":0.125}}"#).unwrap(),
        json::parse(br#"{"value":42.5}"#).unwrap(),
    ];
    let merge = r#"def sq: 1 / (1 + ((0 - . / 100) | exp));
        {lr: $lr.probabilities."1", gbdt: $gbdt.probabilities."1", score: ($score.value | sq)} as $s
        | ([$s[]] | add / length) as $p | {spam: ($p > 0.5), score: $p, scores: $s}"#;
    let native = Expr::compile(merge, &models).unwrap();
    assert!(native.is_native());
    let jaq = Expr::compile_interpreted(merge, &models).unwrap();
    let model_out = |i: usize| outs[i].clone();
    g.bench_function("merge_scores/native", |b| {
        b.iter(|| black_box(native.eval(&Val::Null, model_out).unwrap()))
    });
    g.bench_function("merge_scores/jaq", |b| {
        b.iter(|| black_box(jaq.eval(&Val::Null, model_out).unwrap()))
    });
    let bytes = json::to_string(&vals[1]).into_bytes();
    g.bench_function("parse_8kb_json", |b| {
        b.iter(|| black_box(json::parse(&bytes).unwrap()))
    });
    g.bench_function("write_8kb_json", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(9000);
            json::write(&vals[1], &mut out);
            black_box(out)
        })
    });
    // numbers of every kind (ids above 2^63, prices, coordinates, `1.50`, long decimals)
    let nums = json_docs::numbers();
    let nums_val = json::parse(nums.as_bytes()).unwrap();
    g.bench_function("parse_numbers_json", |b| {
        b.iter(|| black_box(json::parse(nums.as_bytes()).unwrap()))
    });
    g.bench_function("write_numbers_json", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(nums.len() + 64);
            json::write(&nums_val, &mut out);
            black_box(out)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
