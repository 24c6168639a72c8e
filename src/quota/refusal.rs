//! What a policy does instead of a plain refusal: a request may wait for its
//! turn ([`Wait`]), and a client that keeps hammering is blocked for a while
//! ([`Penalty`]). Both are decided by the store, in the same call as the
//! charge, so they hold across a fleet.

use super::{Policy, Quota};
#[cfg(any(feature = "wait", feature = "penalty"))]
use crate::error::{ConfigError, ConfigErrorKind};
use std::time::Duration;

/// The default of `Wait::max_waiting`: requests one instance holds at once.
#[cfg(feature = "wait")]
const DEFAULT_MAX_WAITING: usize = 1_000;

/// Waiting instead of refusing: a request that would be refused, and whose
/// turn comes within [`up_to`](Self::up_to), is booked for that turn by the
/// same store call that decides it, held, then forwarded. The booking is
/// made atomically in the store, so the instances of a fleet never hand one
/// turn to two requests, and the quota holds in every window as it would
/// without waiting. Set on a [`Policy`] with [`Policy::wait`].
///
/// Only GCRA quotas book turns exactly (one theoretical arrival time per
/// key, pushed later by each booking), so a policy that waits holds GCRA
/// quotas counting requests, each allowing at most 1,000 requests a second
/// per key (turns at least 1 ms apart). A token bucket makes the same
/// decisions as GCRA: use [`Algorithm::Gcra`](crate::Algorithm::Gcra).
///
/// A request past the instance's [`max_waiting`](Self::max_waiting), or
/// whose turn is further away than the maximum, is refused at once, never
/// after a wait. A client that goes away while waiting gives its turn back;
/// a gRPC call waits at most until its deadline (`grpc-timeout`).
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::rate::Wait;
/// use tower_ratelimit::{Algorithm, Policy, Quota, RateLimitLayer};
/// let five_a_second = Quota::new(5, Duration::from_secs(1))?.with_algorithm(Algorithm::Gcra)?;
/// let layer = RateLimitLayer::builder()
///     .quota(Policy::new(five_a_second).wait(Wait::up_to(Duration::from_secs(10)))?)
///     .build()?;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "wait"), allow(unreachable_pub))]
pub struct Wait {
    pub(crate) max: Duration,
    pub(crate) max_waiting: usize,
}

#[cfg(feature = "wait")]
impl Wait {
    /// Waits up to `max` for a request's turn (at least 1 ms, at most a
    /// day: checked by [`Policy::wait`]).
    pub fn up_to(max: Duration) -> Self {
        Self {
            max,
            max_waiting: DEFAULT_MAX_WAITING,
        }
    }

    /// The most requests one instance holds waiting at once, over all keys
    /// (default 1,000); past it a request is refused at once. A seat is
    /// taken when the store has booked a turn, so requests admitted at once
    /// hold none; one booked while concurrent charges took the last seats
    /// gives its turn back (a second store call) and is refused.
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.max_waiting = n;
        self
    }
}

impl Wait {
    /// The longest wait, in whole milliseconds.
    pub(crate) fn max_ms(&self) -> u64 {
        u64::try_from(self.max.as_millis()).unwrap_or(u64::MAX)
    }
}

/// A penalty box: a key refused [`after`](Self::after) times within one
/// window is blocked for [`block_for`](Self::block_for). While blocked,
/// every request of that key is refused at once, with `Retry-After` the time
/// left, though its quota may have room again: brute force on a login costs
/// the attacker the block, not one window. Set on a [`Policy`] with
/// [`Policy::penalty`].
///
/// The refusals counted and the block live in the store, beside the quotas'
/// state, and are decided in the same call as the charge: a block set
/// through one instance holds on every instance, at no extra round trip. A
/// refusal still charges no quota, and requests refused because the key is
/// blocked do not lengthen the block unless
/// [`extended_by_blocked`](Self::extended_by_blocked) says so. Each
/// instance's deny cache answers a blocked key locally until its block ends.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::rate::Penalty;
/// use tower_ratelimit::{Policy, Quota, RateLimitLayer};
/// let login = Policy::new(Quota::new(5, Duration::from_secs(60))?)
///     .penalty(Penalty::after(3).block_for(Duration::from_secs(15 * 60)))?;
/// let layer = RateLimitLayer::builder().quota(login).build()?;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "penalty"), allow(unreachable_pub))]
pub struct Penalty {
    pub(crate) after: u64,
    pub(crate) within: Option<Duration>,
    pub(crate) block: Duration,
    pub(crate) extend: bool,
}

#[cfg(feature = "penalty")]
impl Penalty {
    /// Blocks a key once it has been refused `refusals` times within one
    /// window (by default the policy's longest; see [`within`](Self::within)),
    /// for one minute unless [`block_for`](Self::block_for) says otherwise.
    pub fn after(refusals: u64) -> Self {
        Self {
            after: refusals,
            within: None,
            block: Duration::from_secs(60),
            extend: false,
        }
    }

    /// How long a block lasts (default one minute).
    pub fn block_for(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// The span refusals are counted over (default the policy's longest
    /// window): the count starts with a key's first refusal and starts
    /// again once this has passed.
    pub fn within(mut self, within: Duration) -> Self {
        self.within = Some(within);
        self
    }

    /// Whether a request refused because its key is blocked starts the
    /// block again (default `false`: a block ends when it was set to, however
    /// hard the client keeps knocking).
    pub fn extended_by_blocked(mut self, extend: bool) -> Self {
        self.extend = extend;
        self
    }
}

impl Penalty {
    /// The block, in whole milliseconds.
    pub(crate) fn block_ms(&self) -> u64 {
        u64::try_from(self.block.as_millis()).unwrap_or(u64::MAX)
    }

    /// The counting span for `policy`, in whole milliseconds.
    pub(crate) fn within_ms(&self, policy: &Policy) -> u64 {
        match self.within {
            Some(w) => u64::try_from(w.as_millis()).unwrap_or(u64::MAX),
            None => policy
                .quotas()
                .iter()
                .map(Quota::window_ms)
                .max()
                .unwrap_or(1),
        }
    }
}

/// A policy's waiting and penalty settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Refusal {
    pub(crate) wait: Option<Wait>,
    pub(crate) penalty: Option<Penalty>,
}

/// The longest wait a policy may have: one day.
#[cfg(feature = "wait")]
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

impl Policy {
    /// This policy, waiting for a request's turn instead of refusing it:
    /// see [`Wait`]. Errors unless every quota is a GCRA quota counting
    /// requests, of at most 1,000 a second, and the wait is between 1 ms
    /// and a day.
    #[cfg(feature = "wait")]
    #[cfg_attr(docsrs, doc(cfg(feature = "wait")))]
    pub fn wait(self, wait: Wait) -> Result<Self, ConfigError> {
        use super::{Algorithm, EXACT};
        let invalid = |m: String| Err(ConfigError::new(ConfigErrorKind::Quota, m));
        if wait.max < Duration::from_millis(1) || wait.max > MAX_WAIT {
            return invalid(format!(
                "a wait must be between 1ms and 1 day, got {:?}",
                wait.max
            ));
        }
        if wait.max_waiting == 0 {
            return invalid("a wait needs room for at least one waiting request".into());
        }
        for q in self.quotas() {
            if q.algorithm() != Algorithm::Gcra || !q.counts_requests() {
                return invalid(format!(
                    "waiting books a request's turn exactly only on GCRA quotas counting \
                     requests; quota {} is {} in {}: use Algorithm::Gcra (a token bucket \
                     makes the same decisions)",
                    q.name(),
                    q.algorithm().as_str(),
                    q.unit()
                ));
            }
            if q.limit() > q.window_ms() {
                return invalid(format!(
                    "waiting spaces turns at least 1ms apart: quota {} allows more than \
                     1,000 a second",
                    q.name()
                ));
            }
            let r = q.rate();
            let budget = wait.max_ms().saturating_mul(r.per_ms);
            if r.capacity.saturating_add(budget) > EXACT {
                return invalid(format!(
                    "a wait of {:?} on quota {} is too long for exact arithmetic",
                    wait.max,
                    q.name()
                ));
            }
        }
        Ok(self.with_refusal(Refusal {
            wait: Some(wait),
            ..self.refusal()
        }))
    }

    /// This policy, blocking a key that keeps being refused: see
    /// [`Penalty`]. Errors unless the key is blocked after at least one
    /// refusal, for 1 ms to a year, counted over 1 ms to a year.
    #[cfg(feature = "penalty")]
    #[cfg_attr(docsrs, doc(cfg(feature = "penalty")))]
    pub fn penalty(self, penalty: Penalty) -> Result<Self, ConfigError> {
        use super::MAX_WINDOW;
        let invalid = |m: String| Err(ConfigError::new(ConfigErrorKind::Quota, m));
        if penalty.after == 0 {
            return invalid("a penalty needs at least one refusal to block a key".into());
        }
        let in_range = |d: Duration| d >= Duration::from_millis(1) && d <= MAX_WINDOW;
        if !in_range(penalty.block) {
            return invalid(format!(
                "a penalty's block must be between 1ms and 366 days, got {:?}",
                penalty.block
            ));
        }
        if let Some(w) = penalty.within.filter(|w| !in_range(*w)) {
            return invalid(format!(
                "a penalty counts refusals over 1ms to 366 days, got {w:?}"
            ));
        }
        Ok(self.with_refusal(Refusal {
            penalty: Some(penalty),
            ..self.refusal()
        }))
    }

    /// Whether it neither waits nor keeps a penalty box: a plain refusal.
    /// Always, without the features that set either: the code for them
    /// then costs a request nothing.
    #[inline]
    pub(crate) fn is_plain(&self) -> bool {
        self.waits().is_none() && self.penalty_box().is_none()
    }

    /// Its waiting settings, if it waits.
    #[inline]
    pub(crate) fn waits(&self) -> Option<&Wait> {
        if cfg!(feature = "wait") {
            self.inner.refusal.wait.as_ref()
        } else {
            None
        }
    }

    /// Its penalty box, if it has one.
    #[inline]
    pub(crate) fn penalty_box(&self) -> Option<&Penalty> {
        if cfg!(feature = "penalty") {
            self.inner.refusal.penalty.as_ref()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "penalty")]
    use super::*;

    #[cfg(feature = "penalty")]
    #[test]
    fn a_penalty_whose_block_is_empty_or_longer_than_a_year_is_refused() {
        use crate::Quota;
        let policy = || Policy::new(Quota::new(5, Duration::from_secs(10)).unwrap());
        let minute = Duration::from_secs(60);
        assert!(policy()
            .penalty(Penalty::after(0).block_for(minute))
            .is_err());
        assert!(policy()
            .penalty(Penalty::after(3).block_for(Duration::ZERO))
            .is_err());
        let year = Duration::from_secs(400 * 86_400);
        assert!(policy().penalty(Penalty::after(3).block_for(year)).is_err());
        assert!(policy()
            .penalty(Penalty::after(3).block_for(minute))
            .is_ok());
    }
}
