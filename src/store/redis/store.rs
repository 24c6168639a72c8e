//! [`RedisStore`]: the [`Store`] over Redis, its primary and replicas.

#[cfg(feature = "cluster")]
use super::cluster;
#[cfg(feature = "cluster")]
use super::io;
use super::lane::{self, Lanes, Request};
use super::{batch, eviction, keys, reply, scripts};
use crate::algorithm;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::store::backend::Store;
use crate::store::call::{Charge, Settle};
use crate::store::future::StoreFuture;
use crate::store::slots::{Acquire, Occupancy, Release};
use redis::{self, FromRedisValue};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whose clock decides when windows start and end.
///
/// Whichever it is, every TTL the store sets is relative to the time its
/// script was given, so no offset between the application's clock and
/// Redis's deletes or shortens state (the layers measure the offset: see
/// [`RateLimitLayer::connect`](crate::RateLimitLayer::connect)). Concurrency
/// slots are leased by Redis `TIME` in both cases: a lease is a span of
/// real time every instance must agree on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeSource {
    /// The layer's [`Clock`](crate::clock::Clock), passed to each script (the
    /// default). Instances must keep their clocks in sync (NTP) for windows to
    /// line up; tests can move time, and a [`ManualClock`](crate::clock::ManualClock)
    /// works with this store.
    #[default]
    Application,
    /// Redis `TIME`, read inside each script: one clock for the whole fleet,
    /// whatever the instances' clocks say. The layer's clock is then ignored
    /// by the store, so tests can no longer move time.
    Redis,
}

/// The Redis store. Clones share connections.
#[derive(Clone)]
pub struct RedisStore {
    pub(super) inner: Arc<Inner>,
}

/// What a store's clones share (made by its builder).
pub(super) struct Inner {
    /// The primary's connections, or the cluster's.
    pub(super) primary: Primary,
    /// Connections that serve [`Store::status`] reads.
    pub(super) replicas: Vec<Arc<Lanes>>,
    pub(super) next_replica: AtomicUsize,
    pub(super) prefix: String,
    pub(super) time: TimeSource,
    /// The shard name: `host:port/db` of the primary, never its credentials.
    pub(super) name: String,
    /// Where the store connects, as it may be shown (no password).
    pub(super) shown: String,
}

/// Where a store's writes go.
pub(crate) enum Primary {
    /// Long-lived multiplexed connections to one server.
    Lanes(Arc<Lanes>),
    /// One shared connection to a Redis Cluster, which routes each call to
    /// the node serving its key's hash slot.
    #[cfg(feature = "cluster")]
    Cluster(Box<cluster::ClusterLane>),
}

impl Primary {
    /// Charges `job`: queued to travel with concurrent charges on a lane
    /// (refused when `cap` wait already); on a cluster, sent alone to its
    /// key's node (which pipelines it with other calls to that node).
    async fn charge(&self, job: batch::Job, cap: usize) -> batch::JobReply {
        match self {
            Primary::Lanes(lanes) => lanes
                .submit(job, cap)
                .await
                .unwrap_or_else(|_| Err(lane::dropped())),
            #[cfg(feature = "cluster")]
            Primary::Cluster(cluster) => {
                let budget = job.timeout;
                let jobs = std::slice::from_ref(&job);
                let (script, cmd) = batch::command(jobs);
                let reply: Vec<redis::Value> =
                    cluster.run(&Request::Eval { script, cmd }, budget).await?;
                batch::answers(&reply, jobs)?
                    .pop()
                    .ok_or_else(|| StoreError::Protocol("no answer to a charge".into()))?
            }
        }
    }

    /// Runs `request` within `budget`.
    async fn run<T: FromRedisValue>(
        &self,
        request: Request,
        budget: Duration,
    ) -> Result<T, StoreError> {
        match self {
            Primary::Lanes(lanes) => lanes.run(request, budget).await,
            #[cfg(feature = "cluster")]
            Primary::Cluster(cluster) => cluster.run(&request, budget).await,
        }
    }

    #[cfg(any(feature = "advisor", feature = "runtime-limits"))]
    /// Sends `pipe` in one round trip within `budget` (shared limits and
    /// the advisor's fleet report, whose keys share one hash slot). A
    /// cluster is refused when those are configured.
    pub(crate) async fn query_pipeline(
        &self,
        pipe: redis::Pipeline,
        budget: Duration,
    ) -> Result<Vec<redis::Value>, StoreError> {
        match self {
            Primary::Lanes(lanes) => lanes.run(Request::Pipeline(pipe), budget).await,
            #[cfg(feature = "cluster")]
            Primary::Cluster(_) => Err(StoreError::Unavailable(
                "a pipeline over many hash slots cannot go through a Redis Cluster".into(),
            )),
        }
    }

    #[cfg(feature = "coordinated")]
    /// Sends single-key commands in one round trip per node within
    /// `budget`: one pipeline to a standalone primary; on a cluster, each
    /// command to its key's node, multiplexed with the others bound there.
    /// The answer to each command, in order.
    pub(crate) async fn spread(
        &self,
        cmds: &[redis::Cmd],
        budget: Duration,
    ) -> Vec<Result<redis::Value, StoreError>> {
        match self {
            Primary::Lanes(lanes) => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                match lanes
                    .run::<Vec<redis::Value>>(Request::Pipeline(pipe), budget)
                    .await
                {
                    Ok(values) if values.len() == cmds.len() => values
                        .into_iter()
                        .map(|v| match v {
                            redis::Value::ServerError(e) => {
                                Err(super::error::redis_error(e.into()))
                            }
                            v => Ok(v),
                        })
                        .collect(),
                    Ok(_) => failed_all(
                        cmds.len(),
                        StoreError::Protocol("a pipeline reply of another length".into()),
                    ),
                    Err(e) => failed_all(cmds.len(), e),
                }
            }
            #[cfg(feature = "cluster")]
            Primary::Cluster(cluster) => cluster.spread(cmds, budget).await,
        }
    }
}

#[cfg(feature = "coordinated")]
/// `n` answers, each the error `e` (every command of a call that failed whole).
pub(crate) fn failed_all<T>(n: usize, e: StoreError) -> Vec<Result<T, StoreError>> {
    (0..n).map(|_| Err(e.clone())).collect()
}

impl RedisStore {
    /// Connects now and returns the primary's `maxmemory-policy` (for start-up
    /// checks and health endpoints). Not needed: the store connects lazily.
    /// In a cluster, one node answers.
    pub async fn eviction_policy(&self) -> Result<String, StoreError> {
        let budget = Duration::from_secs(5);
        let v: Vec<String> = self
            .call(|inner| async move {
                let cmd = eviction::eviction_policy_cmd();
                inner.primary.run(Request::Command(cmd), budget).await
            })
            .await?;
        eviction::policy_from_reply(&v)
    }

    /// The store's identity as a shard of a [`ShardedStore`](crate::store::ShardedStore):
    /// its primary's `host:port/db` (the first seed node's for a cluster,
    /// `sentinel/NAME/db` for a Sentinel-named primary), never its credentials.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::new("redis://user:secret@10.0.0.1:6380/2").unwrap();
    /// assert_eq!(store.shard_name(), "10.0.0.1:6380/2");
    /// ```
    pub fn shard_name(&self) -> &str {
        &self.inner.name
    }

    #[cfg(any(feature = "advisor", feature = "runtime-limits"))]
    /// Sends `pipe` to the primary in one round trip within `budget`
    /// (shared limits, the advisor's fleet report).
    pub(crate) async fn query_pipeline(
        &self,
        pipe: redis::Pipeline,
        budget: Duration,
    ) -> Result<Vec<redis::Value>, StoreError> {
        self.call(|inner| async move { inner.primary.query_pipeline(pipe, budget).await })
            .await
    }

    #[cfg(feature = "coordinated")]
    /// Sends single-key commands in one round trip per node (one pipeline
    /// to a standalone primary; on a cluster, multiplexed per node): the
    /// coordinated mode's sync. The answer to each command.
    pub(crate) async fn spread(
        &self,
        cmds: Vec<redis::Cmd>,
        budget: Duration,
    ) -> Vec<Result<redis::Value, StoreError>> {
        let n = cmds.len();
        self.call(|inner| async move { Ok(inner.primary.spread(&cmds, budget).await) })
            .await
            .unwrap_or_else(|e| failed_all(n, e))
    }

    /// A store call as the store's answer, made by `call` on what the store
    /// shares: run by the lanes' runners on the caller's runtime, or, for a
    /// Redis Cluster, on the Redis I/O thread (see [`io`]).
    pub(super) fn call<T, F, Fut>(&self, call: F) -> StoreFuture<Result<T, StoreError>>
    where
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        let fut = call(self.inner.clone());
        match &self.inner.primary {
            Primary::Lanes(_) => StoreFuture::pending(fut),
            #[cfg(feature = "cluster")]
            Primary::Cluster(_) => io::store_future(fut),
        }
    }

    #[cfg(any(feature = "advisor", feature = "runtime-limits"))]
    /// Whether this store talks to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if let Primary::Cluster(_) = self.inner.primary {
            return true;
        }
        false
    }

    /// The Redis key holding `key`'s state for the limiter `namespace`.
    pub fn redis_key(
        &self,
        namespace: &crate::store::call::Namespace,
        key: &crate::key::Key,
    ) -> String {
        keys::redis_key(&self.inner.prefix, namespace, key)
    }

    /// The time sent to a script: the application's, or `None` for Redis `TIME`.
    fn sent_now(&self, now_ms: u64) -> Option<u64> {
        match self.inner.time {
            TimeSource::Application => Some(now_ms),
            TimeSource::Redis => None,
        }
    }

    /// A one-request `EVALSHA` of `script` (settle, status) on `call`'s
    /// key at `now_ms`: its keys, time and the number of quotas.
    fn script_cmd(
        &self,
        script: &'static redis::Script,
        call: &Charge<'_>,
        now_ms: u64,
    ) -> (redis::Cmd, Option<u64>) {
        let sent_now = self.sent_now(now_ms);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(reply::key_count(call.policy));
        reply::keys(&mut cmd, &self.hash_key(call), call.policy);
        reply::time_arg(&mut cmd, sent_now);
        reply::count_arg(&mut cmd, call.policy);
        (cmd, sent_now)
    }

    fn hash_key(&self, call: &Charge<'_>) -> keys::HashKey {
        keys::hash_key(&self.inner.prefix, call.namespace, call.key)
    }
}

/// Runs one `EVALSHA` of `script` on `primary` within `budget`.
pub(super) async fn invoke<T: FromRedisValue>(
    primary: &Primary,
    script: &'static redis::Script,
    cmd: redis::Cmd,
    budget: Duration,
) -> Result<T, StoreError> {
    primary.run(Request::Eval { script, cmd }, budget).await
}

impl RedisStore {
    /// Charges `call`, queued on a lane where fewer than `cap` wait.
    fn charge_within(
        &self,
        call: &Charge<'_>,
        cap: usize,
    ) -> StoreFuture<Result<Decision, StoreError>> {
        let job = batch::Job {
            hash_key: self.hash_key(call),
            policy: call.policy.clone(),
            now: self.sent_now(call.now_ms),
            cost: call.cost,
            units: call.units,
            wait_ms: call.wait_ms,
            timeout: call.timeout,
        };
        self.call(|inner| async move { inner.primary.charge(job, cap).await })
    }
}

impl Store for RedisStore {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.charge_within(call, lane::MAX_QUEUED)
    }

    /// Queued only while fewer than an eighth of a lane's cap wait: a
    /// shadow policy never crowds out the charges requests wait for.
    fn charge_shadow(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.charge_within(call, lane::MAX_QUEUED_SHADOW)
    }

    fn settle(&self, call: &Settle<'_>) -> StoreFuture<Result<(), StoreError>> {
        let c = &call.charge;
        let (mut cmd, _) = self.script_cmd(&scripts::SETTLE, c, call.now_ms);
        for (q, s) in call.each() {
            reply::quota_args(&mut cmd, q);
            // A bucket past the charge's window takes no debt (the script
            // does not know the window): sent as settled already.
            let actual = if algorithm::takes_debt(q, &s, call.now_ms) {
                s.actual
            } else {
                s.actual.min(s.reserved)
            };
            cmd.arg(s.window_id)
                .arg(s.charged_at)
                .arg(s.reserved)
                .arg(actual);
        }
        reply::refusal_args(&mut cmd, c.policy);
        let budget = c.timeout;
        self.call(|inner| async move {
            let _written: i64 = invoke(&inner.primary, &scripts::SETTLE, cmd, budget).await?;
            Ok(())
        })
    }

    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        // Read-only: a replica may answer. Time is the application's, as for
        // a charge (or Redis TIME); a window past its reset is discarded.
        let (mut cmd, sent_now) = self.script_cmd(&scripts::STATUS, call, call.now_ms);
        for q in call.policy.quotas() {
            reply::quota_args(&mut cmd, q);
        }
        reply::refusal_args(&mut cmd, call.policy);
        let policy = call.policy.clone();
        let budget = call.timeout;
        self.call(|inner| async move {
            let script = &*scripts::STATUS;
            let deadline = tokio::time::Instant::now() + budget;
            let r: Vec<i64> = match inner.replicas.len() {
                0 => invoke(&inner.primary, script, cmd, budget).await?,
                n => {
                    let i = inner.next_replica.fetch_add(1, Ordering::Relaxed) % n;
                    let request = Request::Eval {
                        script,
                        cmd: cmd.clone(),
                    };
                    match inner.replicas[i].run(request, budget).await {
                        Ok(r) => r,
                        // A read is safe to repeat: the primary answers
                        // within what is left of the budget.
                        Err(_) => {
                            let left =
                                deadline.saturating_duration_since(tokio::time::Instant::now());
                            if left.is_zero() {
                                return Err(StoreError::Timeout(budget));
                            }
                            invoke(&inner.primary, script, cmd, left).await?
                        }
                    }
                }
            };
            reply::decode(&policy, None, sent_now, &r)
        })
    }

    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>> {
        self.acquire_slot(call)
    }

    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.release_slot(call)
    }

    fn keeps_slots(&self) -> bool {
        true
    }

    /// Every policy: its scripts book turns for a policy that waits and
    /// keep penalty boxes, beside the quotas' state.
    fn check_policy(&self, _policy: &crate::Policy) -> Result<(), crate::error::ConfigError> {
        Ok(())
    }

    /// Each call's deadline runs from when its batch (or the call alone)
    /// leaves for Redis, connecting included.
    fn bounds_calls(&self) -> bool {
        true
    }

    /// Where it connects (its URL or sentinels, never credentials) and its key prefix.
    fn identity(&self) -> Option<String> {
        Some(format!("redis {} {}", self.inner.shown, self.inner.prefix))
    }

    /// Redis `TIME` on the primary (on a cluster, on one node); `None`
    /// with [`TimeSource::Redis`], whose windows follow Redis's clock
    /// whatever the layer's says.
    fn time(&self) -> StoreFuture<Result<Option<u64>, StoreError>> {
        if self.inner.time == TimeSource::Redis {
            return StoreFuture::ready(Ok(None));
        }
        self.call(|inner| async move {
            let (secs, micros): (u64, u64) = inner
                .primary
                .run(Request::Command(redis::cmd("TIME")), Duration::from_secs(1))
                .await?;
            Ok(Some(secs * 1_000 + micros / 1_000))
        })
    }

    /// Opens every connection to the primary (or the cluster) and to each
    /// replica, each within the connect timeout. The first failure is
    /// returned once all have tried.
    fn connect(&self) -> StoreFuture<Result<(), StoreError>> {
        self.call(|inner| async move {
            let mut result = match &inner.primary {
                Primary::Lanes(lanes) => lanes.connect().await,
                #[cfg(feature = "cluster")]
                Primary::Cluster(cluster) => cluster.connect().await,
            };
            for replica in &inner.replicas {
                result = result.and(replica.connect().await);
            }
            result
        })
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.inner.shown)
            .field("name", &self.inner.name)
            .field("prefix", &self.inner.prefix)
            .field("replicas", &self.inner.replicas.len())
            .field("time", &self.inner.time)
            .finish_non_exhaustive()
    }
}
