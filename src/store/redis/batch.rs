//! The batched charge call, as pure functions: the `EVALSHA` of
//! `lua/charge.lua` that carries a batch of charges, and each request's
//! answer read from its reply (see [`super::lane`] for how batches travel).

use super::keys::HashKey;
use super::reply;
use super::scripts;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::Policy;
use redis::{Cmd, FromRedisValue, Script, Value};
use smallvec::SmallVec;
use std::time::Duration;

/// The most requests one script call carries (about 0.2 ms of Redis time for
/// single-quota policies, so no batch holds Redis for long).
pub(crate) const MAX_BATCH: usize = 64;

/// One request's charge.
pub(crate) struct Job {
    /// The client's hash key.
    pub(crate) hash_key: HashKey,
    pub(crate) policy: Policy,
    /// Unix ms from the application's clock; `None` = Redis `TIME`.
    pub(crate) now: Option<u64>,
    /// What it costs each request quota.
    pub(crate) cost: u64,
    /// What it reserves in each quota of another unit.
    pub(crate) units: u64,
    /// How far ahead it may be booked (a policy that waits; 0: not at all).
    pub(crate) wait_ms: u64,
    /// How long the request may wait for its answer at the store, from
    /// when it is queued on a lane (see [`super::lane`]).
    pub(crate) timeout: Duration,
}

/// The answer to one request.
pub(crate) type JobReply = Result<Decision, StoreError>;

/// A batch's script call, planned: each distinct policy once, then per
/// request its policy's index, time, cost and reservation (for a policy
/// that waits, whose quotas all count requests and reserve nothing: how far
/// ahead it may be booked); keys in request order. A
/// request for the same key and policy as the one before it (without a
/// sliding log, and a plain policy) continues its run: policy index 0 and no keys, and the
/// script reads and writes the key once for the run (lua/charge.lua).
struct Plan<'j> {
    policies: SmallVec<[&'j Policy; 4]>,
    /// Per request, its policy's index (from 1), or 0 if it continues a run.
    index: SmallVec<[usize; MAX_BATCH]>,
    keys: usize,
    /// The keys' bytes, plus per key a little for a sliding log's `:` and field prefix.
    key_bytes: usize,
    /// The algorithms the batch uses (see [`scripts::bit`]), and whether a
    /// policy waits or keeps a penalty box ([`scripts::REFUSING`]).
    algorithms: usize,
    /// Every argument, the command's name included.
    args: usize,
}

impl<'j> Plan<'j> {
    fn new(jobs: &'j [Job]) -> Self {
        let mut policies: SmallVec<[&Policy; 4]> = SmallVec::new();
        let mut index = SmallVec::new();
        let (mut keys, mut key_bytes) = (0, 0);
        let mut previous: Option<(&Job, usize)> = None;
        for job in jobs {
            let i = match policies.iter().position(|p| **p == job.policy) {
                Some(i) => i + 1,
                None => {
                    policies.push(&job.policy);
                    policies.len()
                }
            };
            let n = reply::key_count(&job.policy);
            let continues = n == 1
                && job.policy.is_plain()
                && previous.is_some_and(|(p, pi)| pi == i && p.hash_key == job.hash_key);
            previous = Some((job, i));
            if continues {
                index.push(0);
                continue;
            }
            index.push(i);
            keys += n;
            key_bytes += (job.hash_key.len() + 24) * n;
        }
        let mut algorithms = policies
            .iter()
            .flat_map(|p| p.quotas())
            .fold(0, |set, q| set | scripts::bit(q.algorithm()));
        if policies.iter().any(|p| !p.is_plain()) {
            algorithms |= scripts::REFUSING;
        }
        let quota_args: usize = policies
            .iter()
            .map(|p| 1 + 6 * p.quotas().len() + if p.is_plain() { 0 } else { 6 })
            .sum();
        Plan {
            // EVALSHA, the hash, the key count, P and J, then the rest.
            args: 5 + keys + quota_args + 4 * jobs.len(),
            policies,
            index,
            keys,
            key_bytes,
            algorithms,
        }
    }

    /// About how many bytes the arguments take.
    fn bytes(&self) -> usize {
        64 + self.key_bytes + 24 * self.args
    }

    fn script(&self) -> &'static Script {
        scripts::charge(self.algorithms)
    }

    /// Writes every argument of the batch's `EVALSHA`.
    fn write(&self, jobs: &[Job], out: &mut Cmd) {
        out.arg("EVALSHA").arg(self.script().get_hash());
        out.arg(self.keys);
        for (job, i) in jobs.iter().zip(&self.index) {
            if *i != 0 {
                reply::keys(out, &job.hash_key, &job.policy);
            }
        }
        out.arg(self.policies.len());
        for p in &self.policies {
            reply::count_arg(out, p);
            for q in p.quotas() {
                reply::quota_args(out, q);
            }
            reply::refusal_args(out, p);
        }
        out.arg(jobs.len());
        for (job, i) in jobs.iter().zip(&self.index) {
            out.arg(*i);
            reply::time_arg(out, job.now);
            let fourth = if job.policy.waits().is_some() {
                job.wait_ms
            } else {
                job.units
            };
            out.arg(job.cost).arg(fourth);
        }
    }
}

/// The script call charging `jobs` (see [`Plan`]), as a redis-rs command
/// sized up front, and the script it runs.
pub(crate) fn command(jobs: &[Job]) -> (&'static Script, Cmd) {
    let plan = Plan::new(jobs);
    let mut cmd = Cmd::with_capacity(plan.args, plan.bytes());
    plan.write(jobs, &mut cmd);
    (plan.script(), cmd)
}

/// Each request's answer from the script's reply (see lua/charge.lua): one
/// string of 8-byte little-endian numbers, per request `k` and its `k`
/// numbers or `-1`, then the message of each request that failed.
pub(crate) fn answers(reply: &[Value], jobs: &[Job]) -> Result<Vec<JobReply>, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("charge script reply: {why}"));
    let (packed, messages) = match reply {
        [Value::BulkString(packed), messages @ ..] if packed.len() % 8 == 0 => (packed, messages),
        _ => return Err(bad("no packed numbers")),
    };
    let nums: Vec<i64> = packed
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("chunks of 8 bytes")))
        .collect();
    let mut messages = messages.iter();
    let mut out = Vec::with_capacity(jobs.len());
    let mut at = 0;
    for job in jobs {
        match nums.get(at) {
            Some(-1) => {
                let message = messages
                    .next()
                    .and_then(|v| String::from_redis_value_ref(v).ok())
                    .unwrap_or_default();
                out.push(Err(response_error(message)));
                at += 1;
            }
            Some(&k) => {
                let k = usize::try_from(k).map_err(|_| bad("a negative length"))?;
                // A length Redis sent: checked, never trusted to fit.
                let end = (at + 1)
                    .checked_add(k)
                    .ok_or_else(|| bad("a length past the end"))?;
                let block = nums.get(at + 1..end).ok_or_else(|| bad("cut short"))?;
                let asked = reply::Asked {
                    cost: job.cost,
                    units: job.units,
                    wait_ms: job.wait_ms,
                };
                out.push(reply::decode(&job.policy, Some(asked), job.now, block));
                at = end;
            }
            None => return Err(bad("fewer answers than requests")),
        }
    }
    if at != nums.len() || messages.next().is_some() {
        return Err(bad("more answers than requests"));
    }
    Ok(out)
}

/// The store error for an error reply: its first word is the code.
pub(crate) fn response_error(message: String) -> StoreError {
    StoreError::Response {
        code: message.split_whitespace().next().map(str::to_owned),
        message: if message.len() > reply::SHOWN {
            reply::shown(&message)
        } else {
            message
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use redis::Arg;

    fn job(key: &str, policy: &Policy) -> Job {
        Job {
            hash_key: HashKey::from_slice(key.as_bytes()),
            policy: policy.clone(),
            now: Some(1_000),
            cost: 1,
            units: 1,
            wait_ms: 0,
            timeout: Duration::from_secs(1),
        }
    }

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "?".into(),
            })
            .collect()
    }

    #[test]
    fn a_length_from_redis_past_the_end_is_a_protocol_error_never_a_panic() {
        let p = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
        let jobs = [job("x", &p)];
        for k in [i64::MAX, i64::MAX - 1, 1 << 62, 5] {
            let err = answers(&packed(&[k, 1, 1_000], &[]), &jobs).unwrap_err();
            assert_eq!(err.kind(), "protocol", "{k}: {err}");
        }
    }

    #[test]
    fn a_long_reply_or_message_is_shown_cut_to_a_kilobyte() {
        let p = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
        let jobs = [job("x", &p)];
        // A block of 40,000 numbers that does not read as this request's.
        let mut nums = vec![40_000, 1, 1_000];
        nums.extend(std::iter::repeat_n(7, 39_998));
        let shown = answers(&packed(&nums, &[]), &jobs).unwrap()[0]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(shown.len() < 1_200, "{} bytes", shown.len());
        assert!(shown.contains("bytes in all"), "{shown}");
        let long = response_error("ERR ".to_owned() + &"x".repeat(200_000));
        assert!(long.to_string().len() < 1_200);
        assert!(long.to_string().contains("bytes in all"));
    }

    #[test]
    fn a_request_for_the_previous_ones_key_and_policy_continues_its_run() {
        let a = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
        let b = Policy::new(Quota::new(9, Duration::from_secs(60)).unwrap());
        let jobs = [
            job("x", &a),
            job("x", &a),
            job("x", &a),
            job("y", &a),
            job("y", &b),
            job("x", &a),
        ];
        let (_, cmd) = command(&jobs);
        let args = args(&cmd);
        // EVALSHA, hash, then the keys of the requests that start a run.
        assert_eq!(args[2..7], ["4", "x", "y", "y", "x"]);
        // The per-request quadruples close the command: policy index 0 = "continues".
        let per_request: Vec<&str> = args[args.len() - 24..]
            .chunks(4)
            .map(|r| r[0].as_str())
            .collect();
        assert_eq!(per_request, ["1", "0", "0", "1", "2", "1"]);
    }

    /// The reply lua/charge.lua makes of these numbers and messages.
    fn packed(nums: &[i64], messages: &[&str]) -> Vec<Value> {
        let bytes = nums.iter().flat_map(|n| n.to_le_bytes()).collect();
        std::iter::once(Value::BulkString(bytes))
            .chain(
                messages
                    .iter()
                    .map(|m| Value::BulkString(m.as_bytes().to_vec())),
            )
            .collect()
    }

    #[test]
    fn each_request_reads_its_own_block_of_the_reply_and_a_failed_one_its_error() {
        let a = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
        let jobs = [job("x", &a), job("y", &a), job("z", &a), job("w", &a)];
        // Per request, `k` and its numbers (allowed, now, then the fixed
        // window's count and reset as read), or -1 (its message follows).
        let message = "WRONGTYPE not a hash";
        let nums = [
            4, 1, 1000, 0, 0,  //
            -1, //
            4, 1, 1000, 2, 61000, //
            4, 0, 1000, 5, 61000,
        ];
        let reply = packed(&nums, &[message]);
        let answers = answers(&reply, &jobs).unwrap();
        let remaining = |r: &JobReply| match r {
            Ok(d) => (d.is_allowed(), d.statuses()[0].remaining),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(remaining(&answers[0]), (true, 4));
        assert_eq!(remaining(&answers[2]), (true, 2));
        assert_eq!(remaining(&answers[3]), (false, 0));
        let err = answers[1].as_ref().unwrap_err();
        assert_eq!(err.to_string(), response_error(message.into()).to_string());
        assert_eq!(err.kind(), "response");
        // A reply too short or too long for the batch is the call's error.
        assert!(answers_len(&packed(&nums[..15], &[message]), &jobs).is_err());
        let mut long = nums.to_vec();
        long.push(0);
        assert!(answers_len(&packed(&long, &[message]), &jobs).is_err());
        assert!(answers_len(&packed(&nums, &[message, "extra"]), &jobs).is_err());
        assert!(answers_len(&[Value::Int(4)], &jobs).is_err());
    }

    fn answers_len(reply: &[Value], jobs: &[Job]) -> Result<usize, StoreError> {
        answers(reply, jobs).map(|a| a.len())
    }
}
