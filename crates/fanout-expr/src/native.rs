//! The native evaluator: the subset of jq that flows use most — paths, literals, string
//! interpolation, object and array construction, `//` — evaluated directly over [`Val`] with jq's
//! semantics. Recognised from jaq's own parse tree; anything else goes to the interpreter.

use crate::{EvalError, EvalErrorKind, EvalLimits, Val, json, truthy};
use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Term};
use jaq_core::path::{Opt, Part};
use jaq_json::Map;

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
    Some(match t {
        Term::Id => Native::Path {
            var: None,
            segs: vec![],
        },
        Term::Num(n) => Native::Lit(json::parse(n.as_bytes()).ok()?),
        Term::Neg(inner) => match &**inner {
            Term::Num(n) => Native::Lit(json::parse(format!("-{n}").as_bytes()).ok()?),
            _ => return None,
        },
        Term::Str(None, parts) => {
            let mut pieces = Vec::new();
            for p in parts {
                match p {
                    StrPart::Str(s) => push_text(&mut pieces, s),
                    StrPart::Char(c) => push_text(&mut pieces, c.encode_utf8(&mut [0; 4])),
                    StrPart::Term(t) => pieces.push(Piece::Expr(from_term(t, scope)?)),
                }
            }
            match pieces.as_slice() {
                [] => Native::Lit(json::str_val("")),
                [Piece::Text(s)] => Native::Lit(json::str_val(s)),
                _ => Native::Interp(pieces),
            }
        }
        Term::Var(v) => Native::Path {
            var: Some(scope.iter().position(|s| Some(*s) == v.strip_prefix('$'))?),
            segs: vec![],
        },
        Term::Path(head, path) => {
            let Native::Path { var, mut segs } = from_term(head, scope)? else {
                return None;
            };
            for (part, opt) in &path.0 {
                if !matches!(opt, Opt::Essential) {
                    return None;
                }
                let Part::Index(key) = part else { return None };
                segs.push(match key {
                    Term::Str(None, parts) => Seg::Key(json::str_val(&plain_str(parts)?)),
                    Term::Num(n) => Seg::Index(n.parse().ok()?),
                    Term::Neg(inner) => match &**inner {
                        Term::Num(n) => Seg::Index(-n.parse::<isize>().ok()?),
                        _ => return None,
                    },
                    _ => return None,
                });
            }
            Native::Path { var, segs }
        }
        Term::Obj(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let (key, value) = match (k, v) {
                    (Term::Str(None, parts), Some(v)) => (plain_str(parts)?, from_term(v, scope)?),
                    (Term::Str(None, parts), None) => {
                        let key = plain_str(parts)?;
                        let path = Native::Path {
                            var: None,
                            segs: vec![Seg::Key(json::str_val(&key))],
                        };
                        (key, path)
                    }
                    (Term::Var(x), None) => {
                        (x.strip_prefix('$')?.to_string(), from_term(k, scope)?)
                    }
                    _ => return None,
                };
                out.push((json::str_val(&key), value));
            }
            Native::Obj(out)
        }
        Term::Arr(None) => Native::Lit(Val::Arr(Default::default())),
        Term::Arr(Some(inner)) => {
            let mut items = Vec::new();
            flatten_commas(inner, &mut items);
            Native::Arr(
                items
                    .into_iter()
                    .map(|t| from_term(t, scope))
                    .collect::<Option<_>>()?,
            )
        }
        Term::BinOp(l, BinaryOp::Alt, r) => Native::Alt(
            Box::new(from_term(l, scope)?),
            Box::new(from_term(r, scope)?),
        ),
        Term::BinOp(l, BinaryOp::Pipe(None), r) => match &**r {
            Term::Call("tonumber", args) if args.is_empty() => {
                Native::ToNumber(Box::new(from_term(l, scope)?))
            }
            _ => return None,
        },
        _ => return None,
    })
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
        }
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
            _ => self.eval_at(input, lookup, limits, 0),
        }
    }

    /// Evaluate a value that will be placed `level` levels deep in the result.
    fn eval_at(
        &self,
        input: &Val,
        lookup: &dyn Fn(usize) -> Val,
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
                Some(i) => walk(&lookup(*i), segs)?,
                None => walk(input, segs)?,
            }),
            Native::Interp(pieces) => {
                let mut s = String::new();
                for p in pieces {
                    match p {
                        Piece::Text(t) => s.push_str(t),
                        Piece::Expr(e) => match e.eval_at(input, lookup, limits, 0)? {
                            Val::TStr(b) | Val::BStr(b) => s.push_str(&String::from_utf8_lossy(&b)),
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
            Native::Obj(entries) => {
                if level >= limits.max_depth {
                    return Err(too_deep(limits));
                }
                let mut m = Map::default();
                for (k, v) in entries {
                    m.insert(k.clone(), v.eval_at(input, lookup, limits, level + 1)?);
                }
                Ok(Val::obj(m))
            }
            Native::Arr(items) => {
                if level >= limits.max_depth {
                    return Err(too_deep(limits));
                }
                let eval = |x: &Native| x.eval_at(input, lookup, limits, level + 1);
                items.iter().map(eval).collect()
            }
            // As in jaq (our reference), an error on the left propagates.
            Native::Alt(l, r) => match l.eval_at(input, lookup, limits, level)? {
                v if truthy(&v) => Ok(v),
                _ => r.eval_at(input, lookup, limits, level),
            },
            Native::ToNumber(inner) => match inner.eval_at(input, lookup, limits, level)? {
                v @ Val::Num(_) => Ok(v),
                Val::TStr(b) | Val::BStr(b)
                    if b.len() <= MAX_NATIVE_NUMBER
                        && !b.iter().any(|c| *c == b'[' || *c == b'{') =>
                {
                    // jq's `tonumber` is `fromjson` for strings: the same reader; exactly one
                    // number is ours, anything else (several values, an error) the interpreter's.
                    let mut values = jaq_json::read::parse_many(&b);
                    match (values.next(), values.next()) {
                        (Some(Ok(v @ Val::Num(_))), None) => Ok(v),
                        _ => Err(not_native()),
                    }
                }
                _ => Err(not_native()),
            },
        }
    }
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

fn walk(v: &Val, segs: &[Seg]) -> Result<Val, EvalError> {
    let mut cur = v;
    for seg in segs {
        match (cur, seg) {
            (Val::Null, _) => return Ok(Val::Null),
            (Val::Obj(m), Seg::Key(k)) => match json::obj_get_val(m, k) {
                Some(x) => cur = x,
                None => return Ok(Val::Null),
            },
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
