//! The `$request` value: `{method, path, params, query, headers, body}`, built once per inbound
//! request. Knows nothing of HTTP libraries: callers pass plain strings and bytes. Also the
//! strict percent-decoding of path parameters ([`decode_path_param`]), which callers apply before
//! they pass them.
//!
//! A route builds only the parts its expressions read ([`RequestUse`], found at compile time
//! by [`Expr::request_use`](crate::Expr::request_use)): a flow that reads `$request.params.id`
//! gets `{params: {id}}` — the same answer for every expression of it, without the headers and
//! query turned into values for every request.

use crate::{Val, json::str_val};
use jaq_core::load::lex::{StrPart, Tok, Token};
use jaq_json::Map;
use std::borrow::Cow;

/// Which headers of `$request.headers` are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HeaderUse {
    /// None.
    #[default]
    None,
    /// These names only, as written (`$request.headers["x-user"]`; the object's keys are
    /// lower-case, so a name with capitals reads `null`, as it would from the whole object).
    Named(Vec<String>),
    /// The whole object (`$request.headers`, `$request.headers | keys`, `$request`).
    All,
}

/// The parts of `$request` that expressions read. Found from each expression's tokens: a read
/// is `$request.FIELD` (or `$request["FIELD"]`, `$request."FIELD"`), and for `headers` also the
/// header's name; any other use of `$request` (passed whole, bound, indexed by a computed key)
/// reads all of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestUse {
    /// `$request.method`.
    pub method: bool,
    /// `$request.path`.
    pub path: bool,
    /// `$request.params`.
    pub params: bool,
    /// `$request.query`.
    pub query: bool,
    /// `$request.headers`.
    pub headers: HeaderUse,
    /// `$request.body`.
    pub body: bool,
    /// `$request.client` (`{address}`: the client's address, from the socket or a trusted proxy).
    pub client: bool,
    /// `$request.auth` (the verified token's claims).
    pub auth: bool,
    /// `$request.tls` (the connection's TLS: version, ALPN, SNI, verified client certificate).
    pub tls: bool,
}

impl RequestUse {
    /// Every part (a use the analysis cannot narrow).
    pub fn all() -> RequestUse {
        RequestUse {
            method: true,
            path: true,
            params: true,
            query: true,
            headers: HeaderUse::All,
            body: true,
            client: true,
            auth: true,
            tls: true,
        }
    }

    /// Whether every part is read.
    pub fn is_all(&self) -> bool {
        *self == RequestUse::all()
    }

    /// Add what `other` reads.
    pub fn add(&mut self, other: &RequestUse) {
        self.method |= other.method;
        self.path |= other.path;
        self.params |= other.params;
        self.query |= other.query;
        self.body |= other.body;
        self.client |= other.client;
        self.auth |= other.auth;
        self.tls |= other.tls;
        self.headers = match (std::mem::take(&mut self.headers), &other.headers) {
            (HeaderUse::All, _) | (_, HeaderUse::All) => HeaderUse::All,
            (HeaderUse::None, o) => o.clone(),
            (h, HeaderUse::None) => h,
            (HeaderUse::Named(mut a), HeaderUse::Named(b)) => {
                a.extend(b.iter().cloned());
                a.sort_unstable();
                a.dedup();
                HeaderUse::Named(a)
            }
        };
    }

    /// The parts read in `$name` by an expression's `tokens`.
    pub(crate) fn of_tokens(tokens: &[Token<&str>], name: &str) -> RequestUse {
        let mut out = RequestUse::default();
        scan(tokens, name, &mut out);
        out
    }

    fn field(&mut self, field: &str) {
        match field {
            "method" => self.method = true,
            "path" => self.path = true,
            "params" => self.params = true,
            "query" => self.query = true,
            "body" => self.body = true,
            "client" => self.client = true,
            "auth" => self.auth = true,
            "tls" => self.tls = true,
            // Any other key is `null` in the whole value as in the parts.
            _ => {}
        }
    }

    fn header(&mut self, h: HeaderUse) {
        self.add(&RequestUse {
            headers: h,
            ..RequestUse::default()
        });
    }
}

/// The text of a string token without interpolation.
fn literal(t: &Token<&str>) -> Option<String> {
    let Tok::Str(parts) = &t.1 else {
        return None;
    };
    let mut out = String::new();
    for p in parts {
        match p {
            StrPart::Str(s) => out.push_str(s),
            StrPart::Char(c) => out.push(*c),
            StrPart::Term(_) => return None,
        }
    }
    Some(out)
}

/// A literal key read at `tokens[i]` — `.name`, `."name"` (two tokens) or `["name"]` — and the
/// index of the token after it.
fn key_at(tokens: &[Token<&str>], i: usize) -> Option<(String, usize)> {
    let Token(s, tok) = tokens.get(i)?;
    match tok {
        Tok::Sym if *s == "." => literal(tokens.get(i + 1)?).map(|k| (k, i + 2)),
        Tok::Sym if s.len() > 1 && s.starts_with('.') && !s.starts_with("..") => {
            Some((s[1..].to_string(), i + 1))
        }
        Tok::Block(inner) if s.starts_with('[') => match inner.as_slice() {
            [key, close] if close.0 == "]" => literal(key).map(|k| (k, i + 1)),
            _ => None,
        },
        _ => None,
    }
}

fn scan(tokens: &[Token<&str>], name: &str, out: &mut RequestUse) {
    for (i, Token(s, tok)) in tokens.iter().enumerate() {
        match tok {
            Tok::Var if s.strip_prefix('$') == Some(name) => match key_at(tokens, i + 1) {
                Some((field, j)) if field == "headers" => match key_at(tokens, j) {
                    Some((h, _)) => out.header(HeaderUse::Named(vec![h])),
                    None => out.header(HeaderUse::All),
                },
                Some((field, _)) => out.field(&field),
                None => *out = RequestUse::all(),
            },
            Tok::Block(inner) => scan(inner, name, out),
            Tok::Str(parts) => {
                for p in parts {
                    if let StrPart::Term(t) = p {
                        scan(std::slice::from_ref(t), name, out);
                    }
                }
            }
            _ => {}
        }
    }
}

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
    /// The client's address (`$request.client.address`; `None`: `null`).
    pub client: Option<&'a str>,
    /// The verified token's claims (`null` when anonymous).
    pub auth: Val,
    /// The connection's TLS (`null` on a plain connection).
    pub tls: Val,
}

/// No path parameters: those of [`RequestParts::new`] until [`RequestParts::with_params`].
pub type NoParams<'a> = std::iter::Empty<(&'a str, &'a str)>;

impl<'a, H> RequestParts<'a, NoParams<'a>, H> {
    /// A request's method, path, query (without `?`) and headers (names lower-case); no path
    /// parameters, body, client address, claims or TLS (`null`) until the `with_*` methods give
    /// them — each stage of the edge fills what it knows.
    pub fn new(method: &'a str, path: &'a str, query: Option<&'a str>, headers: H) -> Self {
        RequestParts {
            method,
            path,
            query,
            params: std::iter::empty(),
            headers,
            body: Val::Null,
            client: None,
            auth: Val::Null,
            tls: Val::Null,
        }
    }
}

impl<'a, P, H> RequestParts<'a, P, H> {
    /// The path parameters the route's pattern captured (`$request.params`).
    pub fn with_params<Q>(self, params: Q) -> RequestParts<'a, Q, H> {
        RequestParts {
            method: self.method,
            path: self.path,
            query: self.query,
            params,
            headers: self.headers,
            body: self.body,
            client: self.client,
            auth: self.auth,
            tls: self.tls,
        }
    }

    /// The parsed body (`$request.body`).
    pub fn with_body(mut self, body: Val) -> Self {
        self.body = body;
        self
    }

    /// The client's address (`$request.client.address`; `None`: `null`).
    pub fn with_client(mut self, client: Option<&'a str>) -> Self {
        self.client = client;
        self
    }

    /// The verified token's claims (`$request.auth`).
    pub fn with_auth(mut self, auth: Val) -> Self {
        self.auth = auth;
        self
    }

    /// The connection's TLS (`$request.tls`).
    pub fn with_tls(mut self, tls: Val) -> Self {
        self.tls = tls;
        self
    }
}

fn key(s: &str) -> Val {
    str_val(s)
}

/// A path parameter's name as `$request.params` keys it: text, made into a value per request, or
/// a value made once (a route's parameter names, made when its config is compiled), which each
/// request takes a reference count of.
pub trait ParamKey {
    /// The key.
    fn into_key(self) -> Val;
}

impl ParamKey for &str {
    fn into_key(self) -> Val {
        key(self)
    }
}

impl ParamKey for Val {
    fn into_key(self) -> Val {
        self
    }
}

/// The names of the path parameters in a route pattern (`/users/{id}/files/{*rest}` → `id`,
/// `rest`), as keys made once: [`ParamKey`].
pub fn param_keys(pattern: &str) -> Vec<(Box<str>, Val)> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        // `{{` is a literal brace.
        if let Some(tail) = after.strip_prefix('{') {
            rest = tail;
            continue;
        }
        let Some(close) = after.find('}') else { break };
        let name = after[..close].trim_start_matches('*');
        if !name.is_empty() && !out.iter().any(|(n, _): &(Box<str>, Val)| &**n == name) {
            out.push((name.into(), key(name)));
        }
        rest = &after[close + 1..];
    }
    out
}

/// The name of a part of `$request`: made once, each request takes a reference count.
fn part(s: &'static str) -> Val {
    const PARTS: [&str; 6] = ["method", "path", "params", "query", "headers", "body"];
    static NAMES: std::sync::LazyLock<[Val; 6]> =
        std::sync::LazyLock::new(|| PARTS.map(crate::json::static_str_val));
    match PARTS.iter().position(|p| *p == s) {
        Some(i) => NAMES[i].clone(),
        None => crate::json::static_str_val(s),
    }
}

/// Build `$request`. Query parameters that repeat become arrays.
pub fn request_val<'a, P, H, K>(parts: RequestParts<'a, P, H>) -> Val
where
    P: IntoIterator<Item = (K, &'a str)>,
    K: ParamKey,
    H: IntoIterator<Item = (&'a str, &'a [u8])>,
{
    request_val_reading(parts, &RequestUse::all())
}

/// Build the parts of `$request` that `reads` names (the others are left out of the object:
/// reading them gives `null`, which only an expression that `reads` does not describe could
/// tell).
pub fn request_val_reading<'a, P, H, K>(parts: RequestParts<'a, P, H>, reads: &RequestUse) -> Val
where
    P: IntoIterator<Item = (K, &'a str)>,
    K: ParamKey,
    H: IntoIterator<Item = (&'a str, &'a [u8])>,
{
    let parts_read = [
        reads.method,
        reads.path,
        reads.params,
        reads.query,
        reads.body,
        reads.client,
        reads.auth,
        reads.tls,
    ]
    .iter()
    .filter(|&&r| r)
    .count()
        + usize::from(reads.headers != HeaderUse::None);
    let mut m = Map::with_capacity_and_hasher(parts_read, Default::default());
    if reads.method {
        m.insert(part("method"), str_val(parts.method));
    }
    if reads.path {
        m.insert(part("path"), str_val(parts.path));
    }
    if reads.params {
        let params: Map = parts
            .params
            .into_iter()
            .map(|(k, v)| (k.into_key(), str_val(v)))
            .collect();
        m.insert(part("params"), Val::obj(params));
    }
    if reads.query {
        m.insert(
            part("query"),
            Val::obj(parse_query(parts.query.unwrap_or(""))),
        );
    }
    let wanted = |name: &str| match &reads.headers {
        HeaderUse::None => false,
        HeaderUse::All => true,
        HeaderUse::Named(names) => names.iter().any(|n| n == name),
    };
    if reads.headers != HeaderUse::None {
        let mut headers = Map::default();
        for (k, v) in parts.headers {
            if !wanted(k) {
                continue;
            }
            let v = String::from_utf8_lossy(v);
            let kv = key(k);
            match headers.get_mut(&kv) {
                Some(Val::TStr(prev)) => {
                    let mut s = String::from_utf8_lossy(prev).into_owned();
                    s.push_str(", ");
                    s.push_str(&v);
                    *prev = jaq_json::Rc::new(s.into_bytes().into());
                }
                _ => {
                    headers.insert(kv, str_val(&v));
                }
            }
        }
        m.insert(part("headers"), Val::obj(headers));
    }
    if reads.body {
        m.insert(part("body"), parts.body);
    }
    if reads.client {
        let mut c = Map::default();
        let address = parts.client.map_or(Val::Null, str_val);
        c.insert(key("address"), address);
        m.insert(part("client"), Val::obj(c));
    }
    if reads.auth {
        m.insert(part("auth"), parts.auth);
    }
    if reads.tls {
        m.insert(part("tls"), parts.tls);
    }
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

/// A part of the request the flow reads that is not text: `$request` holds strings, and bytes
/// that are not UTF-8 are refused — as a path parameter that does not decode is — never
/// replaced by U+FFFD (`?q=a%FFb` would otherwise reach a backend or a database as another
/// value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestTextError {
    /// A query parameter (its name as sent, still percent-encoded) whose name or value is not
    /// UTF-8 after percent-decoding.
    #[error("query parameter `{0}`: not UTF-8 after percent-decoding")]
    Query(String),
    /// A header whose value is not UTF-8.
    #[error("header {0}: not UTF-8")]
    Header(String),
}

/// Check that the parts of a request that `reads` names are text, as [`request_val_reading`]
/// needs them: the query's names and values after percent-decoding (when the flow reads
/// `$request.query`), the value of each header it reads. A query without `%` and ASCII headers
/// are checked without decoding.
pub fn check_text<'a>(
    query: Option<&str>,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    reads: &RequestUse,
) -> Result<(), RequestTextError> {
    if reads.query
        && let Some(q) = query.filter(|q| q.contains('%'))
    {
        for pair in q.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if std::str::from_utf8(&decode_bytes(k)).is_err()
                || std::str::from_utf8(&decode_bytes(v)).is_err()
            {
                return Err(RequestTextError::Query(k.to_string()));
            }
        }
    }
    if reads.headers != HeaderUse::None {
        for (k, v) in headers {
            let wanted = match &reads.headers {
                HeaderUse::None => false,
                HeaderUse::All => true,
                HeaderUse::Named(names) => names.iter().any(|n| n == k),
            };
            if wanted && !v.is_ascii() && std::str::from_utf8(v).is_err() {
                return Err(RequestTextError::Header(k.to_string()));
            }
        }
    }
    Ok(())
}

/// Percent-decode (`+` is a space), lossy on invalid UTF-8 (which [`check_text`] refuses
/// before a request's query is decoded).
pub fn decode(s: &str) -> String {
    String::from_utf8_lossy(&decode_bytes(s)).into_owned()
}

/// Percent-decode (`+` is a space) to bytes; a `%` without two hex digits stays as it is.
fn decode_bytes(s: &str) -> Vec<u8> {
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::to_string;

    #[test]
    fn builds_request() {
        let v = request_val(
            RequestParts::new(
                "GET",
                "/a/1",
                Some("q=a+b%21&x=1&x=2&bad=%zz&tail=%4"),
                [("h", &b"1"[..]), ("h", &b"2"[..])],
            )
            .with_params([("id", "1")])
            .with_client(Some("192.0.2.1")),
        );
        assert_eq!(
            to_string(&v),
            r#"{"method":"GET","path":"/a/1","params":{"id":"1"},"query":{"q":"a b!","x":["1","2"],"bad":"%zz","tail":"%4"},"headers":{"h":"1, 2"},"body":null,"client":{"address":"192.0.2.1"},"auth":null,"tls":null}"#
        );
        assert!(reads("$request.client.address").client);
        assert!(!reads("$request.path").client);
        assert!(reads("$request.tls.client.subject").tls);
        assert!(!reads("$request.path").tls);
        assert!(!reads("$request.client").tls);
        assert!(RequestUse::all().tls);
    }

    fn reads(src: &str) -> RequestUse {
        crate::Expr::compile(src, &["request", "x"])
            .unwrap()
            .request_use()
    }

    fn named(h: &[&str]) -> HeaderUse {
        HeaderUse::Named(h.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn the_parts_of_the_request_an_expression_reads() {
        let params = RequestUse {
            params: true,
            ..RequestUse::default()
        };
        for src in [
            "$request.params.id",
            "$request.params.id | tonumber",
            "$request[\"params\"].id",
            "$request.\"params\"",
            "\"/u/\\($request.params.id)\"",
            "[$x, {a: $request.params}]",
            "$request.params?",
        ] {
            assert_eq!(reads(src), params, "{src}");
        }
        assert_eq!(reads("$x.a"), RequestUse::default());
        assert_eq!(reads("$request.nothing"), RequestUse::default());
        for src in [
            "$request",
            "$request | .params",
            "$request[$x]",
            "$request[\"pa\\(1)\"]",
            "$x as $request | 1",
            "[$request][0].params",
        ] {
            assert!(reads(src).is_all(), "{src}");
        }
        let h = |src: &str| reads(src).headers;
        assert_eq!(h("$request.headers[\"x-user\"]"), named(&["x-user"]));
        assert_eq!(h("$request.headers.\"x-user\""), named(&["x-user"]));
        assert_eq!(
            h("$request.headers.authorization"),
            named(&["authorization"])
        );
        assert_eq!(
            h("[$request.headers.b, $request.headers[\"a\"], $request.headers.b]"),
            named(&["a", "b"])
        );
        assert_eq!(h("$request.headers"), HeaderUse::All);
        assert_eq!(h("$request.headers | keys"), HeaderUse::All);
        assert_eq!(h("$request.headers[$x]"), HeaderUse::All);
        assert_eq!(h("$request.headers.a, $request.headers"), HeaderUse::All);
        let mut u = reads("{q: $request.query.q, m: $request.method}");
        assert!(u.query && u.method && !u.params && !u.body && !u.path);
        u.add(&reads("$request.body.a + ($request.path | length)"));
        assert!(u.query && u.method && u.body && u.path && !u.params);
    }

    #[test]
    fn a_request_built_for_its_reads_answers_those_reads_alike() {
        let parts = || {
            let headers = [
                ("x-user", &b"ann"[..]),
                ("x-user", &b"bob"[..]),
                ("x-request-id", &b"r-1"[..]),
            ];
            RequestParts::new("POST", "/a/1", Some("q=1&q=2"), headers)
                .with_params([("id", "1")])
                .with_body(Val::from(true))
        };
        let whole = request_val(parts());
        for src in [
            "$request.params.id",
            "$request.headers[\"x-user\"]",
            "$request.headers[\"X-User\"]",
            "[$request.query.q, $request.method, $request.path, $request.body]",
            "$request.headers | keys",
            "$request | keys",
        ] {
            let e = crate::Expr::compile(src, &["request"]).unwrap();
            let part = request_val_reading(parts(), &e.request_use());
            let a = e.eval(&Val::Null, |_| whole.clone()).unwrap();
            let b = e.eval(&Val::Null, |_| part.clone()).unwrap();
            assert_eq!(to_string(&a), to_string(&b), "{src}");
        }
        let e = crate::Expr::compile("$request.headers[\"x-user\"]", &["request"]).unwrap();
        assert_eq!(
            to_string(&request_val_reading(parts(), &e.request_use())),
            r#"{"headers":{"x-user":"ann, bob"}}"#,
            "only the header read"
        );
    }

    #[test]
    fn the_verified_claims_are_built_only_when_read() {
        assert!(reads("$request.auth.sub").auth);
        assert!(reads("$request[\"auth\"]").auth);
        assert!(!reads("$request.body.auth").auth);
        assert!(RequestUse::all().auth);
        let parts = |auth: Val| {
            RequestParts::new("GET", "/", None, std::iter::empty())
                .with_params([("id", "1")])
                .with_auth(auth)
        };
        let claims = crate::json::parse(br#"{"sub":"ann"}"#).unwrap();
        let e = crate::Expr::compile("$request.auth.sub", &["request"]).unwrap();
        assert_eq!(
            to_string(&request_val_reading(
                parts(claims.clone()),
                &e.request_use()
            )),
            r#"{"auth":{"sub":"ann"}}"#
        );
        let e = crate::Expr::compile("$request.params.id", &["request"]).unwrap();
        assert_eq!(
            to_string(&request_val_reading(parts(claims), &e.request_use())),
            r#"{"params":{"id":"1"}}"#,
            "claims a flow does not read are not part of its request value"
        );
    }

    #[test]
    fn a_routes_parameter_names_are_keys_made_once() {
        let names =
            |p: &str| -> Vec<String> { param_keys(p).into_iter().map(|(n, _)| n.into()).collect() };
        assert_eq!(names("/users/{id}/files/{*rest}"), ["id", "rest"]);
        assert_eq!(names("/a/{{literal}}/{x}"), ["x"]);
        assert_eq!(names("/{x}/{x}"), ["x"]);
        assert!(names("/plain").is_empty());
        assert!(names("/broken/{x").is_empty());
        // A made key and a key made from text build the same `$request`.
        let keys = param_keys("/users/{id}");
        let made = request_val(
            RequestParts::new("GET", "/users/7", None, std::iter::empty())
                .with_params(keys.iter().map(|(_, k)| (k.clone(), "7"))),
        );
        let text = request_val(
            RequestParts::new("GET", "/users/7", None, std::iter::empty())
                .with_params([("id", "7")]),
        );
        assert_eq!(to_string(&made), to_string(&text));
    }

    #[test]
    fn a_query_or_header_the_flow_reads_must_be_text() {
        let query = RequestUse {
            query: true,
            ..RequestUse::default()
        };
        let header = RequestUse {
            headers: named(&["x-name"]),
            ..RequestUse::default()
        };
        let none: [(&str, &[u8]); 0] = [];
        assert_eq!(check_text(Some("q=a%20b&r=%D0%BF"), none, &query), Ok(()));
        assert_eq!(
            check_text(Some("ok=1&q=a%FFb"), none, &query),
            Err(RequestTextError::Query("q".into()))
        );
        assert_eq!(
            check_text(Some("%C3=1"), none, &query),
            Err(RequestTextError::Query("%C3".into()))
        );
        // Not read: not checked.
        assert_eq!(check_text(Some("q=a%FFb"), none, &header), Ok(()));
        let bad: [(&str, &[u8]); 2] = [("x-other", b"\xff"), ("x-name", b"a\xffb")];
        assert_eq!(
            check_text(None, bad, &header),
            Err(RequestTextError::Header("x-name".into()))
        );
        assert_eq!(check_text(None, bad, &query), Ok(()));
        let fine: [(&str, &[u8]); 1] = [("x-name", "при".as_bytes())];
        assert_eq!(check_text(None, fine, &header), Ok(()));
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
