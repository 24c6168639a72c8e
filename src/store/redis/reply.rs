//! The scripts' arguments and replies: what each algorithm sends to
//! `lua/charge.lua` and how the state it read is replayed through the same
//! pure math the memory store runs, so both stores report identical statuses.

use crate::algorithm::{
    self, fixed_window, gcra, sliding_log, sliding_window, token_bucket, Ask, State,
};
use crate::decision::{Decision, QuotaStatus};
use crate::error::StoreError;
use crate::{Algorithm, Policy, Quota};
use redis::Cmd;
use smallvec::SmallVec;

/// Adds a quota's arguments (code, field prefix, a, b, c, mode) to a script call.
pub(super) fn quota_args(cmd: &mut Cmd, q: &Quota) {
    let (a, b, c) = match q.algorithm() {
        Algorithm::TokenBucket | Algorithm::Gcra => {
            let r = q.rate();
            (r.unit, r.per_ms, r.capacity)
        }
        _ => (q.limit(), q.window_ms(), 0),
    };
    // How the quota is asked (twin of `algorithm::ask`): 0 counts requests,
    // 1 admits while anything is left, 2 only while the reservation fits.
    let mode = match (q.counts_requests(), q.reservation_must_fit()) {
        (true, _) => 0,
        (false, false) => 1,
        (false, true) => 2,
    };
    cmd.arg(q.algorithm().code())
        .arg(q.slot())
        .arg(a)
        .arg(b)
        .arg(c)
        .arg(mode);
}

/// How many keys a call for `policy` touches: the hash, then one log per sliding-log quota.
pub(super) fn key_count(policy: &Policy) -> usize {
    1 + policy
        .quotas()
        .iter()
        .filter(|q| q.algorithm() == Algorithm::SlidingLog)
        .count()
}

/// The time argument of a script call: Unix ms, or "" for Redis `TIME`.
pub(super) fn time_arg(cmd: &mut Cmd, now: Option<u64>) {
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
}

/// The keys a call on `hash_key` touches: the hash, then one log per
/// sliding-log quota (the hash's key, `:`, the quota's field prefix).
pub(super) fn keys(cmd: &mut Cmd, hash_key: &[u8], policy: &Policy) {
    cmd.arg(hash_key);
    for q in policy.quotas() {
        if q.algorithm() == Algorithm::SlidingLog {
            let mut log = SmallVec::<[u8; 96]>::from_slice(hash_key);
            log.push(b':');
            log.extend_from_slice(q.slot().as_bytes());
            cmd.arg(&log[..]);
        }
    }
}

/// One quota's state as the script read it.
enum Read {
    State(State),
    Log {
        total: u64,
        newest: Option<u64>,
        /// When this quota admits the request asked (0: it does now, or never).
        retry_at: u64,
    },
}

/// Parses one quota's reply block; returns the state and the block's length.
fn read_block(q: &Quota, r: &[i64]) -> Option<(Read, usize)> {
    let at = |i: usize| r.get(i).and_then(|v| u64::try_from(*v).ok());
    Some(match q.algorithm() {
        Algorithm::FixedWindow => (
            Read::State(State::FixedWindow(fixed_window::State {
                count: at(0)?,
                reset_ms: at(1)?,
            })),
            2,
        ),
        Algorithm::TokenBucket => (
            Read::State(State::TokenBucket(token_bucket::State {
                // Below zero while the bucket is in debt.
                level: *r.first()?,
                at_ms: at(1)?,
            })),
            2,
        ),
        Algorithm::Gcra => (
            Read::State(State::Gcra(gcra::State {
                tat_ms: at(0)?,
                rem: at(1)?,
            })),
            2,
        ),
        Algorithm::SlidingWindow => (
            Read::State(State::SlidingWindow(sliding_window::State {
                start_ms: at(0)?,
                cur: at(1)?,
                prev: at(2)?,
            })),
            3,
        ),
        Algorithm::SlidingLog => (
            Read::Log {
                total: at(0)?,
                newest: Some(at(1)?).filter(|t| *t > 0),
                retry_at: at(2)?,
            },
            3,
        ),
    })
}

/// Replays `ask` (or a read without charging, `None`) on a reply's state.
fn replay(q: &Quota, read: Read, now: u64, ask: Option<Ask>) -> QuotaStatus {
    match read {
        Read::State(mut s) => match ask {
            Some(ask) => algorithm::charge(q, Some(&mut s), now, ask).0,
            None => algorithm::peek(q, Some(&s), now),
        },
        Read::Log {
            total,
            newest,
            retry_at,
        } => {
            let st = sliding_log::decide(
                total,
                newest,
                |_| retry_at,
                q.limit(),
                q.window_ms(),
                now,
                ask.unwrap_or(Ask::of(0)),
            );
            if ask.is_some() {
                st
            } else {
                algorithm::as_peek(st)
            }
        }
    }
}

/// The most of a reply an error (and so a log line) shows.
pub(super) const SHOWN: usize = 1024;

/// `reply` for an error message: at most [`SHOWN`] bytes of it, and how
/// long it was.
pub(super) fn shown(reply: &impl std::fmt::Debug) -> String {
    let mut s = format!("{reply:?}");
    if s.len() > SHOWN {
        let len = s.len();
        let mut cut = SHOWN;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str(&format!("… ({len} bytes in all)"));
    }
    s
}

/// Builds the decision from a charge script's reply `{allowed, now,
/// block_1, .., block_n}` for a request of `(cost, units)`, or a status
/// script's (`None`).
pub(super) fn decode(
    policy: &Policy,
    asked: Option<(u64, u64)>,
    sent_now: Option<u64>,
    r: &[i64],
) -> Result<Decision, StoreError> {
    let reply = r;
    let bad = || StoreError::Protocol(format!("rate-limit script returned {}", shown(&reply)));
    if r.len() < 2 {
        return Err(bad());
    }
    let now = u64::try_from(r[1]).map_err(|_| bad())?;
    let ask = |q: &Quota| asked.map(|(cost, units)| algorithm::ask(q, cost, units));
    if sent_now.is_some_and(|t| t != now) {
        // Every reply echoes the time it was sent with: a reply to another call
        // (a desynchronised connection) is caught, never used.
        return Err(StoreError::Protocol(format!(
            "reply for time {now} does not belong to a call sent at {sent_now:?}"
        )));
    }
    let mut decision = Decision::empty();
    let mut i = 2;
    for q in policy.quotas() {
        let (read, len) = read_block(q, &r[i..]).ok_or_else(bad)?;
        decision.push(replay(q, read, now, ask(q)));
        i += len;
    }
    if i != r.len() {
        return Err(bad());
    }
    let quotas = policy.quotas();
    decision.decide_each(|i| ask(&quotas[i]).map_or((0, 0), |a| (a.fit, a.charge)));
    if asked.is_some() && decision.is_allowed() != (r[0] == 1) {
        return Err(StoreError::Protocol(format!(
            "charge script decided {} but the state it returned says otherwise: {}",
            r[0],
            shown(&reply)
        )));
    }
    Ok(decision)
}
