//! Comparing JSON answers and showing how they differ.

use serde_json::Value;

/// Equality of JSON values with numbers compared by value (`1` equals `1.0`).
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// `text` cut to at most `max` characters, with `…` when cut.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

fn key_path(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !key.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        format!("{path}.{key}")
    } else {
        format!("{path}[{}]", Value::String(key.to_string()))
    }
}

/// The places where `actual` differs from `expected`, as `.path: expected X, got Y`.
fn differences(expected: &Value, actual: &Value, path: &str, out: &mut Vec<String>) {
    let here = || {
        if path.is_empty() {
            ".".to_string()
        } else {
            path.to_string()
        }
    };
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                match a.get(k) {
                    Some(w) => differences(v, w, &key_path(path, k), out),
                    None => out.push(format!("{}: missing (expected {v})", key_path(path, k))),
                }
            }
            for (k, w) in a {
                if !e.contains_key(k) {
                    out.push(format!("{}: not expected, got {w}", key_path(path, k)));
                }
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (v, w)) in e.iter().zip(a).enumerate() {
                differences(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Array(e), Value::Array(a)) => out.push(format!(
            "{}: expected {} items, got {}",
            here(),
            e.len(),
            a.len()
        )),
        _ if json_eq(expected, actual) => {}
        _ => out.push(format!(
            "{}: expected {}, got {}",
            here(),
            clip(&expected.to_string(), 200),
            clip(&actual.to_string(), 200)
        )),
    }
}

/// How `actual` differs from `expected`: the differing places, then a line diff of both as
/// pretty JSON (`-` expected, `+` actual).
pub fn show(expected: &Value, actual: &Value) -> String {
    let mut places = Vec::new();
    differences(expected, actual, "", &mut places);
    let mut out = String::new();
    for p in places.iter().take(20) {
        out.push_str(&format!("  at {p}\n"));
    }
    if places.len() > 20 {
        out.push_str(&format!("  … and {} more\n", places.len() - 20));
    }
    let e = serde_json::to_string_pretty(expected).unwrap_or_default();
    let a = serde_json::to_string_pretty(actual).unwrap_or_default();
    out.push_str("  --- expected\n  +++ actual\n");
    out.push_str(&line_diff(&e, &a));
    out
}

/// A unified-style line diff with 2 lines of context (`-` only in `a`, `+` only in `b`).
fn line_diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // longest common subsequence, bounded: past it, show both whole
    if a.len().saturating_mul(b.len()) > 4_000_000 {
        let mut out = String::new();
        for l in &a {
            out.push_str(&format!("  - {l}\n"));
        }
        for l in &b {
            out.push_str(&format!("  + {l}\n"));
        }
        return out;
    }
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 2;
    let near_change = |k: usize| {
        let lo = k.saturating_sub(CONTEXT);
        let hi = (k + CONTEXT).min(ops.len().saturating_sub(1));
        (lo..=hi).any(|x| ops[x].0 != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (op, line)) in ops.iter().enumerate() {
        if *op != ' ' || near_change(k) {
            if skipped {
                out.push_str("    …\n");
                skipped = false;
            }
            out.push_str(&format!("  {op} {line}\n"));
        } else {
            skipped = true;
        }
    }
    out
}

/// Whether `actual` includes `part` (see `response_includes`); each miss is added to `misses`.
pub fn includes(part: &Value, actual: &Value, path: &mut String, misses: &mut Vec<String>) {
    let here = |p: &str| {
        if p.is_empty() {
            ".".to_string()
        } else {
            p.to_string()
        }
    };
    match (part, actual) {
        (Value::Object(p), Value::Object(a)) => {
            for (k, v) in p {
                let at = key_path(path, k);
                match a.get(k) {
                    Some(w) => includes(v, w, &mut at.clone(), misses),
                    None => misses.push(format!(
                        "{at}: missing (expected {})",
                        clip(&v.to_string(), 200)
                    )),
                }
            }
        }
        (Value::Array(p), Value::Array(a)) if p.len() == a.len() => {
            for (i, (v, w)) in p.iter().zip(a).enumerate() {
                includes(v, w, &mut format!("{path}[{i}]"), misses);
            }
        }
        (Value::Array(p), Value::Array(a)) => misses.push(format!(
            "{}: expected {} items, got {}",
            here(path),
            p.len(),
            a.len()
        )),
        _ if json_eq(part, actual) => {}
        _ => misses.push(format!(
            "{}: expected {}, got {}",
            here(path),
            clip(&part.to_string(), 200),
            clip(&actual.to_string(), 200)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_compare_by_value_and_differences_name_their_place() {
        assert!(json_eq(&json!({"a": [1, 2.0]}), &json!({"a": [1.0, 2]})));
        let shown = show(
            &json!({"a": 1, "b": [1, 2]}),
            &json!({"a": 2, "b": [1, 2], "c": 0}),
        );
        assert!(shown.contains("at .a: expected 1, got 2"), "{shown}");
        assert!(shown.contains("at .c: not expected, got 0"), "{shown}");
        assert!(
            shown.contains("  -   \"a\": 1,\n  +   \"a\": 2,"),
            "{shown}"
        );
    }

    #[test]
    fn includes_checks_a_subset() {
        let mut misses = Vec::new();
        includes(
            &json!({"user": {"id": "u1"}, "n": [1]}),
            &json!({"user": {"id": "u1", "name": "x"}, "n": [2], "other": true}),
            &mut String::new(),
            &mut misses,
        );
        assert_eq!(misses, vec![".n[0]: expected 1, got 2".to_string()]);
    }
}
