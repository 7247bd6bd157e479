//! A route's declared schemas, loaded (inline, or a file beside the config), bounded (size and
//! depth, `openapi.max_schema_bytes` / `max_schema_depth`) and compiled (JSON Schema 2020-12,
//! `format` asserted unless `openapi.validate_formats: false`, `pattern` by a linear-time regex
//! engine, no remote or file `$ref`: only references inside the schema resolve).

use fanout_config::{Config, ConfigError, ParamIn, Route};
use serde_json::Value;

/// A route's declared schemas, as loaded.
#[derive(Debug, Clone, Default)]
pub struct RouteSchemas {
    /// `request_schema`.
    pub request: Option<Value>,
    /// `answer_schema`.
    pub answer: Option<Value>,
    /// `parameters`, in config order.
    pub params: Vec<Param>,
}

/// A declared parameter, resolved.
#[derive(Debug, Clone)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Path or query.
    pub location: ParamIn,
    /// Whether a request must have it.
    pub required: bool,
    /// Its schema (default `{type: string}`).
    pub schema: Value,
    /// Its description.
    pub description: Option<String>,
}

/// The path parameters' names of a route pattern (`{name}`, `{*rest}` as `rest`).
pub fn path_params(pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        // `{{` is a literal brace in matchit's syntax.
        if let Some(tail) = after.strip_prefix('{') {
            rest = tail;
            continue;
        }
        let Some(close) = after.find('}') else { break };
        let name = after[..close].trim_start_matches('*');
        if !name.is_empty() {
            out.push(name.to_string());
        }
        rest = &after[close + 1..];
    }
    out
}

/// Load route `index`'s schemas; errors name the field (`routes[3].request_schema`).
pub fn load_route(
    cfg: &Config,
    index: usize,
    route: &Route,
) -> Result<RouteSchemas, Vec<ConfigError>> {
    let mut errs = Vec::new();
    let at = |field: &str| format!("routes[{index}].{field}");
    let mut one = |v: &Option<Value>, field: &str| -> Option<Value> {
        let v = v.as_ref()?;
        match load(cfg, v, &at(field)) {
            Ok(s) => Some(s),
            Err(e) => {
                errs.push(e);
                None
            }
        }
    };
    let request = one(&route.request_schema, "request_schema");
    let answer = one(&route.answer_schema, "answer_schema");
    let in_path = path_params(&route.path.value);
    let mut params = Vec::new();
    for (name, p) in &route.parameters {
        let path = at(&format!("parameters.{name}"));
        let location = p.location.unwrap_or(if in_path.iter().any(|n| n == name) {
            ParamIn::Path
        } else {
            ParamIn::Query
        });
        if location == ParamIn::Path && !in_path.iter().any(|n| n == name) {
            errs.push(
                ConfigError::at_path(
                    path.clone(),
                    format!("{path}: the route's path `{}` has no `{{{name}}}`", route.path.value),
                )
                .hint("a path parameter names a `{NAME}` of the route's path; leave `in` out for a query parameter"),
            );
            continue;
        }
        if location == ParamIn::Path && p.required == Some(false) {
            errs.push(ConfigError::at_path(
                format!("{path}.required"),
                format!(
                    "{path}: a path parameter is always present (`required: false` is meaningless)"
                ),
            ));
        }
        let schema = match &p.schema {
            Some(s) => match load(cfg, s, &format!("{path}.schema")) {
                Ok(s) => s,
                Err(e) => {
                    errs.push(e);
                    continue;
                }
            },
            None => serde_json::json!({ "type": "string" }),
        };
        params.push(Param {
            name: name.clone(),
            location,
            required: p.required.unwrap_or(location == ParamIn::Path),
            schema,
            description: p.description.clone(),
        });
    }
    if errs.is_empty() {
        Ok(RouteSchemas {
            request,
            answer,
            params,
        })
    } else {
        Err(errs)
    }
}

/// A schema as declared: a mapping or a boolean (inline), or a file name (JSON, or YAML).
fn load(cfg: &Config, v: &Value, path: &str) -> Result<Value, ConfigError> {
    let limits = &cfg.openapi;
    let schema = match v {
        Value::Object(_) | Value::Bool(_) => v.clone(),
        Value::String(name) => read_file(cfg, name, path)?,
        _ => {
            return Err(ConfigError::at_path(
                path,
                format!(
                    "{path}: a JSON Schema is a mapping or a boolean, or the name of a file holding one"
                ),
            ));
        }
    };
    let bytes = serde_json::to_vec(&schema).map_or(usize::MAX, |b| b.len());
    if bytes > limits.max_schema_bytes {
        return Err(ConfigError::at_path(
            path,
            format!(
                "{path}: the schema is {bytes} bytes of JSON, over openapi.max_schema_bytes ({})",
                limits.max_schema_bytes
            ),
        ));
    }
    let depth = depth_of(&schema, limits.max_schema_depth.saturating_add(1));
    if depth > limits.max_schema_depth {
        return Err(ConfigError::at_path(
            path,
            format!(
                "{path}: the schema is nested deeper than openapi.max_schema_depth ({})",
                limits.max_schema_depth
            ),
        ));
    }
    compile(cfg, &schema).map_err(|e| {
        ConfigError::at_path(path, format!("{path}: not a valid JSON Schema (2020-12): {e}"))
            .hint("only references inside the schema resolve (`$ref: \"#/$defs/NAME\"`); a file or URL is never fetched")
    })?;
    Ok(schema)
}

/// Read a schema file named in the config (relative to the config's directory), at most
/// `openapi.max_schema_bytes` of it.
fn read_file(cfg: &Config, name: &str, path: &str) -> Result<Value, ConfigError> {
    let file = match fanout_config::config_dir(&cfg.file) {
        Some(dir) => dir.join(name),
        None => std::path::PathBuf::from(name),
    };
    let shown = file.display().to_string();
    let limit = cfg.openapi.max_schema_bytes;
    // Only a regular file, at most the limit (a FIFO would block a reload, /dev/zero never ends).
    let bytes = fanout_config::read_limited(&shown, u64::try_from(limit).unwrap_or(u64::MAX))
        .map_err(|e| {
            ConfigError::at_path(
                path,
                format!("{path}: cannot read the schema file `{shown}` (openapi.max_schema_bytes: {limit}): {e}"),
            )
        })?;
    let text = String::from_utf8_lossy(&bytes);
    let parsed: Result<Value, String> = if name.ends_with(".json") {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        serde_saphyr::from_str(&text).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| {
        ConfigError::at_path(
            path,
            format!("{path}: the schema file `{shown}` does not parse: {e}"),
        )
    })
}

/// How deep `v` nests (a scalar is 0), counting no further than `cap`.
fn depth_of(v: &Value, cap: usize) -> usize {
    if cap == 0 {
        return 0;
    }
    match v {
        Value::Array(a) => 1 + a.iter().map(|x| depth_of(x, cap - 1)).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(|x| depth_of(x, cap - 1)).max().unwrap_or(0),
        _ => 0,
    }
}

/// Compile a schema the way requests are validated.
pub(crate) fn compile(cfg: &Config, schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(cfg.openapi.validate_formats)
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_params_of_patterns() {
        assert_eq!(path_params("/users/{id}/posts/{post}"), ["id", "post"]);
        assert_eq!(path_params("/files/{*rest}"), ["rest"]);
        assert_eq!(path_params("/a/{{b}}"), Vec::<String>::new());
    }

    #[test]
    fn depth_counts_nesting() {
        let v = serde_json::json!({"a": {"b": [1, {"c": 2}]}});
        assert_eq!(depth_of(&v, 100), 4);
        assert_eq!(depth_of(&v, 2), 2);
    }
}
