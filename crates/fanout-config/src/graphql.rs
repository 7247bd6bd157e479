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
    /// Persisted queries: automatic persisted queries (Apollo's APQ protocol: a hash instead
    /// of the query text) or a safelist (only the listed operations run).
    #[serde(default)]
    pub persisted_queries: PersistedQueries,
    /// Field-level authorization: `Type.field` → what the request's verified claims must have
    /// (`scopes`, a `require` predicate over `$auth`, as a route's `auth`). A field whose
    /// requirement fails is `null` with a `FORBIDDEN` field error, its resolver never run.
    /// Needs the route's `auth`.
    #[serde(default)]
    pub require: IndexMap<Located<String>, FieldRequire>,
    /// A per-client budget of estimated cost: the name of a `rate_limits` policy whose key
    /// tells clients apart and whose `rate`/`burst` are read as cost units (an operation is
    /// charged its estimated cost, not 1). Over it: 429 `COST_BUDGET_EXCEEDED` with
    /// `Retry-After`, before any backend call. A `store: local` policy. Default none.
    pub cost_limit: Option<Located<String>>,
    /// The schema's text and where it came from, filled in by the loader.
    #[serde(skip)]
    #[schemars(skip)]
    pub source: Option<SchemaSource>,
    /// State the route's POST and GET halves share (APQ's store, the cost budget), made by
    /// the GraphQL front on first use; a new config starts a new one.
    #[serde(skip)]
    #[schemars(skip)]
    pub shared: SharedSlot,
}

/// A slot for state shared by the routes a `graphql:` section becomes (POST and GET): clones
/// share it; it compares equal to every other (it is state, not config).
#[derive(Clone, Default)]
pub struct SharedSlot(
    pub std::sync::Arc<std::sync::OnceLock<std::sync::Arc<dyn std::any::Any + Send + Sync>>>,
);

impl PartialEq for SharedSlot {
    fn eq(&self, _: &SharedSlot) -> bool {
        true
    }
}

impl std::fmt::Debug for SharedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedSlot")
    }
}

/// A GraphQL route's persisted queries: APQ (`enabled`) or a safelist (`safelist`,
/// `safelist_file`), not both.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PersistedQueries {
    /// Automatic persisted queries: a request may send `extensions.persistedQuery.sha256Hash`
    /// instead of the query; an unknown hash is `PERSISTED_QUERY_NOT_FOUND` (the client sends
    /// the query with its hash, which is verified and stored). Default false.
    pub enabled: bool,
    /// Most queries the APQ store keeps (the least recently used dropped first). Default 1000.
    pub max_entries: usize,
    /// A safelist given inline: the operations (document texts) that may run, each known by
    /// its SHA-256. With a safelist, nothing else runs.
    pub safelist: Vec<String>,
    /// A safelist in a file (relative to the config file's directory, at most 4 MiB): an
    /// Apollo persisted query manifest, `{"format": "apollo-persisted-query-manifest",
    /// "version": 1, "operations": [{"id": …, "body": …}]}`.
    pub safelist_file: Option<Located<String>>,
    /// The safelist's operations as loaded (`id`, `body`): `safelist`'s (no id: known by
    /// their SHA-256), then `safelist_file`'s. Filled in by the loader.
    #[serde(skip)]
    #[schemars(skip)]
    pub loaded: Vec<(Option<String>, String)>,
}

impl Default for PersistedQueries {
    fn default() -> Self {
        PersistedQueries {
            enabled: false,
            max_entries: 1000,
            safelist: Vec::new(),
            safelist_file: None,
            loaded: Vec::new(),
        }
    }
}

impl PersistedQueries {
    /// Whether only listed operations run.
    pub fn is_safelist(&self) -> bool {
        !self.safelist.is_empty() || self.safelist_file.is_some()
    }
}

/// What a field asks of the request's verified claims (the grammar of a route's `auth`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldRequire {
    /// Scopes the token must all have (in its `scope` string or its `scp` array).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// A jq predicate over the verified claims (`$auth`), e.g. `$auth.role == "admin"`; false
    /// or an error fails the field.
    pub require: Option<Located<String>>,
}

/// Most bytes of a `safelist_file`.
pub const MAX_SAFELIST_BYTES: u64 = 4 << 20;

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
        load_safelist(&mut g.persisted_queries, dir.as_deref(), errs);
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

/// The safelist's operations: the inline ones by their SHA-256, then the manifest's.
fn load_safelist(
    pq: &mut PersistedQueries,
    dir: Option<&std::path::Path>,
    errs: &mut Vec<ConfigError>,
) {
    pq.loaded = pq.safelist.iter().map(|b| (None, b.clone())).collect();
    let Some(f) = &pq.safelist_file else {
        return;
    };
    let path = match dir {
        Some(d) => d.join(&f.value),
        None => std::path::PathBuf::from(&f.value),
    };
    let shown = path.display().to_string();
    let bad = |why: String| {
        ConfigError::at(
            f.pos,
            format!("graphql.persisted_queries.safelist_file `{shown}`: {why}"),
        )
        .hint(
            "an Apollo persisted query manifest: {\"format\": \"apollo-persisted-query-manifest\", \
             \"version\": 1, \"operations\": [{\"id\": \"…\", \"body\": \"query …\"}]}",
        )
    };
    let bytes = match crate::read_limited(&shown, MAX_SAFELIST_BYTES) {
        Ok(b) => b,
        Err(e) => {
            errs.push(bad(format!("cannot be read: {e}")));
            return;
        }
    };
    #[derive(Deserialize)]
    struct Manifest {
        format: Option<String>,
        operations: Vec<Operation>,
    }
    #[derive(Deserialize)]
    struct Operation {
        id: String,
        body: String,
    }
    let m: Manifest = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(e) => {
            errs.push(bad(format!("is not a manifest: {e}")));
            return;
        }
    };
    if m.format
        .as_deref()
        .is_some_and(|f| f != "apollo-persisted-query-manifest")
    {
        errs.push(bad(
            "its `format` is not `apollo-persisted-query-manifest`".into()
        ));
        return;
    }
    pq.loaded
        .extend(m.operations.into_iter().map(|o| (Some(o.id), o.body)));
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
    let pq = &g.persisted_queries;
    if pq.enabled && pq.is_safelist() {
        errs.push(
            ConfigError::at(
                pq.safelist_file.as_ref().map_or(at, |f| f.pos),
                "graphql.persisted_queries has both `enabled` (APQ) and a safelist",
            )
            .hint("a safelist runs only its operations; APQ would register any other: choose one"),
        );
    }
    if pq.enabled && pq.max_entries == 0 {
        errs.push(
            ConfigError::at(
                at,
                "graphql.persisted_queries.max_entries is 0 with APQ enabled",
            )
            .hint("keep at least one query (default 1000)"),
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
