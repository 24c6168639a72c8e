//! Runtime limits kept in Redis for the whole fleet: one hash per layer
//! (field `default`, and `key:TEXT` per override, each a policy's text
//! form), a version counter beside it, and an epoch: a random id the first
//! change after the keys were lost (a new Redis, `FLUSHDB`, a failover to a
//! replica that missed them) makes anew. A change is one transaction that
//! writes, bumps the version and reads the whole table back. Each instance
//! polls the version and epoch and reads the table again when either moved;
//! a version that went back, or another epoch, is a reset, and the table is
//! read again whatever this instance had installed.

use super::{Change, Snapshot, Table};
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::periodic::Periodic;
use crate::quota::Policy;
use crate::store::{Namespace, RedisStore};
use deadpool_redis::redis::{self, Value};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Keeps a rate limit layer's runtime [`Limits`](super::Limits) in Redis,
/// for every instance of the fleet: set it with
/// [`RateLimitLayerBuilder::shared_limits`](crate::RateLimitLayerBuilder::shared_limits).
///
/// A change is written to Redis first, in one transaction, then applied
/// here; every other instance applies it within its poll interval
/// (default 1 s: one `GET` per instance per interval, and one `HGETALL`
/// when something changed). The limits outlive every instance: a new one
/// reads them in [`RateLimitLayer::connect`](crate::RateLimitLayer::connect),
/// or at the latest on its first poll. While Redis is unreachable a change
/// is refused and each instance keeps the limits it last read.
///
/// They live under the layer's name in the store's prefix (one key for
/// the table, one for its version), so layers with distinct names keep
/// distinct tables. A Redis Cluster is refused: use one primary (with
/// replicas or Sentinel).
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::{rate::SharedLimits, store::RedisStore};
/// let shared = SharedLimits::new(RedisStore::new("redis://127.0.0.1:6379")?)
///     .poll_interval(Duration::from_millis(500));
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct SharedLimits {
    store: RedisStore,
    poll: Duration,
    timeout: Duration,
}

impl SharedLimits {
    /// The limits in `store`'s Redis (its primary connections), polled
    /// every second, each call bounded by one second.
    pub fn new(store: RedisStore) -> Self {
        Self {
            store,
            poll: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        }
    }

    /// How often each instance looks for changes (default 1 s, at least
    /// 10 ms): the longest an instance goes on with old limits.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// How long a change or a poll may take before it fails (default 1 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.store.is_cluster() {
            return Err(ConfigError::new(
                "shared limits live on one Redis primary: a Redis Cluster is not supported \
                 (use a RedisStore with one primary, replicas or Sentinel)",
            ));
        }
        if self.poll < Duration::from_millis(10) {
            return Err(ConfigError::new(format!(
                "the shared limits' poll interval must be at least 10ms, got {:?}",
                self.poll
            )));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new(
                "the shared limits' timeout must be above zero",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedLimits")
            .field("store", &self.store)
            .field("poll", &self.poll)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A layer's shared table: where it lives, and what this instance last read.
pub(crate) struct Shared {
    cfg: SharedLimits,
    namespace: Namespace,
    /// The hash holding the table.
    hash: String,
    /// The counter each change bumps.
    version: String,
    /// The table's epoch: made by the first change after the keys were lost.
    epoch: String,
    /// The version and epoch installed here (`None`: nothing read yet).
    seen: Mutex<Option<Seen>>,
    polling: Periodic,
    /// Whether the last poll failed (its failure is logged once).
    failing: AtomicBool,
}

/// Which table an instance installed: its version, in its epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    version: i64,
    epoch: Option<Vec<u8>>,
}

/// The hash field of the runtime default.
const DEFAULT: &str = "default";
/// The hash field of the policy running in shadow.
const SHADOW: &str = "shadow";
/// Makes the shadow policy the default, when there is one.
const PROMOTE: &str = "local s = redis.call('HGET', KEYS[1], 'shadow') \
    if s then redis.call('HSET', KEYS[1], 'default', s) redis.call('HDEL', KEYS[1], 'shadow') end \
    return 0";
/// The prefix of an override's hash field, before its key's text.
const KEY: &str = "key:";

impl Shared {
    pub(crate) fn new(cfg: SharedLimits, namespace: &Namespace) -> Self {
        // An empty composite: no key extractor makes one, so no client's
        // state shares this tag.
        let base = cfg.store.redis_key(namespace, &Key::composite(&[]));
        Self {
            cfg,
            namespace: namespace.clone(),
            hash: format!("{base}:limits"),
            version: format!("{base}:limits:v"),
            epoch: format!("{base}:limits:e"),
            seen: Mutex::new(None),
            polling: Periodic::default(),
            failing: AtomicBool::new(false),
        }
    }

    /// Writes `change`, and installs the whole table as Redis has it after
    /// it; whether the entry changed was there before.
    pub(crate) async fn write(&self, table: &Table, change: &Change) -> Result<bool, StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let field = match change {
            Change::Default(_) => DEFAULT.to_owned(),
            Change::Shadow(_) | Change::Promote => SHADOW.to_owned(),
            Change::Key(k, _) => format!("{KEY}{k}"),
        };
        // Whether it was there: HSET and HDEL would say it differently.
        pipe.cmd("HEXISTS").arg(&self.hash).arg(&field);
        match change {
            Change::Default(Some(p)) | Change::Shadow(Some(p)) | Change::Key(_, Some(p)) => pipe
                .cmd("HSET")
                .arg(&self.hash)
                .arg(field)
                .arg(p.to_string())
                .ignore(),
            Change::Default(None) | Change::Shadow(None) | Change::Key(_, None) => {
                pipe.cmd("HDEL").arg(&self.hash).arg(field).ignore()
            }
            // Moved inside Redis, so a shadow set meanwhile elsewhere is the one promoted.
            Change::Promote => pipe
                .cmd("EVAL")
                .arg(PROMOTE)
                .arg(1)
                .arg(&self.hash)
                .ignore(),
        };
        // The first change since the keys were lost starts a new epoch.
        pipe.cmd("SET")
            .arg(&self.epoch)
            .arg(format!("{:016x}", fastrand::u64(..)))
            .arg("NX")
            .ignore();
        pipe.cmd("INCR").arg(&self.version);
        pipe.cmd("GET").arg(&self.epoch);
        pipe.cmd("HGETALL").arg(&self.hash);
        let mut reply = self.query(pipe).await?;
        if reply.len() != 4 {
            return Err(protocol(format!("{} replies, not 4", reply.len())));
        }
        let existed = int(reply.remove(0))?.unwrap_or(0) > 0;
        if !self.install(table, reply, false)? {
            // A newer table of this epoch is installed, or this one's
            // version went back (a failover): read what Redis holds now,
            // so the change is in force here before it is reported done.
            self.refresh_now(table, true).await?;
        }
        Ok(existed)
    }

    /// Runs `pipe` on the primary, within the timeout.
    async fn query(&self, pipe: redis::Pipeline) -> Result<Vec<Value>, StoreError> {
        self.cfg.store.query_pipeline(pipe, self.cfg.timeout).await
    }

    /// Reads the whole table and installs it.
    pub(crate) async fn refresh(&self, table: &Table) -> Result<(), StoreError> {
        self.refresh_now(table, false).await
    }

    /// Reads the whole table and installs it; `reset`: even when this
    /// instance installed a later version of the same epoch.
    async fn refresh_now(&self, table: &Table, reset: bool) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("GET").arg(&self.version);
        pipe.cmd("GET").arg(&self.epoch);
        pipe.cmd("HGETALL").arg(&self.hash);
        let reply = self.query(pipe).await?;
        self.install(table, reply, reset).map(drop)
    }

    /// One poll: reads the table again when its version or epoch moved.
    async fn poll(&self, table: &Table) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&self.version);
        pipe.cmd("GET").arg(&self.epoch);
        let [version, epoch]: [Value; 2] = self
            .query(pipe)
            .await?
            .try_into()
            .map_err(|r: Vec<Value>| protocol(format!("{} replies, not 2", r.len())))?;
        let now = as_seen(version, epoch)?;
        let installed = self.seen().clone();
        let reset = match &installed {
            Some(s) if *s == now => return Ok(()),
            Some(s) => s.epoch != now.epoch || s.version > now.version,
            None => false,
        };
        if reset {
            tracing::warn!(
                limiter = self.namespace.name(),
                "the shared rate limits in Redis were reset (their version went back or their \
                 epoch changed: a flush, an eviction or a failover); reading them again"
            );
        }
        self.refresh_now(table, reset).await
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Option<Seen>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs `[version, epoch, hash]` unless a later version of the same
    /// epoch is installed already (two answers may come back out of order)
    /// and this is no `reset`; whether it was installed.
    fn install(&self, table: &Table, reply: Vec<Value>, reset: bool) -> Result<bool, StoreError> {
        let [version, epoch, hash]: [Value; 3] = reply
            .try_into()
            .map_err(|r: Vec<Value>| protocol(format!("{} replies, not 3", r.len())))?;
        let read = as_seen(version, epoch)?;
        let snap = self.parse(table, hash)?;
        let mut installed = self.seen();
        let older = installed
            .as_ref()
            .is_some_and(|s| s.epoch == read.epoch && s.version > read.version);
        if older && !reset {
            return Ok(false);
        }
        *installed = Some(read);
        table.install(snap);
        Ok(true)
    }

    /// The table from `HGETALL`'s answer. An entry that does not read as a
    /// policy for this layer (written by hand, or by another version) is
    /// left out, with a warning, and the rest applies.
    fn parse(&self, table: &Table, hash: Value) -> Result<Snapshot, StoreError> {
        // HGETALL: a map in RESP3, a flat list in RESP2, nil for no hash.
        let pairs: Vec<(Vec<u8>, Vec<u8>)> =
            redis::from_redis_value(hash).map_err(|e| protocol(format!("HGETALL answered {e}")))?;
        let mut snap = Snapshot::default();
        let mut past_cap = 0;
        for (field, value) in pairs {
            let (Ok(field), Ok(value)) = (String::from_utf8(field), String::from_utf8(value))
            else {
                self.skip("a field or value that is not UTF-8", "");
                continue;
            };
            let read = value.parse::<Policy>();
            let policy = match read.and_then(|p| table.check_policy(&p).map(|()| p)) {
                Ok(p) => p,
                Err(e) => {
                    self.skip(&e.to_string(), &field);
                    continue;
                }
            };
            if field == DEFAULT {
                snap.default = Some(policy);
            } else if field == SHADOW {
                snap.shadow = Some(policy);
            } else if let Some(key) = field.strip_prefix(KEY) {
                // The cap a change is held to holds for what is read too
                // (entries written by hand, or by another version).
                if snap.keys.len() >= super::MAX_OVERRIDES {
                    past_cap += 1;
                    continue;
                }
                snap.keys.insert(key.to_owned(), policy);
            } else {
                self.skip("an unknown field", &field);
            }
        }
        if past_cap > 0 {
            tracing::warn!(
                limiter = self.namespace.name(),
                left_out = past_cap,
                "the shared rate limits in Redis hold more than {} overrides; the rest are left out",
                super::MAX_OVERRIDES
            );
        }
        Ok(snap)
    }

    fn skip(&self, why: &str, field: &str) {
        tracing::warn!(
            limiter = self.namespace.name(),
            field_len = field.len(),
            "a shared rate limit entry in Redis is left out: {why}"
        );
    }

    /// Starts polling, once, if a tokio runtime is running.
    pub(crate) fn start(&self, table: &Arc<Table>) {
        self.polling.start(table, self.cfg.poll, |table| async move {
            let Some(this) = table.shared.as_ref() else { return };
        match this.poll(&table).await {
            Ok(()) => {
                if this.failing.swap(false, Ordering::AcqRel) {
                    tracing::info!(limiter = this.namespace.name(), "shared rate limits read again");
                }
            }
            Err(e) => {
                metrics::counter!("ratelimit_shared_limits_poll_failures_total", "limiter" => this.namespace.name().to_owned()).increment(1);
                if !this.failing.swap(true, Ordering::AcqRel) {
                    tracing::warn!(limiter = this.namespace.name(), error = %e, "cannot read the shared rate limits; the last ones read stay");
                }
            }
        }
        });
    }
}

/// A version (no counter reads as 0: nothing was ever changed) and epoch as
/// `GET` answers them.
fn as_seen(version: Value, epoch: Value) -> Result<Seen, StoreError> {
    let epoch: Option<Vec<u8>> =
        redis::from_redis_value(epoch).map_err(|e| protocol(format!("an epoch of {e}")))?;
    Ok(Seen {
        version: int(version)?.unwrap_or(0),
        epoch,
    })
}

fn protocol(what: String) -> StoreError {
    StoreError::Protocol(format!("shared limits: {what}"))
}

/// An integer reply (`GET` of a counter, `INCR`, `HEXISTS`); `None` for nil.
fn int(v: Value) -> Result<Option<i64>, StoreError> {
    redis::from_redis_value(v).map_err(|e| protocol(format!("a count of {e}")))
}
