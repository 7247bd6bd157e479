//! Schema references between a config and a document.
//!
//! A route's declared schema stands alone: its references point inside it
//! (`$ref: "#/$defs/Pet"`). In the document, a `#…` reference is read against the whole
//! document, so [`lift_defs`] moves each embedded schema's `$defs` into
//! `#/components/schemas` (sharing a component when an equal one is there under the same name)
//! and rewrites the references. [`Carrier`] does the reverse for `fanout openapi import`: a spec's
//! `#/components/schemas/NAME` references become `#/$defs/NAME`, each component used (and those
//! it uses, cycles included) copied once into the route schema's `$defs`; OpenAPI 3.0's
//! `nullable` and boolean `exclusiveMinimum`/`exclusiveMaximum` become their 2020-12 forms.

use serde_json::{Map, Value, json};

/// How deep a schema is walked: a deeper one is not carried (and cannot be declared:
/// `openapi.max_schema_depth` is at most this in practice).
const MAX_WALK: usize = 128;

const DEFS: &str = "#/$defs/";
const COMPONENTS: &str = "#/components/schemas/";

/// Every `$ref` string under `v` (not walking deeper than [`MAX_WALK`]).
fn each_ref(v: &mut Value, depth: usize, f: &mut dyn FnMut(&mut String)) {
    if depth > MAX_WALK {
        return;
    }
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                match (k.as_str(), x) {
                    ("$ref", Value::String(s)) => f(s),
                    (_, x) => each_ref(x, depth + 1, f),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| each_ref(x, depth + 1, f)),
        _ => {}
    }
}

/// A component name from a `$defs` key (`^[a-zA-Z0-9._-]+$`).
fn component_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "_".into() } else { s }
}

/// A name not in `comps`: `base`, else `base_2`, `base_3`, …
fn fresh(comps: &Map<String, Value>, base: &str) -> String {
    let mut name = base.to_string();
    let mut n = 2;
    while comps.contains_key(&name) {
        name = format!("{base}_{n}");
        n += 1;
    }
    name
}

/// Move the `$defs` of the schemas the document embeds (request bodies, answers, parameters)
/// into `components.schemas`, rewriting their references; a schema with other `#…`
/// references (to itself, `#`, or to one of its parts) becomes a component whole.
pub(crate) fn lift_defs(doc: &mut Value) {
    let mut comps = doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let before = comps.len();
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            let id = op
                .get("operationId")
                .and_then(Value::as_str)
                .unwrap_or(method)
                .to_string();
            if let Some(content) = op
                .pointer_mut("/requestBody/content")
                .and_then(Value::as_object_mut)
            {
                for m in content.values_mut() {
                    if let Some(s) = m.get_mut("schema") {
                        lift(s, &mut comps, &format!("{id}_request"));
                    }
                }
            }
            if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
                for (status, r) in responses.iter_mut() {
                    let Some(content) = r.get_mut("content").and_then(Value::as_object_mut) else {
                        continue;
                    };
                    for m in content.values_mut() {
                        if let Some(s) = m.get_mut("schema") {
                            lift(s, &mut comps, &format!("{id}_{status}"));
                        }
                    }
                }
            }
            if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
                for p in params {
                    let name = p.get("name").and_then(Value::as_str).unwrap_or("param");
                    let whole = format!("{id}_{name}");
                    if let Some(s) = p.get_mut("schema") {
                        lift(s, &mut comps, &whole);
                    }
                }
            }
        }
    }
    if comps.len() != before {
        doc["components"]["schemas"] = Value::Object(comps);
    }
}

/// A reference into the schema itself (`#…`), not to the document's components (the error
/// answers' `#/components/schemas/Error`, written by the exporter).
fn is_local(r: &str) -> bool {
    r.starts_with('#') && !r.starts_with("#/components/")
}

/// Whether `schema` holds a reference into itself, and whether all of them are to its `$defs`.
fn has_local_refs(schema: &mut Value) -> (bool, bool) {
    let (mut any, mut defs_only) = (false, true);
    each_ref(schema, 0, &mut |r| {
        if is_local(r) {
            any = true;
            defs_only &= r.len() > DEFS.len() && r.starts_with(DEFS);
        }
    });
    (any, defs_only)
}

fn lift(schema: &mut Value, comps: &mut Map<String, Value>, whole: &str) {
    let (any, defs_only) = has_local_refs(schema);
    if !any {
        return;
    }
    let defs = match schema.get("$defs") {
        Some(Value::Object(d)) if defs_only => d.clone(),
        _ => {
            // References to other parts: the schema becomes a component whole.
            let name = fresh(comps, &component_name(whole));
            let prefix = format!("#/components/schemas/{name}");
            each_ref(schema, 0, &mut |r| {
                if is_local(r) {
                    *r = format!("{prefix}{}", &r[1..]);
                }
            });
            comps.insert(name, schema.take());
            *schema = json!({ "$ref": prefix });
            return;
        }
    };
    let rename_with = |names: &dyn Fn(&str) -> String| -> (Value, Vec<(String, Value)>) {
        let map: Vec<(String, String)> = defs.keys().map(|k| (k.clone(), names(k))).collect();
        let rewrite = |v: &mut Value| {
            each_ref(v, 0, &mut |r| {
                let Some(rest) = r.strip_prefix(DEFS) else {
                    return;
                };
                let (seg, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                let key = seg.replace("~1", "/").replace("~0", "~");
                if let Some((_, new)) = map.iter().find(|(old, _)| *old == key) {
                    *r = format!("{COMPONENTS}{new}{tail}");
                }
            });
        };
        let mut top = schema.clone();
        if let Some(o) = top.as_object_mut() {
            o.remove("$defs");
        }
        rewrite(&mut top);
        let lifted = map
            .iter()
            .filter_map(|(old, new)| {
                let mut d = defs.get(old)?.clone();
                rewrite(&mut d);
                Some((new.clone(), d))
            })
            .collect();
        (top, lifted)
    };
    // The same names when each is free or holds an equal schema (an imported spec's
    // components come back as they were); else names of this schema's own.
    let (top, lifted) = rename_with(&|k: &str| component_name(k));
    let shared = lifted
        .iter()
        .all(|(n, d)| comps.get(n).is_none_or(|c| c == d));
    let (top, lifted) = if shared {
        (top, lifted)
    } else {
        let base = component_name(whole);
        let taken = comps.clone();
        let names: Vec<(String, String)> = {
            let mut given: Vec<(String, String)> = Vec::new();
            for k in defs.keys() {
                let mut n = fresh(&taken, &format!("{base}_{}", component_name(k)));
                let mut i = 2;
                while given.iter().any(|(_, g)| *g == n) {
                    n = format!("{base}_{}_{i}", component_name(k));
                    i += 1;
                }
                given.push((k.clone(), n));
            }
            given
        };
        rename_with(&|k: &str| {
            names
                .iter()
                .find(|(old, _)| old == k)
                .map_or_else(|| component_name(k), |(_, n)| n.clone())
        })
    };
    for (n, d) in lifted {
        comps.entry(n).or_insert(d);
    }
    *schema = top;
}

/// Copies a spec's schemas into standalone route schemas (`fanout openapi import`).
pub(crate) struct Carrier<'a> {
    /// The spec's `components.schemas`.
    pub comps: Option<&'a Map<String, Value>>,
    /// An OpenAPI 3.0 document (its schemas' dialect is converted).
    pub v30: bool,
    /// `openapi.max_schema_bytes` / `max_schema_depth` (the defaults): a larger schema is not
    /// carried (the config would not load).
    pub max_bytes: usize,
    pub max_depth: usize,
}

impl Carrier<'_> {
    /// `schema` standing alone: the components it uses (transitively) in its `$defs`. Errors
    /// say why it is not carried.
    pub fn carry(&self, schema: &Value) -> Result<Value, String> {
        let mut top = schema.clone();
        let mut queue: Vec<String> = Vec::new();
        self.prepare(&mut top, &mut queue)?;
        let mut defs = Map::new();
        // Stop copying components once they are over the size a schema may have.
        let mut bytes = 0usize;
        while let Some(name) = queue.pop() {
            if defs.contains_key(&name) {
                continue;
            }
            let key = name.replace("~1", "/").replace("~0", "~");
            let Some(c) = self.comps.and_then(|c| c.get(&key)) else {
                return Err(format!(
                    "`$ref: {COMPONENTS}{name}` names no schema of the document"
                ));
            };
            bytes = bytes.saturating_add(serde_json::to_vec(c).map_or(usize::MAX, |b| b.len()));
            if bytes > self.max_bytes {
                return Err(format!(
                    "the components it uses are over openapi.max_schema_bytes ({})",
                    self.max_bytes
                ));
            }
            let mut c = c.clone();
            self.prepare(&mut c, &mut queue)?;
            defs.insert(name, c);
        }
        if !defs.is_empty() {
            match &mut top {
                Value::Object(o) => {
                    if o.contains_key("$defs") {
                        return Err("it has `$defs` of its own besides components".into());
                    }
                    o.insert("$defs".into(), Value::Object(defs));
                }
                _ => return Err("a boolean schema with references".into()),
            }
        }
        let bytes = serde_json::to_vec(&top).map_or(usize::MAX, |b| b.len());
        if bytes > self.max_bytes {
            return Err(format!(
                "it is {bytes} bytes of JSON with its components, over openapi.max_schema_bytes ({})",
                self.max_bytes
            ));
        }
        if depth(&top, self.max_depth + 1) > self.max_depth {
            return Err(format!(
                "it is nested deeper than openapi.max_schema_depth ({})",
                self.max_depth
            ));
        }
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(&top)
            .map_err(|e| format!("it does not compile as JSON Schema 2020-12: {e}"))?;
        Ok(top)
    }

    /// Convert the dialect (3.0) and rewrite the component references, queueing their names.
    fn prepare(&self, v: &mut Value, queue: &mut Vec<String>) -> Result<(), String> {
        if self.v30 {
            from_30(v, 0)?;
        }
        let mut bad: Option<String> = None;
        each_ref(v, 0, &mut |r| {
            if let Some(name) = r.strip_prefix(COMPONENTS) {
                let name = name.to_string();
                if name.is_empty() || name.contains('/') {
                    bad.get_or_insert_with(|| r.clone());
                    return;
                }
                *r = format!("{DEFS}{name}");
                queue.push(name);
            } else {
                bad.get_or_insert_with(|| r.clone());
            }
        });
        match bad {
            Some(r) => Err(format!(
                "`$ref: {r}` is not a schema of `#/components/schemas` (files and URLs are never fetched)"
            )),
            None => Ok(()),
        }
    }
}

/// OpenAPI 3.0's schema dialect to 2020-12: `nullable: true` adds `null` to `type` (and to
/// `enum`); a boolean `exclusiveMinimum`/`exclusiveMaximum` takes `minimum`/`maximum`'s value.
fn from_30(v: &mut Value, depth: usize) -> Result<(), String> {
    if depth > MAX_WALK {
        return Err(format!("it is nested deeper than {MAX_WALK}"));
    }
    match v {
        Value::Object(o) => {
            if let Some(n) = o.remove("nullable")
                && n == Value::Bool(true)
            {
                match o.get_mut("type") {
                    Some(Value::String(t)) => {
                        let t = t.clone();
                        o.insert("type".into(), json!([t, "null"]));
                    }
                    Some(Value::Array(a)) if !a.iter().any(|t| t == "null") => {
                        a.push("null".into())
                    }
                    _ => {}
                }
                if let Some(Value::Array(e)) = o.get_mut("enum")
                    && !e.contains(&Value::Null)
                {
                    e.push(Value::Null);
                }
            }
            for (flag, bound) in [
                ("exclusiveMinimum", "minimum"),
                ("exclusiveMaximum", "maximum"),
            ] {
                if let Some(Value::Bool(b)) = o.get(flag) {
                    let b = *b;
                    o.remove(flag);
                    if b && let Some(m) = o.remove(bound) {
                        o.insert(flag.into(), m);
                    }
                }
            }
            for (k, x) in o.iter_mut() {
                // values, not schemas
                if matches!(
                    k.as_str(),
                    "enum" | "const" | "default" | "example" | "examples"
                ) {
                    continue;
                }
                from_30(x, depth + 1)?;
            }
        }
        Value::Array(a) => {
            for x in a {
                from_30(x, depth + 1)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn depth(v: &Value, cap: usize) -> usize {
    if cap == 0 {
        return 0;
    }
    match v {
        Value::Array(a) => 1 + a.iter().map(|x| depth(x, cap - 1)).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(|x| depth(x, cap - 1)).max().unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_carried_once_cycles_included_and_lifted_back() {
        let comps = json!({
            "Node": { "type": "object", "properties": {
                "next": { "$ref": "#/components/schemas/Node" },
                "tag": { "$ref": "#/components/schemas/Tag" } } },
            "Tag": { "type": "string", "nullable": true, "enum": ["a", "b"] },
        });
        let c = Carrier {
            comps: comps.as_object(),
            v30: true,
            max_bytes: 65536,
            max_depth: 32,
        };
        let s = c
            .carry(&json!({ "$ref": "#/components/schemas/Node" }))
            .unwrap();
        assert_eq!(s["$ref"], "#/$defs/Node");
        assert_eq!(
            s["$defs"]["Node"]["properties"]["next"]["$ref"],
            "#/$defs/Node"
        );
        assert_eq!(s["$defs"]["Tag"]["type"], json!(["string", "null"]));
        assert_eq!(s["$defs"]["Tag"]["enum"], json!(["a", "b", null]));
        let e = c.carry(&json!({ "$ref": "other.yaml#/Pet" })).unwrap_err();
        assert!(e.contains("never fetched"), "{e}");
        let small = Carrier { max_bytes: 40, ..c };
        let e = small
            .carry(&json!({ "$ref": "#/components/schemas/Node" }))
            .unwrap_err();
        assert!(e.contains("over openapi.max_schema_bytes (40)"), "{e}");

        // Back in a document: the same components, the same references.
        let mut doc = json!({
            "paths": { "/n": { "post": { "operationId": "post_n",
                "requestBody": { "content": { "application/json": { "schema": s } } } } } },
            "components": { "schemas": { "Error": {} } },
        });
        lift_defs(&mut doc);
        let mut want = comps.clone();
        from_30(&mut want, 0).unwrap();
        assert_eq!(doc["components"]["schemas"]["Node"], want["Node"]);
        assert_eq!(doc["components"]["schemas"]["Tag"], want["Tag"]);
        assert_eq!(
            doc.pointer("/paths/~1n/post/requestBody/content/application~1json/schema"),
            Some(&json!({ "$ref": "#/components/schemas/Node" }))
        );
    }

    #[test]
    fn a_name_taken_by_another_schema_is_not_shared() {
        let mut doc = json!({
            "paths": { "/n": { "get": { "operationId": "get_n", "responses": { "200": {
                "content": { "application/json": { "schema": {
                    "$ref": "#/$defs/Error", "$defs": { "Error": { "type": "string" } } } } } } } } } },
            "components": { "schemas": { "Error": { "type": "object" } } },
        });
        lift_defs(&mut doc);
        assert_eq!(
            doc["components"]["schemas"]["Error"],
            json!({ "type": "object" })
        );
        assert_eq!(
            doc["components"]["schemas"]["get_n_200_Error"],
            json!({ "type": "string" })
        );
        let s = doc.pointer("/paths/~1n/get/responses/200/content/application~1json/schema");
        assert_eq!(
            s,
            Some(&json!({ "$ref": "#/components/schemas/get_n_200_Error" }))
        );

        // A reference to the schema itself: the schema becomes a component.
        let mut doc = json!({
            "paths": { "/t": { "get": { "operationId": "get_t", "responses": { "200": {
                "content": { "application/json": { "schema": {
                    "type": "array", "items": { "$ref": "#" } } } } } } } } },
        });
        lift_defs(&mut doc);
        assert_eq!(
            doc["components"]["schemas"]["get_t_200"]["items"]["$ref"],
            "#/components/schemas/get_t_200"
        );
    }
}
#[cfg(test)]
mod document_refs {
    use super::*;
    #[test]
    fn the_exporters_references_to_components_stay() {
        let mut doc = json!({
            "paths": { "/n": { "get": { "operationId": "get_n", "responses": { "400": {
                "content": { "application/json": { "schema": {
                    "allOf": [{"$ref": "#/components/schemas/Error"}, {"type": "object"}] } } } } } } } },
            "components": { "schemas": { "Error": { "type": "object" } } },
        });
        let before = doc.clone();
        lift_defs(&mut doc);
        assert_eq!(doc, before);
    }
}
