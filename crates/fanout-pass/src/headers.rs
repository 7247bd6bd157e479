//! The headers of a pass-through exchange: hop-by-hop fields removed both ways (RFC 9110
//! §7.6.1), the forwarding fields added to the request (`X-Forwarded-*`, `Forwarded`, `Via`)
//! and `Via` to the answer (§7.6.3).

use http::header::{
    CONNECTION, EXPECT, FORWARDED, HOST, HeaderName, HeaderValue, TE, TRANSFER_ENCODING, UPGRADE,
    VIA,
};
use http::{HeaderMap, Version};
use std::net::IpAddr;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Remove the hop-by-hop fields of `h`: every field named in `Connection`, then `Connection`,
/// `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, and `TE` except its
/// `trailers` (kept as `TE: trailers`: gRPC servers need it).
pub fn remove_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    let trailers = h
        .get_all(TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("trailers"))
        });
    for n in named {
        // `Connection: close` names no field, and a field a proxy must never drop is not one
        // a client may name away.
        if n != HOST {
            h.remove(n);
        }
    }
    for n in [
        CONNECTION,
        KEEP_ALIVE,
        PROXY_CONNECTION,
        TRANSFER_ENCODING,
        UPGRADE,
        TE,
    ] {
        h.remove(n);
    }
    if trailers {
        h.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// Which forwarding fields a route adds (`pass.forwarded`).
#[derive(Debug, Clone, Copy)]
pub struct Forwarding {
    /// `X-Forwarded-For`, `-Proto`, `-Host`.
    pub x_forwarded: bool,
    /// RFC 7239 `Forwarded`.
    pub forwarded: bool,
    /// `Via`.
    pub via: bool,
}

/// What the gateway knows of the hop the request came over.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    /// The socket's peer (`None` when unknown).
    pub peer: Option<IpAddr>,
    /// The peer is one of `server.trusted_proxies`: the forwarding fields it sent are kept and
    /// ours appended; from any other peer they are replaced.
    pub trusted: bool,
    /// The request came over TLS.
    pub tls: bool,
    /// The host the client asked for (`Host`, or the HTTP/2 authority).
    pub host: Option<&'a HeaderValue>,
    /// The request's HTTP version.
    pub version: Version,
}

/// Append `Via: VERSION fanout` to `h` for a message that came in `version`.
pub fn add_via(h: &mut HeaderMap, version: Version) {
    let v = match version {
        Version::HTTP_10 => "1.0 fanout",
        Version::HTTP_2 => "2 fanout",
        Version::HTTP_3 => "3 fanout",
        Version::HTTP_09 => "0.9 fanout",
        _ => "1.1 fanout",
    };
    h.append(VIA, HeaderValue::from_static(v));
}

/// The request's headers made ready for the backend: hop-by-hop fields and `Expect` (the
/// gateway answers it itself) removed, `Host` removed unless `preserve_host`, the forwarding
/// fields added as `f` says.
pub fn request_headers(h: &mut HeaderMap, f: Forwarding, hop: Hop<'_>, preserve_host: bool) {
    remove_hop_by_hop(h);
    h.remove(EXPECT);
    if !preserve_host {
        h.remove(HOST);
    }
    let proto = if hop.tls { "https" } else { "http" };
    if f.x_forwarded {
        let chain = if hop.trusted {
            joined(h, &X_FORWARDED_FOR)
        } else {
            None
        };
        let ours = hop.peer.map(|ip| ip.to_string());
        let value = match (chain, ours) {
            (Some(c), Some(p)) => Some(format!("{c}, {p}")),
            (Some(c), None) => Some(c),
            (None, p) => p,
        };
        set(h, X_FORWARDED_FOR, value);
        if !(hop.trusted && h.contains_key(&X_FORWARDED_PROTO)) {
            h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
        }
        if !(hop.trusted && h.contains_key(&X_FORWARDED_HOST)) {
            match hop.host {
                Some(host) => {
                    h.insert(X_FORWARDED_HOST, host.clone());
                }
                None => {
                    h.remove(&X_FORWARDED_HOST);
                }
            }
        }
    }
    if f.forwarded {
        let chain = if hop.trusted {
            joined(h, &FORWARDED)
        } else {
            None
        };
        let mut ours = String::new();
        if let Some(ip) = hop.peer {
            match ip {
                IpAddr::V4(v4) => ours.push_str(&format!("for={v4}")),
                IpAddr::V6(v6) => ours.push_str(&format!("for=\"[{v6}]\"")),
            }
            ours.push(';');
        }
        ours.push_str("proto=");
        ours.push_str(proto);
        if let Some(host) = hop.host.and_then(|v| v.to_str().ok()) {
            // A token or a quoted string (RFC 7239 §4): quoted, with `"` and `\` escaped.
            let quoted = host.replace('\\', "\\\\").replace('"', "\\\"");
            ours.push_str(&format!(";host=\"{quoted}\""));
        }
        let value = match chain {
            Some(c) => format!("{c}, {ours}"),
            None => ours,
        };
        set(h, FORWARDED, Some(value));
    }
    if f.via {
        add_via(h, hop.version);
    }
}

/// The answer's headers made ready for the client: hop-by-hop fields removed, `Via` added.
pub fn answer_headers(h: &mut HeaderMap, f: Forwarding, version: Version) {
    remove_hop_by_hop(h);
    // `TE` is a request field; an answer never carries one.
    h.remove(TE);
    if f.via {
        add_via(h, version);
    }
}

/// Every value of `name`, joined with `, ` (`None` when there is none or one is not text).
fn joined(h: &HeaderMap, name: &HeaderName) -> Option<String> {
    let mut out = String::new();
    for v in h.get_all(name) {
        let t = v.to_str().ok()?;
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(t);
    }
    (!out.is_empty()).then_some(out)
}

/// `name` set to `value` alone (removed when `None` or when the value is not a valid field).
fn set(h: &mut HeaderMap, name: HeaderName, value: Option<String>) {
    match value.and_then(|v| HeaderValue::from_str(&v).ok()) {
        Some(v) => {
            h.insert(name, v);
        }
        None => {
            h.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_fields_go_and_every_field_named_in_connection_with_them() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret-Hop"),
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("te", "trailers, deflate;q=0.5"),
            ("x-secret-hop", "1"),
            ("x-kept", "yes"),
            ("trailer", "x-checksum"),
        ]);
        remove_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["te", "trailer", "x-kept"]);
        assert_eq!(h["te"], "trailers");
        let mut h = map(&[("te", "gzip")]);
        remove_hop_by_hop(&mut h);
        assert!(h.is_empty());
        let mut h = map(&[("connection", "host"), ("host", "a.example")]);
        remove_hop_by_hop(&mut h);
        assert_eq!(h["host"], "a.example", "Host is never named away");
    }

    fn hop(trusted: bool, host: Option<&HeaderValue>) -> Hop<'_> {
        Hop {
            peer: Some("10.0.0.7".parse().unwrap()),
            trusted,
            tls: false,
            host,
            version: Version::HTTP_11,
        }
    }

    const ALL: Forwarding = Forwarding {
        x_forwarded: true,
        forwarded: true,
        via: true,
    };

    #[test]
    fn forwarding_fields_are_appended_for_trusted_proxies_and_replaced_for_others() {
        let host = HeaderValue::from_static("shop.example");
        let sent = [
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "spoof.example"),
            ("forwarded", "for=203.0.113.9"),
            ("expect", "100-continue"),
            ("host", "shop.example"),
        ];
        let mut h = map(&sent);
        request_headers(&mut h, ALL, hop(true, Some(&host)), false);
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.0.0.7");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "spoof.example");
        assert_eq!(
            h["forwarded"],
            "for=203.0.113.9, for=10.0.0.7;proto=http;host=\"shop.example\""
        );
        assert_eq!(h["via"], "1.1 fanout");
        assert!(!h.contains_key("expect") && !h.contains_key("host"));

        let mut h = map(&sent);
        request_headers(&mut h, ALL, hop(false, Some(&host)), true);
        assert_eq!(h["x-forwarded-for"], "10.0.0.7");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "shop.example");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.7;proto=http;host=\"shop.example\""
        );
        assert_eq!(h["host"], "shop.example", "preserve_host");

        let none = Forwarding {
            x_forwarded: false,
            forwarded: false,
            via: false,
        };
        let mut h = map(&sent);
        request_headers(&mut h, none, hop(false, Some(&host)), false);
        assert_eq!(h["x-forwarded-for"], "203.0.113.9", "not ours to touch");
        assert!(!h.contains_key("via"));
    }

    #[test]
    fn the_answer_loses_its_hop_by_hop_fields_and_gains_via() {
        let mut h = map(&[
            ("connection", "x-backend-hop"),
            ("x-backend-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("content-type", "image/png"),
            ("via", "1.1 cdn"),
        ]);
        answer_headers(&mut h, ALL, Version::HTTP_2);
        let via: Vec<_> = h.get_all("via").iter().collect();
        assert_eq!(via, ["1.1 cdn", "2 fanout"]);
        assert!(!h.contains_key("x-backend-hop") && !h.contains_key("transfer-encoding"));
        assert_eq!(h["content-type"], "image/png");
    }
}
