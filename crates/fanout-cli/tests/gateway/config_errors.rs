//! Every kind of config error is reported as `FILE:LINE:COL: message` with the right position.
//! Table-driven: (what, config, expected position, expected words in the message).

use fanout::load_gateway;

const CASES: &[(&str, &str, &str, &str)] = &[
    (
        "YAML syntax",
        "routes:\n  - path: /a\n    respond: { body: '1'\n",
        "3:14",
        "unclosed bracket",
    ),
    (
        "unknown field",
        "routes:\n  - path: /a\n    respnd: { body: '1' }\n",
        "3:5",
        "unknown field `respnd`",
    ),
    (
        "wrong type (duration)",
        "routes:\n  - path: /a\n    deadline: soon\n    respond: { body: '1' }\n",
        "3:15",
        "invalid duration `soon`",
    ),
    (
        "wrong type (boolean)",
        "routes:\n  - path: /a\n    flow:\n      s: { value: '1', optional: maybe }\n    respond: { body: '1' }\n",
        "4:34",
        "invalid boolean",
    ),
    (
        "missing field",
        "routes:\n  - path: /a\n    flow: {}\n",
        "3:5",
        "missing field `respond`",
    ),
    (
        "invalid expression",
        "routes:\n  - path: /a\n    respond:\n      body: '{a: (1 + }'\n",
        "4:23",
        "invalid jq syntax",
    ),
    (
        "unknown step reference",
        "routes:\n  - path: /a\n    flow:\n      s: { value: '1' }\n    respond:\n      body: '{x: $s, y: $nope}'\n",
        "6:25",
        "undefined variable `$nope`",
    ),
    (
        "unknown backend",
        "backends:\n  b: { url: 'http://127.0.0.1:1' }\nroutes:\n  - path: /a\n    flow:\n      s: { http: { backend: c, path: '\"/\"' } }\n    respond: { body: '$s' }\n",
        "6:29",
        "unknown backend `c`",
    ),
    (
        "dependency cycle",
        "routes:\n  - path: /a\n    flow:\n      a: { value: '$b + 1' }\n      b: { value: '$c + 1' }\n      c: { value: '$a + 1' }\n    respond: { body: '$a' }\n",
        "4:7",
        "dependency cycle: $a → $b → $c → $a",
    ),
    (
        "duplicate route",
        "routes:\n  - path: /a\n    respond: { body: '1' }\n  - path: /a\n    method: get\n    respond: { body: '2' }\n",
        "4:11",
        "duplicate route GET /a",
    ),
    (
        "step with two kinds",
        "backends:\n  b: { url: 'http://127.0.0.1:1' }\nroutes:\n  - path: /a\n    flow:\n      s:\n        value: '1'\n        http: { backend: b, path: '\"/\"' }\n    respond: { body: '$s' }\n",
        "6:7",
        "exactly one of `http`, `grpc`, `sql`, `model`, `value` or `fail`",
    ),
    (
        "missing environment variable",
        "backends:\n  b: { url: 'http://${NOPE_HOST}' }\nroutes: []\n",
        "2:21",
        "environment variable `NOPE_HOST` is not set",
    ),
    (
        "invalid backend URL",
        "backends:\n  b: { url: 'ftp://x' }\nroutes: []\n",
        "2:13",
        "invalid URL `ftp://x`",
    ),
    (
        "$item outside for_each",
        "routes:\n  - path: /a\n    flow:\n      s: { value: '$item' }\n    respond: { body: '$s' }\n",
        "4:20",
        "outside a `for_each` step",
    ),
    (
        "invalid method",
        "routes:\n  - path: /a\n    method: 'GE T'\n    respond: { body: '1' }\n",
        "3:13",
        "invalid HTTP method",
    ),
    (
        "duplicate key",
        "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\nroutes: []\n",
        "2:1",
        "duplicate mapping key",
    ),
    (
        "step reads itself",
        "routes:\n  - path: /a\n    flow:\n      s: { value: '$s' }\n    respond: { body: '$s' }\n",
        "4:20",
        "reads its own result",
    ),
    (
        "invalid header name",
        "routes:\n  - path: /a\n    respond:\n      body: '1'\n      headers: { 'bad header': '1' }\n",
        "5:32",
        "invalid header name `bad header`",
    ),
    (
        "framing header in respond.headers (issue 69 §8)",
        "routes:\n  - path: /a\n    respond:\n      body: '1'\n      headers: { content-length: '$request.headers[\"x-len\"]' }\n",
        "5:34",
        "header `content-length` frames the message",
    ),
    (
        "framing header in respond.headers, a literal",
        "routes:\n  - path: /a\n    respond:\n      body: '1'\n      headers:\n        Transfer-Encoding: '\"chunked\"'\n",
        "6:28",
        "header `Transfer-Encoding` frames the message",
    ),
    (
        "framing header sent to a backend",
        "backends:\n  b: { url: 'http://127.0.0.1:1' }\nroutes:\n  - path: /a\n    flow:\n      s: { http: { backend: b, path: '\"/\"', headers: { connection: '\"close\"' } } }\n    respond: { body: '$s' }\n",
        "6:68",
        "header `connection` frames the message",
    ),
    (
        "framing header in a backend's static headers",
        "backends:\n  b: { url: 'http://127.0.0.1:1', headers: { content-length: '0' } }\nroutes: []\n",
        "2:13",
        "header `content-length` frames the message",
    ),
    (
        "unknown function",
        "routes:\n  - path: /a\n    respond:\n      body: |\n        {a: 1}\n        | frobnicate(.a)\n",
        "6:11",
        "undefined filter `frobnicate`",
    ),
];

/// The errors `yaml` (as `f.yaml`, no environment) is refused with, as printed.
fn errors_of(yaml: &str) -> String {
    load_gateway("f.yaml", yaml, &|_: &str| None)
        .err()
        .expect("errors")
        .to_string()
}

#[test]
fn config_errors_have_positions_and_messages() {
    assert!(CASES.len() >= 12);
    let no_env = |_: &str| None;
    let mut failures = Vec::new();
    for (what, yaml, pos, words) in CASES {
        let err = match load_gateway("f.yaml", yaml, &no_env) {
            Ok(_) => {
                failures.push(format!("{what}: accepted"));
                continue;
            }
            Err(e) => e.to_string(),
        };
        let first = err.lines().next().unwrap_or("");
        let expected_prefix = format!("f.yaml:{pos}: ");
        if !first.starts_with(&expected_prefix) || !first.contains(words) {
            failures.push(format!(
                "{what}: expected `{expected_prefix}…{words}…`, got:\n{err}"
            ));
        }
        if !err.contains("hint:") && *what != "YAML syntax" {
            failures.push(format!("{what}: no hint in:\n{err}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn validate_reports_all_semantic_errors_at_once() {
    let yaml =
        "routes:\n  - path: /a\n    flow:\n      s: { value: '$x' }\n    respond: { body: '$y' }\n";
    let err = errors_of(yaml);
    assert!(
        err.contains("f.yaml:4:20:") && err.contains("f.yaml:5:23:"),
        "{err}"
    );
}

/// Issue 46 §3 saw the `coalesce: true … may write` error printed twice for one mistake; not
/// reproduced since (HTTP, SQL and gRPC routes, defaults, a models directory). Each mistake is
/// one error, whatever kinds of routes and steps the config has.
#[test]
fn a_coalesce_on_a_writing_route_is_one_error() {
    let yaml = r#"
defaults: { coalesce: true }
backends:
  a: { url: "http://127.0.0.1:9" }
  db: { protocol: postgres, url: "postgres://u@127.0.0.1:9/db" }
routes:
  - path: /x
    method: POST
    coalesce: true
    flow:
      s: { http: { backend: a, method: POST, path: '"/y"' } }
      t: { sql: { backend: db, mode: exec, query: "UPDATE t SET a = 1" } }
      u: { http: { backend: a, path: '"/z"' }, for_each: '[1, 2]' }
    respond: { body: '$s' }
  - path: /z
    coalesce: true
    flow:
      s: { sql: { backend: db, mode: exec, query: "UPDATE t SET a = 1" } }
    respond: { body: '$s' }
"#;
    let err = errors_of(yaml);
    assert_eq!(
        err.matches("`coalesce: true`, but step").count(),
        2,
        "{err}"
    );
    assert_eq!(err.matches("f.yaml:9:15:").count(), 1, "{err}");
    assert_eq!(err.matches("f.yaml:16:15:").count(), 1, "{err}");
}

/// Issue 46: one mistake in a YAML anchor that two routes share (the second through a `<<` merge)
/// was printed twice — once per route, the second time at the merge entry. A mistake is reported
/// once, where its text is; a route repeated whole through an alias is still a duplicate at the
/// alias.
#[test]
fn a_mistake_in_a_shared_yaml_anchor_is_one_error_where_its_text_is() {
    let yaml = r#"
backends:
  a: { url: "http://127.0.0.1:9" }
routes:
  - &common
    path: /x
    coalesce: true
    flow:
      s: { http: { backend: a, method: POST, path: '"/y"' } }
      t: { http: { backend: nope, path: '"/t"' } }
    respond: { body: '$s' }
  - <<: *common
    path: /z
"#;
    let err = errors_of(yaml);
    assert_eq!(err.matches("unknown backend `nope`").count(), 1, "{err}");
    assert_eq!(
        err.matches("f.yaml:10:29: unknown backend").count(),
        1,
        "{err}"
    );
    let coalesce = yaml.replace("      t: { http: { backend: nope, path: '\"/t\"' } }\n", "");
    let err = errors_of(&coalesce);
    assert_eq!(
        err.matches("`coalesce: true`, but step").count(),
        1,
        "{err}"
    );
    assert_eq!(
        err.matches("f.yaml:7:15: `coalesce: true`").count(),
        1,
        "{err}"
    );
    assert!(!err.contains("f.yaml:12:"), "{err}");

    let repeated = format!(
        "{}  - *common\n",
        coalesce.replace("coalesce: true", "coalesce: false")
    );
    let err = errors_of(&repeated);
    assert!(
        err.contains("f.yaml:13:5: duplicate route GET /x (first defined at line 6)"),
        "{err}"
    );
}
