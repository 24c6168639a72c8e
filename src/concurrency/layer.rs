//! [`ConcurrencyLimitLayer`] and its builder.

use super::limiter::{Limit, Limiter, RejectionFn, Slot};
use super::response::{default_rejection, ConcurrencyRejection};
use crate::adaptive::{Adaptive, AdaptiveLimit};
use crate::builder::Builder;
use crate::error::{ConfigError, ConfigErrorKind};
use crate::guarded::Guarded;
use crate::key::{Global, KeyExtractor};
use crate::metrics::CONCURRENCY;
use crate::slots::Slots;
use bytes::Bytes;
use http::Response;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

use crate::store::DEFAULT_LEASE;

/// Limits how many requests per key are in flight at once.
///
/// A request takes a slot before the inner service is called and gives it
/// back when its response body has been sent, or when it is dropped, fails
/// or panics first. Over the limit, it is answered `429 Too Many Requests`
/// with `Retry-After` and headers that tell the in-flight limit — or, for a
/// gRPC call, `RESOURCE_EXHAUSTED` with the same metadata and a retry delay
/// (see [`crate::grpc`]).
///
/// Cheap to clone: clones share one limiter.
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_ratelimit::{ConcurrencyLimitLayer, key::Header};
/// let layer = ConcurrencyLimitLayer::builder()
///     .limit(5)
///     .key(Header::try_new("x-tenant").unwrap())
///     .build()
///     .unwrap();
/// let app: Router = Router::new().route("/report", get(|| async { "ok" })).layer(layer);
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimitLayer {
    limiter: Arc<Limiter>,
}

/// Configures a [`ConcurrencyLimitLayer`]: the options every layer shares
/// (see [`Builder`]) and the concurrency limiter's own (below).
pub type ConcurrencyLimitLayerBuilder = Builder<Settings>;

/// The concurrency limiter's own options, set through [`ConcurrencyLimitLayerBuilder`].
pub struct Settings {
    limit: Option<u32>,
    adaptive: Option<Adaptive>,
    key: Arc<dyn KeyExtractor>,
    lease: Duration,
    retry_after: Duration,
    on_rejection: Arc<RejectionFn>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("limit", &self.limit)
            .field("adaptive", &self.adaptive)
            .field("lease", &self.lease)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimitLayer {
    /// Opens the store's connections now, so the first requests do not wait
    /// for them (see [`Store::connect`](crate::store::Store::connect)). On
    /// failure the layer still works, connecting on use.
    pub async fn connect(&self) -> Result<(), crate::StoreError> {
        self.limiter.slots.connect().await
    }

    /// Starts configuring a layer (named `"concurrency"` by default).
    pub fn builder() -> ConcurrencyLimitLayerBuilder {
        Builder::with(
            "concurrency",
            Settings {
                limit: None,
                adaptive: None,
                key: Arc::new(Global),
                lease: DEFAULT_LEASE,
                retry_after: Duration::from_secs(1),
                on_rejection: Arc::new(default_rejection),
            },
        )
    }

    /// The requests a key may have in flight now: the configured limit, or
    /// where an [`adaptive`](ConcurrencyLimitLayerBuilder::adaptive) one stands.
    ///
    /// ```
    /// use tower_ratelimit::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder().limit(5).build().unwrap();
    /// assert_eq!(layer.limit(), 5);
    /// ```
    pub fn limit(&self) -> u64 {
        self.limiter.limit.now()
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = Guarded<S, Slot>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded::new(inner, self.limiter.clone())
    }
}

impl fmt::Debug for ConcurrencyLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("name", &self.limiter.slots.namespace.name())
            .field("limit", &self.limiter.limit)
            .field("lease", &self.limiter.slots.lease)
            .field("on_store_error", &self.limiter.slots.guard.policy)
            .finish_non_exhaustive()
    }
}

impl Builder<Settings> {
    /// Requests a key may have in flight at once (at least 1). A layer has
    /// this limit or an [`adaptive`](Self::adaptive) one.
    ///
    /// ```
    /// use tower_ratelimit::ConcurrencyLimitLayer;
    /// assert!(ConcurrencyLimitLayer::builder().limit(5).build().is_ok());
    /// assert!(ConcurrencyLimitLayer::builder().limit(0).build().is_err());
    /// ```
    pub fn limit(mut self, limit: u32) -> Self {
        self.kind.limit = Some(limit);
        self
    }

    /// A limit found from latency instead of set by hand, within bounds:
    /// see [`Adaptive`]. Each process moves it with the latency of the
    /// requests it admits (from its slot to the end of the response body),
    /// and applies it to every key.
    ///
    /// It suits one key, or a few that share a backend: the limit is what
    /// that backend takes at once. With a `RedisStore` it bounds the fleet's
    /// requests per key, and each process finds its own value of it from
    /// the same backend's latency (a gauge, `concurrency_limit`, shows
    /// where it stands).
    ///
    /// ```
    /// use tower_ratelimit::{adaptive::Adaptive, ConcurrencyLimitLayer};
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .adaptive(Adaptive::new().initial(10).min(2).max(100))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(layer.limit(), 10);
    /// // A fixed limit and an adaptive one are exclusive.
    /// let both = ConcurrencyLimitLayer::builder().limit(5).adaptive(Adaptive::new()).build();
    /// assert!(both.is_err());
    /// ```
    pub fn adaptive(mut self, adaptive: Adaptive) -> Self {
        self.kind.adaptive = Some(adaptive);
        self
    }

    /// How to find the client's key (default: one global key, a limit for
    /// the whole service). See [`crate::key`].
    ///
    /// ```
    /// use tower_ratelimit::{ConcurrencyLimitLayer, key::Header};
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(2)
    ///     .key(Header::try_new("x-tenant").unwrap())
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.kind.key = Arc::new(extractor);
        self
    }

    /// How long a slot counts if it is never released (default [`DEFAULT_LEASE`]).
    ///
    /// A crashed instance's slots are freed when their lease ends, so a crash
    /// never locks a key out for longer. Slots are not renewed: a request that
    /// runs longer than its lease stops counting, and the key may then briefly
    /// have more than the limit in flight. Choose a lease above the longest
    /// request (bound requests with a timeout inside this layer); renewal would
    /// cost a store round trip per lease period per running request. Ignored by
    /// [`MemoryStore`](crate::store::MemoryStore): a process's memory dies with it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .lease(Duration::from_secs(120))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.kind.lease = lease;
        self
    }

    /// The `Retry-After` a rejection carries (default 1 s, rounded up to
    /// whole seconds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .retry_after(Duration::from_secs(3))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.kind.retry_after = wait;
        self
    }

    /// Replaces the 429 response (`Retry-After` and the limit's headers are
    /// still added to it).
    ///
    /// ```
    /// use tower_ratelimit::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(2)
    ///     .on_rejection(|r| http::Response::new(bytes::Bytes::from(r.detail())))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_rejection<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&ConcurrencyRejection<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.kind.on_rejection = Arc::new(move |r| f(r).map(Into::into));
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<ConcurrencyLimitLayer, ConfigError> {
        let Builder { common, kind } = self;
        common.check()?;
        let limit = match (kind.limit, kind.adaptive) {
            (None, None) => {
                return Err(ConfigError::new(
                    ConfigErrorKind::Missing,
                    "no concurrency limit configured: call .limit(n) or .adaptive(..)",
                ))
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    ConfigErrorKind::Conflict,
                    "a concurrency limit is fixed (.limit) or adaptive (.adaptive), not both",
                ))
            }
            (Some(0), None) => {
                return Err(ConfigError::new(
                    ConfigErrorKind::Invalid,
                    "the concurrency limit must be at least 1",
                ))
            }
            (Some(n), None) => Limit::Fixed(u64::from(n)),
            (None, Some(a)) => {
                a.check()?;
                Limit::Adaptive(Arc::new(AdaptiveLimit::new(a)))
            }
        };
        let config = match &limit {
            Limit::Fixed(n) => (format!("limit {n}"), false),
            // Found in this process: like no other limiter's.
            Limit::Adaptive(_) => ("an adaptive limit".to_owned(), true),
        };
        let slots = Slots::new(&common, "concurrency", &CONCURRENCY, kind.lease, config)?;
        Ok(ConcurrencyLimitLayer {
            limiter: Arc::new(Limiter {
                slots: Arc::new(slots),
                key: kind.key,
                limit,
                headers: common.headers,
                retry_after_secs: crate::headers::ceil_secs(kind.retry_after.as_millis() as u64)
                    .max(1),
                on_rejection: kind.on_rejection,
                on_key_error: common.on_key_error,
                shadow: common.shadow,
            }),
        })
    }
}
