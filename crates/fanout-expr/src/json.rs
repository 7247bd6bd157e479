//! JSON bytes ⇄ [`Val`]: one parse per backend answer (a hand-written parser, [`read`], that
//! keeps number literals as written), and a direct writer for responses (jaq's `Display` is ~5×
//! slower than writing bytes ourselves).
//!
//! Numbers follow jq 1.7: a number literal keeps its exact text while nothing computes with it
//! (`18446744073709551615`, `1.50`, `1e400` come back byte for byte); arithmetic uses floats
//! (see [`jaq_json::Num::from_literal`]).

mod read;

use crate::Val;
use jaq_json::Num;

pub use read::ParseError;

/// Deepest nesting [`parse`] accepts (the default `max_depth` of expressions).
pub const DEFAULT_MAX_DEPTH: usize = 128;
/// Largest `max_depth` [`parse_limited`] honours (config validation caps it there too).
pub const MAX_DEPTH_CAP: usize = 1000;

/// Parse JSON bytes into a value, refusing data nested deeper than [`DEFAULT_MAX_DEPTH`].
pub fn parse(bytes: &[u8]) -> Result<Val, ParseError> {
    parse_limited(bytes, DEFAULT_MAX_DEPTH)
}

/// Parse JSON bytes into a value, refusing data nested deeper than `max_depth` (at most
/// [`MAX_DEPTH_CAP`]; `[]` is 1 deep). The depth is checked as each array or object opens, so
/// the parser's recursion never goes deeper than `max_depth` levels.
pub fn parse_limited(bytes: &[u8], max_depth: usize) -> Result<Val, ParseError> {
    read::parse(bytes, max_depth.min(MAX_DEPTH_CAP))
}

/// A number value for an unsigned 64-bit integer (protobuf `uint64`/`fixed64`, config
/// literals): exact, as a JSON literal of the same digits would be.
pub fn u64_num(n: u64) -> Num {
    match isize::try_from(n) {
        Ok(i) => Num::Int(i),
        Err(_) => Num::from_literal(itoa::Buffer::new().format(n)),
    }
}

/// A number given as its exact decimal text in JSON number syntax (a database's `numeric`):
/// what [`parse`] makes of that text, except that a text longer than
/// [`jaq_json::Num::from_literal`] reads exactly (1000 characters) is kept as written too, not
/// read as the float it is closest to — its length is the data's own, not a parser's input.
pub fn decimal_num(text: String) -> Num {
    if text.len() <= 1000 {
        Num::from_literal(&text)
    } else {
        Num::Dec(jaq_json::Rc::new(text))
    }
}

/// Convert a `serde_json::Value` (e.g. a default from the config) into a value.
pub fn from_serde(v: &serde_json::Value) -> Val {
    use serde_json::Value as J;
    match v {
        J::Null => Val::Null,
        J::Bool(b) => Val::Bool(*b),
        J::Number(n) => Val::Num(if let Some(i) = n.as_i64() {
            Num::from_integral(i)
        } else if let Some(u) = n.as_u64() {
            u64_num(u)
        } else {
            Num::Float(n.as_f64().unwrap_or(f64::NAN))
        }),
        J::String(s) => Val::utf8_str(s.clone().into_bytes()),
        J::Array(a) => a.iter().map(from_serde).collect(),
        J::Object(o) => Val::obj(
            o.iter()
                .map(|(k, v)| (Val::utf8_str(k.clone().into_bytes()), from_serde(v)))
                .collect(),
        ),
    }
}

/// A string value from text.
pub fn str_val(s: &str) -> Val {
    Val::utf8_str(s.to_string().into_bytes())
}

/// A string value from text that lives as long as the program (a key such as `"rows"`): its bytes
/// are not copied.
pub fn static_str_val(s: &'static str) -> Val {
    Val::utf8_str(bytes::Bytes::from_static(s.as_bytes()))
}

/// The value of key `name` in object `o`, without building a key value: a scan of a small
/// object (the keys' bytes compared), a hash lookup of a large one.
pub fn obj_get<'a>(o: &'a jaq_json::Map, name: &str) -> Option<&'a Val> {
    if o.len() <= SCAN_MAX {
        scan(o, name.as_bytes())
    } else {
        o.get(&str_val(name))
    }
}

/// [`obj_get`] with the key as a value (a path's segment): a scan of a small object when the
/// key is a string, else a hash lookup.
pub fn obj_get_val<'a>(o: &'a jaq_json::Map, key: &Val) -> Option<&'a Val> {
    match key {
        Val::TStr(b) | Val::BStr(b) if o.len() <= SCAN_MAX => scan(o, b),
        _ => o.get(key),
    }
}

/// Objects up to this size are searched by comparing keys, which is cheaper than hashing one.
const SCAN_MAX: usize = 8;

fn scan<'a>(o: &'a jaq_json::Map, name: &[u8]) -> Option<&'a Val> {
    o.iter()
        .find(|(k, _)| matches!(k, Val::TStr(b) | Val::BStr(b) if b.as_ref() == name))
        .map(|(_, v)| v)
}

/// Serialize to a JSON string.
pub fn to_string(v: &Val) -> String {
    let mut out = Vec::with_capacity(64);
    write(v, &mut out);
    // `write` only emits valid UTF-8 (invalid bytes in strings are replaced).
    String::from_utf8(out).unwrap_or_default()
}

/// Text form for URLs and headers: strings as they are, everything else as JSON.
pub fn to_display(v: &Val) -> String {
    to_display_cow(v).into_owned()
}

/// [`to_display`] borrowing a UTF-8 string's text instead of copying it.
pub fn to_display_cow(v: &Val) -> std::borrow::Cow<'_, str> {
    match v {
        Val::TStr(b) | Val::BStr(b) => String::from_utf8_lossy(b),
        other => std::borrow::Cow::Owned(to_string(other)),
    }
}

/// Append the JSON encoding of `v` to `out`.
///
/// Recursive, with a small frame per level (values are at most [`MAX_DEPTH_CAP`] deep:
/// about 100 KiB of stack at that depth).
pub fn write(v: &Val, out: &mut Vec<u8>) {
    match v {
        Val::Null => out.extend_from_slice(b"null"),
        Val::Bool(true) => out.extend_from_slice(b"true"),
        Val::Bool(false) => out.extend_from_slice(b"false"),
        Val::Num(n) => write_num(n, out),
        Val::TStr(b) | Val::BStr(b) => write_str(b, out),
        Val::Arr(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out);
            }
            out.push(b']');
        }
        Val::Obj(o) => {
            out.push(b'{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match k {
                    Val::TStr(b) | Val::BStr(b) => write_str(b, out),
                    other => write_str(to_string(other).as_bytes(), out),
                }
                out.push(b':');
                write(x, out);
            }
            out.push(b'}');
        }
    }
}

fn write_num(n: &Num, out: &mut Vec<u8>) {
    match n {
        Num::Int(i) => out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes()),
        Num::Float(f) if f.is_finite() => {
            if f.fract() == 0.0 && f.abs() < 1e15 {
                // Integral floats print as integers, like jq.
                out.extend_from_slice(itoa::Buffer::new().format(*f as i64).as_bytes())
            } else {
                write_shortest(*f, out)
            }
        }
        Num::Float(_) => out.extend_from_slice(b"null"),
        // a literal as written (jq 1.7); text that is not a JSON number (it cannot come from
        // JSON, but jq literals are laxer) as the float it stands for
        Num::Dec(d) if is_json_number(d.as_bytes()) => out.extend_from_slice(d.as_bytes()),
        Num::Dec(d) => write_num(&Num::Float(d.parse().unwrap_or(f64::NAN)), out),
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

/// Whether `b` is a number in JSON syntax (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`).
/// A finite `f64` as the shortest text that reads back as it (`1.5`, `1e-7`, `1.2e22`): zmij's
/// digits, which are ryu's (and jq's) with the exponent's `+` left out. `.0` stays on integral
/// values; callers that print those as integers do so before.
pub fn write_shortest(f: f64, out: &mut Vec<u8>) {
    shortest(f, out)
}

/// [`write_shortest`] for a finite `f32`: the shortest text that reads back as that `f32`
/// (`0.1f32` is `0.1`, not the `0.10000000149011612` of its `f64`), as databases print a
/// `real` in JSON.
pub fn write_shortest_f32(f: f32, out: &mut Vec<u8>) {
    shortest(f, out)
}

fn shortest<F: zmij::Float>(f: F, out: &mut Vec<u8>) {
    let mut b = zmij::Buffer::new();
    let s = b.format_finite(f).as_bytes();
    match s.iter().position(|&c| c == b'+') {
        Some(i) => {
            out.extend_from_slice(&s[..i]);
            out.extend_from_slice(&s[i + 1..]);
        }
        None => out.extend_from_slice(s),
    }
}

fn is_json_number(b: &[u8]) -> bool {
    fn digits(b: &[u8]) -> (usize, &[u8]) {
        let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
        (n, &b[n..])
    }
    let b = b.strip_prefix(b"-").unwrap_or(b);
    let (n, rest) = digits(b);
    if n == 0 || (n > 1 && b[0] == b'0') {
        return false;
    }
    let rest = match rest.strip_prefix(b".") {
        Some(r) => match digits(r) {
            (0, _) => return false,
            (_, r) => r,
        },
        None => rest,
    };
    match rest.first() {
        None => true,
        Some(b'e' | b'E') => {
            let e = &rest[1..];
            let e = e
                .strip_prefix(b"+")
                .or_else(|| e.strip_prefix(b"-"))
                .unwrap_or(e);
            matches!(digits(e), (1.., r) if r.is_empty())
        }
        Some(_) => false,
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether `b` is printable ASCII without `"` or `\\`, checked a word at a time.
#[inline]
fn plain_ascii(b: &[u8]) -> bool {
    let mut chunks = b.chunks_exact(read::W);
    for chunk in &mut chunks {
        let mut word = [0u8; read::W];
        word.copy_from_slice(chunk);
        let x = usize::from_le_bytes(word);
        // a special byte, or one with its high bit set (not ASCII)
        if read::special_bytes(x) | (x & read::HIGH) != 0 {
            return false;
        }
    }
    chunks
        .remainder()
        .iter()
        .all(|&c| (0x20..0x80).contains(&c) && c != b'"' && c != b'\\')
}

fn write_str(b: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
    // Fast path: printable ASCII without quotes or backslashes is written as it is.
    if plain_ascii(b) {
        out.extend_from_slice(b);
        out.push(b'"');
        return;
    }
    let text = match std::str::from_utf8(b) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(b),
    };
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &c) in bytes.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(c >> 4) as usize],
                    HEX[(c & 0xf) as usize],
                ]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Floats are written as ryu writes them (the digits jq and earlier fanout printed), for
    /// random bit patterns and for the decimals prices and scores are made of.
    #[test]
    fn shortest_floats_are_ryus() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let check = |f: f64| {
            if !f.is_finite() {
                return;
            }
            let mut ours = Vec::new();
            write_shortest(f, &mut ours);
            assert_eq!(
                std::str::from_utf8(&ours).ok(),
                Some(ryu::Buffer::new().format_finite(f)),
                "{f:e}"
            );
        };
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            check(f64::from_bits(x));
            check((x % 1_000_000) as f64 / 100.0);
            check((x % 1000) as f64 * 0.1);
        }
        for f in [
            0.0,
            -0.0,
            0.1,
            1e15,
            1e16,
            1e20,
            1e21,
            1e22,
            1e-7,
            5e-324,
            f64::MAX,
            f64::MIN,
        ] {
            check(f);
        }
    }

    /// The word-at-a-time check agrees with the byte-at-a-time one for every byte at every
    /// position of strings of several lengths (a word and a remainder).
    #[test]
    fn plain_ascii_agrees_with_the_bytewise_check() {
        let naive = |b: &[u8]| {
            b.iter()
                .all(|&c| (0x20..0x80).contains(&c) && c != b'"' && c != b'\\')
        };
        for len in [1usize, 7, 8, 9, 16, 21] {
            for pos in 0..len {
                for c in 0..=255u8 {
                    let mut b = vec![b'a'; len];
                    b[pos] = c;
                    assert_eq!(plain_ascii(&b), naive(&b), "{c:#x} at {pos} of {len}");
                }
            }
        }
        assert!(plain_ascii(b""));
    }

    #[test]
    fn a_key_is_found_alike_in_small_and_large_objects() {
        for n in [1usize, 8, 9, 40] {
            let o: jaq_json::Map = (0..n)
                .map(|i| (str_val(&format!("k{i}")), Val::from(i)))
                .collect();
            let last = format!("k{}", n - 1);
            assert_eq!(obj_get(&o, &last), Some(&Val::from(n - 1)), "{n}");
            assert_eq!(obj_get_val(&o, &str_val("k0")), Some(&Val::from(0usize)));
            assert_eq!(obj_get(&o, "absent"), None);
            assert_eq!(obj_get_val(&o, &Val::from(0usize)), None);
        }
        assert_eq!(to_string(&static_str_val("rows")), r#""rows""#);
    }

    #[test]
    fn strings_needing_no_escape_and_those_needing_one_are_written_right() {
        for (s, want) in [
            ("plain text", r#""plain text""#),
            ("", r#""""#),
            ("q\"", r#""q\"""#),
            ("tab\t", r#""tab\t""#),
            ("é\u{7f}", "\"é\u{7f}\""),
        ] {
            assert_eq!(to_string(&str_val(s)), want, "{s:?}");
        }
    }

    #[test]
    fn round_trip() {
        let src = r#"{"a":[1,2.5,-3,null,true,false],"s":"q\"\\\n\u0001é","big":123456789012345678901234567890,"o":{}}"#;
        let v = parse(src.as_bytes()).unwrap();
        let out = to_string(&v);
        assert_eq!(out, src);
        // serde_json's values hold floats: the same without the big number
        let src = src.replace("123456789012345678901234567890", "12345");
        let a: serde_json::Value = serde_json::from_str(&src).unwrap();
        assert_eq!(
            to_string(&from_serde(&a)),
            to_string(&parse(src.as_bytes()).unwrap())
        );
    }

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    /// Run `f` on a thread with a 2 MiB stack (like an I/O worker's).
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn depth_limits() {
        assert!(parse(nested(128).as_bytes()).is_ok());
        let err = parse(nested(129).as_bytes()).unwrap_err().to_string();
        assert!(err.contains("deeper than 128"), "{err}");
        assert!(parse_limited(nested(10).as_bytes(), 10).is_ok());
        assert!(parse_limited(nested(11).as_bytes(), 10).is_err());
        assert!(parse_limited(br#"{"a":{"b":[1]}}"#, 3).is_ok());
        assert!(parse_limited(br#"{"a":{"b":[1]}}"#, 2).is_err());
        // capped at 1000, and never overflows, however deep the input
        on_small_stack(|| {
            assert!(parse_limited(nested(1000).as_bytes(), 5000).is_ok());
            assert!(parse_limited(nested(1001).as_bytes(), 5000).is_err());
            assert!(parse_limited(nested(100_000).as_bytes(), 1000).is_err());
            let unclosed = "[".repeat(1 << 20);
            assert!(parse_limited(unclosed.as_bytes(), 1000).is_err());
        });
    }

    #[test]
    fn write_deep_values_on_a_small_stack() {
        on_small_stack(|| {
            let src = format!("{}1{}", r#"{"a":["#.repeat(500), "]}".repeat(500));
            let v = parse_limited(src.as_bytes(), 1000).unwrap();
            assert_eq!(to_string(&v), src);
            let v = parse_limited(nested(1000).as_bytes(), 1000).unwrap();
            assert_eq!(to_string(&v).len(), 2000);
            drop(v);
        });
    }

    #[test]
    fn display_strings_raw() {
        assert_eq!(to_display(&str_val("a b")), "a b");
        assert_eq!(to_display(&parse(b"12").unwrap()), "12");
    }
}
