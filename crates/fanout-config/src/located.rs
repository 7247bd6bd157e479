//! [`Located<T>`]: a config value with the line:column it came from (for error messages).

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::hash::{Hash, Hasher};

/// A 1-based line and column in a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
}

impl Pos {
    /// From a serde-saphyr location; `None` when unknown.
    pub fn from_location(l: serde_saphyr::Location) -> Option<Pos> {
        (l.line() > 0).then(|| Pos {
            line: l.line() as u32,
            col: l.column().max(1) as u32,
        })
    }
    /// Move the column right by `n` characters (to point inside a scalar).
    pub fn shift(self, n: usize) -> Pos {
        Pos {
            line: self.line,
            col: self.col + n as u32,
        }
    }
}

/// A value with its position in the YAML file. Equality and hashing look at the value only.
#[derive(Debug, Clone)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// Where it starts in the file (line 0 when it came from a default).
    pub pos: Pos,
    /// Whether the YAML scalar was quoted (its text starts one column after `pos`).
    pub quoted: bool,
}

impl<T> Located<T> {
    /// A value with no position (a default).
    pub fn unknown(value: T) -> Self {
        Located {
            value,
            pos: Pos::default(),
            quoted: false,
        }
    }
}

impl<T: PartialEq> PartialEq for Located<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}
impl<T: Eq> Eq for Located<T> {}
impl<T: Hash> Hash for Located<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.value.hash(state)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        let loc = s.referenced;
        Ok(Located {
            value: s.value,
            pos: Pos::from_location(loc).unwrap_or_default(),
            quoted: false,
        })
    }
}

impl<T: JsonSchema> JsonSchema for Located<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
}
