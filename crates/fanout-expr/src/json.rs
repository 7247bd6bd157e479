//! JSON bytes ⇄ [`Val`]: one parse per backend answer, and a direct writer for responses
//! (jaq's `Display` is ~5× slower than writing bytes ourselves).

use crate::Val;
use jaq_json::Num;

/// Parse JSON bytes into a value.
pub fn parse(bytes: &[u8]) -> Result<Val, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// Convert a `serde_json::Value` (e.g. a default from the config) into a value.
pub fn from_serde(v: &serde_json::Value) -> Val {
    use serde_json::Value as J;
    match v {
        J::Null => Val::Null,
        J::Bool(b) => Val::Bool(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64().and_then(|i| isize::try_from(i).ok()) {
                Val::Num(Num::Int(i))
            } else {
                Val::Num(Num::Float(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
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

/// Serialize to a JSON string.
pub fn to_string(v: &Val) -> String {
    let mut out = Vec::with_capacity(64);
    write(v, &mut out);
    // `write` only emits valid UTF-8 (invalid bytes in strings are replaced).
    String::from_utf8(out).unwrap_or_default()
}

/// Text form for URLs and headers: strings as they are, everything else as JSON.
pub fn to_display(v: &Val) -> String {
    match v {
        Val::TStr(b) | Val::BStr(b) => String::from_utf8_lossy(b).into_owned(),
        other => to_string(other),
    }
}

/// Append the JSON encoding of `v` to `out`.
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
                out.extend_from_slice(ryu::Buffer::new().format_finite(*f).as_bytes())
            }
        }
        Num::Float(_) => out.extend_from_slice(b"null"),
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn write_str(b: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
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

    #[test]
    fn round_trip() {
        let src = r#"{"a":[1,2.5,-3,null,true,false],"s":"q\"\\\n\u0001é","big":123456789012345678901234567890,"o":{}}"#;
        let v = parse(src.as_bytes()).unwrap();
        let out = to_string(&v);
        let a: serde_json::Value = serde_json::from_str(src).unwrap();
        let b: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(a, b, "{out}");
        assert_eq!(
            to_string(&from_serde(&a)),
            to_string(&parse(out.as_bytes()).unwrap())
        );
    }

    #[test]
    fn display_strings_raw() {
        assert_eq!(to_display(&str_val("a b")), "a b");
        assert_eq!(to_display(&parse(b"12").unwrap()), "12");
    }
}
