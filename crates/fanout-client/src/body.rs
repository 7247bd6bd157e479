//! The body of every backend call ([`CallBody`]).

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The body of a backend call: its bytes at once, their length announced (`content-length`)
/// except on gRPC calls — their messages carry their own length, gRPC clients send none, and a
/// length that differs per call is a header HTTP/2 cannot index, encoded anew for every call.
#[derive(Debug)]
pub(crate) struct CallBody {
    data: Option<Bytes>,
    sized: bool,
}

impl CallBody {
    /// `data`, with its length announced.
    pub(crate) fn new(data: Bytes) -> CallBody {
        CallBody {
            data: (!data.is_empty()).then_some(data),
            sized: true,
        }
    }

    /// `data`, without a length (gRPC).
    pub(crate) fn without_length(data: Bytes) -> CallBody {
        CallBody {
            sized: false,
            ..CallBody::new(data)
        }
    }
}

impl hyper::body::Body for CallBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let n = self.data.as_ref().map_or(0, |d| d.len() as u64);
        if self.sized {
            SizeHint::with_exact(n)
        } else {
            let mut hint = SizeHint::new();
            hint.set_lower(n);
            hint
        }
    }
}
