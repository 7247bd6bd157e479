//! fanout's rate limiter (docs/config.md#rate-limits): named policies decided per request by GCRA
//! ([`gcra`]), their keys in a bounded table ([`table`]) or, shared by a fleet, in Redis
//! (`redis`: one Lua script per decision) with a local fallback when Redis is slow or down
//! (`Shared`). Knows nothing of HTTP or of the config's types: the gateway builds a `Policy`
//! from a `Spec` and asks it about each request's key.
//!
//! Features: `shared` (default) brings the policies and their Redis store; without it only
//! [`gcra`] and [`table`] are built, with no Redis client — what the backend call layers use
//! (`fanout-layers`), so that the engine never links Redis.

#![forbid(unsafe_code)]

pub mod gcra;
#[cfg(feature = "shared")]
mod policy;
#[cfg(feature = "shared")]
pub mod redis;
pub mod table;

#[cfg(feature = "shared")]
pub use policy::*;
