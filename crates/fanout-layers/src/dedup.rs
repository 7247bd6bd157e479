//! In-flight de-duplication (singleflight), a [`Backend`] layer: identical GET/HEAD calls in
//! flight at the same time — within a request or across requests — are sent once and the answer
//! is shared. "Identical" means everything the call sends is the same: method, path with query,
//! every header the step set, body ([`crate::backend::CallKey`]), so one user's answer never
//! reaches another user whose call differs in any header (e.g. `authorization`).
//!
//! The shared call has its own time limit, fixed when it starts ([`crate::singleflight`]): a hung
//! call ends at that limit however many callers join it. Every caller keeps its own time: it
//! waits for a shared call until its own end at most, never joins a call that would end before
//! it is expected to finish, and runs the call again when the call it joined ended at a shorter
//! limit while it still has more time — a client's short `x-request-timeout` never fails the
//! callers that share its call.

use crate::backend::{Backend, CallError, CallRequest, CallResponse};
use crate::singleflight::{FlightCounters, Flights};
use crate::trace::{CallTrace, DedupRole, served};
use futures_util::future::BoxFuture;
use std::sync::Arc;

type Call = BoxFuture<'static, Result<CallResponse, CallError>>;

/// A backend whose identical concurrent calls are merged.
pub struct Dedup {
    inner: Arc<dyn Backend>,
    flights: Arc<Flights>,
}

impl Dedup {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Dedup {
        Dedup {
            inner,
            flights: Arc::new(Flights::new()),
        }
    }

    /// Calls started, joined, and shared calls that hit their own time limit.
    pub fn counters(&self) -> FlightCounters {
        self.flights.counters()
    }

    /// The table of shared calls (for the status endpoint).
    pub fn flights(&self) -> Arc<Flights> {
        self.flights.clone()
    }
}

impl Backend for Dedup {
    /// A stream is never shared: passed down.
    fn open(
        &self,
        req: crate::stream::StreamRequest,
    ) -> BoxFuture<'static, Result<crate::stream::StreamResponse, CallError>> {
        self.inner.open(req)
    }

    fn call(&self, req: CallRequest) -> Call {
        if !req.is_safe() {
            return self.inner.call(req);
        }
        let key = req.key();
        let timeout = req.timeout;
        let inner = self.inner.clone();
        // `limit`: the time this call may take — `timeout`, or what a joiner has left when it
        // runs a call again after the one it joined ended at a shorter limit.
        // A call only counted, not traced, is shared like an untraced one (its attempts are
        // counted to the step of the caller that started it).
        let Some(trace) = req.trace.as_ref().filter(|t| t.is_traced()).cloned() else {
            return self.flights.run(key, timeout, move |limit| {
                let mut req = req;
                req.timeout = limit;
                shareable(inner.call(req))
            });
        };
        let (call, joined) = self.flights.join_or_start(key, timeout, move |limit| {
            let mut req = req;
            req.timeout = limit;
            if let Some(t) = &mut req.trace {
                t.dedup = Some(DedupRole::Leader);
            }
            shareable(inner.call(req))
        });
        if !joined {
            return call;
        }
        let trace = CallTrace {
            dedup: Some(DedupRole::Joined),
            ..trace
        };
        Box::pin(served(Some(&trace), call))
    }
}

/// The shared call's answer, with an empty [`CallResponse::parsed`] cell that every caller
/// sharing it sees: the first to parse the body fills it.
fn shareable(call: Call) -> Call {
    Box::pin(async move {
        let mut resp = call.await?;
        resp.parsed = Some(Arc::default());
        Ok(resp)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::Method;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    struct Slow {
        calls: Arc<AtomicUsize>,
        done: Arc<AtomicUsize>,
    }

    impl Backend for Slow {
        fn call(&self, _req: CallRequest) -> Call {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let done = self.done.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok(CallResponse {
                    status: http::StatusCode::OK,
                    body: Bytes::from_static(b"{}"),
                    value: None,
                    parsed: None,
                })
            })
        }
    }

    fn req(method: Method, path: &str) -> CallRequest {
        CallRequest {
            call: crate::backend::Call::Http(crate::backend::HttpCall {
                method,
                path_and_query: path.parse().expect("a test path"),
                headers: Default::default(),
                body: Bytes::new(),
            }),
            timeout: Duration::from_secs(1),
            deadline: tokio::time::Instant::now() + Duration::from_secs(1),
            idempotent: true,
            trace: None,
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
        // Calls that differ in any header the step set are not shared (one user's answer never
        // reaches another); the time budget (what the transport writes in the deadline header)
        // is not part of the identity.
        let with = |auth: &'static str, budget_ms: u64| {
            let mut r = req(Method::GET, "/me");
            r.as_http_mut()
                .unwrap()
                .headers
                .insert("authorization", auth.parse().unwrap());
            r.timeout = Duration::from_millis(budget_ms);
            r.deadline = tokio::time::Instant::now() + r.timeout;
            d.call(r)
        };
        let before = calls.load(Ordering::SeqCst);
        let (a, b, a2) = tokio::join!(with("alice", 100), with("bob", 100), with("alice", 90));
        assert!(a.is_ok() && b.is_ok() && a2.is_ok());
        assert_eq!(
            calls.load(Ordering::SeqCst) - before,
            2,
            "alice once, bob once"
        );
        // After completion a new identical call is a new call.
        let before = calls.load(Ordering::SeqCst);
        d.call(req(Method::GET, "/x")).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), before + 1);
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

    /// Callers sharing one answer share one cell for its parsed value (the first to parse fills
    /// it); a call that is not shared has none.
    #[tokio::test(start_paused = true)]
    async fn sharers_get_one_parse_cell() {
        let d = Dedup::new(Arc::new(Slow {
            calls: Arc::default(),
            done: Arc::default(),
        }));
        let (a, b) = tokio::join!(
            d.call(req(Method::GET, "/x")),
            d.call(req(Method::GET, "/x"))
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        let (pa, pb) = (a.parsed.unwrap(), b.parsed.unwrap());
        assert!(Arc::ptr_eq(&pa, &pb));
        assert!(pa.set((1, fanout_expr::Val::Null)).is_ok());
        assert!(pb.get().is_some(), "filled once, seen by both");
        let post = d.call(req(Method::POST, "/x")).await.unwrap();
        assert!(post.parsed.is_none());
    }
}
