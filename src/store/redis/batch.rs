//! Concurrent charges travel together: one `EVALSHA` of `lua/charge.lua`
//! carries every charge waiting for a connection, and each request still gets
//! its own decision, read and written atomically in order inside the script.
//!
//! Each lane has a queue and a runner task. The runner yields once to the
//! scheduler, so every request that is ready to run joins, then sends
//! everything queued (up to [`MAX_BATCH`]) as one script call, pipelined on
//! the lane's connection, with at most [`BATCHES_IN_FLIGHT`] calls in flight
//! per lane. On a plain-TCP URL the runner owns that connection's socket
//! (see [`super::wire`]): it writes the calls and reads their replies itself.
//! Otherwise (TLS, Unix sockets) it hands each call to redis-rs. An idle service therefore sends every request
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
//! - `NOSCRIPT` means the script did not run at all: the whole batch is
//!   re-sent once, never charged twice (on its own socket with the script's
//!   source, `EVAL`; through redis-rs after `SCRIPT LOAD`).
//! - A failure of one request inside the script (say, its key holds another
//!   type) answers that request with an error (with the rest of its run of
//!   requests for the same key, see [`Plan`]) and leaves the rest of the
//!   batch alone; a failure of the call (connection, timeout, `OOM`, `BUSY`) answers
//!   every request of the batch with it, through the layer's failure policy.
//! - A lane's queue holds at most [`MAX_QUEUED`] requests; past that a charge
//!   fails at once rather than queueing behind a stalled Redis.
//! - A runner dropped mid-way (its runtime shut down) marks its lane idle and
//!   answers what was queued with an error, so a store shared by several
//!   runtimes keeps working from the others.

use super::connection::{Call, Lanes};
use super::keys::HashKey;
use super::reply::{self, Args, Resp};
use super::scripts;
use super::wire::{io_error, response_error, Entry, Item, Parked, Reply, Wire};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::quota::Policy;
use deadpool_redis::redis::{Cmd, Script, Value};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{oneshot, Semaphore};
use tokio::time::Instant;

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

type Sender = oneshot::Sender<JobReply>;
type Waiting = (Job, Sender);

/// A lane's queue.
pub(crate) struct Queue {
    waiting: Vec<Waiting>,
    /// Whether a runner task is sending this lane's batches.
    running: bool,
    /// One permit per batch that may be in flight on the lane at once
    /// (through redis-rs; a lane's own socket counts its batches itself).
    slots: Arc<Semaphore>,
    /// The lane's own socket while no runner needs it.
    parked: Option<Parked>,
    /// The buffers the last runner on the lane's own socket grew, for the
    /// next one: under load a runner ends every few batches (the queue and
    /// its pipeline run dry) and another starts with the next request.
    kept: Kept,
}

/// A runner's buffers, kept for the next runner of the lane.
#[derive(Default)]
struct Kept {
    spare: Vec<Batch>,
    reading: Reading,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            waiting: Vec::new(),
            running: false,
            slots: Arc::new(Semaphore::new(BATCHES_IN_FLIGHT)),
            parked: None,
            kept: Kept::default(),
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

/// A batch's script call, planned: each distinct policy once, then per
/// request its policy's index, time and cost; keys in request order. A
/// request for the same key and policy as the one before it (without a
/// sliding log) continues its run: policy index 0 and no keys, and the
/// script reads and writes the key once for the run (lua/charge.lua).
struct Plan<'j> {
    policies: SmallVec<[&'j Policy; 4]>,
    /// Per request, its policy's index (from 1), or 0 if it continues a run.
    index: SmallVec<[usize; MAX_BATCH]>,
    keys: usize,
    /// The keys' bytes, plus per key a little for a sliding log's `:` and field prefix.
    key_bytes: usize,
    /// The algorithms the batch uses (see [`scripts::bit`]).
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
            let continues =
                n == 1 && previous.is_some_and(|(p, pi)| pi == i && p.hash_key == job.hash_key);
            previous = Some((job, i));
            if continues {
                index.push(0);
                continue;
            }
            index.push(i);
            keys += n;
            key_bytes += (job.hash_key.len() + 24) * n;
        }
        let algorithms = policies
            .iter()
            .flat_map(|p| p.quotas())
            .fold(0, |set, q| set | scripts::bit(q.algorithm()));
        let quota_args: usize = policies.iter().map(|p| 1 + 5 * p.quotas().len()).sum();
        Plan {
            // EVALSHA, the hash, the key count, P and J, then the rest.
            args: 5 + keys + quota_args + 3 * jobs.len(),
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

    /// Writes every argument. With `source`, an `EVAL` carrying the
    /// script's source instead of an `EVALSHA` of its hash (after
    /// `NOSCRIPT`: it runs the batch and caches the script for the next ones).
    fn write(&self, jobs: &[Job], source: bool, out: &mut impl Args) {
        if source {
            out.arg("EVAL").arg(scripts::charge_source(self.algorithms));
        } else {
            out.arg("EVALSHA").arg(self.script().get_hash());
        }
        out.arg(self.keys);
        for (job, i) in jobs.iter().zip(&self.index) {
            if *i != 0 {
                reply::keys(out, &job.hash_key, &job.policy);
            }
        }
        out.arg(self.policies.len());
        for p in &self.policies {
            out.arg(p.quotas().len());
            for q in p.quotas() {
                reply::quota_args(out, q);
            }
        }
        out.arg(jobs.len());
        for (job, i) in jobs.iter().zip(&self.index) {
            out.arg(*i);
            reply::time_arg(out, job.now);
            out.arg(job.cost);
        }
    }
}

/// The script call charging `jobs` (see [`Plan`]), as a redis-rs command
/// sized up front (a batch's command runs to a few KB, and growing it by
/// doubling costs a chain of large reallocations and copies per call), and
/// the script it runs.
pub(crate) fn command(jobs: &[Job], source: bool) -> (&'static Script, Cmd) {
    let plan = Plan::new(jobs);
    let mut cmd = Cmd::with_capacity(plan.args, plan.bytes());
    plan.write(jobs, source, &mut cmd);
    (plan.script(), cmd)
}

/// [`command`] as RESP, appended to `out` (a lane's own socket buffer).
fn encode(jobs: &[Job], source: bool, out: &mut Vec<u8>) {
    let plan = Plan::new(jobs);
    out.reserve(plan.bytes() + 8 * plan.args);
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(plan.args).as_bytes());
    out.extend_from_slice(b"\r\n");
    plan.write(jobs, source, &mut Resp(out));
}

/// Each request's answer from the script's flat reply: per request, `k` and
/// its `k` numbers, or `-1` and an error message (see lua/charge.lua).
pub(crate) fn answers(reply: &[Value], jobs: &[Job]) -> Result<Vec<JobReply>, StoreError> {
    let mut out = Vec::with_capacity(jobs.len());
    answers_into(reply, jobs, &mut out)?;
    Ok(out)
}

/// [`answers`] into `out`, which a lane reuses from batch to batch.
fn answers_into<T: Entry>(
    reply: &[T],
    jobs: &[Job],
    out: &mut Vec<JobReply>,
) -> Result<(), StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("charge script reply: {why}"));
    out.clear();
    let mut at = 0;
    for job in jobs {
        match reply.get(at).and_then(Entry::number) {
            Some(-1) => {
                let message = reply.get(at + 1).and_then(Entry::text).unwrap_or_default();
                out.push(Err(response_error(message)));
                at += 2;
            }
            Some(k) => {
                let k = usize::try_from(k).map_err(|_| bad("a negative length"))?;
                let block = reply
                    .get(at + 1..at + 1 + k)
                    .ok_or_else(|| bad("cut short"))?;
                let mut nums = SmallVec::<[i64; 16]>::new();
                for v in block {
                    match v.number() {
                        Some(n) => nums.push(n),
                        None => return Err(bad(&format!("{v:?} is not a number"))),
                    }
                }
                out.push(reply::decode(&job.policy, Some(job.cost), job.now, &nums));
                at += 1 + k;
            }
            None => return Err(bad("fewer answers than requests")),
        }
    }
    if at != reply.len() {
        return Err(bad("more answers than requests"));
    }
    Ok(())
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
            let starts_batch = q.waiting.len() == 1;
            if !std::mem::replace(&mut q.running, true) {
                drop(q);
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        // Made before the task: a task dropped before its
                        // first poll (a runtime shutting down) still marks
                        // the lane idle.
                        let running = Running {
                            lanes: self.clone(),
                            lane,
                            finished: false,
                        };
                        if self.endpoint().is_some() {
                            rt.spawn(run_wire(running));
                        } else {
                            rt.spawn(run(running));
                        }
                    }
                    // Dropping the queued senders answers their callers.
                    Err(_) => lock(&queues[lane]).reset(),
                }
            } else if starts_batch && self.endpoint().is_some() {
                // A runner waiting on its own socket's replies sends this
                // batch too if it has room (one wake per batch, not per request).
                self.wake(lane).notify_one();
            }
            return rx;
        }
        unreachable!("a store has at least one connection")
    }

    /// Sends one batch on lane `lane` through redis-rs: one answer per job,
    /// or the call's error.
    async fn send_batch(&self, lane: usize, jobs: &[Job]) -> Result<Vec<JobReply>, StoreError> {
        let (script, cmd) = command(jobs, false);
        let reply: Vec<Value> = self.run_on(lane, Call::Eval { script, cmd: &cmd }).await?;
        let answers = answers(&reply, jobs)?;
        if readonly(&answers).is_some() {
            // A demoted primary: replace the connection.
            self.discard(lane);
        }
        Ok(answers)
    }
}

/// A lane's runner: marks the lane idle and answers what is still queued
/// (with an error, by dropping the senders) if the runner is dropped mid-way
/// or before it ever ran (its runtime shut down).
struct Running {
    lanes: Arc<Lanes>,
    lane: usize,
    finished: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.finished {
            lock(&self.lanes.queues()[self.lane]).reset();
        }
    }
}

/// A batch: its requests and, in the same order, where their answers go.
#[derive(Default)]
struct Batch {
    jobs: Vec<Job>,
    senders: Vec<Sender>,
}

impl Batch {
    /// Takes the next batch off a queue into `self` (empty): up to
    /// [`MAX_BATCH`] requests whose callers still wait (those that gave up
    /// before their batch left are never charged). Empty if none still wait.
    fn take(&mut self, q: &mut Queue) {
        let n = q.waiting.len().min(MAX_BATCH);
        self.jobs.reserve(n);
        self.senders.reserve(n);
        for (job, tx) in q.waiting.drain(..n).filter(|(_, tx)| !tx.is_closed()) {
            self.jobs.push(job);
            self.senders.push(tx);
        }
    }

    /// Takes out, in place and in order, the requests whose callers gave up
    /// since the batch was taken.
    fn drop_abandoned(&mut self) {
        let open: SmallVec<[bool; MAX_BATCH]> =
            self.senders.iter().map(|tx| !tx.is_closed()).collect();
        let mut keep = open.iter().copied();
        self.jobs.retain(|_| keep.next().unwrap_or(true));
        let mut keep = open.iter().copied();
        self.senders.retain(|_| keep.next().unwrap_or(true));
    }

    /// Hands each request its answer, or all of them the whole batch's
    /// error, and empties the batch (keeping its room for the next).
    fn deliver(&mut self, replies: Result<impl Iterator<Item = JobReply>, StoreError>) {
        match replies {
            Ok(replies) => {
                for (tx, r) in self.senders.drain(..).zip(replies) {
                    let _ = tx.send(r);
                }
                self.jobs.clear();
            }
            Err(e) => self.fail(&e),
        }
    }

    /// Answers every request with `e` and empties the batch.
    fn fail(&mut self, e: &StoreError) {
        for tx in self.senders.drain(..) {
            let _ = tx.send(Err(e.clone()));
        }
        self.jobs.clear();
    }
}

/// Sends lane `lane`'s batches through redis-rs until its queue is empty
/// (lanes without their own socket: TLS and Unix-socket URLs).
async fn run(mut running: Running) {
    let (lanes, lane) = (running.lanes.clone(), running.lane);
    let slots = lock(&lanes.queues()[lane]).slots.clone();
    loop {
        // Let every request that is ready to run join this batch: one pass
        // of the scheduler, never a timer.
        tokio::task::yield_now().await;
        // With every slot taken, charges queue up for the next batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = Batch::default();
        {
            let mut q = lock(&lanes.queues()[lane]);
            if q.waiting.is_empty() {
                q.running = false;
                running.finished = true;
                return;
            }
            batch.take(&mut q);
        }
        if batch.jobs.is_empty() {
            continue;
        }
        let lanes = lanes.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let replies = lanes.send_batch(lane, &batch.jobs).await;
            batch.deliver(replies.map(Vec::into_iter));
        });
    }
}

/// A batch written to the lane's own socket, waiting for its reply.
struct Sent {
    batch: Batch,
    /// When the connection is given up on if no reply has come.
    deadline: Instant,
    /// Sent as `EVAL` with the script's source (after `NOSCRIPT`).
    source: bool,
}

/// Sends lane `lane`'s batches on its own socket until its queue is empty
/// and every reply is in, then parks the socket for the next runner.
///
/// One task does it all: it writes each batch as soon as it is taken (at
/// most [`BATCHES_IN_FLIGHT`] unanswered), reads the replies in order and
/// hands each request its own. A reply later than the response timeout, a
/// closed or broken socket, a reply that does not parse, or `READONLY` (a
/// demoted primary) fails every batch in flight and drops the socket; the
/// next batch connects a new one.
async fn run_wire(mut running: Running) {
    let (lanes, lane) = (running.lanes.clone(), running.lane);
    let endpoint = lanes
        .endpoint()
        .expect("run_wire runs lanes with an endpoint");
    let wake = lanes.wake(lane);
    // Buffers reused from batch to batch, and from runner to runner: no
    // large allocation per call.
    let (
        mut wire,
        Kept {
            mut spare,
            reading: mut reply,
        },
    ) = {
        let mut q = lock(&lanes.queues()[lane]);
        (
            q.parked.take().and_then(Wire::resume),
            std::mem::take(&mut q.kept),
        )
    };
    spare.reserve(BATCHES_IN_FLIGHT);
    let mut in_flight: VecDeque<Sent> = VecDeque::with_capacity(BATCHES_IN_FLIGHT);
    let timer = tokio::time::sleep(endpoint.response_timeout);
    tokio::pin!(timer);
    // Let every request that is ready to run join the first batch: one
    // pass of the scheduler, never a timer.
    tokio::task::yield_now().await;
    loop {
        if in_flight.len() < BATCHES_IN_FLIGHT {
            let mut batch = spare.pop().unwrap_or_default();
            let more = {
                let mut q = lock(&lanes.queues()[lane]);
                if q.waiting.is_empty() && in_flight.is_empty() {
                    q.parked = wire.take().and_then(Wire::park);
                    spare.push(batch);
                    q.kept = Kept {
                        spare,
                        reading: reply,
                    };
                    q.running = false;
                    running.finished = true;
                    return;
                }
                batch.take(&mut q);
                !q.waiting.is_empty()
            };
            if !batch.jobs.is_empty() && wire.is_none() {
                match lanes.connect_wire(lane).await {
                    Ok(w) => wire = Some(w),
                    Err(e) => {
                        batch.fail(&e);
                        spare.push(batch);
                        continue;
                    }
                }
                // Connecting may take a while: callers that gave up
                // meanwhile are not charged either.
                batch.drop_abandoned();
            }
            if let (false, Some(w)) = (batch.jobs.is_empty(), &mut wire) {
                encode(&batch.jobs, false, w.out());
                let sent = Sent {
                    batch,
                    deadline: Instant::now() + endpoint.response_timeout,
                    source: false,
                };
                if in_flight.is_empty() {
                    timer.as_mut().reset(sent.deadline);
                }
                in_flight.push_back(sent);
                if let Err(e) = w.flush() {
                    give_up(&lanes, lane, &mut wire, &mut in_flight, &mut spare, &e);
                }
                continue;
            }
            spare.push(batch);
            // Only abandoned requests were taken: take again if more wait.
            if in_flight.is_empty() || more {
                continue;
            }
        }
        let w = wire.as_mut().expect("batches in flight have a connection");
        let room = in_flight.len() < BATCHES_IN_FLIGHT;
        let pending = w.pending();
        let step = tokio::select! {
            biased;
            r = w.stream.readable() => r.map_err(io_error).and_then(|()| {
                reply.read(w, &mut in_flight, &mut spare, endpoint.response_timeout)
            }),
            r = w.stream.writable(), if pending => r.map_err(io_error).and_then(|()| w.flush()),
            () = &mut timer => Err(StoreError::Unavailable(format!(
                "redis timed out: no reply within {:?}",
                endpoint.response_timeout
            ))),
            () = wake.notified(), if room => {
                // A new batch is queued: let the rest of it join first.
                tokio::task::yield_now().await;
                Ok(())
            }
        };
        match step {
            Ok(()) => {
                if let Some(front) = in_flight.front() {
                    if timer.deadline() != front.deadline {
                        timer.as_mut().reset(front.deadline);
                    }
                }
            }
            Err(e) => give_up(&lanes, lane, &mut wire, &mut in_flight, &mut spare, &e),
        }
    }
}

/// Gives lane `lane`'s socket up after `e`: every batch in flight fails
/// with it, and the lane's redis-rs connection is made (and the server
/// vetted) again with the next socket.
fn give_up(
    lanes: &Lanes,
    lane: usize,
    wire: &mut Option<Wire>,
    in_flight: &mut VecDeque<Sent>,
    spare: &mut Vec<Batch>,
    e: &StoreError,
) {
    for mut sent in in_flight.drain(..) {
        sent.batch.fail(e);
        spare.push(sent.batch);
    }
    *wire = None;
    lanes.discard(lane);
}

/// The `READONLY` error among `answers`, if any: the connection reaches a
/// replica (a demoted primary) and must be replaced.
fn readonly(answers: &[JobReply]) -> Option<StoreError> {
    answers
        .iter()
        .find_map(|a| a.as_ref().err().filter(|e| e.kind() == "readonly"))
        .cloned()
}

/// What reading a lane's replies reuses from batch to batch.
#[derive(Default)]
struct Reading {
    values: Vec<Item>,
    answers: Vec<JobReply>,
}

impl Reading {
    /// Reads what the socket has and answers each batch whose reply is
    /// whole. `NOSCRIPT` (nothing ran) re-sends the batch once with the
    /// script's source. An error means the connection must be given up.
    fn read(
        &mut self,
        w: &mut Wire,
        in_flight: &mut VecDeque<Sent>,
        spare: &mut Vec<Batch>,
        response_timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        if !w.fill()? {
            return Ok(());
        }
        while let Some(reply) = w.next_reply(&mut self.values)? {
            let mut sent = in_flight
                .pop_front()
                .ok_or_else(|| StoreError::Protocol("redis replied to no call".into()))?;
            let answered = match reply {
                Reply::Error(m) if !sent.source && m.starts_with("NOSCRIPT") => {
                    encode(&sent.batch.jobs, true, w.out());
                    in_flight.push_back(Sent {
                        deadline: Instant::now() + response_timeout,
                        source: true,
                        ..sent
                    });
                    w.flush()?;
                    continue;
                }
                Reply::Error(m) => Err(response_error(m)),
                Reply::Values => answers_into(&self.values, &sent.batch.jobs, &mut self.answers),
            };
            // READONLY, for the call or (the script's write met it) for a
            // request: a demoted primary, where every later batch fails too.
            let demoted = match &answered {
                Ok(()) => readonly(&self.answers),
                Err(e) => (e.kind() == "readonly").then(|| e.clone()),
            };
            let answers = &mut self.answers;
            sent.batch.deliver(answered.map(|()| answers.drain(..)));
            spare.push(sent.batch);
            if let Some(e) = demoted {
                return Err(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use deadpool_redis::redis::Arg;
    use std::time::Duration;

    fn job(key: &str, policy: &Policy) -> Job {
        Job {
            hash_key: HashKey::from_slice(key.as_bytes()),
            policy: policy.clone(),
            now: Some(1_000),
            cost: 1,
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
        let (_, cmd) = command(&jobs, false);
        let args = args(&cmd);
        // EVALSHA, hash, then the keys of the requests that start a run.
        assert_eq!(args[2..7], ["4", "x", "y", "y", "x"]);
        // The per-request triples close the command: policy index 0 = "continues".
        let per_request: Vec<&str> = args[args.len() - 18..]
            .chunks(3)
            .map(|r| r[0].as_str())
            .collect();
        assert_eq!(per_request, ["1", "0", "0", "1", "2", "1"]);
    }

    #[test]
    fn a_lanes_own_items_answer_as_redis_rs_values_do() {
        let a = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
        let jobs = [job("x", &a), job("y", &a), job("z", &a), job("w", &a)];
        // Per request, `k` and its numbers (allowed, now, then the fixed
        // window's count and reset as read), or -1 and an error message.
        let message = "WRONGTYPE not a hash";
        let reply = [
            ":4",
            ":1",
            ":1000",
            ":0",
            ":0",
            ":-1",
            &format!("${}\r\n{message}", message.len()),
            ":4",
            ":1",
            ":1000",
            ":2",
            ":61000",
            ":4",
            ":0",
            ":1000",
            ":5",
            ":61000",
        ];
        let mut buf = format!("*{}\r\n", reply.len()).into_bytes();
        for r in reply {
            buf.extend_from_slice(r.as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        let (mut items, mut values) = (Vec::<Item>::new(), Vec::<Value>::new());
        let whole = Some((buf.len(), Reply::Values));
        assert_eq!(super::super::wire::parse(&buf, &mut items).unwrap(), whole);
        assert_eq!(super::super::wire::parse(&buf, &mut values).unwrap(), whole);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        answers_into(&items, &jobs, &mut ours).unwrap();
        answers_into(&values, &jobs, &mut theirs).unwrap();
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
        let remaining = |r: &JobReply| match r {
            Ok(d) => (d.is_allowed(), d.statuses()[0].remaining),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(remaining(&ours[0]), (true, 4));
        assert_eq!(remaining(&ours[2]), (true, 2));
        assert_eq!(remaining(&ours[3]), (false, 0));
        let err = ours[1].as_ref().unwrap_err();
        assert_eq!(err.to_string(), response_error(message.into()).to_string());
    }

    #[test]
    fn the_resp_encoding_is_the_redis_rs_command_byte_for_byte() {
        let a = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
        // Arguments of every length class: empty (Redis' own time), one
        // digit, two (the script's hash), three or more (a long key, the
        // script's source).
        let mut redis_time = job("y", &a);
        redis_time.now = None;
        let long = "k".repeat(150);
        let jobs = [
            job("x", &a),
            job("x", &a),
            job("{z}", &a),
            redis_time,
            job(&long, &a),
        ];
        for source in [false, true] {
            let mut resp = Vec::new();
            encode(&jobs, source, &mut resp);
            assert_eq!(resp, command(&jobs, source).1.get_packed_command());
        }
    }
}
