//! A limit on requests in flight that finds itself: [`Adaptive`], the
//! estimator that moves it with the latency of the requests it lets
//! through, and the limit the load shedder and the concurrency
//! limiter share between requests.
//!
//! In numbers: a sample slower than the least latency means
//! `limit × (1 − least / latency)` requests are queued. While that queue is
//! short the limit grows; while it is long it shrinks; in between it holds.

use crate::error::{ConfigError, ConfigErrorKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// A limit on requests in flight found from the latency of the requests it
/// lets through instead of set by hand, within bounds: the load shedder's
/// capacity ([`LoadShedLayerBuilder::adaptive`](crate::LoadShedLayerBuilder::adaptive))
/// or the concurrency limiter's limit
/// ([`ConcurrencyLimitLayerBuilder::adaptive`](crate::ConcurrencyLimitLayerBuilder::adaptive)).
///
/// The rule is TCP Vegas's, as Netflix's concurrency-limits applies it: the
/// least latency seen is what a request costs without queueing, and a
/// slower one says how many are queued. While few are, the limit grows;
/// while many are, it shrinks. Now and then it is halved for a moment to
/// measure the least latency afresh, so a service that got slower for good
/// is not held to its old speed. Each process finds its own limit from its
/// own requests.
///
/// ```
/// use tower_ratelimit::{adaptive::Adaptive, LoadShedLayer};
/// let layer = LoadShedLayer::builder()
///     .adaptive(Adaptive::new().initial(20).min(4).max(500))
///     .build()
///     .unwrap();
/// assert_eq!(layer.capacity(), Some(20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Adaptive {
    pub(crate) initial: u64,
    pub(crate) min: u64,
    pub(crate) max: u64,
}

impl Default for Adaptive {
    fn default() -> Self {
        Self::new()
    }
}

impl Adaptive {
    /// Starts at 20 requests in flight, between 1 and 1,000.
    ///
    /// ```
    /// use tower_ratelimit::adaptive::Adaptive;
    /// assert_eq!(Adaptive::new(), Adaptive::default());
    /// ```
    pub const fn new() -> Self {
        Self {
            initial: 20,
            min: 1,
            max: 1_000,
        }
    }

    /// The limit before any latency is known.
    pub const fn initial(mut self, n: u64) -> Self {
        self.initial = n;
        self
    }

    /// The least the limit may fall to (at least 1).
    pub const fn min(mut self, n: u64) -> Self {
        self.min = n;
        self
    }

    /// The most the limit may grow to.
    pub const fn max(mut self, n: u64) -> Self {
        self.max = n;
        self
    }

    /// Refuses bounds that are wrong.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if 1 <= self.min && self.min <= self.initial && self.initial <= self.max {
            return Ok(());
        }
        Err(ConfigError::new(
            ConfigErrorKind::Invalid,
            format!(
            "an adaptive limit needs 1 <= min <= initial <= max, got min {}, initial {}, max {}",
            self.min, self.initial, self.max
        ),
        ))
    }
}

/// An adaptive limit shared by every request of one layer: read without a
/// lock on the request path, moved by each finished request's latency.
#[derive(Debug)]
pub(crate) struct AdaptiveLimit {
    estimator: Mutex<Estimator>,
    now: AtomicU64,
}

impl AdaptiveLimit {
    pub(crate) fn new(cfg: Adaptive) -> Self {
        Self {
            now: AtomicU64::new(cfg.initial),
            estimator: Mutex::new(Estimator::new(cfg)),
        }
    }

    /// The limit now.
    pub(crate) fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// Takes one request's latency, with `in_flight` requests in flight
    /// beside it (itself included); returns the new limit.
    pub(crate) fn sample(&self, latency: Duration, in_flight: u64) -> u64 {
        let mut e = self
            .estimator
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let limit = e.sample(latency, in_flight);
        self.now.store(limit, Ordering::Relaxed);
        limit
    }
}

/// The limit, moved by each latency sample.
#[derive(Debug)]
pub(crate) struct Estimator {
    limit: f64,
    min: f64,
    max: f64,
    /// The least latency seen since the last probe: a request's cost
    /// without queueing.
    least: Option<Duration>,
    samples: u64,
    /// When the least latency is measured afresh (a sample count).
    probe_at: u64,
    /// Until when the last change is left to show (a sample count): the
    /// requests in flight when the limit moved say nothing of the new one,
    /// so it moves at most once per round of requests, as TCP Vegas moves
    /// its window once per round trip.
    settle_at: u64,
}

/// Samples between two fresh measurements of the least latency, per unit
/// of the limit.
const PROBE_EVERY: f64 = 30.0;

impl Estimator {
    pub(crate) fn new(cfg: Adaptive) -> Self {
        let limit = cfg.initial as f64;
        Self {
            limit,
            min: cfg.min as f64,
            max: cfg.max as f64,
            least: None,
            samples: 0,
            probe_at: (PROBE_EVERY * limit) as u64,
            settle_at: 0,
        }
    }

    /// The limit now.
    pub(crate) fn limit(&self) -> u64 {
        self.limit as u64
    }

    /// Takes one request's latency, with `in_flight` requests in flight
    /// beside it (itself included); returns the new limit.
    pub(crate) fn sample(&mut self, latency: Duration, in_flight: u64) -> u64 {
        self.samples += 1;
        if self.samples >= self.probe_at {
            // Halved, the queue drains, and the next samples show what a
            // request costs now without it.
            self.least = None;
            self.limit = (self.limit / 2.0).max(self.min);
            self.probe_at = self.samples + (PROBE_EVERY * self.limit) as u64;
            self.settle_at = self.samples + in_flight;
        }
        let least = match self.least {
            Some(least) if latency >= least => least,
            _ => {
                self.least = Some(latency);
                return self.limit();
            }
        };
        // Too few in flight to tell whether the capacity held it back, or
        // the last change has not shown yet.
        if (in_flight as f64) * 2.0 < self.limit || self.samples < self.settle_at {
            return self.limit();
        }
        let queued = if latency.is_zero() {
            0.0
        } else {
            (self.limit * (1.0 - least.as_secs_f64() / latency.as_secs_f64())).ceil()
        };
        let step = self.limit.log10().max(1.0);
        let (alpha, beta) = (3.0 * step, 6.0 * step);
        let next = if queued <= step {
            self.limit + beta
        } else if queued < alpha {
            self.limit + step
        } else if queued > beta {
            self.limit - step
        } else {
            self.limit
        };
        let next = next.clamp(self.min, self.max);
        if next != self.limit {
            self.settle_at = self.samples + in_flight;
        }
        self.limit = next;
        self.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn grows_while_nothing_queues_and_shrinks_while_much_does_within_its_bounds() {
        let mut e = Estimator::new(Adaptive::new().initial(10).min(10).max(40));
        assert_eq!(
            e.sample(10 * MS, 10),
            10,
            "the first sample sets the least latency"
        );
        assert_eq!(e.sample(10 * MS, 10), 16, "no queue: grows by beta");
        // It moves once per round of requests (one limit's worth of
        // samples), as TCP Vegas moves once per round trip.
        assert_eq!(
            e.sample(10 * MS, 16),
            16,
            "the last change has not shown yet"
        );
        for _ in 0..200 {
            e.sample(10 * MS, e.limit());
        }
        assert_eq!(e.limit(), 40, "held at its maximum");

        let mut e = Estimator::new(Adaptive::new().initial(40).min(10).max(40));
        e.sample(10 * MS, 40);
        // Twice the least latency: half the limit is queued, 20 of 40,
        // more than beta (6 log10 40 = 9.6): it shrinks until the queue is
        // between alpha and beta (6 of 11).
        for _ in 0..600 {
            e.sample(20 * MS, e.limit());
        }
        assert_eq!(e.limit(), 11, "held where about 6 are queued");
        // Ten times: nine in ten queued, at any limit: down to its minimum.
        for _ in 0..100 {
            e.sample(100 * MS, e.limit());
        }
        assert_eq!(e.limit(), 10, "down to its minimum");
    }

    #[test]
    fn a_limit_that_held_nothing_back_is_left_alone() {
        let mut e = Estimator::new(Adaptive::new().initial(100));
        e.sample(10 * MS, 100);
        for _ in 0..20 {
            assert_eq!(e.sample(10 * MS, 10), 100, "10 in flight of 100");
        }
    }

    #[test]
    fn the_least_latency_is_measured_afresh_so_a_slower_service_is_not_held_to_its_old_speed() {
        let mut e = Estimator::new(Adaptive::new().initial(10).min(1).max(1_000));
        e.sample(10 * MS, 10);
        // The service now takes 50 ms for good: at first that reads as a
        // long queue and the limit shrinks, until the probe re-measures.
        for _ in 0..2_000 {
            e.sample(50 * MS, e.limit().max(1));
        }
        assert!(
            e.limit() > 10,
            "it grows again once 50 ms is the norm: {}",
            e.limit()
        );
    }

    #[test]
    fn bad_bounds_are_refused() {
        assert!(Adaptive::new().check().is_ok());
        assert!(Adaptive::new().min(0).check().is_err());
        assert!(Adaptive::new().initial(5).min(10).check().is_err());
        assert!(Adaptive::new().max(10).check().is_err());
    }
}
