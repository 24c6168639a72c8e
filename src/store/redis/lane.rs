//! A role's connections ("lanes"), each one redis-rs multiplexed
//! connection, and the batched charge path over them.
//!
//! Concurrent charges travel together: each lane has a queue and, while
//! charges wait, a runner task. The runner yields once to the scheduler, so
//! every request that is ready to run joins, then sends everything queued
//! (up to [`MAX_BATCH`]) as one `EVALSHA` of `lua/charge.lua`. While that
//! call is in flight, charges queue and leave together the moment it comes
//! back. Only when a whole batch waits does another leave beside those in
//! flight (at most [`BATCHES_IN_FLIGHT`], pipelined by redis-rs on the
//! connection): Redis is far, or the load outgrows one call per round trip.
//! An idle service therefore sends every request alone and at once, and a
//! busy one as few calls as its round trips allow. No request ever waits
//! for a timer or for a batch to fill: at most for the call before it.
//!
//! Why one call in flight rather than several: each call costs the
//! application a fixed amount (a hand-off to redis-rs's connection task and
//! back, a reply to parse, system calls), so fewer, larger calls cost less
//! per request. `scripts/bench.sh` measured the difference (see
//! `docs/performance.md`).
//!
//! Safety:
//! - Replies come back by position, one per request, into that request's own
//!   channel: a reply can never reach another request.
//! - A request whose caller gave up (timed out, dropped) before its batch left
//!   is taken out of it and never charged.
//! - `NOSCRIPT` means the script did not run at all: the script is loaded and
//!   the batch sent once more, never charged twice. Nothing else is re-sent:
//!   not after an I/O error, not after a timeout.
//! - A failure of one request inside the script (say, its key holds another
//!   type) answers that request with an error and leaves the rest of the
//!   batch alone; a failure of the call (connection, timeout, `OOM`, `BUSY`)
//!   answers every request of the batch with it, through the layer's failure
//!   policy.
//! - A request's budget (the store timeout) runs from when it is queued to
//!   its answer: the time it waits behind earlier calls to the store is part
//!   of it while the store fails (its last call found no answer in time).
//!   Only the time the lane had a call out to Redis counts, as the Redis I/O
//!   thread saw it: a runner the application's runtime polls late does not
//!   spend a request's budget, and a long queue behind a store that answers
//!   is this instance's own volume, never a reason to fail open. A request
//!   whose budget ran out in the queue is answered with a timeout and never
//!   sent; one in flight is answered at its own deadline, whatever its
//!   batch's fellows wait for.
//! - A lane's queue holds at most [`MAX_QUEUED`] requests; past that a charge
//!   fails at once with [`StoreError::Backlog`]: the instance asks more of
//!   its store than it answers (the layer answers it as an overload, never
//!   by admitting it without limit), rather than queueing without bound.
//! - A runner forms batches on the application's runtime (so everything
//!   ready to run joins), but each batch is sent, timed and answered on the
//!   Redis I/O thread ([`super::io`]), as connections are made and read
//!   there: a saturated application runtime cannot make a healthy Redis
//!   look slow.
//! - A runner dropped mid-way (its runtime shut down) marks its lane idle and
//!   answers what was queued with an error, so a store shared by several
//!   runtimes keeps working from the others.

use super::batch::{self, Job, JobReply, MAX_BATCH};
use super::error::{breaks_connection, redis_error};
use super::eviction::{self, EvictionCheck};
use super::node::{Conn, Node};
use crate::error::StoreError;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionLike;
use redis::{self, Cmd, FromRedisValue, RedisError, RedisResult, Script, Value};
use smallvec::SmallVec;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// Batches one lane may have in flight at once.
pub(crate) const BATCHES_IN_FLIGHT: usize = 4;

/// The most requests waiting on one lane.
pub(crate) const MAX_QUEUED: usize = 4096;

/// The most requests waiting on one lane that a shadow charge (one no
/// request waits for) may join: an eighth of the queue, so shadow policies
/// never crowd out the charges requests wait for.
pub(crate) const MAX_QUEUED_SHADOW: usize = MAX_QUEUED / 8;

/// A connection unused for this long is checked before it carries a call:
/// the server (its `timeout`), a proxy or `CLIENT KILL` may have closed it.
const IDLE_CHECK: Duration = Duration::from_secs(1);

type Sender = oneshot::Sender<JobReply>;

/// A queued request: its charge, the lane's busy time when it was queued,
/// and where its answer goes.
struct Queued {
    job: Job,
    busy_at: Duration,
    tx: Sender,
}

/// How long a lane has had calls out to Redis, all told: what a queued
/// request's wait is measured in.
#[derive(Default)]
struct Busy {
    /// Calls out now.
    calls: usize,
    /// Since when at least one is.
    since: Option<Instant>,
    /// The time with calls out, before `since`.
    total: Duration,
}

impl Busy {
    fn now(&self, now: Instant) -> Duration {
        self.total
            + self
                .since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    fn begin(&mut self, now: Instant) {
        self.calls += 1;
        self.since.get_or_insert(now);
    }

    fn end(&mut self, now: Instant) {
        self.calls = self.calls.saturating_sub(1);
        if self.calls == 0 {
            if let Some(since) = self.since.take() {
                self.total += now.saturating_duration_since(since);
            }
        }
    }
}

/// The connections of one role: to the primary (or a Sentinel-named
/// primary), or to one replica.
pub(crate) struct Lanes {
    node: Arc<Node>,
    /// Checked on every new connection (the primary's), or not at all.
    eviction: Option<EvictionCheck>,
    response_timeout: Duration,
    lanes: Box<[Lane]>,
    next: AtomicUsize,
}

struct Lane {
    /// The open connection and when it was last handed out. Locked while a
    /// new one is made, so concurrent callers wait for one connection
    /// instead of each making their own.
    conn: Arc<tokio::sync::Mutex<Option<(Conn, Instant)>>>,
    queue: Mutex<Queue>,
    /// Wakes the lane's runner when a charge starts a new batch.
    wake: Notify,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Queued>,
    /// Whether a runner task is sending this lane's batches.
    running: bool,
    /// The lane's calls out to Redis, as the I/O thread saw them.
    busy: Busy,
    /// Whether the lane's last call failed (an error, or no answer in
    /// time): the wait behind calls is then the store's, and spends the
    /// budget of the requests queued; behind calls the store answers, it is
    /// this instance's own volume, which must never make a request fail
    /// open, and the budget starts when the request is sent.
    failing: bool,
}

fn lock(q: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One call: a script (sent as `EVALSHA`, loaded and re-sent after
/// `NOSCRIPT`) or a plain command.
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    Eval { script: &'a Script, cmd: &'a Cmd },
    Command(&'a Cmd),
}

impl Call<'_> {
    /// Sends the call once on `conn`. A script call is re-sent only after
    /// `NOSCRIPT`, when nothing ran (the script is loaded first); any other
    /// error is returned, never retried.
    pub(crate) async fn send<T: FromRedisValue>(
        self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> RedisResult<T> {
        match self {
            Call::Eval { script, cmd } => match cmd.query_async(conn).await {
                Err(e) if is_noscript(&e) => {
                    script.load_async(conn).await?;
                    cmd.query_async(conn).await
                }
                r => r,
            },
            Call::Command(cmd) => cmd.query_async(conn).await,
        }
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

impl Lanes {
    pub(crate) fn new(
        node: Node,
        n: usize,
        eviction: Option<EvictionCheck>,
        response_timeout: Duration,
    ) -> Self {
        Self {
            node: Arc::new(node),
            eviction,
            response_timeout,
            lanes: (0..n.max(1))
                .map(|_| Lane {
                    conn: Arc::default(),
                    queue: Mutex::default(),
                    wake: Notify::new(),
                })
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    fn next_lane(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()
    }

    /// Lane `i`'s connection: the open one, or a new one (checked for
    /// eviction on a primary).
    ///
    /// A new connection is made by a task of its own, bounded by the
    /// connect timeout only: a caller whose budget runs out first gives up
    /// waiting, but the connection (a TLS handshake may take longer than one
    /// request's budget) is still made, for the callers after it.
    async fn connection(&self, i: usize) -> Result<Conn, StoreError> {
        let mut slot = self.lanes[i].conn.clone().lock_owned().await;
        if let Some((conn, used)) = slot.as_mut() {
            if !conn.is_closed() && (used.elapsed() < IDLE_CHECK || conn.is_open().await) {
                *used = Instant::now();
                return Ok(conn.clone());
            }
        }
        *slot = None;
        let (node, eviction) = (self.node.clone(), self.eviction);
        let made = super::io::spawn(async move {
            let mut conn = node.connect().await?;
            if let Some(check) = eviction {
                eviction::check_eviction(check, &mut conn, node.shown()).await?;
            }
            *slot = Some((conn.clone(), Instant::now()));
            Ok(conn)
        });
        made.await.unwrap_or_else(|e| {
            Err(StoreError::Unavailable(format!(
                "redis connection to {} failed: {e}",
                self.node.shown()
            )))
        })
    }

    /// Opens every lane's connection (one attempt each, within the connect
    /// timeout); the first failure is returned once all have tried.
    pub(crate) async fn connect(&self) -> Result<(), StoreError> {
        let mut result = Ok(());
        for i in 0..self.lanes.len() {
            result = result.and(self.connection(i).await.map(drop));
        }
        result
    }

    /// Lane `i`'s connection by `deadline` (`budget` after the call began).
    async fn open(
        &self,
        i: usize,
        deadline: Instant,
        budget: Duration,
    ) -> Result<Conn, StoreError> {
        match tokio::time::timeout_at(deadline, self.connection(i)).await {
            Ok(conn) => conn,
            Err(_) => Err(StoreError::Timeout(budget)),
        }
    }

    /// The answer `call` gets on `conn` by `deadline`. A connection that
    /// broke, or that has answered nothing for the response timeout, is
    /// closed: the next call makes a new one.
    async fn answer<T>(
        &self,
        conn: &Conn,
        deadline: Instant,
        budget: Duration,
        call: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(v)) => {
                conn.answered();
                Ok(v)
            }
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    conn.close();
                } else {
                    // An error reply is an answer: the connection works.
                    conn.answered();
                }
                Err(redis_error(e))
            }
            Err(_) => {
                if conn.stalled_for(self.response_timeout) {
                    conn.close();
                }
                Err(StoreError::Timeout(budget))
            }
        }
    }

    /// Runs `call` on the next lane within `budget`, connecting included.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        call: Call<'_>,
        budget: Duration,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + budget;
        let conn = self.open(self.next_lane(), deadline, budget).await?;
        let mut c = conn.clone();
        let sent = async move { call.send(&mut c).await };
        self.answer(&conn, deadline, budget, sent).await
    }

    /// Sends `pipe` in one round trip on the next lane within `budget` (shared
    /// limits, the advisor's fleet report and the coordinated mode's sync;
    /// never on a request's path).
    #[cfg(any(
        feature = "advisor",
        feature = "runtime-limits",
        feature = "coordinated"
    ))]
    pub(crate) async fn query_pipeline(
        &self,
        pipe: &redis::Pipeline,
        budget: Duration,
    ) -> Result<Vec<Value>, StoreError> {
        let deadline = Instant::now() + budget;
        let conn = self.open(self.next_lane(), deadline, budget).await?;
        let mut c = conn.clone();
        let sent = async move { pipe.query_async::<Vec<Value>>(&mut c).await };
        self.answer(&conn, deadline, budget, sent).await
    }

    /// Queues `job` on a lane (an idle one if any) and starts that lane's
    /// runner if it was idle; the answer comes on the returned channel.
    /// Called inside a tokio runtime: the runner is spawned on it.
    /// Refused at once (`Backlog`) when `cap` or more wait there.
    pub(crate) fn submit(self: &Arc<Self>, job: Job, cap: usize) -> oneshot::Receiver<JobReply> {
        let (tx, rx) = oneshot::channel();
        let first = self.next_lane();
        let n = self.lanes.len();
        // Each lane is locked once: the first idle one takes the job, else the
        // last one tried.
        for k in 0..n {
            let lane = (first + k) % n;
            let mut q = lock(&self.lanes[lane].queue);
            if q.running && k + 1 < n {
                continue;
            }
            if q.waiting.len() >= cap {
                let _ = tx.send(Err(StoreError::Backlog {
                    queued: q.waiting.len(),
                }));
                return rx;
            }
            let busy_at = q.busy.now(Instant::now());
            q.waiting.push(Queued { job, busy_at, tx });
            let fills_batch = q.waiting.len() == MAX_BATCH;
            if !std::mem::replace(&mut q.running, true) {
                drop(q);
                // Made before the task: a task dropped before its first poll
                // (a runtime shutting down) still marks the lane idle.
                let running = Running {
                    lanes: self.clone(),
                    lane,
                    finished: false,
                };
                tokio::spawn(run_batches(running));
            } else if fills_batch {
                // A whole batch waits: it may leave beside the ones in flight.
                self.lanes[lane].wake.notify_one();
            }
            return rx;
        }
        unreachable!("a store has at least one connection")
    }

    /// Charges `batch` on lane `lane` by its requests' deadlines, connecting
    /// included, and hands each request its answer (or, at its own
    /// deadline, a timeout). Runs on the Redis I/O thread, so the budget
    /// measures Redis, not the application's runtime.
    async fn send_batch(self: Arc<Self>, lane: usize, mut batch: Batch) {
        lock(&self.lanes[lane].queue).busy.begin(Instant::now());
        // The call ended: whether the store answered it in time.
        let ended = |answered: bool| {
            let mut q = lock(&self.lanes[lane].queue);
            q.busy.end(Instant::now());
            q.failing = !answered;
        };
        batch.start();
        let (deadline, budget) = batch.deadline();
        let conn = match batch.by_deadlines(self.open(lane, deadline, budget)).await {
            Some(Ok(conn)) => conn,
            Some(Err(e)) => {
                ended(false);
                return batch.deliver(Err(e));
            }
            None => return ended(false),
        };
        // Connecting may have taken a while: callers that gave up meanwhile
        // are not charged.
        batch.drop_abandoned();
        if batch.jobs.is_empty() {
            return ended(true);
        }
        let (deadline, budget) = batch.deadline();
        let (script, cmd) = batch::command(&batch.jobs);
        let mut c = conn.clone();
        let sent = async move {
            Call::Eval { script, cmd: &cmd }
                .send::<Vec<Value>>(&mut c)
                .await
        };
        let reply = batch
            .by_deadlines(self.answer(&conn, deadline, budget, sent))
            .await;
        ended(reply.as_ref().is_some_and(Result::is_ok));
        let Some(reply) = reply else { return };
        let answers = reply.and_then(|reply| batch::answers(&reply, &batch.jobs));
        if answers.as_ref().is_ok_and(|a| a.iter().any(is_readonly)) {
            // A demoted primary: the next connection finds the new one
            // (through Sentinel), or fails again.
            conn.close();
        }
        batch.deliver(answers);
    }
}

fn is_readonly(answer: &JobReply) -> bool {
    answer.as_ref().is_err_and(|e| e.kind() == "readonly")
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
            let mut q = lock(&self.lanes.lanes[self.lane].queue);
            q.waiting.clear();
            q.running = false;
        }
    }
}

/// Sends lane `lane`'s batches until its queue is empty and every reply is in.
async fn run_batches(mut running: Running) {
    let lanes = running.lanes.clone();
    let lane = &lanes.lanes[running.lane];
    let mut in_flight = FuturesUnordered::new();
    // Let every request that is ready to run join the first batch: one pass
    // of the scheduler, never a timer.
    tokio::task::yield_now().await;
    loop {
        // A batch leaves when none is in flight (everything that queued
        // meanwhile goes with it), or when a whole batch waits beside those
        // in flight (Redis is far, or the load outgrows one call per round trip).
        if in_flight.len() < BATCHES_IN_FLIGHT {
            let mut batch = Batch::default();
            let took = {
                let mut q = lock(&lane.queue);
                if q.waiting.is_empty() && in_flight.is_empty() {
                    q.running = false;
                    running.finished = true;
                    return;
                }
                let take = in_flight.is_empty() || q.waiting.len() >= MAX_BATCH;
                if take {
                    batch.take(&mut q);
                }
                take
            };
            // Requests whose budget ran out waiting for the store are
            // answered now and never sent.
            batch.expire();
            if took {
                // A batch whose callers had all given up is dropped; either
                // way, the queue is looked at again (waiting here instead
                // would leave the next charges without a runner).
                if !batch.jobs.is_empty() {
                    in_flight.push(super::io::spawn(
                        lanes.clone().send_batch(running.lane, batch),
                    ));
                }
                continue;
            }
        }
        // Only waits with a batch in flight: for it to come back, or (with
        // room for another) for a whole batch to queue.
        let room = in_flight.len() < BATCHES_IN_FLIGHT;
        tokio::select! {
            biased;
            Some(_) = in_flight.next() => {}
            () = lane.wake.notified(), if room => {}
        }
    }
}

/// A batch: its requests and, in the same order, where their answers go
/// and how much of their budget is left.
#[derive(Default)]
struct Batch {
    jobs: Vec<Job>,
    /// `None` once the request was answered (its deadline passed).
    senders: Vec<Option<Sender>>,
    /// Each request's budget left when the batch was taken: its timeout,
    /// less the time it waited for the store (see [`Batch::take`]).
    left: Vec<Duration>,
    /// Each request's deadline, once the batch started on the I/O thread.
    deadlines: Vec<Instant>,
}

impl Batch {
    /// Takes the next batch off a queue: up to [`MAX_BATCH`] requests whose
    /// callers still wait (those that gave up before their batch left are
    /// never charged). Empty if none still wait. While the store fails, each
    /// request has waited for it for as long as the lane had calls out since
    /// it queued (see [`Queue::failing`]).
    fn take(&mut self, q: &mut Queue) {
        let n = q.waiting.len().min(MAX_BATCH);
        let busy = q.busy.now(Instant::now());
        let failing = q.failing;
        for w in q.waiting.drain(..n).filter(|w| !w.tx.is_closed()) {
            let waited = if failing {
                busy.saturating_sub(w.busy_at)
            } else {
                Duration::ZERO
            };
            self.left.push(w.job.timeout.saturating_sub(waited));
            self.jobs.push(w.job);
            self.senders.push(Some(w.tx));
        }
    }

    /// Answers, and takes out, the requests with no budget left.
    fn expire(&mut self) {
        for i in 0..self.jobs.len() {
            if self.left[i].is_zero() {
                self.timed_out(i);
            }
        }
        self.drop_answered();
    }

    /// Answers request `i` with a timeout of its budget (once).
    fn timed_out(&mut self, i: usize) {
        if let Some(tx) = self.senders[i].take() {
            let _ = tx.send(Err(StoreError::Timeout(self.jobs[i].timeout)));
        }
    }

    /// Starts the requests' clocks (on the I/O thread).
    fn start(&mut self) {
        let now = Instant::now();
        self.deadlines = self.left.iter().map(|left| now + *left).collect();
    }

    /// When the last request's budget runs out, and that budget.
    fn deadline(&self) -> (Instant, Duration) {
        let i = (0..self.deadlines.len())
            .max_by_key(|&i| self.deadlines[i])
            .unwrap_or(0);
        let budget = self.jobs.get(i).map_or(Duration::ZERO, |j| j.timeout);
        (
            self.deadlines.get(i).copied().unwrap_or_else(Instant::now),
            budget,
        )
    }

    /// Waits for `fut`, answering each request with a timeout when its own
    /// deadline passes first; `None` if every request was answered so.
    async fn by_deadlines<T>(&mut self, fut: impl Future<Output = T>) -> Option<T> {
        tokio::pin!(fut);
        loop {
            let next = self
                .senders
                .iter()
                .zip(&self.deadlines)
                .filter(|(tx, _)| tx.is_some())
                .map(|(_, d)| *d)
                .min()?;
            tokio::select! {
                biased;
                out = &mut fut => return Some(out),
                () = tokio::time::sleep_until(next) => {
                    let now = Instant::now();
                    for i in 0..self.jobs.len() {
                        if self.deadlines[i] <= now {
                            self.timed_out(i);
                        }
                    }
                }
            }
        }
    }

    /// Takes out, in place and in order, the requests whose callers gave up
    /// since the batch was taken, or that were answered.
    fn drop_abandoned(&mut self) {
        for tx in &mut self.senders {
            if tx.as_ref().is_some_and(Sender::is_closed) {
                *tx = None;
            }
        }
        self.drop_answered();
    }

    fn drop_answered(&mut self) {
        let open: SmallVec<[bool; MAX_BATCH]> = self.senders.iter().map(Option::is_some).collect();
        fn keep<T>(v: &mut Vec<T>, open: &[bool]) {
            let mut keep = open.iter().copied();
            v.retain(|_| keep.next().unwrap_or(true));
        }
        keep(&mut self.jobs, &open);
        keep(&mut self.left, &open);
        keep(&mut self.deadlines, &open);
        self.senders.retain(Option::is_some);
    }

    /// Hands each request still waiting its answer, or the whole batch's error.
    fn deliver(self, answers: Result<Vec<JobReply>, StoreError>) {
        match answers {
            Ok(answers) => {
                for (tx, a) in self.senders.into_iter().zip(answers) {
                    if let Some(tx) = tx {
                        let _ = tx.send(a);
                    }
                }
            }
            Err(e) => {
                for tx in self.senders.into_iter().flatten() {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}
