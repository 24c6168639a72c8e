//! The Redis store: limits shared by every instance that talks to the same Redis.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::num::NonZeroU32;
//! use tower_ratelimit::{store::RedisStore, Quota, RateLimitLayer};
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .replica("redis://127.0.0.1:6380")
//!     .build()?;
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
//!     .store(store)
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! Concurrent charges travel together: each connection sends one `EVALSHA`
//! of `lua/charge.lua` for every charge waiting while its previous batch was
//! in flight (an idle service sends each charge alone, at once; see
//! [`RedisStoreBuilder::connections`]). For each request in order, the script
//! (assembled from one Lua file per algorithm) reads, decides and writes every
//! quota of its policy atomically and returns the state the decision was made
//! on; the headers are built from that reply only, by the same math the
//! memory store runs. A refund is one more script call, run in the background. All of a
//! client's state is one hash under one key (plus, for a sliding-log quota,
//! a sorted set sharing its hash tag), so every call touches one hash slot.
//!
//! With the `cluster` feature, [`RedisStore::cluster`] runs the same scripts on
//! a Redis Cluster: each call goes to the node serving its key's slot, follows
//! `MOVED`/`ASK` and keeps working after a failover, and is never sent twice
//! after an error that may have let it run (see [`RedisStore::cluster_builder`]).

mod batch;
#[cfg(feature = "cluster")]
mod cluster;
mod concurrency;
mod connection;
mod keys;
mod reply;
mod scripts;
mod wire;

use self::connection::{redis_error, AnyConnection, Call, Connections, Lanes, Vet};
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::store::{Charge, Refund, Store, StoreFuture};
use deadpool_redis::redis::aio::ConnectionLike;
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ConnectionAddr, FromRedisValue, IntoConnectionInfo,
};
use deadpool_redis::{Manager, Pool, Runtime};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whose clock decides when windows start and end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeSource {
    /// The layer's [`Clock`](crate::clock::Clock), passed to each script (the
    /// default). Instances must keep their clocks in sync (NTP); tests can move time.
    #[default]
    Application,
    /// Redis `TIME`, read inside each script: one clock for the whole fleet,
    /// whatever the instances' clocks say. The layer's clock is then ignored
    /// by the store, so tests can no longer move time.
    Redis,
}

/// What to do when Redis may evict limiter keys (`maxmemory-policy` is not `noeviction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvictionCheck {
    /// Log a warning when a connection is made (the default). Evicted state
    /// reads as a fresh window: clients get a new quota early.
    #[default]
    Warn,
    /// Refuse to use the connection: every call fails (per the layer's failure
    /// policy) until Redis is configured with `noeviction`.
    Refuse,
}

/// The Redis store. Clones share connections.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The primary's connections, or the cluster's.
    primary: Connections,
    replicas: Vec<Connections>,
    next_replica: AtomicUsize,
    prefix: String,
    time: TimeSource,
    /// `host:port/db` of the primary (of the first seed node for a cluster).
    name: String,
    cluster: bool,
}

/// Configures a [`RedisStore`]. Nothing connects until the first request, so a
/// service starts even when Redis is down.
#[must_use]
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    /// Seed nodes of a Redis Cluster (cluster mode), else `None`.
    cluster: Option<Vec<String>>,
    replicas: Vec<String>,
    prefix: String,
    connections: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    pool_wait_timeout: Duration,
    time: TimeSource,
    eviction: EvictionCheck,
}

impl RedisStoreBuilder {
    /// Adds a replica that serves [`Store::status`] reads (repeatable). Replicas
    /// lag and do not expire keys themselves; stale windows are discarded.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("redis://10.0.0.1").replica("redis://10.0.0.2").build();
    /// ```
    pub fn replica(mut self, url: impl Into<String>) -> Self {
        self.replicas.push(url.into());
        self
    }

    /// Prefix of every key (default `"trl:"`); no braces, spaces or newlines.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// assert!(RedisStore::builder("redis://127.0.0.1").prefix("{x").build().is_err());
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Connections ("lanes") to the primary (default 1).
    ///
    /// Charges on a lane travel in batches: a runner task sends
    /// everything queued as one script call (up to 64 charges), pipelined,
    /// with up to 4 calls in flight; when all 4 are out, charges queue and
    /// leave together with the next. A charge made on an idle service leaves
    /// at once. More connections mean smaller batches and more Redis CPU per
    /// decision; raise it only when the round trip to Redis is long compared
    /// with the time Redis takes to run a batch (a distant Redis). Each
    /// connection queues at most 4,096 charges; past that, charges fail at
    /// once (per the layer's failure policy) instead of piling up behind a
    /// stalled Redis.
    ///
    /// Each lane is one multiplexed redis-rs connection (refunds, status
    /// reads, concurrency slots) plus, on a plain-TCP `redis://` URL, a socket
    /// its charge runner owns: it writes the batches and parses their replies
    /// itself, with no task hop in between.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("redis://127.0.0.1").connections(4).build();
    /// ```
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// Time allowed to open a connection (default 1 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("redis://127.0.0.1").connect_timeout(Duration::from_millis(200)).build();
    /// ```
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Time allowed for one reply on a connection (default 1 s); a connection
    /// that misses it is replaced (a charge connection first fails every
    /// batch in flight on it). Each request is also bounded by the layer's
    /// store timeout, whichever is shorter.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("redis://127.0.0.1").response_timeout(Duration::from_millis(500)).build();
    /// ```
    pub fn response_timeout(mut self, t: Duration) -> Self {
        self.response_timeout = t;
        self
    }

    /// Time to wait for the pool to hand out a new connection (default 1 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("redis://127.0.0.1").pool_wait_timeout(Duration::from_millis(100)).build();
    /// ```
    pub fn pool_wait_timeout(mut self, t: Duration) -> Self {
        self.pool_wait_timeout = t;
        self
    }

    /// Whose clock decides windows (default [`TimeSource::Application`]).
    ///
    /// ```
    /// use tower_ratelimit::store::{RedisStore, TimeSource};
    /// let store = RedisStore::builder("redis://127.0.0.1").time_source(TimeSource::Redis).build();
    /// ```
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// What to do when Redis may evict limiter keys (default [`EvictionCheck::Warn`]).
    ///
    /// ```
    /// use tower_ratelimit::store::{EvictionCheck, RedisStore};
    /// let store = RedisStore::builder("redis://127.0.0.1").eviction_check(EvictionCheck::Refuse).build();
    /// ```
    pub fn eviction_check(mut self, check: EvictionCheck) -> Self {
        self.eviction = check;
        self
    }

    /// Checks the configuration and builds the store without connecting.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        if self.prefix.is_empty()
            || self.prefix.len() > 64
            || !self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(ConfigError::new(format!(
                "redis key prefix {:?} must be 1 to 64 printable characters without braces",
                self.prefix
            )));
        }
        for t in [
            self.connect_timeout,
            self.response_timeout,
            self.pool_wait_timeout,
        ] {
            if t.is_zero() {
                return Err(ConfigError::new("redis timeouts must be above zero"));
            }
        }
        if self.cluster.as_ref().is_some_and(Vec::is_empty) {
            return Err(ConfigError::new(
                "a Redis Cluster needs at least one seed node url",
            ));
        }
        let vet = vet(self.eviction);
        let primary = match &self.cluster {
            None => Connections::Lanes(Arc::new(Lanes::new(
                self.pool(&self.url)?,
                self.connections,
                wire::Endpoint::from_url(&self.url, self.connect_timeout, self.response_timeout),
                Some(vet),
            ))),
            Some(urls) => self.cluster_connections(urls, vet)?,
        };
        let replicas = self
            .replicas
            .iter()
            .map(|u| {
                Ok(Connections::Lanes(Arc::new(Lanes::new(
                    self.pool(u)?,
                    1,
                    None,
                    None,
                ))))
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                primary,
                replicas,
                next_replica: AtomicUsize::new(0),
                prefix: self.prefix,
                time: self.time,
                name: node_name(&self.url)?,
                cluster: self.cluster.is_some(),
            }),
        })
    }

    #[cfg(feature = "cluster")]
    fn cluster_connections(
        &self,
        urls: &[String],
        vet: Arc<Vet>,
    ) -> Result<Connections, ConfigError> {
        if !self.replicas.is_empty() {
            return Err(ConfigError::new(
                "a Redis Cluster finds its replicas itself: `replica` is for a standalone primary",
            ));
        }
        Ok(Connections::Cluster(Box::new(cluster::ClusterLane::new(
            urls,
            self.connect_timeout,
            self.response_timeout,
            Some(vet),
        )?)))
    }

    #[cfg(not(feature = "cluster"))]
    fn cluster_connections(&self, _: &[String], _: Arc<Vet>) -> Result<Connections, ConfigError> {
        unreachable!("cluster mode is only configurable with the `cluster` feature")
    }

    fn pool(&self, url: &str) -> Result<Pool, ConfigError> {
        let conn = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        let manager = Manager::new_with_config(url, conn)
            .map_err(|e| ConfigError::new(format!("invalid redis url {url:?}: {e}")))?;
        Pool::builder(manager)
            .max_size(self.connections.max(1))
            .wait_timeout(Some(self.pool_wait_timeout))
            .create_timeout(Some(self.connect_timeout))
            .recycle_timeout(Some(self.response_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| ConfigError::new(format!("redis pool: {e}")))
    }
}

/// A node's identity, `host:port/db`, without scheme or credentials.
fn node_name(url: &str) -> Result<String, ConfigError> {
    let info = url
        .into_connection_info()
        .map_err(|e| ConfigError::new(format!("invalid redis url {url:?}: {e}")))?;
    let db = info.redis_settings().db();
    Ok(match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}/{db}")
        }
        ConnectionAddr::Unix(path) => format!("unix:{}/{db}", path.display()),
        other => format!("{other}/{db}"),
    })
}

/// Checks `maxmemory-policy` on every new primary connection.
fn vet(check: EvictionCheck) -> Arc<Vet> {
    Arc::new(move |mut conn: AnyConnection| {
        Box::pin(async move {
            let policy = match eviction_policy(&mut conn).await {
                Ok(p) => p,
                Err(e) => {
                    // Managed Redis often disables CONFIG: nothing to check then.
                    tracing::debug!(error = %e, "could not read maxmemory-policy");
                    return Ok(());
                }
            };
            if policy == "noeviction" {
                return Ok(());
            }
            let msg = format!(
                "redis maxmemory-policy is `{policy}`: Redis may evict live rate-limit keys \
                 (they all carry a TTL, so volatile-* policies evict them too), handing clients \
                 fresh windows; configure `maxmemory-policy noeviction` for the limiter's Redis"
            );
            match check {
                EvictionCheck::Warn => {
                    tracing::warn!("{msg}");
                    Ok(())
                }
                EvictionCheck::Refuse => {
                    tracing::error!("{msg}; refusing to use it");
                    Err(StoreError::Unavailable(msg))
                }
            }
        })
    })
}

fn eviction_policy_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    cmd
}

async fn eviction_policy(conn: &mut (impl ConnectionLike + Send)) -> Result<String, StoreError> {
    let v: Vec<String> = eviction_policy_cmd()
        .query_async(conn)
        .await
        .map_err(redis_error)?;
    policy_from_reply(&v)
}

fn policy_from_reply(v: &[String]) -> Result<String, StoreError> {
    v.get(1)
        .cloned()
        .ok_or_else(|| StoreError::Protocol("CONFIG GET maxmemory-policy returned nothing".into()))
}

impl RedisStore {
    /// A store for the Redis at `url` with default settings (no connection yet).
    pub fn new(url: impl Into<String>) -> Result<Self, ConfigError> {
        Self::builder(url).build()
    }

    /// Configures a store for the primary at `url` (`redis://[user:pass@]host:port[/db]`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            cluster: None,
            replicas: Vec::new(),
            prefix: "trl:".into(),
            connections: 1,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            pool_wait_timeout: Duration::from_secs(1),
            time: TimeSource::Application,
            eviction: EvictionCheck::Warn,
        }
    }

    /// A store for the Redis Cluster reachable at any of `urls` (seed nodes;
    /// the others are discovered), with default settings (no connection yet).
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]).unwrap();
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster<I>(urls: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self::cluster_builder(urls).build()
    }

    /// Configures a store for the Redis Cluster reachable at any of `urls`.
    ///
    /// Every script touches one key, so one hash slot (several quotas share
    /// one hash under the client's key): no `CROSSSLOT`. Calls go to the node
    /// serving the key's slot over one shared cluster connection, which keeps
    /// a multiplexed connection to each node. A call is re-sent only after an
    /// answer proving it did not run (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
    /// `LOADING`, a refused connection), never after an I/O error or a
    /// timeout, so a request is never charged twice: the cluster client's own
    /// retries are turned off. After a failover the first call meets `MOVED`,
    /// goes to the promoted replica (loading the scripts there: `SCRIPT LOAD`
    /// is not replicated) and the client refreshes its slot map.
    ///
    /// [`replica`](RedisStoreBuilder::replica) is refused (the cluster knows
    /// its replicas) and [`connections`](RedisStoreBuilder::connections) is
    /// ignored; the timeouts apply to each node's connection.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::cluster_builder(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .response_timeout(Duration::from_millis(200))
    ///     .build()
    ///     .unwrap();
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster_builder<I>(urls: I) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let urls: Vec<String> = urls.into_iter().map(Into::into).collect();
        let mut b = Self::builder(urls.first().cloned().unwrap_or_default());
        b.cluster = Some(urls);
        b
    }

    /// Connects now and returns the primary's `maxmemory-policy` (for start-up
    /// checks and health endpoints). Not needed: the store connects lazily.
    /// In a cluster, one node answers.
    pub async fn eviction_policy(&self) -> Result<String, StoreError> {
        let v: Vec<String> = self
            .inner
            .primary
            .run(Call::Command(&eviction_policy_cmd()))
            .await?;
        policy_from_reply(&v)
    }

    /// The store's identity as a shard of a [`ShardedStore`](crate::store::ShardedStore):
    /// its primary's `host:port/db` (the first seed node's for a cluster),
    /// never its credentials.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::new("redis://user:secret@10.0.0.1:6380/2").unwrap();
    /// assert_eq!(store.shard_name(), "10.0.0.1:6380/2");
    /// ```
    pub fn shard_name(&self) -> &str {
        &self.inner.name
    }

    /// The primary's connections (for the coordinated mode's sync).
    pub(crate) fn primary(&self) -> &Connections {
        &self.inner.primary
    }

    /// Whether this store talks to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.inner.cluster
    }

    /// The Redis key holding `key`'s state for the limiter `namespace`.
    pub fn redis_key(&self, namespace: &crate::store::Namespace, key: &crate::key::Key) -> String {
        keys::redis_key(&self.inner.prefix, namespace, key)
    }

    /// The time sent to a script: the application's, or `None` for Redis `TIME`.
    fn sent_now(&self, now_ms: u64) -> Option<u64> {
        match self.inner.time {
            TimeSource::Application => Some(now_ms),
            TimeSource::Redis => None,
        }
    }
}

/// Runs one `EVALSHA` of `script` on `lanes` within `budget`.
async fn invoke<T: FromRedisValue>(
    lanes: &Connections,
    script: &'static redis::Script,
    cmd: &redis::Cmd,
    budget: Duration,
) -> Result<T, StoreError> {
    within(budget, lanes.run(Call::Eval { script, cmd })).await
}

/// `fut` within `limit`; past it, `Unavailable` saying that `what` did not
/// come within it (`"redis cluster: no connection"` → `"… within 1s"`).
pub(crate) async fn or_unavailable<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| StoreError::Unavailable(format!("{what} within {limit:?}")))
}

/// Bounds a whole call (connection, re-sends, reply) by `budget`.
async fn within<T>(
    budget: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(budget, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout(budget)),
    }
}

impl RedisStore {
    /// A one-request `EVALSHA` of `script` (refund, status) on `call`'s
    /// key: its keys, time, cost and the number of quotas.
    fn script_cmd(
        &self,
        script: &'static redis::Script,
        call: &Charge<'_>,
        cost: u64,
    ) -> (redis::Cmd, Option<u64>) {
        let sent_now = self.sent_now(call.now_ms);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(reply::key_count(call.policy));
        reply::keys(&mut cmd, &self.hash_key(call), call.policy);
        reply::time_arg(&mut cmd, sent_now);
        cmd.arg(cost).arg(call.policy.quotas().len());
        (cmd, sent_now)
    }

    fn hash_key(&self, call: &Charge<'_>) -> keys::HashKey {
        keys::hash_key(&self.inner.prefix, call.namespace, call.key)
    }
}

impl Store for RedisStore {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        let job = batch::Job {
            hash_key: self.hash_key(call),
            policy: call.policy.clone(),
            now: self.sent_now(call.now_ms),
            cost: call.cost,
        };
        let budget = call.timeout;
        // Inside a runtime a batched charge is queued now (its lane's runner
        // is spawned on that runtime) and waits on its reply in place, with
        // no boxed future around it. Outside one it is queued when first
        // polled; a cluster charge is sent alone.
        if let (Connections::Lanes(lanes), Ok(_)) =
            (&self.inner.primary, tokio::runtime::Handle::try_current())
        {
            return StoreFuture::reply(lanes.submit(job), budget, Err);
        }
        let inner = self.inner.clone();
        StoreFuture::pending(async move { inner.primary.charge(job, budget).await })
    }

    fn refund(&self, call: &Refund<'_>) -> StoreFuture<Result<(), StoreError>> {
        let c = &call.charge;
        let (mut cmd, _) = self.script_cmd(&scripts::REFUND, c, c.cost);
        for (q, s) in c.policy.quotas().iter().zip(call.decision.statuses()) {
            reply::quota_args(&mut cmd, q);
            cmd.arg(s.window_id);
        }
        let inner = self.inner.clone();
        let budget = c.timeout;
        StoreFuture::pending(async move {
            let _written: i64 = invoke(&inner.primary, &scripts::REFUND, &cmd, budget).await?;
            Ok(())
        })
    }

    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        // Read-only: a replica may answer. Time is the application's, as for
        // a charge (or Redis TIME); a window past its reset is discarded.
        let (mut cmd, sent_now) = self.script_cmd(&scripts::STATUS, call, 0);
        for q in call.policy.quotas() {
            reply::quota_args(&mut cmd, q);
        }
        let inner = self.inner.clone();
        let policy = call.policy.clone();
        let budget = call.timeout;
        StoreFuture::pending(async move {
            let lanes = match inner.replicas.len() {
                0 => &inner.primary,
                n => &inner.replicas[inner.next_replica.fetch_add(1, Ordering::Relaxed) % n],
            };
            let r: Vec<i64> = invoke(lanes, &scripts::STATUS, &cmd, budget).await?;
            reply::decode(&policy, None, sent_now, &r)
        })
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("name", &self.inner.name)
            .field("cluster", &self.inner.cluster)
            .field("prefix", &self.inner.prefix)
            .field("replicas", &self.inner.replicas.len())
            .field("time", &self.inner.time)
            .finish_non_exhaustive()
    }
}
