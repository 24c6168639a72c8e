//! The scripts' arguments and replies: what each algorithm sends to
//! `lua/charge.lua` and how the state it read is replayed through the same
//! pure math the memory store runs, so both stores report identical statuses.

use crate::algorithm::{
    self, fixed_window, gcra, penalty, refusal, sliding_log, sliding_window, token_bucket, Ask,
    State,
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

/// The argument opening a policy (lua/policy.lua): its number of quotas,
/// negative when its refusal settings follow its quotas ([`refusal_args`]).
pub(super) fn count_arg(cmd: &mut Cmd, policy: &Policy) {
    let n = policy.quotas().len() as i64;
    cmd.arg(if policy.is_plain() { n } else { -n });
}

/// The refusal settings closing a policy that waits or keeps a penalty
/// box (none for a plain one): whether it waits, its penalty box's field
/// prefix ("" for none), the refusals that block, the span they are
/// counted over, the block (ms) and whether a blocked request starts the
/// block again.
pub(super) fn refusal_args(cmd: &mut Cmd, policy: &Policy) {
    if policy.is_plain() {
        return;
    }
    cmd.arg(u8::from(policy.waits().is_some()));
    match penalty::Rule::of(policy) {
        Some(rule) => cmd
            .arg(penalty_prefix(policy))
            .arg(rule.after)
            .arg(rule.within_ms)
            .arg(rule.block_ms)
            .arg(u8::from(rule.extend)),
        None => cmd.arg("").arg(0).arg(0).arg(0).arg(0),
    };
}

/// The hash field prefix of `policy`'s penalty box: one per policy of a
/// key, by the policy's fingerprint (a block answers only for the policy
/// that refused).
fn penalty_prefix(policy: &Policy) -> String {
    format!("p{:016x}", policy.fingerprint())
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

/// What a charge asked: its cost, its reservation, and how far ahead it may
/// be booked.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asked {
    pub(super) cost: u64,
    pub(super) units: u64,
    pub(super) wait_ms: u64,
}

/// Builds the decision from a charge script's reply `{allowed, now,
/// block_1, .., block_n}` (and, for a policy that waits or keeps a penalty
/// box, its turn and box: see lua/refusal.lua) for a request that `asked`,
/// or a status script's (`None`).
pub(super) fn decode(
    policy: &Policy,
    asked: Option<Asked>,
    sent_now: Option<u64>,
    r: &[i64],
) -> Result<Decision, StoreError> {
    let reply = r;
    let bad = || StoreError::Protocol(format!("rate-limit script returned {}", shown(&reply)));
    if r.len() < 2 {
        return Err(bad());
    }
    let now = u64::try_from(r[1]).map_err(|_| bad())?;
    let ask = |q: &Quota| asked.map(|a| algorithm::ask(q, a.cost, a.units));
    if sent_now.is_some_and(|t| t != now) {
        // Every reply echoes the time it was sent with: a reply to another call
        // (a desynchronised connection) is caught, never used.
        return Err(StoreError::Protocol(format!(
            "reply for time {now} does not belong to a call sent at {sent_now:?}"
        )));
    }
    if !policy.is_plain() {
        return decode_refusing(policy, asked, now, r).ok_or_else(bad)?;
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

/// [`decode`] for a policy that waits or keeps a penalty box: replays
/// `algorithm::refusal` on the state the script read. `None` when the reply
/// does not read as one for this policy.
fn decode_refusing(
    policy: &Policy,
    asked: Option<Asked>,
    now: u64,
    r: &[i64],
) -> Option<Result<Decision, StoreError>> {
    let quotas = policy.quotas();
    let mut reads: SmallVec<[Read; 2]> = SmallVec::new();
    let mut i = 2;
    for q in quotas {
        let (read, len) = read_block(q, r.get(i..)?)?;
        reads.push(read);
        i += len;
    }
    let mut next = || {
        let v = u64::try_from(*r.get(i)?).ok();
        i += 1;
        v
    };
    let turn = match (asked, policy.waits()) {
        (Some(_), Some(_)) => Some(next()?),
        _ => None,
    };
    let penalty = match penalty::Rule::of(policy) {
        Some(rule) => {
            let state = penalty::State {
                refusals: next()?,
                since_ms: next()?,
                until_ms: next()?,
            };
            Some((rule, state))
        }
        None => None,
    };
    if i != r.len() {
        return None;
    }
    let peeks = |reads: SmallVec<[Read; 2]>| {
        quotas
            .iter()
            .zip(reads)
            .map(|(q, read)| replay(q, read, now, None))
            .collect::<SmallVec<[QuotaStatus; 2]>>()
    };
    let Some(asked) = asked else {
        let read = Decision::from_statuses(peeks(reads), 0);
        return Some(Ok(match penalty.and_then(|(_, s)| s.blocked_until(now)) {
            Some(until) => Decision::blocked(read.statuses().iter().copied(), now, until),
            None => read,
        }));
    };
    let decision = match penalty.and_then(|(rule, s)| s.blocked(&rule, now)) {
        Some((until, _)) => Decision::blocked(peeks(reads), now, until),
        None => {
            let gcra: SmallVec<[Option<gcra::State>; 2]> = reads
                .iter()
                .map(|read| match read {
                    Read::State(State::Gcra(s)) => Some(*s),
                    _ => None,
                })
                .collect();
            let mut decision = Decision::empty();
            for (q, read) in quotas.iter().zip(reads) {
                let a = algorithm::ask(q, asked.cost, asked.units);
                decision.push(replay(q, read, now, Some(a)));
            }
            decision.decide_each(|i| {
                let a = algorithm::ask(&quotas[i], asked.cost, asked.units);
                (a.fit, a.charge)
            });
            refusal::after_refusal(
                policy,
                &mut decision,
                || gcra,
                penalty,
                (now, asked.cost, asked.wait_ms),
            );
            decision
        }
    };
    if decision.is_allowed() != (r[0] == 1) || turn.is_some_and(|t| t != decision.wait_ms()) {
        return Some(Err(StoreError::Protocol(format!(
            "charge script decided {} (turn {turn:?}) but the state it returned says otherwise: {}",
            r[0],
            shown(&r)
        ))));
    }
    Some(Ok(decision))
}
