//! fanout's flow engine: compiles a config into an execution plan (no I/O) and runs that plan per
//! request.
//!
//! - [`plan`]: the compiler — expressions compiled once, dependencies inferred from `$names`,
//!   cycles and unknown references reported with line:column.
//! - [`exec`]: the executor — starts each step when its inputs are ready, runs independent steps
//!   concurrently on the request's task, enforces the deadline and the per-step failure policy.
//! - [`Backend`] (from `fanout-layers`): the backend-call interface every step's I/O goes through.
//! - [`kind`]: what a step kind is made of; the engine's own kinds need no other crate, the
//!   others (`sql`, `model`) live with their capability and are given to the compiler
//!   ([`compile_with`]).
//! - [`error`]: [`FlowError`], which maps to the client's status code.
//! - [`explain`]: a route's plan described for people (`fanout explain`: text and Mermaid).

pub mod activity;
pub mod batch;

pub mod call;
pub mod coverage;
mod ctx;
pub mod error;
pub mod exec;
pub mod explain;
pub mod kind;
/// The memory budget for in-flight data ([`fanout_runtime::memory`]), as the executor holds it.
pub use fanout_runtime::memory;
pub mod observe;
pub mod plan;
pub mod reference;
mod respond;
pub mod runtime;
mod step;
pub use step::error_kinds;
mod uri;

pub use error::{Answer, ErrorKind, FlowError, answer_code, code_for_status};
pub use exec::{Outcome, PARTIAL_HEADER};
// The types of the interface the engine calls backends through (`fanout-layers`).
pub use fanout_layers::{
    Backend, CallClass, CallError, CallErrorKind, CallOutcome, CallRequest, CallResponse,
    RejectReason,
};
pub use plan::{Carry, Plan, RoutePlan, compile, compile_with};
