//! Verified tokens remembered until their expiry ([`Verified`]), so a client that sends the same
//! token again pays no signature check. Keyed by a SHA-256 of the provider and the token (the
//! token itself is not kept); at most `auth.verified_cache_entries` entries, the oldest
//! dropped first. Each entry keeps the id of the key that verified it: once that key has left
//! the provider's set, the entry is dropped on its next use and the token verified afresh.

use crate::keys::KeyId;
use fanout_expr::Val;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A token's cache key.
pub(crate) type TokenKey = [u8; 32];

/// The key of `token` verified by provider `provider`.
pub(crate) fn key(provider: usize, token: &str) -> TokenKey {
    let mut h = Sha256::new();
    h.update((provider as u64).to_le_bytes());
    h.update(token.as_bytes());
    h.finalize().into()
}

struct Entry {
    claims: Val,
    /// Unix seconds after which the entry is not used.
    exp: u64,
    /// The key that verified the token.
    key: KeyId,
}

#[derive(Default)]
struct Table {
    map: HashMap<TokenKey, Entry>,
    /// The keys of `map`, oldest first (each once).
    order: VecDeque<TokenKey>,
}

/// The cache of verified tokens.
pub(crate) struct Verified {
    table: Mutex<Table>,
    cap: usize,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
}

impl Verified {
    /// A cache of at most `cap` tokens (0: none).
    pub(crate) fn new(cap: usize) -> Verified {
        Verified {
            table: Mutex::new(Table::default()),
            cap,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The claims of a token verified before, not expired at `now` (unix seconds), whose key
    /// `key_in_use` still holds. An entry whose key has gone is removed.
    pub(crate) fn get(
        &self,
        key: &TokenKey,
        now: u64,
        key_in_use: impl FnOnce(&KeyId) -> bool,
    ) -> Option<Val> {
        if self.cap == 0 {
            return None;
        }
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let found = match t.map.get(key) {
            Some(e) if now < e.exp => {
                if key_in_use(&e.key) {
                    Some(e.claims.clone())
                } else {
                    // Revoked: gone from the map now; its `order` slot is skipped when it
                    // comes up (`insert` tolerates keys `map` no longer has).
                    t.map.remove(key);
                    None
                }
            }
            _ => None,
        };
        drop(t);
        match found {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    /// Remember a verified token until `exp` (unix seconds), dropping the oldest entries when
    /// full.
    pub(crate) fn insert(&self, key: TokenKey, claims: Val, exp: u64, by: KeyId) {
        if self.cap == 0 {
            return;
        }
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let entry = Entry {
            claims,
            exp,
            key: by,
        };
        if let Some(e) = t.map.get_mut(&key) {
            *e = entry;
            return;
        }
        // A key removed by `get` may still have its slot in `order`: drop such slots first.
        if t.order.len() > t.map.len() {
            let Table { map, order } = &mut *t;
            order.retain(|k| map.contains_key(k));
        }
        while t.map.len() >= self.cap {
            let Some(old) = t.order.pop_front() else {
                break;
            };
            t.map.remove(&old);
        }
        t.map.insert(key, entry);
        t.order.push_back(key);
    }

    /// Tokens remembered.
    pub(crate) fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: KeyId = [1; 32];
    const K2: KeyId = [2; 32];

    fn any(_: &KeyId) -> bool {
        true
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_the_oldest_first() {
        let c = Verified::new(3);
        for i in 0..10 {
            c.insert(key(0, &format!("t{i}")), Val::from(i as isize), 100, K1);
        }
        assert_eq!(c.len(), 3);
        assert!(c.get(&key(0, "t0"), 1, any).is_none());
        assert!(c.get(&key(0, "t9"), 1, any).is_some());
        assert!(c.get(&key(0, "t7"), 1, any).is_some());
    }

    #[test]
    fn an_entry_is_not_used_past_its_expiry_nor_for_another_provider() {
        let c = Verified::new(10);
        c.insert(key(0, "t"), Val::Null, 100, K1);
        assert!(c.get(&key(0, "t"), 99, any).is_some());
        assert!(c.get(&key(0, "t"), 100, any).is_none());
        assert!(c.get(&key(1, "t"), 99, any).is_none());
        let off = Verified::new(0);
        off.insert(key(0, "t"), Val::Null, 100, K1);
        assert!(off.get(&key(0, "t"), 1, any).is_none());
    }

    #[test]
    fn an_entry_whose_key_left_the_set_is_dropped_and_its_slot_reused() {
        let c = Verified::new(2);
        c.insert(key(0, "a"), Val::Null, 100, K1);
        c.insert(key(0, "b"), Val::Null, 100, K2);
        let only_k2 = |k: &KeyId| *k == K2;
        assert!(c.get(&key(0, "a"), 1, only_k2).is_none(), "K1 is gone");
        assert!(c.get(&key(0, "b"), 1, only_k2).is_some());
        assert_eq!(c.len(), 1);
        // Verified again (with K2): cached again, and the bound still holds.
        c.insert(key(0, "a"), Val::Null, 100, K2);
        c.insert(key(0, "c"), Val::Null, 100, K2);
        assert_eq!(c.len(), 2);
        assert!(c.get(&key(0, "c"), 1, only_k2).is_some());
    }
}
