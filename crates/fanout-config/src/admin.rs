//! The admin listener (`admin:`): its own address, separate from the client port, serving
//! `/metrics`, `/healthz`, `/readyz` and `/__fanout/status`.

use crate::Dur;
use schemars::JsonSchema;
use serde::Deserialize;

/// The admin listener: metrics, health and status on an address of their own (never subject to
/// the client port's admission or connection cap).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of the admin listener. Default `127.0.0.1:9901` (loopback: reachable only from
    /// the host). `off` or `null` disables it. `fanout serve --admin-listen` overrides it.
    pub listen: Option<String>,
    /// Record request and backend-call metrics on the request path. `false` records nothing
    /// there (`/metrics` still shows the counters and state read at scrape time). Default true.
    pub metrics: bool,
    /// Most open connections to the admin listener; more are closed at once. Default 16.
    pub max_connections: usize,
    /// Time an admin connection has to send a request head, and the longest it may stay idle
    /// between requests; default 10s.
    pub timeout: Dur,
    /// TLS on the admin listener (same settings as the top-level `tls`). Default: none.
    pub tls: Option<crate::ListenerTls>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some("127.0.0.1:9901".into()),
            metrics: true,
            max_connections: 16,
            timeout: Dur::secs(10),
            tls: None,
        }
    }
}

impl AdminConfig {
    /// The address to bind, or `None` when the listener is off (`listen: off` or `null`).
    pub fn listen_addr(&self) -> Option<&str> {
        self.listen
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty() && !a.eq_ignore_ascii_case("off"))
    }
}
