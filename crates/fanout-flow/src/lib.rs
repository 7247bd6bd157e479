//! fanout's flow engine: compiles a config into an execution plan (no I/O) and runs that plan per
//! request.
//!
//! - [`plan`]: the compiler — expressions compiled once, dependencies inferred from `$names`,
//!   cycles and unknown references reported with line:column.
//! - [`exec`]: the executor — starts each step when its inputs are ready, runs independent steps
//!   concurrently on the request's task, enforces the deadline and the per-step failure policy.
//! - [`backend`]: the backend-call layer every step's I/O goes through.
//! - [`error`]: [`FlowError`], which maps to the client's status code.
//! - [`explain`]: a route's plan described for people (`fanout explain`: text and Mermaid).

pub mod activity;
pub mod backend;
pub mod batch;
pub mod boxed;
pub mod cache;
pub mod call;
pub mod compute;
mod ctx;
pub mod dedup;
pub mod error;
pub mod exec;
pub mod explain;
pub mod hedge;
pub mod hist;
pub mod isolation;
pub mod l2;
pub mod memory;
pub mod models;
pub mod observe;
pub mod outcome;
pub mod plan;
pub mod reference;
mod respond;
pub mod retry;
pub mod runtime;
pub mod singleflight;
mod step;
pub use step::StepStats;
/// The `sql` step's counters (SQLSTATE classes, rows and errors per step), read by the metrics of
/// its protocol.
pub use step::sql_stats as sqlstats;
pub mod trace;
mod uri;

pub use backend::{Backend, CallError, CallErrorKind, CallRequest, CallResponse, RejectReason};
pub use error::{Answer, ErrorKind, FlowError, answer_code, code_for_status};
pub use exec::{Outcome, PARTIAL_HEADER};
pub use outcome::{CallClass, CallOutcome};
pub use plan::{Carry, Plan, RoutePlan, compile, compile_with};
