//! The `$request` value: `{method, path, params, query, headers, body}`, built once per inbound
//! request. Knows nothing of HTTP libraries: callers pass plain strings and bytes. Also the
//! strict percent-decoding of path parameters ([`decode_path_param`]), which callers apply before
//! they pass them.

use crate::{Val, json::str_val};
use jaq_json::Map;
use std::borrow::Cow;

/// Parts of an inbound request.
pub struct RequestParts<'a, P, H> {
    /// Method, e.g. `GET`.
    pub method: &'a str,
    /// Path without the query.
    pub path: &'a str,
    /// Raw query string (without `?`).
    pub query: Option<&'a str>,
    /// Path parameters captured by the route pattern, as the caller wants them seen (the
    /// gateway passes them percent-decoded by [`decode_path_param`]).
    pub params: P,
    /// Headers (names lower-case). Repeated names are joined with `, `.
    pub headers: H,
    /// Parsed body (`null` when empty).
    pub body: Val,
}

fn key(s: &str) -> Val {
    str_val(s)
}

/// Build `$request`. Query parameters that repeat become arrays.
pub fn request_val<'a, P, H>(parts: RequestParts<'a, P, H>) -> Val
where
    P: IntoIterator<Item = (&'a str, &'a str)>,
    H: IntoIterator<Item = (&'a str, &'a [u8])>,
{
    let mut m = Map::default();
    m.insert(key("method"), str_val(parts.method));
    m.insert(key("path"), str_val(parts.path));
    let params: Map = parts
        .params
        .into_iter()
        .map(|(k, v)| (key(k), str_val(v)))
        .collect();
    m.insert(key("params"), Val::obj(params));
    m.insert(
        key("query"),
        Val::obj(parse_query(parts.query.unwrap_or(""))),
    );
    let mut headers = Map::default();
    for (k, v) in parts.headers {
        let v = String::from_utf8_lossy(v);
        let kv = key(k);
        match headers.get_mut(&kv) {
            Some(Val::TStr(prev)) => {
                let mut s = String::from_utf8_lossy(prev).into_owned();
                s.push_str(", ");
                s.push_str(&v);
                **prev = s.into_bytes().into();
            }
            _ => {
                headers.insert(kv, str_val(&v));
            }
        }
    }
    m.insert(key("headers"), Val::obj(headers));
    m.insert(key("body"), parts.body);
    Val::obj(m)
}

/// Parse a query string into an object; repeated names become arrays.
pub fn parse_query(q: &str) -> Map {
    let mut out = Map::default();
    for (k, v) in form_urlencoded_pairs(q) {
        let kv = key(&k);
        let vv = str_val(&v);
        match out.get_mut(&kv) {
            Some(Val::Arr(a)) => jaq_json::Rc::make_mut(a).push(vv),
            Some(prev) => {
                let first = std::mem::take(prev);
                *prev = [first, vv].into_iter().collect();
            }
            None => {
                out.insert(kv, vv);
            }
        }
    }
    out
}

fn form_urlencoded_pairs(q: &str) -> impl Iterator<Item = (String, String)> + '_ {
    q.split('&').filter(|s| !s.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k), decode(v))
    })
}

/// Why a path parameter cannot be percent-decoded ([`decode_path_param`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathParamError {
    /// A `%` not followed by two hex digits (`%ZZ`, a truncated `%4`).
    #[error("invalid percent-encoding (a `%` must be followed by two hex digits)")]
    BadEscape,
    /// The decoded bytes are not UTF-8 (e.g. `%FF`).
    #[error("not UTF-8 after percent-decoding")]
    NotUtf8,
}

/// Percent-decode one path parameter, strictly: every `%` starts a `%XX` escape and the result
/// is UTF-8, else an error. `+` stays `+` (it means a space only in query strings), and `%2F`
/// becomes `/` (routing has already matched the raw path). Borrows when there is no `%`.
pub fn decode_path_param(s: &str) -> Result<Cow<'_, str>, PathParamError> {
    if !s.contains('%') {
        return Ok(Cow::Borrowed(s));
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = |j: usize| b.get(j).and_then(|&c| (c as char).to_digit(16));
            let (Some(x), Some(y)) = (hex(i + 1), hex(i + 2)) else {
                return Err(PathParamError::BadEscape);
            };
            out.push((x * 16 + y) as u8);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| PathParamError::NotUtf8)
}

/// Percent-decode (`+` is a space), lossy on invalid UTF-8.
pub fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let h = |c: u8| (c as char).to_digit(16);
                match (h(b[i + 1]), h(b[i + 2])) {
                    (Some(x), Some(y)) => {
                        out.push((x * 16 + y) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::to_string;

    #[test]
    fn builds_request() {
        let v = request_val(RequestParts {
            method: "GET",
            path: "/a/1",
            query: Some("q=a+b%21&x=1&x=2&bad=%zz&tail=%4"),
            params: [("id", "1")],
            headers: [("h", &b"1"[..]), ("h", &b"2"[..])],
            body: Val::Null,
        });
        assert_eq!(
            to_string(&v),
            r#"{"method":"GET","path":"/a/1","params":{"id":"1"},"query":{"q":"a b!","x":["1","2"],"bad":"%zz","tail":"%4"},"headers":{"h":"1, 2"},"body":null}"#
        );
    }

    #[test]
    fn path_params_are_percent_decoded_strictly() {
        let ok = |s| decode_path_param(s).map(Cow::into_owned);
        assert_eq!(ok("plain"), Ok("plain".into()));
        assert!(matches!(decode_path_param("plain"), Ok(Cow::Borrowed(_))));
        assert_eq!(ok("a%20b"), Ok("a b".into()));
        assert_eq!(
            ok("a+b"),
            Ok("a+b".into()),
            "`+` is a space only in queries"
        );
        assert_eq!(ok("a%2Fb%2f"), Ok("a/b/".into()));
        assert_eq!(ok("%D0%BF%D1%80"), Ok("пр".into()));
        assert_eq!(ok("100%25"), Ok("100%".into()));
        for bad in ["%ZZ", "%4", "%", "a%2", "%g0", "x%%41"] {
            assert_eq!(
                decode_path_param(bad),
                Err(PathParamError::BadEscape),
                "{bad}"
            );
        }
        assert_eq!(decode_path_param("%FF"), Err(PathParamError::NotUtf8));
        assert_eq!(decode_path_param("%D0"), Err(PathParamError::NotUtf8));
    }
}
