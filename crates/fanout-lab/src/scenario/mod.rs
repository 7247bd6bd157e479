//! Built-in scenarios: the examples' flows under load, compared across targets.
//!
//! This file holds what every scenario is made of (`Scenario`, `Mode`), the list of built-in
//! ones and the one interface through which the report asks what a scenario accepts
//! (`Mode::acceptance`). Each scenario has its own module: its definition, and the acceptance
//! criteria it checks on a run, if any (`overload.rs`, `slow_backend.rs`, `hedging.rs`). Their
//! configs are in `../scenarios/` and `../variants/`. A gRPC scenario (`grpc_aggregate.rs`)
//! carries its `.proto` files and messages in [`Grpc`]: its requests are built once the files
//! are written next to the configs ([`Scenario::prepare`]).

mod antispam_models;
mod grpc_aggregate;
mod hedging;
mod hh_pools;
mod hh_vacancies;
mod n_plus_one;
mod overload;
mod parallel_calls;
mod pg_one_query;
mod pool_overload;
mod product_page;
mod product_page_merging;
mod slow_backend;

pub use antispam_models::{ANTISPAM_GATEWAY, ANTISPAM_PROTO};
pub use grpc_aggregate::{GRPC_GATEWAY, GRPC_PROTO, GRPC_STUBS};
pub use hedging::{HEDGE_OFF, HEDGE_ON, HEDGE_STUBS};
pub use hh_pools::{POOL_TARGETS, POOLS_GATEWAY, pools_phases};
pub use n_plus_one::{
    N_PLUS_ONE_GATEWAY, N_PLUS_ONE_STUBS, coalescing_config, distinct_requests, identical_requests,
};
pub use overload::{OVERLOAD_GATEWAY, OVERLOAD_STUBS};
pub use parallel_calls::{
    ARTICLE, ArticleRow, CALLS, PARALLEL_GATEWAY, PARALLEL_STUBS, article_row,
};
pub use pg_one_query::{PG_ONE_GATEWAY, PG_ONE_SCHEMA};
pub use pool_overload::{POOL_GATEWAY, POOL_SCHEMA};
pub use slow_backend::{SLOW_GATEWAY, SLOW_STUBS, slow_backend_phases};

use crate::report::{Acceptance, TargetSummary};
use fanout_load::{Protocol, RequestTemplate};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a scenario measures.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Capacity search per target, then interleaved fixed-rate trials at fractions of capacity.
    Compare,
    /// [`Mode::Compare`], plus an interleaved trial per target and round at a fixed offered
    /// `rate` (phase `fixed-rate`) before the two levels (`--quick`: at most the 80 % level).
    CompareAt {
        /// Offered rate, req/s.
        rate: f64,
    },
    /// Capacity search, then one continuous run per target: 0.5× of its capacity, a ramp to 3×,
    /// 3×, then `tail`× — goodput, rejections, accepted latency per phase and time to recover.
    Overload {
        /// The rate of the last phase, as a fraction of capacity (0.7 for `overload`, 0.5 for
        /// `pool-overload`: back to where it started).
        tail: f64,
        /// Seconds after the drop within which full service must be back (acceptance).
        recover_s: f64,
    },
    /// Capacity search, then fixed rate (half of capacity) over several routes at once while one
    /// stub route is normal, `factor`× slower, failing (503), normal again.
    SlowBackend(SlowBackend),
    /// No capacity search: interleaved fixed-rate trials (ABBA) of every target at `rate`;
    /// reports p50/p99/p99.9 and backend calls per request.
    Hedging {
        /// Offered rate, req/s.
        rate: f64,
    },
    /// No capacity search, no open-model load: `clients` closed-loop clients per cell (each sends
    /// its next request when the previous answer arrived, on its own keep-alive connection), for
    /// every route × client count × target, interleaved (ABBA across targets) over rounds; mean
    /// ms per operation ± error, percentiles, CPU per operation, threads, RSS.
    ClosedLoop(ClosedLoop),
    /// Models swapped while they serve (`antispam-models`): a capacity search per target (the
    /// SLO is p99 < 10 ms), then interleaved fixed-rate trials at the baseline's capacity and at
    /// half and all of fanout's; a model file replaced every `swap_every_s` the whole time;
    /// `connections` client connections opened before every trial (see `crate::antispam`).
    Models(Models),
    /// One fixed rate for every target (`hh-pools`), no capacity search: interleaved trials
    /// (ABBA) of every target with the stub route healthy, then `factor`× slower; /proc sampled
    /// during each trial (threads and RSS at their peak), and after each trial the lab waits
    /// until the target's backend calls stop (a queue left behind drains before the next trial).
    Pools(Pools),
}

/// The `hh-pools` mode (see [`Mode::Pools`]).
#[derive(Debug, Clone, Copy)]
pub struct Pools {
    /// Stub service that becomes slower.
    pub service: &'static str,
    /// Route key at that stub (`GET /vacancies/{id}`).
    pub route: &'static str,
    /// Its normal latency, ms.
    pub base_ms: f64,
    /// Slowdown factor of the `slow` phase.
    pub factor: f64,
    /// Offered rate of every trial, req/s.
    pub rate: f64,
}

/// The `antispam-models` mode (see [`Mode::Models`]).
#[derive(Debug, Clone, Copy)]
pub struct Models {
    /// Seconds between two replacements of the swapped model's file.
    pub swap_every_s: f64,
    /// The same with `--quick` (a short run still sees swaps).
    pub quick_swap_every_s: f64,
    /// Client connections (gRPC), opened before every trial and used in turn.
    pub connections: usize,
}

/// The closed-loop mode (`parallel-calls`): the routes driven and how many clients drive them.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    /// (name, path) of each route, `GET`.
    pub routes: &'static [(&'static str, &'static str)],
    /// Client counts, one cell each.
    pub clients: &'static [usize],
    /// Stub calls every operation makes; an answer is correct when its `count` is this.
    pub calls_per_op: u64,
    /// The stub service the calls go to.
    pub service: &'static str,
    /// One call's path at that service, for the floor the lab measures directly.
    pub call_path: &'static str,
}

/// The `slow-backend` mode: which stub route changes, and the routes measured separately.
#[derive(Debug, Clone)]
pub struct SlowBackend {
    /// Stub service that changes.
    pub service: &'static str,
    /// Route key at that stub (`GET /reviews/{id}`).
    pub route: &'static str,
    /// Its normal latency, ms.
    pub base_ms: f64,
    /// Slowdown factor of the `slow` phase.
    pub factor: f64,
    /// The gateway routes, each driven by its own generator at the same time.
    pub routes: Vec<RouteLoad>,
}

/// One gateway route under load, measured on its own.
#[derive(Debug, Clone)]
pub struct RouteLoad {
    /// Short name (`A`, `B`).
    pub name: &'static str,
    /// What it calls.
    pub about: &'static str,
    /// Requests sent (round robin).
    pub requests: Vec<RequestTemplate>,
    /// The route's deadline, ms.
    pub deadline_ms: f64,
    /// Whether the route calls the stub route that changes.
    pub uses_changed: bool,
}

/// A scenario: stubs, the gateway config, the requests and what to measure.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name on the command line.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// `fanout stub` config (addresses as `${NAME_ADDR}`).
    pub stubs: &'static str,
    /// `fanout serve` config.
    pub gateway: &'static str,
    /// Requests sent (round robin).
    pub requests: Vec<RequestTemplate>,
    /// What to measure.
    pub mode: Mode,
    /// Latency SLO used by the capacity search (p99, ms).
    pub slo_p99_ms: f64,
    /// The stub calls on the flow's critical path, for the "direct" baseline: (service, path).
    pub critical_path: Vec<(&'static str, &'static str)>,
    /// Extra targets: other `fanout serve` configs of the same flow, by name.
    pub variants: Vec<(&'static str, String)>,
    /// The hand-written baselines that serve this scenario's routes: `hyper-baseline` and
    /// `java-threads` implement the examples' two flows (and `java-threads` `pool-overload`'s),
    /// `grpc-baseline` the `grpc-aggregate` flow, `pg-baseline` `pg-one-query`'s; none serve the
    /// others.
    pub baselines: &'static [&'static str],
    /// Targets when none are given.
    pub default_targets: &'static [&'static str],
    /// A gRPC scenario: its requests are unary gRPC calls (`requests` is empty until
    /// [`Scenario::prepare`] builds them from the `.proto` files), sent over h2c.
    pub grpc: Option<Grpc>,
    /// A scenario with a database: the lab starts a PostgreSQL cluster, runs `schema` in it and
    /// gives the targets `DB_URL` and `DB_JDBC_URL`.
    pub database: Option<Database>,
}

/// A scenario's database (see [`Scenario::database`]).
#[derive(Debug, Clone, Copy)]
pub struct Database {
    /// SQL run once in database `postgres` before the targets start: tables and their data.
    pub schema: &'static str,
}

/// What a gRPC scenario needs besides its configs.
#[derive(Debug, Clone)]
pub struct Grpc {
    /// `.proto` files written next to the configs (their `protos: {files: [...]}` name them
    /// relative to the config's directory): (file name, text).
    pub protos: &'static [(&'static str, &'static str)],
    /// The method every request calls, `package.Service/Method`.
    pub method: &'static str,
    /// The request messages as JSON (proto3 JSON mapping), sent round robin.
    pub messages: Vec<String>,
    /// The stub calls on the flow's critical path for the direct baseline, made one after the
    /// other over h2c: (service, `package.Service/Method`, JSON message).
    pub critical_path: Vec<(&'static str, &'static str, &'static str)>,
}

impl Scenario {
    /// How the load generator talks to the targets: gRPC (h2c) for a gRPC scenario, else
    /// HTTP/1.1.
    pub fn protocol(&self) -> Protocol {
        if self.grpc.is_some() {
            Protocol::Grpc
        } else {
            Protocol::Http1
        }
    }

    /// The files besides the configs a run writes into its directory: (file name, text).
    pub fn files(&self) -> Vec<(&'static str, &'static str)> {
        self.grpc
            .as_ref()
            .map(|g| g.protos.to_vec())
            .unwrap_or_default()
    }

    /// Write [`Scenario::files`] into `dir` (which exists), and a models scenario's models into
    /// `dir/models/`; returns the paths of the files.
    pub fn write_files(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for (name, text) in self.files() {
            let p = dir.join(name);
            std::fs::write(&p, text)?;
            out.push(p);
        }
        if let Mode::Models(_) = self.mode {
            crate::antispam::write_models(&dir.join("models"))?;
        }
        Ok(out)
    }

    /// Make the scenario ready to run from `dir`, where [`Scenario::write_files`] wrote its
    /// files: a gRPC scenario compiles its `.proto` files and builds its requests (each message
    /// encoded and framed once, by `fanout_load::grpc_request`) and returns the calls of its
    /// direct critical path as (service, request). Nothing to do for an HTTP scenario.
    pub fn prepare(&mut self, dir: &Path) -> Result<Vec<(&'static str, RequestTemplate)>, String> {
        let Some(g) = &self.grpc else {
            return Ok(vec![]);
        };
        let files: Vec<PathBuf> = g.protos.iter().map(|(n, _)| dir.join(n)).collect();
        let at = |e: &dyn std::fmt::Display| format!("scenario {}: {e}", self.name);
        let protos = fanout_load::load_protos(&files, &[dir.to_path_buf()]).map_err(|e| at(&e))?;
        let requests = g
            .messages
            .iter()
            .map(|m| fanout_load::grpc_request(&protos, g.method, m, &[]))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| at(&e))?;
        let direct = g
            .critical_path
            .iter()
            .map(|(svc, method, json)| {
                fanout_load::grpc_request(&protos, method, json, &[]).map(|r| (*svc, r))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| at(&e))?;
        self.requests = requests;
        Ok(direct)
    }
}

/// `GET {path}?id=N` for 64 different ids from `first`, so concurrent requests rarely make
/// identical calls (fanout's in-flight dedup would merge those).
fn id_requests(path: &str, first: u32) -> Vec<RequestTemplate> {
    (first..first + 64)
        .map(|i| RequestTemplate::get(format!("{path}?id={i}")))
        .collect()
}

/// Names of the built-in scenarios.
pub const NAMES: [&str; 14] = [
    "hh-vacancies",
    "hh-pools",
    "product-page",
    "product-page-merging",
    "slow-backend",
    "overload",
    "hedging",
    "grpc-aggregate",
    "pool-overload",
    "pg-one-query",
    "parallel-calls",
    "antispam-models",
    "n-plus-one",
    "n-plus-one-identical",
];

/// Scenarios with their own entry point instead of a [`Scenario`] (no stubs, targets or load):
/// `threads`, HeadHunter's thread benchmark ([`crate::threads::run`]); `seeds`, every seed
/// article's scenarios in turn ([`crate::seeds::run`]).
pub const OWN_ENTRY: [&str; 2] = [crate::threads::NAME, crate::seeds::NAME];

/// Look up a built-in scenario.
pub fn builtin(name: &str) -> Option<Scenario> {
    Some(match name {
        "hh-vacancies" => hh_vacancies::scenario(),
        "hh-pools" => hh_pools::scenario(),
        "product-page-merging" => product_page_merging::scenario(),
        "product-page" => product_page::scenario(),
        "slow-backend" => slow_backend::scenario(),
        "overload" => overload::scenario(),
        "hedging" => hedging::scenario(),
        "grpc-aggregate" => grpc_aggregate::scenario(),
        "pool-overload" => pool_overload::scenario(),
        "pg-one-query" => pg_one_query::scenario(),
        "parallel-calls" => parallel_calls::scenario(),
        "antispam-models" => antispam_models::scenario(),
        "n-plus-one" => n_plus_one::scenario(),
        "n-plus-one-identical" => n_plus_one::identical(),
        _ => return None,
    })
}

/// Every config a scenario writes: (file name, text), stubs first. For tests and `validate`. A
/// gRPC scenario's configs name its `.proto` files ([`Scenario::files`]), which must be written
/// next to them.
pub fn configs(s: &Scenario) -> Vec<(String, String)> {
    let mut out = Vec::new();
    // A scenario without stub services (its backend is a database) has no stubs config.
    if !s.stubs.trim().is_empty() {
        out.push(("stubs.yaml".to_string(), s.stubs.to_string()));
    }
    out.push(("fanout.yaml".to_string(), s.gateway.to_string()));
    for (name, yaml) in &s.variants {
        out.push((format!("{name}.yaml"), yaml.clone()));
    }
    out
}

impl Mode {
    /// The acceptance lines (the product's acceptance criteria) this mode's scenario checks on a
    /// run, for each target in `order`: the `overload`, `slow-backend` and `hedging` scenarios
    /// have some, the comparisons none.
    pub(crate) fn acceptance(
        &self,
        targets: &BTreeMap<String, TargetSummary>,
        order: &[String],
    ) -> Vec<Acceptance> {
        let mut out = Vec::new();
        for name in order {
            let Some(t) = targets.get(name) else { continue };
            match self {
                Mode::Overload { recover_s, .. } => {
                    out.extend(overload::acceptance(name, t, *recover_s))
                }
                Mode::SlowBackend(_) => out.extend(slow_backend::acceptance(name, t)),
                Mode::Hedging { .. } => out.extend(hedging::acceptance(name, t, targets)),
                // Computed with the run's models report (`crate::antispam::acceptance`).
                Mode::Compare
                | Mode::CompareAt { .. }
                | Mode::ClosedLoop(_)
                | Mode::Models(_)
                | Mode::Pools(_) => {}
            }
        }
        out
    }

    /// Reasons this run's acceptance lines may not mean much (an overload phase that did not
    /// overload its target), for the report's warnings.
    pub(crate) fn acceptance_warnings(
        &self,
        targets: &BTreeMap<String, TargetSummary>,
    ) -> Vec<String> {
        match self {
            Mode::Overload { .. } => overload::warnings(targets),
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_is_complete() {
        for name in NAMES {
            let s = builtin(name).unwrap_or_else(|| panic!("{name} is listed but not built in"));
            assert_eq!(s.name, name);
            let mut s = s;
            if s.grpc.is_some() {
                // The requests are built from the `.proto` files written into the run directory.
                assert!(s.requests.is_empty(), "{name}: requests before prepare");
                assert_eq!(s.protocol(), Protocol::Grpc);
                let dir = std::env::temp_dir()
                    .join(format!("fanout-lab-scenario-{name}-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let written = s.write_files(&dir).unwrap();
                assert!(!written.is_empty(), "{name}: .proto files");
                let direct = s.prepare(&dir).unwrap_or_else(|e| panic!("{e}"));
                // A scenario without stubs (the models run in the target) has no direct path.
                assert_eq!(
                    direct.is_empty(),
                    s.stubs.trim().is_empty(),
                    "{name}: direct critical path"
                );
                let _ = std::fs::remove_dir_all(&dir);
                for r in &s.requests {
                    assert_eq!(r.method, http::Method::POST);
                    assert!(r.path.starts_with('/') && r.body.len() > 5, "{name}: {r:?}");
                }
            } else {
                assert_eq!(s.protocol(), Protocol::Http1);
                assert!(s.files().is_empty());
                assert!(s.prepare(Path::new("/nonexistent")).unwrap().is_empty());
            }
            assert!(!s.requests.is_empty(), "{name}: requests");
            assert!(!s.default_targets.is_empty(), "{name}: default targets");
            for t in s.default_targets {
                assert!(
                    *t == "fanout"
                        || (s.baselines.contains(t) && crate::TARGETS.contains(t))
                        || crate::pool_target_available(&s, t)
                        || s.variants.iter().any(|(n, _)| n == t),
                    "{name}: default target {t} is not available"
                );
            }
            for b in s.baselines {
                assert!(crate::TARGETS.contains(b), "{name}: baseline {b}");
            }
            if let Mode::SlowBackend(sb) = &s.mode {
                assert_eq!(slow_backend_phases(sb).len(), 4);
                assert!(sb.routes.iter().any(|r| r.uses_changed));
                assert!(sb.routes.iter().any(|r| !r.uses_changed));
            }
        }
        assert!(builtin("nope").is_none());
    }

    #[test]
    fn grpc_aggregate_stubs_load_with_their_proto() {
        let s = builtin("grpc-aggregate").unwrap();
        let dir = std::env::temp_dir().join(format!("fanout-lab-stubs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        s.write_files(&dir).unwrap();
        let any = |n: &str| n.ends_with("_ADDR").then(|| "127.0.0.1:0".to_string());
        let stubs = fanout_stub::load_in("stubs.yaml", s.stubs, &any, Some(&dir));
        // Without the .proto beside it, the config does not load.
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let without = fanout_stub::load_in("stubs.yaml", s.stubs, &any, Some(&empty));
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<String> = stubs
            .unwrap_or_else(|e| panic!("{e}"))
            .services()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["users", "orders", "recs"]);
        assert!(without.is_err());
    }

    #[test]
    fn grpc_aggregate_sends_64_different_users() {
        let mut s = builtin("grpc-aggregate").unwrap();
        let dir = std::env::temp_dir().join(format!("fanout-lab-grpc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        s.write_files(&dir).unwrap();
        let direct = s.prepare(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(s.requests.len(), 64);
        let bodies: std::collections::BTreeSet<_> = s.requests.iter().map(|r| &r.body).collect();
        assert_eq!(bodies.len(), 64, "every request is another user");
        let r = &s.requests[0];
        assert_eq!(r.path, "/lab.v1.Aggregator/GetPage");
        // PageRequest{user_id: "u1"}: the 5-byte frame prefix, then field 1 (string) = "u1".
        assert_eq!(&r.body[..], b"\0\0\0\0\x04\x0a\x02u1");
        assert_eq!(direct.len(), 1);
        assert_eq!(direct[0].0, "orders");
        assert_eq!(direct[0].1.path, "/lab.v1.Orders/ListOrders");
        assert!(crate::available_targets(&s).contains(&"grpc-baseline".to_string()));
        assert!(!crate::available_targets(&s).contains(&"hyper-baseline".to_string()));
        // A missing .proto file: an error naming the scenario, not a panic.
        let mut s = builtin("grpc-aggregate").unwrap();
        let e = s.prepare(Path::new("/nonexistent-dir")).unwrap_err();
        assert!(
            e.contains("grpc-aggregate") && e.contains("grpc-aggregate.proto"),
            "{e}"
        );
    }
}
