//! A report rendered again from a recorded `report.json`: the text summary the lab printed and
//! `report.html`, from the figures of a run made earlier — no stubs, no targets, no load.
//!
//! The report's renderers are tested this way (`tests/recorded.rs`, against the runs recorded in
//! `tests/data/`), so the live lab tests (`crates/fanout-cli/tests/lab.rs`) check only what
//! needs the load: that the targets ran, did equal work, and that the counts agree. It is also
//! how to see an old run in the current report's layout.
//!
//! Every kind of report the lab writes is read: a scenario's ([`LabReport`]), `threads`
//! ([`ThreadsReport`]), `hop` ([`HopReport`]), `seeds` ([`SeedsReport`]) and the pass-through
//! scenarios beside nginx ([`StreamsReport`]) and the GraphQL ones beside Tailcall
//! ([`GraphqlReport`]), told apart by their `scenario` field.

use crate::graphql_posts::GraphqlReport;
use crate::hop::HopReport;
use crate::report::LabReport;
use crate::seeds::SeedsReport;
use crate::streams::StreamsReport;
use crate::threads::ThreadsReport;
use std::path::Path;

/// A recorded report of any kind.
#[derive(Debug, Clone)]
pub enum Recorded {
    /// A scenario run by the runner (`product-page`, `overload`, `parallel-calls`, …).
    Lab(Box<LabReport>),
    /// `fanout lab threads`.
    Threads(Box<ThreadsReport>),
    /// `fanout lab hop`.
    Hop(Box<HopReport>),
    /// `fanout lab seeds`.
    Seeds(Box<SeedsReport>),
    /// `fanout lab pass-small`, `pass-bulk`, `sse-events`.
    Streams(Box<StreamsReport>),
    /// `fanout lab graphql-posts`, `graphql-posts-identical`.
    Graphql(Box<GraphqlReport>),
}

/// Why a recorded report could not be read or rendered.
#[derive(Debug, thiserror::Error)]
pub enum RecordedError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not a report the lab writes.
    #[error("{path} is not a lab report: {reason}")]
    Parse {
        /// File.
        path: String,
        /// What did not fit.
        reason: String,
    },
}

impl Recorded {
    /// Read `report.json` text (`path` names it in errors).
    pub fn parse(path: &str, json: &str) -> Result<Recorded, RecordedError> {
        let bad = |e: serde_json::Error| RecordedError::Parse {
            path: path.to_string(),
            reason: e.to_string(),
        };
        let v: serde_json::Value = serde_json::from_str(json).map_err(bad)?;
        let scenario = v["scenario"].as_str().unwrap_or_default().to_string();
        Ok(match scenario.as_str() {
            crate::seeds::NAME => {
                Recorded::Seeds(Box::new(serde_json::from_value(v).map_err(bad)?))
            }
            crate::hop::NAME => Recorded::Hop(Box::new(serde_json::from_value(v).map_err(bad)?)),
            crate::threads::NAME => {
                Recorded::Threads(Box::new(serde_json::from_value(v).map_err(bad)?))
            }
            s if crate::streams::NAMES.contains(&s) => {
                Recorded::Streams(Box::new(serde_json::from_value(v).map_err(bad)?))
            }
            s if crate::graphql_posts::NAMES.contains(&s) => {
                Recorded::Graphql(Box::new(serde_json::from_value(v).map_err(bad)?))
            }
            _ => Recorded::Lab(Box::new(serde_json::from_value(v).map_err(bad)?)),
        })
    }

    /// Read `dir/report.json`.
    pub fn load(dir: &Path) -> Result<Recorded, RecordedError> {
        let p = dir.join("report.json");
        let path = p.display().to_string();
        let json = std::fs::read_to_string(&p).map_err(|source| RecordedError::Io {
            path: path.clone(),
            source,
        })?;
        Recorded::parse(&path, &json)
    }

    /// A scenario's acceptance lines for `target` as `(check, pass)`, in the report's order
    /// (`threads`, `hop` and `seeds` reports carry their lines elsewhere: none here).
    pub fn acceptance(&self, target: &str) -> Vec<(String, bool)> {
        match self {
            Recorded::Lab(r) => r
                .acceptance
                .iter()
                .filter(|a| a.target == target)
                .map(|a| (a.check.clone(), a.pass))
                .collect(),
            Recorded::Threads(_)
            | Recorded::Hop(_)
            | Recorded::Seeds(_)
            | Recorded::Streams(_)
            | Recorded::Graphql(_) => vec![],
        }
    }

    /// `report.json` as the lab writes it.
    pub fn json(&self) -> String {
        let json = match self {
            Recorded::Lab(r) => serde_json::to_string_pretty(r),
            Recorded::Threads(r) => serde_json::to_string_pretty(r),
            Recorded::Hop(r) => serde_json::to_string_pretty(r),
            Recorded::Seeds(r) => serde_json::to_string_pretty(r),
            Recorded::Streams(r) => serde_json::to_string_pretty(r),
            Recorded::Graphql(r) => serde_json::to_string_pretty(r),
        };
        json.unwrap_or_default()
    }

    /// The text summary the lab printed at the end of the run (without the closing
    /// `report: …` line).
    pub fn text(&self) -> String {
        match self {
            Recorded::Lab(r) => crate::report::text_summary(r),
            Recorded::Threads(r) => crate::threads::text_summary(r),
            Recorded::Hop(r) => crate::hop::text_summary(r),
            Recorded::Seeds(r) => crate::seeds::text_summary(r),
            Recorded::Streams(r) => crate::streams::text_summary(r),
            Recorded::Graphql(r) => crate::graphql_posts::text_summary(r),
        }
    }

    /// `report.html`.
    pub fn html(&self) -> String {
        let json = self.json();
        match self {
            Recorded::Lab(r) => crate::report::html(r, &json),
            Recorded::Threads(r) => crate::threads::html(r, &json),
            Recorded::Hop(r) => crate::hop::html(r, &json),
            Recorded::Seeds(r) => crate::seeds::html(r, &json),
            Recorded::Streams(r) => crate::streams::html(r, &json),
            Recorded::Graphql(r) => crate::graphql_posts::html(r, &json),
        }
    }

    /// Write `report.json` and `report.html` into `out` (created if missing), as the run did.
    pub fn write(&self, out: &Path) -> Result<(), RecordedError> {
        let io = |p: &Path| {
            let path = p.display().to_string();
            move |source| RecordedError::Io { path, source }
        };
        std::fs::create_dir_all(out).map_err(io(out))?;
        let p = out.join("report.json");
        std::fs::write(&p, self.json()).map_err(io(&p))?;
        let p = out.join("report.html");
        std::fs::write(&p, self.html()).map_err(io(&p))
    }
}
