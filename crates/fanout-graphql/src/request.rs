//! GraphQL over HTTP: the request's parameters from a POST's JSON body or a GET's query, the
//! answer's media type from `Accept`, and the answer's status. A request that is not a
//! well-formed GraphQL-over-HTTP request (a POST that is not `application/json`, a parameter of
//! the wrong type) is refused with its 4xx whatever the answer's media type.

use fanout_expr::Val;
use fanout_expr::json::obj_get;

/// The GraphQL-over-HTTP media type of answers.
pub(crate) const GRAPHQL_RESPONSE: &str = "application/graphql-response+json";
/// The legacy media type, when the client asks for it (and not for the new one).
pub(crate) const JSON: &str = "application/json";

/// A request's parameters.
pub(crate) struct Params {
    pub(crate) query: Option<String>,
    pub(crate) operation_name: Option<String>,
    /// The variables as JSON text (an object), if any.
    pub(crate) variables: Option<Val>,
    /// `extensions.persistedQuery.sha256Hash` (APQ), if the request has one.
    pub(crate) persisted: Option<Persisted>,
    pub(crate) is_get: bool,
    /// Whether the answer is `application/json` (else `application/graphql-response+json`).
    pub(crate) legacy: bool,
}

/// A request's `extensions.persistedQuery`.
pub(crate) struct Persisted {
    /// `version` (only 1 is known).
    pub(crate) version: Option<isize>,
    /// `sha256Hash`, as sent.
    pub(crate) hash: String,
}

/// A request that is not a well-formed GraphQL-over-HTTP request: its status, code and message.
pub(crate) struct BadRequest {
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest {
        status: 400,
        code: "BAD_REQUEST",
        message: message.into(),
    }
}

fn get<'a>(v: &'a Val, name: &str) -> Option<&'a Val> {
    match v {
        Val::Obj(o) => obj_get(o, name),
        _ => None,
    }
}

fn text(v: Option<&Val>) -> Option<String> {
    match v {
        Some(Val::TStr(b)) | Some(Val::BStr(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        // a query parameter given twice: its first value
        Some(Val::Arr(a)) => text(a.first()),
        _ => None,
    }
}

/// The parameters of `request` (`$request`).
pub(crate) fn params(request: &Val) -> Result<Params, (BadRequest, bool)> {
    let method = text(get(request, "method")).unwrap_or_default();
    let accept = get(request, "headers")
        .and_then(|h| text(get(h, "accept")))
        .unwrap_or_default();
    let legacy = prefers_legacy(&accept);
    let is_get = method.eq_ignore_ascii_case("GET");
    let (query, name, vars, ext) = if is_get {
        let q = get(request, "query");
        let json_param = |name: &str| -> Result<Option<Val>, (BadRequest, bool)> {
            match text(q.and_then(|q| get(q, name))) {
                Some(t) if !t.is_empty() => {
                    match fanout_expr::json::parse_limited(t.as_bytes(), 64) {
                        Ok(v @ Val::Obj(_)) => Ok(Some(v)),
                        Ok(Val::Null) => Ok(None),
                        _ => Err((
                            bad(format!("the `{name}` query parameter is not a JSON object")),
                            legacy,
                        )),
                    }
                }
                _ => Ok(None),
            }
        };
        let vars = json_param("variables")?;
        let ext = json_param("extensions")?;
        (
            text(q.and_then(|q| get(q, "query"))),
            text(q.and_then(|q| get(q, "operationName"))),
            vars,
            ext,
        )
    } else {
        // The body is JSON only when the client says so: a `text/plain` or form POST (which a
        // browser sends cross-origin without a preflight) is refused, as the spec asks of a
        // POST without `Content-Type`.
        let content_type = get(request, "headers")
            .and_then(|h| text(get(h, "content-type")))
            .unwrap_or_default();
        if !is_json(&content_type) {
            let got = if content_type.is_empty() {
                "none".to_string()
            } else {
                format!("`{content_type}`")
            };
            return Err((
                BadRequest {
                    status: 415,
                    code: "UNSUPPORTED_MEDIA_TYPE",
                    message: format!(
                        "a GraphQL POST needs `Content-Type: application/json` (got {got})"
                    ),
                },
                legacy,
            ));
        }
        let body = get(request, "body").cloned().unwrap_or(Val::Null);
        if !matches!(body, Val::Obj(_)) {
            return Err((bad("the request body is not a JSON object"), legacy));
        }
        let q = get(&body, "query");
        if !matches!(
            q,
            None | Some(Val::TStr(_)) | Some(Val::BStr(_)) | Some(Val::Null)
        ) {
            return Err((bad("`query` is not a string"), legacy));
        }
        let n = get(&body, "operationName");
        if !matches!(
            n,
            None | Some(Val::TStr(_)) | Some(Val::BStr(_)) | Some(Val::Null)
        ) {
            return Err((bad("`operationName` is not a string"), legacy));
        }
        let v = get(&body, "variables").cloned();
        if !matches!(v, None | Some(Val::Obj(_)) | Some(Val::Null)) {
            return Err((bad("`variables` is not an object"), legacy));
        }
        if !matches!(
            get(&body, "extensions"),
            None | Some(Val::Obj(_)) | Some(Val::Null)
        ) {
            return Err((bad("`extensions` is not an object"), legacy));
        }
        (
            text(q),
            text(n),
            v.filter(|v| !matches!(v, Val::Null)),
            get(&body, "extensions").cloned(),
        )
    };
    let persisted = match ext.as_ref().and_then(|e| get(e, "persistedQuery")) {
        None | Some(Val::Null) => None,
        Some(pq @ Val::Obj(_)) => {
            let version = match get(pq, "version") {
                Some(Val::Num(n)) => n.as_isize(),
                _ => None,
            };
            let Some(hash) = text(get(pq, "sha256Hash")) else {
                return Err((
                    bad("`extensions.persistedQuery` has no `sha256Hash` string"),
                    legacy,
                ));
            };
            Some(Persisted { version, hash })
        }
        Some(_) => {
            return Err((bad("`extensions.persistedQuery` is not an object"), legacy));
        }
    };
    Ok(Params {
        query,
        operation_name: name,
        variables: vars,
        persisted,
        is_get,
        legacy,
    })
}

/// Whether `Accept` asks for `application/json` and not for the GraphQL response type (a
/// missing `Accept`, `*/*` or the new type: the new type).
fn prefers_legacy(accept: &str) -> bool {
    let mut json = false;
    for part in accept.split(',') {
        let ty = part
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match ty.as_str() {
            GRAPHQL_RESPONSE | "*/*" | "application/*" => return false,
            JSON => json = true,
            _ => {}
        }
    }
    json
}

/// Whether a request's `Content-Type` is JSON: `application/json` or an `application/…+json`
/// type, any parameters (`charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let ty = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    ty == JSON || (ty.starts_with("application/") && ty.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_post_body_is_json_only_by_its_content_type() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=UTF-8",
            "application/graphql+json",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for not in [
            "",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/graphql",
            "text/json+xml",
        ] {
            assert!(!is_json(not), "{not}");
        }
    }

    #[test]
    fn the_answer_type_follows_accept() {
        assert!(!prefers_legacy(""));
        assert!(!prefers_legacy("*/*"));
        assert!(!prefers_legacy(
            "application/graphql-response+json, application/json"
        ));
        assert!(!prefers_legacy(
            "application/json;q=0.9, application/graphql-response+json"
        ));
        assert!(prefers_legacy("application/json"));
        assert!(prefers_legacy("application/json; charset=utf-8"));
    }
}
