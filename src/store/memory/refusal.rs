//! The memory store's side of the policies that wait or keep a penalty box
//! (see `algorithm::refusal` for the decision): their state, boxed beside
//! a key's quotas so that a plain policy's key carries one empty pointer.

use super::{count_evictions, slot_of, Entry, MemoryStore, Share};
use crate::algorithm::{self, gcra, penalty, refusal, Next, Outcome, Settled, State};
use crate::decision::Decision;
use crate::store::call::Charge;
use crate::{Algorithm, Policy, Quota};
use smallvec::SmallVec;

/// A key's state for the policies that wait or keep a penalty box.
#[derive(Debug, Default)]
pub(super) struct Extra {
    /// Per policy (its fingerprint): its penalty box, and when that reads
    /// like none.
    penalties: SmallVec<[(u64, penalty::State, u64); 1]>,
    /// Per GCRA quota (its slot) of a policy that waits: its holes.
    holes: SmallVec<[(u64, gcra::Holes); 1]>,
}

impl Extra {
    /// When the last penalty box reads like none (holes never outlive
    /// their quota's state).
    pub(super) fn expires_at(&self) -> u64 {
        self.penalties.iter().map(|p| p.2).max().unwrap_or(0)
    }
}

impl Entry {
    /// `policy`'s penalty box as stored (never refused: all zero).
    fn penalty(&self, policy: &Policy) -> penalty::State {
        let fp = policy.fingerprint();
        self.refusal
            .as_ref()
            .and_then(|x| x.penalties.iter().find(|p| p.0 == fp))
            .map_or_else(penalty::State::default, |p| p.1)
    }

    /// Stores `policy`'s penalty box, and drops the boxes past their life.
    fn set_penalty(
        &mut self,
        policy: &Policy,
        rule: &penalty::Rule,
        state: penalty::State,
        now: u64,
    ) {
        let fp = policy.fingerprint();
        let x = self.refusal.get_or_insert_with(Box::default);
        x.penalties.retain(|p| p.0 != fp && p.2 > now);
        x.penalties.push((fp, state, state.expires_at(rule)));
    }

    /// The holes of quota `q`'s state.
    fn holes(&mut self, q: &Quota) -> &mut gcra::Holes {
        let id = slot_of(q);
        let x = self.refusal.get_or_insert_with(Box::default);
        let i = match x.holes.iter().position(|h| h.0 == id) {
            Some(i) => i,
            None => {
                x.holes.push((id, gcra::Holes::default()));
                x.holes.len() - 1
            }
        };
        &mut x.holes[i].1
    }

    /// Each quota's GCRA state as stored.
    fn gcra_states(&self, quotas: &[Quota], now: u64) -> SmallVec<[Option<gcra::State>; 2]> {
        quotas
            .iter()
            .map(|q| match self.get(slot_of(q), now) {
                Some(State::Gcra(s)) => Some(*s),
                _ => None,
            })
            .collect()
    }

    /// Charges `call`, whose policy waits or keeps a penalty box, into
    /// `decision` (empty): see `algorithm::refusal`.
    fn charge_refusing(&mut self, call: &Charge<'_>, decision: &mut Decision) {
        let (policy, now, cost) = (call.policy, call.now_ms, call.cost);
        let quotas = policy.quotas();
        let penalty = penalty::Rule::of(policy).map(|rule| (rule, self.penalty(policy)));
        if let Some((rule, state)) = penalty {
            if let Some((until, write)) = state.blocked(&rule, now) {
                if let Some(w) = write {
                    self.set_penalty(policy, &rule, w, now);
                }
                let read = quotas
                    .iter()
                    .map(|q| algorithm::peek(q, self.get(slot_of(q), now), now));
                *decision = Decision::blocked(read, now, until);
                return;
            }
        }
        self.charge(quotas, now, (cost, call.units), decision);
        let after = refusal::after_refusal(
            policy,
            decision,
            || self.gcra_states(quotas, now),
            penalty,
            (now, cost, call.wait_ms),
        );
        if let Some(booking) = after.booked {
            for (q, (next, hole)) in quotas.iter().zip(booking.states) {
                let at = self.slots.iter().position(|s| s.id == slot_of(q));
                let fresh = at.is_none_or(|i| self.slots[i].expires_at <= now);
                self.commit(at, q, Next::Gcra(next), now, cost);
                let holes = self.holes(q);
                if fresh {
                    *holes = gcra::Holes::default();
                }
                holes.prune(now);
                if let Some(h) = hole {
                    holes.add(h);
                }
            }
            self.admitted(Share::most(decision.statuses()), now);
        }
        if let (Some((rule, _)), Some(state)) = (penalty, after.penalty) {
            self.set_penalty(policy, &rule, state, now);
        }
    }

    /// Settles quota `q` of a policy that waits (its slot at `at`): a
    /// refund goes through the quota's holes ([`gcra::refund_holed`]).
    pub(super) fn settle_waiting(
        &mut self,
        q: &Quota,
        at: Option<usize>,
        now: u64,
        s: Settled,
    ) -> Outcome {
        if q.algorithm() != Algorithm::Gcra || s.actual >= s.reserved {
            let state = at.map(|i| &mut self.slots[i].state);
            return algorithm::settle(q, state, now, s);
        }
        let state = at.and_then(|i| match &self.slots[i].state {
            State::Gcra(g) => Some(*g),
            _ => None,
        });
        let cost = s.reserved - s.actual;
        let moved = gcra::refund_holed(state, self.holes(q), &q.rate(), s.window_id, now, cost);
        match (moved, at) {
            (Some(next), Some(i)) => {
                self.slots[i].state = State::Gcra(next);
                Outcome::Changed
            }
            _ => Outcome::Unchanged,
        }
    }

    /// The decision of a status read for `policy`: `read`, or a refusal
    /// when the key is in the policy's penalty box.
    pub(super) fn status_of(&self, policy: &Policy, read: Decision, now: u64) -> Decision {
        if policy.penalty_box().is_none() {
            return read;
        }
        match self.penalty(policy).blocked_until(now) {
            Some(until) => Decision::blocked(read.statuses().iter().copied(), now, until),
            None => read,
        }
    }
}

impl MemoryStore {
    /// Charges `call`, whose policy waits or keeps a penalty box.
    pub(super) fn charge_refusing(&self, call: &Charge<'_>) -> Decision {
        let (now, key) = (call.now_ms, (call.namespace.id(), *call.key));
        let mut decision = Decision::empty();
        let ((), made) = self.inner.rates.update(key, now, |entry| match entry {
            Some(e) => {
                e.charge_refusing(call, &mut decision);
                ((), None)
            }
            None => {
                let mut fresh = Entry::new();
                fresh.charge_refusing(call, &mut decision);
                let keep = !fresh.slots.is_empty() || fresh.refusal.is_some();
                ((), keep.then_some(fresh))
            }
        });
        count_evictions(call.namespace, made);
        decision
    }
}
