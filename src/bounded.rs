//! A map that holds at most a fixed number of entries, for state that must
//! stay bounded whatever clients send: the memory store's limiter state, the
//! deny cache, the coordinated mode's keys.
//!
//! Full, a shard first reclaims expired entries: those of a small random
//! sample, else all of them in one sweep (at most one sweep per shard per
//! value of the map's clock, so a flood of live keys costs one sweep per
//! tick, not one per insert). Only when nothing has expired does it evict a
//! live entry, the way Redis's approximated LFU does: of a random sample, the
//! one worth least ([`Entry::worth`]: for limiter state, the key that has used
//! the least of its quota). A flood of new keys therefore evicts keys like its
//! own, not the clients that use their quota.
//!
//! Each shard is a hash table holding its entries inline (a lookup touches
//! one place in memory), and beside it a list of the entries' hashes, for
//! picking one at random in O(1).

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How many entries a full shard looks at to choose one to drop.
const SAMPLE: usize = 8;

/// What the map needs to know of its entries.
pub(crate) trait Entry {
    /// The map's notion of the current time.
    type Now: Copy + PartialEq;

    /// Whether the entry carries no information any more (reclaimed first).
    fn expired(&self, now: Self::Now) -> bool;

    /// How much dropping the entry would cost, compared with others: of a
    /// sample, the one worth least goes first (by the first number, then
    /// the second).
    fn worth(&self, now: Self::Now) -> (f64, u64);
}

/// The outcome of an insert.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Made {
    /// Live entries dropped to make room.
    pub(crate) evicted: usize,
}

pub(crate) struct Bounded<K, V: Entry> {
    shards: Box<[Mutex<Shard<K, V>>]>,
    per_shard: usize,
    hasher: RandomState,
}

/// One entry where it is stored.
struct Stored<K, V> {
    key: K,
    value: V,
    hash: u64,
    /// Where its hash is in the shard's `order`.
    at: usize,
}

struct Shard<K, V: Entry> {
    table: HashTable<Stored<K, V>>,
    /// Every entry's hash, in no particular order: `order[e.at] == e.hash`.
    order: Vec<u64>,
    /// When the last full sweep for expired entries ran.
    swept: Option<V::Now>,
}

impl<K: Hash + Eq, V: Entry> Bounded<K, V> {
    /// A map of at most `cap` entries (at least one), over `shards` locks.
    pub(crate) fn new(cap: usize, shards: usize) -> Self {
        let cap = cap.max(1);
        let n = shards.clamp(1, cap);
        Self {
            shards: (0..n)
                .map(|_| {
                    Mutex::new(Shard {
                        table: HashTable::new(),
                        order: Vec::new(),
                        swept: None,
                    })
                })
                .collect(),
            // Rounded down: the map never holds more than `cap`.
            per_shard: cap / n,
            hasher: RandomState::default(),
        }
    }

    /// The most entries the map holds.
    #[cfg(test)]
    fn cap(&self) -> usize {
        self.per_shard * self.shards.len()
    }

    /// `key`'s hash and its shard, locked; the table within it uses the
    /// same hash.
    fn shard(&self, key: &K) -> (u64, MutexGuard<'_, Shard<K, V>>) {
        let hash = self.hasher.hash_one(key);
        // Bits 25..57 scaled to the shard count (a multiply, not a division).
        // The table uses the top 7 bits to tell entries apart and the low
        // bits to place them: were the shard chosen by either, the keys of
        // one shard would share them, and every lookup would compare keys
        // that cannot match.
        let i = ((((hash >> 25) & 0xffff_ffff) * self.shards.len() as u64) >> 32) as usize;
        // Nothing in a critical section panics on client input; if something
        // else did, the entries are still consistent, so keep going.
        let shard = self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (hash, shard)
    }

    /// Runs `f` on `key`'s entry (`None` when absent or expired), under
    /// its shard's lock; an entry `f` returns is inserted, making room
    /// first if the shard is full.
    pub(crate) fn update<R>(
        &self,
        key: K,
        now: V::Now,
        f: impl FnOnce(Option<&mut V>) -> (R, Option<V>),
    ) -> (R, Made) {
        let (hash, mut shard) = self.shard(&key);
        if let Some(e) = shard.table.find_mut(hash, |e| e.key == key) {
            if !e.value.expired(now) {
                let (out, new) = f(Some(&mut e.value));
                if let Some(v) = new {
                    e.value = v;
                }
                return (out, Made::default());
            }
            let at = e.at;
            shard.remove(hash, at);
        }
        let (out, new) = f(None);
        let mut made = Made::default();
        if let Some(value) = new {
            if shard.table.len() >= self.per_shard {
                made.evicted = shard.make_room(now);
            }
            shard.insert(hash, key, value);
        }
        (out, made)
    }

    /// A copy of what `f` reads of `key`'s entry, if it is there and live.
    pub(crate) fn read<R>(&self, key: &K, now: V::Now, f: impl FnOnce(&V) -> R) -> Option<R> {
        let (hash, shard) = self.shard(key);
        let e = shard.table.find(hash, |e| e.key == *key)?;
        (!e.value.expired(now)).then(|| f(&e.value))
    }

    /// Keeps only the entries for which `f` says `true`, shard by shard.
    #[cfg(feature = "coordinated")]
    pub(crate) fn retain(&self, mut f: impl FnMut(&K, &mut V) -> bool) {
        for shard in self.shards.iter() {
            shard
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|e| f(&e.key, &mut e.value));
        }
    }

    /// Entries held, expired ones not yet reclaimed included.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).table.len())
            .sum()
    }
}

impl<K, V: Entry> Shard<K, V> {
    fn insert(&mut self, hash: u64, key: K, value: V) {
        let at = self.order.len();
        self.order.push(hash);
        self.table.insert_unique(
            hash,
            Stored {
                key,
                value,
                hash,
                at,
            },
            |e| e.hash,
        );
    }

    /// Removes the entry whose hash is at `order[at]`; the last hash moves
    /// into its place.
    fn remove(&mut self, hash: u64, at: usize) {
        if let Ok(e) = self.table.find_entry(hash, |e| e.at == at) {
            e.remove();
        }
        let last = self.order.len() - 1;
        self.order.swap_remove(at);
        if at < last {
            let moved = self.order[at];
            if let Some(e) = self.table.find_mut(moved, |e| e.at == last) {
                e.at = at;
            }
        }
    }

    /// The entry whose hash is at `order[at]` (always there: `order` and
    /// the table change together).
    fn at(&self, at: usize) -> Option<&V> {
        let hash = *self.order.get(at)?;
        self.table.find(hash, |e| e.at == at).map(|e| &e.value)
    }

    fn retain(&mut self, mut keep: impl FnMut(&mut Stored<K, V>) -> bool) {
        self.table.retain(|e| keep(e));
        self.order.clear();
        for e in self.table.iter_mut() {
            e.at = self.order.len();
            self.order.push(e.hash);
        }
    }

    /// Makes room in a full shard: expired entries go first (of a sample,
    /// else in a sweep); failing that, the sampled entry worth least.
    /// Returns how many live entries went.
    fn make_room(&mut self, now: V::Now) -> usize {
        let n = self.order.len();
        let mut picks: Vec<usize> = (0..SAMPLE.min(n)).map(|_| fastrand::usize(..n)).collect();
        picks.sort_unstable();
        picks.dedup();
        let expired: Vec<usize> = picks
            .iter()
            .copied()
            .filter(|&i| self.at(i).is_some_and(|v| v.expired(now)))
            .collect();
        if !expired.is_empty() {
            // Highest position first: a removal moves only the last hash.
            for &i in expired.iter().rev() {
                self.remove(self.order[i], i);
            }
            return 0;
        }
        if self.swept != Some(now) {
            self.swept = Some(now);
            let before = self.table.len();
            self.retain(|e| !e.value.expired(now));
            if self.table.len() < before {
                return 0;
            }
        }
        let least = picks
            .iter()
            .filter_map(|&i| Some((i, self.at(i)?.worth(now))))
            .min_by(|(_, (wa, ta)), (_, (wb, tb))| wa.total_cmp(wb).then(ta.cmp(tb)))
            .map(|(i, _)| i);
        match least {
            Some(i) => {
                self.remove(self.order[i], i);
                1
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry that expires at `until` and is worth `worth`.
    struct E {
        until: u64,
        worth: f64,
    }

    impl Entry for E {
        type Now = u64;
        fn expired(&self, now: u64) -> bool {
            now >= self.until
        }
        fn worth(&self, _: u64) -> (f64, u64) {
            (self.worth, self.until)
        }
    }

    /// Every listed hash names exactly one entry, at its place.
    fn consistent(m: &Bounded<u64, E>) -> bool {
        m.shards.iter().all(|s| {
            let s = s.lock().unwrap();
            s.order.len() == s.table.len()
                && s.table.iter().all(|e| s.order.get(e.at) == Some(&e.hash))
        })
    }

    fn put(m: &Bounded<u64, E>, key: u64, now: u64, worth: f64) -> Made {
        m.update(key, now, |_| {
            (
                (),
                Some(E {
                    until: now + 1_000,
                    worth,
                }),
            )
        })
        .1
    }

    #[test]
    fn a_flood_of_new_keys_evicts_its_own_kind_and_never_the_valuable_ones() {
        let m = Bounded::new(1_000, 4);
        for k in 0..10 {
            put(&m, k, 0, 1.0);
        }
        let mut evicted = 0;
        for k in 10..200_000 {
            evicted += put(&m, k, 0, 0.001).evicted;
        }
        assert!(m.len() <= m.cap());
        assert_eq!(evicted, 200_000 - 10 - (m.len() - 10));
        for k in 0..10 {
            assert!(m.read(&k, 0, |e| e.worth).is_some(), "key {k} was evicted");
        }
    }

    #[test]
    fn a_single_expired_entry_among_live_ones_is_reclaimed_before_any_eviction() {
        let m = Bounded::new(1_000, 1);
        put(&m, 0, 0, 1.0);
        for k in 1..1_000 {
            put(&m, k, 500, 1.0);
        }
        // At 1_000 only key 0 has expired: a sample would rarely find it.
        assert_eq!(put(&m, 5_000, 1_000, 1.0).evicted, 0);
        assert!(m.read(&0, 1_000, |_| ()).is_none());
        // Nothing else has expired: the next new key evicts one.
        assert_eq!(put(&m, 5_001, 1_000, 1.0).evicted, 1);
        assert_eq!(m.len(), 1_000);
        assert!(consistent(&m));
    }

    #[test]
    fn the_list_of_hashes_stays_true_to_the_entries_through_every_change() {
        let m: Bounded<u64, E> = Bounded::new(64, 2);
        for k in 0..10_000u64 {
            // Some keys expire soon, some late: samples, sweeps, evictions
            // and replaced expired entries all happen.
            let now = k / 10;
            m.update(k % 300, now, |e| {
                let worth = (k % 7) as f64;
                match e {
                    Some(e) => {
                        e.until = now + k % 5;
                        ((), None)
                    }
                    None => (
                        (),
                        Some(E {
                            until: now + k % 5,
                            worth,
                        }),
                    ),
                }
            });
            assert!(consistent(&m), "after key {k}");
            assert!(m.len() <= m.cap());
        }
    }

    #[test]
    fn expired_entries_make_room_before_any_live_one_and_read_as_absent() {
        let m = Bounded::new(8, 1);
        for k in 0..8 {
            put(&m, k, 0, 1.0);
        }
        // At 5_000 every entry has expired: room is made with no eviction.
        assert_eq!(put(&m, 100, 5_000, 0.0).evicted, 0);
        assert!(m.read(&0, 5_000, |_| ()).is_none());
        let (seen, _) = m.update(1, 5_000, |e| (e.is_some(), None));
        assert!(!seen, "an expired entry is absent to update");
        assert!(m.len() <= 8);
    }
}
