//! The harness shared by the workspace's tests: real stubs (and, with the `gateway` feature, a
//! real gateway) on ephemeral 127.0.0.1 ports, a small HTTP client, bounded waits, log capture and
//! the example cases (`examples/*/cases.yaml`).
//!
//! `use fanout_testkit::*;` brings the pooled client ([`client`], [`send`], [`get`], [`post`]),
//! the stub helpers, [`wait_until`], [`capture_logs`] and the case types; [`h1`] holds requests on
//! fresh HTTP/1.1 connections, for tests that count connections.

pub mod cases;
pub mod client;
#[cfg(feature = "gateway")]
pub mod gateway;
pub mod h1;
pub mod logs;
pub mod stubs;
pub mod wait;

pub use cases::{Case, CaseRequest, Cases};
pub use client::{Resp, TestClient, client, get, post, send};
#[cfg(feature = "gateway")]
pub use gateway::{gateway, stub_vars};
pub use logs::{Logs, capture_logs};
pub use stubs::{calls, load_stubs, no_vars, start_stubs, stubs};
pub use wait::{PATIENCE, wait_until, wait_within};
