//! [`RedisStoreBuilder`]: where a [`RedisStore`] connects and how.

#[cfg(feature = "cluster")]
use super::cluster;
use super::eviction::EvictionCheck;
use super::lane::Lanes;
use super::node::{self, Node, Settings, Tls};
use super::store::{Inner, Primary, RedisStore, TimeSource};
use super::url::Redacted;
use crate::error::{ConfigError, ConfigErrorKind};
use redis::{ConnectionAddr, ConnectionInfo};
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

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
    /// Adds a replica that serves [`Store::status`](crate::store::Store::status) reads (repeatable). Replicas
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
    /// [`StoreError::Backlog`](crate::StoreError::Backlog) (answered `503` as an overload, never
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
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                format!(
                    "redis key prefix {:?} must be 1 to 64 printable characters without braces",
                    self.prefix
                ),
            ));
        }
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                "redis timeouts must be above zero",
            ));
        }
        let settings = Settings {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            tls: self.tls.clone(),
        };
        let lanes = |node: Node, n: usize, eviction: Option<EvictionCheck>| {
            Arc::new(Lanes::new(node, n, eviction, settings.response_timeout))
        };
        let (primary, name, shown, sentinel_replicas) = match &self.target {
            Target::Url(url) => {
                let node = Node::from_url(url, &settings)?;
                let name = node_name(&node::connection_info(url, &settings.tls)?);
                let shown = node.shown().to_owned();
                let primary = lanes(node, self.connections, Some(self.eviction));
                (Primary::Lanes(primary), name, shown, None)
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => {
                if !self.replicas.is_empty() {
                    return Err(ConfigError::new(ConfigErrorKind::Conflict,
                        "a Redis Cluster finds its replicas itself: `replica` is for a standalone primary",
                    ));
                }
                let first = urls.first().ok_or_else(|| {
                    ConfigError::new(
                        ConfigErrorKind::Missing,
                        "a Redis Cluster needs at least one seed node url",
                    )
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
                    return Err(ConfigError::new(ConfigErrorKind::Conflict,
                        "Sentinel names the replicas itself: `replica` is for a primary given by url",
                    ));
                }
                let [to_primary, to_replicas] =
                    sentinel::nodes(master, sentinels, nodes, &settings)?;
                let name = format!("sentinel/{master}/{}", nodes.db);
                let shown = to_primary.shown().to_owned();
                let primary = lanes(to_primary, self.connections, Some(self.eviction));
                let replicas = lanes(to_replicas, 1, None);
                (Primary::Lanes(primary), name, shown, Some(replicas))
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
    use super::Redacted;
    use super::SentinelNodes;
    use crate::error::{ConfigError, ConfigErrorKind};
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    use redis::{ConnectionAddr, TlsMode};

    /// The nodes for the primary and for the replicas of `master`.
    pub(super) fn nodes(
        master: &str,
        sentinels: &[String],
        nodes: &SentinelNodes,
        settings: &Settings,
    ) -> Result<[Node; 2], ConfigError> {
        if master.is_empty() {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                "a Sentinel master name must not be empty",
            ));
        }
        let first = sentinels.first().ok_or_else(|| {
            ConfigError::new(
                ConfigErrorKind::Missing,
                "Sentinel needs at least one sentinel url",
            )
        })?;
        let infos = sentinels
            .iter()
            .map(|u| node::connection_info(u, &settings.tls))
            .collect::<Result<Vec<_>, _>>()?;
        let auth = |i: &redis::ConnectionInfo| {
            let s = i.redis_settings();
            (
                s.username().map(str::to_owned),
                s.password().map(str::to_owned),
            )
        };
        if infos.iter().any(|i| auth(i) != auth(&infos[0])) {
            return Err(ConfigError::new(
                ConfigErrorKind::Store,
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
                .map_err(|e| {
                    ConfigError::new(
                        ConfigErrorKind::Store,
                        format!("sentinel {}: {e}", Redacted(first)),
                    )
                })?
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
                    super::super::tls::install_crypto_provider();
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
            b.build().map_err(|e| {
                ConfigError::new(
                    ConfigErrorKind::Store,
                    format!("sentinel {}: {e}", Redacted(first)),
                )
            })
        };
        let primary = build(SentinelServerType::Master)?;
        let replicas = build(SentinelServerType::Replica)?;
        Ok([
            Node::sentinel(primary, shown.clone(), nodes.tls, settings)?,
            Node::sentinel(
                replicas,
                shown.replace("the primary", "a replica"),
                nodes.tls,
                settings,
            )?,
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
    /// policy. [`Store::status`](crate::store::Store::status) reads go to a replica Sentinel knows (to the
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
}
