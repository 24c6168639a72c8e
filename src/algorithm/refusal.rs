//! What a policy that waits or keeps a penalty box does with a charge, the
//! same for every store: each store reads the key's state, and
//!
//! 1. refuses at once a key in its penalty box
//!    ([`penalty::State::blocked`]): its quotas are read, not charged
//!    ([`Decision::blocked`]);
//! 2. otherwise decides the quotas as for any policy, charging them if
//!    they all admit the request now;
//! 3. then, on a refusal, [`after_refusal`]: books the request for its
//!    turn when the charge may wait and the turn comes soon enough, or
//!    counts the refusal in the penalty box, which may block the key.
//!
//! Mirrored, decision for decision, by `lua/refusal.lua`.

use super::{gcra, penalty};
use crate::decision::{Decision, RejectReason};
use crate::{Algorithm, Policy};
use smallvec::SmallVec;

/// A request booked for its turn: every quota's new state, and the gap
/// before the turn each must keep as a hole (see [`gcra::book`]).
#[derive(Debug)]
pub(crate) struct Booking {
    pub(crate) states: SmallVec<[(gcra::State, Option<gcra::Hole>); 2]>,
}

/// What a refusal turns into (see [`after_refusal`]).
#[derive(Debug, Default)]
pub(crate) struct AfterRefusal {
    /// The request was booked for its turn: what to write.
    pub(crate) booked: Option<Booking>,
    /// The refusal was counted: the penalty state to write.
    pub(crate) penalty: Option<penalty::State>,
}

/// The common turn of a request of `cost` on every quota of `policy` (GCRA
/// quotas, in `states` as read): the latest of the quotas' own turns, so
/// that each quota is charged when the request really goes. `None` when
/// it never comes (a cost above a burst) or a quota is not GCRA.
pub(crate) fn turn(
    policy: &Policy,
    states: &[Option<gcra::State>],
    now: u64,
    cost: u64,
) -> Option<u64> {
    let mut t = 0;
    for (q, s) in policy.quotas().iter().zip(states) {
        if q.algorithm() != Algorithm::Gcra {
            return None;
        }
        t = t.max(gcra::turn(*s, &q.rate(), now, cost)?);
    }
    Some(t)
}

/// Step 3: `decision`, just decided as for any policy, refused the
/// request. When the policy waits and the charge may wait `wait_ms`, the
/// request is booked for its turn if it comes within that: `decision`
/// becomes the admission (see [`Decision::with_wait`]), and a booking is
/// no refusal. Otherwise the refusal is counted in the penalty box
/// (`penalty`: the rule and the state as read, when the policy keeps one),
/// and `decision` says when the key is blocked, if this refusal blocks it.
/// `gcra` is each quota's GCRA state as read (only read when booking).
pub(crate) fn after_refusal(
    policy: &Policy,
    decision: &mut Decision,
    gcra: impl FnOnce() -> SmallVec<[Option<gcra::State>; 2]>,
    penalty: Option<(penalty::Rule, penalty::State)>,
    (now, cost, wait_ms): (u64, u64, u64),
) -> AfterRefusal {
    let mut out = AfterRefusal::default();
    if decision.is_allowed() {
        return out;
    }
    let may_wait = wait_ms > 0
        && policy.waits().is_some()
        && decision.reject_reason() == Some(RejectReason::Exhausted);
    if may_wait {
        let states = gcra();
        if let Some(t) = turn(policy, &states, now, cost).filter(|t| *t <= wait_ms) {
            let mut booked = Decision::empty();
            let mut writes = SmallVec::new();
            for (q, s) in policy.quotas().iter().zip(&states) {
                let (status, next, hole) = gcra::book(*s, &q.rate(), now, t, cost);
                booked.push(status);
                writes.push((next, hole));
            }
            booked.decide(cost);
            *decision = booked.with_wait(t);
            out.booked = Some(Booking { states: writes });
            return out;
        }
    }
    if let Some((rule, state)) = penalty {
        let (next, block) = state.refused(&rule, now);
        out.penalty = Some(next);
        if let Some(until) = block {
            *decision = std::mem::replace(decision, Decision::empty()).with_block(now, until);
        }
    }
    out
}
