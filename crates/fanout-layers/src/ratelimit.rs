//! A backend's rate limit (`backends.NAME.rate_limit`): calls per second to the backend from
//! every route, by GCRA (`fanout_ratelimit::gcra`). A call within the burst goes at once; one
//! over it waits for its slot when that comes within the call's time (its timeout and the
//! request's deadline), and otherwise fails at once, unsent, as the backend's own refusal
//! ([`RejectReason::RateLimit`]: 503 `backend_rejected`).

use crate::backend::{Backend, CallRequest, CallResponse};
use crate::error::{CallError, CallErrorKind, RejectReason};
use fanout_ratelimit::gcra::Gcra;
use futures_util::future::BoxFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The rate-limit layer.
pub struct RateLimit {
    inner: Arc<dyn Backend>,
    gcra: Gcra,
    /// The theoretical arrival time, in nanoseconds since `epoch`.
    tat: Mutex<u64>,
    epoch: Instant,
    stats: Arc<RateLimitStats>,
}

/// What the layer counts.
#[derive(Debug, Default)]
pub struct RateLimitStats {
    /// Calls that waited for their slot.
    pub delayed: AtomicU64,
    /// Calls refused: no slot within their time.
    pub refused: AtomicU64,
}

impl RateLimit {
    /// `per_second` calls per second to `inner`, with bursts of `burst`.
    pub fn new(inner: Arc<dyn Backend>, per_second: f64, burst: u64) -> RateLimit {
        RateLimit {
            inner,
            gcra: Gcra::new(per_second, burst),
            tat: Mutex::new(0),
            epoch: Instant::now(),
            stats: Arc::default(),
        }
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<RateLimitStats> {
        self.stats.clone()
    }
}

impl RateLimit {
    /// A slot for a call that may wait `timeout` (and no later than `deadline`): `Ok(wait)`, the
    /// wait before its slot, or the refusal.
    fn reserve(&self, timeout: Duration, deadline: Instant) -> Result<Duration, CallError> {
        let now_i = Instant::now();
        let now = u64::try_from(now_i.duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX / 4)
            .saturating_add(1);
        let allowed = timeout.min(deadline.saturating_duration_since(now_i));
        let max_wait = u64::try_from(allowed.as_nanos()).unwrap_or(u64::MAX / 4);
        let reserved = {
            let mut tat = self.tat.lock().unwrap_or_else(|p| p.into_inner());
            self.gcra.reserve(*tat, now, max_wait).map(|(t, wait)| {
                *tat = t;
                wait
            })
        };
        match reserved {
            Ok(wait) => {
                if wait > 0 {
                    self.stats.delayed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Duration::from_nanos(wait))
            }
            Err(needed) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                let msg = format!(
                    "rate limit: the next call to the backend may go in {:.1} ms, after this \
                     call's time ({:.1} ms)",
                    needed as f64 / 1e6,
                    allowed.as_secs_f64() * 1000.0
                );
                let kind = CallErrorKind::Rejected(RejectReason::RateLimit);
                Err(CallError::new(kind, msg))
            }
        }
    }
}

impl Backend for RateLimit {
    fn call(&self, mut req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        match self.reserve(req.timeout, req.deadline) {
            Ok(Duration::ZERO) => self.inner.call(req),
            Ok(wait) => {
                req.timeout = req.timeout.saturating_sub(wait);
                let inner = self.inner.clone();
                Box::pin(async move {
                    tokio::time::sleep(wait).await;
                    inner.call(req).await
                })
            }
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    /// The same tokens as whole calls.
    fn open(
        &self,
        mut req: crate::stream::StreamRequest,
    ) -> BoxFuture<'static, Result<crate::stream::StreamResponse, CallError>> {
        match self.reserve(req.timeout, req.deadline) {
            Ok(Duration::ZERO) => self.inner.open(req),
            Ok(wait) => {
                req.timeout = req.timeout.saturating_sub(wait);
                let inner = self.inner.clone();
                Box::pin(async move {
                    tokio::time::sleep(wait).await;
                    inner.open(req).await
                })
            }
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{Method, StatusCode};
    use std::sync::atomic::AtomicUsize;

    struct Count(Arc<AtomicUsize>);

    impl Backend for Count {
        fn call(&self, _req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {
                Ok(CallResponse {
                    status: StatusCode::OK,
                    body: Bytes::new(),
                    value: None,
                    parsed: None,
                })
            })
        }
    }

    fn req(timeout: Duration) -> CallRequest {
        CallRequest {
            call: crate::backend::Call::Http(crate::backend::HttpCall {
                method: Method::GET,
                path_and_query: http::uri::PathAndQuery::from_static("/x"),
                headers: Default::default(),
                body: Bytes::new(),
            }),
            timeout,
            deadline: Instant::now() + Duration::from_secs(10),
            idempotent: true,
            trace: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_past_the_burst_wait_within_their_time_or_fail_fast() {
        let calls = Arc::new(AtomicUsize::new(0));
        let l = RateLimit::new(Arc::new(Count(calls.clone())), 10.0, 2);
        // the burst goes at once
        for _ in 0..2 {
            l.call(req(Duration::from_millis(50))).await.unwrap();
        }
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        // the next slot is 100 ms away: a call with 50 ms fails at once, unsent
        let start = Instant::now();
        let e = l.call(req(Duration::from_millis(50))).await.unwrap_err();
        assert_eq!(e.kind, CallErrorKind::Rejected(RejectReason::RateLimit));
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        // a call with 500 ms waits for its slot
        l.call(req(Duration::from_millis(500))).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        let s = l.stats();
        assert_eq!(
            (
                s.delayed.load(Ordering::Relaxed),
                s.refused.load(Ordering::Relaxed)
            ),
            (1, 1)
        );
    }
}
