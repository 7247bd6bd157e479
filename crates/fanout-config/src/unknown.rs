//! Every unknown field of a file in one run. Strict deserialization stops at the first unknown
//! field; when it does, the YAML is read again as a plain tree with positions and walked against
//! the config's JSON Schema (the same types, `deny_unknown_fields` = `additionalProperties:
//! false`), collecting each key the schema does not know.
//!
//! The walk is a cross-check, not a second parser: its findings are used only when they include
//! the field the deserializer stopped at (so the two agree on what the file is); otherwise the
//! deserializer's one error stands.

use crate::Pos;
use crate::yaml_tree::Node;
use serde_json::Value;
use serde_saphyr::Spanned;

/// Deepest schema nesting followed (`$ref` chains and `anyOf` branches included); YAML nesting is
/// bounded by the parser's own budget (64 levels).
const MAX_WALK_DEPTH: usize = 128;
/// Most unknown fields reported for one file.
const MAX_REPORTED: usize = 50;

/// One unknown field: where its key is and serde's wording of the error (so the hint code that
/// suggests the closest field applies unchanged).
pub(crate) struct Unknown {
    pub(crate) pos: Option<Pos>,
    pub(crate) message: String,
}

/// Every unknown field of `text` (already `${VAR}`-substituted) against `schema`; empty when
/// the text does not parse as a plain tree.
pub(crate) fn unknown_fields(text: &str, schema: &Value) -> Vec<Unknown> {
    let Some(root) = Node::parse(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    Walk { root: schema }.node(&root.value, schema, 0, &mut out);
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
                        self.node(&v.value, p, depth + 1, out);
                    } else if let Some(e) = extra.filter(|e| e.is_object()) {
                        self.node(&v.value, e, depth + 1, out);
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
                        self.node(&x.value, i, depth + 1, out);
                    }
                }
            }
            Node::Scalar => {}
        }
    }
}

/// A config's YAML text as a tree of positions.
pub(crate) struct Tree(Spanned<Node>);

impl Tree {
    /// `None` when the text is no YAML (then nothing is located).
    pub(crate) fn parse(source: &str) -> Option<Tree> {
        Node::parse(source).map(Tree)
    }

    /// Where `path` (`a.b.c`, `a.list[2].b`; a key may itself hold dots) is written: the
    /// position of its deepest part the file has, `None` when not even its first key is there.
    pub(crate) fn position_of(&self, path: &str) -> Option<Pos> {
        let span = |s: serde_saphyr::Location| Pos::from_location(s);
        let mut node = &self.0.value;
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
                let (Node::Seq(items), Ok(i)) = (node, i.parse::<usize>()) else {
                    break;
                };
                let Some(item) = items.get(i) else { break };
                found = span(item.defined).or(found);
                node = &item.value;
                rest = after;
                continue;
            }
            let Node::Map(entries) = node else { break };
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
