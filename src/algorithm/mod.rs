//! Pure decision math: every function takes `now` and touches no I/O or clock,
//! so it can be tested exhaustively and mirrored by the Lua scripts in `lua/`.
//!
//! Every algorithm reports the same meanings: `remaining` is what can be
//! spent now, `reset_ms` when the quota is fully available again,
//! `retry_after_ms` when a rejected request would be admitted (0 when it
//! never can be), and `window_id` names the state a refund goes back to.
//!
//! A policy that waits for a request's turn or keeps a penalty box decides
//! its charges through [`refusal`] (bookings on GCRA quotas, [`gcra::book`];
//! the box itself, [`penalty`]).

pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod penalty;
mod rate;
pub(crate) mod refusal;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;

use crate::decision::QuotaStatus;
use crate::{Algorithm, Quota};

/// What one request asks of one quota: `fit` units must be left for it to
/// be admitted, and `charge` units are charged when it is. They are equal
/// but for a quota in another unit than requests, which admits while it has
/// anything left and is charged its whole reservation (see [`ask`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    pub(crate) fit: u64,
    pub(crate) charge: u64,
}

impl Ask {
    /// `cost` to fit and to charge.
    pub(crate) const fn of(cost: u64) -> Self {
        Self {
            fit: cost,
            charge: cost,
        }
    }
}

/// What a request of `cost` (the request quotas' charge) and `units` (the
/// reservation of the quotas in other units) asks of `quota`.
#[inline]
pub(crate) fn ask(quota: &Quota, cost: u64, units: u64) -> Ask {
    if quota.counts_requests() {
        Ask::of(cost)
    } else if quota.reservation_must_fit() {
        Ask {
            fit: units.max(1),
            charge: units,
        }
    } else {
        Ask {
            fit: 1,
            charge: units,
        }
    }
}

/// The most any count or backlog holds, `2^53 - 1`: debt past it is dropped,
/// so every number stays exact in the Lua scripts' doubles.
pub(crate) const MAX_COUNT: u64 = (1 << 53) - 1;

/// `a + b`, capped at [`MAX_COUNT`].
pub(crate) fn add_capped(a: u64, b: u64) -> u64 {
    a.saturating_add(b).min(MAX_COUNT.max(a))
}

/// One quota's stored state, whatever its algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow(fixed_window::State),
    TokenBucket(token_bucket::State),
    SlidingWindow(sliding_window::State),
    Gcra(gcra::State),
    SlidingLog(sliding_log::Log),
}

/// What an admitted charge writes: a constant-size algorithm's new state,
/// or an entry for a sliding log. Unlike [`State`] it owns no log, so a
/// policy's pending writes are plain values with nothing to drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    FixedWindow(fixed_window::State),
    TokenBucket(token_bucket::State),
    SlidingWindow(sliding_window::State),
    Gcra(gcra::State),
    /// Log the cost at `now` (sliding log).
    Record,
}

macro_rules! state_as {
    ($state:expr, $variant:ident) => {
        match $state {
            Some(State::$variant(s)) => Some(*s),
            _ => None,
        }
    };
}

/// Evaluates `ask` against `quota` at `now`: the status, and what to write
/// if every quota of the policy admits the request. A sliding log is pruned
/// in place first (dropping expired entries changes no decision).
#[inline]
pub(crate) fn charge(
    quota: &Quota,
    state: Option<&mut State>,
    now: u64,
    cost: Ask,
) -> (QuotaStatus, Next) {
    let (limit, window) = (quota.limit(), quota.window_ms());
    match quota.algorithm() {
        Algorithm::FixedWindow => {
            let (st, s) =
                fixed_window::charge(state_as!(state, FixedWindow), limit, window, now, cost);
            (st, Next::FixedWindow(s))
        }
        Algorithm::TokenBucket => {
            let (st, s) =
                token_bucket::charge(state_as!(state, TokenBucket), &quota.rate(), now, cost);
            (st, Next::TokenBucket(s))
        }
        Algorithm::SlidingWindow => {
            let (st, s) =
                sliding_window::charge(state_as!(state, SlidingWindow), limit, window, now, cost);
            (st, Next::SlidingWindow(s))
        }
        Algorithm::Gcra => {
            let (st, s) = gcra::charge(state_as!(state, Gcra), &quota.rate(), now, cost);
            (st, Next::Gcra(s))
        }
        Algorithm::SlidingLog => {
            let empty = sliding_log::Log::default();
            let log = match state {
                Some(State::SlidingLog(log)) => {
                    log.prune(window, now);
                    &*log
                }
                _ => &empty,
            };
            let (total, live) = log.live(window, now);
            let st = sliding_log::charge(total, log.newest(), live, limit, window, now, cost);
            (st, Next::Record)
        }
    }
}

/// A status read without charging: it admits (nothing is asked) and no wait applies.
pub(crate) fn as_peek(mut status: QuotaStatus) -> QuotaStatus {
    status.allowed = true;
    status.retry_after_ms = 0;
    status
}

/// The status at `now` without charging.
pub(crate) fn peek(quota: &Quota, state: Option<&State>, now: u64) -> QuotaStatus {
    as_peek(peek_any(quota, state, now))
}

fn peek_any(quota: &Quota, state: Option<&State>, now: u64) -> QuotaStatus {
    let (limit, window) = (quota.limit(), quota.window_ms());
    match quota.algorithm() {
        Algorithm::FixedWindow => {
            fixed_window::peek(state_as!(state, FixedWindow), limit, window, now)
        }
        Algorithm::TokenBucket => {
            token_bucket::peek(state_as!(state, TokenBucket), &quota.rate(), now)
        }
        Algorithm::SlidingWindow => {
            sliding_window::peek(state_as!(state, SlidingWindow), limit, window, now)
        }
        Algorithm::Gcra => gcra::peek(state_as!(state, Gcra), &quota.rate(), now),
        Algorithm::SlidingLog => {
            let empty = sliding_log::Log::default();
            let log = match state {
                Some(State::SlidingLog(log)) => log,
                _ => &empty,
            };
            let (total, live) = log.live(window, now);
            sliding_log::charge(total, log.newest(), live, limit, window, now, Ask::of(0))
        }
    }
}

impl Next {
    /// Writes an admitted charge into `state`, or returns the state to create.
    #[inline]
    pub(crate) fn apply(self, state: Option<&mut State>, now: u64, cost: u64) -> Option<State> {
        let new = match self {
            Next::FixedWindow(s) => State::FixedWindow(s),
            Next::TokenBucket(s) => State::TokenBucket(s),
            Next::SlidingWindow(s) => State::SlidingWindow(s),
            Next::Gcra(s) => State::Gcra(s),
            Next::Record => match state {
                Some(State::SlidingLog(log)) => {
                    log.record(now, cost);
                    return None;
                }
                _ => State::SlidingLog(new_log(now, cost)),
            },
        };
        match state {
            Some(s) => {
                *s = new;
                None
            }
            None => Some(new),
        }
    }
}

fn new_log(now: u64, cost: u64) -> sliding_log::Log {
    let mut log = sliding_log::Log::default();
    log.record(now, cost);
    log
}

/// Unix ms after which `state` carries no information (reads as absent).
#[inline]
pub(crate) fn expires_at(quota: &Quota, state: &State) -> u64 {
    match state {
        State::FixedWindow(s) => s.reset_ms,
        State::TokenBucket(s) => token_bucket::expires_at(s, &quota.rate()),
        State::SlidingWindow(s) => sliding_window::expires_at(s, quota.window_ms()),
        State::Gcra(s) => gcra::expires_at(s),
        State::SlidingLog(log) => log.newest().map_or(0, |t| t + quota.window_ms()),
    }
}

/// One quota's settlement: what its charge took, and what the request
/// really cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    /// The state charged: the status's `window_id`.
    pub(crate) window_id: u64,
    /// When it was charged (Unix ms).
    pub(crate) charged_at: u64,
    /// What the charge took.
    pub(crate) reserved: u64,
    /// What the request cost.
    pub(crate) actual: u64,
}

/// A status as its charge left it, shown after settling `charged` to
/// `actual`: what came back is remaining again (the reset before the charge
/// when everything did); debt takes remaining down to 0 and, for a bucket,
/// moves the reset later by the time the excess takes to refill.
pub(crate) fn settled_status(
    quota: &Quota,
    status: QuotaStatus,
    charged: u64,
    actual: u64,
) -> QuotaStatus {
    if actual == 0 && charged > 0 {
        return status.refunded(charged);
    }
    let mut s = status;
    if actual < charged {
        s.remaining = s.remaining.saturating_add(charged - actual).min(s.limit);
    } else if actual > charged {
        let extra = actual - charged;
        s.remaining = s.remaining.saturating_sub(extra);
        if quota.algorithm().has_burst() {
            // Debt is at most one full bucket (`Rate::after`).
            let r = quota.rate();
            let debt = extra.saturating_mul(r.unit).min(r.capacity);
            s.reset_ms = s.reset_ms.saturating_add(r.ms_to_refill(debt));
        }
    }
    s
}

/// What a settlement did to one quota's state.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing (already what it cost, or the state charged is gone).
    Unchanged,
    /// Changed the state in place.
    Changed,
    /// The state was absent and is now this one (debt on a full bucket or
    /// an empty log).
    New(State),
}

/// Settles one quota's charge: below the reservation the rest comes back
/// ([`refund`]); above it the excess is charged to the same window or
/// bucket ([`debit`]).
pub(crate) fn settle(quota: &Quota, state: Option<&mut State>, now: u64, s: Settled) -> Outcome {
    let changed = |c: bool| {
        if c {
            Outcome::Changed
        } else {
            Outcome::Unchanged
        }
    };
    match s.actual.cmp(&s.reserved) {
        std::cmp::Ordering::Less => changed(refund(
            quota,
            state,
            s.window_id,
            now,
            s.reserved - s.actual,
        )),
        std::cmp::Ordering::Greater if takes_debt(quota, &s, now) => {
            debit(quota, state, now, s, s.actual - s.reserved)
        }
        _ => Outcome::Unchanged,
    }
}

/// Whether a bucket still takes a charge's debt at `now`: within one window
/// of the charge (a bucket has no window of its own to match). The other
/// algorithms match the charge's window or log entry instead.
pub(crate) fn takes_debt(quota: &Quota, s: &Settled, now: u64) -> bool {
    !quota.algorithm().has_burst() || now < s.charged_at.saturating_add(quota.window_ms())
}

/// Charges `extra` more to the state a charge went to, while it still holds:
/// the same fixed or sliding window, a log entry still within its window, or
/// a bucket (see [`takes_debt`]). Debt stays in the algorithm's own state:
/// remaining shows 0 until the window resets or the bucket refills from
/// below zero. A fixed or sliding window that is gone takes nothing; an
/// absent bucket is a full one and an absent log an empty one, which take
/// it.
fn debit(quota: &Quota, state: Option<&mut State>, now: u64, s: Settled, extra: u64) -> Outcome {
    let window = quota.window_ms();
    let Some(state) = state else {
        return match quota.algorithm() {
            Algorithm::TokenBucket => Outcome::New(State::TokenBucket(token_bucket::debit(
                None,
                &quota.rate(),
                now,
                extra,
            ))),
            Algorithm::Gcra => {
                Outcome::New(State::Gcra(gcra::debit(None, &quota.rate(), now, extra)))
            }
            Algorithm::SlidingLog => {
                let mut log = sliding_log::Log::default();
                if log.debit(window, s.window_id, now, extra) {
                    Outcome::New(State::SlidingLog(log))
                } else {
                    Outcome::Unchanged
                }
            }
            _ => Outcome::Unchanged,
        };
    };
    let next = match (quota.algorithm(), &mut *state) {
        (Algorithm::FixedWindow, State::FixedWindow(st)) => {
            fixed_window::debit(Some(*st), s.window_id, now, extra).map(State::FixedWindow)
        }
        (Algorithm::SlidingWindow, State::SlidingWindow(st)) => {
            sliding_window::debit(Some(*st), window, s.window_id, extra).map(State::SlidingWindow)
        }
        (Algorithm::TokenBucket, State::TokenBucket(st)) => Some(State::TokenBucket(
            token_bucket::debit(Some(*st), &quota.rate(), now, extra),
        )),
        (Algorithm::Gcra, State::Gcra(st)) => Some(State::Gcra(gcra::debit(
            Some(*st),
            &quota.rate(),
            now,
            extra,
        ))),
        (Algorithm::SlidingLog, State::SlidingLog(log)) => {
            return if log.debit(window, s.window_id, now, extra) {
                Outcome::Changed
            } else {
                Outcome::Unchanged
            };
        }
        _ => None,
    };
    match next {
        Some(n) => {
            *state = n;
            Outcome::Changed
        }
        None => Outcome::Unchanged,
    }
}

/// Refunds `cost` to the state identified by `window_id`, in place; false
/// when the refund does not apply (that state is gone or moved on).
pub(crate) fn refund(
    quota: &Quota,
    state: Option<&mut State>,
    window_id: u64,
    now: u64,
    cost: u64,
) -> bool {
    let Some(state) = state else {
        return false;
    };
    let next = match (quota.algorithm(), &mut *state) {
        (Algorithm::FixedWindow, State::FixedWindow(s)) => {
            fixed_window::refund(Some(*s), window_id, now, cost).map(State::FixedWindow)
        }
        (Algorithm::TokenBucket, State::TokenBucket(s)) => {
            token_bucket::refund(Some(*s), &quota.rate(), window_id, now, cost)
                .map(State::TokenBucket)
        }
        (Algorithm::SlidingWindow, State::SlidingWindow(s)) => {
            sliding_window::refund(Some(*s), quota.window_ms(), window_id, cost)
                .map(State::SlidingWindow)
        }
        (Algorithm::Gcra, State::Gcra(s)) => {
            gcra::refund(Some(*s), &quota.rate(), window_id, now, cost).map(State::Gcra)
        }
        (Algorithm::SlidingLog, State::SlidingLog(log)) => return log.refund(window_id, cost),
        _ => None,
    };
    match next {
        Some(n) => {
            *state = n;
            true
        }
        None => false,
    }
}
