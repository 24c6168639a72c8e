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
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use crate::periodic::Periodic;
use crate::store::{Namespace, RedisStore, SharedTable, TableRead, TableWrite};
use crate::Policy;
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
        if !SharedTable::supported(&self.store) {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                "shared limits live on one Redis primary: a Redis Cluster is not supported \
                 (use a RedisStore with one primary, replicas or Sentinel)",
            ));
        }
        if self.poll < Duration::from_millis(10) {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                format!(
                    "the shared limits' poll interval must be at least 10ms, got {:?}",
                    self.poll
                ),
            ));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
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
    /// The table in Redis.
    table: SharedTable,
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
/// The prefix of an override's hash field, before its key's text.
const KEY: &str = "key:";

impl Shared {
    pub(crate) fn new(cfg: SharedLimits, namespace: &Namespace) -> Self {
        Self {
            table: SharedTable::new(cfg.store.clone(), namespace),
            cfg,
            namespace: namespace.clone(),
            seen: Mutex::new(None),
            polling: Periodic::default(),
            failing: AtomicBool::new(false),
        }
    }

    /// Writes `change`, and installs the whole table as Redis has it after
    /// it; whether the entry changed was there before.
    pub(crate) async fn write(&self, table: &Table, change: &Change) -> Result<bool, StoreError> {
        let key;
        let field = match change {
            Change::Default(_) => DEFAULT,
            Change::Shadow(_) | Change::Promote => SHADOW,
            Change::Key(k, _) => {
                key = format!("{KEY}{k}");
                &key
            }
        };
        let write = match change {
            Change::Default(Some(p)) | Change::Shadow(Some(p)) | Change::Key(_, Some(p)) => {
                TableWrite::Set(field, p.to_string())
            }
            Change::Default(None) | Change::Shadow(None) | Change::Key(_, None) => {
                TableWrite::Remove(field)
            }
            // Moved inside Redis, so a shadow set meanwhile elsewhere is the one promoted.
            Change::Promote => TableWrite::Promote(field),
        };
        let (existed, read) = self.table.write(write, self.cfg.timeout).await?;
        if !self.install(table, read, false)? {
            // A newer table of this epoch is installed, or this one's
            // version went back (a failover): read what Redis holds now,
            // so the change is in force here before it is reported done.
            self.refresh_now(table, true).await?;
        }
        Ok(existed)
    }

    /// Reads the whole table and installs it.
    pub(crate) async fn refresh(&self, table: &Table) -> Result<(), StoreError> {
        self.refresh_now(table, false).await
    }

    /// Reads the whole table and installs it; `reset`: even when this
    /// instance installed a later version of the same epoch.
    async fn refresh_now(&self, table: &Table, reset: bool) -> Result<(), StoreError> {
        let read = self.table.read(self.cfg.timeout).await?;
        self.install(table, read, reset).map(drop)
    }

    /// One poll: reads the table again when its version or epoch moved.
    async fn poll(&self, table: &Table) -> Result<(), StoreError> {
        let (version, epoch) = self.table.version(self.cfg.timeout).await?;
        let now = Seen { version, epoch };
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

    /// Installs `read` unless a later version of the same epoch is
    /// installed already (two answers may come back out of order) and this
    /// is no `reset`; whether it was installed.
    fn install(&self, table: &Table, read: TableRead, reset: bool) -> Result<bool, StoreError> {
        let snap = self.parse(table, read.entries);
        let read = Seen {
            version: read.version,
            epoch: read.epoch,
        };
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

    /// The table from its entries. An entry that does not read as a
    /// policy for this layer (written by hand, or by another version) is
    /// left out, with a warning, and the rest applies.
    fn parse(&self, table: &Table, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Snapshot {
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
        snap
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
