//! One GraphQL request: parameters, document (cached), operation, limits, variables, then
//! execution level by level — each field of a selection resolved once for all its parents (a
//! list's elements together), the fields of a selection at once (a mutation's root fields in
//! order), values completed against their types with null propagation as the spec says, errors
//! with their `path`.

use crate::request::{self, GRAPHQL_RESPONSE, JSON, Params};
use crate::schema::{Api, Resolver};
use apollo_compiler::ExecutableDocument;
use apollo_compiler::Name;
use apollo_compiler::ast::{OperationType, Type, Value};
use apollo_compiler::executable::{Field, Selection, SelectionSet};
use apollo_compiler::response::{JsonMap, JsonValue};
use apollo_compiler::schema::ExtendedType;
use apollo_compiler::validation::Valid;
use fanout_expr::json::{obj_get, str_val};
use fanout_expr::{Num, Val};
use fanout_flow::kind::StepIo;
use fanout_layers::trace::CallTrace;
use futures_util::future::{BoxFuture, join_all};
use indexmap::IndexMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// The answer of one request, as the `graphql` step's value: `{status, type, body}`.
pub(crate) async fn serve(
    api: &Api,
    request: &Val,
    deadline: Instant,
    trace: Option<CallTrace>,
) -> Val {
    let p = match request::params(request) {
        Ok(p) => p,
        Err((e, legacy)) => return request_error(legacy, e.status, e.code, &e.message, None),
    };
    match run(api, request, &p, deadline, trace).await {
        Ok(body) => answer(&p, 200, body),
        Err(e) => {
            let mut v = request_error(p.legacy, e.status, e.code, &e.message, e.locations);
            if let (Some(secs), Val::Obj(o)) = (e.retry_after, &mut v) {
                fanout_expr::Rc::make_mut(o).insert(
                    str_val("retry_after"),
                    Val::Num(Num::from_integral(secs as isize)),
                );
            }
            v
        }
    }
}

/// The parser's nesting bound (Apollo Router's default).
const PARSER_RECURSION: usize = 500;
/// The parser's token bound (Apollo Router's default).
const PARSER_TOKENS: usize = 15_000;

/// A request error: no `data`, one error.
struct ReqErr {
    status: u16,
    code: &'static str,
    message: String,
    locations: Option<Val>,
    /// Seconds until a refused client may try again (`Retry-After`).
    retry_after: Option<u64>,
}

fn req_err(status: u16, code: &'static str, message: impl Into<String>) -> ReqErr {
    ReqErr {
        status,
        code,
        message: message.into(),
        locations: None,
        retry_after: None,
    }
}

fn obj(pairs: impl IntoIterator<Item = (&'static str, Val)>) -> Val {
    Val::obj(pairs.into_iter().map(|(k, v)| (str_val(k), v)).collect())
}

fn answer(p: &Params, status: u16, body: Val) -> Val {
    let ty = if p.legacy { JSON } else { GRAPHQL_RESPONSE };
    obj([
        ("status", Val::Num(Num::from_integral(status as isize))),
        ("type", str_val(ty)),
        ("body", body),
    ])
}

fn request_error(
    legacy: bool,
    status: u16,
    code: &str,
    message: &str,
    locations: Option<Val>,
) -> Val {
    let mut e = vec![("message", str_val(message))];
    if let Some(l) = locations {
        e.push(("locations", l));
    }
    e.push(("extensions", obj([("code", str_val(code))])));
    let body = obj([("errors", Val::Arr(vec![obj(e)].into()))]);
    // `application/json`: 200 for a well-formed request that fails (parse, validation,
    // variables, a limit: spec § "application/json"), its 4xx for one that is not (a parameter
    // of the wrong type, no `query`, the method, the media type); the new type: the error's own
    // status. A spent budget keeps its 429.
    let keeps_status = matches!(
        code,
        "BAD_REQUEST" | "METHOD_NOT_ALLOWED" | "UNSUPPORTED_MEDIA_TYPE"
    ) || matches!(status, 405 | 429);
    let (status, ty) = if legacy {
        (if keeps_status { status } else { 200 }, JSON)
    } else {
        (status, GRAPHQL_RESPONSE)
    };
    obj([
        ("status", Val::Num(Num::from_integral(status as isize))),
        ("type", str_val(ty)),
        ("body", body),
    ])
}

async fn run(
    api: &Api,
    request: &Val,
    p: &Params,
    deadline: Instant,
    trace: Option<CallTrace>,
) -> Result<Val, ReqErr> {
    let found = api
        .shared
        .persisted
        .find(p.query.as_deref(), p.persisted.as_ref())
        .map_err(|(status, code, message)| req_err(status, code, message))?;
    let (stored, register) = match found {
        Some(crate::persisted::Found::Query(t)) => (Some(t), None),
        Some(crate::persisted::Found::Register(h)) => (None, Some(h)),
        None => (None, None),
    };
    let Some(query) = stored
        .as_deref()
        .or(p.query.as_deref())
        .filter(|q| !q.is_empty())
    else {
        return Err(req_err(400, "BAD_REQUEST", "the request has no `query`"));
    };
    if query.len() > api.limits.max_document_bytes {
        return Err(req_err(
            400,
            "MAX_DOCUMENT_BYTES_EXCEEDED",
            format!(
                "the document is {} bytes, more than graphql.limits.max_document_bytes ({})",
                query.len(),
                api.limits.max_document_bytes
            ),
        ));
    }
    let doc = match api.cache.get(query) {
        Some(d) => d,
        None => {
            let invalid =
                |code: &'static str, errors: &apollo_compiler::validation::DiagnosticList| {
                    let first = errors.iter().next().map(|d| d.to_json());
                    let (message, locations) = match first {
                        Some(j) => (j.message.clone(), locations_val(&j.locations)),
                        None => ("the document is not valid".to_string(), None),
                    };
                    ReqErr {
                        status: 400,
                        code,
                        message,
                        locations,
                        retry_after: None,
                    }
                };
            // The parser's own bounds (Apollo Router's defaults): nesting and tokens.
            let doc = apollo_compiler::parser::Parser::new()
                .recursion_limit(PARSER_RECURSION)
                .token_limit(PARSER_TOKENS)
                .parse_ast(query, "query.graphql")
                .map_err(|e| invalid("GRAPHQL_PARSE_FAILED", &e.errors))?
                .to_executable_validate(&api.schema)
                .map_err(|e| invalid("GRAPHQL_VALIDATION_FAILED", &e.errors))?;
            let doc = Arc::new(doc);
            api.cache.put(query, doc.clone());
            doc
        }
    };
    // APQ: a query sent with its (verified) hash is kept once it is a valid document.
    if let Some(h) = register {
        api.shared.persisted.register(h, query);
    }
    let op = doc
        .operations
        .get(p.operation_name.as_deref())
        .map_err(|e| req_err(400, "OPERATION_RESOLUTION_FAILURE", e.message().to_string()))?;
    if p.is_get && op.operation_type != OperationType::Query {
        return Err(req_err(
            405,
            "METHOD_NOT_ALLOWED",
            "only queries may be sent with GET; send mutations with POST",
        ));
    }
    let cost = crate::limits::check(&doc, &op.selection_set, &api.limits)
        .map_err(|e| req_err(400, e.code, e.message))?;
    let raw: JsonMap = match &p.variables {
        Some(v) => serde_json::from_str(&fanout_expr::json::to_string(v))
            .map_err(|_| req_err(400, "BAD_REQUEST", "`variables` is not an object"))?,
        None => JsonMap::new(),
    };
    let vars =
        apollo_compiler::request::coerce_variable_values(&api.schema, op, &raw).map_err(|e| {
            ReqErr {
                status: 400,
                code: "BAD_USER_INPUT",
                message: e.message().to_string(),
                locations: None,
                retry_after: None,
            }
        })?;
    // Introspection: answered by apollo-compiler, merged with the concrete fields' values.
    let introspects = op
        .root_fields(&doc)
        .any(|f| matches!(f.name.as_str(), "__schema" | "__type"));
    let intro = if introspects {
        if !api.introspection {
            return Err(req_err(
                400,
                "INTROSPECTION_DISABLED",
                "introspection is turned off on this route (graphql.introspection)",
            ));
        }
        apollo_compiler::introspection::check_max_depth(&doc, op)
            .map_err(|e| req_err(400, "MAX_DEPTH_EXCEEDED", e.message().to_string()))?;
        let r = apollo_compiler::introspection::partial_execute(
            &api.schema,
            &api.implementers,
            &doc,
            op,
            &vars,
        )
        .map_err(|e| req_err(400, "GRAPHQL_VALIDATION_FAILED", e.message().to_string()))?;
        r.data.map(|d| from_json(&JsonValue::Object(d)))
    } else {
        None
    };
    // The client's cost budget, charged the estimate before any backend call.
    if let Some(c) = &api.cost
        && cost > c.burst()
    {
        return Err(req_err(
            400,
            "COST_BUDGET_EXCEEDED",
            format!(
                "the operation's estimated cost ({cost}) is more than the whole cost budget \
                 (graphql.cost_limit `{}`, {} units at once): it can never run",
                c.name,
                c.burst()
            ),
        ));
    }
    if let Some(c) = &api.cost
        && let Err(wait) = c.charge(request, cost)
    {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        return Err(ReqErr {
            status: 429,
            code: "COST_BUDGET_EXCEEDED",
            message: format!(
                "the client's cost budget (graphql.cost_limit `{}`, {} units at once) is spent: \
                 this operation's estimated cost is {cost}; retry in {}s",
                c.name,
                c.burst(),
                secs.max(1)
            ),
            locations: None,
            retry_after: Some(secs.max(1)),
        });
    }
    let Some(root) = api.schema.root_operation(op.operation_type).cloned() else {
        return Err(req_err(
            400,
            "GRAPHQL_VALIDATION_FAILED",
            "the schema has no root type for this operation",
        ));
    };
    let x = Exec {
        api,
        doc: &doc,
        vars: &vars,
        request,
        deadline,
        trace,
        errors: Mutex::new(Vec::new()),
        serial: op.operation_type == OperationType::Mutation,
    };
    let sets = [&op.selection_set];
    let out = x
        .selection(&root, &sets, vec![Val::Null], vec![None], intro.as_ref())
        .await;
    let data = match out.into_iter().next() {
        Some(C::V(v)) => v,
        _ => Val::Null,
    };
    let errors = x.errors.into_inner().unwrap_or_default();
    let mut body = Vec::with_capacity(2);
    if !errors.is_empty() {
        body.push(("errors", Val::Arr(errors.into())));
    }
    body.push(("data", data));
    Ok(obj(body))
}

fn locations_val(l: &[apollo_compiler::parser::LineColumn]) -> Option<Val> {
    if l.is_empty() {
        return None;
    }
    Some(
        l.iter()
            .map(|lc| {
                obj([
                    ("line", Val::Num(Num::from_integral(lc.line as isize))),
                    ("column", Val::Num(Num::from_integral(lc.column as isize))),
                ])
            })
            .collect(),
    )
}

/// A completed position: a value, `null`, or `null` that must propagate to the nearest
/// nullable parent (its error already recorded).
#[derive(Clone)]
enum C {
    V(Val),
    Null,
    Fail,
}

/// A response path, shared by its children.
type Path = Option<Arc<Seg>>;

struct Seg {
    parent: Path,
    key: Key,
}

enum Key {
    Field(Name),
    Index(usize),
}

fn child(p: &Path, key: Key) -> Path {
    Some(Arc::new(Seg {
        parent: p.clone(),
        key,
    }))
}

fn path_val(p: &Path) -> Val {
    let mut segs = Vec::new();
    let mut at = p.as_ref();
    while let Some(s) = at {
        segs.push(match &s.key {
            Key::Field(n) => str_val(n.as_str()),
            Key::Index(i) => Val::Num(Num::from_integral(*i as isize)),
        });
        at = s.parent.as_ref();
    }
    segs.reverse();
    Val::Arr(segs.into())
}

struct Exec<'a> {
    api: &'a Api,
    doc: &'a Valid<ExecutableDocument>,
    vars: &'a Valid<JsonMap>,
    request: &'a Val,
    deadline: Instant,
    /// The `graphql` step's trace context: each resolver run is a span under it.
    trace: Option<CallTrace>,
    errors: Mutex<Vec<Val>>,
    /// A mutation: the root fields run one after the other.
    serial: bool,
}

impl<'a> Exec<'a> {
    fn error(&self, message: &str, code: &str, path: &Path, field: &Field) {
        let mut e = vec![("message", str_val(message))];
        if let Some(range) = field
            .name
            .location()
            .and_then(|l| l.line_column_range(&self.doc.sources))
        {
            e.push((
                "locations",
                Val::Arr(
                    vec![obj([
                        (
                            "line",
                            Val::Num(Num::from_integral(range.start.line as isize)),
                        ),
                        (
                            "column",
                            Val::Num(Num::from_integral(range.start.column as isize)),
                        ),
                    ])]
                    .into(),
                ),
            ));
        }
        e.push(("path", path_val(path)));
        e.push(("extensions", obj([("code", str_val(code))])));
        if let Ok(mut errs) = self.errors.lock() {
            errs.push(obj(e));
        }
    }

    /// The objects of type `ty` for `parents` with the merged selection sets `sets`: each
    /// field resolved once for all parents.
    fn selection<'b>(
        &'b self,
        ty: &'b Name,
        sets: &'b [&'b SelectionSet],
        parents: Vec<Val>,
        paths: Vec<Path>,
        intro: Option<&'b Val>,
    ) -> BoxFuture<'b, Vec<C>> {
        Box::pin(async move {
            let mut fields: IndexMap<Name, Vec<&'b Field>> = IndexMap::new();
            for s in sets {
                self.collect(ty, s, &mut fields, 0);
            }
            let mut results: Vec<Vec<C>> = Vec::with_capacity(fields.len());
            if self.serial {
                for (k, nodes) in &fields {
                    results.push(self.one(ty, k, nodes, intro, &parents, &paths).await);
                }
            } else {
                results = join_all(
                    fields
                        .iter()
                        .map(|(k, nodes)| self.one(ty, k, nodes, intro, &parents, &paths)),
                )
                .await;
            }
            (0..parents.len())
                .map(|j| {
                    let mut m = fanout_expr::Map::default();
                    for ((k, _), r) in fields.iter().zip(&results) {
                        match r.get(j) {
                            Some(C::V(v)) => {
                                m.insert(str_val(k.as_str()), v.clone());
                            }
                            Some(C::Null) | None => {
                                m.insert(str_val(k.as_str()), Val::Null);
                            }
                            Some(C::Fail) => return C::Fail,
                        }
                    }
                    C::V(Val::obj(m))
                })
                .collect()
        })
    }

    /// One response key of a selection: an introspection field's value from `intro`, else
    /// the field resolved.
    async fn one(
        &self,
        ty: &Name,
        key: &Name,
        nodes: &[&'a Field],
        intro: Option<&Val>,
        parents: &[Val],
        paths: &[Path],
    ) -> Vec<C> {
        if let (Some(i), true) = (
            intro,
            matches!(nodes[0].name.as_str(), "__schema" | "__type"),
        ) {
            let v = match i {
                Val::Obj(o) => obj_get(o, key.as_str()).cloned().unwrap_or(Val::Null),
                _ => Val::Null,
            };
            return vec![C::V(v)];
        }
        self.field(ty, key, nodes, parents, paths).await
    }

    /// CollectFields: the fields of `set` for an object of type `ty`, by response key,
    /// `@skip`/`@include` applied, fragments whose type condition applies expanded.
    fn collect(
        &self,
        ty: &Name,
        set: &'a SelectionSet,
        out: &mut IndexMap<Name, Vec<&'a Field>>,
        depth: usize,
    ) {
        if depth > 64 {
            return;
        }
        for sel in &set.selections {
            if !self.included(sel.directives()) {
                continue;
            }
            match sel {
                Selection::Field(f) => out.entry(f.response_key().clone()).or_default().push(f),
                Selection::FragmentSpread(s) => {
                    if let Some(frag) = self.doc.fragments.get(&s.fragment_name)
                        && self.applies(frag.type_condition(), ty)
                    {
                        self.collect(ty, &frag.selection_set, out, depth + 1);
                    }
                }
                Selection::InlineFragment(i) => {
                    if i.type_condition
                        .as_ref()
                        .is_none_or(|c| self.applies(c, ty))
                    {
                        self.collect(ty, &i.selection_set, out, depth + 1);
                    }
                }
            }
        }
    }

    fn applies(&self, condition: &Name, ty: &Name) -> bool {
        condition == ty || self.api.schema.is_subtype(condition, ty)
    }

    fn included(&self, d: &apollo_compiler::executable::DirectiveList) -> bool {
        let flag = |name: &str| {
            d.get(name)
                .and_then(|d| d.specified_argument_by_name("if"))
                .map(|v| match v.as_ref() {
                    Value::Boolean(b) => *b,
                    Value::Variable(n) => {
                        matches!(self.vars.get(n.as_str()), Some(JsonValue::Bool(true)))
                    }
                    _ => false,
                })
        };
        flag("skip") != Some(true) && flag("include") != Some(false)
    }

    /// One field (response key `key`, its nodes merged) of type `ty`'s objects `parents`.
    async fn field(
        &self,
        ty: &Name,
        key: &Name,
        nodes: &[&'a Field],
        parents: &[Val],
        paths: &[Path],
    ) -> Vec<C> {
        let f = nodes[0];
        if f.name == "__typename" {
            return parents.iter().map(|_| C::V(str_val(ty.as_str()))).collect();
        }
        let paths: Vec<Path> = paths
            .iter()
            .map(|p| child(p, Key::Field(key.clone())))
            .collect();
        let ty_ref = &f.definition.ty;
        if let Some(req) = self.api.requires.get(&(ty.clone(), f.name.clone()))
            && let Err(why) = req.check(self.claims())
        {
            let message = format!("not allowed to read `{ty}.{}`: {why}", f.name);
            for p in &paths {
                self.error(&message, "FORBIDDEN", p, f);
            }
            let c = if ty_ref.is_non_null() {
                C::Fail
            } else {
                C::Null
            };
            return vec![c; parents.len()];
        }
        let values = match self.api.resolvers.get(&(ty.clone(), f.name.clone())) {
            Some(r) => self.resolve(ty, r, f, parents).await,
            None => Ok(parents
                .iter()
                .map(|p| match p {
                    Val::Obj(o) => obj_get(o, f.name.as_str()).cloned().unwrap_or(Val::Null),
                    _ => Val::Null,
                })
                .collect()),
        };
        match values {
            Ok(values) => self.complete(ty_ref, nodes, values, paths).await,
            Err((message, code)) => {
                for p in &paths {
                    self.error(&message, &code, p, f);
                }
                let c = if ty_ref.is_non_null() {
                    C::Fail
                } else {
                    C::Null
                };
                vec![c; parents.len()]
            }
        }
    }

    /// The request's verified claims (`$request.auth`; null when anonymous).
    fn claims(&self) -> &Val {
        match self.request {
            Val::Obj(o) => obj_get(o, "auth").unwrap_or(&Val::Null),
            _ => &Val::Null,
        }
    }

    /// A resolver's flow run once for all `parents`: their values, in order.
    async fn resolve(
        &self,
        ty: &Name,
        r: &Resolver,
        f: &Field,
        parents: &[Val],
    ) -> Result<Vec<Val>, (String, String)> {
        let max = self.api.limits.max_batch;
        if parents.len() > max {
            return Err((
                format!(
                    "field `{}` would be resolved for {} parents, more than graphql.limits.max_batch ({max})",
                    f.name,
                    parents.len()
                ),
                "MAX_BATCH_EXCEEDED".into(),
            ));
        }
        let args = self.args(f);
        let mut req = match self.request {
            Val::Obj(o) => (**o).clone(),
            _ => fanout_expr::Map::default(),
        };
        req.insert(str_val("parents"), Val::Arr(parents.to_vec().into()));
        req.insert(str_val("args"), args);
        let ran = match &self.trace {
            None => r.plan.run(Val::obj(req), self.deadline).await,
            Some(t) => {
                // A span per resolver run (sampled requests), its calls under it; the calls
                // counted for the request's record either way.
                let mut span = None;
                let mut ct = t.clone();
                if let Some(tracer) = &t.tracer {
                    let mut attrs = vec![
                        ("graphql.field", format!("{ty}.{}", f.name)),
                        ("graphql.parents", parents.len().to_string()),
                    ];
                    if let StepIo::Calls { backend, .. } = &r.io {
                        attrs.push(("fanout.backend", backend.clone()));
                    }
                    // Unsampled: no span; the calls still send the request's context.
                    if let Some((child, s)) =
                        tracer.child(&format!("resolve {ty}.{}", f.name), attrs)
                    {
                        ct.tracer = Some(child);
                        span = Some(s);
                    }
                }
                let obs = FieldObserver {
                    trace: ct,
                    calls: AtomicUsize::new(0),
                };
                let ran = r
                    .plan
                    .run_observed(Val::obj(req), self.deadline, &obs)
                    .await;
                if let Some(mut s) = span {
                    let calls = obs.calls.load(Ordering::Relaxed).to_string();
                    let mut attrs = vec![("fanout.calls", calls.as_str())];
                    match &ran {
                        Ok(_) => attrs.push(("fanout.outcome", "ok")),
                        Err(e) => {
                            attrs.push(("fanout.outcome", "failed"));
                            attrs.push(("error.type", e.code()));
                        }
                    }
                    s.set_attributes(&attrs);
                    s.end(Ok(http::StatusCode::OK));
                }
                ran
            }
        };
        match ran {
            Ok(out) => {
                let v = out.value.unwrap_or(Val::Null);
                Ok(match v {
                    Val::Arr(a) if a.len() == parents.len() => a.to_vec(),
                    // skipped by its `when`: its default for every parent
                    other => vec![other; parents.len()],
                })
            }
            Err(e) => Err((e.message.to_string(), e.code().to_string())),
        }
    }

    /// The field's arguments as an object: given values (variables substituted), else the
    /// definition's defaults.
    fn args(&self, f: &Field) -> Val {
        let mut m = fanout_expr::Map::default();
        for def in &f.definition.arguments {
            let given = f
                .arguments
                .iter()
                .find(|a| a.name == def.name)
                .map(|a| a.value.as_ref());
            let v = match (given, &def.default_value) {
                (Some(Value::Variable(n)), d) => match self.vars.get(n.as_str()) {
                    Some(v) => Some(from_json(v)),
                    None => d.as_ref().map(|d| self.value(d)),
                },
                (Some(v), _) => Some(self.value(v)),
                (None, Some(d)) => Some(self.value(d)),
                (None, None) => None,
            };
            if let Some(v) = v {
                m.insert(str_val(def.name.as_str()), v);
            }
        }
        Val::obj(m)
    }

    fn value(&self, v: &Value) -> Val {
        match v {
            Value::Null => Val::Null,
            Value::Enum(n) => str_val(n.as_str()),
            Value::Variable(n) => self
                .vars
                .get(n.as_str())
                .map(from_json)
                .unwrap_or(Val::Null),
            Value::String(s) => str_val(s),
            Value::Float(x) => Val::Num(Num::Float(x.try_to_f64().unwrap_or(f64::NAN))),
            Value::Int(i) => match i.as_str().parse::<isize>() {
                Ok(n) => Val::Num(Num::from_integral(n)),
                Err(_) => Val::Num(Num::Float(i.try_to_f64().unwrap_or(f64::NAN))),
            },
            Value::Boolean(b) => Val::Bool(*b),
            Value::List(l) => l.iter().map(|x| self.value(x)).collect(),
            Value::Object(o) => Val::obj(
                o.iter()
                    .map(|(k, x)| (str_val(k.as_str()), self.value(x)))
                    .collect(),
            ),
        }
    }

    /// CompleteValue for every position at once.
    fn complete<'b>(
        &'b self,
        ty: &'b Type,
        nodes: &'b [&'a Field],
        values: Vec<Val>,
        paths: Vec<Path>,
    ) -> BoxFuture<'b, Vec<C>> {
        Box::pin(async move {
            let f = nodes[0];
            let inner = self
                .complete_nullable(ty, nodes, values, paths.clone())
                .await;
            if ty.is_non_null() {
                inner
                    .into_iter()
                    .zip(&paths)
                    .map(|(c, p)| match c {
                        C::Null => {
                            self.error(
                                &format!("field `{}` is non-null, but its value is null", f.name),
                                "NULL_VALUE",
                                p,
                                f,
                            );
                            C::Fail
                        }
                        c => c,
                    })
                    .collect()
            } else {
                inner
                    .into_iter()
                    .map(|c| match c {
                        C::Fail => C::Null,
                        c => c,
                    })
                    .collect()
            }
        })
    }

    async fn complete_nullable(
        &self,
        ty: &Type,
        nodes: &[&'a Field],
        values: Vec<Val>,
        paths: Vec<Path>,
    ) -> Vec<C> {
        let f = nodes[0];
        if ty.is_list() {
            let item = ty.item_type();
            let mut flat = Vec::new();
            let mut flat_paths = Vec::new();
            let mut shape: Vec<Option<usize>> = Vec::with_capacity(values.len());
            let mut out: Vec<Option<C>> = vec![None; values.len()];
            for (j, (v, p)) in values.into_iter().zip(&paths).enumerate() {
                match v {
                    Val::Null => {
                        out[j] = Some(C::Null);
                        shape.push(None);
                    }
                    Val::Arr(a) => {
                        shape.push(Some(a.len()));
                        for (k, x) in a.iter().enumerate() {
                            flat.push(x.clone());
                            flat_paths.push(child(p, Key::Index(k)));
                        }
                    }
                    other => {
                        self.error(
                            &format!(
                                "field `{}` is a list, but its value is {}",
                                f.name,
                                fanout_expr::kind_phrase(&other)
                            ),
                            "BAD_VALUE",
                            p,
                            f,
                        );
                        out[j] = Some(C::Fail);
                        shape.push(None);
                    }
                }
            }
            let items = self.complete(item, nodes, flat, flat_paths).await;
            let mut it = items.into_iter();
            for (j, s) in shape.into_iter().enumerate() {
                let Some(n) = s else { continue };
                let mut list = Vec::with_capacity(n);
                let mut failed = false;
                for c in it.by_ref().take(n) {
                    match c {
                        C::V(v) => list.push(v),
                        C::Null => list.push(Val::Null),
                        C::Fail => failed = true,
                    }
                }
                out[j] = Some(if failed {
                    C::Fail
                } else {
                    C::V(Val::Arr(list.into()))
                });
            }
            return out.into_iter().map(|c| c.unwrap_or(C::Null)).collect();
        }
        let name = ty.inner_named_type();
        match self.api.schema.types.get(name) {
            Some(leaf @ (ExtendedType::Scalar(_) | ExtendedType::Enum(_))) => values
                .into_iter()
                .zip(&paths)
                .map(|(v, p)| match v {
                    Val::Null => C::Null,
                    v => match coerce_leaf(leaf, v) {
                        Ok(v) => C::V(v),
                        Err(why) => {
                            self.error(&format!("field `{}`: {why}", f.name), "BAD_VALUE", p, f);
                            C::Fail
                        }
                    },
                })
                .collect(),
            Some(ExtendedType::Object(_)) => {
                self.objects(name, |_| Some(name.clone()), nodes, values, paths)
                    .await
            }
            Some(ExtendedType::Interface(_)) | Some(ExtendedType::Union(_)) => {
                let runtime = |v: &Val| {
                    let t = match v {
                        Val::Obj(o) => match obj_get(o, "__typename") {
                            Some(Val::TStr(b)) => std::str::from_utf8(b).ok().map(str::to_string),
                            _ => None,
                        },
                        _ => None,
                    }?;
                    let t = Name::new(&t).ok()?;
                    self.api.schema.is_subtype(name, &t).then_some(t)
                };
                self.objects(name, runtime, nodes, values, paths).await
            }
            _ => vec![C::Null; values.len()],
        }
    }

    /// Objects of `values` (null stays null), each of the type `runtime` finds for it, their
    /// sub-selections executed once per type for all of them.
    async fn objects(
        &self,
        abstract_ty: &Name,
        runtime: impl Fn(&Val) -> Option<Name>,
        nodes: &[&'a Field],
        values: Vec<Val>,
        paths: Vec<Path>,
    ) -> Vec<C> {
        let f = nodes[0];
        let mut out: Vec<C> = vec![C::Null; values.len()];
        let mut groups: IndexMap<Name, Group> = IndexMap::new();
        for (j, (v, p)) in values.into_iter().zip(paths).enumerate() {
            if matches!(v, Val::Null) {
                continue;
            }
            match runtime(&v) {
                Some(t) => {
                    let g = groups.entry(t).or_default();
                    g.0.push(j);
                    g.1.push(v);
                    g.2.push(p);
                }
                None => {
                    self.error(
                        &format!(
                            "field `{}`: the value's type is not known (an `{abstract_ty}` value \
                             needs `__typename` naming one of its types)",
                            f.name
                        ),
                        "BAD_VALUE",
                        &p,
                        f,
                    );
                    out[j] = C::Fail;
                }
            }
        }
        let sets: Vec<&SelectionSet> = nodes.iter().map(|n| &n.selection_set).collect();
        for (t, (idx, vals, ps)) in groups {
            let done = self.selection(&t, &sets, vals, ps, None).await;
            for (j, c) in idx.into_iter().zip(done) {
                out[j] = c;
            }
        }
        out
    }
}

/// What a resolver's run tells: its calls' trace context (the resolver span's tracer) and how
/// many calls it made.
struct FieldObserver {
    trace: CallTrace,
    calls: AtomicUsize,
}

impl fanout_flow::observe::Observer for FieldObserver {
    fn call_trace(&self, _step: &fanout_flow::plan::StepPlan) -> Option<CallTrace> {
        Some(self.trace.clone())
    }

    fn call_finished(
        &self,
        _step: &fanout_flow::plan::StepPlan,
        _elapsed: std::time::Duration,
        _result: Result<(), &fanout_flow::FlowError>,
    ) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// The values of one runtime type among a field's: their positions, values and paths.
type Group = (Vec<usize>, Vec<Val>, Vec<Path>);

/// A leaf value (not null) as its type `leaf` (a scalar or an enum) serializes it: result
/// coercion as the spec (§ "Scalars") and graphql-js do it — `ID` a string (an integer becomes
/// its digits), `Int` an integer within 32 bits, `Float` a finite number, `String` text (a
/// number or boolean becomes its text), `Boolean` a boolean, an enum one of its values' names;
/// a custom scalar any JSON value. `Err`: why the value cannot be.
fn coerce_leaf(leaf: &ExtendedType, v: Val) -> Result<Val, String> {
    let name = leaf.name().as_str();
    let phrase = |v: &Val| match v {
        Val::Arr(_) | Val::Obj(_) => fanout_expr::kind_phrase(v).to_string(),
        _ => {
            let t = fanout_expr::json::to_string(v);
            if t.chars().count() > 40 {
                format!("{}…", t.chars().take(40).collect::<String>())
            } else {
                t
            }
        }
    };
    if let ExtendedType::Enum(e) = leaf {
        let ok = match &v {
            Val::TStr(b) | Val::BStr(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| Name::new(t).ok())
                .is_some_and(|n| e.values.contains_key(&n)),
            _ => false,
        };
        return if ok {
            Ok(v)
        } else {
            Err(format!("{name} cannot represent {}", phrase(&v)))
        };
    }
    let number = |v: &Val| -> Option<f64> {
        match v {
            Val::Num(Num::Int(i)) => Some(*i as f64),
            Val::Num(Num::Float(x)) => Some(*x),
            Val::Num(n) => n.to_string().parse().ok(),
            Val::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
            Val::TStr(b) | Val::BStr(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
            _ => None,
        }
        .filter(|x: &f64| x.is_finite())
    };
    let cannot = |v: &Val| Err(format!("{name} cannot represent {}", phrase(v)));
    match name {
        "Int" => match &v {
            Val::Num(Num::Int(i)) if i32::try_from(*i).is_ok() => Ok(v),
            _ => match number(&v) {
                Some(x)
                    if x.fract() == 0.0 && x >= f64::from(i32::MIN) && x <= f64::from(i32::MAX) =>
                {
                    Ok(Val::Num(Num::from_integral(x as isize)))
                }
                _ => cannot(&v),
            },
        },
        "Float" => match &v {
            Val::Num(Num::Int(_)) => Ok(v),
            _ => match number(&v) {
                Some(x) => Ok(Val::Num(Num::Float(x))),
                None => cannot(&v),
            },
        },
        "String" => match &v {
            Val::TStr(_) | Val::BStr(_) => Ok(v),
            Val::Bool(b) => Ok(str_val(if *b { "true" } else { "false" })),
            Val::Num(_) => match number(&v) {
                Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                    Ok(str_val(&format!("{}", x as i64)))
                }
                Some(x) => Ok(str_val(&x.to_string())),
                None => cannot(&v),
            },
            _ => cannot(&v),
        },
        "Boolean" => match &v {
            Val::Bool(_) => Ok(v),
            Val::Num(_) => match number(&v) {
                Some(x) => Ok(Val::Bool(x != 0.0)),
                None => cannot(&v),
            },
            _ => cannot(&v),
        },
        "ID" => match &v {
            Val::TStr(_) | Val::BStr(_) => Ok(v),
            Val::Num(Num::Int(i)) => Ok(str_val(&i.to_string())),
            Val::Num(_) => match number(&v) {
                Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                    Ok(str_val(&format!("{}", x as i64)))
                }
                _ => cannot(&v),
            },
            _ => cannot(&v),
        },
        // a custom scalar: its value as the resolver gave it (JSON scalars are objects)
        _ => Ok(v),
    }
}

/// A JSON value (apollo-compiler's) as a flow value.
fn from_json(v: &JsonValue) -> Val {
    match v {
        JsonValue::Null => Val::Null,
        JsonValue::Bool(b) => Val::Bool(*b),
        JsonValue::Number(n) => {
            if let Some(i) = n.as_i64() {
                Val::Num(Num::from_integral(i as isize))
            } else {
                Val::Num(Num::Float(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        JsonValue::String(s) => str_val(s.as_str()),
        JsonValue::Array(a) => a.iter().map(from_json).collect(),
        JsonValue::Object(o) => Val::obj(
            o.iter()
                .map(|(k, x)| (str_val(k.as_str()), from_json(x)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apollo_compiler::Schema;

    fn coerce(ty: &str, json: &str) -> Result<String, String> {
        let schema = Schema::parse_and_validate(
            "type Query { a: Int b: ID c: Float d: String e: Boolean f: Color g: Json }\n             enum Color { RED GREEN } scalar Json",
            "s.graphql",
        )
        .unwrap();
        let leaf = schema.types.get(ty).unwrap();
        let v = fanout_expr::json::parse_limited(json.as_bytes(), 8).unwrap();
        coerce_leaf(leaf, v).map(|v| fanout_expr::json::to_string(&v))
    }

    #[test]
    fn leaf_values_are_coerced_as_graphql_js_serializes_them() {
        let ok = |ty: &str, json: &str, want: &str| {
            assert_eq!(coerce(ty, json).as_deref(), Ok(want), "{ty} {json}");
        };
        ok("ID", "7", "\"7\"");
        ok("ID", "\"u-7\"", "\"u-7\"");
        ok("ID", "7.0", "\"7\"");
        ok("Int", "7", "7");
        ok("Int", "7.0", "7");
        ok("Int", "\"7\"", "7");
        ok("Int", "true", "1");
        ok("Float", "2", "2");
        ok("Float", "1.5", "1.5");
        ok("String", "\"x\"", "\"x\"");
        ok("String", "12", "\"12\"");
        ok("String", "1.5", "\"1.5\"");
        ok("String", "false", "\"false\"");
        ok("Boolean", "true", "true");
        ok("Boolean", "0", "false");
        ok("Color", "\"RED\"", "\"RED\"");
        ok("Json", "{\"a\":[1]}", "{\"a\":[1]}");
        for (ty, json) in [
            ("ID", "1.5"),
            ("ID", "true"),
            ("ID", "[1]"),
            ("Int", "1.5"),
            ("Int", "4294967296"),
            ("Int", "\"x\""),
            ("Float", "\"x\""),
            ("Float", "{}"),
            ("String", "[]"),
            ("Boolean", "\"true\""),
            ("Color", "\"BLUE\""),
            ("Color", "1"),
        ] {
            let e = coerce(ty, json).unwrap_err();
            assert!(
                e.starts_with(&format!("{ty} cannot represent")),
                "{ty} {json}: {e}"
            );
        }
    }
}
