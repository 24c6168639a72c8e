//! Coordinated mode: fleet-wide limits with no store call on the request path.
//!
//! Each instance decides locally with one number per key, the *drop ratio*
//! `(actual − limit) / actual`, where `actual` is the fleet's offered rate. A
//! background task per layer, every sync interval, reports this instance's
//! offered counts into time-bucketed Redis counters (one pipelined round trip
//! for all keys) and reads back the fleet's count for the last complete
//! interval. Requests are dropped at random with that ratio. Enforcement lags
//! traffic by one to two intervals; the limit holds on average, not per
//! request (use the strict mode for exactness).
//!
//! ```no_run
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use tower_ratelimit::{store::RedisStore, Coordinated, Quota, RateLimitLayer};
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_second(NonZeroU32::new(10_000).unwrap()))
//!     .coordinated(Coordinated::new(RedisStore::new("redis://10.0.0.5")?).sync_interval(Duration::from_secs(1)))
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! Failure: if Redis cannot be reached, the last ratios stay in force until the
//! staleness bound (default three intervals), then fall to zero: the mode fails
//! open. Shadow mode computes and counts would-be drops and drops nothing.

use crate::bounded::{self, Bounded};
use crate::clock::Clock;
use crate::decision::{Decision, QuotaStatus};
use crate::error::ConfigError;
use crate::key::Key;
use crate::periodic::Periodic;
use crate::quota::{Policy, Quota};
use crate::store::{Namespace, RedisStore};
use deadpool_redis::redis::{self, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Settings of the coordinated mode ([`RateLimitLayerBuilder::coordinated`](crate::RateLimitLayerBuilder::coordinated)).
#[derive(Clone, Debug)]
#[must_use]
pub struct Coordinated {
    store: RedisStore,
    interval: Duration,
    max_keys: usize,
    staleness: Option<Duration>,
    seed: Option<u64>,
    background: bool,
    timeout: Option<Duration>,
}

impl Coordinated {
    /// Coordinates through `store`'s Redis (its primary connections).
    pub fn new(store: RedisStore) -> Self {
        Self {
            store,
            interval: Duration::from_secs(1),
            max_keys: 10_000,
            staleness: None,
            seed: None,
            background: true,
            timeout: None,
        }
    }

    /// The budget of one sync round trip (default: half the sync interval, at most 500 ms).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_ratelimit::{store::RedisStore, Coordinated};
    /// let c = Coordinated::new(RedisStore::new("redis://127.0.0.1").unwrap()).sync_timeout(Duration::from_millis(100));
    /// ```
    pub fn sync_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    fn sync_budget(&self) -> Duration {
        self.timeout
            .unwrap_or_else(|| (self.interval / 2).min(Duration::from_millis(500)))
            .max(Duration::from_millis(1))
    }

    /// How often counts are reported and ratios recomputed (default 1 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_ratelimit::{store::RedisStore, Coordinated};
    /// let c = Coordinated::new(RedisStore::new("redis://127.0.0.1").unwrap()).sync_interval(Duration::from_millis(500));
    /// ```
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The most keys tracked by this instance (default 10,000). Past it, the
    /// key that offered least is forgotten for a new one (it is tracked
    /// afresh when it comes back).
    ///
    /// ```
    /// # use tower_ratelimit::{store::RedisStore, Coordinated};
    /// let c = Coordinated::new(RedisStore::new("redis://127.0.0.1").unwrap()).max_keys(1_000);
    /// ```
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n.max(1);
        self
    }

    /// How long ratios stay in force without a successful sync before they
    /// fall to zero (default three sync intervals).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_ratelimit::{store::RedisStore, Coordinated};
    /// let c = Coordinated::new(RedisStore::new("redis://127.0.0.1").unwrap()).staleness(Duration::from_secs(5));
    /// ```
    pub fn staleness(mut self, staleness: Duration) -> Self {
        self.staleness = Some(staleness);
        self
    }

    /// Seeds the random draws (tests and simulations; default: random per process).
    ///
    /// ```
    /// # use tower_ratelimit::{store::RedisStore, Coordinated};
    /// let c = Coordinated::new(RedisStore::new("redis://127.0.0.1").unwrap()).seed(42);
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Runs no background task: the application calls
    /// [`RateLimitLayer::sync_now`](crate::RateLimitLayer::sync_now) itself
    /// (tests and simulations that move time by hand).
    ///
    /// ```
    /// # use tower_ratelimit::{store::RedisStore, Coordinated};
    /// let c = Coordinated::new(RedisStore::new("redis://127.0.0.1").unwrap()).manual_sync();
    /// ```
    pub fn manual_sync(mut self) -> Self {
        self.background = false;
        self
    }

    /// Checks the settings when the layer is built.
    pub(crate) fn check(self) -> Result<Self, ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::new(
                "the coordinated sync interval must be above zero",
            ));
        }
        if self.store.is_cluster() {
            return Err(ConfigError::new(
                "the coordinated mode syncs many clients' keys in one pipeline, which a \
                 Redis Cluster cannot route: give it a standalone Redis",
            ));
        }
        Ok(self)
    }
}

/// Per-key state: offered units since the last sync, and what the fleet did.
#[derive(Debug)]
struct Tracked {
    offered: u64,
    /// The drop ratio in force.
    ratio: f64,
    /// The fleet's offered units in the last complete interval.
    fleet: u64,
    /// The binding quota's limit and window, as of the last request.
    limit: u64,
    window_ms: u64,
    /// Syncs in a row without local traffic.
    idle: u32,
}

impl bounded::Entry for Tracked {
    type Now = ();

    /// A key without local traffic for three syncs is forgotten.
    fn expired(&self, (): ()) -> bool {
        self.idle > 2
    }

    fn worth(&self, (): ()) -> (f64, u64) {
        ((self.offered + self.fleet) as f64, 0)
    }
}

pub(crate) struct Coordinator {
    cfg: Coordinated,
    interval_ms: u64,
    staleness: Duration,
    namespace: Namespace,
    keys: Bounded<Key, Tracked>,
    /// When the last sync succeeded, on the layer clock's monotonic instant.
    synced: std::sync::Mutex<Option<Instant>>,
    clock: Arc<dyn Clock>,
    background: Periodic,
    rng: std::sync::Mutex<fastrand::Rng>,
}

impl Coordinator {
    pub(crate) fn new(cfg: Coordinated, namespace: Namespace, clock: Arc<dyn Clock>) -> Self {
        let interval_ms = (cfg.interval.as_millis() as u64).max(1);
        let staleness = cfg.staleness.unwrap_or(cfg.interval * 3);
        let rng = cfg
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        Self {
            keys: Bounded::new(cfg.max_keys, 16),
            cfg,
            interval_ms,
            staleness,
            namespace,
            synced: std::sync::Mutex::new(None),
            clock,
            background: Periodic::default(),
            rng: std::sync::Mutex::new(rng),
        }
    }

    /// The request path: count the offer, read the key's drop ratio, and
    /// reject when a random draw falls under it.
    pub(crate) fn decide(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
        cost: u64,
        now: u64,
    ) -> Decision {
        self.start_background();
        // The binding quota is the request quota with the lowest rate; the
        // mode counts requests, so quotas in other units are left open.
        let open = |q: &Quota| QuotaStatus {
            limit: q.limit(),
            remaining: q.limit(),
            reset_ms: now + self.interval_ms,
            allowed: true,
            ..QuotaStatus::default()
        };
        let Some((binding, q)) = policy
            .quotas()
            .iter()
            .enumerate()
            .filter(|(_, q)| q.counts_requests())
            .min_by(|(_, a), (_, b)| {
                let ra = a.limit() as f64 / a.window_ms() as f64;
                let rb = b.limit() as f64 / b.window_ms() as f64;
                ra.total_cmp(&rb)
            })
        else {
            return Decision::from_statuses(policy.quotas().iter().map(open), cost);
        };
        let fresh = self.fresh();
        let ((ratio, fleet), _) = self.keys.update(*key, (), |t| match t {
            Some(t) => {
                t.offered += cost;
                t.limit = q.limit();
                t.window_ms = q.window_ms();
                ((if fresh { t.ratio } else { 0.0 }, t.fleet), None)
            }
            None => (
                (0.0, 0),
                Some(Tracked {
                    offered: cost,
                    ratio: 0.0,
                    fleet: 0,
                    limit: q.limit(),
                    window_ms: q.window_ms(),
                    idle: 0,
                }),
            ),
        });
        let drop = ratio > 0.0 && self.draw() < ratio;
        // Headers say what is known: the limit, and an estimate of what the
        // fleet has left from its last complete interval, scaled to the window.
        let used = (fleet as f64 * q.window_ms() as f64 / self.interval_ms as f64).round() as u64;
        let status = QuotaStatus {
            limit: q.limit(),
            remaining: q.limit().saturating_sub(used),
            reset_ms: now + self.interval_ms,
            retry_after_ms: if drop { self.interval_ms } else { 0 },
            allowed: !drop,
            window_id: 0,
            ..QuotaStatus::default()
        };
        // The binding quota in its own slot, the others as open.
        let statuses =
            policy
                .quotas()
                .iter()
                .enumerate()
                .map(|(i, other)| if i == binding { status } else { open(other) });
        Decision::from_statuses(statuses, cost)
    }

    /// Whether the last successful sync is recent enough for its ratios.
    fn fresh(&self) -> bool {
        let synced = *self
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        synced.is_some_and(|at| self.clock.monotonic() < at + self.staleness)
    }

    /// A uniform draw in [0, 1).
    fn draw(&self) -> f64 {
        self.rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .f64()
    }

    fn start_background(self: &Arc<Self>) {
        if !self.cfg.background {
            return;
        }
        self.background.start(self, self.cfg.interval, |this| async move {
            let now = this.clock.now_ms();
            if let Err(e) = this.sync(now).await {
                tracing::warn!(limiter = this.namespace.name(), error = %e, "coordinated rate limit sync failed; ratios decay after the staleness bound");
            }
        });
    }

    fn bucket_key(&self, key: &Key, epoch: u64) -> String {
        format!(
            "{}:o:{epoch}",
            self.cfg.store.redis_key(&self.namespace, key)
        )
    }

    /// One sync: report offered counts, read the fleet's last complete
    /// interval, set each key's drop ratio. One pipelined round trip.
    /// `now` is wall time (Unix ms): every instance buckets by it.
    pub(crate) async fn sync(&self, now: u64) -> Result<(), crate::StoreError> {
        let epoch = now / self.interval_ms;
        let mut batch: Vec<(Key, u64)> = Vec::new();
        self.keys.retain(|key, t| {
            let n = std::mem::take(&mut t.offered);
            if n == 0 {
                t.idle += 1;
                if t.idle > 2 {
                    // No local traffic for a while: stop tracking (costs nothing).
                    return false;
                }
            } else {
                t.idle = 0;
            }
            batch.push((*key, n));
            true
        });
        if batch.is_empty() {
            self.mark_synced();
            return Ok(());
        }
        let ttl = (3 * self.interval_ms).max(1_000);
        let mut pipe = redis::pipe();
        for (key, n) in &batch {
            let current = self.bucket_key(key, epoch);
            if *n > 0 {
                pipe.cmd("INCRBY").arg(&current).arg(*n).ignore();
                pipe.cmd("PEXPIRE").arg(&current).arg(ttl).ignore();
            }
            pipe.cmd("GET")
                .arg(self.bucket_key(key, epoch.saturating_sub(1)));
        }
        let replies = match self
            .cfg
            .store
            .query_pipeline(pipe, self.cfg.sync_budget())
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // The interval's counts are lost (reporting them later into
                // another bucket would fake a spike); ratios stay until the
                // staleness bound, then the mode fails open.
                metrics::counter!("ratelimit_coordinated_sync_failures_total", "limiter" => self.namespace.name().to_owned())
                    .increment(1);
                return Err(e);
            }
        };
        for ((key, _), reply) in batch.iter().zip(replies) {
            let fleet = match reply {
                Value::BulkString(b) => std::str::from_utf8(&b)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
                Value::Int(i) => i.max(0) as u64,
                _ => 0,
            };
            self.keys.update(*key, (), |t| {
                if let Some(t) = t {
                    let limit =
                        t.limit as f64 * self.interval_ms as f64 / t.window_ms.max(1) as f64;
                    t.ratio = if (fleet as f64) > limit {
                        (fleet as f64 - limit) / fleet as f64
                    } else {
                        0.0
                    };
                    t.fleet = fleet;
                }
                ((), None)
            });
        }
        self.mark_synced();
        Ok(())
    }

    fn mark_synced(&self) {
        *self
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(self.clock.monotonic());
    }
}
