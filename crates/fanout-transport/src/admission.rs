//! Admission control (R2): a concurrency limit (static, or adaptive — see [`crate::limiter`]) with
//! a small bounded CoDel queue in front, priority classes and per-route limits. A request either
//! gets a slot at once, waits in the queue a short while (never past its own deadline), or is
//! rejected immediately with 503 + `Retry-After` — before any flow work, so a rejection costs
//! almost nothing and overload never turns into a queue of requests that time out.
//!
//! Rules:
//! - **Admission**: a request of class C runs at once if `in_flight < cap(C)` (with
//!   `cap(critical) = limit`, `cap(C) = max(1, ceil(limit × share(C)))` otherwise) and its route's
//!   own `max_concurrency`, if any, is not reached.
//! - **Queue**: otherwise it waits in one bounded queue (`queue` entries in total, one FIFO per
//!   class). When the queue is full, a critical or normal request evicts the oldest waiter of a
//!   lower class (which is rejected as `queue full`); if there is none, it is rejected. A
//!   sheddable request never queues while a critical or normal request is waiting.
//! - **CoDel + adaptive LIFO**: when the queue has not been empty for `codel.interval` (a standing
//!   queue), a newly queued request may wait only `codel.target` instead of `queue_timeout`, and
//!   waiters are served newest first; FIFO otherwise. The queue stops standing once it has stayed
//!   empty for `codel.target`: under overload it empties for an instant whenever several slots
//!   free at once, and that must not hand the next 100 ms of newcomers the long `queue_timeout`
//!   (in the `overload` lab that alone put the rejection p99 at 21 ms instead of ~7 ms).
//! - **Hand-off**: a released slot goes to the next eligible waiter, critical first, then normal,
//!   then sheddable; waiters whose wait has already run out or whose client is gone are skipped
//!   without losing the slot.
//! - **Adaptive limit**: each admitted request that ran its flow feeds its latency (admission →
//!   release) to the gradient limit, which is recomputed lazily on admit/release once its window
//!   has elapsed (no timer task).
//!
//! State is one `std::sync::Mutex`, held only for short, non-async critical sections.

use crate::limiter::{GradientLimit, GradientParams};
use fanout_config::{Priority, RouteAdmission};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Priority classes, indexed by [`class_index`]: critical, normal, sheddable.
const CLASSES: usize = 3;
const CLASS_NAMES: [&str; CLASSES] = ["critical", "normal", "sheddable"];
const CRITICAL: usize = 0;
const NORMAL: usize = 1;
const SHEDDABLE: usize = 2;

/// Why a request was rejected, finer than [`Rejection`] (for metrics), indexed like
/// [`REASON_NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// No slot and the queue full (or a sheddable request while others wait).
    QueueFull = 0,
    /// Pushed out of the full queue by a higher-priority request.
    Evicted = 1,
    /// Waited in the queue for `queue_timeout` (or its own deadline).
    QueueTimeout = 2,
    /// Waited for `codel.target` under a standing queue.
    Codel = 3,
    /// Not queued: its expected wait was longer than it may wait (`predict_wait`).
    ExpectedWait = 4,
}

const REASONS: usize = 5;
/// The label of each rejection reason (`fanout_admission_rejections_total{reason}`).
pub const REASON_NAMES: [&str; REASONS] = [
    "queue_full",
    "evicted",
    "queue_timeout",
    "codel",
    "expected_wait",
];

/// Weight of the newest sample in the mean time a request holds a slot (TCP's SRTT: 1/8).
const HOLD_ALPHA: f64 = 0.125;
/// Weight of the newest sample in the mean deviation of that time (TCP's RTTVAR: 1/4).
const HOLD_BETA: f64 = 0.25;

impl Reason {
    fn rejection(self) -> Rejection {
        match self {
            Reason::QueueFull | Reason::Evicted => Rejection::QueueFull,
            Reason::QueueTimeout | Reason::Codel => Rejection::Waited,
            Reason::ExpectedWait => Rejection::WouldWait,
        }
    }
}

/// One priority class's admission state now, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassStatus {
    /// `critical`, `normal` or `sheddable`.
    pub name: &'static str,
    /// Slots this class may fill under the current limit.
    pub limit: u64,
    /// Requests of this class holding a slot.
    pub in_flight: u64,
    /// Requests of this class waiting in the queue.
    pub queued: u64,
    /// Rejections so far, by reason (in the order of [`REASON_NAMES`]).
    pub rejected: [u64; REASONS],
}

fn class_index(p: Priority) -> usize {
    match p {
        Priority::Critical => CRITICAL,
        Priority::Normal => NORMAL,
        Priority::Sheddable => SHEDDABLE,
    }
}

/// How the requests of one route are admitted: their priority class and, if the route has one,
/// its own concurrency limit. The default is `normal` without a route limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteClass {
    priority: Priority,
    /// Index into the admission's route table, for routes with their own limit.
    route: Option<usize>,
}

impl RouteClass {
    /// The priority class.
    pub fn priority(&self) -> Priority {
        self.priority
    }
}

/// The limiter of one listener (clones share it).
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Every slot it may use is busy and the queue is full (or it was evicted from the queue by a
    /// higher-priority request, or it is sheddable and higher-priority requests are waiting).
    QueueFull,
    /// Waited in the queue longer than allowed (`queue_timeout`, `codel.target` under a standing
    /// queue, or its own deadline).
    Waited,
    /// Not queued: a slot would not have freed within the time it may wait (`predict_wait`).
    WouldWait,
}

/// A slot: held while the request runs; dropping it frees the slot (and hands it to the next
/// waiter). Call [`Permit::completed`] once the flow has run so its latency feeds the adaptive
/// limit; requests that end earlier (bad body, client gone) give no sample.
pub struct Permit {
    inner: Arc<Inner>,
    route: Option<usize>,
    class: usize,
    started: Instant,
    /// False for a permit that was never handed out (its release is done by the caller).
    armed: bool,
    sample: bool,
}

impl Permit {
    /// The flow has run: record this request's latency when the slot is released.
    pub fn completed(&mut self) {
        self.sample = true;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            Inner::release(
                &self.inner,
                self.route,
                self.class,
                self.started,
                self.sample,
            );
        }
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("route", &self.route)
            .field("started", &self.started)
            .finish()
    }
}

struct Inner {
    max: usize,
    queue_max: usize,
    queue_timeout: Duration,
    codel_target: Duration,
    codel_interval: Duration,
    /// Share of the limit per class (critical is always 1).
    shares: [f64; CLASSES],
    /// `predict_wait`: refuse at once a request whose expected wait is longer than it may wait.
    predict: bool,
    state: Mutex<State>,
}

struct RouteSlot {
    name: String,
    max: usize,
    in_flight: usize,
    rejected: u64,
    /// How long a request of this route holds its slot, over requests that ran their flow
    /// (`None` before the first; tracked with `predict_wait`).
    hold: Option<Hold>,
    /// When each request of this route holding a slot got it (tracked with `predict_wait`).
    running: Vec<Instant>,
}

/// How long requests hold a slot: exponentially weighted mean and mean deviation, in seconds, as
/// TCP estimates a round trip (RFC 6298).
#[derive(Debug, Clone, Copy)]
struct Hold {
    mean: f64,
    dev: f64,
}

impl Hold {
    fn update(old: Option<Hold>, sample: f64) -> Hold {
        match old {
            None => Hold {
                mean: sample,
                dev: sample / 2.0,
            },
            Some(h) => Hold {
                dev: h.dev + HOLD_BETA * ((sample - h.mean).abs() - h.dev),
                mean: h.mean + HOLD_ALPHA * (sample - h.mean),
            },
        }
    }

    /// A hold that has lasted this long is very likely over by then: mean + 4 × deviation (TCP's
    /// retransmission timeout).
    fn likely_max(&self) -> f64 {
        self.mean + 4.0 * self.dev
    }
}

struct Waiter {
    id: u64,
    tx: oneshot::Sender<Permit>,
    route: Option<usize>,
    /// When its wait runs out; a waiter past it is not handed a slot.
    until: Instant,
    /// Queued under a standing queue (so it got `codel.target`).
    codel: bool,
}

#[derive(Default)]
struct Counters {
    admitted: [u64; CLASSES],
    rejected: [u64; CLASSES],
    queue_full: u64,
    waited: u64,
    codel: u64,
    expected_wait: u64,
    evicted: u64,
    abandoned: u64,
    /// Rejections by class and reason.
    by_reason: [[u64; REASONS]; CLASSES],
}

struct State {
    limit: usize,
    in_flight: usize,
    /// `in_flight` by class.
    in_flight_by: [usize; CLASSES],
    routes: Vec<RouteSlot>,
    queues: [VecDeque<Waiter>; CLASSES],
    queued: usize,
    /// Since when the queue has been non-empty (`None` while it is empty).
    nonempty_since: Option<Instant>,
    /// Since when the queue has been empty (`None` while it is not), and since when it had been
    /// non-empty before that.
    empty_since: Option<(Instant, Instant)>,
    /// The queue was found standing and has not stayed empty for `codel.target` since.
    standing: bool,
    next_id: u64,
    limiter: Option<GradientLimit>,
    /// How long a request holds a slot, over all routes (`None` before the first sample).
    hold: Option<Hold>,
    c: Counters,
}

impl State {
    /// A standing queue at `now`: it has not been empty for `interval`, or it was standing and
    /// has not stayed empty for `target` since.
    fn standing(&self, now: Instant, interval: Duration, target: Duration) -> bool {
        if self.queued == 0 {
            return self.empty_since.is_some_and(|(empty, busy_from)| {
                (self.standing || empty.saturating_duration_since(busy_from) >= interval)
                    && now.saturating_duration_since(empty) < target
            });
        }
        self.standing
            || self
                .nonempty_since
                .is_some_and(|t| now.saturating_duration_since(t) >= interval)
    }

    /// [`State::standing`], remembered (call before deciding on a newcomer).
    fn refresh_standing(&mut self, now: Instant, interval: Duration, target: Duration) -> bool {
        self.standing = self.standing(now, interval, target);
        self.standing
    }

    fn enqueued(&mut self, now: Instant) {
        if self.queued == 0 {
            self.nonempty_since = Some(now);
            self.empty_since = None;
        }
        self.queued += 1;
    }

    fn remove_waiter(&mut self, class: usize, id: u64) -> Option<Waiter> {
        let i = self.queues[class].iter().position(|w| w.id == id)?;
        let w = self.queues[class].remove(i)?;
        self.dequeued();
        Some(w)
    }

    fn dequeued(&mut self) {
        self.queued = self.queued.saturating_sub(1);
        if self.queued == 0
            && let Some(busy_from) = self.nonempty_since.take()
        {
            self.empty_since = Some((Instant::now(), busy_from));
        }
    }

    fn route_fits(&self, route: Option<usize>) -> bool {
        route.is_none_or(|r| self.routes.get(r).is_none_or(|rs| rs.in_flight < rs.max))
    }

    /// How long a request of `class` on `route` queued now would likely wait for a slot, or
    /// `None` without an estimate yet. When its route is full: the oldest running request of
    /// the route is taken to end by the time it has held its slot the route's mean hold time
    /// plus four times its mean deviation (a hold that varies is waited for with a margin), and each
    /// waiter of the route ahead adds the mean ÷ the route's slots. Otherwise (the class's cap is
    /// reached): (waiters ahead + 1) × the mean hold over all routes ÷ the cap. Waiters ahead are
    /// those of higher classes and, served first-in-first-out (`lifo` false), of its own.
    fn expected_wait(
        &self,
        class: usize,
        route: Option<usize>,
        lifo: bool,
        cap: usize,
        now: Instant,
    ) -> Option<Duration> {
        let classes = if lifo { 0..class } else { 0..class + 1 };
        let full_route = route
            .and_then(|r| self.routes.get(r).map(|rs| (r, rs)))
            .filter(|(_, rs)| rs.in_flight >= rs.max);
        let secs = if let Some((r, rs)) = full_route {
            let hold = rs.hold?;
            let ahead = self.queues[classes]
                .iter()
                .flatten()
                .filter(|w| w.route == Some(r))
                .count() as f64;
            let per_slot = hold.mean / rs.max.max(1) as f64;
            match rs.running.iter().min() {
                Some(&oldest) => {
                    let age = now.saturating_duration_since(oldest).as_secs_f64();
                    (hold.likely_max() - age).max(0.0) + ahead * per_slot
                }
                None => (ahead + 1.0) * per_slot,
            }
        } else {
            let hold = self.hold?;
            let ahead: usize = self.queues[classes].iter().map(VecDeque::len).sum();
            (ahead as f64 + 1.0) * hold.mean / cap.max(1) as f64
        };
        Duration::try_from_secs_f64(secs).ok()
    }
}

impl Admission {
    /// A limiter from the config (static limit `max_concurrency`, or the adaptive limit starting
    /// at `adaptive.initial`).
    pub fn new(cfg: &fanout_config::Admission) -> Admission {
        let max = cfg.max_concurrency.max(1);
        let now = Instant::now();
        let limiter = cfg
            .adaptive
            .as_ref()
            .map(|a| GradientLimit::new(GradientParams::from_config(a, max), now.into_std()));
        let limit = limiter.as_ref().map_or(max, GradientLimit::limit);
        let share = |v: f64| {
            if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                1.0
            }
        };
        Admission {
            inner: Arc::new(Inner {
                max,
                queue_max: cfg.queue,
                queue_timeout: cfg.queue_timeout.0,
                codel_target: cfg.codel.target.0,
                codel_interval: cfg.codel.interval.0,
                shares: [1.0, share(cfg.shares.normal), share(cfg.shares.sheddable)],
                predict: cfg.predict_wait,
                state: Mutex::new(State {
                    limit,
                    in_flight: 0,
                    in_flight_by: [0; CLASSES],
                    routes: Vec::new(),
                    queues: Default::default(),
                    queued: 0,
                    nonempty_since: None,
                    empty_since: None,
                    standing: false,
                    next_id: 0,
                    limiter,
                    hold: None,
                    c: Counters::default(),
                }),
            }),
        }
    }

    /// The admission class of a route named `name` (e.g. `GET /users/{id}`, shown in the status)
    /// with settings `cfg`; a route with its own `max_concurrency` gets its own counter.
    pub fn route_class(&self, name: &str, cfg: &RouteAdmission) -> RouteClass {
        // A route keeps its slot across config reloads (found by name): requests admitted under
        // the old config still count, and reloading does not add slots.
        let route = cfg.max_concurrency.map(|max| {
            let mut s = self.inner.lock();
            if let Some(i) = s.routes.iter().position(|r| r.name == name) {
                if let Some(r) = s.routes.get_mut(i) {
                    r.max = max.max(1);
                }
                return i;
            }
            s.routes.push(RouteSlot {
                name: name.to_string(),
                max: max.max(1),
                in_flight: 0,
                rejected: 0,
                hold: None,
                running: Vec::new(),
            });
            s.routes.len() - 1
        });
        RouteClass {
            priority: cfg.priority,
            route,
        }
    }

    /// Get a slot (held until the permit is dropped), or the reason for rejecting.
    pub async fn admit(&self, rc: RouteClass, deadline: Instant) -> Result<Permit, Rejection> {
        let inner = &self.inner;
        let class = class_index(rc.priority);
        let now = Instant::now();
        let (id, mut rx, until) = {
            let mut s = inner.lock();
            if inner.tick(&mut s, now) {
                inner.dispatch(&mut s, now);
            }
            if s.in_flight < inner.cap(s.limit, class) && s.route_fits(rc.route) {
                return Ok(inner.grant(&mut s, class, rc.route, now));
            }
            if deadline <= now {
                return Err(inner.reject(&mut s, class, rc.route, Reason::QueueTimeout));
            }
            if class == SHEDDABLE && (s.queues[CRITICAL].len() + s.queues[NORMAL].len()) > 0 {
                return Err(inner.reject(&mut s, class, rc.route, Reason::QueueFull));
            }
            let full = s.queued >= inner.queue_max;
            if full && !s.queues[class + 1..].iter().any(|q| !q.is_empty()) {
                // Nobody of a lower class to evict.
                return Err(inner.reject(&mut s, class, rc.route, Reason::QueueFull));
            }
            let standing = s.refresh_standing(now, inner.codel_interval, inner.codel_target);
            let wait = if standing {
                inner.codel_target
            } else {
                inner.queue_timeout
            };
            let until = now.checked_add(wait).map_or(deadline, |t| t.min(deadline));
            if inner.predict {
                let cap = inner.cap(s.limit, class);
                let may_wait = until.saturating_duration_since(now);
                if s.expected_wait(class, rc.route, standing, cap, now)
                    .is_some_and(|w| w > may_wait)
                {
                    return Err(inner.reject(&mut s, class, rc.route, Reason::ExpectedWait));
                }
            }
            if full && !inner.evict(&mut s, class) {
                return Err(inner.reject(&mut s, class, rc.route, Reason::QueueFull));
            }
            let (tx, rx) = oneshot::channel();
            let id = s.next_id;
            s.next_id += 1;
            s.queues[class].push_back(Waiter {
                id,
                tx,
                route: rc.route,
                until,
                codel: standing,
            });
            s.enqueued(now);
            (id, rx, until)
        };
        // Declared after `rx`, so dropped before it: a cancelled wait leaves the queue first, and
        // a slot handed over meanwhile is released when `rx` drops with it.
        let mut waiting = Waiting {
            inner,
            class,
            id,
            armed: true,
        };
        let got = tokio::time::timeout_at(until, &mut rx).await;
        waiting.armed = false;
        match got {
            Ok(Ok(permit)) => Ok(permit),
            // Evicted by a higher-priority request (counted then).
            Ok(Err(_)) => Err(Rejection::QueueFull),
            Err(_) => {
                if inner.expire(class, id, rc.route) {
                    Err(Rejection::Waited)
                } else {
                    // Handed a slot (or evicted) just as the wait ran out.
                    rx.try_recv().map_err(|_| Rejection::QueueFull)
                }
            }
        }
    }

    /// Each priority class's limit, slots, queue and rejections now (for metrics).
    pub fn classes(&self) -> Vec<ClassStatus> {
        let inner = &self.inner;
        let s = inner.lock();
        (0..CLASSES)
            .map(|c| ClassStatus {
                name: CLASS_NAMES[c],
                limit: inner.cap(s.limit, c) as u64,
                in_flight: s.in_flight_by[c] as u64,
                queued: s.queues[c].len() as u64,
                rejected: s.c.by_reason[c],
            })
            .collect()
    }

    /// The current limit (static `max_concurrency`, or the adaptive limit now).
    pub fn limit(&self) -> usize {
        self.inner.lock().limit
    }

    /// Counters for the status endpoint.
    pub fn status(&self) -> serde_json::Value {
        let inner = &self.inner;
        let now = Instant::now();
        let s = inner.lock();
        let by_class = |v: [u64; CLASSES]| -> serde_json::Value {
            CLASS_NAMES
                .iter()
                .zip(v)
                .map(|(n, v)| (n.to_string(), v.into()))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        let adaptive = s.limiter.as_ref().map(|l| {
            serde_json::json!({
                "min": l.params().min,
                "initial": l.params().initial,
                "estimated": l.estimated(),
                "short_rtt_ms": l.short_rtt_s().map(|v| v * 1e3),
                "long_rtt_ms": l.long_rtt_s() * 1e3,
                "updates": l.updates(),
            })
        });
        let routes: serde_json::Map<String, serde_json::Value> = s
            .routes
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    serde_json::json!({
                        "max_concurrency": r.max,
                        "in_flight": r.in_flight,
                        "rejected": r.rejected,
                        "hold_ms": r.hold.map(|h| serde_json::json!({
                            "mean": h.mean * 1e3,
                            "deviation": h.dev * 1e3,
                        })),
                    }),
                )
            })
            .collect();
        let caps = [CRITICAL, NORMAL, SHEDDABLE].map(|c| inner.cap(s.limit, c) as u64);
        serde_json::json!({
            "limit": s.limit,
            "max_concurrency": inner.max,
            "adaptive": adaptive,
            "in_flight": s.in_flight,
            "queued": s.queued,
            "standing_queue": s.standing(now, inner.codel_interval, inner.codel_target),
            "admitted": s.c.admitted.iter().sum::<u64>(),
            "rejected_queue_full": s.c.queue_full,
            "rejected_waited_too_long": s.c.waited,
            "rejected_codel": s.c.codel,
            "rejected_expected_wait": s.c.expected_wait,
            "evicted": s.c.evicted,
            "abandoned_in_queue": s.c.abandoned,
            "admitted_by_priority": by_class(s.c.admitted),
            "rejected_by_priority": by_class(s.c.rejected),
            "limit_by_priority": by_class(caps),
            "routes": routes,
        })
    }
}

/// Removes a waiter from the queue when its wait is cancelled (client gone).
struct Waiting<'a> {
    inner: &'a Arc<Inner>,
    class: usize,
    id: u64,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.inner.lock();
            if s.remove_waiter(self.class, self.id).is_some() {
                s.c.abandoned += 1;
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Slots class `class` may fill under `limit`.
    fn cap(&self, limit: usize, class: usize) -> usize {
        if class == CRITICAL {
            return limit;
        }
        let share = self.shares.get(class).copied().unwrap_or(1.0);
        (((limit as f64) * share).ceil() as usize).clamp(1, limit.max(1))
    }

    /// Count and hand out a slot.
    fn grant(
        self: &Arc<Self>,
        s: &mut State,
        class: usize,
        route: Option<usize>,
        now: Instant,
    ) -> Permit {
        s.c.admitted[class] += 1;
        s.in_flight += 1;
        s.in_flight_by[class] += 1;
        if let Some(r) = route.and_then(|r| s.routes.get_mut(r)) {
            r.in_flight += 1;
            if self.predict {
                r.running.push(now);
            }
        }
        let in_flight = s.in_flight;
        if let Some(l) = s.limiter.as_mut() {
            l.on_admit(in_flight);
        }
        Permit {
            inner: self.clone(),
            route,
            class,
            started: now,
            armed: true,
            sample: false,
        }
    }

    /// Free a slot of `class` granted at `started`: a released permit, or one never handed out
    /// (`uncount`: its admission is un-counted too).
    fn free(s: &mut State, route: Option<usize>, class: usize, started: Instant, uncount: bool) {
        if uncount {
            s.c.admitted[class] = s.c.admitted[class].saturating_sub(1);
        }
        s.in_flight_by[class] = s.in_flight_by[class].saturating_sub(1);
        s.in_flight = s.in_flight.saturating_sub(1);
        if let Some(r) = route.and_then(|r| s.routes.get_mut(r)) {
            r.in_flight = r.in_flight.saturating_sub(1);
            // Start times are interchangeable: any entry equal to `started` is this slot's.
            if let Some(i) = r.running.iter().position(|t| *t == started) {
                r.running.swap_remove(i);
            }
        }
    }

    fn reject(&self, s: &mut State, class: usize, route: Option<usize>, why: Reason) -> Rejection {
        s.c.rejected[class] += 1;
        s.c.by_reason[class][why as usize] += 1;
        if let Some(r) = route.and_then(|r| s.routes.get_mut(r)) {
            r.rejected += 1;
        }
        match why {
            Reason::QueueFull | Reason::Evicted => s.c.queue_full += 1,
            Reason::QueueTimeout => s.c.waited += 1,
            Reason::Codel => {
                s.c.waited += 1;
                s.c.codel += 1;
            }
            Reason::ExpectedWait => s.c.expected_wait += 1,
        }
        why.rejection()
    }

    /// The queue is full: make room by evicting the oldest waiter of the lowest class below
    /// `class`. False if there is none.
    fn evict(&self, s: &mut State, class: usize) -> bool {
        for victim in (class + 1..CLASSES).rev() {
            if let Some(w) = s.queues[victim].pop_front() {
                s.dequeued();
                s.c.evicted += 1;
                self.reject(s, victim, w.route, Reason::Evicted);
                // Dropping `w.tx` wakes the waiter with "closed".
                return true;
            }
        }
        false
    }

    /// The wait of waiter `id` ran out: if it is still queued, remove and count it.
    fn expire(&self, class: usize, id: u64, route: Option<usize>) -> bool {
        let mut s = self.lock();
        let Some(w) = s.remove_waiter(class, id) else {
            return false;
        };
        let why = if w.codel {
            Reason::Codel
        } else {
            Reason::QueueTimeout
        };
        self.reject(&mut s, class, route, why);
        true
    }

    /// Recompute the adaptive limit if its window has elapsed; true if the limit changed.
    fn tick(&self, s: &mut State, now: Instant) -> bool {
        let in_flight = s.in_flight;
        let Some(l) = s.limiter.as_mut() else {
            return false;
        };
        if !l.tick(now.into_std(), in_flight) {
            return false;
        }
        s.limit = l.limit().min(self.max);
        true
    }

    /// The next waiter to hand a slot to: the highest class that is under its cap, and in it the
    /// oldest (FIFO) or newest (standing queue: LIFO) waiter whose route has room and whose wait
    /// has not run out.
    fn next_waiter(&self, s: &State, now: Instant) -> Option<(usize, usize)> {
        let lifo = s.standing(now, self.codel_interval, self.codel_target);
        for class in 0..CLASSES {
            if s.in_flight >= self.cap(s.limit, class) {
                continue;
            }
            let ok = |w: &Waiter| w.until > now && s.route_fits(w.route);
            let q = &s.queues[class];
            let found = if lifo {
                q.iter().rposition(ok)
            } else {
                q.iter().position(ok)
            };
            if let Some(i) = found {
                return Some((class, i));
            }
        }
        None
    }

    /// Hand free slots to waiters.
    fn dispatch(self: &Arc<Self>, s: &mut State, now: Instant) {
        while let Some((class, i)) = self.next_waiter(s, now) {
            let Some(w) = s.queues[class].remove(i) else {
                break;
            };
            s.dequeued();
            let permit = self.grant(s, class, w.route, now);
            if let Err(mut permit) = w.tx.send(permit) {
                // The waiter is gone: the slot stays free for the next one.
                permit.armed = false;
                Self::free(s, w.route, class, now, true);
                s.c.abandoned += 1;
            }
        }
    }

    /// A permit was dropped.
    fn release(
        self: &Arc<Self>,
        route: Option<usize>,
        class: usize,
        started: Instant,
        sample: bool,
    ) {
        let now = Instant::now();
        let mut s = self.lock();
        Self::free(&mut s, route, class, started, false);
        if sample {
            let held = now.saturating_duration_since(started);
            if let Some(l) = s.limiter.as_mut() {
                l.on_sample(held);
            }
            if self.predict {
                let secs = held.as_secs_f64();
                s.hold = Some(Hold::update(s.hold, secs));
                if let Some(r) = route.and_then(|r| s.routes.get_mut(r)) {
                    r.hold = Some(Hold::update(r.hold, secs));
                }
            }
        }
        self.tick(&mut s, now);
        self.dispatch(&mut s, now);
    }
}

/// The admission class of each route with non-default admission settings, by path and method
/// (routes not in it are `normal` without a route limit).
#[derive(Default)]
pub struct RouteTable {
    by_path: std::collections::HashMap<String, Vec<(http::Method, RouteClass)>>,
}

impl RouteTable {
    /// Register every route of the config with `admission` (methods are parsed like the flow
    /// compiler does; an invalid one is an error there already and is skipped here).
    pub fn new(routes: &[fanout_config::Route], admission: &Admission) -> RouteTable {
        let mut by_path: std::collections::HashMap<String, Vec<(http::Method, RouteClass)>> =
            Default::default();
        for r in routes {
            let a = &r.admission;
            if a.priority == Priority::Normal && a.max_concurrency.is_none() {
                continue;
            }
            let Ok(method) =
                http::Method::from_bytes(r.method.value.to_ascii_uppercase().as_bytes())
            else {
                continue;
            };
            let class = admission.route_class(&format!("{method} {}", r.path.value), a);
            by_path
                .entry(r.path.value.clone())
                .or_default()
                .push((method, class));
        }
        RouteTable { by_path }
    }

    /// The class of the route `method` `path` (`path` is the route's pattern).
    pub fn get(&self, method: &http::Method, path: &str) -> RouteClass {
        if self.by_path.is_empty() {
            return RouteClass::default();
        }
        self.by_path
            .get(path)
            .and_then(|v| v.iter().find(|(m, _)| m == method))
            .map_or_else(RouteClass::default, |(_, c)| *c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_config::Dur;
    use serde_json::Value;

    /// A static limit, a queue, waits that never run out in a test, no standing queue.
    fn cfg(max: usize, queue: usize) -> fanout_config::Admission {
        fanout_config::Admission {
            max_concurrency: max,
            queue,
            queue_timeout: Dur::secs(60),
            codel: fanout_config::Codel {
                target: Dur::millis(1),
                interval: Dur::secs(60),
            },
            ..Default::default()
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn class(adm: &Admission, priority: Priority, max: Option<usize>) -> RouteClass {
        adm.route_class(
            "GET /r",
            &RouteAdmission {
                priority,
                max_concurrency: max,
            },
        )
    }

    const CRIT: RouteClass = RouteClass {
        priority: Priority::Critical,
        route: None,
    };
    const NORM: RouteClass = RouteClass {
        priority: Priority::Normal,
        route: None,
    };
    const SHED: RouteClass = RouteClass {
        priority: Priority::Sheddable,
        route: None,
    };

    /// Let spawned waiters run until `queued` waiters are in the queue.
    async fn until_queued(adm: &Admission, queued: u64) {
        for _ in 0..10_000 {
            if adm.status()["queued"] == queued {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("queued never reached {queued}: {}", adm.status());
    }

    fn spawn_admit(
        adm: &Arc<Admission>,
        rc: RouteClass,
    ) -> tokio::task::JoinHandle<Result<Permit, Rejection>> {
        let adm = adm.clone();
        tokio::spawn(async move { adm.admit(rc, far()).await })
    }

    #[tokio::test]
    async fn each_class_fills_its_share_of_the_limit() {
        let adm = Admission::new(&cfg(10, 0));
        let st = adm.status();
        assert_eq!(st["limit_by_priority"]["critical"], 10);
        assert_eq!(st["limit_by_priority"]["normal"], 9);
        assert_eq!(st["limit_by_priority"]["sheddable"], 5);
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(adm.admit(SHED, far()).await.unwrap());
        }
        assert_eq!(
            adm.admit(SHED, far()).await.unwrap_err(),
            Rejection::QueueFull
        );
        for _ in 0..4 {
            held.push(adm.admit(NORM, far()).await.unwrap());
        }
        assert_eq!(
            adm.admit(NORM, far()).await.unwrap_err(),
            Rejection::QueueFull
        );
        held.push(adm.admit(CRIT, far()).await.unwrap());
        assert_eq!(
            adm.admit(CRIT, far()).await.unwrap_err(),
            Rejection::QueueFull
        );
        let st = adm.status();
        assert_eq!(st["in_flight"], 10);
        assert_eq!(st["rejected_by_priority"]["sheddable"], 1);
        assert_eq!(st["rejected_by_priority"]["normal"], 1);
        assert_eq!(st["rejected_by_priority"]["critical"], 1);
        assert_eq!(st["rejected_queue_full"], 3);
        drop(held);
        assert_eq!(adm.status()["in_flight"], 0);
        assert_eq!(adm.status()["admitted"], 10);
    }

    #[tokio::test]
    async fn small_limits_give_every_class_at_least_one_slot() {
        let adm = Admission::new(&cfg(1, 0));
        let p = adm.admit(SHED, far()).await.unwrap();
        assert_eq!(
            adm.admit(CRIT, far()).await.unwrap_err(),
            Rejection::QueueFull
        );
        drop(p);
        let _p = adm.admit(CRIT, far()).await.unwrap();
    }

    #[tokio::test]
    async fn a_released_slot_goes_to_the_highest_class_waiting() {
        let adm = Arc::new(Admission::new(&cfg(1, 10)));
        let hold = adm.admit(NORM, far()).await.unwrap();
        let shed = spawn_admit(&adm, SHED);
        until_queued(&adm, 1).await;
        let norm = spawn_admit(&adm, NORM);
        until_queued(&adm, 2).await;
        let crit = spawn_admit(&adm, CRIT);
        until_queued(&adm, 3).await;
        // A sheddable request does not queue behind critical or normal ones.
        assert_eq!(
            adm.admit(SHED, far()).await.unwrap_err(),
            Rejection::QueueFull
        );
        drop(hold);
        let crit = crit.await.unwrap().unwrap();
        assert_eq!(adm.status()["queued"], 2);
        drop(crit);
        let norm = norm.await.unwrap().unwrap();
        drop(norm);
        let shed = shed.await.unwrap().unwrap();
        drop(shed);
        let st = adm.status();
        assert_eq!(st["in_flight"], 0, "{st}");
        assert_eq!(st["admitted"], 4, "{st}");
        assert_eq!(st["admitted_by_priority"]["critical"], 1, "{st}");
    }

    #[tokio::test]
    async fn a_full_queue_evicts_a_lower_class_waiter() {
        let adm = Arc::new(Admission::new(&cfg(1, 1)));
        let hold = adm.admit(CRIT, far()).await.unwrap();
        let shed = spawn_admit(&adm, SHED);
        until_queued(&adm, 1).await;
        let norm = spawn_admit(&adm, NORM);
        assert_eq!(shed.await.unwrap().unwrap_err(), Rejection::QueueFull);
        until_queued(&adm, 1).await;
        // The queue is full of normal: another normal one is rejected, not queued.
        assert_eq!(
            adm.admit(NORM, far()).await.unwrap_err(),
            Rejection::QueueFull
        );
        drop(hold);
        drop(norm.await.unwrap().unwrap());
        let st = adm.status();
        assert_eq!(st["evicted"], 1, "{st}");
        assert_eq!(st["rejected_by_priority"]["sheddable"], 1, "{st}");
        assert_eq!(st["rejected_queue_full"], 2, "{st}");
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_leaves_the_queue_and_leaks_no_slot() {
        let adm = Arc::new(Admission::new(&cfg(1, 10)));
        let hold = adm.admit(NORM, far()).await.unwrap();
        let gone = spawn_admit(&adm, NORM);
        until_queued(&adm, 1).await;
        gone.abort();
        let _ = gone.await;
        assert_eq!(adm.status()["queued"], 0);
        assert_eq!(adm.status()["abandoned_in_queue"], 1);
        drop(hold);
        assert_eq!(adm.status()["in_flight"], 0);
        let _p = adm.admit(NORM, far()).await.unwrap();
    }

    #[tokio::test]
    async fn a_waiter_runs_out_of_time_at_its_deadline() {
        let adm = Admission::new(&cfg(1, 10));
        let _hold = adm.admit(NORM, far()).await.unwrap();
        let soon = Instant::now() + Duration::from_millis(5);
        assert_eq!(adm.admit(NORM, soon).await.unwrap_err(), Rejection::Waited);
        let past = Instant::now();
        assert_eq!(adm.admit(NORM, past).await.unwrap_err(), Rejection::Waited);
        let st = adm.status();
        assert_eq!(st["rejected_waited_too_long"], 2, "{st}");
        assert_eq!(st["rejected_codel"], 0, "{st}");
        assert_eq!(st["queued"], 0, "{st}");
    }

    #[tokio::test]
    async fn fifo_normally() {
        let adm = Arc::new(Admission::new(&cfg(1, 10)));
        let hold = adm.admit(NORM, far()).await.unwrap();
        let first = spawn_admit(&adm, NORM);
        until_queued(&adm, 1).await;
        let second = spawn_admit(&adm, NORM);
        until_queued(&adm, 2).await;
        drop(hold);
        let p = first.await.unwrap().unwrap();
        assert_eq!(adm.status()["queued"], 1);
        drop(p);
        drop(second.await.unwrap().unwrap());
    }

    #[tokio::test]
    async fn a_standing_queue_is_served_newest_first_and_new_waiters_get_only_the_target() {
        let mut c = cfg(1, 10);
        c.codel.interval = Dur::millis(20);
        c.codel.target = Dur::millis(1);
        let adm = Arc::new(Admission::new(&c));
        let hold = adm.admit(NORM, far()).await.unwrap();
        let first = spawn_admit(&adm, NORM);
        until_queued(&adm, 1).await;
        let second = spawn_admit(&adm, NORM);
        until_queued(&adm, 2).await;
        // The queue stays non-empty past the interval: a standing queue.
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(adm.status()["standing_queue"], true);
        // A newcomer only gets `target` (1 ms), not `queue_timeout` (60 s).
        assert_eq!(adm.admit(NORM, far()).await.unwrap_err(), Rejection::Waited);
        let st = adm.status();
        assert_eq!(st["rejected_codel"], 1, "{st}");
        assert_eq!(st["rejected_waited_too_long"], 1, "{st}");
        // LIFO: the newest waiter is served first.
        drop(hold);
        let p = second.await.unwrap().unwrap();
        assert_eq!(adm.status()["queued"], 1);
        drop(p);
        drop(first.await.unwrap().unwrap());
        // Empty again for longer than the target: no longer standing.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let st = adm.status();
        assert_eq!(st["standing_queue"], false, "{st}");
        assert_eq!(st["in_flight"], 0, "{st}");
    }

    #[test]
    fn a_queue_that_empties_for_an_instant_stays_standing() {
        let adm = Admission::new(&cfg(1, 10));
        let (interval, target) = (Duration::from_millis(100), Duration::from_millis(5));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = adm.inner.lock();
        s.enqueued(t0);
        assert!(!s.refresh_standing(at(50), interval, target), "a burst");
        assert!(
            s.refresh_standing(at(100), interval, target),
            "non-empty for the interval"
        );
        // Several slots free at once and take every waiter; the next request comes 1 ms later.
        s.dequeued();
        let empty = s.empty_since.unwrap().0;
        assert!(s.refresh_standing(empty + Duration::from_millis(1), interval, target));
        s.enqueued(empty + Duration::from_millis(1));
        assert!(s.refresh_standing(empty + Duration::from_millis(2), interval, target));
        // Empty for the target: the overload is over, the next queue is a burst again.
        s.dequeued();
        let empty = s.empty_since.unwrap().0;
        assert!(!s.refresh_standing(empty + target, interval, target));
        s.enqueued(empty + target);
        assert!(!s.refresh_standing(empty + target + Duration::from_millis(1), interval, target));
        drop(s);

        // Standing by age alone (no newcomer saw it) survives an instant of emptiness too.
        let adm = Admission::new(&cfg(1, 10));
        let mut s = adm.inner.lock();
        let short = Duration::from_millis(1);
        s.enqueued(Instant::now());
        std::thread::sleep(2 * short);
        s.dequeued();
        let empty = s.empty_since.unwrap().0;
        assert!(s.standing(empty, short, target));
        assert!(!s.standing(empty + target, short, target));
    }

    #[tokio::test]
    async fn a_route_limit_holds_on_top_of_the_global_one() {
        let adm = Arc::new(Admission::new(&cfg(10, 10)));
        let one = class(&adm, Priority::Normal, Some(1));
        let a = adm.admit(one, far()).await.unwrap();
        let waiting = spawn_admit(&adm, one);
        until_queued(&adm, 1).await;
        // Other routes are not affected, and may pass the waiter.
        let other = adm.admit(NORM, far()).await.unwrap();
        let st = adm.status();
        assert_eq!(st["routes"]["GET /r"]["in_flight"], 1, "{st}");
        assert_eq!(st["in_flight"], 2, "{st}");
        drop(other);
        assert_eq!(
            adm.status()["queued"],
            1,
            "a slot of another route frees nothing here"
        );
        drop(a);
        let b = waiting.await.unwrap().unwrap();
        assert_eq!(adm.status()["routes"]["GET /r"]["in_flight"], 1);
        drop(b);
        let st = adm.status();
        assert_eq!(st["routes"]["GET /r"]["in_flight"], 0, "{st}");
        assert_eq!(st["routes"]["GET /r"]["max_concurrency"], 1, "{st}");
    }

    #[tokio::test]
    async fn the_adaptive_limit_starts_at_initial_and_stays_in_range() {
        let mut c = cfg(50, 0);
        c.adaptive = Some(fanout_config::AdaptiveLimit {
            window: Dur::millis(1),
            ..Default::default()
        });
        let adm = Admission::new(&c);
        assert_eq!(adm.limit(), 20);
        for _ in 0..200 {
            let mut held = Vec::new();
            while let Ok(mut p) = adm.admit(NORM, far()).await {
                p.completed();
                held.push(p);
            }
            tokio::task::yield_now().await;
            drop(held);
            let l = adm.limit();
            assert!((8..=50).contains(&l), "{l}");
        }
        let st = adm.status();
        assert!(st["adaptive"]["updates"].as_u64().unwrap_or(0) > 0, "{st}");
        assert_eq!(st["in_flight"], 0, "{st}");
        assert!(matches!(st["limit"], Value::Number(_)));
    }

    /// A route limit of 1, a queue of 4 that may be waited in 100 ms.
    fn route_cfg(predict: bool) -> fanout_config::Admission {
        fanout_config::Admission {
            queue_timeout: Dur::millis(100),
            predict_wait: predict,
            ..cfg(10, 4)
        }
    }

    /// Hold a permit of `rc` for `ms` (paused clock) and release it as completed.
    async fn run_for(adm: &Admission, rc: RouteClass, ms: u64) {
        let mut p = adm.admit(rc, far()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        p.completed();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_whose_wait_would_outlast_the_queue_timeout_is_refused_at_once() {
        let adm = Arc::new(Admission::new(&route_cfg(true)));
        let rc = class(&adm, Priority::Normal, Some(1));
        // No estimate yet: the first request to find the route busy waits (and gives up).
        let busy = adm.admit(rc, far()).await.unwrap();
        let t0 = Instant::now();
        assert_eq!(adm.admit(rc, far()).await.unwrap_err(), Rejection::Waited);
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
        drop(busy);
        // Requests of this route hold their slot 300 ms.
        for _ in 0..10 {
            run_for(&adm, rc, 300).await;
        }
        let mut running = adm.admit(rc, far()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The running one is expected to end in ~290 ms, past the 100 ms it may wait: refused
        // without waiting.
        let t1 = Instant::now();
        assert_eq!(
            adm.admit(rc, far()).await.unwrap_err(),
            Rejection::WouldWait
        );
        assert_eq!(t1.elapsed(), Duration::ZERO);
        // 250 ms in, ~50 ms are left: queued, and served when the slot frees.
        tokio::time::sleep(Duration::from_millis(240)).await;
        let next = spawn_admit(&adm, rc);
        until_queued(&adm, 1).await;
        // A second waiter would wait for both: 50 ms + 300 ms.
        assert_eq!(
            adm.admit(rc, far()).await.unwrap_err(),
            Rejection::WouldWait
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        running.completed();
        drop(running);
        let served = next.await.unwrap().unwrap();
        drop(served);
        let st = adm.status();
        assert_eq!(st["rejected_expected_wait"], 2, "{st}");
        assert_eq!(st["rejected_waited_too_long"], 1, "{st}");
        assert_eq!(st["rejected_queue_full"], 0, "{st}");
        assert_eq!(st["routes"]["GET /r"]["rejected"], 3, "{st}");
        assert_eq!(st["in_flight"], 0, "{st}");
        let normal = adm.classes().remove(NORMAL);
        assert_eq!(normal.rejected, [0, 0, 1, 0, 2], "{st}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_a_request_may_have_is_also_bounded_by_its_deadline() {
        // The wait it may have is the shorter of queue_timeout and its deadline: a request with
        // 30 ms left is refused at once when a slot is ~50 ms away.
        let adm = Arc::new(Admission::new(&route_cfg(true)));
        let rc = class(&adm, Priority::Normal, Some(1));
        for _ in 0..10 {
            run_for(&adm, rc, 300).await;
        }
        let running = adm.admit(rc, far()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let soon = Instant::now() + Duration::from_millis(30);
        assert_eq!(adm.admit(rc, soon).await.unwrap_err(), Rejection::WouldWait);
        let later = Instant::now() + Duration::from_secs(1);
        let queued = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.admit(rc, later).await })
        };
        until_queued(&adm, 1).await;
        drop(running);
        assert!(queued.await.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_that_varies_is_waited_for_with_a_margin() {
        // Holds of 100 and 500 ms in turn: a mean of ~300 ms, but a request running for 250 ms
        // may well run 250 ms more. Not queued for a 100 ms wait, unlike with steady 300 ms holds.
        let adm = Arc::new(Admission::new(&route_cfg(true)));
        let rc = class(&adm, Priority::Normal, Some(1));
        for _ in 0..10 {
            run_for(&adm, rc, 100).await;
            run_for(&adm, rc, 500).await;
        }
        let st = adm.status();
        let hold = &st["routes"]["GET /r"]["hold_ms"];
        let (mean, dev) = (
            hold["mean"].as_f64().unwrap(),
            hold["deviation"].as_f64().unwrap(),
        );
        assert!((250.0..=350.0).contains(&mean), "{st}");
        assert!(dev >= 150.0, "{st}");
        let _running = adm.admit(rc, far()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(
            adm.admit(rc, far()).await.unwrap_err(),
            Rejection::WouldWait
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_predict_wait_a_request_waits_out_its_queue_timeout() {
        let adm = Arc::new(Admission::new(&route_cfg(false)));
        let rc = class(&adm, Priority::Normal, Some(1));
        run_for(&adm, rc, 300).await;
        let _running = adm.admit(rc, far()).await.unwrap();
        let t0 = Instant::now();
        assert_eq!(adm.admit(rc, far()).await.unwrap_err(), Rejection::Waited);
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
        assert_eq!(adm.status()["rejected_expected_wait"], 0);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_route_limit_the_wait_is_judged_from_the_mean_over_all_slots() {
        // Two slots, requests hold them 300 ms: a slot frees every ~150 ms on average, longer
        // than the 100 ms a request may wait. With ten slots, every ~30 ms: queued.
        for (slots, refused) in [(2, true), (10, false)] {
            let adm = Arc::new(Admission::new(&fanout_config::Admission {
                max_concurrency: slots,
                ..route_cfg(true)
            }));
            // `critical` may use every slot.
            run_for(&adm, CRIT, 300).await;
            let held: Vec<_> =
                futures_util::future::join_all((0..slots).map(|_| adm.admit(CRIT, far())))
                    .await
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
            if refused {
                assert_eq!(
                    adm.admit(CRIT, far()).await.unwrap_err(),
                    Rejection::WouldWait
                );
            } else {
                let waiter = spawn_admit(&adm, CRIT);
                until_queued(&adm, 1).await;
                drop(held);
                assert!(waiter.await.unwrap().is_ok());
            }
        }
    }
}
