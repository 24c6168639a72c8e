//! Exact integer arithmetic shared by the token bucket and GCRA, which admit
//! the same requests and differ only in what they store.
//!
//! Both are described by a *backlog* `d`: how far the bucket is from full,
//! in fine units where one token is `unit` and `per_ms` units refill every
//! millisecond. With `g = gcd(limit, window_ms)`, `unit = window_ms / g` and
//! `per_ms = limit / g`, so `limit` tokens per window is exact, with no
//! rounding anywhere. A request of `cost` is admitted iff
//! `cost <= burst && d + cost * unit <= capacity` (`capacity = burst * unit`).
//! Every value stays below 2^53, so `lua/rate.lua` computes the same numbers.
//! ([`Rate`] itself, with its fine units, is the quota's: `crate::quota`.)

use super::Ask;
use crate::decision::QuotaStatus;
use crate::quota::Rate;
use std::num::NonZeroU64;

impl Rate {
    /// Whole milliseconds until `d` fine units have refilled (rounded up).
    pub(crate) fn ms_to_refill(&self, d: u64) -> u64 {
        d.div_ceil(self.per_ms)
    }

    /// Whether `cost` fits a backlog of `d`.
    pub(crate) fn fits(&self, d: u64, cost: u64) -> bool {
        cost <= self.burst && d + cost * self.unit <= self.capacity
    }

    /// The backlog after charging `cost` more to `d`: it may pass the
    /// capacity (debt, refilled from below zero), but by at most one full
    /// bucket, so a settlement's debt delays the next admission by at most
    /// two bucket refills ([`Rate::max_backlog`]).
    pub(crate) fn after(&self, d: u64, cost: u64) -> u64 {
        d.saturating_add(cost.saturating_mul(self.unit))
            .min(self.max_backlog().max(d))
    }

    /// The most a backlog holds: empty, and one full bucket of debt.
    pub(crate) fn max_backlog(&self) -> u64 {
        self.capacity.saturating_mul(2)
    }

    /// The status at `now` for a backlog `d` read from the store, deciding
    /// `ask`; returns the status and the backlog to store.
    pub(crate) fn decide(&self, d: u64, now: u64, ask: Ask) -> (QuotaStatus, u64) {
        let cost = ask.fit;
        let allowed = self.fits(d, cost);
        let after = if allowed {
            self.after(d, ask.charge)
        } else {
            d
        };
        let retry_after_ms = if allowed || cost > self.burst {
            0
        } else {
            self.ms_to_refill(d + cost * self.unit - self.capacity)
        };
        (self.status(d, after, now, allowed, retry_after_ms), after)
    }

    /// The status at `now` of a backlog `d` that a decision leaves at `after`.
    #[inline]
    fn status(
        &self,
        d: u64,
        after: u64,
        now: u64,
        allowed: bool,
        retry_after_ms: u64,
    ) -> QuotaStatus {
        let reset_ms = now + self.ms_to_refill(after);
        QuotaStatus {
            limit: self.burst,
            remaining: self.capacity.saturating_sub(after) / self.unit,
            reset_ms,
            retry_after_ms,
            allowed,
            // When the bucket would be full again had nothing else been charged.
            window_id: reset_ms,
            uncharged_reset_ms: NonZeroU64::new(now + self.ms_to_refill(d)),
        }
    }

    /// A request's turn on a backlog `d`: the whole milliseconds from now
    /// until `cost` fits (0 when it fits now), or `None` when it never does
    /// (a cost above the burst).
    pub(crate) fn turn(&self, d: u64, cost: u64) -> Option<u64> {
        if cost > self.burst {
            return None;
        }
        let over = d
            .saturating_add(cost * self.unit)
            .saturating_sub(self.capacity);
        Some(self.ms_to_refill(over))
    }

    /// Where a request of `cost` booked for its turn `t` ms from now (at or
    /// after its [`turn`](Self::turn) on `d`) starts, in fine units from
    /// now: when the backlog before it has refilled to empty, or at the
    /// turn, whichever is later. The charge sits on top: the backlog it
    /// leaves is `start + cost * unit`. A start later than `d` leaves a gap
    /// the bucket refills in before the turn, which nothing may spend:
    /// were the charge stacked on `d` instead, the bucket would refill
    /// while the request waits and admit another request in its place.
    pub(crate) fn booked_start(&self, d: u64, t: u64) -> u64 {
        d.max(t.saturating_mul(self.per_ms))
    }

    /// The status at `now` of a request of `cost` booked `t` ms ahead on a
    /// backlog `d` (see [`booked_start`](Self::booked_start)), and the
    /// backlog to store: admitted, with the quota as the booking leaves it
    /// (a quota that had to wait has nothing left; each is full again once
    /// the booked charge has refilled).
    pub(crate) fn book(&self, d: u64, now: u64, t: u64, cost: u64) -> (QuotaStatus, u64) {
        let after = self
            .booked_start(d, t)
            .saturating_add(cost.saturating_mul(self.unit));
        (self.status(d, after, now, true, 0), after)
    }

    /// The fine units a refund of `cost` gives back to a backlog `d`: the
    /// charge, but never more than the backlog (the bucket is never above full).
    ///
    /// Only call this for the charge that produced the stored state (its
    /// `window_id` is still the state's full-again time): that charge is the
    /// last in line, so its unrefilled part is exactly `min(charge, d)`. Once
    /// anything else was charged or refunded, no number stored tells how much
    /// of an older charge has refilled, and giving it back could hand out
    /// tokens twice — such refunds are dropped.
    pub(crate) fn refundable(&self, d: u64, cost: u64) -> u64 {
        d.min(cost.min(self.burst) * self.unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_the_first_whole_millisecond_at_which_the_cost_fits() {
        let r = Rate::of(3, 1_000, 3).unwrap();
        // Empty bucket: a token needs 1000 units at 3 per ms: 334 ms (333.3 rounded up).
        let (st, after) = r.decide(3_000, 0, Ask::of(1));
        assert!(!st.allowed);
        assert_eq!(after, 3_000);
        assert_eq!(st.retry_after_ms, 334);
        let (st, _) = r.decide(3_000 - 334 * 3, 334, Ask::of(1));
        assert!(st.allowed);
        let (st, _) = r.decide(3_000 - 333 * 3, 333, Ask::of(1));
        assert!(!st.allowed, "one ms earlier it does not fit");
        assert_eq!(st.retry_after_ms, 1);
    }

    #[test]
    fn a_refund_never_returns_more_than_the_charge_nor_above_full() {
        let r = Rate::of(1, 1_000, 5).unwrap();
        assert_eq!(r.refundable(1_000, 2), 1_000, "half the charge refilled");
        assert_eq!(r.refundable(4_000, 2), 2_000, "capped at the charge");
        assert_eq!(r.refundable(0, 2), 0, "fully refilled");
    }
}
