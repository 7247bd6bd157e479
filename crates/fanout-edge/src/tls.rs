//! TLS on the listeners, as an edge stage (`tls`): the handshake, the certificate files and
//! their reloads are `fanout-transport`'s (`tls.rs`: the listener is built at start, before any
//! config's stages, and lives as long as the process); this stage is what the gateway says of
//! them — the status endpoint's `tls` section (per listener: certificates and their expiry,
//! handshakes, failures by reason, reloads), the `fanout_tls_*` metric families and what
//! `fanout explain` says of a route reached over TLS. `$request.tls` is lent to every stage
//! through [`crate::Lent::tls_of`].

use crate::metrics::{MetricType, Out, Value};
use crate::{BuildCx, EdgeStage, Registration, RequestHead, RouteKind, Step};
use MetricType::{Counter, Gauge};
use fanout_config::ConfigErrors;
use fanout_transport::tls::TlsListener;
use std::sync::Arc;

/// The stage's line in the registry.
pub const STAGE: Registration = Registration {
    name: "tls",
    section: false,
    codes: &[],
    build,
    schema: None,
};

/// The gateway's TLS listeners (none: an empty status section, families without series).
struct TlsStage {
    listeners: Vec<Arc<TlsListener>>,
    /// What `fanout explain` says of every route (the main listener's TLS), if it has TLS.
    main: Option<String>,
}

fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let main = cx.config.tls.as_ref().map(|t| {
        let version = match t.min_version {
            fanout_config::TlsVersion::Tls12 => "1.2",
            fanout_config::TlsVersion::Tls13 => "1.3",
        };
        let clients = match &t.client_auth {
            None => String::new(),
            Some(c) => format!(
                "; client certificates {} (CA {})",
                match c.mode {
                    fanout_config::ClientAuthMode::Required => "required",
                    fanout_config::ClientAuthMode::Optional => "verified when presented",
                },
                c.ca_file.value
            ),
        };
        format!("tls: over TLS {version}+ on the main listener{clients}")
    });
    Ok(Some(Arc::new(TlsStage {
        listeners: cx.listeners.to_vec(),
        main,
    })))
}

impl EdgeStage for TlsStage {
    fn applies(&self, _route: usize, _kind: RouteKind) -> bool {
        false
    }

    fn on_request<'a>(&'a self, _head: &'a mut RequestHead<'_>) -> Step<'a> {
        Step::Next
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        let refs: Vec<&Arc<TlsListener>> = self.listeners.iter().collect();
        Some(fanout_transport::tls::status(&refs))
    }

    fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        families(&self.listeners, out)
    }

    fn explain(&self, _route: usize) -> Vec<String> {
        self.main.iter().cloned().collect()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// TLS listeners (`tls.rs`): each certificate's expiry, reloads, failed handshakes.
fn families(listeners: &[Arc<TlsListener>], out: &mut Out<'_>) -> std::fmt::Result {
    // The families are there without TLS too (empty), like every family of `/metrics`.
    let expiries: Vec<(&str, Vec<(String, i64)>)> =
        listeners.iter().map(|l| (l.name, l.expiries())).collect();
    out.family(
        "fanout_tls_certificate_expiry_timestamp_seconds",
        "When the certificate a TLS listener presents expires (Unix time), by listener and certificate file",
        Gauge,
        expiries.iter().flat_map(|(l, certs)| {
            certs.iter().map(move |(name, t)| {
                (
                    [("listener", *l), ("name", name.as_str())],
                    Value::Gauge(*t as f64),
                )
            })
        }),
    )?;
    out.family(
        "fanout_tls_reloads",
        "Certificate and client CA reloads of a TLS listener, by result (a refused one keeps the loaded files serving)",
        Counter,
        listeners.iter().flat_map(|l| {
            let (ok, refused) = l.reloads();
            [
                ([("listener", l.name), ("result", "ok")], Value::Counter(ok)),
                (
                    [("listener", l.name), ("result", "refused")],
                    Value::Counter(refused),
                ),
            ]
        }),
    )?;
    out.family(
        "fanout_tls_handshake_failures",
        "Failed TLS handshakes, by listener and reason",
        Counter,
        listeners.iter().flat_map(|l| {
            l.failures()
                .into_iter()
                .map(|(r, n)| ([("listener", l.name), ("reason", r)], Value::Counter(n)))
        }),
    )
}
