//! Every unknown field of a file in one run. Strict deserialization stops at the first unknown
//! field; when it does, the YAML is read again as a plain tree with positions and walked against
//! the config's JSON Schema (the same types, `deny_unknown_fields` = `additionalProperties:
//! false`), collecting each key the schema does not know.
//!
//! The walk is a cross-check, not a second parser: its findings are used only when they include
//! the field the deserializer stopped at (so the two agree on what the file is); otherwise the
//! deserializer's one error stands.

use crate::Pos;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::Spanned;
use std::fmt;

/// Deepest schema nesting followed (`$ref` chains and `anyOf` branches included); YAML nesting is
/// bounded by the parser's own budget (64 levels).
const MAX_WALK_DEPTH: usize = 128;
/// Most unknown fields reported for one file.
const MAX_REPORTED: usize = 50;

/// A YAML node: mappings keep their keys' positions.
enum Node {
    Map(Vec<(Spanned<Key>, Node)>),
    Seq(Vec<Node>),
    Scalar,
}

/// A mapping key as text (`404:` is a key too).
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping key")
            }
            fn visit_str<E>(self, s: &str) -> Result<Key, E> {
                Ok(Key(s.to_string()))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Key, E> {
                Ok(Key(i.to_string()))
            }
            fn visit_u64<E>(self, i: u64) -> Result<Key, E> {
                Ok(Key(i.to_string()))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Key, E> {
                Ok(Key(f.to_string()))
            }
            fn visit_bool<E>(self, b: bool) -> Result<Key, E> {
                Ok(Key(b.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Key, E> {
                Ok(Key("null".into()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_str<E>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Node, D2::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = seq.next_element::<Node>()? {
                    out.push(x);
                }
                Ok(Node::Seq(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<Key>>()? {
                    let v = map.next_value::<Node>()?;
                    out.push((k, v));
                }
                Ok(Node::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// One unknown field: where its key is and serde's wording of the error (so the hint code that
/// suggests the closest field applies unchanged).
pub(crate) struct Unknown {
    pub(crate) pos: Option<Pos>,
    pub(crate) message: String,
}

/// Every unknown field of `text` (already `${VAR}`-substituted) against `schema`; empty when
/// the text does not parse as a plain tree.
pub(crate) fn unknown_fields(text: &str, schema: &Value) -> Vec<Unknown> {
    let Ok(root) = serde_saphyr::from_str::<Node>(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    Walk { root: schema }.node(&root, schema, 0, &mut out);
    out
}

struct Walk<'a> {
    root: &'a Value,
}

impl<'a> Walk<'a> {
    /// Follow `$ref`s (`#/$defs/Name`), at most a few in a row.
    fn resolve(&self, mut s: &'a Value) -> &'a Value {
        for _ in 0..8 {
            let Some(r) = s.get("$ref").and_then(Value::as_str) else {
                break;
            };
            let Some(name) = r.strip_prefix("#/$defs/") else {
                break;
            };
            match self.root.get("$defs").and_then(|d| d.get(name)) {
                Some(t) => s = t,
                None => break,
            }
        }
        s
    }

    /// The branch of `anyOf`/`oneOf` that describes `node` best: for a mapping, the one that
    /// knows most of its keys; for a list, the first with `items`.
    fn branch(&self, s: &'a Value, node: &Node) -> Option<&'a Value> {
        let branches = s
            .get("anyOf")
            .or_else(|| s.get("oneOf"))
            .and_then(Value::as_array)?;
        let resolved = branches.iter().map(|b| self.resolve(b));
        match node {
            Node::Map(entries) => resolved
                .filter(|b| {
                    b.get("properties").is_some()
                        || b.get("additionalProperties").is_some_and(Value::is_object)
                })
                .max_by_key(|b| {
                    let props = b.get("properties");
                    entries
                        .iter()
                        .filter(|(k, _)| props.and_then(|p| p.get(&k.value.0)).is_some())
                        .count()
                }),
            Node::Seq(_) => resolved.into_iter().find(|b| b.get("items").is_some()),
            Node::Scalar => None,
        }
    }

    fn node(&self, node: &Node, schema: &'a Value, depth: usize, out: &mut Vec<Unknown>) {
        if depth > MAX_WALK_DEPTH || out.len() >= MAX_REPORTED {
            return;
        }
        let s = self.resolve(schema);
        if s.get("properties").is_none()
            && s.get("items").is_none()
            && !s.get("additionalProperties").is_some_and(Value::is_object)
        {
            if let Some(b) = self.branch(s, node) {
                self.node(node, b, depth + 1, out);
            }
            return;
        }
        match node {
            Node::Map(entries) => {
                let props = s.get("properties").and_then(Value::as_object);
                let extra = s.get("additionalProperties");
                for (k, v) in entries {
                    let name = &k.value.0;
                    if let Some(p) = props.and_then(|p| p.get(name)) {
                        self.node(v, p, depth + 1, out);
                    } else if let Some(e) = extra.filter(|e| e.is_object()) {
                        self.node(v, e, depth + 1, out);
                    } else if extra.and_then(Value::as_bool) == Some(false) {
                        let known: Vec<String> = props
                            .map(|p| p.keys().map(|k| format!("`{k}`")).collect())
                            .unwrap_or_default();
                        let message = if known.is_empty() {
                            format!("unknown field `{name}`, there are no fields")
                        } else {
                            format!(
                                "unknown field `{name}`, expected one of {}",
                                known.join(", ")
                            )
                        };
                        out.push(Unknown {
                            pos: Pos::from_location(k.referenced),
                            message,
                        });
                        if out.len() >= MAX_REPORTED {
                            return;
                        }
                    }
                }
            }
            Node::Seq(items) => {
                if let Some(i) = s.get("items").filter(|i| i.is_object()) {
                    for x in items {
                        self.node(x, i, depth + 1, out);
                    }
                }
            }
            Node::Scalar => {}
        }
    }
}

/// A YAML node with the position of every key and list element, to find where a config path
/// is written ([`Tree::position_of`], for errors made without a position: `error::locate`).
enum PNode {
    Map(Vec<(Spanned<Key>, Spanned<PNode>)>),
    Seq(Vec<Spanned<PNode>>),
    Scalar,
}

impl<'de> Deserialize<'de> for PNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PNode, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PNode;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<PNode, E> {
                Ok(PNode::Scalar)
            }
            fn visit_i64<E>(self, _: i64) -> Result<PNode, E> {
                Ok(PNode::Scalar)
            }
            fn visit_u64<E>(self, _: u64) -> Result<PNode, E> {
                Ok(PNode::Scalar)
            }
            fn visit_f64<E>(self, _: f64) -> Result<PNode, E> {
                Ok(PNode::Scalar)
            }
            fn visit_str<E>(self, _: &str) -> Result<PNode, E> {
                Ok(PNode::Scalar)
            }
            fn visit_unit<E>(self) -> Result<PNode, E> {
                Ok(PNode::Scalar)
            }
            fn visit_none<E>(self) -> Result<PNode, E> {
                Ok(PNode::Scalar)
            }
            fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<PNode, D2::Error> {
                PNode::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PNode, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = seq.next_element::<Spanned<PNode>>()? {
                    out.push(x);
                }
                Ok(PNode::Seq(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PNode, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<Key>>()? {
                    let v = map.next_value::<Spanned<PNode>>()?;
                    out.push((k, v));
                }
                Ok(PNode::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A config's YAML text as a tree of positions.
pub(crate) struct Tree(PNode);

impl Tree {
    /// `None` when the text is no YAML (then nothing is located).
    pub(crate) fn parse(source: &str) -> Option<Tree> {
        serde_saphyr::from_str::<PNode>(source).ok().map(Tree)
    }

    /// Where `path` (`a.b.c`, `a.list[2].b`; a key may itself hold dots) is written: the
    /// position of its deepest part the file has, `None` when not even its first key is there.
    pub(crate) fn position_of(&self, path: &str) -> Option<Pos> {
        let span = |s: serde_saphyr::Location| Pos::from_location(s);
        let mut node = &self.0;
        let mut rest = path;
        let mut found = None;
        for _ in 0..MAX_WALK_DEPTH {
            rest = rest.strip_prefix('.').unwrap_or(rest);
            if rest.is_empty() {
                break;
            }
            if let Some(r) = rest.strip_prefix('[') {
                let Some((i, after)) = r.split_once(']') else {
                    break;
                };
                let (PNode::Seq(items), Ok(i)) = (node, i.parse::<usize>()) else {
                    break;
                };
                let Some(item) = items.get(i) else { break };
                found = span(item.defined).or(found);
                node = &item.value;
                rest = after;
                continue;
            }
            let PNode::Map(entries) = node else { break };
            // The longest key that the path starts with (followed by `.`, `[` or the end).
            let hit = entries
                .iter()
                .filter(|(k, _)| {
                    rest.strip_prefix(k.value.0.as_str()).is_some_and(|after| {
                        after.is_empty() || after.starts_with('.') || after.starts_with('[')
                    })
                })
                .max_by_key(|(k, _)| k.value.0.len());
            let Some((k, v)) = hit else { break };
            found = span(k.defined).or(found);
            rest = &rest[k.value.0.len()..];
            node = &v.value;
        }
        found
    }
}

#[cfg(test)]
mod position_tests {
    use super::*;

    #[test]
    fn a_path_is_found_where_its_key_is_written() {
        let src = "server:\n  trusted_proxies: [10.0.0.0/8, 10.0.0.0/33]\nauth:\n  providers:\n    corp.v1:\n      issuer: x\ncompression:\n  response:\n    levels: { gzip: 10 }\n";
        let t = Tree::parse(src).unwrap();
        let at = |p: &str| t.position_of(p).map(|p| (p.line, p.col));
        assert_eq!(at("compression.response.levels.gzip"), Some((9, 15)));
        assert_eq!(at("auth.providers.corp.v1.issuer"), Some((6, 7)));
        assert_eq!(at("auth.providers.corp.v1"), Some((5, 5)));
        assert_eq!(at("server.trusted_proxies[1]"), Some((2, 33)));
        // The deepest part written: a default never written points at its section.
        assert_eq!(at("auth.providers.corp.v1.token.query"), Some((5, 5)));
        assert_eq!(at("tls.certificates"), None);
    }
}
