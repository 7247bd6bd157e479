//! The PostgreSQL protocol's metric families: its pools (connections, waiters, waits, refusals,
//! cancellations, rows, SQL errors by SQLSTATE class). Its `sql` steps' rows and errors are
//! the families of their counters' runtime ([`crate::step_stats::StepCounters`]).

use MetricType::{Counter, Gauge};
use fanout_protocol::Scope;
use fanout_protocol::metrics::{MetricType, Out, Value};
use std::fmt;
use std::sync::Arc;

/// Database pools (`protocol: postgres` backends): connections, waiters, waits, refusals,
/// cancellations, rows and SQL errors by SQLSTATE class — every series from the start.
pub(super) fn write(live: &Scope<'_>, out: &mut Out<'_>) -> fmt::Result {
    use std::sync::atomic::Ordering::Relaxed;
    let pools: Vec<(&str, &Arc<super::Pool>)> = live
        .backends
        .iter()
        .filter_map(|(n, client)| {
            let pg = client.as_any().downcast_ref::<super::PgBackend>()?;
            Some((*n, pg.pool()))
        })
        .collect();
    out.family(
        "fanout_db_up",
        "1 while the database is reachable (a connection made and none lost since), else 0",
        Gauge,
        pools.iter().map(|(b, p)| {
            let up = if p.readiness().is_ok() { 1.0 } else { 0.0 };
            ([("backend", *b)], Value::Gauge(up))
        }),
    )?;
    out.family(
        "fanout_db_pool_max_connections",
        "The pool's postgres.max_size",
        Gauge,
        pools.iter().map(|(b, p)| {
            (
                [("backend", *b)],
                Value::Gauge(p.settings().max_size as f64),
            )
        }),
    )?;
    out.family(
        "fanout_db_pool_connections",
        "Open connections of the pool, by state (idle, in_use)",
        Gauge,
        pools.iter().flat_map(|(b, p)| {
            let (open, idle) = (p.open(), p.idle());
            [
                (
                    [("backend", *b), ("state", "idle")],
                    Value::Gauge(idle as f64),
                ),
                (
                    [("backend", *b), ("state", "in_use")],
                    Value::Gauge(open.saturating_sub(idle) as f64),
                ),
            ]
        }),
    )?;
    out.family(
        "fanout_db_pool_waiting",
        "Calls waiting for a connection now",
        Gauge,
        pools
            .iter()
            .map(|(b, p)| ([("backend", *b)], Value::Gauge(p.waiting() as f64))),
    )?;
    out.family(
        "fanout_db_pool_wait_seconds",
        "Time calls waited for a connection (0 when one was free)",
        MetricType::Histogram,
        pools.iter().map(|(b, p)| {
            (
                [("backend", *b)],
                Value::Histogram(p.counters.wait.snapshot()),
            )
        }),
    )?;
    out.family(
        "fanout_db_pool_rejections",
        "Calls refused by the pool: `full` (max_waiters already waiting) or `wait` (no connection in time)",
        Counter,
        pools.iter().flat_map(|(b, p)| {
            [
                (
                    [("backend", *b), ("reason", "full")],
                    Value::Counter(p.counters.rejected_full.load(Relaxed)),
                ),
                (
                    [("backend", *b), ("reason", "wait")],
                    Value::Counter(p.counters.rejected_wait.load(Relaxed)),
                ),
            ]
        }),
    )?;
    out.family(
        "fanout_db_cancellations",
        "Statements cancelled at the server because their call's time ran out or its request went away",
        Counter,
        pools.iter().map(|(b, p)| {
            ([("backend", *b)], Value::Counter(p.counters.cancelled.load(Relaxed)))
        }),
    )?;
    out.family(
        "fanout_db_rows",
        "Rows returned by statements",
        Counter,
        pools.iter().map(|(b, p)| {
            (
                [("backend", *b)],
                Value::Counter(p.counters.rows.load(Relaxed)),
            )
        }),
    )?;
    out.family(
        "fanout_db_errors",
        "SQL errors answered by the database, by SQLSTATE class",
        Counter,
        pools.iter().flat_map(|(b, p)| {
            p.counters
                .errors
                .by_class()
                .into_iter()
                .map(move |(class, n)| ([("backend", *b), ("class", class)], Value::Counter(n)))
        }),
    )
}
