//! `fanout test`, run as users run it: the real binary on a temporary directory holding a
//! config, a stubs file and a cases file.

use fanout_testkit::TempDir;
use std::process::{Command, Output};

const CONFIG: &str = r#"
listen: 127.0.0.1:0
backends:
  search: { url: "http://${SEARCH_ADDR}", timeout: 200ms }
  details: { url: "http://${DETAILS_ADDR}", timeout: 100ms }
routes:
  - path: /items
    deadline: 1s
    flow:
      found:
        http: { backend: search, path: '"/search"', query: { q: '$request.query.q' } }
      info:
        optional: true
        default: null
        http: { backend: details, path: '"/details"' }
    respond:
      body: '{q: $found.q, n: $found.n, info: $info}'
"#;

const STUBS: &str = r#"
services:
  search:
    listen: "${SEARCH_ADDR:-127.0.0.1:0}"
    routes:
      - path: /search
        body: '{q: $request.query.q, n: 2}'
  details:
    listen: "${DETAILS_ADDR:-127.0.0.1:0}"
    routes:
      - path: /details
        body: '{size: "L"}'
"#;

fn suite(cases: &str) -> TempDir {
    let d = TempDir::new("ftest");
    d.write("fanout.yaml", CONFIG);
    d.write("stubs.yaml", STUBS);
    d.write("cases.yaml", cases);
    d
}

fn fanout_test(d: &TempDir, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fanout"))
        .arg("test")
        .arg(d.path())
        .args(extra)
        .output()
        .expect("fanout runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn passing_cases_exit_0_and_name_each_case_with_its_line() {
    let d = suite(
        r#"cases:
  - name: both backends
    request: { path: "/items?q=a" }
    status: 200
    response: { q: a, n: 2, info: { size: L } }
    backend_calls:
      search: { count: 1, calls: [{ method: GET, path: /search, query: { q: a } }] }
      details: { count: 1, routes: { "GET /details": 1 } }
  - name: details down, the answer is partial
    request: { path: "/items?q=b" }
    backends:
      details: { fault: down }
    status: 200
    headers: { x-fanout-partial: info }
    response_includes: { q: b, info: null }
    expect: ['.n == 2', '$status == 200', '$headers["x-fanout-partial"] == "info"']
    backend_calls: { details: 1 }
  - name: details slow, the answer still comes within its bound
    request: { path: "/items?q=c" }
    backends:
      details: { fault: slow }
    status: 200
    max_latency_ms: 900
    response_includes: { info: null }
  - name: the override ended with its case
    request: { path: "/items?q=d" }
    status: 200
    response: { q: d, n: 2, info: { size: L } }
"#,
    );
    let o = fanout_test(&d, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let file = d.join("cases.yaml").display().to_string();
    for (name, line) in [
        ("both backends", 2),
        ("details down, the answer is partial", 9),
        ("details slow, the answer still comes within its bound", 18),
        ("the override ended with its case", 25),
    ] {
        assert!(out.contains(&format!("✓ {name}  ({file}:{line},")), "{out}");
    }
    assert!(out.contains("4 cases, 4 passed, 0 failed"), "{out}");
}

#[test]
fn a_failing_case_exits_1_with_a_diff_and_the_failed_assertions() {
    let d = suite(
        r#"cases:
  - name: wrong answer
    request: { path: "/items?q=a" }
    status: 201
    response: { q: a, n: 3, info: { size: L } }
    backend_calls:
      search: { count: 2, calls: [{ path: /search, query: { q: b }, headers: { x-none: "1" } }] }
    expect: ['.n == 5']
  - name: right answer
    request: { path: "/items?q=a" }
    status: 200
    response: { q: a, n: 2, info: { size: L } }
"#,
    );
    let o = fanout_test(&d, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let file = d.join("cases.yaml").display().to_string();
    assert!(
        out.contains(&format!("✗ wrong answer  ({file}:2,")),
        "{out}"
    );
    assert!(out.contains("status: expected 201, got 200"), "{out}");
    assert!(out.contains("at .n: expected 3, got 2"), "{out}");
    assert!(
        out.contains("-   \"n\": 3,") && out.contains("+   \"n\": 2,"),
        "{out}"
    );
    assert!(out.contains("calls to search: expected 2, got 1"), "{out}");
    assert!(out.contains("expect `.n == 5`: gave false"), "{out}");
    assert!(
        out.contains(
            "calls to search: no call matches calls[0]; the nearest: query .q: expected \"b\", \
             got \"a\", header x-none: none (expected \"1\"); received: [GET /search?q=a]"
        ),
        "{out}"
    );
    assert!(
        out.contains(&format!("✓ right answer  ({file}:9,")),
        "{out}"
    );
    assert!(out.contains("2 cases, 1 passed, 1 failed"), "{out}");
    // CASES selects by name: the passing one alone exits 0
    let o = fanout_test(&d, &["right"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("1 cases, 1 passed"), "{}", text(&o));
}

#[test]
fn a_bad_cases_file_is_reported_with_file_line_col() {
    let d = suite(
        "cases:\n  - name: typo\n    request: { path: /items }\n    status: 200\n    respnse: {}\n",
    );
    let o = fanout_test(&d, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    let file = d.join("cases.yaml").display().to_string();
    assert!(
        out.contains(&format!("{file}:5:5: unknown field `respnse`")),
        "{out}"
    );
    assert!(
        out.contains("hint: did you mean `response`? (`fanout schema --cases` lists every field)"),
        "{out}"
    );
    // with --junit, CI gets the error as a JUnit report
    let junit = d.join("junit.xml");
    let o = fanout_test(&d, &["--junit", &junit.display().to_string()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert!(xml.contains("errors=\"1\""), "{xml}");
    assert!(xml.contains("unknown field `respnse`"), "{xml}");
}

#[test]
fn junit_output_parses_as_junit_xml_with_the_counts() {
    let d = suite(
        r#"cases:
  - name: passes <&> "quoted"
    request: { path: "/items?q=a" }
    status: 200
  - name: fails
    request: { path: "/items?q=a" }
    status: 200
    response: { q: "<b>&amp;" }
"#,
    );
    let junit = d.join("junit.xml");
    let o = fanout_test(&d, &["--junit", &junit.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // Python's standard XML parser reads it; the counts and names are JUnit's
    let script = r#"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites", root.tag
suites = root.findall("testsuite")
cases = root.findall("testsuite/testcase")
fails = root.findall("testsuite/testcase/failure")
print(len(suites), root.get("tests"), root.get("failures"), len(cases), len(fails))
print(cases[0].get("name"))
print(fails[0].get("message"))
"#;
    let py = Command::new("python3")
        .args(["-c", script, &junit.display().to_string()])
        .output()
        .expect("python3 runs");
    let got = String::from_utf8_lossy(&py.stdout);
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(
        lines,
        ["1 2 1 2 1", "passes <&> \"quoted\"", "response differs:"],
        "{got}"
    );
}

#[test]
fn update_rewrites_the_wrong_answers_and_keeps_the_comments() {
    let cases = r#"# The suite's cases. A comment that must stay.
cases:
  - name: first   # a trailing comment
    request: { path: "/items?q=a" }
    status: 200
    # the answer below is wrong
    response:
      q: a
      n: 99
    backend_calls: { search: 1 }

  - name: second
    request: { path: "/items?q=zz" }
    status: 200
    response: { q: wrong }   # wrong too
    # a comment after the answer
"#;
    let d = suite(cases);
    let o = fanout_test(&d, &["--update"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the run that updates still fails: {}",
        text(&o)
    );
    assert!(
        text(&o).contains("updated 2 expected answer(s)"),
        "{}",
        text(&o)
    );
    let now = std::fs::read_to_string(d.join("cases.yaml")).unwrap();
    assert_eq!(
        now,
        r#"# The suite's cases. A comment that must stay.
cases:
  - name: first   # a trailing comment
    request: { path: "/items?q=a" }
    status: 200
    # the answer below is wrong
    response: { q: a, "n": 2, info: { size: L } }
    backend_calls: { search: 1 }

  - name: second
    request: { path: "/items?q=zz" }
    status: 200
    response: { q: zz, "n": 2, info: { size: L } }
    # a comment after the answer
"#
    );
    let o = fanout_test(&d, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn schema_cases_prints_the_cases_schema_matching_its_snapshot() {
    let o = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["schema", "--cases"])
        .output()
        .expect("fanout runs");
    assert!(o.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(printed, fanout::testing::schema());
    jsonschema::meta::validate(&printed).expect("a valid JSON Schema");
    let text = serde_json::to_string_pretty(&printed).unwrap() + "\n";
    fanout_testkit::check_snapshot(
        "docs/cases.schema.json",
        &text,
        "cargo test -p fanout --test gateway fanout_test::",
    );
    // every example's cases file is valid against it
    let v = jsonschema::validator_for(&printed).unwrap();
    for e in std::fs::read_dir(fanout_testkit::repo_root().join("examples")).unwrap() {
        let p = e.unwrap().path().join("cases.yaml");
        if p.exists() {
            let doc: serde_json::Value =
                serde_saphyr::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            assert!(v.is_valid(&doc), "{}", p.display());
        }
    }
}

/// A config with a branch of each kind: a `fail` guard, an `on_status` entry, a step with `when`
/// that is optional, a `for_each`, and a second route.
const BRANCHY: &str = r#"
listen: 127.0.0.1:0
backends:
  search: { url: "http://${SEARCH_ADDR}", timeout: 2s }
  details: { url: "http://${DETAILS_ADDR}", timeout: 2s }
routes:
  - path: /items
    deadline: 5s
    flow:
      guard:
        when: '$request.query.q == "bad"'
        fail: { status: 400, code: bad_q }
      found:
        http: { backend: search, path: '"/search"', query: { q: '$request.query.q' } }
        on_status:
          404: { status: 404, code: no_such_items }
      info:
        when: '$request.query.q != "skip"'
        optional: true
        default: null
        http: { backend: details, path: '"/details"' }
      sizes:
        for_each: '$request.query.n // "" | split(",") | map(select(. != ""))'
        value: '$item'
    respond:
      body: '{q: $found.q, n: $found.n, info: $info, sizes: $sizes}'
  - path: /other
    flow:
      one: { value: '1' }
    respond:
      body: '$one'
"#;

/// Where `needle` starts in `text` (1-based line and column), as the coverage lines print it.
fn line_col(text: &str, needle: &str) -> String {
    let (i, _) = text.match_indices(needle).next().expect("needle in text");
    let before = &text[..i];
    let line = before.matches('\n').count() + 1;
    let col = i - before.rfind('\n').map_or(0, |n| n + 1) + 1;
    format!("{line}:{col}")
}

#[test]
fn coverage_lists_the_branches_no_case_went_through() {
    let d = TempDir::new("ftest");
    d.write("fanout.yaml", BRANCHY);
    d.write("stubs.yaml", STUBS);
    d.write(
        "cases.yaml",
        r#"cases:
  - name: found
    request: { path: "/items?q=a&n=1,2" }
    status: 200
    response: { q: a, n: 2, info: { size: L }, sizes: ["1", "2"] }
"#,
    );
    let config = d.join("fanout.yaml").display().to_string();
    // without --coverage, nothing about it
    let o = fanout_test(&d, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("coverage:"), "{}", text(&o));

    let o = fanout_test(&d, &["--coverage"]);
    let out = text(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "coverage leaves the exit status: {out}"
    );
    // routes 2, steps 5 (ran), `when` 2×2, on_status 1, optional 1, for_each 2: 15
    assert!(
        out.contains("coverage: 8 of 15 branches exercised"),
        "{out}"
    );
    let at = |needle: &str| format!("{config}:{}", line_col(BRANCHY, needle));
    for line in [
        format!(
            "{}: route GET /items, step guard: `fail` never fired",
            at("'$request.query.q == \"bad\"'")
        ),
        format!(
            "{}: route GET /items, step found: `on_status` 404 never matched",
            at("404: {")
        ),
        format!(
            "{}: route GET /items, step info: `when` never false",
            at("'$request.query.q != \"skip\"'")
        ),
        format!(
            "{}: route GET /items, step info: optional: its `default` never used",
            at("info:\n")
        ),
        format!(
            "{}: route GET /items, step sizes: `for_each` never empty",
            at("'$request.query.n //")
        ),
        format!("{}: route GET /other: never run by a case", at("/other")),
    ] {
        assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    }
    // what the case did go through is not listed; nor are the branches of a route never run
    for gone in [
        "`fail` always fired",
        "`when` never true",
        "`for_each` never had an element",
        "step one",
    ] {
        assert!(!out.contains(gone), "{gone:?} listed in:\n{out}");
    }
    assert_eq!(out.matches("never").count(), 6, "{out}");
}

#[test]
fn coverage_lists_nothing_once_cases_go_through_every_branch() {
    let d = TempDir::new("ftest");
    d.write("fanout.yaml", BRANCHY);
    d.write("stubs.yaml", STUBS);
    d.write(
        "cases.yaml",
        r#"cases:
  - name: found
    request: { path: "/items?q=a&n=1,2" }
    status: 200
  - name: refused by the guard
    request: { path: "/items?q=bad" }
    status: 400
  - name: search finds nothing
    request: { path: "/items?q=x" }
    backends:
      search: { status: 404 }
    status: 404
    expect: ['.error.code == "no_such_items"']
  - name: details skipped
    request: { path: "/items?q=skip" }
    status: 200
    response_includes: { info: null, sizes: [] }
  - name: details failing, its default is used
    request: { path: "/items?q=y" }
    backends:
      details: { status: 500 }
    status: 200
    headers: { x-fanout-partial: info }
  - name: the other route
    request: { path: /other }
    status: 200
"#,
    );
    let json = d.join("coverage.json");
    let o = fanout_test(
        &d,
        &["--coverage", "--coverage-json", &json.display().to_string()],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("coverage: 15 of 15 branches exercised"),
        "{out}"
    );
    assert!(!out.contains("never"), "{out}");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("written")).expect("JSON");
    assert_eq!(
        written,
        serde_json::json!({"total": 15, "exercised": 15, "missing": []})
    );
}

/// `--update` finds each case's own `response:` through the YAML's positions, whatever the
/// style of the case: flow (`- {name: …, response: …}`, on one line or several), block, the key
/// first, a list at the key's indentation, comments around it; a passing case and a case
/// without `response:` are left as they are.
#[test]
fn update_writes_each_answer_into_its_own_case() {
    let cases = r#"cases:
  - name: a block case that passes
    request: { path: "/items?q=a" }
    status: 200
    response:
      q: a
      n: 2
      info: { size: L }
  - {name: a flow case, request: {path: "/items?q=b"}, status: 200, response: {total: 1}}
  - name: no response, a wrong status
    request: { path: "/items?q=c" }
    status: 201
  - response: { q: wrong }     # the key first
    name: response first
    request: { path: "/items?q=d" }
    status: 200
  - name: block with comments
    request: { path: "/items?q=e" }
    status: 200
    response:   # the old answer
      q: old
      # a comment inside
      n: 1
    # a comment after
  - {name: flow on two lines, request: {path: "/items?q=f"},
     status: 200, response: [1,
       2]}   # after
  - name: a list at the key's indentation
    request: { path: "/items?q=g" }
    status: 200
    response:
    - 1
    - 2
"#;
    let d = suite(cases);
    let o = fanout_test(&d, &["--update"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("updated 5 expected answer(s)"), "{out}");
    let now = std::fs::read_to_string(d.join("cases.yaml")).unwrap();
    assert_eq!(
        now,
        r#"cases:
  - name: a block case that passes
    request: { path: "/items?q=a" }
    status: 200
    response:
      q: a
      n: 2
      info: { size: L }
  - {name: a flow case, request: {path: "/items?q=b"}, status: 200, response: { q: b, "n": 2, info: { size: L } }}
  - name: no response, a wrong status
    request: { path: "/items?q=c" }
    status: 201
  - response: { q: d, "n": 2, info: { size: L } }
    name: response first
    request: { path: "/items?q=d" }
    status: 200
  - name: block with comments
    request: { path: "/items?q=e" }
    status: 200
    response: { q: e, "n": 2, info: { size: L } }
    # a comment after
  - {name: flow on two lines, request: {path: "/items?q=f"},
     status: 200, response: { q: f, "n": 2, info: { size: L } }}   # after
  - name: a list at the key's indentation
    request: { path: "/items?q=g" }
    status: 200
    response: { q: g, "n": 2, info: { size: L } }
"#,
        "{out}"
    );
    // the answers are now the right ones: only the case without `response:` still fails
    let o = fanout_test(&d, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("7 cases, 6 passed, 1 failed"), "{out}");
    assert!(out.contains("✗ no response, a wrong status"), "{out}");
}

/// The case of issue 69: a passing block case, then a failing flow case. The answer goes into
/// the flow case, and the block case above it is left as it is.
#[test]
fn update_of_a_flow_case_after_a_block_case_writes_into_the_flow_case() {
    let cases = r#"cases:
  - name: a
    request: { path: "/items?q=a" }
    status: 200
    response:
      q: a
      n: 2
      info: { size: L }
  - {name: b, request: {path: "/items?q=b"}, status: 200, response: {total: 1}}
"#;
    let d = suite(cases);
    let o = fanout_test(&d, &["--update"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("updated 1 expected answer(s)"), "{out}");
    let now = std::fs::read_to_string(d.join("cases.yaml")).unwrap();
    assert_eq!(
        now,
        cases.replace(
            "response: {total: 1}}",
            "response: { q: b, \"n\": 2, info: { size: L } }}"
        ),
        "{out}"
    );
    let o = fanout_test(&d, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// What `--update` cannot place it refuses, naming the case and why, and leaves as it is: a
/// `response:` that is an alias, one with an anchor (other places may use it), one that comes
/// through a merge key. The other cases are still updated.
#[test]
fn update_refuses_an_answer_it_cannot_place_and_says_why() {
    let cases = r#"cases:
  - name: anchored
    request: { path: "/items?q=a" }
    status: 200
    response: &answer { q: wrong }
  - name: an alias
    request: { path: "/items?q=b" }
    status: 200
    response: *answer
  - &base
    name: base
    request: { path: "/items?q=c" }
    status: 200
    response: { q: c, n: 2, info: { size: L } }
  - <<: *base
    name: merged
    request: { path: "/items?q=d" }
  - name: fine
    request: { path: "/items?q=e" }
    status: 200
    response: { q: wrong }
"#;
    let d = suite(cases);
    let o = fanout_test(&d, &["--update"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let file = d.join("cases.yaml").display().to_string();
    assert!(out.contains("updated 1 expected answer(s)"), "{out}");
    for (name, line, why) in [
        ("anchored", 2, "has an anchor (&answer)"),
        ("an alias", 6, "is an alias (*answer)"),
        ("merged", 15, "comes from a merge key or an alias"),
    ] {
        let said = format!("not updated: case \"{name}\" ({file}:{line}): its `response:` {why}");
        assert!(out.contains(&said), "missing {said:?} in:\n{out}");
    }
    let now = std::fs::read_to_string(d.join("cases.yaml")).unwrap();
    assert_eq!(
        now,
        cases.replace(
            "status: 200\n    response: { q: wrong }\n",
            "status: 200\n    response: { q: e, \"n\": 2, info: { size: L } }\n"
        ),
        "{out}"
    );
}

/// Characters YAML cannot hold raw (outside its printable set: U+007F, U+0080…U+009F but U+0085,
/// U+FFFE) and those that some readers take for line breaks (U+0085, U+2028) are written as
/// escapes in a double-quoted string, and the file reads back as exactly the answer.
#[test]
fn update_escapes_what_yaml_cannot_hold_raw() {
    let d = suite(
        r#"cases:
  - name: odd characters
    request: { path: "/items?q=%7F%C2%80%C2%85%C2%9F%EF%BF%BE%E2%80%A8%01%09x%22%5C" }
    status: 200
    response: { q: old }
"#,
    );
    let o = fanout_test(&d, &["--update"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("updated 1 expected answer(s)"), "{out}");
    let now = std::fs::read_to_string(d.join("cases.yaml")).unwrap();
    assert!(
        now.contains(
            r#"    response: { q: "\u007f\u0080\u0085\u009f\ufffe\u2028\u0001\tx\"\\", "n": 2, info: { size: L } }"#
        ),
        "{now}"
    );
    let o = fanout_test(&d, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A typo inside `backend_calls` (its detailed form, a `calls` entry) is the unknown field with
/// its line, column and the nearest known name, like any other.
#[test]
fn a_typo_inside_backend_calls_is_reported_at_its_place_with_the_nearest_name() {
    let cases = r#"cases:
  - name: count misspelt
    request: { path: /items }
    status: 200
    backend_calls: {search: {cuont: 1}}
  - name: query misspelt
    request: { path: /items }
    status: 200
    backend_calls:
      search:
        calls:
          - path: /search
            qurey: { q: a }
"#;
    let d = suite(cases);
    let o = fanout_test(&d, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    let file = d.join("cases.yaml").display().to_string();
    for (field, near) in [("cuont", "count"), ("qurey", "query")] {
        let at = format!("{file}:{}: unknown field `{field}`", line_col(cases, field));
        assert!(out.contains(&at), "missing {at:?} in:\n{out}");
        let hint = format!("did you mean `{near}`?");
        assert!(out.contains(&hint), "missing {hint:?} in:\n{out}");
    }
    assert!(!out.contains("untagged"), "{out}");
}

/// An `expect` that is not jq and a `backends:` status that is no status are mistakes in the
/// file, not failing cases: exit 2 with FILE:LINE:COL, before anything runs.
#[test]
fn an_invalid_expect_or_override_status_is_bad_input_with_its_position() {
    let cases = r#"cases:
  - name: bad jq
    request: { path: "/items?q=a" }
    status: 200
    expect: ['.n == 2', '.n ==']
  - name: bad status
    request: { path: "/items?q=a" }
    backends:
      details: { status: 0 }
    status: 200
"#;
    let d = suite(cases);
    let o = fanout_test(&d, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    let file = d.join("cases.yaml").display().to_string();
    // the line of the expression, a column inside it
    let (line, col) = line_col(cases, "'.n =='")
        .split_once(':')
        .map(|(l, c)| (l.to_string(), c.parse::<usize>().unwrap()))
        .unwrap();
    let jq = out
        .lines()
        .find(|l| l.contains("expect `.n ==`: "))
        .unwrap_or_else(|| panic!("no error for the expression in:\n{out}"));
    let at = jq
        .strip_prefix(&format!("{file}:{line}:"))
        .and_then(|rest| rest.split_once(':'))
        .and_then(|(c, _)| c.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("not at {file}:{line}:COL: {jq}"));
    assert!((col..col + 7).contains(&at), "{jq}");
    let status = format!("{file}:{}: invalid status 0", line_col(cases, "0 }"));
    assert!(out.contains(&status), "missing {status:?} in:\n{out}");
    assert!(
        out.contains("a status is a number from 100 to 999"),
        "{out}"
    );
    assert!(!out.contains("✗"), "no case ran: {out}");
}

/// Tab, newline and carriage return in a JUnit attribute are written as character references:
/// raw, an XML reader turns them into spaces.
#[test]
fn junit_attributes_keep_tabs_and_line_breaks() {
    let d = suite(
        r#"cases:
  - name: "tab\there, new\nline, cr\rend"
    request: { path: "/items?q=a" }
    status: 201
"#,
    );
    let junit = d.join("junit.xml");
    let o = fanout_test(&d, &["--junit", &junit.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert!(
        xml.contains("<testcase name=\"tab&#9;here, new&#10;line, cr&#13;end\""),
        "{xml}"
    );
    let script = r#"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
print(repr(root.find("testsuite/testcase").get("name")))
"#;
    let py = Command::new("python3")
        .args(["-c", script, &junit.display().to_string()])
        .output()
        .expect("python3 runs");
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&py.stdout).trim(),
        r"'tab\there, new\nline, cr\rend'"
    );
}

/// `fanout test DIR`, DIR holding no `fanout.yaml` but directories that do (`examples/`): each
/// of them runs, with its own summary, then a total; the exit status is the worst of them; JUnit
/// gets one `testsuite` each.
#[test]
fn a_directory_of_suites_runs_each_of_them() {
    let d = TempDir::new("ftest-dirs");
    let passing = "cases:\n  - name: ok\n    request: { path: \"/items?q=a\" }\n    status: 200\n";
    let failing =
        "cases:\n  - name: wrong\n    request: { path: \"/items?q=a\" }\n    status: 201\n";
    for (sub, cases) in [("one", passing), ("two", failing)] {
        d.write(format!("{sub}/fanout.yaml"), CONFIG);
        d.write(format!("{sub}/stubs.yaml"), STUBS);
        d.write(format!("{sub}/cases.yaml"), cases);
    }
    d.write("notes/README.md", "not a suite\n");
    let junit = d.join("junit.xml");
    let o = fanout_test(&d, &["--junit", &junit.display().to_string()]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let one = d.join("one/cases.yaml").display().to_string();
    let two = d.join("two/cases.yaml").display().to_string();
    assert!(
        out.contains(&format!("{one}: 1 cases, 1 passed, 0 failed")),
        "{out}"
    );
    assert!(
        out.contains(&format!("{two}: 1 cases, 0 passed, 1 failed")),
        "{out}"
    );
    assert!(
        out.contains("2 suites: 2 cases, 1 passed, 1 failed"),
        "{out}"
    );
    assert!(!out.contains("notes"), "{out}");
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert_eq!(xml.matches("<testsuite ").count(), 2, "{xml}");
    assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");

    // a suite that cannot run: the others still run, and the exit status is 2
    d.write("three/fanout.yaml", CONFIG);
    d.write("three/stubs.yaml", STUBS);
    d.write(
        "three/cases.yaml",
        "cases:\n  - name: typo\n    respnse: {}\n",
    );
    let o = fanout_test(&d, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    let three = d.join("three/cases.yaml").display().to_string();
    assert!(
        out.contains(&format!("{three}:3:5: unknown field `respnse`")),
        "{out}"
    );
    assert!(
        out.contains(&format!("{one}: 1 cases, 1 passed, 0 failed")),
        "{out}"
    );
    assert!(
        out.contains(&format!("{two}: 1 cases, 0 passed, 1 failed")),
        "{out}"
    );
    assert!(
        out.contains("3 suites: 2 cases, 1 passed, 1 failed; 1 suite could not run"),
        "{out}"
    );

    // a directory with no suite anywhere says so
    let empty = TempDir::new("ftest-none");
    empty.write("notes/README.md", "nothing\n");
    let o = fanout_test(&empty, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("no fanout.yaml in"), "{out}");
    assert!(!out.contains("cannot read"), "{out}");
}
