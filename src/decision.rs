//! What a store answers: the decision and the state of every quota, from one read.

use smallvec::SmallVec;

/// The state of one quota after a decision, as the headers report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaStatus {
    /// The most units that can be spent at once: the quota's limit, or the
    /// burst of a token bucket or GCRA quota.
    pub limit: u64,
    /// Units that can be spent now, within `0..=limit`.
    pub remaining: u64,
    /// Unix ms at which the quota is fully available again (a fixed window's
    /// stored reset; when a bucket is full again; when the last logged or
    /// counted unit stops weighing). `now` when it already is.
    pub reset_ms: u64,
    /// When this quota rejected the request: ms until it would be admitted; else 0.
    pub retry_after_ms: u64,
    /// Whether this quota alone would admit the request.
    pub allowed: bool,
    /// Identity of the state charged, for refunds: a fixed window's reset; for
    /// a token bucket or GCRA the instant it would be full again after this
    /// charge (the refund gives back only the part not yet refilled); a
    /// sliding window counter's window start; a sliding log entry's time. A
    /// refund never reaches a newer window or more than was charged.
    pub window_id: u64,
    /// `reset_ms` as it would be had this charge not been made (a refund, or
    /// another quota rejecting the request).
    pub(crate) uncharged_reset_ms: MaybeMs,
}

/// A time in Unix ms, or none, in 8 bytes: `u64::MAX`, which no reset
/// reaches, is none. An `Option<u64>` takes 16, which made a
/// [`QuotaStatus`] 64 bytes and a [`Decision`] (and a store's
/// `Result<Decision, StoreError>`) over 128: the compiler copies a value of
/// up to 128 bytes with a few register moves and anything larger with a
/// call to `memcpy`, and a Redis store's decision is moved about six times
/// on its way from the reply to the response.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaybeMs(u64);

impl MaybeMs {
    /// No time.
    pub(crate) const NONE: MaybeMs = MaybeMs(u64::MAX);

    /// `ms` (none if it is `u64::MAX`, a time no clock reaches).
    pub(crate) fn some(ms: u64) -> Self {
        MaybeMs(ms)
    }

    /// The time, if there is one.
    pub(crate) fn get(self) -> Option<u64> {
        (self.0 != u64::MAX).then_some(self.0)
    }
}

impl Default for MaybeMs {
    fn default() -> Self {
        MaybeMs::NONE
    }
}

impl std::fmt::Debug for MaybeMs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl QuotaStatus {
    /// Units spent in the current window (`limit - remaining`).
    pub fn used(&self) -> u64 {
        self.limit - self.remaining
    }
}

/// Why a request was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectReason {
    /// A quota has too little left now; retrying after `Retry-After` may succeed.
    Exhausted,
    /// The request's cost exceeds a quota's limit: it can never be admitted.
    CostExceedsLimit,
}

/// The outcome of one charge: allowed or not, and every quota's state from the same read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    reason: Option<RejectReason>,
    statuses: SmallVec<[QuotaStatus; 2]>,
}

impl Decision {
    /// Builds a decision from per-quota statuses as each quota would stand after
    /// charging `cost` (in policy order). It is allowed only if every quota allows
    /// it; otherwise nothing is charged, and the statuses say so.
    pub fn from_statuses(statuses: impl IntoIterator<Item = QuotaStatus>, cost: u64) -> Self {
        let mut d = Self::building();
        d.statuses.extend(statuses);
        d.settle(cost);
        d
    }

    /// An empty decision to [`push`](Self::push) statuses into, then
    /// [`settle`](Self::settle): the memory store builds it in place, where the
    /// caller reads it, instead of copying it out through each return.
    pub(crate) fn building() -> Self {
        Self {
            allowed: false,
            reason: None,
            statuses: SmallVec::new(),
        }
    }

    /// Adds the next quota's status (in policy order).
    pub(crate) fn push(&mut self, status: QuotaStatus) {
        self.statuses.push(status);
    }

    /// Decides from the statuses pushed, as [`Decision::from_statuses`] does.
    pub(crate) fn settle(&mut self, cost: u64) {
        let allowed = self.statuses.iter().all(|s| s.allowed);
        if !allowed {
            // All or nothing: quotas that would have admitted were not charged either.
            for s in self.statuses.iter_mut().filter(|s| s.allowed) {
                *s = crate::algorithm::refunded_status(*s, cost);
            }
        }
        self.allowed = allowed;
        self.reason = if allowed {
            None
        } else if self.statuses.iter().any(|s| cost > s.limit) {
            Some(RejectReason::CostExceedsLimit)
        } else {
            Some(RejectReason::Exhausted)
        };
    }

    /// Whether the request is admitted (and was charged).
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Why it was rejected, if it was.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        self.reason
    }

    /// Each quota's state, in the policy's order.
    pub fn statuses(&self) -> &[QuotaStatus] {
        &self.statuses
    }

    pub(crate) fn statuses_mut(&mut self) -> &mut [QuotaStatus] {
        &mut self.statuses
    }

    /// Index of the quota the headers report: when rejected, the rejecting quota
    /// with the longest wait; when allowed, the one with the least remaining.
    pub fn binding(&self) -> usize {
        let mut best = 0;
        for (i, s) in self.statuses.iter().enumerate().skip(1) {
            let b = &self.statuses[best];
            let better = if self.allowed {
                (s.remaining, std::cmp::Reverse(s.reset_ms))
                    < (b.remaining, std::cmp::Reverse(b.reset_ms))
            } else {
                (!s.allowed, s.retry_after_ms) > (!b.allowed, b.retry_after_ms)
            };
            if better {
                best = i;
            }
        }
        best
    }

    /// The status of the binding quota.
    pub fn binding_status(&self) -> Option<&QuotaStatus> {
        self.statuses.get(self.binding())
    }

    /// Ms until a rejected request would be admitted (the longest wait of any
    /// rejecting quota); 0 if allowed.
    pub fn retry_after_ms(&self) -> u64 {
        self.statuses
            .iter()
            .filter(|s| !s.allowed)
            .map(|s| s.retry_after_ms)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;

    #[test]
    fn a_decision_and_a_stores_answer_fit_in_128_bytes() {
        // What the compiler copies with register moves rather than a call to
        // memcpy (see MaybeMs); a Redis charge's answer is moved about six
        // times between its reply and its response.
        assert!(std::mem::size_of::<QuotaStatus>() <= 56);
        assert!(std::mem::size_of::<Decision>() <= 128);
        assert!(std::mem::size_of::<Result<Decision, StoreError>>() <= 128);
    }

    #[test]
    fn an_uncharged_reset_is_a_time_or_none() {
        assert_eq!(MaybeMs::default().get(), None);
        assert_eq!(MaybeMs::NONE.get(), None);
        assert_eq!(MaybeMs::some(0).get(), Some(0));
        assert_eq!(
            MaybeMs::some(1_796_051_584_123).get(),
            Some(1_796_051_584_123)
        );
        // The one time it cannot hold: u64::MAX, which no clock reaches, is none.
        assert_eq!(MaybeMs::some(u64::MAX).get(), None);
        assert_eq!(QuotaStatus::default().uncharged_reset_ms, MaybeMs::NONE);
        // Debug reads as the Option it stands for.
        let s = QuotaStatus {
            uncharged_reset_ms: MaybeMs::some(5),
            ..QuotaStatus::default()
        };
        assert!(
            format!("{s:?}").contains("uncharged_reset_ms: Some(5)"),
            "{s:?}"
        );
        assert!(format!("{:?}", QuotaStatus::default()).contains("uncharged_reset_ms: None"));
    }

    #[test]
    fn a_refund_restores_the_reset_before_the_charge_only_when_there_is_one() {
        let charged = QuotaStatus {
            limit: 10,
            remaining: 3,
            reset_ms: 2_000,
            uncharged_reset_ms: MaybeMs::some(1_500),
            ..QuotaStatus::default()
        };
        let r = crate::algorithm::refunded_status(charged, 2);
        assert_eq!((r.remaining, r.reset_ms), (5, 1_500));
        let without = QuotaStatus {
            uncharged_reset_ms: MaybeMs::NONE,
            ..charged
        };
        let r = crate::algorithm::refunded_status(without, 2);
        assert_eq!((r.remaining, r.reset_ms), (5, 2_000));
    }
}
