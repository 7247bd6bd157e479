//! Streamed calls: the call path of pass-through routes, beside the whole-body one
//! ([`Backend::call`](crate::Backend::call)).
//!
//! A [`StreamRequest`] carries its body as a stream that is sent at most once ([`BodySlot`]),
//! and a [`StreamResponse`] is the answer's head with its body still to be read
//! ([`StreamBody`]): nothing is gathered, so what a request holds is the frame in hand, whatever
//! the body's size. A backend opens one with [`Backend::open`](crate::Backend::open); each layer
//! says what it does with streams (`open` beside `call`):
//!
//! | layer      | on a streamed call |
//! |------------|--------------------|
//! | cache, dedup, hedge | nothing: passed down (a stream is neither stored, shared nor sent twice) |
//! | breaker    | the same state: refused while open; judged by the answer's head (a 5xx or no answer is a failure) |
//! | bulkhead   | the same slots, held until the answer's body ends ([`StreamResponse::hold`]) |
//! | retry      | only an idempotent call whose body was not touched yet ([`BodySlot::untouched`]) |
//! | rate limit | the same tokens |
//!
//! The protocol client sends the body as its transport asks for it (backpressure: a frame is
//! taken from the client only when the backend's connection can take it) and gives back the
//! answer's body as it arrives.

use crate::error::{CallError, CallErrorKind};
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// The error of a streamed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streamed body, either way: frames of data (and trailers) as they come.
pub type StreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// A streamed call, ready to send.
#[derive(Clone)]
pub struct StreamRequest {
    /// HTTP method.
    pub method: Method,
    /// Path and query, relative to the backend's base URL.
    pub path_and_query: PathAndQuery,
    /// The headers to send (the backend adds its static headers).
    pub headers: HeaderMap,
    /// The body, sent at most once.
    pub body: BodySlot,
    /// Time the answer's head may take (the layers fit their attempts in it).
    pub timeout: Duration,
    /// When the whole exchange ends.
    pub deadline: Instant,
    /// Whether the method may be sent twice: with an untouched body, such a call may be retried.
    pub idempotent: bool,
    /// The call's trace context, as on [`crate::CallRequest::trace`].
    pub trace: Option<crate::trace::CallTrace>,
}

/// The answer of a streamed call: its head, its body still to be read.
pub struct StreamResponse {
    /// Status code.
    pub status: StatusCode,
    /// The HTTP version the backend answered in (a proxy names it in `Via`).
    pub version: http::Version,
    /// The answer's headers, as the backend sent them.
    pub headers: HeaderMap,
    /// The body, read as the caller asks for it.
    pub body: StreamBody,
}

impl std::fmt::Debug for StreamResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl StreamResponse {
    /// The same answer, keeping `guard` (a bulkhead's slot, a connection) until its body ends
    /// — read to the end, failed, or dropped.
    pub fn hold<G: Send + 'static>(self, guard: G) -> StreamResponse {
        StreamResponse {
            body: UnsyncBoxBody::new(Held {
                inner: self.body,
                guard: Some(guard),
            }),
            ..self
        }
    }
}

/// A body that keeps a guard until it ends.
struct Held<G> {
    inner: StreamBody,
    guard: Option<G>,
}

impl<G: Send + 'static> Body for Held<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.guard = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// `Held` is `Unpin` (its fields are), whatever `G` is: it is only moved, never pinned in place.
impl<G> Unpin for Held<G> {}

/// A request body sent at most once: the protocol client takes it from the slot when its
/// transport first asks for a frame ([`BodySlot::sender`]). Until then it is
/// [`BodySlot::untouched`], and an attempt that failed before (no connection, a refused stream)
/// may be followed by another that sends it.
#[derive(Clone)]
pub struct BodySlot(Arc<Slot>);

struct Slot {
    body: Mutex<Option<StreamBody>>,
    /// The body's size hint when it was put in (its `Content-Length`, when it has one).
    hint: SizeHint,
    /// It had nothing to send.
    empty: bool,
    /// A sender took it.
    touched: AtomicBool,
    /// A sender saw its end.
    finished: AtomicBool,
}

impl BodySlot {
    /// A slot holding `body`.
    pub fn new(body: StreamBody) -> BodySlot {
        let hint = body.size_hint();
        let empty = body.is_end_stream();
        BodySlot(Arc::new(Slot {
            body: Mutex::new((!empty).then_some(body)),
            hint,
            empty,
            touched: AtomicBool::new(false),
            finished: AtomicBool::new(empty),
        }))
    }

    /// A slot with no body.
    pub fn empty() -> BodySlot {
        BodySlot::new(UnsyncBoxBody::new(
            http_body_util::Empty::<Bytes>::new().map_err(|never| match never {}),
        ))
    }

    /// Whether no frame of the body was asked for yet (always, for a body without bytes).
    pub fn untouched(&self) -> bool {
        !self.0.touched.load(Ordering::Acquire)
    }

    /// Whether the body was sent to its end (always, for a body without bytes).
    pub fn finished(&self) -> bool {
        self.0.finished.load(Ordering::Acquire)
    }

    /// The body's size hint (exact when the request announced its length).
    pub fn size_hint(&self) -> SizeHint {
        self.0.hint
    }

    /// The body as a transport sends it: taken from the slot on its first poll (a second
    /// sender after that fails its first poll: the body went with an earlier attempt).
    pub fn sender(&self) -> SlotBody {
        SlotBody {
            slot: self.0.clone(),
            body: None,
        }
    }
}

/// A [`BodySlot`]'s body on its way to the backend.
pub struct SlotBody {
    slot: Arc<Slot>,
    body: Option<StreamBody>,
}

impl std::fmt::Debug for SlotBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotBody").finish_non_exhaustive()
    }
}

/// The body of a streamed call was already sent by an earlier attempt.
#[derive(Debug, thiserror::Error)]
#[error("the request body was already sent by an earlier attempt")]
pub struct AlreadySent;

impl Body for SlotBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.body.is_none() {
            if this.slot.empty {
                return Poll::Ready(None);
            }
            this.slot.touched.store(true, Ordering::Release);
            let taken = this
                .slot
                .body
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            match taken {
                Some(b) => this.body = Some(b),
                None => return Poll::Ready(Some(Err(Box::new(AlreadySent)))),
            }
        }
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let r = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = r {
            this.slot.finished.store(true, Ordering::Release);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Some(b) => b.is_end_stream(),
            None => self.slot.empty,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Some(b) => b.size_hint(),
            None => self.slot.hint,
        }
    }
}

/// The answer of a backend that cannot stream ([`Backend::open`](crate::Backend::open)'s
/// default).
pub(crate) fn not_streaming() -> CallError {
    CallError::new(
        CallErrorKind::Invalid,
        "this backend's protocol does not carry streamed calls",
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn body(text: &'static str) -> StreamBody {
        UnsyncBoxBody::new(Full::new(Bytes::from_static(text.as_bytes())).map_err(|e| match e {}))
    }

    #[tokio::test]
    async fn a_slot_is_sent_once_and_untouched_until_a_transport_asks() {
        let slot = BodySlot::new(body("hello"));
        assert!(slot.untouched());
        assert_eq!(slot.size_hint().exact(), Some(5));
        let first = slot.sender();
        assert_eq!(first.size_hint().exact(), Some(5));
        // A sender made but never polled (the attempt failed before sending) leaves it.
        drop(first);
        assert!(slot.untouched());
        let got = slot.sender().collect().await.unwrap().to_bytes();
        assert_eq!(got, "hello");
        assert!(!slot.untouched());
        assert!(slot.finished());
        // Another attempt cannot send it again.
        assert!(slot.sender().collect().await.is_err());
    }

    #[tokio::test]
    async fn an_empty_body_is_never_touched() {
        let slot = BodySlot::empty();
        let got = slot.sender().collect().await.unwrap().to_bytes();
        assert!(got.is_empty());
        assert!(slot.untouched());
        assert!(slot.finished());
        assert!(slot.sender().collect().await.is_ok(), "sent again: nothing");
    }

    #[tokio::test]
    async fn a_held_guard_is_released_when_the_body_ends() {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let resp = StreamResponse {
            status: StatusCode::OK,
            version: http::Version::HTTP_11,
            headers: HeaderMap::new(),
            body: body("abc"),
        }
        .hold(Flag(dropped.clone()));
        let mut b = resp.body;
        assert!(b.frame().await.is_some());
        assert!(
            !dropped.load(Ordering::SeqCst),
            "held while the body goes on"
        );
        assert!(b.frame().await.is_none());
        assert!(dropped.load(Ordering::SeqCst), "released at its end");
    }
}
