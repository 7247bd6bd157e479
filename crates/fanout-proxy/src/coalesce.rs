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
//! **Every request keeps its own deadline** (the rule of `fanout_layers::singleflight` for calls).
//! A run ends at its leader's deadline at the latest. A request joins a live run that is younger
//! than twice the route's usual run time plus 1 ms (a run far older is probably hung) and that
//! either ends no earlier than the request's own deadline or has at least that usual time to
//! finish (`TypicalTime::fits`); it waits for the answer until its own deadline at most, then
//! answers its own `deadline_exceeded`. A run that ends before it is expected to finish (a
//! client's `x-request-timeout: 100` on a route whose runs take 600 ms) is not joined by a
//! request with more time: that request runs the flow itself and its run takes the key's place,
//! so later requests join the longer run; a shorter run never replaces a live longer one. When a
//! joined run's answer was cut short by its leader's deadline (it answered at that deadline or
//! failed with `deadline_exceeded`, or its leader was refused admission), a joiner that has more time left than that run's whole
//! budget runs the flow again (leading, or joining the next run) rather than take it. So no
//! request waits past its own deadline, and no client's short deadline becomes another's failure.
//!
//! **Each request stays its own**: the answer (status, body, `respond.headers`, `_partial`, or
//! the error) is computed once and shared as it is; every joined request still gets its own
//! request id, error body `request_id`, access-log line, span, metrics and `Server-Timing`.
//! Joined requests take no admission slot (they do no flow work); the leader takes one as usual,
//! and a refusal of the leader's admission is shared like any answer.
//!
//! **The leader's client goes away**: the run belongs to the leader's request, so it is
//! cancelled with it (its backend calls too, as for any request). Its joiners then run again:
//! one of them becomes the next leader (one rerun, counted in `reruns`) and the others join it,
//! each still within its own deadline. A dropped leader costs the joiners the time already
//! spent, never a wrong answer.
//!
//! **Nothing is kept**: the table entry is removed when the run finishes, before its answer is
//! handed out; a request arriving after that runs the flow again.

use crate::answer::ApiError;
use fanout_expr::Val;
use fanout_flow::Outcome;
use fanout_layers::singleflight::TypicalTime;
use opentelemetry::trace::SpanContext;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::time::Instant;

/// A run's answer, shared by its leader and joiners.
pub(crate) type Answer = Result<Outcome, ApiError>;

/// A finished run's answer, and whether its leader's deadline shaped it.
pub(crate) struct Finished {
    pub answer: Answer,
    /// The run answered at its deadline or failed with `deadline_exceeded`, or its leader was
    /// refused admission: a joiner with more time might get another answer.
    pub cut: bool,
}

type Shared = Option<Arc<Finished>>;

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
    coalesced: AtomicU64,
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
    /// Wait for this run's answer ([`Joined::wait`]).
    Join(Joined),
}

/// A request waiting for another request's run.
pub(crate) struct Joined {
    answer: watch::Receiver<Shared>,
    /// The leader's span, if traced.
    pub span: Option<SpanContext>,
    /// The run's whole budget (its leader's deadline − its start).
    budget: std::time::Duration,
}

/// What a joined request gets ([`Joined::wait`]).
pub(crate) enum Waited {
    /// The run's answer: the request's own.
    Answer(Arc<Finished>),
    /// Run the flow again (lead, or join the next run): the leader went away before answering,
    /// or its answer was cut short by its deadline while this request has more time.
    Again,
    /// The request's own deadline passed while it waited, after this long.
    Deadline(std::time::Duration),
}

/// The request that runs the flow for a key. Dropped without [`Leader::finish`] (its client went
/// away), it removes its entry and its joiners run again.
pub(crate) struct Leader<'a> {
    runs: &'a Runs,
    key: Arc<[u8]>,
    id: u64,
    started: Instant,
    /// The leader's deadline.
    ends: Instant,
    answer: watch::Sender<Shared>,
    /// `finish` removed the entry already (the drop then has nothing to do).
    removed: bool,
}

/// The counters of one route's [`Runs`] (the status endpoint).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct RunCounters {
    /// Runs of the flow started (each request that did not join one, and each rerun).
    pub runs: u64,
    /// Requests that joined a live run (most are then answered by it: `coalesced`).
    pub joined: u64,
    /// Requests answered by another request's run.
    pub coalesced: u64,
    /// Runs started by a request that had joined a run which could not answer it (its leader
    /// went away, or its answer was cut short by the leader's deadline).
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
            joined: self.counters.joined.load(Relaxed),
            coalesced: self.counters.coalesced.load(Relaxed),
            reruns: self.counters.reruns.load(Relaxed),
            in_flight,
        }
    }

    /// Count a joined request answered by the run it joined.
    pub(crate) fn coalesced(&self) {
        self.counters.coalesced.fetch_add(1, Relaxed);
    }

    /// Join the live run of `key` if this request may (module docs: young, and it ends no
    /// earlier than `deadline` or has the time runs usually take), else lead a new one (which
    /// later requests of the same key join). `again`: the request joined a run before that could
    /// not answer it (a run it leads now is a rerun). `span` gives the request's span, asked for
    /// only when it leads.
    pub(crate) fn role(
        &self,
        key: &[u8],
        deadline: Instant,
        again: bool,
        span: impl FnOnce() -> Option<SpanContext>,
    ) -> Role<'_> {
        use std::collections::hash_map::Entry;
        let now = Instant::now();
        let key: Arc<[u8]> = key.into();
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let entry = table.entry(key.clone());
        let mut keep = false;
        if let Entry::Occupied(e) = &entry {
            let run = e.get();
            if now.saturating_duration_since(run.started) <= self.typical.join_age()
                && run.answer.borrow().is_none()
            {
                if run.ends >= deadline || self.typical.fits(run.started, run.ends) {
                    self.counters.joined.fetch_add(1, Relaxed);
                    return Role::Join(Joined {
                        answer: run.answer.clone(),
                        span: run.span.clone(),
                        budget: run.ends.saturating_duration_since(run.started),
                    });
                }
                // It ends before it is expected to finish, and before this request's deadline:
                // this request's longer run takes its place (a live longer run is never
                // replaced by a shorter one).
                keep = run.ends > deadline;
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
        // A run that may not be joined (probably hung, or cut short before it is expected to
        // finish) is replaced: the new one serves the requests after it (the old run still
        // answers its own joiners).
        match entry {
            Entry::Occupied(mut e) if !keep => {
                e.insert(run);
            }
            Entry::Occupied(_) => {}
            Entry::Vacant(e) => {
                e.insert(run);
            }
        }
        drop(table);
        self.counters.runs.fetch_add(1, Relaxed);
        if again {
            self.counters.reruns.fetch_add(1, Relaxed);
        }
        Role::Lead(Leader {
            runs: self,
            key,
            id,
            started: now,
            ends: deadline,
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
    /// to the requests that joined it. `refused`: the leader was refused admission (whether it
    /// would wait depends on its deadline).
    pub(crate) fn finish(mut self, answer: &Answer, refused: bool) {
        self.runs.remove(&self.key, self.id);
        self.removed = true;
        // A deadline failure is the leader's even when a layer below answered it early (a
        // shared call that ended at another caller's shorter limit).
        let deadline_failure = matches!(answer, Err(e) if e.code == "deadline_exceeded");
        let cut = refused || deadline_failure || Instant::now() >= self.ends;
        if !cut {
            // A run cut short by its deadline says nothing of how long runs take.
            self.runs.typical.record(self.started.elapsed());
        }
        // Receivers are made only from the table's entry, which is gone: the count is final.
        if self.answer.receiver_count() > 0 {
            self.answer.send_replace(Some(Arc::new(Finished {
                answer: answer.clone(),
                cut,
            })));
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

impl Joined {
    /// Wait for the joined run's answer until this request's own `deadline` ([`Waited`]).
    pub(crate) async fn wait(mut self, deadline: Instant) -> Waited {
        let began = Instant::now();
        let got = tokio::time::timeout_at(deadline, async {
            match self.answer.wait_for(Option::is_some).await {
                Ok(a) => a.clone(),
                Err(_) => None,
            }
        })
        .await;
        match got {
            Err(_) => Waited::Deadline(began.elapsed()),
            Ok(None) => Waited::Again,
            Ok(Some(f)) => {
                // Cut short by the leader's deadline while this request has more time left than
                // that run's whole budget: its own run may answer.
                if f.cut && deadline.saturating_duration_since(Instant::now()) > self.budget {
                    Waited::Again
                } else {
                    Waited::Answer(f)
                }
            }
        }
    }
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

    #[allow(clippy::result_large_err)] // the answer type the gateway shares
    fn answer(status: u16) -> Answer {
        Ok(Outcome {
            status,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"{}"),
            value: None,
            partial: Vec::new(),
        })
    }

    fn lead<'a>(runs: &'a Runs, key: &[u8], deadline: Instant) -> Leader<'a> {
        match runs.role(key, deadline, false, || None) {
            Role::Lead(l) => l,
            Role::Join(_) => panic!("expected to lead"),
        }
    }

    fn join(runs: &Runs, key: &[u8], deadline: Instant) -> Joined {
        match runs.role(key, deadline, false, || None) {
            Role::Join(j) => j,
            Role::Lead(_) => panic!("expected to join"),
        }
    }

    fn status(w: Waited) -> u16 {
        match w {
            Waited::Answer(f) => f.answer.as_ref().map(|o| o.status).unwrap_or(0),
            Waited::Again => panic!("ran again"),
            Waited::Deadline(_) => panic!("deadline"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_join_a_live_run_and_wait_for_it_within_their_own_deadline() {
        let runs = Runs::new();
        let now = Instant::now();
        let s = Duration::from_secs(1);
        let leader = lead(&runs, b"k", now + s);
        // A later deadline joins (nothing is known of how long runs take yet), and so does a
        // shorter one: it waits within its own deadline.
        let later = join(&runs, b"k", now + 2 * s);
        let shorter = join(&runs, b"k", now + s / 2);
        assert!(matches!(
            runs.role(b"k2", now + s, false, || None),
            Role::Lead(_)
        ));
        tokio::time::sleep(s / 4).await;
        leader.finish(&answer(200), false);
        assert_eq!(status(later.wait(now + 2 * s).await), 200);
        assert_eq!(status(shorter.wait(now + s / 2).await), 200);
        // Joined requests are counted as coalesced only once answered.
        let c = runs.counters();
        assert_eq!((c.runs, c.joined, c.in_flight), (2, 2, 0));
        // Nothing is kept: after the run a request leads again.
        assert!(matches!(
            runs.role(b"k", now + s, false, || None),
            Role::Lead(_)
        ));

        // A joiner whose deadline passes first answers its own deadline, after its own wait.
        let long = lead(&runs, b"slow", now + 10 * s);
        let t = Instant::now();
        match join(&runs, b"slow", t + s / 2).wait(t + s / 2).await {
            Waited::Deadline(waited) => assert_eq!(waited, s / 2),
            _ => panic!("expected its own deadline"),
        }
        drop(long);
    }

    /// Issue 46's hostile client: a run led by a request with a short deadline must not fail
    /// the requests with more time. Runs take 600 ms.
    #[tokio::test(start_paused = true)]
    async fn a_short_deadline_never_fails_the_requests_with_more_time() {
        let runs = Runs::new();
        let ms = Duration::from_millis;
        // Nothing known yet: a 2 s request joins a 300 ms one, whose run is cut at its deadline;
        // the joiner, with more time left than that whole run had, runs again.
        let t0 = Instant::now();
        let short = lead(&runs, b"k", t0 + ms(300));
        tokio::time::sleep(ms(50)).await;
        let joiner = join(&runs, b"k", Instant::now() + ms(2000));
        let waiting = tokio::spawn(joiner.wait(t0 + ms(2050)));
        tokio::time::sleep(ms(250)).await;
        short.finish(&answer(504), false);
        assert!(matches!(waiting.await.unwrap(), Waited::Again));
        let again = match runs.role(b"k", t0 + ms(2050), true, || None) {
            Role::Lead(l) => l,
            Role::Join(_) => panic!("leads its rerun"),
        };
        tokio::time::sleep(ms(600)).await;
        again.finish(&answer(200), false);
        let c = runs.counters();
        assert_eq!((c.runs, c.reruns), (2, 1));
        // Now runs are known to take 600 ms: a 2 s request does not join a 100 ms run — it
        // leads, and its run takes the key's place; the short requests after it join the long
        // run (a short run never replaces a live longer one).
        let t = Instant::now();
        let attacker = lead(&runs, b"k", t + ms(100));
        let long = lead(&runs, b"k", t + ms(2000));
        let next_short = tokio::spawn(join(&runs, b"k", t + ms(100)).wait(t + ms(100)));
        let next_long = tokio::spawn(join(&runs, b"k", t + ms(2000)).wait(t + ms(2000)));
        tokio::time::sleep(ms(100)).await;
        attacker.finish(&answer(504), false);
        tokio::time::sleep(ms(500)).await;
        long.finish(&answer(200), false);
        assert!(matches!(next_short.await.unwrap(), Waited::Deadline(_)));
        assert_eq!(status(next_long.await.unwrap()), 200);
        // A refusal of the leader's admission is not shared with a joiner that has more time.
        let t = Instant::now();
        let refused = lead(&runs, b"r", t + ms(1500));
        let j = join(&runs, b"r", t + ms(2000));
        refused.finish(&answer(503), true);
        assert!(matches!(j.wait(t + ms(2000)).await, Waited::Again));
    }

    #[tokio::test(start_paused = true)]
    async fn joiners_of_a_leader_that_went_away_run_again_once() {
        let runs = Runs::new();
        let d = Instant::now() + Duration::from_secs(1);
        let leader = lead(&runs, b"k", d);
        let joined: Vec<Joined> = (0..5).map(|_| join(&runs, b"k", d)).collect();
        drop(leader);
        let mut waits = Vec::new();
        for j in joined {
            waits.push(j.wait(d).await);
        }
        assert!(
            waits.iter().all(|w| matches!(w, Waited::Again)),
            "run again"
        );
        // The first leads the rerun, the others join it.
        let Role::Lead(next) = runs.role(b"k", d, true, || None) else {
            panic!("leads");
        };
        for _ in 0..4 {
            assert!(matches!(runs.role(b"k", d, true, || None), Role::Join(_)));
        }
        next.finish(&answer(200), false);
        let c = runs.counters();
        assert_eq!((c.runs, c.reruns, c.joined), (2, 1, 9));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_do_not_join_a_run_far_older_than_runs_usually_take() {
        let runs = Runs::new();
        let d = || Instant::now() + Duration::from_secs(10);
        for _ in 0..3 {
            let l = lead(&runs, b"k", d());
            tokio::time::sleep(Duration::from_millis(10)).await;
            l.finish(&answer(200), false);
        }
        let hung = runs.role(b"k", d(), false, || None);
        assert!(matches!(
            runs.role(b"k", d(), false, || None),
            Role::Join(..)
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(matches!(
            runs.role(b"k", d(), false, || None),
            Role::Lead(_)
        ));
        drop(hung);
    }
}
