//! A cheap, iterative pre-scan of expression sources, run before jaq's recursive lexer and
//! parser: hostile sources (megabytes long, nested thousands deep, chains of thousands of
//! operators) are refused with a [`CompileError`] instead of overflowing the stack.

use crate::CompileError;

/// Longest expression source, in bytes.
pub const MAX_SOURCE_BYTES: usize = 64 * 1024;
/// Deepest nesting of `(`, `[`, `{` and string interpolations `\(`.
pub const MAX_NESTING: usize = 256;
/// Largest estimated depth of an expression's syntax tree: operators, keywords, path
/// segments and string parts of every enclosing bracket group, added up.
pub const MAX_SYNTAX_DEPTH: usize = 1000;

const KEYWORDS: &[&str] = &[
    "if", "then", "elif", "else", "end", "reduce", "foreach", "try", "catch", "def", "label", "as",
    "and", "or", "import", "include",
];

enum Frame {
    /// A bracket group (its index in `groups`).
    Group(usize),
    /// A string interpolation `\( … )` (its index in `groups`).
    Interp(usize),
    /// A string literal.
    Str,
}

struct Group {
    parent: Option<usize>,
    /// Operators, keywords, path segments and string parts directly inside the group.
    ops: usize,
}

/// Check the bounds; `Ok(depth)` means jaq's parser and compiler may run on `src`, whose
/// syntax tree is at most about `depth` levels deep.
pub fn check(src: &str) -> Result<usize, CompileError> {
    if src.len() > MAX_SOURCE_BYTES {
        return Err(err(
            format!(
                "expression is {} bytes long; the limit is {MAX_SOURCE_BYTES} bytes",
                src.len()
            ),
            MAX_SOURCE_BYTES,
        ));
    }
    let b = src.as_bytes();
    let mut groups = vec![Group {
        parent: None,
        ops: 0,
    }];
    let mut stack: Vec<Frame> = Vec::new();
    let cur = |stack: &[Frame]| {
        stack
            .iter()
            .rev()
            .find_map(|f| match f {
                Frame::Group(g) | Frame::Interp(g) => Some(*g),
                Frame::Str => None,
            })
            .unwrap_or(0)
    };
    let mut nesting = 0usize;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if matches!(stack.last(), Some(Frame::Str)) {
            match c {
                b'"' => {
                    stack.pop();
                }
                b'\\' if b.get(i + 1) == Some(&b'(') => {
                    nesting += 1;
                    if nesting > MAX_NESTING {
                        return Err(too_nested(i));
                    }
                    // an interpolation adds two parts to the string's sum
                    let parent = cur(&stack);
                    groups[parent].ops += 2;
                    groups.push(Group {
                        parent: Some(parent),
                        ops: 0,
                    });
                    stack.push(Frame::Interp(groups.len() - 1));
                    i += 1;
                }
                b'\\' => i += 1,
                _ => {}
            }
            i += 1;
            continue;
        }
        match c {
            b'"' => {
                let g = cur(&stack);
                groups[g].ops += 1;
                stack.push(Frame::Str);
            }
            b'#' => {
                // a comment runs to the end of a line that does not end with an odd number
                // of backslashes
                loop {
                    let end = b[i..].iter().position(|&c| c == b'\n').map(|p| i + p);
                    let line_end = end.unwrap_or(b.len());
                    let line = &b[i..line_end];
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    let slashes = line.iter().rev().take_while(|&&c| c == b'\\').count();
                    i = line_end;
                    if end.is_none() || slashes % 2 == 0 {
                        break;
                    }
                    i += 1;
                }
                continue;
            }
            b'(' | b'[' | b'{' => {
                nesting += 1;
                if nesting > MAX_NESTING {
                    return Err(too_nested(i));
                }
                let parent = cur(&stack);
                groups.push(Group {
                    parent: Some(parent),
                    ops: 0,
                });
                stack.push(Frame::Group(groups.len() - 1));
            }
            b')' | b']' | b'}' => {
                if matches!(stack.last(), Some(Frame::Group(_) | Frame::Interp(_))) {
                    nesting -= 1;
                    stack.pop();
                }
            }
            b'|' | b',' | b'+' | b'-' | b'*' | b'/' | b'%' | b'=' | b'<' | b'>' | b'!' | b'?'
            | b';' | b':' | b'.' => {
                let g = cur(&stack);
                groups[g].ops += 1;
            }
            b'$' | b'@' => {
                // a variable or format name: not an operator
                i += 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                continue;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let word = &src[start..i];
                if KEYWORDS.contains(&word) {
                    let g = cur(&stack);
                    groups[g].ops += 1;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    // depth estimate of a group: that of its parent plus all operators of the parent
    let mut depth = vec![0usize; groups.len()];
    let mut max = 0;
    for g in 0..groups.len() {
        let base = match groups[g].parent {
            Some(p) => depth[p] + groups[p].ops + 1,
            None => 0,
        };
        depth[g] = base;
        max = max.max(base + groups[g].ops);
    }
    if max > MAX_SYNTAX_DEPTH {
        return Err(err(
            format!(
                "expression is too complex: its syntax tree could be {max} levels deep \
                 (operators, path segments and keywords of nested groups add up); \
                 the limit is {MAX_SYNTAX_DEPTH}"
            ),
            0,
        ));
    }
    Ok(max + nesting_max(&groups))
}

/// The number of groups on the longest chain of nested groups.
fn nesting_max(groups: &[Group]) -> usize {
    let mut level = vec![0usize; groups.len()];
    let mut max = 0;
    for g in 0..groups.len() {
        level[g] = groups[g].parent.map_or(0, |p| level[p] + 1);
        max = max.max(level[g]);
    }
    max
}

fn too_nested(offset: usize) -> CompileError {
    err(
        format!("expression is nested too deeply: more than {MAX_NESTING} levels of brackets"),
        offset,
    )
}

fn err(message: String, offset: usize) -> CompileError {
    CompileError {
        message,
        offset,
        hint: Some("split the expression, or move work into several steps".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_expressions_pass() {
        for src in [
            r#"{total: $search.total, items: [$search.items[] | select(.price > 100) | {id, name}]}"#,
            r#""/x/\($b.id)?q=\($request.query.q)" # comment (["#,
            "reduce .[] as $x (0; . + $x) | if . > 1 then \"a\" elif . then 1 else null end",
            "def f(g): [g]; f(.a.b.c[0])",
        ] {
            check(src).unwrap();
        }
    }

    #[test]
    fn bounds() {
        let deep = format!("{}1{}", "(".repeat(300), ")".repeat(300));
        assert!(check(&deep).unwrap_err().message.contains("nested"));
        let chain = vec!["1"; 1200].join("+");
        assert!(check(&chain).unwrap_err().message.contains("complex"));
        let ok_chain = vec!["1"; 900].join("+");
        check(&ok_chain).unwrap();
        let interp = format!("\"{}\"", r"\(1)".repeat(600));
        assert!(check(&interp).is_err());
        let nested_str = format!("{}1{}", "\"\\(".repeat(300), ")\"".repeat(300));
        assert!(check(&nested_str).unwrap_err().message.contains("nested"));
        let long = "1".repeat(MAX_SOURCE_BYTES + 1);
        assert!(check(&long).unwrap_err().message.contains("65536"));
    }
}
