//! In-flight de-duplication (singleflight), a [`Backend`] layer: identical GET/HEAD calls (same
//! method, path and query, body) in flight at the same time — within a request or across
//! requests — are sent once and the answer is shared.
//!
//! The table holds only weak references: when every caller has gone (deadline, cancellation) the
//! call is dropped and its connection closed; a caller that goes away while others still wait
//! does not cancel the call for them.

use crate::backend::{Backend, CallError, CallRequest, CallResponse};
use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared, WeakShared};
use http::Method;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Call = BoxFuture<'static, Result<CallResponse, CallError>>;
type Key = (Method, String, Bytes);

/// A backend whose identical concurrent calls are merged.
pub struct Dedup {
    inner: Arc<dyn Backend>,
    inflight: Mutex<HashMap<Key, WeakShared<Call>>>,
}

impl Dedup {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Dedup {
        Dedup {
            inner,
            inflight: Mutex::new(HashMap::new()),
        }
    }
}

fn live(w: &WeakShared<Call>) -> Option<Shared<Call>> {
    // Only calls still running are shared; a finished one is not reused.
    w.upgrade().filter(|s| s.peek().is_none())
}

impl Backend for Dedup {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn status_passthrough(&self) -> bool {
        self.inner.status_passthrough()
    }

    fn call(&self, req: CallRequest) -> Call {
        if req.method != Method::GET && req.method != Method::HEAD {
            return self.inner.call(req);
        }
        let key = (
            req.method.clone(),
            req.path_and_query.clone(),
            req.body.clone(),
        );
        let Ok(mut table) = self.inflight.lock() else {
            return self.inner.call(req);
        };
        if let Some(shared) = table.get(&key).and_then(live) {
            return Box::pin(shared);
        }
        if table.len() >= 256 {
            table.retain(|_, w| live(w).is_some());
        }
        let shared = self.inner.call(req).shared();
        if let Some(weak) = shared.downgrade() {
            table.insert(key, weak);
        }
        Box::pin(shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    struct Slow {
        calls: Arc<AtomicUsize>,
        done: Arc<AtomicUsize>,
    }

    impl Backend for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn call(&self, _req: CallRequest) -> Call {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let done = self.done.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok(CallResponse {
                    status: http::StatusCode::OK,
                    body: Bytes::from_static(b"{}"),
                })
            })
        }
    }

    fn req(method: Method, path: &str) -> CallRequest {
        CallRequest {
            method,
            path_and_query: path.into(),
            headers: Default::default(),
            body: Bytes::new(),
            timeout: Duration::from_secs(1),
            deadline: tokio::time::Instant::now() + Duration::from_secs(1),
            idempotent: true,
        }
    }

    #[tokio::test]
    async fn identical_calls_share_one_and_cancelled_callers_do_not_cancel_others() {
        let calls = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let d = Dedup::new(Arc::new(Slow {
            calls: calls.clone(),
            done: done.clone(),
        }));
        let a = d.call(req(Method::GET, "/x"));
        let b = d.call(req(Method::GET, "/x"));
        let c = d.call(req(Method::GET, "/y"));
        let p1 = d.call(req(Method::POST, "/x"));
        drop(a); // the first caller goes away; the second still gets the answer
        let (b, c) = tokio::join!(b, c);
        assert!(b.is_ok() && c.is_ok());
        drop(p1);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "/x once, /y once, POST not shared"
        );
        // After completion a new identical call is a new call.
        d.call(req(Method::GET, "/x")).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // When every caller is gone, the call is dropped (not finished in the background).
        let before = done.load(Ordering::SeqCst);
        let lonely = d.call(req(Method::GET, "/z"));
        drop(lonely);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            done.load(Ordering::SeqCst),
            before,
            "abandoned call was cancelled"
        );
    }
}
