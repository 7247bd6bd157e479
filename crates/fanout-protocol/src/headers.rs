//! Header lookups by name without hashing it: the inbound server's deadline and request-id
//! headers, the HTTP client's gRPC trailers.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The first value of each of `names` in `headers`. A small map (most requests carry a few
/// headers) is scanned once, comparing names; a lookup by a name that is not a standard header
/// would hash it byte by byte, per name.
pub fn find_headers<'h, const N: usize>(
    headers: &'h HeaderMap,
    names: [&HeaderName; N],
) -> [Option<&'h HeaderValue>; N] {
    if headers.len() > 8 {
        return names.map(|n| headers.get(n));
    }
    let mut found = [None; N];
    for (name, value) in headers {
        for (slot, want) in found.iter_mut().zip(names) {
            if slot.is_none() && name == want {
                *slot = Some(value);
            }
        }
    }
    found
}

/// The first value of `name` in `headers`, as [`find_headers`] finds it (trailers hold one or
/// two fields: a scan, no hashing of a name that is not a standard header).
#[inline]
pub fn find_header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h HeaderValue> {
    let [v] = find_headers(headers, [name]);
    v
}
