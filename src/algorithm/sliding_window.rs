//! Sliding window counter: windows aligned to the Unix epoch, and an estimate
//! of the sliding window's usage of `current + previous × (W − elapsed) / W`.
//! Constant state per key (two counts and a window start).
//!
//! It assumes the previous window's traffic was spread evenly; traffic
//! bunched at the end of the previous window is undercounted, so it can admit
//! more than `limit` within some sliding window (the README reports how much
//! on generated traffic).
//!
//! All arithmetic is scaled by the window (`limit × window ≤ 2^52`), so it is
//! exact and `lua/sliding_window.lua` computes the same numbers.
//!
//! Mirrored, decision for decision, by `lua/sliding_window.lua`.

use super::Ask;
use crate::decision::QuotaStatus;
use std::num::NonZeroU64;

/// A key's sliding-window state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Unix ms at which the current window began (a multiple of the window).
    pub(crate) start_ms: u64,
    /// Units charged in the current window.
    pub(crate) cur: u64,
    /// Units charged in the window before it.
    pub(crate) prev: u64,
}

/// The state rolled forward to the window holding `now`. A stored window
/// that starts later than `now` (another instance's clock ran ahead) is kept
/// as the current one: counts are never dropped because of a clock behind.
pub(crate) fn current(state: Option<State>, window_ms: u64, now: u64) -> State {
    let start = now - now % window_ms;
    match state {
        Some(s) if s.start_ms >= start => s,
        Some(s) if s.start_ms + window_ms == start => State {
            start_ms: start,
            cur: 0,
            prev: s.cur,
        },
        _ => State {
            start_ms: start,
            cur: 0,
            prev: 0,
        },
    }
}

/// The weighted usage, scaled by the window: `prev × (W − elapsed) + cur × W`.
fn scaled_usage(s: &State, window_ms: u64, now: u64) -> u64 {
    let elapsed = now.saturating_sub(s.start_ms);
    s.prev * (window_ms - elapsed) + s.cur * window_ms
}

/// The most units one window counts, `2^52 / window` (at least the limit,
/// as `limit × window ≤ 2^52`): debt past it is dropped, so the scaled
/// usage stays below 2^53, exact here and in Lua.
fn most(window_ms: u64) -> u64 {
    (1 << 52) / window_ms
}

/// Decides whether `ask.fit` fits; returns the status and the state to
/// store if it does, charged `ask.charge` (which may pass the limit).
pub(crate) fn charge(
    state: Option<State>,
    limit: u64,
    window_ms: u64,
    now: u64,
    ask: Ask,
) -> (QuotaStatus, State) {
    let s = current(state, window_ms, now);
    let used = scaled_usage(&s, window_ms, now);
    let fit = ask.fit;
    let allowed = fit <= limit && used + fit * window_ms <= limit * window_ms;
    let next = if allowed {
        State {
            cur: s.cur.saturating_add(ask.charge).min(most(window_ms)),
            ..s
        }
    } else {
        s
    };
    let retry_after_ms = if allowed || fit > limit {
        0
    } else {
        retry_after(&s, limit, window_ms, now, fit)
    };
    let status = QuotaStatus {
        limit,
        remaining: remaining(&next, limit, window_ms, now),
        reset_ms: reset(&next, window_ms, now),
        retry_after_ms,
        allowed,
        window_id: s.start_ms,
        uncharged_reset_ms: NonZeroU64::new(reset(&s, window_ms, now)),
    };
    (status, next)
}

/// The status at `now` without charging.
pub(crate) fn peek(state: Option<State>, limit: u64, window_ms: u64, now: u64) -> QuotaStatus {
    charge(state, limit, window_ms, now, Ask::of(0)).0
}

fn remaining(s: &State, limit: u64, window_ms: u64, now: u64) -> u64 {
    (limit * window_ms).saturating_sub(scaled_usage(s, window_ms, now)) / window_ms
}

/// When the estimate is zero again: the current window's units weigh on
/// until the end of the next window, the previous window's until this one ends.
fn reset(s: &State, window_ms: u64, now: u64) -> u64 {
    if s.cur > 0 {
        s.start_ms + 2 * window_ms
    } else if s.prev > 0 {
        s.start_ms + window_ms
    } else {
        now
    }
}

/// The first whole ms at which `cost` fits, if nothing else is charged:
/// within this window once enough of the previous one has slid out, or else
/// in the next window once enough of this one has.
fn retry_after(s: &State, limit: u64, window_ms: u64, now: u64, cost: u64) -> u64 {
    let elapsed = now.saturating_sub(s.start_ms);
    let to_end = window_ms - elapsed;
    if s.cur + cost <= limit {
        // prev × (W − elapsed − t) ≤ (limit − cur − cost) × W; prev > 0 as it was rejected.
        to_end - (limit - s.cur - cost) * window_ms / s.prev
    } else {
        // Next window: cur × (W − e) ≤ (limit − cost) × W; cur > 0 here.
        to_end + window_ms - (limit - cost) * window_ms / s.cur
    }
}

/// Unix ms after which the state reads exactly like an absent one.
pub(crate) fn expires_at(state: &State, window_ms: u64) -> u64 {
    state.start_ms + 2 * window_ms
}

/// Takes `cost` back from the window it was charged to (`window_id`, its
/// start): the current window's count, or the previous one's if the window
/// has moved on once since; an older charge no longer counts anyway.
pub(crate) fn refund(
    state: Option<State>,
    window_ms: u64,
    window_id: u64,
    cost: u64,
) -> Option<State> {
    let s = state?;
    if s.start_ms == window_id {
        Some(State {
            cur: s.cur.saturating_sub(cost),
            ..s
        })
    } else if s.start_ms == window_id + window_ms {
        Some(State {
            prev: s.prev.saturating_sub(cost),
            ..s
        })
    } else {
        None
    }
}

/// Charges `extra` more to the window it was charged to (`window_id`, its
/// start), as [`refund`] gives back: a settlement above the reservation.
pub(crate) fn debit(
    state: Option<State>,
    window_ms: u64,
    window_id: u64,
    extra: u64,
) -> Option<State> {
    let s = state?;
    let add = |n: u64| n.saturating_add(extra).min(most(window_ms));
    if s.start_ms == window_id {
        Some(State {
            cur: add(s.cur),
            ..s
        })
    } else if s.start_ms == window_id + window_ms {
        Some(State {
            prev: add(s.prev),
            ..s
        })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 1_000;

    #[test]
    fn the_previous_window_weighs_in_proportion_to_its_overlap() {
        let s = State {
            start_ms: 10_000,
            cur: 2,
            prev: 8,
        };
        // A quarter into the window: 8 × 0.75 + 2 = 8 used of 10.
        let st = peek(Some(s), 10, W, 10_250);
        assert_eq!(st.remaining, 2);
        let (st, _) = charge(Some(s), 10, W, 10_250, Ask::of(3));
        assert!(!st.allowed);
        // 8 × (1 − e) + 2 + 3 ≤ 10 once e ≥ 0.375.
        assert_eq!(st.retry_after_ms, 125);
        assert!(charge(Some(s), 10, W, 10_375, Ask::of(3)).0.allowed);
        assert!(!charge(Some(s), 10, W, 10_374, Ask::of(3)).0.allowed);
    }

    #[test]
    fn a_full_current_window_waits_into_the_next_one() {
        let (_, s) = charge(None, 4, W, 5_000, Ask::of(4));
        let (st, _) = charge(Some(s), 4, W, 5_500, Ask::of(2));
        assert!(!st.allowed);
        // Next window: 4 × (1 − e) + 2 ≤ 4 once e ≥ 0.5: 500 + 500 ms.
        assert_eq!(st.retry_after_ms, 1_000);
        assert!(charge(Some(s), 4, W, 6_500, Ask::of(2)).0.allowed);
        assert!(!charge(Some(s), 4, W, 6_499, Ask::of(2)).0.allowed);
        assert_eq!(st.reset_ms, 7_000);
    }

    #[test]
    fn windows_two_apart_forget_everything() {
        let (_, s) = charge(None, 4, W, 5_000, Ask::of(4));
        let st = peek(Some(s), 4, W, 7_000);
        assert_eq!((st.remaining, st.reset_ms), (4, 7_000));
    }

    #[test]
    fn refund_reaches_the_previous_window_once_the_window_moved_on() {
        let (st, s) = charge(None, 4, W, 5_000, Ask::of(3));
        let (_, s) = charge(Some(s), 4, W, 6_000, Ask::of(1));
        let back = refund(Some(s), W, st.window_id, 2).unwrap();
        assert_eq!((back.cur, back.prev), (1, 1));
        assert_eq!(refund(Some(back), W, 3_000, 1), None);
    }
}
