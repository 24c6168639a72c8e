//! Pure decision math: every function takes `now` and touches no I/O or clock,
//! so it can be tested exhaustively and mirrored by the Lua scripts in `lua/`.
//!
//! Every algorithm reports the same meanings: `remaining` is what can be
//! spent now, `reset_ms` when the quota is fully available again,
//! `retry_after_ms` when a rejected request would be admitted (0 when it
//! never can be), and `window_id` names the state a refund goes back to.

pub(crate) mod fixed_window;
pub(crate) mod gcra;
mod rate;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;

use crate::decision::QuotaStatus;
use crate::quota::{Algorithm, Quota};

/// One quota's stored state, whatever its algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow(fixed_window::State),
    TokenBucket(token_bucket::State),
    SlidingWindow(sliding_window::State),
    Gcra(gcra::State),
    SlidingLog(sliding_log::Log),
}

/// What an admitted charge writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Store this state (every constant-size algorithm).
    Set(State),
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

/// Evaluates `cost` against `quota` at `now`: the status, and what to write
/// if every quota of the policy admits the request. A sliding log is pruned
/// in place first (dropping expired entries changes no decision).
#[inline]
pub(crate) fn charge(
    quota: &Quota,
    state: Option<&mut State>,
    now: u64,
    cost: u64,
) -> (QuotaStatus, Next) {
    let (limit, window) = (quota.limit(), quota.window_ms());
    match quota.algorithm() {
        Algorithm::FixedWindow => {
            let (st, s) =
                fixed_window::charge(state_as!(state, FixedWindow), limit, window, now, cost);
            (st, Next::Set(State::FixedWindow(s)))
        }
        Algorithm::TokenBucket => {
            let (st, s) =
                token_bucket::charge(state_as!(state, TokenBucket), &quota.rate(), now, cost);
            (st, Next::Set(State::TokenBucket(s)))
        }
        Algorithm::SlidingWindow => {
            let (st, s) =
                sliding_window::charge(state_as!(state, SlidingWindow), limit, window, now, cost);
            (st, Next::Set(State::SlidingWindow(s)))
        }
        Algorithm::Gcra => {
            let (st, s) = gcra::charge(state_as!(state, Gcra), &quota.rate(), now, cost);
            (st, Next::Set(State::Gcra(s)))
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
            sliding_log::charge(total, log.newest(), live, limit, window, now, 0)
        }
    }
}

impl Next {
    /// Writes an admitted charge into `state`, or returns the state to create.
    #[inline]
    pub(crate) fn apply(self, state: Option<&mut State>, now: u64, cost: u64) -> Option<State> {
        match (self, state) {
            (Next::Set(new), Some(s)) => {
                *s = new;
                None
            }
            (Next::Set(new), None) => Some(new),
            (Next::Record, Some(State::SlidingLog(log))) => {
                log.record(now, cost);
                None
            }
            (Next::Record, Some(s)) => {
                *s = State::SlidingLog(new_log(now, cost));
                None
            }
            (Next::Record, None) => Some(State::SlidingLog(new_log(now, cost))),
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
