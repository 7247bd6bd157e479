//! What the live page (`/ui`) records on the request path: per-step numbers of each route
//! ([`RouteStats`], a few relaxed atomic additions per finished step, kept per loaded config)
//! and the last slow and failed requests with a waterfall of their steps ([`Recent`], bounded
//! rings kept for the process, at most `admin.ui.record_per_second` entries per second each).
//!
//! The per-request part ([`RequestSteps`]) is a small inline vector filled as steps finish, and
//! per step the count of its calls and of the attempts they sent (retries and hedged copies
//! among them: [`AttemptCounts`], shared with the request's calls in their trace context and
//! told by the protocol client at each attempt, traced or not). It is dropped with the request
//! unless the request is slow or failed, so a request that is neither pays one allocation (the
//! counts), one push per step and a count per call and per attempt, and nothing else.

use fanout_config::UiConfig;
use fanout_flow::FlowError;
use fanout_flow::RoutePlan;
use fanout_flow::observe::StepEnd;
use fanout_flow::plan::StepPlan;
use fanout_layers::trace::AttemptCounts;
use fanout_runtime::hist::{AtomicHistogram, HistogramSnapshot, NS_PER_S};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Bounds of the page's step and route times, in nanoseconds: 50 µs … 10 s, finer than the
/// Prometheus latency buckets so that sub-millisecond steps get a p50 of their own.
pub const UI_NS: &[u64] = &[
    50_000,
    100_000,
    200_000,
    350_000,
    500_000,
    750_000,
    1_000_000,
    1_500_000,
    2_500_000,
    4_000_000,
    6_000_000,
    10_000_000,
    15_000_000,
    25_000_000,
    40_000_000,
    60_000_000,
    100_000_000,
    150_000_000,
    250_000_000,
    400_000_000,
    600_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

fn hist() -> AtomicHistogram {
    AtomicHistogram::new(UI_NS, NS_PER_S)
}

/// One step's numbers since the config was loaded.
#[derive(Debug)]
pub struct StepStats {
    /// Step times (start to end), in seconds.
    time: AtomicHistogram,
    /// Steps that failed the request.
    failed: AtomicU64,
    /// Optional steps that failed and gave their default.
    defaulted: AtomicU64,
}

/// One route's numbers since the config was loaded: its runs and each step's.
#[derive(Debug)]
pub struct RouteStat {
    /// Flow run times (admission slot held), in seconds.
    time: AtomicHistogram,
    /// Runs that ended in an error answer.
    failed: AtomicU64,
    /// By step index.
    steps: Vec<StepStats>,
}

/// Every route's numbers, by route index (a new table per loaded config).
#[derive(Debug)]
pub struct RouteStats {
    routes: Vec<RouteStat>,
}

impl RouteStats {
    /// Empty numbers for every route of a plan.
    pub fn new(routes: &[Arc<RoutePlan>]) -> RouteStats {
        RouteStats {
            routes: routes
                .iter()
                .map(|r| RouteStat {
                    time: hist(),
                    failed: AtomicU64::new(0),
                    steps: r
                        .steps
                        .iter()
                        .map(|_| StepStats {
                            time: hist(),
                            failed: AtomicU64::new(0),
                            defaulted: AtomicU64::new(0),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The numbers of route `index`.
    pub fn route(&self, index: usize) -> Option<&RouteStat> {
        self.routes.get(index)
    }
}

impl RouteStat {
    /// The run ended after `elapsed`, failed or not.
    pub fn ran(&self, elapsed: Duration, failed: bool) {
        self.time.record_duration(elapsed);
        if failed {
            self.failed.fetch_add(1, Relaxed);
        }
    }

    /// `{count, failed, sum_s, buckets}` of the route, and `steps`: the same of each step with
    /// `defaulted` (cumulative: the page takes the difference between two reads).
    pub fn json(&self) -> serde_json::Value {
        let steps: Vec<serde_json::Value> = self
            .steps
            .iter()
            .map(|s| {
                let mut v = hist_json(&s.time.snapshot());
                v["failed"] = s.failed.load(Relaxed).into();
                v["defaulted"] = s.defaulted.load(Relaxed).into();
                v
            })
            .collect();
        let mut v = hist_json(&self.time.snapshot());
        v["failed"] = self.failed.load(Relaxed).into();
        v["steps"] = steps.into();
        v
    }
}

fn hist_json(s: &HistogramSnapshot) -> serde_json::Value {
    serde_json::json!({
        "count": s.count,
        "sum_s": s.sum,
        "buckets": s.buckets.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
    })
}

/// The upper bounds of the page's buckets, in seconds (the last is `+Inf`, sent as `null`).
pub fn bounds_json() -> serde_json::Value {
    UI_NS
        .iter()
        .map(|&b| serde_json::Value::from(b as f64 / NS_PER_S))
        .chain(std::iter::once(serde_json::Value::Null))
        .collect()
}

/// How one step of a recorded request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// It gave its value.
    Ok,
    /// It failed and its default was used.
    Defaulted,
    /// It failed the request.
    Failed,
}

/// One finished step of a request, as the ring keeps it.
#[derive(Debug, Clone)]
struct StepRec {
    index: u32,
    /// Offsets from the request's arrival (a flow longer than 71 minutes saturates).
    start_us: u32,
    end_us: u32,
    outcome: StepOutcome,
    /// `error.code` of a failure.
    code: Option<Box<str>>,
}

/// The steps of one request as they finish, and the calls and attempts each made (cheap: inline
/// vectors behind an uncontended lock; dropped with the request unless it is recorded). The
/// attempts are counted by the request's calls in an `Arc` they share; a call that outlives the
/// request (a hedged copy still running, a shared call) counts into a record no longer read.
pub struct RequestSteps {
    start: Instant,
    inner: Mutex<Steps>,
    attempts: Arc<AttemptCounts>,
}

#[derive(Default)]
struct Steps {
    done: SmallVec<[StepRec; 6]>,
    /// Backend calls ended, by step index.
    calls: SmallVec<[u16; 6]>,
}

impl RequestSteps {
    /// The steps of a request that arrived at `start`.
    pub fn new(start: Instant) -> RequestSteps {
        RequestSteps {
            start,
            inner: Mutex::new(Steps::default()),
            attempts: Arc::default(),
        }
    }

    /// `step` ended (it started at `started`).
    pub fn step_finished(
        &self,
        stats: Option<&RouteStat>,
        step: &StepPlan,
        started: Instant,
        end: StepEnd<'_>,
    ) {
        let now = Instant::now();
        let (outcome, code) = match end {
            StepEnd::Ok => (StepOutcome::Ok, None),
            StepEnd::Defaulted(e) => (StepOutcome::Defaulted, Some(e.code().into())),
            StepEnd::Failed(e) => (StepOutcome::Failed, Some(e.code().into())),
        };
        if let Some(s) = stats.and_then(|r| r.steps.get(step.index)) {
            s.time
                .record_duration(now.saturating_duration_since(started));
            match outcome {
                StepOutcome::Ok => {}
                StepOutcome::Defaulted => {
                    s.defaulted.fetch_add(1, Relaxed);
                }
                StepOutcome::Failed => {
                    s.failed.fetch_add(1, Relaxed);
                }
            }
        }
        let rec = StepRec {
            index: u32::try_from(step.index).unwrap_or(u32::MAX),
            start_us: micros32(started.saturating_duration_since(self.start)),
            end_us: micros32(now.saturating_duration_since(self.start)),
            outcome,
            code,
        };
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .done
            .push(rec);
    }

    /// A backend call of `step` ended.
    pub fn call_finished(&self, step: &StepPlan) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.calls.len() <= step.index {
            g.calls.resize(step.index + 1, 0);
        }
        if let Some(c) = g.calls.get_mut(step.index) {
            *c = c.saturating_add(1);
        }
    }

    /// Where the request's calls count their attempts (an `Arc` clone).
    pub fn counter(&self) -> Arc<AttemptCounts> {
        self.attempts.clone()
    }
}

fn micros32(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One recorded request: what the page lists and draws as a waterfall.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Recorded {
    /// Its place in the order requests were recorded (both lists share one sequence, from 1):
    /// `GET /ui/api/state?after=N` sends only the entries past `N`.
    pub seq: u64,
    /// Unix time of its arrival, in milliseconds.
    pub at_unix_ms: u64,
    /// Its request id.
    pub request_id: String,
    /// `METHOD /pattern` of its route.
    pub route: String,
    /// The path it asked for (never the query string).
    pub path: String,
    /// The status it was answered (for a flow failure, the error's).
    pub status: u16,
    /// From its arrival to the end of its flow, in microseconds.
    pub total_us: u64,
    /// The step that failed the request, if one did.
    pub failed_step: Option<String>,
    /// `error.code` of the failure.
    pub code: Option<String>,
    /// Why it failed: the safe message (and the backend), or the log's detail with
    /// `admin.ui.error_detail`.
    pub error: Option<String>,
    /// Its steps in the order they started.
    pub steps: Vec<RecordedStep>,
}

/// One step of a recorded request.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecordedStep {
    /// Step name.
    pub name: String,
    /// Start, from the request's arrival, in microseconds.
    pub start_us: u64,
    /// End, likewise.
    pub end_us: u64,
    /// How it ended.
    pub outcome: StepOutcome,
    /// `error.code` when it failed.
    pub code: Option<String>,
    /// Backend calls it made (a `for_each` step one per element; retries and hedged copies
    /// are within one call).
    pub calls: u16,
    /// Attempts its calls sent to their backends: first attempts, retries and hedged copies
    /// (none for a call served by a cache or joined to another request's identical call).
    pub attempts: u16,
    /// Of the attempts, those the retry layer sent after a failed one.
    pub retries: u16,
    /// Of the attempts, the hedged copies (sent while the first was still waiting).
    pub hedges: u16,
}

/// A bounded ring of recorded requests with its per-second cap.
struct Ring {
    cap: usize,
    items: Mutex<VecDeque<Arc<Recorded>>>,
    /// Requests that qualified, recorded or not.
    seen: AtomicU64,
    /// (the second, entries recorded in it) packed: second << 20 | count.
    window: AtomicU64,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            cap,
            items: Mutex::new(VecDeque::with_capacity(cap.min(1024))),
            seen: AtomicU64::new(0),
            window: AtomicU64::new(0),
        }
    }

    /// Whether one more entry may be recorded in second `sec` (at most `per_second`).
    fn admit(&self, sec: u64, per_second: u32) -> bool {
        self.seen.fetch_add(1, Relaxed);
        if self.cap == 0 {
            return false;
        }
        let mut cur = self.window.load(Relaxed);
        loop {
            let (s, n) = (cur >> 20, cur & 0xF_FFFF);
            let next = if s == sec {
                if n >= u64::from(per_second) {
                    return false;
                }
                cur + 1
            } else {
                (sec << 20) | 1
            };
            match self
                .window
                .compare_exchange_weak(cur, next, Relaxed, Relaxed)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Keep `r`, numbered from `seq` (under the ring's lock, so a ring's entries are in
    /// sequence order).
    fn push(&self, mut r: Recorded, seq: &AtomicU64) {
        let mut g = self.items.lock().unwrap_or_else(|p| p.into_inner());
        r.seq = seq.fetch_add(1, Relaxed) + 1;
        while g.len() >= self.cap {
            g.pop_front();
        }
        g.push_back(Arc::new(r));
    }

    /// The entries recorded after `after` (all with 0), newest first, and `oldest_seq`, the
    /// sequence number of the oldest entry still kept (a client drops what it holds below it):
    /// a poll that asks for what changed costs what changed, not the ring's size.
    fn json(&self, after: u64) -> serde_json::Value {
        let g = self.items.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<Arc<Recorded>> = g
            .iter()
            .rev()
            .take_while(|r| r.seq > after)
            .cloned()
            .collect();
        let oldest = g.front().map(|r| r.seq);
        drop(g);
        let items: Vec<serde_json::Value> = new
            .iter()
            .map(|r| serde_json::to_value(&**r).unwrap_or_default())
            .collect();
        serde_json::json!({
            "capacity": self.cap,
            "seen": self.seen.load(Relaxed),
            "oldest_seq": oldest,
            "requests": items,
        })
    }
}

/// The last slow and failed requests (process-lived: a reload keeps them).
pub struct Recent {
    slow: Ring,
    failed: Ring,
    /// The last sequence number given (both rings).
    seq: AtomicU64,
    threshold: Duration,
    per_second: u32,
    error_detail: bool,
}

/// What a finished run tells [`Recent::finish`].
pub struct Finished<'a> {
    /// The request's steps.
    pub steps: RequestSteps,
    /// The route it ran.
    pub route: &'a RoutePlan,
    /// `METHOD /pattern`.
    pub route_name: &'a str,
    /// The path asked for.
    pub path: &'a str,
    /// Its request id.
    pub request_id: &'a http::HeaderValue,
    /// How the flow ended: its status, or its error.
    pub result: Result<u16, &'a FlowError>,
}

/// A request of a matched route refused before its flow ran (authentication, rate limit,
/// admission, body limits, a bad request), for [`Recent::refused`].
pub struct Refused<'a> {
    /// When it arrived.
    pub start: Instant,
    /// `METHOD /pattern`.
    pub route_name: &'a str,
    /// The path asked for.
    pub path: &'a str,
    /// Its request id.
    pub request_id: &'a http::HeaderValue,
    /// The status it was answered.
    pub status: u16,
    /// The answer's `error.code`.
    pub code: &'a str,
    /// The answer's message (safe for the client).
    pub message: &'a str,
    /// The log's detail, shown only with `admin.ui.error_detail`.
    pub detail: Option<&'a str>,
}

impl Recent {
    /// Empty rings sized by `admin.ui`.
    pub fn new(cfg: &UiConfig) -> Recent {
        Recent {
            slow: Ring::new(cfg.slow_requests),
            failed: Ring::new(cfg.failed_requests),
            seq: AtomicU64::new(0),
            threshold: cfg.slow_threshold.0,
            per_second: cfg.record_per_second,
            error_detail: cfg.error_detail,
        }
    }

    /// A run ended: record it when it failed or was slow (within the per-second cap).
    pub fn finish(&self, f: Finished<'_>, stats: Option<&RouteStat>) {
        let elapsed = f.steps.start.elapsed();
        let failed = f.result.is_err();
        if let Some(s) = stats {
            s.ran(elapsed, failed);
        }
        let slow = elapsed >= self.threshold;
        if !failed && !slow {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let ring = if failed { &self.failed } else { &self.slow };
        if !ring.admit(now.as_secs(), self.per_second) {
            return;
        }
        let arrived = now.saturating_sub(elapsed);
        let inner = f
            .steps
            .inner
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        let attempts = &f.steps.attempts;
        let mut steps: Vec<RecordedStep> = inner
            .done
            .into_iter()
            .map(|s| {
                let n = attempts.step(s.index as usize);
                RecordedStep {
                    name: f
                        .route
                        .steps
                        .get(s.index as usize)
                        .map_or_else(String::new, |p| p.name.to_string()),
                    start_us: u64::from(s.start_us),
                    end_us: u64::from(s.end_us),
                    outcome: s.outcome,
                    code: s.code.map(String::from),
                    calls: inner.calls.get(s.index as usize).copied().unwrap_or(0),
                    attempts: n.attempts,
                    retries: n.retries,
                    hedges: n.hedges,
                }
            })
            .collect();
        steps.sort_by_key(|s| (s.start_us, s.end_us));
        let (status, failed_step, code, error) = match f.result {
            Ok(status) => (status, None, None, None),
            Err(e) => (
                e.status(),
                e.step.as_deref().map(str::to_string),
                Some(e.code().to_string()),
                Some(self.why(e)),
            ),
        };
        ring.push(
            Recorded {
                seq: 0,
                at_unix_ms: u64::try_from(arrived.as_millis()).unwrap_or(u64::MAX),
                request_id: String::from_utf8_lossy(f.request_id.as_bytes()).into_owned(),
                route: f.route_name.to_string(),
                path: f.path.to_string(),
                status,
                total_us: micros(elapsed),
                failed_step,
                code,
                error,
                steps,
            },
            &self.seq,
        );
    }

    /// A request was refused before its flow ran: listed with the failed ones (within the same
    /// per-second cap), with its status and code and no steps.
    pub fn refused(&self, r: Refused<'_>) {
        let elapsed = r.start.elapsed();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if !self.failed.admit(now.as_secs(), self.per_second) {
            return;
        }
        let mut error = r.message.to_string();
        if self.error_detail
            && let Some(d) = r.detail
        {
            error.push_str(": ");
            error.push_str(d);
        }
        self.failed.push(
            Recorded {
                seq: 0,
                at_unix_ms: u64::try_from(now.saturating_sub(elapsed).as_millis())
                    .unwrap_or(u64::MAX),
                request_id: String::from_utf8_lossy(r.request_id.as_bytes()).into_owned(),
                route: r.route_name.to_string(),
                path: r.path.to_string(),
                status: r.status,
                total_us: micros(elapsed),
                failed_step: None,
                code: Some(r.code.to_string()),
                error: Some(error),
                steps: Vec::new(),
            },
            &self.seq,
        );
    }

    /// Why `e` failed, as the page shows it: the safe message and the backend, and the log's
    /// detail only with `admin.ui.error_detail` (it may hold a backend body excerpt).
    fn why(&self, e: &FlowError) -> String {
        let mut s = e.message.clone();
        if let Some(b) = &e.backend {
            s.push_str(&format!(" [backend `{b}`]"));
        }
        if let Some(src) = &e.source {
            s.push_str(&format!(" ({:?})", src.kind));
        }
        if self.error_detail
            && let Some(d) = &e.detail
        {
            s.push_str(": ");
            s.push_str(d);
        }
        s
    }

    /// `{cursor, slow: {capacity, seen, threshold_ms, oldest_seq, requests}, failed: {…}}`,
    /// the requests recorded after `after` newest first (`after` 0: all kept); `cursor` is the
    /// last sequence number given, the `after` of the next poll.
    pub fn json(&self, after: u64) -> serde_json::Value {
        let cursor = self.seq.load(Relaxed);
        let mut slow = self.slow.json(after);
        slow["threshold_ms"] = (self.threshold.as_secs_f64() * 1000.0).into();
        serde_json::json!({
            "cursor": cursor,
            "slow": slow,
            "failed": self.failed.json(after),
            "record_per_second": self.per_second,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_newest_and_caps_each_second() {
        let r = Ring::new(3);
        let mk = |i: u64| Recorded {
            seq: 0,
            at_unix_ms: i,
            request_id: i.to_string(),
            route: String::new(),
            path: String::new(),
            status: 500,
            total_us: 0,
            failed_step: None,
            code: None,
            error: None,
            steps: Vec::new(),
        };
        let seq = AtomicU64::new(0);
        let mut kept = 0;
        for i in 0..10 {
            if r.admit(7, 4) {
                r.push(mk(i), &seq);
                kept += 1;
            }
        }
        assert_eq!(kept, 4, "at most 4 a second");
        assert!(r.admit(8, 4), "a new second admits again");
        r.push(mk(99), &seq);
        // Only what came after a cursor; the oldest kept says what a client may drop.
        let since = r.json(4);
        assert_eq!(since["requests"].as_array().unwrap().len(), 1);
        assert_eq!(since["requests"][0]["seq"], 5);
        assert_eq!(since["oldest_seq"], 3);
        assert_eq!(r.json(5)["requests"].as_array().unwrap().len(), 0);
        let v = r.json(0);
        assert_eq!(v["seen"], 11);
        let ids: Vec<&str> = v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["request_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["99", "3", "2"], "newest first, bounded to 3");
    }
}
