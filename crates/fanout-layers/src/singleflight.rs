//! Shared calls with a time limit of their own — the one mechanism behind in-flight dedup and
//! cache miss coalescing.
//!
//! A shared call is fixed when it starts: its key (everything the call sends, [`CallKey`]) and
//! its end (start + the starting caller's timeout). After that end it fails with a timeout and is
//! dropped, however many callers still wait on it, so a hung backend cannot keep a hot key
//! wedged by new callers joining the hung call forever.
//!
//! **Every caller keeps its own time.** A caller joins a live call that ends no earlier than its
//! own time does (it waits until its own end at most, then fails with its own figures), or one
//! that ends earlier but is expected to finish before then (it has at least twice the time
//! finished calls usually take; [`TypicalTime`]). It does not join a call whose end is sooner
//! than it is expected to finish: it starts a call of its own, which takes the key's place in
//! the table, so the callers after it join the longer call — a caller with a short time limit
//! (a client's `x-request-timeout: 100`) can never make the callers with a longer one share its
//! short call. A call never replaces a live, younger-than-hung call that ends later than it. If
//! a joined call still fails at its own, shorter limit, a joiner that has more time left than the
//! whole limit of that call runs the call again (joining or starting a call in the table, with
//! its remaining time): one caller's short time limit never becomes another caller's failure.
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
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
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
    reruns: AtomicU64,
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
    /// Joiners whose shared call ended at its own, shorter limit, and that ran the call again
    /// with the time they still had.
    pub reruns: u64,
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

    /// Whether a run that started at `started` and ends at `ends` at the latest has the time
    /// runs usually take to finish (the join age: twice the typical time plus 1 ms) — so that a
    /// newcomer with more time may join it rather than start a longer one of its own. `true`
    /// before any run finished (nothing is known yet; a joiner whose run is cut short runs again).
    pub fn fits(&self, started: Instant, ends: Instant) -> bool {
        match started.checked_add(self.join_age()) {
            Some(expected) => expected <= ends,
            None => true,
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

/// What [`Flights::enter`] did: started a call, or joined one (handing back the unused start,
/// for a run again).
enum Entered<S> {
    Started(Shared<Call>),
    Joined {
        call: Shared<Call>,
        /// The joined call's whole time limit.
        limit: Duration,
        start: S,
    },
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
            reruns: AtomicU64::new(0),
        }
    }

    /// The counters.
    pub fn counters(&self) -> FlightCounters {
        FlightCounters {
            started: self.started.load(Relaxed),
            joined: self.joined.load(Relaxed),
            expired: self.expired.load(Relaxed),
            reruns: self.reruns.load(Relaxed),
        }
    }

    /// The answer of the live call for `key` that this caller may join (module docs), else of a
    /// new call made by `start(timeout)`, limited to `timeout` whoever waits on it. The caller
    /// waits `timeout` at most either way.
    pub fn run<S>(self: &Arc<Self>, key: CallKey, timeout: Duration, start: S) -> Call
    where
        S: FnOnce(Duration) -> Call + Send + 'static,
    {
        self.join_or_start(key, timeout, start).0
    }

    /// [`Flights::run`], also saying whether the caller joined a live call (`true`) or started
    /// one. `start` is given the time the call may take (`timeout`, or less when a joiner runs
    /// the call again).
    pub fn join_or_start<S>(
        self: &Arc<Self>,
        key: CallKey,
        timeout: Duration,
        start: S,
    ) -> (Call, bool)
    where
        S: FnOnce(Duration) -> Call + Send + 'static,
    {
        let ends = Instant::now() + timeout;
        match self.enter(&key, timeout, start) {
            Entered::Started(call) => (Box::pin(call), false),
            Entered::Joined { call, limit, start } => (
                Box::pin(self.clone().joined(key, ends, call, limit, start)),
                true,
            ),
        }
    }

    /// A joiner's wait: the joined call's answer, within the joiner's own end; when the joined
    /// call ended at its own limit and this caller has more time left than that whole limit,
    /// the call again (joined or started) with the time left.
    async fn joined<S>(
        self: Arc<Self>,
        key: CallKey,
        ends: Instant,
        mut call: Shared<Call>,
        mut limit: Duration,
        mut start: S,
    ) -> Result<CallResponse, CallError>
    where
        S: FnOnce(Duration) -> Call + Send + 'static,
    {
        let began = Instant::now();
        loop {
            let r = match tokio::time::timeout_at(ends, call).await {
                Ok(r) => r,
                Err(_) => return Err(own_limit(began.elapsed())),
            };
            let left = ends.saturating_duration_since(Instant::now());
            match r {
                Err(e) if e.kind == CallErrorKind::Timeout && left > limit => {
                    self.reruns.fetch_add(1, Relaxed);
                    match self.enter(&key, left, start) {
                        Entered::Started(c) => {
                            return tokio::time::timeout_at(ends, c)
                                .await
                                .unwrap_or_else(|_| Err(own_limit(began.elapsed())));
                        }
                        Entered::Joined {
                            call: c,
                            limit: l,
                            start: s,
                        } => (call, limit, start) = (c, l, s),
                    }
                }
                r => return r,
            }
        }
    }

    /// Join the live call of `key` if this caller may (module docs), else start one and put it
    /// in the key's place (unless a live, longer call that is not hung holds it).
    fn enter<S>(self: &Arc<Self>, key: &CallKey, timeout: Duration, start: S) -> Entered<S>
    where
        S: FnOnce(Duration) -> Call + Send + 'static,
    {
        let now = Instant::now();
        let ends = now + timeout;
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut keep = false;
        if let Some(f) = table.map.get(key)
            && now.saturating_duration_since(f.started) <= self.typical.join_age()
            && let Some(shared) = live(f, now)
        {
            if f.ends >= ends || self.typical.fits(f.started, f.ends) {
                self.joined.fetch_add(1, Relaxed);
                return Entered::Joined {
                    call: shared,
                    limit: f.ends.saturating_duration_since(f.started),
                    start,
                };
            }
            // It ends before it is expected to finish, and before this caller's end: a longer
            // call of our own replaces it (a live call ending later is never replaced).
            keep = f.ends > ends;
        }
        if table.map.len() >= table.sweep_at {
            table.map.retain(|_, f| live(f, now).is_some());
            table.sweep_at = (table.map.len() * 2).max(256);
        }
        self.started.fetch_add(1, Relaxed);
        let call = start(timeout);
        let me = Arc::downgrade(self);
        let limited: Call = Box::pin(async move {
            match tokio::time::timeout_at(ends, call).await {
                Ok(r) => {
                    // A call that timed out inside (at the limit it was given) says nothing of
                    // how long calls take.
                    let timed_out = matches!(&r, Err(e) if e.kind == CallErrorKind::Timeout);
                    if !timed_out && let Some(me) = me.upgrade() {
                        me.typical.record(now.elapsed());
                    }
                    r
                }
                Err(_) => {
                    if let Some(me) = me.upgrade() {
                        me.expired.fetch_add(1, Relaxed);
                    }
                    Err(own_limit(timeout))
                }
            }
        });
        let shared = limited.shared();
        if !keep && let Some(call) = shared.downgrade() {
            table.map.insert(
                key.clone(),
                Flight {
                    call,
                    started: now,
                    ends,
                },
            );
        }
        Entered::Started(shared)
    }
}

/// A caller's own time limit passed after `waited`.
fn own_limit(waited: Duration) -> CallError {
    CallError::new(
        CallErrorKind::Timeout,
        format!(
            "the call did not finish within its time limit ({:.1} ms)",
            waited.as_secs_f64() * 1000.0
        ),
    )
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
            trace: None,
        };
        req.key()
    }

    fn hanging(calls: &Arc<AtomicUsize>) -> impl FnOnce(Duration) -> Call + Send + 'static {
        let calls = calls.clone();
        move |_| {
            calls.fetch_add(1, Relaxed);
            Box::pin(std::future::pending())
        }
    }

    fn answering(calls: &Arc<AtomicUsize>) -> impl FnOnce(Duration) -> Call + Send + 'static {
        taking(calls, Duration::from_millis(10))
    }

    /// A backend call that answers after `took`, or fails with a timeout at the limit it was
    /// given when that comes first (as the protocol clients do).
    fn taking(
        calls: &Arc<AtomicUsize>,
        took: Duration,
    ) -> impl FnOnce(Duration) -> Call + Send + 'static {
        let calls = calls.clone();
        move |limit| {
            calls.fetch_add(1, Relaxed);
            Box::pin(async move {
                if took > limit {
                    tokio::time::sleep(limit).await;
                    return Err(own_limit(limit));
                }
                tokio::time::sleep(took).await;
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
    async fn callers_join_a_live_call_and_wait_for_it_within_their_own_time() {
        let f = Arc::new(Flights::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let a = f.run(key("/k"), Duration::from_millis(100), answering(&calls));
        // A longer time: joins (nothing is known of how long calls take yet).
        let b = f.run(key("/k"), Duration::from_millis(200), answering(&calls));
        // A shorter time: joins the longer call and waits for it within its own 50 ms.
        let c = f.run(key("/k"), Duration::from_millis(50), answering(&calls));
        // Another key: a call of its own.
        let d = f.run(key("/other"), Duration::from_millis(100), answering(&calls));
        let (a, b, c, d) = tokio::join!(a, b, c, d);
        assert!(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
        assert_eq!(calls.load(Relaxed), 2);
        assert_eq!(f.counters().joined, 2);
        // A finished call is not reused.
        f.run(key("/k"), Duration::from_millis(100), answering(&calls))
            .await
            .unwrap();
        assert_eq!(calls.load(Relaxed), 3);
    }

    /// The hostile client of issue 46: its short time limit must not become the failure of the
    /// callers that share its call. The backend takes 600 ms.
    #[tokio::test(start_paused = true)]
    async fn a_short_time_limit_never_fails_the_callers_with_a_longer_one() {
        let f = Arc::new(Flights::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let took = Duration::from_millis(600);
        let (short, long) = (Duration::from_millis(100), Duration::from_secs(2));
        // Nothing known of the backend yet: a 2 s caller joins the 100 ms caller's call, which
        // ends at its limit; the joiner, with more time left than that whole limit, runs the
        // call again with its own time and gets the answer.
        let attacker = tokio::spawn(f.run(key("/hot"), short, taking(&calls, took)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let joiner = tokio::spawn(f.run(key("/hot"), long, taking(&calls, took)));
        let e = attacker.await.unwrap().unwrap_err();
        assert_eq!(e.kind, CallErrorKind::Timeout);
        let r = joiner.await.unwrap();
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(calls.load(Relaxed), 2);
        let c = f.counters();
        assert_eq!((c.started, c.joined, c.reruns), (2, 1, 1));
        // Now calls are known to take 600 ms. Short callers arrive every 40 ms and long ones
        // between them: no long caller fails, and a short caller never replaces a long call
        // (they join it and fail at their own limit, with their own figures).
        let mut longs = Vec::new();
        let mut shorts = Vec::new();
        for i in 0..30 {
            shorts.push(tokio::spawn(f.run(
                key("/hot"),
                short,
                taking(&calls, took),
            )));
            tokio::time::sleep(Duration::from_millis(20)).await;
            if i % 3 == 0 {
                longs.push(tokio::spawn(f.run(key("/hot"), long, taking(&calls, took))));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for l in longs {
            assert!(l.await.unwrap().is_ok(), "a long caller failed");
        }
        // A short caller that joined a long call near its end has the answer; the others
        // failed at their own limit.
        let mut failed = 0;
        for s in shorts {
            if let Err(e) = s.await.unwrap() {
                assert_eq!(e.kind, CallErrorKind::Timeout);
                assert!(e.message.contains("(100.0 ms)"), "{}", e.message);
                failed += 1;
            }
        }
        assert!(failed > 0);
        // One call for the long callers at a time (plus the short calls started while no long
        // call was live): far fewer calls than callers.
        assert!(
            calls.load(Relaxed) < 2 + 30 + 10,
            "calls: {}",
            calls.load(Relaxed)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_joiner_waits_for_a_longer_call_only_until_its_own_end() {
        let f = Arc::new(Flights::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let long = f.run(key("/k"), Duration::from_secs(10), hanging(&calls));
        let started = Instant::now();
        let e = f
            .run(key("/k"), Duration::from_millis(300), hanging(&calls))
            .await
            .unwrap_err();
        assert_eq!(e.kind, CallErrorKind::Timeout);
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert!(e.message.contains("(300.0 ms)"), "{}", e.message);
        assert_eq!(calls.load(Relaxed), 1, "joined, not a call of its own");
        drop(long);
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
        let mut a = f.run(key("/k"), Duration::from_secs(10), move |_| {
            Box::pin(async move {
                let _g = g;
                std::future::pending().await
            })
        });
        // Poll once so the call is running, then leave.
        let _ = futures_util::poll!(&mut a);
        drop(a);
        assert_eq!(dropped.load(Relaxed), 1, "the abandoned call was dropped");
    }
}
