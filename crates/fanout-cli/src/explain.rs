//! `fanout explain`: load and check a config like `fanout validate`, then describe the plan of
//! one route (or every route) as text or Mermaid (`fanout_flow::explain`).

use fanout_config::{Config, ConfigErrors, VarLookup};
use fanout_flow::explain::{self, explain_config_with};
use std::fmt;

/// The output format of `fanout explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Steps by level, timeouts, backend layers, critical path.
    Text,
    /// A Mermaid flowchart (for docs).
    Mermaid,
}

/// Why `fanout explain` printed no plan.
#[derive(Debug)]
pub enum ExplainError {
    /// The config does not load or compile (the same errors as `fanout validate`).
    Config(ConfigErrors),
    /// `--route` names no route of the config.
    UnknownRoute {
        /// What `--route` said.
        spec: String,
        /// The config's routes, one `METHOD /path` a line.
        routes: String,
    },
}

impl fmt::Display for ExplainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExplainError::Config(e) => write!(f, "{e}"),
            ExplainError::UnknownRoute { spec, routes } => write!(
                f,
                "no route `{spec}` in the config; give a path pattern or `METHOD /path`. Routes:\n{}",
                routes.trim_end()
            ),
        }
    }
}

impl std::error::Error for ExplainError {}

/// The plan of the route(s) `route` names (every route when `None`) of the config at `path`.
pub fn explain_file(
    path: &str,
    vars: VarLookup<'_>,
    route: Option<&str>,
    format: Format,
) -> Result<String, ExplainError> {
    explain_file_at(path, vars, route, format, None)
}

/// [`explain_file`], and with `rate` (req/s, text only) Little's law for each route after the
/// plans: see [`littles_law`].
pub fn explain_file_at(
    path: &str,
    vars: VarLookup<'_>,
    route: Option<&str>,
    format: Format,
    rate: Option<f64>,
) -> Result<String, ExplainError> {
    let cfg = Config::from_file(path, vars).map_err(ExplainError::Config)?;
    // Every check the gateway makes at start (backend addresses, routes, …), not only the flows'.
    let gateway = fanout_proxy::Gateway::build(&cfg).map_err(ExplainError::Config)?;
    let protos = fanout_proxy::load_protos(&cfg).map_err(ExplainError::Config)?;
    // The runtimes (the models) as the server opens them (read once; nothing is started).
    let runtimes = fanout_proxy::registry::open_runtimes(&cfg, None)
        .map_err(|e| ExplainError::Config(fanout_config::ConfigErrors(vec![e])))?;
    let kinds = fanout_proxy::registry::STEP_KINDS;
    let mut all =
        explain_config_with(&cfg, kinds, protos, Some(runtimes)).map_err(ExplainError::Config)?;
    // The edge stages each route runs (the routes are in config order).
    for (i, r) in all.routes.iter_mut().enumerate() {
        (r.edge, r.edge_lines) = gateway.edge_stages_of(i);
    }
    let routes = match route {
        None => all.routes.iter().collect(),
        Some(spec) => all.select(spec),
    };
    if routes.is_empty() {
        return Err(ExplainError::UnknownRoute {
            spec: route.unwrap_or_default().to_string(),
            routes: all.route_list(),
        });
    }
    let mut out = match format {
        Format::Text => explain::text(&routes),
        Format::Mermaid => explain::mermaid(&routes),
    };
    if let Some(rate) = rate {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        out.push('\n');
        out.push_str(&littles_law(
            &routes,
            rate,
            cores,
            cfg.server.compute.threads,
            cfg.server.runtime,
        ));
    }
    Ok(out)
}

/// Little's law (requests in flight L = arrival rate λ × time in the system W) for each route at
/// `rate` req/s, the arithmetic HeadHunter's article sized its thread pool with: W is the
/// critical path's worst case (the only latency the config knows: every step on it runs to its
/// timeout), bounded by the deadline; the threads a thread-per-request server needs for L; and
/// the threads fanout runs at any rate (`cores` serving threads — one runtime per core, or the
/// work-stealing runtime's workers — their blocking pools, the compute pool:
/// `compute_threads`, default half the cores).
pub fn littles_law(
    routes: &[&explain::RouteExplain],
    rate: f64,
    cores: usize,
    compute_threads: Option<usize>,
    runtime: fanout_config::RuntimeKind,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Little's law at {rate} req/s: requests in flight L = rate × W, the time a request spends in the gateway"
    );
    let _ = writeln!(
        s,
        "  W assumed: the critical path's worst case above (each step on it runs to its timeout), never more than the deadline;"
    );
    let _ = writeln!(
        s,
        "  the backends' real latencies are not in the config: this L is the most in flight at this rate while calls end by their timeouts (at a measured latency, L = rate × that latency)"
    );
    for r in routes {
        let w = r.worst.min(r.deadline).as_secs_f64();
        let in_flight = (rate * w).ceil();
        let at_deadline = (rate * r.deadline.as_secs_f64()).ceil();
        let _ = writeln!(
            s,
            "  {} {}: W = {} → L = {rate} × {w} s = {in_flight} requests in flight ({at_deadline} if every request ran to the deadline {})",
            r.method,
            r.path,
            fmt_ms(r.worst.min(r.deadline)),
            fmt_ms(r.deadline)
        );
        // Calls that can be in flight at once for one request: the widest level's I/O steps
        // (a `for_each` step: its calls in flight).
        let parallel = r
            .levels
            .iter()
            .map(|lvl| {
                lvl.iter()
                    .filter_map(|&i| r.steps.get(i))
                    .filter(|st| st.backend.is_some())
                    .map(|st| st.for_each.unwrap_or(1))
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            s,
            "    thread per request (HeadHunter's sizing): ≥ {in_flight} request threads, each blocked while its request waits on backends"
        );
        if parallel > 1 {
            let _ = writeln!(
                s,
                "      and with each of its up to {parallel} parallel calls blocking a thread of its own: up to {} call threads more",
                in_flight * parallel as f64
            );
        }
        let compute = compute_threads.unwrap_or((cores / 2).max(1));
        let _ = match runtime {
            fanout_config::RuntimeKind::PerCore => writeln!(
                s,
                "    fanout: the same threads at any rate — {cores} cores, one runtime each (`serve --workers`, default one per core: {cores} here), 1 control thread, ≤ {} blocking, {compute} compute, 1 watchdog",
                4 + 2 * cores
            ),
            fanout_config::RuntimeKind::WorkStealing => writeln!(
                s,
                "    fanout: the same threads at any rate — {cores} workers (`serve --workers`, default one per core: {cores} here), ≤ 4 blocking, {compute} compute, 1 watchdog"
            ),
        };
    }
    s
}

fn fmt_ms(d: std::time::Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms.fract() == 0.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{ms:.1}ms")
    }
}
