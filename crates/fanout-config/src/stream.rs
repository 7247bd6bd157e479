//! A flow route whose answer is streamed as its steps complete (`stream:` on a route;
//! docs/config.md#streamed-answers): Server-Sent Events or NDJSON, one event per `for_each`
//! element or step value as soon as it is ready, a last event with the route's answer.

use crate::{ConfigError, Dur, Located, Route};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// How a flow route streams its answer (`stream:`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamAnswer {
    /// `sse` (`text/event-stream`, default) or `ndjson` (`application/x-ndjson`, one JSON
    /// object a line).
    #[serde(default)]
    pub format: StreamFormat,
    /// The steps whose values are sent as they complete — a `for_each` step's elements one by
    /// one, another step's value once. Default: every step of the flow.
    pub steps: Option<Vec<Located<String>>>,
    /// `sse`: while nothing is sent for this long, a comment (`: keep-alive`) is; `0s` sends
    /// none. Default 15s.
    #[serde(default = "default_heartbeat")]
    pub heartbeat: Dur,
    /// The most events one answer sends (the last one, `end` or `error`, not counted): past
    /// it the flow is stopped and the stream ends with an `error` event, code
    /// `too_many_events`. Default 10000.
    #[serde(default = "default_max_events")]
    pub max_events: u64,
    /// Merge several backends' event streams (SSE or NDJSON) into this answer, their events
    /// interleaved as they arrive, each tagged with its source (docs/config.md#merged-streams).
    pub merge: Option<MergeStreams>,
}

/// The backend streams a streamed answer merges (`stream.merge`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeStreams {
    /// The sources by name (the name is each of their events' `event:`): a backend and the path
    /// of its stream.
    pub sources: IndexMap<String, MergeSource>,
    /// A source that sends no byte for this long fails (an `error` event, code
    /// `source_idle`). Default 30s.
    #[serde(default = "default_source_idle")]
    pub idle_timeout: Dur,
    /// The most events taken from one source; past it the source fails (`too_many_events`).
    /// Default 10000.
    #[serde(default = "default_max_events")]
    pub max_events: u64,
    /// The largest event (SSE) or line (NDJSON) of a source, in bytes; a larger one fails the
    /// source (`event_too_large`): no more than this is buffered per source. Default 65536.
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: usize,
    /// When the merged stream ends: `all` — once every source has ended or failed (default) —,
    /// or `first` — as soon as one source ends or fails.
    #[serde(default)]
    pub end: MergeEnd,
}

/// One merged stream: `GET` (or `method`) `path` on `backend`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeSource {
    /// Name of an HTTP backend under `backends:`.
    pub backend: Located<String>,
    /// The path (and query) sent, after the backend URL's base path.
    pub path: Located<String>,
    /// The method; default GET.
    #[serde(default = "default_get")]
    pub method: String,
}

/// When a merged stream ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MergeEnd {
    /// When every source has ended or failed.
    #[default]
    All,
    /// When the first source ends or fails.
    First,
}

fn default_source_idle() -> Dur {
    Dur::secs(30)
}

fn default_max_event_bytes() -> usize {
    65_536
}

fn default_get() -> String {
    "GET".to_string()
}

/// The encoding of a streamed answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamFormat {
    /// Server-Sent Events: `event:` the step, `id:` the element's index, `data:` the value.
    #[default]
    Sse,
    /// Newline-delimited JSON: `{"event": …, "index": …, "data": …}` a line.
    Ndjson,
}

fn default_heartbeat() -> Dur {
    Dur::secs(15)
}

fn default_max_events() -> u64 {
    10_000
}

/// `stream` is for flow routes: not with `pass`, `websocket` or `grpc`; the steps it names
/// exist; `max_events` at least 1.
pub(crate) fn check_route<B>(
    r: &Route,
    backends: &IndexMap<String, B>,
    errs: &mut Vec<ConfigError>,
) {
    let Some(s) = &r.stream else {
        return;
    };
    let at = r.path.pos;
    for (what, there) in [
        ("pass", r.pass.is_some()),
        ("websocket", r.websocket.is_some()),
        ("grpc", r.grpc.is_some()),
    ] {
        if there {
            errs.push(
                ConfigError::at(at, format!("a `stream` route has no `{what}`")).hint(
                    "`stream` streams a flow's step values; a pass-through route already \
                     streams its backend's answer",
                ),
            );
        }
    }
    if s.max_events == 0 {
        errs.push(ConfigError::at(at, "`stream.max_events` is 0").hint("allow at least one event"));
    }
    if let Some(m) = &s.merge {
        if m.sources.is_empty() {
            errs.push(
                ConfigError::at(at, "`stream.merge.sources` is empty")
                    .hint("name at least one source: `{backend, path}`"),
            );
        }
        for src in m.sources.values() {
            if !src.path.value.starts_with('/')
                || src
                    .path
                    .value
                    .contains(|c: char| c.is_whitespace() || c.is_control())
            {
                errs.push(
                    ConfigError::at(src.path.pos, format!("`{}` is not a path", src.path.value))
                        .hint("a source's path starts with `/`, e.g. `/events`"),
                );
            }
            if src.method.is_empty() || !src.method.bytes().all(|b| b.is_ascii_uppercase()) {
                errs.push(
                    ConfigError::at(src.path.pos, format!("`{}` is not a method", src.method))
                        .hint("e.g. GET"),
                );
            }
            if !backends.contains_key(&src.backend.value) {
                let mut e = ConfigError::at(
                    src.backend.pos,
                    format!("unknown backend `{}`", src.backend.value),
                );
                if let Some(h) = crate::did_you_mean(&src.backend.value, backends.keys()) {
                    e = e.hint(h);
                }
                errs.push(e);
            }
        }
        if m.max_event_bytes == 0 || m.max_events == 0 {
            errs.push(
                ConfigError::at(at, "`stream.merge` limits must be at least 1")
                    .hint("`max_events` and `max_event_bytes` bound each source"),
            );
        }
    }
    for name in s.steps.iter().flatten() {
        if !r.flow.keys().any(|k| k.value == name.value) {
            let names: Vec<&str> = r.flow.keys().map(|k| k.value.as_str()).collect();
            let mut e = ConfigError::at(
                name.pos,
                format!(
                    "`stream.steps` names `{}`, not a step of this route",
                    name.value
                ),
            );
            if let Some(h) = crate::did_you_mean(&name.value, names.iter().copied()) {
                e = e.hint(h);
            }
            errs.push(e);
        }
    }
}
