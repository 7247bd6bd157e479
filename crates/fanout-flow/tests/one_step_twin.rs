//! Differential test of the one-step executor (issue 47 §4): a flow of one step runs through
//! `RoutePlan::run_one`, a flow of more through the scheduler (`run_flow`). Every one-step flow
//! of a table — step shapes (`value`, `http`, `when`, `for_each`, `optional`/`default`,
//! `result`, `fail`, `on_status`, step timeout) × backend answers (statuses, bad JSON, transport
//! failures, past the step timeout or the route deadline) × requests × `respond` forms × a
//! deadline already passed or not — runs as is and again with a second, independent `value`
//! step the answer does not read, which makes the route's plan two steps long and so takes the
//! scheduler (checked: the plan has two steps and the observer saw both start). Both must give
//! the same answer (status, headers, body, `_partial`) or the same error (kind, status, code,
//! step, backend, message, detail), the same backend calls (paths, timeouts, how and when they
//! ended), the same observed end of the step, at the same virtual instant.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
mod support;

use fanout_flow::observe::{Observer, StepEnd};
use fanout_flow::plan::StepPlan;
use fanout_flow::{CallErrorKind, FlowError, Outcome};
use std::sync::Mutex;
use std::time::Duration;
use support::*;
use tokio::time::Instant;

/// The shapes of the step `s` (YAML flow mappings).
const STEPS: &[&str] = &[
    r#"{ value: '{go: $request.query.go}' }"#,
    r#"{ value: 'error("boom")' }"#,
    r#"{ when: '$request.query.go == "yes"', value: '{go: 1}' }"#,
    r#"{ http: { backend: a, path: '"/f"' } }"#,
    r#"{ http: { backend: a, path: '"/f"' }, result: '{v: .n, twice: (.n * 2)}' }"#,
    r#"{ http: { backend: a, path: '"/f"' }, result: '.n | error("bad \(.)")' }"#,
    r#"{ optional: true, default: {d: 1}, http: { backend: a, path: '"/f"' } }"#,
    r#"{ optional: true, http: { backend: a, path: '"/f"' }, result: '.n' }"#,
    r#"{ when: '$request.query.go == "yes"', default: skipped, http: { backend: a, path: '"/f"' } }"#,
    r#"{ http: { backend: a, path: '"/f"' }, default: {nf: true}, on_status: { 409: 409, 410: { status: 404, code: gone_here, message: "it went" }, 5xx: 503, 404: default } }"#,
    r#"{ optional: true, default: none, http: { backend: a, path: '"/f"' }, on_status: { 409: 409 } }"#,
    r#"{ timeout: 50ms, http: { backend: a, path: '"/f"' } }"#,
    r#"{ optional: true, timeout: 50ms, default: [], http: { backend: a, path: '"/f"' } }"#,
    r#"{ for_each: '[1, 2, 3]', concurrency: 2, http: { backend: a, path: '"/f?i=\($item)"' }, result: '{n: .n, i: $index}' }"#,
    r#"{ for_each: '$request.query.go | split("")', optional: true, default: [], http: { backend: a, path: '"/f?c=\($item)"' } }"#,
    r#"{ for_each: '[1, 2]', missing: skip, http: { backend: a, path: '"/f?i=\($item)"' } }"#,
    r#"{ for_each: '[1, 2]', missing: { value: '{gone: $item}' }, http: { backend: a, path: '"/f?i=\($item)"' } }"#,
    // Keyed lookups through `b`'s batch form (the answer is the object of keys): found, missing.
    r#"{ http: { backend: b, key: '"n"' } }"#,
    r#"{ http: { backend: b, key: '"zz"' } }"#,
    r#"{ for_each: '["n", "zz", "n"]', missing: null, http: { backend: b, key: '$item' }, result: '[.]' }"#,
    r#"{ optional: true, default: 0, http: { backend: b, key: '"zz"' } }"#,
    r#"{ when: '$request.query.go == "yes"', fail: { status: 400, code: refused, message: '"no \($request.query.go)"', details: '{field: "go"}' } }"#,
    r#"{ fail: { status: 410, code: always } }"#,
];

/// What `/f` answers.
fn replies() -> Vec<(&'static str, Reply)> {
    vec![
        ("ok", ok(r#"{"n": 2}"#)),
        ("ok later", ok(r#"{"n": 3}"#).after(ms(30))),
        ("empty 204", status(204, "")),
        ("500", status(500, r#"{"oops": 1}"#).after(ms(5))),
        ("502", status(502, "{}")),
        ("404", status(404, "{}")),
        ("409", status(409, "{}")),
        ("410", status(410, "{}")),
        ("bad json", ok(r#"{"n": "#)),
        ("connect", transport(CallErrorKind::Connect)),
        ("reset", transport(CallErrorKind::Reset).after(ms(7))),
        ("timeout", transport(CallErrorKind::Timeout)),
        ("past the step timeout", ok(r#"{"n": 4}"#).after(ms(60))),
        ("past the deadline", ok(r#"{"n": 5}"#).after(ms(5000))),
    ]
}

/// How the route answers.
const RESPONDS: &[&str] = &[
    r#"{ body: '$s' }"#,
    r#"{ status: 'if $s == null then 204 else 201 end', headers: { x-s: '$s | tojson' }, body: '{s: $s}' }"#,
];

/// A config of the two routes: `/one` (the step alone), `/two` (with `zz_pad` beside it).
fn config(step: &str, respond: &str) -> String {
    format!(
        r#"
backends:
  a: {{ url: "http://127.0.0.1:1" }}
  b:
    url: "http://127.0.0.1:1"
    batch: {{ path: '"/f"', query: {{ ids: '$keys | join(",")' }}, split: '.' }}
routes:
  - path: /one
    deadline: 200ms
    flow:
      s: {step}
    respond: {respond}
  - path: /two
    deadline: 200ms
    flow:
      s: {step}
      zz_pad: {{ value: '0' }}
    respond: {respond}
"#
    )
}

/// What the observer saw: steps started, and per step how it ended and its calls' results.
#[derive(Default)]
struct Seen {
    started: Mutex<Vec<String>>,
    events: Mutex<Vec<String>>,
}

fn error_text(e: &FlowError) -> String {
    format!(
        "{:?} {} {} {e} answer={:?}",
        e.kind,
        e.status(),
        e.code(),
        e.answer
    )
}

impl Observer for Seen {
    fn step_started(&self, step: &StepPlan) {
        self.started.lock().unwrap().push(step.name.to_string());
    }
    fn call_finished(&self, step: &StepPlan, elapsed: Duration, result: Result<(), &FlowError>) {
        if &*step.name == "s" {
            let r = result.map_err(error_text);
            self.events
                .lock()
                .unwrap()
                .push(format!("call {elapsed:?} {r:?}"));
        }
    }
    fn step_finished(&self, step: &StepPlan, started: Instant, end: StepEnd<'_>) {
        if &*step.name == "s" {
            let end = match end {
                StepEnd::Ok => "ok".to_string(),
                StepEnd::Defaulted(e) => format!("defaulted {}", error_text(e)),
                StepEnd::Failed(e) => format!("failed {}", error_text(e)),
            };
            let took = Instant::now() - started;
            self.events
                .lock()
                .unwrap()
                .push(format!("end after {took:?}: {end}"));
        }
    }
}

/// Everything a run is compared by.
#[derive(Debug, PartialEq)]
struct Run {
    answer: Result<String, String>,
    calls: Vec<String>,
    events: Vec<String>,
    took: Duration,
}

fn answer_text(o: &Outcome) -> String {
    format!(
        "{} {:?} {} partial={:?} value={:?}",
        o.status,
        o.headers,
        String::from_utf8_lossy(&o.body),
        o.partial,
        o.value.as_ref().map(fanout_expr::json::to_string)
    )
}

/// Run `req` on `path` of `f` (deadline: the route's, or already passed), with the reply.
async fn run(f: &Flow, path: &str, req: &Req, reply: &Reply, passed: bool) -> (Run, Vec<String>) {
    f.script("a", "/f", reply.clone());
    f.script("b", "/f", reply.clone());
    let route = f.route("GET", path);
    let seen = Seen::default();
    let before = f.world.calls().len();
    let t0 = f.world.now();
    let deadline = if passed {
        Instant::now()
    } else {
        Instant::now() + route.deadline
    };
    let out = route.run_observed(req.val(), deadline, &seen).await;
    let took = f.world.now() - t0;
    let calls = f.world.calls()[before..]
        .iter()
        .map(|c| {
            format!(
                "{} {} timeout={:?} +{:?} {:?} at {:?}",
                c.backend,
                c.path,
                c.timeout,
                c.started - t0,
                c.end,
                c.ended.map(|e| e - t0)
            )
        })
        .collect();
    let run = Run {
        answer: out.as_ref().map(answer_text).map_err(error_text),
        calls,
        events: seen.events.into_inner().unwrap(),
        took,
    };
    (run, seen.started.into_inner().unwrap())
}

#[tokio::test(start_paused = true)]
async fn one_step_flows_answer_as_the_scheduler_answers_them() {
    let reqs = [
        ("go=yes", Req::get("/x").query("go=yes")),
        ("go=no", Req::get("/x").query("go=no")),
    ];
    let replies = replies();
    let (mut cases, mut with_pad) = (0, 0);
    for step in STEPS {
        for respond in RESPONDS {
            let f = Flow::new(&config(step, respond));
            // `/one` takes `run_one`, `/two` the scheduler: the plans say so…
            assert_eq!(f.route("GET", "/one").steps.len(), 1);
            assert_eq!(f.route("GET", "/two").steps.len(), 2);
            for (what, reply) in &replies {
                for (query, req) in &reqs {
                    for passed in [false, true] {
                        let case =
                            format!("{step} | {respond} | {what} | {query} | passed={passed}");
                        let (one, started_one) = run(&f, "/one", req, reply, passed).await;
                        let (two, started_two) = run(&f, "/two", req, reply, passed).await;
                        // …and the observer: the pad step ran only in `/two` (every step of a
                        // flow answered has run; a failure may end the request before its turn).
                        assert!(!started_one.iter().any(|s| s == "zz_pad"), "{case}");
                        if two.answer.is_ok() {
                            assert!(started_two.iter().any(|s| s == "zz_pad"), "{case}");
                            with_pad += 1;
                        }
                        assert_eq!(one, two, "{case}");
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(
        cases,
        STEPS.len() * RESPONDS.len() * replies.len() * reqs.len() * 2
    );
    assert!(with_pad > cases / 4, "{with_pad} of {cases} answered");
}
