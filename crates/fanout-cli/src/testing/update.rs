//! `fanout test --update`: rewrite the `response:` values of cases in place with the actual
//! answers, leaving every other line of the file (comments, layout, other fields) as it is.
//!
//! A `response:` value spans from its key to the last line indented deeper than the key; that
//! span is replaced by the new value, on the key's line in flow style when it fits in 100
//! columns, else in block style indented under the key.

use serde_json::Value;

const WIDTH: usize = 100;

/// Why a file could not be updated.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// No `response:` key found where the parser put its value.
    #[error("line {0}: no `response:` key found for the value there")]
    NoKey(u32),
}

/// `text` with the `response:` value starting on each given line (1-based, as the parser
/// reports it) replaced by the paired value.
pub fn rewrite(text: &str, edits: &[(u32, Value)]) -> Result<String, UpdateError> {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut edits: Vec<&(u32, Value)> = edits.iter().collect();
    edits.sort_by_key(|(l, _)| std::cmp::Reverse(*l));
    for (line, value) in edits {
        let value_idx = (*line as usize)
            .saturating_sub(1)
            .min(lines.len().saturating_sub(1));
        let (key_idx, key_col) = (0..=value_idx)
            .rev()
            .take(200)
            .find_map(|i| key_at(&lines[i]).map(|c| (i, c)))
            .ok_or(UpdateError::NoKey(*line))?;
        let mut end = key_idx;
        for (i, l) in lines.iter().enumerate().skip(key_idx + 1) {
            let t = l.trim_start();
            if t.is_empty() {
                continue;
            }
            if l.len() - t.len() <= key_col {
                break;
            }
            end = i;
        }
        let prefix = &lines[key_idx][..key_col];
        let head = format!("{prefix}response:");
        let flow = flow(value);
        let new: Vec<String> = if head.len() + 1 + flow.len() <= WIDTH {
            vec![format!("{head} {flow}")]
        } else {
            let mut out = vec![head];
            block(value, key_col + 2, &mut out);
            out
        };
        lines.splice(key_idx..=end, new);
    }
    let mut out = lines.join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// The column of a `response:` key on this line, if it has one.
fn key_at(line: &str) -> Option<usize> {
    let t = line.trim_start();
    let indent = line.len() - t.len();
    let t2 = t.strip_prefix("- ").unwrap_or(t);
    let col = indent + (t.len() - t2.len());
    (t2.starts_with("response:")).then_some(col)
}

fn key(k: &str) -> String {
    let plain = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !special(k);
    if plain {
        k.to_string()
    } else {
        Value::String(k.to_string()).to_string()
    }
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
    if plain {
        v.to_string()
    } else {
        Value::String(v.to_string()).to_string()
    }
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
                            out.push(format!("{pad}- {}", &l[indent + 2..]));
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

    #[test]
    fn replaces_only_the_value_keeping_comments_around_it() {
        let text = "# top\ncases:\n  - name: a # why\n    request: { path: / }\n    status: 200\n    response:\n      total: 1 # old\n      items: [1]\n    # after\n    backend_calls: { s: 1 }\n";
        let out = rewrite(text, &[(7, json!({"total": 2, "items": []}))]).unwrap();
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
        let out = rewrite(text, &[(3, v.clone())]).unwrap();
        assert!(out.starts_with("cases:\n  - name: a\n    response:\n      total: 8\n      items:\n        - { id: 0,"), "{out}");
        let parsed: Value = serde_saphyr::from_str::<Value>(&out).unwrap();
        assert_eq!(parsed["cases"][0]["response"], v);
    }
}
