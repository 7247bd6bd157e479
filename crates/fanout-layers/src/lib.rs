//! A backend call of fanout and the layers stacked on it, per backend, between a step and its
//! protocol's client. Nothing here knows the flow engine (`fanout-flow`), a protocol or a
//! network library: a step builds a [`CallRequest`], the layers pass it down an
//! `Arc<dyn Backend>` stack (assembled by `fanout-proxy/src/stack.rs` from the config), and the
//! protocol client at the bottom sends it.
//!
//! - [`backend`]: the [`Backend`] trait and the call's types ([`CallRequest`], [`Call`],
//!   [`CallResponse`], [`CallKey`]); [`error`]: how a call fails ([`CallError`]).
//! - [`outcome`]: the one classification of a call's outcome every layer asks.
//! - Layers: [`cache`] (+ [`l2`], the shared second level's contract), [`dedup`] and the
//!   [`singleflight`] under both, [`hedge`], [`retry`], [`isolation`] (bulkhead, breaker).
//! - [`stream`]: streamed calls (pass-through routes), [`Backend::open`] beside [`Backend::call`].
//! - [`trace`]: a call's trace context through the layers.

#![forbid(unsafe_code)]

pub mod backend;
pub mod boxed;
pub mod cache;
pub mod dedup;
pub mod error;
pub mod hedge;
pub mod isolation;
pub mod l2;
pub mod outcome;
pub mod ratelimit;
pub mod retry;
pub mod singleflight;
pub mod stream;
pub mod trace;

pub use backend::{Backend, Call, CallKey, CallRequest, CallResponse};
pub use error::{CallError, CallErrorKind, RejectReason};
pub use outcome::{CallClass, CallOutcome};
