//! No expression and no data may crash the process or hold a thread without bound: every case
//! here ends with an error of the right kind. Cases where stack matters run on threads with a
//! 2 MiB stack (like tokio's workers).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use fanout_expr::{Budget, EvalError, EvalErrorKind as K, EvalLimits, Expr, Mode, Val, json};
use std::time::{Duration, Instant};

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn v(s: &str) -> Val {
    json::parse(s.as_bytes()).unwrap()
}

/// Evaluate `src` (with variables `$s` and `$n`) under `budget` in offload mode.
fn eval_with(src: &str, vars: &[Val], budget: &Budget) -> Result<Val, EvalError> {
    let e = Expr::compile(src, &["s", "n"]).unwrap();
    e.eval_in(&Val::Null, |i| vars[i].clone(), budget, Mode::Offload)
}

fn eval(src: &str, vars: &[Val]) -> Result<Val, EvalError> {
    eval_with(src, vars, &Budget::unlimited_time(EvalLimits::default()))
}

fn kind_of(src: &str, vars: &[Val]) -> K {
    match eval(src, vars) {
        Ok(x) => panic!("{src} succeeded: {}", json::to_string(&x).len()),
        Err(e) => {
            eprintln!("{src}: {e}");
            e.kind()
        }
    }
}

fn small(max_ops: u64) -> Budget {
    Budget::unlimited_time(EvalLimits {
        max_ops,
        ..EvalLimits::default()
    })
}

#[test]
fn fromjson_of_deep_text() {
    on_small_stack(|| {
        for n in [7_000, 100_000] {
            let s = json::str_val(&format!("{}{}", "[".repeat(n), "]".repeat(n)));
            assert_eq!(kind_of("$s | fromjson", &[s, Val::Null]), K::TooDeep);
        }
        // built by the expression itself, too
        let src = r#"("[" * 7000) + ("]" * 7000) | fromjson"#;
        assert_eq!(kind_of(src, &[]), K::TooDeep);
        // within the limit it works
        let s = json::str_val(&format!("{}{}", "[".repeat(100), "]".repeat(100)));
        assert!(eval("$s | fromjson | length", &[s, Val::Null]).is_ok());
    })
}

#[test]
fn deep_values_are_never_built() {
    on_small_stack(|| {
        let e = kind_of("reduce range(0; 1e5) as $i (null; [.])", &[]);
        assert_eq!(e, K::TooDeep);
        assert_eq!(
            kind_of("reduce range(0; 1e5) as $i (null; {a: .})", &[]),
            K::TooDeep
        );
        assert_eq!(
            kind_of("reduce range(0; 1e5) as $i ({}; .a = .)", &[]),
            K::TooDeep
        );
        assert_eq!(
            kind_of("reduce range(0; 1e5) as $i ([0]; .[0] |= [.])", &[]),
            K::TooDeep
        );
        assert_eq!(
            kind_of("reduce range(0; 1e5) as $i ({}; .a += {a: .})", &[]),
            K::TooDeep
        );
        assert_eq!(kind_of("def f: [f]; f", &[]), K::TooDeep);
        assert_eq!(kind_of("def f: .a |= ({} | f); {} | f", &[]), K::TooDeep);
        assert_eq!(
            kind_of("reduce range(1e5) as $i (0; {([.]): 1})", &[]),
            K::TooDeep
        );
        assert_eq!(
            kind_of("reduce range(200) as $i ({}; {a: .} | to_entries)", &[]),
            K::TooDeep
        );
        assert_eq!(
            kind_of("reduce range(200) as $i (0; [.] | group_by(.))", &[]),
            K::TooDeep
        );
        assert_eq!(
            kind_of("reduce range(200) as $i (0; [path_value(.)])", &[]),
            K::TooDeep
        );
        // exactly at the limit is fine, and such values serialize
        let at = eval("reduce range(0; 127) as $i (1; [.])", &[]).unwrap();
        assert_eq!(json::to_string(&at).len(), 127 * 2 + 1);
        assert!(eval("reduce range(0; 128) as $i (1; [.]) | tojson", &[]).is_ok());
        assert_eq!(
            kind_of("reduce range(0; 128) as $i (1; [.]) | [.]", &[]),
            K::TooDeep
        );
    })
}

#[test]
fn long_paths_are_refused() {
    on_small_stack(|| {
        // (jaq does not create structure below `null`: such updates fail with a type error)
        for (root, part) in [("{}", "\"a\""), ("[]", "0"), ("null", "\"a\"")] {
            let path = eval(&format!("[range(10000) | {part}]"), &[]).unwrap();
            let src = format!("{root} | setpath($s; 1)");
            let e = Expr::compile(&src, &["s"]).unwrap();
            let b = Budget::unlimited_time(EvalLimits::default());
            let r = e.eval_in(&Val::Null, |_| path.clone(), &b, Mode::Offload);
            let k = r.unwrap_err().kind();
            assert!(matches!(k, K::TooDeep | K::Failed), "{src}: {k:?}");
            let src = format!("{root} | getpath($s)");
            let e = Expr::compile(&src, &["s"]).unwrap();
            assert!(
                e.eval_in(&Val::Null, |_| path.clone(), &b, Mode::Offload)
                    .is_ok()
            );
        }
        // along an existing structure, paths stop at `max_depth`
        let deep = "reduce range(127) as $i (1; {a: .})";
        let src = format!("{deep} | setpath([range(10000) | \"a\"]; 1)");
        let k = kind_of(&src, &[]);
        assert!(matches!(k, K::TooDeep | K::Failed), "{k:?}");
        let src = format!("{deep} | setpath([range(127) | \"a\"]; {{b: {{c: 1}}}})");
        assert_eq!(kind_of(&src, &[]), K::TooDeep);
        let src = format!("{deep} | setpath([range(127) | \"a\"]; {{b: 1}}) | tojson | length");
        assert!(eval(&src, &[]).is_ok());
    })
}

#[test]
fn huge_collections_and_strings() {
    let n = Val::from(1e12);
    assert_eq!(kind_of("[range(0; $n)]", &[Val::Null, n]), K::TooLarge);
    let s = json::str_val(&"x".repeat(16 * 1024));
    let n = Val::from(1_000_000_000isize);
    assert_eq!(kind_of("$s * $n", &[s.clone(), n]), K::TooLarge);
    for src in [
        "[limit(2000000; repeat(1))]",
        "[range(1e7)] | length",
        "$s * 1000 | . + . | length",
        "$s * 100 | [.,.,.,.,.,.,.,.,.,.,.,.] | tojson | . + . | length",
        "[range(1e6)] | . + . | length",
        "$s * 1000 | ascii_downcase | explode | length",
        "$s * 1000 | @base64 | length",
        "[range(1e5) | \"\\($s)\"] | add | length",
        "$s * 1000 | [splits(\"\")] | length",
        "$s * 1000 | indices(\"x\") | length",
        "$s * 1000 | [match(\"\"; \"g\")] | length",
        "$s * 1000 | gsub(\"x\"; \"yy\") | length",
        "$s * 500 | @html | . + . + . | length",
    ] {
        let k = kind_of(src, &[s.clone(), Val::Null]);
        assert!(matches!(k, K::TooLarge | K::Ops), "{src}: {k:?}");
    }
    // hostile regular expressions are errors
    let src = r#""a" | test(("(" * 10000) + ")" * 10000)"#;
    assert_eq!(kind_of(src, &[]), K::Failed);
    let src = r#""a" | test("a" * 100000)"#;
    assert_eq!(kind_of(src, &[]), K::Failed);
    // DAG values: tiny to build, huge to write
    let k = kind_of("reduce range(0; 40) as $i ([1]; [., .]) | tojson", &[]);
    assert!(matches!(k, K::TooLarge | K::Ops), "{k:?}");
    let k = kind_of("reduce range(0; 40) as $i ([1]; [., .]) | \"\\(.)\"", &[]);
    assert!(matches!(k, K::TooLarge | K::Ops), "{k:?}");
}

/// The collections that take the whole default work budget to build (each seconds in a debug
/// build): a test of their own, so the test runner's threads share them with the others.
#[test]
fn huge_collections_built_step_by_step_stop_at_the_budget() {
    for src in [
        "[range(1e6)] | to_entries | length",
        r#"reduce range(2e6) as $i ({}; .["k\($i)"] = 1) | length"#,
        r#"reduce range(2e6) as $i ({}; . + {"k\($i)": 1}) | length"#,
    ] {
        let k = kind_of(src, &[]);
        assert!(matches!(k, K::TooLarge | K::Ops), "{src}: {k:?}");
    }
}

#[test]
fn long_loops_stop() {
    let src = "reduce range(0; 1e8) as $i (0; .+1)";
    let r = eval_with(src, &[], &small(100_000));
    assert_eq!(r.unwrap_err().kind(), K::Ops);
    // the default budget of `eval` stops it too
    let e = Expr::compile(src, &[]).unwrap();
    assert_eq!(
        e.eval(&Val::Null, |_| Val::Null).unwrap_err().kind(),
        K::Ops
    );

    let big = EvalLimits {
        max_ops: u64::MAX,
        ..EvalLimits::default()
    };
    let start = Instant::now();
    let b = Budget::new(big, Some(start + Duration::from_millis(50)));
    assert_eq!(eval_with(src, &[], &b).unwrap_err().kind(), K::Deadline);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );

    let b = Budget::unlimited_time(big);
    let b2 = b.clone();
    let start = Instant::now();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b2.cancel();
    });
    assert_eq!(eval_with(src, &[], &b).unwrap_err().kind(), K::Cancelled);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    canceller.join().unwrap();
    assert!(b.is_cancelled());
    // a cancelled budget stops native evaluations too
    let native = Expr::compile("$s.a", &["s"]).unwrap();
    let r = native.eval_in(&Val::Null, |_| Val::Null, &b, Mode::Inline);
    assert_eq!(r.unwrap_err().kind(), K::Cancelled);

    // errors cannot be caught to keep going
    let src = "def f: try (reduce range(0; 1e8) as $i (0; .+1)) catch f; f";
    assert_eq!(
        eval_with(src, &[], &small(100_000)).unwrap_err().kind(),
        K::Ops
    );
    let src = "[.[]?, (try ([range(1e12)]) catch 1), range(10)] | length";
    assert_eq!(kind_of(src, &[]), K::TooLarge);
    for src in [
        "def f: f; f",
        "last(range(1e12))",
        "[limit(1e9; repeat(1))] | length",
    ] {
        let r = eval_with(src, &[], &small(1_000_000));
        assert!(
            matches!(r.unwrap_err().kind(), K::Ops | K::TooLarge),
            "{src}"
        );
    }
}

#[test]
fn deep_recursion_is_an_error() {
    on_small_stack(|| {
        for src in [
            "def f: 1 + f; f",
            "def f: [f]; f",
            "def f: (f | .), 1; f",
            "def f: {a: f}; f",
            "def f: .a |= ({} | f); {} | f",
            "def f: .a | f; path(f)",
            "def f(g): f(g | .); f(.)",
            "def f: . as $x | f; f",
            "def f($a): f([$a]); f(1)",
        ] {
            let r = eval_with(src, &[], &small(1_000_000));
            let k = r.unwrap_err().kind();
            assert!(matches!(k, K::TooDeep | K::Ops), "{src}: {k:?}");
        }
        let k = kind_of("[recurse(.+1)]", &[]);
        assert!(matches!(k, K::TooLarge | K::Ops), "{k:?}");
        let r = eval("[limit(10; 0 | recurse(.+1))]", &[]).unwrap();
        assert_eq!(json::to_string(&r), "[0,1,2,3,4,5,6,7,8,9]");
    })
}

#[test]
fn hostile_sources_do_not_compile() {
    on_small_stack(|| {
        let cases = [
            format!("{}1{}", "(".repeat(5000), ")".repeat(5000)),
            format!("{}1{}", "[".repeat(5000), "]".repeat(5000)),
            format!("{}1{}", "{a:".repeat(5000), "}".repeat(5000)),
            vec!["1"; 5001].join("+"),
            vec!["1"; 5001].join("|"),
            vec!["1"; 5001].join(","),
            format!("{}1", "-".repeat(5000)),
            format!("1{}", "?".repeat(5000)),
            format!(".{}", "a.".repeat(5000)),
            "try ".repeat(5000) + "1",
            "1 + ".repeat(1 << 18) + "1",
            format!("\"{}\"", "x".repeat(1 << 20)),
        ];
        for src in &cases {
            let err = Expr::compile(src, &[]).unwrap_err();
            assert!(!err.message.is_empty());
        }
    })
}

#[test]
fn expressions_at_the_bounds_compile_and_run_on_a_small_stack() {
    on_small_stack(|| {
        let b = Budget::unlimited_time(EvalLimits::default());
        let run = |src: &str| {
            let e = Expr::compile_interpreted(src, &[]).unwrap();
            e.eval_in(&Val::Null, |_| Val::Null, &b, Mode::Offload)
        };
        let parens = format!("{}1{}", "(".repeat(250), ")".repeat(250));
        assert_eq!(json::to_string(&run(&parens).unwrap()), "1");
        let chain = vec!["1"; 500].join("+");
        assert_eq!(json::to_string(&run(&chain).unwrap()), "500");
        let chain = vec!["1"; 999].join("+");
        assert_eq!(json::to_string(&run(&chain).unwrap()), "999");
        let arr = format!("{}1{}", "[".repeat(120), "]".repeat(120));
        assert!(run(&arr).is_ok());
        let deep = format!("{}1{}", "[".repeat(250), "]".repeat(250));
        assert_eq!(run(&deep).unwrap_err().kind(), K::TooDeep);
        let alts = vec!["null"; 499].join(" // ");
        assert_eq!(json::to_string(&run(&alts).unwrap()), "null");
    })
}

#[test]
fn inline_yields_and_offload_finishes() {
    let e = Expr::compile("reduce range(0; 100000) as $i (0; .+1)", &[]).unwrap();
    let b = Budget::unlimited_time(EvalLimits::default());
    let r = e.eval_in(&Val::Null, |_| Val::Null, &b, Mode::Inline);
    assert_eq!(r.unwrap_err().kind(), K::Yield);
    let inline_used = b.used_ops();
    assert!(inline_used >= 50_000, "{inline_used}");
    assert!(inline_used <= 50_000 + 1024, "{inline_used}");
    let r = e
        .eval_in(&Val::Null, |_| Val::Null, &b, Mode::Offload)
        .unwrap();
    assert_eq!(json::to_string(&r), "100000");
    assert!(
        b.used_ops() > inline_used + 100_000,
        "the inline attempt still counts"
    );

    // small expressions finish inline
    let small_e = Expr::compile("[range(10)] | add", &[]).unwrap();
    let r = small_e.eval_in(&Val::Null, |_| Val::Null, &b, Mode::Inline);
    assert_eq!(json::to_string(&r.unwrap()), "45");
}

#[test]
fn ops_are_shared_by_clones_of_a_budget() {
    let e = Expr::compile("reduce range(0; 40000) as $i (0; .+1)", &[]).unwrap();
    let one = small(u64::MAX);
    e.eval_in(&Val::Null, |_| Val::Null, &one, Mode::Offload)
        .unwrap();
    let per_run = one.used_ops();
    assert!(per_run > 40_000, "{per_run}");
    let b = small(per_run * 5 / 2);
    let clones: Vec<Budget> = (0..2).map(|_| b.clone()).collect();
    let mut handles = Vec::new();
    for c in clones {
        let e = e.clone();
        handles.push(std::thread::spawn(move || {
            e.eval_in(&Val::Null, |_| Val::Null, &c, Mode::Offload)
                .map(|_| ())
        }));
    }
    for h in handles {
        h.join().unwrap().unwrap();
    }
    let used = b.used_ops();
    assert_eq!(used, 2 * per_run);
    // two more do not fit in what is left
    let r1 = e.eval_in(&Val::Null, |_| Val::Null, &b, Mode::Offload);
    let r2 = e.eval_in(&Val::Null, |_| Val::Null, &b, Mode::Offload);
    assert!(r1.is_err() || r2.is_err());
    assert_eq!(r2.unwrap_err().kind(), K::Ops);
    assert_eq!(b.used_ops(), per_run * 5 / 2);
}

#[test]
fn no_environment_no_exit_no_logging() {
    assert!(Expr::compile("env", &[]).is_err());
    assert!(Expr::compile("$ENV", &[]).is_err());
    assert!(Expr::compile("input", &[]).is_err());
    assert!(Expr::compile("input_filename", &[]).is_err());
    assert!(Expr::compile("$__loc__", &[]).is_err());
    assert_eq!(kind_of("halt", &[]), K::Failed);
    assert_eq!(kind_of("\"bye\" | halt_error", &[]), K::Failed);
    assert_eq!(kind_of("halt_error(1)", &[]), K::Failed);
    assert_eq!(
        json::to_string(&eval("1 | debug | stderr", &[]).unwrap()),
        "1"
    );
}

#[test]
fn big_integers_stay_small() {
    let r = eval("reduce range(0; 40) as $i (3; . * .) | . > 1e300", &[]).unwrap();
    assert_eq!(json::to_string(&r), "true");
    let digits = json::str_val(&"9".repeat(100_000));
    let r = eval("$s | fromjson | . + 1 | . > 0", &[digits, Val::Null]).unwrap();
    assert_eq!(json::to_string(&r), "true");
}

#[test]
fn ordinary_programs_are_unchanged() {
    let doc = v(r#"{"items":[{"id":1,"tags":["a"]},{"id":2,"tags":[]}],"n":null}"#);
    let cases = [
        ("[.items[] | .id] | add", "3"),
        ("[.items[] | select(.tags | length > 0) | .id]", "[1]"),
        (".items | map(.id * 2)", "[2,4]"),
        ("to_entries | map(.key)", r#"["items","n"]"#),
        ("[paths] | length", "9"),
        (".items[0] | tojson | fromjson | .id", "1"),
        (
            ".items[0].tags[0] = \"z\" | .items[0]",
            r#"{"id":1,"tags":["z"]}"#,
        ),
        (
            "setpath([\"items\", 1, \"id\"]; 5) | .items[1]",
            r#"{"id":5,"tags":[]}"#,
        ),
        (".items |= map(.id) | .items", "[1,2]"),
        ("[.items[] | .id] | sort_by(-.) | reverse", "[1,2]"),
        (".items | group_by(.id) | length", "2"),
        ("\"a,b, c\" | [splits(\", *\")]", r#"["a","b","c"]"#),
        ("\"x\" * 3", r#""xxx""#),
        ("{a: {b: 1}} * {a: {c: 2}}", r#"{"a":{"b":1,"c":2}}"#),
        ("[limit(3; repeat(1))]", "[1,1,1]"),
        ("\"\\(.items[0])\"", r#""{\"id\":1,\"tags\":[\"a\"]}""#),
        ("try error({a: 1}) catch .a", "1"),
        ("[.items[] | .id] | @base64", r#""WzEsMl0=""#),
        (
            r#"[.items[] | .id | @text "<\(.)>"] | join(",")"#,
            r#""<1>,<2>""#,
        ),
        ("\"abc\" | test(\"b\")", "true"),
        ("\"a-b\" | gsub(\"-\"; \"+\")", r#""a+b""#),
        ("[range(5)] | .[1:3] = [\"x\"]", r#"[0,"x",3,4]"#),
        // a literal keeps its text, arithmetic on it is a float (jq 1.7; tests/numbers.rs)
        (
            "123456789012345678901234567890 + 1",
            "1.2345678901234568e29",
        ),
        (
            "123456789012345678901234567890",
            "123456789012345678901234567890",
        ),
        ("9223372036854775807 + 1", "9223372036854775808"),
    ];
    for (src, want) in cases {
        let e = Expr::compile(src, &[]).unwrap_or_else(|e| panic!("{src}: {}", e.message));
        let got = e
            .eval(&doc, |_| Val::Null)
            .unwrap_or_else(|e| panic!("{src}: {}", e.0));
        assert_eq!(json::to_string(&got), want, "{src}");
    }
}
