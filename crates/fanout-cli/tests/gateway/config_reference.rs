//! docs/config.md documents every config field, and names no field that does not exist.
//!
//! The fields are taken from the generated JSON Schema (`fanout_proxy::registry::schema()`, what
//! `fanout schema` prints): every property at every level, following `$ref`, `anyOf`/`oneOf`/
//! `allOf`, `additionalProperties` (map entries, written `*`) and `items` (list items, written
//! `[]`). Paths are dotted: `server.admission.codel.target`, `backends.*.retry.budget.ratio`,
//! `routes[].flow.*.http.key`. A map or list of plain values (`headers`, `urls`,
//! `retry.on_status`) is one field; a map or list of objects is a field and so is each of its
//! objects' properties.
//!
//! The convention in docs/config.md (also written in a comment at its top):
//!
//! - A **field table** is a Markdown table preceded by a line `<!-- fields: ROOT -->` (prose and
//!   blank lines may sit between the two). `<!-- fields: -->` (empty ROOT) is the top level.
//! - Each body row of a field table is one **entry**: its first cell is one backticked path
//!   relative to ROOT (`ROOT.cell` is the full path), and it has at least three non-empty cells:
//!   field, default, meaning.
//! - Every schema path has exactly one entry; every entry names a schema path.
//!
//! Tables without a marker (status codes, `$request`, the status endpoint) are not field tables.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

/// Every field path of the schema.
fn schema_paths(schema: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk(schema, schema, "", &mut out, 0);
    out
}

/// Follows a local `$ref` (`#/$defs/Name`).
fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("non-local $ref {r}"));
            let target = root
                .pointer(pointer)
                .unwrap_or_else(|| panic!("dangling $ref {r}"));
            resolve(root, target)
        }
        None => s,
    }
}

fn walk(root: &Value, s: &Value, prefix: &str, out: &mut BTreeSet<String>, depth: usize) {
    assert!(
        depth < 64,
        "schema nested deeper than 64 levels at `{prefix}` (recursive type?)"
    );
    let s = resolve(root, s);
    for alt in ["anyOf", "oneOf", "allOf"] {
        for a in s.get(alt).and_then(Value::as_array).into_iter().flatten() {
            walk(root, a, prefix, out, depth + 1);
        }
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            out.insert(path.clone());
            walk(root, sub, &path, out, depth + 1);
        }
    }
    // `additionalProperties: false` is a boolean; a schema here means a map.
    if let Some(entry) = s.get("additionalProperties").filter(|v| v.is_object()) {
        walk(root, entry, &format!("{prefix}.*"), out, depth + 1);
    }
    if let Some(items) = s.get("items").filter(|v| v.is_object()) {
        walk(root, items, &format!("{prefix}[]"), out, depth + 1);
    }
}

/// One documented field: its full path and the line of its row.
struct Entry {
    path: String,
    line: usize,
}

/// Cells of a table row, split on `|` that is not escaped as `\|`.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim();
    let row = row.strip_prefix('|').unwrap_or(row);
    let row = row.strip_suffix('|').unwrap_or(row);
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut prev = '\0';
    for c in row.chars() {
        if c == '|' && prev != '\\' {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
        prev = c;
    }
    out.push(cur.trim().to_string());
    out
}

fn is_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('.')
        && !p.ends_with('.')
        && !p.contains("..")
        && p.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.*[]".contains(c))
}

/// The entries of docs/config.md, and every violation of the convention (with its line).
fn doc_entries(text: &str) -> (Vec<Entry>, Vec<String>) {
    let mut entries = Vec::new();
    let mut problems = Vec::new();
    // The root of the next (or current) field table, and the line of its marker.
    let mut root: Option<(String, usize)> = None;
    let mut rows_seen = 0usize;
    let mut in_fence = false;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let t = line.trim();
        if in_fence {
            in_fence = !t.starts_with("```");
            continue;
        }
        if rows_seen > 0 && !t.starts_with('|') {
            // The field table ended.
            root = None;
            rows_seen = 0;
        }
        if t.starts_with("```") {
            in_fence = true;
            continue;
        }
        if let Some(m) = t.strip_prefix("<!-- fields") {
            if let Some((_, at)) = &root {
                problems.push(format!(
                    "docs/config.md:{n}: a `<!-- fields -->` marker, but the one at line {at} has no table yet"
                ));
            }
            let Some(m) = m.strip_suffix("-->") else {
                problems.push(format!(
                    "docs/config.md:{n}: write a marker on one line: `<!-- fields: ROOT -->`"
                ));
                continue;
            };
            let r = m.trim().trim_start_matches(':').trim().to_string();
            if !r.is_empty() && !is_path(&r) {
                problems.push(format!(
                    "docs/config.md:{n}: `{r}` is not a field path (use e.g. `backends.*` or `routes[].flow.*`)"
                ));
            }
            root = Some((r, n));
            rows_seen = 0;
            continue;
        }
        if t.starts_with('#')
            && let Some((_, at)) = root.take()
        {
            problems.push(format!(
                "docs/config.md:{at}: a `<!-- fields -->` marker without a table before the next heading"
            ));
        }
        let Some((r, _)) = &root else { continue };
        if !t.starts_with('|') {
            continue;
        }
        rows_seen += 1;
        let c = cells(t);
        // Header row, and the `|---|---|` separator.
        if rows_seen == 1 || c.iter().all(|c| c.chars().all(|ch| "-: ".contains(ch))) {
            continue;
        }
        let first = &c[0];
        let rel = first
            .strip_prefix('`')
            .and_then(|f| f.strip_suffix('`'))
            .filter(|f| is_path(f));
        let Some(rel) = rel else {
            problems.push(format!(
                "docs/config.md:{n}: the first cell of a field-table row must be one backticked field path, is `{first}`"
            ));
            continue;
        };
        if c.len() < 3 || c.iter().take(3).any(|c| c.is_empty()) {
            problems.push(format!(
                "docs/config.md:{n}: `{rel}` needs three non-empty cells: field, default, meaning"
            ));
        }
        let path = if r.is_empty() {
            rel.to_string()
        } else {
            format!("{r}.{rel}")
        };
        entries.push(Entry { path, line: n });
    }
    if let Some((_, at)) = root.filter(|_| rows_seen == 0) {
        problems.push(format!(
            "docs/config.md:{at}: a `<!-- fields -->` marker without a table"
        ));
    }
    (entries, problems)
}

#[test]
fn config_reference_is_complete_and_exact() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("docs/config.md")).unwrap();
    let schema = schema_paths(&fanout_proxy::registry::schema());

    // The walk itself must see nested objects, maps and lists, or this test would prove nothing.
    for known in [
        "listen",
        "server.admission.codel.target",
        "backends.*.retry.budget.ratio",
        "routes[].flow.*.http.key",
        "reference.*.refresh",
    ] {
        assert!(
            schema.contains(known),
            "schema walk missed `{known}`: {schema:#?}"
        );
    }

    let (entries, mut problems) = doc_entries(&text);
    let mut documented: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for e in &entries {
        documented.entry(&e.path).or_default().push(e.line);
    }
    for (path, lines) in &documented {
        if lines.len() > 1 {
            problems.push(format!(
                "`{path}` has {} entries (lines {lines:?}); keep one",
                lines.len()
            ));
        }
    }
    let missing: Vec<&String> = schema
        .iter()
        .filter(|p| !documented.contains_key(p.as_str()))
        .collect();
    let unknown: Vec<&Entry> = entries
        .iter()
        .filter(|e| !schema.contains(&e.path))
        .collect();

    let mut report = String::new();
    if !missing.is_empty() {
        report.push_str(
            "\nIn the config schema but NOT documented in docs/config.md (add a row to the field \
             table of its section; the path is the section's `<!-- fields: ROOT -->` + the row's \
             first cell):\n",
        );
        for p in &missing {
            report.push_str(&format!("  {p}\n"));
        }
    }
    if !unknown.is_empty() {
        report.push_str(
            "\nDocumented in docs/config.md but NOT in the config schema (remove the row or fix \
             its path):\n",
        );
        for e in &unknown {
            report.push_str(&format!("  docs/config.md:{}: {}\n", e.line, e.path));
        }
    }
    if !problems.is_empty() {
        report.push_str(
            "\nField tables that break the convention (see the top of docs/config.md):\n",
        );
        for p in &problems {
            report.push_str(&format!("  {p}\n"));
        }
    }
    assert!(
        report.is_empty(),
        "docs/config.md and the config schema disagree ({} schema fields, {} entries):\n{report}",
        schema.len(),
        entries.len()
    );
}

#[test]
fn convention_parser_reads_roots_maps_and_lists() {
    let doc = "\
<!-- fields: -->
| field | default | meaning |
|---|---|---|
| `listen` | `127.0.0.1:8080` | where |

## `backends`

<!-- fields: backends.* -->

| field | default | meaning |
|---|---|---|
| `retry.attempts` | `2` | a \\| b |
| `oops` | | |
| plain | x | y |

```yaml
| `not.a.row` | x | y |
```

<!-- fields: routes[].flow.* -->
| field | default | meaning |
|---|---|---|
| `http.key` | none | lookup |
";
    let (entries, problems) = doc_entries(doc);
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "listen",
            "backends.*.retry.attempts",
            "backends.*.oops",
            "routes[].flow.*.http.key"
        ]
    );
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("`oops` needs three non-empty cells"));
    assert!(problems[1].contains("one backticked field path"));
}

#[test]
fn schema_walk_follows_refs_options_maps_and_lists() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "server": { "$ref": "#/$defs/Server" },
            "backends": { "type": "object", "additionalProperties": { "$ref": "#/$defs/Backend" } },
            "routes": { "type": "array", "items": { "$ref": "#/$defs/Route" } }
        },
        "additionalProperties": false,
        "$defs": {
            "Server": { "type": "object", "properties": { "limit": { "type": "integer" } } },
            "Backend": {
                "type": "object",
                "properties": {
                    "urls": { "type": "array", "items": { "type": "string" } },
                    "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                    "retry": { "anyOf": [{ "$ref": "#/$defs/Retry" }, { "type": "null" }] }
                },
                "additionalProperties": false
            },
            "Retry": { "type": "object", "properties": { "attempts": { "type": "integer" } } },
            "Route": { "type": "object", "properties": { "path": { "type": "string" } } }
        }
    });
    let paths: Vec<String> = schema_paths(&schema).into_iter().collect();
    assert_eq!(
        paths,
        [
            "backends",
            "backends.*.headers",
            "backends.*.retry",
            "backends.*.retry.attempts",
            "backends.*.urls",
            "routes",
            "routes[].path",
            "server",
            "server.limit",
        ]
    );
}
