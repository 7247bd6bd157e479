//! The run: pacer thread, on-demand connection workers, drain, and the final report.
//!
//! **Pacer.** A dedicated OS thread walks the schedule's intended send times. When the next
//! one is more than ~100 µs away it sleeps with `std::thread::sleep` (nanosleep: ~70 µs
//! overshoot here, versus tokio's 1 ms timer wheel) until just before it, then `yield_now`-spins
//! the rest — the spin is budgeted to 5 % of one core, so at high rates it sleeps instead and
//! batches. On each wake it releases *every* request due by now at once into a [`Dispatch`]
//! (a counter plus a stack of idle workers, not a task per request: an impossible rate queues
//! integers, not futures).
//!
//! **Workers.** Each idle worker is handed one request (most recently idle worker first),
//! claims the next request index, stamps the dispatch time (lag = dispatch − intended, which
//! includes any wait for a free worker), makes sure it has a connection (HTTP/1.1: its own;
//! HTTP/2: a lease on a shared one), sends, reads the body, and records `done − intended`
//! (latency) and `done − dispatch` (service; so latency = lag + service). When requests wait
//! longer than a quarter of the lag threshold with no idle worker, the pacer spawns more
//! workers, rate-limited, up to `max_connections` (× 100 streams for HTTP/2); beyond that
//! requests queue, their intended times ticking.
//!
//! **End.** After the schedule, the run waits up to `drain` for outstanding requests, then
//! aborts the rest: sent ones are `aborted_at_end`, never-sent ones `not_sent`.

use crate::conn::ConnCounters;
use crate::conn::{
    Body, Driver, H2_STREAMS_PER_CONN, H2Lease, H2Pool, Prepared, Target, classify, connect_h1,
    connect_h2,
};
use crate::grpc::{GRPC_STATUS, code_of, judge, status_map};
use crate::recorder::{Outcome, Recorder};
use crate::report::{LagStats, LatencyStats, LoadReport, SecondStats, fmt_ms};
use crate::schedule::Schedule;
use crate::{LoadError, LoadSpec, Protocol};
use http_body_util::BodyExt;
use hyper::client::conn::http1;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Delay between `run` being called and the schedule's time zero (lets the pacer start).
const START_DELAY: Duration = Duration::from_millis(20);
/// Pause between opening the pre-opened connections and the schedule's time zero.
const SETTLE: Duration = Duration::from_millis(300);
/// The pacer sleeps until this long before the next due time (≈ nanosleep overshoot).
const SLEEP_EARLY: Duration = Duration::from_micros(100);
/// Longest single sleep of the pacer (bounds its reaction to a stop).
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// Share of one core the pacer may spend spinning for precise sends.
const SPIN_SHARE: f64 = 0.05;
/// Most spin time the pacer may bank.
const SPIN_BURST: Duration = Duration::from_millis(2);
/// Bounds of the backlog age that makes the pool grow (a quarter of the lag threshold).
const MIN_GROW_AFTER: Duration = Duration::from_micros(50);
const MAX_GROW_AFTER: Duration = Duration::from_millis(1);
/// Pool growth budget: new workers (connections) may be added at `workers / GROWTH_TAU_MS`
/// per millisecond (at least `MIN_GROWTH_PER_MS`), with a burst of `max(16, workers / 4)`.
const GROWTH_TAU_MS: f64 = 16.0;
const MIN_GROWTH_PER_MS: f64 = 1.0;
const MIN_GROWTH_BURST: f64 = 16.0;
/// Response header naming the optional steps that fell back (fanout's `_partial`); such 2xx
/// answers are counted as `partial`.
const PARTIAL_HEADER: &str = "x-fanout-partial";
/// Per-second statistics are closed this long after the second ends.
const TICK_SLACK: Duration = Duration::from_millis(5);

/// Counts Server-Sent Events in a body read a frame at a time: each `\n\n` (the blank line
/// that ends an event), also when the two newlines arrive in different frames.
#[derive(Default)]
struct EventCounter {
    /// The last byte seen was a `\n`.
    newline: bool,
    events: u64,
}

impl EventCounter {
    fn feed(&mut self, data: &[u8]) {
        for &b in data {
            if b == b'\n' {
                if self.newline {
                    self.events += 1;
                    self.newline = false;
                } else {
                    self.newline = true;
                }
            } else {
                self.newline = false;
            }
        }
    }
}

#[cfg(test)]
mod event_counter_tests {
    use super::EventCounter;

    #[test]
    fn events_are_counted_at_their_blank_line_across_frames() {
        let mut c = EventCounter::default();
        c.feed(b"retry: 5\n\ndata: a\ndata: b\n");
        assert_eq!(c.events, 1);
        c.feed(b"\n");
        assert_eq!(
            c.events, 2,
            "the blank line in the next frame ends the event"
        );
        c.feed(b": ping\n\nevent: x\ndata: {}\n\n");
        assert_eq!(c.events, 4);
        c.feed(b"data: half");
        assert_eq!(c.events, 4);
    }
}

type Progress<'a> = Option<&'a (dyn Fn(&SecondStats) + Send + Sync)>;

struct Shared {
    schedule: Schedule,
    total: u64,
    t0: Instant,
    timeout: Duration,
    protocol: Protocol,
    max_connections: usize,
    max_workers: usize,
    /// Requests may wait this long for a busy worker before the pool grows.
    grow_after: Duration,
    target: Target,
    requests: Vec<Prepared>,
    handle: Handle,
    /// Released, not yet claimed requests and the idle workers.
    work: Dispatch,
    claimed: AtomicU64,
    workers: AtomicUsize,
    starting: AtomicUsize,
    saturated: AtomicBool,
    stopped: AtomicBool,
    tasks: Mutex<JoinSet<()>>,
    rec: Mutex<Recorder>,
    all_done: Notify,
    conns: Arc<ConnCounters>,
    h2: H2Pool,
    /// [`LoadSpec::count_events`]: count the events in the answers into `events`.
    count_events: bool,
    events: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

enum Conn {
    None,
    H1(http1::SendRequest<Body>),
    H2(H2Lease),
}

impl Shared {
    fn sec(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.t0).as_secs()
    }

    /// Spawn a task owned by the run (aborted when the run ends).
    fn spawn(&self, fut: Driver) {
        let mut tasks = lock(&self.tasks);
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        while tasks.try_join_next().is_some() {}
        tasks.spawn_on(fut, &self.handle);
    }

    /// Stop the pacer and workers; returns the tasks for the caller to abort.
    fn stop(&self) -> JoinSet<()> {
        let mut tasks = lock(&self.tasks);
        self.stopped.store(true, Ordering::Release);
        self.work.close();
        std::mem::take(&mut *tasks)
    }

    /// Grow the worker pool when released requests are waiting and nobody is idle to take
    /// them. Returns when to look again if the backlog is still there but too young to grow
    /// for, or the growth budget ran out.
    ///
    /// A backlog younger than `grow_after` is left to the busy workers — they usually finish
    /// within microseconds. Growth is rate-limited (exponential with a 16 ms time constant,
    /// see [`Growth`]): a stall of the generator's host (CPU contention, a VM hiccup) leaves a
    /// backlog that more connections cannot clear, and opening hundreds at once would only
    /// deepen the stall; a slow target still gets the connections it needs within tens of ms.
    fn grow(self: &Arc<Self>, now: Instant, growth: &mut Growth) -> Option<Instant> {
        let waiting = self.work.backlog();
        let starting = self.starting.load(Ordering::Acquire);
        if waiting <= starting {
            return None;
        }
        let workers = self.workers.load(Ordering::Relaxed);
        if workers >= self.max_workers {
            self.saturated.store(true, Ordering::Relaxed);
            return None;
        }
        if workers > 0 {
            let oldest = self.claimed.load(Ordering::Relaxed);
            let intended = self.t0
                + self
                    .schedule
                    .send_time(oldest)
                    .unwrap_or_else(|| self.schedule.duration());
            let grow_at = intended + self.grow_after;
            if now < grow_at {
                return Some(grow_at);
            }
        }
        let want = waiting - starting;
        let room = self.max_workers - workers;
        let n = want.min(room).min(growth.take(now, workers));
        for _ in 0..n {
            self.workers.fetch_add(1, Ordering::Relaxed);
            self.starting.fetch_add(1, Ordering::AcqRel);
            let me = self.clone();
            self.spawn(Box::pin(worker(me)));
        }
        (n < want.min(room)).then(|| now + self.grow_after)
    }

    fn finish(
        &self,
        intended: Instant,
        outcome: Outcome,
        was_sent: bool,
        latency: Option<Duration>,
        service: Option<Duration>,
    ) {
        let sec = self.sec(Instant::now());
        let finished = lock(&self.rec).on_finish(
            sec,
            self.sec(intended),
            outcome,
            was_sent,
            latency.map(us),
            service.map(us),
        );
        if finished >= self.total {
            self.all_done.notify_one();
        }
    }

    /// Make sure `conn` is a usable connection (connecting if needed).
    async fn ensure(&self, conn: &mut Conn) -> Result<(), Outcome> {
        match self.protocol {
            Protocol::Http1 => {
                if let Conn::H1(s) = conn
                    && !s.is_closed()
                    && s.ready().await.is_ok()
                {
                    return Ok(());
                }
                *conn = Conn::None;
                let (mut s, driver) = connect_h1(&self.target, &self.conns).await?;
                self.spawn(driver);
                s.ready().await.map_err(|e| classify(&e))?;
                *conn = Conn::H1(s);
                Ok(())
            }
            Protocol::Http2 | Protocol::Grpc => {
                // Pre-opened connections: every request takes the next one in turn.
                if let Some(l) = self.h2.round_robin() {
                    *conn = Conn::H2(l);
                    return Ok(());
                }
                if let Conn::H2(l) = conn
                    && !l.is_closed()
                {
                    return Ok(());
                }
                *conn = Conn::None;
                let lease = self
                    .h2
                    .lease(&self.target, self.max_connections, &self.conns, |d| {
                        self.spawn(d)
                    })
                    .await?;
                *conn = Conn::H2(lease);
                Ok(())
            }
        }
    }

    /// Send request `n` and record its outcome.
    async fn execute(&self, n: u64, conn: &mut Conn) {
        let offset = self
            .schedule
            .send_time(n)
            .unwrap_or_else(|| self.schedule.duration());
        let intended = self.t0 + offset;
        let start = Instant::now();
        lock(&self.rec).on_dispatch(
            self.sec(start),
            us(start.saturating_duration_since(intended)),
        );
        let deadline = start + self.timeout;
        let t_deadline = tokio::time::Instant::from_std(deadline);
        let at_deadline = || Some(deadline.saturating_duration_since(intended));

        match tokio::time::timeout_at(t_deadline, self.ensure(conn)).await {
            Ok(Ok(())) => {}
            Ok(Err(outcome)) => {
                *conn = Conn::None;
                let outcome = match outcome {
                    Outcome::Timeout => Outcome::ConnectTimeout,
                    o => o,
                };
                let latency = if outcome == Outcome::ConnectTimeout {
                    at_deadline()
                } else {
                    None
                };
                self.finish(intended, outcome, false, latency, None);
                return;
            }
            Err(_) => {
                *conn = Conn::None;
                self.finish(
                    intended,
                    Outcome::ConnectTimeout,
                    false,
                    at_deadline(),
                    None,
                );
                return;
            }
        }

        let idx = usize::try_from(n % self.requests.len() as u64).unwrap_or(0);
        let Some(template) = self.requests.get(idx) else {
            self.finish(intended, Outcome::Other, false, None, None);
            return;
        };
        let req = template.build();
        let grpc = self.protocol == Protocol::Grpc;
        lock(&self.rec).on_send(self.sec(Instant::now()));
        let exchange = async {
            let resp = match &mut *conn {
                Conn::H1(s) => s.send_request(req).await,
                Conn::H2(l) => l.sender.send_request(req).await,
                Conn::None => return Err(Outcome::Other),
            }
            .map_err(|e| classify(&e))?;
            let status = resp.status().as_u16();
            let partial = resp.headers().contains_key(PARTIAL_HEADER);
            // gRPC: the status is in the trailers, or in the headers of a trailers-only answer.
            let mut grpc_code = None;
            if grpc && let Some(v) = resp.headers().get(&GRPC_STATUS) {
                grpc_code = Some(code_of(v.as_bytes()));
            }
            let mut body = resp.into_body();
            let mut bytes = 0u64;
            let mut events = EventCounter::default();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| classify(&e))?;
                if let Some(d) = frame.data_ref() {
                    bytes += d.len() as u64;
                    if self.count_events {
                        events.feed(d);
                    }
                } else if grpc
                    && let Some(v) = frame.trailers_ref().and_then(|t| t.get(&GRPC_STATUS))
                {
                    grpc_code = Some(code_of(v.as_bytes()));
                }
            }
            let grpc = grpc.then(|| judge(status, grpc_code));
            if events.events > 0 {
                self.events.fetch_add(events.events, Ordering::Relaxed);
            }
            Ok((status, bytes, partial, grpc))
        };
        let result = tokio::time::timeout_at(t_deadline, exchange).await;
        let done = Instant::now();
        match result {
            Ok(Ok((status, bytes, partial, grpc))) => self.finish(
                intended,
                Outcome::Response {
                    status,
                    bytes,
                    partial,
                    grpc,
                },
                true,
                Some(done.saturating_duration_since(intended)),
                Some(done.saturating_duration_since(start)),
            ),
            Ok(Err(outcome)) => {
                match conn {
                    Conn::H2(l) if !l.is_closed() => {}
                    _ => *conn = Conn::None,
                }
                self.finish(intended, outcome, true, None, None);
            }
            Err(_) => {
                // An HTTP/1.1 connection with a request still in flight cannot be reused;
                // HTTP/2 just resets the stream (done by dropping the response future).
                if matches!(conn, Conn::H1(_)) {
                    *conn = Conn::None;
                }
                self.finish(
                    intended,
                    Outcome::Timeout,
                    true,
                    at_deadline(),
                    Some(self.timeout),
                );
            }
        }
    }
}

async fn worker(shared: Arc<Shared>) {
    let mut conn = Conn::None;
    let me = Arc::new(Notify::new());
    let mut first = true;
    loop {
        let next = shared.work.next(&me);
        if first {
            shared.starting.fetch_sub(1, Ordering::AcqRel);
            first = false;
        }
        if !next.await {
            return; // closed: the run is over
        }
        let n = shared.claimed.fetch_add(1, Ordering::Relaxed);
        shared.execute(n, &mut conn).await;
    }
}

/// Hands released requests to idle workers, most recently idle first (LIFO), so a small hot
/// set of connections carries the load and connections opened for a burst stay idle instead
/// of diluting it (a FIFO semaphore would rotate every request over every connection).
#[derive(Default)]
struct Dispatch {
    state: Mutex<DispatchState>,
}

#[derive(Default)]
struct DispatchState {
    /// Released requests no worker has taken yet.
    backlog: usize,
    /// Idle workers, each waiting on its own `Notify`; a notification hands it one request.
    idle: Vec<Arc<Notify>>,
    closed: bool,
}

impl Dispatch {
    /// Make `k` more requests available: wake up to `k` idle workers, queue the rest.
    fn release(&self, k: usize) {
        let mut wake = Vec::new();
        {
            let mut s = lock(&self.state);
            if s.closed {
                return;
            }
            for _ in 0..k {
                match s.idle.pop() {
                    Some(w) => wake.push(w),
                    None => s.backlog += 1,
                }
            }
        }
        for w in wake {
            w.notify_one();
        }
    }

    /// Requests waiting for a worker.
    fn backlog(&self) -> usize {
        lock(&self.state).backlog
    }

    /// Wait until this worker (`me`) is handed a request; `false` once closed.
    async fn next(&self, me: &Arc<Notify>) -> bool {
        {
            let mut s = lock(&self.state);
            if s.closed {
                return false;
            }
            if s.backlog > 0 {
                s.backlog -= 1;
                return true;
            }
            s.idle.push(me.clone());
        }
        // `notify_one` stores a permit if it comes before we wait: no lost wake-up.
        me.notified().await;
        !lock(&self.state).closed
    }

    /// Stop handing out requests and wake every idle worker so it can exit.
    fn close(&self) {
        let idle = {
            let mut s = lock(&self.state);
            s.closed = true;
            std::mem::take(&mut s.idle)
        };
        for w in idle {
            w.notify_one();
        }
    }
}

/// The pacer thread: release requests as their intended time comes, and grow the worker
/// pool while requests wait (see the module docs).
fn pacer(shared: &Arc<Shared>) {
    let total = shared.total;
    let mut next: u64 = 0;
    let mut budget = SPIN_BURST;
    let mut last = Instant::now();
    let mut grow_at: Option<Instant> = None;
    let mut budget_growth = Growth {
        tokens: MIN_GROWTH_BURST,
        last: Instant::now(),
    };
    while !shared.stopped.load(Ordering::Acquire) {
        let now = Instant::now();
        // Release everything due by now in one batch.
        let mut k: usize = 0;
        let mut next_due = None;
        while next < total {
            match shared.schedule.send_time(next) {
                Some(o) if shared.t0 + o <= now => {
                    next += 1;
                    k += 1;
                }
                Some(o) => {
                    next_due = Some(shared.t0 + o);
                    break;
                }
                None => break,
            }
        }
        if k > 0 {
            shared.work.release(k);
        }
        if k > 0 || grow_at.is_some_and(|g| g <= now) {
            grow_at = shared.grow(now, &mut budget_growth);
        }
        let wake = match (next_due, grow_at) {
            (Some(d), Some(g)) => d.min(g),
            (Some(d), None) => d,
            (None, Some(g)) => g,
            (None, None) => break, // everything released, no backlog to grow for
        };
        // Sleep until just before the wake time, then spin the rest if the budget allows.
        let now = Instant::now();
        budget = (budget + now.saturating_duration_since(last).mul_f64(SPIN_SHARE)).min(SPIN_BURST);
        last = now;
        if wake <= now {
            continue;
        }
        let wait = wake - now;
        if wait > SLEEP_EARLY {
            std::thread::sleep((wait - SLEEP_EARLY).min(MAX_SLEEP));
        } else if wait <= budget {
            while Instant::now() < wake {
                std::thread::yield_now();
            }
            let spun = Instant::now().saturating_duration_since(now);
            budget = budget.saturating_sub(spun);
            last = Instant::now();
        } else {
            std::thread::sleep(wait);
        }
    }
}

/// Token bucket limiting how fast the worker pool (and with it the connection count) grows.
struct Growth {
    tokens: f64,
    last: Instant,
}

impl Growth {
    /// Refill for the time since the last call and take as many whole tokens as available.
    fn take(&mut self, now: Instant, workers: usize) -> usize {
        let ms = now.saturating_duration_since(self.last).as_secs_f64() * 1000.0;
        self.last = now;
        let w = workers as f64;
        let rate = (w / GROWTH_TAU_MS).max(MIN_GROWTH_PER_MS);
        let cap = (w / 4.0).max(MIN_GROWTH_BURST);
        self.tokens = (self.tokens + ms * rate).min(cap);
        let n = self.tokens.floor().max(0.0);
        self.tokens -= n;
        n as usize
    }
}

/// Aborts everything if the run future is dropped early.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        // Dropping the JoinSet aborts every worker and connection task.
        drop(self.0.stop());
    }
}

/// Run the load described by `spec` and report. `progress` is called once per second with
/// that second's statistics (and for every remaining second at the end), from the task that
/// awaits `run`.
///
/// Call it from a multi-threaded tokio runtime for best accuracy (it works on a current-thread
/// runtime too). Errors are only for a spec that cannot start; everything that goes wrong
/// during the run is counted in the report.
pub async fn run(spec: &LoadSpec, progress: Progress<'_>) -> Result<LoadReport, LoadError> {
    if spec.requests.is_empty() {
        return Err(LoadError::Spec("at least one request template is needed"));
    }
    if spec.max_connections == 0 {
        return Err(LoadError::Spec("max_connections must be at least 1"));
    }
    if spec.timeout.is_zero() {
        return Err(LoadError::Spec("timeout must be greater than zero"));
    }
    if spec.open_connections > 0 && !spec.protocol.is_http2() {
        return Err(LoadError::Spec(
            "open_connections needs HTTP/2 or gRPC (HTTP/1.1 connections open on demand)",
        ));
    }
    let handle = Handle::try_current().map_err(|_| LoadError::NoRuntime)?;
    let target = Target::resolve(&spec.target, &spec.tls, spec.protocol).await?;
    let requests = spec
        .requests
        .iter()
        .enumerate()
        .map(|(i, t)| Prepared::new(i, t, &target, spec.protocol))
        .collect::<Result<Vec<_>, _>>()?;
    let schedule = spec.schedule.clone();
    let duration = schedule.duration();
    let total = schedule.total_requests();
    let high_us = us(duration + spec.drain + spec.timeout).saturating_add(1_000_000);
    let max_connections = spec.max_connections.max(spec.open_connections);
    let max_workers = match spec.protocol {
        Protocol::Http1 => max_connections,
        Protocol::Http2 | Protocol::Grpc => max_connections.saturating_mul(H2_STREAMS_PER_CONN),
    };
    // Pre-opened connections (HTTP/2, gRPC): all of them before the schedule's time zero, 64
    // handshakes at a time. One that fails to open is left out (the report's
    // `connections_opened` says how many did).
    let conns = Arc::new(ConnCounters::default());
    let mut opened = Vec::with_capacity(spec.open_connections);
    // Their drivers run from now on, owned by the run's task set (aborted when it ends).
    let mut tasks = JoinSet::new();
    let mut pending = JoinSet::new();
    let mut to_open = spec.open_connections;
    while to_open > 0 || !pending.is_empty() {
        while to_open > 0 && pending.len() < 64 {
            to_open -= 1;
            let (target, counters) = (target.clone(), conns.clone());
            pending.spawn(async move { connect_h2(&target, &counters).await });
        }
        if let Some(Ok(Ok((sender, driver)))) = pending.join_next().await {
            opened.push(sender);
            tasks.spawn_on(driver, &handle);
        }
    }
    // Let the pre-opened connections finish their handshakes (SETTINGS both ways, the server
    // accepting them) before time zero: otherwise the first requests wait behind them.
    if !opened.is_empty() {
        tokio::time::sleep(SETTLE).await;
    }
    let t0 = Instant::now() + START_DELAY;
    let shared = Arc::new(Shared {
        schedule,
        total,
        t0,
        timeout: spec.timeout,
        protocol: spec.protocol,
        max_connections,
        max_workers,
        grow_after: (spec.lag_threshold / 4).clamp(MIN_GROW_AFTER, MAX_GROW_AFTER),
        target,
        requests,
        handle,
        work: Dispatch::default(),
        claimed: AtomicU64::new(0),
        workers: AtomicUsize::new(0),
        starting: AtomicUsize::new(0),
        saturated: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        tasks: Mutex::new(tasks),
        rec: Mutex::new(Recorder::new(high_us, spec.lag_threshold)),
        all_done: Notify::new(),
        conns,
        h2: H2Pool::default(),
        count_events: spec.count_events,
        events: AtomicU64::new(0),
    });
    let guard = StopGuard(shared.clone());
    shared.h2.set_fixed(opened);
    if let Some(n) = &spec.on_start {
        n.notify_one();
    }
    {
        let s = shared.clone();
        std::thread::Builder::new()
            .name("fanout-load-pacer".into())
            .spawn(move || pacer(&s))
            .map_err(LoadError::Pacer)?;
    }

    let sched_end = t0 + duration;
    let hard_end = sched_end + spec.drain;
    let emit = |stats: Vec<SecondStats>, seconds: &mut Vec<SecondStats>| {
        for s in stats {
            if let Some(p) = progress {
                p(&s);
            }
            seconds.push(s);
        }
    };
    let mut seconds = Vec::new();
    let mut next_sec: u64 = 1;
    loop {
        let now = Instant::now();
        if now >= hard_end || (now >= sched_end && lock(&shared.rec).finished >= total) {
            break;
        }
        let tick_at = t0 + Duration::from_secs(next_sec) + TICK_SLACK;
        let wake = tick_at.min(if now < sched_end { sched_end } else { hard_end });
        tokio::select! {
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            _ = shared.all_done.notified() => {}
        }
        if Instant::now() >= tick_at {
            let closed = lock(&shared.rec).close_seconds(next_sec, &shared.schedule);
            emit(closed, &mut seconds);
            next_sec += 1;
        }
    }
    let end = Instant::now();
    shared.stop().shutdown().await;
    shared.h2.clear().await;
    drop(guard);

    let rec = lock(&shared.rec);
    let mut rec_seconds_end = rec.open_end();
    let sched_secs = duration.as_nanos().div_ceil(1_000_000_000) as u64;
    rec_seconds_end = rec_seconds_end.max(sched_secs);
    drop(rec);
    let closed = lock(&shared.rec).close_seconds(rec_seconds_end, &shared.schedule);
    emit(closed, &mut seconds);

    let mut rec = lock(&shared.rec);
    let second_histograms = std::mem::take(&mut rec.closed_histograms);
    let by_send_second = rec.by_send_second(sched_secs, &shared.schedule);
    let mut errors = rec.errors;
    errors.aborted_at_end = rec.sent.saturating_sub(rec.sent_finished);
    errors.not_sent = total.saturating_sub(rec.completed + errors.total());
    let duration_s = duration.as_secs_f64();
    let per_s = |n: u64| {
        if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        }
    };
    let non_ok = rec.completed - rec.ok + errors.total();
    let error_rate = if total > 0 {
        non_ok as f64 / total as f64
    } else {
        0.0
    };
    let late_fraction = if rec.sent > 0 {
        rec.late as f64 / rec.sent as f64
    } else {
        0.0
    };
    let lag_ms = LagStats::from_histogram(&rec.lag);

    let mut reasons = Vec::new();
    let lag_p99_us = if rec.lag.is_empty() {
        0
    } else {
        rec.lag.value_at_quantile(0.99)
    };
    if lag_p99_us > us(spec.lag_threshold) {
        let cause = if shared.saturated.load(Ordering::Relaxed) {
            format!(
                " (connection pool exhausted: all {} {} busy; raise max_connections or lower the rate)",
                max_connections,
                if spec.protocol.is_http2() {
                    "connections' streams"
                } else {
                    "connections"
                }
            )
        } else {
            " (the generator could not dispatch fast enough: CPU-bound or descheduled)".to_string()
        };
        reasons.push(format!(
            "generator lagged behind schedule: lag p99 {} > {}; {:.1}% of sends late{cause}",
            fmt_ms(lag_ms.p99),
            fmt_ms(spec.lag_threshold.as_secs_f64() * 1000.0),
            late_fraction * 100.0
        ));
    }
    if errors.not_sent > 0 {
        reasons.push(format!(
            "{} of {} requests could not be sent before the drain ended",
            errors.not_sent, total
        ));
    }
    let valid = reasons.is_empty();

    Ok(LoadReport {
        target: spec.target.clone(),
        protocol: spec.protocol,
        schedule: shared.schedule.to_string(),
        duration_s,
        elapsed_s: end.saturating_duration_since(t0).as_secs_f64(),
        offered: total,
        sent: rec.sent,
        completed: rec.completed,
        ok: rec.ok,
        rejected: rec.rejected,
        partial: rec.partial,
        offered_rps: per_s(total),
        achieved_rps: per_s(rec.completed),
        status_classes: rec.classes,
        errors,
        grpc_status: (spec.protocol == Protocol::Grpc).then(|| status_map(&rec.grpc_codes)),
        grpc_missing_status: (spec.protocol == Protocol::Grpc).then_some(rec.grpc_missing),
        error_rate,
        latency_ms: LatencyStats::from_histogram(&rec.latency),
        ok_latency_ms: LatencyStats::from_histogram(&rec.ok_latency),
        rejected_latency_ms: LatencyStats::from_histogram(&rec.rejected_latency),
        service_ms: LatencyStats::from_histogram(&rec.service),
        lag_ms,
        late_fraction,
        valid,
        invalid_reason: if valid {
            None
        } else {
            Some(reasons.join("; "))
        },
        connections_opened: shared.conns.opened.load(Ordering::Relaxed),
        max_connections_used: shared.conns.max_open.load(Ordering::Relaxed) as u64,
        bytes_received: rec.bytes,
        events: shared
            .count_events
            .then(|| shared.events.load(Ordering::Relaxed)),
        seconds,
        by_send_second,
        second_histograms,
        latency_hist: rec.latency.clone(),
        service_hist: rec.service.clone(),
        lag_hist: rec.lag.clone(),
    })
}
