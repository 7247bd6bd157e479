//! Client connections: every one of them ends.
//!
//! Each accepted connection is driven by [`drive`], which polls hyper's connection future next to
//! one timer and closes the connection when one of its limits runs out:
//!
//! - **first byte**: nothing (or only part of the HTTP/2 preface) arrived within
//!   `first_byte_timeout` of the accept;
//! - **header read** (HTTP/1): a request head started arriving but is not complete within
//!   `header_read_timeout` (done here, not by hyper, whose timer would also run while a
//!   keep-alive connection waits for its next request and so cap the idle time);
//! - **idle**: no request in flight and no answer being sent for `idle_timeout` — a graceful
//!   close (HTTP/2: GOAWAY), then the connection is dropped if the client has not closed it
//!   within [`LINGER`]. Client PINGs and other frames are not activity;
//! - **send**: a connection with answer data to send that makes no progress for `send_timeout`
//!   (no answer chunk taken by the transport, or the socket refusing every write) is dropped at
//!   once with a reset, which frees its buffered answers.
//!
//! The state the timer looks at is kept in [`ConnShared`] with atomics, written by the socket
//! wrapper ([`TrackedIo`]), the request guard ([`ActiveRequest`]) and the answer body wrapper
//! ([`TrackedBody`]); the timer is re-armed lazily at the earliest moment a limit could run out.
//!
//! [`Connections`] is the registry: the connection cap with idle-first eviction (Envoy's overload
//! manager is the model), shutdown (graceful close of every connection, idle ones dropped after
//! [`LINGER`]), and the counters of `/__fanout/status`.

use bytes::Bytes;
use fanout_config::ServerConfig;
use futures_util::task::AtomicWaker;
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::server::graceful::GracefulConnection;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// How long a connection that is being closed gracefully (idle, shutdown) and has nothing in
/// flight may take to close by itself before it is dropped: time for the GOAWAY to reach the
/// client and for a polite client to close first.
pub const LINGER: Duration = Duration::from_millis(250);

/// Largest piece of an HTTP/2 answer handed to the transport at once. The answer waits in our
/// body wrapper, not in h2's buffers, so a stalled stream holds at most this much there and every
/// piece taken is a progress mark for the send timeout. (HTTP/1 answers are handed over whole:
/// one answer at a time per connection, and a client that does not read shows as a socket that
/// refuses writes.)
const H2_ANSWER_CHUNK: usize = 16 << 10;

/// At the cap with no idle connection to close, how long new connections are refused before
/// the connections are scanned again.
const RESCAN_AFTER: Duration = Duration::from_millis(10);

/// How often a connection that is closing but still busy looks again whether it became quiet.
const CLOSING_RECHECK: Duration = Duration::from_millis(50);

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const PROTO_UNKNOWN: u8 = 0;
const PROTO_H1: u8 = 1;
const PROTO_H2: u8 = 2;

/// Milliseconds since the process's epoch, never 0 (0 means "not set" in the atomics below).
/// Read on every socket read and write and several times per request: the kernel's monotonic
/// clock read directly, counted from the epoch's reading of the same clock (`Instant`'s), in
/// integers.
fn now_ms() -> u64 {
    let (e, e_ns) = epoch_ns();
    match fanout_flow::activity::monotonic_ns(false) {
        Some(ns) => ns.saturating_sub(e_ns) / 1_000_000 + 1,
        None => Instant::now().saturating_duration_since(e).as_millis() as u64 + 1,
    }
}

fn epoch() -> Instant {
    epoch_ns().0
}

/// The epoch, and the monotonic clock's nanoseconds at it.
fn epoch_ns() -> (Instant, u64) {
    static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let at = Instant::now();
        (at, fanout_flow::activity::monotonic_ns(false).unwrap_or(0))
    })
}

fn at_ms(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::from_std(epoch() + Duration::from_millis(ms.saturating_sub(1)))
}

fn dur_ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// The state of one connection the supervisor, the socket and the handlers share.
pub struct ConnShared {
    id: u64,
    /// The accept, or the end of the TLS handshake (the first-byte timer starts there).
    opened_ms: AtomicU64,
    /// `PROTO_*`: unknown until the first bytes decide (HTTP/2 once the whole preface arrived).
    proto: AtomicU8,
    /// When the protocol was decided.
    ready_ms: AtomicU64,
    /// Requests whose handler runs.
    in_flight: AtomicU32,
    /// Answer bodies not yet completely handed to the transport.
    bodies: AtomicU32,
    /// Last request start or end, or answer completion: the start of an idle period.
    activity_ms: AtomicU64,
    /// Last piece of an answer taken by the transport (or the creation of an answer).
    body_progress_ms: AtomicU64,
    /// Since when the socket refuses writes (0: it does not).
    write_blocked_ms: AtomicU64,
    /// HTTP/1: when the first byte of a request head arrived while no request was in flight.
    head_started_ms: AtomicU64,
    /// Asked to close because of the connection cap.
    evicting: AtomicBool,
    /// The supervisor ([`drive`]) is asked to look at `evicting` (set with a wake of `waker`).
    evict_asked: AtomicBool,
    /// Wakes the connection's supervisor task for what happens outside it (eviction, shutdown):
    /// one atomic per poll to register, where a `Notify` and a `watch` took a lock each.
    waker: AtomicWaker,
    /// Reset (not FIN) when the socket is dropped: unsent data is discarded at once.
    reset_on_close: AtomicBool,
}

impl ConnShared {
    fn new(id: u64) -> ConnShared {
        let now = now_ms();
        ConnShared {
            id,
            opened_ms: AtomicU64::new(now),
            proto: AtomicU8::new(PROTO_UNKNOWN),
            ready_ms: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            bodies: AtomicU32::new(0),
            activity_ms: AtomicU64::new(now),
            body_progress_ms: AtomicU64::new(now),
            write_blocked_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            evict_asked: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            reset_on_close: AtomicBool::new(false),
        }
    }

    /// A request's handler starts; the guard ends it.
    pub fn request(self: &Arc<Self>) -> ActiveRequest {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started_ms.store(0, Ordering::Relaxed);
        self.activity_ms.store(now_ms(), Ordering::Relaxed);
        ActiveRequest(self.clone())
    }

    fn proto(&self) -> u8 {
        self.proto.load(Ordering::Acquire)
    }

    /// Nothing in flight, nothing to send: a graceful close loses nothing.
    fn quiet(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && self.bodies.load(Ordering::Acquire) == 0
            && self.write_blocked_ms.load(Ordering::Relaxed) == 0
    }

    /// Quiet and not receiving a request head: the idle timer runs.
    fn idle(&self) -> bool {
        self.proto() != PROTO_UNKNOWN
            && self.quiet()
            && self.head_started_ms.load(Ordering::Relaxed) == 0
    }

    fn idle_since(&self) -> u64 {
        self.activity_ms
            .load(Ordering::Relaxed)
            .max(self.ready_ms.load(Ordering::Relaxed))
    }

    /// May be closed to make room: idle, or still silent since the accept.
    fn evictable(&self) -> Option<u64> {
        if self.proto() == PROTO_UNKNOWN {
            (self.quiet()).then(|| self.opened_ms.load(Ordering::Relaxed))
        } else {
            self.idle().then(|| self.idle_since())
        }
    }
}

/// A request in flight on a connection (dropped when its handler ends or is cancelled).
pub struct ActiveRequest(Arc<ConnShared>);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        self.0.activity_ms.store(now_ms(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client connection's stream: a TCP socket, or a TLS stream over one (`tls.rs`).
pub trait Socket: AsyncRead + AsyncWrite + Unpin {
    /// Close with a reset (not FIN) when dropped: unsent data is discarded at once.
    fn reset_on_drop(&self);
}

impl Socket for TcpStream {
    fn reset_on_drop(&self) {
        let _ = self.set_zero_linger();
    }
}

/// The client socket, recording what the connection's timers need: the first bytes (which
/// decide the protocol), HTTP/1 request heads starting, and whether writes are refused. Over
/// TLS it wraps the TLS stream, so it sees the decrypted bytes.
///
/// A connection whose first line is neither the HTTP/2 preface's nor an HTTP/1 request line
/// (its last word `HTTP/1.x`) is not HTTP this server speaks: its read fails, so hyper closes
/// it without an HTTP/1.1 answer (RFC 9113 §3.4: an invalid preface ends the connection; on a
/// port shared by HTTP/1.1 and h2c this is where the two part).
pub struct TrackedIo<S: Socket = TcpStream> {
    inner: S,
    sh: Arc<ConnShared>,
    first: FirstBytes,
}

/// What the first bytes of a connection showed so far ([`on_read`]).
struct FirstBytes {
    /// Bytes of the HTTP/2 preface matched so far, while the protocol is unknown.
    preface: usize,
    /// The first line was judged (or the preface completed): nothing more to look at.
    done: bool,
    /// 1 once the first line started (0 through leading empty lines).
    line_len: u8,
    /// Spaces in the first line so far: the version is the third word.
    spaces: u8,
    /// Bytes of the version so far.
    word_len: u8,
}

impl FirstBytes {
    fn new() -> FirstBytes {
        FirstBytes {
            preface: 0,
            done: false,
            line_len: 0,
            spaces: 0,
            word_len: 0,
        }
    }
}

/// The third word of an HTTP/1 request line: `HTTP/1.` and a digit.
const H1_VERSION: &[u8; 7] = b"HTTP/1.";

/// The error of a read on a connection that is not HTTP ([`TrackedIo`]).
fn not_http() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "neither an HTTP/1 request line nor the HTTP/2 preface",
    )
}

impl<S: Socket> TrackedIo<S> {
    /// Wrap an accepted socket; its reads and writes update the connection's state `sh`.
    pub fn new(inner: S, sh: Arc<ConnShared>) -> TrackedIo<S> {
        TrackedIo {
            inner,
            sh,
            first: FirstBytes::new(),
        }
    }

    fn on_read(&mut self, data: &[u8]) -> bool {
        on_read(&self.sh, &mut self.first, data)
    }

    /// Read and drop what the client already sent (at most 64 KiB), so that the socket closes
    /// with a FIN: closing with unread bytes would reset it, and a reset may reach the client
    /// before it reads the end.
    fn drain(&mut self, cx: &mut Context<'_>) {
        let mut scratch = [0u8; 1024];
        for _ in 0..64 {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {}
                _ => break,
            }
        }
    }

    fn on_write(&self, res: &Poll<io::Result<usize>>) {
        let blocked = &self.sh.write_blocked_ms;
        let was_blocked = blocked.load(Ordering::Relaxed) != 0;
        match res {
            Poll::Pending if !was_blocked => blocked.store(now_ms(), Ordering::Relaxed),
            Poll::Ready(Ok(n)) if *n > 0 && was_blocked => blocked.store(0, Ordering::Relaxed),
            _ => {}
        }
    }
}

impl<S: Socket> Drop for TrackedIo<S> {
    fn drop(&mut self) {
        if self.sh.reset_on_close.load(Ordering::Relaxed) {
            self.inner.reset_on_drop();
        }
    }
}

impl<S: Socket> AsyncRead for TrackedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        // Only the first bytes and HTTP/1 heads matter: HTTP/2 reads (PINGs included) are not
        // activity.
        if buf.filled().len() > before
            && this.sh.proto.load(Ordering::Relaxed) != PROTO_H2
            && !this.on_read(&buf.filled()[before..])
        {
            buf.set_filled(before);
            this.drain(cx);
            return Poll::Ready(Err(not_http()));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: Socket> AsyncWrite for TrackedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.on_write(&res);
        res
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.on_write(&res);
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What a read tells: the first bytes decide the protocol (HTTP/2 once the whole preface
/// arrived); on HTTP/1, bytes while no request is in flight start a request head. `false` when
/// the connection is not HTTP: the bytes are not the HTTP/2 preface, and the first line is not
/// an HTTP/1 request line (`METHOD TARGET HTTP/1.x`) — decided at the first byte that shows it,
/// no later than hyper's parser would refuse it with a 400. Only the first line is looked at.
fn on_read(sh: &ConnShared, first: &mut FirstBytes, data: &[u8]) -> bool {
    if !first.done {
        let mut line = data;
        if sh.proto.load(Ordering::Relaxed) == PROTO_UNKNOWN {
            let matched = data
                .iter()
                .zip(&PREFACE[first.preface..])
                .take_while(|(a, b)| a == b)
                .count();
            first.preface += matched;
            if first.preface == PREFACE.len() {
                sh.ready_ms.store(now_ms(), Ordering::Relaxed);
                sh.proto.store(PROTO_H2, Ordering::Release);
                first.done = true;
                return true;
            }
            if matched == data.len() {
                return true; // the preface so far
            }
            sh.ready_ms.store(now_ms(), Ordering::Relaxed);
            sh.proto.store(PROTO_H1, Ordering::Release);
            // The bytes that matched the preface start the line ("PRI * HTTP/2", then not the
            // rest of the preface, is not HTTP/1 either).
            line = match first_line(first, &PREFACE[..first.preface]) {
                Some(ok) => {
                    first.done = true;
                    if !ok {
                        return false;
                    }
                    &[]
                }
                None => &data[matched..],
            };
        }
        if let Some(ok) = first_line(first, line) {
            first.done = true;
            if !ok {
                return false;
            }
        }
    }
    if sh.proto.load(Ordering::Relaxed) == PROTO_H1
        && sh.in_flight.load(Ordering::Acquire) == 0
        && sh.head_started_ms.load(Ordering::Relaxed) == 0
    {
        sh.head_started_ms.store(now_ms(), Ordering::Relaxed);
    }
    true
}

/// The next bytes of an HTTP/1 connection's first line: `Some(true)` once it ended as a request
/// line, `Some(false)` at the first byte that shows it is not one, `None` while undecided.
fn first_line(first: &mut FirstBytes, mut d: &[u8]) -> Option<bool> {
    loop {
        if first.spaces == 2 {
            // the version: `HTTP/1.` and a digit, then the line's end
            for &b in d {
                match b {
                    b'\n' => return Some(usize::from(first.word_len) == H1_VERSION.len() + 1),
                    b'\r' => {}
                    _ => {
                        let i = usize::from(first.word_len);
                        first.word_len = first.word_len.saturating_add(1);
                        let ok = match H1_VERSION.get(i) {
                            Some(&want) => b == want,
                            None => i == H1_VERSION.len() && b != b' ', // the digit
                        };
                        if !ok {
                            return Some(false);
                        }
                    }
                }
            }
            return None;
        }
        // the method and the target: only their spaces and the line's end matter
        let Some(at) = d.iter().position(|&b| b == b' ' || b == b'\n') else {
            first.line_len |= u8::from(!d.is_empty() && d != b"\r");
            return None;
        };
        let before = &d[..at];
        first.line_len |= u8::from(!before.is_empty() && before != b"\r");
        if d[at] == b'\n' {
            if first.line_len != 0 {
                return Some(false); // the line ended before its version
            }
            // a leading empty line
        } else {
            first.line_len = 1;
            first.spaces += 1;
        }
        d = &d[at + 1..];
    }
}

/// An answer body, handed to the transport in pieces of at most [`H2_ANSWER_CHUNK`] on HTTP/2,
/// each one a progress mark; while it lives the connection has answer data to send.
pub struct TrackedBody<B> {
    inner: B,
    pending: Bytes,
    sh: Arc<ConnShared>,
}

impl<B> TrackedBody<B> {
    /// Wrap a request body; reading it updates the connection's state `sh`.
    pub fn new(inner: B, sh: Arc<ConnShared>) -> TrackedBody<B> {
        sh.body_progress_ms.store(now_ms(), Ordering::Relaxed);
        sh.bodies.fetch_add(1, Ordering::AcqRel);
        TrackedBody {
            inner,
            pending: Bytes::new(),
            sh,
        }
    }
}

impl<B> Drop for TrackedBody<B> {
    fn drop(&mut self) {
        self.sh.activity_ms.store(now_ms(), Ordering::Relaxed);
        self.sh.bodies.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<B> Body for TrackedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = if this.sh.proto() == PROTO_H2 {
                    this.pending.len().min(H2_ANSWER_CHUNK)
                } else {
                    this.pending.len()
                };
                let chunk = this.pending.split_to(n);
                this.sh.body_progress_ms.store(now_ms(), Ordering::Relaxed);
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.pending = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let extra = self.pending.len() as u64;
        let mut h = SizeHint::new();
        h.set_lower(inner.lower() + extra);
        if let Some(u) = inner.upper() {
            h.set_upper(u + extra);
        }
        h
    }
}

/// Which limit closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    FirstByte,
    HeaderRead,
    Idle,
    Send,
    /// The TLS handshake (`tls.handshake_timeout`).
    TlsHandshake,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Serving = 0,
    /// Shutdown: close gracefully, drop quiet connections after the linger.
    Draining = 1,
    /// The shutdown grace ran out: drop everything.
    Abort = 2,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    closed_idle_for_pressure: AtomicU64,
    accept_errors: AtomicU64,
    first_byte: AtomicU64,
    header_read: AtomicU64,
    idle: AtomicU64,
    send: AtomicU64,
    tls_handshake: AtomicU64,
    closed_at_shutdown: AtomicU64,
}

/// The limits in force, from the config.
struct Limits {
    max: usize,
    max_is_default: bool,
    first_byte_ms: u64,
    header_read_ms: u64,
    idle_ms: u64,
    send_ms: u64,
}

/// All open client connections: the cap, eviction, shutdown and counters.
pub struct Connections {
    limits: Limits,
    /// Places taken ([`Connections::admit`]): never more than `limits.max`.
    open: AtomicUsize,
    evicting: AtomicUsize,
    /// Accepted connections waiting in [`Connections::admit`] for a place an idle connection
    /// frees.
    waiting: AtomicUsize,
    /// After a scan found no idle connection, refuse without scanning until then.
    nothing_idle_until: AtomicU64,
    next_id: AtomicU64,
    table: Mutex<HashMap<u64, Arc<ConnShared>>>,
    /// [`Phase`] as a number ([`Connections::phase`]); a change wakes every connection.
    phase: AtomicU8,
    closed: Notify,
    counters: Counters,
    accept_log: Mutex<AcceptLog>,
}

impl Connections {
    /// The connection table with the limits of `server`.
    pub fn new(cfg: &ServerConfig) -> Connections {
        let c = &cfg.connections;
        let (max, max_is_default) = match c.max_connections {
            Some(m) => (m.max(1), false),
            None => (default_max_connections(open_files_limit()), true),
        };
        Connections {
            limits: Limits {
                max,
                max_is_default,
                first_byte_ms: dur_ms(c.first_byte_timeout.0).max(1),
                header_read_ms: dur_ms(cfg.header_read_timeout.0).max(1),
                idle_ms: dur_ms(c.idle_timeout.0).max(1),
                send_ms: dur_ms(c.send_timeout.0).max(1),
            },
            open: AtomicUsize::new(0),
            evicting: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            nothing_idle_until: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            table: Mutex::new(HashMap::new()),
            phase: AtomicU8::new(Phase::Serving as u8),
            closed: Notify::new(),
            counters: Counters::default(),
            accept_log: Mutex::new(AcceptLog::default()),
        }
    }

    /// The connection cap in force.
    pub fn max_connections(&self) -> usize {
        self.limits.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Connections closed at once at the cap, so far.
    pub fn refused(&self) -> u64 {
        self.counters.refused.load(Ordering::Relaxed)
    }

    /// Take a place for a just-accepted connection, which is then [registered](Self::register);
    /// `false`: refuse it ([`Connections::refuse`]). Below the cap the place is taken at once.
    /// At the cap the oldest idle connections are asked to close, and the place of the first
    /// that does is taken: an idle connection asked to close closes on its next poll, so the
    /// wait is short, and at most [`LINGER`] (one that got a request meanwhile stays open).
    /// With nothing idle, no. A place is taken atomically, so `open` never exceeds the cap —
    /// not while an evicted connection is still closing, nor with several accept loops.
    pub async fn admit(&self) -> bool {
        if self.take_place() {
            return true;
        }
        let _waiting = Waiting::new(&self.waiting);
        // Each waiting connection has a connection closing for it; more are asked when not.
        if self.evicting() < self.waiting.load(Ordering::Acquire) {
            // A scan that found nothing idle is not repeated for every connection of a flood.
            let now = now_ms();
            if now < self.nothing_idle_until.load(Ordering::Relaxed) {
                return false;
            }
            if self.evict_idle(self.eviction_batch()) == 0 && self.evicting() == 0 {
                self.nothing_idle_until
                    .store(now + dur_ms(RESCAN_AFTER), Ordering::Relaxed);
                return false;
            }
        }
        let until = tokio::time::Instant::now() + LINGER;
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.take_place() {
                return true;
            }
            if self.evicting() == 0 {
                // The connections asked to close got requests meanwhile and stay.
                return false;
            }
            if tokio::time::timeout_at(until, closed).await.is_err() {
                return self.take_place();
            }
        }
    }

    /// One more connection, if below the cap.
    fn take_place(&self) -> bool {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.limits.max).then_some(open + 1)
            })
            .is_ok()
    }

    /// A connection refused at the cap: closed at once with a reset (no TIME_WAIT kept here).
    pub fn refuse(&self, stream: TcpStream) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_zero_linger();
        drop(stream);
    }

    fn eviction_batch(&self) -> usize {
        (self.limits.max / 256).clamp(1, 64)
    }

    /// Register an accepted connection, whose place [`Connections::admit`] took.
    pub fn register(self: &Arc<Self>) -> Arc<ConnShared> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let sh = Arc::new(ConnShared::new(id));
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, sh.clone());
        sh
    }

    /// Remove a connection from the table; once only (a second call does nothing), so a
    /// connection dropped before it was served can be removed by its owner's guard as well.
    pub fn deregister(&self, sh: &ConnShared) {
        let removed = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&sh.id)
            .is_some();
        if !removed {
            return;
        }
        if sh.evicting.swap(false, Ordering::AcqRel) {
            self.evicting.fetch_sub(1, Ordering::AcqRel);
        }
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.closed.notify_waiters();
    }

    /// Ask up to `n` of the idle connections, oldest idle first, to close. Returns how many.
    pub fn evict_idle(&self, n: usize) -> usize {
        let Ok(table) = self.table.lock() else {
            return 0;
        };
        // Oldest idle first; within the same millisecond, the older connection.
        let mut idle: Vec<((u64, u64), &Arc<ConnShared>)> = table
            .values()
            .filter(|sh| !sh.evicting.load(Ordering::Acquire))
            .filter_map(|sh| sh.evictable().map(|since| ((since, sh.id), sh)))
            .collect();
        if idle.len() > n {
            idle.select_nth_unstable_by_key(n, |(key, _)| *key);
            idle.truncate(n);
        }
        for (_, sh) in &idle {
            sh.evicting.store(true, Ordering::Release);
            self.evicting.fetch_add(1, Ordering::AcqRel);
            sh.evict_asked.store(true, Ordering::Release);
            sh.waker.wake();
        }
        idle.len()
    }

    /// Connections asked to close for room that have not closed yet.
    pub fn evicting(&self) -> usize {
        self.evicting.load(Ordering::Acquire)
    }

    /// Accepting failed: count it, log at most once a second (with how many happened), and when
    /// the process is out of file descriptors close idle connections or pause accepting briefly.
    pub async fn accept_failed(&self, e: &io::Error) {
        self.counters.accept_errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut log) = self.accept_log.lock() {
            log.record(e);
        }
        let out_of_fds = matches!(e.raw_os_error(), Some(code) if code == EMFILE || code == ENFILE);
        if out_of_fds {
            // Make room: the oldest idle connections go first. With nothing to close, stop
            // accepting until a connection closes (or briefly): pending clients wait in the
            // listen backlog instead of spinning here.
            let closed = self.closed.notified();
            if self.evicting() == 0 {
                self.evict_idle(self.eviction_batch());
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), closed).await;
        } else if !matches!(
            e.kind(),
            io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::Interrupted
        ) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Shutdown: every connection closes gracefully (quiet ones are dropped after [`LINGER`]);
    /// after `grace` whatever is left is dropped.
    pub async fn shutdown(&self, grace: Duration) {
        self.set_phase(Phase::Draining);
        if tokio::time::timeout(grace, self.all_closed())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.open(),
                "shutdown grace period elapsed with requests still in flight; closing their connections"
            );
            self.set_phase(Phase::Abort);
            let _ = tokio::time::timeout(Duration::from_secs(1), self.all_closed()).await;
        }
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Serving,
            1 => Phase::Draining,
            _ => Phase::Abort,
        }
    }

    /// Enter `phase` and wake every connection's supervisor to act on it (each registers its
    /// waker before it reads the phase, so none misses the change).
    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        for sh in table.values() {
            sh.waker.wake();
        }
    }

    /// Returns once no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let closed = self.closed.notified();
            if self.open.load(Ordering::Acquire) == 0 {
                return;
            }
            closed.await;
        }
    }

    fn count(&self, kind: Kind) {
        let c = &self.counters;
        match kind {
            Kind::FirstByte => &c.first_byte,
            Kind::HeaderRead => &c.header_read,
            Kind::Idle => &c.idle,
            Kind::Send => &c.send,
            Kind::TlsHandshake => &c.tls_handshake,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// `connections` on `/__fanout/status`.
    pub fn status(&self) -> serde_json::Value {
        let c = &self.counters;
        let l = &self.limits;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "open": self.open(),
            "max": l.max,
            "max_from_open_files_limit": l.max_is_default,
            "accepted": get(&c.accepted),
            "refused": get(&c.refused),
            "closed_idle_for_pressure": get(&c.closed_idle_for_pressure),
            "accept_errors": get(&c.accept_errors),
            "closed_at_shutdown": get(&c.closed_at_shutdown),
            "timeouts": {
                "first_byte": get(&c.first_byte),
                "header_read": get(&c.header_read),
                "idle": get(&c.idle),
                "send": get(&c.send),
                "tls_handshake": get(&c.tls_handshake),
            },
        })
    }
}

/// A connection waiting in [`Connections::admit`], counted while it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// Accept errors, logged at most once a second with how many happened since the last line.
#[derive(Default)]
struct AcceptLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl AcceptLog {
    fn record(&mut self, e: &io::Error) {
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .last
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            tracing::warn!(
                error = %e,
                count = self.unlogged,
                "accepting connections failed ({} time(s) since the last report)",
                self.unlogged
            );
            self.unlogged = 0;
            self.last = Some(now);
        }
    }
}

/// The soft `RLIMIT_NOFILE` of this process (Linux: `/proc/self/limits`).
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

/// The default connection cap: three quarters of the open-files limit, so a quarter (at least
/// 64 descriptors) stays for backend connections, the listener and files. Without a known
/// limit, 10 000.
pub fn default_max_connections(nofile: Option<u64>) -> usize {
    match nofile {
        None => 10_000,
        Some(n) => {
            let n = n.min(1 << 22) as usize;
            n.saturating_sub((n / 4).max(64)).max(16)
        }
    }
}

/// What a connection does before HTTP (the TLS handshake), under its limits: `timeout`, the
/// connection cap (a connection still in its handshake is silent, so it may be closed for
/// room) and shutdown. `Ok` with `fut`'s output (the first-byte timer starts now); `Err(true)`
/// when `timeout` ran out (counted), `Err(false)` when `fut` gave nothing or the connection was
/// closed otherwise — then the connection is deregistered.
pub async fn setup<T>(
    fut: impl Future<Output = Option<T>>,
    sh: &Arc<ConnShared>,
    conns: &Connections,
    timeout: Duration,
) -> Result<T, bool> {
    let sleep = tokio::time::sleep(timeout);
    tokio::pin!(sleep);
    tokio::pin!(fut);
    let out = std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(v.ok_or(false));
        }
        sh.waker.register(cx.waker());
        if sh.evict_asked.swap(false, Ordering::AcqRel) {
            conns
                .counters
                .closed_idle_for_pressure
                .fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Err(false));
        }
        if conns.phase() != Phase::Serving {
            conns
                .counters
                .closed_at_shutdown
                .fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Err(false));
        }
        if sleep.as_mut().poll(cx).is_ready() {
            conns.count(Kind::TlsHandshake);
            return Poll::Ready(Err(true));
        }
        Poll::Pending
    })
    .await;
    match out {
        Ok(v) => {
            sh.opened_ms.store(now_ms(), Ordering::Relaxed);
            Ok(v)
        }
        Err(e) => {
            conns.deregister(sh);
            Err(e)
        }
    }
}

/// Drive one connection until it ends or one of its limits closes it.
pub async fn drive<C>(conn: C, sh: Arc<ConnShared>, conns: Arc<Connections>)
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    struct Registered<'a>(&'a Connections, &'a ConnShared);
    impl Drop for Registered<'_> {
        fn drop(&mut self) {
            self.0.deregister(self.1);
        }
    }
    let _registered = Registered(&conns, &sh);
    tokio::pin!(conn);
    let mut linger = Linger::default();
    // Fires at once: the first look arms the timer at the earliest limit.
    let sleep = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(sleep);
    let mut phase = conns.phase();
    if phase != Phase::Serving {
        linger.closing = true;
        conn.as_mut().graceful_shutdown();
    }
    // Polled by hand rather than by `select!`: the connection first; then, registered for a
    // wake from outside before reading them, the eviction request and the phase; then the
    // timer. After any of the three, the limits are looked at again (`look`).
    std::future::poll_fn(|cx| {
        loop {
            if let Poll::Ready(res) = conn.as_mut().poll(cx) {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return Poll::Ready(());
            }
            sh.waker.register(cx.waker());
            let now_phase = conns.phase();
            if sh.evict_asked.swap(false, Ordering::AcqRel) {
                if sh.evictable().is_some() {
                    conns
                        .counters
                        .closed_idle_for_pressure
                        .fetch_add(1, Ordering::Relaxed);
                    conn.as_mut().graceful_shutdown();
                    // One poll writes the GOAWAY if the socket takes it; then the descriptor
                    // is released at once.
                    let _ = conn.as_mut().poll(cx);
                    return Poll::Ready(());
                }
                // Became busy since it was picked: it stays (a connection waiting for its place
                // looks again).
                if sh.evicting.swap(false, Ordering::AcqRel) {
                    conns.evicting.fetch_sub(1, Ordering::AcqRel);
                    conns.closed.notify_waiters();
                }
            } else if now_phase != phase {
                phase = now_phase;
                if phase == Phase::Abort {
                    conns
                        .counters
                        .closed_at_shutdown
                        .fetch_add(1, Ordering::Relaxed);
                    sh.reset_on_close.store(true, Ordering::Relaxed);
                    return Poll::Ready(());
                }
                if !linger.closing {
                    linger.closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            } else if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            match look(conn.as_mut(), &sh, &conns, &mut linger, phase) {
                Some(next) => sleep.as_mut().reset(at_ms(next)),
                None => return Poll::Ready(()),
            }
        }
    })
    .await
}

/// A connection's graceful close: whether it started (idle, shutdown), and since when the
/// connection has been quiet (the linger before the descriptor is released).
#[derive(Default)]
struct Linger {
    closing: bool,
    quiet_since: Option<u64>,
}

/// Look at the limits: `Some(next)`, the earliest moment one of them could run out — the ones
/// running now, and those a change of state right after now could start (the handlers and the
/// socket change the state without waking the connection's task) — or `None`: close now.
fn look<C: GracefulConnection>(
    conn: Pin<&mut C>,
    sh: &ConnShared,
    conns: &Connections,
    st: &mut Linger,
    phase: Phase,
) -> Option<u64> {
    let l = &conns.limits;
    let now = now_ms();
    let next = now + l.idle_ms.min(l.send_ms).min(l.header_read_ms);
    let mut next = match hard_limits(sh, l, now, next) {
        Ok(next) => next,
        Err(kind) => {
            conns.count(kind);
            if kind == Kind::Send {
                sh.reset_on_close.store(true, Ordering::Relaxed);
            }
            return None;
        }
    };
    let mut conn = conn;
    if !st.closing && sh.idle() {
        let end = sh.idle_since() + l.idle_ms;
        if now >= end {
            conns.count(Kind::Idle);
            st.closing = true;
            conn.as_mut().graceful_shutdown();
        } else {
            next = next.min(end);
        }
    }
    if st.closing {
        if sh.quiet() {
            let since = *st.quiet_since.get_or_insert(now);
            let end = since + dur_ms(LINGER);
            if now >= end {
                if phase == Phase::Draining {
                    conns
                        .counters
                        .closed_at_shutdown
                        .fetch_add(1, Ordering::Relaxed);
                }
                return None;
            }
            next = next.min(end);
        } else {
            st.quiet_since = None;
            next = next.min(now + dur_ms(CLOSING_RECHECK));
        }
    }
    Some(next.max(now + 1))
}

/// The limits that close a connection at once: the first byte, reading a request head, and
/// send progress (a request body being uploaded, answers blocked on writing). `Ok`: the
/// earliest moment one of them could run out (at most `next`).
fn hard_limits(sh: &ConnShared, l: &Limits, now: u64, mut next: u64) -> Result<u64, Kind> {
    let proto = sh.proto();
    if proto == PROTO_UNKNOWN {
        let end = sh.opened_ms.load(Ordering::Relaxed) + l.first_byte_ms;
        if now >= end {
            return Err(Kind::FirstByte);
        }
        next = next.min(end);
    }
    if proto == PROTO_H1 && sh.in_flight.load(Ordering::Acquire) == 0 {
        let started = sh.head_started_ms.load(Ordering::Relaxed);
        if started != 0 {
            let end = started + l.header_read_ms;
            if now >= end {
                return Err(Kind::HeaderRead);
            }
            next = next.min(end);
        }
    }
    let upload = (sh.bodies.load(Ordering::Acquire) > 0)
        .then(|| sh.body_progress_ms.load(Ordering::Relaxed));
    let blocked = Some(sh.write_blocked_ms.load(Ordering::Relaxed)).filter(|&b| b != 0);
    for since in [upload, blocked].into_iter().flatten() {
        let end = since + l.send_ms;
        if now >= end {
            return Err(Kind::Send);
        }
        next = next.min(end);
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_cap_leaves_room_for_backends() {
        assert_eq!(default_max_connections(Some(1024)), 768);
        assert_eq!(default_max_connections(Some(200)), 136);
        assert_eq!(default_max_connections(Some(20_000)), 15_000);
        assert_eq!(default_max_connections(None), 10_000);
        assert!(default_max_connections(Some(u64::MAX)) <= 1 << 22);
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }

    fn conns(max: usize) -> Arc<Connections> {
        let mut cfg = ServerConfig::default();
        cfg.connections.max_connections = Some(max);
        Arc::new(Connections::new(&cfg))
    }

    /// An HTTP/1 connection idle since `since` (ms).
    fn idle_since(sh: &ConnShared, since: u64) {
        sh.proto.store(PROTO_H1, Ordering::Release);
        sh.ready_ms.store(since, Ordering::Relaxed);
        sh.activity_ms.store(since, Ordering::Relaxed);
    }

    /// A connection admitted (below the cap) and registered.
    fn placed(c: &Arc<Connections>) -> Arc<ConnShared> {
        assert!(c.take_place(), "below the cap");
        c.register()
    }

    /// `admit` on its own task: its outcome, once it has one.
    fn admitting(c: &Arc<Connections>) -> tokio::task::JoinHandle<bool> {
        let c = c.clone();
        tokio::spawn(async move { c.admit().await })
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_idle_connection_is_evicted_first_and_busy_ones_never() {
        let c = conns(3);
        let a = placed(&c);
        let b = placed(&c);
        let busy = placed(&c);
        idle_since(&a, 2000);
        idle_since(&b, 1000);
        idle_since(&busy, 10);
        let _req = busy.request();
        let new = admitting(&c);
        tokio::task::yield_now().await;
        assert!(!new.is_finished(), "it waits for the place being freed");
        // The evicted connection closes (its task would): its place is the new one's.
        c.deregister(&b);
        assert!(
            new.await.unwrap(),
            "at the cap, an idle connection makes room"
        );
        assert_eq!(c.open(), 3);
        assert_eq!(c.evicting(), 0);
        assert!(
            !c.table.lock().unwrap().contains_key(&b.id),
            "the oldest idle went first"
        );
        assert!(!a.evicting.load(Ordering::Acquire));
        assert!(
            !busy.evicting.load(Ordering::Acquire),
            "busy connections are never evicted"
        );
        assert_eq!(c.evict_idle(5), 1, "only `a` is left to evict");
        assert_eq!(
            c.evict_idle(5),
            0,
            "nothing idle left: new connections are refused"
        );
        assert!(!busy.evicting.load(Ordering::Acquire));
    }

    #[tokio::test(start_paused = true)]
    async fn open_never_exceeds_the_cap_while_evicted_connections_close() {
        let c = conns(2);
        let a = placed(&c);
        let b = placed(&c);
        idle_since(&a, 1000);
        idle_since(&b, 2000);
        // Two accept loops at the cap at once: each asks an idle connection to close for it.
        let first = admitting(&c);
        let second = admitting(&c);
        tokio::task::yield_now().await;
        assert_eq!(
            c.evicting(),
            2,
            "one idle connection closing per waiting one"
        );
        assert_eq!(c.open(), 2, "not over the cap while they close");
        assert_eq!(c.status()["open"], 2);
        assert!(!first.is_finished() && !second.is_finished());
        // `a` closes: one of them takes its place.
        c.deregister(&a);
        tokio::task::yield_now().await;
        assert_eq!(
            usize::from(first.is_finished()) + usize::from(second.is_finished()),
            1
        );
        assert_eq!(c.open(), 2);
        // `b` got a request meanwhile and stays: the other one is refused, at once.
        let _req = b.request();
        b.evicting.store(false, Ordering::Release);
        c.evicting.fetch_sub(1, Ordering::AcqRel);
        c.closed.notify_waiters();
        let (x, y) = (first.await.unwrap(), second.await.unwrap());
        assert!(x != y, "one admitted, one refused");
        assert_eq!(c.open(), 2);
        // Nothing idle at the cap: refused without waiting.
        assert!(!c.admit().await);
        assert_eq!(c.open(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_not_freed_within_linger_is_refused() {
        let c = conns(1);
        let a = placed(&c);
        idle_since(&a, 1000);
        // `a` is asked to close but never does (its task is stuck): refused after LINGER.
        let started = tokio::time::Instant::now();
        assert!(!c.admit().await);
        // Refused only once LINGER has passed on the paused clock.
        assert!(tokio::time::Instant::now() >= started + LINGER);
        assert_eq!(c.open(), 1);
    }

    #[tokio::test]
    async fn out_of_descriptors_evicts_idle_connections_and_counts_the_error() {
        let c = conns(100);
        let silent = placed(&c); // never sent a byte: evictable
        let emfile = io::Error::from_raw_os_error(EMFILE);
        c.accept_failed(&emfile).await;
        c.accept_failed(&emfile).await;
        assert!(silent.evicting.load(Ordering::Acquire));
        assert_eq!(c.status()["accept_errors"], 2);
    }

    #[test]
    fn accept_errors_are_logged_at_most_once_a_second() {
        let mut log = AcceptLog::default();
        let e = io::Error::from_raw_os_error(EMFILE);
        log.record(&e);
        assert_eq!(log.unlogged, 0, "the first one is logged");
        for _ in 0..100 {
            log.record(&e);
        }
        assert_eq!(log.unlogged, 100, "the next ones wait for the next report");
    }

    #[test]
    fn the_preface_decides_the_protocol() {
        let mut io_state = PrefaceOnly::new();
        assert!(io_state.feed(&PREFACE[..10]));
        assert_eq!(
            io_state.sh.proto(),
            PROTO_UNKNOWN,
            "a partial preface decides nothing"
        );
        assert!(io_state.feed(&PREFACE[10..]));
        assert_eq!(io_state.sh.proto(), PROTO_H2);
        let mut io_state = PrefaceOnly::new();
        assert!(io_state.feed(b"PO"));
        assert_eq!(io_state.sh.proto(), PROTO_H1);
        assert!(
            io_state.sh.head_started_ms.load(Ordering::Relaxed) != 0,
            "a head started"
        );
    }

    /// Each of `parts` fed in turn; whether the last was taken (`false`: not HTTP).
    fn feed_all(parts: &[&[u8]]) -> bool {
        let mut io_state = PrefaceOnly::new();
        parts.iter().all(|p| io_state.feed(p))
    }

    #[test]
    fn a_first_line_that_is_neither_http1_nor_the_preface_is_not_http() {
        // HTTP/1 request lines, however the reads cut them, and what follows them
        for parts in [
            &[&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]][..],
            &[b"G", b"ET /a?b=c HTTP/1", b".0\r", b"\n"],
            &[b"\r\n\r\nPOST /x HTTP/1.1\r\n"],
            &[b"PRI * HTTP/1.1\r\n"],
            &[b"GET / HTTP/1.1\r\n", b"garbage after the first line\n"],
            &[b"GET /no-end-yet"],
            &[b"GET / HT", b"TP/1.1\r", b"\n", b"\r\n"],
            &[
                &PREFACE[..],
                b"\x00\x00\x00garbage frames: HTTP/2 reads them",
            ],
        ] {
            assert!(feed_all(parts), "{parts:?}");
        }
        // not HTTP: h2spec's invalid preface (hyper's first read takes 24 bytes), garbage, other
        // versions, a broken HTTP/2 preface
        for parts in [
            &[&b"INVALID CONNECTION PREFA"[..], b"CE\r\n\r\n"][..],
            &[b"\x00\x01\x02\x03garbage\r\n\r\n"],
            &[b"GET / HTTP/9.9\r\n"],
            &[b"GET /\r\n"],
            &[b"GET / HTTP/1.\r\n"],
            &[b"GET / HTTP/1.11\r\n"],
            &[b"GET / HTTP/1.1 x\r\n"],
            &[b"GET / HTTP/1.1x"],
            &[b"GET /a b HTTP/1.1\r\n"],
            &[b"PRI * HTTP/2.0\r\n\r\nSM\r\n", b"x"],
            &[b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"],
        ] {
            assert!(!feed_all(parts), "{parts:?}");
        }
    }

    /// The read hook of [`TrackedIo`] without a socket.
    struct PrefaceOnly {
        sh: Arc<ConnShared>,
        first: FirstBytes,
    }

    impl PrefaceOnly {
        fn new() -> PrefaceOnly {
            PrefaceOnly {
                sh: Arc::new(ConnShared::new(1)),
                first: FirstBytes::new(),
            }
        }

        fn feed(&mut self, data: &[u8]) -> bool {
            on_read(&self.sh, &mut self.first, data)
        }
    }
}
