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
//! Each shard is an `IndexMap` behind a short lock: a lookup by key and a
//! pick at random are both O(1).

use foldhash::fast::RandomState;
use indexmap::map::raw_entry_v1::{RawEntryApiV1, RawEntryMut};
use indexmap::IndexMap;
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

struct Shard<K, V: Entry> {
    map: IndexMap<K, V, RandomState>,
    /// When the last full sweep for expired entries ran.
    swept: Option<V::Now>,
}

impl<K: Hash + Eq, V: Entry> Bounded<K, V> {
    /// A map of at most `cap` entries (at least one), over `shards` locks.
    pub(crate) fn new(cap: usize, shards: usize) -> Self {
        let cap = cap.max(1);
        let n = shards.clamp(1, cap);
        // One hasher for the shard choice and every shard's map: a key is
        // hashed once per call.
        let hasher = RandomState::default();
        Self {
            shards: (0..n)
                .map(|_| {
                    Mutex::new(Shard {
                        map: IndexMap::with_hasher(hasher.clone()),
                        swept: None,
                    })
                })
                .collect(),
            // Rounded down: the map never holds more than `cap`.
            per_shard: cap / n,
            hasher,
        }
    }

    /// The most entries the map holds.
    #[cfg(test)]
    fn cap(&self) -> usize {
        self.per_shard * self.shards.len()
    }

    /// `key`'s hash and its shard, locked. The shard is chosen by the
    /// hash's high bits; the map within it uses the same hash.
    fn shard(&self, key: &K) -> (u64, MutexGuard<'_, Shard<K, V>>) {
        let hash = self.hasher.hash_one(key);
        let i = (hash >> 32) as usize % self.shards.len();
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
        let map = &mut shard.map;
        let found = map
            .raw_entry_v1()
            .from_hash_full(hash, |k| *k == key)
            .map(|(i, _, _)| i);
        let live = match found {
            Some(i) if map[i].expired(now) => {
                map.swap_remove_index(i);
                None
            }
            found => found,
        };
        let (out, new) = match live {
            Some(i) => f(Some(&mut map[i])),
            None => f(None),
        };
        let mut made = Made::default();
        match (new, live) {
            (Some(v), Some(i)) => shard.map[i] = v,
            (Some(v), None) => {
                if shard.map.len() >= self.per_shard {
                    made.evicted = shard.make_room(now);
                }
                // Absent (it was looked up above): the slot is vacant.
                if let RawEntryMut::Vacant(slot) =
                    shard.map.raw_entry_mut_v1().from_hash(hash, |k| *k == key)
                {
                    slot.insert_hashed_nocheck(hash, key, v);
                }
            }
            (None, _) => {}
        }
        (out, made)
    }

    /// A copy of what `f` reads of `key`'s entry, if it is there and live.
    pub(crate) fn read<R>(&self, key: &K, now: V::Now, f: impl FnOnce(&V) -> R) -> Option<R> {
        let (hash, shard) = self.shard(key);
        let (_, v) = shard
            .map
            .raw_entry_v1()
            .from_key_hashed_nocheck(hash, key)?;
        (!v.expired(now)).then(|| f(v))
    }

    /// Keeps only the entries for which `f` says `true`, shard by shard.
    #[cfg(feature = "redis")]
    pub(crate) fn retain(&self, mut f: impl FnMut(&K, &mut V) -> bool) {
        for shard in self.shards.iter() {
            shard
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map
                .retain(|k, v| f(k, v));
        }
    }

    /// Entries held, expired ones not yet reclaimed included.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).map.len())
            .sum()
    }
}

impl<K, V: Entry> Shard<K, V> {
    /// Makes room in a full shard: expired entries go first (of a sample,
    /// else in a sweep); failing that, the sampled entry worth least.
    /// Returns how many live entries went.
    fn make_room(&mut self, now: V::Now) -> usize {
        let map = &mut self.map;
        let mut picks: Vec<usize> = (0..SAMPLE.min(map.len()))
            .map(|_| fastrand::usize(..map.len()))
            .collect();
        picks.sort_unstable();
        picks.dedup();
        let expired: Vec<usize> = picks
            .iter()
            .copied()
            .filter(|&i| map[i].expired(now))
            .collect();
        if !expired.is_empty() {
            // Highest index first: a swap-remove moves only the last entry.
            for &i in expired.iter().rev() {
                map.swap_remove_index(i);
            }
            return 0;
        }
        if self.swept != Some(now) {
            self.swept = Some(now);
            let before = map.len();
            map.retain(|_, v| !v.expired(now));
            if map.len() < before {
                return 0;
            }
        }
        let least = picks.iter().copied().min_by(|&a, &b| {
            let (wa, ta) = map[a].worth(now);
            let (wb, tb) = map[b].worth(now);
            wa.total_cmp(&wb).then(ta.cmp(&tb))
        });
        match least {
            Some(i) => {
                map.swap_remove_index(i);
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
