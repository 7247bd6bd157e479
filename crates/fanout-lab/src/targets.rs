//! The targets a run may name: the lab's own (`fanout`, the baselines), a scenario's variants,
//! `java-threads-N` pools, another fanout build as `NAME=PATH`; and the configs fanout targets
//! serve ([`equal_work`]).

use crate::java;
use crate::model::Scenario;

/// Target names the lab knows (besides a scenario's variants). A scenario lists the baselines
/// that serve its routes in `Scenario::baselines`.
pub const TARGETS: [&str; 8] = [
    "fanout",
    "antispam-py",
    "hyper-baseline",
    "java-threads",
    "grpc-baseline",
    "pg-baseline",
    "java-blocking",
    "java-virtual",
];

/// The targets that run the Java baseline (`bench/baselines/java-threads`), each in its own
/// style: `java-threads` (200 request threads, parallel calls on a 200-thread pool),
/// `java-blocking` (parallel calls on a pool of as many threads as cores: the Kotlin article's
/// sync version), `java-virtual` (virtual threads, Java 21+).
pub const JAVA_TARGETS: [&str; 3] = ["java-threads", "java-blocking", "java-virtual"];

/// Whether `target` runs the Java baseline: one of [`JAVA_TARGETS`] or a `java-threads-N` pool
/// target ([`java::pool_size`]).
pub fn is_java_target(target: &str) -> bool {
    JAVA_TARGETS.contains(&target) || java::pool_size(target).is_some()
}

/// Whether `target` may run in scenario `s`: a `java-threads-N` target wherever `java-threads`
/// serves the routes.
pub(crate) fn pool_target_available(s: &Scenario, target: &str) -> bool {
    java::pool_size(target).is_some() && s.baselines.contains(&"java-threads")
}

/// A target `NAME=PATH`: another fanout binary (e.g. a build of an earlier commit) serving the
/// scenario's config, to compare two builds interleaved in one run.
pub(crate) fn external_fanout(target: &str) -> Option<(&str, &str)> {
    target
        .split_once('=')
        .filter(|(name, bin)| !name.is_empty() && !bin.is_empty())
}

/// Targets that can run `s`: `fanout`, the baselines that serve its routes, its variants.
pub fn available_targets(s: &Scenario) -> Vec<String> {
    let mut v = vec!["fanout".to_string()];
    v.extend(
        TARGETS[1..]
            .iter()
            .filter(|t| s.baselines.contains(t))
            .map(|t| t.to_string()),
    );
    v.extend(s.variants.iter().map(|(n, _)| n.to_string()));
    // Every scenario: its config served one runtime per core (the default), and on the
    // work-stealing runtime.
    v.push(PER_CORE.to_string());
    v.push(WORK_STEALING.to_string());
    // A scenario's own `java-threads-N` targets (`hh-pools`); any other N runs too.
    v.extend(
        s.default_targets
            .iter()
            .filter(|t| pool_target_available(s, t))
            .map(|t| t.to_string()),
    );
    v
}

pub use crate::model::{PER_CORE, WORK_STEALING};

/// A variant target's config as the lab runs it ([`equal_work`]); `None` for other targets.
pub(crate) fn lab_variant(s: &Scenario, target: &str) -> Option<String> {
    if let Some(runtime) = runtime_of(target) {
        return Some(equal_work(
            &with_runtime(s.gateway, runtime),
            !s.baselines.is_empty(),
        ));
    }
    s.variants
        .iter()
        .find(|(n, _)| *n == target)
        .map(|(_, y)| equal_work(y, !s.baselines.is_empty()))
}

/// The `server.runtime` a runtime target names ([`PER_CORE`], [`WORK_STEALING`]).
pub fn runtime_of(target: &str) -> Option<&'static str> {
    match target {
        PER_CORE => Some("per_core"),
        WORK_STEALING => Some("work_stealing"),
        _ => None,
    }
}

/// `yaml` with `server.runtime: RUNTIME`: a line under its top-level `server:` (block style),
/// or a `server:` section of its own.
pub fn with_runtime(yaml: &str, runtime: &str) -> String {
    let line = format!("  runtime: {runtime}");
    match yaml.lines().position(|l| l.trim_end() == "server:") {
        Some(i) => {
            let mut lines: Vec<&str> = yaml.lines().collect();
            lines.insert(i + 1, &line);
            lines.join("\n") + "\n"
        }
        None => format!("{yaml}\nserver:\n{line}\n"),
    }
}

/// A fanout config as the lab runs it: whole-request coalescing off (`defaults.coalesce:
/// false`), so fanout computes every request as the baselines do; and, in a scenario compared
/// with hand-written baselines (`dedup_off`), in-flight dedup off too (`defaults.dedup: false`),
/// so fanout makes every backend call the baselines make — what sharing saves is not mixed into
/// a comparison of CPU per request (it has scenarios of its own). Scenarios that compare fanout
/// configs with each other (product-page-merging, hedging, slow-backend) keep dedup. A backend
/// or route that states `dedup`/`coalesce` itself keeps its setting. (The lab's configs have no
/// top-level `defaults:`; one in block style gets the lines inserted.)
///
/// A config that turns coalescing on itself (a top-level `defaults:` with `coalesce: true`) is
/// kept as it is: it is a scenario's "what sharing saves" target (`n-plus-one-identical`).
pub fn equal_work(yaml: &str, dedup_off: bool) -> String {
    if states_coalescing(yaml) {
        return yaml.to_string();
    }
    let mut add = vec!["  coalesce: false"];
    if dedup_off {
        add.push("  dedup: false");
    }
    match yaml.lines().position(|l| l.trim_end() == "defaults:") {
        Some(i) => {
            let mut lines: Vec<&str> = yaml.lines().collect();
            for (k, l) in add.into_iter().enumerate() {
                lines.insert(i + 1 + k, l);
            }
            lines.join("\n") + "\n"
        }
        None => format!("{yaml}\ndefaults:\n{}\n", add.join("\n")),
    }
}

/// Whether `yaml`'s top-level `defaults:` (block style) says `coalesce: true`.
fn states_coalescing(yaml: &str) -> bool {
    let mut lines = yaml.lines().skip_while(|l| l.trim_end() != "defaults:");
    lines.next().is_some()
        && lines
            .take_while(|l| l.is_empty() || l.starts_with(' '))
            .any(|l| l.trim() == "coalesce: true")
}

#[cfg(test)]
mod equal_work_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_lab_turns_whole_request_coalescing_off() {
        let appended = equal_work("routes: []\n", false);
        assert!(
            appended.ends_with("\ndefaults:\n  coalesce: false\n"),
            "{appended}"
        );
        let inserted = equal_work("defaults:\n  timeout: 2s\nroutes: []\n", false);
        assert_eq!(
            inserted,
            "defaults:\n  coalesce: false\n  timeout: 2s\nroutes: []\n"
        );
        // A config that turns coalescing on itself is kept (a "what sharing saves" target).
        let on = "routes: []\ndefaults:\n  timeout: 2s\n  coalesce: true\n";
        assert_eq!(equal_work(on, true), on);
        // ... but not a route's own `coalesce: true` (only the top-level defaults count).
        let route = "routes:\n  - path: /x\n    coalesce: true\n";
        assert!(equal_work(route, false).ends_with("\ndefaults:\n  coalesce: false\n"));
    }

    #[test]
    fn against_baselines_the_lab_turns_dedup_off_too() {
        let appended = equal_work("routes: []\n", true);
        assert!(
            appended.ends_with("\ndefaults:\n  coalesce: false\n  dedup: false\n"),
            "{appended}"
        );
        let inserted = equal_work("defaults:\n  timeout: 2s\nroutes: []\n", true);
        assert_eq!(
            inserted,
            "defaults:\n  coalesce: false\n  dedup: false\n  timeout: 2s\nroutes: []\n"
        );
    }

    #[test]
    fn every_scenario_runs_on_either_runtime_with_the_same_work() {
        for name in crate::scenario::NAMES {
            let s = &crate::scenario::builtin(name).unwrap();
            let targets = available_targets(s);
            for (target, runtime) in [(PER_CORE, "per_core"), (WORK_STEALING, "work_stealing")] {
                assert!(
                    targets.iter().any(|t| t == target),
                    "{}: {targets:?}",
                    s.name
                );
                let yaml = lab_variant(s, target).unwrap();
                let line = format!("  runtime: {runtime}");
                assert_eq!(
                    yaml.lines()
                        .filter(|l| l.trim_start().starts_with("runtime:"))
                        .count(),
                    1,
                    "{}: {yaml}",
                    s.name
                );
                assert!(yaml.lines().any(|l| l == line), "{}: {yaml}", s.name);
                // The same work as `fanout`: the lab's equal-work lines are there too.
                assert_eq!(
                    yaml.contains("coalesce: false"),
                    !states_coalescing(s.gateway),
                    "{}: {yaml}",
                    s.name
                );
            }
        }
        assert_eq!(runtime_of("fanout"), None);
        // Under a `server:` block the scenario has, or a section of its own.
        assert_eq!(
            with_runtime(
                "server:\n  max_connections: 10\nroutes: []\n",
                "work_stealing"
            ),
            "server:\n  runtime: work_stealing\n  max_connections: 10\nroutes: []\n"
        );
        assert_eq!(
            with_runtime("routes: []\n", "per_core"),
            "routes: []\n\nserver:\n  runtime: per_core\n"
        );
    }
}
