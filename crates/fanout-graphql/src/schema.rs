//! The schema of a GraphQL route and its resolvers, compiled and checked at load: the SDL
//! parsed and validated by apollo-compiler (its errors at the config's FILE:LINE:COL), each
//! resolver `Type.field` a field of an object type, each compiled as a flow of its own whose
//! step runs once per parent (`$parent`) with the field's arguments (`$args`), and every field
//! of the root types resolved.

use crate::cache::DocCache;
use apollo_compiler::Name;
use apollo_compiler::Schema;
use apollo_compiler::collections::HashMap as AHashMap;
use apollo_compiler::schema::{ExtendedType, Implementers};
use apollo_compiler::validation::Valid;
use fanout_config::{ConfigError, GraphqlLimits, GraphqlRoute, Located, Pos, Route};
use fanout_flow::RoutePlan;
use fanout_flow::kind::{StepCx, StepIo};
use std::collections::HashMap;
use std::sync::Arc;

/// A GraphQL route, compiled: what every operation of it runs against.
pub struct Api {
    pub(crate) schema: Valid<Schema>,
    pub(crate) implementers: AHashMap<Name, Implementers>,
    /// `Type.field` → the flow that resolves it.
    pub(crate) resolvers: HashMap<(Name, Name), Resolver>,
    pub(crate) limits: GraphqlLimits,
    pub(crate) introspection: bool,
    pub(crate) cache: DocCache,
    /// `Type.field` → what the request's claims must have (`graphql.require`).
    pub(crate) requires: HashMap<(Name, Name), crate::authz::Requirement>,
    /// State the route's POST and GET halves share: APQ's store or the safelist, the cost
    /// budget's state.
    pub(crate) shared: Arc<Shared>,
    /// The per-client cost budget (`graphql.cost_limit`).
    pub(crate) cost: Option<crate::cost::CostLimit>,
}

/// What a `graphql:` section's routes (POST and GET) share.
pub(crate) struct Shared {
    pub(crate) persisted: crate::persisted::Persisted,
    pub(crate) cost: Option<Arc<fanout_ratelimit::Policy>>,
}

/// One field's resolver: its flow (a `for_each` step over `$request.parents`).
pub(crate) struct Resolver {
    pub(crate) plan: Arc<RoutePlan>,
    /// `http GET users`: its step's words, for `fanout explain`.
    pub(crate) text: String,
    pub(crate) io: StepIo,
}

/// The names of a resolver flow's slots 0–3: a `for_each` element is `$parent`.
const RESOLVER_SCOPE: [&str; 4] = ["request", "parent", "index", "ref"];

impl Api {
    /// Compile route `route`'s `graphql:` section, reporting every error in `sc`.
    pub(crate) fn compile(sc: &mut StepCx<'_, '_>, route: &Route, g: &GraphqlRoute) -> Option<Api> {
        let source = g.source.as_ref()?;
        let shown = source
            .file
            .clone()
            .unwrap_or_else(|| "schema.graphql".into());
        let schema = match Schema::parse_and_validate(&source.text, &shown) {
            Ok(s) => s,
            Err(e) => {
                let cfg_source = &sc.config().source;
                for d in e.errors.iter() {
                    let json = d.to_json();
                    let message = json.message.clone();
                    let at = json.locations.first().map(|l| (l.line, l.column));
                    let err = match (&source.file, at) {
                        (Some(f), Some((l, c))) => ConfigError::at(
                            source.pos,
                            format!("graphql schema {f}:{l}:{c}: {message}"),
                        ),
                        (None, Some((l, c))) => ConfigError::at(
                            inline_pos(cfg_source, source.pos, l, c),
                            format!("graphql schema: {message}"),
                        ),
                        (_, None) => {
                            ConfigError::at(source.pos, format!("graphql schema: {message}"))
                        }
                    };
                    sc.error(err);
                }
                return None;
            }
        };
        let errors_before = count_errors(sc);
        let mut resolvers = HashMap::new();
        for (key, step) in &g.resolvers {
            let Some((ty, field)) = resolver_target(sc, &schema, key, "resolver") else {
                continue;
            };
            let Some(plan) = resolver_flow(sc, route, key, step) else {
                continue;
            };
            let work = plan.steps.last().map(|s| s.work());
            let (text, io) = match work {
                Some(w) => (w.text, w.io),
                None => (String::new(), StepIo::None),
            };
            resolvers.insert(
                (ty, field),
                Resolver {
                    plan: Arc::new(plan),
                    text,
                    io,
                },
            );
        }
        // Every field of a root type needs a resolver: there is no parent value to read.
        for op in [
            apollo_compiler::ast::OperationType::Query,
            apollo_compiler::ast::OperationType::Mutation,
            apollo_compiler::ast::OperationType::Subscription,
        ] {
            let Some(root) = schema.root_operation(op) else {
                continue;
            };
            let Some(obj) = schema.get_object(root) else {
                continue;
            };
            for name in obj.fields.keys() {
                if !resolvers.contains_key(&(root.clone(), name.clone())) {
                    sc.error(
                        ConfigError::at(
                            source.pos,
                            format!("graphql: field `{root}.{name}` has no resolver"),
                        )
                        .hint(format!(
                            "a root field needs one under `graphql.resolvers`, e.g. \
                             `{root}.{name}: {{http: {{backend: NAME, path: '\"/…\"'}}}}`"
                        )),
                    );
                }
            }
        }
        let mut requires = HashMap::new();
        for (key, req) in &g.require {
            let Some(target) = resolver_target(sc, &schema, key, "graphql.require") else {
                continue;
            };
            let mut errs = Vec::new();
            match crate::authz::compile(sc.config(), route, key, req, &mut errs) {
                Some(r) => {
                    requires.insert(target, r);
                }
                None => {
                    for e in errs {
                        sc.error(e);
                    }
                }
            }
        }
        let mut errs = Vec::new();
        let cost_spec = crate::cost::spec(sc.config(), g, &mut errs);
        for e in errs {
            sc.error(e);
        }
        if op_is_subscription(&schema) {
            sc.error(
                ConfigError::at(source.pos, "graphql: subscriptions are not served yet")
                    .hint("remove the `subscription` root type"),
            );
        }
        if count_errors(sc) > errors_before {
            return None;
        }
        let implementers = schema.implementers_map();
        let make = || -> Arc<dyn std::any::Any + Send + Sync> {
            Arc::new(Shared {
                persisted: crate::persisted::Persisted::new(&g.persisted_queries),
                cost: cost_spec.as_ref().map(|c| c.policy()),
            })
        };
        let shared = g
            .shared
            .0
            .get_or_init(make)
            .clone()
            .downcast::<Shared>()
            .ok()
            .unwrap_or_else(|| {
                Arc::new(Shared {
                    persisted: crate::persisted::Persisted::new(&g.persisted_queries),
                    cost: cost_spec.as_ref().map(|c| c.policy()),
                })
            });
        let cost = match (cost_spec, &shared.cost) {
            (Some(c), Some(p)) => Some(c.limit(p.clone())),
            _ => None,
        };
        Some(Api {
            schema,
            implementers,
            resolvers,
            requires,
            cache: DocCache::new(g.limits.cached_documents),
            limits: g.limits.clone(),
            introspection: g.introspection,
            shared,
            cost,
        })
    }

    /// The resolvers, for `fanout explain`: `Query.posts → http GET posts, …`.
    pub(crate) fn describe(&self) -> String {
        let mut lines: Vec<String> = self
            .resolvers
            .iter()
            .map(|((t, f), r)| format!("{t}.{f} → {}", r.text))
            .collect();
        lines.sort();
        let mut text = format!("{} resolvers ({})", lines.len(), lines.join("; "));
        if !self.requires.is_empty() {
            let mut req: Vec<String> = self
                .requires
                .iter()
                .map(|((t, f), r)| format!("{t}.{f}: {}", r.describe()))
                .collect();
            req.sort();
            text.push_str(&format!("; require ({})", req.join("; ")));
        }
        if let Some(c) = &self.cost {
            text.push_str(&format!(
                "; cost budget `{}` ({} units at once)",
                c.name,
                c.burst()
            ));
        }
        match &self.shared.persisted {
            crate::persisted::Persisted::Off => {}
            crate::persisted::Persisted::Apq(_) => text.push_str("; persisted queries (APQ)"),
            crate::persisted::Persisted::Safelist { by_id, .. } => {
                text.push_str(&format!("; safelist of {} operations", by_id.len()))
            }
        }
        text
    }

    /// The first resolver that may write (a mutation's call), with its backend and what it does:
    /// such a route never shares a run between requests.
    pub(crate) fn writer(&self) -> Option<(String, String)> {
        let mut all: Vec<_> = self.resolvers.iter().collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all.into_iter().find_map(|((t, f), r)| match &r.io {
            StepIo::Calls {
                backend,
                writes: Some(what),
                ..
            } => Some((backend.clone(), format!("resolver {t}.{f}: {what}"))),
            _ => None,
        })
    }
}

fn op_is_subscription(schema: &Schema) -> bool {
    schema
        .root_operation(apollo_compiler::ast::OperationType::Subscription)
        .is_some()
}

/// How many errors the compilation has reported so far (a resolver's flow reports its own).
fn count_errors(sc: &mut StepCx<'_, '_>) -> usize {
    sc.error_count()
}

/// The config position of line `l`, column `c` of an inline SDL (`schema: |` then the text on
/// the following lines, indented).
fn inline_pos(source: &str, at: Pos, l: usize, c: usize) -> Pos {
    let lines: Vec<&str> = source.lines().collect();
    let first = at.line as usize; // 1-based line of `schema: |`: the text starts on the next
    let block = lines
        .get(first.saturating_sub(1))
        .map(|t| {
            let after = t.get((at.col as usize).saturating_sub(1)..).unwrap_or("");
            after.starts_with('|') || after.starts_with('>')
        })
        .unwrap_or(false);
    if !block {
        return Pos {
            line: at.line + l as u32 - 1,
            // a block scalar's position is its text's first line and column: every line of
            // the text is indented as far
            col: at.col + c as u32 - 1,
        };
    }
    let line_no = first + l; // 1-based
    let indent = lines
        .get(line_no - 1)
        .map(|t| t.len() - t.trim_start().len())
        .unwrap_or(0);
    Pos {
        line: line_no as u32,
        col: (indent + c) as u32,
    }
}

/// `Type.field` of a resolver key, checked against the schema.
fn resolver_target(
    sc: &mut StepCx<'_, '_>,
    schema: &Schema,
    key: &Located<String>,
    what: &str,
) -> Option<(Name, Name)> {
    let Some((t, f)) = key.value.split_once('.') else {
        sc.error(
            ConfigError::at(
                key.pos,
                format!("{what} `{}` is not `Type.field`", key.value),
            )
            .hint("name the field with its type, e.g. `Query.posts` or `Post.user`"),
        );
        return None;
    };
    let object = match schema.types.get(t) {
        Some(ExtendedType::Object(o)) => o,
        Some(_) => {
            sc.error(ConfigError::at(
                key.pos,
                format!("{what} `{}`: `{t}` is not an object type", key.value),
            ));
            return None;
        }
        None => {
            let names: Vec<&str> = schema
                .types
                .iter()
                .filter(|(_, ty)| ty.is_object() && !ty.is_built_in())
                .map(|(n, _)| n.as_str())
                .collect();
            let mut e = ConfigError::at(
                key.pos,
                format!("{what} `{}`: the schema has no type `{t}`", key.value),
            );
            if let Some(h) = fanout_names::did_you_mean(t, names.iter().copied()) {
                e = e.hint(h);
            }
            sc.error(e);
            return None;
        }
    };
    if !object.fields.contains_key(f) {
        let names: Vec<&str> = object.fields.keys().map(|n| n.as_str()).collect();
        let mut e = ConfigError::at(
            key.pos,
            format!("{what} `{}`: type `{t}` has no field `{f}`", key.value),
        );
        if let Some(h) = fanout_names::did_you_mean(f, names.iter().copied()) {
            e = e.hint(h);
        }
        sc.error(e);
        return None;
    }
    Some((Name::new(t).ok()?, Name::new(f).ok()?))
}

/// A resolver's flow: `args` (the field's arguments, `$args`) and the resolver's step run once
/// per parent (`for_each` over `$request.parents`, each parent `$parent`), answering the list
/// of values in the parents' order.
fn resolver_flow(
    sc: &mut StepCx<'_, '_>,
    route: &Route,
    key: &Located<String>,
    step: &fanout_config::Step,
) -> Option<RoutePlan> {
    let mut r = route.clone();
    r.graphql = None;
    r.path = Located {
        value: format!("{}#{}", route.path.value, key.value),
        ..route.path.clone()
    };
    r.flow.clear();
    let value = |s: &str| Located {
        pos: key.pos,
        used: key.pos,
        ..Located::unknown(s.to_string())
    };
    let args: fanout_config::Step =
        serde_json::from_value(serde_json::json!({ "value": "$request.args" })).ok()?;
    r.flow.insert(Located::unknown("args".to_string()), args);
    let mut resolve = step.clone();
    resolve.for_each = Some(value("$request.parents"));
    r.flow.insert(
        Located {
            value: "resolve".to_string(),
            ..key.clone()
        },
        resolve,
    );
    r.respond = Some(fanout_config::Respond {
        body: value("$resolve"),
        status: Default::default(),
        headers: Default::default(),
    });
    fanout_flow::kind::compile_flow(sc, &r, &RESOLVER_SCOPE, true)
}
