//! [`ConcurrencyLimitLayer`] and its builder.

use super::limiter::{Limiter, RejectionFn};
use super::memory::MemorySlots;
use super::response::{self, ConcurrencyRejection};
use super::service::ConcurrencyLimit;
use super::store::SlotStore;
use crate::breaker::{Breaker, CircuitBreaker};
use crate::clock::{Clock, SystemClock};
use crate::error::ConfigError;
use crate::headers::HeaderStyle;
use crate::key::{Global, KeyError, KeyExtractor};
use crate::layer::{check_name, DEFAULT_STORE_TIMEOUT};
use crate::limiter::{KeyErrorFn, LogThrottle, OnStoreError};
use crate::store::Namespace;
use bytes::Bytes;
use http::Response;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// The default lease: how long a slot counts when its instance dies without
/// releasing it. Above the request timeouts of most APIs; see
/// [`ConcurrencyLimitLayerBuilder::lease`].
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

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
/// use tower_ratelimit::{concurrency::ConcurrencyLimitLayer, key::Header};
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

impl ConcurrencyLimitLayer {
    /// Starts configuring a layer.
    pub fn builder() -> ConcurrencyLimitLayerBuilder {
        ConcurrencyLimitLayerBuilder::default()
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::new(inner, self.limiter.clone())
    }
}

impl fmt::Debug for ConcurrencyLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("name", &self.limiter.namespace.name())
            .field("limit", &self.limiter.limit)
            .field("lease", &self.limiter.lease)
            .field("on_store_error", &self.limiter.on_store_error)
            .finish_non_exhaustive()
    }
}

/// Configures a [`ConcurrencyLimitLayer`]; [`build`](Self::build) checks the configuration.
#[must_use]
pub struct ConcurrencyLimitLayerBuilder {
    name: String,
    limit: Option<u32>,
    store: Option<Arc<dyn SlotStore>>,
    clock: Arc<dyn Clock>,
    key: Arc<dyn KeyExtractor>,
    lease: Duration,
    headers: HeaderStyle,
    retry_after: Duration,
    on_rejection: Arc<RejectionFn>,
    on_key_error: Arc<KeyErrorFn>,
    on_store_error: OnStoreError,
    store_timeout: Duration,
    shadow: bool,
    breaker: CircuitBreaker,
}

impl Default for ConcurrencyLimitLayerBuilder {
    fn default() -> Self {
        Self {
            name: "concurrency".into(),
            limit: None,
            store: None,
            clock: Arc::new(SystemClock),
            key: Arc::new(Global),
            lease: DEFAULT_LEASE,
            headers: HeaderStyle::default(),
            retry_after: Duration::from_secs(1),
            on_rejection: Arc::new(response::default_rejection),
            on_key_error: Arc::new(crate::response::default_key_error),
            on_store_error: OnStoreError::default(),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            shadow: false,
            breaker: CircuitBreaker::new(),
        }
    }
}

impl fmt::Debug for ConcurrencyLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayerBuilder")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimitLayerBuilder {
    /// Names the limiter (default `"concurrency"`): its slots are kept apart
    /// from other limiters sharing a store, it labels the metrics, and it names
    /// the policy in IETF headers. `[A-Za-z0-9_.-]`, 1 to 64 bytes.
    ///
    /// ```
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// assert!(ConcurrencyLimitLayer::builder().name("reports").limit(2).build().is_ok());
    /// assert!(ConcurrencyLimitLayer::builder().name("bad name").limit(2).build().is_err());
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Requests a key may have in flight at once (required, at least 1).
    ///
    /// ```
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// assert!(ConcurrencyLimitLayer::builder().limit(20).build().is_ok());
    /// assert!(ConcurrencyLimitLayer::builder().limit(0).build().is_err());
    /// ```
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// How to find the client's key (default: one global key). See [`crate::key`].
    ///
    /// ```
    /// use tower_ratelimit::{concurrency::ConcurrencyLimitLayer, key::ApiKey};
    /// let layer = ConcurrencyLimitLayer::builder().limit(5).key(ApiKey::bearer()).build().unwrap();
    /// ```
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.key = Arc::new(extractor);
        self
    }

    /// Where slots live (default: a new [`MemorySlots`], per process). Pass a
    /// `RedisStore` (feature `redis`) for a fleet-wide limit — the same store
    /// value the rate limiter uses.
    ///
    /// ```
    /// use tower_ratelimit::concurrency::{ConcurrencyLimitLayer, MemorySlots};
    /// let layer = ConcurrencyLimitLayer::builder().limit(5).store(MemorySlots::new()).build().unwrap();
    /// ```
    pub fn store(mut self, store: impl SlotStore) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// The time source for leases (default [`SystemClock`]); tests pass a
    /// [`ManualClock`](crate::clock::ManualClock).
    ///
    /// ```
    /// use tower_ratelimit::{clock::ManualClock, concurrency::ConcurrencyLimitLayer};
    /// let layer = ConcurrencyLimitLayer::builder().limit(5).clock(ManualClock::new(0)).build().unwrap();
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
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
    /// [`MemorySlots`]: a process's memory dies with it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .lease(Duration::from_secs(120))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Which headers a rejection carries (default [`HeaderStyle::GitHub`]):
    /// `X-RateLimit-Limit: N` and `X-RateLimit-Remaining: 0`, and/or IETF
    /// `RateLimit-Policy: "NAME";q=N;qu="concurrent-requests"` and
    /// `RateLimit: "NAME";r=0`. Admitted responses carry none: the in-flight
    /// count changes while they run.
    ///
    /// ```
    /// use tower_ratelimit::{concurrency::ConcurrencyLimitLayer, HeaderStyle};
    /// let layer = ConcurrencyLimitLayer::builder().limit(5).headers(HeaderStyle::Ietf).build().unwrap();
    /// ```
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// The `Retry-After` of a rejection (default 1 s; whole seconds, rounded up).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .retry_after(Duration::from_secs(2))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// Replaces the 429 response to HTTP requests (the limit headers and
    /// `Retry-After` are still added); gRPC calls get `RESOURCE_EXHAUSTED`.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .on_rejection(|r| {
    ///         let body = format!("at most {} at a time", r.limit);
    ///         http::Response::builder().status(429).body(Bytes::from(body)).unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&ConcurrencyRejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.on_rejection = Arc::new(f);
        self
    }

    /// Replaces the response to a request whose key cannot be extracted (default 500).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .on_key_error(|err| {
    ///         http::Response::builder().status(401).body(Bytes::from(err.to_string())).unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_key_error<F>(mut self, f: F) -> Self
    where
        F: Fn(&KeyError) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.on_key_error = Arc::new(f);
        self
    }

    /// What a store failure does to a request (default [`OnStoreError::FailOpen`]):
    /// admit it without a slot, answer 503, or limit in this process to
    /// `fraction` of the limit (at least 1) until the store answers again.
    ///
    /// ```
    /// use tower_ratelimit::{concurrency::ConcurrencyLimitLayer, OnStoreError};
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(8)
    ///     .on_store_error(OnStoreError::Local { fraction: 0.25 })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_store_error(mut self, policy: OnStoreError) -> Self {
        self.on_store_error = policy;
        self
    }

    /// The latency budget of one store call (default [`DEFAULT_STORE_TIMEOUT`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .store_timeout(Duration::from_millis(20))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// Shadow mode: decide and record as usual, but never reject. Would-be
    /// rejections hold no slot, are counted
    /// (`concurrency_shadow_rejections_total`) and logged.
    ///
    /// ```
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder().limit(5).shadow(true).build().unwrap();
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The circuit breaker in front of the store (default [`CircuitBreaker::new`]).
    ///
    /// ```
    /// use tower_ratelimit::{concurrency::ConcurrencyLimitLayer, CircuitBreaker};
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .circuit_breaker(CircuitBreaker::new().failures(3))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
    /// let err = ConcurrencyLimitLayer::builder()
    ///     .limit(5)
    ///     .lease(Duration::from_millis(10))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("lease"));
    /// ```
    pub fn build(self) -> Result<ConcurrencyLimitLayer, ConfigError> {
        check_name(&self.name)?;
        let limit = match self.limit {
            None => {
                return Err(ConfigError::new(
                    "no concurrency limit configured: call .limit(n)",
                ))
            }
            Some(0) => return Err(ConfigError::new("the concurrency limit must be at least 1")),
            Some(n) => u64::from(n),
        };
        if self.store_timeout.is_zero() {
            return Err(ConfigError::new("the store timeout must be above zero"));
        }
        if self.lease <= self.store_timeout {
            return Err(ConfigError::new(format!(
                "the lease ({:?}) must be longer than the store timeout ({:?}), and should \
                 be longer than the slowest request",
                self.lease, self.store_timeout
            )));
        }
        let fallback = match self.on_store_error {
            OnStoreError::Local { fraction } if !(fraction > 0.0 && fraction <= 1.0) => {
                return Err(ConfigError::new(format!(
                    "OnStoreError::Local needs a fraction in (0, 1], got {fraction}"
                )))
            }
            OnStoreError::Local { fraction } => Some((
                MemorySlots::new(),
                ((limit as f64 * fraction).floor() as u64).max(1),
            )),
            _ => None,
        };
        let retry_after_secs =
            crate::headers::ceil_secs(self.retry_after.as_millis() as u64).max(1);
        Ok(ConcurrencyLimitLayer {
            limiter: Arc::new(Limiter {
                namespace: Namespace::new(&self.name),
                store: self.store.unwrap_or_else(|| Arc::new(MemorySlots::new())),
                clock: self.clock,
                key: self.key,
                limit,
                lease: self.lease,
                headers: self.headers,
                retry_after_secs,
                on_rejection: self.on_rejection,
                on_key_error: self.on_key_error,
                on_store_error: self.on_store_error,
                store_timeout: self.store_timeout,
                shadow: self.shadow,
                breaker: Breaker::new(self.breaker),
                fallback,
                log: LogThrottle::default(),
                metrics: Default::default(),
            }),
        })
    }
}
