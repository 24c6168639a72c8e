//! The options every layer of this crate takes, written once: [`Builder`]
//! is the builder of [`RateLimitLayer`](crate::RateLimitLayer),
//! [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) and
//! [`LoadShedLayer`](crate::LoadShedLayer), and the methods here apply to all
//! three; each layer adds its own.
//!
//! ```
//! # use std::num::NonZeroU32;
//! use std::time::Duration;
//! use tower_ratelimit::{ConcurrencyLimitLayer, failure::OnStoreError, Quota, RateLimitLayer};
//! let rate = RateLimitLayer::builder()
//!     .name("api")
//!     .store_timeout(Duration::from_millis(20))
//!     .on_store_error(OnStoreError::FailClosed)
//!     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
//!     .build()?;
//! let concurrency = ConcurrencyLimitLayer::builder()
//!     .name("reports")
//!     .store_timeout(Duration::from_millis(20))
//!     .limit(4)
//!     .build()?;
//! # Ok::<(), tower_ratelimit::ConfigError>(())
//! ```

use crate::clock::{Clock, SystemClock};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::failure::{CircuitBreaker, OnStoreError};
use crate::headers::HeaderStyle;
use crate::key::KeyError;
use crate::store::{MemoryStore, Store, DEFAULT_TIMEOUT};
use bytes::Bytes;
use http::Response;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub(crate) type KeyErrorFn = dyn Fn(&KeyError) -> Response<Bytes> + Send + Sync;

/// Configures a layer of kind `K`; [`build`](crate::RateLimitLayerBuilder::build)
/// (on each kind) checks the configuration. The methods on `Builder<K>` are
/// the options every layer shares; see each layer's builder for its own.
#[must_use]
pub struct Builder<K> {
    pub(crate) common: Common,
    pub(crate) kind: K,
}

/// The shared options.
pub(crate) struct Common {
    pub(crate) name: String,
    pub(crate) store: Option<Arc<dyn Store>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) store_timeout: Duration,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) breaker: CircuitBreaker,
    pub(crate) shadow: bool,
    pub(crate) headers: HeaderStyle,
    pub(crate) on_key_error: Arc<KeyErrorFn>,
}

impl<K> Builder<K> {
    /// A builder with the defaults, for a layer named `name` by default.
    pub(crate) fn with(name: &str, kind: K) -> Self {
        Self {
            common: Common {
                name: name.into(),
                store: None,
                clock: Arc::new(SystemClock),
                store_timeout: DEFAULT_TIMEOUT,
                on_store_error: OnStoreError::default(),
                breaker: CircuitBreaker::new(),
                shadow: false,
                headers: HeaderStyle::default(),
                on_key_error: Arc::new(crate::key::default_key_error),
            },
            kind,
        }
    }

    /// Names the limiter: its state is kept apart from other limiters
    /// sharing a store, and its metrics and log lines carry the name.
    /// `[A-Za-z0-9_.-]`, 1 to 64 bytes. Defaults: `default` for a rate
    /// limit, `concurrency` and `load_shed`.
    ///
    /// A name on a store belongs to one limiter: building a different one
    /// (another kind, another fixed policy or limit, or any policy chosen
    /// per request) with a name a live limiter holds on the same store
    /// ([`Store::identity`]) is refused, as
    /// the two would count together. Clones of a layer share its limiter;
    /// the same limiter built again (a fleet's instances in one process)
    /// is allowed.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let q = Quota::per_second(NonZeroU32::new(5).unwrap());
    /// assert!(RateLimitLayer::builder().name("search-api").quota(q.clone()).build().is_ok());
    /// assert!(RateLimitLayer::builder().name("bad name").quota(q).build().is_err());
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.common.name = name.into();
        self
    }

    /// Where state lives (default: a new [`MemoryStore`] shared by this
    /// layer's clones). Give several layers the same store to share it: each
    /// keeps its own namespace.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{store::MemoryStore, Quota, RateLimitLayer};
    /// let store = MemoryStore::new();
    /// let q = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// let a = RateLimitLayer::builder().name("a").quota(q.clone()).store(store.clone()).build().unwrap();
    /// let b = RateLimitLayer::builder().name("b").quota(q).store(store).build().unwrap();
    /// ```
    pub fn store(mut self, store: impl Store) -> Self {
        self.common.store = Some(Arc::new(store));
        self
    }

    /// The time source of windows and leases (default [`SystemClock`]);
    /// tests pass a [`ManualClock`](crate::clock::ManualClock).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{clock::ManualClock, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .clock(ManualClock::new(0))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.common.clock = Arc::new(clock);
        self
    }

    /// How long the store may take to answer one call (default
    /// [`DEFAULT_TIMEOUT`]); past it, the call is a store failure,
    /// answered per [`on_store_error`](Self::on_store_error).
    ///
    /// It measures the store: for the Redis store, from when the call leaves
    /// for Redis (connecting included) until its reply, and judged only
    /// after every reply already received has been read. Time a charge
    /// waits for its batch, or for a busy application runtime to poll the
    /// request, does not count: an
    /// overloaded instance decides later, never fails open for it. A store
    /// that does not bound its own calls is bounded by the layer from the
    /// first poll.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .store_timeout(Duration::from_millis(20))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.common.store_timeout = timeout;
        self
    }

    /// What a store failure does to a request (default [`OnStoreError::FailOpen`]).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{failure::OnStoreError, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .on_store_error(OnStoreError::FailClosed)
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_store_error(mut self, policy: OnStoreError) -> Self {
        self.common.on_store_error = policy;
        self
    }

    /// The circuit breaker in front of the store (default [`CircuitBreaker::new`]:
    /// open after 5 consecutive failures, probe after 1 s).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_ratelimit::{failure::CircuitBreaker, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
    ///     .circuit_breaker(CircuitBreaker::new().failures(3).cooldown(Duration::from_millis(250)))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.common.breaker = breaker;
        self
    }

    /// Shadow mode: decide and record as usual, but never reject. Would-be
    /// rejections are counted and logged, and the inner service sees every
    /// request: watch a new limit before enforcing it.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
    ///     .shadow(true)
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.common.shadow = shadow;
        self
    }

    /// Which rate-limit headers responses carry (default [`HeaderStyle::GitHub`]).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{headers::HeaderStyle, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .headers(HeaderStyle::Both)
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.common.headers = style;
        self
    }

    /// Replaces the answer to a request whose key cannot be extracted
    /// (default [`default_key_error`](crate::key::default_key_error): 400 when the
    /// request lacks it, 500 when the application is misconfigured; see
    /// [`KeyError::kind`](crate::key::KeyError::kind)). gRPC calls are
    /// answered with a gRPC status instead: `INVALID_ARGUMENT` or `INTERNAL`.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use bytes::Bytes;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .on_key_error(|err| {
    ///         http::Response::builder().status(401).body(Bytes::from(err.to_string())).unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_key_error<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&KeyError) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.common.on_key_error = Arc::new(move |r| f(r).map(Into::into));
        self
    }
}

impl Common {
    /// Checks the shared options.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        check_name(&self.name)?;
        if self.store_timeout.is_zero() {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                "the store timeout must be above zero",
            ));
        }
        self.on_store_error.check()?;
        Ok(())
    }

    /// The configured store, or a new memory store.
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        self.store
            .clone()
            .unwrap_or_else(|| Arc::new(MemoryStore::new()))
    }
}

/// A limiter's name keys its state in a shared store and labels its metrics.
fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            ConfigErrorKind::Invalid,
            format!("limiter name {name:?} must be 1 to 64 characters of [A-Za-z0-9_.-]"),
        ))
    }
}

impl<K: fmt::Debug> fmt::Debug for Builder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.common.name)
            .field("store", &self.common.store.is_some())
            .field("store_timeout", &self.common.store_timeout)
            .field("on_store_error", &self.common.on_store_error)
            .field("breaker", &self.common.breaker)
            .field("shadow", &self.common.shadow)
            .field("headers", &self.common.headers)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}
