//! The local deny cache: once the store rejects a key until time T, later
//! requests for that key before T are rejected here, with the same headers, and
//! cost the store nothing.
//!
//! "Until T" is the rejection's `Retry-After`: for a fixed window its reset, for
//! token bucket and GCRA the time this cost would next fit. The client was told
//! to wait until T; honouring that locally is consistent with what it saw.
//! Requests with a smaller cost than the one rejected are not denied from the
//! cache (they might fit sooner).

use crate::decision::Decision;
use crate::key::Key;
use crate::quota::Policy;
use hashbrown::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

/// Local deny cache settings for [`RateLimitLayerBuilder::deny_cache`](crate::RateLimitLayerBuilder::deny_cache).
///
/// On by default for network stores (it is never consulted for the memory
/// store, which answers locally anyway).
///
/// ```
/// use tower_ratelimit::DenyCache;
/// let on = DenyCache::new().max_keys(50_000);
/// let off = DenyCache::disabled();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct DenyCache {
    pub(crate) max_keys: usize,
}

impl Default for DenyCache {
    fn default() -> Self {
        Self::new()
    }
}

impl DenyCache {
    /// Remembers up to 10,000 rejected keys.
    pub const fn new() -> Self {
        Self { max_keys: 10_000 }
    }

    /// No deny cache: every request calls the store.
    pub const fn disabled() -> Self {
        Self { max_keys: 0 }
    }

    /// The most keys remembered (0 disables the cache). At the cap expired
    /// entries go first, then arbitrary ones: an evicted entry only costs one
    /// more store call.
    pub const fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }
}

struct Denial {
    /// Unix ms until which the key is denied.
    until_ms: u64,
    /// The cost that was rejected.
    cost: u64,
    /// When the store decided.
    decided_ms: u64,
    decision: Decision,
    policy: Policy,
}

const SHARDS: usize = 16;

pub(crate) struct Denials {
    shards: Box<[Mutex<HashMap<Key, Denial>>]>,
    per_shard: usize,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Denials {
    /// `None` when disabled.
    pub(crate) fn new(cfg: DenyCache) -> Option<Self> {
        (cfg.max_keys > 0).then(|| {
            let n = SHARDS.min(cfg.max_keys);
            Self {
                shards: (0..n).map(|_| Mutex::new(HashMap::new())).collect(),
                per_shard: cfg.max_keys / n,
                hasher: hashbrown::DefaultHashBuilder::default(),
            }
        })
    }

    fn shard(&self, key: &Key) -> &Mutex<HashMap<Key, Denial>> {
        let i = self.hasher.hash_one(key) >> 48;
        &self.shards[i as usize % self.shards.len()]
    }

    /// The cached rejection for `key`, if it still holds at `now` for `cost`,
    /// with `Retry-After` counted down to `now`.
    pub(crate) fn check(&self, key: &Key, cost: u64, now: u64) -> Option<(Decision, Policy)> {
        let mut map = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let d = map.get(key)?;
        if now >= d.until_ms {
            map.remove(key);
            return None;
        }
        if cost < d.cost {
            return None;
        }
        let elapsed = now.saturating_sub(d.decided_ms);
        let mut decision = d.decision.clone();
        for s in decision.statuses_mut().iter_mut().filter(|s| !s.allowed) {
            s.retry_after_ms = s.retry_after_ms.saturating_sub(elapsed).max(1);
        }
        Some((decision, d.policy.clone()))
    }

    /// Remembers a rejection that has a finite wait.
    pub(crate) fn insert(
        &self,
        key: Key,
        cost: u64,
        now: u64,
        decision: &Decision,
        policy: &Policy,
    ) {
        let wait = decision.retry_after_ms();
        if decision.is_allowed() || wait == 0 {
            return;
        }
        let mut map = self
            .shard(&key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.per_shard && !map.contains_key(&key) {
            map.retain(|_, d| d.until_ms > now);
            if map.len() >= self.per_shard {
                if let Some(victim) = map.keys().next().copied() {
                    map.remove(&victim);
                }
            }
        }
        map.insert(
            key,
            Denial {
                until_ms: now + wait,
                cost,
                decided_ms: now,
                decision: decision.clone(),
                policy: policy.clone(),
            },
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::QuotaStatus;
    use crate::quota::Quota;
    use std::time::Duration;

    fn rejected(retry: u64) -> Decision {
        Decision::from_statuses(
            [QuotaStatus {
                limit: 5,
                remaining: 0,
                reset_ms: 1_000 + retry,
                retry_after_ms: retry,
                allowed: false,
                window_id: 1_000 + retry,
                ..QuotaStatus::default()
            }],
            1,
        )
    }

    fn policy() -> Policy {
        Policy::new(Quota::new(5, Duration::from_secs(1)).unwrap())
    }

    #[test]
    fn denies_until_the_retry_after_then_forgets() {
        let c = Denials::new(DenyCache::new()).unwrap();
        let k = Key::new("k");
        c.insert(k, 1, 1_000, &rejected(500), &policy());
        let (d, _) = c.check(&k, 1, 1_000).unwrap();
        assert_eq!(d, rejected(500), "same decision, same headers");
        let (d, _) = c.check(&k, 1, 1_200).unwrap();
        assert_eq!(d.retry_after_ms(), 300, "Retry-After counts down");
        assert!(c.check(&k, 1, 1_500).is_none());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_smaller_cost_is_not_denied_from_the_cache() {
        let c = Denials::new(DenyCache::new()).unwrap();
        let k = Key::new("k");
        c.insert(k, 3, 0, &rejected(500), &policy());
        assert!(c.check(&k, 2, 1).is_none());
        assert!(c.check(&k, 3, 1).is_some());
    }

    #[test]
    fn stays_within_its_cap() {
        let c = Denials::new(DenyCache::new().max_keys(100)).unwrap();
        for i in 0..10_000u32 {
            c.insert(Key::new(i.to_le_bytes()), 1, 0, &rejected(1_000), &policy());
        }
        assert!(c.len() <= 100);
    }

    #[test]
    fn disabled_means_no_cache() {
        assert!(Denials::new(DenyCache::disabled()).is_none());
    }
}
