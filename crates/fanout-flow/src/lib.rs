//! fanout's flow engine: compiles a config into an execution plan (no I/O) and runs that plan per
//! request.
//!
//! - [`plan`]: the compiler — expressions compiled once, dependencies inferred from `$names`,
//!   cycles and unknown references reported with line:column.
//! - [`exec`]: the executor — starts each step when its inputs are ready, runs independent steps
//!   concurrently on the request's task, enforces the deadline and the per-step failure policy.
//! - [`Backend`] (from `fanout-layers`): the backend-call interface every step's I/O goes through.
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
pub mod memory;
pub mod observe;
pub mod plan;
pub mod reference;
mod respond;
pub mod runtime;
mod step;
/// The `sql` step's counters (SQLSTATE classes, rows and errors per step), read by the metrics of
/// its protocol.
pub use step::sql_stats as sqlstats;
pub use step::{StepStats, error_kinds};
mod uri;

pub use error::{Answer, ErrorKind, FlowError, answer_code, code_for_status};
pub use exec::{Outcome, PARTIAL_HEADER};
// The types of the interface the engine calls backends through (`fanout-layers`).
pub use fanout_layers::{
    Backend, CallClass, CallError, CallErrorKind, CallOutcome, CallRequest, CallResponse,
    RejectReason,
};
pub use plan::{Carry, Plan, RoutePlan, compile, compile_with};
