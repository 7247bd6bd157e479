//! The registries: every component the gateway is assembled from, one line each. A new backend
//! protocol, step kind, runtime or edge stage is a module (or crate) of its own plus its line here
//! (docs/ARCHITECTURE.md, "How to add …").

/// Every backend protocol, one line each ([`fanout_protocol`]; docs/ARCHITECTURE.md, "How to add
/// a backend protocol").
pub const PROTOCOLS: &[fanout_protocol::Registration] =
    &[fanout_client::PROTOCOL, fanout_postgres::PROTOCOL];
