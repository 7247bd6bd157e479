//! fanout's connections and overload: the answer body ([`body`]), the connection table and its
//! limits ([`conn`]), the per-core runtimes and their listeners ([`cores`]), TLS on a listener
//! ([`tls`]), admission control ([`admission`]) and its adaptive limit ([`limiter`]), and the
//! stall watchdog ([`watchdog`]).
//!
//! It knows connections, sockets and slots, not routes or plans: it must not depend on
//! `fanout-proxy` (the gateway that uses it) nor on `fanout-ops` (metrics, telemetry); the proxy
//! reads its counters at scrape time.

#![forbid(unsafe_code)]

pub mod admission;
pub mod body;
pub mod conn;
pub mod cores;
pub mod limiter;
pub mod tls;
pub mod watchdog;
