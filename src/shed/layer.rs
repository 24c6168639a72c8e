//! [`LoadShedLayer`] and its builder.

use super::adaptive::Adaptive;
use super::priority::Priority;
use super::service::LoadShed;
use super::shedder::{
    default_response, share_of, Capacity, ClassifyFn, Overloaded, ShedFn, Shedder, UtilisationFn,
};
use crate::builder::Builder;
use crate::error::ConfigError;
use crate::failure::LogThrottle;
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
/// Process-local: it protects this instance's resources. Unlike
/// `tower::load_shed`, which refuses everything while the inner service is
/// not ready, it decides per request by class.
///
/// Cheap to clone: clones share one count.
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_ratelimit::shed::{LoadShedLayer, Priority};
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
            "default",
            Settings {
                capacity: None,
                adaptive: None,
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
    /// use tower_ratelimit::shed::LoadShedLayer;
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
    /// use tower_ratelimit::shed::LoadShedLayer;
    /// assert_eq!(LoadShedLayer::builder().capacity(10).build().unwrap().capacity(), Some(10));
    /// ```
    pub fn capacity(&self) -> Option<u64> {
        self.shedder.capacity.as_ref().map(|c| c.now())
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadShed::new(inner, self.shedder.clone())
    }
}

impl fmt::Debug for LoadShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedLayer")
            .field("name", &self.shedder.name)
            .field("capacity", &self.capacity())
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
            .field("shares", &self.shares)
            .finish_non_exhaustive()
    }
}

impl Builder<Settings> {
    /// How many requests this process serves at once at full load (at least 1).
    /// Each class may have `floor(share × capacity)` in flight.
    ///
    /// ```
    /// use tower_ratelimit::shed::LoadShedLayer;
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
    /// use tower_ratelimit::shed::{Adaptive, LoadShedLayer, Priority};
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
    /// use tower_ratelimit::shed::LoadShedLayer;
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
    /// use tower_ratelimit::shed::{LoadShedLayer, Priority};
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
    /// use tower_ratelimit::shed::{LoadShedLayer, Priority};
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
    /// use tower_ratelimit::shed::LoadShedLayer;
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
    /// use tower_ratelimit::shed::LoadShedLayer;
    /// let layer = LoadShedLayer::builder()
    ///     .capacity(100)
    ///     .on_shed(|o| {
    ///         let body = format!("busy; {} traffic paused", o.priority);
    ///         http::Response::builder().status(503).body(Bytes::from(body)).unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_shed<F>(mut self, f: F) -> Self
    where
        F: Fn(&Overloaded) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.kind.on_shed = Arc::new(f);
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// ```
    /// use tower_ratelimit::shed::LoadShedLayer;
    /// // No load signal at all is a configuration error.
    /// assert!(LoadShedLayer::builder().build().is_err());
    /// ```
    pub fn build(self) -> Result<LoadShedLayer, ConfigError> {
        let Builder { common, kind } = self;
        common.check()?;
        if common.store.is_some() {
            return Err(ConfigError::new(
                "the load shedder counts the requests of this process and calls no store",
            ));
        }
        if kind.capacity.is_none() && kind.adaptive.is_none() && kind.utilisation.is_none() {
            return Err(ConfigError::new(
                "no load signal: call .capacity(n) or .adaptive(..), and/or .utilisation(signal)",
            ));
        }
        for (p, s) in Priority::ALL.iter().zip(kind.shares) {
            if !(s > 0.0 && s <= 1.0) {
                return Err(ConfigError::new(format!(
                    "the share of {p} traffic must be in (0, 1], got {s}"
                )));
            }
        }
        for w in Priority::ALL.windows(2) {
            let (more, less) = (w[0], w[1]);
            if kind.shares[less.index()] > kind.shares[more.index()] {
                return Err(ConfigError::new(format!(
                    "{less} traffic may not use a larger share ({}) than {more} traffic ({}): \
                     it would be shed later",
                    kind.shares[less.index()],
                    kind.shares[more.index()]
                )));
            }
        }
        let capacity = match (kind.capacity, kind.adaptive) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "a capacity is fixed (.capacity) or adaptive (.adaptive), not both",
                ))
            }
            (None, Some(a)) => match a.problem() {
                Some(why) => return Err(ConfigError::new(why)),
                None => Some(Capacity::adaptive(a)),
            },
            (None, None) => None,
            (Some(0), _) => return Err(ConfigError::new("the capacity must be at least 1")),
            (Some(cap), None) => {
                let limits = kind.shares.map(|s| share_of(s, cap));
                if let Some(p) = Priority::ALL.iter().find(|p| limits[p.index()] == 0) {
                    return Err(ConfigError::new(format!(
                        "a capacity of {cap} leaves {p} traffic no room at share {}: raise the \
                         capacity or the share",
                        kind.shares[p.index()]
                    )));
                }
                Some(Capacity::Fixed(cap, limits))
            }
        };
        Ok(LoadShedLayer {
            shedder: Arc::new(Shedder {
                name: common.name,
                classify: kind.classify,
                capacity,
                shares: kind.shares,
                utilisation: kind.utilisation,
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
