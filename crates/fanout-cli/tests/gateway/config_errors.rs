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
        "routes:\n  - path: /a\n    pass: {}\n",
        "3:11",
        "missing field `backend`",
    ),
    (
        "a route without respond or pass",
        "routes:\n  - path: /a\n    flow: {}\n",
        "2:11",
        "a route needs `respond` (or `pass`)",
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
    (
        "request id header",
        "server:\n  request_id_header: \"x request id\"\nroutes: []\n",
        "2:3",
        "server.request_id_header `x request id` is not a valid header name",
    ),
    (
        "drain spread not within the shutdown grace",
        "server:\n  shutdown_grace: 10s\n  drain_spread: 10s\nroutes: []\n",
        "3:3",
        "server.drain_spread (10s) must be shorter than server.shutdown_grace (10s)",
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

/// Issue 69 §16: the errors of the edge sections (auth, rate limits, compression, TLS, trusted
/// proxies) point at the key at fault — none is `FILE:0:0:` or a bare `FILE:` — and a file with
/// mistakes in several sections gets all of them at once.
#[test]
fn edge_section_errors_have_positions_and_all_are_printed() {
    let cases: &[(&str, &[&str])] = &[
        (
            "auth:\n  providers:\n    corp:\n      issuer: \"\"\n      algorithms: [ES256]\n    q:\n      issuer: x\n      hmac_secret: 0123456789abcdef0123456789abcdef\n      algorithms: [HS256]\n      token: { query: t }\nroutes: []\n",
            &[
                "f.yaml:3:5: auth.providers.corp has no keys",
                "f.yaml:4:7: auth.providers.corp.issuer is empty",
                "f.yaml:10:16: auth.providers.q.token: reading the token from the query parameter",
            ],
        ),
        (
            "rate_limits:\n  p1: { rate: 10/s, burst: 0, key: '1' }\n  p2: { rate: 10/s, key: '1', store: redis }\n  p3: { rate: 10/s, key: '1', redis: { fleet_share: 0 } }\nserver:\n  trusted_proxies: [10.0.0.0/8, 10.0.0.0/33]\nroutes: []\n",
            &[
                "f.yaml:2:21: rate_limits.p1.burst must be at least 1",
                "f.yaml:3:31: rate_limits.p2: `store: redis` needs",
                "f.yaml:4:40: rate_limits.p3.redis.fleet_share must be in (0, 1]",
                "f.yaml:6:33: server.trusted_proxies: `10.0.0.0/33` is not",
            ],
        ),
        (
            "compression:\n  response:\n    enabled: true\n    levels: { gzip: 10 }\n    content_types: [application/json, json]\n    algorithms: []\nroutes: []\n",
            &[
                "f.yaml:4:15: `compression.response.levels.gzip` is 10",
                "f.yaml:6:5: `compression.response.algorithms` is empty",
                "f.yaml:5:39: `compression.response.content_types` entry `json`",
            ],
        ),
        (
            "tls:\n  handshake_timeout: 0s\n  certificates: []\nroutes: []\n",
            &[
                "f.yaml:3:3: `tls.certificates` is empty",
                "f.yaml:2:3: `tls.handshake_timeout` must be above 0",
            ],
        ),
        (
            "rate_limits:\n  'a:b': { rate: 10/s, key: '1' }\nroutes: []\n",
            &["f.yaml:2:3: rate limit policy name `a:b` may not"],
        ),
        (
            // CORS (a structural check) and auth (a built part): both.
            "auth:\n  providers:\n    corp: { issuer: x }\nroutes:\n  - path: /a\n    cors: { origins: ['*'], credentials: true }\n    respond: { body: '1' }\n",
            &[
                "f.yaml:6:23: `cors.origins: *` with `credentials: true`",
                "f.yaml:3:5: auth.providers.corp has no keys",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (yaml, want) in cases {
        let err = errors_of(yaml);
        for w in *want {
            if !err.lines().any(|l| l.starts_with(w)) {
                failures.push(format!("expected a line `{w}…` in:\n{err}"));
            }
        }
        for l in err.lines().filter(|l| !l.starts_with("  hint:")) {
            let pos = l.strip_prefix("f.yaml:").unwrap_or("");
            let has_pos = pos
                .split(':')
                .take(2)
                .all(|n| n.parse::<u32>().is_ok_and(|n| n > 0));
            if !has_pos {
                failures.push(format!("no position: {l}"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// Issue 69 §16: a valid config that may not mean what it says is warned about, not refused:
/// a rate-limit key that reads `$request.body` (null when limits decide) or `$request.auth` on
/// a route without `auth`, and a trusted proxy range that trusts every address.
#[test]
fn validate_warns_about_keys_that_are_constant_and_proxies_that_trust_everyone() {
    let dir = fanout_testkit::TempDir::new("validate-warnings");
    let cfg = dir.write(
        "fanout.yaml",
        "rate_limits:\n  body: { rate: 10/s, key: '$request.body.user' }\n  who: { rate: 10/s, key: '$request.auth.sub' }\n  ip: { rate: 10/s, key: '$request.client.address' }\nserver:\n  trusted_proxies: [10.0.0.0/8, 0.0.0.0/0]\nroutes:\n  - path: /a\n    rate_limit: [body, who, ip]\n    respond: { body: '1' }\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["validate", cfg.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "warnings do not refuse:\n{stderr}"
    );
    assert!(stdout.contains(": ok"), "{stdout}");
    let file = cfg.to_str().unwrap();
    for want in [
        format!("{file}:2:23: warning: rate_limits.body.key reads $request.body"),
        format!(
            "{file}:3:22: warning: rate_limits.who.key reads $request.auth, which is null on GET /a"
        ),
        format!("{file}:6:33: warning: server.trusted_proxies has `0.0.0.0/0`"),
    ] {
        assert!(
            stderr.lines().any(|l| l.starts_with(&want)),
            "{want}\nin:\n{stderr}"
        );
    }
    assert!(!stderr.contains("rate_limits.ip"), "{stderr}");
}
