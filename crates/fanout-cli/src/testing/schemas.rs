//! `fanout test --schemas`: each case's request and answer checked against its route's declared
//! schemas (docs/openapi.md) — a success answer against `answer_schema`, an error answer against
//! the contract's error object, and the request body of a case the gateway accepted against
//! `request_schema`. A mismatch is a failure of the case naming the pointer and keyword.
//!
//! `fanout test --propose-schemas`: each flow route's success answers to its cases, made into a
//! draft `answer_schema` (`fanout_openapi::propose`) printed after the report for the author to
//! review — never written into the config.

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
        self.index(method, path)
            .and_then(|i| self.routes.get(i).map(|(_, _, s, graphql)| (s, *graphql)))
    }

    /// The index of the route `method path` matches (`path` may carry a query).
    pub fn index(&self, method: &str, path: &str) -> Option<usize> {
        let path = path.split('?').next().unwrap_or(path);
        let got = segments(path);
        self.routes.iter().position(|(m, pattern, _, graphql)| {
            (*graphql || m.eq_ignore_ascii_case(method)) && matches(pattern, &got)
        })
    }

    /// The draft answer schema of each route that answered a case with success and JSON
    /// (`answers[i]`: route `i`'s answers), in config order. Pass-through, WebSocket and
    /// GraphQL routes are left out (their answers are the backend's, or per query). The walk
    /// stops at the depth whose schema `openapi.max_schema_depth` still loads.
    pub fn proposals(&self, answers: &[Vec<Value>]) -> Vec<RouteProposal> {
        let limits = &self.cfg.openapi;
        // Each level of an answer is two of its schema (`properties`, the key), plus the top.
        let depth = limits.max_schema_depth.saturating_sub(1) / 2;
        let mut out = Vec::new();
        for (i, ((method, _, declared, graphql), route)) in
            self.routes.iter().zip(&self.cfg.routes).enumerate()
        {
            let Some(got) = answers.get(i).filter(|a| !a.is_empty()) else {
                continue;
            };
            if *graphql || route.pass.is_some() || route.websocket.is_some() {
                continue;
            }
            let proposal = fanout_openapi::propose(got, depth);
            let bytes = serde_json::to_vec(&proposal.schema).map_or(usize::MAX, |b| b.len());
            out.push(RouteProposal {
                route: i,
                method: method.clone(),
                path: match &route.grpc {
                    Some(g) => format!("/{}", g.value),
                    None => route.path.value.clone(),
                },
                line: route.path.pos.line,
                declared: declared.answer.is_some(),
                too_large: (bytes > limits.max_schema_bytes).then_some(bytes),
                proposal,
            });
        }
        out
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

/// A route's draft answer schema (`--propose-schemas`).
#[derive(Debug, Clone)]
pub struct RouteProposal {
    /// The route's place in `routes`.
    pub route: usize,
    /// Its method (`POST` for gRPC).
    pub method: String,
    /// Its path pattern.
    pub path: String,
    /// The config line of its `path`.
    pub line: u32,
    /// Whether it declares an `answer_schema` already (the draft is for comparing).
    pub declared: bool,
    /// The draft's JSON size when over `openapi.max_schema_bytes` (it would not load as is).
    pub too_large: Option<usize>,
    /// The draft.
    pub proposal: fanout_openapi::Proposal,
}

/// The header line of the proposals' text (what follows it is YAML).
pub const PROPOSALS_HEADER: &str = "# fanout test --propose-schemas";

/// The proposals as YAML, for people to review: a list, one entry per route, each with its
/// draft `answer_schema` and comments on what limited it.
pub fn proposals_text(config: &str, proposals: &[RouteProposal]) -> String {
    let mut out = format!(
        "{PROPOSALS_HEADER}: draft answer schemas from the cases' success answers ({config}).\n\
         # Review each before declaring it as the route's answer_schema: types, required keys\n\
         # (present in every answer) and array items are what the answers showed; enums, formats\n\
         # and bounds are never guessed. Nothing was written.\n"
    );
    if proposals.is_empty() {
        out.push_str("# no flow route answered a case with success and a JSON body\n[]\n");
        return out;
    }
    for p in proposals {
        let mut notes = Vec::new();
        if p.declared {
            notes.push(
                "it declares an answer_schema already: this draft is to compare with it"
                    .to_string(),
            );
        }
        if p.proposal.truncated {
            notes.push(
                "values nested deeper than openapi.max_schema_depth allows were not walked: their place accepts anything (`{}`)".to_string(),
            );
        }
        if let Some(b) = p.too_large {
            notes.push(format!(
                "the draft is {b} bytes of JSON, over openapi.max_schema_bytes: trim it (or raise the limit) before declaring it"
            ));
        }
        let entry = serde_json::json!([{
            "route": format!("{} {}", p.method, p.path),
            "answers": p.proposal.answers,
            "answer_schema": p.proposal.schema,
        }]);
        let _ = std::fmt::Write::write_fmt(
            &mut out,
            format_args!("# routes[{}] ({config}:{})\n", p.route, p.line),
        );
        for n in notes {
            out.push_str(&format!("# {n}\n"));
        }
        out.push_str(&serde_saphyr::to_string(&entry).unwrap_or_default());
    }
    out
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
