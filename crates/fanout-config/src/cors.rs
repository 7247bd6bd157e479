//! Cross-origin resource sharing (`cors:`) for routes called from browser pages on other
//! origins (docs/config.md#cors). Off unless `defaults.cors` or a route's `cors` sets it.

use crate::{ConfigError, Dur, Located};
use schemars::JsonSchema;
use serde::Deserialize;

/// Which browser pages (origins) may call a route, with which methods and headers, and what
/// they may read of the answer. The gateway answers preflight `OPTIONS` requests itself
/// (before authentication, without running a flow) and puts the CORS headers on every answer
/// of the route, error answers included (401, 403, 429, 5xx), with `Vary: Origin`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cors {
    /// `false` turns CORS off (a route's `cors: {enabled: false}` turns the defaults' off for
    /// it). Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Allowed origins: exact (`https://app.example.com`, compared without case), a pattern
    /// with `*` standing for one DNS label (`https://*.example.com` matches
    /// `https://eu.example.com`, not `https://a.b.example.com` nor `https://example.com`), or
    /// `*` for any origin (not with `credentials`). The origin `null` (sandboxed pages, files)
    /// is allowed only when listed as `null`. Required when enabled.
    #[serde(default)]
    pub origins: Vec<Located<String>>,
    /// Methods a page may use. Default: the methods of the routes on the path.
    #[serde(default)]
    pub methods: Vec<Located<String>>,
    /// Request headers a page may send beyond the CORS-safelisted ones (`content-type`
    /// beyond its three simple values, `authorization`, `x-request-timeout` …), compared
    /// without case; `*` allows any (not with `credentials`, and never `authorization`, as
    /// browsers require). Default: none.
    #[serde(default)]
    pub headers: Vec<Located<String>>,
    /// Answer headers a page's script may read beyond the safelisted ones. Default: the
    /// request id header, `retry-after`, `ratelimit`, `ratelimit-policy`, `www-authenticate`
    /// and `server-timing`.
    pub expose_headers: Option<Vec<String>>,
    /// Whether pages may send cookies and HTTP authentication (`Access-Control-Allow-
    /// Credentials: true`); the allowed origin is then echoed, never `*`. Default false.
    #[serde(default)]
    pub credentials: bool,
    /// How long a browser may cache a preflight answer (`Access-Control-Max-Age`; browsers cap
    /// it, Chromium at 2 h). At most 24h. Default 10m.
    #[serde(default = "default_max_age")]
    pub max_age: Dur,
}

fn yes() -> bool {
    true
}

fn default_max_age() -> Dur {
    Dur::secs(600)
}

/// The longest `max_age` accepted (browsers cap it lower).
pub const MAX_AGE_LIMIT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Cors {
    /// Load-time checks: every origin well formed, no `*` (origin or header) with
    /// `credentials`, methods are HTTP method tokens, `max_age` within its limit.
    pub fn check(&self, errs: &mut Vec<ConfigError>) {
        if !self.enabled {
            return;
        }
        if self.origins.is_empty() {
            errs.push(
                ConfigError::at(
                    crate::Pos::default(),
                    "`cors.origins` is empty: no page could call the route",
                )
                .hint("list the origins, e.g. `origins: [https://app.example.com]`"),
            );
        }
        for o in &self.origins {
            if o.value == "*" {
                if self.credentials {
                    errs.push(
                        ConfigError::at(
                            o.pos,
                            "`cors.origins: *` with `credentials: true`: browsers refuse \
                             credentials for any origin",
                        )
                        .hint("list the origins that may send credentials"),
                    );
                }
                continue;
            }
            if o.value == "null" {
                continue;
            }
            if let Err(why) = origin_shape(&o.value) {
                errs.push(
                    ConfigError::at(o.pos, format!("`{}` is not an origin: {why}", o.value)).hint(
                        "write scheme://host[:port] with no path, e.g. \
                             `https://app.example.com` or `https://*.example.com`",
                    ),
                );
            }
        }
        for m in &self.methods {
            if !is_token(&m.value) || m.value == "*" {
                errs.push(
                    ConfigError::at(m.pos, format!("`{}` is not an HTTP method", m.value))
                        .hint("write e.g. `methods: [GET, POST]`"),
                );
            }
        }
        for h in &self.headers {
            let v = h.value.trim();
            if v == "*" {
                if self.credentials {
                    errs.push(
                        ConfigError::at(
                            h.pos,
                            "`cors.headers: *` with `credentials: true`: browsers ignore `*` \
                             with credentials",
                        )
                        .hint("list the headers pages send, e.g. `[authorization, content-type]`"),
                    );
                }
                continue;
            }
            if !is_token(v) {
                errs.push(ConfigError::at(
                    h.pos,
                    format!("`{}` is not a header name", h.value),
                ));
            }
        }
        for h in self.expose_headers.iter().flatten() {
            if h != "*" && !is_token(h.trim()) {
                errs.push(ConfigError::at(
                    crate::Pos::default(),
                    format!("cors.expose_headers: `{h}` is not a header name"),
                ));
            }
        }
        if self.max_age.0 > MAX_AGE_LIMIT {
            errs.push(
                ConfigError::at(
                    crate::Pos::default(),
                    format!("`cors.max_age` {} is over 24h", self.max_age),
                )
                .hint("browsers cap it at 2h (Chromium) to 24h (Firefox)"),
            );
        }
    }
}

/// Whether `s` is an HTTP token (a method or a header name).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether `o` is `scheme://host[:port]` (the host may hold `*` labels), lower or upper case.
fn origin_shape(o: &str) -> Result<(), &'static str> {
    let (scheme, rest) = o.split_once("://").ok_or("no `scheme://`")?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return Err("a bad scheme");
    }
    if rest.is_empty() {
        return Err("no host");
    }
    if rest.contains(['/', '?', '#', '@']) {
        return Err("an origin has no path, query, fragment or user");
    }
    let host = match rest.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(']') || rest.starts_with('[') => {
            if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.len() > 5 {
                return Err("a bad port");
            }
            h
        }
        _ => rest,
    };
    if host.is_empty() {
        return Err("no host");
    }
    let ok = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-.*[]:".contains(&b));
    if !ok {
        return Err("a bad host");
    }
    if host
        .split('.')
        .any(|label| label.contains('*') && label != "*")
    {
        return Err("`*` stands for a whole label (`https://*.example.com`)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::origin_shape;

    #[test]
    fn origins_are_scheme_host_and_port() {
        for ok in [
            "https://app.example.com",
            "http://127.0.0.1:8080",
            "https://*.example.com",
            "http://[::1]:3000",
            "HTTPS://App.Example.com",
        ] {
            assert!(origin_shape(ok).is_ok(), "{ok}");
        }
        for bad in [
            "app.example.com",
            "https://",
            "https://app.example.com/",
            "https://app.example.com/path",
            "https://user@app.example.com",
            "https://a*b.example.com",
            "https://app.example.com:http",
            "https://app example.com",
        ] {
            assert!(origin_shape(bad).is_err(), "{bad}");
        }
    }
}
