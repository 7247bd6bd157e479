//! Request ids: every request has one — the client's own (`x-request-id`, when present and
//! valid) or a generated one. It is returned in a response header and in error bodies, and it is
//! the key of the request's log lines, so support can go from a client's answer to the detail.
//!
//! Generated ids are 16 lower-case hex digits: a per-process random 64-bit offset plus a counter,
//! through the SplitMix64 finalizer (a bijection on `u64`), so ids never repeat within a process
//! and do not reveal how many requests it served.

use http::HeaderValue;
use std::sync::atomic::{AtomicU64, Ordering};

/// Longest accepted client request id.
pub const MAX_LEN: usize = 128;

/// Makes request ids.
pub struct RequestIds {
    offset: u64,
    counter: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds::new()
    }
}

impl RequestIds {
    /// A generator with a random offset.
    pub fn new() -> RequestIds {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS once per process (and per instance after that).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(std::process::id() as u64);
        RequestIds {
            offset: h.finish(),
            counter: AtomicU64::new(0),
        }
    }

    /// The client's id when it is valid (1–[`MAX_LEN`] characters of `A-Z a-z 0-9 - _ . : @`),
    /// otherwise a new one.
    pub fn for_request(&self, client: Option<&HeaderValue>) -> HeaderValue {
        if let Some(v) = client
            && valid(v.as_bytes())
        {
            return v.clone();
        }
        self.generate()
    }

    /// A new id.
    pub fn generate(&self) -> HeaderValue {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let id = splitmix64(n.wrapping_add(self.offset));
        let mut buf = [0u8; 16];
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for (i, b) in buf.iter_mut().enumerate() {
            *b = HEX[((id >> (60 - 4 * i)) & 0xf) as usize];
        }
        // 16 hex digits are always a valid header value.
        HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static("0"))
    }
}

/// Whether a client's request id may be used (and echoed into logs and answers) as is.
pub fn valid(v: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&v.len())
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@'))
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_client_id_is_kept_and_an_invalid_one_replaced() {
        let ids = RequestIds::new();
        let mine = HeaderValue::from_static("req-42.a:b@c_d");
        assert_eq!(ids.for_request(Some(&mine)), mine);
        for bad in ["", "has space", "semi;colon", "quote\"", "ünï"] {
            let v = HeaderValue::from_bytes(bad.as_bytes()).ok();
            let got = ids.for_request(v.as_ref());
            assert_ne!(got.as_bytes(), bad.as_bytes());
            assert_eq!(got.len(), 16);
        }
        let long = HeaderValue::from_str(&"a".repeat(MAX_LEN + 1)).unwrap();
        assert_eq!(ids.for_request(Some(&long)).len(), 16);
        let max = HeaderValue::from_str(&"a".repeat(MAX_LEN)).unwrap();
        assert_eq!(ids.for_request(Some(&max)), max);
    }

    #[test]
    fn generated_ids_do_not_repeat() {
        let ids = RequestIds::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100_000 {
            let id = ids.generate();
            assert!(valid(id.as_bytes()));
            assert!(seen.insert(id), "repeated id");
        }
    }
}
