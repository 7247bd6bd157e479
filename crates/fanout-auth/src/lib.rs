//! JWT authentication at the edge (docs/config.md#auth--authentication): the providers of a config
//! (`auth.providers`), what each route asks ([`Policy`]), and [`Auth::authenticate`], which
//! reads a request's token, verifies it (signature, `alg`, `kid`, `exp`/`nbf` with leeway,
//! issuer, audience, required claims), checks the route's condition and gives the verified
//! claims as the flow value `$request.auth`.
//!
//! Keys come from the config (a JWK set or PEM keys inline, an HMAC secret) or from a JWKS URL
//! (`jwks.rs`: one cache per URL, fetched before ready, refreshed in the background, once more
//! on an unknown `kid`); verified tokens are remembered until their expiry (`cache.rs`).
//! Verification is `jsonwebtoken`'s (on `ring`); this crate decides which key and which rules.

#![forbid(unsafe_code)]

mod cache;
mod error;
mod jwks;
mod keys;
mod token;

pub use error::{Denied, FetchError, KeysError, TokenError};
pub use jwks::{Fetch, FetchFuture, Fetched, HttpFetch, KeyStatus};
pub use token::scopes;

use fanout_config::auth::{AuthMode, AuthProvider, RouteAuth};
use fanout_config::{Config, ConfigError, Located, Pos};
use fanout_expr::{Expr, Val};
use jsonwebtoken::{Algorithm, Validation};
use jwks::{KeyCache, Schedule};
use keys::{KeySet, Lookup};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use token::Where;

/// The algorithms of public keys a provider may accept.
const PUBLIC_ALGS: [&str; 9] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];
/// The HMAC algorithms (only with `hmac_secret`).
const HMAC_ALGS: [&str; 3] = ["HS256", "HS384", "HS512"];

/// One provider, compiled.
struct Provider {
    name: String,
    issuer: String,
    audiences: Vec<String>,
    algorithms: Vec<Algorithm>,
    leeway: u64,
    /// `required_claims` beyond what `jsonwebtoken` checks itself.
    required: Vec<String>,
    /// The spec claims `jsonwebtoken` checks for presence.
    required_spec: Vec<String>,
    token: Where,
    max_token_bytes: usize,
    keys: Arc<KeyCache>,
    counts: Counts,
}

/// Per provider: tokens accepted, refused by reason, requests without a token.
#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    cached: AtomicU64,
    missing: AtomicU64,
    forbidden: AtomicU64,
    unavailable: AtomicU64,
    refused: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

/// One provider's keys and decisions ([`Auth::counters`]).
#[derive(Debug, Clone)]
pub struct ProviderCounters {
    /// The provider's name.
    pub name: String,
    /// Its keys.
    pub keys: KeyStatus,
    /// Tokens accepted (from the cache or verified).
    pub accepted: u64,
    /// Requests without a token on a route that requires one.
    pub missing: u64,
    /// Valid tokens the route's condition refused.
    pub forbidden: u64,
    /// Requests refused because the provider had no keys.
    pub unavailable: u64,
    /// Invalid tokens by [`TokenError::reason`].
    pub invalid: std::collections::BTreeMap<&'static str, u64>,
}

/// What a route asks of the request's token.
#[derive(Clone)]
pub struct Policy {
    provider: usize,
    /// `required` or `optional` (a route with `none` has no policy).
    pub mode: AuthMode,
    require: Option<Expr>,
    scopes: Vec<String>,
}

/// The authentication of one config: its providers, the routes' policies, the key caches and
/// the verified-token cache.
pub struct Auth {
    providers: Vec<Provider>,
    /// By route index (config order).
    routes: Vec<Option<Policy>>,
    /// Every key cache (one per JWKS URL), for start, readiness and status.
    caches: Vec<Arc<KeyCache>>,
    verified: cache::Verified,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The scheme of a key URL fetched through a backend of the config: `backend://NAME/path`.
pub const BACKEND_SCHEME: &str = "backend://";

impl Auth {
    /// Compile `cfg`'s providers and the routes' `auth` (or `defaults.auth`). With `prev`, a
    /// JWKS URL whose schedule did not change keeps its cache (keys, counters, refresh).
    /// `fetch` is made only when some provider has a `jwks_url`. Every error at once, at its
    /// line.
    pub fn build(
        cfg: &Config,
        prev: Option<&Auth>,
        fetch: impl FnOnce() -> Result<Arc<dyn Fetch>, FetchError>,
    ) -> Result<Auth, Vec<ConfigError>> {
        let mut fetch = Some(fetch);
        let mut fetcher: Option<Arc<dyn Fetch>> = None;
        let fetch_for = |url: &str| {
            if url.starts_with(BACKEND_SCHEME) {
                return Err(FetchError::BadUrl(
                    "a backend:// key URL needs the gateway's backends".into(),
                ));
            }
            if let Some(f) = &fetcher {
                return Ok(f.clone());
            }
            let f = match fetch.take() {
                Some(make) => make()?,
                None => return Err(FetchError::BadUrl("no fetcher".into())),
            };
            fetcher = Some(f.clone());
            Ok(f)
        };
        Auth::build_with(cfg, prev, fetch_for, |_| true)
    }

    /// [`Auth::build`] with a fetcher per key URL: `fetch_for(url)` is asked once for each URL
    /// whose cache is not kept — a `backend://NAME/path` URL is fetched through backend `NAME`'s
    /// client (its TLS, timeouts, breaker and call metrics). A kept cache needs `may_keep(url)`
    /// too (its backend was kept by the reload).
    pub fn build_with(
        cfg: &Config,
        prev: Option<&Auth>,
        mut fetch_for: impl FnMut(&str) -> Result<Arc<dyn Fetch>, FetchError>,
        may_keep: impl Fn(&str) -> bool,
    ) -> Result<Auth, Vec<ConfigError>> {
        let mut errs = Vec::new();
        let mut caches: Vec<Arc<KeyCache>> = Vec::new();
        let mut providers = Vec::new();
        for (name, p) in &cfg.auth.providers {
            let keys = match provider_keys(name, p) {
                Ok(Some(keys)) => Arc::new(KeyCache::fixed(keys)),
                Ok(None) => {
                    let Some(url) = &p.jwks_url else { continue };
                    let schedule = schedule(p);
                    let kept = caches
                        .iter()
                        .chain(prev.map(|a| a.caches.iter()).into_iter().flatten())
                        .find(|c| c.same_source(&url.value, &schedule))
                        .filter(|_| may_keep(&url.value))
                        .cloned();
                    match kept {
                        Some(c) => c,
                        None => {
                            if !(url.value.starts_with("http://")
                                || url.value.starts_with("https://")
                                || url.value.starts_with(BACKEND_SCHEME))
                            {
                                errs.push(
                                    ConfigError::at(
                                        url.pos,
                                        format!(
                                            "auth.providers.{name}.jwks_url `{}` is not an http://, https:// or backend:// URL",
                                            url.value
                                        ),
                                    )
                                    .hint("e.g. https://idp.example.com/.well-known/jwks.json, or backend://idp/.well-known/jwks.json through backend `idp`"),
                                );
                                continue;
                            }
                            let f = match fetch_for(&url.value) {
                                Ok(f) => f,
                                Err(e) => {
                                    errs.push(ConfigError::at(
                                        url.pos,
                                        format!("auth.providers.{name}.jwks_url: {e}"),
                                    ));
                                    continue;
                                }
                            };
                            Arc::new(KeyCache::url(url.value.clone(), schedule, f))
                        }
                    }
                }
                Err(e) => {
                    errs.push(e);
                    // The provider's other mistakes are said too (keys of no use to anyone).
                    let none = KeySet {
                        keys: Vec::new(),
                        skipped: 0,
                    };
                    if let Err(mut e) = provider(name, p, Arc::new(KeyCache::fixed(none))) {
                        errs.append(&mut e);
                    }
                    continue;
                }
            };
            if !caches.iter().any(|c| Arc::ptr_eq(c, &keys)) {
                caches.push(keys.clone());
            }
            match provider(name, p, keys) {
                Ok(p) => providers.push(p),
                Err(mut e) => errs.append(&mut e),
            }
        }
        // `defaults.auth` compiled once (its errors said once), shared by the routes without.
        let before = errs.len();
        let default_policy = cfg
            .defaults
            .auth
            .as_ref()
            .and_then(|ra| policy(ra, cfg, Pos::default(), &mut errs));
        for e in errs.iter_mut().skip(before) {
            if e.pos.is_none_or(|p| p.line == 0) {
                e.pos = None;
                e.path = Some("defaults.auth".into());
            }
        }
        let mut routes = Vec::with_capacity(cfg.routes.len());
        for r in &cfg.routes {
            routes.push(match &r.auth {
                Some(ra) => policy(ra, cfg, r.path.pos, &mut errs),
                None => default_policy.clone(),
            });
        }
        fanout_config::locate(&mut errs, &cfg.source);
        for e in &mut errs {
            if e.file.is_empty() {
                e.file = cfg.file.clone();
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(Auth {
            providers,
            routes,
            caches,
            verified: cache::Verified::new(cfg.auth.verified_cache_entries),
        })
    }

    /// The policy of route `index` (`None`: no authentication).
    pub fn policy(&self, index: usize) -> Option<&Policy> {
        self.routes.get(index).and_then(Option::as_ref)
    }

    /// Fetch every JWK set not fetched yet and start its background refresh; returns when each
    /// first fetch is done (a failed one is retried in the background: the routes of its
    /// providers answer 503 and the gateway is not ready until it succeeds). The URLs whose
    /// first fetch failed (a reload that brings them is refused).
    pub async fn start(&self) -> Vec<String> {
        futures_util::future::join_all(self.caches.iter().map(|c| c.start()))
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// `Err` naming the providers that have never had keys.
    pub fn readiness(&self) -> Result<(), String> {
        let missing: Vec<&str> = self
            .providers
            .iter()
            .filter(|p| p.keys.snapshot().is_none())
            .map(|p| p.name.as_str())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "auth provider(s) without keys (their JWK set has not loaded): {}",
                missing.join(", ")
            ))
        }
    }

    /// Authenticate a request under `policy`: its token read from `headers` (or the query),
    /// verified (or found verified in the cache), the route's condition checked. The verified
    /// claims, or `null` for an anonymous request on an `optional` route.
    pub async fn authenticate(
        &self,
        policy: &Policy,
        headers: &http::HeaderMap,
        query: Option<&str>,
    ) -> Result<Val, Denied> {
        let p = &self.providers[policy.provider];
        let out = self.authenticate_with(p, policy, headers, query).await;
        match &out {
            Ok(_) => {}
            Err(Denied::Missing) => {
                p.counts.missing.fetch_add(1, Ordering::Relaxed);
            }
            Err(Denied::Forbidden { .. }) => {
                p.counts.forbidden.fetch_add(1, Ordering::Relaxed);
            }
            Err(Denied::Unavailable { .. }) => {
                p.counts.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            Err(Denied::Invalid(e)) => {
                let mut m = p.counts.refused.lock().unwrap_or_else(|x| x.into_inner());
                *m.entry(e.reason()).or_default() += 1;
            }
        }
        out
    }

    async fn authenticate_with(
        &self,
        p: &Provider,
        policy: &Policy,
        headers: &http::HeaderMap,
        query: Option<&str>,
    ) -> Result<Val, Denied> {
        if p.keys.snapshot().is_none() {
            return Err(Denied::Unavailable {
                provider: p.name.clone(),
            });
        }
        let token = match p.token.read(headers, query)? {
            Some(t) => t,
            None if policy.mode == AuthMode::Optional => return Ok(Val::Null),
            None => return Err(Denied::Missing),
        };
        if token.len() > p.max_token_bytes {
            return Err(TokenError::TooLarge {
                len: token.len(),
                max: p.max_token_bytes,
            }
            .into());
        }
        let key = cache::key(policy.provider, &token);
        // A cached token counts only while the key that verified it is still in the set.
        let in_use = |id: &keys::KeyId| p.keys.snapshot().is_some_and(|k| k.has(id));
        let claims = match self.verified.get(&key, now_unix(), in_use) {
            Some(c) => {
                p.counts.cached.fetch_add(1, Ordering::Relaxed);
                c
            }
            None => {
                let (claims, exp, by) = p.verify_fetching(&token).await?;
                self.verified.insert(key, claims.clone(), exp, by);
                claims
            }
        };
        p.counts.accepted.fetch_add(1, Ordering::Relaxed);
        policy.admits(&claims)?;
        Ok(claims)
    }

    /// The providers' keys and counters, the verified-token cache: `{providers: {NAME: {...}},
    /// verified_cache: {...}}` for the status endpoint.
    pub fn status_json(&self) -> serde_json::Value {
        let now = SystemTime::now();
        let providers: serde_json::Map<String, serde_json::Value> = self
            .providers
            .iter()
            .map(|p| {
                let s = p.keys.status();
                let refused = p.counts.refused.lock().unwrap_or_else(|x| x.into_inner()).clone();
                (
                    p.name.clone(),
                    serde_json::json!({
                        "jwks_url": s.url,
                        "keys": s.keys,
                        "skipped_keys": s.skipped_keys,
                        "loaded": s.loaded_at.is_some(),
                        "keys_age_s": s.loaded_at.map(|t| now.duration_since(t).unwrap_or_default().as_secs_f64()),
                        "fetches": s.fetches,
                        "fetch_failures": s.failures,
                        "unknown_kid_fetches": s.unknown_kid_fetches,
                        "last_error": s.last_error,
                        "accepted": p.counts.accepted.load(Ordering::Relaxed),
                        "accepted_from_cache": p.counts.cached.load(Ordering::Relaxed),
                        "missing": p.counts.missing.load(Ordering::Relaxed),
                        "forbidden": p.counts.forbidden.load(Ordering::Relaxed),
                        "unavailable": p.counts.unavailable.load(Ordering::Relaxed),
                        "refused": refused,
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "providers": providers,
            "verified_cache": {
                "entries": self.verified.len(),
                "hits": self.verified.hits.load(Ordering::Relaxed),
                "misses": self.verified.misses.load(Ordering::Relaxed),
            },
        })
    }

    /// Per provider: its keys and what it decided, for the metrics.
    pub fn counters(&self) -> Vec<ProviderCounters> {
        self.providers
            .iter()
            .map(|p| ProviderCounters {
                name: p.name.clone(),
                keys: p.keys.status(),
                accepted: p.counts.accepted.load(Ordering::Relaxed),
                missing: p.counts.missing.load(Ordering::Relaxed),
                forbidden: p.counts.forbidden.load(Ordering::Relaxed),
                unavailable: p.counts.unavailable.load(Ordering::Relaxed),
                invalid: p
                    .counts
                    .refused
                    .lock()
                    .unwrap_or_else(|x| x.into_inner())
                    .clone(),
            })
            .collect()
    }
}

impl Provider {
    /// Verify `token`; when it names a `kid` the keys lack, refresh them once (single-flight,
    /// cooldown) and try again. The claims, their `exp` and the key that verified them.
    async fn verify_fetching(&self, token: &str) -> Result<(Val, u64, keys::KeyId), TokenError> {
        let seen = self.keys.generation();
        match self.verify(token) {
            Err(TokenError::UnknownKid(kid)) => {
                if self.keys.refresh_for_unknown_kid(seen).await {
                    self.verify(token)
                } else {
                    Err(TokenError::UnknownKid(kid))
                }
            }
            r => r,
        }
    }

    /// Verify `token` with the keys in use.
    fn verify(&self, token: &str) -> Result<(Val, u64, keys::KeyId), TokenError> {
        let keys = self
            .keys
            .snapshot()
            .ok_or_else(|| TokenError::NoKey("(no keys loaded)".into()))?;
        let header = token::header(token)?;
        if !self.algorithms.contains(&header.alg) {
            return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
        }
        let found = match keys.find(header.kid.as_deref(), header.alg) {
            Lookup::Found(k) => k,
            Lookup::UnknownKid => {
                return Err(TokenError::UnknownKid(error::quoted(
                    header.kid.as_deref().unwrap_or(""),
                )));
            }
            Lookup::NoKey => return Err(TokenError::NoKey(format!("{:?}", header.alg))),
        };
        let mut v = Validation::new(header.alg);
        v.algorithms = vec![header.alg];
        v.leeway = self.leeway;
        v.validate_exp = true;
        v.validate_nbf = true;
        v.set_issuer(&[&self.issuer]);
        if self.audiences.is_empty() {
            v.validate_aud = false;
        } else {
            v.set_audience(&self.audiences);
        }
        v.set_required_spec_claims(&self.required_spec);
        let mut last = TokenError::Signature;
        for k in found {
            match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
                token, &k.key, &v,
            ) {
                Ok(data) => {
                    let claims = data.claims;
                    if let Some(c) = self.required.iter().find(|c| !claims.contains_key(*c)) {
                        return Err(TokenError::MissingClaim(c.clone()));
                    }
                    let exp = claims
                        .get("exp")
                        .and_then(|e| e.as_u64().or_else(|| e.as_f64().map(|f| f as u64)))
                        .unwrap_or(0);
                    let val = fanout_expr::json::from_serde(&serde_json::Value::Object(claims));
                    return Ok((val, exp, k.id));
                }
                Err(e) => {
                    last = token_error(e);
                    // Another key of the same kid-less set may still verify the signature.
                    if last != TokenError::Signature {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }
}

/// `jsonwebtoken`'s error as ours.
fn token_error(e: jsonwebtoken::errors::Error) -> TokenError {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidSignature => TokenError::Signature,
        K::ExpiredSignature => TokenError::Expired,
        K::ImmatureSignature => TokenError::NotYetValid,
        K::InvalidIssuer => TokenError::Issuer,
        K::InvalidAudience => TokenError::Audience,
        K::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
        K::InvalidAlgorithm => TokenError::Algorithm("(not the key's)".into()),
        _ => TokenError::Malformed(error::escaped(&e.to_string())),
    }
}

impl Policy {
    /// The route's condition over verified claims (`null`: an anonymous request, admitted by
    /// an optional route).
    fn admits(&self, claims: &Val) -> Result<(), Denied> {
        if matches!(claims, Val::Null) {
            return Ok(());
        }
        if !self.scopes.is_empty() {
            let has = token::scopes(claims);
            if let Some(missing) = self.scopes.iter().find(|s| !has.contains(s)) {
                return Err(Denied::Forbidden {
                    scopes: self.scopes.clone(),
                    why: format!("the token lacks the scope {}", error::quoted(missing)),
                });
            }
        }
        if let Some(e) = &self.require {
            match e.eval(&Val::Null, |_| claims.clone()) {
                Ok(v) if fanout_expr::truthy(&v) => {}
                Ok(_) => {
                    return Err(Denied::Forbidden {
                        scopes: Vec::new(),
                        why: format!("`{}` is false", e.source()),
                    });
                }
                Err(err) => {
                    return Err(Denied::Forbidden {
                        scopes: Vec::new(),
                        why: format!("`{}` failed: {}", e.source(), err.0),
                    });
                }
            }
        }
        Ok(())
    }

    /// One line for `fanout explain`.
    pub fn describe(&self, auth: &Auth) -> String {
        let provider = auth
            .providers
            .get(self.provider)
            .map_or("?", |p| p.name.as_str());
        let mode = match self.mode {
            AuthMode::Optional => "optional",
            _ => "required",
        };
        let mut s = format!("{mode} (provider {provider}");
        if !self.scopes.is_empty() {
            s.push_str(&format!(", scopes {}", self.scopes.join(" ")));
        }
        if let Some(e) = &self.require {
            s.push_str(&format!(", require `{}`", e.source()));
        }
        s.push(')');
        s
    }
}

/// A provider's fixed keys (`keys`, `hmac_secret`), `None` for a JWKS URL; exactly one source.
fn provider_keys(name: &str, p: &AuthProvider) -> Result<Option<KeySet>, ConfigError> {
    let field = |f: &str| format!("auth.providers.{name}.{f}");
    let sources = [
        p.jwks_url.as_ref().map(|l| ("jwks_url", l.pos)),
        p.keys.as_ref().map(|l| ("keys", l.pos)),
        p.hmac_secret.as_ref().map(|l| ("hmac_secret", l.pos)),
    ];
    let given: Vec<(&str, Pos)> = sources.into_iter().flatten().collect();
    match given.as_slice() {
        [] => Err(ConfigError::at_path(
            format!("auth.providers.{name}"),
            format!("auth.providers.{name} has no keys"),
        )
        .hint("give one of `jwks_url`, `keys` (a JWK set or PEM public keys) or `hmac_secret`")),
        [_] => {
            if let Some(k) = &p.keys {
                return KeySet::inline(&k.value)
                    .map(Some)
                    .map_err(|e| ConfigError::at(k.pos, format!("{}: {e}", field("keys"))));
            }
            if let Some(s) = &p.hmac_secret {
                if s.value.len() < 32 {
                    return Err(ConfigError::at(
                        s.pos,
                        format!("{} is shorter than 32 bytes", field("hmac_secret")),
                    )
                    .hint("use a random secret of at least 32 bytes (256 bits)"));
                }
                return Ok(Some(KeySet::hmac(s.value.as_bytes())));
            }
            Ok(None)
        }
        [_, (second, pos), ..] => Err(ConfigError::at(
            *pos,
            format!(
                "{} gives more than one key source (`{}` and `{second}`)",
                field(""),
                given[0].0
            ),
        )
        .hint("a provider takes its keys from one of `jwks_url`, `keys`, `hmac_secret`: HMAC secrets never share a provider with public keys")),
    }
}

fn schedule(p: &AuthProvider) -> Schedule {
    Schedule {
        min: p.refresh.min.0,
        max: p.refresh.max.0,
        cooldown: p.refresh.unknown_kid_cooldown.0,
        timeout: p.refresh.fetch_timeout.0,
        max_bytes: p.refresh.max_bytes,
    }
}

/// A provider's algorithms, claims and token source checked.
fn provider(
    name: &str,
    p: &AuthProvider,
    keys: Arc<KeyCache>,
) -> Result<Provider, Vec<ConfigError>> {
    let mut errs = Vec::new();
    let hmac = p.hmac_secret.is_some();
    let allowed: &[&str] = if hmac { &HMAC_ALGS } else { &PUBLIC_ALGS };
    let algs: Vec<Located<String>> = if p.algorithms.is_empty() {
        let d: &[&str] = if hmac {
            &["HS256"]
        } else {
            &["RS256", "ES256"]
        };
        d.iter().map(|a| Located::unknown(a.to_string())).collect()
    } else {
        p.algorithms.clone()
    };
    let mut algorithms = Vec::new();
    for a in &algs {
        if !allowed.contains(&a.value.as_str()) {
            let why = if HMAC_ALGS.contains(&a.value.as_str()) {
                "HMAC algorithms need `hmac_secret`, and never share a provider with public keys"
                    .to_string()
            } else if PUBLIC_ALGS.contains(&a.value.as_str()) {
                "a provider with `hmac_secret` accepts only HS256, HS384, HS512".to_string()
            } else {
                format!("accepted: {}", allowed.join(", "))
            };
            errs.push(
                ConfigError::at(
                    a.pos,
                    format!(
                        "auth.providers.{name}.algorithms: `{}` is not accepted here",
                        a.value
                    ),
                )
                .hint(why),
            );
            continue;
        }
        if let Ok(alg) = Algorithm::from_str(&a.value) {
            algorithms.push(alg);
        }
    }
    let token = match Where::from_config(&p.token) {
        Ok(w) => w,
        Err(e) => {
            // The key at fault: the query parameter without `allow_query`, else the section.
            let which = if p.token.query.is_some() && !p.token.allow_query {
                ".query"
            } else {
                ""
            };
            errs.push(
                ConfigError::at_path(
                    format!("auth.providers.{name}.token{which}"),
                    format!("auth.providers.{name}.token: {e}"),
                )
                .hint("the token is read from one of `header`, `cookie`, `query` (with `allow_query: true`)"),
            );
            Where::Authorization
        }
    };
    if p.issuer.trim().is_empty() {
        errs.push(
            ConfigError::at_path(
                format!("auth.providers.{name}.issuer"),
                format!("auth.providers.{name}.issuer is empty"),
            )
            .hint(
                "the `iss` every token of this provider carries, e.g. `https://idp.example.com/`",
            ),
        );
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    // `iss` (and `aud` when audiences are set) must be present: jsonwebtoken checks them only
    // when they are.
    let spec = ["exp", "nbf", "aud", "iss", "sub"];
    let mut required_spec: Vec<String> = vec!["exp".into(), "iss".into()];
    if !p.audiences.is_empty() {
        required_spec.push("aud".into());
    }
    let mut required = Vec::new();
    for c in &p.required_claims {
        if spec.contains(&c.as_str()) {
            if !required_spec.contains(c) {
                required_spec.push(c.clone());
            }
        } else {
            required.push(c.clone());
        }
    }
    Ok(Provider {
        name: name.to_string(),
        issuer: p.issuer.clone(),
        audiences: p.audiences.clone(),
        algorithms,
        leeway: p.leeway.0.as_secs(),
        required,
        required_spec,
        token,
        max_token_bytes: p.max_token_bytes,
        keys,
        counts: Counts::default(),
    })
}

/// A route's `auth` compiled (`None` for `mode: none`).
fn policy(ra: &RouteAuth, cfg: &Config, at: Pos, errs: &mut Vec<ConfigError>) -> Option<Policy> {
    if ra.mode == AuthMode::None {
        return None;
    }
    let Some(name) = &ra.provider else {
        errs.push(
            ConfigError::at(at, "`auth` names no `provider`")
                .hint("name one of `auth.providers`, or say `mode: none`"),
        );
        return None;
    };
    let Some(index) = cfg.auth.providers.get_index_of(&name.value) else {
        let known: Vec<&str> = cfg.auth.providers.keys().map(String::as_str).collect();
        let mut e = ConfigError::at(
            name.pos,
            format!(
                "auth provider `{}` is not defined in `auth.providers`",
                name.value
            ),
        );
        if let Some(s) = fanout_config::closest(&name.value, known.iter().copied()) {
            e = e.hint(format!("did you mean `{s}`?"));
        }
        errs.push(e);
        return None;
    };
    let require = match &ra.require {
        Some(src) => match Expr::compile(&src.value, &["auth"]) {
            Ok(e) => Some(e),
            Err(e) => {
                errs.push(ConfigError::at(
                    src.pos,
                    format!("auth.require: {}", e.message),
                ));
                return None;
            }
        },
        None => None,
    };
    Some(Policy {
        provider: index,
        mode: ra.mode,
        require,
        scopes: ra.scopes.clone(),
    })
}
