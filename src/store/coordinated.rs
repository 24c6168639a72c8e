//! The coordinated mode: [`Coordinated`], a store that decides in this
//! process and syncs with the fleet in the background.

use super::call::{Charge, Namespace, Settle};
use super::future::StoreFuture;
use super::redis::{CounterReport, CounterSync, RedisStore};
use super::sharded::ShardedStore;
use super::Store;
use crate::bounded::{self, Bounded};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, QuotaStatus};
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::periodic::Periodic;
use crate::{Policy, Quota};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// The coordinated mode's store: decides in this process, holding each key
/// to this instance's share of its limit, and syncs counts with the fleet
/// through Redis in the background. Clones share one state; one store
/// serves any number of layers, each in its own namespace.
///
/// Coordinated mode: fleet-wide limits with no store call on the request
/// path, as a [`Store`] that answers in this process and syncs with the
/// fleet in the background (feature `coordinated`).
///
/// Every sync interval, at a point in the middle half of the interval (on
/// the wall clock every instance shares, chosen at random per instance), a
/// background task reports what this instance was offered and what it
/// admitted into Redis counters, one pair per key and interval (the
/// interval the requests arrived in), and reads back the fleet's counts for
/// the interval before the last, which every instance reported at least
/// half an interval earlier. From the offered counts each instance learns
/// its **share** of the key's traffic, and so its share of the limit:
///
/// ```text
/// allowance = correction × limit × (own offered ÷ fleet offered)
/// ```
///
/// The shares of all instances add up to one whatever the counts are, so
/// noise in them does not turn into overshoot. But an instance whose load
/// is under its share for a moment cannot lend the rest to one that is
/// over it, so where each instance's load wobbles around its share (a
/// random balancer, bursty clients) allowances adding up to the limit
/// admit less than it. The admitted counts measure that **shortfall**: the
/// fleet's offered units (at most the limit) minus what it admitted. Each
/// sync hands a quarter of it back through the key's **correction**, a
/// factor on the allowance that rises while the fleet admits less than it
/// should and falls when it admits more. It stays between 1 (the
/// uncorrected allowances are the floor) and 1.2: over a surge's first two
/// intervals, met with the allowances from before it and full budgets,
/// the fleet admits at most 1.5 times the limit with the default burst.
///
/// Between syncs, each instance holds its admissions to its allowance with
/// a local budget that refills at that rate and holds half a sync interval
/// of it (see [`CoordinatedBuilder::burst`]): a surge is met the moment it
/// reaches an instance, and when it ends the instance admits again at once,
/// with no ratio left to decay. An instance with no share yet (it just
/// joined, or the key is new to it) drops at random with the fleet-wide
/// ratio `(fleet − limit) ÷ fleet` instead.
///
/// ```no_run
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tower_ratelimit::store::{Coordinated, RedisStore};
/// use tower_ratelimit::{Quota, RateLimitLayer};
/// let coordinated = Coordinated::builder(RedisStore::new("redis://10.0.0.5")?)
///     .sync_interval(Duration::from_secs(1))
///     .build()?;
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::per_second(NonZeroU32::new(10_000).unwrap()))
///     .store(coordinated)
///     .build()?;
/// # Ok(()) }
/// ```
///
/// # What moves the shares
///
/// Shares come from counts one to two intervals old, which is right while
/// the balancer keeps spreading load the way it did:
/// - an **uneven balancer** is no problem: each instance's share is what it
///   really receives;
/// - a **spike at one instance** is held to that instance's old share, so
///   the fleet stays at the limit and that instance's clients see the drops,
///   until the next counts give it the larger share (two intervals);
/// - an instance that **joins** drops with the fleet-wide ratio until it has
///   a share; one that **leaves** takes its share with it, so the others
///   admit a little less than the limit for two intervals;
/// - a key **new to the fleet** is admitted in full for its first two to
///   three intervals, until its first counts are read.
///
/// The limit holds on average, not per request: the repository's fleet
/// simulation (`tools/src/bin/simulate.rs`) measures surges, low rates and
/// balancers (figures in its `docs/performance.md`).
///
/// # What it counts
///
/// It counts requests: a quota in another unit (tokens, bytes) is settled
/// after the response, which this mode cannot do, so a fixed policy with one
/// is refused when the layer is built, and one chosen per request is left
/// open. A settlement or refund changes nothing (it counts offered load),
/// and a status read shows what the last sync learned.
///
/// # Redis load
///
/// Each sync sends four commands per key the instance saw lately (two
/// `HINCRBY`, of the offered and the admitted count, and a `PEXPIRE` into
/// the interval's hash; an `HMGET` of the interval read), in one round
/// trip per Redis node, whatever the request rate:
///
/// ```text
/// commands per second = 4 × instances × active keys per instance ÷ interval
/// ```
///
/// With many instances and keys, spread the counters over a Cluster
/// (`RedisStore::cluster`) or shards ([`Coordinated::sharded`]), or
/// lengthen the interval. Every instance also holds connections to every
/// node: with thousands of instances, raise Redis's `maxclients`.
///
/// If a node does not answer, only its keys keep their last shares, until
/// the staleness bound (default three intervals); then their charges fail
/// ([`StoreError::Unavailable`]) and the layer's failure policy answers them
/// (by default admitted without headers, counted in
/// `ratelimit_store_failure_decisions_total{action="open"}`). After an
/// outage the counts of its intervals are partial, so shares take a few
/// intervals to settle. A failed sync counts in
/// `ratelimit_coordinated_sync_failures_total`.
#[derive(Clone)]
pub struct Coordinated {
    inner: Arc<Shared>,
}

/// What the clones of a [`Coordinated`] share.
struct Shared {
    cfg: CoordinatedBuilder,
    /// Where the counters live: each key's Redis.
    stores: Vec<RedisStore>,
    /// One coordinator per limiter (namespace id).
    limiters: Mutex<HashMap<u64, Arc<Coordinator>>>,
}

/// Configures a [`Coordinated`] store.
#[derive(Clone)]
#[must_use]
pub struct CoordinatedBuilder {
    counters: Counters,
    interval: Duration,
    burst: Option<Duration>,
    max_keys: usize,
    staleness: Option<Duration>,
    seed: Option<u64>,
    background: bool,
    timeout: Option<Duration>,
    clock: Arc<dyn Clock>,
}

/// Where the counters live.
#[derive(Clone, Debug)]
enum Counters {
    /// One Redis (a standalone primary, Sentinel's primary, or a Cluster).
    One(RedisStore),
    /// Spread over shards by key, as the sharded store places its keys.
    Sharded(ShardedStore),
}

impl Coordinated {
    /// A coordinated store over `store`'s Redis, with the default settings.
    pub fn new(store: RedisStore) -> Result<Self, ConfigError> {
        Self::builder(store).build()
    }

    /// Configures a coordinated store over `store`'s Redis: its primary, or
    /// on a Cluster the primary serving each key's slot.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap())
    ///     .sync_interval(Duration::from_millis(500))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn builder(store: RedisStore) -> CoordinatedBuilder {
        CoordinatedBuilder::with(Counters::One(store))
    }

    /// Configures a coordinated store whose counters are spread over the
    /// shards of `store`, each key's on the shard that holds its state with
    /// the sharded store itself. Every shard must be a Redis one (added with
    /// [`ShardedStoreBuilder::shard`](crate::store::ShardedStoreBuilder::shard)).
    ///
    /// ```no_run
    /// use tower_ratelimit::store::{Coordinated, ShardedStore};
    /// let shards = ShardedStore::from_urls(["redis://10.0.0.1", "redis://10.0.0.2"]).unwrap();
    /// let c = Coordinated::sharded(shards).build().unwrap();
    /// ```
    pub fn sharded(store: ShardedStore) -> CoordinatedBuilder {
        CoordinatedBuilder::with(Counters::Sharded(store))
    }

    /// Runs one sync of every limiter now, at time `now_ms` (Unix ms; the
    /// background task does this every interval): report counts, read the
    /// fleet's, set shares. For tests and simulations that move time by hand
    /// ([`CoordinatedBuilder::manual_sync`]).
    pub async fn sync_now(&self, now_ms: u64) -> Result<(), StoreError> {
        let limiters: Vec<_> = self.lock().values().cloned().collect();
        let mut result = Ok(());
        for c in limiters {
            result = result.and(c.sync(now_ms).await);
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Coordinator>>> {
        self.inner
            .limiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The coordinator of limiter `namespace`, made on its first call.
    fn coordinator(&self, namespace: &Namespace) -> Arc<Coordinator> {
        self.lock()
            .entry(namespace.id())
            .or_insert_with(|| Arc::new(Coordinator::new(self.inner.clone(), namespace.clone())))
            .clone()
    }
}

impl CoordinatedBuilder {
    fn with(counters: Counters) -> Self {
        Self {
            counters,
            interval: Duration::from_secs(1),
            burst: None,
            max_keys: 10_000,
            staleness: None,
            seed: None,
            background: true,
            timeout: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// The clock the background sync keeps time by, and staleness is
    /// measured on (default [`SystemClock`]); give the layers' clock when
    /// it is another ([`ManualClock`](crate::clock::ManualClock) in tests).
    ///
    /// ```
    /// use tower_ratelimit::clock::ManualClock;
    /// use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let clock = ManualClock::new(0);
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).clock(clock);
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The budget of one sync round trip (default: half the sync interval, at most 500 ms).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).sync_timeout(Duration::from_millis(100));
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

    /// How often counts are reported and shares recomputed (default 1 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).sync_interval(Duration::from_millis(500));
    /// ```
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// How far ahead of its allowance an instance may run: its local budget
    /// holds this long of its allowance, and at least five requests
    /// (default half the sync interval). Longer absorbs burstier traffic at
    /// each instance; shorter lets less of a surge through before the
    /// budget binds: with the default and a 1 s interval, the fleet admits
    /// at most 1.25 times its limit over a surge's first two seconds (1.5
    /// times when the allowances were raised to make up a shortfall, at
    /// most by a fifth, just before it).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).burst(Duration::from_millis(200));
    /// ```
    pub fn burst(mut self, burst: Duration) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The most keys tracked by this instance (default 10,000). Past it, the
    /// key that offered least is forgotten for a new one (it is tracked
    /// afresh when it comes back).
    ///
    /// ```
    /// # use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).max_keys(1_000);
    /// ```
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n.max(1);
        self
    }

    /// How long a key's share stays in force without a successful sync of
    /// that key before the key fails open (default three sync intervals).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).staleness(Duration::from_secs(5));
    /// ```
    pub fn staleness(mut self, staleness: Duration) -> Self {
        self.staleness = Some(staleness);
        self
    }

    /// Seeds the random draws (tests and simulations; default: random per process).
    ///
    /// ```
    /// # use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).seed(42);
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Runs no background task: the application calls
    /// [`Coordinated::sync_now`] itself (tests and simulations that move
    /// time by hand).
    ///
    /// ```
    /// # use tower_ratelimit::store::{Coordinated, RedisStore};
    /// let c = Coordinated::builder(RedisStore::new("redis://127.0.0.1").unwrap()).manual_sync();
    /// ```
    pub fn manual_sync(mut self) -> Self {
        self.background = false;
        self
    }

    /// Checks the settings and builds the store.
    pub fn build(self) -> Result<Coordinated, ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                "the coordinated sync interval must be above zero",
            ));
        }
        let stores = match &self.counters {
            Counters::One(store) => vec![store.clone()],
            Counters::Sharded(sharded) => sharded.redis_shards().ok_or_else(|| {
                ConfigError::new(
                    ConfigErrorKind::Conflict,
                    "the coordinated mode keeps its counters in Redis: every shard of its \
                     sharded store must be a Redis store (ShardedStoreBuilder::shard)",
                )
            })?,
        };
        Ok(Coordinated {
            inner: Arc::new(Shared {
                cfg: self,
                stores,
                limiters: Mutex::new(HashMap::new()),
            }),
        })
    }
}

impl fmt::Debug for CoordinatedBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoordinatedBuilder")
            .field("counters", &self.counters)
            .field("interval", &self.interval)
            .field("burst", &self.burst)
            .field("max_keys", &self.max_keys)
            .field("staleness", &self.staleness)
            .field("background", &self.background)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Coordinated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinated")
            .field("settings", &self.inner.cfg)
            .field("limiters", &self.lock().len())
            .finish()
    }
}

impl Store for Coordinated {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        let c = self.coordinator(call.namespace);
        StoreFuture::ready(
            c.decide(call.key, call.policy, call.cost, call.now_ms)
                .map_err(|Stale| {
                    StoreError::Unavailable(
                        "this key's coordinated share is past its staleness bound (its counts \
                         did not sync)"
                            .into(),
                    )
                }),
        )
    }

    /// Nothing to give back or charge: the mode counts offered load.
    fn settle(&self, _: &Settle<'_>) -> StoreFuture<Result<(), StoreError>> {
        StoreFuture::ready(Ok(()))
    }

    /// What the last sync learned of the key, charging nothing.
    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        let c = self.coordinator(call.namespace);
        StoreFuture::ready(Ok(c.peek(call.key, call.policy, call.now_ms)))
    }

    fn is_local(&self) -> bool {
        true
    }

    /// A fixed policy with a quota in another unit than requests is
    /// refused: this mode counts requests and settles nothing.
    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        if policy.quotas().iter().any(|q| !q.counts_requests()) {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                "the coordinated mode counts requests: a quota in another unit (tokens, \
                 bytes) is settled in the store, so limit it with a layer of another store",
            ));
        }
        crate::store::backend::plain_only(policy, "the coordinated mode")
    }

    fn identity(&self) -> Option<String> {
        let ids: Option<Vec<String>> = self.inner.stores.iter().map(Store::identity).collect();
        Some(format!("coordinated[{}]", ids?.join(",")))
    }
}

/// How many intervals of local counts a key keeps: the one being counted,
/// the ones not yet reported, and the one shares are read from.
const EPOCHS: usize = 4;

/// The fewest units a local budget holds, however low the allowance: with
/// only a unit or two, a budget cannot carry what an instance did not use
/// in one quiet moment over to the next busy one.
const MIN_BURST: f64 = 5.0;

/// How much of the fleet's shortfall one sync hands back
/// ([`Coordinator::correct`]): a change shows in the counts two to three
/// syncs later, and handing all of it back at once would overshoot and
/// oscillate.
const GAIN: f64 = 0.25;

/// The most the correction multiplies allowances by. A surge's first two
/// intervals meet the allowances from before it, with full budgets (half
/// an interval by default): at most (2 + 0.5) × 1.2 = 3 intervals of the
/// limit, 1.5 times it.
const MAX_CORRECTION: f64 = 1.2;

/// This instance's offered and admitted units in one interval.
#[derive(Clone, Copy, Debug, Default)]
struct Count {
    epoch: u64,
    offered: u64,
    admitted: u64,
    /// Whether it was sent: a report goes at most once (a failed `HINCRBY`
    /// may have run, and a second would count the interval twice).
    sent: bool,
    /// Whether Redis confirmed it, so the fleet's count holds it.
    landed: bool,
}

/// What the last sync taught about a key.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Share {
    /// Nothing to hold to: no sync yet, or the fleet is under the limit and
    /// this instance sent nothing.
    Open,
    /// This instance's share of the limit, in units per millisecond.
    Allowance(f64),
    /// No share of its own yet: drop at random with the fleet's ratio.
    Ratio(f64),
}

/// Per-key state.
#[derive(Debug)]
struct Tracked {
    counts: [Count; EPOCHS],
    share: Share,
    /// The local budget: units left, and when it was last refilled (layer clock, ms).
    budget: f64,
    refilled: u64,
    /// The fleet's offered units in the last interval read.
    fleet: u64,
    /// What the allowance is multiplied by to hand the fleet's shortfall
    /// back ([`Coordinator::correct`]), from 1 to [`MAX_CORRECTION`].
    correction: f64,
    /// When this key last synced (or, before its first sync, was first
    /// tracked), on the layer clock's monotonic instant.
    synced: Instant,
    /// The binding quota's limit and window, as of the last request.
    limit: u64,
    window_ms: u64,
}

impl Tracked {
    fn new(limit: u64, window_ms: u64, now: u64, mono: Instant) -> Self {
        Self {
            counts: [Count::default(); EPOCHS],
            share: Share::Open,
            budget: 0.0,
            refilled: now,
            fleet: 0,
            correction: 1.0,
            synced: mono,
            limit,
            window_ms,
        }
    }

    fn count(&mut self, epoch: u64, cost: u64, admitted: bool) {
        let c = &mut self.counts[(epoch % EPOCHS as u64) as usize];
        if c.epoch != epoch {
            *c = Count {
                epoch,
                ..Count::default()
            };
        }
        c.offered = c.offered.saturating_add(cost);
        if admitted {
            c.admitted = c.admitted.saturating_add(cost);
        }
    }

    fn at(&self, epoch: u64) -> Option<&Count> {
        let c = &self.counts[(epoch % EPOCHS as u64) as usize];
        (c.epoch == epoch && c.offered > 0).then_some(c)
    }

    /// The binding quota's limit per sync interval of `interval_ms`.
    fn limit_per(&self, interval_ms: u64) -> f64 {
        self.limit as f64 * interval_ms as f64 / self.window_ms.max(1) as f64
    }

    fn newest(&self) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.offered > 0)
            .map(|c| c.epoch)
            .max()
            .unwrap_or(0)
    }
}

impl bounded::Entry for Tracked {
    /// The current interval.
    type Now = u64;

    /// A key without local traffic for three intervals is forgotten.
    fn expired(&self, epoch: u64) -> bool {
        self.newest() + 3 < epoch
    }

    fn worth(&self, _: u64) -> (f64, u64) {
        let offered: f64 = self.counts.iter().map(|c| c.offered as f64).sum();
        (offered + self.fleet as f64, 0)
    }
}

/// A request's verdict.
enum Verdict {
    Admit,
    /// Dropped: when to try again (ms).
    Drop(u64),
}

/// A key's share is past the staleness bound (no sync of it succeeded in
/// that long): its charge fails, and the failure policy answers it.
#[derive(Debug)]
struct Stale;

/// The quota a request is held to: the one counting requests with the
/// lowest rate (quotas in other units are left open), with its index.
fn binding(policy: &Policy) -> Option<(usize, &Quota)> {
    let rate = |q: &Quota| q.limit() as f64 / q.window_ms() as f64;
    policy
        .quotas()
        .iter()
        .enumerate()
        .filter(|(_, q)| q.counts_requests())
        .min_by(|(_, a), (_, b)| rate(a).total_cmp(&rate(b)))
}

/// One limiter's coordination (a layer's namespace in a [`Coordinated`]).
struct Coordinator {
    shared: Arc<Shared>,
    interval_ms: u64,
    /// When in each interval the background task syncs (ms after its start).
    phase_ms: u64,
    burst_ms: f64,
    staleness: Duration,
    namespace: Namespace,
    keys: Bounded<Key, Tracked>,
    background: Periodic,
    rng: Mutex<fastrand::Rng>,
}

impl Coordinator {
    fn new(shared: Arc<Shared>, namespace: Namespace) -> Self {
        let cfg = &shared.cfg;
        let interval_ms = (cfg.interval.as_millis() as u64).max(1);
        let staleness = cfg.staleness.unwrap_or(cfg.interval.saturating_mul(3));
        let burst_ms = cfg
            .burst
            .map_or(interval_ms as f64 / 2.0, |b| b.as_secs_f64() * 1e3);
        let mut rng = cfg
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        let phase_ms = interval_ms / 4 + rng.u64(0..(interval_ms / 2).max(1));
        Self {
            keys: Bounded::new(cfg.max_keys, 16),
            interval_ms,
            phase_ms,
            burst_ms,
            staleness,
            namespace,
            shared,
            background: Periodic::default(),
            rng: Mutex::new(rng),
        }
    }

    fn clock(&self) -> &dyn Clock {
        &*self.shared.cfg.clock
    }

    /// The request path: hold the offer to the key's allowance (or its
    /// fleet ratio), and count it and whether it was admitted. A key whose
    /// share is stale is not decided here.
    fn decide(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
        cost: u64,
        now: u64,
    ) -> Result<Decision, Stale> {
        self.start_background();
        let Some((binding, q)) = binding(policy) else {
            return Ok(self.answer(policy, None, now, cost));
        };
        let epoch = now / self.interval_ms;
        let mono = self.clock().monotonic();
        let ((verdict, fleet, stale), _) = self.keys.update(*key, epoch, |t| match t {
            Some(t) => {
                t.limit = q.limit();
                t.window_ms = q.window_ms();
                let stale = mono.saturating_duration_since(t.synced) >= self.staleness;
                let verdict = if stale {
                    Verdict::Admit
                } else {
                    self.verdict(t, cost, now)
                };
                t.count(epoch, cost, matches!(verdict, Verdict::Admit));
                ((verdict, t.fleet, stale), None)
            }
            None => {
                let mut t = Tracked::new(q.limit(), q.window_ms(), now, mono);
                t.count(epoch, cost, true);
                ((Verdict::Admit, 0, false), Some(t))
            }
        });
        if stale {
            return Err(Stale);
        }
        let retry_after_ms = match verdict {
            Verdict::Admit => None,
            Verdict::Drop(ms) => Some(ms),
        };
        Ok(self.answer(policy, Some((binding, fleet, retry_after_ms)), now, cost))
    }

    /// What the last sync learned of `key`, counting nothing: a status read.
    fn peek(&self, key: &Key, policy: &Policy, now: u64) -> Decision {
        let known = binding(policy).map(|(binding, _)| {
            let fleet = self
                .keys
                .read(key, now / self.interval_ms, |t| t.fleet)
                .unwrap_or(0);
            (binding, fleet, None)
        });
        self.answer(policy, known, now, 0)
    }

    /// The statuses of a request of `cost` at `now`: the binding quota (its
    /// index, the fleet's offered units in the interval read, when the
    /// request may try again if dropped) in its own slot, with an estimate
    /// of what the fleet has left scaled to the quota's window; every other
    /// quota open.
    fn answer(
        &self,
        policy: &Policy,
        binding: Option<(usize, u64, Option<u64>)>,
        now: u64,
        cost: u64,
    ) -> Decision {
        let open = |q: &Quota| QuotaStatus {
            limit: q.limit(),
            remaining: q.limit(),
            reset_ms: now + self.interval_ms,
            allowed: true,
            ..QuotaStatus::default()
        };
        let statuses = policy
            .quotas()
            .iter()
            .enumerate()
            .map(|(i, q)| match binding {
                Some((b, fleet, retry_after_ms)) if b == i => {
                    let used = (fleet as f64 * q.window_ms() as f64 / self.interval_ms as f64)
                        .round() as u64;
                    QuotaStatus {
                        limit: q.limit(),
                        remaining: q.limit().saturating_sub(used),
                        reset_ms: now + self.interval_ms,
                        retry_after_ms: retry_after_ms.unwrap_or(0),
                        allowed: retry_after_ms.is_none(),
                        window_id: 0,
                        ..QuotaStatus::default()
                    }
                }
                _ => open(q),
            });
        Decision::from_statuses(statuses, cost)
    }

    /// Holds one request of `cost` to the key's share, spending its budget.
    fn verdict(&self, t: &mut Tracked, cost: u64, now: u64) -> Verdict {
        match t.share {
            Share::Open => Verdict::Admit,
            Share::Ratio(ratio) if self.draw() < ratio => Verdict::Drop(self.interval_ms),
            Share::Ratio(_) => Verdict::Admit,
            Share::Allowance(rate) => {
                // A request dearer than the budget holds still passes when
                // the budget is full, unless it exceeds the fleet's whole
                // limit for an interval.
                let cap = self
                    .capacity(rate)
                    .max((cost as f64).min(t.limit_per(self.interval_ms)));
                let elapsed = now.saturating_sub(t.refilled) as f64;
                t.budget = (t.budget + elapsed * rate).min(cap);
                t.refilled = now.max(t.refilled);
                if t.budget >= cost as f64 {
                    t.budget -= cost as f64;
                    Verdict::Admit
                } else {
                    let wait = ((cost as f64 - t.budget) / rate).ceil() as u64;
                    Verdict::Drop(wait.clamp(1, self.interval_ms))
                }
            }
        }
    }

    /// What a local budget holds at an allowance of `rate` units per ms.
    fn capacity(&self, rate: f64) -> f64 {
        (rate * self.burst_ms).max(MIN_BURST)
    }

    /// A uniform draw in [0, 1).
    fn draw(&self) -> f64 {
        self.rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .f64()
    }

    fn start_background(self: &Arc<Self>) {
        if !self.shared.cfg.background {
            return;
        }
        self.background.start(self, self.shared.cfg.interval, |this| async move {
            // Sync at this instance's phase of the wall-clock interval, in
            // its middle half: an interval is reported at least half an
            // interval before anyone reads it, whatever the clocks' skew
            // and the syncs' latency (up to that), and the fleet's syncs
            // are spread over half of each interval.
            let at = this.clock().now_ms() % this.interval_ms;
            let wait = (this.phase_ms + this.interval_ms - at) % this.interval_ms;
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let now = this.clock().now_ms();
            if let Err(e) = this.sync(now).await {
                tracing::warn!(limiter = this.namespace.name(), error = %e, "coordinated rate limit sync failed for some keys; they fail after the staleness bound");
            }
        });
    }

    /// Which counter store holds `key`.
    fn store_of(&self, key: &Key) -> usize {
        match &self.shared.cfg.counters {
            Counters::One(_) => 0,
            Counters::Sharded(sharded) => sharded.index(&self.namespace, key),
        }
    }

    /// One sync at wall time `now` (Unix ms; every instance counts
    /// intervals by it): report the intervals that ended, read the fleet's
    /// counts of the one before the last (which every instance reported
    /// during the last interval), and set each key's share. One round trip
    /// per Redis node.
    async fn sync(&self, now: u64) -> Result<(), StoreError> {
        let epoch = now / self.interval_ms;
        let read = epoch.saturating_sub(2);
        // Per key: its counter store, its reports, and its own count in the
        // interval read (if Redis confirmed it).
        let mut items: Vec<(Key, usize, Vec<CounterReport>, u64)> = Vec::new();
        self.keys.retain(|key, t| {
            if bounded::Entry::expired(t, epoch) {
                return false;
            }
            let local = t.at(read).filter(|c| c.landed).map_or(0, |c| c.offered);
            // The intervals that ended since the one read now (never that
            // one: a late report would reach some readers and not others).
            let mut reports = Vec::new();
            for c in t
                .counts
                .iter_mut()
                .filter(|c| c.epoch > read && c.epoch < epoch)
            {
                if c.offered > 0 && !c.sent {
                    reports.push(CounterReport {
                        epoch: c.epoch,
                        offered: c.offered,
                        admitted: c.admitted,
                    });
                }
                c.sent = true;
            }
            items.push((*key, self.store_of(key), reports, local));
            true
        });
        if items.is_empty() {
            return Ok(());
        }
        // The counters outlive the read by an interval.
        let ttl = self.interval_ms.saturating_mul(4);
        let budget = self.shared.cfg.sync_budget();
        let sends = self.shared.stores.iter().enumerate().map(|(s, store)| {
            let mine: Vec<usize> = (0..items.len()).filter(|&i| items[i].1 == s).collect();
            let calls: Vec<CounterSync<'_>> = mine
                .iter()
                .map(|&i| CounterSync {
                    key: &items[i].0,
                    reports: &items[i].2,
                    read,
                })
                .collect();
            async move {
                let synced = match calls.is_empty() {
                    true => Vec::new(),
                    false => {
                        store
                            .sync_counters(&self.namespace, &calls, ttl, budget)
                            .await
                    }
                };
                (mine, synced)
            }
        });
        let mut failure = None;
        let mono = self.clock().monotonic();
        for (mine, synced) in futures_util::future::join_all(sends).await {
            for (i, s) in mine.into_iter().zip(synced) {
                let (key, _, reports, local) = &items[i];
                let landed = match s.landed {
                    Ok(()) => true,
                    Err(e) => {
                        failure.get_or_insert(e);
                        false
                    }
                };
                let fleet = match s.fleet {
                    Ok((offered, admitted)) => Some(Tally { offered, admitted }),
                    Err(e) => {
                        failure.get_or_insert(e);
                        None
                    }
                };
                self.keys.update(*key, epoch, |t| {
                    if let Some(t) = t {
                        if landed {
                            for r in reports {
                                if let Some(c) = t.counts.iter_mut().find(|c| c.epoch == r.epoch) {
                                    c.landed = true;
                                }
                            }
                        }
                        if let Some(fleet) = fleet {
                            self.learn(t, *local, fleet, now);
                            t.synced = mono;
                        }
                    }
                    ((), None)
                });
            }
        }
        match failure {
            Some(e) => {
                // Keys whose node failed keep their shares until the
                // staleness bound.
                metrics::counter!("ratelimit_coordinated_sync_failures_total", "limiter" => self.namespace.name().to_owned())
                    .increment(1);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Sets `t`'s share from this instance's count (`local`) and the fleet's
    /// in the interval read, at layer time `now`.
    fn learn(&self, t: &mut Tracked, local: u64, tally: Tally, now: u64) {
        let limit = t.limit_per(self.interval_ms);
        if local > 0 {
            Self::correct(t, tally, limit);
        }
        let fleet = tally.offered;
        // One interval's counts, not smoothed over several: the shares of
        // all instances then add up to exactly one, whatever each
        // instance's history (smoothing made them one only where every
        // instance had smoothed over the same intervals, and a key's first,
        // partial interval skewed them for several more).
        let (l, f) = (local.min(fleet) as f64, fleet as f64);
        let share = if l > 0.0 && f > 0.0 {
            let rate = t.correction * limit * l / f / self.interval_ms as f64;
            if !matches!(t.share, Share::Allowance(_)) {
                // A first allowance starts with half an interval of it if
                // the fleet is within the limit (its wobble must not be
                // dropped), else empty: the key ran open until now, so it
                // has had its burst. Not the budget's floor: a key's first
                // interval is partial and may look within the limit.
                t.budget = if f <= limit {
                    rate * self.burst_ms
                } else {
                    0.0
                };
                t.refilled = now;
            }
            Share::Allowance(rate)
        } else if fleet as f64 > limit {
            Share::Ratio((fleet as f64 - limit) / fleet as f64)
        } else {
            Share::Open
        };
        t.share = share;
        t.fleet = fleet;
    }

    /// Moves `t`'s correction by the fleet's shortfall in the interval
    /// read: how much less it admitted than it should have (what it was
    /// offered, at most `limit`, the limit per interval), or its excess.
    /// Allowances add up to the limit, but an instance under its share
    /// cannot lend the rest to one over it, so when each instance's load
    /// wobbles around its share (a random balancer, bursty clients) the
    /// fleet admits less; the correction raises every allowance until it
    /// admits its limit.
    fn correct(t: &mut Tracked, tally: Tally, limit: f64) {
        if tally.offered == 0 {
            return;
        }
        let target = (tally.offered as f64).min(limit);
        let shortfall = (target - tally.admitted as f64) / limit;
        t.correction = (t.correction + GAIN * shortfall).clamp(1.0, MAX_CORRECTION);
    }
}

/// The fleet's counts of one key in one interval.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    offered: u64,
    admitted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 40/s with a 500 ms interval: 20 an interval.
    const LIMIT: f64 = 20.0;

    fn tally(offered: u64, admitted: u64) -> Tally {
        Tally { offered, admitted }
    }

    #[test]
    fn the_correction_hands_back_a_quarter_of_the_shortfall_a_sync_and_stays_within_its_bounds() {
        let mut t = Tracked::new(40, 1_000, 0, Instant::now());
        // Offered over the limit, 2 admitted short of it.
        Coordinator::correct(&mut t, tally(30, 18), LIMIT);
        assert!((t.correction - 1.025).abs() < 1e-9, "{}", t.correction);
        // Offered under the limit: the target is the offer.
        Coordinator::correct(&mut t, tally(16, 14), LIMIT);
        assert!((t.correction - 1.05).abs() < 1e-9, "{}", t.correction);
        // More than the limit admitted: lowered, never below 1.
        Coordinator::correct(&mut t, tally(30, 24), LIMIT);
        assert_eq!(t.correction, 1.0);
        // However large the shortfall, at most the bound.
        for _ in 0..20 {
            Coordinator::correct(&mut t, tally(30, 0), LIMIT);
        }
        assert_eq!(t.correction, MAX_CORRECTION);
        // Nothing offered says nothing.
        Coordinator::correct(&mut t, tally(0, 0), LIMIT);
        assert_eq!(t.correction, MAX_CORRECTION);
    }
}
