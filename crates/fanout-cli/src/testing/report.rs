//! What `fanout test` prints (for people) and writes with `--junit` (for CI).

use super::run::{CaseResult, Report};
use std::fmt::Write as _;

/// The report for people: per case ✓/✗ with FILE:LINE, what failed, and a summary line.
pub fn human(report: &Report) -> String {
    let mut out = String::new();
    for r in &report.results {
        let mark = if r.passed() { "✓" } else { "✗" };
        let _ = writeln!(
            out,
            "{mark} {}  ({}:{}, {} ms)",
            r.name,
            r.file,
            r.line,
            r.elapsed.as_millis()
        );
        for f in &r.failures {
            for line in f.lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    let failed = report.results.iter().filter(|r| !r.passed()).count();
    let _ = writeln!(
        out,
        "{}: {} cases, {} passed, {} failed ({} ms)",
        report.file,
        report.results.len(),
        report.results.len() - failed,
        failed,
        report.elapsed.as_millis()
    );
    out
}

/// `text` escaped for XML element text; characters XML 1.0 cannot hold are replaced by U+FFFD.
/// Tab and newline stay as they are (text keeps them); a carriage return is written `&#13;`
/// (a reader would turn a raw one, or CR LF, into a newline).
pub fn xml_escape(text: &str) -> String {
    escape(text, false)
}

/// `text` escaped for an XML attribute value: as [`xml_escape`], and tab, newline and carriage
/// return written `&#9;`, `&#10;`, `&#13;` (a reader normalizes raw ones in an attribute to
/// spaces).
pub fn xml_attr(text: &str) -> String {
    escape(text, true)
}

fn escape(text: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#13;"),
            '\t' if attribute => out.push_str("&#9;"),
            '\n' if attribute => out.push_str("&#10;"),
            '\t' | '\n' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn secs(d: std::time::Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// One suite for [`junit_suites`]: its results, or why it could not run.
#[derive(Debug, Clone, Copy)]
pub enum JunitSuite<'a> {
    /// The suite ran.
    Ran(&'a Report),
    /// The suite could not run (a file that does not load, a database that cannot be created).
    Error {
        /// The cases file.
        file: &'a str,
        /// Why.
        message: &'a str,
    },
}

/// JUnit XML (`testsuites` / `testsuite` / `testcase` / `failure`), one `testsuite` per
/// cases file.
pub fn junit(reports: &[&Report]) -> String {
    let suites: Vec<JunitSuite<'_>> = reports.iter().map(|r| JunitSuite::Ran(r)).collect();
    junit_suites(&suites)
}

/// JUnit XML for a suite that could not run (a file that does not load, a database that
/// cannot be created): one `<testcase>` with an `<error>`.
pub fn junit_error(file: &str, message: &str) -> String {
    junit_suites(&[JunitSuite::Error { file, message }])
}

/// JUnit XML of several suites, in order: one `testsuite` each; a suite that could not run is
/// one `<testcase name="load and start">` with an `<error>`.
pub fn junit_suites(suites: &[JunitSuite<'_>]) -> String {
    let mut tests = 0;
    let mut failed = 0;
    let mut errors = 0;
    let mut time = std::time::Duration::ZERO;
    for s in suites {
        match s {
            JunitSuite::Ran(r) => {
                tests += r.results.len();
                failed += r.results.iter().filter(|c| !c.passed()).count();
                time += r.elapsed;
            }
            JunitSuite::Error { .. } => {
                tests += 1;
                errors += 1;
            }
        }
    }
    let time = if time.is_zero() {
        "0".to_string()
    } else {
        secs(time)
    };
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"fanout test\" tests=\"{tests}\" failures=\"{failed}\" errors=\"{errors}\" time=\"{time}\">"
    );
    for s in suites {
        match s {
            JunitSuite::Ran(r) => {
                let f = r.results.iter().filter(|c| !c.passed()).count();
                let _ = writeln!(
                    out,
                    "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{f}\" errors=\"0\" skipped=\"0\" time=\"{}\">",
                    xml_attr(&r.file),
                    r.results.len(),
                    secs(r.elapsed)
                );
                for c in &r.results {
                    testcase(&mut out, c);
                }
                out.push_str("  </testsuite>\n");
            }
            JunitSuite::Error { file, message } => {
                let first = message.lines().next().unwrap_or("");
                let _ = writeln!(
                    out,
                    "  <testsuite name=\"{f}\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\" time=\"0\">\n    \
                     <testcase name=\"load and start\" classname=\"{f}\" file=\"{f}\" time=\"0\">\n      \
                     <error message=\"{m}\" type=\"setup\">{all}</error>\n    </testcase>\n  </testsuite>",
                    f = xml_attr(file),
                    m = xml_attr(first),
                    all = xml_escape(message)
                );
            }
        }
    }
    out.push_str("</testsuites>\n");
    out
}

fn testcase(out: &mut String, c: &CaseResult) {
    let _ = write!(
        out,
        "    <testcase name=\"{}\" classname=\"{}\" file=\"{}\" line=\"{}\" time=\"{}\"",
        xml_attr(&c.name),
        xml_attr(&c.file),
        xml_attr(&c.file),
        c.line,
        secs(c.elapsed)
    );
    if c.passed() {
        out.push_str("/>\n");
        return;
    }
    out.push_str(">\n");
    let first = c
        .failures
        .first()
        .and_then(|f| f.lines().next())
        .unwrap_or("");
    let _ = writeln!(
        out,
        "      <failure message=\"{}\" type=\"assertion\">{}:{}\n{}</failure>",
        xml_attr(first),
        xml_escape(&c.file),
        c.line,
        xml_escape(&c.failures.join("\n"))
    );
    out.push_str("    </testcase>\n");
}
