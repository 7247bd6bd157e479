//! Liveness and readiness (`/healthz`, `/readyz` on the admin listener).
//!
//! - **Alive** while the process serves the admin listener at all: always 200.
//! - **Ready** when the client listener is up, every required reference dataset has loaded and
//!   the gateway is not draining; otherwise 503 with the reason. A load balancer or Kubernetes
//!   stops sending traffic on the first 503 of `/readyz`, so the shutdown sequence is
//!   [`Health::set_draining`] (readiness flips), wait `server.drain_delay` for the balancers to
//!   notice, then drain.
//!
//! The flags are process-lived (a config reload keeps them).

use fanout_flow::reference::ReferenceSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// The gateway's health flags.
#[derive(Debug, Default)]
pub struct Health {
    listening: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    /// Flags for a gateway that is not listening yet and not draining.
    pub fn new() -> Health {
        Health::default()
    }

    /// The client listener is up (`true`) or closed (`false`).
    pub fn set_listening(&self, up: bool) {
        self.listening.store(up, Ordering::Release);
    }

    /// The gateway is shutting down: from now on it is not ready (for good).
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether [`Health::set_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// `Ok` when ready to take traffic, else why not.
    pub fn readiness(&self, reference: &ReferenceSet) -> Result<(), String> {
        if self.is_draining() {
            return Err("draining: the gateway is shutting down".into());
        }
        if !self.listening.load(Ordering::Acquire) {
            return Err("the client listener is not up".into());
        }
        let missing = reference.missing_required();
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|n| &**n).collect();
            return Err(format!(
                "required reference data not loaded yet: {}",
                names.join(", ")
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_listening_and_not_draining() {
        let refs = ReferenceSet::new(Vec::new());
        let h = Health::new();
        assert!(h.readiness(&refs).unwrap_err().contains("listener"));
        h.set_listening(true);
        assert_eq!(h.readiness(&refs), Ok(()));
        h.set_draining();
        assert!(h.readiness(&refs).unwrap_err().contains("draining"));
        h.set_listening(false);
        assert!(h.is_draining());
    }
}
