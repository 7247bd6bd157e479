//! Shared calls with a time limit of their own — the one mechanism behind in-flight dedup and
//! cache miss coalescing.
//!
//! A shared call is fixed when it starts: its key (everything the call sends, [`CallKey`]) and
//! its end (start + the starting caller's timeout). After that end it fails with a timeout and is
//! dropped, however many callers still wait on it, so a hung backend cannot keep a hot key
//! wedged by new callers joining the hung call forever. A caller joins a live call only when
//! that call will end within the caller's own time; otherwise it starts a fresh call (which
//! later callers then join).
//!
//! A caller also does not join a call that is already much older than the backend's calls usually
//! take (twice the moving average of finished calls, plus 1 ms): such a call is probably hung,
//! and joining it would turn one slow answer into many failed requests. Without dedup a hung
//! call fails one request; with it, at most the callers of the first moments share its fate.
//!
//! The table holds weak references: when every caller has gone, the call is dropped (its
//! connection closed); a caller that goes away while others wait does not cancel it for them.

use crate::backend::{CallError, CallErrorKind, CallKey, CallResponse};
use futures_util::future::{BoxFuture, FutureExt, Shared, WeakShared};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::Instant;

/// A backend call's future.
pub type Call = BoxFuture<'static, Result<CallResponse, CallError>>;

struct Flight {
    call: WeakShared<Call>,
    /// When the call started.
    started: Instant,
    /// When the call ends at the latest (its own time limit).
    ends: Instant,
}

/// Live shared calls by key.
pub struct Flights {
    table: Mutex<Table>,
    /// How long finished calls took.
    typical: TypicalTime,
    started: AtomicU64,
    joined: AtomicU64,
    expired: AtomicU64,
}

struct Table {
    map: HashMap<CallKey, Flight>,
    /// Size at which finished entries are swept out (grows with the live entries, so sweeping
    /// stays amortised O(1) per call).
    sweep_at: usize,
}

/// Counters of a [`Flights`] table.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct FlightCounters {
    /// Calls started.
    pub started: u64,
    /// Callers that joined a live call instead of starting one.
    pub joined: u64,
    /// Shared calls that reached their own time limit.
    pub expired: u64,
}

/// How long shared work (a call, a request's run) usually takes — a moving average with
/// weight 1/8 — and so how old a live one may be for a newcomer to join it: twice that plus
/// 1 ms (no limit before the first one finished). Used by call dedup and request coalescing.
#[derive(Debug, Default)]
pub struct TypicalTime {
    us: AtomicU64,
}

impl TypicalTime {
    /// The oldest a live run may be to be joined.
    pub fn join_age(&self) -> Duration {
        match self.us.load(Relaxed) {
            0 => Duration::MAX,
            t => Duration::from_micros(t.saturating_mul(2).saturating_add(1000)),
        }
    }

    /// Count one that took `took`.
    pub fn record(&self, took: Duration) {
        let us = (took.as_micros() as u64).max(1);
        let old = self.us.load(Relaxed);
        // Races between two updates lose one sample: harmless.
        let new = if old == 0 { us } else { old - old / 8 + us / 8 };
        self.us.store(new.max(1), Relaxed);
    }
}

impl Default for Flights {
    fn default() -> Self {
        Flights::new()
    }
}

fn live(f: &Flight, now: Instant) -> Option<Shared<Call>> {
    // Only calls still running (and not past their end) are shared.
    if f.ends <= now {
        return None;
    }
    f.call.upgrade().filter(|s| s.peek().is_none())
}

impl Flights {
    /// An empty table.
    pub fn new() -> Flights {
        Flights {
            table: Mutex::new(Table {
                map: HashMap::new(),
                sweep_at: 256,
            }),
            typical: TypicalTime::default(),
            started: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// The counters.
    pub fn counters(&self) -> FlightCounters {
        FlightCounters {
            started: self.started.load(Relaxed),
            joined: self.joined.load(Relaxed),
            expired: self.expired.load(Relaxed),
        }
    }

    /// The answer of the live call for `key` if it ends within `timeout` from now, else of a new
    /// call made by `start`, limited to `timeout` whoever waits on it.
    pub fn run(
        self: &std::sync::Arc<Self>,
        key: CallKey,
        timeout: Duration,
        start: impl FnOnce() -> Call,
    ) -> Shared<Call> {
        self.join_or_start(key, timeout, start).0
    }

    /// [`Flights::run`], also saying whether the caller joined a live call (`true`) or started
    /// one.
    pub fn join_or_start(
        self: &std::sync::Arc<Self>,
        key: CallKey,
        timeout: Duration,
        start: impl FnOnce() -> Call,
    ) -> (Shared<Call>, bool) {
        let now = Instant::now();
        let ends = now + timeout;
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = table.map.get(&key)
            && f.ends <= ends
            && now.saturating_duration_since(f.started) <= self.typical.join_age()
            && let Some(shared) = live(f, now)
        {
            self.joined.fetch_add(1, Relaxed);
            return (shared, true);
        }
        if table.map.len() >= table.sweep_at {
            table.map.retain(|_, f| live(f, now).is_some());
            table.sweep_at = (table.map.len() * 2).max(256);
        }
        self.started.fetch_add(1, Relaxed);
        let call = start();
        let me = std::sync::Arc::downgrade(self);
        let limited: Call = Box::pin(async move {
            match tokio::time::timeout_at(ends, call).await {
                Ok(r) => {
                    if let Some(me) = me.upgrade() {
                        me.typical.record(now.elapsed());
                    }
                    r
                }
                Err(_) => {
                    if let Some(me) = me.upgrade() {
                        me.expired.fetch_add(1, Relaxed);
                    }
                    Err(CallError::new(
                        CallErrorKind::Timeout,
                        format!(
                            "the call did not finish within its time limit ({:.1} ms)",
                            timeout.as_secs_f64() * 1000.0
                        ),
                    ))
                }
            }
        });
        let shared = limited.shared();
        if let Some(call) = shared.downgrade() {
            table.map.insert(
                key,
                Flight {
                    call,
                    started: now,
                    ends,
                },
            );
        }
        (shared, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    fn key(s: &str) -> CallKey {
        let req = crate::backend::CallRequest {
            call: crate::backend::Call::Http(crate::backend::HttpCall {
                method: http::Method::GET,
                path_and_query: s.parse().expect("a test path"),
                headers: Default::default(),
                body: Bytes::new(),
            }),
            timeout: Duration::ZERO,
            deadline: Instant::now(),
            idempotent: true,
            deadline_header: None,
            trace: None,
        };
        req.key()
    }

    fn hanging(calls: &Arc<AtomicUsize>) -> impl FnOnce() -> Call {
        let calls = calls.clone();
        move || {
            calls.fetch_add(1, Relaxed);
            Box::pin(std::future::pending())
        }
    }

    fn answering(calls: &Arc<AtomicUsize>) -> impl FnOnce() -> Call {
        let calls = calls.clone();
        move || {
            calls.fetch_add(1, Relaxed);
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(CallResponse {
                    status: http::StatusCode::OK,
                    body: Bytes::from_static(b"{}"),
                    value: None,
                    parsed: None,
                })
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_shared_call_ends_at_its_own_limit_although_callers_keep_joining() {
        let f = Arc::new(Flights::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let t = Duration::from_millis(100);
        // Callers keep arriving every 10 ms, each with a 100 ms budget; the backend hangs.
        let first = tokio::spawn(f.run(key("/hot"), t, hanging(&calls)));
        let mut joiners = Vec::new();
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            joiners.push(tokio::spawn(f.run(key("/hot"), t, hanging(&calls))));
        }
        // The first call failed at its own limit although callers were still waiting on it.
        let r = first.await.unwrap();
        assert_eq!(r.unwrap_err().kind, CallErrorKind::Timeout);
        // A caller whose budget ends after the live call's end does not join it: each started
        // call serves only callers it can answer in time, so calls are started again and again
        // instead of one call living forever.
        assert!(calls.load(Relaxed) >= 2, "calls: {}", calls.load(Relaxed));
        for j in joiners {
            assert_eq!(j.await.unwrap().unwrap_err().kind, CallErrorKind::Timeout);
        }
        assert!(f.counters().expired >= 2);
        // The backend is back: the next caller starts a fresh call and gets its answer.
        let r = f.run(key("/hot"), t, answering(&calls)).await;
        assert!(r.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn callers_join_a_call_that_ends_within_their_time_and_only_then() {
        let f = Arc::new(Flights::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let a = f.run(key("/k"), Duration::from_millis(100), answering(&calls));
        // Ends within 200 ms: joins.
        let b = f.run(key("/k"), Duration::from_millis(200), answering(&calls));
        // Would end after this caller's 50 ms: a call of its own.
        let c = f.run(key("/k"), Duration::from_millis(50), answering(&calls));
        // Another key: a call of its own.
        let d = f.run(key("/other"), Duration::from_millis(100), answering(&calls));
        let (a, b, c, d) = tokio::join!(a, b, c, d);
        assert!(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
        assert_eq!(calls.load(Relaxed), 3);
        assert_eq!(f.counters().joined, 1);
        // A finished call is not reused.
        f.run(key("/k"), Duration::from_millis(100), answering(&calls))
            .await
            .unwrap();
        assert_eq!(calls.load(Relaxed), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn callers_do_not_join_a_call_far_older_than_calls_usually_take() {
        let f = Arc::new(Flights::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let t = Duration::from_secs(1);
        // Calls usually take 10 ms.
        for _ in 0..3 {
            f.run(key("/k"), t, answering(&calls)).await.unwrap();
        }
        // One hangs: callers in the first moments join it, later ones start their own call.
        let hung = f.run(key("/k"), t, hanging(&calls));
        let early = f.run(key("/k"), t, hanging(&calls));
        assert_eq!(f.counters().joined, 1, "joined while young");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let late = f.run(key("/k"), t, answering(&calls));
        assert!(
            late.await.is_ok(),
            "a caller 50 ms later does not wait for the hung call"
        );
        assert_eq!(f.counters().joined, 1);
        drop((hung, early));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_every_caller_left_is_dropped() {
        let f = Arc::new(Flights::new());
        let dropped = Arc::new(AtomicUsize::new(0));
        struct Guard(Arc<AtomicUsize>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.fetch_add(1, Relaxed);
            }
        }
        let g = Guard(dropped.clone());
        let a = f.run(key("/k"), Duration::from_secs(10), move || {
            Box::pin(async move {
                let _g = g;
                std::future::pending().await
            })
        });
        // Poll once so the call is running, then leave.
        let _ = futures_util::poll!(a.clone());
        drop(a);
        assert_eq!(dropped.load(Relaxed), 1, "the abandoned call was dropped");
    }
}
