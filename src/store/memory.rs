//! The embedded store: sharded maps behind short per-shard locks.

use super::{Charge, Refund, Store, StoreFuture};
use crate::algorithm::{self, Next, State};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::quota::Quota;
use hashbrown::HashTable;
use smallvec::SmallVec;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
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
    shards: Box<[Padded<Mutex<Shard>>]>,
    shard_mask: u64,
    max_keys_per_shard: usize,
    max_keys: usize,
    overflow: Overflow,
    hasher: hashbrown::DefaultHashBuilder,
}

/// One key's state in a shard's table: two cache lines, aligned, hold all a
/// charge reads and writes.
#[repr(align(64))]
struct Bucket {
    namespace: u64,
    key: Key,
    entry: Entry,
}

impl Bucket {
    fn is(&self, namespace: u64, key: &Key) -> bool {
        self.namespace == namespace && self.key.as_bytes() == key.as_bytes()
    }
}

/// What is hashed: the namespace and the key's encoded bytes (not the unused
/// tail of its inline buffer).
struct HashInput<'a>(u64, &'a [u8]);

impl Hash for HashInput<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0);
        state.write(self.1);
    }
}

/// One shard per cache line pair: threads working on different shards never
/// contend on a line they do not share (two lines, for adjacent-line prefetch).
#[repr(align(128))]
struct Padded<T>(T);

#[derive(Default)]
struct Shard {
    map: HashTable<Bucket>,
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

    fn position(&self, id: u64) -> Option<usize> {
        self.slots.iter().position(|s| s.id == id)
    }

    fn expires_at(&self) -> u64 {
        self.slots.iter().map(|s| s.expires_at).max().unwrap_or(0)
    }

    /// Writes an admitted charge of `cost` to quota `q`'s slot.
    fn commit(&mut self, q: &Quota, next: Next, now: u64, cost: u64) {
        let at = self.position(slot_of(q));
        self.commit_at(at, q, next, now, cost);
    }

    /// As [`Entry::commit`], with the slot's index already known (`None`: a new slot).
    #[inline]
    fn commit_at(&mut self, at: Option<usize>, q: &Quota, next: Next, now: u64, cost: u64) {
        match at.and_then(|i| self.slots.get_mut(i)) {
            Some(slot) => {
                next.apply(Some(&mut slot.state), now, cost);
                slot.expires_at = algorithm::expires_at(q, &slot.state);
            }
            None => {
                if let Some(state) = next.apply(None, now, cost) {
                    let expires_at = algorithm::expires_at(q, &state);
                    self.slots.push(Slot {
                        id: slot_of(q),
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
        let shards = (0..n)
            .map(|_| Padded(Mutex::new(Shard::default())))
            .collect();
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
        self.inner.shards.iter().map(|s| lock(&s.0).map.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hash of `key` in `namespace` and the shard it lives in.
    fn locate(&self, namespace: u64, key: &Key) -> (&Mutex<Shard>, u64) {
        let hash = self
            .inner
            .hasher
            .hash_one(HashInput(namespace, key.as_bytes()));
        // High bits pick the shard; hashbrown uses the low bits within it.
        let idx = (hash >> 40) & self.inner.shard_mask;
        (&self.inner.shards[idx as usize].0, hash)
    }

    /// Charges `call`, writing every quota's status into `decision` (empty, from
    /// [`Decision::building`]).
    fn charge_now(&self, call: &Charge<'_>, decision: &mut Decision) -> Result<(), StoreError> {
        let ns = call.namespace.id();
        let (shard, hash) = self.locate(ns, call.key);
        let mut shard = lock(shard);
        let now = call.now_ms;
        let quotas = call.policy.quotas();

        // What each quota writes if all admit, and where its slot is.
        let mut next: SmallVec<[(Option<usize>, Next); 2]> = SmallVec::new();
        // One lookup serves the decision and the commit (an existing key is
        // hashed and probed once per charge, not twice).
        let mut entry = shard
            .map
            .find_mut(hash, |b| b.is(ns, call.key))
            .map(|b| &mut b.entry);
        for q in quotas {
            let (at, state) = match entry.as_deref_mut() {
                Some(e) => match e.position(slot_of(q)) {
                    Some(i) => (Some(i), Some(&mut e.slots[i].state)),
                    None => (None, None),
                },
                None => (None, None),
            };
            let (status, n) = algorithm::charge(q, state, now, call.cost);
            decision.push(status);
            next.push((at, n));
        }
        decision.settle(call.cost);
        if !decision.is_allowed() {
            return Ok(());
        }
        if let Some(entry) = entry {
            if entry.slots.iter().any(|s| s.expires_at <= now) {
                // Expired slots go first; the indices found above move.
                entry.slots.retain(|s| s.expires_at > now);
                for (q, (_, n)) in quotas.iter().zip(next.drain(..)) {
                    entry.commit(q, n, now, call.cost);
                }
            } else {
                for (q, (at, n)) in quotas.iter().zip(next.drain(..)) {
                    entry.commit_at(at, q, n, now, call.cost);
                }
            }
            return Ok(());
        }
        let mut entry = Entry {
            slots: SmallVec::new(),
        };
        for (q, (_, n)) in quotas.iter().zip(next.drain(..)) {
            entry.commit_at(None, q, n, now, call.cost);
        }
        let bucket = Bucket {
            namespace: ns,
            key: *call.key,
            entry,
        };
        self.insert(&mut shard, hash, bucket, now)
    }

    /// The hash of a stored key (when the table grows or a key is evicted).
    fn rehash(&self, b: &Bucket) -> u64 {
        self.inner
            .hasher
            .hash_one(HashInput(b.namespace, b.key.as_bytes()))
    }

    /// Inserts a new key, reclaiming expired state and applying the cap.
    fn insert(
        &self,
        shard: &mut Shard,
        hash: u64,
        bucket: Bucket,
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
                    // The first entry in table order; the rest stay (an
                    // `ExtractIf` dropped early keeps what it did not yield).
                    shard.map.extract_if(|_| true).next();
                }
            }
        }
        let expiry = bucket.entry.expires_at();
        if shard.map.is_empty() || expiry < shard.min_expiry {
            shard.min_expiry = expiry;
        }
        shard.map.insert_unique(hash, bucket, |b| self.rehash(b));
        shard.inserts_since_sweep += 1;
        Ok(())
    }

    fn refund_now(&self, call: &Refund<'_>) {
        let c = &call.charge;
        let ns = c.namespace.id();
        let (shard, hash) = self.locate(ns, c.key);
        let mut shard = lock(shard);
        let Some(entry) = shard
            .map
            .find_mut(hash, |b| b.is(ns, c.key))
            .map(|b| &mut b.entry)
        else {
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
        let ns = call.namespace.id();
        let (shard, hash) = self.locate(ns, call.key);
        let shard = lock(shard);
        let entry = shard
            .map
            .find(hash, |b| b.is(ns, call.key))
            .map(|b| &b.entry);
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
    shard.map.retain(|b| b.entry.expires_at() > now);
    shard.min_expiry = shard
        .map
        .iter()
        .map(|b| b.entry.expires_at())
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
        // Built in place: the decision (128 bytes) is written where the caller
        // reads it, not copied out through each return.
        let mut out = StoreFuture::ready(Ok(Decision::building()));
        if let Some(result) = out.ready_mut() {
            let failed = match result {
                Ok(decision) => self.charge_now(call, decision).err(),
                Err(_) => None,
            };
            if let Some(err) = failed {
                *result = Err(err);
            }
        }
        out
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
