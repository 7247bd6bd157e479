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
///
/// A value reached through a YAML alias (`*name`) or a merge key (`<<: *name`) has two places:
/// where its text is (`pos`, the anchored definition — where errors point, so one mistake in a
/// shared part is one error however many routes use it) and where it is used (`used`, the alias
/// or `<<` entry). They are the same for every other value.
#[derive(Debug, Clone)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// Where its text starts in the file (line 0 when it came from a default).
    pub pos: Pos,
    /// Where it is used: the alias or merge entry that brought it here, else `pos`.
    pub used: Pos,
    /// Whether the YAML scalar was quoted (its text starts one column after `pos`).
    pub quoted: bool,
}

impl<T> Located<T> {
    /// A value with no position (a default).
    pub fn unknown(value: T) -> Self {
        Located {
            value,
            pos: Pos::default(),
            used: Pos::default(),
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
        let used = Pos::from_location(s.referenced);
        Ok(Located {
            value: s.value,
            pos: Pos::from_location(s.defined).or(used).unwrap_or_default(),
            used: used.unwrap_or_default(),
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

/// The position of byte `offset` of `value`, a YAML scalar that starts at `start` in `source`,
/// to point inside an expression in errors. The parser places `start` on the opening quote of a
/// quoted scalar and on the first content character of a block scalar (`|`); value lines of a
/// block scalar map one to one to file lines, at the same column. Lines folded from a multi-line
/// quoted or plain scalar cannot be mapped exactly: the scalar's start is used.
pub fn pos_in_scalar(source: &str, start: Pos, value: &str, offset: usize) -> Pos {
    let before = value.get(..offset).unwrap_or(value);
    let line_idx = before.matches('\n').count() as u32;
    let col_in_line = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1);
    let first = source
        .lines()
        .nth(start.line.saturating_sub(1) as usize)
        .and_then(|l| l.chars().nth(start.col.saturating_sub(1) as usize));
    match (first, line_idx) {
        (Some('\'' | '"'), 0) => start.shift(col_in_line + 1),
        (Some('\'' | '"'), _) => start,
        (Some('|' | '>'), _) => {
            // A position on the indicator itself: content starts on the next line.
            let line = start.line + 1 + line_idx;
            let indent = source
                .lines()
                .nth(start.line as usize)
                .map_or(0, |l| l.len() - l.trim_start().len());
            Pos {
                line,
                col: (indent + col_in_line + 1) as u32,
            }
        }
        (_, 0) => start.shift(col_in_line),
        (_, _) if !starts_its_line(source, start) => start,
        (_, k) => Pos {
            line: start.line + k,
            col: start.col + col_in_line as u32,
        },
    }
}

/// Whether only indentation precedes `start` on its line (as for the content of a block scalar,
/// whose `|` sits on the line above; a plain scalar follows its key on the same line).
fn starts_its_line(source: &str, start: Pos) -> bool {
    source
        .lines()
        .nth(start.line.saturating_sub(1) as usize)
        .is_some_and(|l| {
            l.chars()
                .take(start.col.saturating_sub(1) as usize)
                .all(char::is_whitespace)
        })
}
