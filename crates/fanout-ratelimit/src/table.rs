//! The bounded key table: one `u64` per key (a GCRA TAT, or a time until which the key is
//! known to be refused), sharded behind short non-async mutexes (never held across an await).
//! A value at or before now means "nothing to remember", so such entries are dropped whenever
//! a full shard needs room; a shard still full takes no new key — the key shares one overflow
//! value (counted), so a flood of distinct keys cannot grow the table past `max_keys`.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Keys are already hashed (keyed SipHash, [`KeyTable::hash`]): the map uses them as they are.
#[derive(Default)]
struct Id(u64);

impl Hasher for Id {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Shard {
    map: HashMap<u64, u64, BuildHasherDefault<Id>>,
    /// No value in the shard is earlier than this (a sweep before it would drop nothing).
    earliest: u64,
}

/// What to do with a new key when its shard is full of live entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Use the table's one overflow value (a bucket all such keys share).
    Overflow,
    /// Decide on a value of its own that is not kept.
    Forget,
}

/// A bounded map from a key's hash to a `u64` whose "empty" is any value `<= now`.
pub struct KeyTable {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    overflow: Mutex<u64>,
    overflowed: AtomicU64,
}

/// Bytes one entry takes in a shard's hash table (key, value, control byte).
const ENTRY_BYTES: usize = 17;

impl KeyTable {
    /// A table of at most `max_keys` keys (at least 1).
    pub fn new(max_keys: usize) -> KeyTable {
        let max_keys = max_keys.max(1);
        let shards = (max_keys / 1024).clamp(1, 64);
        KeyTable {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::default(),
                        earliest: u64::MAX,
                    })
                })
                .collect(),
            per_shard: max_keys / shards,
            hasher: RandomState::new(),
            overflow: Mutex::new(0),
            overflowed: AtomicU64::new(0),
        }
    }

    /// The key's hash (SipHash with this process's random key: a client cannot aim keys at
    /// one shard or one slot).
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Run `f` on the value of key `h` at `now` (0 when absent) and keep what it leaves when
    /// that is after `now`.
    pub fn with<R>(&self, h: u64, now: u64, full: Full, f: impl FnOnce(&mut u64) -> R) -> R {
        let i = (h % self.shards.len() as u64) as usize;
        let Some(shard) = self.shards.get(i) else {
            return f(&mut 0);
        };
        let mut s = shard.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = s.map.get_mut(&h) {
            let r = f(v);
            let v = *v;
            if v <= now {
                s.map.remove(&h);
            }
            return r;
        }
        if s.map.len() >= self.per_shard && now >= s.earliest {
            s.map.retain(|_, v| *v > now);
            s.earliest = s.map.values().copied().min().unwrap_or(u64::MAX);
        }
        if s.map.len() >= self.per_shard {
            drop(s);
            if full == Full::Forget {
                return f(&mut 0);
            }
            self.overflowed.fetch_add(1, Ordering::Relaxed);
            let mut o = self.overflow.lock().unwrap_or_else(|p| p.into_inner());
            return f(&mut o);
        }
        let mut v = 0;
        let r = f(&mut v);
        if v > now {
            s.map.insert(h, v);
            s.earliest = s.earliest.min(v);
        }
        r
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.len())
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys it holds.
    pub fn max_keys(&self) -> usize {
        self.per_shard * self.shards.len()
    }

    /// Decisions made on the overflow value (new keys while the table was full).
    pub fn overflowed(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// The memory its hash tables hold, in bytes (allocated buckets × 17, the tables'
    /// structs): what the key count costs.
    pub fn bytes(&self) -> usize {
        let tables: usize = self
            .shards
            .iter()
            .map(|s| {
                let cap = s.lock().unwrap_or_else(|p| p.into_inner()).map.capacity();
                if cap == 0 {
                    0
                } else {
                    (cap * 8 / 7).next_power_of_two() * ENTRY_BYTES
                }
            })
            .sum();
        tables + self.shards.len() * std::mem::size_of::<Mutex<Shard>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_distinct_keys_stays_within_the_bound_and_overflows() {
        let t = KeyTable::new(100_000);
        let now = 1;
        for i in 0..300_000u64 {
            let h = t.hash(&i.to_le_bytes());
            t.with(h, now, Full::Overflow, |v| *v = now + 1_000_000_000);
        }
        assert!(t.len() <= 100_000, "{}", t.len());
        assert!(t.len() >= 99_000, "{}", t.len());
        assert_eq!(t.overflowed(), 300_000 - t.len() as u64);
        // 2048 buckets of 17 bytes per shard of 1562 keys: about 2.2 MB for 100 000 keys
        let bytes = t.bytes();
        assert!(bytes <= 100_000 * 24, "{bytes} bytes");
        println!("100000 keys: {} keys held, {bytes} bytes", t.len());
    }

    #[test]
    fn expired_entries_make_room_for_new_keys() {
        let t = KeyTable::new(10);
        for i in 0..10u64 {
            t.with(t.hash(&i.to_le_bytes()), 1, Full::Overflow, |v| *v = 100);
        }
        assert_eq!(t.len(), 10);
        // at 50 every entry is live: a new key overflows
        t.with(t.hash(b"new"), 50, Full::Overflow, |v| *v = 200);
        assert_eq!(t.overflowed(), 1);
        // at 150 they are all past: the new key takes a slot
        t.with(t.hash(b"new"), 150, Full::Overflow, |v| *v = 200);
        assert_eq!((t.len(), t.overflowed()), (1, 1));
    }

    #[test]
    fn a_forgetting_table_never_shares_a_value() {
        let t = KeyTable::new(1);
        t.with(t.hash(b"a"), 1, Full::Forget, |v| *v = 100);
        let seen = t.with(t.hash(b"b"), 1, Full::Forget, |v| *v);
        assert_eq!(seen, 0);
        assert_eq!(t.overflowed(), 0);
    }
}
