//! The database of a suite whose config reads `${DATABASE_URL}`: a throw-away PostgreSQL
//! database (crate `fanout-pgtemp`) created from the suite's schema SQL, when no URL is given.

use fanout_pgtemp::{PgCluster, PgDatabase};
use std::path::Path;

/// A fresh database with `schema_sql` run in it, for the config `config`; dropped with the
/// handle. The error says why, for the user.
pub(crate) async fn provide(
    config: &Path,
    schema_sql: Option<&Path>,
) -> Result<PgDatabase, String> {
    if !PgCluster::available() {
        return Err(format!(
            "{} reads ${{DATABASE_URL}}: pass --database-url URL, or install PostgreSQL's server \
             binaries (initdb, pg_ctl) for a throw-away database",
            config.display()
        ));
    }
    let schema_sql = schema_sql.map(Path::to_path_buf);
    tokio::task::spawn_blocking(move || {
        let schema = match schema_sql {
            Some(p) => Some((
                p.display().to_string(),
                std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?,
            )),
            None => None,
        };
        let db =
            PgCluster::database().map_err(|e| format!("a throw-away PostgreSQL database: {e}"))?;
        if let Some((file, sql)) = schema {
            db.psql(&sql).map_err(|e| format!("{file}: {e}"))?;
        }
        Ok(db)
    })
    .await
    .map_err(|e| format!("a throw-away PostgreSQL database: {e}"))?
}
