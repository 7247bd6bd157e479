//! The text rendering of [`RouteExplain`]: per route, the steps by level with what each waits
//! for, its timeout and its backend's layers, then the critical path against the deadline.

use super::{
    BackendExplain, HedgeExplain, RouteExplain, StepExplain, Timeout, TimeoutFrom, fmt_dur,
};
use crate::plan::{Coalesce, StepIo};
use std::fmt::Write as _;

/// Every route in `routes`, separated by a blank line.
pub(super) fn render(routes: &[&RouteExplain]) -> String {
    let parts: Vec<String> = routes.iter().map(|r| route(r)).collect();
    parts.join("\n")
}

fn route(r: &RouteExplain) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} {}", r.method, r.path);
    if let Some(pass) = &r.pass {
        let _ = writeln!(out, "  {pass}");
        if !r.edge.is_empty() {
            let _ = writeln!(
                out,
                "  edge stages, in order (each may refuse before the body is read): {}",
                r.edge.join(", ")
            );
        }
        for line in &r.edge_lines {
            let _ = writeln!(out, "  {line}");
        }
        return out;
    }
    let _ = writeln!(
        out,
        "  deadline {} (a call gets its timeout or the time left before the deadline, whichever \
         is shorter)",
        fmt_dur(r.deadline)
    );
    if !r.edge.is_empty() {
        let _ = writeln!(
            out,
            "  edge stages, in order (each may refuse before the body is read): {}",
            r.edge.join(", ")
        );
    }
    for line in &r.edge_lines {
        let _ = writeln!(out, "  {line}");
    }
    coalesce(&mut out, r);
    let _ = writeln!(
        out,
        "  {} in {}; steps of one level can run in parallel, and each step starts as soon as \
         the steps it waits for are done",
        plural(r.steps.len(), "step", "steps"),
        plural(r.levels.len(), "level", "levels"),
    );
    for (l, members) in r.levels.iter().enumerate() {
        let _ = writeln!(out);
        let when = if l == 0 {
            "starts when the request arrives"
        } else {
            "each step once the steps it waits for are done"
        };
        let _ = writeln!(out, "  level {} ({when})", l + 1);
        for &i in members {
            step(&mut out, r, &r.steps[i]);
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "  respond: when every step is done");
    critical(&mut out, r);
    out
}

/// Whether concurrent identical requests share one run, and what makes them identical.
fn coalesce(out: &mut String, r: &RouteExplain) {
    let text = match &r.coalesce {
        Coalesce::On if r.key.is_empty() => "coalesced: concurrent requests share one run of the \
             flow (it reads nothing of the request)"
            .to_string(),
        Coalesce::On => format!(
            "coalesced: concurrent requests equal in {} share one run of the flow (nothing \
             else of the request splits them)",
            r.key.join(", ")
        ),
        Coalesce::Off => "not coalesced: `coalesce: false`".to_string(),
        Coalesce::Writes { step, what } => {
            format!("not coalesced: step `{step}` may write ({what})")
        }
    };
    let _ = writeln!(out, "  {text}");
}

fn step(out: &mut String, r: &RouteExplain, s: &StepExplain) {
    let _ = writeln!(out, "    {}: {}", s.name, kind(s));
    let line = |out: &mut String, text: String| {
        let _ = writeln!(out, "      {text}");
    };
    if !s.waits_for.is_empty() {
        let names: Vec<&str> = s
            .waits_for
            .iter()
            .map(|&d| r.steps[d].name.as_str())
            .collect();
        line(out, format!("waits for: {}", names.join(", ")));
    }
    if s.conditional {
        let text = match s.work.io {
            StepIo::Guard { .. } => "when: refuses the request only if its condition holds".into(),
            _ => format!(
                "when: runs only if its condition holds, else its value is {}",
                s.default
            ),
        };
        line(out, text);
    }
    if s.optional {
        line(
            out,
            format!(
                "optional: a failure gives {} and marks the answer partial",
                s.default
            ),
        );
    }
    if let Some(t) = s.timeout {
        line(out, timeout(r, s, t));
    }
    if let Some(b) = &s.backend {
        line(out, backend(b));
    }
}

/// The step's kind in a few words.
fn kind(s: &StepExplain) -> String {
    let mut k = s.work.text.clone();
    match (&s.work.io, s.for_each) {
        (StepIo::Calls { .. }, Some(c)) => {
            let _ = write!(k, ", one call per for_each element, ≤ {c} in flight");
        }
        (StepIo::Keyed { .. }, Some(_)) => k.push_str(", one key per for_each element"),
        (StepIo::Compute { per_item }, Some(_)) => {
            let _ = write!(k, ", one {per_item} per for_each element");
        }
        (_, Some(_)) => k.push_str(", per for_each element"),
        _ => {}
    }
    if s.compute {
        k.push_str(", evaluated on the compute pool");
    }
    k
}

fn timeout(r: &RouteExplain, s: &StepExplain, t: Timeout) -> String {
    let from = match (s.work.io.backend(), t.from) {
        (_, TimeoutFrom::Step) => "step".to_string(),
        (Some(backend), TimeoutFrom::Backend) => format!("backend {backend}"),
        (None, TimeoutFrom::Backend) => "backend".to_string(),
        (_, TimeoutFrom::Defaults) => "defaults.timeout".to_string(),
    };
    let per = match s.work.io {
        StepIo::Keyed { .. } => "per batch call",
        _ => "per call",
    };
    let mut line = format!("timeout: {} {per} ({from})", fmt_dur(t.value));
    if let StepIo::Keyed {
        window: Some(w), ..
    } = s.work.io
    {
        let _ = write!(line, ", after the {} window", fmt_dur(w));
    }
    if t.value > r.deadline {
        let _ = write!(
            line,
            "; longer than the deadline {}, which ends it first",
            fmt_dur(r.deadline)
        );
    }
    if let Some(u) = s.unused_timeout {
        let _ = write!(
            line,
            "; the step's own timeout {} does not apply to keyed lookups",
            fmt_dur(u)
        );
    }
    line
}

/// `backend NAME: 2 addresses, cache …, dedup, …`.
fn backend(b: &BackendExplain) -> String {
    let mut parts = match b.pool {
        Some((size, waiters, wait, statement)) => vec![format!(
            "pool of {size} connections, ≤ {waiters} waiting ≤ {} each, statement_timeout {}",
            fmt_dur(wait),
            fmt_dur(statement)
        )],
        None => vec![plural(b.addresses, "address", "addresses")],
    };
    if let Some(c) = &b.cache {
        let mut p = format!("cache ttl {}", fmt_dur(c.ttl));
        if !c.stale_while_revalidate.is_zero() {
            let _ = write!(
                p,
                ", stale-while-revalidate {}",
                fmt_dur(c.stale_while_revalidate)
            );
        }
        if !c.stale_if_error.is_zero() {
            let _ = write!(p, ", stale-if-error {}", fmt_dur(c.stale_if_error));
        }
        parts.push(p);
    }
    if b.dedup {
        parts.push("dedup".into());
    }
    if b.breaker {
        parts.push("breaker".into());
    }
    if let Some(m) = b.max_concurrency {
        parts.push(format!("bulkhead {m}"));
    }
    if let Some((attempts, statuses)) = &b.retry {
        let st: Vec<String> = statuses.iter().map(u16::to_string).collect();
        let on = if st.is_empty() {
            "transport failures".to_string()
        } else {
            format!("transport failures and {}", st.join("/"))
        };
        parts.push(format!(
            "retry ({} in all, on {on})",
            plural(*attempts as usize, "attempt", "attempts")
        ));
    }
    match b.hedge {
        Some(HedgeExplain::Delay(d)) => parts.push(format!("hedge after {}", fmt_dur(d))),
        Some(HedgeExplain::Percentile {
            percentile,
            min_delay,
        }) => parts.push(format!(
            "hedge after the p{percentile} latency (≥ {})",
            fmt_dur(min_delay)
        )),
        None => {}
    }
    if b.not_idempotent {
        parts.push("no retry or hedge: the call is not idempotent".into());
    }
    format!("backend {}: {}", b.name, parts.join(", "))
}

fn critical(out: &mut String, r: &RouteExplain) {
    if r.critical.is_empty() {
        let _ = writeln!(out, "  critical path: none (no step calls a backend)");
        return;
    }
    let names: Vec<&str> = r
        .critical
        .iter()
        .map(|&i| r.steps[i].name.as_str())
        .collect();
    let _ = writeln!(out, "  critical path: {}", names.join(" → "));
    let terms: Vec<String> = r
        .critical
        .iter()
        .map(|&i| &r.steps[i])
        .filter(|s| !s.worst.is_zero())
        .map(|s| format!("{} ({})", fmt_dur(s.worst), s.name))
        .collect();
    let sum = if terms.len() > 1 {
        format!(" = {}", terms.join(" + "))
    } else {
        String::new()
    };
    let verdict = if r.worst < r.deadline {
        format!(
            "within the deadline {} ({} to spare)",
            fmt_dur(r.deadline),
            fmt_dur(r.deadline - r.worst)
        )
    } else if r.worst == r.deadline {
        format!("equal to the deadline {}", fmt_dur(r.deadline))
    } else {
        format!(
            "over the deadline {} by {}: if every step on the path ran to its timeout, the \
             deadline would end the request (504)",
            fmt_dur(r.deadline),
            fmt_dur(r.worst - r.deadline)
        )
    };
    let _ = writeln!(out, "    worst case {}{sum}, {verdict}", fmt_dur(r.worst));
    let _ = writeln!(
        out,
        "    (an upper bound, not a prediction: each step on the path runs to its timeout; retries \
         and hedged copies stay within a call's timeout)"
    );
    if r.critical.iter().any(|&i| {
        r.steps[i].for_each.is_some() && matches!(r.steps[i].work.io, StepIo::Calls { .. })
    }) {
        let _ = writeln!(
            out,
            "    (a for_each step counts one round of calls: with more elements than calls in \
             flight, each further round can add its timeout, up to the deadline)"
        );
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}
