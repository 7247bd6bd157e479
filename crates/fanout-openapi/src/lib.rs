//! The API contract of a config's routes (docs/openapi.md): the OpenAPI 3.1 document
//! (`fanout openapi`, the admin listener's `/openapi.json`) and request validation at the edge
//! against the routes' declared schemas, compiled when the config loads.
//!
//! [`Contract::compile`] loads and compiles every route's `parameters`, `request_schema` and
//! `answer_schema` (a schema that does not compile, is too large or too deep is a config error
//! at its field), builds the document once, and keeps a [`RouteCheck`] for each route that
//! declares something to check; the gateway asks [`Contract::route`] per request (a vector
//! lookup: nothing more for a route without one).

#![forbid(unsafe_code)]

mod export;
mod import;
mod infer;
mod propose;
mod refs;
mod schema;
mod validate;

pub use export::{DIALECT, error_schema};
pub use import::{ImportError, import};
pub use infer::{Reads, route_reads};
pub use propose::{Proposal, propose};
pub use schema::{Param, RouteSchemas, path_params};
pub use validate::{CODE, Invalid, RouteCheck, check_value};

use bytes::Bytes;
use fanout_config::{Config, ConfigError};

/// A loaded config's contract: each route's checks and the document.
pub struct Contract {
    checks: Vec<Option<RouteCheck>>,
    document: Bytes,
}

impl Contract {
    /// Load and compile every route's declared schemas and build the document. Errors are at
    /// their fields (`routes[2].request_schema`), located by the caller.
    pub fn compile(cfg: &Config) -> Result<Contract, Vec<ConfigError>> {
        let schemas = load(cfg)?;
        let checks = schemas
            .iter()
            .map(|s| RouteCheck::compile(cfg, s))
            .collect();
        let doc = export::document(cfg, &schemas, &route_reads(&cfg.source));
        Ok(Contract {
            checks,
            document: Bytes::from(doc.to_string()),
        })
    }

    /// Route `index`'s checks (`None`: it declares nothing to check).
    pub fn route(&self, index: usize) -> Option<&RouteCheck> {
        self.checks.get(index).and_then(Option::as_ref)
    }

    /// The document as JSON text.
    pub fn document_json(&self) -> &Bytes {
        &self.document
    }
}

/// Every route's declared schemas, loaded and checked (errors of every route at once).
pub fn load(cfg: &Config) -> Result<Vec<RouteSchemas>, Vec<ConfigError>> {
    let mut errs = Vec::new();
    let mut out = Vec::with_capacity(cfg.routes.len());
    for (i, route) in cfg.routes.iter().enumerate() {
        let kind_err = |field: &str, why: &str| {
            ConfigError::at_path(
                format!("routes[{i}].{field}"),
                format!("routes[{i}].{field}: {why}"),
            )
        };
        if route.request_schema.is_some() && (route.pass.is_some() || route.websocket.is_some()) {
            errs.push(kind_err(
                "request_schema",
                "a pass-through or WebSocket route streams its request body, which is never read whole: only a flow route validates one",
            ));
        }
        if route.grpc.is_some() && (route.request_schema.is_some() || !route.parameters.is_empty())
        {
            errs.push(kind_err(
                if route.request_schema.is_some() { "request_schema" } else { "parameters" },
                "a gRPC route's message is typed by its .proto (`protos:`), and it has no path or query parameters",
            ));
        }
        if !route.parameters.is_empty() && (route.pass.is_some() || route.websocket.is_some()) {
            errs.push(kind_err(
                "parameters",
                "typed parameters are checked on flow routes only (a pass-through or WebSocket route forwards what it is sent)",
            ));
        }
        match schema::load_route(cfg, i, route) {
            Ok(s) => out.push(s),
            Err(mut e) => {
                errs.append(&mut e);
                out.push(RouteSchemas::default());
            }
        }
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        for e in &mut errs {
            if e.file.is_empty() {
                e.file = cfg.file.clone();
            }
        }
        Err(errs)
    }
}

/// The OpenAPI 3.1 document of `cfg`'s routes (errors: a declared schema that does not load).
pub fn document(cfg: &Config) -> Result<serde_json::Value, Vec<ConfigError>> {
    let schemas = load(cfg)?;
    Ok(export::document(cfg, &schemas, &route_reads(&cfg.source)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_config::Config;

    fn config(yaml: &str) -> Config {
        Config::from_yaml("fanout.yaml", yaml, &|_| None).unwrap()
    }

    const ROUTE: &str = r#"
routes:
  - path: /items/{id}
    method: POST
    parameters:
      id: { schema: { type: integer, minimum: 1 } }
      tag: { schema: { type: array, items: { type: integer }, maxItems: 2 } }
      q: { required: true }
    request_schema:
      type: object
      required: [name]
      properties: { name: { type: string }, at: { type: string, format: date-time } }
    respond: { body: '1' }
"#;

    fn body(s: &str) -> fanout_expr::Val {
        fanout_expr::json::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn parameters_and_bodies_are_checked_with_pointer_and_keyword() {
        let c = Contract::compile(&config(ROUTE)).unwrap();
        let check = c.route(0).unwrap();
        let p = |id: &str, q: Option<&str>| check.params([("id", id)].into_iter(), q);
        assert!(p("7", Some("q=x&tag=1&tag=2")).is_ok());
        let e = p("x", Some("q=x")).unwrap_err();
        assert_eq!(e.details["in"], "path");
        assert_eq!(e.details["pointer"], "/id");
        assert_eq!(e.details["keyword"], "type");
        let e = p("7", None).unwrap_err();
        assert_eq!(e.details["keyword"], "required");
        assert_eq!(e.details["pointer"], "/q");
        let e = p("7", Some("q=x&tag=1&tag=b")).unwrap_err();
        assert_eq!(e.details["pointer"], "/tag/1");
        let e = p("7", Some("q=x&tag=1&tag=2&tag=3")).unwrap_err();
        assert_eq!(e.details["keyword"], "maxItems");
        let e = p("7", Some("q=x&q=y")).unwrap_err();
        assert!(e.message.contains("given 2 times"), "{}", e.message);

        assert!(check.body(&body(r#"{"name": "a"}"#)).is_ok());
        let e = check.body(&body(r#"{"name": 1}"#)).unwrap_err();
        assert_eq!(e.details["pointer"], "/name");
        assert_eq!(e.details["schema_path"], "/properties/name/type");
        assert!(
            e.message.contains("at /name") && e.message.contains("`type`"),
            "{}",
            e.message
        );
        let e = check
            .body(&body(r#"{"name": "a", "at": "yesterday"}"#))
            .unwrap_err();
        assert_eq!(e.details["keyword"], "format", "format is asserted");
        let e = check.body(&fanout_expr::Val::Null).unwrap_err();
        assert_eq!(e.details["keyword"], "type");
    }

    #[test]
    fn a_route_without_schemas_has_no_check() {
        let c = Contract::compile(&config(
            "routes:\n  - path: /a\n    respond: { body: '1' }\n",
        ))
        .unwrap();
        assert!(c.route(0).is_none());
    }

    #[test]
    fn bad_and_oversized_schemas_are_config_errors_at_their_field() {
        let errs = |yaml: &str| {
            Contract::compile(&config(yaml))
                .err()
                .unwrap()
                .into_iter()
                .map(|e| e.message)
                .collect::<Vec<_>>()
        };
        let e = errs(
            "routes:\n  - path: /a\n    request_schema: { type: 12 }\n    respond: { body: '1' }\n",
        );
        assert!(
            e[0].starts_with("routes[0].request_schema: not a valid JSON Schema"),
            "{e:?}"
        );
        let e = errs(
            "openapi: { max_schema_depth: 3 }\nroutes:\n  - path: /a\n    answer_schema: { properties: { a: { properties: { b: { type: string } } } } }\n    respond: { body: '1' }\n",
        );
        assert!(
            e[0].contains("deeper than openapi.max_schema_depth (3)"),
            "{e:?}"
        );
        let e = errs(
            "openapi: { max_schema_bytes: 10 }\nroutes:\n  - path: /a\n    answer_schema: { type: object, required: [abc] }\n    respond: { body: '1' }\n",
        );
        assert!(e[0].contains("over openapi.max_schema_bytes (10)"), "{e:?}");
        let e = errs(
            "routes:\n  - path: /a\n    request_schema: { $ref: 'https://example.com/s.json' }\n    respond: { body: '1' }\n",
        );
        assert!(
            e[0].contains("not a valid JSON Schema"),
            "a remote $ref is never fetched: {e:?}"
        );
        let e = errs(
            "routes:\n  - path: /a\n    parameters: { id: { in: path } }\n    respond: { body: '1' }\n",
        );
        assert!(e[0].contains("has no `{id}`"), "{e:?}");
        let e = errs(
            "routes:\n  - path: /a\n    request_schema: missing.json\n    respond: { body: '1' }\n",
        );
        assert!(e[0].contains("cannot read the schema file"), "{e:?}");
        // A FIFO is refused, never opened (a reload would block on it).
        let fifo = std::env::temp_dir().join(format!("fanout-openapi-fifo-{}", std::process::id()));
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let e = errs(&format!(
            "routes:\n  - path: /a\n    request_schema: {}\n    respond: {{ body: '1' }}\n",
            fifo.display()
        ));
        let _ = std::fs::remove_file(&fifo);
        assert!(e[0].contains("not a regular file"), "{e:?}");
    }
}
