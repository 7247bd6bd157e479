//! fanout's load lab: `fanout lab SCENARIO` (the `fanout-lab` binary, run by the gateway's
//! launcher) starts the stubs and every system under test as child processes, drives
//! open-model load from this process (`fanout-load`), samples each target's CPU time, RSS and
//! threads from `/proc`, and writes `report.json` and a self-contained `report.html`. Targets are
//! compared **interleaved** (A B B A …) over several trials, and reported as medians with
//! min–max.
//!
//! Where things are: `model` the shared types (a leaf: scenario descriptions, trials, options,
//! errors); `scenario` the built-in scenarios and what each accepts; `runner` a run from start
//! to report and the [`runner`]'s `Measure` trait, implemented once per mode in `measure`;
//! `report` the report (JSON, HTML, text), which imports no scenario module; `seeds`, `threads`
//! `hop` and `streams` (`pass-small`, `pass-bulk`, `sse-events`: beside nginx) the scenarios with an
//! entry point of their own; `graphql_posts` (`graphql-posts`, `graphql-posts-identical`: beside
//! Tailcall 1.0.0) too.

pub mod antispam;
pub mod baseline;
pub mod certs;
pub mod graphql_posts;
pub mod hop;
pub mod http;
pub mod java;
pub mod measure;
pub mod model;
/// The throw-away PostgreSQL cluster (crate `fanout-pgtemp`, which `fanout test` uses too).
pub use fanout_pgtemp as postgres;
pub mod process;
pub mod procstat;
pub mod recorded;
pub mod report;
mod runner;
pub mod scenario;
pub mod seeds;
pub mod streams;
pub mod svg;
pub mod targets;
pub mod threads;
pub mod token;

/// The closed-loop mode's clients (moved to `measure`; the old path stays).
pub use measure as closed_loop;
pub use model::{
    LAG_THRESHOLD, LabError, LabOptions, OVERLOAD_SEARCH_LAG_MS, PhaseBound, RECOVERED_SUCCESS,
    Trial,
};
/// The `hh-pools` part of a report (moved into `report`; the old path stays).
pub use report::pools;
pub use targets::{JAVA_TARGETS, TARGETS, available_targets, equal_work, is_java_target};

/// The environment variable through which `fanout lab` (the launcher in the gateway binary)
/// names the `fanout` executable the lab runs as system under test, stub and load generator.
pub const FANOUT_BIN_ENV: &str = "FANOUT_LAB_FANOUT_BIN";

/// The environment variable through which `fanout lab` passes the command line the user typed,
/// for the report's `command` field.
pub const COMMAND_ENV: &str = "FANOUT_LAB_COMMAND";

/// Run the lab and write `report.json` and `report.html` into `opts.out`.
pub async fn run(opts: LabOptions) -> Result<report::LabReport, LabError> {
    let Some(scenario) = scenario::builtin(&opts.scenario) else {
        return Err(LabError::UnknownScenario(
            opts.scenario.clone(),
            format!(
                "{}, {}, {}, {}, {}",
                scenario::NAMES.join(", "),
                scenario::OWN_ENTRY.join(", "),
                hop::NAME,
                streams::NAMES.join(", "),
                graphql_posts::NAMES.join(", ")
            ),
        ));
    };
    let kind = measure::of(&scenario.mode);
    runner::start::run(opts, scenario, kind).await
}
