//! A flow route whose answer is streamed as its steps complete (`stream:` on a route;
//! docs/config.md#streamed-answers): Server-Sent Events or NDJSON, one event per `for_each`
//! element or step value as soon as it is ready, a last event with the route's answer.

use crate::{ConfigError, Dur, Located, Route};
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
pub(crate) fn check_route(r: &Route, errs: &mut Vec<ConfigError>) {
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
