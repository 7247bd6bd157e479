//! `fanout test --propose-schemas`: a draft answer schema (JSON Schema 2020-12) from the answers
//! a route gave its cases, for the author to review and declare as `answer_schema`.
//!
//! What it says, and only that: each value's `type` (`integer` when every number seen was whole,
//! `number` otherwise; `null` added where some answer had null there), an object's `properties`
//! and as `required` the keys present in every object seen at that place, an array's `items` as
//! the merge of every element of every array seen there. It guesses no `enum`, `format`,
//! `pattern`, bound or `additionalProperties`: a few cases cannot tell those apart from chance.
//!
//! Bounded: values nested deeper than `max_depth` are not walked (their place is `{}`, any
//! value, and [`Proposal::truncated`] says so); the walk is linear in the answers' size.

use indexmap::IndexMap;
use serde_json::{Map, Value, json};

/// A proposed schema and what limited it.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// The draft schema.
    pub schema: Value,
    /// How many answers it was made from.
    pub answers: usize,
    /// Whether some value was nested deeper than the depth limit (its place accepts anything).
    pub truncated: bool,
}

/// The shapes seen at one place of the answers.
#[derive(Debug, Default)]
struct Shape {
    null: bool,
    boolean: bool,
    integer: bool,
    number: bool,
    string: bool,
    /// Arrays seen here, and the merged shape of their elements.
    array: Option<Box<Shape>>,
    /// Objects seen here: how many, and each key's shape and how many of them had it.
    objects: usize,
    properties: IndexMap<String, (Shape, usize)>,
    /// A value here was not walked (too deep): anything goes.
    any: bool,
}

/// The draft schema of `answers` (each a whole answer body), walking values at most
/// `max_depth` levels deep.
pub fn propose<'a>(answers: impl IntoIterator<Item = &'a Value>, max_depth: usize) -> Proposal {
    let mut shape = Shape::default();
    let mut count = 0;
    let mut truncated = false;
    for a in answers {
        count += 1;
        shape.add(a, max_depth, &mut truncated);
    }
    let mut schema = shape.schema();
    if let Value::Object(o) = &mut schema {
        let mut top = Map::new();
        top.insert(
            "$schema".into(),
            "https://json-schema.org/draft/2020-12/schema".into(),
        );
        top.append(o);
        schema = Value::Object(top);
    }
    Proposal {
        schema,
        answers: count,
        truncated,
    }
}

impl Shape {
    fn add(&mut self, v: &Value, depth: usize, truncated: &mut bool) {
        match v {
            Value::Null => self.null = true,
            Value::Bool(_) => self.boolean = true,
            // A whole number written `2.0` is an integer in JSON Schema 2020-12 too.
            Value::Number(n) => {
                if n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0) {
                    self.integer = true;
                } else {
                    self.number = true;
                }
            }
            Value::String(_) => self.string = true,
            Value::Array(a) => {
                let items = self.array.get_or_insert_with(Box::default);
                if depth == 0 {
                    if !a.is_empty() {
                        items.any = true;
                        *truncated = true;
                    }
                    return;
                }
                for x in a {
                    items.add(x, depth - 1, truncated);
                }
            }
            Value::Object(o) => {
                self.objects += 1;
                if depth == 0 {
                    if !o.is_empty() {
                        self.any = true;
                        *truncated = true;
                    }
                    return;
                }
                for (k, x) in o {
                    let (s, n) = self.properties.entry(k.clone()).or_default();
                    *n += 1;
                    s.add(x, depth - 1, truncated);
                }
            }
        }
    }

    fn schema(&self) -> Value {
        if self.any {
            return json!({});
        }
        let mut types: Vec<&str> = Vec::new();
        if self.objects > 0 {
            types.push("object");
        }
        if self.array.is_some() {
            types.push("array");
        }
        if self.string {
            types.push("string");
        }
        // `number` includes the integers: one of the two.
        if self.number {
            types.push("number");
        } else if self.integer {
            types.push("integer");
        }
        if self.boolean {
            types.push("boolean");
        }
        if self.null {
            types.push("null");
        }
        let mut out = Map::new();
        match types.as_slice() {
            // No value seen here (the items of arrays that were always empty): anything.
            [] => return json!({}),
            [one] => {
                out.insert("type".into(), (*one).into());
            }
            many => {
                out.insert("type".into(), json!(many));
            }
        }
        if self.objects > 0 {
            let props: Map<String, Value> = self
                .properties
                .iter()
                .map(|(k, (s, _))| (k.clone(), s.schema()))
                .collect();
            let required: Vec<&String> = self
                .properties
                .iter()
                .filter(|(_, (_, n))| *n == self.objects)
                .map(|(k, _)| k)
                .collect();
            if !props.is_empty() {
                out.insert("properties".into(), Value::Object(props));
            }
            if !required.is_empty() {
                out.insert("required".into(), json!(required));
            }
        }
        if let Some(items) = &self.array {
            let s = items.schema();
            if s != json!({}) || items.any {
                out.insert("items".into(), s);
            }
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_bounded_and_said() {
        let deep = json!({"a": {"b": {"c": 1}}});
        let p = propose([&deep], 2);
        assert!(p.truncated);
        assert_eq!(p.schema["properties"]["a"]["properties"]["b"], json!({}));
        let p = propose([&deep], 3);
        assert!(!p.truncated);
        // Deeper than any stack would take: the walk stops at the limit.
        let mut v = json!(1);
        for _ in 0..300 {
            v = json!([v]);
        }
        let p = propose([&v], 32);
        assert!(p.truncated);
    }
}
