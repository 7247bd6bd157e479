//! The body of every backend call ([`CallBody`]), and the reading of its answer's
//! ([`read_answer`]: at most `max_response_bytes`, held once).

use bytes::Bytes;
use fanout_layers::stream::{BoxError, SlotBody};
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The body of a backend call: its bytes at once, their length announced (`content-length`)
/// except on gRPC calls — their messages carry their own length, gRPC clients send none, and a
/// length that differs per call is a header HTTP/2 cannot index, encoded anew for every call;
/// or, for a streamed call ([`fanout_layers::stream`]), the request's body as the client sends
/// it, each frame taken when the connection can take it.
#[derive(Debug)]
pub(crate) enum CallBody {
    /// Bytes at once.
    Whole {
        /// `None` once sent (or when there are none).
        data: Option<Bytes>,
        /// The length is announced.
        sized: bool,
    },
    /// A streamed call's body, taken from its slot on the first poll.
    Stream(SlotBody),
}

impl CallBody {
    /// `data`, with its length announced.
    pub(crate) fn new(data: Bytes) -> CallBody {
        CallBody::Whole {
            data: (!data.is_empty()).then_some(data),
            sized: true,
        }
    }

    /// `data`, without a length (gRPC).
    pub(crate) fn without_length(data: Bytes) -> CallBody {
        CallBody::Whole {
            data: (!data.is_empty()).then_some(data),
            sized: false,
        }
    }
}

impl hyper::body::Body for CallBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            CallBody::Whole { data, .. } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            CallBody::Stream(s) => Pin::new(s).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            CallBody::Whole { data, .. } => data.is_none(),
            CallBody::Stream(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            CallBody::Whole { data, sized } => {
                let n = data.as_ref().map_or(0, |d| d.len() as u64);
                if *sized {
                    SizeHint::with_exact(n)
                } else {
                    let mut hint = SizeHint::new();
                    hint.set_lower(n);
                    hint
                }
            }
            CallBody::Stream(s) => s.size_hint(),
        }
    }
}

/// The decoded bytes are gathered in chunks of this size while an answer without a length is
/// read (copied out of the frames, which may each keep a whole read buffer of the connection).
const CHUNK: usize = 64 << 10;

/// Why an answer's body could not be read.
#[derive(Debug)]
pub(crate) enum ReadError<E> {
    /// It is larger than the limit (announced so, or read past it).
    TooLarge,
    /// The body failed (the connection broke, a protocol error).
    Failed(E),
}

/// An answer's whole body, at most `limit` bytes, holding no more than that while it is read:
///
/// - a body whose length (`Content-Length`) is over the limit is refused unread;
/// - a body of one frame is that frame, uncopied;
/// - with a length, the frames are copied into a buffer of exactly that length;
/// - without one, they are copied into chunks of [`CHUNK`] bytes, joined at the end (then the
///   answer is held twice, briefly);
///
/// and reading stops at the first frame past the limit ([`ReadError::TooLarge`]), so an answer
/// over the limit costs at most `limit + CHUNK` bytes. Trailers are ignored.
pub(crate) async fn read_answer<B>(body: B, limit: usize) -> Result<Bytes, ReadError<B::Error>>
where
    B: hyper::body::Body<Data = Bytes>,
{
    use http_body_util::BodyExt;
    let hint = body.size_hint();
    if hint.lower() > limit as u64 {
        return Err(ReadError::TooLarge);
    }
    let exact = hint.exact().and_then(|n| usize::try_from(n).ok());
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut gathered = Gathered::default();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(ReadError::Failed)?.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        len += data.len();
        if len > limit {
            return Err(ReadError::TooLarge);
        }
        match first.take() {
            None if gathered.is_empty() => first = Some(data),
            earlier => {
                if let Some(e) = earlier {
                    gathered.add(&e, exact);
                }
                gathered.add(&data, exact);
            }
        }
    }
    Ok(match first {
        Some(one) => one,
        None => gathered.join(len),
    })
}

/// The frames of an answer, copied: into one buffer of the answer's length when it has one,
/// else into chunks of [`CHUNK`] bytes.
#[derive(Default)]
struct Gathered {
    chunks: Vec<Vec<u8>>,
}

impl Gathered {
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    fn add(&mut self, mut data: &[u8], exact: Option<usize>) {
        while !data.is_empty() {
            let room = self.chunks.last().map_or(0, |c| c.capacity() - c.len());
            if room == 0 {
                // The answer's length (at least this frame's: it may have lied), or a chunk.
                let size = exact
                    .filter(|_| self.chunks.is_empty())
                    .map_or(CHUNK, |n| n.max(data.len()));
                self.chunks.push(Vec::with_capacity(size));
                continue;
            }
            let (now, rest) = data.split_at(room.min(data.len()));
            if let Some(c) = self.chunks.last_mut() {
                c.extend_from_slice(now);
            }
            data = rest;
        }
    }

    /// The answer in one buffer (`len` bytes).
    fn join(mut self, len: usize) -> Bytes {
        if self.chunks.len() <= 1 {
            return self.chunks.pop().map(Bytes::from).unwrap_or_default();
        }
        let mut out = Vec::with_capacity(len);
        for c in self.chunks {
            out.extend_from_slice(&c);
        }
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
    use super::*;
    use http_body_util::StreamBody;

    type FrameList = std::vec::IntoIter<Result<Frame<Bytes>, &'static str>>;

    /// A body of `frames` (a trailers frame at the end), announcing `len` when given.
    struct Frames {
        inner: StreamBody<futures_util::stream::Iter<FrameList>>,
        len: Option<u64>,
    }

    impl hyper::body::Body for Frames {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Pin::new(&mut self.get_mut().inner).poll_frame(cx)
        }

        fn size_hint(&self) -> SizeHint {
            self.len.map_or_else(SizeHint::new, SizeHint::with_exact)
        }
    }

    fn body(parts: &[&'static [u8]], len: Option<u64>, fail: bool) -> Frames {
        let mut frames: Vec<Result<Frame<Bytes>, &'static str>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        frames.push(Ok(Frame::trailers(http::HeaderMap::new())));
        if fail {
            frames.push(Err("broken"));
        }
        Frames {
            inner: StreamBody::new(futures_util::stream::iter(frames)),
            len,
        }
    }

    #[tokio::test]
    async fn answers_are_read_whole_within_the_limit() {
        let big: &'static [u8] = Box::leak(vec![7u8; 3 * CHUNK + 5].into_boxed_slice());
        for len in [None, Some(3 * CHUNK as u64 + 11)] {
            // One frame: itself.
            let one = read_answer(body(&[big], None, false), usize::MAX)
                .await
                .unwrap();
            assert_eq!(one.as_ptr(), big.as_ptr(), "not copied");
            // Several: joined in order, trailers ignored.
            let got = read_answer(body(&[b"ab", big, b"", b"cdef"], len, false), 1 << 20)
                .await
                .unwrap();
            assert_eq!(got.len(), 3 * CHUNK + 11);
            assert_eq!(
                (&got[..2], &got[got.len() - 4..]),
                (&b"ab"[..], &b"cdef"[..])
            );
            assert!(got[2..got.len() - 4].iter().all(|b| *b == 7));
            // Exactly the limit passes, one byte more does not.
            let limit = 3 * CHUNK + 11;
            assert!(
                read_answer(body(&[b"ab", big, b"cdef"], len, false), limit)
                    .await
                    .is_ok()
            );
            assert!(matches!(
                read_answer(body(&[b"ab", big, b"cdef"], len, false), limit - 1).await,
                Err(ReadError::TooLarge)
            ));
            assert!(matches!(
                read_answer(body(&[b"ab"], len, true), 1 << 20).await,
                Err(ReadError::Failed("broken"))
            ));
        }
        assert_eq!(
            read_answer(body(&[], None, false), 0).await.unwrap(),
            Bytes::new()
        );
        // Announced over the limit: refused before a frame is read.
        assert!(matches!(
            read_answer(body(&[], Some(11), true), 10).await,
            Err(ReadError::TooLarge)
        ));
    }
}
