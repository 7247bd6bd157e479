//! The rate-limit stage (docs/config.md#rate-limits): after routing, before the deadline, the
//! body and admission, each of the route's policies (`rate_limit:`, else
//! `defaults.rate_limit`) decides the request by its key — a jq expression over `$request`
//! (without the body, which is not read yet) — in `fanout-ratelimit`. Over a limit: 429
//! `rate_limited` with `Retry-After` and the draft-09 `RateLimit-Policy` / `RateLimit` fields.
//!
//! Also the client address (`$request.client.address`, the keys' default): the socket's peer,
//! or — only when that peer is one of `server.trusted_proxies` — the address the proxies put in
//! `X-Forwarded-For` / `Forwarded`, read right to left, skipping trusted hops.

use crate::answer::{RateLimited, Refusal};
use crate::{Gateway, Live};
use fanout_config::ratelimit::{RateLimitOnFailure, RateLimitStore};
use fanout_config::{ClientAddressHeader, Config, ConfigError, ConfigErrors};
use fanout_expr::request::{ParamKey, RequestUse};
use fanout_expr::{Expr, Val};
use fanout_flow::RoutePlan;
use fanout_ratelimit::{OnFailure, Policy, SharedSpec, Spec};
use http::HeaderMap;
use http::request::Parts;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// One policy as the stage runs it.
pub(crate) struct Compiled {
    /// The policy's name.
    pub(crate) name: Arc<str>,
    key: Expr,
    /// The config it was built from (a reload keeps its state while this is equal).
    config: fanout_config::ratelimit::RateLimitPolicy,
    /// Its limiter and state.
    pub(crate) policy: Arc<Policy>,
    /// `"NAME"` as a structured-field string.
    sf_name: String,
}

/// The rate limits of one loaded config.
#[derive(Default)]
pub(crate) struct RateLimits {
    /// The policies, in config order.
    pub(crate) policies: Vec<Compiled>,
    /// By route index: the route's policies (indices into `policies`) and what their keys read.
    routes: Vec<(Vec<usize>, RequestUse)>,
    /// `server.trusted_proxies`, parsed.
    trusted: Vec<(IpAddr, u8)>,
    header: ClientAddressHeader,
    /// The Redis connection of the shared policies (kept by a reload that keeps `redis:`).
    conn: Option<Arc<dyn fanout_ratelimit::redis::Connect>>,
    /// What the config may not mean ([`warnings`]): said by `fanout validate`, logged at start
    /// and reload.
    pub(crate) warnings: Vec<ConfigError>,
}

/// `name` as a structured-field string (`"…"`, `\` and `"` escaped, other characters outside
/// printable ASCII dropped).
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => {}
        }
    }
    out.push('"');
    out
}

/// A CIDR (`10.0.0.0/8`, `::1/128`) or one address.
fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (ip, bits) = match text.trim().split_once('/') {
        Some((ip, bits)) => (ip.parse::<IpAddr>().ok()?, Some(bits.parse::<u8>().ok()?)),
        None => (text.trim().parse::<IpAddr>().ok()?, None),
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(max);
    (bits <= max).then_some((ip.to_canonical(), bits))
}

fn in_net(ip: IpAddr, (net, bits): (IpAddr, u8)) -> bool {
    match (ip.to_canonical(), net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// An address as a proxy wrote it: `192.0.2.1`, `192.0.2.1:80`, `[2001:db8::1]:80`,
/// `2001:db8::1`, optionally quoted.
fn parse_hop(text: &str) -> Option<IpAddr> {
    let t = text.trim().trim_matches('"');
    if let Ok(ip) = t.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = t.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    t.parse::<SocketAddr>().ok().map(|s| s.ip())
}

impl RateLimits {
    /// Whether `ip` is a trusted proxy.
    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| in_net(ip, *n))
    }

    /// The client's address: the peer's (the socket address of the connection the request came
    /// on, `None` when unknown), or when the peer is a trusted proxy, the first hop from the
    /// right of the forwarding header that is not trusted (a hop that does not parse ends the
    /// walk at the last trusted one).
    pub(crate) fn client_address(&self, parts: &Parts, peer: Option<SocketAddr>) -> Option<IpAddr> {
        let peer = peer?.ip().to_canonical();
        if self.trusted.is_empty() || !self.trusts(peer) {
            return Some(peer);
        }
        let mut hops: Vec<&str> = Vec::new();
        let headers: &HeaderMap = &parts.headers;
        match self.header {
            ClientAddressHeader::XForwardedFor => {
                for v in headers.get_all("x-forwarded-for") {
                    let Ok(v) = v.to_str() else { return Some(peer) };
                    hops.extend(v.split(','));
                }
            }
            ClientAddressHeader::Forwarded => {
                for v in headers.get_all(http::header::FORWARDED) {
                    let Ok(v) = v.to_str() else { return Some(peer) };
                    for element in v.split(',') {
                        let hop = element.split(';').find_map(|pair| {
                            let (k, v) = pair.trim().split_once('=')?;
                            k.trim().eq_ignore_ascii_case("for").then_some(v)
                        });
                        // An element without `for=` says nothing of the client: the walk ends.
                        hops.push(hop.unwrap_or(""));
                    }
                }
            }
        }
        let mut client = peer;
        for hop in hops.iter().rev() {
            let Some(ip) = parse_hop(hop) else { break };
            client = ip.to_canonical();
            if !self.trusts(client) {
                break;
            }
        }
        Some(client)
    }

    /// Whether route `i` needs the client address (its keys, or its flow, read it).
    pub(crate) fn needs_client(&self, route: &RoutePlan) -> bool {
        route.request_use.client || self.routes.get(route.index).is_some_and(|(_, u)| u.client)
    }

    /// `{name: {allowed, denied, fallback, redis_errors, denied_locally, keys, table_bytes,
    /// overflow, store}}` for the status endpoint.
    pub(crate) fn status_json(&self) -> serde_json::Value {
        let m: serde_json::Map<String, serde_json::Value> = self
            .policies
            .iter()
            .map(|c| {
                let p = &c.policy;
                let n = p.counters();
                (
                    c.name.to_string(),
                    serde_json::json!({
                        "store": if p.is_shared() { "redis" } else { "local" },
                        "allowed": n.allowed.load(Ordering::Relaxed),
                        "denied": n.denied.load(Ordering::Relaxed),
                        "fallback": n.fallback.load(Ordering::Relaxed),
                        "redis_errors": n.redis_errors.load(Ordering::Relaxed),
                        "denied_locally": n.denied_locally.load(Ordering::Relaxed),
                        "keys": p.keys(),
                        "table_bytes": p.table_bytes(),
                        "overflow": p.overflowed(),
                    }),
                )
            })
            .collect();
        serde_json::Value::Object(m)
    }
}

/// The rate limits of `cfg`: every policy's key compiled (errors at their line:col), the
/// policies of each route resolved; a policy whose config (and `redis:`) did not change keeps
/// its state from `prev`.
pub(crate) fn build(
    cfg: &Config,
    prev: Option<(&Config, &RateLimits)>,
) -> Result<RateLimits, ConfigErrors> {
    let mut errs = Vec::new();
    let mut trusted = Vec::new();
    for (i, t) in cfg.server.trusted_proxies.iter().enumerate() {
        match parse_cidr(t) {
            Some(n) => trusted.push(n),
            None => errs.push(
                ConfigError::at_path(
                    format!("server.trusted_proxies[{i}]"),
                    format!("server.trusted_proxies: `{t}` is not an address or CIDR"),
                )
                .hint("e.g. `10.0.0.0/8`, `192.0.2.7` or `2001:db8::/32`")
                .in_file(&cfg.file),
            ),
        }
    }
    let same_redis = prev.is_some_and(|(p, _)| p.redis == cfg.redis);
    let mut conn = prev
        .filter(|_| same_redis)
        .and_then(|(_, r)| r.conn.clone());
    let mut policies = Vec::with_capacity(cfg.rate_limits.len());
    for (name, p) in &cfg.rate_limits {
        let key = match Expr::compile(&p.key.value, &["request"]) {
            Ok(e) => e,
            Err(e) => {
                let pos = cfg.pos_in_scalar(p.key.pos, &p.key.value, e.offset);
                errs.push(
                    ConfigError::at(
                        pos,
                        format!("rate_limits.{name}.key: {}", e.message),
                    )
                    .hint("a jq expression over `$request`, e.g. `$request.headers[\"x-api-key\"]`")
                    .in_file(&cfg.file),
                );
                continue;
            }
        };
        let kept = prev
            .filter(|_| same_redis)
            .and_then(|(_, r)| r.policies.iter().find(|c| *c.name == **name))
            .filter(|c| c.config == *p)
            .map(|c| c.policy.clone());
        let policy = match kept {
            Some(k) => k,
            None => {
                let shared = match (p.store, &cfg.redis) {
                    (RateLimitStore::Redis, Some(r)) => {
                        let c = match &conn {
                            Some(c) => c.clone(),
                            None => match crate::l2::rate_limit_connection(r) {
                                Ok(c) => {
                                    conn = Some(c.clone());
                                    c
                                }
                                Err(e) => {
                                    errs.push(e.in_file(&cfg.file));
                                    continue;
                                }
                            },
                        };
                        Some(SharedSpec {
                            conn: c,
                            key_prefix: r.key_prefix.clone(),
                            timeout: p.redis.timeout.0,
                            fleet_share: p.redis.fleet_share,
                            on_failure: match p.redis.on_failure {
                                RateLimitOnFailure::Local => OnFailure::Local,
                                RateLimitOnFailure::Deny => OnFailure::Deny,
                            },
                            retry_after: p.redis.retry_after.0,
                        })
                    }
                    _ => None,
                };
                Arc::new(Policy::new(&Spec {
                    name: name.clone(),
                    per_second: p.per_second(),
                    burst: p.burst_size(),
                    max_keys: p.max_keys,
                    shared,
                }))
            }
        };
        policies.push(Compiled {
            name: name.as_str().into(),
            key,
            config: p.clone(),
            policy,
            sf_name: sf_string(name),
        });
    }
    let routes = (0..cfg.routes.len())
        .map(|i| {
            let mut reads = RequestUse::default();
            let ids: Vec<usize> = cfg
                .route_rate_limits(i)
                .into_iter()
                .filter_map(|n| policies.iter().position(|c| &*c.name == n))
                .collect();
            for &id in &ids {
                if let Some(c) = policies.get(id) {
                    reads.add(&c.key.request_use());
                }
            }
            // The body is read after this stage: a key never sees it.
            reads.body = false;
            (ids, reads)
        })
        .collect();
    if !errs.is_empty() {
        fanout_config::locate(&mut errs, &cfg.source);
        return Err(ConfigErrors(errs));
    }
    let warnings = warnings(cfg, &policies, &trusted);
    Ok(RateLimits {
        policies,
        routes,
        trusted,
        header: cfg.server.client_address_header,
        conn,
        warnings,
    })
}

/// What a valid config may not mean: a key that reads `$request.body` (never read yet when the
/// limit decides: `null`) or `$request.auth` on a route without authentication (`null` there),
/// so every request of those routes may share one budget; a trusted proxy range that trusts
/// every address (any client can then choose its own address by the forwarding header).
fn warnings(cfg: &Config, policies: &[Compiled], trusted: &[(IpAddr, u8)]) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for c in policies {
        let reads = c.key.request_use();
        let at = format!("rate_limits.{}.key", c.name);
        if reads.body {
            out.push(
                ConfigError::at_path(
                    at.clone(),
                    format!(
                        "warning: rate_limits.{}.key reads $request.body, which is null when the limit decides (before the body is read): that part of the key is the same for every request",
                        c.name
                    ),
                )
                .hint("key on what arrives before the body: a header, the client address, $request.auth"),
            );
        }
        if reads.auth {
            let anonymous: Vec<String> = (0..cfg.routes.len())
                .filter(|&i| cfg.route_rate_limits(i).contains(&&*c.name))
                .filter(|&i| {
                    cfg.routes
                        .get(i)
                        .and_then(|r| r.auth.as_ref())
                        .or(cfg.defaults.auth.as_ref())
                        .is_none_or(|a| a.mode == fanout_config::auth::AuthMode::None)
                })
                .filter_map(|i| cfg.routes.get(i))
                .map(|r| format!("{} {}", r.method.value.to_ascii_uppercase(), r.path.value))
                .collect();
            if !anonymous.is_empty() {
                out.push(
                    ConfigError::at_path(
                        at,
                        format!(
                            "warning: rate_limits.{}.key reads $request.auth, which is null on {} (no `auth`): every request there shares one budget",
                            c.name,
                            anonymous.join(", ")
                        ),
                    )
                    .hint("give those routes `auth:`, or key them on something else (`$request.client.address`)"),
                );
            }
        }
    }
    for (i, (ip, bits)) in trusted.iter().enumerate() {
        if *bits == 0 {
            out.push(
                ConfigError::at_path(
                    format!("server.trusted_proxies[{i}]"),
                    format!(
                        "warning: server.trusted_proxies has `{ip}/0`, which trusts every address: any client can choose its own address (and rate-limit key) with the forwarding header"
                    ),
                )
                .hint("list only your load balancers' addresses or ranges"),
            );
        }
    }
    fanout_config::locate(&mut out, &cfg.source);
    for w in &mut out {
        w.file = cfg.file.clone();
    }
    out
}

impl Gateway {
    /// The rate-limit stage: every policy of the route decides the request by its key; the
    /// first that refuses ends it (429 `rate_limited`).
    pub(crate) async fn rate_limit<'a, K: ParamKey>(
        &self,
        live: &Live,
        parts: &'a Parts,
        route: &RoutePlan,
        params: impl IntoIterator<Item = (K, &'a str)>,
        client: Option<&'a str>,
        auth: &Val,
    ) -> Result<(), Refusal<'a>> {
        let limits = &live.rate_limits;
        let Some((ids, reads)) = limits.routes.get(route.index) else {
            return Ok(());
        };
        if ids.is_empty() {
            return Ok(());
        }
        // `$request` without its body, as the flow's is built (a part the keys read that is not
        // UTF-8 is refused the same way: 400, never replaced).
        let request =
            crate::lifecycle::build_request(parts, params, Val::Null, auth.clone(), reads, client)?;
        let mut key = Vec::new();
        for &id in ids {
            let Some(c) = limits.policies.get(id) else {
                continue;
            };
            key.clear();
            match c.key.eval(&Val::Null, |_| request.clone()) {
                Ok(Val::TStr(s) | Val::BStr(s)) => key.extend_from_slice(&s),
                Ok(v) => fanout_expr::json::write(&v, &mut key),
                // A key that does not evaluate is counted under one key of its own.
                Err(e) => {
                    tracing::debug!(policy = %c.name, error = %e.0, "rate limit key failed");
                    key.extend_from_slice(b"\0key-error");
                }
            }
            let verdict = c.policy.decide(&key).await;
            if !verdict.decision.allowed {
                return Err(Refusal::RateLimited(Box::new(RateLimited {
                    policy: c.name.clone(),
                    sf_name: c.sf_name.clone(),
                    verdict,
                })));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(trusted: &[&str], header: ClientAddressHeader) -> RateLimits {
        RateLimits {
            trusted: trusted.iter().map(|t| parse_cidr(t).unwrap()).collect(),
            header,
            ..RateLimits::default()
        }
    }

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().uri("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn client(l: &RateLimits, peer: &str, headers: &[(&str, &str)]) -> String {
        let peer = SocketAddr::new(peer.parse().unwrap(), 4000);
        l.client_address(&parts(headers), Some(peer))
            .unwrap()
            .to_string()
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_proxies() {
        let x = ClientAddressHeader::XForwardedFor;
        let none = limits(&[], x);
        let xff = [("x-forwarded-for", "203.0.113.9")];
        assert_eq!(client(&none, "10.0.0.1", &xff), "10.0.0.1");
        let l = limits(&["10.0.0.0/8"], x);
        assert_eq!(client(&l, "10.0.0.1", &xff), "203.0.113.9");
        assert_eq!(client(&l, "192.0.2.1", &xff), "192.0.2.1", "untrusted peer");
        // right to left, skipping trusted hops; a spoofed left part is not reached
        let chain = [("x-forwarded-for", "1.1.1.1, 198.51.100.7, 10.1.1.1")];
        assert_eq!(client(&l, "10.0.0.1", &chain), "198.51.100.7");
        let two = [
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "10.2.2.2"),
        ];
        assert_eq!(client(&l, "10.0.0.1", &two), "1.1.1.1");
        // garbage ends the walk at the last trusted hop
        let bad = [("x-forwarded-for", "1.1.1.1, nonsense")];
        assert_eq!(client(&l, "10.0.0.1", &bad), "10.0.0.1");
    }

    #[test]
    fn forwarded_for_is_read_with_ports_quotes_and_v6() {
        let l = limits(&["10.0.0.0/8", "::1"], ClientAddressHeader::Forwarded);
        let h = [(
            "forwarded",
            "for=192.0.2.60;proto=http, for=\"[2001:db8:cafe::17]:4711\"",
        )];
        assert_eq!(client(&l, "10.0.0.1", &h), "2001:db8:cafe::17");
        let h = [("forwarded", "for=192.0.2.60:8080;by=10.0.0.1, for=10.9.9.9")];
        assert_eq!(client(&l, "::1", &h), "192.0.2.60");
        let h = [("forwarded", "for=unknown")];
        assert_eq!(client(&l, "10.0.0.1", &h), "10.0.0.1");
    }

    #[test]
    fn cidrs_match_by_prefix() {
        let n = parse_cidr("192.168.0.0/16").unwrap();
        assert!(in_net("192.168.4.5".parse().unwrap(), n));
        assert!(!in_net("192.169.0.1".parse().unwrap(), n));
        assert!(in_net("::ffff:192.168.0.1".parse().unwrap(), n));
        assert!(in_net(
            "8.8.8.8".parse().unwrap(),
            parse_cidr("0.0.0.0/0").unwrap()
        ));
        assert!(parse_cidr("10.0.0.0/33").is_none());
        assert!(parse_cidr("nope").is_none());
    }

    #[test]
    fn policy_names_are_structured_field_strings() {
        assert_eq!(sf_string("per-user"), "\"per-user\"");
        assert_eq!(sf_string("a\"b"), "\"a\\\"b\"");
    }
}
