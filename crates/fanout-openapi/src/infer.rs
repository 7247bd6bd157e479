//! What a route's expressions say about its request, for the document when the route declares
//! nothing: the query parameters they read (`$request.query.NAME`, `$request.query["NAME"]`),
//! typed `number` when read through `tonumber`, and whether they read the body.

use serde_json::Value;

/// What the expressions of one route read of `$request`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reads {
    /// Query parameters by name, in order of first use, with whether one is read as a number.
    pub query: Vec<(String, bool)>,
    /// `$request.body` (or `$request` whole).
    pub body: bool,
}

/// The fields of a route that hold no expression (their text is not scanned).
const NOT_EXPRESSIONS: [&str; 8] = [
    "summary",
    "description",
    "tags",
    "parameters",
    "request_schema",
    "answer_schema",
    "examples",
    "path",
];

/// The expressions of each route of the config text `source` (its YAML as values), scanned.
pub fn route_reads(source: &str) -> Vec<Reads> {
    let doc: Value = serde_saphyr::from_str(source).unwrap_or(Value::Null);
    let Some(routes) = doc.get("routes").and_then(Value::as_array) else {
        return Vec::new();
    };
    routes
        .iter()
        .map(|r| {
            let mut reads = Reads::default();
            if let Some(o) = r.as_object() {
                for (k, v) in o {
                    if !NOT_EXPRESSIONS.contains(&k.as_str()) {
                        scan_value(v, &mut reads, 0);
                    }
                }
            }
            reads
        })
        .collect()
}

fn scan_value(v: &Value, reads: &mut Reads, depth: usize) {
    if depth > 64 {
        return;
    }
    match v {
        Value::String(s) => scan(s, reads),
        Value::Array(a) => a.iter().for_each(|x| scan_value(x, reads, depth + 1)),
        Value::Object(o) => o.values().for_each(|x| scan_value(x, reads, depth + 1)),
        _ => {}
    }
}

/// Scan one expression's text.
pub fn scan(src: &str, reads: &mut Reads) {
    const REQ: &str = "$request";
    let mut at = 0;
    while let Some(i) = src[at..].find(REQ) {
        let start = at + i + REQ.len();
        at = start;
        let rest = &src[start..];
        // `$requests` is another name.
        if rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let Some(field) = rest.strip_prefix('.') else {
            // `$request` whole (passed on, bound): it may read anything.
            if !rest.trim_start().starts_with('[') {
                reads.body = true;
            }
            continue;
        };
        if let Some(after) = field.strip_prefix("body") {
            if !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                reads.body = true;
            }
            continue;
        }
        let Some(q) = field.strip_prefix("query") else {
            continue;
        };
        let (name, tail) = if let Some(n) = q.strip_prefix('.') {
            let end = n
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(n.len());
            (&n[..end], &n[end..])
        } else if let Some(n) = q.strip_prefix("[\"").or_else(|| q.strip_prefix(".\"")) {
            match n.find('"') {
                Some(end) => (&n[..end], n[end + 1..].trim_start_matches(']')),
                None => continue,
            }
        } else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        let number = tail.trim_start().strip_prefix('|').is_some_and(|t| {
            let t = t.trim_start();
            t.starts_with("tonumber")
        });
        match reads.query.iter_mut().find(|(n, _)| n == name) {
            Some((_, num)) => *num |= number,
            None => reads.query.push((name.to_string(), number)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_query_parameters_and_body() {
        let mut r = Reads::default();
        scan(
            r#"{q: $request.query.text, page: ($request.query.page | tonumber), t: $request.query["x-y"], b: $request.body.id}"#,
            &mut r,
        );
        assert_eq!(
            r.query,
            vec![
                ("text".to_string(), false),
                ("page".to_string(), true),
                ("x-y".to_string(), false)
            ]
        );
        assert!(r.body);
        let mut r = Reads::default();
        scan("$request.params.id", &mut r);
        assert_eq!(r, Reads::default());
    }
}
