//! The native evaluator: the subset of jq that flows use most — paths, literals, string
//! interpolation, object and array construction, `//`, arithmetic and comparisons, `if`,
//! `and`/`or`, `x as $v | …`, `def f: …;` without arguments, `[x[]]`, `[x[] as $v | …]`,
//! computed keys (`$price[$id]`), `+` of objects and `null`, `map(f)`, `join(s)`, `index(x)`,
//! `transpose` and a few builtins (`length`, `add`, `not`, `exp`, `log`, `sqrt`) — evaluated
//! directly over [`Val`] with jq's semantics. Recognised from jaq's own parse tree; anything
//! else goes to the interpreter.
//!
//! Every native form yields exactly one value or an error. Where jq's answer depends on cases
//! this evaluator does not model (arithmetic on non-numbers, `length` of a string, an error
//! raised by an operator), the evaluation returns [`NOT_NATIVE`] and the expression's
//! interpreted form answers instead, so errors and odd cases stay jaq's. The work of a native
//! evaluation is bounded by the expression ([`MAX_NATIVE_COST`] nodes, definitions expanded) and
//! by the data it reads (`add`, `[x[]]`: one pass over an array already within the value
//! limits); what iterates over data (`map`, `[x[] as $v | …]`, `transpose`, `join`, `index`,
//! object `+`) counts its work, and past `server.expressions.inline_ops` units the evaluation
//! is the interpreter's (which charges the request's budget and moves to the compute pool);
//! its recursion by [`MAX_NATIVE_DEPTH`].

use crate::{EvalError, EvalErrorKind, EvalLimits, Val, json, truthy};
use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Pattern, Term};
use jaq_core::ops::{Cmp, Math};
use jaq_core::path::{Opt, Part};
use jaq_json::Map;
use jaq_std::ValT as _;
use std::cell::Cell;
use std::sync::Arc;

/// Most nodes a native expression may evaluate (definitions expanded at each call); a larger
/// one runs on the interpreter, under the evaluation budget.
pub(crate) const MAX_NATIVE_COST: usize = 4096;
/// Deepest nesting of a native expression (definitions expanded); deeper ones run on the
/// interpreter, which grows its stack.
pub(crate) const MAX_NATIVE_DEPTH: usize = 64;

/// One segment of a path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seg {
    Key(Val),
    Index(isize),
}

/// A natively evaluated expression. Every variant yields exactly one value (or an error).
#[derive(Debug, Clone)]
pub(crate) enum Native {
    /// A constant.
    Lit(Val),
    /// `$var.a[0]` (Some) or `.a[0]` (None).
    Path { var: Option<usize>, segs: Vec<Seg> },
    /// `"text \(expr) text"`.
    Interp(Vec<Piece>),
    /// `{key: expr, …}`.
    Obj(Vec<(Val, Native)>),
    /// `[expr, …]`.
    Arr(Vec<Native>),
    /// `l // r`.
    Alt(Box<Native>, Box<Native>),
    /// `x | tonumber` (a path parameter or header made a number): a number as it is, a short
    /// string holding one JSON number as that number; anything else is the interpreter's to
    /// answer ([`NOT_NATIVE`]), so the semantics — errors and jq's odd cases included — stay
    /// jaq's.
    ToNumber(Box<Native>),
    /// `l + r`, `l - r`, … on two numbers (jaq's own arithmetic); other operands go to the
    /// interpreter.
    Math(Box<Native>, Math, Box<Native>),
    /// `a + b + c …` (three or more operands): each evaluated once, then added left to right
    /// exactly as [`Native::Math`] adds two. When the first is an object, its map is made (or
    /// grown) once to hold the objects after it, instead of growing at every `+`
    /// (`{id: $id} + ($price[$id] // {}) + ($stock[$id] // {})`).
    Merge(Vec<Native>),
    /// `l == r`, `l < r`, … (jaq's total order of values).
    Cmp(Box<Native>, Cmp, Box<Native>),
    /// `l and r` (true) / `l or r` (false), short-circuiting as jq does.
    Logic(Box<Native>, bool, Box<Native>),
    /// `-x` of a number.
    Neg(Box<Native>),
    /// `l | r`.
    Pipe(Box<Native>, Box<Native>),
    /// `l as $x | r`: `r` sees `$x` as the variable at index `.2`, its input is `.`.
    Bind(Box<Native>, Box<Native>, usize),
    /// `if c then a elif … else b end` (no `else`: `.`).
    If(Vec<(Native, Native)>, Option<Box<Native>>),
    /// A call of `def f: body;` (no arguments), its body compiled where it is defined.
    Call(Arc<Def>),
    /// A builtin applied to `.`.
    Builtin(Builtin),
    /// `[x[]]`: the values of an array or object.
    Values(Box<Native>),
    /// `[src[] as $x | body]`: `body` (input `.`) once per value of `src` (an array or an
    /// object's values), `$x` bound to it at index `.1`. Its work is counted like `map`'s.
    ForAs(Box<Native>, usize, Box<Native>, usize),
    /// `base[key]` with a computed key (`$price[$id]`): both evaluated with the input `.`; an
    /// object by a string, an array by an integer, `null` by either; anything else is jaq's.
    Lookup(Box<Native>, Box<Native>),
    /// `join(sep)` of an array of strings by a string; anything else is jaq's.
    Join(Box<Native>),
    /// `index(x)` of an array by a value that is not an array (the first position of an equal
    /// element, or `null`); strings and arrays as `x` are jaq's.
    IndexOf(Box<Native>),
    /// `map(f)` (jq's `[.[] | f]`) over an array or an object's values, `f` native. Its work
    /// (elements × `f`'s nodes) is counted against the evaluation's native work cap.
    Map(Box<Native>, usize),
}

/// A definition without arguments, compiled once; calls share it.
#[derive(Debug)]
pub(crate) struct Def {
    body: Native,
    cost: usize,
    depth: usize,
}

/// The builtins evaluated natively (all of arity 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Builtin {
    Length,
    Add,
    Not,
    Exp,
    Log,
    Sqrt,
    /// jq's `transpose` of an array of arrays (or nulls), short rows padded with `null`; other
    /// inputs are the interpreter's. Its output's size is counted against the native work cap.
    Transpose,
}

impl Builtin {
    fn named(name: &str) -> Option<Builtin> {
        Some(match name {
            "transpose" => Builtin::Transpose,
            "length" => Builtin::Length,
            "add" => Builtin::Add,
            "not" => Builtin::Not,
            "exp" => Builtin::Exp,
            "log" => Builtin::Log,
            "sqrt" => Builtin::Sqrt,
            _ => return None,
        })
    }
}

/// The variables an evaluation sees: the flow's (`lookup`, indices below `base`) and those
/// bound by `as` (a chain on the stack, innermost first).
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    lookup: &'a dyn Fn(usize) -> Val,
    local: Option<&'a Local<'a>>,
    /// Data-proportional work done so far (`map` elements × nodes, `transpose` cells), capped
    /// by `server.expressions.inline_ops`: beyond it the evaluation is the interpreter's, which
    /// charges the request's budget and moves to the compute pool.
    work: &'a Cell<u64>,
}

pub(crate) struct Local<'a> {
    index: usize,
    val: Val,
    up: Option<&'a Local<'a>>,
}

impl Env<'_> {
    /// Variable `i`: bound by `as` (indices from the flow's count up), else the flow's.
    fn get(&self, i: usize) -> Val {
        let mut l = self.local;
        while let Some(x) = l {
            if x.index == i {
                return x.val.clone();
            }
            l = x.up;
        }
        (self.lookup)(i)
    }
}

/// The message of the error that sends one evaluation to the interpreter (see
/// [`Native::ToNumber`]); never shown: the caller runs the expression's interpreted form instead.
pub(crate) const NOT_NATIVE: &str = "\u{0}not native";

/// Longest string `tonumber` parses natively (a number's text; longer ones go to the interpreter).
const MAX_NATIVE_NUMBER: usize = 64;

#[derive(Debug, Clone)]
pub(crate) enum Piece {
    Text(String),
    Expr(Native),
}

/// Try to compile a parsed term natively.
pub(crate) fn from_term(t: &Term<&str>, scope: &[&str]) -> Option<Native> {
    let mut cx = Cx {
        scope: scope.iter().map(|s| s.to_string()).collect(),
        defs: Vec::new(),
    };
    let n = compile(t, &mut cx)?;
    let (cost, depth) = n.weight();
    (cost <= MAX_NATIVE_COST && depth <= MAX_NATIVE_DEPTH).then_some(n)
}

/// What a term is compiled in: the variables in scope (the flow's first, then those bound by
/// `as`), and the definitions in scope (`None`: one that is not native, e.g. with arguments or
/// while its own body is compiled — a recursive call is the interpreter's).
struct Cx {
    scope: Vec<String>,
    defs: Vec<(String, Option<Arc<Def>>)>,
}

fn compile(t: &Term<&str>, cx: &mut Cx) -> Option<Native> {
    let bx = |t: &Term<&str>, cx: &mut Cx| compile(t, cx).map(Box::new);
    Some(match t {
        Term::Id => Native::Path {
            var: None,
            segs: vec![],
        },
        Term::Num(n) => Native::Lit(json::parse(n.as_bytes()).ok()?),
        Term::Neg(inner) => match &**inner {
            // the literal's number negated, as jaq does (`-0` is `0`; `-1.50` keeps its text)
            Term::Num(n) => Native::Lit((-json::parse(n.as_bytes()).ok()?).ok()?),
            _ => Native::Neg(bx(inner, cx)?),
        },
        Term::Str(None, parts) => {
            let mut pieces = Vec::new();
            for p in parts {
                match p {
                    StrPart::Str(s) => push_text(&mut pieces, s),
                    StrPart::Char(c) => push_text(&mut pieces, c.encode_utf8(&mut [0; 4])),
                    StrPart::Term(t) => pieces.push(Piece::Expr(compile(t, cx)?)),
                }
            }
            match pieces.as_slice() {
                [] => Native::Lit(json::str_val("")),
                [Piece::Text(s)] => Native::Lit(json::str_val(s)),
                _ => Native::Interp(pieces),
            }
        }
        Term::Var(v) => Native::Path {
            var: Some(
                cx.scope
                    .iter()
                    .rposition(|s| Some(s.as_str()) == v.strip_prefix('$'))?,
            ),
            segs: vec![],
        },
        Term::Path(head, path)
            if path
                .0
                .iter()
                .any(|(p, _)| matches!(p, Part::Index(k) if static_seg(k).is_none())) =>
        {
            let mut base = compile(head, cx)?;
            for (part, opt) in &path.0 {
                if !matches!(opt, Opt::Essential) {
                    return None;
                }
                let Part::Index(key) = part else { return None };
                let key = match static_seg(key) {
                    Some(Seg::Key(k)) => Native::Lit(k),
                    Some(Seg::Index(i)) => Native::Lit(Val::Num(jaq_json::Num::Int(i))),
                    None => compile(key, cx)?,
                };
                base = Native::Lookup(Box::new(base), Box::new(key));
            }
            base
        }
        Term::Path(head, path) => {
            let Native::Path { var, mut segs } = compile(head, cx)? else {
                return None;
            };
            for (part, opt) in &path.0 {
                if !matches!(opt, Opt::Essential) {
                    return None;
                }
                let Part::Index(key) = part else { return None };
                segs.push(static_seg(key)?);
            }
            Native::Path { var, segs }
        }
        Term::Obj(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let (key, value) = match (k, v) {
                    (Term::Str(None, parts), Some(v)) => (plain_str(parts)?, compile(v, cx)?),
                    (Term::Str(None, parts), None) => {
                        let key = plain_str(parts)?;
                        let path = Native::Path {
                            var: None,
                            segs: vec![Seg::Key(json::str_val(&key))],
                        };
                        (key, path)
                    }
                    (Term::Var(x), None) => (x.strip_prefix('$')?.to_string(), compile(k, cx)?),
                    _ => return None,
                };
                out.push((json::str_val(&key), value));
            }
            Native::Obj(out)
        }
        Term::Arr(None) => Native::Lit(Val::Arr(Default::default())),
        Term::Arr(Some(inner)) => match &**inner {
            Term::BinOp(src, BinaryOp::Pipe(Some(Pattern::Var(x))), body)
                if matches!(&**src, Term::Path(_, path)
                    if matches!(path.0.last(), Some((Part::Range(None, None), Opt::Essential)))) =>
            {
                let Term::Path(head, path) = &**src else {
                    return None;
                };
                let prefix = &path.0[..path.0.len() - 1];
                let source = if prefix.is_empty() {
                    bx(head, cx)?
                } else {
                    let t = Term::Path(head.clone(), jaq_core::path::Path(prefix.to_vec()));
                    bx(&t, cx)?
                };
                let name = x.strip_prefix('$').unwrap_or(x).to_string();
                let index = cx.scope.len();
                cx.scope.push(name);
                let body = compile(body, cx);
                cx.scope.pop();
                let body = body?;
                let (cost, _) = body.weight();
                Native::ForAs(source, index, Box::new(body), cost)
            }
            Term::Path(head, path)
                if matches!(
                    path.0.as_slice(),
                    [(Part::Range(None, None), Opt::Essential)]
                ) =>
            {
                Native::Values(bx(head, cx)?)
            }
            _ => {
                let mut items = Vec::new();
                flatten_commas(inner, &mut items);
                Native::Arr(
                    items
                        .into_iter()
                        .map(|t| compile(t, cx))
                        .collect::<Option<_>>()?,
                )
            }
        },
        Term::BinOp(l, BinaryOp::Alt, r) => Native::Alt(bx(l, cx)?, bx(r, cx)?),
        Term::BinOp(l, BinaryOp::Pipe(None), r) => match &**r {
            Term::Call("tonumber", args) if args.is_empty() && !cx.defined("tonumber") => {
                Native::ToNumber(bx(l, cx)?)
            }
            _ => Native::Pipe(bx(l, cx)?, bx(r, cx)?),
        },
        Term::BinOp(l, BinaryOp::Pipe(Some(Pattern::Var(x))), r) => {
            let value = bx(l, cx)?;
            let name = x.strip_prefix('$').unwrap_or(x).to_string();
            let index = cx.scope.len();
            cx.scope.push(name);
            let body = compile(r, cx);
            cx.scope.pop();
            Native::Bind(value, Box::new(body?), index)
        }
        Term::BinOp(l, BinaryOp::Math(Math::Add), r) => {
            let (l, r) = (compile(l, cx)?, compile(r, cx)?);
            match l {
                Native::Math(a, Math::Add, b) => Native::Merge(vec![*a, *b, r]),
                Native::Merge(mut operands) => {
                    operands.push(r);
                    Native::Merge(operands)
                }
                l => Native::Math(Box::new(l), Math::Add, Box::new(r)),
            }
        }
        Term::BinOp(l, BinaryOp::Math(op), r) => Native::Math(bx(l, cx)?, *op, bx(r, cx)?),
        Term::BinOp(l, BinaryOp::Cmp(op), r) => Native::Cmp(bx(l, cx)?, *op, bx(r, cx)?),
        Term::BinOp(l, BinaryOp::And, r) => Native::Logic(bx(l, cx)?, true, bx(r, cx)?),
        Term::BinOp(l, BinaryOp::Or, r) => Native::Logic(bx(l, cx)?, false, bx(r, cx)?),
        Term::IfThenElse(branches, otherwise) => {
            let mut bs = Vec::with_capacity(branches.len());
            for (c, then) in branches {
                bs.push((compile(c, cx)?, compile(then, cx)?));
            }
            let otherwise = match otherwise {
                Some(o) => Some(bx(o, cx)?),
                None => None,
            };
            Native::If(bs, otherwise)
        }
        Term::Def(defs, rest) => {
            let mark = cx.defs.len();
            for d in defs {
                // Poisoned while its body compiles: a recursive call is not native.
                cx.defs.push((d.name.to_string(), None));
                let def = if d.args.is_empty() {
                    compile(&d.body, cx).map(|body| {
                        let (cost, depth) = body.weight();
                        Arc::new(Def { body, cost, depth })
                    })
                } else {
                    None
                };
                if let Some(last) = cx.defs.last_mut() {
                    last.1 = def;
                }
            }
            let out = compile(rest, cx);
            cx.defs.truncate(mark);
            out?
        }
        // `null`, `true`, `false` are calls in jq's grammar
        Term::Call(name @ ("null" | "true" | "false"), args)
            if args.is_empty() && !cx.defined(name) =>
        {
            Native::Lit(match *name {
                "null" => Val::Null,
                n => Val::Bool(n == "true"),
            })
        }
        Term::Call("join", args) if args.len() == 1 && !cx.defined("join") => {
            Native::Join(bx(&args[0], cx)?)
        }
        Term::Call("index", args) if args.len() == 1 && !cx.defined("index") => {
            Native::IndexOf(bx(&args[0], cx)?)
        }
        Term::Call("map", args) if args.len() == 1 && !cx.defined("map") => {
            let f = compile(&args[0], cx)?;
            let (cost, _) = f.weight();
            Native::Map(Box::new(f), cost)
        }
        Term::Call(name, args) if args.is_empty() => {
            match cx.defs.iter().rev().find(|(n, _)| n == name) {
                Some((_, Some(def))) => Native::Call(def.clone()),
                Some((_, None)) => return None,
                None => Native::Builtin(Builtin::named(name)?),
            }
        }
        _ => return None,
    })
}

impl Cx {
    fn defined(&self, name: &str) -> bool {
        self.defs.iter().any(|(n, _)| n == name)
    }
}

fn push_text(pieces: &mut Vec<Piece>, s: &str) {
    match pieces.last_mut() {
        Some(Piece::Text(t)) => t.push_str(s),
        _ => pieces.push(Piece::Text(s.to_string())),
    }
}

fn plain_str(parts: &[StrPart<&str, Term<&str>>]) -> Option<String> {
    let mut s = String::new();
    for p in parts {
        match p {
            StrPart::Str(x) => s.push_str(x),
            StrPart::Char(c) => s.push(*c),
            StrPart::Term(_) => return None,
        }
    }
    Some(s)
}

/// A path segment written as a literal: `.a`, `["a"]`, `[0]`, `[-1]`.
fn static_seg(key: &Term<&str>) -> Option<Seg> {
    Some(match key {
        Term::Str(None, parts) => Seg::Key(json::str_val(&plain_str(parts)?)),
        Term::Num(n) => Seg::Index(n.parse().ok()?),
        Term::Neg(inner) => match &**inner {
            Term::Num(n) => Seg::Index(-n.parse::<isize>().ok()?),
            _ => return None,
        },
        _ => return None,
    })
}

fn flatten_commas<'a, 's>(t: &'a Term<&'s str>, out: &mut Vec<&'a Term<&'s str>>) {
    match t {
        Term::BinOp(l, BinaryOp::Comma, r) => {
            flatten_commas(l, out);
            flatten_commas(r, out);
        }
        other => out.push(other),
    }
}

impl Native {
    /// Whether this is a bare path (the cheapest case).
    pub(crate) fn is_path(&self) -> bool {
        matches!(self, Native::Path { .. })
    }

    /// Whether some inputs send an evaluation to the interpreter ([`NOT_NATIVE`]).
    pub(crate) fn may_fall_back(&self) -> bool {
        match self {
            Native::ToNumber(_) => true,
            Native::Lit(_) | Native::Path { .. } => false,
            Native::Interp(pieces) => pieces
                .iter()
                .any(|p| matches!(p, Piece::Expr(e) if e.may_fall_back())),
            Native::Obj(entries) => entries.iter().any(|(_, v)| v.may_fall_back()),
            Native::Arr(items) => items.iter().any(Native::may_fall_back),
            Native::Alt(l, r) => l.may_fall_back() || r.may_fall_back(),
            // Operators, builtins and what contains them: their odd cases are jaq's.
            Native::Math(..)
            | Native::Merge(_)
            | Native::Cmp(..)
            | Native::Logic(..)
            | Native::Neg(_)
            | Native::Pipe(..)
            | Native::Bind(..)
            | Native::If(..)
            | Native::Call(_)
            | Native::Builtin(_)
            | Native::Values(_)
            | Native::Map(..)
            | Native::ForAs(..)
            | Native::Lookup(..)
            | Native::Join(_)
            | Native::IndexOf(_) => true,
        }
    }

    /// (nodes evaluated, nesting depth), definitions expanded at their calls (saturating).
    fn weight(&self) -> (usize, usize) {
        let many = |xs: &mut dyn Iterator<Item = &Native>| {
            xs.map(Native::weight)
                .fold((1usize, 0usize), |(c, d), (c1, d1)| {
                    (c.saturating_add(c1), d.max(d1))
                })
        };
        let (cost, depth) = match self {
            Native::Lit(_) | Native::Path { .. } | Native::Builtin(_) => (1, 0),
            Native::Call(def) => (def.cost, def.depth),
            Native::Interp(pieces) => many(&mut pieces.iter().filter_map(|p| match p {
                Piece::Expr(e) => Some(e),
                Piece::Text(_) => None,
            })),
            Native::Obj(entries) => many(&mut entries.iter().map(|(_, v)| v)),
            Native::Arr(items) | Native::Merge(items) => many(&mut items.iter()),
            Native::If(bs, o) => many(&mut bs.iter().flat_map(|(c, t)| [c, t]).chain(o.as_deref())),
            Native::ToNumber(x)
            | Native::Neg(x)
            | Native::Values(x)
            | Native::Map(x, _)
            | Native::Join(x)
            | Native::IndexOf(x) => many(&mut [&**x].into_iter()),
            Native::Alt(l, r)
            | Native::Math(l, _, r)
            | Native::Cmp(l, _, r)
            | Native::Logic(l, _, r)
            | Native::Pipe(l, r)
            | Native::Lookup(l, r)
            | Native::Bind(l, r, _)
            | Native::ForAs(l, _, r, _) => many(&mut [&**l, &**r].into_iter()),
        };
        (cost.saturating_add(1), depth.saturating_add(1))
    }

    /// Evaluate. The work is bounded by the expression (no ops are charged), but what it
    /// builds respects `limits`: values placed inside new objects and arrays must fit within
    /// `max_depth`, interpolated strings within `max_string_bytes`.
    pub(crate) fn eval(
        &self,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
        limits: &EvalLimits,
    ) -> Result<Val, EvalError> {
        // the most common cases first, without depth bookkeeping
        match self {
            Native::Path { var, segs } => match var {
                Some(i) => walk(&lookup(*i), segs),
                None => walk(input, segs),
            },
            Native::Lit(v) => Ok(v.clone()),
            _ => {
                let work = Cell::new(0);
                let env = Env {
                    lookup,
                    local: None,
                    work: &work,
                };
                self.eval_at(input, env, limits, 0)
            }
        }
    }

    /// Evaluate a value that will be placed `level` levels deep in the result.
    fn eval_at(
        &self,
        input: &Val,
        env: Env<'_>,
        limits: &EvalLimits,
        level: usize,
    ) -> Result<Val, EvalError> {
        let placed = |v: Val| {
            if level == 0 || v.depth_le(limits.max_depth.saturating_sub(level)) {
                Ok(v)
            } else {
                Err(too_deep(limits))
            }
        };
        match self {
            Native::Lit(v) => placed(v.clone()),
            Native::Path { var, segs } => placed(match var {
                Some(i) => walk(&env.get(*i), segs)?,
                None => walk(input, segs)?,
            }),
            Native::Interp(pieces) => {
                let mut s = String::new();
                for p in pieces {
                    match p {
                        Piece::Text(t) => s.push_str(t),
                        Piece::Expr(e) => match e.eval_at(input, env, limits, 0)? {
                            Val::TStr(b) | Val::BStr(b) => s.push_str(&String::from_utf8_lossy(&b)),
                            // an integer's text is its digits (what `{v}` would write, faster)
                            Val::Num(jaq_json::Num::Int(i)) => {
                                s.push_str(itoa::Buffer::new().format(i))
                            }
                            // jq interpolates non-strings as their JSON text (`tojson`).
                            other => display_into(&mut s, &other, limits.max_string_bytes)?,
                        },
                    }
                    if s.len() > limits.max_string_bytes {
                        return Err(too_long(s.len(), limits));
                    }
                }
                Ok(Val::utf8_str(s.into_bytes()))
            }
            Native::Obj(entries) => build_obj(entries, 0, input, env, limits, level),
            Native::Arr(items) => {
                if level >= limits.max_depth {
                    return Err(too_deep(limits));
                }
                let eval = |x: &Native| x.eval_at(input, env, limits, level + 1);
                items.iter().map(eval).collect()
            }
            // As in jaq (our reference), an error on the left propagates.
            Native::Alt(l, r) => match l.eval_at(input, env, limits, level)? {
                v if truthy(&v) => Ok(v),
                _ => r.eval_at(input, env, limits, level),
            },
            Native::ToNumber(inner) => match inner.eval_at(input, env, limits, level)? {
                v @ Val::Num(_) => Ok(v),
                Val::TStr(b) | Val::BStr(b) => {
                    // The common case, a path parameter or header holding a plain integer,
                    // without the JSON reader (what it would make of it: an `Int`).
                    if let Some(i) = plain_int(&b) {
                        return Ok(Val::Num(jaq_json::Num::Int(i)));
                    }
                    if b.len() > MAX_NATIVE_NUMBER || b.iter().any(|c| *c == b'[' || *c == b'{') {
                        return Err(not_native());
                    }
                    // jq's `tonumber` is `fromjson` for strings: exactly one JSON number
                    // (whitespace around it allowed) is ours, read by the crate's JSON reader,
                    // whose numbers are `Num::from_literal`'s as the interpreter's are; anything
                    // else (several values, jq's laxer texts such as `NaN`, an error) is the
                    // interpreter's.
                    match json::parse_limited(&b, limits.max_depth) {
                        Ok(v @ Val::Num(_)) => Ok(v),
                        _ => Err(not_native()),
                    }
                }
                _ => Err(not_native()),
            },
            // Operands: both single values, so jq's order of evaluation only decides which of
            // two errors is reported — the interpreter's call (`NOT_NATIVE`).
            Native::Math(l, op, r) => match (
                l.eval_at(input, env, limits, 0),
                r.eval_at(input, env, limits, 0),
            ) {
                (Ok(x @ Val::Num(_)), Ok(y @ Val::Num(_))) => {
                    op.run(x, y).map_err(|_| not_native()).and_then(placed)
                }
                // `null` is neutral for `+`; objects merge shallowly (the right's keys win,
                // new keys after the left's), as jaq adds them
                (Ok(x), Ok(y)) if *op == Math::Add => add(x, y, env, limits).and_then(placed),
                _ => Err(not_native()),
            },
            Native::Merge(operands) => {
                let [first, rest @ ..] = operands.as_slice() else {
                    return Err(not_native());
                };
                let mut vals = Vec::with_capacity(rest.len());
                for o in rest {
                    vals.push(o.eval_at(input, env, limits, 0).map_err(|_| not_native())?);
                }
                // What the objects after the first add at most: the first is made this much
                // larger (within the element limit; past it the adds below refuse anyway).
                let more = vals
                    .iter()
                    .map(|v| match v {
                        Val::Obj(o) => o.len(),
                        _ => 0,
                    })
                    .fold(0usize, usize::saturating_add);
                let more = if more <= limits.max_elements { more } else { 0 };
                let mut acc = match first {
                    Native::Obj(entries) => build_obj(entries, more, input, env, limits, 0),
                    other => other.eval_at(input, env, limits, 0).map(|mut v| {
                        if let Val::Obj(m) = &mut v
                            && more > 0
                        {
                            grow(m, more);
                        }
                        v
                    }),
                }
                .map_err(|_| not_native())?;
                for v in vals {
                    acc = add(acc, v, env, limits)?;
                }
                placed(acc)
            }
            Native::Cmp(l, op, r) => match (
                l.eval_at(input, env, limits, 0),
                r.eval_at(input, env, limits, 0),
            ) {
                (Ok(x), Ok(y)) => Ok(Val::Bool(op.run(&x, &y))),
                _ => Err(not_native()),
            },
            Native::Logic(l, and, r) => {
                let x = truthy(&l.eval_at(input, env, limits, 0)?);
                if x != *and {
                    return Ok(Val::Bool(x));
                }
                Ok(Val::Bool(truthy(&r.eval_at(input, env, limits, 0)?)))
            }
            Native::Neg(x) => match x.eval_at(input, env, limits, 0)? {
                v @ Val::Num(_) => (-v).map_err(|_| not_native()),
                _ => Err(not_native()),
            },
            Native::Pipe(l, r) => {
                let v = l.eval_at(input, env, limits, 0)?;
                r.eval_at(&v, env, limits, level)
            }
            Native::Bind(value, body, index) => {
                let local = Local {
                    index: *index,
                    val: value.eval_at(input, env, limits, 0)?,
                    up: env.local,
                };
                let inner = Env {
                    lookup: env.lookup,
                    local: Some(&local),
                    work: env.work,
                };
                body.eval_at(input, inner, limits, level)
            }
            Native::If(branches, otherwise) => {
                for (c, then) in branches {
                    if truthy(&c.eval_at(input, env, limits, 0)?) {
                        return then.eval_at(input, env, limits, level);
                    }
                }
                match otherwise {
                    Some(o) => o.eval_at(input, env, limits, level),
                    None => placed(input.clone()),
                }
            }
            Native::Call(def) => def.body.eval_at(input, env, limits, level),
            Native::Builtin(Builtin::Transpose) => {
                if level >= limits.max_depth {
                    return Err(too_deep(limits));
                }
                transpose(input, env, limits).and_then(placed)
            }
            Native::Builtin(b) => b.apply(input).and_then(placed),
            Native::ForAs(source, index, body, cost) => {
                if level >= limits.max_depth {
                    return Err(too_deep(limits));
                }
                // errors (their wording) are the interpreter's
                let src = source
                    .eval_at(input, env, limits, 0)
                    .map_err(|_| not_native())?;
                let each = |x: &Val| {
                    let local = Local {
                        index: *index,
                        val: x.clone(),
                        up: env.local,
                    };
                    let inner = Env {
                        lookup: env.lookup,
                        local: Some(&local),
                        work: env.work,
                    };
                    body.eval_at(input, inner, limits, level + 1)
                        .map_err(|_| not_native())
                };
                collect_each(&src, env, limits, *cost, each)
            }
            Native::Lookup(base, key) => {
                let b = base
                    .eval_at(input, env, limits, 0)
                    .map_err(|_| not_native())?;
                let k = key
                    .eval_at(input, env, limits, 0)
                    .map_err(|_| not_native())?;
                let found = match (&b, &k) {
                    (Val::Null, Val::TStr(_) | Val::Num(jaq_json::Num::Int(_))) => Val::Null,
                    (Val::Obj(m), Val::TStr(_)) => {
                        json::obj_get_val(m, &k).cloned().unwrap_or(Val::Null)
                    }
                    (Val::Arr(a), Val::Num(jaq_json::Num::Int(i))) => {
                        let idx = if *i < 0 {
                            a.len().checked_sub(i.unsigned_abs())
                        } else {
                            Some(i.unsigned_abs())
                        };
                        idx.and_then(|i| a.get(i)).cloned().unwrap_or(Val::Null)
                    }
                    _ => return Err(not_native()),
                };
                placed(found)
            }
            Native::Join(sep) => {
                let sep = sep
                    .eval_at(input, env, limits, 0)
                    .map_err(|_| not_native())?;
                let (Val::Arr(a), Val::TStr(sep)) = (input, &sep) else {
                    return Err(not_native());
                };
                let mut len = 0usize;
                for x in a.iter() {
                    let Val::TStr(b) = x else {
                        return Err(not_native());
                    };
                    len = len.saturating_add(b.len()).saturating_add(sep.len());
                }
                if len > limits.max_string_bytes {
                    return Err(not_native());
                }
                charge(env, limits, a.len(), 1)?;
                let mut out = Vec::with_capacity(len);
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.extend_from_slice(sep);
                    }
                    if let Val::TStr(b) = x {
                        out.extend_from_slice(b);
                    }
                }
                Ok(Val::utf8_str(out))
            }
            Native::IndexOf(x) => {
                let x = x.eval_at(input, env, limits, 0).map_err(|_| not_native())?;
                match (input, &x) {
                    (Val::Arr(_), Val::Arr(_)) => Err(not_native()),
                    (Val::Arr(a), x) => {
                        charge(env, limits, a.len(), 1)?;
                        Ok(a.iter().position(|y| y == x).map_or(Val::Null, Val::from))
                    }
                    _ => Err(not_native()),
                }
            }
            Native::Map(f, cost) => {
                if level >= limits.max_depth {
                    return Err(too_deep(limits));
                }
                let each = |x: &Val| f.eval_at(x, env, limits, level + 1);
                collect_each(input, env, limits, *cost, each)
            }
            Native::Values(x) => {
                if level >= limits.max_depth {
                    return Err(too_deep(limits));
                }
                match x.eval_at(input, env, limits, 0)? {
                    Val::Arr(a) => placed(Val::Arr(a)),
                    Val::Obj(o) => placed(o.values().cloned().collect()),
                    _ => Err(not_native()),
                }
            }
        }
    }
}

impl Builtin {
    fn apply(self, v: &Val) -> Result<Val, EvalError> {
        let float = |f: fn(f64) -> f64| match v {
            Val::Num(_) => v.as_f64().map(|x| Val::from(f(x))).ok_or_else(not_native),
            _ => Err(not_native()),
        };
        match self {
            Builtin::Not => Ok(Val::Bool(!truthy(v))),
            // evaluated in `eval_at`, where the work is counted
            Builtin::Transpose => Err(not_native()),
            Builtin::Exp => float(libm::exp),
            Builtin::Log => float(libm::log),
            Builtin::Sqrt => float(libm::sqrt),
            Builtin::Length => match v {
                Val::Null => Ok(Val::from(0usize)),
                Val::Arr(a) => Ok(Val::from(a.len())),
                Val::Obj(o) => Ok(Val::from(o.len())),
                Val::BStr(b) => Ok(Val::from(b.len())),
                // numbers (|x| per kind of number), text (characters) and errors: jaq's.
                _ => Err(not_native()),
            },
            // `reduce .[] as $x (null; . + $x)` over numbers; anything else is jaq's (strings,
            // arrays and objects added up are the interpreter's, under its budget).
            Builtin::Add => {
                let items: Box<dyn Iterator<Item = &Val>> = match v {
                    Val::Arr(a) => Box::new(a.iter()),
                    Val::Obj(o) => Box::new(o.values()),
                    _ => return Err(not_native()),
                };
                let mut acc = Val::Null;
                for x in items {
                    acc = match (acc, x) {
                        (Val::Null, x @ (Val::Num(_) | Val::Null)) => x.clone(),
                        (a @ Val::Num(_), Val::Null) => a,
                        (a @ Val::Num(_), x @ Val::Num(_)) => {
                            (a + x.clone()).map_err(|_| not_native())?
                        }
                        _ => return Err(not_native()),
                    };
                }
                Ok(acc)
            }
        }
    }
}

/// `each` over an array's elements or an object's values, collected into an array, its work
/// (`cost` per element) counted; iterating anything else is the interpreter's (jq words that
/// error).
fn collect_each(
    v: &Val,
    env: Env<'_>,
    limits: &EvalLimits,
    cost: usize,
    each: impl FnMut(&Val) -> Result<Val, EvalError>,
) -> Result<Val, EvalError> {
    match v {
        Val::Arr(a) => {
            charge(env, limits, a.len(), cost)?;
            a.iter().map(each).collect()
        }
        Val::Obj(o) => {
            charge(env, limits, o.len(), cost)?;
            o.values().map(each).collect()
        }
        _ => Err(not_native()),
    }
}

/// Count `n × per` units of data-proportional work; beyond `inline_ops` the evaluation goes to
/// the interpreter ([`NOT_NATIVE`]), which charges the request's budget for it.
/// `{k: v, …}` placed `level` deep, with room for `more` entries besides its own.
fn build_obj(
    entries: &[(Val, Native)],
    more: usize,
    input: &Val,
    env: Env<'_>,
    limits: &EvalLimits,
    level: usize,
) -> Result<Val, EvalError> {
    if level >= limits.max_depth {
        return Err(too_deep(limits));
    }
    let cap = entries.len().saturating_add(more);
    let mut m = Map::with_capacity_and_hasher(cap, Default::default());
    for (k, v) in entries {
        m.insert(k.clone(), v.eval_at(input, env, limits, level + 1)?);
    }
    Ok(Val::obj(m))
}

/// Make room for `more` entries in the object `m` (a copy of it if it is shared, made at the
/// size it will have, as the first `+` would copy it).
fn grow(m: &mut Arc<Map>, more: usize) {
    match Arc::get_mut(m) {
        Some(own) => own.reserve(more),
        None => {
            let cap = m.len().saturating_add(more);
            let mut copy = Map::with_capacity_and_hasher(cap, Default::default());
            copy.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
            *m = Arc::new(copy);
        }
    }
}

/// jq's `x + y` for the operands the native evaluator models — two numbers (jaq's arithmetic),
/// `null` and anything (the other), two objects (a shallow merge: the right's keys win, new
/// keys after the left's, as jaq adds them); anything else is the interpreter's.
fn add(x: Val, y: Val, env: Env<'_>, limits: &EvalLimits) -> Result<Val, EvalError> {
    match (x, y) {
        (x @ Val::Num(_), y @ Val::Num(_)) => Math::Add.run(x, y).map_err(|_| not_native()),
        (Val::Null, x) | (x, Val::Null) => Ok(x),
        (Val::Obj(mut l), Val::Obj(r)) => {
            charge(env, limits, l.len().saturating_add(r.len()), 1)?;
            if l.len().saturating_add(r.len()) > limits.max_elements {
                return Err(not_native());
            }
            Arc::make_mut(&mut l).extend(r.iter().map(|(k, v)| (k.clone(), v.clone())));
            Ok(Val::Obj(l))
        }
        _ => Err(not_native()),
    }
}

fn charge(env: Env<'_>, limits: &EvalLimits, n: usize, per: usize) -> Result<(), EvalError> {
    let add = u64::try_from(n.saturating_mul(per.max(1))).unwrap_or(u64::MAX);
    let total = env.work.get().saturating_add(add);
    env.work.set(total);
    if total > limits.inline_ops {
        return Err(not_native());
    }
    Ok(())
}

/// jq's `def transpose: [range([.[] | length] | max) as $i | [.[][$i]]];` for an array (or an
/// object's values) of arrays and nulls, at least one row; anything else is the interpreter's.
fn transpose(input: &Val, env: Env<'_>, limits: &EvalLimits) -> Result<Val, EvalError> {
    let rows: Vec<&Val> = match input {
        Val::Arr(a) => a.iter().collect(),
        Val::Obj(o) => o.values().collect(),
        _ => return Err(not_native()),
    };
    let mut width = 0;
    for r in &rows {
        match r {
            Val::Arr(a) => width = width.max(a.len()),
            Val::Null => {}
            // `length` of a string, number or object, then indexing it by number: jaq's.
            _ => return Err(not_native()),
        }
    }
    // `max` of no lengths is `null`, and `range(null)` is jaq's to answer.
    if rows.is_empty() {
        return Err(not_native());
    }
    charge(env, limits, width, rows.len())?;
    Ok((0..width)
        .map(|i| {
            rows.iter()
                .map(|r| match r {
                    Val::Arr(a) => a.get(i).cloned().unwrap_or(Val::Null),
                    _ => Val::Null,
                })
                .collect()
        })
        .collect())
}

fn not_native() -> EvalError {
    EvalError(NOT_NATIVE.into(), EvalErrorKind::Failed)
}

fn too_deep(limits: &EvalLimits) -> EvalError {
    crate::budget::stop_error(jaq_core::budget::Stop::TooDeep, limits)
}

fn too_long(n: usize, limits: &EvalLimits) -> EvalError {
    crate::budget::stop_error(jaq_core::budget::Stop::String(n), limits)
}

/// Append the text of `v` (as jaq displays it) to `s`, failing beyond `max` bytes.
fn display_into(s: &mut String, v: &Val, max: usize) -> Result<(), EvalError> {
    use std::fmt::Write;
    struct Bounded<'a>(&'a mut String, usize);
    impl Write for Bounded<'_> {
        fn write_str(&mut self, x: &str) -> std::fmt::Result {
            if self.0.len() + x.len() > self.1 {
                return Err(std::fmt::Error);
            }
            self.0.push_str(x);
            Ok(())
        }
    }
    write!(Bounded(s, max), "{v}").map_err(|_| {
        EvalError(
            format!(
                "string of more than {max} bytes exceeds server.expressions.max_string_bytes ({max})"
            ),
            EvalErrorKind::TooLarge,
        )
    })
}

fn type_name(v: &Val) -> &'static str {
    match v {
        Val::Null => "null",
        Val::Bool(_) => "boolean",
        Val::Num(_) => "number",
        Val::TStr(_) | Val::BStr(_) => "string",
        Val::Arr(_) => "array",
        Val::Obj(_) => "object",
    }
}

/// `text` as an integer when it is one in canonical JSON form (`0`, or an optional `-` and 1 to
/// 18 digits without a leading zero — `-0` excepted, which keeps its text): the `Int` the JSON
/// reader would make of it.
fn plain_int(text: &[u8]) -> Option<isize> {
    let (neg, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let ok = match digits {
        [b'0'] => !neg,
        [b'1'..=b'9', rest @ ..] => rest.len() < 18 && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !ok {
        return None;
    }
    let n = digits
        .iter()
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    isize::try_from(if neg { -n } else { n }).ok()
}

fn walk(v: &Val, segs: &[Seg]) -> Result<Val, EvalError> {
    let mut cur = v;
    for seg in segs {
        match (cur, seg) {
            (Val::Null, _) => return Ok(Val::Null),
            (Val::Obj(m), Seg::Key(k)) => match json::obj_get_val(m, k) {
                Some(x) => cur = x,
                None => return Ok(Val::Null),
            },
            // jaq's (the reference's) answer: a JSON object has no number keys (jq 1.7 errors)
            (Val::Obj(_), Seg::Index(_)) => return Ok(Val::Null),
            (Val::Arr(a), Seg::Index(i)) => {
                let idx = if *i < 0 {
                    a.len().checked_sub(i.unsigned_abs())
                } else {
                    Some(*i as usize)
                };
                match idx.and_then(|i| a.get(i)) {
                    Some(x) => cur = x,
                    None => return Ok(Val::Null),
                }
            }
            (other, Seg::Key(k)) => {
                return Err(EvalError::failed(format!(
                    "cannot index {} with \"{}\"",
                    type_name(other),
                    json::to_display(k)
                )));
            }
            (other, Seg::Index(i)) => {
                return Err(EvalError::failed(format!(
                    "cannot index {} with number {i}",
                    type_name(other)
                )));
            }
        }
    }
    Ok(cur.clone())
}
