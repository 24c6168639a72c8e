//! Pure decision math: every function takes `now` and touches no I/O or clock,
//! so it can be tested exhaustively and mirrored by the Lua scripts in `lua/`.

pub(crate) mod fixed_window;

use crate::decision::QuotaStatus;
use crate::quota::{Algorithm, Quota};

/// One quota's stored state, whatever its algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow(fixed_window::State),
}

impl State {
    /// Unix ms after which the state carries no information (reads as fresh).
    pub(crate) fn expires_at(&self) -> u64 {
        match self {
            State::FixedWindow(s) => s.reset_ms,
        }
    }
}

fn fixed(state: Option<&State>) -> Option<fixed_window::State> {
    state.map(|State::FixedWindow(s)| *s)
}

/// Evaluates `cost` against `quota`: the status, and the state to store if every
/// quota of the policy admits the request.
pub(crate) fn charge(
    quota: &Quota,
    state: Option<&State>,
    now: u64,
    cost: u64,
) -> (QuotaStatus, State) {
    match quota.algorithm() {
        Algorithm::FixedWindow => {
            let (st, s) =
                fixed_window::charge(fixed(state), quota.limit(), quota.window_ms(), now, cost);
            (st, State::FixedWindow(s))
        }
    }
}

/// The status at `now` without charging.
pub(crate) fn peek(quota: &Quota, state: Option<&State>, now: u64) -> QuotaStatus {
    match quota.algorithm() {
        Algorithm::FixedWindow => {
            fixed_window::peek(fixed(state), quota.limit(), quota.window_ms(), now)
        }
    }
}

/// The state after refunding `cost` to the state identified by `window_id`, or
/// `None` when the refund does not apply (that state is gone).
pub(crate) fn refund(
    quota: &Quota,
    state: Option<&State>,
    window_id: u64,
    now: u64,
    cost: u64,
) -> Option<State> {
    match quota.algorithm() {
        Algorithm::FixedWindow => {
            fixed_window::refund(fixed(state), window_id, now, cost).map(State::FixedWindow)
        }
    }
}

/// What a refund does to the status a response reports: the cost comes back,
/// capped at the limit.
pub(crate) fn refunded_status(mut status: QuotaStatus, cost: u64) -> QuotaStatus {
    status.remaining = status.remaining.saturating_add(cost).min(status.limit);
    status
}
