//! Counters of a running stub: per route (requests, completions, concurrency, aborts, faults
//! fired, and the overshoot of its sleeps) and per service (connections). Tests prove
//! concurrency and cancellation through them; the load lab proves through the overshoot that
//! the stub was not the bottleneck.
//!
//! Everything on the request path is an atomic add, except the overshoot: an HdrHistogram per
//! route *and per shard*, the shard picked by the recording thread, so threads rarely meet on a
//! lock (held only for the `record` call). Reads merge the shards.

use crate::config::FAULT_KINDS;
use hdrhistogram::Histogram;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Significant digits of the overshoot histograms (1 % resolution).
const OVERSHOOT_SIGFIG: u8 = 2;

/// Most shards per route histogram.
const MAX_SHARDS: usize = 16;

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, assigned round-robin on first use.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Relaxed);
}

/// Overshoot (actual minus requested sleep, in µs) of one route, sharded by thread.
#[derive(Debug)]
pub(crate) struct Overshoot {
    /// Created on the first record, so routes that never sleep cost no histogram.
    shards: Box<[Mutex<Option<Histogram<u64>>>]>,
}

impl Default for Overshoot {
    fn default() -> Self {
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .clamp(1, MAX_SHARDS);
        Overshoot {
            shards: (0..n).map(|_| Mutex::new(None)).collect(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Overshoot percentiles of one route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OvershootSummary {
    pub(crate) count: u64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) max_us: u64,
}

impl Overshoot {
    pub(crate) fn record(&self, overshoot: Duration) {
        let us = u64::try_from(overshoot.as_micros()).unwrap_or(u64::MAX);
        let i = SHARD.with(|s| *s) % self.shards.len().max(1);
        let Some(shard) = self.shards.get(i) else {
            return;
        };
        let mut h = lock(shard);
        if h.is_none() {
            // Auto-resizing: grows to the largest value seen. Creation cannot fail for a
            // valid sigfig; if it did, the sample is dropped.
            *h = Histogram::new(OVERSHOOT_SIGFIG).ok();
        }
        if let Some(h) = h.as_mut()
            && h.record(us).is_err()
        {
            // Beyond what the histogram can grow to: count it at its highest value.
            h.saturating_record(us);
        }
    }

    pub(crate) fn summary(&self) -> OvershootSummary {
        let mut total: Option<Histogram<u64>> = None;
        for shard in &*self.shards {
            let h = lock(shard);
            let Some(h) = h.as_ref() else { continue };
            match &mut total {
                None => total = Some(h.clone()),
                Some(t) => {
                    if let Err(e) = t.add(h) {
                        tracing::debug!(error = %e, "cannot merge overshoot histograms");
                    }
                }
            }
        }
        match total {
            Some(h) if !h.is_empty() => OvershootSummary {
                count: h.len(),
                p50_us: h.value_at_quantile(0.5),
                p99_us: h.value_at_quantile(0.99),
                max_us: h.max(),
            },
            _ => OvershootSummary::default(),
        }
    }

    fn reset(&self) {
        for shard in &*self.shards {
            if let Some(h) = lock(shard).as_mut() {
                h.reset();
            }
        }
    }
}

/// Live counters of one route.
#[derive(Debug, Default)]
pub(crate) struct RouteCounters {
    requests: AtomicU64,
    completed: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    aborted: AtomicU64,
    /// Faults fired, by kind (index into [`FAULT_KINDS`]).
    faults: [AtomicU64; FAULT_KINDS.len()],
    overshoot: Overshoot,
    /// Event streams (`sse:` routes), open and left by the client.
    pub(crate) streams: std::sync::Arc<crate::events::StreamCounters>,
}

impl RouteCounters {
    /// Count a request as started; the guard counts it as completed or aborted.
    pub(crate) fn start(&self) -> RequestGuard<'_> {
        self.requests.fetch_add(1, Relaxed);
        let now = self.in_flight.fetch_add(1, Relaxed) + 1;
        self.max_in_flight.fetch_max(now, Relaxed);
        RequestGuard {
            counters: self,
            done: false,
        }
    }

    /// Count a fault of kind `kind` (index into [`FAULT_KINDS`]) as fired.
    pub(crate) fn fault_fired(&self, kind: usize) {
        if let Some(c) = self.faults.get(kind) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Record how much later than requested a sleep ended.
    pub(crate) fn record_overshoot(&self, overshoot: Duration) {
        self.overshoot.record(overshoot);
    }

    pub(crate) fn snapshot(&self) -> RouteStats {
        let o = self.overshoot.summary();
        RouteStats {
            requests: self.requests.load(Relaxed),
            completed: self.completed.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            max_in_flight: self.max_in_flight.load(Relaxed),
            aborted: self.aborted.load(Relaxed),
            overshoot_count: o.count,
            overshoot_p50_us: o.p50_us,
            overshoot_p99_us: o.p99_us,
            overshoot_max_us: o.max_us,
            faults: FaultCounts::from_array(self.faults.each_ref().map(|c| c.load(Relaxed))),
            streams_open: self.streams.open.load(Relaxed),
            streams_left: self.streams.left.load(Relaxed),
        }
    }

    /// Zero the totals; `in_flight` is a gauge and stays, `max_in_flight` restarts from it.
    pub(crate) fn reset(&self) {
        self.requests.store(0, Relaxed);
        self.completed.store(0, Relaxed);
        self.aborted.store(0, Relaxed);
        self.streams.left.store(0, Relaxed);
        for c in &self.faults {
            c.store(0, Relaxed);
        }
        self.overshoot.reset();
        self.max_in_flight
            .store(self.in_flight.load(Relaxed), Relaxed);
    }
}

/// Held by a request handler: on drop, leaves `in_flight` and counts the request as completed
/// (after [`RequestGuard::complete`]) or aborted (the handler future was dropped midway).
pub(crate) struct RequestGuard<'a> {
    counters: &'a RouteCounters,
    done: bool,
}

impl RequestGuard<'_> {
    /// The handler produced its response.
    pub(crate) fn complete(mut self) {
        self.done = true;
    }
}

impl Drop for RequestGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            self.counters.completed.fetch_add(1, Relaxed);
        } else {
            self.counters.aborted.fetch_add(1, Relaxed);
        }
        self.counters.in_flight.fetch_sub(1, Relaxed);
    }
}

/// Live connection counters of one service.
#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    open: AtomicU64,
    total: AtomicU64,
}

impl ConnCounters {
    /// Count a new connection; it stays open until the guard drops.
    pub(crate) fn open(&self) -> ConnGuard<'_> {
        self.total.fetch_add(1, Relaxed);
        self.open.fetch_add(1, Relaxed);
        ConnGuard(self)
    }
    pub(crate) fn open_now(&self) -> u64 {
        self.open.load(Relaxed)
    }
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }
    pub(crate) fn reset(&self) {
        self.total.store(0, Relaxed);
    }
}

/// Counts a connection as open while alive.
pub(crate) struct ConnGuard<'a>(&'a ConnCounters);

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// A snapshot of one route's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteStats {
    /// Requests that reached the route (started).
    pub requests: u64,
    /// Requests answered (the handler returned a response).
    pub completed: u64,
    /// Requests being handled now.
    pub in_flight: u64,
    /// Highest `in_flight` seen since start or the last reset.
    pub max_in_flight: u64,
    /// Requests whose handler was dropped before it finished (the client went away).
    pub aborted: u64,
    /// Sleeps measured for the overshoot percentiles (requests with a non-zero delay that
    /// reached the end of their sleep).
    #[serde(default)]
    pub overshoot_count: u64,
    /// Median overshoot in µs: how much later than requested a sleep ended (the timer's
    /// granularity — 1 ms for tokio — plus scheduling delay).
    #[serde(default)]
    pub overshoot_p50_us: u64,
    /// 99th percentile of the overshoot, µs.
    #[serde(default)]
    pub overshoot_p99_us: u64,
    /// Largest overshoot, µs.
    #[serde(default)]
    pub overshoot_max_us: u64,
    /// Faults fired, by kind.
    #[serde(default)]
    pub faults: FaultCounts,
    /// Event streams (`sse:` routes) being sent now.
    #[serde(default)]
    pub streams_open: u64,
    /// Event streams the client left before their end (a held stream always ends so).
    #[serde(default)]
    pub streams_left: u64,
}

/// Faults fired on a route, by kind (serialized as `{"status": n, "reset": n, ...}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultCounts {
    /// `status` faults.
    pub status: u64,
    /// `reset` faults.
    pub reset: u64,
    /// `hang` faults.
    pub hang: u64,
    /// `slow_body` faults.
    pub slow_body: u64,
    /// `malformed` faults.
    pub malformed: u64,
    /// `close_after_headers` faults.
    pub close_after_headers: u64,
    /// `grpc_status` faults.
    pub grpc_status: u64,
}

impl FaultCounts {
    /// From counts in [`FAULT_KINDS`] order.
    fn from_array(c: [u64; FAULT_KINDS.len()]) -> FaultCounts {
        let [
            status,
            reset,
            hang,
            slow_body,
            malformed,
            close_after_headers,
            grpc_status,
        ] = c;
        FaultCounts {
            status,
            reset,
            hang,
            slow_body,
            malformed,
            close_after_headers,
            grpc_status,
        }
    }

    /// The count of fault kind `kind` as named in the config (`"reset"`, ...).
    pub fn get(&self, kind: &str) -> Option<u64> {
        Some(match kind {
            "status" => self.status,
            "reset" => self.reset,
            "hang" => self.hang,
            "slow_body" => self.slow_body,
            "malformed" => self.malformed,
            "close_after_headers" => self.close_after_headers,
            "grpc_status" => self.grpc_status,
            _ => return None,
        })
    }

    /// All faults fired.
    pub fn total(&self) -> u64 {
        self.status
            + self.reset
            + self.hang
            + self.slow_body
            + self.malformed
            + self.close_after_headers
            + self.grpc_status
    }
}

/// A snapshot of one service's counters (what `GET /__stub/stats` returns).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStats {
    /// Connections open now.
    pub connections_open: u64,
    /// Connections accepted since start or the last reset.
    pub connections_total: u64,
    /// Per route, keyed `"METHOD PATH-PATTERN"` (e.g. `"GET /search"`, `"* /any"`; a gRPC
    /// method: `"POST /package.Service/Method"`).
    pub routes: IndexMap<String, RouteStats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_completion_and_abort() {
        let c = RouteCounters::default();
        let a = c.start();
        let b = c.start();
        assert_eq!(c.snapshot().in_flight, 2);
        a.complete();
        drop(b);
        let s = c.snapshot();
        assert_eq!(
            s,
            RouteStats {
                requests: 2,
                completed: 1,
                in_flight: 0,
                max_in_flight: 2,
                aborted: 1,
                ..RouteStats::default()
            }
        );
        let g = c.start();
        c.reset();
        assert_eq!(c.snapshot().max_in_flight, 1);
        g.complete();
        assert_eq!(c.snapshot().completed, 1);
        assert_eq!(c.snapshot().in_flight, 0);
    }

    #[test]
    fn faults_and_overshoot_are_counted_and_reset() {
        let c = RouteCounters::default();
        c.fault_fired(1);
        c.fault_fired(1);
        c.fault_fired(4);
        c.fault_fired(99);
        for us in 1..=100 {
            c.record_overshoot(Duration::from_micros(us * 10));
        }
        std::thread::scope(|s| {
            s.spawn(|| c.record_overshoot(Duration::from_millis(50)));
        });
        let s = c.snapshot();
        assert_eq!(s.faults.total(), 3);
        assert_eq!((s.faults.reset, s.faults.get("malformed")), (2, Some(1)));
        assert_eq!(s.faults.get("nope"), None);
        assert_eq!(s.overshoot_count, 101);
        assert!((490..=520).contains(&s.overshoot_p50_us), "{s:?}");
        assert!((980..=1020).contains(&s.overshoot_p99_us), "{s:?}");
        assert!((49_500..=50_500).contains(&s.overshoot_max_us), "{s:?}");
        c.reset();
        assert_eq!(c.snapshot(), RouteStats::default());
    }
}
