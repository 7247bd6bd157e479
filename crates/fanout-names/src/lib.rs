//! Closest-name suggestions: "did you mean `x`?" when a misspelt name is close to a known one.
//!
//! The one closeness rule of the project, for every unknown name a user can write: config
//! fields and references (`fanout-config`), expression variables and functions (`fanout-expr`),
//! steps, gRPC services and methods. A crate of its own so that each of them can use it without
//! depending on the others.

#![forbid(unsafe_code)]

/// Longest name for which a suggestion is looked for: anything longer is not a typo, and the
/// edit distance is quadratic in the length.
const MAX_NAME_CHARS: usize = 64;

/// "did you mean `x`?" when one of `candidates` is close to `name` (a typo: a few edits
/// relative to the length, a swapped pair of letters, another case, or a clearly shared
/// spelling); `None` when nothing is close. The closest candidate wins; candidates are written
/// as given (pass `$name` to suggest `$name`).
pub fn did_you_mean(
    name: &str,
    candidates: impl IntoIterator<Item = impl AsRef<str>>,
) -> Option<String> {
    closest(name, candidates).map(|c| format!("did you mean `{c}`?"))
}

/// The candidate closest to `name`, if one is close enough (see [`did_you_mean`]).
pub fn closest(
    name: &str,
    candidates: impl IntoIterator<Item = impl AsRef<str>>,
) -> Option<String> {
    let key = name.to_lowercase();
    let key_len = key.chars().count();
    if key_len == 0 || key_len > MAX_NAME_CHARS {
        return None;
    }
    // (edit distance, similarity, candidate): smaller distance first, then higher similarity
    let mut best: Option<(usize, f64, String)> = None;
    for c in candidates {
        let c = c.as_ref();
        if c == name || c.is_empty() {
            continue;
        }
        let cand = c.to_lowercase();
        let cand_len = cand.chars().count();
        if cand_len > MAX_NAME_CHARS {
            continue;
        }
        let edits = strsim::osa_distance(&key, &cand);
        let similarity = strsim::jaro_winkler(&key, &cand);
        let close = edits <= max_edits(key_len.max(cand_len))
            || (similarity >= 0.9 && key_len.min(cand_len) >= 4);
        if !close {
            continue;
        }
        let better = match &best {
            None => true,
            Some((e, s, _)) => edits < *e || (edits == *e && similarity > *s),
        };
        if better {
            best = Some((edits, similarity, c.to_string()));
        }
    }
    best.map(|(_, _, c)| c)
}

/// Edits a name of `len` characters may be off by and still count as a typo of another.
fn max_edits(len: usize) -> usize {
    match len {
        0..=2 => 0,
        3..=5 => 1,
        6..=8 => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let steps = ["vacancies", "search", "profile"];
        assert_eq!(
            did_you_mean("vacancy", steps).as_deref(),
            Some("did you mean `vacancies`?")
        );
        assert_eq!(
            did_you_mean("serach", steps).as_deref(),
            Some("did you mean `search`?")
        );
        assert_eq!(
            did_you_mean("Profile", steps).as_deref(),
            Some("did you mean `profile`?")
        );
        assert_eq!(did_you_mean("user", steps), None);
        assert_eq!(did_you_mean("x", ["y", "z"]), None);
        assert_eq!(did_you_mean("search", steps), None, "not a typo of itself");
        assert_eq!(did_you_mean("anything", Vec::<String>::new()), None);
        assert_eq!(did_you_mean(&"a".repeat(1000), [&"a".repeat(999)]), None);
        // the closest wins
        assert_eq!(
            closest("lenght", ["length", "ltrimstr", "last"]).as_deref(),
            Some("length")
        );
        // a clear shared spelling counts even when many characters are missing
        assert_eq!(
            closest(
                "max_concurrent",
                ["max_concurrency", "queue", "queue_timeout"]
            )
            .as_deref(),
            Some("max_concurrency")
        );
        assert_eq!(
            did_you_mean("$serch", ["$request", "$search"]).as_deref(),
            Some("did you mean `$search`?")
        );
    }
}
