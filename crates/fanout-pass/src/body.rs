//! The two bodies of a pass-through exchange, each passed on a frame at a time — the frame in
//! hand is all a request holds, whatever the body's size — and each watching the exchange's
//! two limits on the same clock ([`Clock`]): the whole exchange (`pass.timeout`) and the time
//! since a byte last moved either way (`pass.idle_timeout`).
//!
//! - [`Upload`]: the client's request body on its way to the backend, cut when it crosses
//!   `pass.max_body_bytes`; its bytes counted in.
//! - [`Download`]: the backend's answer body on its way to the client; its bytes counted out.
//!
//! A body that is cut fails with a [`Cut`] instead of ending: the other side sees an aborted
//! message (a reset stream, a connection closed before the announced length or the last chunk),
//! never a complete one.

use bytes::Bytes;
use fanout_layers::stream::{BoxError, StreamBody};
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Why an exchange was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Cut {
    /// The whole exchange took `pass.timeout`.
    #[error("the exchange took longer than pass.timeout ({} ms)", .0.as_millis())]
    Timeout(Duration),
    /// Nothing moved either way for `pass.idle_timeout`.
    #[error("no byte moved either way for pass.idle_timeout ({} ms)", .0.as_millis())]
    Idle(Duration),
    /// The request's body crossed `pass.max_body_bytes`.
    #[error("the request body exceeds {0} bytes (pass.max_body_bytes)")]
    TooLarge(u64),
    /// The client's body broke (the client went away mid-upload).
    #[error("the client's request body broke")]
    ClientBroke,
    /// The backend's answer body broke.
    #[error("the backend's answer broke")]
    BackendBroke,
}

impl Cut {
    /// The `reason` label of `fanout_pass_cut_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Cut::Timeout(_) => "timeout",
            Cut::Idle(_) => "idle_timeout",
            Cut::TooLarge(_) => "body_too_large",
            Cut::ClientBroke => "client_broke",
            Cut::BackendBroke => "backend_broke",
        }
    }

    /// Every reason, in the order of [`Counters::cut`].
    pub const REASONS: [&'static str; 5] = [
        "timeout",
        "idle_timeout",
        "body_too_large",
        "client_broke",
        "backend_broke",
    ];

    fn index(self) -> usize {
        match self {
            Cut::Timeout(_) => 0,
            Cut::Idle(_) => 1,
            Cut::TooLarge(_) => 2,
            Cut::ClientBroke => 3,
            Cut::BackendBroke => 4,
        }
    }
}

/// A route's counters (kept across reloads while the route is).
#[derive(Debug, Default)]
pub struct Counters {
    /// Request body bytes passed to the backend.
    pub bytes_in: AtomicU64,
    /// Answer body bytes passed to the client.
    pub bytes_out: AtomicU64,
    /// Exchanges cut, by [`Cut::REASONS`].
    pub cut: [AtomicU64; 5],
}

impl Counters {
    /// Count an exchange cut for `why`.
    pub fn cut(&self, why: Cut) {
        if let Some(c) = self.cut.get(why.index()) {
            c.fetch_add(1, Relaxed);
        }
    }
}

/// The clock of one exchange: when it started, when it must end, and when a byte last moved.
#[derive(Debug)]
pub struct Clock {
    start: Instant,
    timeout: Duration,
    idle: Duration,
    /// Milliseconds from `start` to the last byte moved (either way).
    last_ms: AtomicU64,
}

impl Clock {
    /// An exchange that started at `start`.
    pub fn new(start: Instant, timeout: Duration, idle: Duration) -> Clock {
        Clock {
            start,
            timeout,
            idle,
            last_ms: AtomicU64::new(0),
        }
    }

    /// A byte moved.
    pub fn moved(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Relaxed);
    }

    /// When the whole exchange must end.
    pub fn deadline(&self) -> Instant {
        self.start + self.timeout
    }

    /// When a limit runs out if nothing moves.
    fn due(&self) -> Instant {
        let last = self.start + Duration::from_millis(self.last_ms.load(Relaxed));
        (last + self.idle).min(self.deadline())
    }

    /// The limit that ran out at `now`, if one did.
    fn expired(&self, now: Instant) -> Option<Cut> {
        if now >= self.deadline() {
            return Some(Cut::Timeout(self.timeout));
        }
        let last = self.start + Duration::from_millis(self.last_ms.load(Relaxed));
        (now >= last + self.idle).then_some(Cut::Idle(self.idle))
    }
}

/// A timer on a [`Clock`]: ready when one of its limits runs out.
pub struct Watch {
    clock: Arc<Clock>,
    sleep: Pin<Box<Sleep>>,
}

impl Watch {
    /// A timer on `clock`.
    pub fn new(clock: Arc<Clock>) -> Watch {
        let due = clock.due();
        Watch {
            clock,
            sleep: Box::pin(tokio::time::sleep_until(due)),
        }
    }

    /// The clock it watches.
    pub fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    /// The limit that ran out at `now`, if one did (for a body that keeps its own timer).
    pub fn expired(&self, now: Instant) -> Option<Cut> {
        self.clock.expired(now)
    }

    /// When a limit runs out if nothing moves (for a body that keeps its own timer).
    pub fn due(&self) -> Instant {
        self.clock.due()
    }

    /// Ready with the limit that ran out.
    ///
    /// The timer is re-armed lazily: bytes moving only push the clock's `due` later, so a timer
    /// set at an earlier `due` fires early, finds no limit run out and is set again — once per
    /// idle period instead of a reset (and a clock read) on every poll of a busy stream.
    pub fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<Cut> {
        loop {
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if let Some(c) = self.clock.expired(Instant::now()) {
                return Poll::Ready(c);
            }
            self.sleep.as_mut().reset(self.clock.due());
        }
    }
}

/// The client's request body on its way to the backend.
pub struct Upload<B> {
    inner: B,
    limit: u64,
    seen: u64,
    watch: Watch,
    counters: Arc<Counters>,
}

impl<B> Upload<B> {
    /// `inner`, cut past `limit` bytes or when `watch` fires.
    pub fn new(inner: B, limit: u64, watch: Watch, counters: Arc<Counters>) -> Upload<B> {
        Upload {
            inner,
            limit,
            seen: 0,
            watch,
            counters,
        }
    }
}

impl<B> Upload<B> {
    fn cut(&self, why: Cut) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.counters.cut(why);
        Poll::Ready(Some(Err(Box::new(why))))
    }
}

impl<B> Body for Upload<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    let n = d.len() as u64;
                    this.seen += n;
                    if this.seen > this.limit {
                        return this.cut(Cut::TooLarge(this.limit));
                    }
                    this.counters.bytes_in.fetch_add(n, Relaxed);
                    this.watch.clock.moved();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(_))) => this.cut(Cut::ClientBroke),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.watch.poll_cut(cx) {
                Poll::Ready(why) => this.cut(why),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The backend's answer body on its way to the client.
pub struct Download {
    inner: StreamBody,
    watch: Watch,
    counters: Arc<Counters>,
}

impl Download {
    /// `inner`, cut when `watch` fires.
    pub fn new(inner: StreamBody, watch: Watch, counters: Arc<Counters>) -> Download {
        Download {
            inner,
            watch,
            counters,
        }
    }

    fn cut(&self, why: Cut) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.counters.cut(why);
        Poll::Ready(Some(Err(Box::new(why))))
    }
}

impl Body for Download {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.counters.bytes_out.fetch_add(d.len() as u64, Relaxed);
                    this.watch.clock.moved();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(_))) => this.cut(Cut::BackendBroke),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.watch.poll_cut(cx) {
                Poll::Ready(why) => this.cut(why),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http_body_util::{BodyExt, StreamBody as Frames};

    /// A body that yields `parts`, then waits forever.
    fn stalled(parts: Vec<&'static str>) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
        let frames = futures_util::stream::iter(
            parts
                .into_iter()
                .map(|p| Ok::<_, BoxError>(Frame::data(Bytes::from_static(p.as_bytes())))),
        );
        use futures_util::StreamExt;
        Frames::new(frames.chain(futures_util::stream::pending()))
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_body_is_cut_at_the_idle_timeout_and_any_body_at_the_whole_timeout() {
        let counters = Arc::new(Counters::default());
        let clock = Arc::new(Clock::new(
            Instant::now(),
            Duration::from_secs(60),
            Duration::from_secs(5),
        ));
        let mut up = Upload::new(
            stalled(vec!["ab", "cd"]),
            100,
            Watch::new(clock.clone()),
            counters.clone(),
        );
        assert_eq!(
            up.frame().await.unwrap().unwrap().into_data().unwrap(),
            "ab"
        );
        assert_eq!(
            up.frame().await.unwrap().unwrap().into_data().unwrap(),
            "cd"
        );
        let e = up.frame().await.unwrap().unwrap_err();
        assert_eq!(
            e.downcast_ref::<Cut>(),
            Some(&Cut::Idle(Duration::from_secs(5)))
        );
        assert_eq!(counters.bytes_in.load(Relaxed), 4);
        assert_eq!(counters.cut[1].load(Relaxed), 1);

        // Bytes keep moving, but the whole exchange has its end.
        let clock = Arc::new(Clock::new(
            Instant::now(),
            Duration::from_secs(8),
            Duration::from_secs(5),
        ));
        let mut down = Download::new(
            UnsyncBoxBody::new(stalled(vec![])),
            Watch::new(clock.clone()),
            counters.clone(),
        );
        tokio::time::sleep(Duration::from_secs(4)).await;
        clock.moved();
        let e = down.frame().await.unwrap().unwrap_err();
        assert!(matches!(e.downcast_ref::<Cut>(), Some(Cut::Timeout(_))));
    }

    use http_body_util::combinators::UnsyncBoxBody;

    #[tokio::test(start_paused = true)]
    async fn an_upload_past_its_limit_fails_instead_of_ending() {
        let counters = Arc::new(Counters::default());
        let clock = Arc::new(Clock::new(
            Instant::now(),
            Duration::from_secs(60),
            Duration::from_secs(5),
        ));
        let mut up = Upload::new(
            stalled(vec!["abc", "def"]),
            5,
            Watch::new(clock),
            counters.clone(),
        );
        assert!(up.frame().await.unwrap().is_ok());
        let e = up.frame().await.unwrap().unwrap_err();
        assert_eq!(e.downcast_ref::<Cut>(), Some(&Cut::TooLarge(5)));
        assert_eq!(counters.bytes_in.load(Relaxed), 3, "only what went");
    }
}
