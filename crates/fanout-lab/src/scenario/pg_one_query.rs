//! `pg-one-query`: CPU per request of a one-statement route — fanout's `sql` step against the
//! hand-written hyper + tokio-postgres baseline (`bench/baselines/pg-query`), on a real
//! PostgreSQL with an indexed lookup (the database's cost is small and the same for both), compared
//! interleaved like `hh-vacancies`.

use crate::model::{Database, Mode, Scenario};
use fanout_load::RequestTemplate;

/// The fanout config.
pub const PG_ONE_GATEWAY: &str = include_str!("../scenarios/pg-one-query.yaml");
/// The database: 10 000 users with a primary key.
pub const PG_ONE_SCHEMA: &str = include_str!("../scenarios/pg-one-query.sql");

/// The scenario.
pub(super) fn scenario() -> Scenario {
    Scenario {
        name: "pg-one-query",
        about: "one indexed Postgres lookup per request (GET /users/{id}): fanout's sql step vs the hand-written hyper + tokio-postgres baseline, CPU per request interleaved",
        stubs: "",
        gateway: PG_ONE_GATEWAY,
        // 1000 different users: concurrent requests rarely ask for the same one.
        requests: (1..=1000)
            .map(|i| RequestTemplate::get(format!("/users/{i}")))
            .collect(),
        mode: Mode::Compare,
        slo_p99_ms: 50.0,
        critical_path: vec![],
        variants: vec![],
        baselines: &["pg-baseline"],
        default_targets: &["fanout", "pg-baseline"],
        grpc: None,
        database: Some(Database {
            schema: PG_ONE_SCHEMA,
        }),
    }
}
