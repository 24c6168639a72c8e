//! Where a Redis store's commands go: [`Connections`], either a few shared
//! multiplexed connections ("lanes") to one server, or (with the `cluster`
//! feature) one Redis Cluster connection. Scripts, replies and errors are the
//! same for both; only how a call reaches its node differs.
//!
//! Checking a connection out of `deadpool_redis` per request costs a recycle
//! round trip (`UNWATCH` + `PING`). Instead each lane keeps one
//! `MultiplexedConnection`: clones share its socket, concurrent commands are
//! pipelined on it, and each reply is matched to its own command even when
//! the caller's future was dropped mid-call (the late reply is discarded). A
//! lane whose connection failed is emptied and refilled from the pool, so a
//! broken or demoted (`READONLY`) connection is never reused.

use super::batch::{Job, JobReply, Queue};
use super::wire::{Endpoint, Wire};
use crate::error::StoreError;
use crate::store::StoreFuture;
use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::{
    self, Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Script, Value,
};
use deadpool_redis::{Connection, Pool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;

/// Checks a freshly made connection before it serves traffic.
pub(crate) type Vet =
    dyn Fn(AnyConnection) -> crate::limiter::BoxFuture<Result<(), StoreError>> + Send + Sync;

/// The connections of one role (a primary, a replica, or a whole cluster).
pub(crate) enum Connections {
    /// Long-lived multiplexed connections to one standalone server.
    Lanes(Arc<Lanes>),
    /// One shared connection to a Redis Cluster, which routes each call to
    /// the node serving its key's hash slot.
    #[cfg(feature = "cluster")]
    Cluster(Box<super::cluster::ClusterLane>),
}

/// One call: a script (sent as `EVALSHA`, reloaded after `NOSCRIPT`) or a plain command.
#[derive(Clone, Copy)]
pub(crate) enum Call<'a> {
    /// An `EVALSHA` of `script` built by the caller (arguments written
    /// straight into one buffer, no allocation per argument).
    Eval {
        script: &'a Script,
        cmd: &'a Cmd,
    },
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
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load_async(conn).await?;
                    cmd.query_async(conn).await
                }
                r => r,
            },
            Call::Command(cmd) => cmd.query_async(conn).await,
        }
    }
}

impl Connections {
    /// Charges `job` within `budget`: queued to travel with concurrent
    /// charges on a lane (see [`super::batch`]), waiting on its reply as
    /// [`RedisStore::charge`](super::RedisStore) does inside a runtime; on a
    /// cluster, sent alone to its key's node (which pipelines it with other
    /// calls to that node).
    pub(crate) async fn charge(&self, job: Job, budget: Duration) -> JobReply {
        match self {
            Connections::Lanes(lanes) => StoreFuture::reply(lanes.submit(job), budget, Err).await,
            #[cfg(feature = "cluster")]
            Connections::Cluster(cluster) => {
                super::within(budget, async {
                    let jobs = std::slice::from_ref(&job);
                    let (script, cmd) = super::batch::command(jobs, false);
                    let reply: Vec<Value> = cluster.run(Call::Eval { script, cmd: &cmd }).await?;
                    super::batch::answers(&reply, jobs)?
                        .pop()
                        .expect("answers checked the length")
                })
                .await
            }
        }
    }

    /// Runs `call` on these connections (no time limit: the caller bounds it).
    pub(crate) async fn run<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T, StoreError> {
        match self {
            Connections::Lanes(lanes) => lanes.run_on(lanes.next_lane(), call).await,
            #[cfg(feature = "cluster")]
            Connections::Cluster(cluster) => cluster.run(call).await,
        }
    }

    /// Sends `pipe` in one round trip within `budget` (the coordinated mode's
    /// sync). A pipeline over many clients' keys spans many hash slots, which a
    /// cluster cannot route: the layer refuses that combination when it is built.
    pub(crate) async fn query_pipeline(
        &self,
        pipe: &redis::Pipeline,
        budget: std::time::Duration,
    ) -> Result<Vec<redis::Value>, StoreError> {
        match self {
            Connections::Lanes(lanes) => lanes.query_pipeline(pipe, budget).await,
            #[cfg(feature = "cluster")]
            Connections::Cluster(_) => Err(StoreError::Unavailable(
                "the coordinated mode cannot sync through a Redis Cluster".into(),
            )),
        }
    }
}

/// A connection of either kind.
#[derive(Clone)]
pub(crate) enum AnyConnection {
    Standalone(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(deadpool_redis::cluster::ClusterConnection),
}

impl ConnectionLike for AnyConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AnyConnection::Standalone(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            AnyConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            AnyConnection::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            AnyConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConnection::Standalone(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            AnyConnection::Cluster(c) => c.get_db(),
        }
    }
}

pub(crate) struct Lanes {
    pool: Pool,
    lanes: Box<[Mutex<Option<MultiplexedConnection>>]>,
    /// Each lane's charges waiting to travel together (see [`super::batch`]).
    queues: Box<[Mutex<Queue>]>,
    /// Wakes a lane's runner waiting on its own socket when a new batch queues.
    wake: Box<[Notify]>,
    /// Where each lane's own socket for charges connects (plain TCP);
    /// `None`: charges go through redis-rs too.
    endpoint: Option<Endpoint>,
    next: AtomicUsize,
    vet: Option<Arc<Vet>>,
}

impl Lanes {
    pub(crate) fn new(
        pool: Pool,
        n: usize,
        endpoint: Option<Endpoint>,
        vet: Option<Arc<Vet>>,
    ) -> Self {
        Self {
            pool,
            lanes: (0..n.max(1)).map(|_| Mutex::new(None)).collect(),
            queues: (0..n.max(1)).map(|_| Mutex::default()).collect(),
            wake: (0..n.max(1)).map(|_| Notify::new()).collect(),
            endpoint,
            next: AtomicUsize::new(0),
            vet,
        }
    }

    /// The lanes' charge queues.
    pub(crate) fn queues(&self) -> &[Mutex<Queue>] {
        &self.queues
    }

    /// Lane `i`'s runner wake-up.
    pub(crate) fn wake(&self, i: usize) -> &Notify {
        &self.wake[i]
    }

    /// Where the lanes' own sockets connect, if they have them.
    pub(crate) fn endpoint(&self) -> Option<&Endpoint> {
        self.endpoint.as_ref()
    }

    /// Opens lane `i`'s own socket for charges. The server is vetted first,
    /// through the lane's redis-rs connection (made now if it has none).
    pub(crate) async fn connect_wire(&self, i: usize) -> Result<Wire, StoreError> {
        let endpoint = self
            .endpoint
            .as_ref()
            .expect("only lanes with an endpoint have their own socket");
        self.get_lane(i).await?;
        endpoint.connect().await
    }

    /// The next lane in turn.
    pub(crate) fn next_lane(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()
    }

    /// Runs `call` on lane `lane`'s connection.
    pub(crate) async fn run_on<T: FromRedisValue>(
        &self,
        lane: usize,
        call: Call<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.get_lane(lane).await?;
        call.send(&mut conn).await.map_err(|e| self.failed(lane, e))
    }

    /// The store error for `err` on lane `lane`, dropping the lane's
    /// connection first if `err` may have broken it.
    fn failed(&self, lane: usize, err: RedisError) -> StoreError {
        if breaks_connection(&err) {
            self.discard(lane);
        }
        redis_error(err)
    }

    /// Lane `i`'s connection, connecting (and vetting) it if it has none.
    pub(crate) async fn get_lane(&self, i: usize) -> Result<MultiplexedConnection, StoreError> {
        if let Some(c) = self.lanes[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(c);
        }
        let conn = self.pool.get().await.map_err(pool_error)?;
        // Out of the pool for good: the lane owns it and drops it when it breaks.
        let conn = Connection::take(conn);
        if let Some(vet) = &self.vet {
            vet(AnyConnection::Standalone(conn.clone())).await?;
        }
        *self.lanes[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    /// Sends `pipe` in one round trip within `budget` (used by the coordinated
    /// mode's periodic sync; never on a request's path).
    pub(crate) async fn query_pipeline(
        &self,
        pipe: &redis::Pipeline,
        budget: std::time::Duration,
    ) -> Result<Vec<redis::Value>, StoreError> {
        let call = async {
            let i = self.next_lane();
            let mut conn = self.get_lane(i).await?;
            pipe.query_async::<Vec<redis::Value>>(&mut conn)
                .await
                .map_err(|e| self.failed(i, e))
        };
        tokio::time::timeout(budget, call)
            .await
            .map_err(|_| StoreError::Timeout(budget))?
    }

    /// Drops lane `i`'s connection after an error that may have broken it.
    pub(crate) fn discard(&self, i: usize) {
        self.lanes[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Whether a connection that produced `err` must not be used again.
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
        || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

pub(crate) fn redis_error(err: RedisError) -> StoreError {
    if err.is_timeout() {
        StoreError::Unavailable(format!("redis timed out: {err}"))
    } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
        StoreError::Unavailable(format!("redis connection failed: {err}"))
    } else {
        StoreError::Response {
            code: err.code().map(str::to_owned),
            message: err.to_string(),
        }
    }
}

fn pool_error(err: deadpool_redis::PoolError) -> StoreError {
    match err {
        deadpool_redis::PoolError::Backend(e) => redis_error(e),
        other => StoreError::Unavailable(format!("redis pool: {other}")),
    }
}
