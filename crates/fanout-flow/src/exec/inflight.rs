//! The futures of one request that are in flight: polled only when woken, each through a waker of
//! its own, on the request's task.
//!
//! `futures_util`'s `FuturesUnordered` does the same, but after it has polled as many futures as
//! it holds (one, for a route with one call) it wakes its own task and returns `Pending` — a
//! cooperative yield. On tokio's multi-thread scheduler a task woken while it runs is re-queued as
//! a yield, which also wakes an idle worker to steal it: a futex call, a context switch on the
//! other core and one more poll of the whole request, for every step that waits on I/O
//! (measured: ≈2 futex calls per request of a one-call route, none without). [`InFlight`] yields
//! only when a future woke itself while it was being polled (tokio's cooperative budget, a
//! `yield_now`), so a flow waiting on its backends costs one poll per answer.

use futures_util::task::AtomicWaker;
use smallvec::SmallVec;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The indices woken since they were last polled, and the task to wake for them.
#[derive(Default)]
struct Shared {
    ready: Mutex<Indices>,
    task: AtomicWaker,
}

/// Slot indices: a flow has few steps, so they are kept inline (no allocation per request).
type Indices = SmallVec<[usize; 8]>;

fn lock(m: &Mutex<Indices>) -> std::sync::MutexGuard<'_, Indices> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The waker of one slot: queues its index (once until it is polled) and wakes the task.
struct SlotWaker {
    shared: Arc<Shared>,
    index: usize,
    queued: AtomicBool,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            lock(&self.shared.ready).push(self.index);
            self.shared.task.wake();
        }
    }
}

struct Slot<F> {
    fut: Option<F>,
    /// The slot's own waker, made the first time the slot is polled while other futures are in
    /// flight (a future alone in the set is polled with the task's waker: no allocation).
    waker: Option<(Arc<SlotWaker>, Waker)>,
}

/// A set of futures, each polled when its own waker was woken; outputs in completion order.
///
/// A future alone in the set is polled with the task's own waker (`direct`): a flow whose steps
/// run one at a time needs no per-future wakers, no shared queue and no lock. Once another
/// future joins it, the direct one is polled again through its own waker (it may have woken the
/// task meanwhile without a trace in the queue: polling it once more is allowed, losing it is
/// not).
pub(crate) struct InFlight<F> {
    slots: SmallVec<[Slot<F>; 4]>,
    free: Indices,
    len: usize,
    /// The queue of woken slots and the task to wake; made with the first slot waker.
    shared: Option<Arc<Shared>>,
    /// Woken indices taken from `shared`, still to be polled (first to last).
    local: Indices,
    at: usize,
    /// The slot last polled with the task's own waker, while it was alone in the set.
    direct: Option<usize>,
}

impl<F: Future + Unpin> InFlight<F> {
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::with_capacity(0)
    }

    /// A set with room for `n` futures (no allocation until `n` are in flight at once, nor for
    /// up to four).
    pub(crate) fn with_capacity(n: usize) -> Self {
        InFlight {
            slots: SmallVec::with_capacity(n),
            free: Indices::new(),
            len: 0,
            shared: None,
            local: Indices::new(),
            at: 0,
            direct: None,
        }
    }

    /// Futures in the set.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Add a future; it is polled at the next [`InFlight::poll_next`].
    pub(crate) fn push(&mut self, fut: F) {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    fut: None,
                    waker: None,
                });
                self.slots.len() - 1
            }
        };
        let Some(slot) = self.slots.get_mut(index) else {
            return;
        };
        slot.fut = Some(fut);
        // Polled at the next pass, as if woken: queued on the owner's side, so that a pass that
        // still has earlier wakes to poll polls it too. Always queued, whatever `queued` says: a
        // wake of the slot's previous future may still be on its way (it only polls the new one
        // once more, which futures allow).
        if let Some((state, _)) = &slot.waker {
            state.queued.store(true, Ordering::Release);
        }
        self.local.push(index);
        self.len += 1;
    }

    /// The next output, `Ready(None)` when the set is empty.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        match self.len {
            0 => return Poll::Ready(None),
            1 => return self.poll_alone(cx),
            _ => {}
        }
        let shared = self.shared.get_or_insert_with(Default::default).clone();
        shared.task.register(cx.waker());
        if self.at >= self.local.len() {
            self.local.clear();
            self.at = 0;
        }
        // The future polled alone with the task's waker may have woken the task for itself.
        if let Some(d) = self.direct.take() {
            self.local.push(d);
        }
        // Everything woken so far is polled in this pass, after what an earlier pass left (it
        // returned an output before it reached them): a wake that only sat in `shared` while this
        // pass ended `Pending` would be lost, its task woken before and not again.
        {
            let mut woken = lock(&shared.ready);
            self.local.extend(woken.drain(..));
        }
        while let Some(&i) = self.local.get(self.at) {
            self.at += 1;
            let Some(slot) = self.slots.get_mut(i) else {
                continue;
            };
            if slot.fut.is_none() {
                continue; // a late wake of a future that already finished
            }
            let (state, waker) = slot.waker.get_or_insert_with(|| {
                let state = Arc::new(SlotWaker {
                    shared: shared.clone(),
                    index: i,
                    queued: AtomicBool::new(false),
                });
                let waker = Waker::from(state.clone());
                (state, waker)
            });
            state.queued.store(false, Ordering::Release);
            let Some(fut) = slot.fut.as_mut() else {
                continue;
            };
            let mut scx = Context::from_waker(waker);
            if let Poll::Ready(out) = Pin::new(fut).poll(&mut scx) {
                slot.fut = None;
                self.free.push(i);
                self.len -= 1;
                return Poll::Ready(Some(out));
            }
        }
        // A future woken again while this pass polled it (or meanwhile, from another thread) has
        // woken the task through `shared.task` (registered above): it runs on the task's next
        // turn, after the others waiting for this worker.
        Poll::Pending
    }

    /// The only future in the set, polled with the task's own waker. Whatever was queued refers
    /// to it or to finished futures: the queues are emptied (a wake still on its way through a
    /// slot waker only polls a future once more later).
    fn poll_alone(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        self.local.clear();
        self.at = 0;
        if let Some(shared) = &self.shared {
            lock(&shared.ready).clear();
        }
        let Some(i) = self.slots.iter().position(|s| s.fut.is_some()) else {
            self.len = 0;
            return Poll::Ready(None);
        };
        let Some(slot) = self.slots.get_mut(i) else {
            return Poll::Ready(None);
        };
        if let Some((state, _)) = &slot.waker {
            state.queued.store(false, Ordering::Release);
        }
        let Some(fut) = slot.fut.as_mut() else {
            return Poll::Ready(None);
        };
        self.direct = Some(i);
        if let Poll::Ready(out) = Pin::new(fut).poll(cx) {
            slot.fut = None;
            self.free.push(i);
            self.len -= 1;
            self.direct = None;
            return Poll::Ready(Some(out));
        }
        Poll::Pending
    }

    /// The next output (`None` when the set is empty).
    pub(crate) async fn next(&mut self) -> Option<F::Output> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts how often the task it runs in is woken.
    struct CountWake(AtomicUsize);
    impl Wake for CountWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_pending_future_does_not_wake_the_task_and_a_woken_one_is_polled() {
        let count = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let mut set: InFlight<Pin<Box<dyn Future<Output = u32> + Send>>> = InFlight::new();
        set.push(Box::pin(async move { rx.await.unwrap_or(0) }));
        set.push(Box::pin(async { 7 }));
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(7)));
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        assert_eq!(count.0.load(Ordering::Relaxed), 0, "no self-wake");
        assert_eq!(set.len(), 1);
        let _ = tx.send(5);
        assert_eq!(
            count.0.load(Ordering::Relaxed),
            1,
            "the answer wakes the task"
        );
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(5)));
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn a_future_that_wakes_itself_yields_the_task() {
        let count = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut polls = 0;
        let fut = std::future::poll_fn(move |cx| {
            polls += 1;
            if polls < 3 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(polls)
            }
        });
        let mut set = InFlight::new();
        set.push(Box::pin(fut));
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(3)));
    }

    #[test]
    fn a_future_added_after_an_early_output_is_polled_even_if_the_rest_waits() {
        let count = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut set: InFlight<Pin<Box<dyn Future<Output = u32> + Send>>> = InFlight::new();
        let (_tx, rx) = tokio::sync::oneshot::channel::<u32>();
        set.push(Box::pin(async { 1 }));
        set.push(Box::pin(async move { rx.await.unwrap_or(0) }));
        // The first output returns before the pass reaches the second (pending) future.
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(1)));
        // A step that became runnable is added; the next pass polls it although the one left from
        // the last pass is still pending, and nothing will wake the task for it.
        set.push(Box::pin(async { 2 }));
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(2)));
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn a_slot_whose_finished_future_woke_itself_still_runs_its_next_future() {
        let count = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut set: InFlight<Pin<Box<dyn Future<Output = u32> + Send>>> = InFlight::new();
        // Wakes itself and finishes in the same poll: a late wake of a free slot.
        set.push(Box::pin(std::future::poll_fn(|cx| {
            cx.waker().wake_by_ref();
            Poll::Ready(1)
        })));
        let (_tx, rx) = tokio::sync::oneshot::channel::<u32>();
        set.push(Box::pin(async move { rx.await.unwrap_or(0) }));
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(1)));
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        // The free slot is reused; its new future is polled and then woken by its answer.
        let (tx2, rx2) = tokio::sync::oneshot::channel::<u32>();
        set.push(Box::pin(async move { rx2.await.unwrap_or(0) }));
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        let before = count.0.load(Ordering::Relaxed);
        let _ = tx2.send(5);
        assert_eq!(count.0.load(Ordering::Relaxed), before + 1);
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(5)));
    }

    #[test]
    fn a_future_polled_alone_and_woken_meanwhile_is_polled_when_another_joins() {
        let count = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut set: InFlight<Pin<Box<dyn Future<Output = u32> + Send>>> = InFlight::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        set.push(Box::pin(async move { rx.await.unwrap_or(0) }));
        // Alone: polled with the task's own waker, which its answer wakes directly.
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        let _ = tx.send(4);
        assert_eq!(
            count.0.load(Ordering::Relaxed),
            1,
            "the answer wakes the task"
        );
        // Before the task runs, another step starts: the pass must still poll the first one,
        // although nothing queued it.
        let (_tx2, rx2) = tokio::sync::oneshot::channel::<u32>();
        set.push(Box::pin(async move { rx2.await.unwrap_or(0) }));
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(4)));
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn futures_that_run_one_at_a_time_need_no_slot_wakers() {
        let count = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut set: InFlight<Pin<Box<dyn Future<Output = u32> + Send>>> = InFlight::new();
        for k in 0..3 {
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            set.push(Box::pin(async move { rx.await.unwrap_or(0) }));
            assert_eq!(set.poll_next(&mut cx), Poll::Pending);
            let _ = tx.send(k);
            assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(k)));
        }
        assert!(set.shared.is_none(), "no queue was needed");
        assert!(set.slots.iter().all(|s| s.waker.is_none()));
        assert_eq!(count.0.load(Ordering::Relaxed), 3, "one wake per answer");
    }

    #[test]
    fn slots_are_reused_and_many_futures_finish_in_any_order() {
        let count = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut set: InFlight<Pin<Box<dyn Future<Output = usize> + Send>>> = InFlight::new();
        let mut senders = Vec::new();
        for _ in 0..100 {
            let (tx, rx) = tokio::sync::oneshot::channel::<usize>();
            senders.push(tx);
            set.push(Box::pin(async move { rx.await.unwrap_or(usize::MAX) }));
        }
        assert_eq!(set.poll_next(&mut cx), Poll::Pending);
        let mut got = Vec::new();
        for (k, tx) in senders.into_iter().enumerate().rev() {
            let _ = tx.send(k);
            if let Poll::Ready(Some(v)) = set.poll_next(&mut cx) {
                got.push(v);
            }
        }
        assert_eq!(got, (0..100).rev().collect::<Vec<_>>());
        assert_eq!(set.len(), 0);
        set.push(Box::pin(async { 1 }));
        assert_eq!(set.slots.len(), 100, "a free slot is reused");
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(Some(1)));
    }
}
