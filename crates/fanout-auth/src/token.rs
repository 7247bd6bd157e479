//! Where a token is read (`token:`), its header read before any key is chosen, the scopes of
//! verified claims.

use crate::error::TokenError;
use base64::Engine;
use fanout_config::auth::TokenSource;
use fanout_expr::Val;
use http::HeaderName;
use std::borrow::Cow;

/// Where a provider reads the token.
pub(crate) enum Where {
    /// `Authorization: Bearer <token>`.
    Authorization,
    /// Another header: the token, or `Bearer <token>`.
    Header(HeaderName),
    /// A cookie's value.
    Cookie(String),
    /// A query parameter (only with `allow_query`).
    Query(String),
}

impl Where {
    pub(crate) fn from_config(t: &TokenSource) -> Result<Where, String> {
        let given = [t.header.is_some(), t.cookie.is_some(), t.query.is_some()]
            .iter()
            .filter(|g| **g)
            .count();
        if given > 1 {
            return Err("give one of `header`, `cookie`, `query`".into());
        }
        if let Some(h) = &t.header {
            let name = HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                .map_err(|_| format!("`{h}` is not a header name"))?;
            return Ok(if name == http::header::AUTHORIZATION {
                Where::Authorization
            } else {
                Where::Header(name)
            });
        }
        if let Some(c) = &t.cookie {
            return Ok(Where::Cookie(c.clone()));
        }
        if let Some(q) = &t.query {
            if !t.allow_query {
                return Err(format!(
                    "reading the token from the query parameter `{q}` needs `allow_query: true` \
                     (URLs end up in logs, proxies and browser histories)"
                ));
            }
            return Ok(Where::Query(q.clone()));
        }
        Ok(Where::Authorization)
    }

    /// The token, `None` when the request has none.
    pub(crate) fn read<'a>(
        &self,
        headers: &'a http::HeaderMap,
        query: Option<&'a str>,
    ) -> Result<Option<Cow<'a, str>>, TokenError> {
        let text = |v: &'a http::HeaderValue| {
            v.to_str()
                .map_err(|_| TokenError::Malformed("the header is not text".into()))
        };
        match self {
            Where::Authorization => {
                let Some(v) = headers.get(http::header::AUTHORIZATION) else {
                    return Ok(None);
                };
                Ok(bearer(text(v)?).map(Cow::Borrowed))
            }
            Where::Header(name) => {
                let Some(v) = headers.get(name) else {
                    return Ok(None);
                };
                let v = text(v)?.trim();
                Ok((!v.is_empty()).then(|| Cow::Borrowed(bearer(v).unwrap_or(v))))
            }
            Where::Cookie(name) => {
                for v in headers.get_all(http::header::COOKIE) {
                    for pair in text(v)?.split(';') {
                        if let Some((k, val)) = pair.trim().split_once('=')
                            && k == name
                            && !val.is_empty()
                        {
                            return Ok(Some(Cow::Borrowed(val)));
                        }
                    }
                }
                Ok(None)
            }
            Where::Query(name) => Ok(query.and_then(|q| {
                q.split('&').find_map(|pair| {
                    let (k, v) = pair.split_once('=')?;
                    (k == name && !v.is_empty()).then_some(Cow::Borrowed(v))
                })
            })),
        }
    }
}

/// `Bearer <token>` (the scheme in any case).
fn bearer(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The token's header; `alg: none` is named as such, and a header whose `crit` names anything
/// is refused (fanout understands no JWS extension).
pub(crate) fn header(token: &str) -> Result<jsonwebtoken::Header, TokenError> {
    let raw = || {
        token
            .split('.')
            .next()
            .and_then(|h| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(h)
                    .ok()
            })
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    };
    match jsonwebtoken::decode_header(token) {
        Ok(h) => {
            // `jsonwebtoken` drops `crit`; read the header's JSON again for it.
            if let Some(crit) = raw().as_ref().and_then(|h| h.get("crit")) {
                return Err(TokenError::Critical(critical(crit)));
            }
            Ok(h)
        }
        Err(e) => {
            // `none` is no algorithm `jsonwebtoken` knows: say so rather than "bad header".
            let alg_none = raw()
                .and_then(|h| {
                    h.get("alg")?
                        .as_str()
                        .map(|a| a.eq_ignore_ascii_case("none"))
                })
                .unwrap_or(false);
            if alg_none {
                Err(TokenError::AlgNone)
            } else {
                // The parser's message quotes the header's values (an `alg` of the client's):
                // escaped, so it cannot forge a log line.
                Err(TokenError::Malformed(crate::error::escaped(&e.to_string())))
            }
        }
    }
}

/// What a `crit` header names, for the log: the names quoted (at most 4), or what it is when
/// it is not a list of names.
fn critical(crit: &serde_json::Value) -> String {
    match crit.as_array() {
        Some(names) if !names.is_empty() && names.iter().all(|n| n.is_string()) => {
            let mut out: Vec<String> = names
                .iter()
                .take(4)
                .map(|n| crate::error::quoted(n.as_str().unwrap_or_default()))
                .collect();
            if names.len() > 4 {
                out.push(format!("and {} more", names.len() - 4));
            }
            out.join(", ")
        }
        Some(names) if names.is_empty() => "an empty list".into(),
        _ => "a value that is not a list of names".into(),
    }
}

/// The scopes of verified claims: `scope` (space-separated) or `scp` (an array or a string).
pub fn scopes(claims: &Val) -> Vec<String> {
    let mut out = Vec::new();
    let Val::Obj(m) = claims else {
        return out;
    };
    for k in ["scope", "scp"] {
        match m.get(&fanout_expr::json::str_val(k)) {
            Some(Val::TStr(s)) | Some(Val::BStr(s)) => out.extend(
                String::from_utf8_lossy(s)
                    .split_whitespace()
                    .map(str::to_string),
            ),
            Some(Val::Arr(a)) => {
                for v in a.iter() {
                    if let Val::TStr(s) = v {
                        out.push(String::from_utf8_lossy(s).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(yaml: serde_json::Value) -> TokenSource {
        serde_json::from_value(yaml).unwrap()
    }

    #[test]
    fn a_token_is_read_where_the_provider_says() {
        let mut h = http::HeaderMap::new();
        h.insert("authorization", "bearer abc".parse().unwrap());
        h.insert("x-token", "def".parse().unwrap());
        h.insert("cookie", "a=1; session=ghi".parse().unwrap());
        let read = |w: Where, q| w.read(&h, q).unwrap().map(|c: Cow<'_, str>| c.into_owned());
        let w = |v| Where::from_config(&src(v)).unwrap();
        assert_eq!(read(w(serde_json::json!({})), None).as_deref(), Some("abc"));
        assert_eq!(
            read(w(serde_json::json!({"header": "X-Token"})), None).as_deref(),
            Some("def")
        );
        assert_eq!(
            read(w(serde_json::json!({"cookie": "session"})), None).as_deref(),
            Some("ghi")
        );
        let q = w(serde_json::json!({"query": "access_token", "allow_query": true}));
        assert_eq!(
            read(q, Some("a=1&access_token=jkl")).as_deref(),
            Some("jkl")
        );
        assert!(Where::from_config(&src(serde_json::json!({"query": "t"}))).is_err());
        // Another scheme is no bearer token.
        let mut basic = http::HeaderMap::new();
        basic.insert("authorization", "Basic dXNlcg==".parse().unwrap());
        assert!(Where::Authorization.read(&basic, None).unwrap().is_none());
    }
}
