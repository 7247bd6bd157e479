//! fanout's operations: the per-event metric families and their registry ([`metrics`], with the
//! process's own numbers from `/proc`), traces, their export, the access log writer and
//! `Server-Timing` ([`telemetry`]), the live page's request recorder ([`record`]), the liveness
//! and readiness flags ([`health`]) and the failed-request log throttle ([`errlog`]).
//!
//! It holds what is recorded and how it leaves the process, not the gateway it is read from: it
//! must not depend on `fanout-proxy` (which builds these parts, feeds them per request and writes
//! `/metrics`, reading the gateway at scrape time in its `scrape.rs`) nor on `fanout-transport`.

#![forbid(unsafe_code)]

pub mod errlog;
pub mod health;
pub mod metrics;
pub mod record;
pub mod telemetry;
