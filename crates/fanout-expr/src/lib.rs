//! Expressions of fanout: jq programs (via jaq) compiled once at config load, evaluated per request.
//!
//! Every expression in a config (conditions, request building, result mapping, the response) is an
//! [`Expr`]. Expressions read named inputs as jq *global variables* (`$request`, `$search`, `$item`,
//! …); the caller declares which names exist when compiling, and [`Expr::vars`] tells which of them
//! an expression reads — the flow compiler infers step dependencies from that.
//!
//! Two evaluation strategies, chosen at compile time:
//! - **native** ([`native`]): paths (`$name.a.b[0]`, `.a`), literals, string interpolation, object
//!   and array construction and `//` over those are evaluated directly over the value, with jq's
//!   semantics (missing key → `null`, indexing a number → error);
//! - **jaq**: everything else runs on the jaq interpreter with the standard library.
//!
//! Values are [`Val`] (jaq's JSON value, `Arc`-shared, cheap to clone). [`json`] converts between
//! JSON bytes and `Val` (one parse per backend answer, a hand-written writer for responses).

pub mod json;
mod native;
pub mod request;

use jaq_core::load::{self, lex::StrPart, lex::Tok, lex::Token};
use jaq_core::{Compiler, Ctx, Vars, data::JustLut};
use std::fmt;
use std::sync::Arc;

pub use jaq_json::{Map, Val};

type JaqFilter = jaq_core::Filter<JustLut<Val>>;

/// An expression failed to compile. `offset` is a byte offset into the source where known.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct CompileError {
    /// What is wrong, in words.
    pub message: String,
    /// Byte offset of the offending token in the expression source.
    pub offset: usize,
    /// A suggestion for the user, when there is one.
    pub hint: Option<String>,
}

/// An expression failed at run time (a jq error, or no output).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub String);

#[derive(Clone)]
enum Kind {
    /// Evaluated without the interpreter.
    Native(native::Native),
    /// Anything else; `vars` are the scope indices passed as jaq globals, in compile order.
    Jaq { filter: Arc<JaqFilter> },
}

/// A compiled expression. Cheap to clone (shares the compiled program).
#[derive(Clone)]
pub struct Expr {
    src: Arc<str>,
    kind: Kind,
    /// Indices into the compile-time scope of the variables this expression reads (sorted, unique).
    vars: Vec<usize>,
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expr({:?})", self.src)
    }
}

impl Expr {
    /// Compile `src`. `scope` lists the variable names that may be read (without `$`).
    /// Variables bound inside the expression (`... as $x`) are of course allowed too.
    pub fn compile(src: &str, scope: &[&str]) -> Result<Expr, CompileError> {
        let tokens = load::Lexer::new(src).lex().map_err(|errs| {
            let (expect, at) = errs
                .into_iter()
                .next()
                .map(|(e, at)| (lex_expect(&e, at), span_in(src, at)))
                .unwrap_or_else(|| ("a valid token".into(), 0));
            CompileError {
                message: format!("invalid jq syntax: expected {expect}"),
                offset: at,
                hint: None,
            }
        })?;
        let mut used = Vec::new();
        collect_vars(&tokens, &mut used);
        let mut vars: Vec<usize> = used
            .iter()
            .filter_map(|v| scope.iter().position(|s| *s == &v[1..]))
            .collect();
        vars.sort_unstable();
        vars.dedup();

        if let Some(n) = load::parse(src, |p| p.term()).and_then(|t| native::from_term(&t, scope)) {
            return Ok(Expr {
                src: src.into(),
                kind: Kind::Native(n),
                vars,
            });
        }
        Self::compile_jaq(src, scope, vars)
    }

    /// Compile for the interpreter even when the native evaluator could handle the expression
    /// (for benchmarks and equivalence tests).
    pub fn compile_interpreted(src: &str, scope: &[&str]) -> Result<Expr, CompileError> {
        let e = Self::compile(src, scope)?;
        Self::compile_jaq(src, scope, e.vars)
    }

    fn compile_jaq(src: &str, scope: &[&str], vars: Vec<usize>) -> Result<Expr, CompileError> {
        let globals: Vec<String> = vars.iter().map(|&i| format!("${}", scope[i])).collect();
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs());
        let loader = load::Loader::new(defs);
        let arena = load::Arena::default();
        let modules = loader
            .load(
                &arena,
                load::File {
                    code: src,
                    path: (),
                },
            )
            .map_err(|errs| load_error(src, errs))?;
        let filter = Compiler::default()
            .with_funs(funs)
            .with_global_vars(globals.iter().map(String::as_str))
            .compile(modules)
            .map_err(|errs| {
                let mut first = None;
                for (_file, undef) in errs {
                    for (name, kind) in undef {
                        first.get_or_insert((name, kind));
                    }
                }
                match first {
                    Some((name, kind)) => {
                        let offset = span_in(src, name);
                        let is_var = name.starts_with('$');
                        let known: Vec<String> = scope.iter().map(|s| format!("${s}")).collect();
                        CompileError {
                            message: format!("undefined {} `{name}`", kind.as_str()),
                            offset,
                            hint: Some(if is_var {
                                format!("known names here: {}", known.join(", "))
                            } else {
                                "check the spelling of the function and its number of arguments"
                                    .into()
                            }),
                        }
                    }
                    None => CompileError {
                        message: "expression does not compile".into(),
                        offset: 0,
                        hint: None,
                    },
                }
            })?;
        Ok(Expr {
            src: src.into(),
            kind: Kind::Jaq {
                filter: Arc::new(filter),
            },
            vars,
        })
    }

    /// The source text.
    pub fn source(&self) -> &str {
        &self.src
    }

    /// Indices (into the compile-time scope) of the variables this expression reads.
    pub fn vars(&self) -> &[usize] {
        &self.vars
    }

    /// Whether this expression is evaluated natively (no interpreter).
    pub fn is_native(&self) -> bool {
        matches!(self.kind, Kind::Native(_))
    }

    /// Whether this expression is a plain path such as `$found.ids` (the cheapest native case).
    pub fn is_path(&self) -> bool {
        matches!(&self.kind, Kind::Native(n) if n.is_path())
    }

    /// Evaluate to the first output. `lookup(i)` returns the value of scope variable `i`.
    pub fn eval(&self, input: &Val, lookup: impl Fn(usize) -> Val) -> Result<Val, EvalError> {
        match &self.kind {
            Kind::Native(n) => n.eval(input, &lookup),
            Kind::Jaq { filter } => {
                let vars = Vars::new(self.vars.iter().map(|&i| lookup(i)));
                let ctx = Ctx::<JustLut<Val>>::new(&filter.lut, vars);
                let mut outs = filter.id.run((ctx, input.clone()));
                match outs.next() {
                    Some(Ok(v)) => Ok(v),
                    Some(Err(e)) => Err(EvalError(exn_message(e))),
                    None => Err(EvalError(format!(
                        "expression `{}` produced no value",
                        self.src
                    ))),
                }
            }
        }
    }

    /// Evaluate and return every output (jq streams), e.g. for `.items[]`.
    pub fn eval_all(
        &self,
        input: &Val,
        lookup: impl Fn(usize) -> Val,
    ) -> Result<Vec<Val>, EvalError> {
        match &self.kind {
            Kind::Native(_) => self.eval(input, lookup).map(|v| vec![v]),
            Kind::Jaq { filter } => {
                let vars = Vars::new(self.vars.iter().map(|&i| lookup(i)));
                let ctx = Ctx::<JustLut<Val>>::new(&filter.lut, vars);
                filter
                    .id
                    .run((ctx, input.clone()))
                    .map(|r| r.map_err(|e| EvalError(exn_message(e))))
                    .collect()
            }
        }
    }
}

fn exn_message(e: jaq_core::Exn<Val>) -> String {
    // Never use `jaq_core::unwrap_valr`: it exits the process on `halt`.
    match e.get_err() {
        Ok(err) => {
            let s = err.to_string();
            s.strip_prefix("error: ").map(str::to_string).unwrap_or(s)
        }
        Err(e) => match e.get_halt() {
            Ok(code) => format!("expression called halt (exit code {code}); halt is not allowed"),
            Err(_) => "expression broke out of its control flow".into(),
        },
    }
}

fn span_in(whole: &str, part: &str) -> usize {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    if p >= w && p <= w + whole.len() {
        p - w
    } else {
        0
    }
}

fn load_error(src: &str, errs: load::Errors<&str, ()>) -> CompileError {
    for (_file, err) in errs {
        match err {
            load::Error::Lex(es) => {
                if let Some((expect, at)) = es.into_iter().next() {
                    return CompileError {
                        message: format!("invalid jq syntax: expected {}", lex_expect(&expect, at)),
                        offset: span_in(src, at),
                        hint: None,
                    };
                }
            }
            load::Error::Parse(es) => {
                if let Some((expect, found)) = es.into_iter().next() {
                    let found_txt = if found.is_empty() {
                        "end of expression".to_string()
                    } else {
                        format!("`{}`", found.chars().take(20).collect::<String>())
                    };
                    return CompileError {
                        message: format!(
                            "invalid jq syntax: expected {}, found {found_txt}",
                            expect.as_str()
                        ),
                        offset: if found.is_empty() {
                            src.len()
                        } else {
                            span_in(src, found)
                        },
                        hint: None,
                    };
                }
            }
            load::Error::Io(es) => {
                if let Some((path, msg)) = es.into_iter().next() {
                    return CompileError {
                        message: format!("cannot import `{path}`: {msg}"),
                        offset: span_in(src, path),
                        hint: Some("modules are not available in fanout expressions".into()),
                    };
                }
            }
        }
    }
    CompileError {
        message: "invalid jq syntax".into(),
        offset: 0,
        hint: None,
    }
}

fn lex_expect(e: &load::lex::Expect<&str>, _at: &str) -> String {
    use load::lex::Expect as E;
    match e {
        E::Digit => "a digit".into(),
        E::Ident => "an identifier".into(),
        E::Delim(d) => format!(
            "a closing delimiter for `{}`",
            d.chars().next().unwrap_or('(')
        ),
        E::Escape => "a valid escape sequence".into(),
        E::Unicode => "a valid unicode escape".into(),
        E::Token => "a valid token".into(),
        _ => "a valid token".into(),
    }
}

/// Collect `$name` tokens, including inside string interpolations.
fn collect_vars<'s>(tokens: &[Token<&'s str>], out: &mut Vec<&'s str>) {
    for Token(s, tok) in tokens {
        match tok {
            Tok::Var => out.push(s),
            Tok::Block(inner) => collect_vars(inner, out),
            Tok::Str(parts) => {
                for p in parts {
                    if let StrPart::Term(t) = p {
                        collect_vars(std::slice::from_ref(t), out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether a value counts as true in jq (`null` and `false` are false, everything else true).
pub fn truthy(v: &Val) -> bool {
    !matches!(v, Val::Null | Val::Bool(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Val {
        json::parse(s.as_bytes()).unwrap()
    }
    fn run(src: &str, scope: &[&str], vals: &[Val], input: &Val) -> Result<String, String> {
        let e = Expr::compile(src, scope).map_err(|e| e.message)?;
        e.eval(input, |i| vals[i].clone())
            .map(|x| json::to_string(&x))
            .map_err(|e| e.0)
    }

    #[test]
    fn native_and_jaq_agree() {
        let scope = ["request", "search", "item"];
        let vals = [
            v(r#"{"q":"x y","n":null}"#),
            v(r#"{"items":[{"id":1,"name":"a"},{"id":2}],"n":3,"f":2.5,"t":true,"s":"str"}"#),
            v(r#"{"id":7,"name":"seven"}"#),
        ];
        let input = v(r#"{"id":9,"name":"nine","deep":{"x":[1,2]}}"#);
        let cases = [
            "$search.items[1].id",
            "$search.items[-1].id",
            "$search.items[5]",
            "$search.missing.deeper",
            "$search.n",
            "$request",
            ".",
            ".deep.x[1]",
            ".[\"name\"]",
            "$search[\"items\"][0]",
            "42",
            "-1.5",
            "\"plain\"",
            "\"esc\\n\\t\\u00e9\"",
            "\"/items/\\($item.id)\"",
            "\"n=\\($search.n) f=\\($search.f) t=\\($search.t) o=\\($search.items[0]) s=\\($search.s) null=\\($request.n)\"",
            "{total: $search.n, first: $search.items[0].name, lit: 1}",
            "{id, name}",
            "{$item}",
            "{\"quoted key\": .id, b: {c: [$search.n, .name, []]}}",
            "[$search.n, $item.id, \"x\"]",
            "[]",
            "{}",
            "$request.n // []",
            "$search.n // []",
            "$search.n.x // \"fallback\"",
            "$request.n // $request.missing // 0",
        ];
        for src in cases {
            let native = Expr::compile(src, &scope).unwrap();
            assert!(native.is_native(), "{src} should be native");
            let jaq = Expr::compile_interpreted(src, &scope).unwrap();
            assert!(!jaq.is_native());
            let a = native.eval(&input, |i| vals[i].clone());
            let b = jaq.eval(&input, |i| vals[i].clone());
            assert_eq!(
                a.map(|x| json::to_string(&x)).map_err(|_| ()),
                b.map(|x| json::to_string(&x)).map_err(|_| ()),
                "{src}"
            );
        }
        for src in ["$search.n.x", ".id.x", "$search.items.x"] {
            let native = Expr::compile(src, &scope).unwrap();
            assert!(native.is_native());
            assert!(native.eval(&input, |i| vals[i].clone()).is_err(), "{src}");
            let jaq = Expr::compile_interpreted(src, &scope).unwrap();
            assert!(jaq.eval(&input, |i| vals[i].clone()).is_err(), "{src}");
        }
        for src in [
            "$search.items | length",
            "[$search.items[].id]",
            "\"\\($item.id | tostring)\"",
            ".[0:1]",
            "$search.n?",
            "@uri \"\\(.)\"",
        ] {
            assert!(
                !Expr::compile(src, &scope).unwrap().is_native(),
                "{src} is for the interpreter"
            );
        }
    }

    #[test]
    fn vars_are_inferred_including_interpolation() {
        let scope = ["request", "a", "b", "c"];
        let e = Expr::compile(r#""/x/\($b.id)?q=\($request.query.q)""#, &scope).unwrap();
        assert_eq!(e.vars(), &[0, 2]);
        let e = Expr::compile("[$a.items[] | .id] | map(. + 1)", &scope).unwrap();
        assert_eq!(e.vars(), &[1]);
        let e = Expr::compile(".[] as $c | $c", &scope).unwrap();
        assert_eq!(e.vars(), &[3], "over-approximates shadowed names");
    }

    #[test]
    fn errors_point_at_the_cause() {
        let err = Expr::compile("$nope.x", &["request"]).unwrap_err();
        assert!(err.message.contains("$nope"), "{}", err.message);
        assert_eq!(err.offset, 0);
        let err = Expr::compile("{a: (1 + }", &["request"]).unwrap_err();
        assert!(err.message.contains("invalid jq syntax"), "{}", err.message);
        let err = Expr::compile("nosuchfn(1)", &[]).unwrap_err();
        assert!(err.message.contains("nosuchfn"), "{}", err.message);
    }

    #[test]
    fn interpreter_builds_objects() {
        let out = run(
            "{total: $s.total, ids: [$s.items[].id]}",
            &["s"],
            &[v(r#"{"total":2,"items":[{"id":"a"},{"id":"b"}]}"#)],
            &Val::Null,
        )
        .unwrap();
        assert_eq!(out, r#"{"total":2,"ids":["a","b"]}"#);
        assert_eq!(
            run(". + 1", &[], &[], &v("41")).unwrap(),
            "42",
            "input is `.`"
        );
        assert!(run("empty", &[], &[], &Val::Null).is_err());
    }
}
