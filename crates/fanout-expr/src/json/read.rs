//! JSON bytes → [`Val`]: a hand-written parser (RFC 8259, strict) that keeps number literals.
//!
//! serde_json hands a visitor an `f64` for every number that is not a 64-bit integer, so
//! `123456789012345678901234567890` or `1.50` could not come back as written. This parser
//! sees each number's text and applies [`Num::from_literal`] (jq 1.7's rule: a literal keeps
//! its text until something computes with it); the common numbers cost no allocation:
//! integers that fit `isize` and decimals that print back as written are plain machine
//! numbers. It is also faster than serde_json + a visitor (no `serde` indirection; strings are
//! scanned a word at a time).
//!
//! Errors read like serde_json's (`expected value at line 1 column 3`).

use crate::Val;
use jaq_json::{Map, Num};
use std::borrow::Cow;

/// The input is not one JSON value, or nests deeper than allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg} at line {line} column {column}")]
pub struct ParseError {
    msg: Cow<'static, str>,
    line: usize,
    column: usize,
}

impl ParseError {
    /// Line of the error (1-based).
    pub fn line(&self) -> usize {
        self.line
    }

    /// Column of the error (1-based bytes into the line; 0 before its first byte).
    pub fn column(&self) -> usize {
        self.column
    }

    /// What is wrong, without the position.
    pub fn message(&self) -> &str {
        &self.msg
    }
}

/// Parse exactly one JSON value (whitespace around it allowed); containers at most `max`
/// levels deep (`[]` is 1).
pub(crate) fn parse(bytes: &[u8], max: usize) -> Result<Val, ParseError> {
    let mut p = Parser {
        b: bytes,
        i: 0,
        max,
        vals: Vec::new(),
        entries: Vec::new(),
    };
    p.ws();
    let v = p.value(max)?;
    p.ws();
    if p.i < p.b.len() {
        return Err(p.err("trailing characters"));
    }
    Ok(v)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    max: usize,
    /// The elements of the arrays being read (a stack: an inner array's above its parent's),
    /// so each array is made once at its final size instead of grown.
    vals: Vec<Val>,
    /// Likewise the entries of the objects being read: each map is sized once.
    entries: Vec<(Val, Val)>,
}

/// Bytes in a word (the string scans read a word at a time).
pub(crate) const W: usize = std::mem::size_of::<usize>();
const ONES: usize = usize::MAX / 255;
/// The high bit of every byte of a word.
pub(crate) const HIGH: usize = ONES << 7;

/// The high bit set in the bytes of word `x` that are [`special`] (below 0x20, `"` or `\\`) —
/// at least the lowest such byte exactly (higher flags may be spurious), none when there is
/// none.
#[inline]
pub(crate) fn special_bytes(x: usize) -> usize {
    let ctrl = x.wrapping_sub(ONES * 0x20) & !x;
    let q = x ^ (ONES * usize::from(b'"'));
    let quote = q.wrapping_sub(ONES) & !q;
    let bs = x ^ (ONES * usize::from(b'\\'));
    let backslash = bs.wrapping_sub(ONES) & !bs;
    (ctrl | quote | backslash) & HIGH
}

/// Bytes a JSON string cannot hold unescaped, or that end its plain run.
#[inline]
fn special(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

impl<'a> Parser<'a> {
    #[cold]
    #[inline(never)]
    fn err(&self, msg: impl Into<Cow<'static, str>>) -> ParseError {
        let at = self.i.min(self.b.len());
        let before = &self.b[..at];
        let line = 1 + before.iter().filter(|c| **c == b'\n').count();
        let start = before
            .iter()
            .rposition(|c| *c == b'\n')
            .map_or(0, |n| n + 1);
        // serde_json's convention: the column of the offending byte (1-based)
        let column = at - start + usize::from(at < self.b.len());
        ParseError {
            msg: msg.into(),
            line,
            column,
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    fn value(&mut self, left: usize) -> Result<Val, ParseError> {
        match self.peek() {
            None => Err(self.err("EOF while parsing a value")),
            Some(b'"') => {
                self.i += 1;
                Ok(Val::utf8_str(self.string()?))
            }
            Some(b'{') => self.object(left),
            Some(b'[') => self.array(left),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.ident(b"true", Val::Bool(true)),
            Some(b'f') => self.ident(b"false", Val::Bool(false)),
            Some(b'n') => self.ident(b"null", Val::Null),
            Some(_) => Err(self.err("expected value")),
        }
    }

    fn ident(&mut self, word: &[u8], v: Val) -> Result<Val, ParseError> {
        for &c in word {
            match self.peek() {
                Some(x) if x == c => self.i += 1,
                Some(_) => return Err(self.err("expected ident")),
                None => return Err(self.err("EOF while parsing a value")),
            }
        }
        Ok(v)
    }

    /// One level down from `left`, or the depth error.
    fn down(&self, left: usize) -> Result<usize, ParseError> {
        left.checked_sub(1)
            .ok_or_else(|| self.err(format!("JSON nested deeper than {} levels", self.max)))
    }

    #[inline(never)]
    fn array(&mut self, left: usize) -> Result<Val, ParseError> {
        let inner = self.down(left)?;
        self.i += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(Val::Arr(Vec::new().into()));
        }
        let base = self.vals.len();
        loop {
            let v = self.value(inner)?;
            self.vals.push(v);
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(b']') {
                        return Err(self.err("trailing comma"));
                    }
                }
                Some(b']') => {
                    self.i += 1;
                    let out: Vec<Val> = self.vals.drain(base..).collect();
                    return Ok(Val::Arr(out.into()));
                }
                Some(_) => return Err(self.err("expected `,` or `]`")),
                None => return Err(self.err("EOF while parsing a list")),
            }
        }
    }

    #[inline(never)]
    fn object(&mut self, left: usize) -> Result<Val, ParseError> {
        let inner = self.down(left)?;
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Val::obj(Map::default()));
        }
        let base = self.entries.len();
        loop {
            match self.peek() {
                Some(b'"') => self.i += 1,
                Some(_) => return Err(self.err("key must be a string")),
                None => return Err(self.err("EOF while parsing an object")),
            }
            let k = self.string()?;
            self.ws();
            match self.peek() {
                Some(b':') => self.i += 1,
                Some(_) => return Err(self.err("expected `:`")),
                None => return Err(self.err("EOF while parsing an object")),
            }
            self.ws();
            let v = self.value(inner)?;
            self.entries.push((Val::utf8_str(k), v));
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(b'}') {
                        return Err(self.err("trailing comma"));
                    }
                }
                Some(b'}') => {
                    self.i += 1;
                    let n = self.entries.len() - base;
                    let mut out = Map::with_capacity_and_hasher(n, Default::default());
                    // a repeated key keeps its first place and its last value, as before
                    for (k, v) in self.entries.drain(base..) {
                        out.insert(k, v);
                    }
                    return Ok(Val::obj(out));
                }
                Some(_) => return Err(self.err("expected `,` or `}`")),
                None => return Err(self.err("EOF while parsing an object")),
            }
        }
    }

    /// Move `i` to the next byte that ends a plain run of string bytes (or to the end),
    /// a word at a time (the technique serde_json uses); whether the run was all ASCII (then
    /// it needs no UTF-8 check).
    #[inline]
    fn skip_plain(&mut self) -> bool {
        let mut seen = 0usize;
        while let Some(chunk) = self.b.get(self.i..self.i + W) {
            let mut word = [0u8; W];
            word.copy_from_slice(chunk);
            let x = usize::from_le_bytes(word);
            let hit = special_bytes(x);
            if hit != 0 {
                // the lowest flagged byte is exactly the first special one
                let n = (hit.trailing_zeros() / 8) as usize;
                // the bytes before it (the high bits of a byte below 0x80 never leak)
                let first = hit & hit.wrapping_neg();
                seen |= x & HIGH & (first - 1);
                self.i += n;
                return seen == 0;
            }
            seen |= x & HIGH;
            self.i += W;
        }
        while let Some(&c) = self.b.get(self.i) {
            if special(c) {
                break;
            }
            seen |= usize::from(c & 0x80);
            self.i += 1;
        }
        seen == 0
    }

    /// A string's bytes (UTF-8 checked), `i` just after its opening quote.
    fn string(&mut self) -> Result<Vec<u8>, ParseError> {
        let start = self.i;
        let ascii = self.skip_plain();
        match self.peek() {
            Some(b'"') => {
                let s = &self.b[start..self.i];
                if !ascii && std::str::from_utf8(s).is_err() {
                    return Err(self.err("invalid unicode code point"));
                }
                self.i += 1;
                Ok(s.to_vec())
            }
            _ => self.string_slow(start, ascii),
        }
    }

    /// The rest of a string with escapes (`i` at the first byte that is not plain; `ascii`:
    /// whether the bytes so far were).
    #[inline(never)]
    fn string_slow(&mut self, start: usize, mut ascii: bool) -> Result<Vec<u8>, ParseError> {
        let mut out = self.b[start..self.i].to_vec();
        loop {
            match self.peek() {
                None => return Err(self.err("EOF while parsing a string")),
                Some(b'"') => {
                    self.i += 1;
                    // plain runs are split at ASCII bytes and escapes add whole characters:
                    // checking the whole is checking every run
                    if !ascii && std::str::from_utf8(&out).is_err() {
                        return Err(self.err("invalid unicode code point"));
                    }
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    self.escape(&mut out)?;
                }
                Some(c) if c < 0x20 => {
                    return Err(self
                        .err("control character (\\u0000-\\u001F) found while parsing a string"));
                }
                Some(_) => {}
            }
            let run = self.i;
            ascii &= self.skip_plain();
            out.extend_from_slice(&self.b[run..self.i]);
        }
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), ParseError> {
        let Some(c) = self.peek() else {
            return Err(self.err("EOF while parsing a string"));
        };
        self.i += 1;
        let byte = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let ch = self.unicode_escape()?;
                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                return Ok(());
            }
            _ => {
                self.i -= 1;
                return Err(self.err("invalid escape"));
            }
        };
        out.push(byte);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u16, ParseError> {
        let Some(h) = self.b.get(self.i..self.i + 4) else {
            self.i = self.b.len();
            return Err(self.err("EOF while parsing a string"));
        };
        let mut n = 0u16;
        for &c in h {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(self.err("invalid escape")),
            };
            n = (n << 4) | u16::from(d);
        }
        self.i += 4;
        Ok(n)
    }

    /// `\uXXXX` (after the `u`), a surrogate pair as one character.
    fn unicode_escape(&mut self) -> Result<char, ParseError> {
        let n = self.hex4()?;
        let code = match n {
            0xD800..=0xDBFF => {
                if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                    return Err(self.err("lone leading surrogate in hex escape"));
                }
                self.i += 2;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(self.err("lone leading surrogate in hex escape"));
                }
                0x10000 + ((u32::from(n) - 0xD800) << 10) + (u32::from(low) - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.err("invalid unicode code point")),
            n => u32::from(n),
        };
        char::from_u32(code).ok_or_else(|| self.err("invalid unicode code point"))
    }

    /// A number (JSON syntax checked); its value by [`Num::from_literal`], with a fast path
    /// for integers of up to 18 digits.
    fn number(&mut self) -> Result<Val, ParseError> {
        let start = self.i;
        let neg = self.peek() == Some(b'-');
        if neg {
            self.i += 1;
        }
        let int_start = self.i;
        let mut m: u64 = 0;
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(c @ b'1'..=b'9') => {
                m = u64::from(c - b'0');
                self.i += 1;
                while let Some(c @ b'0'..=b'9') = self.peek() {
                    m = m.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
                    self.i += 1;
                }
            }
            _ => return Err(self.err("invalid number")),
        }
        let int_len = self.i - int_start;
        let mut plain_int = true;
        if self.peek() == Some(b'.') {
            plain_int = false;
            self.i += 1;
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            plain_int = false;
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.digits()?;
        }
        if let Some(b'0'..=b'9') = self.peek() {
            // `01`: a leading zero
            return Err(self.err("invalid number"));
        }
        if plain_int && int_len <= 18 && !(neg && m == 0) {
            // below 10^18: no overflow in `m`, and it fits i64
            let i = if neg { -(m as i64) } else { m as i64 };
            if let Ok(i) = isize::try_from(i) {
                return Ok(Val::Num(Num::Int(i)));
            }
        }
        // ASCII by construction
        let text = std::str::from_utf8(&self.b[start..self.i]).unwrap_or("0");
        Ok(Val::Num(Num::from_literal(text)))
    }

    /// One or more digits.
    fn digits(&mut self) -> Result<(), ParseError> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(match self.peek() {
                None => self.err("EOF while parsing a value"),
                Some(_) => self.err("invalid number"),
            });
        }
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        Ok(())
    }
}
