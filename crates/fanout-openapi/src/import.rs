//! `fanout openapi import SPEC`: a starting config from an OpenAPI document (3.0 or 3.1, JSON or
//! YAML): one pass-through route per operation (its `summary`, `description`, `tags`,
//! `deprecated` carried over), all to one backend made from the first of `servers` (its
//! variables at their defaults, its base path the backend URL's). Nothing is fetched.

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

/// The starting config (YAML text) for the document `text` (`name`: its file name, for the
/// header comment).
pub fn import(text: &str, name: &str) -> Result<String, ImportError> {
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
            r.insert("pass".into(), json!({ "backend": "api" }));
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
    Ok(format!(
        "# A starting config imported from {name} by `fanout openapi import`: one pass-through route\n\
         # per operation, to the backend of its first server. Turn routes into flows, declare their\n\
         # schemas (request_schema, parameters) and check it with `fanout validate`.\n{yaml}"
    ))
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
        let out = import(spec, "pets.yaml").unwrap();
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
            import("swagger: '2.0'\n", "s"),
            Err(ImportError::Version(_))
        ));
    }
}
