//! gRPC over a pass-through route (a `grpc:` route with `pass:`): unary and streaming methods
//! (client, server, bidi) forwarded as they are. The messages of both streams are watched as
//! they pass — each one's 5-byte length prefix is read, its bytes are never copied, decoded or
//! re-compressed (`grpc-encoding` is the peers' business) — so that:
//!
//! - a message over `pass.max_message_bytes` ends the call with `RESOURCE_EXHAUSTED`: from the
//!   client, its upload is cut (the backend sees the stream reset) and the answer ends with that
//!   status; from the backend, the answer ends with it before the message, and the backend's
//!   stream is dropped;
//! - a cut of the exchange after the answer's head (its timeout — `pass.timeout` or the client's
//!   `grpc-timeout`, whichever is sooner —, its idle time, a backend whose stream broke) ends the
//!   answer with the gRPC status it means in trailers (`DEADLINE_EXCEEDED`, `UNAVAILABLE`), so a
//!   client sees a status instead of a transport error.
//!
//! A client that cancels resets its stream: the request and answer bodies are dropped with it,
//! and so is the backend's stream (the backend sees the call cancelled).

use crate::body::Cut;
use bytes::Bytes;
use fanout_layers::stream::BoxError;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// The length prefix of a gRPC message: a compressed flag and a big-endian `u32`.
const PREFIX: usize = 5;

/// Where a stream of gRPC messages is: inside a message's prefix or its bytes.
#[derive(Debug, Default)]
pub struct Messages {
    /// Prefix bytes seen of the message that starts (0–4), and those bytes.
    prefix: [u8; PREFIX],
    have: usize,
    /// Bytes of the current message still to come.
    left: u64,
    /// Messages that started.
    started: u64,
}

/// A message longer than the limit starts at `at` of the data just fed (0 when its prefix began
/// in an earlier frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge {
    /// Where its prefix starts in the data fed.
    pub at: usize,
    /// Its length.
    pub len: u64,
}

impl Messages {
    /// Follow `data`, the next bytes of the stream: `Err` at the first message longer than
    /// `limit`.
    pub fn feed(&mut self, data: &[u8], limit: usize) -> Result<(), TooLarge> {
        let mut i = 0;
        while i < data.len() {
            if self.left > 0 {
                let take = self.left.min((data.len() - i) as u64);
                self.left -= take;
                i += take as usize;
                continue;
            }
            // A prefix: it starts here unless it began in an earlier frame.
            let start = if self.have == 0 { i } else { 0 };
            let take = (PREFIX - self.have).min(data.len() - i);
            self.prefix[self.have..self.have + take].copy_from_slice(&data[i..i + take]);
            self.have += take;
            i += take;
            if self.have == PREFIX {
                self.have = 0;
                self.started += 1;
                let len = u64::from(u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]));
                if len > limit as u64 {
                    return Err(TooLarge { at: start, len });
                }
                self.left = len;
            }
        }
        Ok(())
    }

    /// Messages that started so far.
    pub fn started(&self) -> u64 {
        self.started
    }
}

/// What a call's two streams tell each other: the client's upload was refused for a message over
/// the limit (the answer then ends with `RESOURCE_EXHAUSTED`).
#[derive(Debug, Default)]
pub struct Verdict {
    request_too_large: AtomicBool,
}

impl Verdict {
    /// Whether the client's upload was refused for a message over the limit.
    pub fn request_too_large(&self) -> bool {
        self.request_too_large.load(Ordering::Relaxed)
    }
}

/// The error a request stream fails with when a message is over the limit.
#[derive(Debug, thiserror::Error)]
#[error("a request message of {len} bytes exceeds {limit} (pass.max_message_bytes)")]
pub struct MessageTooLarge {
    len: u64,
    limit: usize,
}

/// The client's stream of request messages, watched on its way to the backend.
pub struct Requests<B> {
    inner: B,
    messages: Messages,
    limit: usize,
    verdict: Arc<Verdict>,
    failed: bool,
}

impl<B> Requests<B> {
    /// `inner`, failed at its first message over `limit` bytes (said in `verdict`).
    pub fn new(inner: B, limit: usize, verdict: Arc<Verdict>) -> Self {
        Requests {
            inner,
            messages: Messages::default(),
            limit,
            verdict,
            failed: false,
        }
    }
}

impl<B> Body for Requests<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref()
                    && let Err(t) = this.messages.feed(d, this.limit)
                {
                    this.failed = true;
                    this.verdict
                        .request_too_large
                        .store(true, Ordering::Relaxed);
                    return Poll::Ready(Some(Err(Box::new(MessageTooLarge {
                        len: t.len,
                        limit: this.limit,
                    }))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            other => other.map(|_| None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The backend's stream of answer messages, watched on its way to the client; a cut ends it
/// with trailers naming the gRPC status instead of an aborted stream.
pub struct Answers<B> {
    inner: B,
    messages: Messages,
    limit: usize,
    verdict: Arc<Verdict>,
    /// The trailers to send next (the call ended on our side), then the end.
    ending: Option<HeaderMap>,
    done: bool,
}

impl<B> Answers<B> {
    /// `inner` (a pass-through answer), with messages up to `limit` bytes.
    pub fn new(inner: B, limit: usize, verdict: Arc<Verdict>) -> Self {
        Answers {
            inner,
            messages: Messages::default(),
            limit,
            verdict,
            ending: None,
            done: false,
        }
    }
}

/// Trailers ending a call with `code` (a gRPC status code) and `message`.
pub fn status_trailers(code: u8, message: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from(u16::from(code)));
    // A message is percent-encoded where it is not printable ASCII (gRPC's rule); ours are.
    if let Ok(v) = HeaderValue::from_str(message) {
        h.insert("grpc-message", v);
    }
    h
}

/// The gRPC status of a cut answer (`error`, what the pass-through body failed with).
fn cut_status(error: &BoxError, verdict: &Verdict) -> (u8, String) {
    if verdict.request_too_large.load(Ordering::Relaxed) {
        return (8, "a request message exceeds pass.max_message_bytes".into());
    }
    match error.downcast_ref::<Cut>() {
        Some(c @ (Cut::Timeout(_) | Cut::Idle(_))) => (4, c.to_string()),
        Some(c @ Cut::TooLarge(_)) => (8, c.to_string()),
        Some(Cut::ClientBroke) => (1, "the client's stream broke".into()),
        Some(Cut::BackendBroke) | None => (14, "the backend's stream broke".into()),
    }
}

impl<B> Body for Answers<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(t) = this.ending.take() {
            this.done = true;
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Some(d) = frame.data_ref() else {
                    return Poll::Ready(Some(Ok(frame)));
                };
                match this.messages.feed(d, this.limit) {
                    Ok(()) => Poll::Ready(Some(Ok(frame))),
                    Err(t) => {
                        let why = format!(
                            "an answer message of {} bytes exceeds {} (pass.max_message_bytes)",
                            t.len, this.limit
                        );
                        let trailers = status_trailers(8, &why);
                        // What came before the message goes out, then the status.
                        let before = d.slice(..t.at);
                        if before.is_empty() {
                            this.done = true;
                            Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                        } else {
                            this.ending = Some(trailers);
                            Poll::Ready(Some(Ok(Frame::data(before))))
                        }
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let (code, message) = cut_status(&e, &this.verdict);
                this.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(status_trailers(code, &message)))))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.ending.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn msg(len: u32) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&len.to_be_bytes());
        v.extend(std::iter::repeat_n(7u8, len as usize));
        v
    }

    #[test]
    fn messages_are_followed_across_frames_and_the_first_too_large_is_found() {
        let mut stream = msg(3);
        stream.extend(msg(0));
        stream.extend(msg(10));
        // Fed one byte at a time, and whole: the same messages.
        let mut m = Messages::default();
        for b in &stream {
            m.feed(std::slice::from_ref(b), 10).unwrap();
        }
        assert_eq!(m.started(), 3);
        let mut whole = Messages::default();
        whole.feed(&stream, 10).unwrap();
        assert_eq!(whole.started(), 3);
        // The 10-byte message is over a limit of 9: its prefix starts at byte 13.
        let mut m = Messages::default();
        assert_eq!(m.feed(&stream, 9), Err(TooLarge { at: 13, len: 10 }));
        // A prefix split over two frames: found in the second, where it starts at 0.
        let mut m = Messages::default();
        m.feed(&stream[..15], 9).unwrap();
        assert_eq!(m.feed(&stream[15..], 9), Err(TooLarge { at: 0, len: 10 }));
    }
}
