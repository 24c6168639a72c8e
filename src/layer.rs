//! [`RateLimitLayer`] and its builder.

use crate::body::{InnerBody, WrapBody};
use crate::breaker::{Breakers, CircuitBreaker};
use crate::clock::{Clock, SystemClock};
use crate::deny_cache::{Denials, DenyCache};
use crate::error::ConfigError;
use crate::headers::HeaderStyle;
use crate::key::{Key, KeyError, KeyExtractor};
use crate::limiter::{KeySource, Limiter, LogThrottle, OnStoreError, PolicySource};
use crate::quota::{Policy, Quota};
use crate::response::{self, Rejection};
use crate::service::RateLimit;
use crate::store::{Charge, MemoryStore, Namespace, Store};
use crate::Decision;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// The default store timeout: far above a healthy Redis round trip (well under
/// a millisecond on a LAN, a few at p99.9), and small next to the request
/// budgets of the services it protects.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);

/// Applies a rate limit to every request of the wrapped service.
///
/// Cheap to clone: clones share one limiter (one store, one configuration), so
/// `.layer(layer.clone())` on several routers limits them together.
///
/// ```
/// use std::num::NonZeroU32;
/// use tower_ratelimit::{key::PeerIp, Quota, RateLimitLayer};
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
///     .key(PeerIp::new())
///     .build()
///     .unwrap();
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "ok" }))
///     .layer(layer);
/// ```
///
/// `M` is the responses' [`BodyMode`](crate::BodyMode): [`WrapBody`] from
/// [`build`](RateLimitLayerBuilder::build), [`InnerBody`] after
/// [`inner_body`](Self::inner_body).
pub struct RateLimitLayer<M = WrapBody> {
    limiter: Arc<Limiter>,
    body: PhantomData<fn() -> M>,
}

impl<M> Clone for RateLimitLayer<M> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            body: PhantomData,
        }
    }
}

impl RateLimitLayer {
    /// Starts configuring a layer.
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::default()
    }

    /// Answers in the inner service's own response body type instead of a
    /// [`ResponseBody`](crate::ResponseBody): the limiter's answers are made
    /// with `From<Bytes>`, so the inner body must allow it (axum's `Body`
    /// does).
    ///
    /// For axum, recommended: axum boxes every response body that is not
    /// its own `Body`, so the default mode costs one allocation and one
    /// indirection per response (about 2% of a hello world's CPU; the
    /// repository's `docs/performance.md`). Headers, refunds and answers are the same in
    /// both modes. The returned layer keeps this one's limiter: its clones
    /// and this layer's other clones limit together.
    ///
    /// The inner service is what the layer wraps: with axum's
    /// `Router::layer` that is always a route, whose body is axum's. In a
    /// `ServiceBuilder`, a layer below this one that wraps bodies in a type
    /// of its own (such as this crate's `ConcurrencyLimitLayer`) makes the
    /// stack fail to compile here (its body is not `From<Bytes>`): keep the
    /// default mode there.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tower_ratelimit::{key::PeerIp, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
    ///     .key(PeerIp::new())
    ///     .build()
    ///     .unwrap()
    ///     .inner_body();
    /// let app: axum::Router = axum::Router::new()
    ///     .route("/", axum::routing::get(|| async { "ok" }))
    ///     .layer(layer);
    /// ```
    #[must_use]
    pub fn inner_body(self) -> RateLimitLayer<InnerBody> {
        RateLimitLayer {
            limiter: self.limiter,
            body: PhantomData,
        }
    }
}

impl<M> RateLimitLayer<M> {
    /// Reads the caller's state without charging, with this layer's key, policy
    /// and store (e.g. for a GitHub-style `GET /rate_limit`). `Ok(None)` when the
    /// request is exempt.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// # use tower_ratelimit::{Quota, RateLimitLayer};
    /// # tokio_test_block_on(async {
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
    ///     .key(|_: &http::request::Parts| tower_ratelimit::key::Key::global())
    ///     .build()
    ///     .unwrap();
    /// let (parts, ()) = http::Request::new(()).into_parts();
    /// let status = layer.status(&parts).await.unwrap().unwrap();
    /// assert_eq!(status.decision.statuses()[0].remaining, 60);
    /// # });
    /// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    /// # }
    /// ```
    pub fn status(
        &self,
        parts: &Parts,
    ) -> impl Future<Output = Result<Option<Status>, StatusError>> + Send + 'static {
        let limiter = self.limiter.clone();
        let now_ms = limiter.clock.now_ms();
        let key = match &limiter.key {
            KeySource::Sync(k) => Ok(k.extract(parts)),
            KeySource::Async(f) => Err(f(parts)),
        };
        let policy_sync = match &limiter.policy {
            PolicySource::Static(p) => Some(Ok(p.clone())),
            _ => None,
        };
        let policy_fn = match &limiter.policy {
            PolicySource::Sync(f) => Some(f.clone()),
            _ => None,
        };
        let policy_async = match &limiter.policy {
            PolicySource::Async(f) => Some(f.clone()),
            _ => None,
        };
        // Resolve what needs the request head now; the future owns the rest.
        let parts_for_policy =
            (policy_fn.is_some() || policy_async.is_some()).then(|| clone_head(parts));
        async move {
            let key = match key {
                Ok(k) => k,
                Err(fut) => fut.await,
            }
            .map_err(StatusError::Key)?;
            let Some(key) = key else { return Ok(None) };
            let policy = match (policy_sync, policy_fn, policy_async, &parts_for_policy) {
                (Some(p), ..) => p,
                (_, Some(f), _, Some(p)) => Ok(f(p, &key)),
                (_, _, Some(f), Some(p)) => f(p, key).await,
                _ => unreachable!("a policy source is always configured"),
            }
            .map_err(StatusError::Key)?;
            let decision = limiter
                .store
                .status(&Charge {
                    namespace: &limiter.namespace,
                    key: &key,
                    policy: &policy,
                    cost: 0,
                    now_ms,
                    timeout: limiter.store_timeout,
                })
                .await
                .map_err(StatusError::Store)?;
            Ok(Some(Status {
                policy,
                decision,
                now_ms,
            }))
        }
    }
}

/// Copies a request head (without extensions that cannot be cloned) for an async policy lookup.
pub(crate) fn clone_head(parts: &Parts) -> Parts {
    let mut b = http::Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version);
    if let Some(h) = b.headers_mut() {
        *h = parts.headers.clone();
    }
    let (mut p, ()) = b
        .body(())
        .map(|r| r.into_parts())
        .unwrap_or_else(|_| http::Request::new(()).into_parts());
    p.extensions = parts.extensions.clone();
    p
}

/// A caller's rate-limit state, read without charging.
#[derive(Debug, Clone)]
pub struct Status {
    /// The policy that applies to the caller.
    pub policy: Policy,
    /// Every quota's state.
    pub decision: Decision,
    /// The time the state was read at (Unix ms).
    pub now_ms: u64,
}

/// Why [`RateLimitLayer::status`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The caller's key could not be extracted.
    #[error(transparent)]
    Key(KeyError),
    /// The store failed.
    #[error(transparent)]
    Store(crate::StoreError),
}

impl<M> RateLimitLayer<M> {
    /// Coordinated mode: runs one sync now (report counts, read the fleet's,
    /// set ratios) at the layer's clock time. The background task does this
    /// every interval; call it yourself with [`Coordinated::manual_sync`](crate::Coordinated::manual_sync).
    /// Without the coordinated mode it does nothing.
    #[cfg(feature = "redis")]
    pub async fn sync_now(&self) -> Result<(), crate::StoreError> {
        match &self.limiter.coordinator {
            Some(c) => c.sync(self.limiter.clock.now_ms()).await,
            None => Ok(()),
        }
    }
}

impl<S, M> Layer<S> for RateLimitLayer<M> {
    type Service = RateLimit<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.limiter.clone())
    }
}

impl<M> fmt::Debug for RateLimitLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("name", &self.limiter.namespace.name())
            .field("body", &std::any::type_name::<M>())
            .field("headers", &self.limiter.headers)
            .field("on_store_error", &self.limiter.on_store_error)
            .field("store_timeout", &self.limiter.store_timeout)
            .finish_non_exhaustive()
    }
}

/// Configures a [`RateLimitLayer`]; [`build`](Self::build) checks the configuration.
#[must_use]
pub struct RateLimitLayerBuilder {
    name: String,
    store: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    key: Option<KeySource>,
    policy: Option<Result<PolicySource, ConfigError>>,
    cost: Option<Arc<crate::limiter::CostFn>>,
    headers: HeaderStyle,
    refund: Arc<crate::limiter::RefundFn>,
    on_rejection: Arc<crate::limiter::RejectionFn>,
    on_key_error: Arc<crate::limiter::KeyErrorFn>,
    on_store_error: OnStoreError,
    store_timeout: Duration,
    shadow: bool,
    breaker: CircuitBreaker,
    deny_cache: DenyCache,
    #[cfg(feature = "redis")]
    coordinated: Option<crate::coordinated::Coordinated>,
}

impl Default for RateLimitLayerBuilder {
    fn default() -> Self {
        Self {
            name: "default".into(),
            store: None,
            clock: Arc::new(SystemClock),
            key: None,
            policy: None,
            cost: None,
            headers: HeaderStyle::default(),
            refund: Arc::new(|status, _| status == StatusCode::NOT_MODIFIED),
            on_rejection: Arc::new(response::default_rejection),
            on_key_error: Arc::new(response::default_key_error),
            on_store_error: OnStoreError::default(),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            shadow: false,
            breaker: CircuitBreaker::new(),
            deny_cache: DenyCache::new(),
            #[cfg(feature = "redis")]
            coordinated: None,
        }
    }
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder {
    /// Names the limiter (default `"default"`): its state is kept apart from
    /// other limiters sharing a store. `[A-Za-z0-9_.-]`, 1 to 64 bytes.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let q = Quota::per_second(NonZeroU32::new(5).unwrap());
    /// assert!(RateLimitLayer::builder().name("search-api").quota(q.clone()).build().is_ok());
    /// assert!(RateLimitLayer::builder().name("bad name").quota(q).build().is_err());
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// One quota for every request.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn quota(self, quota: Quota) -> Self {
        self.policy(Policy::new(quota))
    }

    /// Several quotas for every request, charged all or nothing.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Policy, Quota, RateLimitLayer};
    /// let n = |n| NonZeroU32::new(n).unwrap();
    /// let policy = Policy::new(Quota::per_second(n(10))).and(Quota::per_hour(n(1000))).unwrap();
    /// let layer = RateLimitLayer::builder().policy(policy).build().unwrap();
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(Ok(PolicySource::Static(policy)));
        self
    }

    /// A policy per request, e.g. tiers by key: 60/h anonymous, 5000/h authenticated.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Policy, Quota, RateLimitLayer};
    /// let anon = Policy::new(Quota::per_hour(NonZeroU32::new(60).unwrap()));
    /// let auth = Policy::new(Quota::per_hour(NonZeroU32::new(5000).unwrap()));
    /// let layer = RateLimitLayer::builder()
    ///     .policy_fn(move |parts, _key| {
    ///         if parts.headers.contains_key("authorization") { auth.clone() } else { anon.clone() }
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn policy_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts, &Key) -> Policy + Send + Sync + 'static,
    {
        self.policy = Some(Ok(PolicySource::Sync(Arc::new(f))));
        self
    }

    /// A policy looked up asynchronously (e.g. an API key's plan in a database or
    /// cache). The closure gets the head by reference and must return a future
    /// that owns what it needs. Only users of this path pay for its boxing.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Policy, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .policy_async(|_parts, _key| async {
    ///         // e.g. let plan = db.plan_for(key).await?;
    ///         Ok(Policy::new(Quota::per_hour(NonZeroU32::new(5000).unwrap())))
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn policy_async<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(&Parts, Key) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Policy, KeyError>> + Send + 'static,
    {
        self.policy = Some(Ok(PolicySource::Async(Arc::new(
            move |p: &Parts, k: Key| Box::pin(f(p, k)) as _,
        ))));
        self
    }

    /// How to find the client's key (default: one global key). See [`crate::key`].
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{key::ClientIp, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .key(ClientIp::new().trust_cidr("10.0.0.0/8".parse().unwrap()))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.key = Some(KeySource::Sync(Arc::new(extractor)));
        self
    }

    /// Finds the key asynchronously (e.g. resolving a session id). `Ok(None)` exempts the request.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{key::Key, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .key_async(|parts| {
    ///         let session = parts.headers.get("cookie").cloned();
    ///         async move { Ok(session.map(|s| Key::secret(s.as_bytes()))) }
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn key_async<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<Key>, KeyError>> + Send + 'static,
    {
        self.key = Some(KeySource::Async(Arc::new(move |p: &Parts| {
            Box::pin(f(p)) as _
        })));
        self
    }

    /// The cost of a request (default 1). A cost above a quota's limit is
    /// always rejected; a cost of 0 is admitted without spending.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_minute(NonZeroU32::new(100).unwrap()))
    ///     .cost(|parts| if parts.uri.path().starts_with("/search") { 10 } else { 1 })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn cost<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(f));
        self
    }

    /// Where state lives (default: a new [`MemoryStore`] shared by this layer's clones).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{store::MemoryStore, Quota, RateLimitLayer};
    /// let store = MemoryStore::new();
    /// let q = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// // Two layers, one store: each keeps its own namespace.
    /// let a = RateLimitLayer::builder().name("a").quota(q.clone()).store(store.clone()).build().unwrap();
    /// let b = RateLimitLayer::builder().name("b").quota(q).store(store).build().unwrap();
    /// ```
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// The time source (default [`SystemClock`]); tests pass a [`crate::clock::ManualClock`].
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{clock::ManualClock, Quota, RateLimitLayer};
    /// let clock = ManualClock::new(0);
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .clock(clock.clone())
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Which headers responses carry (default [`HeaderStyle::GitHub`]).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{HeaderStyle, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .headers(HeaderStyle::Both)
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// Which responses are free: their cost is refunded (default: `304 Not Modified`).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use http::StatusCode;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .refund_if(|status, _headers| status == StatusCode::NOT_MODIFIED || status.is_server_error())
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn refund_if<F>(mut self, f: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        self.refund = Arc::new(f);
        self
    }

    /// Replaces the 429 response (the rate-limit headers are still added to it).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use bytes::Bytes;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .on_rejection(|_r| {
    ///         http::Response::builder().status(429).body(Bytes::from("slow down")).unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.on_rejection = Arc::new(f);
        self
    }

    /// Replaces the response to a request whose key cannot be extracted (default 500).
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
    pub fn on_key_error<F>(mut self, f: F) -> Self
    where
        F: Fn(&KeyError) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.on_key_error = Arc::new(f);
        self
    }

    /// What a store failure does to a request (default [`OnStoreError::FailOpen`]).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{OnStoreError, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .on_store_error(OnStoreError::FailClosed)
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
        self.store_timeout = timeout;
        self
    }

    /// Shadow mode: decide and record as usual, but never reject. Would-be
    /// rejections are counted (`ratelimit_shadow_rejections_total`) and logged,
    /// and the inner service sees every request — watch a new limit before
    /// enforcing it.
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
        self.shadow = shadow;
        self
    }

    /// The circuit breaker in front of the store (default [`CircuitBreaker::new`]:
    /// open after 5 consecutive failures, probe after 1 s).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_ratelimit::{CircuitBreaker, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
    ///     .circuit_breaker(CircuitBreaker::new().failures(3).cooldown(Duration::from_millis(250)))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// The local deny cache (default [`DenyCache::new`], used with network stores only).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{DenyCache, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
    ///     .deny_cache(DenyCache::disabled())
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn deny_cache(mut self, cache: DenyCache) -> Self {
        self.deny_cache = cache;
        self
    }

    /// Coordinated mode: decide locally with a per-key drop ratio computed out of
    /// band from fleet-wide counts in Redis — no store call on the request
    /// path; approximate limits that lag traffic by one or two sync intervals.
    /// See [`Coordinated`](crate::Coordinated). The layer's `store` is not used in this mode.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{store::RedisStore, Coordinated, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1000).unwrap()))
    ///     .coordinated(Coordinated::new(RedisStore::new("redis://127.0.0.1").unwrap()))
    ///     .build()
    ///     .unwrap();
    /// ```
    #[cfg(feature = "redis")]
    pub fn coordinated(mut self, coordinated: crate::coordinated::Coordinated) -> Self {
        self.coordinated = Some(coordinated);
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        check_name(&self.name)?;
        let policy = self.policy.ok_or_else(|| {
            ConfigError::new(
                "no quota configured: call .quota(), .policy(), .policy_fn() or .policy_async()",
            )
        })??;
        if self.store_timeout.is_zero() {
            return Err(ConfigError::new("the store timeout must be above zero"));
        }
        let fallback = match self.on_store_error {
            OnStoreError::Local { fraction } if !(fraction > 0.0 && fraction <= 1.0) => {
                return Err(ConfigError::new(format!(
                    "OnStoreError::Local needs a fraction in (0, 1], got {fraction}"
                )))
            }
            OnStoreError::Local { .. } => Some(MemoryStore::new()),
            _ => None,
        };
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        let namespace = Namespace::new(&self.name);
        #[cfg(feature = "redis")]
        let coordinator = match self.coordinated {
            Some(c) if c.interval.is_zero() => {
                return Err(ConfigError::new(
                    "the coordinated sync interval must be above zero",
                ))
            }
            Some(c) if c.store.is_cluster() => {
                return Err(ConfigError::new(
                    "the coordinated mode syncs many clients' keys in one pipeline, which a \
                     Redis Cluster cannot route: give it a standalone Redis",
                ))
            }
            Some(c) => Some(Arc::new(crate::coordinated::Coordinator::new(
                c,
                namespace.clone(),
            ))),
            None => None,
        };
        // The memory store answers locally: a deny cache in front of it only costs.
        let denials = if store.is_local() {
            None
        } else {
            Denials::new(self.deny_cache)
        };
        let breakers = Breakers::new(self.breaker, store.failure_domains());
        Ok(RateLimitLayer {
            limiter: Arc::new(Limiter {
                namespace,
                store,
                clock: self.clock,
                key: self
                    .key
                    .unwrap_or_else(|| KeySource::Sync(Arc::new(EveryRequest))),
                policy,
                cost: self.cost,
                headers: self.headers,
                refund: self.refund,
                on_rejection: self.on_rejection,
                on_key_error: self.on_key_error,
                on_store_error: self.on_store_error,
                store_timeout: self.store_timeout,
                shadow: self.shadow,
                breakers,
                denials,
                fallback,
                log: LogThrottle::default(),
                metrics: Default::default(),
                #[cfg(feature = "redis")]
                coordinator,
            }),
            body: PhantomData,
        })
    }
}

/// A limiter's name keys its state in a shared store and labels its metrics.
pub(crate) fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(format!(
            "limiter name {name:?} must be 1 to 64 characters of [A-Za-z0-9_.-]"
        )))
    }
}

/// The default key: every request shares one (a global limit).
struct EveryRequest;

impl KeyExtractor for EveryRequest {
    fn extract(&self, _: &Parts) -> Result<Option<Key>, KeyError> {
        Ok(Some(Key::global()))
    }
}
