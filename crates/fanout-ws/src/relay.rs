//! The relay of one WebSocket: messages read from each side and written to the other, one in
//! hand per direction (a message is read from a side only once the other side's codec took
//! the previous one: backpressure, and what a connection holds is bounded by the codec's
//! buffers and one message), under the route's limits:
//!
//! - a message or frame over `max_message_bytes` / `max_frame_bytes` closes both sides with
//!   1009 (the codec refuses it before reading its payload), a frame that breaks the protocol
//!   with 1002, a text message that is not UTF-8 with 1007 — and the side at fault is read no
//!   more (its codec would go on with the frame it refused);
//! - `idle_timeout` without a frame from either side closes both with 1001 `idle timeout`;
//! - every `ping_interval` the gateway pings the client (payload `fanout`; its pong is not
//!   forwarded), so a client that answers stays open through silence;
//! - the drain (shutdown) closes both with 1001 `going away`;
//! - a side that goes away without a close frame gets the other side closed: the backend with
//!   1001 `client went away`, the client with 1011 `backend went away`.
//!
//! Close frames are passed on with their code and reason; pings are passed on (and answered at
//! once by the codec), pongs too except those to the gateway's own pings. A closing connection
//! gets `close_timeout` for the close handshakes, then both sockets are dropped.

use crate::counters::{By, Dir, RouteCounters};
use futures_util::{Sink, Stream};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::{Error as WsErr, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

/// The payload of the gateway's own pings.
const PING: &[u8] = b"fanout";

/// A relay's clocks.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest time without a frame from either side.
    pub idle: Duration,
    /// How often the client is pinged (`None`: never).
    pub ping: Option<Duration>,
    /// Time given to the close handshakes.
    pub close: Duration,
}

/// One side of the relay.
struct Side<S> {
    ws: WebSocketStream<S>,
    /// The message taken for this side, not yet given to its codec.
    out: Option<Message>,
    /// The codec holds bytes to write.
    flush: bool,
    /// Its stream ended (closed, failed, or the close handshake is over).
    gone: bool,
    /// A close frame went (or is going) to it: no more data is sent.
    closing: bool,
    /// It broke the protocol or a limit: nothing more is read from it (its codec would go on
    /// with the frame it refused), only our close frame written.
    deaf: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Side<S> {
    fn new(ws: WebSocketStream<S>) -> Side<S> {
        Side {
            ws,
            out: None,
            flush: false,
            gone: false,
            closing: false,
            deaf: false,
        }
    }

    /// Nothing more will come from it or go to it.
    fn done(&self) -> bool {
        self.gone || (self.deaf && self.out.is_none() && !self.flush)
    }

    /// Whether a data message (or ping) may be taken for this side now.
    fn takes(&self) -> bool {
        !self.gone && !self.closing && self.out.is_none()
    }

    /// Send a close frame (replacing a message not yet given to the codec).
    fn close(&mut self, code: CloseCode, reason: &'static str) {
        if self.gone || self.closing {
            return;
        }
        self.closing = true;
        self.out = Some(Message::Close(Some(CloseFrame {
            code,
            reason: Utf8Bytes::from_static(reason),
        })));
    }

    /// Pass a close frame that came from the other side.
    fn pass_close(&mut self, frame: Option<CloseFrame>) {
        if self.gone || self.closing {
            return;
        }
        self.closing = true;
        self.out = Some(Message::Close(frame));
    }

    /// Give the message in hand to the codec and flush; whether anything changed.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> bool {
        if self.gone {
            let had = self.out.take().is_some() || self.flush;
            self.flush = false;
            return had;
        }
        let mut progress = false;
        if self.out.is_some() {
            match Pin::new(&mut self.ws).poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    if let Some(m) = self.out.take()
                        && Pin::new(&mut self.ws).start_send(m).is_err()
                    {
                        self.gone = true;
                        return true;
                    }
                    self.flush = true;
                    progress = true;
                }
                Poll::Ready(Err(_)) => {
                    self.gone = true;
                    return true;
                }
                Poll::Pending => {}
            }
        }
        if self.flush {
            match Pin::new(&mut self.ws).poll_flush(cx) {
                Poll::Ready(Ok(())) => {
                    self.flush = false;
                    progress = true;
                }
                Poll::Ready(Err(_)) => {
                    self.gone = true;
                    progress = true;
                }
                Poll::Pending => {}
            }
        }
        progress
    }
}

/// What a read from one side asks of the relay.
enum Read {
    /// Nothing now.
    Nothing,
    /// A message for the other side.
    Pass(Message),
    /// A close frame: passed on, the connection closing.
    Close(Option<CloseFrame>),
    /// A message or frame over the limit (1009), or a frame that breaks the protocol (1002)
    /// or a text message that is not UTF-8 (1007): the side is read no more.
    Fault(CloseCode, &'static str),
    /// The side went away (without a close frame unless it sent one before).
    Gone,
    /// A frame that moves nothing (a pong to the gateway's ping).
    Seen,
}

fn read<S: AsyncRead + AsyncWrite + Unpin>(side: &mut Side<S>, cx: &mut Context<'_>) -> Read {
    match Pin::new(&mut side.ws).poll_next(cx) {
        Poll::Pending => Read::Nothing,
        Poll::Ready(None) => {
            side.gone = true;
            Read::Gone
        }
        // A side that went away without a close frame is gone, not at fault.
        Poll::Ready(Some(Err(WsErr::Protocol(ProtocolError::ResetWithoutClosingHandshake)))) => {
            side.gone = true;
            Read::Gone
        }
        Poll::Ready(Some(Err(e @ (WsErr::Capacity(_) | WsErr::Protocol(_) | WsErr::Utf8(_))))) => {
            side.deaf = true;
            match e {
                WsErr::Capacity(_) => Read::Fault(CloseCode::Size, "message too big"),
                WsErr::Utf8(_) => {
                    Read::Fault(CloseCode::Invalid, "invalid UTF-8 in a text message")
                }
                _ => Read::Fault(CloseCode::Protocol, "protocol error"),
            }
        }
        Poll::Ready(Some(Err(_))) => {
            side.gone = true;
            Read::Gone
        }
        Poll::Ready(Some(Ok(m))) => match m {
            Message::Close(f) => {
                // The codec answers it; what is left is to flush that answer.
                side.closing = true;
                side.flush = true;
                Read::Close(f)
            }
            Message::Ping(_) => {
                // The codec queued its pong: flushed with the next write.
                side.flush = true;
                Read::Pass(m)
            }
            Message::Pong(ref p) if &p[..] == PING => Read::Seen,
            Message::Frame(_) => Read::Seen,
            m => Read::Pass(m),
        },
    }
}

fn data_len(m: &Message) -> Option<usize> {
    match m {
        Message::Text(t) => Some(t.len()),
        Message::Binary(b) => Some(b.len()),
        _ => None,
    }
}

/// Relay between `client` and `backend` until both ended or the close time ran out; counts
/// messages, bytes and how it ended in `counters`. `drain` comes when the gateway shuts down
/// (and this WebSocket's turn in `server.drain_spread` has come).
pub async fn run<C, B>(
    client: WebSocketStream<C>,
    backend: WebSocketStream<B>,
    limits: Limits,
    counters: &RouteCounters,
    drain: crate::counters::DrainSignal,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut c = Side::new(client);
    let mut b = Side::new(backend);
    let idle = tokio::time::sleep(limits.idle);
    tokio::pin!(idle);
    let closing_timer = tokio::time::sleep(limits.close);
    tokio::pin!(closing_timer);
    let mut closing = false;
    let mut ping = limits.ping.map(|p| {
        let mut i = tokio::time::interval_at(Instant::now() + p, p);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let mut ping_due = false;
    let drained = drain.wait();
    tokio::pin!(drained);
    let mut first: Option<(By, u16)> = None;
    let code_of = |f: &Option<CloseFrame>| f.as_ref().map_or(1005, |f| u16::from(f.code));
    std::future::poll_fn(|cx| {
        loop {
            let mut progress = false;
            let mut start_closing = false;
            if !closing && drained.as_mut().poll(cx).is_ready() {
                first.get_or_insert((By::Gateway, 1001));
                c.close(CloseCode::Away, "going away");
                b.close(CloseCode::Away, "going away");
                start_closing = true;
            }
            // Client to backend.
            if !c.gone && !c.deaf && b.out.is_none() {
                match read(&mut c, cx) {
                    Read::Nothing => {}
                    r => {
                        progress = true;
                        idle.as_mut().reset(Instant::now() + limits.idle);
                        match r {
                            Read::Pass(m) => {
                                if let Some(n) = data_len(&m) {
                                    counters.message(Dir::In, n);
                                }
                                if b.takes() {
                                    b.out = Some(m);
                                }
                            }
                            Read::Close(f) => {
                                first.get_or_insert((By::Client, code_of(&f)));
                                b.pass_close(f);
                                start_closing = true;
                            }
                            Read::Fault(code, why) => {
                                first.get_or_insert((By::Gateway, u16::from(code)));
                                c.close(code, why);
                                b.close(code, why);
                                start_closing = true;
                            }
                            Read::Gone => {
                                first.get_or_insert((By::Client, 1006));
                                b.close(CloseCode::Away, "client went away");
                                start_closing = true;
                            }
                            Read::Seen | Read::Nothing => {}
                        }
                    }
                }
            }
            // Backend to client.
            if !b.gone && !b.deaf && c.out.is_none() {
                match read(&mut b, cx) {
                    Read::Nothing => {}
                    r => {
                        progress = true;
                        idle.as_mut().reset(Instant::now() + limits.idle);
                        match r {
                            Read::Pass(m) => {
                                if let Some(n) = data_len(&m) {
                                    counters.message(Dir::Out, n);
                                }
                                if c.takes() {
                                    c.out = Some(m);
                                }
                            }
                            Read::Close(f) => {
                                first.get_or_insert((By::Backend, code_of(&f)));
                                c.pass_close(f);
                                start_closing = true;
                            }
                            Read::Fault(code, why) => {
                                first.get_or_insert((By::Gateway, u16::from(code)));
                                c.close(code, why);
                                b.close(code, why);
                                start_closing = true;
                            }
                            Read::Gone => {
                                first.get_or_insert((By::Backend, 1006));
                                c.close(CloseCode::Error, "backend went away");
                                start_closing = true;
                            }
                            Read::Seen | Read::Nothing => {}
                        }
                    }
                }
            }
            if !closing {
                if let Some(p) = &mut ping
                    && p.poll_tick(cx).is_ready()
                {
                    ping_due = true;
                    progress = true;
                }
                if ping_due && c.takes() {
                    c.out = Some(Message::Ping(bytes::Bytes::from_static(PING)));
                    ping_due = false;
                }
                if idle.as_mut().poll(cx).is_ready() {
                    first.get_or_insert((By::Gateway, 1001));
                    c.close(CloseCode::Away, "idle timeout");
                    b.close(CloseCode::Away, "idle timeout");
                    start_closing = true;
                }
            }
            progress |= b.poll_write(cx);
            progress |= c.poll_write(cx);
            if start_closing && !closing {
                closing = true;
                closing_timer.as_mut().reset(Instant::now() + limits.close);
                progress = true;
            }
            if c.done() && b.done() {
                return Poll::Ready(());
            }
            if closing {
                // A side whose close handshake is over and flushed is done with.
                if closing_timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            if !progress {
                return Poll::Pending;
            }
        }
    })
    .await;
    let (by, code) = first.unwrap_or((By::Gateway, 1006));
    counters.closed(by, code);
}
