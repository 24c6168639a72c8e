//! [`LoadShedLayer`] and its builder.

use super::priority::Priority;
use super::shedder::{
    default_response, share_of, Admission, Capacity, ClassifyFn, Fleet, Overloaded, ShedFn,
    Shedder, UtilisationFn, FLEET_KEY,
};
use crate::adaptive::Adaptive;
use crate::builder::Builder;
use crate::error::{ConfigError, ConfigErrorKind};
use crate::failure::LogThrottle;
use crate::guarded::Guarded;
use crate::metrics::FLEET_SHED;
use crate::slots::Slots;
use crate::store::DEFAULT_LEASE;
use bytes::Bytes;
use http::request::Parts;
use http::Response;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// The default shares of capacity per class, most important first: critical
/// 100 %, normal 90 %, low 70 %, test 50 %.
pub const DEFAULT_SHARES: [(Priority, f64); 4] = [
    (Priority::Critical, 1.0),
    (Priority::Normal, 0.9),
    (Priority::Low, 0.7),
    (Priority::Test, 0.5),
];

/// Sheds low-priority requests when this process is loaded, keeping capacity
/// for critical ones.
///
/// Each request is classified ([`Priority`]); each class may use a share of
/// the capacity — by default test traffic up to 50 % of it, low 70 %, normal
/// 90 % and critical all of it — so as load rises test traffic is shed first,
/// then low, then normal, and critical last, with the top 10 % reserved for
/// it. A shed request is answered `503 Service Unavailable` with
/// `Retry-After` and a problem+json body (a gRPC call: `UNAVAILABLE` with a
/// retry pushback); the inner service is not called.
///
/// Load is the number of requests in flight through this layer against a
/// [`capacity`](LoadShedLayerBuilder::capacity), and/or a
/// [`utilisation`](LoadShedLayerBuilder::utilisation) signal you supply.
/// Both count this process: they protect this instance's resources. A
/// [`fleet_capacity`](LoadShedLayerBuilder::fleet_capacity) counts the whole
/// fleet's requests in a store, for what the instances share. Unlike
/// `tower::load_shed`, which refuses everything while the inner service is
/// not ready, it decides per request by class.
///
/// Cheap to clone: clones share one count.
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_ratelimit::{LoadShedLayer, shed::Priority};
/// let shed = LoadShedLayer::builder()
///     .capacity(200)
///     .classify(|parts| match parts.uri.path() {
///         "/charge" => Priority::Critical,
///         "/analytics" => Priority::Low,
///         _ => Priority::Normal,
///     })
///     .build()
///     .unwrap();
/// let app: Router = Router::new().route("/charge", get(|| async { "ok" })).layer(shed);
/// ```
#[derive(Clone)]
pub struct LoadShedLayer {
    shedder: Arc<Shedder>,
}

impl LoadShedLayer {
    /// Starts configuring a layer.
    pub fn builder() -> LoadShedLayerBuilder {
        Builder::with(
            "load_shed",
            Settings {
                capacity: None,
                adaptive: None,
                fleet_capacity: None,
                lease: DEFAULT_LEASE,
                utilisation: None,
                classify: Arc::new(|_: &Parts| Priority::Normal),
                shares: DEFAULT_SHARES.map(|(_, s)| s),
                retry_after: Duration::from_secs(1),
                on_shed: Arc::new(default_response),
            },
        )
    }

    /// Requests in flight through this layer (and its clones) now.
    ///
    /// ```
    /// use tower_ratelimit::LoadShedLayer;
    /// assert_eq!(LoadShedLayer::builder().capacity(10).build().unwrap().in_flight(), 0);
    /// ```
    pub fn in_flight(&self) -> u64 {
        self.shedder.in_flight.load(Ordering::Acquire)
    }

    /// The capacity in requests in flight now: the configured one, or where
    /// an [`adaptive`](LoadShedLayerBuilder::adaptive) capacity stands.
    /// `None` with only a utilisation signal.
    ///
    /// ```
    /// use tower_ratelimit::LoadShedLayer;
    /// assert_eq!(LoadShedLayer::builder().capacity(10).build().unwrap().capacity(), Some(10));
    /// ```
    pub fn capacity(&self) -> Option<u64> {
        self.shedder.capacity.as_ref().map(|c| c.now())
    }

    /// The fleet's capacity in requests in flight, if one is configured
    /// ([`fleet_capacity`](LoadShedLayerBuilder::fleet_capacity)).
    ///
    /// ```
    /// use tower_ratelimit::LoadShedLayer;
    /// assert_eq!(LoadShedLayer::builder().fleet_capacity(50).build().unwrap().fleet_capacity(), Some(50));
    /// ```
    pub fn fleet_capacity(&self) -> Option<u64> {
        self.shedder.fleet.as_ref().map(|f| f.capacity)
    }

    /// Opens the store's connections now, so the first requests do not wait
    /// for them (see [`Store::connect`](crate::store::Store::connect)). On
    /// failure the layer still works, connecting on use. Without a fleet
    /// capacity there is no store, and this does nothing.
    pub async fn connect(&self) -> Result<(), crate::StoreError> {
        match &self.shedder.fleet {
            Some(fleet) => fleet.slots.connect().await,
            None => Ok(()),
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = Guarded<S, Admission>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded::new(inner, self.shedder.clone())
    }
}

impl fmt::Debug for LoadShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedLayer")
            .field("name", &self.shedder.name)
            .field("capacity", &self.capacity())
            .field("fleet_capacity", &self.fleet_capacity())
            .field("shares", &self.shedder.shares)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

/// Configures a [`LoadShedLayer`]: of the options every layer shares (see
/// [`Builder`]) its name and shadow mode apply (it calls no store), and the
/// load shedder's own (below).
pub type LoadShedLayerBuilder = Builder<Settings>;

/// The load shedder's own options, set through [`LoadShedLayerBuilder`].
pub struct Settings {
    capacity: Option<u64>,
    adaptive: Option<Adaptive>,
    fleet_capacity: Option<u64>,
    lease: Duration,
    utilisation: Option<Arc<UtilisationFn>>,
    classify: Arc<ClassifyFn>,
    shares: [f64; 4],
    retry_after: Duration,
    on_shed: Arc<ShedFn>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("capacity", &self.capacity)
            .field("fleet_capacity", &self.fleet_capacity)
            .field("shares", &self.shares)
            .finish_non_exhaustive()
    }
}

impl Builder<Settings> {
    /// How many requests this process serves at once at full load (at least 1).
    /// Each class may have `floor(share × capacity)` in flight.
    ///
    /// ```
    /// use tower_ratelimit::LoadShedLayer;
    /// assert!(LoadShedLayer::builder().capacity(100).build().is_ok());
    /// assert!(LoadShedLayer::builder().capacity(0).build().is_err());
    /// ```
    pub fn capacity(mut self, requests: u64) -> Self {
        self.kind.capacity = Some(requests);
        self
    }

    /// Finds the capacity from latency instead of taking a fixed one: it
    /// grows while the requests let through do not queue, and shrinks while
    /// they do, within the [`Adaptive`] bounds (see there for the rule).
    /// Each class may have `floor(share × capacity)` in flight, at least
    /// one. With every class at share 1 it is a plain adaptive concurrency
    /// limit. Choose this or [`capacity`](Self::capacity).
    ///
    /// ```
    /// use tower_ratelimit::{adaptive::Adaptive, LoadShedLayer, shed::Priority};
    /// // A plain adaptive concurrency limit: one class, all of the capacity.
    /// let layer = LoadShedLayer::builder()
    ///     .adaptive(Adaptive::new().min(2).max(200))
    ///     .share(Priority::Normal, 1.0)
    ///     .build()
    ///     .unwrap();
    /// assert!(LoadShedLayer::builder().capacity(10).adaptive(Adaptive::new()).build().is_err());
    /// ```
    pub fn adaptive(mut self, adaptive: Adaptive) -> Self {
        self.kind.adaptive = Some(adaptive);
        self
    }

    /// How many requests the whole fleet serves at once at full load: each
    /// class may have `floor(share × capacity)` in flight across every
    /// instance that shares the layer's [`store`](Builder::store) (a
    /// `RedisStore`; with the default [`MemoryStore`](crate::store::MemoryStore)
    /// it counts this process only).
    ///
    /// Each admitted request holds a leased slot under one key of the store
    /// for as long as it runs: one acquire before the inner service is
    /// called and one release, off the response path, when its response is
    /// done. A request shed by this process's own
    /// [`capacity`](Self::capacity) or [`utilisation`](Self::utilisation)
    /// makes no store call. When the store fails, the layer's
    /// [failure policy](Builder::on_store_error) decides (by default it
    /// fails open), and `load_shed_fleet_store_failure_decisions_total`
    /// counts it. A slot that is never released (a crashed instance) stops
    /// counting when its [`lease`](Self::lease) ends.
    ///
    /// ```
    /// use tower_ratelimit::{LoadShedLayer, shed::Priority};
    /// use tower_ratelimit::store::MemoryStore;
    /// let layer = LoadShedLayer::builder()
    ///     .name("payments-fleet")
    ///     .fleet_capacity(400) // with a RedisStore: the fleet's capacity
    ///     .store(MemoryStore::new())
    ///     .build()
    ///     .unwrap();
    /// assert!(LoadShedLayer::builder().fleet_capacity(0).build().is_err());
    /// ```
    pub fn fleet_capacity(mut self, requests: u64) -> Self {
        self.kind.fleet_capacity = Some(requests);
        self
    }

    /// How long a fleet slot counts if it is never released (default
    /// [`DEFAULT_LEASE`], 30 s). Choose it above the longest request: a
    /// request that runs longer stops counting. Only with a
    /// [`fleet_capacity`](Self::fleet_capacity).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::LoadShedLayer;
    /// let layer = LoadShedLayer::builder()
    ///     .fleet_capacity(100)
    ///     .lease(Duration::from_secs(60))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.kind.lease = lease;
        self
    }

    /// A load signal from 0 (idle) to 1 (saturated), read on every request —
    /// e.g. CPU or worker-pool utilisation sampled in the background into an
    /// atomic. A class is shed while the signal is above its share (so
    /// critical traffic, with share 1, never is by the signal alone). NaN reads
    /// as 0: a broken signal must not take the service down. With a capacity
    /// too, a request must pass both.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use tower_ratelimit::LoadShedLayer;
    /// let busy_permille = Arc::new(AtomicU64::new(0)); // updated by a sampler task
    /// let signal = busy_permille.clone();
    /// let layer = LoadShedLayer::builder()
    ///     .utilisation(move || signal.load(Ordering::Relaxed) as f64 / 1000.0)
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn utilisation<F>(mut self, signal: F) -> Self
    where
        F: Fn() -> f64 + Send + Sync + 'static,
    {
        self.kind.utilisation = Some(Arc::new(signal));
        self
    }

    /// Assigns each request its class (default: every request is
    /// [`Priority::Normal`]). Classify from something clients cannot forge, or
    /// strip the header at your edge: anyone can send `x-priority: critical`.
    ///
    /// ```
    /// use tower_ratelimit::{LoadShedLayer, shed::Priority};
    /// let layer = LoadShedLayer::builder()
    ///     .capacity(100)
    ///     .classify(|parts| {
    ///         parts.headers.get("x-priority")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or_default()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn classify<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Priority + Send + Sync + 'static,
    {
        self.kind.classify = Arc::new(f);
        self
    }

    /// The share of capacity (and of the utilisation signal) `class` may use,
    /// in (0, 1] (defaults in [`DEFAULT_SHARES`]). Shares must not decrease
    /// with importance: test ≤ low ≤ normal ≤ critical.
    ///
    /// ```
    /// use tower_ratelimit::{LoadShedLayer, shed::Priority};
    /// let layer = LoadShedLayer::builder()
    ///     .capacity(100)
    ///     .share(Priority::Normal, 0.8) // reserve 20 % for critical traffic
    ///     .build()
    ///     .unwrap();
    /// assert!(LoadShedLayer::builder().capacity(100).share(Priority::Test, 0.95).build().is_err());
    /// ```
    pub fn share(mut self, class: Priority, share: f64) -> Self {
        self.kind.shares[class.index()] = share;
        self
    }

    /// The `Retry-After` of a shed request (default 1 s; whole seconds, rounded up).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::LoadShedLayer;
    /// let layer = LoadShedLayer::builder()
    ///     .capacity(100)
    ///     .retry_after(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.kind.retry_after = wait;
        self
    }

    /// Replaces the 503 response to HTTP requests (`Retry-After` is still
    /// added); gRPC calls get `UNAVAILABLE`.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_ratelimit::LoadShedLayer;
    /// let layer = LoadShedLayer::builder()
    ///     .capacity(100)
    ///     .on_shed(|o| {
    ///         let body = format!("busy; {} traffic paused", o.priority);
    ///         http::Response::builder().status(503).body(Bytes::from(body)).unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_shed<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&Overloaded) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.kind.on_shed = Arc::new(move |r| f(r).map(Into::into));
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// ```
    /// use tower_ratelimit::LoadShedLayer;
    /// // No load signal at all is a configuration error.
    /// assert!(LoadShedLayer::builder().build().is_err());
    /// ```
    pub fn build(self) -> Result<LoadShedLayer, ConfigError> {
        let Builder { common, kind } = self;
        common.check()?;
        if common.store.is_some() && kind.fleet_capacity.is_none() {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                "the load shedder uses a store only to count the fleet: call .fleet_capacity(n)",
            ));
        }
        if kind.capacity.is_none()
            && kind.adaptive.is_none()
            && kind.utilisation.is_none()
            && kind.fleet_capacity.is_none()
        {
            return Err(ConfigError::new(
                ConfigErrorKind::Missing,
                "no load signal: call .capacity(n), .adaptive(..) or .fleet_capacity(n), \
                 and/or .utilisation(signal)",
            ));
        }
        for (p, s) in Priority::ALL.iter().zip(kind.shares) {
            if !(s > 0.0 && s <= 1.0) {
                return Err(ConfigError::new(
                    ConfigErrorKind::Invalid,
                    format!("the share of {p} traffic must be in (0, 1], got {s}"),
                ));
            }
        }
        for w in Priority::ALL.windows(2) {
            let (more, less) = (w[0], w[1]);
            if kind.shares[less.index()] > kind.shares[more.index()] {
                return Err(ConfigError::new(
                    ConfigErrorKind::Invalid,
                    format!(
                        "{less} traffic may not use a larger share ({}) than {more} traffic ({}): \
                     it would be shed later",
                        kind.shares[less.index()],
                        kind.shares[more.index()]
                    ),
                ));
            }
        }
        let capacity = match (kind.capacity, kind.adaptive) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    ConfigErrorKind::Conflict,
                    "a capacity is fixed (.capacity) or adaptive (.adaptive), not both",
                ))
            }
            (None, Some(a)) => {
                a.check()?;
                Some(Capacity::adaptive(a))
            }
            (None, None) => None,
            (Some(cap), None) => Some(Capacity::Fixed(cap, limits("capacity", cap, kind.shares)?)),
        };
        let fleet = match kind.fleet_capacity {
            None => None,
            Some(cap) => Some(Fleet {
                limits: limits("fleet capacity", cap, kind.shares)?,
                capacity: cap,
                key: crate::key::Key::new(FLEET_KEY),
                slots: Arc::new(Slots::new(
                    &common,
                    "fleet load shedder",
                    &FLEET_SHED,
                    kind.lease,
                    (format!("fleet capacity {cap}"), false),
                )?),
            }),
        };
        Ok(LoadShedLayer {
            shedder: Arc::new(Shedder {
                name: common.name,
                classify: kind.classify,
                capacity,
                shares: kind.shares,
                utilisation: kind.utilisation,
                fleet,
                in_flight: AtomicU64::new(0),
                retry_after_secs: crate::headers::ceil_secs(kind.retry_after.as_millis() as u64)
                    .max(1),
                on_shed: kind.on_shed,
                shadow: common.shadow,
                log: LogThrottle::default(),
                metrics: Default::default(),
            }),
        })
    }
}

/// The requests in flight each class may have in `capacity`, refusing a
/// capacity that leaves a class none.
fn limits(what: &str, capacity: u64, shares: [f64; 4]) -> Result<[u64; 4], ConfigError> {
    if capacity == 0 {
        return Err(ConfigError::new(
            ConfigErrorKind::Invalid,
            format!("the {what} must be at least 1"),
        ));
    }
    let limits = shares.map(|s| share_of(s, capacity));
    match Priority::ALL.iter().find(|p| limits[p.index()] == 0) {
        Some(p) => Err(ConfigError::new(
            ConfigErrorKind::Invalid,
            format!(
                "a {what} of {capacity} leaves {p} traffic no room at share {}: raise the \
             {what} or the share",
                shares[p.index()]
            ),
        )),
        None => Ok(limits),
    }
}
