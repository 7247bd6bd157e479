//! `fanout openapi import SPEC`: a starting config from an OpenAPI document (3.0 or 3.1, JSON or
//! YAML): one route per operation (its `summary`, `description`, `tags`, `deprecated` carried
//! over), all to one backend made from the first of `servers` (its variables at their defaults,
//! its base path the backend URL's). Nothing is fetched.
//!
//! The operation's schemas are carried (unless `carry` is off): its JSON request body's schema
//! as `request_schema`, its path and query parameters' as typed `parameters`, its first success
//! answer's JSON schema as `answer_schema` — each standing alone, the `#/components/schemas` it
//! uses copied into its `$defs` (`refs::Carrier`). An operation with something carried is a
//! proxy flow (one `http` step calling the same method and path, with the declared query
//! parameters, the request's `authorization` and declared header parameters, and the body; the
//! backend's error statuses passed): a pass-through route streams its request and declares no
//! schema. The others stay pass-through routes. What is not carried is said in a comment.

use crate::refs::Carrier;
use serde_json::{Map, Value, json};

/// Why a document cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Not JSON or YAML.
    #[error("the document does not parse: {0}")]
    Parse(String),
    /// Not OpenAPI 3.
    #[error("{0}")]
    Version(String),
    /// No operations.
    #[error("the document has no operations under `paths`")]
    Empty,
}

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// How far a `$ref` to `#/components/{parameters,requestBodies,responses}` is followed.
const MAX_HOPS: usize = 8;

/// The starting config (YAML text) for the document `text` (`name`: its file name, for the
/// header comment); `carry`: carry the operations' schemas (else every route is pass-through).
pub fn import(text: &str, name: &str, carry: bool) -> Result<String, ImportError> {
    let doc: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| ImportError::Parse(e.to_string()))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| ImportError::Parse(e.to_string()))?
    };
    let version = doc.get("openapi").and_then(Value::as_str).unwrap_or("");
    if !version.starts_with("3.") {
        let was = match doc.get("swagger") {
            Some(_) => "Swagger 2.0".to_string(),
            None => format!("`openapi: {version}`"),
        };
        return Err(ImportError::Version(format!(
            "{was} is not read: import takes OpenAPI 3.0 or 3.1 (convert a Swagger 2.0 document first)"
        )));
    }
    let url = server(&doc);
    let limits = fanout_config::OpenApiConfig::default();
    let carrier = Carrier {
        comps: doc
            .pointer("/components/schemas")
            .and_then(Value::as_object),
        v30: version.starts_with("3.0"),
        max_bytes: limits.max_schema_bytes,
        max_depth: limits.max_schema_depth,
    };
    let mut notes: Vec<String> = Vec::new();
    let mut routes = Vec::new();
    for (path, item) in doc
        .get("paths")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        for method in METHODS {
            let Some(op) = item.get(method).and_then(Value::as_object) else {
                continue;
            };
            let mut r = Map::new();
            r.insert("path".into(), path.as_str().into());
            r.insert("method".into(), method.to_ascii_uppercase().into());
            let summary = op
                .get("summary")
                .or_else(|| op.get("operationId"))
                .and_then(Value::as_str);
            if let Some(s) = summary {
                r.insert("summary".into(), s.into());
            }
            if let Some(d) = op.get("description").and_then(Value::as_str) {
                r.insert("description".into(), d.into());
            }
            if let Some(t) = op.get("tags").filter(|t| t.is_array()) {
                r.insert("tags".into(), t.clone());
            }
            if op.get("deprecated") == Some(&Value::Bool(true)) {
                r.insert("deprecated".into(), true.into());
            }
            let at = format!("{} {path}", method.to_ascii_uppercase());
            let carried = match carry {
                true => carry_op(&doc, &carrier, item, op, &at, &mut notes),
                false => None,
            };
            match carried {
                Some(c) => {
                    for (k, v) in c {
                        r.insert(k, v);
                    }
                }
                None => {
                    r.insert("pass".into(), json!({ "backend": "api" }));
                }
            }
            routes.push(Value::Object(r));
        }
    }
    if routes.is_empty() {
        return Err(ImportError::Empty);
    }
    let mut cfg = Map::new();
    let info = doc.get("info");
    let mut oa = Map::new();
    if let Some(t) = info.and_then(|i| i.get("title")).and_then(Value::as_str) {
        oa.insert("title".into(), t.into());
    }
    if let Some(v) = info.and_then(|i| i.get("version")) {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
        oa.insert("version".into(), v.into());
    }
    if !oa.is_empty() {
        cfg.insert("openapi".into(), Value::Object(oa));
    }
    cfg.insert("backends".into(), json!({ "api": { "url": url } }));
    cfg.insert("routes".into(), Value::Array(routes));
    let yaml = serde_saphyr::to_string(&Value::Object(cfg))
        .map_err(|e| ImportError::Parse(e.to_string()))?;
    let mut head = format!(
        "# A starting config imported from {name} by `fanout openapi import`: one route per\n\
         # operation, to the backend of its first server; an operation with schemas is a proxy flow\n\
         # declaring them (request_schema, parameters, answer_schema), the others pass-through\n\
         # routes. Review it and check it with `fanout validate`.\n"
    );
    for n in &notes {
        head.push_str(&format!("# not carried: {}\n", n.replace('\n', " ")));
    }
    Ok(format!("{head}{yaml}"))
}

/// `v` with its `$ref` to `#/components/KIND/NAME` followed (at most [`MAX_HOPS`]).
fn deref<'a>(doc: &'a Value, mut v: &'a Value) -> Option<&'a Value> {
    for _ in 0..MAX_HOPS {
        let Some(r) = v.get("$ref").and_then(Value::as_str) else {
            return Some(v);
        };
        let pointer = r.strip_prefix('#')?;
        if !pointer.starts_with("/components/") {
            return None;
        }
        v = doc.pointer(pointer)?;
    }
    None
}

/// Whether a media type is JSON (`application/json`, `application/problem+json`, …).
fn is_json(media: &str) -> bool {
    let m = media
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
}

/// An expression reading `$request.query.NAME`.
fn query_expr(name: &str) -> String {
    if !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
    {
        format!("$request.query.{name}")
    } else {
        format!("$request.query[{}]", Value::from(name))
    }
}

/// The fields of the proxy flow route for one operation, or `None` when nothing is carried
/// (it stays pass-through). Each part not carried adds a note saying why.
fn carry_op(
    doc: &Value,
    carrier: &Carrier<'_>,
    item: &Value,
    op: &Map<String, Value>,
    at: &str,
    notes: &mut Vec<String>,
) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    // Request body: JSON only (a flow parses the body as JSON).
    let mut body = None;
    if let Some(rb) = op.get("requestBody") {
        let Some(rb) = deref(doc, rb) else {
            notes.push(format!("{at}: its requestBody `$ref` does not resolve in the document; a pass-through route"));
            return None;
        };
        let content = rb.get("content").and_then(Value::as_object);
        let other: Vec<&String> = content
            .into_iter()
            .flatten()
            .map(|(m, _)| m)
            .filter(|m| !is_json(m))
            .collect();
        if !other.is_empty() {
            notes.push(format!(
                "{at}: its request body may be {} (not JSON): a pass-through route, which streams it",
                other.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
            ));
            return None;
        }
        let schema = content
            .into_iter()
            .flatten()
            .find_map(|(_, m)| m.get("schema"));
        if let Some(schema) = schema {
            match carrier.carry(schema) {
                Ok(s) => {
                    // No body is `null`: an optional body accepts it.
                    let required = rb.get("required") == Some(&Value::Bool(true));
                    body = Some(if required {
                        s
                    } else {
                        let mut wrapped = json!({ "anyOf": [{ "type": "null" }, s] });
                        hoist_defs(&mut wrapped);
                        wrapped
                    });
                }
                Err(e) => notes.push(format!("{at}: the request body's schema: {e}")),
            }
        }
    }
    // Parameters: the path item's, then the operation's (which win, by name and place).
    let mut params: Vec<(String, String, &Value)> = Vec::new();
    for list in [item.get("parameters"), op.get("parameters")] {
        for p in list.and_then(Value::as_array).into_iter().flatten() {
            let Some(p) = deref(doc, p) else {
                notes.push(format!(
                    "{at}: a parameter `$ref` does not resolve in the document"
                ));
                continue;
            };
            let (Some(name), Some(place)) = (
                p.get("name").and_then(Value::as_str),
                p.get("in").and_then(Value::as_str),
            ) else {
                continue;
            };
            params.retain(|(n, i, _)| !(n == name && i == place));
            params.push((name.to_string(), place.to_string(), p));
        }
    }
    let mut declared = Map::new();
    let mut query = Map::new();
    let mut headers = Map::new();
    headers.insert(
        "authorization".into(),
        "$request.headers.authorization".into(),
    );
    for (name, place, p) in &params {
        match place.as_str() {
            "header" => {
                let lower = name.to_ascii_lowercase();
                if !matches!(lower.as_str(), "accept" | "content-type" | "authorization") {
                    headers.insert(
                        lower.clone(),
                        format!("$request.headers[{}]", Value::from(lower)).into(),
                    );
                }
                continue;
            }
            "path" | "query" => {}
            _ => continue,
        }
        if place == "query" {
            query.insert(name.clone(), query_expr(name).into());
        }
        let style_ok = p
            .get("style")
            .is_none_or(|s| s == if place == "path" { "simple" } else { "form" })
            && p.get("explode")
                .is_none_or(|e| e == &Value::Bool(true) || place == "path");
        let Some(schema) = p.get("schema") else {
            notes.push(format!(
                "{at}: parameter `{name}` has no `schema` (a `content` one is not read)"
            ));
            continue;
        };
        let is_object = schema.get("type").and_then(Value::as_str) == Some("object");
        if !style_ok || is_object {
            notes.push(format!(
                "{at}: parameter `{name}`: only the default style (`form`, exploded, for a query; `simple` for a path) of scalars and arrays is checked"
            ));
            continue;
        }
        let schema = match carrier.carry(schema) {
            Ok(s) => s,
            Err(e) => {
                notes.push(format!("{at}: parameter `{name}`'s schema: {e}"));
                continue;
            }
        };
        let mut d = Map::new();
        d.insert("schema".into(), schema);
        if place == "query" && p.get("required") == Some(&Value::Bool(true)) {
            d.insert("required".into(), true.into());
        }
        if let Some(desc) = p.get("description").and_then(Value::as_str) {
            d.insert("description".into(), desc.into());
        }
        declared.insert(name.clone(), Value::Object(d));
    }
    // The answer: the first success status with a JSON schema.
    let mut status: u16 = 200;
    let mut answer = None;
    let mut codes: Vec<(&String, &Value)> = op
        .get("responses")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(code, _)| code.starts_with('2'))
        .collect();
    codes.sort_by(|a, b| a.0.cmp(b.0));
    if let Some((code, r)) = codes.first() {
        status = code.parse().unwrap_or(200);
        if let Some(r) = deref(doc, r) {
            let schema = r
                .get("content")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .find(|(m, _)| is_json(m))
                .and_then(|(_, m)| m.get("schema"));
            if let Some(schema) = schema {
                match carrier.carry(schema) {
                    Ok(s) => answer = Some(s),
                    Err(e) => notes.push(format!("{at}: the {code} answer's schema: {e}")),
                }
            }
        }
    }
    if body.is_none() && declared.is_empty() && answer.is_none() {
        return None;
    }
    if !declared.is_empty() {
        out.insert("parameters".into(), Value::Object(declared));
    }
    let method = at.split(' ').next().unwrap_or("GET");
    let mut http = Map::new();
    http.insert("backend".into(), "api".into());
    http.insert("method".into(), method.into());
    http.insert("path".into(), "$request.path".into());
    if !query.is_empty() {
        http.insert("query".into(), Value::Object(query));
    }
    http.insert("headers".into(), Value::Object(headers));
    if let Some(b) = body {
        out.insert("request_schema".into(), b);
        http.insert("body".into(), "$request.body".into());
    }
    if let Some(a) = answer {
        out.insert("answer_schema".into(), a);
    }
    out.insert(
        "flow".into(),
        json!({ "call": { "http": http, "on_status": { "4xx": "pass", "5xx": "pass" } } }),
    );
    out.insert(
        "respond".into(),
        json!({ "status": status, "body": "$call" }),
    );
    Some(out)
}

/// `{anyOf: [null, S]}` with S's `$defs` moved to the top (its `#/$defs/…` references read from
/// the root).
fn hoist_defs(wrapped: &mut Value) {
    let defs = wrapped
        .pointer_mut("/anyOf/1")
        .and_then(Value::as_object_mut)
        .and_then(|o| o.remove("$defs"));
    if let Some(d) = defs {
        wrapped["$defs"] = d;
    }
}

/// The backend's URL: the first server's, its variables at their defaults (its base path is the
/// backend URL's, which every pass-through route's path follows). Without a server (or with a
/// relative one): a local address to edit.
fn server(doc: &Value) -> String {
    let Some(s) = doc
        .get("servers")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    else {
        return "http://127.0.0.1:8081".into();
    };
    let mut url = s
        .get("url")
        .and_then(Value::as_str)
        .unwrap_or("/")
        .to_string();
    for (name, var) in s
        .get("variables")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(d) = var.get("default").and_then(Value::as_str) {
            url = url.replace(&format!("{{{name}}}"), d);
        }
    }
    if !url.contains("://") {
        // A relative server URL: the document's own host, unknown here.
        return format!("http://127.0.0.1:8081{}", url.trim_end_matches('/'));
    }
    url.trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_route_per_operation_to_the_first_server() {
        let spec = r#"
openapi: 3.0.3
info: { title: Pets, version: 2.0.0 }
servers:
  - url: "https://{region}.example.com/v1/"
    variables: { region: { default: eu } }
paths:
  /pets:
    get: { summary: List pets, tags: [pets] }
    post: { operationId: createPet, deprecated: true }
  /pets/{id}:
    get: { description: One pet }
"#;
        let out = import(spec, "pets.yaml", true).unwrap();
        let cfg: Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(cfg["backends"]["api"]["url"], "https://eu.example.com/v1");
        assert_eq!(cfg["openapi"]["version"], "2.0.0");
        let routes = cfg["routes"].as_array().unwrap();
        assert_eq!(routes.len(), 3);
        assert_eq!(routes[0]["method"], "GET");
        assert_eq!(routes[0]["pass"], json!({"backend": "api"}));
        assert_eq!(routes[1]["summary"], "createPet");
        assert_eq!(routes[1]["deprecated"], true);
        assert_eq!(routes[2]["path"], "/pets/{id}");
        assert!(matches!(
            import("swagger: '2.0'\n", "s", true),
            Err(ImportError::Version(_))
        ));
    }
}
