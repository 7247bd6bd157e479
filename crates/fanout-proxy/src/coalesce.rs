//! Whole-request coalescing: concurrent requests to a route that would compute the same answer
//! share one run of the flow (docs/config.md#coalescing).
//!
//! **The key** is exactly what the flow can see of a request: its `$request` value, which the
//! gateway builds with only the parts the route's expressions read
//! ([`fanout_flow::RoutePlan::request_use`]: method, path parameters, query, the named headers or
//! all of them, body). A header the flow never reads (a request id, `traceparent`, a cookie) is
//! not in that value, so it cannot split the key; one the flow reads (`authorization`) always
//! does. The value is encoded without loss ([`key_of`]: every string and number as its exact
//! bytes, length-prefixed), and the table compares whole keys — no hash alone decides. The route
//! and the config generation are not in the key: each route of each loaded config ([`crate::Live`])
//! has a table of its own ([`Runs`]), so a reload never shares a run with the old config.
//!
//! **Bounded sharing** (the rule of `fanout_flow::singleflight` for calls): a run ends at its
//! leader's deadline at the latest. A request joins a live run only when that end is within its
//! own deadline, and only while the run is younger than twice the route's usual run time plus
//! 1 ms (a run far older is probably hung); otherwise it runs the flow itself (and later requests
//! join that run). So no request waits past its own deadline for a hung run.
//!
//! **Each request stays its own**: the answer (status, body, `respond.headers`, `_partial`, or
//! the error) is computed once and shared as it is; every joined request still gets its own
//! request id, error body `request_id`, access-log line, span, metrics and `Server-Timing`.
//! Joined requests take no admission slot (they do no flow work); the leader takes one as usual,
//! and a refusal of the leader's admission is shared like any answer.
//!
//! **The leader's client goes away**: the run belongs to the leader's request, so it is
//! cancelled with it (its backend calls too, as for any request). Its joiners then run again:
//! one of them becomes the next leader and the others join it, each still within its own
//! deadline. A dropped leader costs the joiners the time already spent, never a wrong answer.
//!
//! **Nothing is kept**: the table entry is removed when the run finishes, before its answer is
//! handed out; a request arriving after that runs the flow again.

use crate::answer::ApiError;
use fanout_expr::Val;
use fanout_flow::Outcome;
use fanout_flow::singleflight::TypicalTime;
use opentelemetry::trace::SpanContext;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::time::Instant;

/// A run's answer, shared by its leader and joiners.
pub(crate) type Answer = Result<Outcome, ApiError>;

type Shared = Option<Arc<Answer>>;

/// The live runs of one route of one loaded config, by key.
pub(crate) struct Runs {
    /// Keys are shared with their leaders (`Arc`: one copy of the key per run); each operation
    /// hashes a key once (the `entry` API).
    table: Mutex<HashMap<Arc<[u8]>, Run>>,
    next_id: AtomicU64,
    /// How long finished runs took.
    typical: TypicalTime,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    runs: AtomicU64,
    joined: AtomicU64,
    reruns: AtomicU64,
}

struct Run {
    id: u64,
    started: Instant,
    /// The leader's deadline: the run ends by then.
    ends: Instant,
    answer: watch::Receiver<Shared>,
    /// The leader's span (tracing on), which the joiners' spans link to.
    span: Option<SpanContext>,
}

/// What one request does with a key: run the flow (and share its answer), or wait for a live
/// run's.
pub(crate) enum Role<'a> {
    /// Run the flow; [`Leader::finish`] shares the answer.
    Lead(Leader<'a>),
    /// Wait for this run's answer ([`wait`]); the leader's span, if traced.
    Join(watch::Receiver<Shared>, Option<SpanContext>),
}

/// The request that runs the flow for a key. Dropped without [`Leader::finish`] (its client went
/// away), it removes its entry and its joiners run again.
pub(crate) struct Leader<'a> {
    runs: &'a Runs,
    key: Arc<[u8]>,
    id: u64,
    started: Instant,
    answer: watch::Sender<Shared>,
    /// `finish` removed the entry already (the drop then has nothing to do).
    removed: bool,
}

/// The counters of one route's [`Runs`] (the status endpoint).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct RunCounters {
    /// Runs of the flow started (each request that did not join one).
    pub runs: u64,
    /// Requests answered by another request's run.
    pub coalesced: u64,
    /// Joined requests whose leader went away before answering, so they ran again.
    pub reruns: u64,
    /// Runs in the table now.
    pub in_flight: u64,
}

impl Default for Runs {
    fn default() -> Self {
        Runs::new()
    }
}

impl Runs {
    /// An empty table.
    pub(crate) fn new() -> Runs {
        Runs {
            table: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            typical: TypicalTime::default(),
            counters: Counters::default(),
        }
    }

    /// The counters.
    pub(crate) fn counters(&self) -> RunCounters {
        let in_flight = self.table.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
        RunCounters {
            runs: self.counters.runs.load(Relaxed),
            coalesced: self.counters.joined.load(Relaxed),
            reruns: self.counters.reruns.load(Relaxed),
            in_flight,
        }
    }

    /// Count a joined request that runs again (its leader went away).
    pub(crate) fn rerun(&self) {
        self.counters.reruns.fetch_add(1, Relaxed);
    }

    /// Join the live run of `key` if it ends by `deadline` (and is not far older than runs
    /// usually take), else lead a new one (which later requests of the same key join). `span`
    /// gives the request's span, asked for only when it leads.
    pub(crate) fn role(
        &self,
        key: &[u8],
        deadline: Instant,
        span: impl FnOnce() -> Option<SpanContext>,
    ) -> Role<'_> {
        use std::collections::hash_map::Entry;
        let now = Instant::now();
        let key: Arc<[u8]> = key.into();
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let entry = table.entry(key.clone());
        if let Entry::Occupied(e) = &entry {
            let run = e.get();
            if run.ends <= deadline
                && now.saturating_duration_since(run.started) <= self.typical.join_age()
                && run.answer.borrow().is_none()
            {
                self.counters.joined.fetch_add(1, Relaxed);
                return Role::Join(run.answer.clone(), run.span.clone());
            }
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, rx) = watch::channel(None);
        let run = Run {
            id,
            started: now,
            ends: deadline,
            answer: rx,
            span: span(),
        };
        // A run that did not fit replaces the entry: the new one serves the requests after it
        // (the old run still answers its own joiners).
        match entry {
            Entry::Occupied(mut e) => {
                e.insert(run);
            }
            Entry::Vacant(e) => {
                e.insert(run);
            }
        }
        drop(table);
        self.counters.runs.fetch_add(1, Relaxed);
        Role::Lead(Leader {
            runs: self,
            key,
            id,
            started: now,
            answer: tx,
            removed: false,
        })
    }

    /// Remove the entry of run `id` (if it is still the key's entry).
    fn remove(&self, key: &Arc<[u8]>, id: u64) {
        use std::collections::hash_map::Entry;
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Entry::Occupied(e) = table.entry(key.clone())
            && e.get().id == id
        {
            e.remove();
        }
    }
}

impl Leader<'_> {
    /// The run answered: remove its entry (nothing is kept after the run), then hand the answer
    /// to the requests that joined it.
    pub(crate) fn finish(mut self, answer: &Answer) {
        self.runs.remove(&self.key, self.id);
        self.removed = true;
        self.runs.typical.record(self.started.elapsed());
        // Receivers are made only from the table's entry, which is gone: the count is final.
        if self.answer.receiver_count() > 0 {
            self.answer.send_replace(Some(Arc::new(answer.clone())));
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Before `finish` (the leader's client went away) it removes the entry, and dropping
        // the sender tells the joiners.
        if !self.removed {
            self.runs.remove(&self.key, self.id);
        }
    }
}

/// Wait for a joined run's answer until `deadline`: `Ok(Some)` the answer, `Ok(None)` the
/// leader went away before answering (run again), `Err(())` the deadline passed.
pub(crate) async fn wait(
    mut answer: watch::Receiver<Shared>,
    deadline: Instant,
) -> Result<Option<Arc<Answer>>, ()> {
    let got = tokio::time::timeout_at(deadline, async {
        match answer.wait_for(Option::is_some).await {
            Ok(a) => a.clone(),
            Err(_) => None,
        }
    })
    .await;
    got.map_err(|_| ())
}

/// The key of a `$request` value: an encoding without loss (a tag per kind, every string's
/// bytes and every number's exact form, length-prefixed), so that two values share a key only
/// when they are the same value.
pub(crate) fn key_of(request: &Val) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode(request, &mut out);
    out
}

fn bytes(tag: u8, b: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn encode(v: &Val, out: &mut Vec<u8>) {
    use fanout_expr::Num;
    match v {
        Val::Null => out.push(0),
        Val::Bool(false) => out.push(1),
        Val::Bool(true) => out.push(2),
        Val::Num(Num::Int(i)) => bytes(3, &(*i as i64).to_le_bytes(), out),
        Val::Num(Num::Float(f)) => bytes(4, &f.to_bits().to_le_bytes(), out),
        Val::Num(Num::Dec(d)) => bytes(5, d.as_bytes(), out),
        Val::Num(other) => bytes(6, other.to_string().as_bytes(), out),
        Val::TStr(b) => bytes(7, b, out),
        Val::BStr(b) => bytes(8, b, out),
        Val::Arr(a) => {
            out.push(9);
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a.iter() {
                encode(x, out);
            }
        }
        Val::Obj(o) => {
            out.push(10);
            out.extend_from_slice(&(o.len() as u64).to_le_bytes());
            for (k, x) in o.iter() {
                encode(k, out);
                encode(x, out);
            }
        }
    }
}

/// The coalescing tables of a loaded config: one per route that coalesces, by route index.
pub(crate) fn tables(routes: &[Arc<fanout_flow::RoutePlan>]) -> Vec<Option<Runs>> {
    routes
        .iter()
        .map(|r| r.coalesces().then(Runs::new))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_expr::json;
    use std::time::Duration;

    fn key(text: &str) -> Vec<u8> {
        key_of(&json::parse(text.as_bytes()).unwrap())
    }

    #[test]
    fn keys_differ_whenever_the_values_do() {
        let same = ["{\"a\":\"x\"}", "{\"a\":\"x\"}"];
        assert_eq!(key(same[0]), key(same[1]));
        let distinct = [
            "{}",
            "{\"a\":\"x\"}",
            "{\"a\":\"xy\"}",
            "{\"ax\":\"\"}",
            "{\"a\":[\"x\"]}",
            "{\"a\":[\"x\",\"\"]}",
            "{\"a\":1}",
            "{\"a\":1.0}",
            "{\"a\":\"1\"}",
            "{\"a\":null}",
            "{\"a\":true}",
            "{\"a\":{\"b\":\"x\"}}",
            "[\"a\",\"x\"]",
        ];
        for (i, a) in distinct.iter().enumerate() {
            for b in &distinct[i + 1..] {
                assert_ne!(key(a), key(b), "{a} and {b}");
            }
        }
        // Strings that are not valid UTF-8 keep their bytes (JSON text would replace them).
        let a = key_of(&Val::BStr(bytes::Bytes::from_static(b"\xff\xfe").into()));
        let b = key_of(&Val::BStr(bytes::Bytes::from_static(b"\xff\xfd").into()));
        assert_ne!(a, b);
    }

    fn ok() -> Arc<Answer> {
        Arc::new(Ok(Outcome {
            status: 200,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"{}"),
            value: None,
            partial: Vec::new(),
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn requests_join_a_run_that_ends_within_their_deadline_and_only_then() {
        let runs = Runs::new();
        let now = Instant::now();
        let s = Duration::from_secs(1);
        let Role::Lead(leader) = runs.role(b"k", now + s, || None) else {
            panic!("the first request leads");
        };
        let Role::Join(joined, _) = runs.role(b"k", now + 2 * s, || None) else {
            panic!("a later deadline joins");
        };
        assert!(matches!(runs.role(b"k2", now + s, || None), Role::Lead(_)));
        // A shorter deadline runs its own (and replaces the entry).
        let Role::Lead(short) = runs.role(b"k", now + s / 2, || None) else {
            panic!("a shorter deadline leads");
        };
        leader.finish(&ok());
        let got = wait(joined, now + 2 * s).await.unwrap().unwrap();
        assert!(matches!(got.as_ref(), Ok(o) if o.status == 200));
        // The short run's entry was not removed by the first leader; then it ends.
        assert!(matches!(runs.role(b"k", now + s, || None), Role::Join(..)));
        drop(short);
        let c = runs.counters();
        assert_eq!((c.runs, c.coalesced, c.in_flight), (3, 2, 0));
        // Nothing is kept: after the run a request leads again.
        assert!(matches!(runs.role(b"k", now + s, || None), Role::Lead(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn joiners_of_a_leader_that_went_away_run_again() {
        let runs = Runs::new();
        let d = Instant::now() + Duration::from_secs(1);
        let leader = runs.role(b"k", d, || None);
        let Role::Join(joined, _) = runs.role(b"k", d, || None) else {
            panic!("joins");
        };
        drop(leader);
        assert!(wait(joined, d).await.unwrap().is_none(), "run again");
        assert!(matches!(runs.role(b"k", d, || None), Role::Lead(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_do_not_join_a_run_far_older_than_runs_usually_take() {
        let runs = Runs::new();
        let d = || Instant::now() + Duration::from_secs(10);
        for _ in 0..3 {
            let Role::Lead(l) = runs.role(b"k", d(), || None) else {
                panic!("leads");
            };
            tokio::time::sleep(Duration::from_millis(10)).await;
            l.finish(&ok());
        }
        let hung = runs.role(b"k", d(), || None);
        assert!(matches!(runs.role(b"k", d(), || None), Role::Join(..)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(matches!(runs.role(b"k", d(), || None), Role::Lead(_)));
        drop(hung);
    }
}
