//! `fanout test --update`: rewrite the `response:` values of cases in place with the actual
//! answers, leaving every other part of the file (comments, layout, other fields) as it is.
//!
//! Each case's own `response:` is found through the YAML's positions (the `n`-th entry of
//! `cases:`, its `response` key), never by searching the text. Its value is replaced:
//!
//! - in a block-style case (`- name: …` on lines of their own), the key and its value — from the
//!   key to the last line indented deeper than the key — become `response: VALUE` in flow style
//!   when that fits in 100 columns, else `response:` and the value in block style under it;
//! - in a flow-style case (`- {name: …, response: {…}}`), the value alone (up to its closing
//!   bracket, or the scalar's end) becomes the value in flow style, on one line.
//!
//! What it cannot place it refuses, naming why, and leaves as it is: a `response:` that is an
//! alias (`*name`), that has an anchor (`&name`: other places may use it) or a tag, or that comes
//! from a merge key (`<<: *base`). Every rewrite is checked by reading the new text back: the
//! document must be the old one with exactly that case's answer changed, else it is refused too.

use fanout_config::yaml_tree::Node;
use serde_json::Value;
use serde_saphyr::{Location, Spanned};
use std::fmt::Write as _;

const WIDTH: usize = 100;

/// Why a file could not be updated at all (a case that cannot be is a [`Rewritten::refused`]).
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The file no longer reads as YAML (changed while the cases ran?).
    #[error("cannot read the file again to update it: {0}")]
    Unreadable(String),
    /// The answers, each checked alone, do not read back together.
    #[error("the updated file would not read back as exactly the answers; left as it was")]
    Mismatch,
}

/// What [`rewrite`] made of a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewritten {
    /// The new text.
    pub text: String,
    /// The cases (indexes in `cases:`) whose answer was written, in the order given.
    pub updated: Vec<usize>,
    /// The cases whose answer was not written, and why (a sentence).
    pub refused: Vec<(usize, String)>,
}

/// `text` with the `response:` of each given case (its index in the `cases:` list) replaced
/// by the paired answer, where that can be done safely; the others are [`Rewritten::refused`].
pub fn rewrite(text: &str, edits: &[(usize, Value)]) -> Result<Rewritten, UpdateError> {
    let unreadable = |e: serde_saphyr::Error| {
        UpdateError::Unreadable(e.to_string().lines().next().unwrap_or("").to_string())
    };
    let root: Spanned<Node> = serde_saphyr::from_str(text).map_err(unreadable)?;
    let old: Value = serde_saphyr::from_str(text).map_err(unreadable)?;
    let cases = match &root.value {
        Node::Map(entries) => {
            entries
                .iter()
                .find(|(k, _)| k.value.0 == "cases")
                .and_then(|(_, v)| match &v.value {
                    Node::Seq(items) => Some(items.as_slice()),
                    _ => None,
                })
        }
        _ => None,
    }
    .unwrap_or_default();
    let mut out = Rewritten {
        text: text.to_string(),
        updated: Vec::new(),
        refused: Vec::new(),
    };
    let mut placed: Vec<(usize, &Value, Replacement)> = Vec::new();
    for (i, answer) in edits {
        let place = cases
            .get(*i)
            .ok_or_else(|| "the case is no longer in the file".to_string())
            .and_then(|case| place(text, case, answer));
        match place {
            Ok(r) => {
                // alone, it must read back as the answer and leave everything else as it was
                let one = splice(text, std::slice::from_ref(&r));
                if reads_back(&old, &one, &[(*i, answer)]) {
                    placed.push((*i, answer, r));
                } else {
                    out.refused.push((
                        *i,
                        "written there, the file would not read back as exactly this answer \
                         (the value shares text with another place?); change it by hand"
                            .into(),
                    ));
                }
            }
            Err(why) => out.refused.push((*i, why)),
        }
    }
    if placed.is_empty() {
        return Ok(out);
    }
    let all: Vec<Replacement> = placed.iter().map(|(_, _, r)| r.clone()).collect();
    let new = splice(text, &all);
    let answers: Vec<(usize, &Value)> = placed.iter().map(|(i, a, _)| (*i, *a)).collect();
    if !reads_back(&old, &new, &answers) {
        return Err(UpdateError::Mismatch);
    }
    out.text = new;
    out.updated = answers.iter().map(|(i, _)| *i).collect();
    Ok(out)
}

/// Bytes `start..end` of the text become `with`.
#[derive(Debug, Clone)]
struct Replacement {
    start: usize,
    end: usize,
    with: String,
}

/// The text with the (non-overlapping) replacements made.
fn splice(text: &str, reps: &[Replacement]) -> String {
    let mut reps: Vec<&Replacement> = reps.iter().collect();
    reps.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for r in reps {
        out.push_str(&text[at..r.start]);
        out.push_str(&r.with);
        at = r.end;
    }
    out.push_str(&text[at..]);
    out
}

/// Whether `new` reads as `old` with each given case's `response` replaced by its answer, and
/// nothing else changed.
fn reads_back(old: &Value, new: &str, answers: &[(usize, &Value)]) -> bool {
    let Ok(new) = serde_saphyr::from_str::<Value>(new) else {
        return false;
    };
    let mut want = old.clone();
    for (i, answer) in answers {
        match want
            .get_mut("cases")
            .and_then(|c| c.get_mut(*i))
            .and_then(|c| c.get_mut("response"))
        {
            Some(r) => *r = (*answer).clone(),
            None => return false,
        }
    }
    want == new
}

/// Byte offset and length of a location's text, when known.
fn bytes(l: &Location) -> Option<(usize, usize)> {
    let s = l.span();
    Some((
        usize::try_from(s.byte_offset()?).ok()?,
        usize::try_from(s.byte_len()?).ok()?,
    ))
}

/// Whether a node is used somewhere other than where its text is (an alias, a merge key).
fn moved<T>(s: &Spanned<T>) -> bool {
    bytes(&s.referenced) != bytes(&s.defined) || s.referenced.line() != s.defined.line()
}

/// The text at a location (an alias's `*name`), for messages.
fn text_at<'t>(text: &'t str, l: &Location) -> &'t str {
    bytes(l).and_then(|(o, n)| text.get(o..o + n)).unwrap_or("")
}

const UNSURE: &str = "--update cannot tell where its value is written; change it by hand";

/// Where the answer of `case` goes, and its text there; `Err`: why it cannot be placed.
fn place(text: &str, case: &Spanned<Node>, answer: &Value) -> Result<Replacement, String> {
    if moved(case) {
        return Err(format!(
            "the case is an alias ({}) of a case written at line {}; change it there",
            text_at(text, &case.referenced),
            case.defined.line()
        ));
    }
    let Node::Map(entries) = &case.value else {
        return Err("the case is not a mapping".into());
    };
    let Some((key, value)) = entries.iter().find(|(k, _)| k.value.0 == "response") else {
        return Err("the case has no `response:` of its own".into());
    };
    if moved(key) {
        return Err(format!(
            "its `response:` comes from a merge key or an alias ({}), written at line {}; \
             change it there",
            text_at(text, &key.referenced),
            key.defined.line()
        ));
    }
    if moved(value) {
        return Err(format!(
            "its `response:` is an alias ({}) of a value written at line {}; change it there \
             or write the answer in its place by hand",
            text_at(text, &value.referenced),
            value.defined.line()
        ));
    }
    let ((k, klen), (v, vlen)) = bytes(&key.referenced)
        .zip(bytes(&value.defined))
        .ok_or_else(|| UNSURE.to_string())?;
    let key_text = text.get(k..k + klen).ok_or_else(|| UNSURE.to_string())?;
    let case_at = bytes(&case.defined)
        .map(|(o, _)| o)
        .filter(|o| *o <= k && text.is_char_boundary(*o))
        .ok_or_else(|| UNSURE.to_string())?;
    let flow_case = text[case_at..].starts_with('{');
    if !own_key(text, case_at, k, flow_case) {
        return Err(
            "its `response:` comes from a merge key (`<<: {…}`), not the case's own mapping; \
             change it where it is written"
                .into(),
        );
    }
    let start = value_start(text, k + klen, v)?;
    let rep = if flow_case {
        // only the value: the rest of the flow mapping stays as it is
        let end = match text[start..].chars().next() {
            Some('{' | '[') => flow_end(text, start).ok_or_else(|| UNSURE.to_string())?,
            _ => v + vlen,
        };
        Replacement {
            start,
            end,
            with: flow(answer),
        }
    } else {
        block_replacement(text, k, key_text, start, value, answer)?
    };
    // the next key of the case must stay outside
    let others_outside = entries.iter().all(|(ok, _)| {
        std::ptr::eq(ok, key)
            || moved(ok)
            || bytes(&ok.referenced).is_none_or(|(o, _)| o < rep.start || o >= rep.end)
    });
    if !others_outside || rep.end < rep.start || rep.end > text.len() {
        return Err(UNSURE.into());
    }
    Ok(rep)
}

/// Where the value after a key (its text ends at `after_key`) starts: after the `:`, blanks and
/// comments; a block scalar's `|`/`>` header is part of it. `v` is where the parser put the
/// value. An anchor or a tag is refused.
fn value_start(text: &str, after_key: usize, v: usize) -> Result<usize, String> {
    let between = text.get(after_key..v).ok_or_else(|| UNSURE.to_string())?;
    let Some(rest) = between.trim_start_matches([' ', '\t']).strip_prefix(':') else {
        return Err(format!(
            "its `response:` is written in a form --update does not rewrite (an explicit `?` \
             key?); {UNSURE}"
        ));
    };
    let mut i = v - rest.len();
    while i < v {
        let t = &text[i..v];
        let c = t.chars().next().unwrap_or(' ');
        if c.is_whitespace() {
            i += c.len_utf8();
        } else if c == '#' {
            i += t.find('\n').unwrap_or(t.len());
        } else if c == '&' || c == '!' {
            let name: String = t
                .chars()
                .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | '{' | '}' | '[' | ']'))
                .collect();
            return Err(if c == '&' {
                format!(
                    "its `response:` has an anchor ({name}) that other places may use; change \
                     it by hand"
                )
            } else {
                format!("its `response:` has a tag ({name}); change it by hand")
            });
        } else if c == '|' || c == '>' {
            return Ok(i);
        } else if c == '-' && t[1..].starts_with(char::is_whitespace) {
            // a list at the key's indentation: the parser places it at its first item
            return Ok(i);
        } else {
            return Err(UNSURE.into());
        }
    }
    Ok(v)
}

/// The end of the flow collection starting at `start` (just after its closing bracket).
fn flow_end(text: &str, start: usize) -> Option<usize> {
    flow_scan(text, start, |_, _| {})
}

/// Walk the flow collection starting at `start`, calling `at(i, depth)` before each byte `i`
/// that is not inside a quoted scalar or a comment (`depth`: brackets open before it); returns
/// the end of the collection (just after its closing bracket).
fn flow_scan(text: &str, start: usize, mut at: impl FnMut(usize, usize)) -> Option<usize> {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut i = start;
    let mut prev = b' ';
    while i < b.len() {
        at(i, depth);
        let c = b[i];
        match c {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b'"' | b'\'' if prev.is_ascii_whitespace() || b"{[,:?".contains(&prev) => {
                i = quoted_end(b, i)?;
            }
            b'#' if prev.is_ascii_whitespace() => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            _ => {}
        }
        prev = b.get(i).copied().unwrap_or(b' ');
        i += 1;
    }
    None
}

/// Whether the key at byte `k` is written in the case's own mapping (starting at `case`), not
/// in a merged one (`<<: {response: …}`): in a block mapping, at the mapping's column; in a flow
/// mapping, directly inside its braces.
fn own_key(text: &str, case: usize, k: usize, flow_case: bool) -> bool {
    if flow_case {
        let mut depth = None;
        flow_scan(text, case, |i, d| {
            if i == k {
                depth = Some(d);
            }
        });
        depth == Some(1)
    } else {
        let col = |at: usize| at - text[..at].rfind('\n').map_or(0, |i| i + 1);
        k >= case && col(k) == col(case)
    }
}

/// The index of the quote closing the quoted scalar that opens at `start`.
fn quoted_end(b: &[u8], start: usize) -> Option<usize> {
    let q = b[start];
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' if q == b'"' => i += 1,
            b'\'' if q == b'\'' && b.get(i + 1) == Some(&b'\'') => i += 1,
            c if c == q => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The replacement of a block-style `response:` key (at byte `k`) and its value (starting at
/// `start`): up to the last line indented deeper than the key (for a list written at the key's
/// indentation, its `- ` lines too), a comment at the end of that line included; comment lines
/// after the value stay.
fn block_replacement(
    text: &str,
    k: usize,
    key_text: &str,
    start: usize,
    value: &Spanned<Node>,
    answer: &Value,
) -> Result<Replacement, String> {
    let line_start = text[..k].rfind('\n').map_or(0, |i| i + 1);
    let key_col = k - line_start;
    let key_line_end = text[k..].find('\n').map_or(text.len(), |i| k + i);
    // a list written at the key's indentation (`response:` then `- 1` under its `r`)
    let value_line = &text[text[..start].rfind('\n').map_or(0, |i| i + 1)..];
    let value_text = value_line.trim_start_matches(' ');
    let compact = matches!(value.value, Node::Seq(_))
        && start > key_line_end
        && value_line.len() - value_text.len() == key_col
        && value_text.starts_with('-');
    let block_scalar = text[start..].starts_with(['|', '>']);
    let mut end = key_line_end;
    let mut at = key_line_end;
    while at < text.len() {
        let ls = at + 1;
        let le = text[ls..].find('\n').map_or(text.len(), |i| ls + i);
        let line = &text[ls..le];
        let t = line.trim_start_matches(' ');
        let indent = line.len() - t.len();
        let blank = t.trim().is_empty();
        let comment = t.starts_with('#') && !(block_scalar && indent > key_col);
        if blank || comment {
            at = le;
            continue;
        }
        let item = compact && indent == key_col && (t.trim_end() == "-" || t.starts_with("- "));
        if indent > key_col || item {
            end = le;
            at = le;
            continue;
        }
        break;
    }
    if text[..end].ends_with('\r') {
        end -= 1;
    }
    if start > end {
        return Err(UNSURE.into());
    }
    let f = flow(answer);
    let with = if key_col + key_text.len() + 2 + f.len() <= WIDTH {
        format!("{key_text}: {f}")
    } else {
        let mut lines = vec![format!("{key_text}:")];
        block(answer, key_col + 2, &mut lines);
        lines.join("\n")
    };
    Ok(Replacement {
        start: k,
        end,
        with,
    })
}

fn key(k: &str) -> String {
    let plain = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !special(k);
    if plain { k.to_string() } else { quote(k) }
}

/// Words a YAML reader may take for something other than a string.
fn special(s: &str) -> bool {
    matches!(
        s.to_ascii_lowercase().as_str(),
        "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
    )
}

/// A string value: plain when that reads back as the same string in flow and block context
/// (a letter first, then letters, digits, spaces, `_ - . /`, no trailing space), else quoted.
fn string(v: &str) -> String {
    let plain = v.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.' | '/'))
        && !v.ends_with(' ')
        && !special(v);
    if plain { v.to_string() } else { quote(v) }
}

/// Whether YAML holds `c` raw in a double-quoted scalar: its printable set (YAML 1.2, 5.1),
/// less the characters YAML 1.1 readers take for line breaks (U+0085, U+2028, U+2029) and the
/// byte order mark.
fn raw_in_yaml(c: char) -> bool {
    matches!(c as u32, 0x20..=0x7E | 0xA0..=0xD7FF | 0xE000..=0xFFFD | 0x10000..=0x10FFFF)
        && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{FEFF}')
}

/// `s` as a YAML double-quoted scalar: `\"`, `\\`, `\t`, `\n`, `\r`, and `\uXXXX` for every
/// other character YAML cannot hold raw, so it reads back as exactly `s`.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if raw_in_yaml(c) => out.push(c),
            c => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// A value in YAML flow style (JSON with plain keys where they are safe).
fn flow(v: &Value) -> String {
    match v {
        Value::Object(m) if m.is_empty() => "{}".into(),
        Value::Object(m) => format!(
            "{{ {} }}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", key(k), flow(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Array(a) => format!("[{}]", a.iter().map(flow).collect::<Vec<_>>().join(", ")),
        Value::String(s) => string(s),
        other => other.to_string(),
    }
}

/// A value in block style at `indent`, one line per entry (nested values in flow style when
/// they fit).
fn block(v: &Value, indent: usize, out: &mut Vec<String>) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let head = format!("{pad}{}:", key(k));
                let f = flow(v);
                // a list of objects goes one per line, as people write them
                if (head.len() + 1 + f.len() <= WIDTH && !is_list_of_objects(v)) || !is_nested(v) {
                    out.push(format!("{head} {f}"));
                } else {
                    out.push(head);
                    block(v, indent + 2, out);
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for item in a {
                let f = flow(item);
                if pad.len() + 2 + f.len() <= WIDTH || !is_nested(item) {
                    out.push(format!("{pad}- {f}"));
                } else {
                    // the item's lines at indent + 2, the first one after `- `
                    let mut inner = Vec::new();
                    block(item, indent + 2, &mut inner);
                    for (i, l) in inner.into_iter().enumerate() {
                        if i == 0 {
                            out.push(format!("{pad}- {}", l.get(indent + 2..).unwrap_or("")));
                        } else {
                            out.push(l);
                        }
                    }
                }
            }
        }
        other => out.push(format!("{pad}{}", flow(other))),
    }
}

fn is_list_of_objects(v: &Value) -> bool {
    matches!(v, Value::Array(a) if a.iter().any(|i| matches!(i, Value::Object(m) if !m.is_empty())))
}

fn is_nested(v: &Value) -> bool {
    matches!(v, Value::Object(m) if !m.is_empty()) || matches!(v, Value::Array(a) if !a.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(text: &str, case: usize, v: Value) -> String {
        let r = rewrite(text, &[(case, v)]).unwrap();
        assert_eq!(r.refused, vec![], "{text}");
        r.text
    }

    #[test]
    fn replaces_only_the_value_keeping_comments_around_it() {
        let text = "# top\ncases:\n  - name: a # why\n    request: { path: / }\n    status: 200\n    response:\n      total: 1 # old\n      items: [1]\n    # after\n    backend_calls: { s: 1 }\n";
        let out = one(text, 0, json!({"total": 2, "items": []}));
        assert_eq!(
            out,
            "# top\ncases:\n  - name: a # why\n    request: { path: / }\n    status: 200\n    response: { total: 2, items: [] }\n    # after\n    backend_calls: { s: 1 }\n"
        );
    }

    #[test]
    fn long_values_are_written_as_blocks() {
        let text = "cases:\n  - name: a\n    response: {}\n";
        let long: Vec<Value> = (0..8)
            .map(|i| json!({"id": i, "title": format!("Vacancy number {i}")}))
            .collect();
        let v = json!({"total": 8, "items": long});
        let out = one(text, 0, v.clone());
        assert!(out.starts_with("cases:\n  - name: a\n    response:\n      total: 8\n      items:\n        - { id: 0,"), "{out}");
        let parsed: Value = serde_saphyr::from_str::<Value>(&out).unwrap();
        assert_eq!(parsed["cases"][0]["response"], v);
    }

    #[test]
    fn a_flow_case_gets_its_own_answer_and_the_block_case_above_keeps_its_own() {
        let text = "cases:\n  - name: a\n    response:\n      total: 1\n  - {name: b, response: {total: 1}}\n";
        let out = one(text, 1, json!({"total": 2}));
        assert_eq!(
            out,
            "cases:\n  - name: a\n    response:\n      total: 1\n  - {name: b, response: { total: 2 }}\n"
        );
    }

    #[test]
    fn scalars_in_flow_cases_and_block_scalars_are_replaced_whole() {
        let text = "cases:\n  - {name: a, response: \"x, y\" }\n  - name: b\n    response: |\n      text\n      # not a comment\n    status: 200\n";
        let r = rewrite(text, &[(0, json!(1)), (1, json!("t"))]).unwrap();
        assert_eq!(r.refused, vec![]);
        assert_eq!(
            r.text,
            "cases:\n  - {name: a, response: 1 }\n  - name: b\n    response: t\n    status: 200\n"
        );
    }

    #[test]
    fn a_list_at_the_keys_indentation_is_replaced_whole() {
        let text = "cases:\n  - name: g\n    response:\n    - 1\n    # c\n    - [2,\n      3]\n    status: 200\n";
        let out = one(text, 0, json!([]));
        assert_eq!(
            out,
            "cases:\n  - name: g\n    response: []\n    status: 200\n"
        );
    }

    #[test]
    fn what_yaml_cannot_hold_raw_is_escaped_and_reads_back_exactly() {
        let odd: String = [
            '\u{1}', '\t', '\n', '\r', '"', '\\', '\u{7f}', '\u{80}', '\u{85}', '\u{9f}', '\u{a0}',
            '\u{2028}', '\u{2029}', '\u{feff}', '\u{fffe}', '\u{ffff}', 'é', '😀',
        ]
        .into_iter()
        .collect();
        let v = json!({ odd.clone(): odd });
        let out = one("cases:\n  - response: 0\n", 0, v.clone());
        let parsed: Value = serde_saphyr::from_str::<Value>(&out).unwrap();
        assert_eq!(parsed["cases"][0]["response"], v, "{out}");
        assert!(
            out.contains(r#""\u0001\t\n\r\"\\\u007f\u0080\u0085\u009f"#),
            "{out}"
        );
    }

    #[test]
    fn aliases_anchors_and_merges_are_refused() {
        let text = "cases:\n  - name: a\n    response: &r {x: 1}\n  - name: b\n    response: *r\n  - <<: {response: 2}\n    name: c\n";
        let r = rewrite(text, &[(0, json!(0)), (1, json!(0)), (2, json!(0))]).unwrap();
        assert_eq!(r.text, text);
        assert_eq!(r.updated, Vec::<usize>::new());
        let why: Vec<&str> = r.refused.iter().map(|(_, w)| w.as_str()).collect();
        assert!(why[0].contains("anchor (&r)"), "{why:?}");
        assert!(why[1].contains("alias (*r)"), "{why:?}");
        assert!(why[2].contains("merge key"), "{why:?}");
    }
}
