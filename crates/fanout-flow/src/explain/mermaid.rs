//! The Mermaid rendering of [`RouteExplain`] (a `flowchart LR` for docs): the request, one node
//! per step (an HTTP call a box, a keyed lookup a box naming its batch form, a value a rounded
//! box, a `fail` guard a hexagon), an edge per dependency, the response; the critical path in
//! bold, optional steps dashed. Several routes become one subgraph each.

use super::{RouteExplain, StepExplain, fmt_dur};
use crate::plan::StepIo;
use std::fmt::Write as _;

/// One flowchart for `routes`.
pub(super) fn render(routes: &[&RouteExplain]) -> String {
    let mut out = String::from("flowchart LR\n");
    out.push_str("  classDef critical stroke-width:3px\n");
    out.push_str("  classDef optional stroke-dasharray:5 5\n");
    let nested = routes.len() > 1;
    for (k, r) in routes.iter().enumerate() {
        let id = format!("r{k}");
        if nested {
            let _ = writeln!(
                out,
                "  subgraph {id} [\"{}\"]",
                escape(&format!("{} {}", r.method, r.path))
            );
        }
        route(&mut out, &id, r);
        if nested {
            out.push_str("  end\n");
        }
    }
    out
}

fn route(out: &mut String, id: &str, r: &RouteExplain) {
    let start = format!("{id}_request");
    let end = format!("{id}_respond");
    let node = |i: usize| format!("{id}_s{i}");
    if let Some(pass) = &r.pass {
        // A pass-through route: the request, and the backend it is streamed to and from.
        let _ = writeln!(
            out,
            "  {start}([\"{}\"])",
            escape(&format!("{} {}", r.method, r.path))
        );
        let _ = writeln!(out, "  {id}_pass[\"{}\"]", escape(pass));
        let _ = writeln!(out, "  {start} <--> {id}_pass");
        return;
    }
    let _ = writeln!(
        out,
        "  {start}([\"{}<br/>deadline {}\"])",
        escape(&format!("{} {}", r.method, r.path)),
        fmt_dur(r.deadline)
    );
    for (i, s) in r.steps.iter().enumerate() {
        let label = label(s);
        let shape = match s.work.io {
            StepIo::None => format!("(\"{label}\")"),
            StepIo::Guard { .. } => format!("{{{{\"{label}\"}}}}"),
            _ => format!("[\"{label}\"]"),
        };
        let _ = writeln!(out, "  {}{shape}", node(i));
    }
    let worst = if r.critical.is_empty() {
        "no backend calls".to_string()
    } else {
        format!(
            "worst case {} · deadline {}",
            fmt_dur(r.worst),
            fmt_dur(r.deadline)
        )
    };
    let _ = writeln!(out, "  {end}([\"respond<br/>{worst}\"])");
    for (i, s) in r.steps.iter().enumerate() {
        if s.waits_for.is_empty() {
            let _ = writeln!(out, "  {start} --> {}", node(i));
        }
        for &d in &s.waits_for {
            let _ = writeln!(out, "  {} --> {}", node(d), node(i));
        }
    }
    for i in 0..r.steps.len() {
        if !r.steps.iter().any(|s| s.waits_for.contains(&i)) {
            let _ = writeln!(out, "  {} --> {end}", node(i));
        }
    }
    if r.steps.is_empty() {
        let _ = writeln!(out, "  {start} --> {end}");
    }
    let class = |out: &mut String, name: &str, members: Vec<String>| {
        if !members.is_empty() {
            let _ = writeln!(out, "  class {} {name}", members.join(","));
        }
    };
    class(
        out,
        "critical",
        r.critical.iter().map(|&i| node(i)).collect(),
    );
    let optional = (0..r.steps.len()).filter(|&i| r.steps[i].optional);
    class(out, "optional", optional.map(node).collect());
}

/// A step's node text: name, kind, timeout, and what makes it conditional or optional.
fn label(s: &StepExplain) -> String {
    let mut lines = vec![format!("<b>{}</b>", escape(&s.name))];
    let kind = &s.work.label;
    lines.push(escape(kind));
    if let Some(t) = s.timeout {
        let mut t = format!("timeout {}", fmt_dur(t.value));
        if let StepIo::Keyed {
            window: Some(w), ..
        } = s.work.io
        {
            let _ = write!(t, " + window {}", fmt_dur(w));
        }
        lines.push(t);
    }
    let mut flags = Vec::new();
    if s.conditional {
        flags.push("when".to_string());
    }
    if let Some(c) = s.for_each {
        flags.push(match s.work.io {
            StepIo::Calls { .. } => format!("for_each ×{c}"),
            _ => "for_each".to_string(),
        });
    }
    if s.optional {
        flags.push("optional".to_string());
    }
    if !flags.is_empty() {
        lines.push(flags.join(" · "));
    }
    lines.join("<br/>")
}

/// Text safe inside a quoted Mermaid label.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '#' => out.push_str("#35;"),
            c => out.push(c),
        }
    }
    out
}
