//! A request's timeline (each finished step's duration and how it ended) and the `Server-Timing`
//! header built from it: `name;dur=12.3;desc="backend vacancies"` per step (names reduced to
//! header tokens), then `total;dur=…`. The same timeline gives the access log the cause of each
//! degraded step.
//!
//! Who gets the header: routes with `server_timing: true`, and any request carrying the trusted
//! header of `server.server_timing` with its token (compared in constant time).

use fanout_config::ServerTimingHeader;
use fanout_flow::observe::StepEnd;
use fanout_flow::plan::StepPlan;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

/// How one step ended, as the timeline keeps it.
pub struct StepTiming {
    /// The step's name.
    pub name: Arc<str>,
    /// The backend it calls, if any.
    pub backend: Option<Arc<str>>,
    /// From its start to its end.
    pub dur: Duration,
    /// `Some((code, cause))` when it failed (defaulted or failing the request).
    pub failure: Option<(String, String)>,
}

/// The finished steps of one request, in the order they finished.
#[derive(Default)]
pub struct Timeline {
    steps: Mutex<Vec<StepTiming>>,
}

impl Timeline {
    /// `step` ended.
    pub fn step_finished(&self, step: &StepPlan, started: Instant, end: StepEnd<'_>) {
        let failure = match end {
            StepEnd::Ok => None,
            StepEnd::Defaulted(e) | StepEnd::Failed(e) => Some((
                e.code().to_string(),
                e.detail.clone().unwrap_or_else(|| e.message.clone()),
            )),
        };
        let t = StepTiming {
            name: step.name.clone(),
            backend: step.backend().cloned(),
            dur: started.elapsed(),
            failure,
        };
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).push(t);
    }

    /// The steps so far.
    pub fn take(&self) -> Vec<StepTiming> {
        std::mem::take(&mut *self.steps.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Who gets `Server-Timing` by header.
pub struct TimingGate {
    header: HeaderName,
    token: Vec<u8>,
}

impl TimingGate {
    /// From `server.server_timing` (`None` when it is absent or its token empty).
    pub fn new(cfg: Option<&ServerTimingHeader>) -> Result<Option<TimingGate>, String> {
        let Some(cfg) = cfg else {
            return Ok(None);
        };
        if cfg.token.is_empty() {
            return Ok(None);
        }
        let header = HeaderName::from_bytes(cfg.header.as_bytes()).map_err(|_| {
            format!(
                "server.server_timing.header `{}` is not a valid header name",
                cfg.header
            )
        })?;
        Ok(Some(TimingGate {
            header,
            token: cfg.token.as_bytes().to_vec(),
        }))
    }

    /// The request carries the header with the right token.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        headers
            .get(&self.header)
            .is_some_and(|v| bool::from(v.as_bytes().ct_eq(&self.token)))
    }
}

/// The `Server-Timing` value of `steps`, with the request's `total`.
pub fn header_value(steps: &[StepTiming], total: Duration) -> Option<HeaderValue> {
    let mut out = String::with_capacity(32 * (steps.len() + 1));
    for s in steps {
        push_token(&mut out, &s.name);
        let _ = write!(out, ";dur={:.1}", ms(s.dur));
        let desc = match (&s.backend, &s.failure) {
            (Some(b), None) => format!("backend {b}"),
            (Some(b), Some((code, _))) => format!("backend {b}, {code}"),
            (None, Some((code, _))) => code.clone(),
            (None, None) => String::new(),
        };
        if !desc.is_empty() {
            out.push_str(";desc=\"");
            push_quoted(&mut out, &desc);
            out.push('"');
        }
        out.push_str(", ");
    }
    let _ = write!(out, "total;dur={:.1}", ms(total));
    HeaderValue::from_str(&out).ok()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `name` as an HTTP token: characters outside the token set become `_`.
fn push_token(out: &mut String, name: &str) {
    if name.is_empty() {
        out.push('_');
    }
    for c in name.chars() {
        let ok = c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        out.push(if ok { c } else { '_' });
    }
}

/// `s` inside a quoted-string: `"` and `\` escaped, non-printable or non-ASCII as `?`.
fn push_quoted(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_lists_steps_with_durations_and_the_total() {
        let steps = vec![
            StepTiming {
                name: "vacancies".into(),
                backend: Some("search".into()),
                dur: Duration::from_micros(12_340),
                failure: None,
            },
            StepTiming {
                name: "odd name/é".into(),
                backend: Some("x\"y".into()),
                dur: Duration::from_millis(2),
                failure: Some(("backend_timeout".into(), "slow".into())),
            },
        ];
        let v = header_value(&steps, Duration::from_millis(20)).unwrap();
        assert_eq!(
            v.to_str().unwrap(),
            r#"vacancies;dur=12.3;desc="backend search", odd_name__;dur=2.0;desc="backend x\"y, backend_timeout", total;dur=20.0"#
        );
    }

    #[test]
    fn the_gate_wants_the_exact_token() {
        let cfg = ServerTimingHeader {
            header: "x-fanout-timing".into(),
            token: "s3cret".into(),
        };
        let gate = TimingGate::new(Some(&cfg)).unwrap().unwrap();
        let mut h = HeaderMap::new();
        assert!(!gate.allows(&h));
        h.insert("x-fanout-timing", HeaderValue::from_static("s3cre"));
        assert!(!gate.allows(&h));
        h.insert("x-fanout-timing", HeaderValue::from_static("s3cret"));
        assert!(gate.allows(&h));
        let empty = ServerTimingHeader {
            header: "x-fanout-timing".into(),
            token: String::new(),
        };
        assert!(TimingGate::new(Some(&empty)).unwrap().is_none());
    }
}
