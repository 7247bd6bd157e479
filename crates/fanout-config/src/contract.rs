//! Config types of the client-facing contract: what a client gets when a flow refuses a request
//! (`fail` steps), when a backend answers an error status (`on_status`), when keyed lookups miss
//! some keys (`missing`), and a response status computed by an expression.
//!
//! Each type has a short YAML form written by hand (`on_status: {404: pass}`, `missing: skip`)
//! and reads with a hand-written visitor, so a wrong value gets an error naming every form.

use crate::{ExprSrc, Located};
use schemars::JsonSchema;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::fmt;

/// A `fail` step: when it runs (its `when` is true, or it has none), the request ends at once
/// with this status, `code` and `message` — before any call that has not started yet.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailSpec {
    /// Status answered, 400–599 (e.g. 400 for invalid input, 404, 409, 422).
    pub status: Located<u16>,
    /// Stable machine-readable `error.code`: lower-case letters, digits and `_`, e.g. `invalid_id`.
    pub code: Located<String>,
    /// Message expression (a string), e.g. `'"order id must be digits, got \($request.params.id)"'`.
    /// Default: the status's reason phrase.
    pub message: Option<ExprSrc>,
    /// Expression whose value is returned as `error.details` (any JSON), e.g. the invalid fields.
    pub details: Option<ExprSrc>,
}

/// Which backend statuses an `on_status` entry applies to: one status (`404`) or a class
/// (`4xx`, `5xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusPattern {
    /// One status code.
    Exact(u16),
    /// A class: 4 for `4xx`, 5 for `5xx`.
    Class(u16),
}

impl StatusPattern {
    /// Whether `status` matches.
    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusPattern::Exact(s) => s == status,
            StatusPattern::Class(c) => status / 100 == c,
        }
    }
    fn parse(s: &str) -> Option<StatusPattern> {
        let s = s.trim();
        if let Ok(n) = s.parse::<u16>() {
            return (100..=599).contains(&n).then_some(StatusPattern::Exact(n));
        }
        match s.to_ascii_lowercase().as_str() {
            "1xx" => Some(StatusPattern::Class(1)),
            "2xx" => Some(StatusPattern::Class(2)),
            "3xx" => Some(StatusPattern::Class(3)),
            "4xx" => Some(StatusPattern::Class(4)),
            "5xx" => Some(StatusPattern::Class(5)),
            _ => None,
        }
    }
}

impl fmt::Display for StatusPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusPattern::Exact(s) => write!(f, "{s}"),
            StatusPattern::Class(c) => write!(f, "{c}xx"),
        }
    }
}

impl<'de> Deserialize<'de> for StatusPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = StatusPattern;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a status code such as `404` or a class `4xx` / `5xx`")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusPattern, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusPattern, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StatusPattern, E> {
                StatusPattern::parse(v).ok_or_else(|| {
                    E::custom(format!(
                        "invalid status pattern `{v}`: expected a status code such as `404` or a class `4xx` / `5xx`"
                    ))
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for StatusPattern {
    fn schema_name() -> Cow<'static, str> {
        "StatusPattern".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^([1-5][0-9][0-9]|[1-5]xx)$",
            "description": "A status code (`404`) or a class (`4xx`, `5xx`)."
        })
    }
}

/// What the client gets when a step's backend answers a status matched by an `on_status` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusAction {
    /// Fail the request with this status (the code is derived from it: `not_found`, `conflict`,
    /// … for 4xx, `backend_status` for 5xx).
    Status(u16),
    /// Fail the request with the backend's own status.
    Pass,
    /// Not a failure: the step's value is its `default`.
    Default,
    /// Fail the request with this status, code and message.
    Answer {
        /// Status answered, 400–599.
        status: u16,
        /// `error.code`.
        code: Option<String>,
        /// A fixed message.
        message: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerRepr {
    status: u16,
    code: Option<String>,
    message: Option<String>,
}

impl<'de> Deserialize<'de> for StatusAction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StatusAction;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a status code (e.g. `404`), `pass`, `default`, or `{status, code, message}`",
                )
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusAction, E> {
                u16::try_from(v)
                    .ok()
                    .filter(|s| (400..=599).contains(s))
                    .map(StatusAction::Status)
                    .ok_or_else(|| E::custom(format!("status {v} must be within 400–599")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusAction, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("status {v} must be within 400–599"))),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StatusAction, E> {
                match v {
                    "pass" => Ok(StatusAction::Pass),
                    "default" => Ok(StatusAction::Default),
                    other => match other.parse::<u64>() {
                        Ok(n) => self.visit_u64(n),
                        Err(_) => Err(E::custom(format!(
                            "invalid status action `{other}`: expected a status code (e.g. `404`), `pass`, `default`, or `{{status, code, message}}`"
                        ))),
                    },
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StatusAction, A::Error> {
                let a = AnswerRepr::deserialize(de::value::MapAccessDeserializer::new(map))?;
                if !(400..=599).contains(&a.status) {
                    return Err(de::Error::custom(format!(
                        "status {} must be within 400–599",
                        a.status
                    )));
                }
                Ok(StatusAction::Answer {
                    status: a.status,
                    code: a.code,
                    message: a.message,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for StatusAction {
    fn schema_name() -> Cow<'static, str> {
        "StatusAction".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A status code to answer (400–599), `pass` (the backend's status), `default` (the step's value is its `default`), or `{status, code, message}`.",
            "anyOf": [
                { "type": "integer", "minimum": 400, "maximum": 599 },
                { "type": "string", "enum": ["pass", "default"] },
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["status"],
                    "properties": {
                        "status": { "type": "integer", "minimum": 400, "maximum": 599 },
                        "code": { "type": "string" },
                        "message": { "type": "string" }
                    }
                }
            ]
        })
    }
}

/// What a step does with a key its batch lookup did not find (or, for a `for_each` `http` step,
/// an element whose call answered 404).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum MissingPolicy {
    /// Fail the step (a required step fails the request: 404 `key_not_found`). The default.
    #[default]
    Fail,
    /// Leave the element out of the list (`null` for a step without `for_each`).
    Skip,
    /// Put `null` in its place.
    Null,
    /// Put this expression's value in its place (it can read `$item` and `$index`).
    Value(ExprSrc),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MissingValueRepr {
    value: ExprSrc,
}

impl<'de> Deserialize<'de> for MissingPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MissingPolicy;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`fail`, `skip`, `null`, or `{value: EXPRESSION}`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<MissingPolicy, E> {
                match v {
                    "fail" => Ok(MissingPolicy::Fail),
                    "skip" => Ok(MissingPolicy::Skip),
                    "null" => Ok(MissingPolicy::Null),
                    other => Err(E::custom(format!(
                        "invalid missing-key policy `{other}`: expected `fail`, `skip`, `null`, or `{{value: EXPRESSION}}`"
                    ))),
                }
            }
            fn visit_unit<E: de::Error>(self) -> Result<MissingPolicy, E> {
                Ok(MissingPolicy::Null)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MissingPolicy, A::Error> {
                let r = MissingValueRepr::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(MissingPolicy::Value(r.value))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for MissingPolicy {
    fn schema_name() -> Cow<'static, str> {
        "MissingPolicy".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "What a step does with a missing key: `fail` (default), `skip`, `null`, or `{value: EXPRESSION}` (per element; reads `$item`, `$index`).",
            "anyOf": [
                { "type": "string", "enum": ["fail", "skip", "null"] },
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["value"],
                    "properties": { "value": { "type": "string" } }
                }
            ]
        })
    }
}

/// `respond.status`: a fixed status, or an expression giving one (e.g.
/// `'if $order == null then 404 else 200 end'`).
#[derive(Debug, Clone, PartialEq)]
pub enum StatusSrc {
    /// A fixed status code.
    Code(Located<u16>),
    /// An expression evaluated with the response body's scope.
    Expr(ExprSrc),
}

impl Default for StatusSrc {
    fn default() -> Self {
        StatusSrc::Code(Located::unknown(200))
    }
}

enum IntOrStr {
    Int(u64),
    Str(String),
}

impl<'de> Deserialize<'de> for IntOrStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = IntOrStr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a status code such as `201`, or an expression giving one")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IntOrStr, E> {
                Ok(IntOrStr::Int(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IntOrStr, E> {
                u64::try_from(v)
                    .map(IntOrStr::Int)
                    .map_err(|_| E::custom(format!("status {v} is not a valid HTTP status")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IntOrStr, E> {
                Ok(IntOrStr::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for StatusSrc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let l = Located::<IntOrStr>::deserialize(d)?;
        Ok(match l.value {
            IntOrStr::Int(n) => StatusSrc::Code(Located {
                value: u16::try_from(n).unwrap_or(0),
                pos: l.pos,
                used: l.used,
                quoted: l.quoted,
            }),
            IntOrStr::Str(s) => StatusSrc::Expr(Located {
                value: s,
                pos: l.pos,
                used: l.used,
                quoted: l.quoted,
            }),
        })
    }
}

impl JsonSchema for StatusSrc {
    fn schema_name() -> Cow<'static, str> {
        "StatusSrc".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A status code (100–599), or an expression (a string) giving one.",
            "anyOf": [
                { "type": "integer", "minimum": 100, "maximum": 599 },
                { "type": "string" }
            ]
        })
    }
}
