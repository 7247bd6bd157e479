//! The database of a suite whose config reads `${DATABASE_URL}`: a throw-away PostgreSQL
//! database (crate `fanout-pgtemp`) created from the suite's schema SQL, when no URL is given.

use super::run::{Suite, TestError};
use fanout_pgtemp::{PgCluster, PgDatabase};

/// A fresh database with the suite's `schema_sql` run in it; dropped with the handle.
pub(crate) async fn provide(suite: &Suite) -> Result<PgDatabase, TestError> {
    if !PgCluster::available() {
        return Err(TestError::Start(format!(
            "{} reads ${{DATABASE_URL}}: pass --database-url URL, or install PostgreSQL's server \
             binaries (initdb, pg_ctl) for a throw-away database",
            suite.config.display()
        )));
    }
    let schema = match &suite.schema_sql {
        Some(p) => Some((
            p.display().to_string(),
            std::fs::read_to_string(p)
                .map_err(|e| TestError::Start(format!("{}: {e}", p.display())))?,
        )),
        None => None,
    };
    tokio::task::spawn_blocking(move || {
        let db = PgCluster::database()
            .map_err(|e| TestError::Start(format!("a throw-away PostgreSQL database: {e}")))?;
        if let Some((file, sql)) = schema {
            db.psql(&sql)
                .map_err(|e| TestError::Start(format!("{file}: {e}")))?;
        }
        Ok(db)
    })
    .await
    .map_err(|e| TestError::Start(format!("a throw-away PostgreSQL database: {e}")))?
}
