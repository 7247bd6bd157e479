//! `fanout test --coverage`: every route and branch of the config's flows, and which of them no
//! case went through. The branches are listed from the config (with their FILE:LINE:COL); the
//! gateway records the ones its requests take ([`fanout_flow::coverage`]).

use fanout_config::{Config, Pos, Route, Step};
use fanout_flow::coverage::{Branch, Coverage, Hit};
use std::fmt::Write as _;

/// One route or branch of the config.
#[derive(Debug, Clone)]
pub struct Item {
    /// Where it is in the config.
    pub pos: Pos,
    /// `route GET /x` or `route GET /x, step s`.
    pub node: String,
    /// What went untried when it is not hit: `never run by a case`, `` `when` never false ``.
    pub missing: &'static str,
    /// What a request records when it goes through it.
    pub hit: Hit,
    /// The hit without which this one cannot happen (a step's route, a branch's step): when
    /// that is missing, only it is listed.
    pub within: Option<Hit>,
}

/// Every route and branch of `cfg`, in config order.
pub fn inventory(cfg: &Config) -> Vec<Item> {
    let mut out = Vec::new();
    for (r, route) in cfg.routes.iter().enumerate() {
        let name = route_name(route);
        let route_hit = Hit::Route(r);
        out.push(Item {
            pos: route_pos(route),
            node: format!("route {name}"),
            missing: "never run by a case",
            hit: route_hit,
            within: None,
        });
        for (s, (step_name, step)) in route.flow.iter().enumerate() {
            let node = format!("route {name}, step {}", step_name.value);
            let hit = |branch| Hit::Step {
                route: r,
                step: s,
                branch,
            };
            let ran = hit(Branch::Ran);
            out.push(Item {
                pos: step_name.pos,
                node: node.clone(),
                missing: "never ran",
                hit: ran,
                within: Some(route_hit),
            });
            let mut branch = |pos: Pos, missing: &'static str, b: Branch| {
                out.push(Item {
                    pos,
                    node: node.clone(),
                    missing,
                    hit: hit(b),
                    within: Some(ran),
                });
            };
            for (pos, missing, b) in branches(step, step_name.pos) {
                branch(pos, missing, b);
            }
        }
    }
    out
}

/// A step's branches: (where, what is missing when untried, the branch).
fn branches(step: &Step, at: Pos) -> Vec<(Pos, &'static str, Branch)> {
    let mut out = Vec::new();
    if let Some(when) = &step.when {
        if step.fail.is_some() {
            out.push((when.pos, "`fail` never fired", Branch::When(true)));
            out.push((
                when.pos,
                "`fail` always fired (`when` never false)",
                Branch::When(false),
            ));
        } else {
            out.push((when.pos, "`when` never true", Branch::When(true)));
            out.push((when.pos, "`when` never false", Branch::When(false)));
        }
    }
    if let Some(each) = &step.for_each {
        out.push((
            each.pos,
            "`for_each` never had an element",
            Branch::ForEachEmpty(false),
        ));
        out.push((
            each.pos,
            "`for_each` never empty",
            Branch::ForEachEmpty(true),
        ));
    }
    if step.optional {
        out.push((at, "optional: its `default` never used", Branch::Defaulted));
    }
    for pattern in step.on_status.keys() {
        // the text after the pattern is added by `missing_line`
        out.push((pattern.pos, "", Branch::OnStatus(pattern.value)));
    }
    out
}

/// `GET /path`, or `grpc package.Service/Method`.
fn route_name(route: &Route) -> String {
    match &route.grpc {
        Some(m) => format!("grpc {}", m.value),
        None => format!(
            "{} {}",
            route.method.value.to_ascii_uppercase(),
            route.path.value
        ),
    }
}

fn route_pos(route: &Route) -> Pos {
    match &route.grpc {
        Some(m) if route.path.pos.line == 0 => m.pos,
        _ => route.path.pos,
    }
}

/// What `--coverage` found: the number of items, and those missed (only the outermost: a route
/// never run stands for its steps' branches).
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Routes and branches in the config.
    pub total: usize,
    /// Of those, exercised by a case.
    pub hit: usize,
    /// `FILE:LINE:COL: route …, step …: … never …`, one per missing item.
    pub missing: Vec<String>,
}

/// Compare the config's `items` with what `cov` recorded. `file` is the config as named to
/// `fanout test`.
pub fn summarize(file: &str, items: &[Item], cov: &Coverage) -> Summary {
    let mut s = Summary {
        total: items.len(),
        ..Summary::default()
    };
    let mut missing = Vec::new();
    for item in items {
        if cov.has(&item.hit) {
            s.hit += 1;
            continue;
        }
        if item.within.is_some_and(|w| !cov.has(&w)) {
            continue; // its route or step is listed instead
        }
        missing.push(item);
    }
    // in file order (a step's `optional` is on its name's line, before its `when`)
    missing.sort_by_key(|i| (i.pos.line, i.pos.col));
    s.missing = missing.iter().map(|i| missing_line(file, i)).collect();
    s
}

fn missing_line(file: &str, item: &Item) -> String {
    let what = match item.hit {
        Hit::Step {
            branch: Branch::OnStatus(p),
            ..
        } => format!("`on_status` {p} never matched"),
        _ => item.missing.to_string(),
    };
    let at = if item.pos.line == 0 {
        file.to_string()
    } else {
        format!("{file}:{}:{}", item.pos.line, item.pos.col)
    };
    format!("{at}: {}: {what}", item.node)
}

/// The lines `fanout test --coverage` prints after the results.
pub fn human(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "coverage: {} of {} branches exercised", s.hit, s.total);
    for m in &s.missing {
        let _ = writeln!(out, "  {m}");
    }
    out
}

/// `--coverage-json`: the same as JSON (`{"total", "exercised", "missing": [lines]}`).
pub fn json(s: &Summary) -> serde_json::Value {
    serde_json::json!({
        "total": s.total,
        "exercised": s.hit,
        "missing": s.missing,
    })
}
