//! Counters of a running stub: per route (requests, completions, concurrency, aborts) and per
//! service (connections). Tests prove concurrency and cancellation through them.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters of one route.
#[derive(Debug, Default)]
pub(crate) struct RouteCounters {
    requests: AtomicU64,
    completed: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    aborted: AtomicU64,
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

    pub(crate) fn snapshot(&self) -> RouteStats {
        RouteStats {
            requests: self.requests.load(Relaxed),
            completed: self.completed.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            max_in_flight: self.max_in_flight.load(Relaxed),
            aborted: self.aborted.load(Relaxed),
        }
    }

    /// Zero the totals; `in_flight` is a gauge and stays, `max_in_flight` restarts from it.
    pub(crate) fn reset(&self) {
        self.requests.store(0, Relaxed);
        self.completed.store(0, Relaxed);
        self.aborted.store(0, Relaxed);
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
}

/// A snapshot of one service's counters (what `GET /__stub/stats` returns).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStats {
    /// Connections open now.
    pub connections_open: u64,
    /// Connections accepted since start or the last reset.
    pub connections_total: u64,
    /// Per route, keyed `"METHOD PATH-PATTERN"` (e.g. `"GET /search"`, `"* /any"`).
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
                aborted: 1
            }
        );
        let g = c.start();
        c.reset();
        assert_eq!(c.snapshot().max_in_flight, 1);
        g.complete();
        assert_eq!(c.snapshot().completed, 1);
        assert_eq!(c.snapshot().in_flight, 0);
    }
}
