//! GraphQL over HTTP: the request's parameters from a POST's JSON body or a GET's query, the
//! answer's media type from `Accept`, and the answer's status.

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

/// A request that is not a GraphQL request at all: its message.
pub(crate) struct BadRequest(pub(crate) String);

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
        let vars = match text(q.and_then(|q| get(q, "variables"))) {
            Some(t) if !t.is_empty() => match fanout_expr::json::parse_limited(t.as_bytes(), 64) {
                Ok(v) => Some(v),
                Err(_) => {
                    return Err((
                        BadRequest("the `variables` query parameter is not JSON".into()),
                        legacy,
                    ));
                }
            },
            _ => None,
        };
        let ext = match text(q.and_then(|q| get(q, "extensions"))) {
            Some(t) if !t.is_empty() => match fanout_expr::json::parse_limited(t.as_bytes(), 16) {
                Ok(v) => Some(v),
                Err(_) => {
                    return Err((
                        BadRequest("the `extensions` query parameter is not JSON".into()),
                        legacy,
                    ));
                }
            },
            _ => None,
        };
        (
            text(q.and_then(|q| get(q, "query"))),
            text(q.and_then(|q| get(q, "operationName"))),
            vars,
            ext,
        )
    } else {
        let body = get(request, "body").cloned().unwrap_or(Val::Null);
        if !matches!(body, Val::Obj(_)) {
            return Err((
                BadRequest("the request body is not a JSON object".into()),
                legacy,
            ));
        }
        let q = get(&body, "query");
        if !matches!(
            q,
            None | Some(Val::TStr(_)) | Some(Val::BStr(_)) | Some(Val::Null)
        ) {
            return Err((BadRequest("`query` is not a string".into()), legacy));
        }
        let n = get(&body, "operationName");
        if !matches!(
            n,
            None | Some(Val::TStr(_)) | Some(Val::BStr(_)) | Some(Val::Null)
        ) {
            return Err((BadRequest("`operationName` is not a string".into()), legacy));
        }
        let v = get(&body, "variables").cloned();
        if !matches!(v, None | Some(Val::Obj(_)) | Some(Val::Null)) {
            return Err((BadRequest("`variables` is not an object".into()), legacy));
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
                    BadRequest("`extensions.persistedQuery` has no `sha256Hash` string".into()),
                    legacy,
                ));
            };
            Some(Persisted { version, hash })
        }
        Some(_) => {
            return Err((
                BadRequest("`extensions.persistedQuery` is not an object".into()),
                legacy,
            ));
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
