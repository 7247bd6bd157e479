//! Request validation at the edge: a route's typed parameters and its request body checked
//! against the schemas compiled at load. The first wrong value is named by its JSON pointer and
//! the keyword it broke ([`Invalid`], answered 400 `invalid_request`). A route without a
//! declared schema has no [`RouteCheck`] and costs nothing.

use crate::schema::{Param, RouteSchemas};
use fanout_config::{Config, ParamIn};
use fanout_expr::Val;
use serde_json::Value;

/// Why a request does not match its route's declared schemas: what the client is told (the
/// message) and `error.details`: `{in, name?, pointer, keyword, schema_path}`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// For the client: what is wrong, where.
    pub message: String,
    /// `error.details` (JSON).
    pub details: Value,
}

/// The code of the refusal (`error.code`).
pub const CODE: &str = "invalid_request";

/// What one route checks of each request.
pub struct RouteCheck {
    params: Vec<ParamCheck>,
    queries: bool,
    body: Option<jsonschema::Validator>,
}

struct ParamCheck {
    name: String,
    location: ParamIn,
    required: bool,
    coerce: Coerce,
    validator: jsonschema::Validator,
}

/// How a parameter's text becomes the value its schema checks (by the schema's `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coerce {
    Text,
    Integer,
    Number,
    Boolean,
    /// Every repetition an element (of the item type).
    Array(Scalar),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scalar {
    Text,
    Integer,
    Number,
    Boolean,
}

fn scalar_of(schema: &Value) -> Scalar {
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") => Scalar::Integer,
        Some("number") => Scalar::Number,
        Some("boolean") => Scalar::Boolean,
        _ => Scalar::Text,
    }
}

fn coerce_of(schema: &Value) -> Coerce {
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => Coerce::Array(schema.get("items").map_or(Scalar::Text, scalar_of)),
        _ => match scalar_of(schema) {
            Scalar::Text => Coerce::Text,
            Scalar::Integer => Coerce::Integer,
            Scalar::Number => Coerce::Number,
            Scalar::Boolean => Coerce::Boolean,
        },
    }
}

/// A parameter's text as the value of its type; a text that is not one stays text (and fails
/// the schema's `type`).
fn read_scalar(kind: Scalar, text: &str) -> Value {
    match kind {
        Scalar::Text => Value::String(text.to_string()),
        Scalar::Integer => text
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(text.to_string())),
        Scalar::Number => text
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.to_string()), Value::Number),
        Scalar::Boolean => match text {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => Value::String(text.to_string()),
        },
    }
}

impl RouteCheck {
    /// The check of a route with declared schemas (`None` when it declares none: no cost).
    pub(crate) fn compile(cfg: &Config, schemas: &RouteSchemas) -> Option<RouteCheck> {
        if schemas.request.is_none() && schemas.params.is_empty() {
            return None;
        }
        // The schemas compiled when they were loaded (`schema::load`), so these do not fail.
        let params: Vec<ParamCheck> = schemas
            .params
            .iter()
            .filter_map(|p: &Param| {
                Some(ParamCheck {
                    name: p.name.clone(),
                    location: p.location,
                    required: p.required,
                    coerce: coerce_of(&p.schema),
                    validator: crate::schema::compile(cfg, &p.schema).ok()?,
                })
            })
            .collect();
        let body = schemas
            .request
            .as_ref()
            .and_then(|s| crate::schema::compile(cfg, s).ok());
        Some(RouteCheck {
            queries: params.iter().any(|p| p.location == ParamIn::Query),
            params,
            body,
        })
    }

    /// Whether the route has a request body schema.
    pub fn checks_body(&self) -> bool {
        self.body.is_some()
    }

    /// Check the declared parameters: the path's (decoded, by name) and the query's.
    pub fn params<'a>(
        &self,
        path: impl Iterator<Item = (&'a str, &'a str)> + Clone,
        query: Option<&str>,
    ) -> Result<(), Invalid> {
        if self.params.is_empty() {
            return Ok(());
        }
        let pairs: Vec<(String, String)> = match (self.queries, query) {
            (true, Some(q)) => q
                .split('&')
                .filter(|s| !s.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (
                        fanout_expr::request::decode(k),
                        fanout_expr::request::decode(v),
                    )
                })
                .collect(),
            _ => Vec::new(),
        };
        for p in &self.params {
            let texts: Vec<&str> = match p.location {
                ParamIn::Path => path
                    .clone()
                    .filter(|(k, _)| *k == p.name)
                    .map(|(_, v)| v)
                    .collect(),
                ParamIn::Query => pairs
                    .iter()
                    .filter(|(k, _)| *k == p.name)
                    .map(|(_, v)| v.as_str())
                    .collect(),
            };
            let place = match p.location {
                ParamIn::Path => "path",
                ParamIn::Query => "query",
            };
            if texts.is_empty() {
                if p.required {
                    return Err(Invalid {
                        message: format!("the {place} parameter `{}` is required", p.name),
                        details: details(
                            place,
                            Some(&p.name),
                            &format!("/{}", p.name),
                            "required",
                            "",
                        ),
                    });
                }
                continue;
            }
            let value = match p.coerce {
                Coerce::Array(item) => {
                    Value::Array(texts.iter().map(|t| read_scalar(item, t)).collect())
                }
                _ if texts.len() > 1 => {
                    return Err(Invalid {
                        message: format!(
                            "the {place} parameter `{}` is given {} times; it takes one value",
                            p.name,
                            texts.len()
                        ),
                        details: details(place, Some(&p.name), &format!("/{}", p.name), "type", ""),
                    });
                }
                Coerce::Text => read_scalar(Scalar::Text, texts[0]),
                Coerce::Integer => read_scalar(Scalar::Integer, texts[0]),
                Coerce::Number => read_scalar(Scalar::Number, texts[0]),
                Coerce::Boolean => read_scalar(Scalar::Boolean, texts[0]),
            };
            if let Err(e) = p.validator.validate(&value) {
                let pointer = format!("/{}{}", p.name, e.instance_path().as_str());
                return Err(Invalid {
                    message: format!(
                        "the {place} parameter `{}` does not match its schema at {pointer}: {} (keyword `{}`)",
                        p.name,
                        e.masked(),
                        e.kind().keyword()
                    ),
                    details: details(
                        place,
                        Some(&p.name),
                        &pointer,
                        e.kind().keyword(),
                        e.schema_path().as_str(),
                    ),
                });
            }
        }
        Ok(())
    }

    /// Check the request body (parsed; `null` when there is none) against `request_schema`.
    pub fn body(&self, body: &Val) -> Result<(), Invalid> {
        let Some(v) = &self.body else {
            return Ok(());
        };
        let mut text = Vec::new();
        fanout_expr::json::write(body, &mut text);
        // The body was parsed (and bounded) already: this reading of its JSON text does not fail.
        let value: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
        self.body_value(v, &value)
    }

    fn body_value(&self, v: &jsonschema::Validator, value: &Value) -> Result<(), Invalid> {
        match v.validate(value) {
            Ok(()) => Ok(()),
            Err(e) => {
                let pointer = e.instance_path().as_str().to_string();
                let shown = if pointer.is_empty() {
                    "/"
                } else {
                    pointer.as_str()
                };
                Err(Invalid {
                    message: format!(
                        "the request body does not match the route's request_schema at {shown}: {} (keyword `{}`)",
                        e.masked(),
                        e.kind().keyword()
                    ),
                    details: details(
                        "body",
                        None,
                        &pointer,
                        e.kind().keyword(),
                        e.schema_path().as_str(),
                    ),
                })
            }
        }
    }
}

fn details(
    place: &str,
    name: Option<&str>,
    pointer: &str,
    keyword: &str,
    schema_path: &str,
) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("in".into(), place.into());
    if let Some(n) = name {
        m.insert("name".into(), n.into());
    }
    m.insert("pointer".into(), pointer.into());
    m.insert("keyword".into(), keyword.into());
    m.insert("schema_path".into(), schema_path.into());
    Value::Object(m)
}

/// Check a JSON value against a schema the way request bodies are (for `fanout test
/// --schemas`): `Err` names the pointer and keyword of the first wrong value.
pub fn check_value(cfg: &Config, schema: &Value, value: &Value) -> Result<(), Invalid> {
    let v = crate::schema::compile(cfg, schema).map_err(|e| Invalid {
        message: format!("not a valid JSON Schema: {e}"),
        details: Value::Null,
    })?;
    let check = RouteCheck {
        params: Vec::new(),
        queries: false,
        body: None,
    };
    check.body_value(&v, value)
}
