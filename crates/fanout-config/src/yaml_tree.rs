//! A YAML document as a tree of positions: every mapping key, value and list element with the
//! place its text starts (`serde_saphyr::Spanned`). For what needs to know where a part of a file
//! is written rather than what it means: every unknown field of a file at once (`unknown.rs`),
//! where an error made without a position belongs ([`crate::locate`]), where `fanout test
//! --update` writes an answer.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;

/// A YAML node: mappings and lists keep the positions of their keys, values and elements.
pub enum Node {
    /// A mapping: its entries in order.
    Map(Vec<(Spanned<Key>, Spanned<Node>)>),
    /// A list.
    Seq(Vec<Spanned<Node>>),
    /// Anything else (its text is not kept).
    Scalar,
}

/// A mapping key as text (`404:` is a key too).
pub struct Key(pub String);

impl Node {
    /// `text` as a tree (`None` when it is no YAML).
    pub fn parse(text: &str) -> Option<Spanned<Node>> {
        serde_saphyr::from_str(text).ok()
    }
}

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
                while let Some(x) = seq.next_element::<Spanned<Node>>()? {
                    out.push(x);
                }
                Ok(Node::Seq(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<Key>>()? {
                    let v = map.next_value::<Spanned<Node>>()?;
                    out.push((k, v));
                }
                Ok(Node::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}
