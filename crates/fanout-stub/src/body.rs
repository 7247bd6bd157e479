//! Response bodies of the stub: a whole body in one frame (the normal case, no allocation
//! beyond the bytes), a body dribbled in timed pieces (`slow_body`), and a body that fails
//! after the headers went out (`close_after_headers`). The first two can end with trailers
//! (gRPC answers: `grpc-status`, `grpc-message`), which HTTP/2 sends after the data.

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The error a `close_after_headers` body ends with; hyper then closes the connection (HTTP/1)
/// or resets the stream (HTTP/2).
#[derive(Debug, thiserror::Error)]
#[error("connection closed after the headers (injected fault)")]
pub(crate) struct InjectedClose;

/// A response body of the stub.
pub(crate) enum StubBody {
    /// All bytes in one frame, then the trailers if any.
    Full {
        /// The bytes, until sent.
        data: Option<Bytes>,
        /// The trailers, until sent.
        trailers: Option<HeaderMap>,
    },
    /// Pieces sent on a schedule.
    Dribble(Dribble),
    /// An event stream (`sse:` routes), its events as they are due.
    Events(crate::events::EventsBody),
    /// Announces `len` bytes, then fails once the headers are flushed.
    CloseAfterHeaders {
        /// The announced `content-length`.
        len: u64,
        /// Whether the first poll (which lets hyper flush the headers) happened.
        yielded: bool,
    },
}

/// A body sent in `chunks` pieces, piece `i` (from 0) at `start + (i + 1) · interval`.
pub(crate) struct Dribble {
    body: Bytes,
    chunks: u32,
    next: u32,
    start: Instant,
    interval: Duration,
    /// Boxed so the body stays `Unpin`; one allocation per dribbled response.
    sleep: Pin<Box<Sleep>>,
    /// Sent after the last piece.
    trailers: Option<HeaderMap>,
}

impl StubBody {
    /// A whole body.
    pub(crate) fn full(b: impl Into<Bytes>) -> StubBody {
        StubBody::Full {
            data: Some(b.into()),
            trailers: None,
        }
    }

    /// This body with `trailers` sent after its data (a body that fails after the headers has
    /// none: it ends with an error).
    pub(crate) fn with_trailers(mut self, t: HeaderMap) -> StubBody {
        match &mut self {
            StubBody::Full { trailers, .. } => *trailers = Some(t),
            StubBody::Dribble(d) => d.trailers = Some(t),
            StubBody::Events(_) | StubBody::CloseAfterHeaders { .. } => {}
        }
        self
    }

    /// `body` in `chunks` pieces spread over `duration` from now, without padding: at most one
    /// piece per byte (for bodies whose length is part of their format, e.g. a gRPC frame).
    pub(crate) fn dribble_exact(body: Bytes, chunks: u32, duration: Duration) -> StubBody {
        let most = u32::try_from(body.len()).unwrap_or(u32::MAX);
        Self::dribble(body, chunks.min(most), duration)
    }

    /// `body` in `chunks` pieces spread over `duration` from now. Bodies shorter than `chunks`
    /// bytes are padded with spaces (valid trailing whitespace in JSON) so every piece carries
    /// at least one byte.
    pub(crate) fn dribble(body: Bytes, chunks: u32, duration: Duration) -> StubBody {
        let chunks = chunks.max(1);
        let body = if body.len() < chunks as usize {
            let mut padded = Vec::with_capacity(chunks as usize);
            padded.extend_from_slice(&body);
            padded.resize(chunks as usize, b' ');
            Bytes::from(padded)
        } else {
            body
        };
        let start = Instant::now();
        let interval = duration / chunks;
        StubBody::Dribble(Dribble {
            body,
            chunks,
            next: 0,
            start,
            interval,
            sleep: Box::pin(tokio::time::sleep_until(start + interval)),
            trailers: None,
        })
    }

    /// A body announcing `len` bytes (at least 1) that fails instead of sending them.
    pub(crate) fn close_after_headers(len: usize) -> StubBody {
        StubBody::CloseAfterHeaders {
            len: (len as u64).max(1),
            yielded: false,
        }
    }
}

impl Dribble {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame<Bytes>>> {
        if self.next >= self.chunks {
            return Poll::Ready(self.trailers.take().map(Frame::trailers));
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let (i, n, len) = (self.next as usize, self.chunks as usize, self.body.len());
        let piece = self.body.slice(i * len / n..(i + 1) * len / n);
        self.next += 1;
        if self.next < self.chunks {
            let at = self.start + self.interval * (self.next + 1);
            self.sleep.as_mut().reset(at);
        }
        Poll::Ready(Some(Frame::data(piece)))
    }
}

impl Body for StubBody {
    type Data = Bytes;
    type Error = InjectedClose;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, InjectedClose>>> {
        match self.get_mut() {
            StubBody::Full { data, trailers } => Poll::Ready(
                data.take()
                    .filter(|b| !b.is_empty())
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            StubBody::Dribble(d) => d.poll_next(cx).map(|o| o.map(Ok)),
            StubBody::Events(e) => e.poll_next(cx).map(|o| o.map(Ok)),
            StubBody::CloseAfterHeaders { yielded, .. } => {
                if *yielded {
                    Poll::Ready(Some(Err(InjectedClose)))
                } else {
                    // Let hyper flush the status line and headers before the body fails.
                    *yielded = true;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            StubBody::Full { data, trailers } => {
                data.as_ref().is_none_or(Bytes::is_empty) && trailers.is_none()
            }
            StubBody::Dribble(d) => d.next >= d.chunks && d.trailers.is_none(),
            StubBody::Events(_) | StubBody::CloseAfterHeaders { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            StubBody::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |b| b.len() as u64))
            }
            StubBody::Dribble(d) => {
                let len = d.body.len() as u64;
                let sent = (u64::from(d.next) * len) / u64::from(d.chunks.max(1));
                SizeHint::with_exact(len.saturating_sub(sent))
            }
            StubBody::CloseAfterHeaders { len, .. } => SizeHint::with_exact(*len),
            StubBody::Events(_) => SizeHint::new(),
        }
    }
}
