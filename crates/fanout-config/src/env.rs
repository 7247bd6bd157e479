//! `${NAME}` / `${NAME:-default}` substitution in config text, before YAML parsing.
//! `$${` writes a literal `${`. A missing variable without a default is an error at its position.

use crate::{ConfigError, Pos};

/// Substitute variables in `text` using `lookup`.
pub fn substitute(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    if !text.contains("${") {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        if i > 0 && rest.as_bytes()[i - 1] == b'$' {
            // `$${` → literal `${`
            out.push_str(&rest[..i - 1]);
            out.push_str("${");
            rest = &rest[i + 2..];
            continue;
        }
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let pos = position(text, text.len() - rest.len() + i);
        let end = after.find('}').ok_or_else(|| {
            ConfigError::at(pos, "unterminated `${` in config")
                .hint("write `${NAME}` or `${NAME:-default}`")
        })?;
        let inner = &after[..end];
        let (name, default) = match inner.find(":-") {
            Some(j) => (&inner[..j], Some(&inner[j + 2..])),
            None => (inner, None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(ConfigError::at(
                pos,
                format!("invalid variable name `{name}` in `${{{inner}}}`"),
            )
            .hint("variable names are letters, digits and `_`"));
        }
        match lookup(name).or_else(|| default.map(str::to_string)) {
            Some(v) => out.push_str(&v),
            None => {
                return Err(ConfigError::at(
                    pos,
                    format!("environment variable `{name}` is not set"),
                )
                .hint(format!(
                    "set {name}, or give a default: `${{{name}:-value}}`"
                )));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn position(text: &str, offset: usize) -> Pos {
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map(|n| offset - n).unwrap_or(offset + 1);
    Pos {
        line: line as u32,
        col: col as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn substitutes() {
        let look = |n: &str| (n == "A").then(|| "1".to_string());
        assert_eq!(substitute("x: ${A}", &look).unwrap(), "x: 1");
        assert_eq!(substitute("x: ${B:-z}", &look).unwrap(), "x: z");
        assert_eq!(substitute("x: $${A}", &look).unwrap(), "x: ${A}");
        let e = substitute("a: 1\nx: ${B}", &look).unwrap_err();
        assert_eq!(e.pos, Some(Pos { line: 2, col: 4 }));
    }
}
