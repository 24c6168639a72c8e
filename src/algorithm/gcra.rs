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
//! A policy that waits books a request that does not fit now for its turn
//! ([`turn`], [`book`]): the TAT moves past the turn, so one TAT holds
//! every booked turn of the key, in order. Its bookings are given back in
//! any order ([`refund_holed`]): the last one moves the TAT back; an
//! earlier one leaves a [`Hole`], reclaimed once the TAT comes back down to
//! it.
//!
//! Mirrored, decision for decision, by `lua/gcra.lua` (bookings and holes:
//! `lua/refusal.lua`).

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

/// A request's turn at `now` on this quota: whole ms until `cost` fits (0
/// when it fits now), or `None` when it never does.
pub(crate) fn turn(state: Option<State>, r: &Rate, now: u64, cost: u64) -> Option<u64> {
    r.turn(backlog(state, r, now), cost)
}

/// Books `cost` for the turn `t` ms from now (at or after its [`turn`] on
/// this quota): the status as the booking leaves the quota, the state to
/// store, and the gap before the turn that nothing may spend (see
/// [`Rate::booked_start`]) as a [`Hole`], so that giving the booking back
/// gives the gap back too.
pub(crate) fn book(
    state: Option<State>,
    r: &Rate,
    now: u64,
    t: u64,
    cost: u64,
) -> (QuotaStatus, State, Option<Hole>) {
    let d = backlog(state, r, now);
    let (status, after) = r.book(d, now, t, cost);
    let gap = r.booked_start(d, t) - d;
    let hole = (gap > 0).then_some(Hole {
        end: now + t,
        units: gap,
    });
    (status, tat_after(r, now, after), hole)
}

/// The most holes one quota of a key keeps. Past it the one that ends
/// first goes: its units are never given back (fewer admissions, never
/// more).
pub(crate) const MAX_HOLES: usize = 64;

/// Units given back out of line: a refunded charge that was not the last,
/// or the gap before a booked turn. It ends where the TAT stood after it
/// (`end`, whole Unix ms: turns are at least 1 ms apart, so two charges
/// never end on the same ms) and spans `units` fine units below that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hole {
    pub(crate) end: u64,
    pub(crate) units: u64,
}

/// A quota's holes, in no order; at most [`MAX_HOLES`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holes(Vec<Hole>);

impl Holes {
    /// Adds `hole`: to the one ending on the same ms if any (a booking's gap
    /// and the charge before it, which then lie end to end), else as a new
    /// one, making room by dropping the one that ends first.
    pub(crate) fn add(&mut self, hole: Hole) {
        if let Some(h) = self.0.iter_mut().find(|h| h.end == hole.end) {
            h.units = h.units.saturating_add(hole.units);
            return;
        }
        if self.0.len() >= MAX_HOLES {
            if let Some(first) = (0..self.0.len()).min_by_key(|&i| self.0[i].end) {
                self.0.swap_remove(first);
            }
        }
        self.0.push(hole);
    }

    /// Takes the hole ending at `end`, if there is one: its units.
    fn take(&mut self, end: u64) -> Option<u64> {
        let i = self.0.iter().position(|h| h.end == end)?;
        Some(self.0.swap_remove(i).units)
    }

    /// Drops the holes that end by `now`: what they held has refilled.
    pub(crate) fn prune(&mut self, now: u64) {
        self.0.retain(|h| h.end > now);
    }

    /// How many there are.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A refund of `cost` for a policy whose charges are given back in any
/// order (a policy that waits: its booked requests are cancelled by
/// clients that go away). The last charge (its `window_id` is still the
/// TAT's, as [`refund`] requires) moves the TAT back by its unspent part,
/// then by every hole that ends where the TAT lands, in turn. An earlier
/// charge still ahead (`window_id > now`) leaves a hole. A refund once the
/// charge's time has passed gives nothing back. Returns the state to store
/// when it moved; `holes` is updated in place (a TAT at or before `now`
/// keeps none).
pub(crate) fn refund_holed(
    state: Option<State>,
    holes: &mut Holes,
    r: &Rate,
    window_id: u64,
    now: u64,
    cost: u64,
) -> Option<State> {
    holes.prune(now);
    let d = backlog(state, r, now);
    let Some(s) = state.filter(|_| d > 0) else {
        *holes = Holes::default();
        return None;
    };
    if expires_at(&s) != window_id {
        if window_id > now && cost > 0 {
            holes.add(Hole {
                end: window_id,
                units: cost.min(r.burst) * r.unit,
            });
        }
        return None;
    }
    let mut left = d - r.refundable(d, cost);
    while left > 0 {
        match holes.take(now + r.ms_to_refill(left)) {
            Some(units) => left = left.saturating_sub(units),
            None => break,
        }
    }
    if left == 0 {
        *holes = Holes::default();
    }
    (left < d).then(|| tat_after(r, now, left))
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

    /// Books `n` requests of one at `now` on `state`, each at its own turn
    /// plus `late(i)` ms (another quota's later turn), keeping holes as the
    /// stores do; returns the state and each booking's window id.
    fn book_n(
        r: &Rate,
        mut state: Option<State>,
        holes: &mut Holes,
        now: u64,
        n: usize,
        late: impl Fn(usize) -> u64,
    ) -> (Option<State>, Vec<u64>) {
        let mut ids = vec![];
        for i in 0..n {
            let t = turn(state, r, now, 1).unwrap() + late(i);
            let (st, next, hole) = book(state, r, now, t, 1);
            assert!(st.allowed);
            holes.prune(now);
            if let Some(h) = hole {
                holes.add(h);
            }
            ids.push(st.window_id);
            state = Some(next);
        }
        (state, ids)
    }

    /// Refunds the bookings `ids` in `order` at `now`.
    fn cancel(
        r: &Rate,
        mut state: Option<State>,
        holes: &mut Holes,
        ids: &[u64],
        order: &[usize],
        now: u64,
    ) -> Option<State> {
        for &i in order {
            if let Some(s) = refund_holed(state, holes, r, ids[i], now, 1) {
                state = Some(s);
            }
        }
        state
    }

    #[test]
    fn bookings_cancelled_in_any_order_before_their_turns_leave_the_tat_where_it_was() {
        // 5 a second, burst 2; 3 a second, burst 1 (333⅓ ms: turns rounded
        // up to whole ms leave gaps); and bookings made later than their
        // own turn (a second quota's turn), which leave gaps too.
        let rates = [
            Rate::of(5, 1_000, 2).unwrap(),
            Rate::of(3, 1_000, 1).unwrap(),
        ];
        let mut rng = fastrand::Rng::with_seed(7);
        for r in &rates {
            for late in [0, 37] {
                let now = 10_000;
                // The burst spent: the TAT is ahead of now.
                let (_, before) = charge(None, r, now, Ask::of(r.burst));
                let mut orders: Vec<Vec<usize>> = vec![(0..10).rev().collect(), (0..10).collect()];
                for _ in 0..20 {
                    let mut o: Vec<usize> = (0..10).collect();
                    rng.shuffle(&mut o);
                    orders.push(o);
                }
                for order in orders {
                    let mut holes = Holes::default();
                    let (booked, ids) = book_n(r, Some(before), &mut holes, now, 10, |i| {
                        late * (i as u64 % 2)
                    });
                    assert!(booked.unwrap().tat_ms > before.tat_ms + 1_000);
                    let back = cancel(r, booked, &mut holes, &ids, &order, now + 1);
                    assert_eq!(
                        back,
                        Some(before),
                        "rate {r:?}, late {late}, order {order:?}"
                    );
                    assert_eq!(holes, Holes::default(), "no hole is left over");
                }
            }
        }
    }

    #[test]
    fn a_partly_cancelled_stack_keeps_holes_until_the_last_booking_goes() {
        let r = Rate::of(10, 1_000, 1).unwrap();
        let now = 50_000;
        let (_, before) = charge(None, &r, now, Ask::of(1));
        let mut holes = Holes::default();
        let (booked, ids) = book_n(&r, Some(before), &mut holes, now, 5, |_| 0);
        // The 2nd and 4th go: the TAT stays, as the 5th still waits.
        let s = cancel(&r, booked, &mut holes, &ids, &[1, 3], now);
        assert_eq!(s, booked);
        assert_eq!(holes.len(), 2);
        // The 5th goes: the TAT drops past the 4th's hole to the 3rd's end.
        let s = cancel(&r, s, &mut holes, &ids, &[4], now);
        assert_eq!(expires_at(&s.unwrap()), ids[2]);
        assert_eq!(holes.len(), 1);
        // The 3rd: past the 2nd's hole to the 1st's end.
        let s = cancel(&r, s, &mut holes, &ids, &[2], now);
        assert_eq!(expires_at(&s.unwrap()), ids[0]);
        assert_eq!(holes.len(), 0);
        // A new request waits exactly as after the 1st booking alone.
        assert_eq!(turn(s, &r, now, 1), Some(200));
    }

    #[test]
    fn a_refund_once_the_booked_time_has_passed_gives_nothing_back() {
        let r = Rate::of(10, 1_000, 1).unwrap();
        let now = 50_000;
        let (_, before) = charge(None, &r, now, Ask::of(1));
        let mut holes = Holes::default();
        let (booked, ids) = book_n(&r, Some(before), &mut holes, now, 3, |_| 0);
        let end = ids[2];
        // Past the last booking's end: nothing to give, no hole kept.
        assert_eq!(refund_holed(booked, &mut holes, &r, ids[2], end, 1), None);
        assert_eq!(refund_holed(booked, &mut holes, &r, ids[1], end, 1), None);
        assert_eq!(holes.len(), 0);
        // An earlier booking whose time has passed leaves no hole either.
        let mid = ids[1];
        assert_eq!(refund_holed(booked, &mut holes, &r, ids[0], mid, 1), None);
        assert_eq!(holes.len(), 0);
    }

    #[test]
    fn past_the_most_holes_the_first_to_end_goes() {
        let mut holes = Holes::default();
        for end in 1..=MAX_HOLES as u64 + 1 {
            holes.add(Hole {
                end: end * 10,
                units: 1,
            });
        }
        assert_eq!(holes.len(), MAX_HOLES);
        assert_eq!(holes.take(10), None, "the first to end went");
        assert_eq!(holes.take(20), Some(1));
        holes.add(Hole { end: 30, units: 4 });
        assert_eq!(holes.take(30), Some(5), "one end, one hole");
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
