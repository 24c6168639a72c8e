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

use crate::decision::{Decision, QuotaStatus};
use crate::key::Key;
use crate::quota::Policy;
use crate::store::{Namespace, RedisStore};
use deadpool_redis::redis::{self, Value};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Settings of the coordinated mode ([`RateLimitLayerBuilder::coordinated`](crate::RateLimitLayerBuilder::coordinated)).
#[derive(Clone, Debug)]
#[must_use]
pub struct Coordinated {
    pub(crate) store: RedisStore,
    pub(crate) interval: Duration,
    pub(crate) max_keys: usize,
    pub(crate) staleness: Option<Duration>,
    pub(crate) seed: Option<u64>,
    pub(crate) background: bool,
    pub(crate) timeout: Option<Duration>,
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

    pub(crate) fn sync_budget(&self) -> Duration {
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

    /// The most keys tracked by this instance (default 10,000). Keys beyond it
    /// are admitted untracked until tracked keys go idle and are dropped.
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
}

/// Per-key state: offered units since the last sync, and what the fleet did.
#[derive(Debug)]
struct Tracked {
    offered: AtomicU64,
    /// Drop ratio × 2^32 (0 = admit all).
    ratio: AtomicU64,
    /// The fleet's offered units in the last complete interval.
    fleet: AtomicU64,
    /// The binding quota's limit and window, as of the last request.
    limit: AtomicU64,
    window_ms: AtomicU64,
    /// Syncs in a row without local traffic.
    idle: AtomicU64,
}

const ONE: f64 = (1u64 << 32) as f64;

pub(crate) struct Coordinator {
    cfg: Coordinated,
    interval_ms: u64,
    staleness_ms: u64,
    namespace: Namespace,
    keys: papaya::HashMap<Key, Tracked>,
    tracked: AtomicUsize,
    /// Unix ms of the last successful sync (0: none yet).
    synced_ms: AtomicU64,
    started: AtomicBool,
    seed: u64,
}

impl Coordinator {
    pub(crate) fn new(cfg: Coordinated, namespace: Namespace) -> Self {
        let interval_ms = (cfg.interval.as_millis() as u64).max(1);
        let staleness_ms = cfg
            .staleness
            .map_or(3 * interval_ms, |d| d.as_millis() as u64);
        let seed = cfg.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(std::process::id())
        });
        Self {
            cfg,
            interval_ms,
            staleness_ms,
            namespace,
            keys: papaya::HashMap::new(),
            tracked: AtomicUsize::new(0),
            synced_ms: AtomicU64::new(0),
            started: AtomicBool::new(false),
            seed,
        }
    }

    /// The request path: an atomic add, an atomic load and a random draw; the
    /// decision is rejected when the draw falls under the key's drop ratio.
    pub(crate) fn decide(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
        cost: u64,
        now: u64,
    ) -> Decision {
        self.start_background();
        // The binding quota is the one with the lowest rate.
        let q = policy
            .quotas()
            .iter()
            .min_by(|a, b| {
                let ra = a.limit() as f64 / a.window_ms() as f64;
                let rb = b.limit() as f64 / b.window_ms() as f64;
                ra.total_cmp(&rb)
            })
            .expect("a policy has a quota");
        let keys = self.keys.pin();
        let tracked = match keys.get(key) {
            Some(t) => Some(t),
            None if self.tracked.load(Ordering::Relaxed) < self.cfg.max_keys => {
                let t = keys.get_or_insert_with(*key, || {
                    self.tracked.fetch_add(1, Ordering::Relaxed);
                    Tracked {
                        offered: AtomicU64::new(0),
                        ratio: AtomicU64::new(0),
                        fleet: AtomicU64::new(0),
                        limit: AtomicU64::new(q.limit()),
                        window_ms: AtomicU64::new(q.window_ms()),
                        idle: AtomicU64::new(0),
                    }
                });
                Some(t)
            }
            // At the cap: admitted untracked (fails open for this key).
            None => None,
        };
        let (ratio, fleet) = match tracked {
            Some(t) => {
                t.offered.fetch_add(cost, Ordering::Relaxed);
                if t.limit.load(Ordering::Relaxed) != q.limit() {
                    t.limit.store(q.limit(), Ordering::Relaxed);
                }
                if t.window_ms.load(Ordering::Relaxed) != q.window_ms() {
                    t.window_ms.store(q.window_ms(), Ordering::Relaxed);
                }
                (self.ratio(t, now), t.fleet.load(Ordering::Relaxed))
            }
            None => (0.0, 0),
        };
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
        let mut statuses = vec![status; 1];
        // Report the binding quota in the policy's first slot, others as unknown-but-open.
        for other in policy.quotas().iter().skip(1) {
            statuses.push(QuotaStatus {
                limit: other.limit(),
                remaining: other.limit(),
                reset_ms: now + self.interval_ms,
                retry_after_ms: 0,
                allowed: true,
                window_id: 0,
                ..QuotaStatus::default()
            });
        }
        Decision::from_statuses(statuses, cost)
    }

    /// The ratio in force at `now`: the last computed one, or zero once the
    /// last successful sync is older than the staleness bound.
    fn ratio(&self, t: &Tracked, now: u64) -> f64 {
        let synced = self.synced_ms.load(Ordering::Relaxed);
        if synced == 0 || now.saturating_sub(synced) >= self.staleness_ms {
            return 0.0;
        }
        t.ratio.load(Ordering::Relaxed) as f64 / ONE
    }

    /// A uniform draw in [0, 1) from a per-thread xorshift generator.
    fn draw(&self) -> f64 {
        thread_local! {
            static STATE: Cell<u64> = const { Cell::new(0) };
        }
        STATE.with(|s| {
            let mut x = s.get();
            if x == 0 {
                static THREADS: AtomicU64 = AtomicU64::new(1);
                x = (self.seed ^ THREADS.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)) | 1;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.set(x);
            (x >> 11) as f64 / (1u64 << 53) as f64
        })
    }

    fn start_background(self: &Arc<Self>) {
        if !self.cfg.background
            || self.started.load(Ordering::Relaxed)
            || self.started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.started.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Self> = Arc::downgrade(self);
        let period = self.cfg.interval;
        rt.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // The layer is gone: stop.
                let Some(this) = weak.upgrade() else { return };
                let now = crate::clock::SystemClock.now_ms_coarse();
                if let Err(e) = this.sync(now).await {
                    tracing::warn!(limiter = this.namespace.name(), error = %e, "coordinated rate limit sync failed; ratios decay after the staleness bound");
                }
            }
        });
    }

    fn bucket_key(&self, key: &Key, epoch: u64) -> String {
        let mut k = self.cfg.store.redis_key(&self.namespace, key);
        k.push_str(":o:");
        k.push_str(&epoch.to_string());
        k
    }

    /// One sync: report offered counts, read the fleet's last complete
    /// interval, set each key's drop ratio. One pipelined round trip.
    pub(crate) async fn sync(&self, now: u64) -> Result<(), crate::StoreError> {
        let epoch = now / self.interval_ms;
        let keys = self.keys.pin_owned();
        let mut batch: Vec<(Key, u64)> = Vec::new();
        let mut idle: Vec<Key> = Vec::new();
        for (key, t) in keys.iter() {
            let n = t.offered.swap(0, Ordering::Relaxed);
            if n == 0 && t.idle.fetch_add(1, Ordering::Relaxed) >= 2 {
                // No local traffic for a while: stop tracking (costs nothing).
                idle.push(*key);
                continue;
            }
            if n > 0 {
                t.idle.store(0, Ordering::Relaxed);
            }
            batch.push((*key, n));
        }
        for k in idle {
            if keys.remove(&k).is_some() {
                self.tracked.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if batch.is_empty() {
            self.synced_ms.store(now.max(1), Ordering::Relaxed);
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
            .primary()
            .query_pipeline(&pipe, self.cfg.sync_budget())
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
            if let Some(t) = keys.get(key) {
                let limit = t.limit.load(Ordering::Relaxed) as f64 * self.interval_ms as f64
                    / t.window_ms.load(Ordering::Relaxed).max(1) as f64;
                let ratio = if (fleet as f64) > limit {
                    (fleet as f64 - limit) / fleet as f64
                } else {
                    0.0
                };
                t.fleet.store(fleet, Ordering::Relaxed);
                t.ratio.store((ratio * ONE) as u64, Ordering::Relaxed);
            }
        }
        self.synced_ms.store(now.max(1), Ordering::Relaxed);
        Ok(())
    }
}
