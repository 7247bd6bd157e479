//! Request ids, as an edge stage (`request_id`): every request has one — the client's own (in
//! `server.request_id_header`, `x-request-id` by default, when present and valid) or a
//! generated one. It is named on arrival, before every other phase, returned in that header on
//! every answer and in error bodies, and it is the key of the request's log lines, so support
//! can go from a client's answer to the detail.
//!
//! Generated ids are 16 lower-case hex digits: a per-process random 64-bit offset plus a counter,
//! through the SplitMix64 finalizer (a bijection on `u64`), so ids never repeat within a process
//! (the generator is handed from each config's stage to the next) and do not reveal how many
//! requests it served.

use crate::{BuildCx, EdgeStage, Namer, Registration, RequestHead, RouteKind, Step};
use fanout_config::{ConfigError, ConfigErrors};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::sync::Arc;
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

/// The stage's line in the registry.
pub const STAGE: Registration = Registration {
    name: "request_id",
    section: false,
    codes: &[],
    build,
    schema: None,
};

/// Names every request: the header, and the generator (kept across reloads).
struct RequestIdStage {
    header: HeaderName,
    ids: Arc<RequestIds>,
}

fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let name = &cx.config.server.request_id_header;
    let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        let path = "server.request_id_header";
        ConfigErrors(vec![
            ConfigError::at_path(path, format!("{path} `{name}` is not a valid header name"))
                .hint("a header name such as `x-request-id`"),
        ])
    })?;
    let ids = cx
        .prev
        .and_then(|p| p.as_any().downcast_ref::<RequestIdStage>())
        .map_or_else(|| Arc::new(RequestIds::new()), |p| p.ids.clone());
    Ok(Some(Arc::new(RequestIdStage { header, ids })))
}

impl EdgeStage for RequestIdStage {
    fn applies(&self, _route: usize, _kind: RouteKind) -> bool {
        false
    }

    fn on_request<'a>(&'a self, _head: &'a mut RequestHead<'_>) -> Step<'a> {
        Step::Next
    }

    fn namer(&self) -> Option<&dyn Namer> {
        Some(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Namer for RequestIdStage {
    fn header(&self) -> &HeaderName {
        &self.header
    }

    fn name(&self, headers: &HeaderMap) -> HeaderValue {
        self.ids.for_request(headers.get(&self.header))
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
