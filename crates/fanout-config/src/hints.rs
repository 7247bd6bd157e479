//! Hints that finish the job of an error message: what to do about each YAML error, and
//! "did you mean `x`?" when a misspelt name is close to a known one (the rule is
//! [`fanout_names`]'s, re-exported by this crate as [`crate::closest`] and
//! [`crate::did_you_mean`]).
//!
//! Every YAML error gets a hint ([`yaml_hint`]): specific ones for the parser's usual messages
//! (indentation, tabs, quotes, brackets, unknown fields, …) and a generic one otherwise.

use fanout_names::did_you_mean;

/// Indentation mistakes: the parser notices them at the line after the wrong one.
const INDENTATION: &str = "check the indentation of this line and the one above: keys of one \
     mapping must start in the same column, and a nested value must be indented more than its \
     key; use spaces, not tabs";

/// Specific hints, by a piece of the parser's message (lowercase); the first match wins.
const HINTS: &[(&[&str], &str)] = &[
    (
        &["a tab", "tabs ", "tab cannot"],
        "YAML indentation must be spaces, not tabs: replace the tabs on this line with spaces",
    ),
    (
        &["mapping values are not allowed in this context"],
        "a `key:` appears where it cannot start: check the indentation of this line and the one \
         above (a nested key goes on its own line, indented more than its parent), and quote \
         values that contain `: `",
    ),
    (
        &[
            "did not find expected '-' indicator",
            "block sequence entries are not allowed",
        ],
        "items of one list (`- …`) must start in the same column, and a list under a key must be \
         indented consistently: check the indentation of this line and the one above; use \
         spaces, not tabs",
    ),
    (
        &["multiline quoted scalar"],
        "a quoted value runs on over this line: close the quote where the value ends (an \
         unclosed quote swallows the lines after it), or indent the continuation lines",
    ),
    (
        &[
            "did not find expected key",
            "mapping keys are not allowed in this context",
            "invalid indentation",
            "indentation error",
            "incorrect indentation",
        ],
        INDENTATION,
    ),
    (
        &["simple key expected ':'"],
        "each line of a mapping is `key: value`: add the missing `:`, or check the indentation \
         of this line and the one above",
    ),
    (
        &["unclosed quote"],
        "a quoted value is not closed: add the closing quote; inside '…' write '' for a single \
         quote, inside \"…\" write \\\"",
    ),
    (
        &[
            "while parsing a quoted scalar",
            "while scanning a quoted scalar",
        ],
        "inside double quotes `\\` starts a YAML escape: put jq expressions such as \
         `\"\\(.x)\"` in single quotes ('…') or a block scalar (`|`), or write `\\\\`",
    ),
    (
        &["unclosed bracket"],
        "a `{` or `[` opened here is not closed: add the closing bracket, or quote the value if \
         the bracket belongs to it",
    ),
    (
        &[
            "while parsing a flow mapping",
            "while parsing a flow sequence",
            "flow construct",
            "while parsing an implicit flow mapping",
        ],
        "inside `{ … }` and `[ … ]` separate the items with `,`, and quote values that contain \
         `:`, `,`, `#`, brackets or braces",
    ),
    (
        &["invalid trailing content after"],
        "only a comment may follow the closing quote on the same line: quote the whole value",
    ),
    (
        &["unexpected character", "did not find expected node content"],
        "a plain value cannot start with this character (`@`, `` ` ``, `%`, `!`, `&`, `*`, `|`, \
         `>` mean something in YAML): quote the value",
    ),
    (
        &["unknown anchor"],
        "`*name` refers to an anchor that is not defined above it: define it with `&name`, or \
         quote the value if the `*` belongs to it",
    ),
    (
        &["multiple yaml documents"],
        "a config is a single YAML document: remove the `---` line",
    ),
    (
        &["unexpected end", "unexpected eof"],
        "the document ends earlier than expected: check for an unclosed quote or bracket or a \
         truncated file; the top level of a config is a mapping (`routes:`, `backends:`, …)",
    ),
    (
        &["duplicate mapping key"],
        "each key may appear once in a mapping; remove one of them",
    ),
    (
        &["missing field"],
        "add the field; see docs/config.md (if it is there, check its indentation: it must \
         start in the same column as the other keys of its mapping)",
    ),
    (
        &[
            "too large or too complex",
            "budget breached",
            "alias replay",
        ],
        "the document is too large or nests too deeply (aliases `*name` count each time they \
         are used): simplify it",
    ),
    (&["utf-8"], "save the file as UTF-8 text"),
    (
        &["must be quoted", "requires quoting"],
        "quote the value ('…')",
    ),
];

/// What to do about a YAML error whose message (without position) is `message`.
pub(crate) fn yaml_hint(message: &str) -> String {
    let lower = message.to_lowercase();
    if lower.starts_with("unknown field") {
        let schema = "`fanout schema` lists every field";
        return match suggestion_from_list(message) {
            Some(s) => format!("{s} ({schema})"),
            None => format!("remove the field or fix its spelling; {schema}"),
        };
    }
    if lower.starts_with("unknown variant") {
        return match suggestion_from_list(message) {
            Some(s) => s,
            None => "use one of the values listed; see docs/config.md".into(),
        };
    }
    for (needles, hint) in HINTS {
        if needles.iter().any(|n| lower.contains(n)) {
            return (*hint).to_string();
        }
    }
    if lower.starts_with("invalid") || lower.starts_with("expected") || lower.contains("expected a")
    {
        return "check the value's type against docs/config.md".into();
    }
    "check this line and the one above against docs/config.md (indentation, quotes, brackets); \
     `fanout schema` lists every field"
        .into()
}

/// Rewrite parser messages meant for programmers into ones meant for the config's author.
pub(crate) fn polish_yaml_message(message: String) -> String {
    if message.starts_with("multiple YAML documents detected") {
        return "multiple YAML documents in one file".into();
    }
    message
}

/// For serde's "unknown field `x`, expected one of a, b" (also with backquoted names, and
/// "expected `a` or `b`"): "did you mean `a`?" when `x` is close to one of the names.
fn suggestion_from_list(message: &str) -> Option<String> {
    let rest = message.split_once('`')?.1;
    let (name, rest) = rest.split_once('`')?;
    let list = rest
        .split_once("expected one of ")
        .or_else(|| rest.split_once("expected "))?
        .1;
    let candidates = list
        .split(", ")
        .flat_map(|s| s.split(" or "))
        .map(|s| s.trim().trim_matches('`'))
        .filter(|s| !s.is_empty());
    did_you_mean(name, candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_field_suggests_from_serde_list() {
        let m = "unknown field `respnd`, expected one of path, method, deadline, flow, respond";
        assert_eq!(
            yaml_hint(m),
            "did you mean `respond`? (`fanout schema` lists every field)"
        );
        let m = "unknown field `bdoy`, expected one of `body`, `status`, `headers`";
        assert!(yaml_hint(m).starts_with("did you mean `body`?"));
        let m = "unknown field `sttus`, expected `body` or `status`";
        assert!(yaml_hint(m).starts_with("did you mean `status`?"));
        let m = "unknown field `zzz`, expected one of path, method";
        assert_eq!(
            yaml_hint(m),
            "remove the field or fix its spelling; `fanout schema` lists every field"
        );
        let m = "unknown field `x`, there are no fields";
        assert!(yaml_hint(m).starts_with("remove the field"));
        let m = "unknown variant `lru2`, expected one of lru, fifo";
        assert_eq!(yaml_hint(m), "did you mean `lru`?");
    }

    #[test]
    fn parser_messages_get_specific_hints() {
        let cases = [
            (
                "while parsing a block mapping, did not find expected key",
                "check the indentation",
            ),
            ("mapping values are not allowed in this context", "a `key:`"),
            (
                "while parsing a block collection, did not find expected '-' indicator",
                "items of one list",
            ),
            (
                "tabs disallowed within this context (block indentation)",
                "not tabs",
            ),
            ("while scanning a plain scalar, found a tab", "not tabs"),
            ("unclosed quote", "closing quote"),
            ("unclosed bracket '{'", "closing bracket"),
            (
                "while parsing a flow mapping, did not find expected ',' or '}'",
                "separate the items",
            ),
            (
                "while parsing a quoted scalar, found unknown escape character",
                "single quotes",
            ),
            (
                "invalid trailing content after single-quoted scalar",
                "quote the whole value",
            ),
            ("unexpected character: `@'", "quote the value"),
            ("simple key expected ':'", "missing `:`"),
            (
                "invalid indentation in multiline quoted scalar",
                "close the quote",
            ),
            ("unexpected end of input", "unclosed quote or bracket"),
            ("multiple YAML documents in one file", "`---`"),
            ("alias references unknown anchor", "&name"),
            ("missing field `respond`", "indentation"),
            ("duplicate mapping key: listen", "remove one"),
            ("invalid duration `soon`", "type"),
            ("expected string scalar", "type"),
        ];
        for (message, words) in cases {
            let hint = yaml_hint(message);
            assert!(hint.contains(words), "{message}: {hint}");
        }
    }

    #[test]
    fn every_message_gets_a_hint() {
        for message in ["", "something nobody has seen before", "\u{1F600}"] {
            assert!(yaml_hint(message).contains("docs/config.md"), "{message}");
        }
    }

    #[test]
    fn real_yaml_errors_have_hints() {
        let cases = [
            (
                "routes:\n  - path: /a\n    respond:\n      body: '1'\n     status: 200\n",
                "5:6",
                "check the indentation of this line and the one above",
            ),
            (
                "routes:\n  - path: /a\n    respond:\n\tbody: '1'\n",
                "4:2",
                "not tabs",
            ),
            (
                "routes:\n  - path: /a\n    respnd: { body: '1' }\n",
                "3:5",
                "did you mean `respond`?",
            ),
            (
                "routes:\n  - path: /a\n    respond:\n      body: x: y\n",
                "4:14",
                "a `key:` appears",
            ),
            (
                "routes: []\n---\nroutes: []\n",
                "3:1",
                "remove the `---` line",
            ),
        ];
        for (yaml, pos, words) in cases {
            let r: Result<crate::Config, _> = crate::from_yaml("f.yaml", yaml, &|_| None);
            let e = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.starts_with(&format!("f.yaml:{pos}: ")), "{e}");
            assert!(e.contains("\n  hint: "), "{e}");
            assert!(e.contains(words), "{e}");
        }
    }
}
