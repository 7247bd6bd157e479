//! What fanout's engine runs beside the request tasks, shared by the engine (`fanout-flow`), the
//! step kinds' runtimes (`fanout-model`) and the gateway:
//!
//! - [`compute`]: the bounded pool of compute threads CPU-heavy work goes to (R1).
//! - [`cores`]: which core a serving thread is (`server.runtime: per_core`), for state kept per
//!   core.
//! - [`hist`]: the lock-free histogram the pool, the models and the gateway record into.
//! - [`memory`]: the gateway's memory budget for in-flight data and one request's account in it
//!   (the executor, the protocols and the inbound side all hold bytes there).
//! - [`runtime`]: what a runtime hosted for a step kind is (the [`runtime::Runtime`] trait) and
//!   the set of them opened for one config ([`runtime::Runtimes`]).

#![forbid(unsafe_code)]

pub mod compute;
pub mod cores;
pub mod hist;
pub mod memory;
pub mod runtime;
