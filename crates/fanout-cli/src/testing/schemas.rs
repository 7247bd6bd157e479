//! `fanout test --schemas`: each case's request and answer checked against its route's declared
//! schemas (docs/openapi.md) — a success answer against `answer_schema`, an error answer against
//! the contract's error object, and the request body of a case the gateway accepted against
//! `request_schema`. A mismatch is a failure of the case naming the pointer and keyword.

use fanout_config::Config;
use fanout_openapi::RouteSchemas;
use serde_json::Value;

/// The config's routes and their declared schemas, for matching cases to routes.
pub struct Schemas {
    cfg: Config,
    routes: Vec<(String, Vec<String>, RouteSchemas, bool)>,
}

impl Schemas {
    /// Load every route's schemas (errors: the config's, at their fields).
    pub fn load(cfg: Config) -> Result<Schemas, fanout_config::ConfigErrors> {
        let schemas = fanout_openapi::load(&cfg).map_err(|mut e| {
            fanout_config::locate(&mut e, &cfg.source);
            fanout_config::ConfigErrors(e)
        })?;
        let routes = cfg
            .routes
            .iter()
            .zip(schemas)
            .map(|(r, s)| {
                let path = match &r.grpc {
                    Some(g) => format!("/{}", g.value),
                    None => r.path.value.clone(),
                };
                let method = if r.grpc.is_some() {
                    "POST".to_string()
                } else {
                    r.method.value.to_ascii_uppercase()
                };
                (method, segments(&path), s, r.graphql.is_some())
            })
            .collect();
        Ok(Schemas { cfg, routes })
    }

    /// The schemas of the route `method path` matches (`path` may carry a query).
    /// (A GraphQL route's pattern matches any method: it answers GET and POST.)
    fn route(&self, method: &str, path: &str) -> Option<(&RouteSchemas, bool)> {
        let path = path.split('?').next().unwrap_or(path);
        let got = segments(path);
        self.routes
            .iter()
            .find(|(m, pattern, _, graphql)| {
                (*graphql || m.eq_ignore_ascii_case(method)) && matches(pattern, &got)
            })
            .map(|(_, _, s, graphql)| (s, *graphql))
    }

    /// The failures of one case: its request (`method`, `path`, `body`) and the answer it got.
    pub fn check(
        &self,
        method: &str,
        path: &str,
        request: Option<&Value>,
        status: u16,
        answer: Option<&Value>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let Some((s, graphql)) = self.route(method, path) else {
            return out;
        };
        let mut against = |what: &str, schema: &Value, value: &Value| {
            if let Err(e) = fanout_openapi::check_value(&self.cfg, schema, value) {
                out.push(format!(
                    "schemas: the {what} does not match at {}: {}",
                    e.details["pointer"]
                        .as_str()
                        .filter(|p| !p.is_empty())
                        .unwrap_or("/"),
                    e.message
                        .split_once(": ")
                        .map_or(e.message.as_str(), |(_, m)| m)
                ));
            }
        };
        if (200..300).contains(&status) {
            if let (Some(schema), Some(body)) = (&s.request, request.or(Some(&Value::Null))) {
                against("request body (request_schema)", schema, body);
            }
            if let (Some(schema), Some(a)) = (&s.answer, answer) {
                against("answer (answer_schema)", schema, a);
            }
        } else if status >= 400 {
            match answer {
                // A GraphQL route's refusals of the operation (a parse or validation error, a
                // limit) are GraphQL responses: `errors`, each with a `message`. Its other
                // refusals (authentication, a deadline) are the error object.
                Some(a) if graphql && a.get("errors").is_some() => {
                    let ok = a["errors"].as_array().is_some_and(|e| {
                        !e.is_empty() && e.iter().all(|e| e["message"].is_string())
                    });
                    if !ok {
                        out.push(
                            "schemas: the GraphQL error answer's `errors` is not a list of errors \
                             with a `message`"
                                .to_string(),
                        );
                    }
                }
                Some(a) => against(
                    "error answer (the error object)",
                    &fanout_openapi::error_schema(),
                    a,
                ),
                None => out.push("schemas: the error answer is not JSON".to_string()),
            }
        }
        out
    }
}

fn segments(path: &str) -> Vec<String> {
    path.split('/').skip(1).map(str::to_string).collect()
}

/// Whether a request path's segments match a route pattern's (`{name}` one segment, `{*rest}`
/// the rest).
fn matches(pattern: &[String], path: &[String]) -> bool {
    for (i, p) in pattern.iter().enumerate() {
        if p.starts_with("{*") {
            return path.len() > i;
        }
        let Some(seg) = path.get(i) else {
            return false;
        };
        let param = p.starts_with('{') && p.ends_with('}') && !p.starts_with("{{");
        if !param && p != seg {
            return false;
        }
    }
    pattern.len() == path.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_matched_to_routes_and_checked() {
        let cfg = Config::from_yaml(
            "fanout.yaml",
            "routes:\n  - path: /a/{id}\n    answer_schema: { type: object, required: [id] }\n    respond: { body: '1' }\n",
            &|_| None,
        )
        .unwrap();
        let s = Schemas::load(cfg).unwrap();
        assert!(
            s.check(
                "GET",
                "/a/1?x=1",
                None,
                200,
                Some(&serde_json::json!({"id": 1}))
            )
            .is_empty()
        );
        let f = s.check(
            "GET",
            "/a/1",
            None,
            200,
            Some(&serde_json::json!({"name": 1})),
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].contains("answer (answer_schema)") && f[0].contains("`required`"),
            "{f:?}"
        );
        assert!(
            s.check("GET", "/b", None, 200, Some(&serde_json::json!({})))
                .is_empty(),
            "no route: nothing to check"
        );
        let f = s.check(
            "GET",
            "/a/1",
            None,
            404,
            Some(&serde_json::json!({"error": {"code": "x"}})),
        );
        assert!(f[0].contains("error object"), "{f:?}");
    }
}
