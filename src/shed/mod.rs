//! Load shedding with priorities: under load, refuse the least important
//! requests first (503), keeping capacity for critical ones.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tower_ratelimit::{LoadShedLayer, shed::Priority};
//!
//! let shed = LoadShedLayer::builder()
//!     .capacity(500) // requests this process serves at once at full load
//!     .classify(|parts| match parts.uri.path() {
//!         "/charges" => Priority::Critical,
//!         p if p.starts_with("/reports") => Priority::Low,
//!         _ => Priority::Normal,
//!     })
//!     .build()
//!     .unwrap();
//! let app: Router = Router::new().route("/charges", get(|| async { "ok" })).layer(shed);
//! ```
//!
//! The layer's service is [`Guarded<S, Admission>`](crate::guarded::Guarded),
//! shared with the concurrency limiter: its response future is
//! [`ResponseFuture<S, ReqBody, Admission>`](crate::guarded::ResponseFuture),
//! and its response body
//! [`GuardedBody<ResBody, Admission>`](crate::body::GuardedBody) — the inner
//! service's body holding the request's [`Admission`] (it counts in flight)
//! until it has been sent, or the shedder's own 503.
//!
//! # Classes and shares
//!
//! | class | may use (default) | shed when |
//! |---|---|---|
//! | [`Priority::Test`] | 50 % of capacity | half the capacity is in use |
//! | [`Priority::Low`] | 70 % | 70 % is in use |
//! | [`Priority::Normal`] | 90 % | 90 % is in use |
//! | [`Priority::Critical`] | 100 % | everything is in use |
//!
//! So the last 10 % of capacity is reserved for critical traffic, and as load
//! rises test traffic is shed first, then low, then normal. Shares are set
//! with [`LoadShedLayerBuilder::share`](crate::LoadShedLayerBuilder::share). The count is exact: a class never has
//! more than its share in flight, however many requests race.
//!
//! # Per process, and how it combines with the fleet-wide rate limit
//!
//! The shedder protects *this instance's* resources (threads, memory, a
//! database pool): its state is an atomic counter, it makes no network call,
//! and it knows nothing of other instances. The rate limit
//! ([`RateLimitLayer`](crate::RateLimitLayer) with a `RedisStore`) is
//! fleet-wide and per client: it decides what each client is *entitled* to;
//! the shedder decides what this instance can *afford* right now, whoever
//! asks. They answer differently on purpose: a rate-limited client gets 429
//! (slow down, it is you), a shed request 503 (retry, it is us).
//!
//! Put the shedder **outermost**: an overloaded instance then refuses work
//! before spending a store round trip on it, and a shed request does not
//! spend the client's rate quota. In axum the last `.layer()` call is the
//! outermost:
//!
//! ```
//! # use axum::{routing::get, Router};
//! # use tower_ratelimit::{ConcurrencyLimitLayer, LoadShedLayer, RateLimitLayer, Quota};
//! # let quota = Quota::per_second(std::num::NonZeroU32::new(10).unwrap());
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(ConcurrencyLimitLayer::builder().limit(5).build().unwrap()) // innermost
//!     .layer(RateLimitLayer::builder().quota(quota).build().unwrap())
//!     .layer(LoadShedLayer::builder().capacity(200).build().unwrap()); // outermost
//! ```
//!
//! # Fleet-wide: a capacity for what the instances share
//!
//! With a [`fleet_capacity`](crate::LoadShedLayerBuilder::fleet_capacity) and a
//! `RedisStore`, the count is the fleet's: each admitted request holds a
//! leased slot under one key in Redis (the concurrency limiter's slots, one
//! `EVALSHA` to acquire and one, off the response path, to release), and a
//! class of share `s` is admitted while fewer than `floor(s × capacity)` are
//! held across every instance. It protects what the instances share — a
//! database, a downstream API — and keeps its last part for critical
//! traffic, however the balancer spreads the load.
//!
//! ```
//! # #[cfg(feature = "redis")] {
//! use tower_ratelimit::LoadShedLayer;
//! use tower_ratelimit::store::RedisStore;
//! let fleet = LoadShedLayer::builder()
//!     .name("ledger-db")
//!     .capacity(200)       // this instance, counted in memory
//!     .fleet_capacity(600) // every instance on this Redis
//!     .store(RedisStore::new("redis://127.0.0.1:6379")?)
//!     .build()?;
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - **Order.** This process's own capacity and utilisation are checked
//!   first: a request they shed makes no store call.
//! - **Cost.** Two Redis calls per admitted request, whatever the class; the
//!   one key lives on one Redis node, so its load grows with the fleet's
//!   request rate. Leased slots were chosen over coordinated counts (a sync
//!   per interval, no call per request): between two syncs each instance
//!   fills the room it last saw, so a fleet of N runs up to N × a class's
//!   share at once whatever the interval
//!   (`tests/properties/fleet_counting_model.rs` models both; the numbers
//!   are in `docs/performance.md`).
//! - **Failure.** When Redis fails, the layer's
//!   [failure policy](crate::failure::OnStoreError) decides: by default it fails open;
//!   `Local { fraction }` gives each instance that fraction of each class's
//!   fleet limit, counted in memory; `FailClosed` answers 503. The breaker
//!   and the store timeout apply as for the other limiters.
//! - **Leases.** A slot a crashed instance never gave back stops counting
//!   when its [`lease`](crate::LoadShedLayerBuilder::lease) ends (30 s by default).
//!
//! A [`utilisation`](crate::LoadShedLayerBuilder::utilisation) signal can carry any
//! other load figure you compute, including a fleet-wide one.
//!
//! # Metrics
//!
//! As [`crate::metrics`], every series labelled `limiter` (the layer's name):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `load_shed_decisions_total` | counter | `class`, `outcome` = `admitted`, `shed` | requests by class and outcome |
//! | `load_shed_shadow_total` | counter | `class` | would-be sheds admitted in shadow mode |
//! | `load_shed_in_flight` | gauge | | requests in flight through the shedder |
//! | `load_shed_utilisation` | gauge | | the utilisation signal's last reading |
//! | `load_shed_capacity` | gauge | | where an adaptive capacity stands |
//! | `load_shed_fleet_store_duration_seconds` | histogram | `op` = `acquire`, `release` | fleet store call latency |
//! | `load_shed_fleet_store_errors_total` | counter | `kind` | fleet store failures |
//! | `load_shed_fleet_store_failure_decisions_total` | counter | `action` = `open`, `closed`, `local` | requests decided by the failure policy |
//! | `load_shed_fleet_breaker_state` | gauge | | 0 closed, 1 open, 2 half-open |
//! | `load_shed_fleet_releases_total` | counter | `result` = `ok`, `failed` | fleet slots given back |

pub(crate) mod layer;
mod metrics;
mod priority;
mod shedder;

pub use layer::{Settings, DEFAULT_SHARES};
pub use priority::{ParsePriorityError, Priority};
pub use shedder::{default_response, Admission, Overloaded};
