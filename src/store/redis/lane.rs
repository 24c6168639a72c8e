//! A role's connections ("lanes"), each one redis-rs multiplexed
//! connection, and what travels on them: batched charges and single calls.
//!
//! Concurrent charges travel together: each lane has a queue and, while
//! anything waits on it, a runner task ([`super::runner`]) spawned on the
//! runtime of the request that found the lane idle. The runner yields once
//! to the scheduler, so every request that is ready to run joins, then
//! sends everything queued (up to [`MAX_BATCH`](super::batch::MAX_BATCH))
//! as one `EVALSHA` of `lua/charge.lua`. While that call is in flight,
//! charges queue and leave together the moment it comes back (the first
//! one queued when no batch is in flight wakes the runner at once). Only
//! when a whole batch waits does another leave beside those in flight (at
//! most [`BATCHES_IN_FLIGHT`], pipelined on the connection): Redis is far,
//! or the load outgrows one call per round trip. An idle service therefore sends every request alone
//! and at once, and a busy one as few calls as its round trips allow. No
//! request ever waits for a timer or for a batch to fill: at most for the
//! call before it. Other calls (settlements, status reads, concurrency
//! slots, `TIME`, the extras' pipelines) go on the same connection, each
//! alone and at once.
//!
//! Why one call in flight rather than several: each call costs the
//! application a fixed amount (a hand-off to the connection, a reply to
//! parse, system calls), so fewer, larger calls cost less per request.
//! `scripts/bench.sh` measured the difference (see `docs/performance.md`).
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
//! - A request's budget (its store timeout) runs from when its call is
//!   written. While the store fails (the lane's last call got an error or
//!   no answer in time), it runs from when the request was queued: the wait
//!   behind calls the store does not answer is the store's, and a request
//!   whose budget ran out in the queue is answered with a timeout and never
//!   sent. Behind calls the store answers, a long queue is this instance's
//!   own volume, never a reason to fail open.
//! - A runner reads replies before it judges deadlines, and judges a
//!   deadline only after the runtime has turned its reactor since the
//!   deadline passed: a reply already in the socket is read, however late
//!   a saturated runtime polls the runner. Its answer comes late; it never
//!   becomes a timeout, so the limiter never fails open because the
//!   instance is busy.
//! - A lane's queue holds at most [`MAX_QUEUED`] requests; past that a charge
//!   fails at once with [`StoreError::Backlog`]: the instance asks more of
//!   its store than it answers (the layer answers it as an overload, never
//!   by admitting it without limit), rather than queueing without bound.
//! - A runner dropped mid-way (its runtime shut down) answers what it held
//!   and what was queued with an error, and its connection goes with it, so
//!   a store shared by several runtimes keeps working from the others.

use super::batch::{Job, JobReply};
use super::error::redis_error;
use super::eviction::EvictionCheck;
use super::node::{Link, Node};
use crate::error::StoreError;
use redis::aio::ConnectionLike;
use redis::{self, Cmd, FromRedisValue, RedisError, RedisResult, Script, Value};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Batches one lane may have in flight at once.
pub(crate) const BATCHES_IN_FLIGHT: usize = 4;

/// The most requests waiting on one lane.
pub(crate) const MAX_QUEUED: usize = 4096;

/// The most requests waiting on one lane that a shadow charge (one no
/// request waits for) may join: an eighth of the queue, so shadow policies
/// never crowd out the charges requests wait for.
pub(crate) const MAX_QUEUED_SHADOW: usize = MAX_QUEUED / 8;

/// Where a charge's answer goes.
pub(super) type Sender = oneshot::Sender<JobReply>;

/// What a single call answers.
pub(super) type CallReply = Result<Value, StoreError>;

/// A queued charge: the request, when it was queued, where its answer goes.
pub(super) struct Queued {
    pub(super) job: Job,
    pub(super) queued_at: Instant,
    pub(super) tx: Sender,
}

/// A queued single call.
pub(super) struct QueuedCall {
    /// What to send; `None` asks only for the lane's connection
    /// ([`Lanes::connect`]), answered once it is open.
    pub(super) request: Option<Request>,
    pub(super) timeout: Duration,
    pub(super) queued_at: Instant,
    pub(super) tx: oneshot::Sender<CallReply>,
}

/// The connections of one role: to the primary (or a Sentinel-named
/// primary), or to one replica.
pub(crate) struct Lanes {
    pub(super) node: Arc<Node>,
    /// Checked on every new connection (the primary's), or not at all.
    pub(super) eviction: Option<EvictionCheck>,
    pub(super) response_timeout: Duration,
    pub(super) lanes: Box<[Lane]>,
    pub(super) next: AtomicUsize,
}

pub(super) struct Lane {
    pub(super) queue: Mutex<Queue>,
}

#[derive(Default)]
pub(super) struct Queue {
    pub(super) charges: Vec<Queued>,
    pub(super) calls: Vec<QueuedCall>,
    /// Whether a runner task serves this lane.
    pub(super) running: bool,
    /// The lane's connection while no runner holds it.
    pub(super) link: Option<Link>,
    /// Whether the lane's last call failed (an error, or no answer in
    /// time): the wait in the queue then spends the budget of the requests
    /// queued.
    pub(super) failing: bool,
    /// Wakes the runner when a call, or a whole batch, waits.
    pub(super) waker: Option<Waker>,
    /// Whether the runner sends a charge as soon as it sees one (no batch
    /// of charges is in flight): the first charge queued then wakes it.
    pub(super) wake_on_charge: bool,
}

pub(super) fn lock(q: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One call other than a charge, owned: it waits in a queue.
pub(crate) enum Request {
    /// A script: `EVALSHA`, loaded and sent again after `NOSCRIPT`.
    Eval {
        script: &'static Script,
        cmd: Cmd,
    },
    Command(Cmd),
    /// Several commands in one round trip (the extras, never on a request's path).
    #[cfg(any(
        feature = "advisor",
        feature = "runtime-limits",
        feature = "coordinated"
    ))]
    Pipeline(redis::Pipeline),
}

impl Request {
    /// Sends the call once on `conn`. A script call is re-sent only after
    /// `NOSCRIPT`, when nothing ran (the script is loaded first); any other
    /// error is returned, never retried. A pipeline's replies come as one
    /// array.
    pub(crate) async fn send(&self, conn: &mut (impl ConnectionLike + Send)) -> RedisResult<Value> {
        match self {
            Request::Eval { script, cmd } => match cmd.query_async(conn).await {
                Err(e) if is_noscript(&e) => {
                    script.load_async(conn).await?;
                    cmd.query_async(conn).await
                }
                r => r,
            },
            Request::Command(cmd) => cmd.query_async(conn).await,
            #[cfg(any(
                feature = "advisor",
                feature = "runtime-limits",
                feature = "coordinated"
            ))]
            Request::Pipeline(pipe) => pipe.query_async::<Vec<Value>>(conn).await.map(Value::Array),
        }
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A reply as `T`, or the store error its shape makes it.
pub(crate) fn convert<T: FromRedisValue>(reply: Value) -> Result<T, StoreError> {
    redis::from_redis_value(reply).map_err(|e| redis_error(e.into()))
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
                    queue: Mutex::default(),
                })
                .collect(),
            next: AtomicUsize::new(0),
        }
    }
}

/// The error of a request whose runner was dropped before answering it.
pub(crate) fn dropped() -> StoreError {
    StoreError::Unavailable(
        "the redis connection carrying this call was dropped (its runtime shut down)".into(),
    )
}
