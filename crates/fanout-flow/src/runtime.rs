//! The runtimes the engine hosts for its step kinds, one line each ([`REGISTERED`]); what a
//! runtime is: [`fanout_runtime::runtime`], re-exported here.

pub use fanout_runtime::runtime::*;

use fanout_config::{Config, ConfigError};

/// Every runtime, one line each, in the order of [`Runtimes`].
pub const REGISTERED: &[Registration] = &[fanout_model::runtime::RUNTIME];

/// Open every registered runtime for `cfg` ([`Runtimes::open`]), keeping those of `prev` whose
/// inputs did not change.
pub fn open(cfg: &Config, prev: Option<(&Config, &Runtimes)>) -> Result<Runtimes, ConfigError> {
    Runtimes::open(REGISTERED, cfg, prev)
}
