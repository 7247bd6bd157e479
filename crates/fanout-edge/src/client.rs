//! The client's address as the stages see it (`$request.client.address`): the socket's peer,
//! or — only when that peer is one of `server.trusted_proxies` — the address the proxies put in
//! `X-Forwarded-For` / `Forwarded` (`server.client_address_header`), read right to left,
//! skipping trusted hops. And the CIDR blocks every address list is written in.

use fanout_config::{ClientAddressHeader, Config, ConfigError, ConfigErrors};
use http::HeaderMap;
use http::request::Parts;
use std::net::{IpAddr, SocketAddr};

/// A CIDR block (`10.0.0.0/8`, `2001:db8::/32`) or one address (`/32`, `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `text` as a block or one address; `None` when it is neither.
    pub fn parse(text: &str) -> Option<Cidr> {
        let (ip, bits) = match text.trim().split_once('/') {
            Some((ip, bits)) => (ip.parse::<IpAddr>().ok()?, Some(bits.parse::<u8>().ok()?)),
            None => (text.trim().parse::<IpAddr>().ok()?, None),
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        (bits <= max).then_some(Cidr {
            net: ip.to_canonical(),
            bits,
        })
    }

    /// Whether `ip` is in the block (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (ip.to_canonical(), self.net) {
            (IpAddr::V4(a), IpAddr::V4(n)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(a) & mask == u32::from(n) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(n)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(n) & mask
            }
            _ => false,
        }
    }

    /// The prefix length.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// The network address.
    pub fn net(&self) -> IpAddr {
        self.net
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.bits)
    }
}

/// `server.trusted_proxies` and `server.client_address_header`, read.
#[derive(Debug, Clone, Default)]
pub struct ClientAddresses {
    trusted: Vec<Cidr>,
    header: ClientAddressHeader,
    warnings: Vec<ConfigError>,
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

impl ClientAddresses {
    /// The config's trusted proxies; one that is not an address or CIDR is an error at its
    /// place.
    pub fn new(cfg: &Config) -> Result<ClientAddresses, ConfigErrors> {
        let mut errs = Vec::new();
        let mut trusted = Vec::new();
        for (i, t) in cfg.server.trusted_proxies.iter().enumerate() {
            match Cidr::parse(t) {
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
        if !errs.is_empty() {
            return Err(ConfigErrors(errs));
        }
        let mut warnings = Vec::new();
        for (i, c) in trusted.iter().enumerate() {
            if c.bits() == 0 {
                warnings.push(
                    ConfigError::at_path(
                        format!("server.trusted_proxies[{i}]"),
                        format!(
                            "warning: server.trusted_proxies has `{c}`, which trusts every address: any client can choose its own address (and rate-limit key) with the forwarding header"
                        ),
                    )
                    .hint("list only your load balancers' addresses or ranges"),
                );
            }
        }
        fanout_config::locate(&mut warnings, &cfg.source);
        for w in &mut warnings {
            w.file = cfg.file.clone();
        }
        Ok(ClientAddresses {
            trusted,
            header: cfg.server.client_address_header,
            warnings,
        })
    }

    /// What `server.trusted_proxies` may not mean (a `/0` block trusts every address).
    pub fn warnings(&self) -> &[ConfigError] {
        &self.warnings
    }

    /// The trusted proxies.
    pub fn trusted(&self) -> &[Cidr] {
        &self.trusted
    }

    /// Whether `ip` is a trusted proxy.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// Whether the socket's peer `peer` is one of `server.trusted_proxies` (the forwarding
    /// headers it sends are believed; a pass-through route appends to them).
    pub fn trusts_peer(&self, peer: Option<SocketAddr>) -> bool {
        peer.is_some_and(|p| self.trusts(p.ip().to_canonical()))
    }

    /// The client's address: the peer's (`None` when unknown), or when the peer is a trusted
    /// proxy, the first hop from the right of the forwarding header that is not trusted (a hop
    /// that does not parse ends the walk at the last trusted one).
    pub fn resolve(&self, parts: &Parts, peer: Option<SocketAddr>) -> Option<IpAddr> {
        self.resolve_headers(&parts.headers, peer)
    }

    /// [`ClientAddresses::resolve`] from the request's headers alone.
    pub fn resolve_headers(&self, headers: &HeaderMap, peer: Option<SocketAddr>) -> Option<IpAddr> {
        let peer = peer?.ip().to_canonical();
        if self.trusted.is_empty() || !self.trusts(peer) {
            return Some(peer);
        }
        let mut hops: Vec<&str> = Vec::new();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(trusted: &[&str], header: ClientAddressHeader) -> ClientAddresses {
        ClientAddresses {
            trusted: trusted.iter().map(|t| Cidr::parse(t).unwrap()).collect(),
            header,
            warnings: Vec::new(),
        }
    }

    fn client(l: &ClientAddresses, peer: &str, headers: &[(&str, &str)]) -> String {
        let mut b = http::Request::builder().uri("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let parts = b.body(()).unwrap().into_parts().0;
        let peer = SocketAddr::new(peer.parse().unwrap(), 4000);
        l.resolve(&parts, Some(peer)).unwrap().to_string()
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_proxies() {
        let x = ClientAddressHeader::XForwardedFor;
        let none = addresses(&[], x);
        let xff = [("x-forwarded-for", "203.0.113.9")];
        assert_eq!(client(&none, "10.0.0.1", &xff), "10.0.0.1");
        let l = addresses(&["10.0.0.0/8"], x);
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
        let l = addresses(&["10.0.0.0/8", "::1"], ClientAddressHeader::Forwarded);
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
    fn blocks_contain_their_addresses_and_mapped_ones() {
        let b = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(b.contains("10.1.200.3".parse().unwrap()));
        assert!(!b.contains("10.2.0.1".parse().unwrap()));
        assert!(b.contains("::ffff:10.1.0.9".parse().unwrap()));
        let one = Cidr::parse("2001:db8::1").unwrap();
        assert_eq!(one.bits(), 128);
        assert!(one.contains("2001:db8::1".parse().unwrap()));
        assert!(!one.contains("2001:db8::2".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert_eq!(Cidr::parse("10.0.0.0/33"), None);
        assert_eq!(Cidr::parse("example.com"), None);
    }
}
