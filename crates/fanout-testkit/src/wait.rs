//! Bounded polling for states that settle asynchronously (a closed socket, a counter).
//!
//! The bound keeps a broken test from hanging; it measures nothing, so it is generous.

use std::time::Duration;

/// How long [`wait_until`] polls before it fails the test.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The pause between two checks.
const POLL: Duration = Duration::from_millis(5);

/// Poll `cond` until it holds; panics (naming `what`) if it does not within [`PATIENCE`].
pub async fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    wait_within(what, PATIENCE, cond).await
}

/// Poll `cond` every 5 ms until it holds; panics (naming `what`) after `limit` worth of polls.
pub async fn wait_within(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let polls = limit.as_millis() / POLL.as_millis();
    for _ in 0..polls {
        if cond() {
            return;
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
    let polls = PATIENCE.as_millis() / POLL.as_millis();
    for _ in 0..polls {
        if cond().await {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("timed out waiting for: {what}");
}
