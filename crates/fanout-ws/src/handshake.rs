//! The client's handshake: is it a WebSocket one (HTTP/1.1 `GET` + `Upgrade: websocket`, or
//! RFC 8441's extended `CONNECT` with `:protocol = websocket` over HTTP/2), may its `Origin`
//! open one, which subprotocols it offers; and the headers both ways — the client's with its
//! hop-by-hop fields out, forwarding fields in and a fresh key for the backend; the backend's
//! answer with its hop-by-hop fields out, the client's accept value in.

use crate::counters::Refused;
use fanout_pass::headers::{Forwarding, Hop, add_via, remove_hop_by_hop, request_headers};
use http::header::{
    CONNECTION, CONTENT_LENGTH, HOST, HeaderMap, HeaderValue, ORIGIN, SEC_WEBSOCKET_ACCEPT,
    SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION,
    TRANSFER_ENCODING, UPGRADE,
};
use http::{Method, StatusCode, Version};

/// How the client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// HTTP/1.1 `Upgrade`, with its `Sec-WebSocket-Key`.
    Upgrade {
        /// The client's key (its accept value goes in the 101).
        key: HeaderValue,
    },
    /// HTTP/2 extended CONNECT (RFC 8441).
    Connect,
}

/// Why a handshake is not one this route takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Not a WebSocket handshake at all: 426.
    #[error("this route speaks WebSocket: send a WebSocket handshake (`Upgrade: websocket`)")]
    NotWebSocket,
    /// A WebSocket handshake with a part missing or wrong: 400.
    #[error("{0}")]
    Bad(&'static str),
    /// `Origin` not allowed: 403.
    #[error("origin `{0}` may not open a WebSocket on this route (websocket.origins)")]
    Origin(String),
}

impl HandshakeError {
    /// The reason it is counted under.
    pub fn reason(&self) -> Refused {
        match self {
            HandshakeError::NotWebSocket => Refused::NotWebSocket,
            HandshakeError::Bad(_) => Refused::BadHandshake,
            HandshakeError::Origin(_) => Refused::Origin,
        }
    }
}

fn has_token(h: &HeaderMap, name: &http::HeaderName, token: &str) -> bool {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Whether `parts` is an HTTP/2 extended CONNECT for a WebSocket (RFC 8441): routed to the
/// path's GET route.
pub fn extended_connect(parts: &http::request::Parts) -> bool {
    parts.method == Method::CONNECT
        && parts
            .extensions
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// Whether `parts` is a WebSocket handshake, and how it asked.
pub fn asked(parts: &http::request::Parts) -> Result<Asked, HandshakeError> {
    let h = &parts.headers;
    let version_ok = || {
        h.get(SEC_WEBSOCKET_VERSION)
            .is_some_and(|v| v.as_bytes() == b"13")
    };
    if parts.method == Method::CONNECT {
        let ws = parts
            .extensions
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"));
        if !ws {
            return Err(HandshakeError::NotWebSocket);
        }
        if !version_ok() {
            return Err(HandshakeError::Bad("`Sec-WebSocket-Version` must be 13"));
        }
        return Ok(Asked::Connect);
    }
    if parts.method != Method::GET || !has_token(h, &UPGRADE, "websocket") {
        return Err(HandshakeError::NotWebSocket);
    }
    if parts.version != Version::HTTP_11 {
        return Err(HandshakeError::Bad("a WebSocket upgrade needs HTTP/1.1"));
    }
    if !has_token(h, &CONNECTION, "upgrade") {
        return Err(HandshakeError::Bad("`Connection` must name `Upgrade`"));
    }
    if !version_ok() {
        return Err(HandshakeError::Bad("`Sec-WebSocket-Version` must be 13"));
    }
    let key = h
        .get(SEC_WEBSOCKET_KEY)
        .filter(|k| valid_key(k.as_bytes()))
        .ok_or(HandshakeError::Bad(
            "`Sec-WebSocket-Key` must be 16 bytes in base64",
        ))?;
    Ok(Asked::Upgrade { key: key.clone() })
}

/// 24 characters of base64 ending in `==` (16 bytes).
fn valid_key(k: &[u8]) -> bool {
    k.len() == 24
        && k.ends_with(b"==")
        && k[..22]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
}

/// Which origins may open a WebSocket (`websocket.origins`).
#[derive(Debug, Clone)]
pub enum Origins {
    /// `*`: any.
    Any,
    /// These (lower-case `scheme://host[:port]`); none listed: only the gateway's own.
    Listed(Vec<String>),
}

impl Origins {
    /// From the config's list.
    pub fn new(list: &[String]) -> Origins {
        if list.iter().any(|o| o == "*") {
            return Origins::Any;
        }
        Origins::Listed(
            list.iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
        )
    }

    /// Whether the handshake may go on: no `Origin` (not a browser), an `Origin` listed, or,
    /// with none listed, one whose host is the request's own (`host`: `Host` or the HTTP/2
    /// authority).
    pub fn check(&self, h: &HeaderMap, host: Option<&HeaderValue>) -> Result<(), HandshakeError> {
        let Some(origin) = h.get(ORIGIN) else {
            return Ok(());
        };
        let text = origin.to_str().unwrap_or_default().to_ascii_lowercase();
        let ok = match self {
            Origins::Any => true,
            Origins::Listed(l) if !l.is_empty() => l.contains(&text),
            Origins::Listed(_) => {
                let own = text.split_once("://").map(|(_, a)| a);
                let host = host.and_then(|h| h.to_str().ok());
                matches!((own, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
            }
        };
        if ok {
            Ok(())
        } else {
            Err(HandshakeError::Origin(
                String::from_utf8_lossy(origin.as_bytes())
                    .chars()
                    .take(200)
                    .collect(),
            ))
        }
    }
}

/// The subprotocols the client offers (`Sec-WebSocket-Protocol`, comma-separated, in order).
pub fn offered(h: &HeaderMap) -> Vec<String> {
    h.get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The handshake's headers for the backend: the client's with the hop-by-hop fields and
/// `Expect` out (pass-through rules, `fanout_pass::headers`), the forwarding fields in, the
/// WebSocket fields of this hop (`Sec-WebSocket-Key` = `key`, version 13, no extension — the
/// relay's codec has none) and the subprotocols offered kept.
pub fn backend_headers(
    client: &HeaderMap,
    f: Forwarding,
    hop: Hop<'_>,
    preserve_host: bool,
    key: &str,
) -> HeaderMap {
    let mut h = client.clone();
    let protocols: Vec<HeaderValue> = h.get_all(SEC_WEBSOCKET_PROTOCOL).iter().cloned().collect();
    // An HTTP/1.1 hop: the client's version is said in `Via`.
    request_headers(&mut h, f, hop, preserve_host);
    for n in [
        SEC_WEBSOCKET_KEY,
        SEC_WEBSOCKET_EXTENSIONS,
        SEC_WEBSOCKET_VERSION,
        SEC_WEBSOCKET_ACCEPT,
        SEC_WEBSOCKET_PROTOCOL,
        CONTENT_LENGTH,
    ] {
        h.remove(n);
    }
    for p in protocols {
        h.append(SEC_WEBSOCKET_PROTOCOL, p);
    }
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    if let Ok(k) = HeaderValue::from_str(key) {
        h.insert(SEC_WEBSOCKET_KEY, k);
    }
    if !preserve_host {
        h.remove(HOST);
    }
    h
}

/// The answer's head for the client from the backend's 101: its fields but the hop-by-hop
/// ones and the backend's accept value; `Via` as configured; for an HTTP/1.1 client 101 with
/// `Upgrade`, `Connection` and the accept value of its key, for HTTP/2 200.
pub fn client_answer(backend: &HeaderMap, asked: &Asked, via: bool) -> http::Response<()> {
    let mut h = backend.clone();
    remove_hop_by_hop(&mut h);
    for n in [
        SEC_WEBSOCKET_ACCEPT,
        SEC_WEBSOCKET_EXTENSIONS,
        CONTENT_LENGTH,
        TRANSFER_ENCODING,
    ] {
        h.remove(n);
    }
    if via {
        add_via(&mut h, Version::HTTP_11);
    }
    let status = match asked {
        Asked::Upgrade { key } => {
            let accept =
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
            if let Ok(a) = HeaderValue::from_str(&accept) {
                h.insert(SEC_WEBSOCKET_ACCEPT, a);
            }
            h.insert(UPGRADE, HeaderValue::from_static("websocket"));
            h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
            StatusCode::SWITCHING_PROTOCOLS
        }
        Asked::Connect => StatusCode::OK,
    };
    let mut resp = http::Response::new(());
    *resp.status_mut() = status;
    *resp.headers_mut() = h;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method(method).uri("/ws");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    const OK: [(&str, &str); 4] = [
        ("upgrade", "websocket"),
        ("connection", "keep-alive, Upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];

    #[test]
    fn a_handshake_needs_every_part() {
        assert!(matches!(
            asked(&parts("GET", &OK)),
            Ok(Asked::Upgrade { .. })
        ));
        assert_eq!(asked(&parts("GET", &[])), Err(HandshakeError::NotWebSocket));
        assert_eq!(
            asked(&parts("POST", &OK)),
            Err(HandshakeError::NotWebSocket)
        );
        for skip in 1..4 {
            let h: Vec<_> = OK
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, h)| *h)
                .collect();
            assert!(matches!(
                asked(&parts("GET", &h)),
                Err(HandshakeError::Bad(_))
            ));
        }
        let mut bad_key = OK;
        bad_key[3] = ("sec-websocket-key", "short");
        assert!(matches!(
            asked(&parts("GET", &bad_key)),
            Err(HandshakeError::Bad(_))
        ));
    }

    #[test]
    fn origins_listed_any_or_own() {
        let host = HeaderValue::from_static("gw.example:8080");
        let h = |o: &str| {
            let mut h = HeaderMap::new();
            h.insert(ORIGIN, HeaderValue::from_str(o).unwrap());
            h
        };
        let own = Origins::new(&[]);
        assert!(own.check(&HeaderMap::new(), Some(&host)).is_ok());
        assert!(
            own.check(&h("https://gw.example:8080"), Some(&host))
                .is_ok()
        );
        assert!(own.check(&h("https://evil.example"), Some(&host)).is_err());
        let listed = Origins::new(&["https://App.example/".into()]);
        assert!(listed.check(&h("https://app.example"), Some(&host)).is_ok());
        assert!(
            listed
                .check(&h("https://gw.example:8080"), Some(&host))
                .is_err()
        );
        assert!(Origins::new(&["*".into()]).check(&h("null"), None).is_ok());
    }

    #[test]
    fn the_backend_gets_its_own_key_and_the_offered_protocols() {
        let mut client = HeaderMap::new();
        for (k, v) in OK {
            client.insert(k, HeaderValue::from_static(v));
        }
        client.insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("chat, superchat"),
        );
        client.insert(
            "sec-websocket-extensions",
            HeaderValue::from_static("permessage-deflate"),
        );
        client.insert("connection", HeaderValue::from_static("Upgrade, x-secret"));
        client.insert("x-secret", HeaderValue::from_static("1"));
        client.insert("host", HeaderValue::from_static("gw"));
        let hop = Hop {
            peer: Some([10, 0, 0, 1].into()),
            trusted: false,
            tls: false,
            host: client.get("host"),
            version: Version::HTTP_11,
        };
        let f = Forwarding {
            x_forwarded: true,
            forwarded: false,
            via: true,
        };
        let h = backend_headers(&client, f, hop, false, "AQIDBAUGBwgJCgsMDQ4PEA==");
        assert_eq!(h["sec-websocket-key"], "AQIDBAUGBwgJCgsMDQ4PEA==");
        assert_eq!(h["sec-websocket-protocol"], "chat, superchat");
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "Upgrade");
        assert!(!h.contains_key("sec-websocket-extensions"));
        assert!(!h.contains_key("x-secret"));
        assert!(!h.contains_key("host"));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        assert_eq!(h["x-forwarded-host"], "gw");
    }
}
