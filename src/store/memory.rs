//! The embedded store: sharded maps behind short per-shard locks.

use super::{Charge, Refund, Store, StoreFuture};
use crate::algorithm::{self, Next, State};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::quota::Quota;
use hashbrown::HashMap;
use smallvec::SmallVec;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What the memory store does when a new key arrives and it already tracks
/// `max_keys` live keys (expired state is always reclaimed first).
///
/// This is a security choice: see each variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Refuse the new key: its request gets a store error, answered per the
    /// layer's failure policy (503 by default). Existing clients keep exact
    /// limits; newcomers fail closed until state expires. The default: a flood
    /// of unique keys can never reset anyone else's window.
    #[default]
    RejectNew,
    /// Evict some live key of the same shard to make room. Newcomers are always
    /// served, but a flood of unique keys resets the windows of evicted clients,
    /// letting them exceed their quota.
    EvictLive,
}

/// In-process limiter state: exact, lock-sharded, bounded.
///
/// Clones share one state. Limits held here are per process: four instances
/// that each allow 100/s admit 400/s together; use `RedisStore` for fleet-wide limits.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    shard_mask: u64,
    max_keys_per_shard: usize,
    max_keys: usize,
    overflow: Overflow,
    hasher: hashbrown::DefaultHashBuilder,
}

type MapKey = (u64, Key);

#[derive(Default)]
struct Shard {
    map: HashMap<MapKey, Entry, hashbrown::DefaultHashBuilder>,
    /// No entry expires before this (Unix ms); a sweep before it would free nothing.
    min_expiry: u64,
    /// Inserts since the last sweep: sweeps are paid for by inserts, amortised O(1).
    inserts_since_sweep: usize,
}

/// One key's state: one slot per quota (algorithm and window), each with the
/// time after which it carries no information.
#[derive(Clone, Debug)]
struct Entry {
    slots: SmallVec<[Slot; 1]>,
}

#[derive(Clone, Debug)]
struct Slot {
    id: u64,
    expires_at: u64,
    state: State,
}

impl Entry {
    fn get(&self, id: u64) -> Option<&State> {
        self.slots.iter().find(|s| s.id == id).map(|s| &s.state)
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Slot> {
        self.slots.iter_mut().find(|s| s.id == id)
    }

    fn expires_at(&self) -> u64 {
        self.slots.iter().map(|s| s.expires_at).max().unwrap_or(0)
    }

    /// Writes an admitted charge of `cost` to quota `q`'s slot.
    fn commit(&mut self, q: &Quota, next: Next, now: u64, cost: u64) {
        let id = slot_of(q);
        match self.get_mut(id) {
            Some(slot) => {
                next.apply(Some(&mut slot.state), now, cost);
                slot.expires_at = algorithm::expires_at(q, &slot.state);
            }
            None => {
                if let Some(state) = next.apply(None, now, cost) {
                    let expires_at = algorithm::expires_at(q, &state);
                    self.slots.push(Slot {
                        id,
                        expires_at,
                        state,
                    });
                }
            }
        }
    }
}

/// A quota's slot within a key: its window and algorithm (as `Quota::slot`).
fn slot_of(q: &Quota) -> u64 {
    (q.window_ms() << 3) | q.algorithm().index()
}

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    shards: usize,
    overflow: Overflow,
}

impl MemoryStoreBuilder {
    /// The most keys tracked at once (default 100,000, about 15 MB). Expired
    /// state does not count: it is reclaimed as new keys arrive. The cap is
    /// split evenly over the lock shards, so the store may reach [`Overflow`]
    /// somewhat before it holds exactly `max_keys`; it never holds more.
    ///
    /// ```
    /// use tower_ratelimit::store::MemoryStore;
    /// let store = MemoryStore::builder().max_keys(1_000).build();
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// What happens at the cap (default [`Overflow::RejectNew`]).
    ///
    /// ```
    /// use tower_ratelimit::store::{MemoryStore, Overflow};
    /// let store = MemoryStore::builder().overflow(Overflow::EvictLive).build();
    /// ```
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
    }

    /// Number of lock shards, rounded up to a power of two (default 64).
    ///
    /// ```
    /// use tower_ratelimit::store::MemoryStore;
    /// let store = MemoryStore::builder().shards(16).build();
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 1 << 16);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let n = self.shards.next_power_of_two();
        // Fewer keys than shards: fewer shards, so the cap stays exact.
        let n = n.min(self.max_keys.next_power_of_two()).max(1);
        let n = prev_pow2_dividing(self.max_keys, n);
        let shards = (0..n).map(|_| Mutex::new(Shard::default())).collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                shard_mask: (n - 1) as u64,
                max_keys_per_shard: self.max_keys / n,
                max_keys: self.max_keys,
                overflow: self.overflow,
                hasher: hashbrown::DefaultHashBuilder::default(),
            }),
        }
    }
}

/// The largest power of two `<= n` that divides `max_keys`, so shards × per-shard cap == max_keys.
fn prev_pow2_dividing(max_keys: usize, mut n: usize) -> usize {
    while n > 1 && !max_keys.is_multiple_of(n) {
        n /= 2;
    }
    n
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::builder().build()
    }
}

impl MemoryStore {
    /// A store with default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: 100_000,
            shards: 64,
            overflow: Overflow::RejectNew,
        }
    }

    /// Keys currently held (including expired ones not yet reclaimed).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &MapKey) -> (&Mutex<Shard>, u64) {
        let hash = self.inner.hasher.hash_one(key);
        // High bits pick the shard; hashbrown uses the low bits within it.
        let idx = (hash >> 40) & self.inner.shard_mask;
        (&self.inner.shards[idx as usize], hash)
    }

    fn charge_now(&self, call: &Charge<'_>) -> Result<Decision, StoreError> {
        let mk = (call.namespace.id(), *call.key);
        let (shard, _) = self.shard(&mk);
        let mut shard = lock(shard);
        let now = call.now_ms;
        let quotas = call.policy.quotas();

        let mut next: SmallVec<[Next; 2]> = SmallVec::new();
        // One lookup serves the decision and the commit (an existing key is
        // hashed and probed once per charge, not twice).
        let mut entry = shard.map.get_mut(&mk);
        let decision = Decision::from_statuses(
            quotas.iter().map(|q| {
                let state = entry
                    .as_deref_mut()
                    .and_then(|e| e.get_mut(slot_of(q)))
                    .map(|s| &mut s.state);
                let (status, n) = algorithm::charge(q, state, now, call.cost);
                next.push(n);
                status
            }),
            call.cost,
        );
        if !decision.is_allowed() {
            return Ok(decision);
        }
        if let Some(entry) = entry {
            entry.slots.retain(|s| s.expires_at > now);
            for (q, n) in quotas.iter().zip(next) {
                entry.commit(q, n, now, call.cost);
            }
            return Ok(decision);
        }
        let mut entry = Entry {
            slots: SmallVec::new(),
        };
        for (q, n) in quotas.iter().zip(next) {
            entry.commit(q, n, now, call.cost);
        }
        self.insert(&mut shard, mk, entry, now)?;
        Ok(decision)
    }

    /// Inserts a new key, reclaiming expired state and applying the cap.
    fn insert(
        &self,
        shard: &mut Shard,
        mk: MapKey,
        entry: Entry,
        now: u64,
    ) -> Result<(), StoreError> {
        let cap = self.inner.max_keys_per_shard;
        let full = shard.map.len() >= cap;
        if now >= shard.min_expiry && (full || shard.inserts_since_sweep >= shard.map.len() / 4) {
            sweep(shard, now);
        }
        if shard.map.len() >= cap {
            match self.inner.overflow {
                Overflow::RejectNew => {
                    return Err(StoreError::Full {
                        max_keys: self.inner.max_keys,
                        retry_at_ms: shard.min_expiry,
                    })
                }
                Overflow::EvictLive => {
                    if let Some(victim) = shard.map.keys().next().copied() {
                        shard.map.remove(&victim);
                    }
                }
            }
        }
        let expiry = entry.expires_at();
        if shard.map.is_empty() || expiry < shard.min_expiry {
            shard.min_expiry = expiry;
        }
        shard.map.insert(mk, entry);
        shard.inserts_since_sweep += 1;
        Ok(())
    }

    fn refund_now(&self, call: &Refund<'_>) {
        let c = &call.charge;
        let mk = (c.namespace.id(), *c.key);
        let (shard, _) = self.shard(&mk);
        let mut shard = lock(shard);
        let Some(entry) = shard.map.get_mut(&mk) else {
            return;
        };
        let mut refunded = false;
        for (q, status) in c.policy.quotas().iter().zip(call.decision.statuses()) {
            let Some(slot) = entry.get_mut(slot_of(q)) else {
                continue;
            };
            if algorithm::refund(q, Some(&mut slot.state), status.window_id, c.now_ms, c.cost) {
                // A refund can bring a bucket's "full again" time forward.
                slot.expires_at = algorithm::expires_at(q, &slot.state);
                refunded = true;
            }
        }
        if refunded {
            let expiry = entry.expires_at();
            shard.min_expiry = shard.min_expiry.min(expiry);
        }
    }

    fn status_now(&self, call: &Charge<'_>) -> Decision {
        let mk = (call.namespace.id(), *call.key);
        let (shard, _) = self.shard(&mk);
        let shard = lock(shard);
        let entry = shard.map.get(&mk);
        Decision::from_statuses(
            call.policy
                .quotas()
                .iter()
                .map(|q| algorithm::peek(q, entry.and_then(|e| e.get(slot_of(q))), call.now_ms)),
            0,
        )
    }
}

fn sweep(shard: &mut Shard, now: u64) {
    shard.map.retain(|_, e| e.expires_at() > now);
    shard.min_expiry = shard
        .map
        .values()
        .map(Entry::expires_at)
        .min()
        .unwrap_or(u64::MAX);
    shard.inserts_since_sweep = 0;
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Nothing in a critical section panics on client input; if something else
    // did, the counts are still consistent, so keep limiting.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store for MemoryStore {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        StoreFuture::ready(self.charge_now(call))
    }

    fn refund(&self, call: &Refund<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.refund_now(call);
        StoreFuture::ready(Ok(()))
    }

    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        StoreFuture::ready(Ok(self.status_now(call)))
    }

    fn is_local(&self) -> bool {
        true
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("max_keys", &self.inner.max_keys)
            .field("overflow", &self.inner.overflow)
            .finish()
    }
}
