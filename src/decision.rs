//! What a store answers: the decision and the state of every quota, from one read.
//!
//! ```
//! use tower_ratelimit::decision::{Decision, QuotaStatus};
//! let reset_ms = 1_700_000_001_500;
//! let hourly = QuotaStatus::refusing(100, 0, reset_ms, 1_500);
//! let d = Decision::from_statuses([hourly], 1);
//! assert!(!d.is_allowed());
//! assert_eq!(d.retry_after_ms(), 1_500);
//! ```

use smallvec::SmallVec;
use std::num::NonZeroU64;

/// The state of one quota after a decision, as the headers report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaStatus {
    /// The most units that can be spent at once: the quota's limit, or the
    /// burst of a token bucket or GCRA quota.
    pub limit: u64,
    /// Units that can be spent now, within `0..=limit`. On a rejection it
    /// is below the request's cost (0 for a cost of 1): what the client can
    /// still spend, never what it asked for.
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
    /// `reset_ms` as it would be had this charge not been made: what the
    /// headers show after a refund, or when another quota rejected the
    /// request. `None` keeps `reset_ms`. (A Unix time is never zero; the
    /// `NonZeroU64` keeps the status small.)
    pub uncharged_reset_ms: Option<NonZeroU64>,
}

impl QuotaStatus {
    /// A quota that admits the request: `remaining` of `limit` left, fully
    /// available again at `reset_ms` (Unix ms).
    pub fn admitting(limit: u64, remaining: u64, reset_ms: u64) -> Self {
        Self {
            limit,
            remaining,
            reset_ms,
            allowed: true,
            ..Self::default()
        }
    }

    /// A quota that refuses the request, which it would admit in
    /// `retry_after_ms`.
    pub fn refusing(limit: u64, remaining: u64, reset_ms: u64, retry_after_ms: u64) -> Self {
        Self {
            limit,
            remaining,
            reset_ms,
            retry_after_ms,
            allowed: false,
            ..Self::default()
        }
    }

    /// This status with the identity of the state charged (see
    /// [`window_id`](Self::window_id)).
    pub fn with_window_id(mut self, window_id: u64) -> Self {
        self.window_id = window_id;
        self
    }

    /// This status with the reset it would have had without this charge
    /// (see [`uncharged_reset_ms`](Self::uncharged_reset_ms); 0 keeps `reset_ms`).
    pub fn with_uncharged_reset_ms(mut self, reset_ms: u64) -> Self {
        self.uncharged_reset_ms = NonZeroU64::new(reset_ms);
        self
    }

    /// Units spent in the current window (`limit - remaining`; 0 when a
    /// store reports more remaining than the limit).
    pub fn used(&self) -> u64 {
        self.limit.saturating_sub(self.remaining)
    }

    /// The status once `cost` of this charge is given back: the cost comes
    /// back, capped at the limit, and the reset is the one before the charge.
    pub(crate) fn refunded(mut self, cost: u64) -> Self {
        self.remaining = self.remaining.saturating_add(cost).min(self.limit);
        if let Some(reset) = self.uncharged_reset_ms {
            self.reset_ms = reset.get();
        }
        self
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
    /// The key is in its policy's penalty box: refused until the block ends
    /// ([`Decision::blocked_until_ms`]), whatever its quotas hold.
    Blocked,
}

/// The outcome of one charge: allowed or not, and every quota's state from the same read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    statuses: Statuses,
    outcome: Outcome,
}

/// The rest of a decision in one word: admitted or why not, whether the
/// key is blocked, and a time. With two statuses inline beside it a
/// decision is 128 bytes, the most that moves without a call to `memcpy`;
/// a decision moves several times a request, and in fields of its own
/// these cost a request through the memory store 10% more instructions.
///
/// Bits 0–1: the [`RejectReason`] (0: admitted); bit 2: the key is blocked
/// until `at`; bits 8–63: `at`, in ms: the wait for a booked turn of an
/// admission, or the end of a refusal's block (Unix ms).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Outcome(u64);

impl Outcome {
    const ADMITTED: Self = Self(0);
    const REASON: u64 = 0b11;
    const BLOCKS: u64 = 0b100;
    const AT_SHIFT: u32 = 8;

    fn refused(reason: RejectReason) -> Self {
        Self(match reason {
            RejectReason::Exhausted => 1,
            RejectReason::CostExceedsLimit => 2,
            RejectReason::Blocked => 3,
        })
    }

    fn reason(self) -> Option<RejectReason> {
        match self.0 & Self::REASON {
            0 => None,
            1 => Some(RejectReason::Exhausted),
            2 => Some(RejectReason::CostExceedsLimit),
            _ => Some(RejectReason::Blocked),
        }
    }

    fn at(self) -> u64 {
        self.0 >> Self::AT_SHIFT
    }

    /// This outcome with `at` (saturating at 2^56 - 1 ms, over two million
    /// years), blocking until then when `blocks`.
    fn with_at(self, at: u64, blocks: bool) -> Self {
        let at = at.min(u64::MAX >> Self::AT_SHIFT);
        let flag = if blocks { Self::BLOCKS } else { 0 };
        Self((self.0 & Self::REASON) | flag | (at << Self::AT_SHIFT))
    }

    fn blocked_until(self) -> Option<u64> {
        (self.0 & Self::BLOCKS != 0).then(|| self.at())
    }
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("reason", &self.reason())
            .field("blocked_until_ms", &self.blocked_until())
            .field("at_ms", &self.at())
            .finish()
    }
}

/// Every quota's status of one decision: two fit without allocating.
pub(crate) type Statuses = SmallVec<[QuotaStatus; 2]>;

impl Decision {
    /// Builds a decision from per-quota statuses as each quota would stand after
    /// charging `cost` (in policy order). It is allowed only if every quota allows
    /// it; otherwise nothing is charged, and the statuses say so.
    pub fn from_statuses(statuses: impl IntoIterator<Item = QuotaStatus>, cost: u64) -> Self {
        Self::of(statuses.into_iter().collect(), cost)
    }

    /// [`from_statuses`](Self::from_statuses) for statuses already collected.
    pub(crate) fn of(statuses: Statuses, cost: u64) -> Self {
        let mut d = Self::empty();
        d.statuses = statuses;
        d.decide(cost);
        d
    }

    /// A decision with no statuses yet: [`push`](Self::push) them, then
    /// [`decide`](Self::decide).
    pub(crate) fn empty() -> Self {
        Self {
            statuses: Statuses::new(),
            outcome: Outcome::ADMITTED,
        }
    }

    /// Adds the next quota's status (in policy order), as charged.
    pub(crate) fn push(&mut self, status: QuotaStatus) {
        self.statuses.push(status);
    }

    /// Decides from the statuses pushed, each quota having been asked to fit
    /// and charged `cost`: see [`decide_each`](Self::decide_each).
    pub(crate) fn decide(&mut self, cost: u64) {
        self.decide_each(|_| (cost, cost));
    }

    /// Decides from the statuses pushed, quota `i` having been asked to fit
    /// `asks(i).0` units and charged `asks(i).1`: allowed only if every
    /// quota allows; otherwise nothing is charged, and the statuses say so.
    #[inline]
    pub(crate) fn decide_each(&mut self, asks: impl Fn(usize) -> (u64, u64)) {
        let statuses = &mut self.statuses;
        if statuses.iter().all(|s| s.allowed) {
            self.outcome = Outcome::ADMITTED;
            return;
        }
        // All or nothing: quotas that would have admitted were not charged either.
        for (i, s) in statuses.iter_mut().enumerate() {
            if s.allowed {
                *s = s.refunded(asks(i).1);
            }
        }
        let never = statuses
            .iter()
            .enumerate()
            .any(|(i, s)| asks(i).0 > s.limit);
        self.outcome = Outcome::refused(if never {
            RejectReason::CostExceedsLimit
        } else {
            RejectReason::Exhausted
        });
    }

    /// A refusal because the key is in its policy's penalty box until
    /// `until_ms` (Unix ms): `statuses` are its quotas as read, uncharged.
    /// A store that keeps penalty boxes answers it (see [`Penalty`](crate::rate::Penalty)).
    pub fn blocked(
        statuses: impl IntoIterator<Item = QuotaStatus>,
        now_ms: u64,
        until_ms: u64,
    ) -> Self {
        let mut d = Self::empty();
        d.statuses = statuses
            .into_iter()
            .map(|mut s| {
                s.allowed = false;
                s.retry_after_ms = until_ms.saturating_sub(now_ms);
                s
            })
            .collect();
        d.outcome = Outcome::refused(RejectReason::Blocked).with_at(until_ms, true);
        d
    }

    /// This refusal, decided at `now_ms`, which put the key in its penalty
    /// box until `until_ms` (Unix ms): later requests are
    /// [`blocked`](Self::blocked). The refusal keeps its reason; its
    /// `Retry-After` is the block's end. An admission is left as it is.
    pub fn with_block(mut self, now_ms: u64, until_ms: u64) -> Self {
        if !self.is_allowed() {
            self.outcome = self.outcome.with_at(until_ms, true);
            let left = until_ms.saturating_sub(now_ms);
            for s in self.statuses.iter_mut().filter(|s| !s.allowed) {
                s.retry_after_ms = s.retry_after_ms.max(left);
            }
        }
        self
    }

    /// This decision as a later request sees it: a refusal that put the key
    /// in its penalty box is, for the requests after it, a block.
    pub(crate) fn into_blocked(mut self) -> Self {
        if let Some(until) = self.outcome.blocked_until() {
            self.outcome = Outcome::refused(RejectReason::Blocked).with_at(until, true);
        }
        self
    }

    /// Until when (Unix ms) the key is in its policy's penalty box, when
    /// this decision found it there or put it there.
    pub fn blocked_until_ms(&self) -> Option<u64> {
        self.outcome.blocked_until()
    }

    /// This admission, for the request's turn `wait_ms` from now: a store
    /// that books turns (a policy that waits,
    /// [`Charge::wait_ms`](crate::store::Charge::wait_ms)) says so. Its
    /// statuses are the quotas as that turn leaves them. A refusal is left
    /// as it is.
    pub fn with_wait(mut self, wait_ms: u64) -> Self {
        if self.is_allowed() {
            self.outcome = self.outcome.with_at(wait_ms, false);
        }
        self
    }

    /// This admission for a later turn as a refusal, for a request of
    /// `cost` that could not wait for it: each quota left with less than
    /// the cost refuses, until the turn. A decision with no wait is left
    /// as it is.
    pub(crate) fn into_unseated(mut self, cost: u64) -> Self {
        let wait = self.wait_ms();
        if wait == 0 {
            return self;
        }
        let short = self.statuses.iter().any(|s| s.remaining < cost.max(1));
        for s in self.statuses.iter_mut() {
            if !short || s.remaining < cost.max(1) {
                s.allowed = false;
                s.retry_after_ms = wait;
            }
        }
        self.outcome = Outcome::refused(RejectReason::Exhausted);
        self
    }

    /// How long the admitted request waits for its booked turn, in ms (0
    /// when it goes now, and for a refusal).
    pub fn wait_ms(&self) -> u64 {
        if self.is_allowed() {
            self.outcome.at()
        } else {
            0
        }
    }

    /// Whether the request is admitted (and was charged).
    pub fn is_allowed(&self) -> bool {
        self.outcome.0 & Outcome::REASON == 0
    }

    /// Why it was rejected, if it was.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        self.outcome.reason()
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
            let better = if self.is_allowed() {
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

    #[test]
    fn a_booking_with_no_seat_becomes_a_refusal_by_the_quotas_with_nothing_left_until_its_turn() {
        let full = QuotaStatus {
            limit: 5,
            remaining: 0,
            allowed: true,
            ..QuotaStatus::default()
        };
        let room = QuotaStatus {
            limit: 100,
            remaining: 40,
            allowed: true,
            ..QuotaStatus::default()
        };
        let booked = Decision::from_statuses([full, room], 1).with_wait(600);
        let refused = booked.into_unseated(1);
        assert!(!refused.is_allowed());
        assert_eq!(refused.reject_reason(), Some(RejectReason::Exhausted));
        assert_eq!(refused.wait_ms(), 0);
        let s = refused.statuses();
        assert_eq!((s[0].allowed, s[0].retry_after_ms), (false, 600));
        assert_eq!((s[1].allowed, s[1].retry_after_ms), (true, 0));
        assert_eq!(refused.binding(), 0);
        // An admission for now is no booking: left as it is.
        let now = Decision::from_statuses([room], 1);
        assert!(now.clone().into_unseated(1).is_allowed());
    }

    #[test]
    fn a_decision_of_two_quotas_moves_without_memcpy_and_keeps_its_outcome() {
        assert!(std::mem::size_of::<Decision>() <= 128);
        let s = QuotaStatus::refusing(5, 0, 1_000, 400);
        let until = 1_700_000_000_000;
        let d = Decision::from_statuses([s], 1).with_block(1_000, until);
        assert_eq!(d.reject_reason(), Some(RejectReason::Exhausted));
        assert_eq!(d.blocked_until_ms(), Some(until));
        assert_eq!(d.wait_ms(), 0);
        let d = d.into_blocked();
        assert_eq!(d.reject_reason(), Some(RejectReason::Blocked));
        assert_eq!(d.blocked_until_ms(), Some(until));
        let ok = Decision::from_statuses([QuotaStatus::admitting(5, 4, 1_000)], 1);
        let booked = ok.clone().with_wait(u64::MAX);
        assert!(booked.is_allowed() && booked.blocked_until_ms().is_none());
        assert_eq!(booked.wait_ms(), u64::MAX >> 8, "saturates");
        assert_eq!(ok.with_wait(200).wait_ms(), 200);
    }

    #[test]
    fn used_never_underflows_when_a_store_reports_more_remaining_than_the_limit() {
        let odd = QuotaStatus {
            limit: 5,
            remaining: 9,
            ..QuotaStatus::default()
        };
        assert_eq!(odd.used(), 0);
    }

    #[test]
    fn a_refund_restores_the_reset_before_the_charge_only_when_there_is_one() {
        let charged = QuotaStatus {
            limit: 10,
            remaining: 3,
            reset_ms: 2_000,
            uncharged_reset_ms: NonZeroU64::new(1_500),
            ..QuotaStatus::default()
        };
        let r = charged.refunded(2);
        assert_eq!((r.remaining, r.reset_ms), (5, 1_500));
        let without = QuotaStatus {
            uncharged_reset_ms: None,
            ..charged
        };
        let r = without.refunded(2);
        assert_eq!((r.remaining, r.reset_ms), (5, 2_000));
        assert_eq!(charged.refunded(100).remaining, 10, "never above the limit");
    }

    #[test]
    fn a_rejection_charges_no_quota_and_names_its_reason() {
        let admits = QuotaStatus {
            limit: 10,
            remaining: 4,
            allowed: true,
            uncharged_reset_ms: NonZeroU64::new(900),
            reset_ms: 1_000,
            ..QuotaStatus::default()
        };
        let rejects = QuotaStatus {
            limit: 3,
            remaining: 0,
            allowed: false,
            retry_after_ms: 700,
            ..QuotaStatus::default()
        };
        let d = Decision::from_statuses([admits, rejects], 2);
        assert!(!d.is_allowed());
        assert_eq!(
            d.statuses()[0].remaining,
            6,
            "the admitting quota gets its cost back"
        );
        assert_eq!(d.statuses()[0].reset_ms, 900);
        assert_eq!(d.reject_reason(), Some(RejectReason::Exhausted));
        assert_eq!(d.binding(), 1);
        let d = Decision::from_statuses([admits, rejects], 4);
        assert_eq!(d.reject_reason(), Some(RejectReason::CostExceedsLimit));
    }
}
