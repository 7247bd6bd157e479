//! Compile-time check of the fields a config names in gRPC messages: when a step's `message`
//! (or a gRPC route's `respond.body`) is a jq object construction — `{id: $request.params.id,
//! "limit": 3, user_id}` — its keys are checked against the message type, nested literal objects
//! against their fields' types, so a misspelt field is a `fanout validate` error at its line and
//! column instead of a failed request. Anything not a plain literal (a computed key, `{} +
//! $x`, a value built at run time) is left to the run-time check, which names the field too.

use fanout_grpc::MessageCodec;

/// A key of an object construction: its text, its byte offset in the expression, and the byte
/// range of its value (`None` for the `{name}` / `{$name}` shorthands).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) name: String,
    pub(crate) offset: usize,
    pub(crate) value: Option<(usize, usize)>,
}

/// The keys of `src[start..end]` when it is, apart from whitespace, one object construction;
/// `None` otherwise. Computed keys (`(expr): v`, `@fmt: v`, interpolated strings) are skipped.
pub(crate) fn object_keys(src: &str, start: usize, end: usize) -> Option<Vec<Key>> {
    let b = src.as_bytes();
    let mut i = start;
    while i < end && b[i].is_ascii_whitespace() {
        i += 1;
    }
    if i >= end || b[i] != b'{' {
        return None;
    }
    let close = matching(b, i, end)?;
    if b[close + 1..end].iter().any(|c| !c.is_ascii_whitespace()) {
        return None;
    }
    let mut keys = Vec::new();
    for (s, e) in split_top(b, i + 1, close) {
        let (mut s, e) = (s, e);
        while s < e && b[s].is_ascii_whitespace() {
            s += 1;
        }
        if s >= e {
            continue;
        }
        let entry_end = trim_end(b, s, e);
        let (name, after) = if b[s] == b'"' {
            let q = string_end(b, s, e)?;
            let inner = &src[s + 1..q];
            if inner.contains('\\') {
                continue; // escapes or interpolation: computed
            }
            (inner.to_string(), q + 1)
        } else {
            let id_start = if b[s] == b'$' { s + 1 } else { s };
            let mut j = id_start;
            while j < e && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            if j == id_start || b[id_start].is_ascii_digit() {
                continue; // `(expr): v`, `@base64: v`, …
            }
            let name = &src[id_start..j];
            if b[s] == b'$' {
                if name == "__loc__" || j != entry_end {
                    continue;
                }
                keys.push(Key {
                    name: name.to_string(),
                    offset: id_start,
                    value: None,
                });
                continue;
            }
            (name.to_string(), j)
        };
        let mut k = after;
        while k < e && b[k].is_ascii_whitespace() {
            k += 1;
        }
        if k >= entry_end {
            // Shorthand `{name}` (only for identifiers; `{"a"}` is jq's shorthand too).
            keys.push(Key {
                name,
                offset: s,
                value: None,
            });
        } else if b[k] == b':' {
            keys.push(Key {
                name,
                offset: if b[s] == b'"' { s + 1 } else { s },
                value: Some((k + 1, e)),
            });
        }
    }
    Some(keys)
}

fn trim_end(b: &[u8], s: usize, mut e: usize) -> usize {
    while e > s && b[e - 1].is_ascii_whitespace() {
        e -= 1;
    }
    e
}

/// The index of the bracket closing the one at `open` (strings and comments skipped).
fn matching(b: &[u8], open: usize, end: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < end {
        match b[i] {
            b'"' => i = string_end(b, i, end)?,
            b'#' => {
                while i < end && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote closing the string opening at `open` (`\(…)` interpolations, with
/// their own strings, included).
fn string_end(b: &[u8], open: usize, end: usize) -> Option<usize> {
    let mut i = open + 1;
    while i < end {
        match b[i] {
            b'\\' if b.get(i + 1) == Some(&b'(') => {
                let close = matching(b, i + 1, end)?;
                i = close;
            }
            b'\\' => i += 1,
            b'"' => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The ranges between the depth-0 commas of `b[start..end]`.
fn split_top(b: &[u8], start: usize, end: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut from = start;
    let mut i = start;
    while i < end {
        match b[i] {
            b'"' => match string_end(b, i, end) {
                Some(q) => i = q,
                None => return out,
            },
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                out.push((from, i));
                from = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push((from, end));
    out
}

/// A field the message type does not have: (its name, its byte offset, the type, the type's
/// field names).
pub(crate) struct Unknown {
    pub(crate) name: String,
    pub(crate) offset: usize,
    pub(crate) message: String,
    pub(crate) fields: Vec<String>,
}

/// Every key of the literal object `src[start..end]` (recursively, for literal values of
/// message fields) that `codec`'s type does not have; depth-bounded.
pub(crate) fn unknown_fields(
    src: &str,
    start: usize,
    end: usize,
    codec: &MessageCodec,
    depth: usize,
    out: &mut Vec<Unknown>,
) {
    if depth > 16 || codec.is_well_known() {
        return;
    }
    let Some(keys) = object_keys(src, start, end) else {
        return;
    };
    for k in keys {
        match codec.field(&k.name) {
            None => out.push(Unknown {
                name: k.name,
                offset: k.offset,
                message: codec.name().to_string(),
                fields: codec.field_names(),
            }),
            Some(f) => {
                if let (Some(m), Some((vs, ve))) = (f.message, k.value) {
                    unknown_fields(src, vs, ve, &m, depth + 1, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(src: &str) -> Option<Vec<String>> {
        object_keys(src, 0, src.len()).map(|k| k.into_iter().map(|k| k.name).collect())
    }

    #[test]
    fn keys_of_object_literals() {
        assert_eq!(
            names(r#"{id: $request.params.id, "limit": 3, user_id, $x}"#).unwrap(),
            ["id", "limit", "user_id", "x"]
        );
        assert_eq!(
            names(r#" { a: {b: 1, c: [1, {d: 2}]}, e: "x,y}", f: "\(.a + "}")" } "#).unwrap(),
            ["a", "e", "f"]
        );
        // Computed keys are skipped; not-a-literal is None.
        assert_eq!(
            names(r#"{(.k): 1, "a\(.b)": 2, @base64: 3, z: 4}"#).unwrap(),
            ["z"]
        );
        assert_eq!(names("{a: 1} + $x"), None);
        assert_eq!(names(".a"), None);
        assert_eq!(names("{a: 1"), None);
        assert_eq!(names("{}").unwrap(), Vec::<String>::new());
        let k = object_keys("{ab: 1}", 0, 7).unwrap();
        assert_eq!(k[0].offset, 1);
        assert_eq!(k[0].value, Some((4, 6)));
    }
}
