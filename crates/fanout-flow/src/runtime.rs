//! The runtimes the engine hosts for step kinds ([`fanout_runtime::runtime`], re-exported here).
//! Which ones exist is the gateway's list (`fanout-proxy`'s `RUNTIMES`): the caller opens them
//! ([`Runtimes::open`]) and gives them to the compiler ([`crate::plan::Carry::runtimes`]).

pub use fanout_runtime::runtime::*;
