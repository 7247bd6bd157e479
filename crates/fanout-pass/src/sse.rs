//! Server-Sent Events on a pass-through route (`pass.sse`; docs/config.md#server-sent-events).
//!
//! An answer `200` with `Content-Type: text/event-stream`, no `Content-Length` and no
//! `Content-Encoding` ([`is_event_stream`]) is passed as [`SseBody`] instead of
//! [`crate::body::Download`]: still a frame at a time as the backend sends it (nothing buffered:
//! each frame goes to the client as soon as it arrives), and besides
//!
//! - the stream's events are followed ([`Scanner`]: where each one ends, at a blank line), so
//!   whatever the gateway adds or ends goes **between events**, never inside one;
//! - while the backend is silent, a comment (`: keep-alive`) every `pass.sse.heartbeat` —
//!   counted as a byte moved on the exchange's [`Clock`](crate::body::Clock), so
//!   `pass.idle_timeout` does not cut a stream whose heartbeats flow;
//! - `pass.sse.idle_timeout` without a byte from the backend ends the stream cleanly (at an event
//!   boundary; inside an event the answer is cut), as `pass.timeout` does;
//! - on shutdown ([`Drain::start`]) the stream ends at its next event boundary, so a client's
//!   `EventSource` reconnects (to another instance) with its `Last-Event-ID`, having lost nothing;
//! - each route counts its open streams, events, heartbeats and how streams ended
//!   ([`SseCounters`], [`End`]).

use crate::body::{Counters, Cut, Watch};
use crate::spread::Spread;
use bytes::Bytes;
use fanout_layers::stream::{BoxError, StreamBody};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// The comment sent while the backend is silent.
pub const HEARTBEAT: &[u8] = b": keep-alive\n\n";

/// Whether an answer is an event stream the gateway may follow event by event: `200`,
/// `Content-Type: text/event-stream`, no `Content-Length` (bytes added would break a length
/// the backend announced) and no `Content-Encoding` (an encoded stream's events cannot be
/// seen, nor a comment added to it).
pub fn is_event_stream(status: http::StatusCode, headers: &HeaderMap) -> bool {
    if status != http::StatusCode::OK
        || headers.contains_key(http::header::CONTENT_LENGTH)
        || headers
            .get(http::header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return false;
    }
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| media_is_event_stream(v.as_bytes()))
}

/// `text/event-stream`, with or without parameters, in any case.
pub fn media_is_event_stream(v: &[u8]) -> bool {
    let essence = v.split(|&b| b == b';').next().unwrap_or(b"");
    essence
        .trim_ascii()
        .eq_ignore_ascii_case(b"text/event-stream")
}

/// The gateway's shutdown as the streams see it: started once, every open stream told (each
/// after its offset in `server.drain_spread`).
#[derive(Debug, Default)]
pub struct Drain {
    started: AtomicBool,
    /// When it started: each stream's offset counts from here, however late its body is
    /// polled.
    at: std::sync::OnceLock<Instant>,
    notify: Arc<Notify>,
    spread: Spread,
}

impl Drain {
    /// A drain not started, every stream ending as soon as it starts.
    pub fn new() -> Arc<Drain> {
        Arc::new(Drain::default())
    }

    /// A drain not started whose streams end spread over `window` once it starts.
    pub fn spread_over(window: Duration) -> Arc<Drain> {
        Arc::new(Drain {
            spread: Spread::new(window),
            ..Drain::default()
        })
    }

    /// The gateway stops: every open stream ends at its next event boundary.
    pub fn start(&self) {
        let _ = self.at.set(Instant::now());
        self.started.store(true, Relaxed);
        self.notify.notify_waiters();
    }

    /// Whether it started.
    pub fn started(&self) -> bool {
        self.started.load(Relaxed)
    }

    /// A wait for this stream's turn: the start (registered at once, so a start after this
    /// call wakes it; one before it is seen at once), then the stream's offset in the spread.
    pub fn wait(self: &Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut start = Box::pin(self.notify.clone().notified_owned());
        start.as_mut().enable();
        let (this, after) = (self.clone(), self.spread.offset());
        Box::pin(async move {
            if !this.started() {
                start.await;
            }
            if let (false, Some(at)) = (after.is_zero(), this.at.get()) {
                tokio::time::sleep_until(*at + after).await;
            }
        })
    }
}

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The client went away (the answer was dropped before its end).
    ClientLeft,
    /// The backend ended its answer.
    BackendEnded,
    /// `pass.sse.idle_timeout` (or `pass.idle_timeout`) without a byte from the backend.
    Idle,
    /// `pass.timeout`, the whole exchange's limit.
    Timeout,
    /// The gateway's shutdown.
    Drain,
    /// The backend's answer broke off.
    Error,
}

impl End {
    /// The `cause` label of `fanout_sse_streams_ended_total`, in the order of
    /// [`SseCounters::ended`].
    pub const CAUSES: [&'static str; 6] = [
        "client_left",
        "backend_ended",
        "idle",
        "timeout",
        "drain",
        "error",
    ];

    fn index(self) -> usize {
        match self {
            End::ClientLeft => 0,
            End::BackendEnded => 1,
            End::Idle => 2,
            End::Timeout => 3,
            End::Drain => 4,
            End::Error => 5,
        }
    }
}

/// A route's event streams (kept across reloads with the route's other counters).
#[derive(Debug, Default)]
pub struct SseCounters {
    /// Streams open now.
    pub open: AtomicI64,
    /// Events passed to clients (complete events with at least one field).
    pub events: AtomicU64,
    /// Heartbeat comments sent.
    pub heartbeats: AtomicU64,
    /// Streams ended, by [`End::CAUSES`].
    pub ended: [AtomicU64; 6],
}

impl SseCounters {
    /// `{open, events, heartbeats, ended: {cause: n}}`.
    pub fn json(&self) -> serde_json::Value {
        let ended: serde_json::Map<String, serde_json::Value> = End::CAUSES
            .iter()
            .zip(&self.ended)
            .map(|(c, n)| (c.to_string(), n.load(Relaxed).into()))
            .collect();
        serde_json::json!({
            "open": self.open.load(Relaxed),
            "events": self.events.load(Relaxed),
            "heartbeats": self.heartbeats.load(Relaxed),
            "ended": ended,
        })
    }
}

/// The field name (and its colon) that makes a block an event.
const DATA: &[u8] = b"data:";

/// Where an event stream is (the `text/event-stream` grammar's lines and blank lines), fed the
/// bytes as they pass: whether the bytes so far end at an event boundary, and how many events
/// they completed.
#[derive(Debug, Clone)]
pub struct Scanner {
    /// Bytes of the current line so far.
    line_len: usize,
    /// How much of `data:` the current line starts with (`DATA.len() + 1`: it does not).
    matched: usize,
    /// The block since the last blank line has a `data` field: a client dispatches it as an
    /// event (a block of comments, `id`, `retry` or `event` alone dispatches nothing).
    data: bool,
    /// The last byte was a CR (a LF right after it ends the same line).
    cr: bool,
    /// The bytes so far end with a blank line (or are none).
    boundary: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            line_len: 0,
            matched: 0,
            data: false,
            cr: false,
            boundary: true,
        }
    }
}

impl Scanner {
    /// Whether the bytes so far end between events.
    pub fn at_boundary(&self) -> bool {
        self.boundary
    }

    /// Follow `data`; the number of events it completed.
    pub fn feed(&mut self, data: &[u8]) -> u64 {
        let mut events = 0;
        for &b in data {
            if std::mem::take(&mut self.cr) && b == b'\n' {
                continue;
            }
            match b {
                b'\r' | b'\n' => {
                    self.cr = b == b'\r';
                    if self.line_len == 0 {
                        // A blank line: the block ends (an event when it had data).
                        if std::mem::take(&mut self.data) {
                            events += 1;
                        }
                        self.boundary = true;
                    } else {
                        // `data: …`, `data:…` or a bare `data`.
                        if self.matched == DATA.len() || (self.matched == 4 && self.line_len == 4) {
                            self.data = true;
                        }
                        self.line_len = 0;
                        self.matched = 0;
                    }
                }
                _ => {
                    if self.matched == self.line_len && self.matched < DATA.len() {
                        self.matched += usize::from(DATA.get(self.matched) == Some(&b));
                    }
                    self.line_len += 1;
                    self.boundary = false;
                }
            }
        }
        events
    }
}

/// The settings of a route's streams (`pass.sse`).
#[derive(Debug, Clone, Copy)]
pub struct SseLimits {
    /// The heartbeat period (`None`: no heartbeats).
    pub heartbeat: Option<Duration>,
    /// How long the backend may send nothing.
    pub idle: Duration,
}

/// An event stream on its way to the client (see the [module docs](self)).
pub struct SseBody {
    inner: StreamBody,
    watch: Watch,
    counters: Arc<Counters>,
    streams: Arc<SseCounters>,
    limits: SseLimits,
    scan: Scanner,
    drain: Arc<Drain>,
    drain_wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The waker `drain_wait` was last polled with: until the drain starts it needs polling
    /// again only when the task's waker changes (a poll of a `Notified` takes a lock).
    drain_waker: Option<Waker>,
    draining: bool,
    /// One timer for the three limits of a silent backend: the exchange's (`watch`), the
    /// stream's idleness and the next heartbeat. Set lazily: bytes only push those later, so
    /// the timer may fire early — it then finds nothing due and is set again, once per period
    /// instead of a reset on every event.
    timer: Pin<Box<Sleep>>,
    /// When the backend last sent a byte.
    last: Instant,
    /// When the stream last sent a byte: the backend's or a heartbeat.
    last_sent: Instant,
    ended: Option<End>,
}

impl SseBody {
    /// The backend's event stream `inner`, cut when `watch` fires, its bytes and cuts counted in
    /// `counters`, the stream in `streams`; ended at an event boundary once `drain` starts.
    pub fn new(
        inner: StreamBody,
        watch: Watch,
        counters: Arc<Counters>,
        streams: Arc<SseCounters>,
        limits: SseLimits,
        drain: Arc<Drain>,
    ) -> SseBody {
        let now = Instant::now();
        streams.open.fetch_add(1, Relaxed);
        SseBody {
            inner,
            watch,
            limits,
            scan: Scanner::default(),
            drain_wait: drain.wait(),
            drain_waker: None,
            draining: false,
            drain,
            timer: Box::pin(tokio::time::sleep_until(now)),
            last: now,
            last_sent: now,
            ended: None,
            counters,
            streams,
        }
    }

    /// The stream ended for `why` (counted once).
    fn end(&mut self, why: End) {
        if self.ended.is_none() {
            self.ended = Some(why);
            let c = &self.streams;
            c.open.fetch_sub(1, Relaxed);
            if let Some(n) = c.ended.get(why.index()) {
                n.fetch_add(1, Relaxed);
            }
        }
    }

    /// End cleanly.
    fn close(&mut self, why: End) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.end(why);
        Poll::Ready(None)
    }

    /// Cut: the client sees an aborted answer.
    fn cut(&mut self, why: End, cut: Cut) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.counters.cut(cut);
        self.end(why);
        Poll::Ready(Some(Err(Box::new(cut))))
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        // Dropped before its end: the client went away — or the shutdown's grace ran out.
        let why = if self.drain.started() {
            End::Drain
        } else {
            End::ClientLeft
        };
        self.end(why);
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended.is_some() {
            return Poll::Ready(None);
        }
        if !this.draining
            && (this.drain.started()
                || !this
                    .drain_waker
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker())))
        {
            this.draining = this.drain_wait.as_mut().poll(cx).is_ready();
            this.drain_waker = Some(cx.waker().clone());
        }
        if this.draining && this.scan.at_boundary() {
            return this.close(End::Drain);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref()
                    && !d.is_empty()
                {
                    this.counters.bytes_out.fetch_add(d.len() as u64, Relaxed);
                    this.watch.clock().moved();
                    let events = this.scan.feed(d);
                    if events > 0 {
                        this.streams.events.fetch_add(events, Relaxed);
                    }
                    let now = Instant::now();
                    this.last = now;
                    this.last_sent = now;
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(_))) => return this.cut(End::Error, Cut::BackendBroke),
            Poll::Ready(None) => return this.close(End::BackendEnded),
            Poll::Pending => {}
        }
        // The backend is silent: the exchange's limits, the stream's idle limit, a heartbeat.
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            if let Some(c) = this.watch.expired(now) {
                let why = match c {
                    Cut::Timeout(_) => End::Timeout,
                    _ => End::Idle,
                };
                if this.scan.at_boundary() {
                    return this.close(why);
                }
                return this.cut(why, c);
            }
            let idle_end = this.last + this.limits.idle;
            if now >= idle_end {
                if this.scan.at_boundary() {
                    return this.close(End::Idle);
                }
                return this.cut(End::Idle, Cut::Idle(this.limits.idle));
            }
            let mut due = this.watch.due().min(idle_end);
            if let Some(h) = this.limits.heartbeat {
                if now >= this.last_sent + h {
                    // Inside an event no comment is sent: look again a period later.
                    this.last_sent = now;
                    if this.scan.at_boundary() {
                        this.timer.as_mut().reset(due.min(now + h));
                        this.streams.heartbeats.fetch_add(1, Relaxed);
                        this.watch.clock().moved();
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(HEARTBEAT)))));
                    }
                }
                due = due.min(this.last_sent + h);
            }
            this.timer.as_mut().reset(due);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended.is_some()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::new()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::body::Clock;
    use http_body_util::BodyExt;
    use http_body_util::combinators::UnsyncBoxBody;
    use tokio::sync::mpsc;

    /// A backend body fed through a channel (an `Err` item breaks it).
    fn channel() -> (mpsc::UnboundedSender<Result<&'static str, ()>>, StreamBody) {
        let (tx, rx) = mpsc::unbounded_channel::<Result<&'static str, ()>>();
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            let item = rx.recv().await?;
            let frame = item
                .map(|s| Frame::data(Bytes::from_static(s.as_bytes())))
                .map_err(|()| -> BoxError { "broke".into() });
            Some((frame, rx))
        });
        (
            tx,
            UnsyncBoxBody::new(http_body_util::StreamBody::new(frames)),
        )
    }

    struct Setup {
        tx: mpsc::UnboundedSender<Result<&'static str, ()>>,
        body: SseBody,
        counters: Arc<Counters>,
        streams: Arc<SseCounters>,
        drain: Arc<Drain>,
    }

    fn setup(heartbeat: Option<u64>, idle: u64, pass_idle: u64, timeout: u64) -> Setup {
        setup_on(Drain::new(), heartbeat, idle, pass_idle, timeout)
    }

    fn setup_on(
        drain: Arc<Drain>,
        heartbeat: Option<u64>,
        idle: u64,
        pass_idle: u64,
        timeout: u64,
    ) -> Setup {
        let (tx, inner) = channel();
        let counters = Arc::new(Counters::default());
        let streams = Arc::new(SseCounters::default());
        let clock = Arc::new(Clock::new(
            Instant::now(),
            Duration::from_secs(timeout),
            Duration::from_secs(pass_idle),
        ));
        let body = SseBody::new(
            inner,
            Watch::new(clock),
            counters.clone(),
            streams.clone(),
            SseLimits {
                heartbeat: heartbeat.map(Duration::from_secs),
                idle: Duration::from_secs(idle),
            },
            drain.clone(),
        );
        Setup {
            tx,
            body,
            counters,
            streams,
            drain,
        }
    }

    async fn next(b: &mut SseBody) -> Option<Result<Bytes, String>> {
        match b.frame().await? {
            Ok(f) => Some(Ok(f.into_data().unwrap())),
            Err(e) => Some(Err(e.to_string())),
        }
    }

    fn ended(c: &SseCounters) -> Vec<(&'static str, u64)> {
        End::CAUSES
            .iter()
            .zip(&c.ended)
            .map(|(n, v)| (*n, v.load(Relaxed)))
            .filter(|(_, v)| *v > 0)
            .collect()
    }

    #[test]
    fn the_scanner_finds_event_boundaries_whatever_the_line_ends_and_the_chunking() {
        let text =
            "retry: 10\n\n: c\n\ndata: a\ndata: b\n\nid: 1\r\ndata: x\r\n\r\nevent: e\rdata: y\r\r";
        // (the retry-only block and the comment-only block are not events: 3 are)
        for split in 0..text.len() {
            let mut s = Scanner::default();
            let (a, b) = text.split_at(split);
            let n = s.feed(a.as_bytes()) + s.feed(b.as_bytes());
            assert_eq!(n, 3, "split at {split}");
            assert!(s.at_boundary(), "split at {split}");
        }
        let mut s = Scanner::default();
        assert!(s.at_boundary());
        s.feed(b"data: a\n");
        assert!(!s.at_boundary(), "inside an event");
        s.feed(b"\n");
        assert!(s.at_boundary());
        s.feed(b"data: partial");
        assert!(!s.at_boundary());
        // A CR then a LF in the next chunk: one line end, not a blank line.
        let mut s = Scanner::default();
        assert_eq!(s.feed(b"data: a\r"), 0);
        assert_eq!(s.feed(b"\n"), 0);
        assert!(!s.at_boundary());
        assert_eq!(s.feed(b"\r\n"), 1);
        assert!(s.at_boundary());
        // `data` alone is a field; `database: x` and `id: data:` are not data.
        assert_eq!(Scanner::default().feed(b"data\n\n"), 1);
        assert_eq!(Scanner::default().feed(b"database: x\n\n"), 0);
        assert_eq!(Scanner::default().feed(b"id: data:\n\n"), 0);
        assert_eq!(Scanner::default().feed(b"dat\n\n"), 0);
    }

    #[test]
    fn only_a_plain_200_event_stream_is_followed() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, http::HeaderValue::from_static(v));
            }
            m
        };
        let ok = http::StatusCode::OK;
        let es = ("content-type", "Text/Event-Stream; charset=utf-8");
        assert!(is_event_stream(ok, &h(&[es])));
        assert!(!is_event_stream(http::StatusCode::NO_CONTENT, &h(&[es])));
        assert!(!is_event_stream(ok, &h(&[es, ("content-length", "10")])));
        assert!(!is_event_stream(
            ok,
            &h(&[es, ("content-encoding", "gzip")])
        ));
        assert!(is_event_stream(
            ok,
            &h(&[es, ("content-encoding", "identity")])
        ));
        assert!(!is_event_stream(ok, &h(&[("content-type", "text/plain")])));
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeats_flow_only_between_events_and_keep_the_exchange_alive() {
        let mut s = setup(Some(15), 300, 30, 3600);
        s.tx.send(Ok("data: a\n\n")).unwrap();
        assert_eq!(next(&mut s.body).await.unwrap().unwrap(), "data: a\n\n");
        // Silent for 100 s: heartbeats every 15 s, and pass.idle_timeout (30 s) never cuts.
        let start = Instant::now();
        for _ in 0..6 {
            assert_eq!(
                next(&mut s.body).await.unwrap().unwrap(),
                HEARTBEAT,
                "a heartbeat"
            );
        }
        assert_eq!(start.elapsed(), Duration::from_secs(90));
        // Inside an event: no heartbeat until it ends.
        s.tx.send(Ok("data: b\n")).unwrap();
        assert_eq!(next(&mut s.body).await.unwrap().unwrap(), "data: b\n");
        let tx = s.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            tx.send(Ok("\n")).unwrap();
        });
        assert_eq!(next(&mut s.body).await.unwrap().unwrap(), "\n");
        assert_eq!(s.streams.heartbeats.load(Relaxed), 6);
        assert_eq!(s.streams.events.load(Relaxed), 2);
        assert_eq!(s.streams.open.load(Relaxed), 1);
        assert_eq!(
            s.counters.cut.iter().map(|c| c.load(Relaxed)).sum::<u64>(),
            0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_backend_ends_the_stream_cleanly_at_the_idle_timeout() {
        let mut s = setup(Some(15), 60, 30, 3600);
        s.tx.send(Ok("data: a\n\n")).unwrap();
        next(&mut s.body).await.unwrap().unwrap();
        let start = Instant::now();
        let mut beats = 0;
        while let Some(f) = next(&mut s.body).await {
            assert_eq!(f.unwrap(), HEARTBEAT);
            beats += 1;
        }
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        assert_eq!(beats, 3, "at 15, 30 and 45 s");
        assert_eq!(ended(&s.streams), [("idle", 1)]);
        assert_eq!(s.streams.open.load(Relaxed), 0);
        drop(s.body);
        assert_eq!(ended(&s.streams), [("idle", 1)], "counted once");

        // Stuck inside an event: cut, not ended as if complete.
        let mut s = setup(None, 60, 120, 3600);
        s.tx.send(Ok("data: half")).unwrap();
        next(&mut s.body).await.unwrap().unwrap();
        let e = next(&mut s.body).await.unwrap().unwrap_err();
        assert!(e.contains("pass.idle_timeout"), "{e}");
        assert_eq!(ended(&s.streams), [("idle", 1)]);
        assert_eq!(s.counters.cut[1].load(Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_ends_the_stream_at_the_next_event_boundary() {
        let mut s = setup(Some(15), 300, 30, 3600);
        s.tx.send(Ok("data: a\n")).unwrap();
        next(&mut s.body).await.unwrap().unwrap();
        s.drain.start();
        // Inside an event: the rest of it still goes.
        s.tx.send(Ok("data: b\n")).unwrap();
        s.tx.send(Ok("\nda")).unwrap();
        assert_eq!(next(&mut s.body).await.unwrap().unwrap(), "data: b\n");
        assert_eq!(next(&mut s.body).await.unwrap().unwrap(), "\nda");
        s.tx.send(Ok("ta: c\n\n")).unwrap();
        s.tx.send(Ok("data: never\n\n")).unwrap();
        assert_eq!(next(&mut s.body).await.unwrap().unwrap(), "ta: c\n\n");
        assert!(next(&mut s.body).await.is_none(), "ended at the boundary");
        assert_eq!(ended(&s.streams), [("drain", 1)]);

        // At a boundary when the drain starts: ended at once, even while waiting.
        let mut s = setup(Some(15), 300, 30, 3600);
        s.tx.send(Ok("data: a\n\n")).unwrap();
        next(&mut s.body).await.unwrap().unwrap();
        let drain = s.drain.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drain.start();
        });
        let start = Instant::now();
        assert!(next(&mut s.body).await.is_none());
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(ended(&s.streams), [("drain", 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_drain_spread_streams_end_at_their_offsets_not_at_once() {
        // `server.drain_spread: 10s`: the first stream's offset is 0, the second's 6.18 s,
        // the third's 2.36 s (the golden-ratio sequence).
        let drain = Drain::spread_over(Duration::from_secs(10));
        let mut streams: Vec<Setup> = (0..3)
            .map(|_| setup_on(drain.clone(), None, 300, 30, 3600))
            .collect();
        for s in &mut streams {
            s.tx.send(Ok("data: a\n\n")).unwrap();
            next(&mut s.body).await.unwrap().unwrap();
        }
        let start = Instant::now();
        drain.start();
        let mut ends = Vec::new();
        for s in &mut streams {
            // Each stream still passes what its backend sends until its turn.
            assert!(next(&mut s.body).await.is_none());
            ends.push(start.elapsed().as_millis());
            assert_eq!(ended(&s.streams), [("drain", 1)]);
        }
        // Polled in turn: each ends at its offset from the drain's start, however late it is
        // polled — the third's (2.36 s) has passed by the second's end (tokio's timer rounds up
        // to the next millisecond).
        assert_eq!(ends[0], 0);
        assert!((6180..=6181).contains(&ends[1]), "{ends:?}");
        assert_eq!(ends[2], ends[1]);

        // Before its turn a stream goes on: events pass.
        let drain = Drain::spread_over(Duration::from_secs(10));
        let _first = setup_on(drain.clone(), None, 300, 30, 3600);
        let mut s = setup_on(drain.clone(), None, 300, 30, 3600);
        drain.start();
        s.tx.send(Ok("data: b\n\n")).unwrap();
        assert_eq!(next(&mut s.body).await.unwrap().unwrap(), "data: b\n\n");
        let start = Instant::now();
        assert!(next(&mut s.body).await.is_none());
        assert!((6180..=6181).contains(&start.elapsed().as_millis()));
    }

    #[tokio::test(start_paused = true)]
    async fn streams_end_counted_by_cause() {
        // The backend ends.
        let mut s = setup(Some(15), 300, 30, 3600);
        s.tx.send(Ok("data: a\n\n")).unwrap();
        next(&mut s.body).await.unwrap().unwrap();
        drop(s.tx);
        assert!(next(&mut s.body).await.is_none());
        assert_eq!(ended(&s.streams), [("backend_ended", 1)]);
        // The client leaves.
        let s = setup(Some(15), 300, 30, 3600);
        assert_eq!(s.streams.open.load(Relaxed), 1);
        drop(s.body);
        assert_eq!(ended(&s.streams), [("client_left", 1)]);
        assert_eq!(s.streams.open.load(Relaxed), 0);
        // The backend breaks: the answer is cut.
        let mut s = setup(Some(15), 300, 30, 3600);
        s.tx.send(Err(())).unwrap();
        assert!(next(&mut s.body).await.unwrap().is_err());
        assert_eq!(ended(&s.streams), [("error", 1)]);
        assert_eq!(s.counters.cut[4].load(Relaxed), 1, "backend_broke");
        // The whole exchange's limit, between events.
        let mut s = setup(Some(15), 300, 30, 40);
        s.tx.send(Ok("data: a\n\n")).unwrap();
        next(&mut s.body).await.unwrap().unwrap();
        let mut beats = 0;
        while let Some(f) = next(&mut s.body).await {
            f.unwrap();
            beats += 1;
        }
        assert_eq!(beats, 2);
        assert_eq!(ended(&s.streams), [("timeout", 1)]);
    }
}
