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

use crate::decision::{MaybeMs, QuotaStatus};
use crate::quota::MAX_LIMIT;

/// A rate in fine units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rate {
    /// Fine units per token.
    pub(crate) unit: u64,
    /// Fine units refilled per millisecond.
    pub(crate) per_ms: u64,
    /// The most tokens held (the burst).
    pub(crate) burst: u64,
    /// `burst * unit`: a full bucket in fine units.
    pub(crate) capacity: u64,
}

/// Binary GCD: shifts and subtractions, no divisions (it runs on every
/// token-bucket and GCRA charge).
const fn gcd(mut a: u64, mut b: u64) -> u64 {
    if a == 0 {
        return b;
    }
    if b == 0 {
        return a;
    }
    let shift = (a | b).trailing_zeros();
    a >>= a.trailing_zeros();
    loop {
        b >>= b.trailing_zeros();
        if a > b {
            let t = a;
            a = b;
            b = t;
        }
        b -= a;
        if b == 0 {
            return a << shift;
        }
    }
}

impl Rate {
    /// `limit` tokens per `window_ms`, at most `burst` held; `None` when the
    /// capacity in fine units would exceed 2^52 (the quota refuses it).
    pub(crate) const fn of(limit: u64, window_ms: u64, burst: u64) -> Option<Rate> {
        let g = gcd(limit, window_ms);
        let unit = window_ms / g;
        let per_ms = limit / g;
        match burst.checked_mul(unit) {
            Some(capacity) if capacity <= MAX_LIMIT => Some(Rate {
                unit,
                per_ms,
                burst,
                capacity,
            }),
            _ => None,
        }
    }

    /// As [`Rate::of`], holding at most as many tokens as fit 2^52 fine units
    /// (only reachable for quotas scaled down internally, never as configured).
    pub(crate) fn capped(limit: u64, window_ms: u64, burst: u64) -> Rate {
        match Rate::of(limit, window_ms, burst) {
            Some(r) => r,
            None => {
                let unit = window_ms / gcd(limit, window_ms);
                Rate::of(limit, window_ms, (MAX_LIMIT / unit).clamp(1, burst)).unwrap_or(Rate {
                    unit,
                    per_ms: limit / gcd(limit, window_ms),
                    burst: 1,
                    capacity: unit,
                })
            }
        }
    }

    /// Whole milliseconds until `d` fine units have refilled (rounded up).
    pub(crate) fn ms_to_refill(&self, d: u64) -> u64 {
        d.div_ceil(self.per_ms)
    }

    /// Whether `cost` fits a backlog of `d`.
    pub(crate) fn fits(&self, d: u64, cost: u64) -> bool {
        cost <= self.burst && d + cost * self.unit <= self.capacity
    }

    /// The status at `now` for a backlog `d` read from the store, deciding
    /// `cost`; returns the status and the backlog to store.
    pub(crate) fn decide(&self, d: u64, now: u64, cost: u64) -> (QuotaStatus, u64) {
        let allowed = self.fits(d, cost);
        let after = if allowed { d + cost * self.unit } else { d };
        let reset_ms = now + self.ms_to_refill(after);
        let retry_after_ms = if allowed || cost > self.burst {
            0
        } else {
            self.ms_to_refill(d + cost * self.unit - self.capacity)
        };
        let status = QuotaStatus {
            limit: self.burst,
            remaining: self.capacity.saturating_sub(after) / self.unit,
            reset_ms,
            retry_after_ms,
            allowed,
            // When the bucket would be full again had nothing else been charged.
            window_id: reset_ms,
            uncharged_reset_ms: MaybeMs::some(now + self.ms_to_refill(d)),
        };
        (status, after)
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
    fn binary_gcd_agrees_with_euclid() {
        fn euclid(mut a: u64, mut b: u64) -> u64 {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        }
        let samples = [
            0,
            1,
            2,
            3,
            7,
            12,
            1_000,
            3_600_000,
            1 << 40,
            MAX_LIMIT,
            u64::MAX,
        ];
        for a in samples {
            for b in samples {
                assert_eq!(gcd(a, b), euclid(a, b), "gcd({a}, {b})");
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (a, b) = (x >> (x % 50), (x.rotate_left(29)) >> (x % 40));
            assert_eq!(gcd(a, b), euclid(a, b), "gcd({a}, {b})");
        }
    }

    #[test]
    fn a_rate_that_does_not_divide_its_window_is_exact_in_fine_units() {
        // 3 per second: one token is 1000 units, 3 units refill per ms.
        let r = Rate::of(3, 1_000, 3).unwrap();
        assert_eq!((r.unit, r.per_ms, r.capacity), (1_000, 3, 3_000));
        // 1000 per hour reduces by gcd 1000.
        let r = Rate::of(1_000, 3_600_000, 1_000).unwrap();
        assert_eq!((r.unit, r.per_ms), (3_600, 1));
    }

    #[test]
    fn capacity_past_two_to_the_52_is_refused() {
        assert!(Rate::of(7, 1 << 40, 1 << 20).is_none());
        assert!(Rate::of(7, 1 << 20, 1 << 20).is_some());
    }

    #[test]
    fn retry_after_is_the_first_whole_millisecond_at_which_the_cost_fits() {
        let r = Rate::of(3, 1_000, 3).unwrap();
        // Empty bucket: a token needs 1000 units at 3 per ms: 334 ms (333.3 rounded up).
        let (st, after) = r.decide(3_000, 0, 1);
        assert!(!st.allowed);
        assert_eq!(after, 3_000);
        assert_eq!(st.retry_after_ms, 334);
        let (st, _) = r.decide(3_000 - 334 * 3, 334, 1);
        assert!(st.allowed);
        let (st, _) = r.decide(3_000 - 333 * 3, 333, 1);
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
