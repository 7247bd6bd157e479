//! The jq parser and compilers (`fanout_expr::Expr`: every expression of a config): any text is
//! an expression or a `CompileError`, never a panic, a stack overflow or a hang — through
//! `Expr::compile` (the native evaluator where it can, jaq where not),
//! `Expr::compile_interpreted` (jaq alone) and `Expr::compile_native_only`; the two compilers
//! accept the same texts. What compiles is evaluated once on a small input under a small
//! budget: an output or an `EvalError`, never a panic or a hang.

#![no_main]

use fanout_expr::{Budget, EvalLimits, Expr, Mode, Val};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// Variables an expression may read (the flow's `$request`, a step's, `$item` of `for_each`).
const SCOPE: &[&str] = &["request", "user", "item"];

fn input() -> &'static Val {
    static INPUT: OnceLock<Val> = OnceLock::new();
    INPUT.get_or_init(|| {
        fanout_expr::json::parse(
            br#"{"a": 1, "b": [1, 2.5, "x", null, true], "c": {"d": "e", "n": -3}, "s": "h\u00e9llo"}"#,
        )
        .expect("the input is JSON")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let expr = Expr::compile(src, SCOPE);
    let interpreted = Expr::compile_interpreted(src, SCOPE);
    let native = Expr::compile_native_only(src, SCOPE);
    assert_eq!(
        expr.is_ok(),
        interpreted.is_ok(),
        "compile and compile_interpreted disagree: {:?} / {:?}",
        expr.as_ref().err(),
        interpreted.as_ref().err()
    );
    if let (Ok(Some(_)), Err(e)) = (&native, &expr) {
        panic!("the native form compiles, the expression does not: {e:?}");
    }
    let limits = EvalLimits {
        max_ops: 20_000,
        inline_ops: 20_000,
        max_depth: 32,
        max_elements: 10_000,
        max_string_bytes: 64 << 10,
    };
    let lookup = |i: usize| Val::from(i);
    for e in [expr, interpreted].into_iter().flatten() {
        let budget = Budget::unlimited_time(limits);
        let _ = e.eval_all_in(input(), lookup, &budget, Mode::Offload);
    }
});
