//! The PostgreSQL protocol's metric families: its pools (connections, waiters, waits, refusals,
//! cancellations, rows, SQL errors by SQLSTATE class) and its `sql` steps' rows and errors.

use MetricType::{Counter, Gauge};
use fanout_protocol::Scope;
use fanout_protocol::metrics::{MetricType, Out, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Database pools (`protocol: postgres` backends): connections, waiters, waits, refusals,
/// cancellations, rows and SQL errors by SQLSTATE class — every series from the start.
/// A step's rows and its SQL errors by class.
type StepSums = (u64, Vec<(&'static str, u64)>);

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
    )?;
    // Per step, summed over the routes that have a step of that name on that database (the
    // labels of the other per-step families).
    let mut steps: BTreeMap<(&str, &str), StepSums> = BTreeMap::new();
    for (s, stats) in live.steps.iter().filter_map(|s| {
        let stats = s.stats.downcast_ref::<fanout_flow::sqlstats::SqlStats>()?;
        Some((s, stats))
    }) {
        let e = steps
            .entry((&*s.backend, &*s.step))
            .or_insert_with(|| (0, Vec::new()));
        e.0 += stats.rows();
        let errors = stats.errors().by_class();
        if e.1.is_empty() {
            e.1 = errors;
        } else {
            for (sum, (_, n)) in e.1.iter_mut().zip(errors) {
                sum.1 += n;
            }
        }
    }
    out.family(
        "fanout_db_step_rows",
        "Rows received by each sql step (a cached or shared answer counts for every step it reaches)",
        Counter,
        steps.iter().map(|((b, s), (rows, _))| {
            ([("backend", *b), ("step", *s)], Value::Counter(*rows))
        }),
    )?;
    out.family(
        "fanout_db_step_errors",
        "SQL errors received by each sql step, by SQLSTATE class",
        Counter,
        steps.iter().flat_map(|((b, s), (_, errors))| {
            errors.iter().map(move |(class, n)| {
                (
                    [("backend", *b), ("step", *s), ("class", *class)],
                    Value::Counter(*n),
                )
            })
        }),
    )
}
