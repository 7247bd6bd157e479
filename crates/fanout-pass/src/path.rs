//! The path a pass-through route sends (`pass.path`): a template of literal text and the
//! route's parameters, filled with the parameters as they came (still percent-encoded), the
//! request's query appended as it came.

use bytes::{BufMut, BytesMut};
use http::uri::PathAndQuery;

/// A compiled `pass.path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Param(String),
}

/// Why a `pass.path` does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// `{name}` names no parameter of the route's path.
    #[error("`pass.path` uses `{{{name}}}`, which the route's path `{route}` does not capture")]
    Unknown {
        /// The name used.
        name: String,
        /// The route's path.
        route: String,
    },
    /// A `{` without its `}`, or an empty name.
    #[error("`pass.path` `{0}` has an unclosed or empty `{{…}}`")]
    Syntax(String),
}

/// Why a request's path cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A parameter holds a `.` or `..` segment, which would climb out of the path the route
    /// sends to.
    #[error("path parameter `{0}` holds a `.` or `..` segment")]
    DotSegment(String),
    /// The result is not a valid path and query.
    #[error("the path to send is not a valid URI path")]
    Invalid,
}

/// The parameters `{name}` and `{*name}` of a route's path pattern.
fn route_params(route: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = route;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let name = &rest[open + 1..open + close];
        out.push(name.trim_start_matches('*'));
        rest = &rest[open + close + 1..];
    }
    out
}

impl Rewrite {
    /// `template` for a route whose path pattern is `route`.
    pub fn compile(template: &str, route: &str) -> Result<Rewrite, RewriteError> {
        let known = route_params(route);
        let mut pieces = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(RewriteError::Syntax(template.to_string()));
            };
            let name = rest[open + 1..open + close].trim_start_matches('*');
            if name.is_empty() {
                return Err(RewriteError::Syntax(template.to_string()));
            }
            if !known.contains(&name) {
                return Err(RewriteError::Unknown {
                    name: name.to_string(),
                    route: route.to_string(),
                });
            }
            pieces.push(Piece::Param(name.to_string()));
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Rewrite { pieces })
    }

    /// The path and query to send: the template filled with `params` (name, raw value), then
    /// `?query` when the request has one.
    pub fn apply<'a>(
        &self,
        params: impl Iterator<Item = (&'a str, &'a str)> + Clone,
        query: Option<&str>,
    ) -> Result<PathAndQuery, PathError> {
        let mut out = BytesMut::with_capacity(64);
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.put_slice(t.as_bytes()),
                Piece::Param(name) => {
                    let value = params
                        .clone()
                        .find(|(n, _)| n == name)
                        .map_or("", |(_, v)| v);
                    if has_dot_segment(value) {
                        return Err(PathError::DotSegment(name.clone()));
                    }
                    out.put_slice(value.as_bytes());
                }
            }
        }
        if let Some(q) = query {
            out.put_u8(b'?');
            out.put_slice(q.as_bytes());
        }
        PathAndQuery::from_maybe_shared(out.freeze()).map_err(|_| PathError::Invalid)
    }
}

/// Whether `raw` (percent-encoded) has a segment that is `.` or `..`, spelled plainly or with
/// `%2e` (either case).
fn has_dot_segment(raw: &str) -> bool {
    raw.split('/').any(|seg| {
        let s = seg.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn apply(t: &str, route: &str, params: &[(&str, &str)], q: Option<&str>) -> String {
        Rewrite::compile(t, route)
            .unwrap()
            .apply(params.iter().copied(), q)
            .map(|p| p.to_string())
            .unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn a_catch_all_strips_a_prefix_and_the_query_is_kept_as_it_came() {
        let r = "/files/{*rest}";
        assert_eq!(
            apply("/v1/{rest}", r, &[("rest", "a/b%20c")], Some("x=1&y=%2F")),
            "/v1/a/b%20c?x=1&y=%2F"
        );
        assert_eq!(apply("/{rest}", r, &[("rest", "a")], None), "/a");
        assert_eq!(
            apply(
                "/u/{id}/items/{*rest}",
                "/users/{id}/{*rest}",
                &[("id", "7"), ("rest", "x/y")],
                None
            ),
            "/u/7/items/x/y"
        );
    }

    #[test]
    fn dot_segments_are_refused_in_every_spelling() {
        let r = "/files/{*rest}";
        for v in ["..", "a/../b", "%2e%2E", ".%2e/x", "./a"] {
            assert!(
                apply("/v1/{rest}", r, &[("rest", v)], None).starts_with("error"),
                "{v}"
            );
        }
        assert_eq!(
            apply("/v1/{rest}", r, &[("rest", "a..b/.c")], None),
            "/v1/a..b/.c"
        );
    }

    #[test]
    fn unknown_and_broken_parameters_are_config_errors() {
        assert!(matches!(
            Rewrite::compile("/v1/{nope}", "/files/{*rest}"),
            Err(RewriteError::Unknown { .. })
        ));
        assert!(matches!(
            Rewrite::compile("/v1/{rest", "/files/{*rest}"),
            Err(RewriteError::Syntax(_))
        ));
        assert!(Rewrite::compile("/v1/{*rest}", "/files/{*rest}").is_ok());
    }
}
