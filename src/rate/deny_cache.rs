//! The local deny cache: once the store rejects a key under a policy until
//! time T, later requests for that key under that same policy before T are
//! rejected here, with the same headers, and cost the store nothing. A
//! request of the same key under another policy (another route's quota, a
//! tier chosen per request, a runtime override) is not answered from the
//! cache: the store never refused it.
//!
//! "Until T" is the rejection's `Retry-After`: for a fixed window its reset, for
//! token bucket and GCRA the time this cost would next fit. The client was told
//! to wait until T; honouring that locally is consistent with what it saw.
//! Requests with a smaller cost or reservation than the one rejected are not
//! denied from the cache (they might fit sooner). Only a rejection the store made is cached,
//! never one made without it (the failure policy's local limit).

use crate::bounded::{self, Bounded};
use crate::decision::Decision;
use crate::key::Key;
use crate::Policy;
use std::time::Duration;
use tokio::time::Instant;

/// Local deny cache settings for [`RateLimitLayerBuilder::deny_cache`](crate::RateLimitLayerBuilder::deny_cache).
///
/// On by default for network stores (it is never consulted for the memory
/// store, which answers locally anyway).
///
/// ```
/// use tower_ratelimit::rate::DenyCache;
/// let on = DenyCache::new().max_keys(50_000);
/// let off = DenyCache::disabled();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct DenyCache {
    max_keys: usize,
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

    /// The most keys remembered (0 disables the cache). At the cap, expired
    /// entries go first, then those that expire soonest: an evicted entry
    /// only costs one more store call.
    pub const fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }
}

struct Denial {
    /// The key is denied until then (monotonic time).
    until: Instant,
    /// The cost and the reservation that were rejected.
    cost: (u64, u64),
    /// When the store decided.
    decided: Instant,
    decision: Decision,
    /// The policy the store refused: only it is answered from here.
    policy: Policy,
}

impl bounded::Entry for Denial {
    type Now = Instant;

    fn expired(&self, now: Instant) -> bool {
        now >= self.until
    }

    /// The sooner a denial ends, the less it saves.
    fn worth(&self, now: Instant) -> (f64, u64) {
        (self.until.saturating_duration_since(now).as_secs_f64(), 0)
    }
}

pub(crate) struct Denials {
    /// By key and policy fingerprint (the policy itself is checked on a hit).
    map: Bounded<(Key, u64), Denial>,
}

impl Denials {
    /// `None` when disabled.
    pub(crate) fn new(cfg: DenyCache) -> Option<Self> {
        (cfg.max_keys > 0).then(|| Self {
            map: Bounded::new(cfg.max_keys, 16),
        })
    }

    /// The cached rejection for `key` under `policy`, if it still holds
    /// now for `cost`, with `Retry-After` counted down to now.
    pub(crate) fn check(
        &self,
        key: &Key,
        policy: &Policy,
        cost: (u64, u64),
        now: Instant,
    ) -> Option<Decision> {
        let (decision, elapsed) = self.map.read(&(*key, policy.fingerprint()), now, |d| {
            // A blocked key is refused whatever it asks.
            let blocked = d.decision.blocked_until_ms().is_some();
            let covered =
                (blocked || cost.0 >= d.cost.0 && cost.1 >= d.cost.1) && d.policy == *policy;
            covered.then(|| (d.decision.clone(), now - d.decided))
        })??;
        let elapsed = elapsed.as_millis() as u64;
        // A key the cached refusal put in the penalty box is now in it.
        let mut decision = decision.into_blocked();
        for s in decision.statuses_mut().iter_mut().filter(|s| !s.allowed) {
            s.retry_after_ms = s.retry_after_ms.saturating_sub(elapsed).max(1);
        }
        Some(decision)
    }

    /// Remembers a rejection of `key` under `policy` that has a finite wait.
    ///
    /// A refusal of a request that could have waited `booked_ms` for its
    /// turn holds only until its turn is that near: then the store would
    /// book it. Under a policy with a penalty box, only a refusal that
    /// found or put the key in the box is cached (until the block ends):
    /// every other refusal must reach the store, which counts it.
    pub(crate) fn insert(
        &self,
        key: Key,
        cost: (u64, u64),
        decision: &Decision,
        policy: &Policy,
        booked_ms: u64,
        now: Instant,
    ) {
        let counted = policy.penalty_box().is_some() && decision.blocked_until_ms().is_none();
        let wait = decision.retry_after_ms().saturating_sub(booked_ms);
        if decision.is_allowed() || wait == 0 || counted {
            return;
        }
        let denial = Denial {
            until: now + Duration::from_millis(wait),
            cost,
            decided: now,
            decision: decision.clone(),
            policy: policy.clone(),
        };
        self.map
            .update((key, policy.fingerprint()), now, |_| ((), Some(denial)));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::decision::QuotaStatus;
    use crate::Quota;

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
    fn denies_until_the_retry_after_on_the_monotonic_clock_then_forgets() {
        let (c, clock) = (Denials::new(DenyCache::new()).unwrap(), ManualClock::new(0));
        let k = Key::new("k");
        c.insert(k, (1, 1), &rejected(500), &policy(), 0, clock.monotonic());
        let d = c.check(&k, &policy(), (1, 1), clock.monotonic()).unwrap();
        assert_eq!(d, rejected(500), "same decision, same headers");
        clock.advance(Duration::from_millis(200));
        let d = c.check(&k, &policy(), (1, 1), clock.monotonic()).unwrap();
        assert_eq!(d.retry_after_ms(), 300, "Retry-After counts down");
        // A wall-clock step does not move the expiry.
        clock.set(3_600_000);
        assert!(c.check(&k, &policy(), (1, 1), clock.monotonic()).is_some());
        clock.advance(Duration::from_millis(300));
        assert!(c.check(&k, &policy(), (1, 1), clock.monotonic()).is_none());
    }

    #[test]
    fn a_smaller_cost_or_reservation_is_not_denied_from_the_cache() {
        let c = Denials::new(DenyCache::new()).unwrap();
        let (k, now) = (Key::new("k"), Instant::now());
        c.insert(k, (3, 3), &rejected(500), &policy(), 0, now);
        assert!(c.check(&k, &policy(), (2, 2), now).is_none());
        assert!(c.check(&k, &policy(), (3, 3), now).is_some());
        // A smaller reservation (a quota in tokens) might fit sooner too.
        assert!(c.check(&k, &policy(), (3, 2), now).is_none());
    }

    #[test]
    fn a_rejection_answers_only_its_own_policy_and_each_policy_keeps_its_own() {
        let c = Denials::new(DenyCache::new()).unwrap();
        let (k, now) = (Key::new("k"), Instant::now());
        let login = Policy::new(Quota::new(2, Duration::from_secs(3600)).unwrap());
        let api = Policy::new(Quota::new(100, Duration::from_secs(3600)).unwrap());
        c.insert(k, (1, 1), &rejected(500), &login, 0, now);
        assert!(c.check(&k, &login, (1, 1), now).is_some());
        assert!(
            c.check(&k, &api, (1, 1), now).is_none(),
            "another policy, never refused"
        );
        // The same quotas built again are the same policy.
        let login_again = Policy::new(Quota::new(2, Duration::from_secs(3600)).unwrap());
        assert!(c.check(&k, &login_again, (1, 1), now).is_some());
        c.insert(k, (1, 1), &rejected(900), &api, 0, now);
        assert_eq!(
            c.check(&k, &login, (1, 1), now).unwrap().retry_after_ms(),
            500
        );
        assert_eq!(
            c.check(&k, &api, (1, 1), now).unwrap().retry_after_ms(),
            900
        );
    }

    #[test]
    fn stays_within_its_cap() {
        let c = Denials::new(DenyCache::new().max_keys(100)).unwrap();
        let now = Instant::now();
        for i in 0..10_000u32 {
            c.insert(
                Key::new(i.to_le_bytes()),
                (1, 1),
                &rejected(1_000),
                &policy(),
                0,
                now,
            );
        }
        assert!(c.len() <= 100, "{} entries", c.len());
    }

    #[test]
    fn disabled_means_no_cache() {
        assert!(Denials::new(DenyCache::disabled()).is_none());
    }
}
