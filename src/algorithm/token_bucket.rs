//! Token bucket: `burst` tokens of capacity, refilled at `limit` per window,
//! lazily (computed from the elapsed time on each request, never by a timer).
//! A bucket left idle fills up, so a client that was quiet may burst.
//!
//! The state is the level and the time it was computed at. Levels are kept
//! in exact fine units (see [`rate`](super::rate)). The state's own time
//! never goes backwards: a request stamped earlier than the last update (a
//! clock behind another instance's) is evaluated at the last update.
//!
//! Mirrored, decision for decision, by `lua/token_bucket.lua`.

use super::Ask;
use crate::decision::QuotaStatus;
use crate::quota::Rate;

/// A key's token-bucket state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Tokens held at `at_ms`, in fine units (`unit` per token); below zero
    /// when a settlement charged more than was left (debt, refilled first).
    pub(crate) level: i64,
    /// Unix ms the level was computed at.
    pub(crate) at_ms: u64,
}

/// The effective time and backlog (fine units below full) at `now`.
fn backlog(state: Option<State>, r: &Rate, now: u64) -> (u64, u64) {
    match state {
        None => (now, 0),
        Some(s) => {
            let t = now.max(s.at_ms);
            let refilled = (t - s.at_ms).saturating_mul(r.per_ms);
            let refilled = i64::try_from(refilled).unwrap_or(i64::MAX);
            let level = s.level.saturating_add(refilled).min(full(r));
            (t, full(r).abs_diff(level))
        }
    }
}

/// A full bucket's level (capacity is below 2^52).
fn full(r: &Rate) -> i64 {
    r.capacity as i64
}

/// The state holding backlog `d` (at most 2^53) at `t`.
fn with_backlog(r: &Rate, d: u64, t: u64) -> State {
    State {
        level: full(r) - d as i64,
        at_ms: t,
    }
}

/// Decides whether `ask.fit` fits; returns the status and the state to
/// store if it does, charged `ask.charge`.
pub(crate) fn charge(state: Option<State>, r: &Rate, now: u64, ask: Ask) -> (QuotaStatus, State) {
    let (t, d) = backlog(state, r, now);
    let (mut status, after) = r.decide(d, t, ask);
    // Computed at `t >= now`; the wait is from `now` (0 stays 0: never admissible).
    if status.retry_after_ms > 0 {
        status.retry_after_ms += t - now;
    }
    (status, with_backlog(r, after, t))
}

/// The status at `now` without charging.
pub(crate) fn peek(state: Option<State>, r: &Rate, now: u64) -> QuotaStatus {
    let (t, d) = backlog(state, r, now);
    r.decide(d, t, Ask::of(0)).0
}

/// Unix ms after which the state reads exactly like an absent one (a full bucket).
pub(crate) fn expires_at(state: &State, r: &Rate) -> u64 {
    let below_full = full(r).saturating_sub(state.level).max(0) as u64;
    state.at_ms + r.ms_to_refill(below_full)
}

/// Gives back the part of a charge that has not refilled yet, only while
/// that charge is the last change to the bucket (`window_id`, the instant it
/// would be full again after the charge, still matches): see
/// [`Rate::refundable`] for why an older charge's refund is dropped.
pub(crate) fn refund(
    state: Option<State>,
    r: &Rate,
    window_id: u64,
    now: u64,
    cost: u64,
) -> Option<State> {
    let s = state?;
    if expires_at(&s, r) != window_id {
        return None;
    }
    let (t, d) = backlog(Some(s), r, now);
    let give = r.refundable(d, cost);
    (give > 0).then(|| with_backlog(r, d - give, t))
}

/// Takes `extra` more tokens, below zero if need be: a settlement above the
/// reservation. Unlike a refund it applies whatever was charged since (more
/// debt is never a gift), as long as the caller checked the charge's window.
pub(crate) fn debit(state: Option<State>, r: &Rate, now: u64, extra: u64) -> State {
    let (t, d) = backlog(state, r, now);
    with_backlog(r, r.after(d, extra), t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(limit: u64, window: u64, burst: u64) -> Rate {
        Rate::of(limit, window, burst).unwrap()
    }

    #[test]
    fn a_fresh_bucket_is_full_and_a_burst_drains_it() {
        let r = rate(10, 1_000, 10);
        let mut s = None;
        for i in 0..10 {
            let (st, next) = charge(s, &r, 5_000, Ask::of(1));
            assert!(st.allowed, "request {i}");
            assert_eq!(st.remaining, 9 - i);
            s = Some(next);
        }
        let (st, _) = charge(s, &r, 5_000, Ask::of(1));
        assert!(!st.allowed);
        assert_eq!(st.retry_after_ms, 100, "one token every 100 ms");
        assert_eq!(st.reset_ms, 6_000, "full again a window later");
    }

    #[test]
    fn lazy_refill_after_idle_time_caps_at_the_burst() {
        let r = rate(10, 1_000, 4);
        let (_, s) = charge(None, &r, 0, Ask::of(4));
        let st = peek(Some(s), &r, 250);
        assert_eq!(st.remaining, 2, "2.5 tokens refilled, 2 whole");
        let st = peek(Some(s), &r, 1_000_000);
        assert_eq!((st.remaining, st.limit), (4, 4), "never above the burst");
        assert_eq!(st.reset_ms, 1_000_000);
    }

    #[test]
    fn a_cost_above_the_burst_is_never_admitted_and_has_no_retry() {
        let r = rate(10, 1_000, 5);
        let (st, _) = charge(None, &r, 0, Ask::of(6));
        assert!(!st.allowed);
        assert_eq!((st.retry_after_ms, st.remaining), (0, 5));
    }

    #[test]
    fn a_request_stamped_before_the_last_update_is_evaluated_at_the_last_update() {
        let r = rate(1, 1_000, 1);
        let (_, s) = charge(None, &r, 10_000, Ask::of(1));
        // Another instance's clock is 500 ms behind.
        let (st, s2) = charge(Some(s), &r, 9_500, Ask::of(1));
        assert!(!st.allowed);
        assert_eq!(st.retry_after_ms, 1_500);
        assert_eq!(s2.at_ms, 10_000, "the state's time never goes back");
    }

    #[test]
    fn refund_returns_the_charge_but_not_tokens_that_already_refilled() {
        let r = rate(1, 1_000, 1);
        let (st, s) = charge(None, &r, 0, Ask::of(1));
        let back = refund(Some(s), &r, st.window_id, 0, 1).unwrap();
        assert_eq!(peek(Some(back), &r, 0).remaining, 1);
        // Half of it has refilled by 500: only the other half comes back.
        let back = refund(Some(s), &r, st.window_id, 500, 1).unwrap();
        assert_eq!(backlog(Some(back), &r, 500).1, 0);
        // The token refilled at 1000; another charge at 1000 spent it. A late
        // refund of the first charge must not give it back.
        let (_, s2) = charge(Some(s), &r, 1_000, Ask::of(1));
        assert_eq!(refund(Some(s2), &r, st.window_id, 0, 1), None);
    }

    #[test]
    fn a_late_refund_of_a_charge_that_is_no_longer_the_last_change_is_dropped() {
        // Regression (found by the refund property test): A and B charged at
        // 0, A refunded, C charged at 7, B refunded. Refunding A shifted B's
        // tokens earlier, so B's `window_id` overstated what of B was still
        // unrefilled, and B's refund handed out 7 ms of refilled tokens.
        let r = rate(1, 100, 4);
        let (a, s) = charge(None, &r, 0, Ask::of(1));
        let (b, s) = charge(Some(s), &r, 0, Ask::of(1));
        assert_eq!(
            refund(Some(s), &r, a.window_id, 0, 1),
            None,
            "B came after A"
        );
        let (_, s) = charge(Some(s), &r, 7, Ask::of(1));
        assert_eq!(
            refund(Some(s), &r, b.window_id, 0, 1),
            None,
            "C came after B"
        );
    }

    #[test]
    fn refund_never_fills_above_capacity() {
        let r = rate(1, 1_000, 3);
        let (st, s) = charge(None, &r, 0, Ask::of(1));
        let back = refund(Some(s), &r, st.window_id, 0, 5).unwrap();
        assert_eq!(back.level, full(&r));
    }
}
