//! `GET /metrics`: the per-event families of [`fanout_ops::metrics::Metrics`], then everything read at scrape
//! time from the gateway's existing counters and state (a prometheus-client `Collector`, so it
//! costs nothing between scrapes), then the process. The format is OpenMetrics text 1.0 (what
//! prometheus-client writes: counters' samples end in `_total`, the answer ends with `# EOF`).
//!
//! Every label value the config determines has its sample, zero until something is counted
//! (every backend, cache, batch form, dataset, error code, admission class and reason), so a
//! fresh gateway's `/metrics` has every series a dashboard queries; they are read from the live
//! config, so a reload's removed backends leave with it.

use crate::{Gateway, Live};
use fanout_ops::metrics::process;
use fanout_protocol::metrics::{MetricType, Out, Value};
use fanout_protocol::{AddressStatus, ProtocolClient, Scope};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The `Content-Type` of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a scrape reads asynchronously before [`encode`]: each cache's entry count (after its
/// pending housekeeping), in the order of [`cache_list`].
pub struct Prefetched {
    cache_entries: Vec<u64>,
    /// The config's live part the scrape reads (one, even if a reload happens meanwhile).
    live: Arc<Live>,
}

/// Read the asynchronous part of a scrape of `gw`.
pub async fn prefetch(gw: &Gateway) -> Prefetched {
    let live = gw.live();
    let mut cache_entries = Vec::new();
    for (_, stats) in cache_list(&live) {
        cache_entries.push(stats.entries().await);
    }
    Prefetched {
        cache_entries,
        live,
    }
}

/// The whole `/metrics` text of `gw`. Reads `/proc` (process metrics): call it off the runtime's
/// workers (`spawn_blocking`).
pub fn encode(gw: &Arc<Gateway>, pre: Prefetched) -> Result<String, fmt::Error> {
    let mut out = String::with_capacity(32 * 1024);
    encode_registry(&mut out, gw.metrics.registry())?;
    let mut state = Registry::default();
    state.register_collector(Box::new(State(gw.clone(), pre)));
    encode_registry(&mut out, &state)?;
    encode_eof(&mut out)?;
    Ok(out)
}

/// The scrape-time part of `/metrics` for one gateway.
struct State(Arc<Gateway>, Prefetched);

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("State")
    }
}

impl Collector for State {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut out = Out::new(encoder);
        let gw = &*self.0;
        let live = &*self.1.live;
        errors(gw, live, &mut out)?;
        backends(live, &mut out)?;
        protocols(live, &mut out)?;
        resilience(live, &mut out)?;
        admission(gw, &mut out)?;
        caches(live, &self.1, &mut out)?;
        batches(live, &mut out)?;
        reference(live, &mut out)?;
        runtimes(live, &mut out)?;
        live.stages.metrics(&mut out)?;
        live.pass.metrics(&mut out)?;
        gw.websockets.metrics(&live.websockets, &mut out)?;
        runtime(gw, &mut out)?;
        process_stats(&mut out)
    }
}

use MetricType::{Counter, Gauge};

type L2<'a> = [(&'static str, &'a str); 2];

/// Error answers by code: every code the gateway, the flow and the config answer with, zero
/// until counted, and any other code counted (a code of a step a reload removed).
fn errors(gw: &Gateway, live: &Live, out: &mut Out<'_>) -> fmt::Result {
    let counted = gw.errors.snapshot();
    let mut by_code: BTreeMap<&str, u64> = crate::answer::GATEWAY_CODES
        .into_iter()
        .chain(
            fanout_flow::error_kinds(crate::registry::STEP_KINDS)
                .into_iter()
                // Its code is the config's (`fail`, `on_status`): among `error_codes`.
                .filter(|k| *k != fanout_flow::ErrorKind::Answered)
                .map(|k| k.code()),
        )
        .chain(live.error_codes.iter().map(|c| &**c))
        // The edge stages' refusals.
        .chain(
            gw.registry
                .stages()
                .iter()
                .flat_map(|s| s.codes.iter().copied()),
        )
        .map(|c| (c, 0))
        .collect();
    by_code.extend(counted.iter().map(|(c, n)| (c.as_str(), *n)));
    out.family(
        "fanout_errors",
        "Error answers, by error.code",
        Counter,
        by_code
            .into_iter()
            .map(|(code, n)| ([("code", code)], Value::Counter(n))),
    )?;
    out.single(
        "fanout_panics",
        "Requests answered 500 because their handler panicked",
        Value::Counter(gw.panics.load(std::sync::atomic::Ordering::Relaxed)),
    )
}

/// Backends and their addresses: calls in flight, rotation, ejections.
fn backends(live: &Live, out: &mut Out<'_>) -> fmt::Result {
    let addrs: Vec<(&str, Vec<AddressStatus>)> = live
        .stacks
        .iter()
        .map(|(n, s)| (n.as_str(), s.client.addresses()))
        .collect();
    out.family(
        "fanout_backend_in_flight",
        "Calls on the wire to a backend now (all its addresses)",
        Gauge,
        addrs.iter().map(|(b, a)| {
            let n: u32 = a.iter().map(|a| a.state.in_flight).sum();
            ([("backend", *b)], Value::Gauge(f64::from(n)))
        }),
    )?;
    let per_addr = || {
        addrs
            .iter()
            .flat_map(|(b, a)| a.iter().map(move |a| (*b, a)))
    };
    out.family(
        "fanout_backend_address_up",
        "1 while an address is in rotation, 0 while it is ejected or on probation",
        Gauge,
        per_addr().map(|(b, a)| {
            let up = if a.state.ejected { 0.0 } else { 1.0 };
            (
                [("backend", b), ("address", a.address.as_str())],
                Value::Gauge(up),
            )
        }),
    )?;
    out.family(
        "fanout_outlier_ejections",
        "Times an address was ejected by outlier detection",
        Counter,
        per_addr().map(|(b, a)| {
            (
                [("backend", b), ("address", a.address.as_str())],
                Value::Counter(a.state.ejections),
            )
        }),
    )
}

/// Each protocol's own families ([`fanout_protocol::Registration::metrics`]).
fn protocols(live: &Live, out: &mut Out<'_>) -> fmt::Result {
    let backends: Vec<(&str, &dyn ProtocolClient)> = live
        .stacks
        .iter()
        .map(|(n, s)| (n.as_str(), &*s.client))
        .collect();
    let scope = Scope {
        backends: &backends,
    };
    for p in crate::PROTOCOLS {
        (p.metrics)(&scope, out)?;
    }
    Ok(())
}

/// Breakers, retries, hedges, dedup: a sample for every backend, zero (closed) for backends
/// without the layer.
fn resilience(live: &Live, out: &mut Out<'_>) -> fmt::Result {
    type Read = fn(&crate::stack::StackStats) -> Option<u64>;
    let families: [(&str, &str, MetricType, Read); 7] = [
        (
            "fanout_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open (0 for backends without a breaker)",
            Gauge,
            |s| Some(u64::from(s.breaker.as_ref()?.level())),
        ),
        (
            "fanout_retries",
            "Retry attempts sent (attempts after the first)",
            Counter,
            |s| Some(s.retry.as_ref()?.counters().retries),
        ),
        (
            "fanout_retry_budget_refusals",
            "Retries that were due but refused by the retry budget",
            Counter,
            |s| Some(s.retry.as_ref()?.counters().budget_exhausted),
        ),
        (
            "fanout_hedges",
            "Hedged attempts sent (second copies)",
            Counter,
            |s| Some(s.hedge.as_ref()?.counters().hedges),
        ),
        (
            "fanout_hedges_won",
            "Calls answered by the hedged copy",
            Counter,
            |s| Some(s.hedge.as_ref()?.counters().hedge_wins),
        ),
        (
            "fanout_hedge_budget_refusals",
            "Hedges that were due but refused by the hedge budget",
            Counter,
            |s| Some(s.hedge.as_ref()?.counters().budget_exhausted),
        ),
        (
            "fanout_dedup_saved_calls",
            "Calls that joined an identical call in flight instead of being sent",
            Counter,
            |s| Some(s.dedup.as_ref()?.counters().joined),
        ),
    ];
    for (name, help, ty, read) in families {
        let samples = live.stacks.iter().map(|(n, s)| {
            let v = read(s).unwrap_or(0);
            let v = match ty {
                Gauge => Value::Gauge(v as f64),
                _ => Value::Counter(v),
            };
            ([("backend", n.as_str())], v)
        });
        out.family(name, help, ty, samples)?;
    }
    Ok(())
}

/// Admission control by priority class, and client connections.
fn admission(gw: &Gateway, out: &mut Out<'_>) -> fmt::Result {
    let classes = gw.admission.classes();
    let gauge = |f: fn(&fanout_transport::admission::ClassStatus) -> u64| {
        classes
            .iter()
            .map(move |c| ([("class", c.name)], Value::Gauge(f(c) as f64)))
    };
    out.family(
        "fanout_admission_limit",
        "Requests of a priority class that may run at once under the current limit",
        Gauge,
        gauge(|c| c.limit),
    )?;
    out.family(
        "fanout_admission_in_flight",
        "Admitted requests running now",
        Gauge,
        gauge(|c| c.in_flight),
    )?;
    out.family(
        "fanout_admission_queue_length",
        "Requests waiting in the admission queue now",
        Gauge,
        gauge(|c| c.queued),
    )?;
    out.family(
        "fanout_admission_rejections",
        "Requests rejected by admission control (503), by class and reason",
        Counter,
        classes.iter().flat_map(|c| {
            fanout_transport::admission::REASON_NAMES
                .iter()
                .zip(c.rejected)
                .map(|(r, n)| ([("class", c.name), ("reason", *r)], Value::Counter(n)))
        }),
    )?;
    out.single(
        "fanout_connections_open",
        "Client connections open now",
        Value::Gauge(gw.conns.open() as f64),
    )?;
    out.single(
        "fanout_connections_refused",
        "Client connections closed at once at the connection cap",
        Value::Counter(gw.conns.refused()),
    )
}

/// Every cache with its `cache` label: answer caches by the backend's name, per-key caches of
/// batch forms as `BACKEND:keys`.
fn cache_list(live: &Live) -> Vec<(String, &fanout_layers::cache::CacheStats)> {
    let mut all: Vec<(String, &fanout_layers::cache::CacheStats)> = Vec::new();
    for (n, answers, keys) in &live.caches {
        all.push((n.clone(), answers));
        if let Some(k) = keys {
            all.push((format!("{n}:keys"), k));
        }
    }
    all
}

/// Cache lookups and entries.
fn caches(live: &Live, pre: &Prefetched, out: &mut Out<'_>) -> fmt::Result {
    let all = cache_list(live);
    out.family(
        "fanout_cache_requests",
        "Cache lookups, by cache and result (hit, miss, stale)",
        Counter,
        all.iter().flat_map(|(n, s)| {
            let c = s.counters();
            [
                ("hit", c.hits),
                ("miss", c.misses),
                ("stale", c.stale_served),
            ]
            .map(|(r, v)| ([("cache", n.as_str()), ("result", r)], Value::Counter(v)))
        }),
    )?;
    out.family(
        "fanout_cache_entries",
        "Entries in a cache now (approximate)",
        Gauge,
        all.iter()
            .zip(&pre.cache_entries)
            .map(|((n, _), entries)| ([("cache", n.as_str())], Value::Gauge(*entries as f64))),
    )?;
    // Answer caches only (per-key caches have no L2); zero for caches without one.
    out.family(
        "fanout_cache_l2_requests",
        "Shared (Redis) L2 cache lookups, by cache and result (hit, miss, error, skipped)",
        Counter,
        live.caches.iter().flat_map(|(n, answers, _)| {
            let c = answers.l2_counters();
            [
                ("hit", c.map_or(0, |c| c.hits)),
                ("miss", c.map_or(0, |c| c.misses)),
                ("error", c.map_or(0, |c| c.errors)),
                ("skipped", c.map_or(0, |c| c.skipped)),
            ]
            .map(|(r, v)| ([("cache", n.as_str()), ("result", r)], Value::Counter(v)))
        }),
    )
}

fn batches(live: &Live, out: &mut Out<'_>) -> fmt::Result {
    let mut b: Vec<_> = live.batches.iter().collect();
    b.sort_by(|x, y| x.0.cmp(y.0));
    out.family(
        "fanout_batch_size",
        "Keys per batch call",
        MetricType::Histogram,
        b.iter().map(|(n, p)| {
            (
                [("backend", n.as_str())],
                Value::Histogram(p.stats().sizes()),
            )
        }),
    )?;
    out.family(
        "fanout_batch_saved_calls",
        "Calls saved by batching: keys fetched in a shared call instead of one call each",
        Counter,
        b.iter().map(|(n, p)| {
            (
                [("backend", n.as_str())],
                Value::Counter(p.stats().saved_calls()),
            )
        }),
    )
}

fn reference(live: &Live, out: &mut Out<'_>) -> fmt::Result {
    let status = live.reference.status();
    let now = std::time::SystemTime::now();
    // A dataset never loaded is as old as its config: no copy is younger than that.
    let configured = live.reference.created_at();
    out.family(
        "fanout_reference_age_seconds",
        "Age of the copy of a reference dataset in use (never loaded: time since it was configured)",
        Gauge,
        status.iter().map(|(n, s)| {
            let since = s.loaded_at.unwrap_or(configured);
            let age = now.duration_since(since).unwrap_or_default();
            ([("dataset", &**n)], Value::Gauge(age.as_secs_f64()))
        }),
    )?;
    out.family(
        "fanout_reference_loads",
        "Loads of a reference dataset, by result (ok, error)",
        Counter,
        status.iter().flat_map(|(n, s)| {
            [("ok", s.loads), ("error", s.failures)].map(|(r, v)| -> (L2<'_>, Value) {
                ([("dataset", &**n), ("result", r)], Value::Counter(v))
            })
        }),
    )
}

/// The families of the runtimes step kinds use (the models), as each describes them.
fn runtimes(live: &Live, out: &mut Out<'_>) -> fmt::Result {
    use fanout_flow::runtime::{FamilyKind, Sample};
    let now = std::time::SystemTime::now();
    for r in live.runtimes.iter() {
        for f in r.metrics(now) {
            let ty = match f.kind {
                FamilyKind::Counter => Counter,
                FamilyKind::Gauge => Gauge,
                FamilyKind::Histogram => MetricType::Histogram,
            };
            out.family(
                f.name,
                f.help,
                ty,
                f.samples.into_iter().map(|(labels, v)| {
                    let v = match v {
                        Sample::Counter(n) => Value::Counter(n),
                        Sample::Gauge(g) => Value::Gauge(g),
                        Sample::Histogram(h) => Value::Histogram(h),
                    };
                    (labels, v)
                }),
            )?;
        }
    }
    Ok(())
}

fn runtime(gw: &Gateway, out: &mut Out<'_>) -> fmt::Result {
    let c = &gw.compute;
    out.single(
        "fanout_compute_queue_length",
        "Jobs waiting for a compute pool thread",
        Value::Gauge(c.queued() as f64),
    )?;
    out.single(
        "fanout_compute_run_seconds",
        "Time compute pool jobs ran (large parses, compute: true steps)",
        Value::Histogram(c.run_times()),
    )?;
    out.single(
        "fanout_compute_refused",
        "Compute pool jobs refused because its queue was full (503 overloaded)",
        Value::Counter(c.refused()),
    )?;
    let w = gw.watchdog.get();
    out.single(
        "fanout_runtime_stalls",
        "Times a runtime worker held the CPU without yielding past server.stall_threshold",
        Value::Counter(w.map_or(0, |w| w.stalls())),
    )?;
    out.single(
        "fanout_runtime_cpu_starvations",
        "Times the whole process got no CPU past server.stall_threshold (not a stall)",
        Value::Counter(w.map_or(0, |w| w.starvations())),
    )?;
    out.single(
        "fanout_flow_stalls",
        "Polls of a request's flow that ran past server.stall_threshold (logged with route and step)",
        Value::Counter(fanout_flow::activity::stalls()),
    )
}

/// The standard `process_*` metrics (absent when `/proc` cannot be read).
fn process_stats(out: &mut Out<'_>) -> fmt::Result {
    let Some(p) = process::read() else {
        return Ok(());
    };
    out.single(
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds",
        Value::CounterF(p.cpu_seconds),
    )?;
    out.single(
        "process_resident_memory_bytes",
        "Resident memory size in bytes",
        Value::Gauge(p.resident_bytes),
    )?;
    out.single(
        "process_threads",
        "Number of OS threads in the process",
        Value::Gauge(p.threads),
    )?;
    out.single(
        "process_open_fds",
        "Number of open file descriptors",
        Value::Gauge(p.open_fds),
    )?;
    if let Some(max) = p.max_fds {
        out.single(
            "process_max_fds",
            "Maximum number of open file descriptors",
            Value::Gauge(max),
        )?;
    }
    out.single(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds",
        Value::Gauge(p.start_time),
    )
}
