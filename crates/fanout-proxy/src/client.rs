//! The outbound HTTP client: one pooled hyper client per backend (HTTP/1.1 keep-alive or HTTP/2,
//! TLS via rustls), round robin over the backend's addresses. Implements [`Backend`].

use bytes::Bytes;
use fanout_config::{Backend as BackendConfig, ConfigError, Defaults, Protocol};
use fanout_flow::{Backend, CallError, CallErrorKind, CallRequest, CallResponse};
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

struct Base {
    /// `scheme://authority`
    origin: String,
    /// Base path without trailing `/` (may be empty).
    path: String,
}

/// An HTTP backend.
pub struct HttpBackend {
    name: String,
    bases: Vec<Base>,
    next: AtomicUsize,
    client: HttpClient,
    headers: HeaderMap,
    max_response_bytes: usize,
    passthrough: bool,
}

impl HttpBackend {
    /// Build the client for a backend from its config. Reads the CA file if one is configured;
    /// does no network I/O.
    pub fn new(
        name: &str,
        cfg: &BackendConfig,
        defaults: &Defaults,
    ) -> Result<HttpBackend, ConfigError> {
        let mut bases = Vec::new();
        for u in cfg.url.iter().chain(cfg.urls.iter()) {
            let (scheme, rest) = u.value.split_once("://").unwrap_or(("http", &u.value));
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
                None => (rest, ""),
            };
            bases.push(Base {
                origin: format!("{scheme}://{authority}"),
                path: path.to_string(),
            });
        }
        let mut headers = HeaderMap::new();
        for (k, v) in &cfg.headers {
            let hn = HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                ConfigError::at(
                    Default::default(),
                    format!("backend `{name}`: invalid header name `{k}`"),
                )
            })?;
            let hv = HeaderValue::from_str(v).map_err(|_| {
                ConfigError::at(
                    Default::default(),
                    format!("backend `{name}`: invalid value for header `{k}`"),
                )
            })?;
            headers.insert(hn, hv);
        }

        let mut roots = rustls::RootCertStore::empty();
        match &cfg.tls.ca_file {
            Some(path) => {
                use rustls_pki_types::{CertificateDer, pem::PemObject};
                let certs = CertificateDer::pem_file_iter(&path.value).map_err(|e| {
                    ConfigError::at(
                        path.pos,
                        format!(
                            "backend `{name}`: cannot read CA file `{}`: {e}",
                            path.value
                        ),
                    )
                })?;
                for c in certs {
                    let c = c.map_err(|e| {
                        ConfigError::at(
                            path.pos,
                            format!("backend `{name}`: bad certificate in `{}`: {e}", path.value),
                        )
                    })?;
                    roots.add(c).map_err(|e| {
                        ConfigError::at(
                            path.pos,
                            format!(
                                "backend `{name}`: unusable certificate in `{}`: {e}",
                                path.value
                            ),
                        )
                    })?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| {
                ConfigError::at(
                    Default::default(),
                    format!("backend `{name}`: TLS setup failed: {e}"),
                )
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();

        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(
            cfg.connect_timeout.unwrap_or(defaults.connect_timeout).0,
        ));
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let connector = match cfg.protocol {
            Protocol::Http1 => builder.enable_http1().wrap_connector(http),
            Protocol::Http2 => builder.enable_http2().wrap_connector(http),
        };
        let mut cb = Client::builder(TokioExecutor::new());
        cb.pool_idle_timeout(cfg.pool_idle_timeout.0)
            .pool_max_idle_per_host(cfg.pool_max_idle)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new());
        if cfg.protocol == Protocol::Http2 {
            cb.http2_only(true);
        }
        Ok(HttpBackend {
            name: name.to_string(),
            bases,
            next: AtomicUsize::new(0),
            client: cb.build(connector),
            headers,
            max_response_bytes: cfg.max_response_bytes,
            passthrough: cfg.status_passthrough,
        })
    }
}

fn classify(e: &hyper_util::client::legacy::Error) -> CallErrorKind {
    if e.is_connect() {
        CallErrorKind::Connect
    } else {
        CallErrorKind::Reset
    }
}

fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

impl Backend for HttpBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn status_passthrough(&self) -> bool {
        self.passthrough
    }

    fn call(&self, req: CallRequest) -> BoxFuture<'static, Result<CallResponse, CallError>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len().max(1);
        let uri = match self.bases.get(i) {
            Some(b) => format!("{}{}{}", b.origin, b.path, req.path_and_query),
            None => String::new(),
        };
        let mut builder = Request::builder().method(req.method).uri(&uri);
        if let Some(h) = builder.headers_mut() {
            for (k, v) in &self.headers {
                h.insert(k.clone(), v.clone());
            }
            h.extend(req.headers);
        }
        let request = builder.body(Full::new(req.body));
        let client = self.client.clone();
        let limit = self.max_response_bytes;
        Box::pin(async move {
            let request = request.map_err(|e| {
                CallError::new(
                    CallErrorKind::Connect,
                    format!("invalid request to `{uri}`: {e}"),
                )
            })?;
            let resp = client
                .request(request)
                .await
                .map_err(|e| CallError::new(classify(&e), describe(&e)))?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        CallError::new(
                            CallErrorKind::BodyTooLarge,
                            format!("answer larger than max_response_bytes ({limit})"),
                        )
                    } else {
                        CallError::new(
                            CallErrorKind::Reset,
                            format!("reading the answer failed: {}", describe(&*e)),
                        )
                    }
                })?
                .to_bytes();
            Ok(CallResponse {
                status: parts.status,
                body,
            })
        })
    }
}
