//! The penalty box of one key under one policy: the refusals counted since
//! the count started, and until when the key is blocked. A key refused
//! `after` times within `within_ms` of the count's start is blocked for
//! `block_ms`; while blocked, every request of it is refused at once and
//! no quota is touched.
//!
//! Mirrored, decision for decision, by `lua/refusal.lua`.

use crate::Policy;

/// A key's penalty state under one policy. All zero: never refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Refusals counted since `since_ms` (reset when the key is blocked).
    pub(crate) refusals: u64,
    /// When the count started (Unix ms).
    pub(crate) since_ms: u64,
    /// Until when the key is blocked (Unix ms; blocked while it is ahead).
    pub(crate) until_ms: u64,
}

/// A policy's penalty box settings, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    /// Refusals that block the key.
    pub(crate) after: u64,
    /// The span refusals are counted over, from the first.
    pub(crate) within_ms: u64,
    /// How long a block lasts.
    pub(crate) block_ms: u64,
    /// Whether a request refused because the key is blocked starts the
    /// block again.
    pub(crate) extend: bool,
}

impl Rule {
    /// The penalty box of `policy`, if it keeps one.
    pub(crate) fn of(policy: &Policy) -> Option<Rule> {
        policy.penalty_box().map(|p| Rule {
            after: p.after,
            within_ms: p.within_ms(policy),
            block_ms: p.block_ms(),
            extend: p.extend,
        })
    }
}

impl State {
    /// Until when the key is blocked, if it is at `now` (as stored: what a
    /// status read reports).
    pub(crate) fn blocked_until(&self, now: u64) -> Option<u64> {
        (self.until_ms > now).then_some(self.until_ms)
    }

    /// When a request finds the key blocked at `now`: until when (a block started
    /// again from `now` when the rule says so), and the state to store
    /// (`None`: nothing changes).
    pub(crate) fn blocked(self, rule: &Rule, now: u64) -> Option<(u64, Option<State>)> {
        let until_ms = self.blocked_until(now)?;
        if !rule.extend {
            return Some((until_ms, None));
        }
        let until_ms = now.saturating_add(rule.block_ms);
        Some((until_ms, Some(State { until_ms, ..self })))
    }

    /// After a refusal at `now` of a key that is not blocked: the state to
    /// store, and until when this refusal blocks the key, if it does. The
    /// first refusal starts a count (so does the first after a block), and
    /// so does a refusal once the count's `within_ms` has passed.
    pub(crate) fn refused(self, rule: &Rule, now: u64) -> (State, Option<u64>) {
        let mut s = self;
        if s.refusals == 0 || now >= s.since_ms.saturating_add(rule.within_ms) {
            s.refusals = 0;
            s.since_ms = now;
        }
        s.refusals += 1;
        if s.refusals < rule.after {
            return (s, None);
        }
        s.refusals = 0;
        s.until_ms = now.saturating_add(rule.block_ms);
        (s, Some(s.until_ms))
    }

    /// Unix ms from which the state reads exactly like an absent one: the
    /// block has ended and the count's span has passed.
    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        self.until_ms
            .max(self.since_ms.saturating_add(rule.within_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        after: 3,
        within_ms: 1_000,
        block_ms: 5_000,
        extend: false,
    };

    #[test]
    fn the_refusal_that_reaches_the_count_blocks_and_starts_a_new_count() {
        let s = State::default();
        let (s, b) = s.refused(&RULE, 10_000);
        assert_eq!(
            (s, b),
            (
                State {
                    refusals: 1,
                    since_ms: 10_000,
                    until_ms: 0
                },
                None
            )
        );
        let (s, b) = s.refused(&RULE, 10_500);
        assert_eq!((s.refusals, b), (2, None));
        let (s, b) = s.refused(&RULE, 10_999);
        assert_eq!(b, Some(15_999));
        assert_eq!(s.refusals, 0);
        assert_eq!(s.blocked(&RULE, 15_998), Some((15_999, None)));
        assert_eq!(s.blocked(&RULE, 15_999), None, "the block ends on time");
    }

    #[test]
    fn refusals_older_than_the_span_start_the_count_again() {
        let (s, _) = State::default().refused(&RULE, 0);
        let (s, _) = s.refused(&RULE, 999);
        let (s, b) = s.refused(&RULE, 1_000);
        assert_eq!((s.refusals, s.since_ms, b), (1, 1_000, None));
    }

    #[test]
    fn a_blocked_request_starts_the_block_again_only_when_the_rule_says_so() {
        let s = State {
            refusals: 0,
            since_ms: 0,
            until_ms: 5_000,
        };
        assert_eq!(s.blocked(&RULE, 4_000), Some((5_000, None)));
        let extend = Rule {
            extend: true,
            ..RULE
        };
        let (until, next) = s.blocked(&extend, 4_000).unwrap();
        assert_eq!(until, 9_000);
        assert_eq!(next.unwrap().until_ms, 9_000);
    }

    #[test]
    fn a_state_past_its_block_and_span_reads_like_none() {
        let (s, _) = State::default().refused(&RULE, 100);
        assert_eq!(s.expires_at(&RULE), 1_100);
        let at = s.expires_at(&RULE);
        assert_eq!(
            s.refused(&RULE, at),
            State::default().refused(&RULE, at),
            "the count starts again as from nothing"
        );
    }
}
