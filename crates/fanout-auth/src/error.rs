//! Why a token was refused, why a request was denied, why keys did not load. Every message is
//! safe for the log: it never holds the token, and a value the client chose (a `kid`, an
//! `alg`) is quoted, escaped and cut short.

/// Why a token did not verify (the log's reason; the client is told only `invalid_token`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Longer than the provider's `max_token_bytes`: refused unread.
    #[error("the token is {len} bytes, over max_token_bytes ({max})")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The provider's limit.
        max: usize,
    },
    /// Not three base64url parts with a JSON header and claims.
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(String),
    /// `alg: none`: an unsigned token.
    #[error("the token is unsigned (alg `none`)")]
    AlgNone,
    /// An `alg` the provider does not accept (an HMAC token on a provider of public keys, …).
    #[error("the token's alg {0} is not one the provider accepts")]
    Algorithm(String),
    /// A `kid` the provider's keys do not have (after a refresh, when one was allowed).
    #[error("the token names key id {0}, which the provider's keys do not have")]
    UnknownKid(String),
    /// No key of the provider is of the token's `alg`.
    #[error("no key of the provider is for alg {0}")]
    NoKey(String),
    /// The signature does not verify with the key.
    #[error("the signature does not verify")]
    Signature,
    /// `exp` is past, beyond the leeway.
    #[error("the token has expired (exp is past, beyond the leeway)")]
    Expired,
    /// `nbf` is ahead, beyond the leeway.
    #[error("the token is not valid yet (nbf is ahead, beyond the leeway)")]
    NotYetValid,
    /// `iss` is not the provider's issuer.
    #[error("the token's issuer is not the provider's")]
    Issuer,
    /// `aud` names none of the provider's audiences.
    #[error("the token's audience is none of the provider's audiences")]
    Audience,
    /// A claim of `required_claims` is missing.
    #[error("the token lacks the required claim {0}")]
    MissingClaim(String),
    /// The header's `crit` names extensions fanout does not understand (it understands none:
    /// RFC 7515 §4.1.11 says such a token must be refused), or is not a list of names.
    #[error("the token's header marks as critical {0}, which fanout does not understand")]
    Critical(String),
}

impl TokenError {
    /// Every [`TokenError::reason`] (each has a metric series from the start).
    pub const REASONS: [&'static str; 13] = [
        "too_large",
        "malformed",
        "alg_none",
        "algorithm",
        "unknown_kid",
        "no_key",
        "signature",
        "expired",
        "not_yet_valid",
        "issuer",
        "audience",
        "missing_claim",
        "critical",
    ];

    /// A short stable name (a metric label, a log field).
    pub fn reason(&self) -> &'static str {
        match self {
            TokenError::TooLarge { .. } => "too_large",
            TokenError::Malformed(_) => "malformed",
            TokenError::AlgNone => "alg_none",
            TokenError::Algorithm(_) => "algorithm",
            TokenError::UnknownKid(_) => "unknown_kid",
            TokenError::NoKey(_) => "no_key",
            TokenError::Signature => "signature",
            TokenError::Expired => "expired",
            TokenError::NotYetValid => "not_yet_valid",
            TokenError::Issuer => "issuer",
            TokenError::Audience => "audience",
            TokenError::MissingClaim(_) => "missing_claim",
            TokenError::Critical(_) => "critical",
        }
    }
}

/// Text that may hold what the client sent (a parser's message quoting the token's header), for
/// the log: control characters escaped (`\n`, `\u{1b}`, …) so it can never start a line of its
/// own, at most 200 characters.
pub(crate) fn escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(256));
    for (n, c) in s.chars().enumerate() {
        if n == 200 {
            out.push('…');
            break;
        }
        if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// A value the client chose, for the log: quoted, escaped, at most 64 characters.
pub(crate) fn quoted(s: &str) -> String {
    let cut: String = s.chars().take(64).collect();
    let more = if cut.len() < s.len() { "…" } else { "" };
    format!("{cut:?}{more}")
}

/// Why a request was not let through.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Denied {
    /// No token where the route requires one: 401 `unauthenticated`.
    #[error("no token was sent")]
    Missing,
    /// A token that does not verify: 401 `invalid_token`.
    #[error("{0}")]
    Invalid(#[from] TokenError),
    /// A valid token that the route's condition refuses: 403 `forbidden` (`insufficient_scope`).
    #[error("the route's condition refused the token: {why}")]
    Forbidden {
        /// The scopes the route asks for (for `WWW-Authenticate`'s `scope`).
        scopes: Vec<String>,
        /// Why, for the log.
        why: String,
    },
    /// The provider has never had keys: 503, and no request goes through.
    #[error("provider `{provider}` has no keys yet (its JWK set has never loaded)")]
    Unavailable {
        /// The provider's name.
        provider: String,
    },
}

/// Why key material did not load (config time: a config error; fetch time: the status's
/// `last_error`, the last good keys staying in use).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// Not a JWK set (`{"keys": [...]}`) or PEM text.
    #[error("not a JWK set: {0}")]
    NotJwks(String),
    /// A PEM block that is no RSA, EC or Ed25519 public key.
    #[error("PEM block {index} is not an RSA, EC or Ed25519 public key: {why}")]
    BadPem {
        /// Its position (1-based).
        index: usize,
        /// What the parser said.
        why: String,
    },
    /// Nothing usable: no key of a public-key type (HMAC `oct` keys are never taken from a key
    /// set).
    #[error("no usable public key ({skipped} skipped)")]
    NoKeys {
        /// Keys skipped (unsupported type, `oct`, bad parameters).
        skipped: usize,
    },
    /// The fetch failed.
    #[error("{0}")]
    Fetch(#[from] FetchError),
}

/// Why fetching a JWK set failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The URL does not parse.
    #[error("bad JWKS URL: {0}")]
    BadUrl(String),
    /// Connect, send or read failed.
    #[error("fetching the JWK set failed: {0}")]
    Transport(String),
    /// Not 200.
    #[error("the JWK set answered status {0}")]
    Status(u16),
    /// Over `refresh.fetch_timeout`.
    #[error("fetching the JWK set took longer than {0:?}")]
    Timeout(std::time::Duration),
    /// Over `refresh.max_bytes`.
    #[error("the JWK set is larger than {0} bytes")]
    TooLarge(usize),
}
