//! Built-in scenarios: the examples' flows under load, compared across targets.
//!
//! This file holds the list of built-in scenarios (what each is made of, `Scenario` and `Mode`,
//! is in the leaf `crate::model`). Each scenario has its own module: its definition, and the
//! acceptance criteria it checks on a run, if any (`overload.rs`, `slow_backend.rs`,
//! `hedging.rs`, which the mode's `Measure` implementation adds to the report). Their
//! configs are in `../scenarios/` and `../variants/`. A gRPC scenario (`grpc_aggregate.rs`)
//! carries its `.proto` files and messages in [`Grpc`]: its requests are built once the files
//! are written next to the configs ([`Scenario::prepare`]).

mod antispam_models;
mod grpc_aggregate;
pub(crate) mod hedging;
mod hh_pools;
mod hh_vacancies;
mod n_plus_one;
pub(crate) mod overload;
mod parallel_calls;
mod pg_one_query;
mod pool_overload;
mod product_page;
mod product_page_merging;
pub(crate) mod slow_backend;

pub use antispam_models::{ANTISPAM_GATEWAY, ANTISPAM_PROTO};
pub use grpc_aggregate::{GRPC_GATEWAY, GRPC_PROTO, GRPC_STUBS};
pub use hedging::{HEDGE_OFF, HEDGE_ON, HEDGE_STUBS};
pub use hh_pools::{POOL_TARGETS, POOLS_GATEWAY};
pub use n_plus_one::{
    N_PLUS_ONE_GATEWAY, N_PLUS_ONE_STUBS, coalescing_config, distinct_requests, identical_requests,
};
pub use overload::{OVERLOAD_GATEWAY, OVERLOAD_STUBS};
pub use parallel_calls::{CALLS, PARALLEL_GATEWAY, PARALLEL_STUBS};
pub use pg_one_query::{PG_ONE_GATEWAY, PG_ONE_SCHEMA};
pub use pool_overload::{POOL_GATEWAY, POOL_SCHEMA};
pub use slow_backend::{SLOW_GATEWAY, SLOW_STUBS, slow_backend_phases};

// What a scenario is made of lives in the leaf `crate::model` (the report reads it too).
pub use crate::model::{
    ARTICLE, ArticleRow, ClosedLoop, Database, Grpc, Mode, Models, Pools, RouteLoad, Scenario,
    SlowBackend, article_row, pools_phases,
};
use fanout_load::RequestTemplate;
use std::path::{Path, PathBuf};

impl Scenario {
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
pub const OWN_ENTRY: [&str; 2] = ["threads", "seeds"];

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

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_load::Protocol;

    #[test]
    fn the_own_entries_are_those_modules_names() {
        assert_eq!(OWN_ENTRY, [crate::threads::NAME, crate::seeds::NAME]);
    }

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
                        || crate::targets::pool_target_available(&s, t)
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
