//! Hints for undefined names in expressions: "did you mean `length`?", "`sub` takes 2 or 3
//! arguments".
//!
//! The closeness rule is [`fanout_names::closest`], the one every unknown name in a config uses.

use crate::Val;
use fanout_names::{closest, did_you_mean};
use jaq_core::data::JustLut;

/// Names and arities of the filters every expression can call (jaq core, std and json),
/// without the internal ones (`_name`, `name_`).
fn filters() -> Vec<(&'static str, usize)> {
    type D = JustLut<Val>;
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs())
        .map(|d| (d.name, d.args.len()));
    let funs = jaq_core::funs::<D>()
        .chain(jaq_std::funs::<D>())
        .chain(jaq_json::funs::<D>())
        .map(|(name, args, _)| (name, args.len()));
    let mut all: Vec<(&'static str, usize)> = defs
        .chain(funs)
        .filter(|(n, _)| !n.starts_with('_') && !n.ends_with('_'))
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// "`sub` takes 2 or 3 arguments" (`None` if there is no filter `name`).
fn takes(all: &[(&str, usize)], name: &str) -> Option<String> {
    let arities: Vec<String> = all
        .iter()
        .filter(|(n, _)| *n == name)
        .map(|(_, a)| a.to_string())
        .collect();
    let (count, plural) = match arities.as_slice() {
        [] => return None,
        [one] => (one.clone(), one != "1"),
        [init @ .., last] => (format!("{} or {last}", init.join(", ")), true),
    };
    let noun = if plural { "arguments" } else { "argument" };
    Some(format!("`{name}` takes {count} {noun}"))
}

/// The hint for an undefined filter `name` called with `arity` arguments.
pub(crate) fn filter_hint(name: &str, arity: usize) -> String {
    let all = filters();
    let exists = |a: usize| all.iter().any(|(n, x)| *n == name && *x == a);
    if !exists(arity)
        && let Some(t) = takes(&all, name)
    {
        let mut hint = format!("{t}, not {arity}");
        if all.iter().any(|(n, a)| *n == name && *a > arity) {
            hint.push_str("; arguments are separated by `;`, not `,`");
        }
        return hint;
    }
    let same_arity = all.iter().filter(|(_, a)| *a == arity).map(|(n, _)| *n);
    if let Some(s) = did_you_mean(name, same_arity) {
        return format!("{s} (jq functions: docs/config.md#expressions)");
    }
    let any = all.iter().map(|(n, _)| *n);
    if let Some(other) = closest(name, any) {
        let t = takes(&all, &other).unwrap_or_default();
        return format!("did you mean `{other}`? ({t})");
    }
    "check the spelling of the function and its number of arguments".into()
}

/// The hint for an undefined variable `name` (with `$`); `scope` are the names that exist
/// (without `$`).
pub(crate) fn var_hint(name: &str, scope: &[&str]) -> String {
    let known: Vec<String> = scope.iter().map(|s| format!("${s}")).collect();
    let list = if known.is_empty() {
        "no variables exist here".to_string()
    } else {
        format!("known names here: {}", known.join(", "))
    };
    match did_you_mean(name, known.iter().map(String::as_str)) {
        Some(s) => format!("{s} ({list})"),
        None => list,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_hints() {
        assert_eq!(
            filter_hint("lenght", 0),
            "did you mean `length`? (jq functions: docs/config.md#expressions)"
        );
        assert!(filter_hint("tostrng", 0).starts_with("did you mean `tostring`?"));
        assert!(filter_hint("slect", 1).starts_with("did you mean `select`?"));
        assert_eq!(
            filter_hint("frobnicate", 1),
            "check the spelling of the function and its number of arguments"
        );
        assert_eq!(
            filter_hint("map", 0),
            "`map` takes 1 argument, not 0; arguments are separated by `;`, not `,`"
        );
        let h = filter_hint("sub", 1);
        assert!(h.starts_with("`sub` takes 2 or 3 arguments, not 1;"), "{h}");
        assert_eq!(
            filter_hint("length", 2),
            "`length` takes 0 arguments, not 2"
        );
        assert_eq!(
            filter_hint("contains", 0).split(';').next(),
            Some("`contains` takes 1 argument, not 0")
        );
        // the same number of arguments first; a close name of another arity says what it takes
        assert_eq!(
            filter_hint("sortby", 0),
            "did you mean `sort`? (jq functions: docs/config.md#expressions)"
        );
        assert_eq!(
            filter_hint("sortby", 1),
            "did you mean `sort_by`? (jq functions: docs/config.md#expressions)"
        );
        assert_eq!(
            filter_hint("sum", 0),
            "did you mean `sub`? (`sub` takes 2 or 3 arguments)"
        );
        assert!(
            !filter_hint("split_on", 2).contains("split_`"),
            "internal names are not suggested"
        );
    }

    #[test]
    fn var_hints() {
        assert_eq!(
            var_hint("$serch", &["request", "search"]),
            "did you mean `$search`? (known names here: $request, $search)"
        );
        assert_eq!(var_hint("$zzz", &["request"]), "known names here: $request");
        assert_eq!(var_hint("$x", &[]), "no variables exist here");
    }
}
