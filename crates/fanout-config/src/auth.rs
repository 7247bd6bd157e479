//! Authentication at the edge (`auth:`, a route's or the defaults' `auth:`): named JWT providers
//! and what a route asks of the token. Checked and compiled by `fanout-auth`; see
//! docs/config.md#auth--authentication.

use crate::{Dur, Located};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// The JWT providers routes may name, and the cache of verified tokens they share.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Providers by name: who issues tokens and how they are checked.
    pub providers: IndexMap<String, AuthProvider>,
    /// Most verified tokens remembered (until each one's expiry), so a client that sends the
    /// same token again pays no signature check. 0 turns the cache off. Default 10000.
    pub verified_cache_entries: usize,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            providers: IndexMap::new(),
            verified_cache_entries: 10_000,
        }
    }
}

/// One issuer of JWTs. Exactly one of `jwks_url`, `keys` and `hmac_secret` says where its keys
/// come from.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthProvider {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// Accepted `aud` values: a token must name at least one. Empty: `aud` is not checked.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Where the public keys are served as a JWK set (`http://` or `https://`): fetched before
    /// the gateway is ready, refreshed in the background (`refresh`).
    pub jwks_url: Option<Located<String>>,
    /// Public keys given inline: a JWK set (JSON text with `keys`), or one or more PEM public
    /// keys. For tests and air-gapped setups.
    pub keys: Option<Located<String>>,
    /// The shared secret of an HMAC provider (HS256/384/512), usually `${SECRET}`. Never in a
    /// provider with public keys.
    pub hmac_secret: Option<Located<String>>,
    /// Accepted `alg`s: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA (public
    /// keys) or HS256, HS384, HS512 (`hmac_secret` only). Default: RS256 and ES256 (HS256 with
    /// `hmac_secret`).
    #[serde(default)]
    pub algorithms: Vec<Located<String>>,
    /// Clock skew allowed on `exp` and `nbf`. Default 30s.
    #[serde(default = "default_leeway")]
    pub leeway: Dur,
    /// Claims every token must have. Default `[exp]` (`exp` is always required).
    #[serde(default)]
    pub required_claims: Vec<String>,
    /// Where the token is read. Default the `Authorization: Bearer` header.
    #[serde(default)]
    pub token: TokenSource,
    /// When the JWK set at `jwks_url` is fetched.
    #[serde(default)]
    pub refresh: JwksRefresh,
    /// Longest token accepted, in bytes; a longer one is refused unread. Default 8192.
    #[serde(default = "default_max_token_bytes")]
    pub max_token_bytes: usize,
}

fn default_leeway() -> Dur {
    Dur::secs(30)
}

fn default_max_token_bytes() -> usize {
    8192
}

/// Where a token is read: one of `header`, `cookie`, `query`. Default `{header: authorization}`
/// (the `Bearer` scheme).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TokenSource {
    /// A header: `authorization` takes `Bearer <token>`; another header the token itself (or
    /// `Bearer <token>`).
    pub header: Option<String>,
    /// A cookie's value.
    pub cookie: Option<String>,
    /// A query parameter (URLs end up in logs and histories): only with `allow_query: true`.
    pub query: Option<String>,
    /// Allow `query`. Default false.
    pub allow_query: bool,
}

/// When a JWK set is fetched: every `max-age` of its answer within `[min, max]` (`max` when it
/// gives none), and once — at most every `unknown_kid_cooldown` — when a token names a key it
/// does not have. A failed fetch keeps the last good keys and is tried again after
/// `unknown_kid_cooldown`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JwksRefresh {
    /// Shortest time between scheduled refreshes. Default 1m.
    pub min: Dur,
    /// Longest time between scheduled refreshes. Default 1h.
    pub max: Dur,
    /// Shortest time between fetches made for an unknown `kid` (and between retries of a failed
    /// fetch). Default 10s.
    pub unknown_kid_cooldown: Dur,
    /// Time limit of one fetch. Default 2s.
    pub fetch_timeout: Dur,
    /// Largest JWK set document read, in bytes. Default 1 MiB.
    pub max_bytes: usize,
}

impl Default for JwksRefresh {
    fn default() -> Self {
        JwksRefresh {
            min: Dur::secs(60),
            max: Dur::secs(3600),
            unknown_kid_cooldown: Dur::secs(10),
            fetch_timeout: Dur::secs(2),
            max_bytes: 1 << 20,
        }
    }
}

/// What a route (or `defaults`) asks of the request's token.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteAuth {
    /// The provider (a name under `auth.providers`). Required unless `mode: none`.
    pub provider: Option<Located<String>>,
    /// `required` (default): no valid token, no answer (401); `optional`: a request without a
    /// token is anonymous (`$request.auth` is null), one with a bad token is refused; `none`: no
    /// authentication (a route turning off the defaults' `auth`).
    #[serde(default)]
    pub mode: AuthMode,
    /// A jq predicate over the verified claims (`$auth`), e.g. `$auth.tenant == "acme"`; false
    /// or an error is 403 `forbidden`.
    pub require: Option<Located<String>>,
    /// Scopes the token must all have (in its `scope` string or its `scp` array); else 403.
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// Whether a route needs a token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// No authentication.
    None,
    /// Anonymous requests allowed; a token sent must be valid.
    Optional,
    /// A valid token is required.
    #[default]
    Required,
}
