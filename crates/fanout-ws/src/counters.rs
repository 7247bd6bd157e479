//! What the WebSocket routes count: per route (kept across reloads by path) the open
//! connections, messages and bytes each way, closes by code and by who closed, refusals by
//! reason; for the process ([`Hub`]) the open connections under `server.websockets`, and the
//! drain that closes them all.

use fanout_protocol::metrics::{MetricType, Out, Value};
use std::sync::Arc;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use tokio::sync::{Notify, watch};

/// Why a handshake was refused (the `reason` label of `fanout_websocket_refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a WebSocket handshake (426).
    NotWebSocket,
    /// A WebSocket handshake missing a part or with a bad value (400).
    BadHandshake,
    /// `Origin` not allowed (403).
    Origin,
    /// The route's `max_connections` (503).
    RouteLimit,
    /// `server.websockets.max_connections` (503).
    GlobalLimit,
    /// The gateway is shutting down (503).
    Draining,
    /// The path could not be sent (400).
    BadPath,
    /// The backend could not be reached (502).
    BackendUnavailable,
    /// The backend did not answer within `handshake_timeout` (504).
    BackendTimeout,
    /// The backend refused the upgrade or answered it wrongly (502).
    BackendRefused,
}

impl Refused {
    /// Every reason, in label order.
    pub const ALL: [Refused; 10] = [
        Refused::NotWebSocket,
        Refused::BadHandshake,
        Refused::Origin,
        Refused::RouteLimit,
        Refused::GlobalLimit,
        Refused::Draining,
        Refused::BadPath,
        Refused::BackendUnavailable,
        Refused::BackendTimeout,
        Refused::BackendRefused,
    ];

    /// Its label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::NotWebSocket => "not_websocket",
            Refused::BadHandshake => "bad_handshake",
            Refused::Origin => "origin",
            Refused::RouteLimit => "route_limit",
            Refused::GlobalLimit => "global_limit",
            Refused::Draining => "draining",
            Refused::BadPath => "bad_path",
            Refused::BackendUnavailable => "backend_unavailable",
            Refused::BackendTimeout => "backend_timeout",
            Refused::BackendRefused => "backend_refused",
        }
    }
}

/// Who closed a WebSocket first (the `by` label of `fanout_websocket_closes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// The client sent a close frame, or went away without one (1006).
    Client,
    /// The backend sent a close frame, or went away without one (1006).
    Backend,
    /// The gateway: a limit (1009), the idle timeout or the drain (1001).
    Gateway,
}

impl By {
    const ALL: [By; 3] = [By::Client, By::Backend, By::Gateway];

    fn as_str(self) -> &'static str {
        match self {
            By::Client => "client",
            By::Backend => "backend",
            By::Gateway => "gateway",
        }
    }
}

/// The close codes counted one by one; any other is counted as `other`.
pub const CODES: [u16; 10] = [1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011];

/// The direction of a message: `In` from the client to the backend, `Out` back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to backend.
    In,
    /// Backend to client.
    Out,
}

/// One route's counters.
#[derive(Default)]
pub struct RouteCounters {
    open: AtomicUsize,
    messages: [AtomicU64; 2],
    bytes: [AtomicU64; 2],
    closes: [[AtomicU64; CODES.len() + 1]; 3],
    refused: [AtomicU64; Refused::ALL.len()],
}

impl RouteCounters {
    /// Open WebSockets on the route.
    pub fn open(&self) -> usize {
        self.open.load(Acquire)
    }

    /// Count a refused handshake.
    pub fn refused(&self, r: Refused) {
        if let Some(i) = Refused::ALL.iter().position(|x| *x == r)
            && let Some(c) = self.refused.get(i)
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Count a data message of `bytes` bytes going `dir`.
    pub(crate) fn message(&self, dir: Dir, bytes: usize) {
        let i = dir as usize;
        if let (Some(m), Some(b)) = (self.messages.get(i), self.bytes.get(i)) {
            m.fetch_add(1, Relaxed);
            b.fetch_add(bytes as u64, Relaxed);
        }
    }

    /// Count a WebSocket's end: who closed it first, with which code.
    pub(crate) fn closed(&self, by: By, code: u16) {
        let i = CODES.iter().position(|c| *c == code).unwrap_or(CODES.len());
        if let Some(c) = self.closes.get(by as usize).and_then(|row| row.get(i)) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// `{open, messages: {in, out}, bytes: {in, out}, closes: {by: {code: n}}, refused: {reason: n}}`.
    pub fn status_json(&self, max: usize) -> serde_json::Value {
        let pair = |a: &[AtomicU64; 2]| serde_json::json!({"in": a[0].load(Relaxed), "out": a[1].load(Relaxed)});
        let closes: serde_json::Map<String, serde_json::Value> = By::ALL
            .iter()
            .zip(&self.closes)
            .map(|(by, row)| {
                let codes: serde_json::Map<String, serde_json::Value> = code_labels()
                    .zip(row)
                    .filter(|(_, n)| n.load(Relaxed) > 0)
                    .map(|(c, n)| (c, n.load(Relaxed).into()))
                    .collect();
                (by.as_str().to_string(), codes.into())
            })
            .collect();
        let refused: serde_json::Map<String, serde_json::Value> = Refused::ALL
            .iter()
            .zip(&self.refused)
            .map(|(r, n)| (r.as_str().to_string(), n.load(Relaxed).into()))
            .collect();
        serde_json::json!({
            "open": self.open(),
            "max_connections": max,
            "messages": pair(&self.messages),
            "bytes": pair(&self.bytes),
            "closes": closes,
            "refused": refused,
        })
    }
}

fn code_labels() -> impl Iterator<Item = String> {
    CODES
        .iter()
        .map(|c| c.to_string())
        .chain(std::iter::once("other".to_string()))
}

/// The process's WebSockets: how many are open under `server.websockets.max_connections`, and
/// the drain (on shutdown every relay closes with 1001 and new handshakes are refused).
pub struct Hub {
    open: AtomicUsize,
    max: usize,
    drain: watch::Sender<bool>,
    closed: Notify,
    refused_global: AtomicU64,
    spread: fanout_pass::spread::Spread,
}

/// One relay's view of the drain: the signal, and how long after it this WebSocket closes
/// (its offset in `server.drain_spread`).
pub struct DrainSignal {
    rx: watch::Receiver<bool>,
    after: std::time::Duration,
}

impl DrainSignal {
    /// Returns once this WebSocket's turn to close has come.
    pub async fn wait(mut self) {
        loop {
            if *self.rx.borrow_and_update() {
                break;
            }
            if self.rx.changed().await.is_err() {
                // The hub is gone without a drain: never.
                std::future::pending::<()>().await;
            }
        }
        if !self.after.is_zero() {
            tokio::time::sleep(self.after).await;
        }
    }
}

impl Hub {
    /// A hub allowing `max` open WebSockets.
    pub fn new(max: usize) -> Hub {
        Hub {
            open: AtomicUsize::new(0),
            max,
            drain: watch::Sender::new(false),
            closed: Notify::new(),
            refused_global: AtomicU64::new(0),
            spread: fanout_pass::spread::Spread::default(),
        }
    }

    /// The same, closing its WebSockets spread over `window` once the drain starts
    /// (`server.drain_spread`).
    pub fn with_drain_spread(mut self, window: std::time::Duration) -> Hub {
        self.spread = fanout_pass::spread::Spread::new(window);
        self
    }

    /// Open WebSockets.
    pub fn open(&self) -> usize {
        self.open.load(Acquire)
    }

    /// Whether the drain started.
    pub fn draining(&self) -> bool {
        *self.drain.borrow()
    }

    /// Start the drain: every open WebSocket is closed with 1001 (going away) to both sides,
    /// new handshakes are refused with 503.
    pub fn drain(&self) {
        self.drain.send_replace(true);
    }

    /// The drain signal, for one relay.
    pub(crate) fn drain_signal(&self) -> DrainSignal {
        DrainSignal {
            rx: self.drain.subscribe(),
            after: self.spread.offset(),
        }
    }

    /// Returns once no WebSocket is open.
    pub async fn all_closed(&self) {
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            closed.await;
        }
    }

    /// Drain, and wait until every WebSocket closed or `grace` passed (what is still open
    /// then is dropped with its task when the runtime stops).
    pub async fn shutdown(&self, grace: std::time::Duration) {
        self.drain();
        if tokio::time::timeout(grace, self.all_closed())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.open(),
                "WebSockets still open at the end of the shutdown grace period"
            );
        }
    }

    /// A place for one WebSocket on `route` (whose cap is `route_max`), or why not.
    pub(crate) fn ticket(
        self: &Arc<Self>,
        route: &Arc<RouteCounters>,
        route_max: usize,
    ) -> Result<Ticket, Refused> {
        if self.draining() {
            return Err(Refused::Draining);
        }
        if route.open.fetch_add(1, AcqRel) >= route_max {
            route.open.fetch_sub(1, AcqRel);
            return Err(Refused::RouteLimit);
        }
        if self.open.fetch_add(1, AcqRel) >= self.max {
            self.open.fetch_sub(1, AcqRel);
            route.open.fetch_sub(1, AcqRel);
            self.refused_global.fetch_add(1, Relaxed);
            return Err(Refused::GlobalLimit);
        }
        Ok(Ticket {
            hub: self.clone(),
            route: route.clone(),
        })
    }

    /// `websockets` on `/__fanout/status`: the process's numbers and each route's
    /// (`routes`: path → [`RouteCounters::status_json`]).
    pub fn status_json(&self, routes: &crate::WsRoutes) -> serde_json::Value {
        let by_route: serde_json::Map<String, serde_json::Value> = routes
            .iter()
            .map(|(name, plan)| {
                (
                    name.to_string(),
                    plan.counters().status_json(plan.max_connections()),
                )
            })
            .collect();
        serde_json::json!({
            "open": self.open(),
            "max_connections": self.max,
            "draining": self.draining(),
            "refused_global_limit": self.refused_global.load(Relaxed),
            "routes": by_route,
        })
    }

    /// The `fanout_websocket_*` families (every series of every route from the start).
    pub fn metrics(&self, routes: &crate::WsRoutes, out: &mut Out<'_>) -> std::fmt::Result {
        out.single(
            "fanout_websockets_open",
            "WebSockets open now, over all routes",
            Value::Gauge(self.open() as f64),
        )?;
        out.family(
            "fanout_websocket_open",
            "WebSockets open now, by route",
            MetricType::Gauge,
            routes.iter().map(|(r, p)| {
                (
                    [("route", r.to_string())],
                    Value::Gauge(p.counters().open() as f64),
                )
            }),
        )?;
        let dirs = |r: &str, a: &[AtomicU64; 2]| {
            [("in", &a[0]), ("out", &a[1])].map(|(d, n)| {
                (
                    [("route", r.to_string()), ("direction", d.to_string())],
                    Value::Counter(n.load(Relaxed)),
                )
            })
        };
        out.family(
            "fanout_websocket_messages",
            "WebSocket data messages relayed, by route and direction (in: client to backend; out: backend to client)",
            MetricType::Counter,
            routes.iter().flat_map(|(r, p)| dirs(r, &p.counters().messages)),
        )?;
        out.family(
            "fanout_websocket_bytes",
            "WebSocket data message payload bytes relayed, by route and direction",
            MetricType::Counter,
            routes
                .iter()
                .flat_map(|(r, p)| dirs(r, &p.counters().bytes)),
        )?;
        out.family(
            "fanout_websocket_closes",
            "WebSockets ended, by route, who closed first (client, backend, gateway) and close code (1006: went away without a close frame)",
            MetricType::Counter,
            routes.iter().flat_map(|(r, p)| {
                By::ALL
                    .iter()
                    .zip(&p.counters().closes)
                    .flat_map(|(by, row)| {
                        code_labels().zip(row).map(move |(code, n)| {
                            (
                                [
                                    ("route", r.to_string()),
                                    ("by", by.as_str().to_string()),
                                    ("code", code),
                                ],
                                Value::Counter(n.load(Relaxed)),
                            )
                        })
                    })
                    .collect::<Vec<_>>()
            }),
        )?;
        out.family(
            "fanout_websocket_refused",
            "WebSocket handshakes refused, by route and reason",
            MetricType::Counter,
            routes.iter().flat_map(|(r, p)| {
                Refused::ALL
                    .iter()
                    .zip(&p.counters().refused)
                    .map(|(why, n)| {
                        (
                            [
                                ("route", r.to_string()),
                                ("reason", why.as_str().to_string()),
                            ],
                            Value::Counter(n.load(Relaxed)),
                        )
                    })
                    .collect::<Vec<_>>()
            }),
        )
    }
}

/// One open WebSocket's place under its route's and the process's caps, given back when
/// dropped (its relay ended, or the upgrade never completed).
pub struct Ticket {
    hub: Arc<Hub>,
    route: Arc<RouteCounters>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.route.open.fetch_sub(1, AcqRel);
        if self.hub.open.fetch_sub(1, AcqRel) == 1 {
            self.hub.closed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_capped_per_route_and_overall_and_refused_while_draining() {
        let hub = Arc::new(Hub::new(2));
        let (a, b) = (
            Arc::new(RouteCounters::default()),
            Arc::new(RouteCounters::default()),
        );
        let a1 = hub.ticket(&a, 1).unwrap();
        assert_eq!(hub.ticket(&a, 1).err(), Some(Refused::RouteLimit));
        let b1 = hub.ticket(&b, 5).unwrap();
        assert_eq!(hub.ticket(&b, 5).err(), Some(Refused::GlobalLimit));
        assert_eq!((hub.open(), a.open(), b.open()), (2, 1, 1));
        drop(a1);
        assert_eq!((hub.open(), a.open()), (1, 0));
        hub.drain();
        assert_eq!(hub.ticket(&a, 1).err(), Some(Refused::Draining));
        drop(b1);
        assert_eq!(hub.open(), 0);
    }

    #[tokio::test]
    async fn all_closed_returns_when_the_last_ticket_goes() {
        let hub = Arc::new(Hub::new(10));
        let r = Arc::new(RouteCounters::default());
        let t = hub.ticket(&r, 10).unwrap();
        let h = hub.clone();
        let waiter = tokio::spawn(async move { h.all_closed().await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(t);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn closes_are_counted_by_who_and_code() {
        let r = RouteCounters::default();
        r.closed(By::Client, 1000);
        r.closed(By::Gateway, 1009);
        r.closed(By::Backend, 4000);
        let s = r.status_json(7);
        assert_eq!(s["closes"]["client"]["1000"], 1);
        assert_eq!(s["closes"]["gateway"]["1009"], 1);
        assert_eq!(s["closes"]["backend"]["other"], 1);
        assert_eq!(s["max_connections"], 7);
    }
}
