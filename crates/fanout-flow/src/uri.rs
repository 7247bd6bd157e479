//! The path of a backend call as browsers and curl send what they are given: characters that a
//! URI's path or query may not hold are percent-encoded ([`encode_path_and_query`]), so a value
//! with a space, a quote or a non-ASCII letter interpolated into `path` just works. What is
//! already valid — `%XX` escapes, `/`, `?`, `&`, `=` and the rest of RFC 3986's characters — is
//! left as it is, so a path built from already-encoded parts is not encoded twice.

use std::borrow::Cow;

/// Whether `b` may stand for itself in a URI's path or query: RFC 3986 `pchar` (unreserved,
/// sub-delims, `:`, `@`), `/` and `?` — the same set for both parts (the first `?` ends the path,
/// and a query may hold more). `%` is judged separately (only as an escape).
fn uri_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
                | b'?'
        )
}

/// Whether `s` has a valid `%XX` escape at `i` (where it has a `%`).
fn escape_at(s: &[u8], i: usize) -> bool {
    let hex = |j: usize| s.get(j).is_some_and(u8::is_ascii_hexdigit);
    hex(i + 1) && hex(i + 2)
}

/// Percent-encode every byte of `s` that a URI's path or query may not hold: space, `"`, `<`,
/// `>`, `\`, `^`, `` ` ``, `{`, `|`, `}`, `[`, `]`, `#` (a fragment is never sent), control
/// characters, non-ASCII (as its UTF-8 bytes), and a `%` that does not start a `%XX` escape.
/// Returns `s` itself when nothing needs encoding (the usual case). The result always parses as a
/// URI's path and query.
pub(crate) fn encode_path_and_query(s: &str) -> Cow<'_, str> {
    let b = s.as_bytes();
    let mut out: Option<String> = None;
    for (i, &c) in b.iter().enumerate() {
        let keep = if c == b'%' {
            escape_at(b, i)
        } else {
            uri_byte(c)
        };
        match (&mut out, keep) {
            (None, true) => {}
            (Some(o), true) => o.push(char::from(c)),
            (Some(o), false) => push_escape(o, c),
            (None, false) => {
                // Everything before `i` was kept, so it is ASCII: `i` is a char boundary.
                let mut o = String::with_capacity(s.len() + 16);
                o.push_str(s.get(..i).unwrap_or_default());
                push_escape(&mut o, c);
                out = Some(o);
            }
        }
    }
    out.map_or(Cow::Borrowed(s), Cow::Owned)
}

/// Append `sep` and `key=value` to `out` as `application/x-www-form-urlencoded` encodes the
/// pair: ASCII letters, digits and `*-._` stand for themselves, a space is `+`, every other byte
/// `%XX` — exactly the `form_urlencoded` crate's `Serializer::append_pair`, without its
/// byte-at-a-time iterator: the runs that need no encoding (most of a typical `ids=1,2,3`
/// value) are copied whole.
pub(crate) fn append_form_pair(out: &mut String, sep: char, key: &str, value: &str) {
    out.push(sep);
    append_form_encoded(out, key);
    out.push('=');
    append_form_encoded(out, value);
}

fn append_form_encoded(out: &mut String, s: &str) {
    let b = s.as_bytes();
    let mut run = 0;
    for (i, &c) in b.iter().enumerate() {
        if c.is_ascii_alphanumeric() || matches!(c, b'*' | b'-' | b'.' | b'_') {
            continue;
        }
        // `run..i` holds kept (ASCII) bytes only, or nothing: after an escaped byte of a
        // multi-byte character `run` is inside it, its next byte is escaped too, and the empty
        // range (not on a char boundary) gives "".
        out.push_str(s.get(run..i).unwrap_or_default());
        if c == b' ' {
            out.push('+');
        } else {
            push_escape(out, c);
        }
        run = i + 1;
    }
    out.push_str(s.get(run..).unwrap_or_default());
}

/// Append `%XX` for `c`.
fn push_escape(out: &mut String, c: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(c >> 4)]));
    out.push(char::from(HEX[usize::from(c & 0xF)]));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(s: &str) -> String {
        encode_path_and_query(s).into_owned()
    }

    #[test]
    fn query_pairs_are_encoded_exactly_as_form_urlencoded_encodes_them() {
        let mut all = String::new();
        for c in (0u32..0x250).chain([0x7FF, 0x800, 0xFFFF, 0x1F600]) {
            if let Some(c) = char::from_u32(c) {
                all.push(c);
            }
        }
        let values = [
            "",
            "p1,p2,p3,p4,p5",
            "a b+c&d=e/f?g#h%20",
            "*-._~!'()",
            "Grüße, 世界 😀",
            all.as_str(),
        ];
        for k in ["ids", "a b", "ключ", ""] {
            for v in values {
                let mut ours = String::from("/p");
                append_form_pair(&mut ours, '?', k, v);
                append_form_pair(&mut ours, '&', v, k);
                let theirs = form_urlencoded::Serializer::new(String::new())
                    .append_pair(k, v)
                    .append_pair(v, k)
                    .finish();
                let theirs = format!("/p?{theirs}");
                assert_eq!(ours, theirs, "{k:?} = {v:?}");
            }
        }
    }

    #[test]
    fn valid_paths_are_left_as_they_are() {
        for s in [
            "/items/7",
            "/a/b%20c/d?x=1&y=a%2Fb&z",
            "/a:b@c/!$&'()*+,;=-._~",
            "/q?a=1?b=/c",
            "/",
        ] {
            assert!(matches!(encode_path_and_query(s), Cow::Borrowed(_)), "{s}");
        }
    }

    #[test]
    fn what_a_uri_may_not_hold_is_percent_encoded() {
        assert_eq!(enc("/items/a b"), "/items/a%20b");
        assert_eq!(enc("/s?q=a b&t=1"), "/s?q=a%20b&t=1");
        assert_eq!(
            enc("/x/\"<>\\^`{|}[]"),
            "/x/%22%3C%3E%5C%5E%60%7B%7C%7D%5B%5D"
        );
        assert_eq!(enc("/x/a#b?c#d"), "/x/a%23b?c%23d");
        assert_eq!(enc("/x/\n\t\u{7f}"), "/x/%0A%09%7F");
        assert_eq!(enc("/x/пр"), "/x/%D0%BF%D1%80");
        assert_eq!(enc("/x/100%"), "/x/100%25");
        assert_eq!(enc("/x/%zz%4"), "/x/%25zz%254");
        assert_eq!(enc("/x/%41 %"), "/x/%41%20%25");
        // A `?` inside the query stays a `?`.
        assert_eq!(enc("/a b?c d?e"), "/a%20b?c%20d?e");
    }

    #[test]
    fn every_result_is_a_valid_path_and_query() {
        let all: String = (0u8..=127).map(char::from).chain("é€😀".chars()).collect();
        for s in [
            format!("/{all}"),
            format!("/p?{all}"),
            format!("/{all}?{all}"),
        ] {
            let e = enc(&s);
            let pq: http::uri::PathAndQuery = e.parse().unwrap();
            assert_eq!(pq.as_str(), e, "nothing dropped (no fragment)");
        }
    }
}
