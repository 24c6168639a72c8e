//! A circuit breaker in front of the store: after repeated failures, stop
//! calling it for a cool-down and answer per the failure policy at once, so a
//! dead Redis does not add the store timeout to every request.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Circuit breaker settings for [`RateLimitLayerBuilder::circuit_breaker`](crate::RateLimitLayerBuilder::circuit_breaker).
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::CircuitBreaker;
/// let breaker = CircuitBreaker::new().failures(3).cooldown(Duration::from_millis(500));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct CircuitBreaker {
    pub(crate) threshold: u32,
    pub(crate) cooldown: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new()
    }
}

impl CircuitBreaker {
    /// Opens after 5 consecutive store failures; probes again after 1 s.
    pub const fn new() -> Self {
        Self {
            threshold: 5,
            cooldown: Duration::from_secs(1),
        }
    }

    /// Never opens: every request calls the store (and may wait for its timeout).
    pub const fn disabled() -> Self {
        Self {
            threshold: u32::MAX,
            cooldown: Duration::ZERO,
        }
    }

    /// Consecutive failures that open the breaker (at least 1).
    pub const fn failures(mut self, n: u32) -> Self {
        self.threshold = if n == 0 { 1 } else { n };
        self
    }

    /// How long the breaker stays open before one probe call is let through.
    pub const fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }
}

/// The breaker's state, as reported by metrics (`0`, `1`, `2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

/// Whether a request may call the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: call the store.
    Call,
    /// The cool-down has passed: this one call probes the store.
    Probe,
    /// Open: do not call the store.
    Reject,
}

pub(crate) struct Breaker {
    threshold: u32,
    cooldown_ms: u64,
    failures: AtomicU32,
    /// 0 = closed; otherwise the time (ms) until which calls are refused.
    open_until: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(cfg: CircuitBreaker) -> Self {
        Self {
            threshold: cfg.threshold,
            cooldown_ms: cfg.cooldown.as_millis() as u64,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    pub(crate) fn admit(&self, now: u64) -> Admit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Admit::Call;
        }
        if now < until {
            return Admit::Reject;
        }
        // One caller wins the probe; the others keep failing fast meanwhile.
        match self.open_until.compare_exchange(
            until,
            now + self.cooldown_ms.max(1),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Admit::Probe,
            Err(_) => Admit::Reject,
        }
    }

    /// Records a successful call; returns true if this closed an open breaker.
    pub(crate) fn success(&self) -> bool {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        self.open_until.load(Ordering::Acquire) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
    }

    /// Records a failed call; returns true if this opened the breaker.
    pub(crate) fn failure(&self, now: u64) -> bool {
        if self.threshold == u32::MAX {
            return false;
        }
        let n = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if n >= self.threshold {
            let was = self
                .open_until
                .swap(now + self.cooldown_ms.max(1), Ordering::AcqRel);
            return was == 0;
        }
        false
    }

    fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    #[cfg(test)]
    fn state(&self, now: u64) -> BreakerState {
        match self.open_until.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            until if now < until => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }
}

/// Most breakers a layer keeps; stores with more failure domains share them.
const MAX_DOMAINS: usize = 1024;

/// One breaker per failure domain of the store (see
/// [`Store::failure_domain`](crate::store::Store::failure_domain)): one for a
/// single Redis, one per shard for a sharded store, so repeated failures of one
/// dead shard open only that shard's breaker and the others keep calling.
pub(crate) struct Breakers(Box<[Breaker]>);

impl Breakers {
    pub(crate) fn new(cfg: CircuitBreaker, domains: usize) -> Self {
        Self(
            (0..domains.clamp(1, MAX_DOMAINS))
                .map(|_| Breaker::new(cfg))
                .collect(),
        )
    }

    /// The breaker of failure domain `domain`.
    pub(crate) fn get(&self, domain: usize) -> &Breaker {
        &self.0[domain % self.0.len()]
    }

    /// Whether any domain's breaker is open (the `ratelimit_breaker_state` gauge).
    pub(crate) fn any_open(&self) -> bool {
        self.0.iter().any(Breaker::is_open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_domain_has_its_own_breaker() {
        let b = Breakers::new(CircuitBreaker::new().failures(2), 3);
        assert!(!b.get(1).failure(0));
        assert!(b.get(1).failure(1), "domain 1 opens");
        assert!(b.any_open());
        assert_eq!(b.get(1).admit(2), Admit::Reject);
        assert_eq!(b.get(0).admit(2), Admit::Call, "domain 0 still calls");
        assert_eq!(b.get(2).admit(2), Admit::Call, "domain 2 still calls");
        assert_eq!(b.get(4).admit(2), Admit::Reject, "domains wrap around");
        assert!(Breakers::new(CircuitBreaker::new(), 0).get(7).admit(0) == Admit::Call);
    }

    #[test]
    fn opens_after_the_threshold_rejects_during_cooldown_and_lets_one_probe_through() {
        let b = Breaker::new(
            CircuitBreaker::new()
                .failures(3)
                .cooldown(Duration::from_millis(100)),
        );
        assert_eq!(b.admit(0), Admit::Call);
        assert!(!b.failure(0));
        assert!(!b.failure(1));
        assert!(b.failure(2), "the third failure opens it");
        assert_eq!(b.admit(50), Admit::Reject);
        assert_eq!(b.state(50), BreakerState::Open);
        assert_eq!(b.admit(102), Admit::Probe);
        assert_eq!(b.admit(103), Admit::Reject, "one probe at a time");
        // The probe fails: open for another cool-down.
        b.failure(104);
        assert_eq!(b.admit(150), Admit::Reject);
        assert_eq!(b.admit(205), Admit::Probe);
        assert!(b.success(), "a successful probe closes it");
        assert_eq!(b.admit(206), Admit::Call);
        assert_eq!(b.state(206), BreakerState::Closed);
    }

    #[test]
    fn a_success_resets_the_count_of_consecutive_failures() {
        let b = Breaker::new(CircuitBreaker::new().failures(2));
        b.failure(0);
        b.success();
        assert!(!b.failure(1));
        assert_eq!(b.admit(1), Admit::Call);
    }

    #[test]
    fn a_disabled_breaker_never_opens() {
        let b = Breaker::new(CircuitBreaker::disabled());
        for t in 0..1000 {
            assert!(!b.failure(t));
        }
        assert_eq!(b.admit(1000), Admit::Call);
    }
}
