//! The embedded store: limiter state and concurrency slots in this
//! process's memory, exact and bounded.

mod refusal;

use super::backend::Store;
use super::call::{Charge, Settle};
use super::future::StoreFuture;
use super::slots::{Acquire, Occupancy, Release, SlotId};
use crate::algorithm::{self, Next, Outcome, State};
use crate::bounded::{self, Bounded};
use crate::decision::{Decision, QuotaStatus};
use crate::error::StoreError;
use crate::key::Key;
use crate::Quota;
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// In-process limiter state: exact, lock-sharded, bounded.
///
/// Clones share one state. Limits held here are per process: four instances
/// that each allow 100/s admit 400/s together; use `RedisStore` for fleet-wide limits.
///
/// # At the key cap
///
/// The store tracks at most [`max_keys`](MemoryStoreBuilder::max_keys)
/// clients. Expired state is reclaimed first. When every key is live, room
/// is made the way Redis's approximated eviction does it: of a few keys
/// picked at random, the one that has used the least of its quota goes (of
/// equals, the oldest). A flood of new keys (one request each) therefore
/// evicts keys like its own, oldest first, never the clients that use their
/// quota, and a newcomer is always served.
/// The bound: a key evicted and seen again starts afresh, so it can exceed
/// its quota by at most what it had used when evicted, which for the key
/// chosen is the least in its sample, typically one request of a flood key.
/// Evictions are counted in `ratelimit_memory_evictions_total`, labelled
/// with the limiter whose new key needed the room.
///
/// ```
/// use tower_ratelimit::store::MemoryStore;
/// let store = MemoryStore::builder().max_keys(50_000).build();
/// assert!(store.is_empty());
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    rates: Bounded<(u64, Key), Entry>,
    slots: Slots,
    max_keys: usize,
}

/// One key's state: one slot per quota (algorithm and window), each with the
/// time after which it carries no information.
struct Entry {
    slots: SmallVec<[Slot; 1]>,
    /// The largest share of a quota the key had used at its last charge:
    /// what evicting it would hand back.
    used: Share,
    /// The penalty boxes and holes of the policies that wait or keep a
    /// penalty box (see [`refusal`]); none for a key of plain policies.
    refusal: Option<Box<refusal::Extra>>,
}

/// `used` units of a quota of `limit`: compared by cross-multiplying, so
/// the charge path divides nothing.
#[derive(Clone, Copy, Debug)]
struct Share {
    used: u64,
    limit: u64,
}

impl Share {
    const NONE: Share = Share { used: 0, limit: 1 };

    fn of(status: &QuotaStatus) -> Share {
        Share {
            used: status.used(),
            limit: status.limit.max(1),
        }
    }

    /// The larger of the two shares.
    fn max(self, other: Share) -> Share {
        if u128::from(other.used) * u128::from(self.limit)
            > u128::from(self.used) * u128::from(other.limit)
        {
            other
        } else {
            self
        }
    }

    /// The largest share among `statuses`.
    fn most(statuses: &[QuotaStatus]) -> Share {
        statuses.iter().map(Share::of).fold(Share::NONE, Share::max)
    }

    fn fraction(self) -> f64 {
        self.used as f64 / self.limit as f64
    }
}

struct Slot {
    id: u64,
    expires_at: u64,
    state: State,
}

impl Entry {
    fn new() -> Self {
        Entry {
            slots: SmallVec::new(),
            used: Share::NONE,
            refusal: None,
        }
    }

    /// Quota slot `id`'s state at `now`: none once it has expired, though
    /// the entry lives on for another slot or a penalty box.
    fn get(&self, id: u64, now: u64) -> Option<&State> {
        self.slots
            .iter()
            .find(|s| s.id == id && s.expires_at > now)
            .map(|s| &s.state)
    }

    fn expires_at(&self) -> u64 {
        let slots = self.slots.iter().map(|s| s.expires_at).max().unwrap_or(0);
        match &self.refusal {
            None => slots,
            Some(x) => slots.max(x.expires_at()),
        }
    }

    /// Charges every quota what `cost` and `units` ask of it, all or
    /// nothing: each quota's slot is looked up once, evaluated, and written
    /// only if every quota admits.
    fn charge(
        &mut self,
        quotas: &[Quota],
        now: u64,
        (cost, units): (u64, u64),
        decision: &mut Decision,
    ) {
        let ask = |q: &Quota| algorithm::ask(q, cost, units);
        // Where each quota's slot is, what it writes if all admit, and what
        // it is charged.
        let mut pending = SmallVec::<[(Option<usize>, Next, u64); 2]>::new();
        let mut used = Share::NONE;
        for q in quotas {
            let a = ask(q);
            let (at, next, share) = self.evaluate(q, now, a, decision);
            used = used.max(share);
            pending.push((at, next, a.charge));
        }
        decision.decide_each(|i| {
            let a = ask(&quotas[i]);
            (a.fit, a.charge)
        });
        if decision.is_allowed() {
            for (q, &(at, next, charge)) in quotas.iter().zip(&pending) {
                self.commit(at, q, next, now, charge);
            }
            self.admitted(used, now);
        }
    }

    /// Evaluates quota `q` for `ask`, pushing its status: where its slot is,
    /// what it writes if every quota admits, and the share it has used.
    fn evaluate(
        &mut self,
        q: &Quota,
        now: u64,
        ask: algorithm::Ask,
        decision: &mut Decision,
    ) -> (Option<usize>, Next, Share) {
        let id = slot_of(q);
        let at = self.slots.iter().position(|s| s.id == id);
        let state = at.map(|i| &mut self.slots[i].state);
        let (status, next) = algorithm::charge(q, state, now, ask);
        let used = Share::of(&status);
        decision.push(status);
        (at, next, used)
    }

    /// After an admitted charge: the share used, and no expired slot kept.
    fn admitted(&mut self, used: Share, now: u64) {
        self.used = used;
        if self.slots.iter().any(|s| s.expires_at <= now) {
            self.slots.retain(|s| s.expires_at > now);
        }
    }

    /// Writes an admitted charge of `cost` to quota `q`'s slot (at index
    /// `at`, or new).
    #[inline]
    fn commit(&mut self, at: Option<usize>, q: &Quota, next: Next, now: u64, cost: u64) {
        match at {
            Some(i) => {
                let slot = &mut self.slots[i];
                next.apply(Some(&mut slot.state), now, cost);
                slot.expires_at = algorithm::expires_at(q, &slot.state);
            }
            None => {
                if let Some(state) = next.apply(None, now, cost) {
                    self.slots.push(Slot {
                        id: slot_of(q),
                        expires_at: algorithm::expires_at(q, &state),
                        state,
                    });
                }
            }
        }
    }
}

impl bounded::Entry for Entry {
    type Now = u64;

    fn expired(&self, now: u64) -> bool {
        self.expires_at() <= now
    }

    /// The least used goes first; of equally used keys, the one whose
    /// state expires soonest (the oldest).
    fn worth(&self, _now: u64) -> (f64, u64) {
        (self.used.fraction(), self.expires_at())
    }
}

/// A quota's slot within a key: its window and algorithm (as `Quota::slot`).
#[inline]
fn slot_of(q: &Quota) -> u64 {
    if q.counts_requests() {
        (q.window_ms() << 3) | q.algorithm().index()
    } else {
        slot_of_units(q)
    }
}

/// The slot of a quota in another unit: a hash of its whole identity, in
/// the other half of the numbers (a window is below 2^35 ms).
fn slot_of_units(q: &Quota) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    q.slot().hash(&mut h);
    h.finish() | 1 << 63
}

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    shards: usize,
}

impl MemoryStoreBuilder {
    /// The most keys tracked at once (default 100,000, a few tens of MB).
    /// Expired state does not count: it is reclaimed first. See
    /// [`MemoryStore`] for what happens at the cap.
    ///
    /// ```
    /// use tower_ratelimit::store::MemoryStore;
    /// let store = MemoryStore::builder().max_keys(1_000).build();
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Number of lock shards (default 64).
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
        MemoryStore {
            inner: Arc::new(Inner {
                rates: Bounded::new(self.max_keys, self.shards),
                slots: Slots::new(self.shards),
                max_keys: self.max_keys,
            }),
        }
    }
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
        }
    }

    /// Keys currently held (including expired ones not yet reclaimed).
    pub fn len(&self) -> usize {
        self.inner.rates.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots held for `key` in the limiter `namespace` (for tests and health checks).
    ///
    /// ```
    /// use tower_ratelimit::{key::Key, store::{MemoryStore, Namespace}};
    /// assert_eq!(MemoryStore::new().in_flight(&Namespace::new("api"), &Key::global()), 0);
    /// ```
    pub fn in_flight(&self, namespace: &super::Namespace, key: &Key) -> u64 {
        self.inner.slots.held(&(namespace.id(), *key))
    }

    fn charge_now(&self, call: &Charge<'_>) -> Decision {
        if !call.policy.is_plain() {
            return self.charge_refusing(call);
        }
        let (now, cost, quotas) = (call.now_ms, (call.cost, call.units), call.policy.quotas());
        let key = (call.namespace.id(), *call.key);
        let mut decision = Decision::empty();
        let ((), made) = self.inner.rates.update(key, now, |entry| match entry {
            Some(e) => {
                e.charge(quotas, now, cost, &mut decision);
                ((), None)
            }
            None => {
                let mut fresh = Entry::new();
                fresh.charge(quotas, now, cost, &mut decision);
                ((), (!fresh.slots.is_empty()).then_some(fresh))
            }
        });
        count_evictions(call.namespace, made);
        decision
    }

    fn settle_now(&self, call: &Settle<'_>) {
        let c = &call.charge;
        let key = (c.namespace.id(), *c.key);
        let now = call.now_ms;
        let waits = c.policy.waits().is_some();
        let ((), room) = self.inner.rates.update(key, now, |entry| {
            let mut fresh = Entry::new();
            let (made, e) = match entry {
                Some(e) => (false, e),
                None => (true, &mut fresh),
            };
            let mut changed = false;
            for (q, settled) in call.each() {
                let at = e.slots.iter().position(|s| s.id == slot_of(q));
                let outcome = if waits {
                    // Its bookings are given back in any order.
                    e.settle_waiting(q, at, now, settled)
                } else {
                    algorithm::settle(q, at.map(|i| &mut e.slots[i].state), now, settled)
                };
                match (outcome, at) {
                    // A refund brings a bucket's "full again" time forward,
                    // a debit takes it back.
                    (Outcome::Changed, Some(i)) => {
                        e.slots[i].expires_at = algorithm::expires_at(q, &e.slots[i].state);
                        changed = true;
                    }
                    (Outcome::New(state), _) => {
                        e.slots.push(Slot {
                            id: slot_of(q),
                            expires_at: algorithm::expires_at(q, &state),
                            state,
                        });
                        changed = true;
                    }
                    _ => {}
                }
            }
            if changed {
                // What eviction weighs: a client settled into debt has used
                // its quota, and must not look like one that has not.
                let statuses: SmallVec<[QuotaStatus; 2]> = c
                    .policy
                    .quotas()
                    .iter()
                    .map(|q| algorithm::peek(q, e.get(slot_of(q), now), now))
                    .collect();
                e.used = Share::most(&statuses);
            }
            ((), (made && !fresh.slots.is_empty()).then_some(fresh))
        });
        // Debt on a bucket that is gone is new state, which may need room.
        count_evictions(c.namespace, room);
    }

    fn status_now(&self, call: &Charge<'_>) -> Decision {
        let key = (call.namespace.id(), *call.key);
        let peek = |entry: Option<&Entry>| {
            Decision::from_statuses(
                call.policy.quotas().iter().map(|q| {
                    algorithm::peek(
                        q,
                        entry.and_then(|e| e.get(slot_of(q), call.now_ms)),
                        call.now_ms,
                    )
                }),
                0,
            )
        };
        self.inner
            .rates
            .read(&key, call.now_ms, |e| {
                e.status_of(call.policy, peek(Some(e)), call.now_ms)
            })
            .unwrap_or_else(|| peek(None))
    }
}

/// Counts the live keys evicted to make room for a key of `namespace`.
#[inline]
fn count_evictions(namespace: &super::Namespace, made: bounded::Made) {
    if made.evicted > 0 {
        count(namespace, made.evicted);
    }
    #[cold]
    fn count(namespace: &super::Namespace, evicted: usize) {
        metrics::counter!("ratelimit_memory_evictions_total", "limiter" => namespace.name().to_owned())
            .increment(evicted as u64);
    }
}

/// Slot ids held per (namespace, key).
type SlotMap = HashMap<(u64, Key), HashSet<SlotId>, foldhash::fast::RandomState>;

/// In-flight slots: per key, the ids of the requests holding one. Bounded by
/// the requests in flight: a key's entry goes with its last slot. Leases do
/// not apply: a crashed process takes its slots with it.
struct Slots {
    shards: Box<[Mutex<SlotMap>]>,
    hasher: foldhash::fast::RandomState,
}

impl Slots {
    fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn shard(&self, k: &(u64, Key)) -> std::sync::MutexGuard<'_, SlotMap> {
        use std::hash::BuildHasher;
        let i = self.hasher.hash_one(k) as usize % self.shards.len();
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn held(&self, k: &(u64, Key)) -> u64 {
        self.shard(k).get(k).map_or(0, |ids| ids.len() as u64)
    }

    fn acquire(&self, call: &Acquire<'_>) -> Occupancy {
        let k = (call.namespace.id(), *call.key);
        let mut map = self.shard(&k);
        let held = map.get(&k).map_or(0, HashSet::len) as u64;
        if held >= call.limit {
            return Occupancy {
                acquired: false,
                in_flight: held,
            };
        }
        map.entry(k).or_default().insert(call.id);
        Occupancy {
            acquired: true,
            in_flight: held + 1,
        }
    }

    fn release(&self, call: &Release<'_>) {
        let k = (call.namespace.id(), *call.key);
        let mut map = self.shard(&k);
        if let Some(ids) = map.get_mut(&k) {
            ids.remove(&call.id);
            if ids.is_empty() {
                map.remove(&k);
            }
        }
    }

    fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

impl Store for MemoryStore {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        StoreFuture::ready(Ok(self.charge_now(call)))
    }

    fn settle(&self, call: &Settle<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.settle_now(call);
        StoreFuture::ready(Ok(()))
    }

    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        StoreFuture::ready(Ok(self.status_now(call)))
    }

    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>> {
        StoreFuture::ready(Ok(self.inner.slots.acquire(call)))
    }

    /// Idempotent. An acquire here completes within its call, so a release can
    /// never overtake it.
    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.inner.slots.release(call);
        StoreFuture::ready(Ok(()))
    }

    /// Every call is answered within it, in-process.
    fn bounds_calls(&self) -> bool {
        true
    }

    /// Its state's address: clones share it, two stores never do.
    fn identity(&self) -> Option<String> {
        Some(format!("memory@{:p}", Arc::as_ptr(&self.inner)))
    }

    fn keeps_slots(&self) -> bool {
        true
    }

    fn is_local(&self) -> bool {
        true
    }

    /// Every policy: it books turns for a policy that waits and keeps
    /// penalty boxes.
    fn check_policy(&self, _policy: &crate::Policy) -> Result<(), crate::error::ConfigError> {
        Ok(())
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("max_keys", &self.inner.max_keys)
            .field("keys", &self.len())
            .field("slot_keys", &self.inner.slots.keys())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Namespace;
    use std::sync::atomic::{AtomicU64, Ordering};
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
        let (s, ns, k) = (Slots::new(4), Namespace::new("t"), Key::new("a"));
        let ids: Vec<_> = (0..3).map(|_| SlotId::next()).collect();
        assert!(s.acquire(&acquire(&ns, &k, ids[0], 2)).acquired);
        assert_eq!(
            s.acquire(&acquire(&ns, &k, ids[1], 2)),
            Occupancy {
                acquired: true,
                in_flight: 2
            }
        );
        assert_eq!(
            s.acquire(&acquire(&ns, &k, ids[2], 2)),
            Occupancy {
                acquired: false,
                in_flight: 2
            }
        );
        // Another namespace has its own slots.
        let other = Namespace::new("u");
        assert!(s.acquire(&acquire(&other, &k, ids[2], 2)).acquired);
        s.release(&release(&other, &k, ids[2]));
        s.release(&release(&ns, &k, ids[0]));
        s.release(&release(&ns, &k, ids[0]));
        assert_eq!(
            s.held(&(ns.id(), k)),
            1,
            "a second release of one id frees nothing"
        );
        s.release(&release(&ns, &k, ids[1]));
        assert_eq!(s.keys(), 0, "no entry outlives its last slot");
    }

    #[test]
    fn slots_are_exact_under_contention_and_nothing_leaks() {
        let (s, ns, k) = (Slots::new(4), Namespace::new("t"), Key::new("a"));
        let peak = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..2_000 {
                        let id = SlotId::next();
                        let o = s.acquire(&acquire(&ns, &k, id, 3));
                        assert!(o.in_flight <= 3);
                        if o.acquired {
                            peak.fetch_max(s.held(&(ns.id(), k)), Ordering::Relaxed);
                            s.release(&release(&ns, &k, id));
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 3);
        assert_eq!(s.keys(), 0);
    }
}
