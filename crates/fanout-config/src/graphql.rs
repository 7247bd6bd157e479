//! GraphQL routes (`graphql:` on a route): a schema (SDL), how each field is resolved (a step
//! of any kind, reading `$parent` and `$args`), introspection and the limits that refuse a
//! document before any backend call (docs/graphql.md).

use crate::{ConfigError, Located, Route, Step};
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

/// A GraphQL route: the schema, its resolvers and limits.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphqlRoute {
    /// The schema in SDL, inline (`schema: |` then the type definitions). Exactly one of
    /// `schema` and `schema_file`.
    pub schema: Option<Located<String>>,
    /// A file holding the schema in SDL, relative to the config file's directory.
    pub schema_file: Option<Located<String>>,
    /// How fields are resolved: `Type.field` → a step (`http`, `grpc`, `sql`, `model`, `value`,
    /// with `result`, `timeout`, `optional`, `on_status` …) whose expressions read the parent
    /// object as `$parent` and the field's arguments as `$args`. A field without a resolver is
    /// read from its parent's value by name; every field of the root types needs one.
    /// (The schema shows each as an object: its fields are a flow step's, `routes[].flow.*`.)
    #[serde(default)]
    #[schemars(
        with = "std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>>"
    )]
    pub resolvers: IndexMap<Located<String>, Step>,
    /// Answer the introspection fields (`__schema`, `__type`). Default true; turn it off in
    /// production to keep the schema private (`__typename` is always answered).
    #[serde(default = "yes")]
    pub introspection: bool,
    /// Limits checked before any backend call (each refusal a GraphQL error naming the limit).
    #[serde(default)]
    pub limits: GraphqlLimits,
    /// The schema's text and where it came from, filled in by the loader.
    #[serde(skip)]
    #[schemars(skip)]
    pub source: Option<SchemaSource>,
}

/// The SDL of a GraphQL route as loaded: its text and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaSource {
    /// The SDL.
    pub text: String,
    /// The file it was read from (`schema_file`), or `None` when it is inline in the config.
    pub file: Option<String>,
    /// Where the schema is given in the config (`schema` or `schema_file`).
    pub pos: crate::Pos,
}

fn yes() -> bool {
    true
}

/// The limits of a GraphQL route, checked on each operation before anything is called.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GraphqlLimits {
    /// Largest document (the query text), in bytes. Default 32768.
    pub max_document_bytes: usize,
    /// Deepest selection nesting (a root field is depth 1). Default 15.
    pub max_depth: usize,
    /// Most aliased fields in an operation (fragments counted where they are spread).
    /// Default 30.
    pub max_aliases: usize,
    /// Most fields selected in an operation (fragments counted where they are spread).
    /// Default 500.
    pub max_fields: usize,
    /// Highest estimated cost: every field costs 1, times the sizes of the lists above it
    /// (each list counted as `list_size` elements). Default 20000.
    pub max_cost: u64,
    /// The number of elements a list field is assumed to have in the cost estimate.
    /// Default 10.
    pub list_size: u64,
    /// Parsed and validated documents kept, by their text (the least recently used dropped
    /// first). Default 1000.
    pub cached_documents: usize,
    /// Most parents one resolver is run for at once (a list's elements resolved in one run of
    /// its step). Default 10000.
    pub max_batch: usize,
}

impl Default for GraphqlLimits {
    fn default() -> Self {
        GraphqlLimits {
            max_document_bytes: 32 << 10,
            max_depth: 15,
            max_aliases: 30,
            max_fields: 500,
            max_cost: 20_000,
            list_size: 10,
            cached_documents: 1000,
            max_batch: 10_000,
        }
    }
}

/// Most bytes of a `schema_file`.
pub const MAX_SCHEMA_BYTES: u64 = 4 << 20;

/// A GraphQL route without a method answers both POST and GET: it is read as two routes (POST,
/// then GET at the same path), and each route's schema text is read (`schema_file`).
pub(crate) fn normalize_routes(cfg: &mut crate::Config, errs: &mut Vec<ConfigError>) {
    let dir = crate::config_dir(&cfg.file);
    let mut out = Vec::with_capacity(cfg.routes.len());
    for mut r in std::mem::take(&mut cfg.routes) {
        let Some(g) = &mut r.graphql else {
            out.push(r);
            continue;
        };
        g.source = load_source(g, dir.as_deref(), errs);
        if r.method.pos.line == 0 {
            r.method.value = "POST".into();
            let mut get = r.clone();
            get.method.value = "GET".into();
            out.push(r);
            out.push(get);
        } else {
            out.push(r);
        }
    }
    cfg.routes = out;
}

fn load_source(
    g: &GraphqlRoute,
    dir: Option<&std::path::Path>,
    errs: &mut Vec<ConfigError>,
) -> Option<SchemaSource> {
    match (&g.schema, &g.schema_file) {
        (Some(s), None) => Some(SchemaSource {
            text: s.value.clone(),
            file: None,
            pos: s.pos,
        }),
        (None, Some(f)) => {
            let path = match dir {
                Some(d) => d.join(&f.value),
                None => std::path::PathBuf::from(&f.value),
            };
            let shown = path.display().to_string();
            match crate::read_limited(&shown, MAX_SCHEMA_BYTES)
                .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
            {
                Ok(text) => Some(SchemaSource {
                    text,
                    file: Some(shown),
                    pos: f.pos,
                }),
                Err(e) => {
                    errs.push(ConfigError::at(
                        f.pos,
                        format!("graphql.schema_file `{shown}` cannot be read: {e}"),
                    ));
                    None
                }
            }
        }
        (Some(s), Some(_)) => {
            errs.push(
                ConfigError::at(s.pos, "graphql has both `schema` and `schema_file`")
                    .hint("give the SDL inline or in a file, not both"),
            );
            None
        }
        (None, None) => None,
    }
}

/// A GraphQL route has its schema and no flow of its own.
pub(crate) fn check_route(r: &Route, errs: &mut Vec<ConfigError>) {
    let Some(g) = &r.graphql else {
        return;
    };
    let at = r.path.pos;
    if g.schema.is_none() && g.schema_file.is_none() {
        errs.push(
            ConfigError::at(
                at,
                "a `graphql` route needs `graphql.schema` or `schema_file`",
            )
            .hint("give the schema in SDL: `schema: |` then `type Query { … }`"),
        );
    }
    let mut not = |what: &str, hint: &str| {
        errs.push(ConfigError::at(at, format!("a `graphql` route has no `{what}`")).hint(hint));
    };
    if !r.flow.is_empty() {
        not(
            "flow",
            "fields are resolved by `graphql.resolvers`; move the steps there",
        );
    }
    if r.respond.is_some() {
        not("respond", "the answer is the GraphQL response");
    }
    if r.pass.is_some() || r.websocket.is_some() || r.grpc.is_some() {
        not(
            "pass/websocket/grpc",
            "a route is one of a flow, a pass-through, a WebSocket or a GraphQL route",
        );
    }
    for (name, step) in &g.resolvers {
        if step.for_each.is_some() {
            errs.push(
                ConfigError::at(name.pos, format!("resolver `{}` has `for_each`", name.value))
                    .hint("a resolver runs once per parent object (`$parent`); a list's parents are batched for you"),
            );
        }
        if matches!(step.missing, crate::MissingPolicy::Skip) {
            errs.push(
                ConfigError::at(
                    name.pos,
                    format!("resolver `{}` has `missing: skip`", name.value),
                )
                .hint("every parent needs a value: use `missing: null` or a `{value: …}`"),
            );
        }
    }
}
