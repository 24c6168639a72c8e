//! Concurrent charges travel together: one `EVALSHA` of `lua/charge.lua`
//! carries every charge waiting for a connection, and each request still gets
//! its own decision, read and written atomically in order inside the script.
//!
//! Each lane (one multiplexed connection) has a queue and a runner task. The
//! runner yields once to the scheduler, so every request that is ready to run
//! joins, then sends everything queued (up to [`MAX_BATCH`]) as one script
//! call, pipelined on the connection, with at most [`BATCHES_IN_FLIGHT`]
//! calls in flight per lane. An idle service therefore sends every request
//! alone and at once; a busy one sends one call per scheduler pass; and when
//! Redis falls behind, charges queue until a call comes back and leave
//! together. No request ever waits for a timer or for a batch to fill, and
//! under load Redis runs one script call (one read, one write system call)
//! for many decisions instead of one per request.
//!
//! Safety:
//! - Replies come back by position, one per request, into that request's own
//!   channel: a reply can never reach another request.
//! - A request whose caller gave up (timed out, dropped) before its batch left
//!   is taken out of it and never charged.
//! - `NOSCRIPT` means the script did not run at all: the script is loaded and
//!   the whole batch re-sent once (`Call::Eval`), never charged twice.
//! - A failure of one request inside the script (say, its key holds another
//!   type) answers that request with an error and leaves the rest of the batch
//!   alone; a failure of the call (connection, timeout, `OOM`, `BUSY`) answers
//!   every request of the batch with it, through the layer's failure policy.
//! - A lane's queue holds at most [`MAX_QUEUED`] requests; past that a charge
//!   fails at once rather than queueing behind a stalled Redis.
//! - A runner dropped mid-way (its runtime shut down) marks its lane idle and
//!   answers what was queued with an error, so a store shared by several
//!   runtimes keeps working from the others.

use super::connection::{Call, Lanes};
use super::keys::HashKey;
use super::{reply, scripts};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::quota::Policy;
use deadpool_redis::redis::{Cmd, FromRedisValue, Script, Value};
use smallvec::SmallVec;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{oneshot, Semaphore};

/// The most requests one script call carries (about 0.2 ms of Redis time for
/// single-quota policies, so no batch holds Redis for long).
pub(crate) const MAX_BATCH: usize = 64;

/// Batches one lane may have in flight at once (pipelined on its connection).
pub(crate) const BATCHES_IN_FLIGHT: usize = 4;

/// The most requests waiting on one lane.
pub(crate) const MAX_QUEUED: usize = 4096;

/// One request's charge.
pub(crate) struct Job {
    /// The client's hash key.
    pub(crate) hash_key: HashKey,
    pub(crate) policy: Policy,
    /// Unix ms from the application's clock; `None` = Redis `TIME`.
    pub(crate) now: Option<u64>,
    pub(crate) cost: u64,
}

/// The answer to one request.
pub(crate) type JobReply = Result<Decision, StoreError>;

type Waiting = (Job, oneshot::Sender<JobReply>);

/// A lane's queue.
pub(crate) struct Queue {
    waiting: Vec<Waiting>,
    /// Whether a runner task is sending this lane's batches.
    running: bool,
    /// One permit per batch that may be in flight on the lane at once.
    slots: Arc<Semaphore>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            waiting: Vec::new(),
            running: false,
            slots: Arc::new(Semaphore::new(BATCHES_IN_FLIGHT)),
        }
    }
}

impl Queue {
    /// Empties the queue (dropping the senders answers their callers) and marks it idle.
    fn reset(&mut self) {
        self.waiting.clear();
        self.running = false;
    }
}

fn lock(q: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `EVALSHA` for `jobs` and the script it runs: each distinct policy once,
/// then per request its policy's index, time and cost; keys in request order.
/// Arguments are written straight into the command's one buffer.
pub(crate) fn command(jobs: &[Job]) -> (&'static Script, Cmd) {
    let mut policies: SmallVec<[&Policy; 4]> = SmallVec::new();
    let mut index: SmallVec<[usize; MAX_BATCH]> = SmallVec::new();
    let mut keys = 0;
    // Per key its bytes, plus a sliding log's `:` and field prefix, rounded up.
    let mut key_bytes = 0;
    for job in jobs {
        let i = match policies.iter().position(|p| **p == job.policy) {
            Some(i) => i,
            None => {
                policies.push(&job.policy);
                policies.len() - 1
            }
        };
        index.push(i + 1);
        let n = reply::key_count(&job.policy);
        keys += n;
        key_bytes += (job.hash_key.len() + 24) * n;
    }
    let algorithms = policies
        .iter()
        .flat_map(|p| p.quotas())
        .fold(0, |set, q| set | scripts::bit(q.algorithm()));
    let script = scripts::charge(algorithms);
    // Sized up front: a batch's command runs to a few KB, and growing it by
    // doubling costs a chain of large reallocations and copies per call.
    let quota_args: usize = policies.iter().map(|p| 1 + 5 * p.quotas().len()).sum();
    // EVALSHA, the hash, the key count, P and J, then the rest.
    let mut cmd = Cmd::with_capacity(
        5 + keys + quota_args + 3 * jobs.len(),
        64 + key_bytes + 24 * quota_args + 24 * jobs.len(),
    );
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    for job in jobs {
        reply::keys(&mut cmd, &job.hash_key, &job.policy);
    }
    cmd.arg(policies.len());
    for p in &policies {
        cmd.arg(p.quotas().len());
        for q in p.quotas() {
            reply::quota_args(&mut cmd, q);
        }
    }
    cmd.arg(jobs.len());
    for (job, i) in jobs.iter().zip(index) {
        cmd.arg(i);
        reply::time_arg(&mut cmd, job.now);
        cmd.arg(job.cost);
    }
    (script, cmd)
}

/// Each request's answer from the script's flat reply: per request, `k` and
/// its `k` numbers, or `-1` and an error message (see lua/charge.lua).
pub(crate) fn answers(reply: &[Value], jobs: &[Job]) -> Result<Vec<JobReply>, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("charge script reply: {why}"));
    let mut out = Vec::with_capacity(jobs.len());
    let mut at = 0;
    for job in jobs {
        match reply.get(at) {
            Some(Value::Int(-1)) => {
                let message = reply
                    .get(at + 1)
                    .and_then(|m| String::from_redis_value_ref(m).ok())
                    .unwrap_or_default();
                out.push(Err(StoreError::Response {
                    code: message.split_whitespace().next().map(str::to_owned),
                    message,
                }));
                at += 2;
            }
            Some(Value::Int(k)) => {
                let k = usize::try_from(*k).map_err(|_| bad("a negative length"))?;
                let block = reply
                    .get(at + 1..at + 1 + k)
                    .ok_or_else(|| bad("cut short"))?;
                let nums = block
                    .iter()
                    .map(|v| match v {
                        Value::Int(n) => Ok(*n),
                        other => Err(bad(&format!("{other:?} is not a number"))),
                    })
                    .collect::<Result<SmallVec<[i64; 16]>, _>>()?;
                out.push(reply::decode(&job.policy, Some(job.cost), job.now, &nums));
                at += 1 + k;
            }
            _ => return Err(bad("fewer answers than requests")),
        }
    }
    if at != reply.len() {
        return Err(bad("more answers than requests"));
    }
    Ok(out)
}

impl Lanes {
    /// Queues `job` on a lane (an idle one if any) and starts that lane's
    /// runner if it was idle. The reply arrives on the returned channel.
    pub(crate) fn submit(self: &Arc<Self>, job: Job) -> oneshot::Receiver<JobReply> {
        let (tx, rx) = oneshot::channel();
        let queues = self.queues();
        let first = self.next_lane();
        // Each lane is locked once: the first idle one takes the job, else the
        // last one tried.
        for k in 0..queues.len() {
            let lane = (first + k) % queues.len();
            let mut q = lock(&queues[lane]);
            if q.running && k + 1 < queues.len() {
                continue;
            }
            if q.waiting.len() >= MAX_QUEUED {
                let _ = tx.send(Err(StoreError::Unavailable(format!(
                    "{MAX_QUEUED} charges already wait for this redis connection"
                ))));
                return rx;
            }
            q.waiting.push((job, tx));
            if !std::mem::replace(&mut q.running, true) {
                drop(q);
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(run(self.clone(), lane));
                    }
                    // Dropping the queued senders answers their callers.
                    Err(_) => lock(&queues[lane]).reset(),
                }
            }
            return rx;
        }
        unreachable!("a store has at least one connection")
    }

    /// Sends one batch on lane `lane`: one answer per job, or the call's error.
    async fn send_batch(&self, lane: usize, jobs: &[Job]) -> Result<Vec<JobReply>, StoreError> {
        let (script, cmd) = command(jobs);
        let reply: Vec<Value> = self.run_on(lane, Call::Eval { script, cmd: &cmd }).await?;
        answers(&reply, jobs)
    }
}

/// Marks the lane idle and answers what is still queued (with an error, by
/// dropping the senders) if the runner is dropped mid-way (its runtime shut down).
struct Running<'a> {
    lanes: &'a Lanes,
    lane: usize,
    finished: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.finished {
            lock(&self.lanes.queues()[self.lane]).reset();
        }
    }
}

/// Sends lane `lane`'s batches until its queue is empty.
async fn run(lanes: Arc<Lanes>, lane: usize) {
    let mut running = Running {
        lanes: &lanes,
        lane,
        finished: false,
    };
    let slots = lock(&lanes.queues()[lane]).slots.clone();
    loop {
        // Let every request that is ready to run join this batch: one pass
        // of the scheduler, never a timer.
        tokio::task::yield_now().await;
        // With every slot taken, charges queue up for the next batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (jobs, senders) = {
            let mut q = lock(&lanes.queues()[lane]);
            if q.waiting.is_empty() {
                q.running = false;
                running.finished = true;
                return;
            }
            let n = q.waiting.len().min(MAX_BATCH);
            let mut jobs = Vec::with_capacity(n);
            let mut senders = Vec::with_capacity(n);
            // Callers that gave up before their batch left are never charged.
            for (job, tx) in q.waiting.drain(..n).filter(|(_, tx)| !tx.is_closed()) {
                jobs.push(job);
                senders.push(tx);
            }
            (jobs, senders)
        };
        if jobs.is_empty() {
            continue;
        }
        let lanes = lanes.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match lanes.send_batch(lane, &jobs).await {
                Ok(replies) => {
                    for (tx, r) in senders.into_iter().zip(replies) {
                        let _ = tx.send(r);
                    }
                }
                Err(e) => {
                    for tx in senders {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}
