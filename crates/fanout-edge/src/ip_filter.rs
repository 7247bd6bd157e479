//! IP allow and deny lists (docs/config.md#ip_filter): a route's `stages.ip_filter` (else
//! `defaults.stages.ip_filter`) lists CIDR blocks the client's address must be in (`allow`) and
//! may not be in (`deny`). The address is the one `server.trusted_proxies` resolves (the
//! socket's peer, or what a trusted proxy says of the client). A request from a denied address,
//! from an address outside a non-empty `allow`, or from no known address is refused — 403
//! `ip_denied` — before authentication, before the body is read and before any backend call;
//! each decision is counted by route.
//!
//! A lookup costs one hash probe per distinct prefix length in the lists, whatever their size.

use crate::client::Cidr;
use crate::metrics::{MetricType, Out, Value};
use crate::{BuildCx, EdgeStage, Registration, Rejection, RequestHead, RouteKind, Step};
use fanout_config::{ConfigError, ConfigErrors};
use http::StatusCode;
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The stage's line in the registry.
pub const STAGE: Registration = Registration {
    name: "ip_filter",
    section: true,
    codes: &["ip_denied"],
    build,
    schema: Some(|| serde_json::to_value(schemars::schema_for!(Section)).unwrap_or_default()),
};

/// `stages.ip_filter`: IP allow and deny lists (docs/config.md#ip_filter--ip-allow-and-deny-lists).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Section {
    /// Blocks a client's address must be in (empty: any address not denied).
    #[serde(default)]
    allow: Vec<String>,
    /// Blocks a client's address may not be in; a denied address is refused even when allowed.
    #[serde(default)]
    deny: Vec<String>,
    /// (`defaults` only) Also close a connection whose peer the lists refuse at once, before
    /// its TLS handshake and any request (a trusted proxy's connection is let in).
    #[serde(default)]
    on_connection: bool,
}

/// CIDR blocks, by prefix length: an address is in the set when its prefix of one of those
/// lengths is.
#[derive(Default)]
struct Blocks {
    v4: Vec<(u8, HashSet<u32>)>,
    v6: Vec<(u8, HashSet<u128>)>,
    /// As written (normalised), for `fanout explain`.
    shown: Vec<String>,
}

impl Blocks {
    fn insert(&mut self, c: Cidr) {
        self.shown.push(c.to_string());
        let bits = c.bits();
        match c.net() {
            IpAddr::V4(a) => {
                let masked = u32::from(a) & mask32(bits);
                match self.v4.iter_mut().find(|(b, _)| *b == bits) {
                    Some((_, s)) => {
                        s.insert(masked);
                    }
                    None => self.v4.push((bits, HashSet::from([masked]))),
                }
            }
            IpAddr::V6(a) => {
                let masked = u128::from(a) & mask128(bits);
                match self.v6.iter_mut().find(|(b, _)| *b == bits) {
                    Some((_, s)) => {
                        s.insert(masked);
                    }
                    None => self.v6.push((bits, HashSet::from([masked]))),
                }
            }
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match ip.to_canonical() {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4.iter().any(|(b, s)| s.contains(&(a & mask32(*b))))
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6.iter().any(|(b, s)| s.contains(&(a & mask128(*b))))
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.shown.is_empty()
    }
}

fn mask32(bits: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0)
}

fn mask128(bits: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0)
}

/// One section's lists.
struct Lists {
    allow: Blocks,
    deny: Blocks,
}

/// What the lists decide for `client`: `Err(why)` for the log when refused.
impl Lists {
    fn decide(&self, client: Option<IpAddr>) -> Result<(), String> {
        let Some(ip) = client else {
            return Err("the client's address is unknown".into());
        };
        if self.deny.contains(ip) {
            return Err(format!("{ip} is in the deny list"));
        }
        if !self.allow.is_empty() && !self.allow.contains(ip) {
            return Err(format!("{ip} is not in the allow list"));
        }
        Ok(())
    }
}

/// Decisions of one route: allowed, denied.
#[derive(Default)]
struct Counts {
    allowed: AtomicU64,
    denied: AtomicU64,
}

/// The stage for one loaded config.
struct IpFilter {
    /// By route index: its lists (shared when they come from `defaults`), if it has any.
    routes: Vec<Option<Arc<Lists>>>,
    /// By route index: its name (`METHOD path`) and counters (kept across reloads by name).
    counts: Vec<(String, Arc<Counts>)>,
    /// The defaults' lists, when they also judge connections (`on_connection`), and the
    /// trusted proxies (whose connections are let in).
    connections: Option<(Arc<Lists>, crate::ClientAddresses)>,
    /// Connections closed by the defaults' lists (kept across reloads).
    connections_refused: Arc<AtomicU64>,
    /// Routes with lists of their own while the defaults judge connections.
    warnings: Vec<ConfigError>,
}

fn read(cx: &BuildCx<'_>, value: &serde_json::Value, at: &str) -> Result<Lists, Vec<ConfigError>> {
    read_section(cx, value, at).map(|(l, _)| l)
}

/// A section's lists, and whether it asks to judge connections.
fn read_section(
    cx: &BuildCx<'_>,
    value: &serde_json::Value,
    at: &str,
) -> Result<(Lists, bool), Vec<ConfigError>> {
    let section: Section = cx.read(value, at).map_err(|e| vec![e])?;
    let mut errs = Vec::new();
    let mut lists = Lists {
        allow: Blocks::default(),
        deny: Blocks::default(),
    };
    for (name, written, blocks) in [
        ("allow", &section.allow, &mut lists.allow),
        ("deny", &section.deny, &mut lists.deny),
    ] {
        for (i, text) in written.iter().enumerate() {
            match Cidr::parse(text) {
                Some(c) => blocks.insert(c),
                None => errs.push(
                    ConfigError::at_path(
                        format!("{at}.{name}[{i}]"),
                        format!("{at}.{name}: `{text}` is not an address or CIDR block"),
                    )
                    .hint("e.g. `10.0.0.0/8`, `192.0.2.7` or `2001:db8::/32`")
                    .in_file(&cx.config.file),
                ),
            }
        }
    }
    if section.on_connection && at != "defaults.stages.ip_filter" {
        errs.push(
            ConfigError::at_path(
                format!("{at}.on_connection"),
                format!("{at}.on_connection: connections are judged before any route is known"),
            )
            .hint("set `on_connection` in `defaults.stages.ip_filter`")
            .in_file(&cx.config.file),
        );
    }
    if errs.is_empty() {
        Ok((lists, section.on_connection))
    } else {
        Err(errs)
    }
}

fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let mut errs = Vec::new();
    let (defaults, on_connection) = match cx.config.defaults.stages.get(STAGE.name) {
        Some(v) => match read_section(cx, v, "defaults.stages.ip_filter") {
            Ok((l, c)) => (Some(Arc::new(l)), c),
            Err(mut e) => {
                errs.append(&mut e);
                (None, false)
            }
        },
        None => (None, false),
    };
    let prev_stage = cx.prev.and_then(|p| p.as_any().downcast_ref::<IpFilter>());
    let prev = prev_stage
        .map(|p| p.counts.iter().cloned().collect::<HashMap<_, _>>())
        .unwrap_or_default();
    let mut warnings = Vec::new();
    let mut routes = Vec::with_capacity(cx.config.routes.len());
    let mut counts = Vec::with_capacity(cx.config.routes.len());
    for (i, r) in cx.config.routes.iter().enumerate() {
        let lists = match r.stages.get(STAGE.name) {
            Some(v) => match read(cx, v, &format!("routes[{i}].stages.ip_filter")) {
                Ok(l) => {
                    if on_connection {
                        let at = format!("routes[{i}].stages.ip_filter");
                        warnings.push(
                            ConfigError::at_path(
                                at.clone(),
                                format!(
                                    "warning: {at}: the defaults' lists close refused \
                                     connections (`on_connection`) before this route is known: \
                                     its own lists cannot let those addresses in"
                                ),
                            )
                            .hint("narrow the defaults' lists, or drop `on_connection`"),
                        );
                    }
                    Some(Arc::new(l))
                }
                Err(mut e) => {
                    errs.append(&mut e);
                    None
                }
            },
            None => defaults.clone(),
        };
        // A section with both lists empty turns the filter off for the route.
        routes.push(lists.filter(|l| !(l.allow.is_empty() && l.deny.is_empty())));
        let name = route_name(r);
        let c = prev.get(&name).cloned().unwrap_or_default();
        counts.push((name, c));
    }
    if !errs.is_empty() {
        return Err(ConfigErrors(errs));
    }
    fanout_config::locate(&mut warnings, &cx.config.source);
    let warnings = warnings
        .into_iter()
        .map(|w| w.in_file(&cx.config.file))
        .collect();
    let connections = match (on_connection, &defaults) {
        (true, Some(l)) if !(l.allow.is_empty() && l.deny.is_empty()) => {
            Some((l.clone(), cx.clients.clone()))
        }
        _ => None,
    };
    let connections_refused =
        prev_stage.map_or_else(Default::default, |p| p.connections_refused.clone());
    Ok(Some(Arc::new(IpFilter {
        routes,
        counts,
        connections,
        connections_refused,
        warnings,
    })))
}

/// `METHOD path` of a configured route.
fn route_name(r: &fanout_config::Route) -> String {
    let path = match &r.grpc {
        Some(g) if r.path.value.is_empty() => format!("/{}", g.value),
        _ => r.path.value.clone(),
    };
    let method = match (&r.grpc, r.method.pos.line) {
        (Some(_), 0) => "POST".to_string(),
        _ => r.method.value.to_ascii_uppercase(),
    };
    format!("{method} {path}")
}

impl EdgeStage for IpFilter {
    fn applies(&self, route: usize, _: RouteKind) -> bool {
        self.routes.get(route).is_some_and(Option::is_some)
    }

    fn connects(&self) -> bool {
        self.connections.is_some()
    }

    fn on_connection(&self, peer: std::net::SocketAddr) -> bool {
        let Some((lists, clients)) = &self.connections else {
            return true;
        };
        let ip = peer.ip().to_canonical();
        if clients.trusts(ip) || lists.decide(Some(ip)).is_ok() {
            return true;
        }
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
        false
    }

    fn warnings(&self) -> Vec<ConfigError> {
        self.warnings.clone()
    }

    fn on_request<'a>(&'a self, head: &'a mut RequestHead<'_>) -> Step<'a> {
        let route = head.route.index;
        let Some(lists) = self.routes.get(route).and_then(Option::as_ref) else {
            return Step::Next;
        };
        let decided = lists.decide(head.client());
        let counts = self.counts.get(route).map(|(_, c)| c);
        match decided {
            Ok(()) => {
                if let Some(c) = counts {
                    c.allowed.fetch_add(1, Ordering::Relaxed);
                }
                Step::Next
            }
            Err(why) => {
                if let Some(c) = counts {
                    c.denied.fetch_add(1, Ordering::Relaxed);
                }
                Step::Refuse(
                    Rejection::new(
                        StatusCode::FORBIDDEN,
                        "ip_denied",
                        "the client's address may not call this route",
                    )
                    .detail(why),
                )
            }
        }
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        let routes: serde_json::Map<String, serde_json::Value> = self
            .counts
            .iter()
            .zip(&self.routes)
            .filter(|(_, l)| l.is_some())
            .map(|((name, c), _)| {
                (
                    name.clone(),
                    serde_json::json!({
                        "allowed": c.allowed.load(Ordering::Relaxed),
                        "denied": c.denied.load(Ordering::Relaxed),
                    }),
                )
            })
            .collect();
        Some(serde_json::json!({
            "routes": routes,
            "connections_refused": self.connections_refused.load(Ordering::Relaxed),
        }))
    }

    fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        out.family(
            "fanout_ip_filter_requests",
            "Requests the IP allow/deny lists decided, by route and decision (allowed, denied)",
            MetricType::Counter,
            self.counts
                .iter()
                .zip(&self.routes)
                .filter(|(_, l)| l.is_some())
                .flat_map(|((name, c), _)| {
                    [("allowed", &c.allowed), ("denied", &c.denied)].map(|(d, v)| {
                        (
                            [("route", name.as_str()), ("decision", d)],
                            Value::Counter(v.load(Ordering::Relaxed)),
                        )
                    })
                }),
        )?;
        out.single(
            "fanout_ip_filter_connections_refused",
            "Connections closed at accept because the defaults' IP lists refuse the peer (on_connection)",
            Value::Counter(self.connections_refused.load(Ordering::Relaxed)),
        )
    }

    fn explain(&self, route: usize) -> Vec<String> {
        let Some(Some(lists)) = self.routes.get(route) else {
            return Vec::new();
        };
        let mut parts = Vec::new();
        if !lists.allow.is_empty() {
            parts.push(format!("allow {}", lists.allow.shown.join(", ")));
        }
        if !lists.deny.is_empty() {
            parts.push(format!("deny {}", lists.deny.shown.join(", ")));
        }
        let mut lines = vec![format!(
            "ip_filter: {}; otherwise 403 ip_denied",
            parts.join("; ")
        )];
        if self.connections.is_some() {
            lines.push(
                "ip_filter: connections from addresses the defaults' lists refuse are closed at \
                 accept (on_connection)"
                    .to_string(),
            );
        }
        lines
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lists(allow: &[&str], deny: &[&str]) -> Lists {
        let mut l = Lists {
            allow: Blocks::default(),
            deny: Blocks::default(),
        };
        for a in allow {
            l.allow.insert(Cidr::parse(a).unwrap());
        }
        for d in deny {
            l.deny.insert(Cidr::parse(d).unwrap());
        }
        l
    }

    #[test]
    fn deny_wins_allow_bounds_and_an_unknown_address_is_refused() {
        let l = lists(
            &["10.0.0.0/8", "2001:db8::/32"],
            &["10.9.0.0/16", "10.1.2.3"],
        );
        let ok = |s: &str| l.decide(Some(s.parse().unwrap())).is_ok();
        assert!(ok("10.1.2.4"));
        assert!(!ok("10.1.2.3"), "one denied address");
        assert!(!ok("10.9.7.7"), "a denied block inside an allowed one");
        assert!(!ok("192.0.2.1"), "outside allow");
        assert!(ok("2001:db8::5"));
        assert!(
            ok("::ffff:10.3.3.3"),
            "a mapped IPv4 address counts as IPv4"
        );
        assert!(l.decide(None).is_err());
        let only_deny = lists(&[], &["192.0.2.0/24"]);
        assert!(
            only_deny
                .decide(Some("198.51.100.1".parse().unwrap()))
                .is_ok()
        );
        assert!(
            only_deny
                .decide(Some("192.0.2.9".parse().unwrap()))
                .is_err()
        );
        let everyone = lists(&["0.0.0.0/0", "::/0"], &[]);
        assert!(
            everyone
                .decide(Some("203.0.113.5".parse().unwrap()))
                .is_ok()
        );
        assert!(
            everyone
                .decide(Some("2001:db8::1".parse().unwrap()))
                .is_ok()
        );
    }
}
