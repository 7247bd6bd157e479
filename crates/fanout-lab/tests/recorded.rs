//! The lab's reports rendered from recorded runs (`tests/data/<scenario>/report.json`, each
//! recorded from a real `fanout lab <scenario> --quick`; tests/data/README.md says how to record
//! them again): the text summary the lab prints, `report.json`'s fields and `report.html` — its
//! sections, tables and charts, rendered in headless Chromium. These checks are about the shape
//! of the report, not about behaviour under load: the live runs in
//! `crates/fanout-cli/tests/lab.rs` check that the targets ran, did equal work and that the
//! counts agree. Counts and shapes only, never the figures.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use fanout_lab::recorded::Recorded;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every recorded run in `tests/data`.
const FIXTURES: [&str; 12] = [
    "antispam-models",
    "hedging",
    "hh-pools",
    "hop",
    "n-plus-one",
    "overload",
    "parallel-calls",
    "pool-overload",
    "product-page",
    "seeds",
    "slow-backend",
    "threads",
];

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The recorded run `name`: the report and its `report.json` as the lab writes it now.
fn recorded(name: &str) -> (Recorded, serde_json::Value) {
    let rec = Recorded::load(&data(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let json = serde_json::from_str(&rec.json()).expect("report.json is JSON");
    (rec, json)
}

/// The report `name` written again into a directory of its own: (directory, report.html).
fn written(name: &str, rec: &Recorded) -> (PathBuf, String) {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!(
        "fanout-lab-recorded-{name}-{}-{seq}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    rec.write(&out).expect("write the report");
    let html = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    (out, html)
}

/// The summary prints one PASS/FAIL line per acceptance line.
fn assert_printed_acceptance(rep: &serde_json::Value, text: &str) {
    let lines = rep["acceptance"].as_array().map(Vec::len).unwrap_or(0);
    assert!(lines > 0, "the recorded run has acceptance lines");
    let printed = text
        .lines()
        .filter(|l| l.starts_with("PASS  ") || l.starts_with("FAIL  "))
        .count();
    assert_eq!(printed, lines, "one PASS/FAIL line each:\n{text}");
}

// ---- tier 1: the text and report.json of every recorded run ------------------------------------

/// Every recorded report reads back into the lab's types and is written out again field for field
/// (nothing the renderers could read is dropped), with a non-empty text and page.
#[test]
fn every_recorded_report_reads_back_to_the_same_json() {
    for name in FIXTURES {
        let path = data(name).join("report.json");
        let original: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
        let (rec, again) = recorded(name);
        same(name, &again, &original);
        assert!(!rec.text().is_empty(), "{name}: text");
        assert!(rec.html().starts_with("<!DOCTYPE html>"), "{name}: html");
    }
}

/// `a` is `b`, numbers within a few units in the last place (serde_json's float parsing may be off
/// by one: a number read back and written again need not be the same text).
fn same(at: &str, a: &serde_json::Value, b: &serde_json::Value) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let (kx, ky): (Vec<&String>, Vec<&String>) = (x.keys().collect(), y.keys().collect());
            assert_eq!(kx, ky, "{at}: fields");
            for (k, v) in x {
                same(&format!("{at}.{k}"), v, &y[k]);
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: length");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                same(&format!("{at}[{i}]"), v, w);
            }
        }
        (Value::Number(x), Value::Number(y)) if x != y => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            assert!(
                (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
                "{at}: {x} ≠ {y}"
            );
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

#[test]
fn a_file_that_is_no_report_is_refused_with_its_name() {
    let err =
        Recorded::parse("x/report.json", r#"{"scenario": "product-page"}"#).expect_err("no report");
    assert!(err.to_string().contains("x/report.json"), "{err}");
    let out = std::env::temp_dir().join(format!("fanout-lab-recorded-none-{}", std::process::id()));
    let err = Recorded::load(&out).expect_err("no file");
    assert!(err.to_string().contains("report.json"), "{err}");
}

#[test]
fn n_plus_one_prints_calls_per_request() {
    let (rec, _) = recorded("n-plus-one");
    assert!(rec.text().contains("calls/req"), "{}", rec.text());
}

#[test]
fn overload_prints_an_acceptance_line_each_and_the_phase_fields() {
    let (rec, rep) = recorded("overload");
    for target in ["fanout", "java-threads"] {
        let phases = rep["targets"][target]["phases"].as_array().expect("phases");
        assert_eq!(phases.len(), 4, "{target}");
        for p in phases {
            for field in [
                "ok_rate",
                "accepted_p50_ms",
                "accepted_p99_ms",
                "rejected_rate",
                "rejected_p99_ms",
                "rss_max_mb",
            ] {
                assert!(
                    p[field].as_f64().is_some(),
                    "{target} {}: {field}",
                    p["name"]
                );
            }
            for field in ["rejected", "timeouts", "errors", "threads_max"] {
                assert!(
                    p[field].as_u64().is_some(),
                    "{target} {}: {field}",
                    p["name"]
                );
            }
        }
        let r = &rep["targets"][target]["recovery"];
        assert!(r["recovered"].is_boolean(), "{target}: recovery {r}");
        assert!(r["time_to_recover_s"].is_number() || r["time_to_recover_s"].is_null());
        let checks = rec.acceptance(target);
        for want in [
            "goodput at 3×",
            "accepted p99 at 3×",
            "rejection p99 at 3×",
            "recovery",
        ] {
            assert!(
                checks.iter().any(|(c, _)| c.contains(want)),
                "{target}: acceptance line `{want}` in {checks:?}"
            );
        }
    }
    assert_printed_acceptance(&rep, &rec.text());
    let (out, html) = written("overload", &rec);
    for section in [
        "Acceptance",
        "Overload phases",
        "Rejections and failures per second",
    ] {
        assert!(html.contains(section), "report.html has `{section}`");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn pool_overload_prints_an_acceptance_line_each() {
    let (rec, rep) = recorded("pool-overload");
    for target in ["fanout", "java-threads"] {
        let checks = rec.acceptance(target);
        for want in ["goodput at 3×", "rejection p99 at 3×", "recovery"] {
            assert!(
                checks.iter().any(|(c, _)| c.contains(want)),
                "{target}: acceptance line `{want}` in {checks:?}"
            );
        }
    }
    assert_printed_acceptance(&rep, &rec.text());
}

#[test]
fn slow_backend_prints_its_routes_and_acceptance_lines() {
    let (rec, rep) = recorded("slow-backend");
    for r in rep["targets"]["fanout"]["routes"]
        .as_array()
        .expect("routes")
    {
        for p in r["phases"].as_array().expect("phases") {
            for field in [
                "offered_rate",
                "p50_ms",
                "p99_ms",
                "max_ms",
                "success_pct",
                "default_share",
            ] {
                assert!(
                    p[field].as_f64().is_some(),
                    "{} {}: {field}",
                    r["route"],
                    p["name"]
                );
            }
            assert!(p["within_deadline"].is_boolean());
        }
    }
    let checks = rec.acceptance("fanout");
    for want in ["route A", "route B"] {
        assert!(checks.iter().any(|(c, _)| c.contains(want)), "{checks:?}");
    }
    assert_printed_acceptance(&rep, &rec.text());
    let (out, html) = written("slow-backend", &rec);
    assert!(html.contains("Routes per phase"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn hedging_prints_the_p99_cut_for_the_hedged_target_only() {
    let (rec, rep) = recorded("hedging");
    let checks = rec.acceptance("hedge");
    assert!(
        checks.iter().any(|(c, _)| c.contains("p99 cut")),
        "{checks:?}"
    );
    assert!(rec.acceptance("no-hedge").is_empty());
    assert_printed_acceptance(&rep, &rec.text());
    let (out, html) = written("hedging", &rec);
    assert!(html.contains("Hedging (all trials merged)"));
    let _ = std::fs::remove_dir_all(&out);
}

/// `parallel-calls`: the floor, one line per target and cell, the article's rows; the page's
/// closed-loop chart and the article's table.
#[test]
fn parallel_calls_prints_the_floor_a_line_per_cell_and_the_article() {
    let (rec, rep) = recorded("parallel-calls");
    let text = rec.text();
    assert!(
        text.contains("floor (the lab calling items /item/0 itself)"),
        "{text}"
    );
    let targets: Vec<&String> = rep["targets"]
        .as_object()
        .expect("targets")
        .keys()
        .collect();
    assert!(
        targets.len() >= 2,
        "the recorded run has a Java target: {targets:?}"
    );
    for t in &targets {
        let lines = text
            .lines()
            .filter(|l| l.starts_with(&format!("{t} ")))
            .count();
        assert_eq!(lines, 4, "{t}:\n{text}");
    }
    assert!(text.contains("article, 2 cores"), "{text}");
    let (out, html) = written("parallel-calls", &rec);
    assert!(html.contains("Closed loop: ms per operation"));
    assert!(html.contains("article: 2 cores / 6 JMH threads"));
    let _ = std::fs::remove_dir_all(&out);
}

/// `threads`: a header and one line per pool size of either table (13: the quick sizes are among
/// the article's), both columns filled on the quick sizes; the page's side-by-side section.
#[test]
fn threads_prints_both_tables_side_by_side() {
    let (rec, rep) = recorded("threads");
    let sizes = rep["rows"].as_array().expect("rows").len();
    assert_eq!(sizes, 5, "the quick pool sizes");
    let text = rec.text();
    let table: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.split('|')
                .next()
                .is_some_and(|t| t.trim().parse::<u64>().is_ok())
        })
        .collect();
    assert_eq!(table.len(), 13, "{text}");
    let both = table.iter().filter(|l| !l.contains('—')).count();
    assert_eq!(both, sizes, "{text}");
    assert!(
        text.contains("article ms") && text.contains("here ms"),
        "{text}"
    );
    let (out, html) = written("threads", &rec);
    assert!(html.contains("This machine beside the article"));
    let _ = std::fs::remove_dir_all(&out);
}

/// `hh-pools`: one printed line per target and phase; the page's table has a header and a row
/// each, eight of them Java pools.
#[test]
fn hh_pools_prints_and_tables_a_row_per_target_and_phase() {
    let (rec, rep) = recorded("hh-pools");
    let targets = rep["pools"]["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["phase"] == "healthy")
        .count();
    assert_eq!(targets, 5, "fanout and 4 Java pools");
    let text = rec.text();
    for phase in ["healthy", "slow"] {
        let lines = text
            .lines()
            .filter(|l| l.starts_with(&format!("{phase} ")))
            .count();
        assert_eq!(lines, targets, "{phase}:\n{text}");
    }
    assert!(text.contains("goodput/s"), "{text}");
    let (out, html) = written("hh-pools", &rec);
    let table = html
        .split("Pools: fanout and the Java thread-per-request baseline")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the pools table");
    assert_eq!(table.matches("<tr>").count(), 11, "a header and 10 rows");
    assert_eq!(table.matches("<td>java-threads-").count(), 8, "Java rows");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn hop_prints_the_added_latency() {
    let (rec, rep) = recorded("hop");
    assert_eq!(rep["acceptance"].as_array().map(Vec::len), Some(2));
    assert!(rec.text().contains("added by the hop"), "{}", rec.text());
    let (out, _) = written("hop", &rec);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn antispam_models_prints_the_swaps_and_the_failures_line() {
    let (rec, rep) = recorded("antispam-models");
    let checks = rec.acceptance("fanout");
    assert!(
        checks
            .iter()
            .any(|(c, _)| c == "failed requests during swaps"),
        "{checks:?}"
    );
    assert_printed_acceptance(&rep, &rec.text());
    assert!(
        rec.text().contains("models: spam_swap swapped every 3 s"),
        "{}",
        rec.text()
    );
}

/// `seeds`: a section per article with the article's figures as data, a printed line per
/// scenario (ran, or not run and why), HeadHunter's table (13 pool sizes) and the Kotlin JMH
/// table (6 rows × 4 cells) as data, and a page with a section per article and a block per run.
#[test]
fn seeds_has_a_section_per_article_and_a_line_per_scenario() {
    let (rec, rep) = recorded("seeds");
    let text = rec.text();
    assert_eq!(rep["scenario"], "seeds");
    let articles = rep["articles"].as_array().expect("articles");
    let ids: Vec<&str> = articles.iter().filter_map(|a| a["id"].as_str()).collect();
    assert_eq!(
        ids,
        ["000+001", "002", "003", "004"],
        "a section per article"
    );
    let mut seen = vec![];
    for a in articles {
        assert!(
            a["article"].as_array().is_some_and(|f| !f.is_empty()),
            "the article's figures: {a}"
        );
        for r in a["runs"].as_array().expect("runs") {
            let name = r["scenario"].as_str().expect("scenario");
            seen.push(name);
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("a line for {name}:\n{text}"));
            if r["ran"] == true {
                assert!(r["not_run"].is_null(), "{r}");
                assert!(r["ours"].as_array().is_some_and(|f| !f.is_empty()), "{r}");
                assert!(line.contains("ran in"), "{line}");
            } else {
                assert!(r["not_run"].as_str().is_some_and(|w| !w.is_empty()), "{r}");
                assert!(line.contains("not run: "), "{line}");
            }
        }
    }
    assert_eq!(
        seen,
        [
            "threads",
            "parallel-calls",
            "product-page-merging",
            "antispam-models"
        ],
        "every scenario of the recorded run (`--scenarios`), in order"
    );
    let runs = seen.len();
    let pools = articles[0]["article"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["label"]
                .as_str()
                .is_some_and(|l| l.starts_with("pool of "))
        })
        .count();
    assert_eq!(pools, 13);
    let jmh = articles[1]["article"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["value"]
                .as_str()
                .is_some_and(|v| v.ends_with("ms per operation"))
        })
        .count();
    assert_eq!(jmh, 24);
    let (out, html) = written("seeds", &rec);
    assert_eq!(
        html.matches("class=\"article\"").count(),
        4,
        "a section per article"
    );
    assert_eq!(
        html.matches("class=\"run\"").count(),
        runs,
        "a block per scenario"
    );
    let _ = std::fs::remove_dir_all(&out);
}

// ---- tier 2: the pages rendered in headless Chromium ------------------------------------------

fn chromium() -> &'static str {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    let Some(chrome) = found else {
        panic!(
            "headless Chromium is needed to check the report: `apt-get install chromium` (./scripts/test installs it)"
        );
    };
    chrome
}

/// Render the page headless; return (DOM after load, stderr). Writes a screenshot to `shot`.
fn render(html: &Path, shot: &Path) -> (String, String) {
    let chrome = chromium();
    let profile = html.with_file_name("chromium-profile");
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
    ];
    let url = format!("file://{}", html.display());
    // One browser start for both: headless Chromium writes the screenshot and prints the DOM
    // after load in the same run.
    let dom = Command::new(chrome)
        .args(common)
        .arg(format!("--user-data-dir={}", profile.display()))
        .args([
            "--window-size=1200,2400",
            &format!("--screenshot={}", shot.display()),
            "--dump-dom",
            &url,
        ])
        .output()
        .expect("chromium runs");
    assert!(dom.status.success() || shot.exists(), "screenshot failed");
    (
        String::from_utf8_lossy(&dom.stdout).into_owned(),
        String::from_utf8_lossy(&dom.stderr).into_owned(),
    )
}

/// Render the recorded run `name`'s page headless: at least `min_charts` charts with data, no
/// browser errors. Returns the DOM after load.
fn assert_renders(name: &str, min_charts: usize) -> String {
    let (rec, _) = recorded(name);
    let (out, _) = written(name, &rec);
    let (dom, stderr) = render(&out.join("report.html"), &out.join("report.png"));
    let figures = dom.matches("class=\"chart\"").count();
    assert!(
        figures >= min_charts,
        "{name}: expected ≥ {min_charts} charts, found {figures}"
    );
    assert!(dom.matches("<svg").count() >= min_charts, "{name}");
    for bad in ["Uncaught", "SyntaxError", "Failed to load resource"] {
        assert!(
            !stderr.contains(bad),
            "{name}: browser reported `{bad}`:\n{stderr}"
        );
    }
    assert!(
        out.join("report.png")
            .metadata()
            .is_ok_and(|m| m.len() > 10_000),
        "{name}: screenshot rendered"
    );
    let _ = std::fs::remove_dir_all(&out);
    dom
}

#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn product_page_renders_its_charts_with_data_lines() {
    let dom = assert_renders("product-page", 6);
    assert!(
        dom.matches("class=\"series\"").count() >= 6,
        "charts have data lines"
    );
}

#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn overload_renders_its_phases_and_per_second_charts() {
    let dom = assert_renders("overload", 8);
    for section in [
        "Acceptance",
        "Overload phases",
        "Rejections and failures per second",
    ] {
        assert!(dom.contains(section), "report.html has `{section}`");
    }
}

#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn slow_backend_renders_routes_per_phase() {
    let dom = assert_renders("slow-backend", 6);
    assert!(dom.contains("Routes per phase"));
}

#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn hedging_renders_the_merged_latency() {
    let dom = assert_renders("hedging", 6);
    assert!(dom.contains("Hedging (all trials merged)"));
}

#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn parallel_calls_renders_the_closed_loop_and_the_article() {
    let dom = assert_renders("parallel-calls", 4);
    assert!(dom.contains("Closed loop: ms per operation"));
    assert!(dom.contains("article: 2 cores / 6 JMH threads"));
}

#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn threads_renders_this_machine_beside_the_article() {
    let dom = assert_renders("threads", 1);
    assert!(dom.contains("This machine beside the article"));
}

#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn hh_pools_renders_the_pools_table_and_charts() {
    let dom = assert_renders("hh-pools", 3);
    let table = dom
        .split("Pools: fanout and the Java thread-per-request baseline")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the pools table");
    assert_eq!(table.matches("<tr>").count(), 11, "a header and 10 rows");
}

/// The seeds page: with the thread benchmark run, HeadHunter's chart.
#[test]
#[ignore = "tier 2 (./scripts/test): needs Chromium"]
fn seeds_renders_a_section_per_article() {
    let (_, rep) = recorded("seeds");
    let ran_threads = rep["articles"][0]["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .any(|r| r["scenario"] == "threads" && r["ran"] == true);
    assert!(
        ran_threads,
        "the recorded seeds run ran the thread benchmark"
    );
    let dom = assert_renders("seeds", 1);
    assert_eq!(dom.matches("class=\"article\"").count(), 4);
}
