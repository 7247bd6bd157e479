//! The authentication stage (docs/config.md#auth--authentication): the route's policy
//! (`fanout_auth::Policy`, from its `auth` or `defaults.auth`) decides — the request's token is
//! read and verified by `fanout-auth`, and its verified claims become `$request.auth` (`null`
//! when the route has no policy or the request is anonymous on an optional route). Each request
//! is authenticated on its own, before it may join a coalesced run; what a flow reads of
//! `$request.auth` is part of the coalescing key, as of any backend call that carries it.
//! Refusals: 401 `unauthenticated` / `invalid_token`, 403 `forbidden`, 503 `auth_unavailable`,
//! with `WWW-Authenticate` (RFC 6750) and the reason in the log only.

use crate::metrics::{MetricType, Out, Value};
use crate::{BuildCx, EdgeStage, Registration, Rejection, RequestHead, RouteKind, Step};
use fanout_auth::{Auth, Denied, Fetch, FetchError, FetchFuture, Fetched};
use fanout_config::ConfigErrors;
use fanout_layers::backend::{Backend, Call, CallRequest, HttpCall};
use futures_util::future::BoxFuture;
use http::{HeaderValue, StatusCode};
use std::sync::Arc;

/// The stage's line in the registry. Its config is `auth:` and each route's `auth`.
pub const STAGE: Registration = Registration {
    name: "auth",
    section: false,
    codes: &[
        "unauthenticated",
        "invalid_token",
        "forbidden",
        "auth_unavailable",
    ],
    build,
    schema: None,
};

/// The providers, their keys and each route's policy, for one loaded config.
struct AuthStage {
    auth: Auth,
    /// What `fanout explain` says of each route (`None`: nothing, a config without providers).
    explained: Vec<Option<String>>,
}

fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let prev = cx.prev.and_then(|p| p.as_any().downcast_ref::<AuthStage>());
    // One HTTPS client for the key URLs on the web; a `backend://NAME/path` URL goes through
    // backend NAME's stack (its TLS roots and client certificate, timeouts, breaker, metrics).
    let mut web: Option<Arc<dyn Fetch>> = None;
    let fetch_for = |url: &str| -> Result<Arc<dyn Fetch>, FetchError> {
        if let Some(rest) = url.strip_prefix(fanout_auth::BACKEND_SCHEME) {
            let (name, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let backend = cx.backends.get(name).ok_or_else(|| {
                FetchError::BadUrl(format!(
                    "`{url}` names backend `{name}`, which is not in `backends:`"
                ))
            })?;
            let path = if path.is_empty() { "/" } else { path };
            let path_and_query = http::uri::PathAndQuery::try_from(path)
                .map_err(|e| FetchError::BadUrl(format!("`{url}`: {e}")))?;
            return Ok(Arc::new(BackendFetch {
                backend: backend.clone(),
                path_and_query,
            }));
        }
        match &web {
            Some(f) => Ok(f.clone()),
            None => {
                let f: Arc<dyn Fetch> = Arc::new(fanout_auth::HttpFetch::new()?);
                web = Some(f.clone());
                Ok(f)
            }
        }
    };
    // A cache fetched through a backend is kept only with its backend's stack.
    let may_keep = |url: &str| match url.strip_prefix(fanout_auth::BACKEND_SCHEME) {
        Some(rest) => {
            let name = rest.split('/').next().unwrap_or_default();
            cx.kept_backends.iter().any(|k| k == name)
        }
        None => true,
    };
    let auth = Auth::build_with(cx.config, prev.map(|p| &p.auth), fetch_for, may_keep)
        .map_err(ConfigErrors)?;
    let explained = cx
        .config
        .routes
        .iter()
        .map(|r| explain_route(cx.config, r))
        .collect();
    Ok(Some(Arc::new(AuthStage { auth, explained })))
}

/// A JWK set fetched through a backend of the config (`jwks_url: backend://NAME/path`): a GET
/// of `path` through the backend's whole stack, so its TLS (a private CA, a client certificate),
/// timeouts, retries, breaker and call metrics apply as to any call. The backend's own answer
/// limit applies, then `refresh.max_bytes`; `Cache-Control` is not read (the refresh schedule
/// decides).
struct BackendFetch {
    backend: Arc<dyn Backend>,
    path_and_query: http::uri::PathAndQuery,
}

impl Fetch for BackendFetch {
    fn fetch(&self, _url: &str, timeout: std::time::Duration, max_bytes: usize) -> FetchFuture {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        );
        let req = CallRequest {
            call: Call::Http(HttpCall {
                method: http::Method::GET,
                path_and_query: self.path_and_query.clone(),
                headers,
                body: bytes::Bytes::new(),
            }),
            timeout,
            deadline: tokio::time::Instant::now() + timeout,
            idempotent: true,
            trace: None,
        };
        let call = self.backend.call(req);
        Box::pin(async move {
            let resp = tokio::time::timeout(timeout, call)
                .await
                .map_err(|_| FetchError::Timeout(timeout))?
                .map_err(|e| FetchError::Transport(e.to_string()))?;
            if resp.status != StatusCode::OK {
                return Err(FetchError::Status(resp.status.as_u16()));
            }
            let body = resp.bytes();
            if body.len() > max_bytes {
                return Err(FetchError::TooLarge(max_bytes));
            }
            Ok(Fetched {
                body,
                max_age: None,
            })
        })
    }
}

/// Who may call route `r`, described; said of every route of a config with providers.
fn explain_route(cfg: &fanout_config::Config, r: &fanout_config::Route) -> Option<String> {
    use fanout_config::auth::AuthMode;
    let none = || {
        (!cfg.auth.providers.is_empty())
            .then(|| "none: every request reaches the flow ($request.auth is null)".to_string())
    };
    let Some(a) = r.auth.as_ref().or(cfg.defaults.auth.as_ref()) else {
        return none();
    };
    let mode = match a.mode {
        AuthMode::None => return none(),
        AuthMode::Optional => "optional (anonymous requests allowed: $request.auth is null)",
        AuthMode::Required => "required (no valid token: 401)",
    };
    let provider = a.provider.as_ref().map_or("?", |p| p.value.as_str());
    let mut s = format!("a JWT from provider `{provider}`, {mode}");
    if let Some(p) = cfg.auth.providers.get(provider) {
        let keys = match (&p.jwks_url, &p.keys) {
            (Some(u), _) => format!("keys from {}", fanout_config::shown_url(&u.value)),
            (None, Some(_)) => "inline keys".to_string(),
            (None, None) => "an HMAC secret".to_string(),
        };
        s.push_str(&format!("; issuer {}, {keys}", p.issuer));
    }
    if !a.scopes.is_empty() {
        s.push_str(&format!("; scopes {} (else 403)", a.scopes.join(" ")));
    }
    if let Some(r) = &a.require {
        s.push_str(&format!("; require `{}` (else 403)", r.value));
    }
    Some(s)
}

/// A refusal: the status, code and challenge of RFC 6750; why goes to the log, never to the
/// client.
fn refusal(denied: Denied) -> Rejection {
    let bearer = |v: &str| HeaderValue::from_str(v).ok();
    let (r, challenge) = match &denied {
        Denied::Missing => (
            Rejection::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "this route needs a bearer token",
            ),
            bearer("Bearer"),
        ),
        Denied::Invalid(_) => (
            Rejection::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "the token is not valid",
            ),
            bearer(r#"Bearer error="invalid_token""#),
        ),
        Denied::Forbidden { scopes, .. } => {
            let challenge = if scopes.is_empty() {
                r#"Bearer error="insufficient_scope""#.to_string()
            } else {
                format!(
                    r#"Bearer error="insufficient_scope", scope="{}""#,
                    scopes.join(" ")
                )
            };
            (
                Rejection::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "the token does not allow this request",
                ),
                bearer(&challenge),
            )
        }
        Denied::Unavailable { .. } => (
            Rejection::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "auth_unavailable",
                "authentication is not available yet; retry later",
            ),
            None,
        ),
    };
    let mut r = r.detail(denied.to_string()).logged();
    if let Some(c) = challenge {
        r = r.header(http::header::WWW_AUTHENTICATE, c);
    }
    r
}

impl EdgeStage for AuthStage {
    fn applies(&self, route: usize, _: RouteKind) -> bool {
        self.auth.policy(route).is_some()
    }

    fn on_request<'a>(&'a self, head: &'a mut RequestHead<'_>) -> Step<'a> {
        let Some(policy) = self.auth.policy(head.route.index) else {
            return Step::Next;
        };
        Step::Wait(Box::pin(async move {
            let claims = self
                .auth
                .authenticate(policy, &head.parts.headers, head.parts.uri.query())
                .await
                .map_err(refusal)?;
            head.auth = claims;
            Ok(())
        }))
    }

    fn readiness(&self) -> Result<(), String> {
        self.auth.readiness()
    }

    /// The JWK sets are fetched before the gateway is ready (a failed fetch is retried in the
    /// background; a reload whose new set cannot be fetched is refused).
    fn start(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async {
            self.auth
                .start()
                .await
                .into_iter()
                .map(|url| {
                    format!(
                        "JWK set {url} not fetched: its providers' routes answer 503 and the gateway is not ready until it is"
                    )
                })
                .collect()
        })
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        Some(self.auth.status_json())
    }

    /// Each provider's keys (count, age, fetches) and decisions, every reason a series from the
    /// start.
    fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        use MetricType::{Counter, Gauge};
        type L2<'a> = [(&'static str, &'a str); 2];
        let providers = self.auth.counters();
        let now = std::time::SystemTime::now();
        out.family(
            "fanout_auth_keys",
            "Keys in use by an auth provider (0 until its JWK set loads)",
            Gauge,
            providers.iter().map(|p| {
                (
                    [("provider", p.name.as_str())],
                    Value::Gauge(p.keys.keys as f64),
                )
            }),
        )?;
        out.family(
            "fanout_auth_keys_age_seconds",
            "Age of the keys an auth provider uses (no sample before they load)",
            Gauge,
            providers.iter().filter_map(|p| {
                let age = now.duration_since(p.keys.loaded_at?).unwrap_or_default();
                Some((
                    [("provider", p.name.as_str())],
                    Value::Gauge(age.as_secs_f64()),
                ))
            }),
        )?;
        out.family(
            "fanout_auth_jwks_fetches",
            "JWK set fetches of an auth provider, by result (ok, error)",
            Counter,
            providers.iter().flat_map(|p| {
                [("ok", p.keys.fetches), ("error", p.keys.failures)].map(
                    |(r, v)| -> (L2<'_>, Value) {
                        (
                            [("provider", p.name.as_str()), ("result", r)],
                            Value::Counter(v),
                        )
                    },
                )
            }),
        )?;
        out.family(
            "fanout_auth_unknown_kid_fetches",
            "JWK set fetches made because a token named an unknown kid",
            Counter,
            providers.iter().map(|p| {
                (
                    [("provider", p.name.as_str())],
                    Value::Counter(p.keys.unknown_kid_fetches),
                )
            }),
        )?;
        out.family(
            "fanout_auth_requests",
            "Requests an auth provider decided, by outcome (accepted, missing, invalid, forbidden, unavailable)",
            Counter,
            providers.iter().flat_map(|p| {
                let invalid: u64 = p.invalid.values().sum();
                [
                    ("accepted", p.accepted),
                    ("missing", p.missing),
                    ("invalid", invalid),
                    ("forbidden", p.forbidden),
                    ("unavailable", p.unavailable),
                ]
                .map(|(o, v)| -> (L2<'_>, Value) {
                    ([("provider", p.name.as_str()), ("outcome", o)], Value::Counter(v))
                })
            }),
        )?;
        out.family(
            "fanout_auth_invalid_tokens",
            "Tokens an auth provider refused, by reason",
            Counter,
            providers.iter().flat_map(|p| {
                fanout_auth::TokenError::REASONS.map(|r| -> (L2<'_>, Value) {
                    let n = p.invalid.get(r).copied().unwrap_or(0);
                    (
                        [("provider", p.name.as_str()), ("reason", r)],
                        Value::Counter(n),
                    )
                })
            }),
        )
    }

    fn explain(&self, route: usize) -> Vec<String> {
        match self.explained.get(route) {
            Some(Some(s)) => vec![format!("auth: {s}")],
            _ => Vec::new(),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
