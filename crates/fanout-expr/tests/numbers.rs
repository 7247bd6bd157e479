//! Numbers pass through unchanged (jq 1.7): a number literal keeps its exact text while nothing
//! computes with it; arithmetic uses floats. The parser and writer of `fanout_expr::json`, and
//! expressions over their values (native and jaq).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // test code: a failed unwrap is a failed test

use fanout_expr::{Expr, Val, json};
use jaq_json::Num;

fn v(s: &str) -> Val {
    json::parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn eval(src: &str, input: &str) -> Val {
    let e = Expr::compile(src, &[]).unwrap();
    e.eval(&v(input), |_| Val::Null).unwrap()
}

fn eval_str(src: &str, input: &str) -> String {
    json::to_string(&eval(src, input))
}

/// Literals that come back byte for byte, alone, in an array and in an object.
const LITERALS: &[&str] = &[
    "0",
    "-1",
    "42",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-18446744073709551615",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "-123456789012345678901234567890",
    "12345678901234567",
    "0.1000000000000000055511151231257827",
    "-0.1000000000000000055511151231257827",
    "3.141592653589793238462643383279",
    "1.50",
    "1.0",
    "100.0",
    "0.5",
    "-2.5",
    "3.14159",
    "0.00001",
    "0.000001",
    "123456789.123456",
    "1e400",
    "-1e400",
    "1e-400",
    "1E-5",
    "1e-5",
    "2.5E+10",
    "1e2",
    "1E2",
    "-0",
    "-0.0",
    "0.0",
    "0e0",
];

#[test]
fn literals_come_back_byte_for_byte() {
    for lit in LITERALS {
        assert_eq!(json::to_string(&v(lit)), *lit);
        let arr = format!("[{lit},1,{lit}]");
        assert_eq!(json::to_string(&v(&arr)), arr);
        let obj = format!(r#"{{"id":{lit},"n":{{"x":[{lit}]}}}}"#);
        assert_eq!(json::to_string(&v(&obj)), obj);
        // through an expression that only moves the value (native, then jaq)
        assert_eq!(eval_str(".id", &obj), *lit, "native .id of {obj}");
        assert_eq!(eval_str("[.n.x[0], .id] | .[1]", &obj), *lit, "jaq");
        assert_eq!(eval_str("{a: .id}", &obj), format!(r#"{{"a":{lit}}}"#));
        // tojson and string interpolation show the text too
        assert_eq!(eval_str(".id | tojson", &obj), format!("\"{lit}\""));
        assert_eq!(eval_str(r#""\(.id)""#, &obj), format!("\"{lit}\""));
    }
}

#[test]
fn common_numbers_cost_no_allocation() {
    let num = |s: &str| match v(s) {
        Val::Num(n) => n,
        other => panic!("{other:?}"),
    };
    assert!(matches!(num("42"), Num::Int(42)));
    assert!(matches!(num("-9223372036854775808"), Num::Int(i) if i == isize::MIN));
    assert!(matches!(num("2.5"), Num::Float(f) if f == 2.5));
    assert!(matches!(num("-0.00001"), Num::Float(f) if f == -0.00001));
    assert!(matches!(num("123456789.123456"), Num::Float(f) if f == 123456789.123456));
    for kept in [
        "18446744073709551615",
        "1.50",
        "1e2",
        "-0",
        "0.000001",
        "1234567890.123456",
    ] {
        assert!(
            matches!(num(kept), Num::Dec(ref d) if **d == kept),
            "{kept}"
        );
    }
}

#[test]
fn arithmetic_uses_floats_like_jq() {
    let big = "18446744073709551615";
    let sum = eval(". + 1", big);
    assert!(
        matches!(sum, Val::Num(Num::Float(f)) if f == 18446744073709551616.0),
        "{sum:?}"
    );
    assert_eq!(json::to_string(&sum), "1.8446744073709552e19");
    assert!(matches!(eval(". - 1", big), Val::Num(Num::Float(_))));
    assert!(matches!(eval(". * 2", "1.50"), Val::Num(Num::Float(f)) if f == 3.0));
    assert_eq!(eval_str(". * 1", "1.50"), "1.5");
    assert_eq!(
        eval_str(". + 0", "0.1000000000000000055511151231257827"),
        "0.1"
    );
    assert_eq!(eval_str(". / 2", "1e2"), "50");
    assert_eq!(
        eval_str(". + 1", "1e400"),
        "null",
        "infinity is written as null"
    );
    assert_eq!(eval_str("floor", "1.50"), "1");
    // negation keeps the text
    assert_eq!(eval_str("-.", big), "-18446744073709551615");
    assert_eq!(eval_str("-.", "-1.50"), "1.50");
    // small integers stay integers
    assert_eq!(eval_str(". + 1", "41"), "42");
}

#[test]
fn literals_compare_exactly() {
    let big = "18446744073709551615";
    assert_eq!(eval_str(". == 18446744073709551615", big), "true");
    assert_eq!(eval_str(". == 18446744073709551614", big), "false");
    assert_eq!(eval_str(". > 18446744073709551614", big), "true");
    assert_eq!(eval_str(". < 18446744073709551616", big), "true");
    assert_eq!(
        eval_str(
            "sort",
            "[18446744073709551615,18446744073709551614,-1,1e2,2.5]"
        ),
        "[-1,2.5,1e2,18446744073709551614,18446744073709551615]"
    );
    assert_eq!(
        eval_str(
            "unique",
            "[18446744073709551615,18446744073709551614,18446744073709551615]"
        ),
        "[18446744073709551614,18446744073709551615]"
    );
    assert_eq!(
        eval_str(". == 0.1", "0.1000000000000000055511151231257827"),
        "false"
    );
    assert_eq!(eval_str(". == 1.5", "1.50"), "true");
    assert_eq!(eval_str(". == 1", "1.0"), "true");
    assert_eq!(eval_str(". == 100", "1e2"), "true");
    assert_eq!(eval_str(". == 0", "-0"), "true");
    assert_eq!(
        eval_str(". == 9223372036854775807", "9223372036854775808"),
        "false"
    );
    assert_eq!(
        eval_str(". > 9223372036854775807", "9223372036854775808"),
        "true"
    );
    assert_eq!(
        eval_str(". < -9223372036854775808", "-9223372036854775809"),
        "true"
    );
    assert_eq!(eval_str(". < 1e401", "1e400"), "true");
    // against floats (computed values): as floats
    assert_eq!(eval_str(". == (0.5 + 0.5)", "1.0"), "true");
    // object lookups by such a value
    assert_eq!(
        eval_str(
            "group_by(.id) | map(length)",
            r#"[{"id":18446744073709551615},{"id":18446744073709551614},{"id":18446744073709551615}]"#
        ),
        "[1,2]"
    );
}

#[test]
fn fromjson_tonumber_and_program_literals_keep_text_too() {
    assert_eq!(
        eval_str(r#""18446744073709551615" | tonumber"#, "null"),
        "18446744073709551615"
    );
    assert_eq!(
        eval_str(
            r#""[1.50, 123456789012345678901234567890]" | fromjson"#,
            "null"
        ),
        "[1.50,123456789012345678901234567890]"
    );
    assert_eq!(
        eval_str("[18446744073709551615, 1.50, 2.5]", "null"),
        "[18446744073709551615,1.50,2.5]"
    );
    // a big literal in a program is a literal too: `+ 1` is a float
    assert!(matches!(
        eval("18446744073709551615 + 1", "null"),
        Val::Num(Num::Float(_))
    ));
    // the interpreter and the native evaluator agree
    for src in [
        "18446744073709551615",
        "-18446744073709551615",
        "1.50",
        "{a: 1e400}",
    ] {
        let native = Expr::compile(src, &[]).unwrap();
        let jaq = Expr::compile_interpreted(src, &[]).unwrap();
        let a = json::to_string(&native.eval(&Val::Null, |_| Val::Null).unwrap());
        let b = json::to_string(&jaq.eval(&Val::Null, |_| Val::Null).unwrap());
        assert_eq!(a, b, "{src}");
    }
}

#[test]
fn config_literals_and_u64() {
    let j = serde_json::json!({"a": 18446744073709551615u64, "b": -5, "c": 2.5});
    assert_eq!(
        json::to_string(&json::from_serde(&j)),
        r#"{"a":18446744073709551615,"b":-5,"c":2.5}"#
    );
    assert_eq!(json::u64_num(u64::MAX).to_string(), "18446744073709551615");
    assert!(matches!(json::u64_num(7), Num::Int(7)));
}

#[test]
fn huge_literals_are_bounded() {
    // more than 1000 characters: a float, as before (never a panic, time linear in the size)
    let digits = "9".repeat(1 << 20);
    assert_eq!(json::to_string(&v(&digits)), "null", "infinite");
    let long = format!("0.{}", "3".repeat(5000));
    assert_eq!(json::to_string(&v(&long)), "0.3333333333333333");
    let exp = format!("1e{}", "9".repeat(900));
    assert_eq!(
        json::to_string(&v(&exp)),
        exp,
        "kept: below 1000 characters"
    );
    assert_eq!(eval_str(". + 1", &exp), "null");
    assert_eq!(eval_str(". > 1e400", &exp), "true");
    // a text that is not JSON (jaq literals are laxer) is written as its float
    let odd = Val::Num(Num::Dec(jaq_json::Rc::new("+5".to_string())));
    assert_eq!(json::to_string(&odd), "5");
}

#[test]
fn errors_are_precise() {
    let err = |s: &str| json::parse(s.as_bytes()).unwrap_err().to_string();
    let cases = [
        ("", "EOF while parsing a value at line 1 column 0"),
        ("   ", "EOF while parsing a value at line 1 column 3"),
        ("x", "expected value at line 1 column 1"),
        ("[1 2]", "expected `,` or `]` at line 1 column 4"),
        ("[1,]", "trailing comma at line 1 column 4"),
        ("{\"a\":1,}", "trailing comma at line 1 column 8"),
        ("{\"a\" 1}", "expected `:` at line 1 column 6"),
        ("{1:2}", "key must be a string at line 1 column 2"),
        ("{\"a\":1", "EOF while parsing an object at line 1 column 6"),
        ("[1", "EOF while parsing a list at line 1 column 2"),
        ("\"abc", "EOF while parsing a string at line 1 column 4"),
        ("1 2", "trailing characters at line 1 column 3"),
        ("01", "invalid number at line 1 column 2"),
        ("1.", "EOF while parsing a value at line 1 column 2"),
        ("1.x", "invalid number at line 1 column 3"),
        ("-", "invalid number at line 1 column 1"),
        ("1e", "EOF while parsing a value at line 1 column 2"),
        ("+1", "expected value at line 1 column 1"),
        ("NaN", "expected value at line 1 column 1"),
        ("tru", "EOF while parsing a value at line 1 column 3"),
        ("nul1", "expected ident at line 1 column 4"),
        ("\"\\x\"", "invalid escape at line 1 column 3"),
        (
            "\"\\ud800\"",
            "lone leading surrogate in hex escape at line 1 column 8",
        ),
        (
            "\"\\udc00\"",
            "invalid unicode code point at line 1 column 8",
        ),
        (
            "\"a\u{1}\"",
            "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 3",
        ),
        ("[\n1,\n?]", "expected value at line 3 column 1"),
    ];
    for (src, want) in cases {
        assert_eq!(err(src), want, "{src:?}");
    }
    assert!(err("\"\u{1}\"").starts_with("control character"));
    let bad_utf8 = json::parse(b"\"\xff\"").unwrap_err();
    assert_eq!(bad_utf8.message(), "invalid unicode code point");
    assert!(json::parse(b"\"\xc3\xa9\\n\xff\"").is_err(), "escaped run");
    // at every place of a machine word, before and after an escape
    for k in 0..20 {
        for m in [0, 3, 9] {
            let pad = |n: usize| "a".repeat(n).into_bytes();
            for mid in [&b"\xff"[..], b"\xc3", b"\xe2\x82", b"\xed\xa0\x80"] {
                for esc in [&b""[..], b"\\n"] {
                    let s = [&b"\""[..], &pad(k), esc, mid, &pad(m), b"\""].concat();
                    assert!(json::parse(&s).is_err(), "{s:?}");
                }
            }
            for esc in ["", "\\t"] {
                let s = format!("\"{}{esc}é€😀{}\"", "a".repeat(k), "b".repeat(m));
                let back = json::to_string(&v(&s));
                assert_eq!(back, s);
            }
        }
    }
}

#[test]
fn strings_and_escapes() {
    let s = r#"["plain","with \"quotes\" and \\ and \/","\b\f\n\r\t","\u00e9\u20ac\ud83d\ude00","é€😀","a long string that spans several machine words without anything special in it"]"#;
    let val = v(s);
    let a: serde_json::Value = serde_json::from_str(s).unwrap();
    let b: serde_json::Value = serde_json::from_str(&json::to_string(&val)).unwrap();
    assert_eq!(a, b);
    assert_eq!(v(r#""\u00e9""#), v("\"é\""));
    // duplicate keys: the last value wins, at the first key's place (as before)
    assert_eq!(
        json::to_string(&v(r#"{"a":1,"b":2,"a":3}"#)),
        r#"{"a":3,"b":2}"#
    );
    // whitespace everywhere JSON allows it
    assert_eq!(
        json::to_string(&v(" \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } } \n")),
        r#"{"a":[1,2],"b":{}}"#
    );
}

/// Mutated documents (a fixed pseudo-random sequence: bytes replaced, inserted, removed) are
/// accepted exactly when serde_json accepts them (but for numbers beyond f64, which serde_json
/// refuses and jq keeps), and never panic; what both accept is the same value.
#[test]
fn mutated_documents_are_judged_like_serde_json() {
    let seeds = [
        r#"{"a":[1,2.5,-3e2,true,false,null],"b":{"c":"d\u00e9\n\"x\""},"e":[]}"#,
        r#"[{"id":18446744073709551615,"p":1.50},"\ud83d\ude00",0,-0,1E-5]"#,
        r#"{"nested":[[[[{"k":[{}]}]]]],"s":"a\\b\/c\t"}"#,
    ];
    let alphabet = b"{}[]:,\"\\0123456789.eE+-truefalsn \t\n\xc3\xa9\xff/u";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut both = 0;
    for round in 0..20_000 {
        let mut doc = seeds[round % seeds.len()].as_bytes().to_vec();
        for _ in 0..1 + next() % 3 {
            let at = (next() as usize) % (doc.len() + 1);
            let c = alphabet[(next() as usize) % alphabet.len()];
            match next() % 3 {
                0 if at < doc.len() => doc[at] = c,
                1 => doc.insert(at, c),
                _ if at < doc.len() => {
                    doc.remove(at);
                }
                _ => doc.push(c),
            }
        }
        let ours = json::parse(&doc);
        let theirs = serde_json::from_slice::<serde_json::Value>(&doc);
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) => {
                both += 1;
                let mut out = Vec::new();
                json::write(a, &mut out);
                let back: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
                    panic!(
                        "{}: our output does not parse: {e}",
                        String::from_utf8_lossy(&out)
                    )
                });
                // numbers may be written differently (kept text vs shortest float)
                assert!(same(&back, b), "{}", String::from_utf8_lossy(&doc));
            }
            (Err(_), Err(_)) => {}
            (Ok(_), Err(e)) if e.to_string().contains("out of range") => {}
            _ => panic!(
                "{:?}: ours {:?}, serde_json {:?}",
                String::from_utf8_lossy(&doc),
                ours.as_ref().map(|_| "ok"),
                theirs.as_ref().map(|_| "ok")
            ),
        }
    }
    assert!(both > 1000, "only {both} mutated documents were valid");
}

/// Equal values, numbers compared as `f64` (a kept literal and serde_json's float of it).
fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as J;
    match (a, b) {
        (J::Number(x), J::Number(y)) => x.as_f64() == y.as_f64(),
        (J::Array(x), J::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (J::Object(x), J::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
