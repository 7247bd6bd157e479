//! The admin listener (`admin:`): its own address, separate from the client port, serving
//! `/metrics`, `/healthz`, `/readyz` and `/__fanout/status`.

use crate::{ConfigError, Dur, Located};
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
    /// The live page `/ui` (and its data, `/ui/api/state`): routes with their flow graphs and
    /// live step numbers, backends, databases, models, admission, reloads, and the last slow
    /// and failed requests with a waterfall of their steps.
    pub ui: UiConfig,
    /// Host names the admin listener answers to, besides IP addresses and `localhost` (which
    /// it always answers to). A request whose `Host` is another name gets 403 on every path
    /// but `/healthz` and `/readyz`: a web page on another site cannot read `/ui`, `/metrics`
    /// or the status through DNS rebinding. A name may start with `*.` (any subdomain); `*`
    /// alone turns the check off. Default: none (reach it by IP address or `localhost`).
    pub hosts: Vec<Located<String>>,
    /// A secret every admin request but `/healthz` and `/readyz` must carry, as
    /// `Authorization: Bearer <token>` or as the password of `Basic` credentials (what a
    /// browser asks for on `/ui`); 401 without it. At least 16 characters; give it from the
    /// environment (`token: ${ADMIN_TOKEN}`). Default: none. For client certificates instead,
    /// set `admin.tls.client_auth`.
    pub token: Option<Located<String>>,
}

/// The live page on the admin listener (`admin.ui`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UiConfig {
    /// Serve `/ui` and record what it shows (per-step numbers, slow and failed requests).
    /// `false`: `/ui` is a 404 and nothing is recorded on the request path. Default true.
    pub enabled: bool,
    /// How many of the last slow requests are kept (oldest dropped first). Default 50.
    pub slow_requests: usize,
    /// How many of the last failed requests are kept (oldest dropped first). Default 50.
    pub failed_requests: usize,
    /// A request whose flow takes at least this long is slow. Default 500ms.
    pub slow_threshold: Dur,
    /// Most slow and most failed requests recorded per second, each (the others are counted,
    /// not kept): bounds the cost under a storm of failures. Default 20.
    pub record_per_second: u32,
    /// Show each failed step's internal detail as the log line has it (backend status and
    /// body excerpt, transport and expression errors). Default false: the page shows the
    /// error code, the safe message and the backend, never a backend body.
    pub error_detail: bool,
    /// How many of the last config reloads (applied or refused, with their errors) the page
    /// lists. Default 20.
    pub reload_history: usize,
}

impl Default for UiConfig {
    fn default() -> Self {
        UiConfig {
            enabled: true,
            slow_requests: 50,
            failed_requests: 50,
            slow_threshold: Dur(std::time::Duration::from_millis(500)),
            record_per_second: 20,
            error_detail: false,
            reload_history: 20,
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some("127.0.0.1:9901".into()),
            metrics: true,
            max_connections: 16,
            timeout: Dur::secs(10),
            tls: None,
            ui: UiConfig::default(),
            hosts: Vec::new(),
            token: None,
        }
    }
}

/// The shortest `admin.token` accepted.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

impl AdminConfig {
    /// `admin.token` long enough, `admin.hosts` names that are names.
    pub(crate) fn check(&self, errs: &mut Vec<ConfigError>) {
        if let Some(t) = &self.token
            && t.value.chars().count() < MIN_ADMIN_TOKEN_CHARS
        {
            errs.push(
                ConfigError::at(
                    t.pos,
                    format!(
                        "admin.token is shorter than {MIN_ADMIN_TOKEN_CHARS} characters"
                    ),
                )
                .hint("use a random secret, e.g. `openssl rand -hex 24`, given from the environment: `token: ${ADMIN_TOKEN}`"),
            );
        }
        for h in &self.hosts {
            let (pos, h) = (h.pos, h.value.as_str());
            let name = h.strip_prefix("*.").unwrap_or(h);
            let ok = h == "*"
                || (!name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
            if !ok {
                errs.push(
                    ConfigError::at(
                        pos,
                        format!("admin.hosts: `{h}` is not a host name"),
                    )
                    .hint("give names such as `fanout-admin.internal` or `*.example.com`, without a port"),
                );
            }
        }
    }

    /// The address to bind, or `None` when the listener is off (`listen: off` or `null`).
    pub fn listen_addr(&self) -> Option<&str> {
        self.listen
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty() && !a.eq_ignore_ascii_case("off"))
    }
}
