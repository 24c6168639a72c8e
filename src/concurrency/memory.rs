//! [`MemorySlots`]: in-flight slots in this process's memory.

use super::store::{Acquire, Occupancy, Release, SlotId, SlotStore};
use crate::error::StoreError;
use crate::key::Key;
use crate::store::StoreFuture;
use hashbrown::{HashMap, HashSet};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};

const SHARDS: usize = 32;

type MapKey = (u64, Key);
type Shard = Mutex<HashMap<MapKey, HashSet<SlotId>>>;

/// In-flight slots held in this process: exact, lock-sharded, and bounded by
/// the requests in flight (a key's entry is removed with its last slot).
///
/// Clones share one state. Limits held here are per process: four instances
/// that each allow 5 in flight admit 20 together; use `RedisStore` for a
/// fleet-wide limit. Leases do not apply: a crashed process takes its slots
/// with it.
///
/// ```
/// use tower_ratelimit::concurrency::{ConcurrencyLimitLayer, MemorySlots};
/// let slots = MemorySlots::new();
/// // Two layers, one state (each in its own namespace).
/// let a = ConcurrencyLimitLayer::builder().name("a").limit(5).store(slots.clone()).build().unwrap();
/// let b = ConcurrencyLimitLayer::builder().name("b").limit(5).store(slots).build().unwrap();
/// ```
#[derive(Clone, Default)]
pub struct MemorySlots {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Shard]>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: hashbrown::DefaultHashBuilder::default(),
        }
    }
}

impl MemorySlots {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots held for `key` in the limiter `namespace` (for tests and health checks).
    ///
    /// ```
    /// use tower_ratelimit::{concurrency::MemorySlots, key::Key, store::Namespace};
    /// assert_eq!(MemorySlots::new().in_flight(&Namespace::new("api"), &Key::global()), 0);
    /// ```
    pub fn in_flight(&self, namespace: &crate::store::Namespace, key: &Key) -> u64 {
        let k = (namespace.id(), *key);
        self.shard(&k)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&k)
            .map_or(0, |ids| ids.len() as u64)
    }

    /// Keys with at least one slot held, over every namespace.
    ///
    /// ```
    /// assert_eq!(tower_ratelimit::concurrency::MemorySlots::new().keys(), 0);
    /// ```
    pub fn keys(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    fn shard(&self, k: &MapKey) -> &Shard {
        let h = self.inner.hasher.hash_one(k);
        &self.inner.shards[h as usize % SHARDS]
    }

    pub(crate) fn acquire_now(&self, call: &Acquire<'_>) -> Occupancy {
        let k = (call.namespace.id(), *call.key);
        let mut map = self
            .shard(&k)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let ids = map.entry(k).or_default();
        let held = ids.len() as u64;
        if held >= call.limit {
            if ids.is_empty() {
                map.remove(&k);
            }
            return Occupancy {
                acquired: false,
                in_flight: held,
            };
        }
        ids.insert(call.id);
        Occupancy {
            acquired: true,
            in_flight: held + 1,
        }
    }

    pub(crate) fn release_now(&self, call: &Release<'_>) {
        let k = (call.namespace.id(), *call.key);
        let mut map = self
            .shard(&k)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(ids) = map.get_mut(&k) {
            ids.remove(&call.id);
            if ids.is_empty() {
                map.remove(&k);
            }
        }
    }
}

impl SlotStore for MemorySlots {
    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>> {
        StoreFuture::ready(Ok(self.acquire_now(call)))
    }

    /// Idempotent. An acquire here completes within its call, so a release can
    /// never overtake it.
    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.release_now(call);
        StoreFuture::ready(Ok(()))
    }

    fn is_local(&self) -> bool {
        true
    }
}

impl fmt::Debug for MemorySlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySlots")
            .field("keys", &self.keys())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Namespace;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn acquire<'a>(ns: &'a Namespace, key: &'a Key, id: SlotId, limit: u64) -> Acquire<'a> {
        Acquire {
            namespace: ns,
            key,
            id,
            limit,
            now_ms: 0,
            lease: Duration::from_secs(30),
            timeout: Duration::from_millis(50),
        }
    }

    fn release<'a>(ns: &'a Namespace, key: &'a Key, id: SlotId) -> Release<'a> {
        Release {
            namespace: ns,
            key,
            id,
            now_ms: 0,
            lease: Duration::from_secs(30),
            timeout: Duration::from_millis(50),
        }
    }

    #[test]
    fn at_most_limit_slots_per_key_releases_are_idempotent_and_empty_keys_are_removed() {
        let (s, ns, k) = (MemorySlots::new(), Namespace::new("t"), Key::new("a"));
        let ids: Vec<_> = (0..3).map(|_| SlotId::next()).collect();
        assert!(s.acquire_now(&acquire(&ns, &k, ids[0], 2)).acquired);
        assert_eq!(
            s.acquire_now(&acquire(&ns, &k, ids[1], 2)),
            Occupancy {
                acquired: true,
                in_flight: 2
            }
        );
        assert_eq!(
            s.acquire_now(&acquire(&ns, &k, ids[2], 2)),
            Occupancy {
                acquired: false,
                in_flight: 2
            }
        );
        // Another namespace and another key have their own slots.
        assert!(
            s.acquire_now(&acquire(&Namespace::new("u"), &k, ids[2], 2))
                .acquired
        );
        s.release_now(&release(&Namespace::new("u"), &k, ids[2]));
        s.release_now(&release(&ns, &k, ids[0]));
        s.release_now(&release(&ns, &k, ids[0]));
        assert_eq!(
            s.in_flight(&ns, &k),
            1,
            "a second release of one id frees nothing"
        );
        s.release_now(&release(&ns, &k, ids[1]));
        assert_eq!(s.keys(), 0, "no entry outlives its last slot");
    }

    #[test]
    fn exact_under_contention_and_nothing_leaks() {
        let (s, ns, k) = (MemorySlots::new(), Namespace::new("t"), Key::new("a"));
        let peak = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..2_000 {
                        let id = SlotId::next();
                        let o = s.acquire_now(&acquire(&ns, &k, id, 3));
                        assert!(o.in_flight <= 3);
                        if o.acquired {
                            peak.fetch_max(s.in_flight(&ns, &k), Ordering::Relaxed);
                            s.release_now(&release(&ns, &k, id));
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 3);
        assert_eq!(s.keys(), 0);
    }
}
