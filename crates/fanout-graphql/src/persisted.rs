//! Persisted queries: Apollo's automatic persisted queries (APQ) — a request names its query by
//! SHA-256 (`extensions.persistedQuery.sha256Hash`); an unknown hash is
//! `PERSISTED_QUERY_NOT_FOUND` and the client sends the text with its hash, verified and kept
//! in a bounded store — or a safelist: only the listed operations run, by id or by their text.

use fanout_config::PersistedQueries;
use sha2::Digest;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A route's persisted queries.
pub(crate) enum Persisted {
    /// Neither: a request naming a persisted query is refused.
    Off,
    /// APQ: the queries registered so far.
    Apq(Store),
    /// A safelist: operations by id, and the SHA-256 of every listed text.
    Safelist {
        by_id: HashMap<String, Arc<str>>,
        hashes: HashSet<String>,
    },
}

/// How a request's query is found.
pub(crate) enum Found {
    /// The text to run.
    Query(Arc<str>),
    /// The text sent, to run (then to store under its hash, once it is valid).
    Register(String),
}

/// A refusal: status, `extensions.code`, message.
pub(crate) type Refusal = (u16, &'static str, String);

impl Persisted {
    pub(crate) fn new(pq: &PersistedQueries) -> Persisted {
        if pq.is_safelist() {
            let mut by_id = HashMap::new();
            let mut hashes = HashSet::new();
            for (id, body) in &pq.loaded {
                let h = sha256_hex(body);
                let text: Arc<str> = body.as_str().into();
                by_id.insert(id.clone().unwrap_or_else(|| h.clone()), text);
                hashes.insert(h);
            }
            Persisted::Safelist { by_id, hashes }
        } else if pq.enabled {
            Persisted::Apq(Store::new(pq.max_entries))
        } else {
            Persisted::Off
        }
    }

    /// The query a request runs: `query` (its text, if sent) and `pq` (its
    /// `extensions.persistedQuery`, if any).
    pub(crate) fn find(
        &self,
        query: Option<&str>,
        pq: Option<&crate::request::Persisted>,
    ) -> Result<Option<Found>, Refusal> {
        let Some(pq) = pq else {
            // A query without a hash: as sent, unless a safelist leaves it out.
            return match (self, query) {
                (Persisted::Safelist { hashes, .. }, Some(q))
                    if !hashes.contains(&sha256_hex(q)) =>
                {
                    Err((
                        403,
                        "QUERY_NOT_IN_SAFELIST",
                        "the operation is not in this route's safelist \
                         (graphql.persisted_queries)"
                            .into(),
                    ))
                }
                _ => Ok(None),
            };
        };
        if matches!(self, Persisted::Off) {
            return Err((
                400,
                "PERSISTED_QUERY_NOT_SUPPORTED",
                "persisted queries are not enabled on this route (graphql.persisted_queries)"
                    .into(),
            ));
        }
        if pq.version != Some(1) {
            return Err((
                400,
                "PERSISTED_QUERY_VERSION_NOT_SUPPORTED",
                "`extensions.persistedQuery.version` must be 1".into(),
            ));
        }
        if let Some(q) = query.filter(|q| !q.is_empty()) {
            let h = sha256_hex(q);
            if !h.eq_ignore_ascii_case(&pq.hash) {
                return Err((
                    400,
                    "PERSISTED_QUERY_HASH_MISMATCH",
                    format!(
                        "`extensions.persistedQuery.sha256Hash` is not the query's SHA-256 ({h})"
                    ),
                ));
            }
            return match self {
                Persisted::Safelist { hashes, .. } if !hashes.contains(&h) => Err((
                    403,
                    "QUERY_NOT_IN_SAFELIST",
                    "the operation is not in this route's safelist (graphql.persisted_queries)"
                        .into(),
                )),
                Persisted::Apq(_) => Ok(Some(Found::Register(h))),
                _ => Ok(None),
            };
        }
        match self {
            Persisted::Apq(store) => match store.get(&pq.hash.to_ascii_lowercase()) {
                Some(text) => Ok(Some(Found::Query(text))),
                None => Err((
                    404,
                    "PERSISTED_QUERY_NOT_FOUND",
                    "PersistedQueryNotFound: send the query with its hash".into(),
                )),
            },
            Persisted::Safelist { by_id, .. } => match by_id.get(&pq.hash) {
                Some(text) => Ok(Some(Found::Query(text.clone()))),
                None => Err((
                    404,
                    "PERSISTED_QUERY_NOT_IN_LIST",
                    "the persisted query id is not in this route's safelist \
                     (graphql.persisted_queries)"
                        .into(),
                )),
            },
            Persisted::Off => Ok(None),
        }
    }

    /// Keep `text` under `hash` (APQ; after it parsed and validated).
    pub(crate) fn register(&self, hash: String, text: &str) {
        if let Persisted::Apq(store) = self {
            store.put(hash, text);
        }
    }
}

/// The APQ store: query texts by their SHA-256, at most `max` (the least recently used
/// dropped first).
pub(crate) struct Store {
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    texts: HashMap<String, (Arc<str>, u64)>,
    clock: u64,
}

impl Store {
    fn new(max: usize) -> Store {
        Store {
            max,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn get(&self, hash: &str) -> Option<Arc<str>> {
        let mut g = self.inner.lock().ok()?;
        g.clock += 1;
        let now = g.clock;
        let (text, used) = g.texts.get_mut(hash)?;
        *used = now;
        Some(text.clone())
    }

    fn put(&self, hash: String, text: &str) {
        if self.max == 0 {
            return;
        }
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        if !g.texts.contains_key(&hash) && g.texts.len() >= self.max {
            // Only when full: a scan of at most `max` entries.
            if let Some(oldest) = g
                .texts
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                g.texts.remove(&oldest);
            }
        }
        g.clock += 1;
        let now = g.clock;
        g.texts.insert(hash, (text.into(), now));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map(|g| g.texts.len()).unwrap_or(0)
    }
}

/// The lower-case hex SHA-256 of `text`.
pub(crate) fn sha256_hex(text: &str) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let d = sha2::Sha256::digest(text.as_bytes());
    let mut s = String::with_capacity(64);
    for b in d {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_at_most_max_entries_dropping_the_least_recently_used() {
        let s = Store::new(2);
        s.put("a".into(), "{ a }");
        s.put("b".into(), "{ b }");
        assert!(s.get("a").is_some());
        s.put("c".into(), "{ c }");
        assert_eq!(s.len(), 2);
        assert!(s.get("b").is_none(), "b was the least recently used");
        assert!(s.get("a").is_some() && s.get("c").is_some());
    }

    #[test]
    fn sha256_is_lower_case_hex() {
        assert_eq!(
            sha256_hex("{ __typename }"),
            "7f56e67dd21ab3f30d1ff8b7bed08893f0a0db86449836189b361dd1e56ddb4b"
        );
    }
}
