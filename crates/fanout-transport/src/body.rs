//! The body of every answer the gateway sends ([`Body`]): a whole body (JSON, metrics text, a
//! gRPC message), optionally followed by trailers (`grpc-status`), or — for the gRPC services
//! tonic serves (server reflection) — a stream that ends at a deadline, or a pass-through
//! route's answer as its backend sends it. (The body of a backend
//! call is `fanout-client`'s.)

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Frame, SizeHint};
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::time::{Instant, Sleep};

/// Errors of streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An answer body.
pub enum Body {
    /// A whole body, then trailers if any.
    Full {
        /// The data, `None` once sent (or when there is none).
        data: Option<Bytes>,
        /// Trailers sent after the data (`grpc-status`, `grpc-message`).
        /// (Boxed: a response is moved through several layers, and only gRPC answers have
        /// trailers.)
        trailers: Option<Box<HeaderMap>>,
    },
    /// A body passed through from a backend as it arrives (pass-through routes): its frames,
    /// trailers included, as they come; its error aborts the answer (the client sees a cut
    /// body, never a clean end). Never buffered by the answer phase (compression skips it).
    Passed(UnsyncBoxBody<Bytes, BoxError>),
    /// A streamed body that ends (without trailers) when its deadline passes.
    Stream {
        /// The body.
        inner: UnsyncBoxBody<Bytes, BoxError>,
        /// When it is cut.
        until: Pin<Box<Sleep>>,
    },
}

impl Body {
    /// A whole body.
    pub fn full(data: impl Into<Bytes>) -> Body {
        let data: Bytes = data.into();
        Body::Full {
            data: (!data.is_empty()).then_some(data),
            trailers: None,
        }
    }

    /// No body.
    pub fn empty() -> Body {
        Body::Full {
            data: None,
            trailers: None,
        }
    }

    /// A whole body followed by trailers.
    pub fn with_trailers(data: Option<Bytes>, trailers: HeaderMap) -> Body {
        Body::Full {
            data: data.filter(|d| !d.is_empty()),
            trailers: Some(Box::new(trailers)),
        }
    }

    /// A streamed body, cut at `until`.
    pub fn stream(inner: UnsyncBoxBody<Bytes, BoxError>, until: Instant) -> Body {
        Body::Stream {
            inner,
            until: Box::pin(tokio::time::sleep_until(until)),
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Body::Full { data, trailers } => {
                if let Some(d) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            Body::Passed(inner) => Pin::new(inner).poll_frame(cx),
            Body::Stream { inner, until } => {
                if until.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                let frame = ready!(Pin::new(inner).poll_frame(cx));
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Body::Stream { inner, .. } | Body::Passed(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            // With trailers (gRPC) the length is not announced: HTTP/1.1 cannot send trailers
            // after a `content-length` body, and gRPC answers carry none — a length that differs
            // per answer is a header HTTP/2 cannot index, encoded anew for every answer.
            Body::Full {
                data,
                trailers: Some(_),
            } => {
                let mut hint = SizeHint::new();
                hint.set_lower(data.as_ref().map_or(0, |d| d.len() as u64));
                hint
            }
            Body::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Body::Stream { inner, .. } | Body::Passed(inner) => inner.size_hint(),
        }
    }
}
