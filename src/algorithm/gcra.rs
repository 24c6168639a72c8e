//! GCRA (generic cell rate algorithm): one theoretical arrival time (TAT)
//! per key. Each unit of cost pushes the TAT one emission interval
//! (`window / limit`) later; a request is admitted while the TAT, after it,
//! stays within `burst` intervals of now.
//!
//! It admits exactly what a [token bucket](super::token_bucket) of the same
//! rate and burst admits (the backlog is `TAT - now`), with one timestamp of
//! state. The TAT is kept exactly: whole milliseconds plus a remainder in
//! `1 / per_ms` of a millisecond (see [`rate`](super::rate)).
//!
//! Mirrored, decision for decision, by `lua/gcra.lua`.

use super::Ask;
use crate::decision::QuotaStatus;
use crate::quota::Rate;

/// A key's GCRA state: the theoretical arrival time `tat_ms + rem / per_ms`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Whole Unix ms of the TAT.
    pub(crate) tat_ms: u64,
    /// The fraction of a ms past `tat_ms`, in fine units (`< per_ms`).
    pub(crate) rem: u64,
}

/// The backlog (fine units) at `now`; a TAT in the past is a full bucket.
fn backlog(state: Option<State>, r: &Rate, now: u64) -> u64 {
    match state {
        // A remainder from a larger limit (the limit was lowered) is clamped: < 1 ms.
        Some(s) if s.tat_ms >= now => (s.tat_ms - now)
            .saturating_mul(r.per_ms)
            .saturating_add(s.rem.min(r.per_ms - 1)),
        _ => 0,
    }
}

fn tat_after(r: &Rate, now: u64, d: u64) -> State {
    State {
        tat_ms: now + d / r.per_ms,
        rem: d % r.per_ms,
    }
}

/// Decides whether `ask.fit` fits; returns the status and the state to
/// store if it does, charged `ask.charge`.
pub(crate) fn charge(state: Option<State>, r: &Rate, now: u64, ask: Ask) -> (QuotaStatus, State) {
    let (status, after) = r.decide(backlog(state, r, now), now, ask);
    (status, tat_after(r, now, after))
}

/// The status at `now` without charging.
pub(crate) fn peek(state: Option<State>, r: &Rate, now: u64) -> QuotaStatus {
    r.decide(backlog(state, r, now), now, Ask::of(0)).0
}

/// Unix ms from which the state reads exactly like an absent one.
pub(crate) fn expires_at(state: &State) -> u64 {
    state.tat_ms + u64::from(state.rem > 0)
}

/// Moves the TAT back by the part of the charge not yet elapsed, never before
/// `now` — only while that charge is the last change (the TAT is still the one
/// it produced, `window_id`), exactly as the token bucket: see
/// [`Rate::refundable`] for why an older charge's refund is dropped.
pub(crate) fn refund(
    state: Option<State>,
    r: &Rate,
    window_id: u64,
    now: u64,
    cost: u64,
) -> Option<State> {
    let s = state?;
    if expires_at(&s) != window_id {
        return None;
    }
    let d = backlog(Some(s), r, now);
    let give = r.refundable(d, cost);
    (give > 0).then(|| tat_after(r, now, d - give))
}

/// Moves the TAT `extra` units later: a settlement above the reservation.
/// Unlike a refund it applies whatever was charged since (more debt is
/// never a gift), as long as the caller checked the charge's window.
pub(crate) fn debit(state: Option<State>, r: &Rate, now: u64, extra: u64) -> State {
    tat_after(r, now, r.after(backlog(state, r, now), extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emission_interval_spaces_requests_after_the_burst() {
        // 4 per second, burst 2: interval 250 ms.
        let r = Rate::of(4, 1_000, 2).unwrap();
        let (a, s) = charge(None, &r, 1_000, Ask::of(1));
        let (b, s) = charge(Some(s), &r, 1_000, Ask::of(1));
        let (c, s2) = charge(Some(s), &r, 1_000, Ask::of(1));
        assert!(a.allowed && b.allowed && !c.allowed);
        assert_eq!(c.retry_after_ms, 250);
        assert_eq!(s2, s, "a rejection moves nothing");
        assert_eq!(s.tat_ms, 1_500);
        assert!(charge(Some(s), &r, 1_250, Ask::of(1)).0.allowed);
    }

    #[test]
    fn a_tat_with_a_fraction_of_a_millisecond_is_kept_exactly() {
        // 3 per second: 333.33 ms per request.
        let r = Rate::of(3, 1_000, 2).unwrap();
        let (_, s) = charge(None, &r, 0, Ask::of(2));
        assert_eq!((s.tat_ms, s.rem), (666, 2));
        assert_eq!(expires_at(&s), 667);
        let (st, s) = charge(Some(s), &r, 334, Ask::of(1));
        assert!(st.allowed);
        // Three requests moved the TAT by exactly one second: no drift.
        assert_eq!((s.tat_ms, s.rem), (1_000, 0));
    }

    #[test]
    fn refund_applies_only_while_the_charge_is_the_latest() {
        let r = Rate::of(1, 1_000, 2).unwrap();
        let (st, s) = charge(None, &r, 0, Ask::of(1));
        let back = refund(Some(s), &r, st.window_id, 0, 1).unwrap();
        assert_eq!(peek(Some(back), &r, 0).remaining, 2);
        let (_, later) = charge(Some(s), &r, 10, Ask::of(1));
        assert_eq!(refund(Some(later), &r, st.window_id, 10, 1), None);
    }

    #[test]
    fn refund_never_moves_the_tat_before_now() {
        let r = Rate::of(1, 1_000, 2).unwrap();
        let (st, s) = charge(None, &r, 0, Ask::of(1));
        // Half of the charge has elapsed: only the other half comes back.
        let back = refund(Some(s), &r, st.window_id, 500, 1).unwrap();
        assert_eq!(
            back,
            State {
                tat_ms: 500,
                rem: 0
            }
        );
    }
}
