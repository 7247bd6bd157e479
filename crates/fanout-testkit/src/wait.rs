//! Bounded polling for states that settle asynchronously (a closed socket, a counter).
//!
//! The bound keeps a broken test from hanging; it measures nothing, so it is generous.

use std::future::Future;
use std::time::Duration;

/// How long [`wait_until`] polls before it fails the test.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The pause between two checks.
const POLL: Duration = Duration::from_millis(5);

/// The pause between two looks that cost more (a request to a server under test, a child
/// process's state).
const SLOW_POLL: Duration = Duration::from_millis(20);

/// Poll `cond` until it holds; panics (naming `what`) if it does not within [`PATIENCE`].
pub async fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    wait_within(what, PATIENCE, cond).await
}

/// Poll `cond` every 5 ms until it holds; panics (naming `what`) after `limit` worth of polls.
pub async fn wait_within(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    wait_for(what, limit, || cond().then_some(())).await
}

/// Poll `f` every 5 ms until it gives a value, and return it; panics (naming `what`) after
/// `limit` worth of polls.
pub async fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..polls(limit, POLL) {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("timed out waiting for: {what}");
}

/// [`wait_until`] for a condition that needs `.await` (e.g. a look at a Redis server).
pub async fn wait_until_async<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_async(what, PATIENCE, || {
        let c = cond();
        async move { c.await.then_some(()) }
    })
    .await
}

/// [`wait_until_async`] for a condition over a state worth showing when it never holds: `look`
/// gives `Ok(())` when it holds, else `Err` with what it saw (e.g. the counters), which the
/// failure prints beside `what`.
pub async fn wait_until_async_showing<F, Fut>(what: &str, mut look: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + PATIENCE;
    for _ in 0..polls(PATIENCE, SLOW_POLL) {
        match bounded(what, deadline, look()).await {
            Ok(()) => return,
            Err(s) => seen = s,
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(SLOW_POLL).await;
    }
    panic!("timed out waiting for: {what}; last seen: {seen}");
}

/// [`wait_for`] for a look that needs `.await` (a request, a connection): polls `f` every 20 ms
/// until it gives a value; panics (naming `what`) after `limit` worth of polls, or `limit` of
/// wall-clock time, whichever comes first (each look is bounded by the time left).
pub async fn wait_for_async<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + limit;
    for _ in 0..polls(limit, SLOW_POLL) {
        if let Some(v) = bounded(what, deadline, f()).await {
            return v;
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(SLOW_POLL).await;
    }
    panic!("timed out waiting for: {what}");
}

/// One look, bounded by the wall-clock `deadline` of the whole wait: a look that never
/// finishes (a connection the server under test accepted and then forgot), or looks slow
/// enough that the polls' count would add up to hours, fail the test naming `what` instead of
/// hanging the test binary until CI's own limit ends it. Real time: not for a paused clock.
async fn bounded<T>(what: &str, deadline: std::time::Instant, look: impl Future<Output = T>) -> T {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    match tokio::time::timeout(left.max(SLOW_POLL), look).await {
        Ok(v) => v,
        Err(_) => panic!(
            "timed out waiting for: {what} (a look was still unfinished at the end of the wait)"
        ),
    }
}

/// [`wait_for`] for a test without a runtime (a child process's output read by threads):
/// polls `f` every 20 ms, blocking this thread; `None` after `limit` worth of polls, for the
/// caller to fail with what it knows (e.g. the child's output so far).
pub fn poll_blocking<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    for _ in 0..polls(limit, SLOW_POLL) {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(SLOW_POLL);
    }
    None
}

/// How many polls of `every` `limit` is worth: counted rather than timed, so a loaded machine,
/// where each pause lasts longer, waits longer still.
fn polls(limit: Duration, every: Duration) -> u128 {
    (limit.as_millis() / every.as_millis()).max(1)
}
