//! The gateway's integration tests, one module per subject, in one test binary: linking the whole
//! gateway once instead of once per file is most of the suite's build time.
//!
//! Run one subject with `cargo test -p fanout --test gateway <module>::`, one test with
//! `cargo test -p fanout --test gateway <module>::<name>`.
//!
//! The tests here share one process, so none of them may depend on process-wide state that another
//! test changes. Those that do are binaries of their own, beside this directory:
//! - `threads.rs` counts the threads of its process;
//! - `compute.rs` sets the stall threshold (`server.stall_threshold`, process-wide in
//!   `fanout_flow::activity`) to 1 ms and expects a counted stall;
//! - `hostile_requests.rs` expects the process-wide stall counter not to move during a request;
//! - `load_selftest.rs` times an in-process load generator (other tests would take its CPU);
//! - `lab.rs` runs the lab, which measures child processes and must not share the machine.
//!
//! The log capture (`fanout_testkit::capture_logs`) is process-wide too: tests that read it find
//! their lines by request ids no other test uses.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test
#[path = "../support/mod.rs"]
mod support;

mod admission;
mod auth;
mod bad_requests;
mod batching;
mod caching;
mod cli;
mod client_contract;
mod coalesce;
mod compression;
mod config_errors;
mod config_hints;
mod config_reference;
mod connections;
mod cors;
mod docs;
mod edge_stages;
mod examples;
mod explain;
mod fanout_test;
mod flow;
mod graphql;
mod graphql_edge;
mod graphql_interop;
mod grpc;
mod grpc_compression;
mod grpc_interop;
mod grpc_keepalive;
mod grpc_streams;
mod h2spec;
mod hostile_config;
mod house;
mod ip_filter;
mod isolation;
mod metrics;
mod models;
mod numbers;
mod openapi;
mod outlier;
mod pass;
mod per_core;
mod pg_errors;
mod postgres;
mod ratelimit;
mod redis_cache;
mod reference;
mod reload;
mod request_values;
mod retries;
mod schema;
mod secrets;
mod shared_calls;
mod signals;
mod sse;
mod streamed;
mod telemetry;
mod tls;
mod tls_listener;
mod ui;
mod websocket;
mod ws_python;
