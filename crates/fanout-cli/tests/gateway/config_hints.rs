//! Error messages that finish the job: every YAML error carries a hint, misspelt names get a
//! "did you mean", and `fanout validate` on a missing file says what to check.
//! Table-driven: (what, config, expected position, words of the message, words of the hint).

use fanout::load_gateway;
use std::process::{Command, Stdio};

const CASES: &[(&str, &str, &str, &str, &str)] = &[
    (
        "key indented less than its siblings",
        "routes:\n  - path: /a\n    respond:\n      body: '1'\n     status: 200\n",
        "5:6",
        "did not find expected key",
        "check the indentation of this line and the one above: keys of one mapping must start in \
         the same column",
    ),
    (
        "key indented more than its siblings",
        "routes:\n  - path: /a\n      respond: { body: '1' }\n",
        "3:14",
        "mapping values are not allowed in this context",
        "check the indentation of this line and the one above",
    ),
    (
        "list item out of line",
        "routes:\n  - path: /a\n    respond: { body: '1' }\n - path: /b\n",
        "4:2",
        "did not find expected key",
        "check the indentation of this line and the one above",
    ),
    (
        "tab as indentation",
        "routes:\n  - path: /a\n    respond:\n\tbody: '1'\n",
        "4:2",
        "tabs disallowed",
        "YAML indentation must be spaces, not tabs",
    ),
    (
        "tab after a value",
        "routes:\n  - path: /a\n\trespond: { body: '1' }\n",
        "2:11",
        "found a tab",
        "not tabs",
    ),
    (
        "unclosed quote",
        "routes:\n  - path: /a\n    respond: { body: \"1 }\n",
        "3:22",
        "unclosed quote",
        "add the closing quote",
    ),
    (
        "unclosed bracket",
        "routes:\n  - path: /a\n    respond: { body: '1' \n",
        "3:14",
        "unclosed bracket",
        "add the closing bracket",
    ),
    (
        "jq interpolation in double quotes",
        "routes:\n  - path: /a\n    respond: { body: \"\\(.x)\" }\n",
        "3:22",
        "unknown escape character",
        "single quotes",
    ),
    (
        "a colon inside a plain value",
        "routes:\n  - path: /a\n    respond:\n      body: x: y\n",
        "4:14",
        "mapping values are not allowed",
        "quote values that contain `: `",
    ),
    (
        "a key without a colon",
        "routes:\n  - path: /a\n    respond: { body: '1' }\n  bad\n",
        "4:3",
        "simple key expected ':'",
        "add the missing `:`",
    ),
    (
        "two documents",
        "routes: []\n---\nroutes: []\n",
        "3:1",
        "multiple YAML documents in one file",
        "remove the `---` line",
    ),
    (
        "unknown field close to a real one",
        "routes:\n  - path: /a\n    respnd: { body: '1' }\n",
        "3:5",
        "unknown field `respnd`",
        "did you mean `respond`? (`fanout schema` lists every field)",
    ),
    (
        "unknown server field close to a real one",
        "server:\n  stall_treshold: 5ms\nroutes: []\n",
        "2:3",
        "unknown field `stall_treshold`",
        "did you mean `stall_threshold`?",
    ),
    (
        "unknown field, nothing close",
        "routes:\n  - path: /a\n    zzz: 1\n    respond: { body: '1' }\n",
        "3:5",
        "unknown field `zzz`",
        "remove the field or fix its spelling; `fanout schema` lists every field",
    ),
    (
        "missing field",
        "routes:\n  - path: /a\n    pass: {}\n",
        "3:11",
        "missing field `backend`",
        "check its indentation",
    ),
    (
        "a route without respond (or pass)",
        "routes:\n  - path: /a\n",
        "2:11",
        "a route needs `respond` (or `pass`)",
        "check its indentation",
    ),
    (
        "unknown jq function close to a real one",
        "routes:\n  - path: /a\n    respond: { body: '[1] | lenght' }\n",
        "3:29",
        "undefined filter `lenght`",
        "did you mean `length`?",
    ),
    (
        "jq function with arguments separated by a comma",
        "routes:\n  - path: /a\n    respond: { body: '\"ab\" | sub(\"a\", \"b\")' }\n",
        "3:30",
        "undefined filter `sub`",
        "`sub` takes 2 or 3 arguments, not 1; arguments are separated by `;`, not `,`",
    ),
    (
        "unknown step close to a real one",
        "routes:\n  - path: /a\n    flow:\n      search: { value: '1' }\n    respond: { body: '{n: $serch}' }\n",
        "5:27",
        "undefined variable `$serch`",
        "did you mean `$search`? (known names here: ",
    ),
    (
        "unknown step, nothing close",
        "routes:\n  - path: /a\n    flow:\n      search: { value: '1' }\n    respond: { body: '$zzz' }\n",
        "5:23",
        "undefined variable `$zzz`",
        "known names here: $request",
    ),
    (
        "a literal path where a jq expression is expected",
        "backends:\n  orders: { url: \"http://127.0.0.1:1\" }\nroutes:\n  - path: /a\n    flow:\n      o: { http: { backend: orders, path: '/orders' } }\n    respond: { body: '$o' }\n",
        "6:44",
        "invalid jq syntax",
        "this field is a jq expression, so a fixed text is a jq string: write `'\"/orders\"'`",
    ),
];

/// Names that compile but are refused in a place are not offered there: `$item`/`$index` in
/// `respond` and in a step without `for_each`.
#[test]
fn hints_do_not_offer_item_and_index_outside_for_each() {
    let no_env = |_: &str| None;
    for yaml in [
        "routes:\n  - path: /a\n    flow:\n      search: { value: '1' }\n    respond: { body: '$zzz' }\n",
        "routes:\n  - path: /a\n    flow:\n      search: { value: '1' }\n    respond: { body: '1', headers: { x-a: '$zzz' } }\n",
        "routes:\n  - path: /a\n    flow:\n      search: { value: '$zzz' }\n    respond: { body: '1' }\n",
    ] {
        let err = load_gateway("f.yaml", yaml, &no_env)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("known names here: $request"), "{err}");
        assert!(!err.contains("$item") && !err.contains("$index"), "{err}");
    }
    // inside `for_each` they are offered
    let yaml = "routes:\n  - path: /a\n    flow:\n      each: { for_each: '[1]', value: '$zzz' }\n    respond: { body: '1' }\n";
    let err = load_gateway("f.yaml", yaml, &no_env)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("$item") && err.contains("$index"), "{err}");
}

#[test]
fn errors_carry_hints_that_say_what_to_do() {
    let no_env = |_: &str| None;
    let mut failures = Vec::new();
    for (what, yaml, pos, message, hint) in CASES {
        let err = match load_gateway("f.yaml", yaml, &no_env) {
            Ok(_) => {
                failures.push(format!("{what}: accepted"));
                continue;
            }
            Err(e) => e.to_string(),
        };
        let mut lines = err.lines();
        let first = lines.next().unwrap_or("");
        let second = lines.next().unwrap_or("");
        let prefix = format!("f.yaml:{pos}: ");
        if !first.starts_with(&prefix) || !first.contains(message) {
            failures.push(format!(
                "{what}: expected `{prefix}…{message}…`, got:\n{err}"
            ));
        }
        if !second.starts_with("  hint: ") || !second.contains(hint) {
            failures.push(format!("{what}: expected the hint `…{hint}…`, got:\n{err}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// Whatever is broken in the YAML, the error says what to do about it.
#[test]
fn every_yaml_error_has_a_hint() {
    let broken = [
        "routes: [\n",
        "routes: {\n",
        "routes:\n  - path: '/a\n",
        "listen: @x\nroutes: []\n",
        "listen: 'a' b\nroutes: []\n",
        "routes: *nothing\n",
        "routes:\n  - path: /a\n    respond: { body: [1, 2 }\n",
        "routes:\n  - path: /a\n    method: [GET]\n    respond: { body: '1' }\n",
        "routes: 5\n",
        "- a\n- b\n",
        "\t\n",
        "routes:\n- path: /a\n  respond: {body: '1'}\n -x\n",
        "a: b: c\n",
        "? complex\n: key\n",
        "routes: []\nroutes: []\n",
        "server: { max_body_bytes: lots }\nroutes: []\n",
        "%YAML 9.9\n---\nroutes: []\n",
    ];
    let mut failures = Vec::new();
    for yaml in broken {
        match load_gateway("f.yaml", yaml, &|_: &str| None) {
            Ok(_) => failures.push(format!("accepted: {yaml:?}")),
            Err(e) => {
                let err = e.to_string();
                if !err.starts_with("f.yaml:") || !err.contains("\n  hint: ") {
                    failures.push(format!("{yaml:?}:\n{err}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// `fanout validate FILE` takes a path, not `--config`: the hint must not talk about `--config`.
#[test]
fn validate_of_a_missing_file_says_what_to_check() {
    let path = std::env::temp_dir().join(format!(
        "fanout-config-hints-{}-missing.yaml",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("validate")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run fanout validate: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let path = path.display();
    assert!(
        err.starts_with(&format!("{path}: cannot read config: ")),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "\n  hint: check that the file exists and is readable: {path}"
        )),
        "{err}"
    );
    assert!(!err.contains("--config"), "{err}");

    // a directory is not a config file
    let dir = std::env::temp_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("validate")
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run fanout validate: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("hint: pass the path of a regular file"),
        "{err}"
    );
}

/// Every unknown field of a file is reported in one run, each at its own line with its own
/// did-you-mean — in gateway and stubs configs alike.
#[test]
fn every_unknown_field_is_reported_in_one_run() {
    let no_env = |_: &str| None;
    let yaml = "\
listen: 127.0.0.1:0
servr: {}
backends:
  a: { url: \"http://127.0.0.1:1\", timout: 1s }
routes:
  - path: /a
    flow:
      x: { http: { backend: a, path: '\"/x\"', qurey: {} } }
    on_status: { 404: 400 }
    respond: { bdoy: '1' }
";
    let err = load_gateway("f.yaml", yaml, &no_env)
        .err()
        .unwrap()
        .to_string();
    for (at, name, suggestion) in [
        ("f.yaml:2:1:", "servr", "did you mean `server`?"),
        ("f.yaml:4:35:", "timout", "did you mean `timeout`?"),
        ("f.yaml:8:46:", "qurey", "did you mean `query`?"),
        ("f.yaml:9:5:", "on_status", ""),
        ("f.yaml:10:16:", "bdoy", "did you mean `body`?"),
    ] {
        let line = err
            .lines()
            .position(|l| l.starts_with(at) && l.contains(&format!("unknown field `{name}`")))
            .unwrap_or_else(|| panic!("no `{at} unknown field `{name}`` in:\n{err}"));
        let hint = err.lines().nth(line + 1).unwrap_or("");
        assert!(hint.contains(suggestion), "{name}: {hint}\n{err}");
    }
    assert_eq!(err.matches("unknown field").count(), 5, "{err}");

    let stubs = "services:\n  a:\n    listen: 127.0.0.1:0\n    latncy: 1ms\n    routes:\n      - path: /x\n        bdoy: '1'\n";
    let err = fanout_stub::load("s.yaml", stubs, &no_env)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("s.yaml:4:5: unknown field `latncy`"), "{err}");
    assert!(err.contains("s.yaml:7:9: unknown field `bdoy`"), "{err}");
}
