//! The harness shared by the workspace's tests: real stubs on ephemeral 127.0.0.1 ports, a small
//! HTTP client, bounded waits, log capture and a real `redis-server` per test ([`RedisServer`]).
//! The example cases (`examples/*/cases.yaml`) are read and run by `fanout test`'s runner
//! (`fanout::testing`), not here.
//!
//! It does not depend on the gateway: the stub, flow, load generator and baseline tests use it, and
//! Cargo unifies a dev-dependency's features over a workspace build, so even a feature-gated
//! gateway part would link the whole gateway into their test binaries. Starting a gateway is in
//! the `fanout` package's own tests (`crates/fanout-cli/tests/support`).
//!
//! `use fanout_testkit::*;` brings the pooled client ([`client()`], [`send()`], [`get()`], [`post()`]),
//! the stub helpers, the waits ([`wait_until`], [`wait_for`], …), [`capture_logs`], the OTLP
//! trace receiver ([`OtlpReceiver`]), the file helpers ([`repo_root`], [`check_snapshot`],
//! [`TempDir`], [`free_addr`]) and the case types; [`h1`] holds requests on
//! fresh HTTP/1.1 connections, for tests that count connections, [`grpc`] a hand-written
//! h2c gRPC server, for tests of gRPC clients, and [`raw`] a backend of raw bodies (hashed as
//! they arrive, generated as they go), for pass-through routes.

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // the tests' harness: a failed unwrap is a failed test
pub mod client;
pub mod files;
pub mod grpc;
pub mod h1;
pub mod jwt;
pub mod logs;
pub mod otlp;
pub mod raw;
pub mod redis_server;
pub mod sse;
pub mod stubs;
pub mod wait;

pub use client::{Resp, TestClient, client, get, post, send};
pub use files::{TempDir, check_snapshot, free_addr, repo_root, snapshot_mismatch};
pub use logs::{Logs, capture_logs};
pub use otlp::{OtlpReceiver, RecvSpan};
pub use redis_server::RedisServer;
pub use stubs::{calls, load_stubs, no_vars, route_calls, start_stubs, stubs};
pub use wait::{
    PATIENCE, poll_blocking, wait_for, wait_for_async, wait_until, wait_until_async,
    wait_until_async_showing, wait_within,
};
