//! Boxing a request's futures without building them on the stack first.
//!
//! `Box::pin(make_future())` builds the future in the caller's stack frame, allocates, and
//! copies the future's whole size into the box — kilobytes per request for the large ones (the
//! request's, a step's, a statement's), most of them bytes of states not yet entered. When the
//! allocation cannot be reasoned about by the optimiser (our global allocator is a C function),
//! the copy stays, and so does a stack frame as large as the future. Allocating first and
//! building the future straight into the allocation writes only what its first state holds.

use std::future::Future;
use std::pin::Pin;

/// `Box::pin(make())`, with the box allocated before `make` runs, so the future is written in
/// place instead of copied in (the crate's documentation).
#[inline(always)]
pub fn pinned<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

#[cfg(test)]
mod tests {
    use super::pinned;

    #[tokio::test]
    async fn the_future_runs_as_boxed() {
        let s = String::from("kept");
        let fut = pinned(|| async move { s.len() + 1 });
        assert_eq!(fut.await, 5);
    }
}
