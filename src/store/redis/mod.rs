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
//! Every call goes through redis-rs: plain TCP (`redis://`), TLS
//! (`rediss://`, feature `tls`), Unix sockets (`unix://`, `redis+unix://`),
//! a primary found through Sentinel (feature `sentinel`) or a Redis Cluster
//! (feature `cluster`). `AUTH`, `SELECT` and the protocol (`?protocol=resp3`)
//! come from the URL.
//!
//! Concurrent charges travel together: each connection sends one `EVALSHA`
//! of `lua/charge.lua` for every charge waiting while its previous batch was
//! in flight (an idle service sends each charge alone, at once; see
//! [`RedisStoreBuilder::connections`]). For each request in order, the script
//! (assembled from one Lua file per algorithm) reads, decides and writes every
//! quota of its policy atomically and returns the state the decision was made
//! on; the headers are built from that reply only, by the same math the
//! memory store runs. A settlement (a refund, or debt) is one more script call, run in the background.
//! All of a client's state is one hash under one key (plus, for a
//! sliding-log quota, a sorted set sharing its hash tag), so every call
//! touches one hash slot.
//!
//! With the `cluster` feature, [`RedisStore::cluster`] runs the same scripts on
//! a Redis Cluster: each call goes to the node serving its key's slot, follows
//! `MOVED`/`ASK` and keeps working after a failover, and is never sent twice
//! after an error that may have let it run (see [`RedisStore::cluster_builder`]).
//!
//! Passwords never appear in this store's `Debug` output, its errors or its
//! log lines: URLs are shown as `redis://user:***@host:6379`.
//!
//! # Batching
//!
//! Each connection ([`RedisStoreBuilder::connections`], default 1) has a
//! runner task that sends everything queued as one script call, up to 64
//! charges, with up to 4 calls in flight; when all 4 are out, charges queue
//! and leave together with the next. Requests in a row for one key and
//! policy (a hot client, a global limit) form a run: the key is sent and
//! read once, and each request is decided on the state the one before it
//! left, with the same replies as one by one. Replies come back by position
//! into each request's own channel; a request whose caller gave up before
//! its batch left is never charged; `NOSCRIPT` (nothing ran) loads the
//! script and re-sends the batch once; one request failing inside the script
//! fails alone.
//!
//! # Connections and time
//!
//! One long-lived redis-rs multiplexed connection per lane carries charges,
//! refunds, status reads, concurrency slots and the eviction check (no
//! per-request checkout from a pool). Each stage has its timeout: connect
//! (TLS handshake and `AUTH` included), the layer's store timeout around each
//! call, and the response timeout after which a connection that answers
//! nothing is replaced. A connection that failed or answered `READONLY` is
//! replaced, and one idle for a second is checked before it carries a call.
//! [`Store::connect`](crate::store::Store::connect) opens them before
//! serving.
//!
//! Every connection, batch sent and store timeout runs on one thread of
//! the crate's own (`tower-ratelimit-redis`, a small tokio runtime shared by
//! every Redis store in the process), not on the application's runtime. An
//! instance whose runtime is saturated still has its replies read as they
//! arrive and its timeouts measured against Redis alone: its decisions get
//! slower, never fail open because the instance is busy. A request waits
//! for its answer on a channel, from any runtime. The application owns time: `now` comes from the layer's clock
//! (or Redis `TIME`, see [`TimeSource`]); TTLs only clean up.
//!
//! # Keys
//!
//! One key per client, `trl:<limiter>:{<128-bit hash of the key>}`: a hash
//! holding every quota's state, plus a sorted set `…}:sl<window>` per
//! sliding-log quota, sharing the hash tag. Client input cannot inject
//! braces, newlines or length.
//!
//! # Capacity
//!
//! Redis runs each script on one core, so the budget is its CPU per decision:
//! `primaries = requests/s × Redis CPU per decision ÷ the share of a core you
//! allow`. An allowed or rejected request costs at most one command (far
//! fewer under load), a refunded one one more. Measured for a fixed-window
//! policy: about 25–40 µs of Redis CPU for a charge sent alone and 5–8 µs
//! for one in a batch of 15–20; the other algorithms cost 1.1–1.3× that, the
//! sliding log 3.5×. Replicas add no charge capacity. Under a Redis store,
//! requests wait in batches and their memory is freed in bursts, which
//! glibc's malloc serves from slower paths: `GLIBC_TUNABLES=glibc.malloc.tcache_count=256`
//! (or jemalloc or mimalloc) helps. The measurements are in the
//! repository's `docs/performance.md`.

/// The reply parsers, reachable by the fuzz targets (`fuzz/`, built with
/// `--cfg fuzzing`); not part of the API.
#[cfg(fuzzing)]
pub mod fuzzing {
    use super::batch::{self, Job};
    use super::keys::HashKey;
    use crate::decision::Decision;
    use crate::error::StoreError;
    use crate::quota::Policy;
    use crate::store::Occupancy;
    use deadpool_redis::redis::Value;
    use std::time::Duration;

    /// A charge batch's reply (`packed` numbers, then error messages) read
    /// for requests of `(policy, now, cost)`.
    pub fn charge_reply(
        packed: Vec<u8>,
        messages: Vec<Vec<u8>>,
        requests: &[(Policy, Option<u64>, u64)],
    ) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
        let jobs: Vec<Job> = requests
            .iter()
            .map(|(policy, now, cost)| Job {
                hash_key: HashKey::from_slice(b"k"),
                policy: policy.clone(),
                now: *now,
                cost: *cost,
                units: *cost,
                timeout: Duration::from_secs(1),
            })
            .collect();
        let mut reply = vec![Value::BulkString(packed)];
        reply.extend(messages.into_iter().map(Value::BulkString));
        batch::answers(&reply, &jobs)
    }

    /// A status script's reply.
    pub fn status_reply(
        policy: &Policy,
        sent_now: Option<u64>,
        reply: &[i64],
    ) -> Result<Decision, StoreError> {
        super::reply::decode(policy, None, sent_now, reply)
    }

    /// A concurrency acquire script's reply to a call sent at `sent`.
    pub fn acquire_reply(sent: u64, reply: &[i64]) -> Result<Occupancy, StoreError> {
        super::concurrency::decode(sent, reply)
    }
}

mod batch;
#[cfg(feature = "cluster")]
mod cluster;
mod concurrency;
mod io;
mod keys;
mod lane;
mod node;
mod reply;
mod scripts;
mod url;

use self::lane::{Call, Lanes};
use self::node::{Node, Settings, Tls};
use self::url::Redacted;
use crate::algorithm;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::store::{Acquire, Charge, Occupancy, Release, Settle, Store, StoreFuture};
use deadpool_redis::redis::aio::ConnectionLike;
use deadpool_redis::redis::{self, Cmd, ConnectionAddr, ConnectionInfo, FromRedisValue};
use std::fmt;
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
    primary: Primary,
    /// Connections that serve [`Store::status`] reads.
    replicas: Vec<Lanes>,
    next_replica: AtomicUsize,
    prefix: String,
    time: TimeSource,
    /// The shard name: `host:port/db` of the primary, never its credentials.
    name: String,
    /// Where the store connects, as it may be shown (no password).
    shown: String,
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
            Primary::Lanes(lanes) => lanes.submit(job, cap).await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the redis connection carrying this charge was dropped (its runtime shut down)"
                        .into(),
                ))
            }),
            #[cfg(feature = "cluster")]
            Primary::Cluster(cluster) => {
                let budget = job.timeout;
                let jobs = std::slice::from_ref(&job);
                let (script, cmd) = batch::command(jobs);
                let reply: Vec<redis::Value> = cluster
                    .run(Call::Eval { script, cmd: &cmd }, budget)
                    .await?;
                batch::answers(&reply, jobs)?
                    .pop()
                    .ok_or_else(|| StoreError::Protocol("no answer to a charge".into()))?
            }
        }
    }

    /// Runs `call` within `budget`.
    async fn run<T: FromRedisValue>(
        &self,
        call: Call<'_>,
        budget: Duration,
    ) -> Result<T, StoreError> {
        match self {
            Primary::Lanes(lanes) => lanes.run(call, budget).await,
            #[cfg(feature = "cluster")]
            Primary::Cluster(cluster) => cluster.run(call, budget).await,
        }
    }

    /// Sends `pipe` in one round trip within `budget` (shared limits and
    /// the advisor's fleet report, whose keys share one hash slot). A
    /// cluster is refused when those are configured.
    pub(crate) async fn query_pipeline(
        &self,
        pipe: &redis::Pipeline,
        budget: Duration,
    ) -> Result<Vec<redis::Value>, StoreError> {
        match self {
            Primary::Lanes(lanes) => lanes.query_pipeline(pipe, budget).await,
            #[cfg(feature = "cluster")]
            Primary::Cluster(_) => Err(StoreError::Unavailable(
                "a pipeline over many hash slots cannot go through a Redis Cluster".into(),
            )),
        }
    }

    /// Sends single-key commands in one round trip per node within
    /// `budget`: one pipeline to a standalone primary; on a cluster, each
    /// command to its key's node, multiplexed with the others bound there.
    /// The answer to each command, in order.
    pub(crate) async fn spread(
        &self,
        cmds: &[Cmd],
        budget: Duration,
    ) -> Vec<Result<redis::Value, StoreError>> {
        match self {
            Primary::Lanes(lanes) => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                match lanes.query_pipeline(&pipe, budget).await {
                    Ok(values) if values.len() == cmds.len() => values
                        .into_iter()
                        .map(|v| match v {
                            redis::Value::ServerError(e) => Err(lane::redis_error(e.into())),
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

/// `n` answers, each the error `e` (every command of a call that failed whole).
pub(crate) fn failed_all<T>(n: usize, e: StoreError) -> Vec<Result<T, StoreError>> {
    (0..n).map(|_| Err(e.clone())).collect()
}

/// What a builder connects to.
#[derive(Clone)]
enum Target {
    Url(String),
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        master: String,
        sentinels: Vec<String>,
        nodes: SentinelNodes,
    },
}

/// How to reach the nodes Sentinel names.
#[cfg(feature = "sentinel")]
#[derive(Clone, Default)]
struct SentinelNodes {
    username: Option<String>,
    password: Option<String>,
    db: i64,
    tls: bool,
}

/// Configures a [`RedisStore`]. Nothing connects until the first request, so a
/// service starts even when Redis is down.
#[must_use]
#[derive(Clone)]
pub struct RedisStoreBuilder {
    target: Target,
    replicas: Vec<String>,
    prefix: String,
    connections: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    time: TimeSource,
    eviction: EvictionCheck,
    tls: Tls,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisStoreBuilder");
        match &self.target {
            Target::Url(url) => d.field("url", &Redacted(url)),
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => d.field(
                "cluster",
                &urls.iter().map(|u| Redacted(u)).collect::<Vec<_>>(),
            ),
            #[cfg(feature = "sentinel")]
            Target::Sentinel {
                master, sentinels, ..
            } => d.field("sentinel_master", master).field(
                "sentinels",
                &sentinels.iter().map(|u| Redacted(u)).collect::<Vec<_>>(),
            ),
        };
        d.field(
            "replicas",
            &self
                .replicas
                .iter()
                .map(|u| Redacted(u))
                .collect::<Vec<_>>(),
        )
        .field("prefix", &self.prefix)
        .field("connections", &self.connections)
        .field("connect_timeout", &self.connect_timeout)
        .field("response_timeout", &self.response_timeout)
        .field("time", &self.time)
        .field("eviction", &self.eviction)
        .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// Adds a replica that serves [`Store::status`] reads (repeatable). Replicas
    /// lag and do not expire keys themselves; stale windows are discarded. A
    /// read the replica fails is answered by the primary.
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
    /// Charges on a lane travel in batches: a runner task sends everything
    /// queued as one script call (up to 64 charges); while it is in flight,
    /// charges queue and leave together when it comes back, and another
    /// call (up to 4, pipelined) leaves beside it only when a whole batch of
    /// 64 waits. A charge made on an idle service leaves at once. So a charge
    /// waits at most for one round trip before its own. More connections mean
    /// smaller batches and more Redis CPU per decision; raise it only when
    /// the round trip to Redis is long compared with the time Redis takes to
    /// run a batch (a distant Redis). Each connection queues at most 4,096
    /// charges; past that, a charge fails at once with
    /// [`StoreError::Backlog`] (answered `503` as an overload, never
    /// admitted without limit, and not counted by the breaker) instead of
    /// piling up. An instance that gets there asks more of Redis than one
    /// connection answers: add connections, or shed load before the limiter
    /// with [`LoadShedLayer`](crate::LoadShedLayer).
    ///
    /// A charge's store timeout covers its wait in the queue while Redis
    /// fails to answer (a charge whose budget ran out there is never sent),
    /// but not its wait behind calls Redis answers: a long queue of a busy
    /// instance decides late, it never fails open.
    ///
    /// Each lane is one multiplexed redis-rs connection: charges, refunds,
    /// status reads and concurrency slots share it, pipelined.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("redis://127.0.0.1").connections(4).build();
    /// ```
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// Time allowed to open a connection, TLS handshake and `AUTH` included
    /// (default 1 s).
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

    /// How long a connection may go without answering anything while calls
    /// wait on it before it is replaced (default 1 s). Each call is bounded
    /// by the layer's store timeout too, whichever is shorter.
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

    /// Trusts these CA certificates (PEM, one or more) for `rediss://`
    /// servers instead of the system's roots (feature `tls`): a managed
    /// Redis with its own CA, or one made for a test.
    ///
    /// ```no_run
    /// use tower_ratelimit::store::RedisStore;
    /// let ca = std::fs::read("/etc/redis/ca.pem").unwrap();
    /// let store = RedisStore::builder("rediss://redis.internal:6380").tls_ca_pem(ca).build();
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents this client certificate chain and its private key (both PEM)
    /// to `rediss://` servers that ask for one (`tls-auth-clients yes`):
    /// mutual TLS (feature `tls`).
    ///
    /// ```no_run
    /// use tower_ratelimit::store::RedisStore;
    /// let (cert, key) = (std::fs::read("client.pem").unwrap(), std::fs::read("client.key").unwrap());
    /// let store = RedisStore::builder("rediss://redis.internal:6380").tls_client_cert_pem(cert, key).build();
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_cert_pem(
        mut self,
        cert_chain: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_chain.into(), key.into()));
        self
    }

    /// **Unsafe**: accepts any server certificate, without checking who
    /// signed it or which host it names (feature `tls`). The connection is
    /// encrypted but anyone on the path can impersonate Redis, read the
    /// limiter's traffic and its `AUTH` password, and answer every charge.
    /// For a development setup only; give the server's CA with
    /// [`tls_ca_pem`](Self::tls_ca_pem) instead. (A `#insecure` URL fragment
    /// is refused: this is the only way to ask for it.)
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("rediss://localhost:6380")
    ///     .danger_accept_invalid_certificates()
    ///     .build();
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn danger_accept_invalid_certificates(mut self) -> Self {
        self.tls.insecure = true;
        self
    }

    /// The user name for the nodes Sentinel names (feature `sentinel`; the
    /// sentinels' own credentials come from their URLs).
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::sentinel_builder("mymaster", ["redis://10.0.0.1:26379"])
    ///     .node_username("limiter")
    ///     .node_password("s3cret")
    ///     .build();
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn node_username(mut self, username: impl Into<String>) -> Self {
        if let Target::Sentinel { nodes, .. } = &mut self.target {
            nodes.username = Some(username.into());
        }
        self
    }

    /// The password for the nodes Sentinel names (feature `sentinel`). See
    /// [`node_username`](Self::node_username).
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn node_password(mut self, password: impl Into<String>) -> Self {
        if let Target::Sentinel { nodes, .. } = &mut self.target {
            nodes.password = Some(password.into());
        }
        self
    }

    /// The database on the nodes Sentinel names (default 0; feature `sentinel`).
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::sentinel_builder("mymaster", ["redis://10.0.0.1:26379"]).node_db(2).build();
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn node_db(mut self, db: i64) -> Self {
        if let Target::Sentinel { nodes, .. } = &mut self.target {
            nodes.db = db;
        }
        self
    }

    /// The nodes Sentinel names speak TLS (features `sentinel` and `tls`),
    /// verified as [`tls_ca_pem`](Self::tls_ca_pem) and
    /// [`tls_client_cert_pem`](Self::tls_client_cert_pem) say. The sentinels
    /// speak TLS when their URLs are `rediss://`.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::sentinel_builder("mymaster", ["rediss://10.0.0.1:26379"]).node_tls().build();
    /// ```
    #[cfg(all(feature = "sentinel", feature = "tls"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "sentinel", feature = "tls"))))]
    pub fn node_tls(mut self) -> Self {
        if let Target::Sentinel { nodes, .. } = &mut self.target {
            nodes.tls = true;
        }
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
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(ConfigError::new("redis timeouts must be above zero"));
        }
        let settings = Settings {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            tls: self.tls.clone(),
        };
        let lanes = |node: Node, n: usize, eviction: Option<EvictionCheck>| {
            Lanes::new(node, n, eviction, self.response_timeout)
        };
        let (primary, name, shown, sentinel_replicas) = match &self.target {
            Target::Url(url) => {
                let node = Node::from_url(url, &settings)?;
                let name = node_name(&node::connection_info(url, &settings.tls)?);
                let shown = node.shown().to_owned();
                let primary = lanes(node, self.connections, Some(self.eviction));
                (Primary::Lanes(Arc::new(primary)), name, shown, None)
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => {
                if !self.replicas.is_empty() {
                    return Err(ConfigError::new(
                        "a Redis Cluster finds its replicas itself: `replica` is for a standalone primary",
                    ));
                }
                let first = urls.first().ok_or_else(|| {
                    ConfigError::new("a Redis Cluster needs at least one seed node url")
                })?;
                let name = node_name(&node::connection_info(first, &settings.tls)?);
                let lane = cluster::ClusterLane::new(urls, &settings, self.eviction)?;
                let shown = format!("cluster {}", Redacted(first));
                (Primary::Cluster(Box::new(lane)), name, shown, None)
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel {
                master,
                sentinels,
                nodes,
            } => {
                if !self.replicas.is_empty() {
                    return Err(ConfigError::new(
                        "Sentinel names the replicas itself: `replica` is for a primary given by url",
                    ));
                }
                let [to_primary, to_replicas] =
                    sentinel::nodes(master, sentinels, nodes, &settings)?;
                let name = format!("sentinel/{master}/{}", nodes.db);
                let shown = to_primary.shown().to_owned();
                let primary = lanes(to_primary, self.connections, Some(self.eviction));
                let replicas = lanes(to_replicas, 1, None);
                (
                    Primary::Lanes(Arc::new(primary)),
                    name,
                    shown,
                    Some(replicas),
                )
            }
        };
        let mut replicas = self
            .replicas
            .iter()
            .map(|u| Ok(lanes(Node::from_url(u, &settings)?, 1, None)))
            .collect::<Result<Vec<_>, ConfigError>>()?;
        replicas.extend(sentinel_replicas);
        Ok(RedisStore {
            inner: Arc::new(Inner {
                primary,
                replicas,
                next_replica: AtomicUsize::new(0),
                prefix: self.prefix,
                time: self.time,
                name,
                shown,
            }),
        })
    }
}

#[cfg(feature = "sentinel")]
mod sentinel {
    //! A store whose primary (and replicas) Sentinel names.

    use super::node::{self, Node, Settings};
    use super::url::Redacted;
    use super::SentinelNodes;
    use crate::error::ConfigError;
    use deadpool_redis::redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    use deadpool_redis::redis::{ConnectionAddr, TlsMode};

    /// The nodes for the primary and for the replicas of `master`.
    pub(super) fn nodes(
        master: &str,
        sentinels: &[String],
        nodes: &SentinelNodes,
        settings: &Settings,
    ) -> Result<[Node; 2], ConfigError> {
        if master.is_empty() {
            return Err(ConfigError::new("a Sentinel master name must not be empty"));
        }
        let first = sentinels
            .first()
            .ok_or_else(|| ConfigError::new("Sentinel needs at least one sentinel url"))?;
        let infos = sentinels
            .iter()
            .map(|u| node::connection_info(u, &settings.tls))
            .collect::<Result<Vec<_>, _>>()?;
        let auth = |i: &deadpool_redis::redis::ConnectionInfo| {
            let s = i.redis_settings();
            (
                s.username().map(str::to_owned),
                s.password().map(str::to_owned),
            )
        };
        if infos.iter().any(|i| auth(i) != auth(&infos[0])) {
            return Err(ConfigError::new(
                "every sentinel url must carry the same user name and password",
            ));
        }
        let sentinel_tls = matches!(infos[0].addr(), ConnectionAddr::TcpTls { .. });
        let (username, password) = auth(&infos[0]);
        let shown = format!(
            "the primary Sentinel names {master:?} (sentinels {})",
            sentinels
                .iter()
                .map(|u| Redacted(u).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let build = |role: SentinelServerType| {
            let addrs = infos.iter().map(|i| i.addr().clone());
            let mut b = SentinelClientBuilder::new(addrs, master, role)
                .map_err(|e| ConfigError::new(format!("sentinel {}: {e}", Redacted(first))))?
                .set_client_to_redis_db(nodes.db)
                .set_client_to_redis_tcp_settings(node::tcp_settings())
                .set_client_to_sentinel_tcp_settings(node::tcp_settings());
            if let Some(u) = &username {
                b = b.set_client_to_sentinel_username(u);
            }
            if let Some(p) = &password {
                b = b.set_client_to_sentinel_password(p);
            }
            if let Some(u) = &nodes.username {
                b = b.set_client_to_redis_username(u);
            }
            if let Some(p) = &nodes.password {
                b = b.set_client_to_redis_password(p);
            }
            #[cfg(feature = "tls")]
            {
                let mode = if settings.tls.insecure {
                    TlsMode::Insecure
                } else {
                    TlsMode::Secure
                };
                if sentinel_tls || nodes.tls {
                    node::install_crypto_provider();
                }
                if sentinel_tls {
                    b = b.set_client_to_sentinel_tls_mode(mode);
                    if settings.tls.ca.is_some() || settings.tls.client.is_some() {
                        b = b.set_client_to_sentinel_certificates(settings.tls.certificates());
                    }
                }
                if nodes.tls {
                    b = b.set_client_to_redis_tls_mode(mode);
                    if settings.tls.ca.is_some() || settings.tls.client.is_some() {
                        b = b.set_client_to_redis_certificates(settings.tls.certificates());
                    }
                }
            }
            #[cfg(not(feature = "tls"))]
            let _ = (sentinel_tls, TlsMode::Secure);
            b.build()
                .map_err(|e| ConfigError::new(format!("sentinel {}: {e}", Redacted(first))))
        };
        let primary = build(SentinelServerType::Master)?;
        let replicas = build(SentinelServerType::Replica)?;
        Ok([
            Node::sentinel(primary, shown.clone(), nodes.tls, settings),
            Node::sentinel(
                replicas,
                shown.replace("the primary", "a replica"),
                nodes.tls,
                settings,
            ),
        ])
    }
}

/// A node's identity, `host:port/db`, without scheme or credentials.
fn node_name(info: &ConnectionInfo) -> String {
    let db = info.redis_settings().db();
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}/{db}")
        }
        ConnectionAddr::Unix(path) => format!("unix:{}/{db}", path.display()),
        other => format!("{other}/{db}"),
    }
}

/// Checks `maxmemory-policy` on a new primary connection (`shown` names it).
async fn check_eviction(
    check: EvictionCheck,
    conn: &mut (impl ConnectionLike + Send),
    shown: &str,
) -> Result<(), StoreError> {
    let policy = match eviction_policy(conn).await {
        Ok(p) => p,
        Err(e) => {
            // Managed Redis often disables CONFIG: nothing to check then.
            tracing::debug!(redis = shown, error = %e, "could not read maxmemory-policy");
            return Ok(());
        }
    };
    if policy == "noeviction" {
        return Ok(());
    }
    let msg = format!(
        "redis maxmemory-policy is `{policy}` on {shown}: Redis may evict live rate-limit keys \
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
        .map_err(lane::redis_error)?;
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

    /// Configures a store for the primary at `url`:
    /// `redis://[user:password@]host[:port][/db]`, `rediss://…` for TLS
    /// (feature `tls`), or `unix:///path/to/redis.sock[?db=N&pass=…]`
    /// (also `redis+unix://`).
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::builder("redis://limiter:s3cret@10.0.0.1:6379/2").build().unwrap();
    /// assert!(!format!("{store:?}").contains("s3cret"));
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        Self::builder_for(Target::Url(url.into()))
    }

    fn builder_for(target: Target) -> RedisStoreBuilder {
        RedisStoreBuilder {
            target,
            replicas: Vec::new(),
            prefix: "trl:".into(),
            connections: 1,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            time: TimeSource::Application,
            eviction: EvictionCheck::Warn,
            tls: Tls::default(),
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
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
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
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_builder<I>(urls: I) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self::builder_for(Target::Cluster(urls.into_iter().map(Into::into).collect()))
    }

    /// A store for the primary that Sentinel names `master`, asking the
    /// sentinels at `sentinel_urls` (feature `sentinel`), with default settings.
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"]).unwrap();
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel<I>(master: impl Into<String>, sentinel_urls: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self::sentinel_builder(master, sentinel_urls).build()
    }

    /// Configures a store for the primary that Sentinel names `master`
    /// (feature `sentinel`).
    ///
    /// Every new connection asks the sentinels where the primary is (and
    /// checks it is one), so after a failover the connections to the old
    /// primary, which answer `READONLY` or fail, are replaced by connections
    /// to the promoted replica. The scripts are loaded there on first use
    /// (`SCRIPT LOAD` is not replicated). As everywhere in this store, no
    /// call is re-sent after an error that may have let it run: a request is
    /// charged once or, if its call failed, answered per the layer's failure
    /// policy. [`Store::status`] reads go to a replica Sentinel knows (to the
    /// primary when there is none).
    ///
    /// The sentinels' user name, password and TLS (`rediss://`) come from
    /// their URLs; the data nodes' from [`node_username`](RedisStoreBuilder::node_username),
    /// [`node_password`](RedisStoreBuilder::node_password),
    /// [`node_db`](RedisStoreBuilder::node_db) and `node_tls` (with `tls`).
    ///
    /// ```
    /// use tower_ratelimit::store::RedisStore;
    /// let store = RedisStore::sentinel_builder("mymaster", ["redis://:sentinel-pw@10.0.0.1:26379"])
    ///     .node_password("s3cret")
    ///     .build()
    ///     .unwrap();
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_builder<I>(master: impl Into<String>, sentinel_urls: I) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self::builder_for(Target::Sentinel {
            master: master.into(),
            sentinels: sentinel_urls.into_iter().map(Into::into).collect(),
            nodes: SentinelNodes::default(),
        })
    }

    /// Connects now and returns the primary's `maxmemory-policy` (for start-up
    /// checks and health endpoints). Not needed: the store connects lazily.
    /// In a cluster, one node answers.
    pub async fn eviction_policy(&self) -> Result<String, StoreError> {
        let budget = Duration::from_secs(5);
        let v: Vec<String> = self
            .inner
            .primary
            .run(Call::Command(&eviction_policy_cmd()), budget)
            .await?;
        policy_from_reply(&v)
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

    /// The primary's connections (for the coordinated mode's sync).
    /// Sends `pipe` to the primary in one round trip within `budget`, from
    /// the Redis I/O runtime (the coordinated mode's sync).
    pub(crate) async fn query_pipeline(
        &self,
        pipe: redis::Pipeline,
        budget: Duration,
    ) -> Result<Vec<redis::Value>, StoreError> {
        let inner = self.inner.clone();
        io::call(async move { inner.primary.query_pipeline(&pipe, budget).await }).await
    }

    /// Sends single-key commands in one round trip per node (one pipeline
    /// to a standalone primary; on a cluster, multiplexed per node), from
    /// the Redis I/O runtime: the coordinated mode's sync. The answer to
    /// each command.
    pub(crate) async fn spread(
        &self,
        cmds: Vec<Cmd>,
        budget: Duration,
    ) -> Vec<Result<redis::Value, StoreError>> {
        let inner = self.inner.clone();
        let n = cmds.len();
        io::call(async move { Ok(inner.primary.spread(&cmds, budget).await) })
            .await
            .unwrap_or_else(|e| failed_all(n, e))
    }

    /// Whether this store talks to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if let Primary::Cluster(_) = self.inner.primary {
            return true;
        }
        false
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
        cmd.arg(call.policy.quotas().len());
        (cmd, sent_now)
    }

    fn hash_key(&self, call: &Charge<'_>) -> keys::HashKey {
        keys::hash_key(&self.inner.prefix, call.namespace, call.key)
    }
}

/// Runs one `EVALSHA` of `script` on `primary` within `budget`.
async fn invoke<T: FromRedisValue>(
    primary: &Primary,
    script: &'static redis::Script,
    cmd: &redis::Cmd,
    budget: Duration,
) -> Result<T, StoreError> {
    primary.run(Call::Eval { script, cmd }, budget).await
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
            timeout: call.timeout,
        };
        let inner = self.inner.clone();
        match &self.inner.primary {
            // Queued from here; the batch leaves from the I/O runtime.
            Primary::Lanes(_) => {
                StoreFuture::pending(async move { inner.primary.charge(job, cap).await })
            }
            #[cfg(feature = "cluster")]
            Primary::Cluster(_) => {
                io::store_future(async move { inner.primary.charge(job, cap).await })
            }
        }
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
        let inner = self.inner.clone();
        let budget = c.timeout;
        io::store_future(async move {
            let _written: i64 = invoke(&inner.primary, &scripts::SETTLE, &cmd, budget).await?;
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
        let inner = self.inner.clone();
        let policy = call.policy.clone();
        let budget = call.timeout;
        io::store_future(async move {
            let script = &*scripts::STATUS;
            let deadline = tokio::time::Instant::now() + budget;
            let r: Vec<i64> = match inner.replicas.len() {
                0 => invoke(&inner.primary, script, &cmd, budget).await?,
                n => {
                    let i = inner.next_replica.fetch_add(1, Ordering::Relaxed) % n;
                    let call = Call::Eval { script, cmd: &cmd };
                    match inner.replicas[i].run(call, budget).await {
                        Ok(r) => r,
                        // A read is safe to repeat: the primary answers
                        // within what is left of the budget.
                        Err(_) => {
                            let left =
                                deadline.saturating_duration_since(tokio::time::Instant::now());
                            if left.is_zero() {
                                return Err(StoreError::Timeout(budget));
                            }
                            invoke(&inner.primary, script, &cmd, left).await?
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
        let inner = self.inner.clone();
        io::store_future(async move {
            let (secs, micros): (u64, u64) = inner
                .primary
                .run(Call::Command(&redis::cmd("TIME")), Duration::from_secs(1))
                .await?;
            Ok(Some(secs * 1_000 + micros / 1_000))
        })
    }

    /// Opens every connection to the primary (or the cluster) and to each
    /// replica, each within the connect timeout. The first failure is
    /// returned once all have tried.
    fn connect(&self) -> StoreFuture<Result<(), StoreError>> {
        let inner = self.inner.clone();
        io::store_future(async move {
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
