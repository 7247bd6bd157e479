//! Typed reading of a node's attributes.

use crate::OpError;
use crate::onnx::{AttributeProto, NodeProto};

/// A node's attributes, looked up by name.
pub(crate) struct Attrs<'a>(pub &'a [AttributeProto]);

impl<'a> Attrs<'a> {
    pub fn of(node: &'a NodeProto) -> Attrs<'a> {
        Attrs(&node.attribute)
    }

    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.0.iter().find(|a| a.name.as_deref() == Some(name))
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).and_then(|a| a.i).unwrap_or(default)
    }

    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.get(name).and_then(|a| a.f).unwrap_or(default)
    }

    pub fn string(&self, name: &str, default: &str) -> Result<String, OpError> {
        match self.get(name).and_then(|a| a.s.as_deref()) {
            None => Ok(default.to_owned()),
            Some(b) => String::from_utf8(b.to_vec())
                .map_err(|_| OpError(format!("attribute {name} is not UTF-8"))),
        }
    }

    pub fn floats(&self, name: &str) -> &'a [f32] {
        self.get(name).map(|a| a.floats.as_slice()).unwrap_or(&[])
    }

    pub fn ints(&self, name: &str) -> &'a [i64] {
        self.get(name).map(|a| a.ints.as_slice()).unwrap_or(&[])
    }

    pub fn strings(&self, name: &str) -> Result<Vec<String>, OpError> {
        self.get(name)
            .map(|a| a.strings.as_slice())
            .unwrap_or(&[])
            .iter()
            .map(|b| {
                String::from_utf8(b.clone())
                    .map_err(|_| OpError(format!("attribute {name} is not UTF-8")))
            })
            .collect()
    }

    /// An error when any of `names` is present: attributes fanout does not implement.
    pub fn refuse(&self, names: &[&str]) -> Result<(), OpError> {
        match names.iter().find(|n| self.has(n)) {
            Some(n) => Err(OpError(format!("attribute {n} is not supported"))),
            None => Ok(()),
        }
    }
}

/// A usize from a non-negative attribute or index.
pub(crate) fn index(v: i64, what: &str) -> Result<usize, OpError> {
    usize::try_from(v).map_err(|_| OpError(format!("{what} {v} is negative")))
}
