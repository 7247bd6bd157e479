//! The OpenAPI 3.1 document of a config's routes: each route an operation with its parameters
//! (declared, else from the pattern and what the expressions read), its request body and answer
//! schemas (declared, else any JSON), every error answer the route can give (the contract of
//! docs/config.md "Failures and status codes": status, the `error.code` values, the error
//! object), its security (JWT providers as bearer schemes with scopes, client certificates as
//! `mutualTLS`), the rate-limit and `Retry-After` headers, and `servers` from the listener.

use crate::infer::Reads;
use crate::schema::RouteSchemas;
use fanout_config::{Config, ParamIn, Route, StatusAction, StatusSrc, auth::AuthMode};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The JSON Schema dialect of the document's schemas.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// What kind of route an operation is.
fn kind(route: &Route) -> &'static str {
    if route.grpc.is_some() {
        "grpc"
    } else if route.pass.is_some() {
        "pass"
    } else if route.websocket.is_some() {
        "websocket"
    } else {
        "flow"
    }
}

/// The path of a route in the document: `{*rest}` is `{rest}`; a gRPC route's is
/// `/package.Service/Method`.
fn doc_path(route: &Route) -> String {
    if let Some(g) = &route.grpc {
        return format!("/{}", g.value);
    }
    route.path.value.replace("{*", "{")
}

/// The codes one route may answer, by status.
#[derive(Default)]
struct Answers(BTreeMap<u16, Vec<String>>);

impl Answers {
    fn add(&mut self, status: u16, code: &str) {
        let codes = self.0.entry(status).or_default();
        if !codes.iter().any(|c| c == code) {
            codes.push(code.to_string());
        }
    }
}

/// The document, built from the config and its routes' loaded schemas (by route index).
pub fn document(cfg: &Config, schemas: &[RouteSchemas], reads: &[Reads]) -> Value {
    let mut paths: Map<String, Value> = Map::new();
    let mut ids: Vec<String> = Vec::new();
    for (i, route) in cfg.routes.iter().enumerate() {
        let empty = RouteSchemas::default();
        let s = schemas.get(i).unwrap_or(&empty);
        let r = reads.get(i).cloned().unwrap_or_default();
        let path = doc_path(route);
        let method = if route.grpc.is_some() {
            "post".to_string()
        } else {
            route.method.value.to_ascii_lowercase()
        };
        let op = operation(cfg, route, s, &r, &path, &method, &mut ids);
        let item = paths
            .entry(path)
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(o) = item.as_object_mut() {
            o.insert(method, op);
        }
    }
    let mut doc = json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": DIALECT,
        "info": info(cfg),
        "servers": servers(cfg),
        "paths": paths,
        "components": components(cfg),
        "x-fanout-formats-asserted": cfg.openapi.validate_formats,
    });
    if cfg.routes.iter().any(|r| !r.tags.is_empty()) {
        let mut tags: Vec<&String> = cfg.routes.iter().flat_map(|r| &r.tags).collect();
        tags.sort();
        tags.dedup();
        doc["tags"] = tags.iter().map(|t| json!({ "name": t })).collect();
    }
    // A declared schema's `#/$defs/…` references read against the whole document: its `$defs`
    // become components.
    crate::refs::lift_defs(&mut doc);
    doc
}

fn info(cfg: &Config) -> Value {
    let mut info = json!({
        "title": cfg.openapi.title,
        "version": cfg.openapi.version,
    });
    if let Some(d) = &cfg.openapi.description {
        info["description"] = d.as_str().into();
    }
    info
}

fn servers(cfg: &Config) -> Value {
    if !cfg.openapi.servers.is_empty() {
        return cfg
            .openapi
            .servers
            .iter()
            .map(|u| json!({ "url": u }))
            .collect();
    }
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let listen = &cfg.listen;
    // An address that listens everywhere is reached as localhost from the same machine.
    let host = listen
        .strip_prefix("0.0.0.0:")
        .or_else(|| listen.strip_prefix("[::]:"))
        .map_or_else(|| listen.clone(), |port| format!("localhost:{port}"));
    json!([{ "url": format!("{scheme}://{host}"), "description": "the gateway's listener (`listen`)" }])
}

/// A route's auth: its own, else the defaults'.
fn route_auth<'a>(cfg: &'a Config, route: &'a Route) -> Option<&'a fanout_config::auth::RouteAuth> {
    route
        .auth
        .as_ref()
        .or(cfg.defaults.auth.as_ref())
        .filter(|a| a.mode != AuthMode::None)
}

fn rate_limited(cfg: &Config, route: &Route) -> bool {
    match &route.rate_limit {
        Some(l) => !l.is_empty(),
        None => !cfg.defaults.rate_limit.is_empty(),
    }
}

fn client_certificates(cfg: &Config) -> Option<bool> {
    let c = cfg.tls.as_ref()?.client_auth.as_ref()?;
    Some(c.mode == fanout_config::ClientAuthMode::Required)
}

fn operation(
    cfg: &Config,
    route: &Route,
    s: &RouteSchemas,
    reads: &Reads,
    path: &str,
    method: &str,
    ids: &mut Vec<String>,
) -> Value {
    let kind = kind(route);
    let mut op = Map::new();
    op.insert("operationId".into(), operation_id(method, path, ids).into());
    if let Some(t) = &route.summary {
        op.insert("summary".into(), t.as_str().into());
    }
    if let Some(t) = &route.description {
        op.insert("description".into(), t.as_str().into());
    }
    if !route.tags.is_empty() {
        op.insert("tags".into(), json!(route.tags));
    }
    if route.deprecated {
        op.insert("deprecated".into(), true.into());
    }
    let params = parameters(route, s, reads);
    let typed = !s.params.is_empty();
    if !params.is_empty() {
        op.insert("parameters".into(), Value::Array(params));
    }
    let body = request_body(route, s, reads, kind, method);
    let has_body = body.is_some();
    if let Some(b) = body {
        op.insert("requestBody".into(), b);
    }
    op.insert(
        "responses".into(),
        responses(cfg, route, s, kind, has_body, typed),
    );
    if let Some(sec) = security(cfg, route) {
        op.insert("security".into(), sec);
    }
    op.insert("x-fanout-kind".into(), kind.into());
    if let Some(g) = &route.grpc {
        op.insert("x-fanout-grpc-method".into(), g.value.as_str().into());
    }
    Value::Object(op)
}

fn operation_id(method: &str, path: &str, ids: &mut Vec<String>) -> String {
    let mut id = String::from(method);
    for part in path.split(|c: char| !c.is_ascii_alphanumeric()) {
        if !part.is_empty() {
            id.push('_');
            id.push_str(&part.to_ascii_lowercase());
        }
    }
    let mut unique = id.clone();
    let mut n = 2;
    while ids.contains(&unique) {
        unique = format!("{id}_{n}");
        n += 1;
    }
    ids.push(unique.clone());
    unique
}

fn parameters(route: &Route, s: &RouteSchemas, reads: &Reads) -> Vec<Value> {
    let mut out = Vec::new();
    let declared =
        |name: &str, at: ParamIn| s.params.iter().any(|p| p.name == name && p.location == at);
    if route.grpc.is_none() {
        for name in crate::schema::path_params(&route.path.value) {
            if declared(&name, ParamIn::Path) {
                continue;
            }
            out.push(json!({
                "name": name, "in": "path", "required": true,
                "schema": { "type": "string" },
            }));
        }
    }
    for p in &s.params {
        let mut v = json!({
            "name": p.name,
            "in": match p.location { ParamIn::Path => "path", ParamIn::Query => "query" },
            "required": p.required,
            "schema": p.schema,
        });
        if let Some(d) = &p.description {
            v["description"] = d.as_str().into();
        }
        if p.schema.get("type").and_then(Value::as_str) == Some("array") {
            v["style"] = "form".into();
            v["explode"] = true.into();
        }
        out.push(v);
    }
    for (name, number) in &reads.query {
        if declared(name, ParamIn::Query) {
            continue;
        }
        let schema = if *number {
            json!({ "type": "number" })
        } else {
            json!({ "type": "string" })
        };
        out.push(json!({ "name": name, "in": "query", "required": false, "schema": schema }));
    }
    out
}

fn examples(
    route: &Route,
    pick: fn(&fanout_config::RouteExample) -> Option<&Value>,
) -> Option<Value> {
    let mut out = Map::new();
    for (name, e) in &route.examples {
        if let Some(v) = pick(e) {
            let mut ex = json!({ "value": v });
            if let Some(s) = &e.summary {
                ex["summary"] = s.as_str().into();
            }
            out.insert(name.clone(), ex);
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

fn request_body(
    route: &Route,
    s: &RouteSchemas,
    reads: &Reads,
    kind: &str,
    method: &str,
) -> Option<Value> {
    if route.graphql.is_some() {
        return (method == "post").then(|| {
            json!({
                "required": true,
                "content": { "application/json": { "schema": {
                    "type": "object",
                    "required": ["query"],
                    "properties": {
                        "query": { "type": "string" },
                        "operationName": { "type": ["string", "null"] },
                        "variables": { "type": ["object", "null"] },
                        "extensions": { "type": ["object", "null"] },
                    },
                } } },
            })
        });
    }
    let mut media = match (&s.request, kind) {
        (Some(schema), _) => json!({ "schema": schema }),
        (None, "flow" | "grpc") if reads.body || kind == "grpc" => json!({ "schema": {} }),
        (None, "pass") if !matches!(method, "get" | "head" | "delete" | "options") => {
            return Some(json!({
                "description": "passed to the backend as it is",
                "content": { "*/*": { "schema": {} } },
            }));
        }
        _ => return None,
    };
    if let Some(e) = examples(route, |e| e.request.as_ref()) {
        media["examples"] = e;
    }
    // A body is required when its schema refuses `null` (no body is `null`).
    let required = s
        .request
        .as_ref()
        .is_some_and(|schema| !accepts_null(schema));
    Some(json!({
        "required": required,
        "content": { "application/json": media },
    }))
}

/// A GraphQL response (GraphQL over HTTP): `data` and/or `errors`.
fn graphql_response() -> Value {
    json!({
        "type": "object",
        "properties": {
            "data": { "type": ["object", "null"] },
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["message"],
                    "properties": { "message": { "type": "string" } },
                },
            },
            "extensions": { "type": "object" },
        },
    })
}

fn accepts_null(schema: &Value) -> bool {
    // The schema loaded, so it compiles; whether `null` passes is the validator's to say
    // (`$ref`, `anyOf`, … included).
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map_or(true, |v| v.is_valid(&Value::Null))
}

/// The statuses and codes of the contract a route of `kind` can answer.
fn answers(
    cfg: &Config,
    route: &Route,
    kind: &str,
    has_body: bool,
    typed: bool,
    validated_body: bool,
) -> Answers {
    let mut a = Answers::default();
    a.add(500, "internal_error");
    a.add(503, "overloaded");
    a.add(400, "bad_header");
    if route.grpc.is_none() && route.path.value.contains('{') {
        a.add(400, "bad_path");
    }
    if typed || validated_body {
        a.add(400, crate::validate::CODE);
    }
    if route_auth(cfg, route).is_some() {
        a.add(401, "unauthenticated");
        a.add(401, "invalid_token");
        a.add(503, "auth_unavailable");
        if route_auth(cfg, route).is_some_and(|r| !r.scopes.is_empty() || r.require.is_some()) {
            a.add(403, "forbidden");
        }
    }
    if rate_limited(cfg, route) {
        a.add(429, "rate_limited");
    }
    if route.stages.get("ip_filter").is_some() || cfg.defaults.stages.get("ip_filter").is_some() {
        a.add(403, "ip_denied");
    }
    match kind {
        "pass" => {
            a.add(413, "body_too_large");
            a.add(502, "backend_unavailable");
            a.add(502, "backend_reset");
            a.add(504, "backend_timeout");
            a.add(503, "backend_rejected");
        }
        "websocket" => {
            a.add(426, "upgrade_required");
            a.add(400, "bad_handshake");
            a.add(403, "origin_refused");
            a.add(503, "websocket_limit");
            a.add(503, "shutting_down");
            a.add(502, "backend_unavailable");
        }
        _ => {
            a.add(504, "deadline_exceeded");
            a.add(500, "expression_failed");
            a.add(500, "expression_limit");
            a.add(400, "bad_query");
            if has_body {
                a.add(400, "invalid_json");
                a.add(400, "bad_body");
                a.add(413, "body_too_large");
                a.add(408, "body_timeout");
                a.add(503, "body_readers_full");
                a.add(503, "memory_budget_exhausted");
                if !cfg.compression.request.decode.is_empty() {
                    a.add(415, "unsupported_encoding");
                    a.add(400, "bad_encoding");
                }
            }
            for step in route.flow.values() {
                if step.http.is_some() || step.grpc.is_some() || step.sql.is_some() {
                    a.add(504, "backend_timeout");
                    a.add(502, "backend_unavailable");
                    a.add(502, "backend_reset");
                    a.add(502, "backend_status");
                    a.add(502, "bad_backend_answer");
                    a.add(503, "backend_rejected");
                    a.add(500, "invalid_call");
                    if !step.optional {
                        a.add(404, "not_found");
                    }
                    if step.http.as_ref().is_some_and(|h| h.key.is_some()) {
                        a.add(404, "key_not_found");
                    }
                }
                if step.sql.is_some() {
                    // the `sql` step kind's own error classes (fanout-postgres: step.rs,
                    // sqlstate.rs); `bad_parameter` when a statement parameter read from the
                    // request does not fit its column's type
                    a.add(400, "bad_parameter");
                    a.add(409, "conflict");
                    a.add(422, "constraint_violation");
                    a.add(502, "database_error");
                    a.add(503, "database_busy");
                    a.add(503, "database_unavailable");
                }
                if step.model.is_some() {
                    a.add(503, "model_queue_full");
                    a.add(500, "model_failed");
                    a.add(400, "bad_model_input");
                }
                if let Some(f) = &step.fail {
                    a.add(f.status.value, &f.code.value);
                }
                for action in step.on_status.values() {
                    if let StatusAction::Answer {
                        status,
                        code: Some(c),
                        ..
                    } = action
                    {
                        a.add(*status, c);
                    }
                }
            }
            if kind == "grpc" {
                a.add(415, "unsupported_content_type");
                a.add(400, "invalid_message");
                a.add(413, "message_too_large");
            }
        }
    }
    a
}

fn responses(
    cfg: &Config,
    route: &Route,
    s: &RouteSchemas,
    kind: &str,
    has_body: bool,
    typed: bool,
) -> Value {
    let mut out = Map::new();
    match kind {
        "pass" => {
            out.insert(
                "default".into(),
                json!({ "description": "the backend's answer, passed as it is (status, headers and body)" }),
            );
        }
        "websocket" => {
            out.insert(
                "101".into(),
                json!({ "description": "Switching Protocols: the WebSocket is open (HTTP/2: 200 to the extended CONNECT)" }),
            );
        }
        _ => {
            let status = match &route.respond.as_ref().map(|r| &r.status) {
                Some(StatusSrc::Code(c)) => c.value.to_string(),
                Some(StatusSrc::Expr(_)) => "2XX".to_string(),
                None => "200".to_string(),
            };
            let mut media = json!({ "schema": s.answer.clone().unwrap_or(json!({})) });
            if let Some(e) = examples(route, |e| e.answer.as_ref()) {
                media["examples"] = e;
            }
            let answer = if route.graphql.is_some() {
                json!({
                    "description": "the GraphQL response: `data`, and `errors` where fields failed",
                    "content": {
                        "application/graphql-response+json": { "schema": graphql_response() },
                        "application/json": { "schema": graphql_response() },
                    },
                })
            } else if let Some(stream) = &route.stream {
                let mime = match stream.format {
                    fanout_config::StreamFormat::Sse => "text/event-stream",
                    fanout_config::StreamFormat::Ndjson => "application/x-ndjson",
                };
                json!({
                    "description": "the flow's values as they complete, one event each, the route's answer last (docs/config.md#streamed-answers)",
                    "content": { mime: { "schema": {} } },
                })
            } else {
                json!({
                    "description": "the flow's answer (`respond`)",
                    "content": { "application/json": media },
                })
            };
            out.insert(status, answer);
        }
    }
    let a = answers(cfg, route, kind, has_body, typed, s.request.is_some());
    for (status, codes) in a.0 {
        // A success status the flow answers (a `fail` step with 200 …) is not an error.
        if out.contains_key(&status.to_string()) {
            continue;
        }
        let mut r = json!({
            "description": reason(status),
            // `allOf` rather than siblings of `$ref` (valid in 3.1, yet ignored by validators
            // that follow OpenAPI 3.0's rule, openapi-core among them: the `enum` went unchecked).
            "content": { "application/json": { "schema": { "allOf": [
                { "$ref": "#/components/schemas/Error" },
                { "properties": { "error": { "properties": { "code": { "enum": codes } } } } },
            ] } } },
        });
        // A GraphQL route refuses an operation it cannot run (a parse or validation error, a
        // limit) with a GraphQL response.
        if route.graphql.is_some() && status == 400 {
            r["content"]["application/graphql-response+json"] =
                json!({ "schema": graphql_response() });
        }
        let mut headers = Map::new();
        if status == 503 || status == 429 {
            headers.insert(
                "Retry-After".into(),
                json!({ "$ref": "#/components/headers/Retry-After" }),
            );
        }
        if status == 429 {
            headers.insert(
                "RateLimit-Policy".into(),
                json!({ "$ref": "#/components/headers/RateLimit-Policy" }),
            );
            headers.insert(
                "RateLimit".into(),
                json!({ "$ref": "#/components/headers/RateLimit" }),
            );
        }
        if status == 401 {
            headers.insert(
                "WWW-Authenticate".into(),
                json!({ "$ref": "#/components/headers/WWW-Authenticate" }),
            );
        }
        if status == 426 {
            headers.insert(
                "Upgrade".into(),
                json!({ "schema": { "const": "websocket" } }),
            );
        }
        if !headers.is_empty() {
            r["headers"] = Value::Object(headers);
        }
        out.insert(status.to_string(), r);
    }
    Value::Object(out)
}

fn reason(status: u16) -> String {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .map_or_else(|| format!("status {status}"), str::to_string)
}

fn security(cfg: &Config, route: &Route) -> Option<Value> {
    let mtls = client_certificates(cfg) == Some(true);
    let auth = route_auth(cfg, route);
    let provider = auth.and_then(|a| {
        a.provider
            .as_ref()
            .map(|p| p.value.clone())
            .or_else(|| cfg.auth.providers.keys().next().cloned())
    });
    let mut first = Map::new();
    if let (Some(a), Some(p)) = (auth, &provider) {
        first.insert(p.clone(), json!(a.scopes));
    }
    if mtls {
        first.insert("mutualTLS".into(), json!([]));
    }
    if first.is_empty() {
        return None;
    }
    let mut alts = vec![Value::Object(first)];
    if auth.is_some_and(|a| a.mode == AuthMode::Optional) {
        alts.push(if mtls {
            json!({ "mutualTLS": [] })
        } else {
            json!({})
        });
    }
    Some(Value::Array(alts))
}

fn components(cfg: &Config) -> Value {
    let mut schemes = Map::new();
    for (name, p) in &cfg.auth.providers {
        let mut desc = format!("a JWT issued by `{}`", p.issuer);
        if !p.audiences.is_empty() {
            desc.push_str(&format!(" for {}", p.audiences.join(", ")));
        }
        desc.push_str("; a route's scopes are those its token must carry (`scope` or `scp`)");
        let scheme = if let Some(h) = &p.token.header {
            json!({ "type": "apiKey", "in": "header", "name": h, "description": desc })
        } else if let Some(c) = &p.token.cookie {
            json!({ "type": "apiKey", "in": "cookie", "name": c, "description": desc })
        } else {
            json!({ "type": "http", "scheme": "bearer", "bearerFormat": "JWT", "description": desc })
        };
        schemes.insert(name.clone(), scheme);
    }
    if client_certificates(cfg).is_some() {
        schemes.insert(
            "mutualTLS".into(),
            json!({ "type": "mutualTLS", "description": "a client certificate that chains to `tls.client_auth.ca_file`" }),
        );
    }
    let mut c = json!({
        "schemas": { "Error": error_schema() },
        "headers": {
            "Retry-After": { "description": "seconds to wait before trying again", "schema": { "type": "integer", "minimum": 0 } },
            "RateLimit-Policy": { "description": "the rate limits the route applies (IETF draft `RateLimit` header fields)", "schema": { "type": "string" } },
            "RateLimit": { "description": "what is left of the limit that refused the request", "schema": { "type": "string" } },
            "WWW-Authenticate": { "description": "the challenge (RFC 6750): `Bearer`, with `error=\"invalid_token\"` for a token that does not verify", "schema": { "type": "string" } },
        },
    });
    if !schemes.is_empty() {
        c["securitySchemes"] = Value::Object(schemes);
    }
    c
}

/// The error object of every error answer (docs/config.md "Failures and status codes").
pub fn error_schema() -> Value {
    json!({
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "step", "request_id"],
                "properties": {
                    "code": { "type": "string", "description": "stable, for programs" },
                    "message": { "type": "string", "description": "safe for people" },
                    "step": { "type": ["string", "null"], "description": "the step concerned" },
                    "request_id": { "type": "string" },
                    "details": { "description": "from a `fail` step, or where an `invalid_request` went wrong: `{in, name, pointer, keyword, schema_path}`" },
                    "backend": { "description": "with `server.expose_error_details` only" },
                    "detail": { "description": "with `server.expose_error_details` only" },
                },
            },
        },
    })
}
