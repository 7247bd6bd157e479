//! Loading stub configs: formats accepted, and errors with `FILE:LINE:COL`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
use fanout_stub::{Latency, WeightedLatency, load};
use fanout_testkit::no_vars;
use std::time::Duration;

fn err(yaml: &str) -> String {
    match load("stubs.yaml", yaml, &no_vars) {
        Ok(_) => panic!("config should not load:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

fn ok(yaml: &str) -> fanout_stub::CompiledStubs {
    match load("stubs.yaml", yaml, &no_vars) {
        Ok(c) => c,
        Err(e) => panic!("config should load:\n{e}"),
    }
}

#[test]
fn unknown_field_is_an_error_with_position() {
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        bogus: 1\n",
    );
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
    assert!(e.contains("unknown field `bogus`"), "{e}");
}

#[test]
fn bad_expression_points_inside_the_expression() {
    // Single-quoted: the column is the quote's plus one plus the offset.
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        body: '{a: nosuchfn}'\n",
    );
    // `body: '` ends at column 15; `nosuchfn` starts at column 20.
    assert!(e.starts_with("stubs.yaml:6:20: body expression: "), "{e}");
    assert!(e.contains("nosuchfn"), "{e}");

    // Plain scalar.
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        body: $nope\n",
    );
    assert!(e.starts_with("stubs.yaml:6:15: "), "{e}");
    assert!(
        e.contains("$request"),
        "the hint lists the known names: {e}"
    );

    // Block scalar: the position is on the expression's own line.
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        body: |\n          {a: 1,\n           b: (}\n",
    );
    // Line 8 is `           b: (}`: the unexpected `}` is at column 16.
    assert!(e.starts_with("stubs.yaml:8:16: "), "{e}");

    // Block scalar with a blank line and deeper indentation inside.
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        body: |\n          {a: 1,\n\n             b: $nope}\n",
    );
    assert!(e.starts_with("stubs.yaml:9:17: "), "{e}");
}

#[test]
fn structural_errors_are_all_reported() {
    let yaml = r#"services:
  a:
    listen: nowhere
    routes:
      - path: x
      - path: /__stub/mine
      - path: /d
      - path: /d
      - path: /m
        method: "GE T"
      - path: /s
        status: 1000
      - path: /h
        headers: { "bad name": "1" }
      - path: /l
        latency: {uniform: {min: 10ms, max: 1ms}}
      - path: /c/{a}
      - path: /c/{b}
"#;
    let e = err(yaml);
    let lines: Vec<&str> = e.lines().filter(|l| l.starts_with("stubs.yaml:")).collect();
    let expect = [
        ("stubs.yaml:3:13:", "invalid listen address `nowhere`"),
        ("stubs.yaml:5:", "must start with `/`"),
        ("stubs.yaml:6:", "reserved"),
        ("stubs.yaml:8:", "duplicate route GET /d"),
        ("stubs.yaml:10:", "invalid HTTP method"),
        ("stubs.yaml:12:", "invalid status 1000"),
        ("stubs.yaml:14:", "invalid header name `bad name`"),
        ("stubs.yaml:16:", "min 10ms greater than max 1ms"),
        ("stubs.yaml:18:", "invalid route path `/c/{b}`"),
    ];
    assert_eq!(lines.len(), expect.len(), "{e}");
    for (line, (prefix, text)) in lines.iter().zip(expect) {
        assert!(line.starts_with(prefix), "{line} (expected {prefix})");
        assert!(line.contains(text), "{line} (expected {text})");
    }
}

#[test]
fn latency_forms() {
    let c = ok(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - {path: /a, latency: 5ms}
      - {path: /b, latency: 7}
      - {path: /c, latency: 1.5s}
      - {path: /d, latency: {fixed: 2ms}}
      - {path: /e, latency: {uniform: {min: 1ms, max: 10ms}}}
      - {path: /f}
"#);
    assert_eq!(
        c.routes("a").expect("service a"),
        ["GET /a", "GET /b", "GET /c", "GET /d", "GET /e", "GET /f"]
    );
    let ms = Duration::from_millis;
    let want = [
        Latency::Fixed(ms(5)),
        Latency::Fixed(ms(7)),
        Latency::Fixed(ms(1500)),
        Latency::Fixed(ms(2)),
        Latency::Uniform {
            min: ms(1),
            max: ms(10),
        },
        Latency::None,
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = c.start().await.expect("start");
        for (key, want) in c.routes("a").expect("service a").iter().zip(want) {
            assert_eq!(s.behaviour("a", key).expect("route").latency, want, "{key}");
        }
    });

    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        latency: {pareto: {scale: 1ms}}\n",
    );
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
    assert!(e.contains("pareto"), "{e}");
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        latency: {normal: {mean: 1ms}}\n",
    );
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
    assert!(e.contains("missing field `sd`"), "{e}");
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        latency: {uniform: {min: 1ms}}\n",
    );
    assert!(e.contains("missing field `max`"), "{e}");
    let e = err(
        "services:\n  a:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /x\n        latency: 5 parsecs\n",
    );
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
}

#[test]
fn variables_are_substituted() {
    let yaml = "services:\n  a:\n    listen: \"${A_ADDR:-127.0.0.1:0}\"\n    routes:\n      - path: /x\n        body: '\"${GREETING}\"'\n";
    let vars = |n: &str| (n == "GREETING").then(|| "hi".to_string());
    let c = load("stubs.yaml", yaml, &vars).expect("loads");
    assert_eq!(c.services(), [("a".to_string(), "127.0.0.1:0".to_string())]);
    let e = match load("stubs.yaml", yaml, &no_vars) {
        Ok(_) => panic!("GREETING is unset"),
        Err(e) => e.to_string(),
    };
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
}

#[test]
fn missing_file_and_empty_config() {
    let e = fanout_stub::load_file("/nonexistent/stubs.yaml", &no_vars)
        .expect_err("error")
        .to_string();
    assert!(e.contains("cannot read stub config"), "{e}");
    let e = err("services: {}\n");
    assert!(e.contains("no services"), "{e}");
}

#[test]
fn schema_describes_the_config() {
    let s = fanout_stub::schema();
    let text = s.to_string();
    for needle in [
        "services",
        "listen",
        "routes",
        "latency",
        "uniform",
        "body",
        "lognormal",
        "mixture",
        "stall",
        "faults",
        "slow_body",
        "close_after_headers",
        "protos",
        "grpc",
        "grpc_status",
        "grpc_message",
        "UNAVAILABLE",
    ] {
        assert!(text.contains(needle), "schema lacks {needle}: {text}");
    }
}

#[test]
fn new_latency_models_load() {
    let c = ok(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /n
        latency: {normal: {mean: 20ms, sd: 5ms}}
      - path: /l
        latency: {lognormal: {median: 90ms, sigma: 0.1}}
      - path: /m
        latency:
          mixture:
            - {p: 0.99, latency: 2ms}
            - {p: 0.01, latency: {uniform: {min: 100ms, max: 200ms}}}
      - path: /s
        latency: {stall: {every: 1s, duration: 200ms, base: {fixed: 1ms}}}
      - path: /s2
        latency: {stall: {every: 5s, duration: 1s}}
"#);
    let ms = Duration::from_millis;
    let want = [
        Latency::Normal {
            mean: ms(20),
            sd: ms(5),
        },
        Latency::LogNormal {
            median: ms(90),
            sigma: 0.1,
        },
        Latency::Mixture(vec![
            WeightedLatency {
                p: 0.99,
                latency: Latency::Fixed(ms(2)),
            },
            WeightedLatency {
                p: 0.01,
                latency: Latency::Uniform {
                    min: ms(100),
                    max: ms(200),
                },
            },
        ]),
        Latency::Stall {
            every: ms(1000),
            duration: ms(200),
            base: Box::new(Latency::Fixed(ms(1))),
        },
        Latency::Stall {
            every: ms(5000),
            duration: ms(1000),
            base: Box::new(Latency::None),
        },
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = c.start().await.expect("start");
        for (key, want) in c.routes("a").expect("service a").iter().zip(want) {
            assert_eq!(s.behaviour("a", key).expect("route").latency, want, "{key}");
        }
    });
}

#[test]
fn mixture_probabilities_must_sum_to_one() {
    let yaml = r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /m
        latency:
          mixture:
            - {p: 0.9, latency: 2ms}
            - {p: 0.05, latency: 20ms}
"#;
    let e = err(yaml);
    // The position of the model (`mixture:`).
    assert!(e.starts_with("stubs.yaml:7:11: "), "{e}");
    assert!(e.contains("sum to 0.95,"), "{e}");
    assert!(e.contains("hint:"), "{e}");

    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /m
        latency: {mixture: [{p: 1.5, latency: 2ms}, {p: -0.5, latency: 1ms}]}
"#);
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
    assert!(e.contains("not within 0..1"), "{e}");

    // Within the tolerance of 1e-6.
    ok(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /m
        latency: {mixture: [{p: 0.3333333, latency: 2ms}, {p: 0.6666667, latency: 1ms}]}
"#);
}

#[test]
fn stall_and_lognormal_are_checked() {
    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /s
        latency: {stall: {every: 100ms, duration: 200ms}}
"#);
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
    assert!(e.contains("shorter than `every`"), "{e}");
    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /s
        latency: {lognormal: {median: 10ms, sigma: -1}}
"#);
    assert!(e.starts_with("stubs.yaml:6:"), "{e}");
    assert!(e.contains("sigma"), "{e}");
}

#[test]
fn faults_load_and_bad_faults_have_positions() {
    let c = ok(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /f
        faults:
          - {status: 503, p: 0.1, body: '{error: "down", path: $request.path}'}
          - {reset: {}, p: 0.01}
          - {hang: {}, p: 0.01}
          - {slow_body: {chunks: 10, duration: 1s}, p: 0.01}
          - {malformed: {}, p: 0.01}
          - {close_after_headers: {}}
"#);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = c.start().await.expect("start");
        let b = s.behaviour("a", "GET /f").expect("route");
        let kinds: Vec<_> = b.faults.iter().map(|f| (f.kind.name(), f.p)).collect();
        assert_eq!(
            kinds,
            [
                ("status", 0.1),
                ("reset", 0.01),
                ("hang", 0.01),
                ("slow_body", 0.01),
                ("malformed", 0.01),
                ("close_after_headers", 1.0)
            ]
        );
    });

    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /f
        faults:
          - {status: 503, p: 0.1}
          - {explode: {}, p: 0.1}
"#);
    assert!(e.starts_with("stubs.yaml:8:"), "{e}");
    assert!(e.contains("unknown fault kind `explode`"), "{e}");

    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /f
        faults:
          - {reset: {}, p: 0.1}
          - {hang: {}, p: 2}
"#);
    assert!(e.starts_with("stubs.yaml:8:"), "{e}");
    assert!(e.contains("probability 2 is not within 0..1"), "{e}");

    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /f
        faults:
          - {status: 503, reset: {}}
"#);
    assert!(e.starts_with("stubs.yaml:7:"), "{e}");
    assert!(e.contains("one kind"), "{e}");

    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /f
        faults:
          - {slow_body: {chunks: 0, duration: 1s}}
"#);
    assert!(e.starts_with("stubs.yaml:7:"), "{e}");
    assert!(e.contains("chunks"), "{e}");

    // A bad body expression points inside the expression.
    let e = err(r#"services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /f
        faults:
          - status: 503
            body: '{a: $nope}'
"#);
    // The quote is at column 19; `$nope` starts at column 24.
    assert!(e.starts_with("stubs.yaml:8:24: "), "{e}");
}

#[test]
fn event_streams_are_checked() {
    let e = err(r#"
services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /e
        body: '1'
        faults: [{slow_body: {chunks: 2, duration: 1s}}]
        sse:
          events: [{event: "two\nlines"}, {delay: 1s}]
"#);
    for want in [
        "an `sse` route has no `body`",
        "this fault shapes a body",
        "`sse.events[0].event` is one line",
        "`sse.events[1]` sends nothing",
    ] {
        assert!(e.contains(want), "{want} in:\n{e}");
    }
    ok(r#"
services:
  a:
    listen: 127.0.0.1:0
    routes:
      - path: /e
        faults: [{status: 503, p: 0.5}]
        sse: {ids: true, retry: 100, repeat: 0, events: [{data: "a\nb", delay: 1s}]}
"#);
}
