//! [`RateLimitLayer`] and its builder.

#[cfg(feature = "advisor")]
use super::advisor::{Advice, Advisor, Recorder};
use super::body::{InnerBody, WrapBody};
use super::deny_cache::{Denials, DenyCache};
use super::limiter::{KeySource, Limiter, PolicySource, RejectionFn, Status, StatusError};
#[cfg(feature = "runtime-limits")]
use super::limits::{Limits, Table};
use super::response::{default_rejection, Rejection};
use super::service::RateLimit;
use super::settle::Settlement;
use crate::builder::Builder;
use crate::error::{ConfigError, ConfigErrorKind};
use crate::failure::{Guard, OnStoreError};
use crate::key::{Global, Key, KeyError, KeyExtractor};
use crate::store::{MemoryStore, Namespace};
use crate::Policy;
use bytes::Bytes;
use http::request::Parts;
use http::Response;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use tower_layer::Layer;

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
/// `M` is the responses' [`BodyMode`](crate::rate::BodyMode): [`WrapBody`] from
/// [`build`](RateLimitLayerBuilder::build), [`InnerBody`] after
/// [`inner_body`](Self::inner_body).
pub struct RateLimitLayer<M = WrapBody> {
    limiter: Arc<Limiter>,
    extras: Extras,
    body: PhantomData<fn() -> M>,
}

/// What the layer's extras keep beside the limiter, which reaches them only
/// through its seams (`hooks.rs`).
#[derive(Clone, Default)]
struct Extras {
    /// The runtime limits' table ([`RateLimitLayer::limits`]).
    #[cfg(feature = "runtime-limits")]
    limits: Option<Arc<Table>>,
    /// The advisor's record ([`RateLimitLayer::advice`]).
    #[cfg(feature = "advisor")]
    advisor: Option<Arc<Recorder>>,
}

impl<M> Clone for RateLimitLayer<M> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            extras: self.extras.clone(),
            body: PhantomData,
        }
    }
}

/// Configures a [`RateLimitLayer`]: the options every layer shares (see
/// [`Builder`]) and the rate limiter's own (below).
pub type RateLimitLayerBuilder = Builder<Settings>;

/// The rate limiter's own options, set through [`RateLimitLayerBuilder`].
pub struct Settings {
    key: KeySource,
    policy: Option<PolicySource>,
    cost: Option<Arc<super::settle::CostFn>>,
    settlement: Settlement,
    status_extension: bool,
    on_rejection: Arc<RejectionFn>,
    deny_cache: DenyCache,
    #[cfg(all(feature = "runtime-limits", feature = "redis"))]
    shared_limits: Option<super::limits::SharedLimits>,
    #[cfg(feature = "advisor")]
    advisor: Option<Advisor>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("policy", &self.policy.is_some())
            .field("deny_cache", &self.deny_cache)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Starts configuring a layer.
    pub fn builder() -> RateLimitLayerBuilder {
        Builder::with(
            "default",
            Settings {
                key: KeySource::Sync(Arc::new(Global)),
                policy: None,
                cost: None,
                settlement: Settlement::new(),
                status_extension: false,
                on_rejection: Arc::new(default_rejection),
                deny_cache: DenyCache::new(),
                #[cfg(all(feature = "runtime-limits", feature = "redis"))]
                shared_limits: None,
                #[cfg(feature = "advisor")]
                advisor: None,
            },
        )
    }

    /// Answers in the inner service's own response body type instead of a
    /// [`ResponseBody`](crate::body::ResponseBody): the limiter's answers are made
    /// with `From<Bytes>`, so the inner body must allow it (axum's `Body`
    /// does).
    ///
    /// For axum, recommended: axum boxes every response body that is not
    /// its own `Body`, so the default mode costs one allocation and one
    /// indirection per response. Headers, refunds and answers are the same
    /// in both modes. The returned layer keeps this one's limiter: its clones
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
    ///
    /// The body passes through unwatched, so requests settle at their
    /// response head: [`from_trailers`](super::Settlement::from_trailers)
    /// and [`from_body_bytes`](super::Settlement::from_body_bytes)
    /// see nothing here, and a warning says so.
    #[must_use]
    pub fn inner_body(self) -> RateLimitLayer<InnerBody> {
        let l = &self.limiter;
        if l.settle_trailers.is_some() || l.body_bytes {
            tracing::warn!(
                limiter = l.namespace.name(),
                "inner_body passes the response body through unwatched: a settlement from \
                 the trailers or the body's bytes sees nothing, and requests settle at \
                 their response head"
            );
        }
        RateLimitLayer {
            limiter: self.limiter,
            extras: self.extras,
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
        self.limiter
            .clone()
            .status(super::limiter::clone_head(parts))
    }

    /// Opens the store's connections now, so the first requests do not wait
    /// for them (see [`Store::connect`](crate::store::Store::connect)). Call
    /// it before serving; on failure the layer still works, connecting on use.
    ///
    /// It also measures how far the layer's clock is from the store's
    /// ([`Store::time`](crate::store::Store::time): Redis `TIME`), as it does
    /// every minute after: the gauge `ratelimit_store_clock_offset_seconds`,
    /// and a warning naming the offset past 500 ms. An offset never deletes
    /// state (every TTL is relative), but instances whose clocks differ
    /// disagree on windows.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{store::RedisStore, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
    ///     .store(RedisStore::new("rediss://redis.internal:6380")?)
    ///     .build()?;
    /// if let Err(e) = layer.connect().await {
    ///     tracing::warn!(error = %e, "rate limit store not reachable yet");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn connect(&self) -> Result<(), crate::StoreError> {
        self.limiter.store.connect().await?;
        if let Some(skew) = &self.limiter.skew {
            skew.measure().await;
            skew.start();
        }
        #[cfg(feature = "runtime-limits")]
        self.limits().refresh().await?;
        Ok(())
    }

    /// Answers every request waiting for its turn at once (503, or gRPC
    /// `UNAVAILABLE`), giving its turn back, and lets no request wait from
    /// now on (they are refused as they would be without waiting): call it
    /// when the service starts shutting down, so that no waiting request
    /// holds the shutdown up. For every clone of this layer.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .build()?;
    /// // In a graceful shutdown handler, before waiting for requests in flight:
    /// layer.close_waiters();
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn close_waiters(&self) {
        self.limiter.waiters.close();
    }

    /// The handle that changes this layer's limits while it serves, at
    /// once for every clone: see [`Limits`]. With
    /// [`shared_limits`](RateLimitLayerBuilder::shared_limits) the changes
    /// hold for the whole fleet.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
    ///     .build()
    ///     .unwrap();
    /// assert!(layer.limits().overrides().is_empty());
    /// ```
    #[cfg(feature = "runtime-limits")]
    #[cfg_attr(docsrs, doc(cfg(feature = "runtime-limits")))]
    pub fn limits(&self) -> Limits {
        let table = self.extras.limits.clone();
        Limits::new(table.expect("every layer built with runtime-limits has its table"))
    }

    /// What the [`advisor`](RateLimitLayerBuilder::advisor) saw over its
    /// closed windows, and the limits it suggests; `None` without one.
    /// This process's requests only.
    #[cfg(feature = "advisor")]
    #[cfg_attr(docsrs, doc(cfg(feature = "advisor")))]
    pub fn advice(&self) -> Option<Advice> {
        let advisor = self.extras.advisor.as_ref()?;
        Some(advisor.advice(self.limiter.clock.now_ms()))
    }

    /// The same report for the whole fleet, when the advisor merges its
    /// windows in Redis ([`Advisor::fleet`]): this instance's closed
    /// windows are sent first, then every instance's are read. Without
    /// `fleet`, this process's report; `Ok(None)` without an advisor.
    #[cfg(all(feature = "advisor", feature = "redis"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "advisor", feature = "redis"))))]
    pub async fn fleet_advice(&self) -> Result<Option<Advice>, crate::StoreError> {
        let Some(advisor) = &self.extras.advisor else {
            return Ok(None);
        };
        advisor
            .fleet_advice(self.limiter.clock.now_ms())
            .await
            .map(Some)
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
            .field("on_store_error", &self.limiter.guard.policy)
            .field("store_timeout", &self.limiter.store_timeout)
            .finish_non_exhaustive()
    }
}

impl Builder<Settings> {
    /// The quota, or the quotas ([`Policy`]), every request is charged
    /// against, all or nothing.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Policy, Quota, RateLimitLayer};
    /// let n = |n| NonZeroU32::new(n).unwrap();
    /// let one = RateLimitLayer::builder().quota(Quota::per_second(n(10))).build()?;
    /// let policy = Policy::new(Quota::per_second(n(10))).and(Quota::per_hour(n(1000)))?;
    /// let both = RateLimitLayer::builder().quota(policy).build()?;
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn quota(mut self, policy: impl Into<Policy>) -> Self {
        self.kind.policy = Some(PolicySource::Static(policy.into()));
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
        self.kind.policy = Some(PolicySource::Sync(Arc::new(f)));
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
        self.kind.policy = Some(PolicySource::Async(Arc::new(move |p: &Parts, k: Key| {
            Box::pin(f(p, k)) as _
        })));
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
        self.kind.key = KeySource::Sync(Arc::new(extractor));
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
        self.kind.key = KeySource::Async(Arc::new(move |p: &Parts| Box::pin(f(p)) as _));
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
        self.kind.cost = Some(Arc::new(f));
        self
    }

    /// How requests are settled once their cost is known, and which
    /// responses are free: see [`Settlement`]. By default, quotas of another
    /// unit than requests are charged the request's [`cost`](Self::cost) and
    /// never settled, and a `304 Not Modified` is free.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::rate::Settlement;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let tokens = Quota::new(1_000, Duration::from_secs(60))?.named("tokens")?.with_unit("tokens")?;
    /// let layer = RateLimitLayer::builder()
    ///     .quota(tokens)
    ///     .settlement(
    ///         Settlement::new()
    ///             .reserve(|_| 0)
    ///             .from_head(|_status, headers| headers.get("x-tokens-used")?.to_str().ok()?.parse().ok()),
    ///     )
    ///     .build()?;
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn settlement(mut self, settlement: Settlement) -> Self {
        self.kind.settlement = settlement;
        self
    }

    /// Gives the inner service each charged request's [`Status`] (every
    /// quota's limit, remaining and reset, as the headers report them) in
    /// the request's extensions; with axum, as the extractor
    /// `Extension<Status>` (or `Option<Extension<Status>>`: a request not
    /// charged, exempt or admitted without the store, carries none). Off by
    /// default: it costs an allocation per request.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer, rate::Status};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .status_extension(true)
    ///     .build()
    ///     .unwrap();
    /// // In a handler: `req.extensions().get::<Status>()`, then
    /// // `status.decision.statuses()[0].remaining`.
    /// ```
    pub fn status_extension(mut self, on: bool) -> Self {
        self.kind.status_extension = on;
        self
    }

    /// Replaces the 429 response (the rate-limit headers are still added to
    /// it): any `http::Response` whose body becomes [`Bytes`] (a `String`, a
    /// `&'static str`, a `Vec<u8>`).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .on_rejection(|r| {
    ///         let body = format!("slow down: try again in {}s", r.retry_after_secs().unwrap_or(1));
    ///         http::Response::builder().status(429).body(body).unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn on_rejection<F, B>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.kind.on_rejection = Arc::new(move |r| f(r).map(Into::into));
        self
    }

    /// The local deny cache (default [`DenyCache::new`], used with network stores only).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{rate::DenyCache, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
    ///     .deny_cache(DenyCache::disabled())
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn deny_cache(mut self, cache: DenyCache) -> Self {
        self.kind.deny_cache = cache;
        self
    }

    /// Keeps the limits changed at runtime ([`RateLimitLayer::limits`]) in
    /// Redis, for every instance: see [`SharedLimits`](super::SharedLimits).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{rate::SharedLimits, store::RedisStore, Quota, RateLimitLayer};
    /// let store = RedisStore::new("redis://127.0.0.1").unwrap();
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
    ///     .store(store.clone())
    ///     .shared_limits(SharedLimits::new(store))
    ///     .build()
    ///     .unwrap();
    /// ```
    #[cfg(all(feature = "runtime-limits", feature = "redis"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "runtime-limits", feature = "redis"))))]
    pub fn shared_limits(mut self, shared: super::limits::SharedLimits) -> Self {
        self.kind.shared_limits = Some(shared);
        self
    }

    /// Records each key's usage per window (requests offered, rejected
    /// ones included) and suggests limits from it: see [`Advisor`] and
    /// [`RateLimitLayer::advice`].
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{rate::Advisor, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
    ///     .advisor(Advisor::new())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(layer.advice().unwrap().windows, 0);
    /// ```
    #[cfg(feature = "advisor")]
    #[cfg_attr(docsrs, doc(cfg(feature = "advisor")))]
    pub fn advisor(mut self, advisor: Advisor) -> Self {
        self.kind.advisor = Some(advisor);
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        let Builder { common, kind } = self;
        common.check()?;
        let policy = kind.policy.ok_or_else(|| {
            ConfigError::new(
                ConfigErrorKind::Missing,
                "no quota configured: call .quota(), .policy_fn() or .policy_async()",
            )
        })?;
        let store = common.store();
        let backstop = crate::failure::backstop(&*store, common.store_timeout);
        let namespace = Namespace::new(&common.name);
        if let PolicySource::Static(p) = &policy {
            store.check_policy(p)?;
        }
        #[cfg_attr(
            not(any(feature = "runtime-limits", feature = "advisor")),
            allow(unused_mut)
        )]
        let mut extras = Extras::default();
        #[cfg(feature = "runtime-limits")]
        let overrides: Option<Arc<dyn super::hooks::Overrides>> = {
            #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
            let mut table = Table::new(store.clone());
            #[cfg(feature = "redis")]
            if let Some(shared) = kind.shared_limits {
                shared.check()?;
                table.shared = Some(super::limits::Shared::new(shared, &namespace));
            }
            let table = Arc::new(table);
            table.start();
            extras.limits = Some(table.clone());
            Some(Arc::new(super::limits::Hook(table)))
        };
        #[cfg(not(feature = "runtime-limits"))]
        let overrides = None;
        #[cfg(feature = "advisor")]
        let observer: Option<Arc<dyn super::hooks::Observe>> = match kind.advisor {
            Some(a) => {
                a.check()?;
                let recorder = Arc::new(Recorder::new(a, &namespace));
                extras.advisor = Some(recorder.clone());
                Some(Arc::new(super::advisor::Hook(recorder)))
            }
            None => None,
        };
        #[cfg(not(feature = "advisor"))]
        let observer = None;
        let claim = {
            let (what, unique) = match &policy {
                PolicySource::Static(p) => (format!("rate limit {p}"), false),
                // Closures cannot be compared: like no other limiter.
                _ => (
                    "rate limit with a policy chosen per request".to_owned(),
                    true,
                ),
            };
            crate::names::claim(&*store, &common.name, what, unique)?
        };
        let fallback =
            matches!(common.on_store_error, OnStoreError::Local { .. }).then(MemoryStore::new);
        // The memory store answers locally: a deny cache in front of it only costs.
        let denials = if store.is_local() {
            None
        } else {
            Denials::new(kind.deny_cache)
        };
        let guard = Guard::new(
            &common.name,
            "rate limit",
            common.on_store_error,
            common.breaker,
            store.failure_domains(),
            common.clock.clone(),
        );
        // A network store's clock is watched; one in this process is ours.
        let skew = (!store.is_local()).then(|| {
            Arc::new(crate::skew::Skew::new(
                store.clone(),
                common.clock.clone(),
                &common.name,
            ))
        });
        Ok(RateLimitLayer {
            limiter: Arc::new(Limiter {
                // `~` is no character of a limiter's name: no name a user
                // picks reaches a shadow policy's state.
                shadow_namespace: Namespace::new(&format!("{}~shadow", common.name)),
                namespace,
                local_store: store.is_local(),
                store,
                clock: common.clock,
                key: kind.key,
                policy,
                overrides,
                observer,
                cost: kind.cost,
                reserve: kind.settlement.reserve,
                settle: kind.settlement.head,
                settle_trailers: kind.settlement.trailers,
                body_bytes: kind.settlement.body_bytes,
                usage_extension: kind.settlement.usage,
                dropped: kind.settlement.dropped,
                headers: common.headers,
                status_extension: kind.status_extension,
                refund: kind.settlement.refund,
                free: super::free::FreeResponses::new(),
                on_rejection: kind.on_rejection,
                on_key_error: common.on_key_error,
                store_timeout: common.store_timeout,
                backstop,
                shadow: common.shadow,
                guard,
                denials,
                fallback,
                metrics: Default::default(),
                skew,
                waiters: Arc::default(),
                refusal_metrics: std::sync::OnceLock::new(),
                _name: claim,
            }),
            extras,
            body: PhantomData,
        })
    }
}
