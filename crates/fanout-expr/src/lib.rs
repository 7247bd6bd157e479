//! Expressions of fanout: jq programs (via jaq) compiled once at config load, evaluated per request.
//!
//! Every expression in a config (conditions, request building, result mapping, the response) is an
//! [`Expr`]. Expressions read named inputs as jq *global variables* (`$request`, `$search`, `$item`,
//! …); the caller declares which names exist when compiling, and [`Expr::vars`] tells which of them
//! an expression reads — the flow compiler infers step dependencies from that.
//!
//! Two evaluation strategies, chosen at compile time:
//! - **native** ([`native`]): paths (`$name.a.b[0]`, `.a`), literals, string interpolation, object
//!   and array construction, `//`, arithmetic and comparisons, `and`/`or`, `if`, `x as $v | …`,
//!   definitions without arguments, `[x[]]` and a few builtins are evaluated directly over the
//!   value, with jq's semantics (missing key → `null`, indexing a number → error; the cases it
//!   does not model go to the interpreter);
//! - **jaq**: everything else runs on the jaq interpreter with the standard library.
//!
//! Values are [`Val`] (jaq's JSON value, `Arc`-shared, cheap to clone). [`json`] converts between
//! JSON bytes and `Val` (one parse per backend answer, a hand-written writer for responses).
//!
//! No expression and no data can crash the process or hold a thread without bound: sources are
//! bounded before jaq parses them ([`scan`]), and evaluations run under a [`Budget`] of work,
//! time and value sizes ([`Expr::eval_in`]; `vendor/README.md` describes the jaq fork that
//! enforces it).

#![forbid(unsafe_code)]

mod budget;
pub mod json;
mod native;
pub mod request;
pub mod scan;
mod suggest;

pub use budget::{Budget, EvalErrorKind, EvalLimits, Mode};

use jaq_core::compile::Undefined;
use jaq_core::load::{self, lex::StrPart, lex::Tok, lex::Token};
use jaq_core::{Compiler, Ctx, Vars, data::JustLut};
use std::fmt;
use std::sync::Arc;

pub use jaq_json::{Map, Num, Rc, Val};

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

/// An expression failed at run time: the message, and what kind of failure it is.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub String, pub EvalErrorKind);

impl EvalError {
    /// What kind of failure this is.
    pub fn kind(&self) -> EvalErrorKind {
        self.1
    }

    /// An ordinary failure ([`EvalErrorKind::Failed`]).
    pub(crate) fn failed(msg: impl Into<String>) -> EvalError {
        EvalError(msg.into(), EvalErrorKind::Failed)
    }
}

/// Stack kept for jaq's parser and compiler (see [`Expr::compile`]).
const COMPILE_STACK: usize = 16 << 20;
/// Stack an evaluation needs besides its recursion: the interpreter's red zone and
/// `max_depth`-deep walks over values are added (see [`Expr::stack_need`]).
const EVAL_STACK_BASE: usize = 256 << 10;
/// Stack the interpreter may use per level of an expression's syntax tree.
#[cfg(debug_assertions)]
const STACK_PER_SYNTAX_LEVEL: usize = 8 << 10;
#[cfg(not(debug_assertions))]
const STACK_PER_SYNTAX_LEVEL: usize = 3 << 10;
/// Smallest new stack segment for an evaluation.
const EVAL_STACK_GROW: usize = 4 << 20;

#[derive(Clone)]
enum Kind {
    /// Evaluated without the interpreter; the second field is the interpreted form for the
    /// inputs the native form leaves to it (`x | tonumber` on an odd string).
    Native(native::Native, Option<Arc<JaqFilter>>),
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
    /// Estimated depth of the syntax tree (see [`scan::check`]).
    syntax_depth: usize,
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expr({:?})", self.src)
    }
}

impl Expr {
    /// Compile `src`. `scope` lists the variable names that may be read (without `$`).
    /// Variables bound inside the expression (`... as $x`) are of course allowed too.
    ///
    /// Hostile sources are refused before jaq's recursive parser runs (see [`scan`]), and
    /// parsing and compiling run on a stack of their own, so no source can overflow the stack.
    pub fn compile(src: &str, scope: &[&str]) -> Result<Expr, CompileError> {
        Self::compile_hinting(src, scope, &[])
    }

    /// [`Expr::compile`], with `hidden` names of `scope` left out of the "known names here" hint
    /// of an undefined variable: names that compile but are refused in this place by a later
    /// check (`$item` outside `for_each`).
    pub fn compile_hinting(
        src: &str,
        scope: &[&str],
        hidden: &[&str],
    ) -> Result<Expr, CompileError> {
        let depth = scan::check(src)?;
        stacker::maybe_grow(COMPILE_STACK / 2, COMPILE_STACK, || {
            Self::compile_checked(src, scope, hidden, depth)
        })
    }

    fn compile_checked(
        src: &str,
        scope: &[&str],
        hidden: &[&str],
        depth: usize,
    ) -> Result<Expr, CompileError> {
        let vars = Self::scope_vars(src, scope)?;

        if let Some(n) = load::parse(src, |p| p.term()).and_then(|t| native::from_term(&t, scope)) {
            let fallback = if n.may_fall_back() {
                match Self::compile_jaq(src, scope, hidden, vars.clone(), depth)?.kind {
                    Kind::Jaq { filter } => Some(filter),
                    Kind::Native(..) => None,
                }
            } else {
                None
            };
            return Ok(Expr {
                src: src.into(),
                kind: Kind::Native(n, fallback),
                vars,
                syntax_depth: depth,
            });
        }
        Self::compile_jaq(src, scope, hidden, vars, depth)
    }

    /// The native form of `src` alone, without the interpreted form it falls back to (`None`
    /// when `src` is not in the native subset): for the differential tests, which compare
    /// [`Expr::eval_native_only`] with [`Expr::compile_interpreted`] and need not compile jaq
    /// twice. Its other evaluations would fail where the interpreter should answer.
    #[doc(hidden)]
    pub fn compile_native_only(src: &str, scope: &[&str]) -> Result<Option<Expr>, CompileError> {
        let depth = scan::check(src)?;
        stacker::maybe_grow(COMPILE_STACK / 2, COMPILE_STACK, || {
            let vars = Self::scope_vars(src, scope)?;
            let native = load::parse(src, |p| p.term()).and_then(|t| native::from_term(&t, scope));
            Ok(native.map(|n| Expr {
                src: src.into(),
                kind: Kind::Native(n, None),
                vars,
                syntax_depth: depth,
            }))
        })
    }

    /// Indices into `scope` of the variables `src` reads (sorted, unique); a lexing error is
    /// the compile error.
    fn scope_vars(src: &str, scope: &[&str]) -> Result<Vec<usize>, CompileError> {
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
        Ok(vars)
    }

    /// Compile for the interpreter even when the native evaluator could handle the expression
    /// (for benchmarks and equivalence tests).
    pub fn compile_interpreted(src: &str, scope: &[&str]) -> Result<Expr, CompileError> {
        let depth = scan::check(src)?;
        stacker::maybe_grow(COMPILE_STACK / 2, COMPILE_STACK, || {
            let vars = Self::scope_vars(src, scope)?;
            Self::compile_jaq(src, scope, &[], vars, depth)
        })
    }

    fn compile_jaq(
        src: &str,
        scope: &[&str],
        hidden: &[&str],
        vars: Vec<usize>,
        syntax_depth: usize,
    ) -> Result<Expr, CompileError> {
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
                        let hint = match kind {
                            Undefined::Filter(arity) => suggest::filter_hint(name, arity),
                            _ if name.starts_with('$') => {
                                let shown: Vec<&str> = scope
                                    .iter()
                                    .copied()
                                    .filter(|n| !hidden.contains(n))
                                    .collect();
                                suggest::var_hint(name, &shown)
                            }
                            _ => "check the spelling".into(),
                        };
                        CompileError {
                            message: format!("undefined {} `{name}`", kind.as_str()),
                            offset,
                            hint: Some(hint),
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
            syntax_depth,
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

    /// The parts of `$request` this expression reads (everything when the analysis cannot
    /// narrow it; nothing when it does not read `$request`). Compile-time only: it lexes the
    /// source again.
    pub fn request_use(&self) -> request::RequestUse {
        match load::Lexer::new(&self.src).lex() {
            Ok(tokens) => request::RequestUse::of_tokens(&tokens, "request"),
            Err(_) => request::RequestUse::all(),
        }
    }

    /// Whether this expression is evaluated natively (no interpreter).
    pub fn is_native(&self) -> bool {
        matches!(self.kind, Kind::Native(..))
    }

    /// The native evaluator's own answer, without the interpreter's fallback (for the
    /// differential tests): `None` when the expression is not native or when this evaluation
    /// is handed to the interpreter (jq's odd cases, work past `inline_ops`). Default limits.
    #[doc(hidden)]
    pub fn eval_native_only(
        &self,
        input: &Val,
        lookup: impl Fn(usize) -> Val,
    ) -> Option<Result<Val, EvalError>> {
        match &self.kind {
            Kind::Native(n, _) => match self.eval_native(n, input, &lookup, None) {
                Err(e) if e.0 == native::NOT_NATIVE => None,
                r => Some(r),
            },
            Kind::Jaq { .. } => None,
        }
    }

    /// Whether this expression is a plain path such as `$found.ids` (the cheapest native case).
    pub fn is_path(&self) -> bool {
        matches!(&self.kind, Kind::Native(n, _) if n.is_path())
    }

    /// Evaluate to the first output. `lookup(i)` returns the value of scope variable `i`.
    ///
    /// Runs under a default budget ([`EvalLimits::default`], no deadline).
    pub fn eval(&self, input: &Val, lookup: impl Fn(usize) -> Val) -> Result<Val, EvalError> {
        self.eval_first(input, &lookup, None)
    }

    /// Evaluate and return every output (jq streams), e.g. for `.items[]`.
    ///
    /// Runs under a default budget ([`EvalLimits::default`], no deadline).
    pub fn eval_all(
        &self,
        input: &Val,
        lookup: impl Fn(usize) -> Val,
    ) -> Result<Vec<Val>, EvalError> {
        self.eval_every(input, &lookup, None)
    }

    /// Evaluate to the first output under a request's `budget`, as `mode` allows.
    pub fn eval_in(
        &self,
        input: &Val,
        lookup: impl Fn(usize) -> Val,
        budget: &Budget,
        mode: Mode,
    ) -> Result<Val, EvalError> {
        self.eval_first(input, &lookup, Some((budget, mode)))
    }

    /// Evaluate and return every output under a request's `budget`, as `mode` allows.
    pub fn eval_all_in(
        &self,
        input: &Val,
        lookup: impl Fn(usize) -> Val,
        budget: &Budget,
        mode: Mode,
    ) -> Result<Vec<Val>, EvalError> {
        self.eval_every(input, &lookup, Some((budget, mode)))
    }

    fn eval_first(
        &self,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
        budget: Option<(&Budget, Mode)>,
    ) -> Result<Val, EvalError> {
        match &self.kind {
            Kind::Native(n, fallback) => {
                match (self.eval_native(n, input, lookup, budget), fallback) {
                    (Err(e), Some(filter)) if e.0 == native::NOT_NATIVE => {
                        self.first_of_jaq(filter, input, lookup, budget)
                    }
                    (r, _) => r,
                }
            }
            Kind::Jaq { filter } => self.first_of_jaq(filter, input, lookup, budget),
        }
    }

    fn eval_native(
        &self,
        n: &native::Native,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
        budget: Option<(&Budget, Mode)>,
    ) -> Result<Val, EvalError> {
        let limits = match budget {
            Some((b, _)) if b.is_cancelled() => {
                return Err(budget::stop_error(
                    jaq_core::budget::Stop::Cancelled,
                    b.limits(),
                ));
            }
            Some((b, _)) => *b.limits(),
            None => EvalLimits::default(),
        };
        n.eval(input, lookup, &limits)
    }

    fn first_of_jaq(
        &self,
        filter: &Arc<JaqFilter>,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
        budget: Option<(&Budget, Mode)>,
    ) -> Result<Val, EvalError> {
        self.run_jaq(filter, input, lookup, budget, |run, outs| {
            match outs.next() {
                Some(Ok(v)) => Ok(v),
                Some(Err(e)) => Err(exn_error(e, run)),
                None => Err(run.stopped().unwrap_or_else(|| {
                    EvalError::failed(format!("expression `{}` produced no value", self.src))
                })),
            }
        })
    }

    fn all_of_jaq(
        &self,
        filter: &Arc<JaqFilter>,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
        budget: Option<(&Budget, Mode)>,
    ) -> Result<Vec<Val>, EvalError> {
        self.run_jaq(filter, input, lookup, budget, |run, outs| {
            let mut all = Vec::new();
            for r in outs {
                run.output(all.len() + 1)?;
                all.push(r.map_err(|e| exn_error(e, run))?);
            }
            Ok(all)
        })
    }

    fn eval_every(
        &self,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
        budget: Option<(&Budget, Mode)>,
    ) -> Result<Vec<Val>, EvalError> {
        match &self.kind {
            Kind::Native(n, fallback) => {
                match (self.eval_native(n, input, lookup, budget), fallback) {
                    (Err(e), Some(filter)) if e.0 == native::NOT_NATIVE => {
                        self.all_of_jaq(filter, input, lookup, budget)
                    }
                    (r, _) => r.map(|v| vec![v]),
                }
            }
            Kind::Jaq { filter } => self.all_of_jaq(filter, input, lookup, budget),
        }
    }

    fn run_jaq<T>(
        &self,
        filter: &JaqFilter,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
        budget: Option<(&Budget, Mode)>,
        take: impl FnOnce(
            &budget::Run,
            &mut dyn Iterator<Item = jaq_core::ValX<'_, Val>>,
        ) -> Result<T, EvalError>,
    ) -> Result<T, EvalError> {
        let need = self.stack_need(budget.map_or(128, |(b, _)| b.limits().max_depth));
        let remaining = stacker::remaining_stack();
        let eval = || {
            let run = budget::Run::new(budget);
            if let Some(r) = remaining.filter(|r| *r >= need) {
                run.stack_remaining(r);
            }
            let vars = Vars::new(self.vars.iter().map(|&i| lookup(i)));
            let ctx = Ctx::<JustLut<Val>>::new(&filter.lut, vars);
            let mut outs = filter.id.run((ctx, input.clone()));
            let r = take(&run, &mut outs);
            // drop the interpreter's state while the scope is installed
            drop(outs);
            match run.stopped() {
                Some(e) => Err(e),
                None => r,
            }
        };
        match remaining {
            Some(r) if r >= need => eval(),
            // too little (or unknown) stack here: run on a new segment
            _ => stacker::grow(need.max(EVAL_STACK_GROW), eval),
        }
    }
}

impl Expr {
    /// Stack an evaluation should have: if the thread has less, it runs on a new segment.
    fn stack_need(&self, max_depth: usize) -> usize {
        let walks = jaq_core::budget::STACK_RED_ZONE
            + max_depth.saturating_mul(jaq_core::budget::STACK_PER_LEVEL);
        let recursion = self.syntax_depth.saturating_mul(STACK_PER_SYNTAX_LEVEL);
        EVAL_STACK_BASE + walks + recursion
    }
}

/// The error of an exception: the scope's stop if it stopped, else the jq error.
fn exn_error(e: jaq_core::Exn<Val>, run: &budget::Run) -> EvalError {
    run.stopped()
        .unwrap_or_else(|| EvalError::failed(exn_message(e)))
}

fn exn_message(e: jaq_core::Exn<Val>) -> String {
    // Never use `jaq_core::unwrap_valr`: it exits the process on `halt`.
    match e.get_err() {
        Ok(err) => {
            // errors may embed values of any size: keep the message short
            let s = err.to_string_bounded(ERROR_MESSAGE_MAX);
            s.strip_prefix("error: ").map(str::to_string).unwrap_or(s)
        }
        Err(e) => match e.get_halt() {
            Ok(code) => format!("expression called halt (exit code {code}); halt is not allowed"),
            Err(_) => "expression broke out of its control flow".into(),
        },
    }
}

/// Longest error message (values in it are cut).
const ERROR_MESSAGE_MAX: usize = 4096;

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

/// What kind of value `v` is, as a message names it: `null`, `a boolean`, `a number`, `a string`,
/// `an array`, `an object` (`expected an array, got a string`). Never the value itself, which
/// may be a secret or large.
pub fn kind_phrase(v: &Val) -> &'static str {
    match v {
        Val::Null => "null",
        Val::Bool(_) => "a boolean",
        Val::Num(_) => "a number",
        Val::TStr(_) | Val::BStr(_) => "a string",
        Val::Arr(_) => "an array",
        Val::Obj(_) => "an object",
    }
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
    fn tonumber_is_native_and_agrees_with_jaq_on_every_kind_of_string() {
        let native = Expr::compile("$x | tonumber", &["x"]).unwrap();
        assert!(native.is_native());
        let jaq = Expr::compile_interpreted("$x | tonumber", &["x"]).unwrap();
        let long = "9".repeat(100);
        let texts = [
            "12",
            "0",
            "-7",
            "100",
            "999999999999999999",
            "-999999999999999999",
            "1000000000000000000",
            "9223372036854775807",
            "-",
            "00",
            "-01",
            "١٢",
            " 12 ",
            "1.50",
            "1e3",
            "-0",
            "-12.5e-3",
            "01",
            "1 2",
            "",
            " ",
            "abc",
            "[1]",
            "{}",
            "9007199254740993",
            "123456789012345678901234567890",
            "1e400",
            "true",
            "null",
            "\"5\"",
            "0x10",
            "+1",
            "1.",
            ".5",
            "NaN",
            "1abc",
            "1 OR 1=1",
            "12 ",
            "\t-3\n",
            "1 2 3",
            "[1] 2",
            "2 [1]",
            &long,
        ];
        let mut inputs: Vec<Val> = texts.iter().map(|t| json::str_val(t)).collect();
        inputs.extend([v("7"), v("2.50"), v("null"), v("true"), v("[1]"), v("{}")]);
        for x in inputs {
            let a = native.eval_all(&Val::Null, |_| x.clone());
            let b = jaq.eval_all(&Val::Null, |_| x.clone());
            let show = |r: Result<Vec<Val>, EvalError>| {
                r.map(|vs| vs.iter().map(json::to_string).collect::<Vec<_>>())
                    .map_err(|e| e.0)
            };
            assert_eq!(show(a), show(b), "{}", json::to_string(&x));
        }
        // jq 1.7: the whole string must be one number (whitespace around it allowed), never
        // the number a longer text starts with.
        for (text, want) in [(" 12 ", Some("12")), ("-1.50", Some("-1.50"))]
            .into_iter()
            .chain(["1abc", "1 OR 1=1", "0x10", "1 2", "12a", "1,2", "[1]", ""].map(|t| (t, None)))
        {
            for e in [&native, &jaq] {
                let got = e
                    .eval_all(&Val::Null, |_| json::str_val(text))
                    .map(|vs| vs.iter().map(json::to_string).collect::<Vec<_>>());
                match want {
                    Some(n) => assert_eq!(got.ok(), Some(vec![n.to_string()]), "{text:?}"),
                    None => assert!(got.is_err(), "{text:?} | tonumber gave {got:?}"),
                }
            }
        }
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
            "$search.n | tonumber",
            "$search.s | tonumber",
            "$item.name | tonumber",
            "$request.n | tonumber",
            "$search.items | tonumber",
            "{n: ($search.f | tonumber)}",
            "$search.items | length",
            // found by the differential test (tests/differential.rs): an object indexed by a
            // number is `null` in jaq, and a negated literal is jaq's negation of it
            ".[0]",
            "$search[1].id",
            "{a: $request[-1]}",
            "-0",
            "[-0, -1.50, -100000000000000000000, -2.5]",
            "{a: -0}",
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

    /// Operators, `if`, `as`, definitions and builtins: the native form answers like the
    /// interpreter on every kind of operand (the odd ones through its fallback), errors included.
    #[test]
    fn native_operators_agree_with_jaq_on_every_kind_of_value() {
        let scope = ["a", "b"];
        let kinds = [
            "null",
            "true",
            "false",
            "0",
            "1",
            "-2",
            "2.5",
            "1e308",
            "3.000",
            "\"x\"",
            "\"12\"",
            "\"é\"",
            "[]",
            "[1,2.5,null]",
            "[\"a\",\"b\"]",
            "[[1],[2]]",
            "{}",
            "{\"k\":1,\"l\":2}",
            "{\"k\":\"s\"}",
            "[[1,2],null,[3]]",
            "[null]",
            "[[],[]]",
            "{\"p\":[1],\"q\":[2,3]}",
            "[[1],\"s\"]",
        ];
        let exprs = [
            "$a + $b",
            "$a - $b",
            "$a * $b",
            "$a / $b",
            "$a % $b",
            "$a == $b",
            "$a != $b",
            "$a < $b",
            "$a >= $b",
            "$a and $b",
            "$a or $b",
            "-$a",
            "$a | length",
            "$a | add",
            "$a | not",
            "$a | exp",
            "$a | log",
            "$a | sqrt",
            "[$a[]]",
            "if $a then $b else 0 end",
            "if $a then 1 elif $b then 2 end",
            "$a as $x | [$x, $b, .]",
            "$a as $b | $b",
            "def f: . + 1; $a | f",
            "def sq: 1 / (1 + ((0 - . / 100) | exp)); {s: ($a | sq), t: ($b | sq)}",
            "def f: $a; $b as $a | [f, $a]",
            "def length: 7; $a | length",
            "([$a[]] | add / length) as $p | {p: $p, big: ($p > 0.5)}",
            "{x: $a, y: $b} as $s | [$s[]] | add",
            "$a | map(. + 1)",
            "$a | map({v: ., b: $b})",
            "$a | map(length)",
            "$a | map(map(.))",
            "$a | transpose",
            "[$a, $b] | transpose",
            "[$a, $b] | transpose | map({x: .[0], y: .[1]})",
            "def transpose: 6; $a | transpose",
            "$a | join(\",\")",
            "$a | join($b)",
            "$a | index($b)",
            "$a | index(\"x\")",
            "$a | index(\"x\") != null",
            "($a | length > 0) and ($b | index(1) == null)",
            "[$a, null, true, false]",
            "def null: 1; $a == null",
            "[$a[] as $x | {x: $x, b: $b}]",
            "[$a.k[] as $x | $x]",
            "[$a[] as $x | $b[$x]]",
            "$a[$b]",
            "$a[$b].k",
            "$a[\"k\"][$b]",
            "{k: 0} + $a",
            "$a + {l: 1}",
            "($a[$b] // {}) + ($b[$a] // {})",
            "$a + $b + $a",
            "{k: 0} + $a + $b",
            "{k: 0, m: $b} + $a + {l: 1} + $b",
            "$a + $b + {l: 1} + $a",
            "1 + $a + $b",
            "$a - $b + $a",
            "{id: 1} + ($a[$b] // {}) + ($b[$a] // {}) + ($a // {})",
            "$a as $x | $x + $x + $b",
        ];
        let input = v(r#"{"in":1}"#);
        for src in exprs {
            let native = Expr::compile(src, &scope).unwrap();
            assert!(native.is_native(), "{src} should be native");
            let jaq = Expr::compile_interpreted(src, &scope).unwrap();
            for a in kinds {
                for b in kinds {
                    let vals = [v(a), v(b)];
                    let x = native.eval(&input, |i| vals[i].clone());
                    let y = jaq.eval(&input, |i| vals[i].clone());
                    assert_eq!(
                        x.map(|x| json::to_string(&x)).map_err(|e| e.0),
                        y.map(|x| json::to_string(&x)).map_err(|e| e.0),
                        "{src} with $a = {a}, $b = {b}"
                    );
                }
            }
        }
        // What stays the interpreter's: recursion, definitions with arguments, iteration that
        // yields several values, and anything too large to evaluate without a budget.
        let chain: String = (0..20)
            .map(|i| format!("def f{}: f{i} + f{i}; ", i + 1))
            .collect();
        for src in [
            "def f: f; f",
            "def f(g): g; f(1)",
            "def add(f): 1; add",
            "def map(f): 5; $a | map(.)",
            "def join(f): 1; $a | join(\",\")",
            "$a[]",
            "[$a[] | . + 1]",
            &format!("def f0: 1; {chain}f20"),
        ] {
            assert!(
                !Expr::compile(src, &scope).unwrap().is_native(),
                "{src} is for the interpreter"
            );
        }
    }

    /// `map` does work in proportion to its data: past `inline_ops` the native form hands the
    /// evaluation to the interpreter, which yields to the compute pool inline and answers there.
    #[test]
    fn native_map_beyond_the_inline_cap_is_the_interpreters() {
        let e = Expr::compile("$a | map($a | map(. + 1) | length)", &["a"]).unwrap();
        assert!(e.is_native());
        let a = v(&format!(
            "[{}]",
            (0..300)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ));
        let limits = EvalLimits {
            inline_ops: 50_000,
            ..EvalLimits::default()
        };
        let budget = Budget::unlimited_time(limits);
        let inline = e.eval_in(&Val::Null, |_| a.clone(), &budget, Mode::Inline);
        assert_eq!(inline.map_err(|e| e.kind()), Err(EvalErrorKind::Yield));
        let used = budget.used_ops();
        assert!(used > 0, "the interpreter charged the request's budget");
        let out = e
            .eval_in(&Val::Null, |_| a.clone(), &budget, Mode::Offload)
            .unwrap();
        assert_eq!(
            json::to_string(&out),
            format!("[{}]", vec!["300"; 300].join(","))
        );
        // small enough: native, nothing charged
        let small = v("[1,2,3]");
        let budget = Budget::unlimited_time(limits);
        let out = e
            .eval_in(&Val::Null, |_| small.clone(), &budget, Mode::Inline)
            .unwrap();
        assert_eq!(json::to_string(&out), "[3,3,3]");
        assert_eq!(budget.used_ops(), 0);
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

    #[test]
    fn kind_phrases_name_each_kind_with_its_article() {
        let kinds: Vec<&str> = ["null", "true", "1.5", "\"s\"", "[1]", "{}"]
            .iter()
            .map(|s| kind_phrase(&v(s)))
            .collect();
        assert_eq!(
            kinds,
            [
                "null",
                "a boolean",
                "a number",
                "a string",
                "an array",
                "an object"
            ]
        );
    }
}
