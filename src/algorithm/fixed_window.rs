//! Fixed window: `limit` units per window; the window starts at a key's first
//! request and its reset time is stored with the count (never derived from a
//! TTL and a second clock), so every response in a window reports one reset.
//!
//! Mirrored, decision for decision, by `lua/fixed_window.lua`.

use super::{add_capped, Ask};
use crate::decision::QuotaStatus;
use std::num::NonZeroU64;

/// A key's fixed-window state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Units charged in the window.
    pub(crate) count: u64,
    /// Unix ms when the window ends (stored, not derived).
    pub(crate) reset_ms: u64,
}

/// The state as it stands at `now`: a window whose reset has passed is gone,
/// whatever the store returned (a lagging replica, a key not yet expired).
pub(crate) fn current(state: Option<State>, window_ms: u64, now: u64) -> State {
    match state {
        Some(s) if s.reset_ms > now => s,
        _ => State {
            count: 0,
            reset_ms: now + window_ms,
        },
    }
}

/// Decides whether `ask.fit` fits; returns the status and the state to
/// store if it does, charged `ask.charge` (which may go past the limit: a
/// reservation charged whole while anything is left).
pub(crate) fn charge(
    state: Option<State>,
    limit: u64,
    window_ms: u64,
    now: u64,
    ask: Ask,
) -> (QuotaStatus, State) {
    let s = current(state, window_ms, now);
    let allowed = ask.fit <= limit && s.count.saturating_add(ask.fit) <= limit;
    let next = if allowed {
        State {
            count: add_capped(s.count, ask.charge),
            ..s
        }
    } else {
        s
    };
    let status = status_of(next, limit, now, allowed, ask.fit);
    (status, next)
}

/// The status of `state` at `now`, without charging.
pub(crate) fn peek(state: Option<State>, limit: u64, window_ms: u64, now: u64) -> QuotaStatus {
    status_of(current(state, window_ms, now), limit, now, true, 0)
}

/// Gives `cost` back to the window `window_id` (its reset), only if that window
/// is still the stored one; never below zero.
pub(crate) fn refund(state: Option<State>, window_id: u64, now: u64, cost: u64) -> Option<State> {
    match state {
        Some(s) if s.reset_ms == window_id && s.reset_ms > now => Some(State {
            count: s.count.saturating_sub(cost),
            ..s
        }),
        _ => None,
    }
}

/// Charges `extra` more to the window `window_id` (its reset), only while
/// that window is still the stored one and has not ended: a settlement above
/// the reservation. The count may pass the limit (remaining shows 0 until the
/// reset).
pub(crate) fn debit(state: Option<State>, window_id: u64, now: u64, extra: u64) -> Option<State> {
    match state {
        Some(s) if s.reset_ms == window_id && s.reset_ms > now => Some(State {
            count: add_capped(s.count, extra),
            ..s
        }),
        _ => None,
    }
}

fn status_of(s: State, limit: u64, now: u64, allowed: bool, cost: u64) -> QuotaStatus {
    // A lowered limit can leave count above it: remaining stays within [0, limit].
    let remaining = limit.saturating_sub(s.count);
    QuotaStatus {
        limit,
        remaining,
        reset_ms: s.reset_ms,
        retry_after_ms: if allowed || cost > limit {
            0
        } else {
            s.reset_ms - now
        },
        allowed,
        window_id: s.reset_ms,
        uncharged_reset_ms: NonZeroU64::new(s.reset_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use std::time::Duration;

    const W: u64 = 60_000;

    #[test]
    fn first_request_opens_a_window_ending_one_window_later() {
        let clock = ManualClock::new(10_000);
        let (st, s) = charge(None, 3, W, clock.now_ms(), Ask::of(1));
        assert!(st.allowed);
        assert_eq!((st.remaining, st.reset_ms), (2, 70_000));
        assert_eq!(
            s,
            State {
                count: 1,
                reset_ms: 70_000
            }
        );
    }

    #[test]
    fn boundary_last_ms_of_window_is_still_the_old_window_and_reset_instant_is_new() {
        let clock = ManualClock::new(0);
        let (_, s) = charge(None, 1, W, clock.now_ms(), Ask::of(1));
        clock.set(W - 1);
        let (st, _) = charge(Some(s), 1, W, clock.now_ms(), Ask::of(1));
        assert!(!st.allowed);
        assert_eq!(st.retry_after_ms, 1);
        assert_eq!(st.reset_ms, W);
        clock.advance(Duration::from_millis(1));
        let (st, s2) = charge(Some(s), 1, W, clock.now_ms(), Ask::of(1));
        assert!(st.allowed);
        assert_eq!(
            s2.reset_ms,
            2 * W,
            "a new window starts at the reset instant"
        );
    }

    #[test]
    fn cost_above_one_spends_several_units_and_rejects_when_it_does_not_fit() {
        let (st, s) = charge(None, 5, W, 0, Ask::of(3));
        assert_eq!((st.allowed, st.remaining), (true, 2));
        let (st, s2) = charge(Some(s), 5, W, 1, Ask::of(3));
        assert!(!st.allowed);
        assert_eq!(st.remaining, 2, "a rejected request is not charged");
        assert_eq!(s2, s);
        let (st, _) = charge(Some(s), 5, W, 1, Ask::of(2));
        assert_eq!((st.allowed, st.remaining), (true, 0));
    }

    #[test]
    fn cost_above_the_limit_is_never_admitted_even_in_a_fresh_window() {
        let (st, s) = charge(None, 5, W, 0, Ask::of(6));
        assert!(!st.allowed);
        assert_eq!(st.remaining, 5);
        assert_eq!(s.count, 0);
        assert_eq!(st.retry_after_ms, 0, "no wait makes it admissible");
    }

    #[test]
    fn lowered_limit_clamps_remaining_to_zero() {
        let (_, s) = charge(None, 10, W, 0, Ask::of(8));
        let st = peek(Some(s), 5, W, 1);
        assert_eq!(st.remaining, 0);
        let st = peek(Some(s), 20, W, 1);
        assert_eq!(st.remaining, 12);
    }

    #[test]
    fn refund_to_the_current_window_returns_the_cost_and_never_goes_below_zero() {
        let (_, s) = charge(None, 5, W, 0, Ask::of(2));
        let r = refund(Some(s), s.reset_ms, 10, 2).unwrap();
        assert_eq!(r.count, 0);
        let r = refund(Some(s), s.reset_ms, 10, 7).unwrap();
        assert_eq!(r.count, 0);
    }

    #[test]
    fn refund_to_an_expired_window_changes_nothing() {
        let (_, old) = charge(None, 5, W, 0, Ask::of(2));
        // The old window ended; a new one holds 1 unit.
        let (_, new) = charge(Some(old), 5, W, W + 5, Ask::of(1));
        assert_eq!(refund(Some(new), old.reset_ms, W + 6, 2), None);
        // Even before anyone opened the new window, an ended window takes no refund.
        assert_eq!(refund(Some(old), old.reset_ms, W, 2), None);
    }

    #[test]
    fn a_stored_window_whose_reset_has_passed_reads_as_fresh() {
        let stale = State {
            count: 99,
            reset_ms: 1_000,
        };
        let st = peek(Some(stale), 100, W, 1_000);
        assert_eq!(st.remaining, 100);
        assert_eq!(st.reset_ms, 1_000 + W);
    }
}
