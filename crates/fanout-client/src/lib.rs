//! fanout's outbound HTTP client — the HTTP and gRPC backend protocol ([`PROTOCOL`]): each
//! call's address chosen by the backend's balancer ([`balance`]), plain HTTP/1.1 over fanout's
//! own keep-alive pool, `https://` and HTTP/2 over hyper-util's pooled client ([`client`]).

#![forbid(unsafe_code)]

pub mod balance;
mod body;
pub mod client;
mod decode;
#[doc(hidden)]
pub mod fuzzing;
mod h1pool;

pub use client::{HttpBackend, PROTOCOL};
pub use fanout_protocol::AddressStatus;
