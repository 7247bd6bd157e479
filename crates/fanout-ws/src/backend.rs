//! The backend side of a WebSocket: one of the backend's URLs dialled (TCP, TLS for `https://`
//! with the backend's CA and client certificate), the handshake sent as an HTTP/1.1 `Upgrade`
//! through hyper's client connection, the answer checked (101, `Sec-WebSocket-Accept` of our
//! key, a subprotocol the client offered, no extension) and the upgraded connection returned.

use bytes::Bytes;
use fanout_config::{Backend as BackendConfig, ConfigError, Defaults};
use http::header::{AUTHORIZATION, HOST, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::future::Future as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A byte stream to the backend: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One address of the backend.
#[derive(Debug)]
struct Base {
    host: String,
    port: u16,
    tls: bool,
    /// The URL's path (no trailing `/`), put before the path sent.
    path: String,
    /// `host[:port]` as the URL has it (the `Host` sent).
    authority: HeaderValue,
    /// The URL's userinfo as `Authorization: Basic`.
    basic: Option<HeaderValue>,
}

/// Why the backend's side could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// No connection (resolution, refusal, TLS, `connect_timeout`).
    #[error("connecting to {address} failed: {detail}")]
    Connect {
        /// `host:port`.
        address: String,
        /// What failed.
        detail: String,
    },
    /// The connection broke before the handshake's answer.
    #[error("the backend's connection broke during the handshake: {0}")]
    Broke(String),
    /// The backend answered with another status than 101.
    #[error("the backend answered the handshake with {0}")]
    Status(StatusCode),
    /// A 101 that is not a valid WebSocket answer.
    #[error("the backend's handshake answer is invalid: {0}")]
    Invalid(&'static str),
}

/// A WebSocket route's backend: its addresses (tried in turn, starting from the next one for
/// each connection), TLS settings, static headers and connect timeout.
pub struct Target {
    bases: Vec<Base>,
    next: AtomicUsize,
    tls: Option<tokio_rustls::TlsConnector>,
    headers: HeaderMap,
    connect_timeout: Duration,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("bases", &self.bases)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The backend `name` of config `cfg` (an `http1` backend): its URLs parsed, its CA and
    /// client certificate read when one URL is `https://`. No network I/O.
    pub fn new(
        name: &str,
        cfg: &BackendConfig,
        defaults: &Defaults,
    ) -> Result<Target, ConfigError> {
        let at = cfg
            .url
            .iter()
            .chain(cfg.urls.iter())
            .next()
            .map(|u| u.pos)
            .unwrap_or_default();
        let bad = |u: &str, why: &str| {
            ConfigError::at(
                at,
                format!(
                    "backend `{name}`: URL `{}` {why}",
                    fanout_config::shown_url(u)
                ),
            )
        };
        let mut bases = Vec::new();
        for u in cfg.url.iter().chain(cfg.urls.iter()) {
            let (scheme, rest) = u.value.split_once("://").unwrap_or(("http", &u.value));
            let tls = match scheme {
                "http" => false,
                "https" => true,
                _ => return Err(bad(&u.value, "is not http:// or https://")),
            };
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
                None => (rest, ""),
            };
            let (userinfo, authority) = match authority.rsplit_once('@') {
                Some((ui, a)) => (Some(ui), a),
                None => (None, authority),
            };
            let parsed: http::uri::Authority = authority
                .parse()
                .map_err(|_| bad(&u.value, "has no valid host"))?;
            let host = parsed
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = parsed.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let basic = userinfo.and_then(|ui| {
                use base64::Engine as _;
                let v = base64::engine::general_purpose::STANDARD.encode(ui.as_bytes());
                HeaderValue::from_str(&format!("Basic {v}")).ok()
            });
            bases.push(Base {
                host,
                port,
                tls,
                path: path.to_string(),
                authority: HeaderValue::from_str(authority)
                    .map_err(|_| bad(&u.value, "has no valid host"))?,
                basic,
            });
        }
        if bases.is_empty() {
            return Err(ConfigError::at(at, format!("backend `{name}` has no URL")));
        }
        let tls = if bases.iter().any(|b| b.tls) {
            let roots = fanout_protocol::tls::trusted_roots(name, cfg)?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| {
                    ConfigError::at(at, format!("backend `{name}`: TLS setup failed: {e}"))
                })?
                .with_root_certificates(roots);
            let mut c = match fanout_protocol::tls::client_identity(name, cfg)? {
                Some((chain, key)) => builder.with_client_auth_cert(chain, key).map_err(|e| {
                    ConfigError::at(
                        at,
                        format!("backend `{name}`: unusable client certificate: {e}"),
                    )
                })?,
                None => builder.with_no_client_auth(),
            };
            // The handshake is HTTP/1.1 whatever the backend speaks for other calls.
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(tokio_rustls::TlsConnector::from(Arc::new(c)))
        } else {
            None
        };
        let mut headers = HeaderMap::new();
        for (k, v) in &cfg.headers {
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                headers.insert(k, v);
            }
        }
        Ok(Target {
            bases,
            next: AtomicUsize::new(0),
            tls,
            headers,
            connect_timeout: cfg.connect_timeout.unwrap_or(defaults.connect_timeout).0,
        })
    }

    /// Send the handshake (`headers` ready but for `Host` and the backend's own headers) to
    /// `path` on the first address that takes a connection, and return the upgraded connection
    /// with the answer's head. `key` is the `Sec-WebSocket-Key` sent; `offered` the
    /// subprotocols the client offered.
    pub(crate) async fn open(
        &self,
        path: &PathAndQuery,
        mut headers: HeaderMap,
        key: &str,
        offered: &[String],
        preserve_host: bool,
    ) -> Result<(Upgraded, http::response::Parts), DialError> {
        let n = self.bases.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for i in 0..n {
            let Some(base) = self.bases.get((first + i) % n) else {
                continue;
            };
            let io = match self.connect(base).await {
                Ok(io) => io,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            for (k, v) in &self.headers {
                headers.insert(k.clone(), v.clone());
            }
            if let Some(b) = &base.basic
                && !headers.contains_key(AUTHORIZATION)
            {
                headers.insert(AUTHORIZATION, b.clone());
            }
            if !preserve_host || !headers.contains_key(HOST) {
                headers.insert(HOST, base.authority.clone());
            }
            let full = format!("{}{}", base.path, path.as_str());
            let path: PathAndQuery = full.parse().map_err(|_| DialError::Invalid("path"))?;
            return handshake(io, path, headers, key, offered).await;
        }
        Err(last.unwrap_or(DialError::Connect {
            address: String::new(),
            detail: "no address".into(),
        }))
    }

    async fn connect(&self, b: &Base) -> Result<Box<dyn Io>, DialError> {
        let fail = |detail: String| DialError::Connect {
            address: format!("{}:{}", b.host, b.port),
            detail,
        };
        let tcp = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((b.host.as_str(), b.port)),
        )
        .await
        .map_err(|_| {
            fail(format!(
                "no connection within connect_timeout ({} ms)",
                self.connect_timeout.as_millis()
            ))
        })?
        .map_err(|e| fail(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        if !b.tls {
            return Ok(Box::new(tcp));
        }
        let Some(tls) = &self.tls else {
            return Err(fail("no TLS settings".into()));
        };
        let name = rustls_pki_types::ServerName::try_from(b.host.clone())
            .map_err(|e| fail(e.to_string()))?;
        let s = tokio::time::timeout(self.connect_timeout, tls.connect(name, tcp))
            .await
            .map_err(|_| fail("TLS handshake not done within connect_timeout".into()))?
            .map_err(|e| fail(e.to_string()))?;
        Ok(Box::new(s))
    }
}

/// The handshake on a new connection: sent, its answer checked, the connection upgraded.
async fn handshake(
    io: Box<dyn Io>,
    path: PathAndQuery,
    headers: HeaderMap,
    key: &str,
    offered: &[String],
) -> Result<(Upgraded, http::response::Parts), DialError> {
    let broke = |e: hyper::Error| DialError::Broke(e.to_string());
    let (mut send, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(64 << 10)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(io))
        .await
        .map_err(broke)?;
    let mut conn = std::pin::pin!(conn.with_upgrades());
    let mut req = Request::new(Empty::new());
    *req.uri_mut() = http::Uri::from(path);
    *req.headers_mut() = headers;
    let mut sent = std::pin::pin!(send.send_request(req));
    // The answer's head, while the connection is driven: on a 101 the connection's future
    // ends (its socket handed to the upgrade) as it delivers the answer.
    let mut conn_done = false;
    let answered = std::future::poll_fn(|cx| {
        loop {
            if let std::task::Poll::Ready(r) = sent.as_mut().poll(cx) {
                return std::task::Poll::Ready(r.map_err(broke));
            }
            if conn_done {
                return std::task::Poll::Pending;
            }
            match conn.as_mut().poll(cx) {
                std::task::Poll::Ready(Ok(())) => conn_done = true,
                std::task::Poll::Ready(Err(e)) => {
                    return std::task::Poll::Ready(Err(DialError::Broke(e.to_string())));
                }
                std::task::Poll::Pending => return std::task::Poll::Pending,
            }
        }
    })
    .await;
    let mut resp: Response<Incoming> = answered?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(DialError::Status(resp.status()));
    }
    check_answer(resp.headers(), key, offered)?;
    let on = hyper::upgrade::on(&mut resp);
    if !conn_done {
        conn.as_mut().await.map_err(broke)?;
    }
    let upgraded = on.await.map_err(broke)?;
    let (parts, _) = resp.into_parts();
    Ok((upgraded, parts))
}

/// A 101 is a WebSocket answer to our key: `Upgrade: websocket`, the accept value of `key`, a
/// subprotocol among `offered` (or none), no extension (none was offered).
fn check_answer(h: &HeaderMap, key: &str, offered: &[String]) -> Result<(), DialError> {
    use http::header::{
        SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_PROTOCOL, UPGRADE,
    };
    let upgrade = h
        .get(UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !upgrade {
        return Err(DialError::Invalid("no `Upgrade: websocket`"));
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    if h.get(SEC_WEBSOCKET_ACCEPT).map(HeaderValue::as_bytes) != Some(accept.as_bytes()) {
        return Err(DialError::Invalid(
            "`Sec-WebSocket-Accept` does not match the key sent",
        ));
    }
    if h.contains_key(SEC_WEBSOCKET_EXTENSIONS) {
        return Err(DialError::Invalid("an extension that was not offered"));
    }
    if let Some(p) = h.get(SEC_WEBSOCKET_PROTOCOL) {
        let p = p.to_str().unwrap_or_default().trim();
        if !offered.iter().any(|o| o == p) {
            return Err(DialError::Invalid("a subprotocol the client did not offer"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_must_accept_our_key_and_a_protocol_offered() {
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        let mut h = HeaderMap::new();
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert(
            "sec-websocket-accept",
            HeaderValue::from_static("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        );
        assert!(check_answer(&h, key, &[]).is_ok());
        h.insert("sec-websocket-protocol", HeaderValue::from_static("chat"));
        assert!(check_answer(&h, key, &[]).is_err());
        assert!(check_answer(&h, key, &["chat".into()]).is_ok());
        assert!(check_answer(&h, "other", &["chat".into()]).is_err());
        h.insert(
            "sec-websocket-extensions",
            HeaderValue::from_static("permessage-deflate"),
        );
        assert!(check_answer(&h, key, &["chat".into()]).is_err());
    }
}
