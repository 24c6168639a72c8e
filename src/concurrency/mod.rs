//! The concurrent-requests limiter: at most N requests in flight per key, per
//! process or for the whole fleet.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tower_ratelimit::ConcurrencyLimitLayer;
//! use tower_ratelimit::key::Header;
//!
//! // At most 5 reports per tenant run at once; the 6th is answered 429.
//! let reports = ConcurrencyLimitLayer::builder()
//!     .name("reports")
//!     .limit(5)
//!     .key(Header::try_new("x-tenant").unwrap())
//!     .build()
//!     .unwrap();
//! let app: Router = Router::new()
//!     .route("/reports", get(|| async { "expensive" }))
//!     .route_layer(reports);
//! ```
//!
//! Slots live in the layer's [`Store`](crate::store::Store): per process
//! in a [`MemoryStore`](crate::store::MemoryStore) (the default), or for the
//! whole fleet in a `RedisStore`.
//!
//! A request rate limit ([`RateLimitLayer`](crate::RateLimitLayer)) bounds how
//! many requests a client *starts* per window; this bounds how many *run at
//! once*, which is what protects expensive endpoints from slow or bursty
//! clients whose requests pile up.
//!
//! # Slots
//!
//! A request takes a slot (a unique [`SlotId`](crate::store::SlotId)) before the inner service is
//! called and gives it back when the response body has produced its last
//! frame — or, first, when the body is dropped (the client disconnected
//! mid-response), the request future is dropped (the client went away
//! before the response, or a handler panicked), or the inner service returned
//! an error. The slot is a guard with `Drop`, so no path leaks it; a release to
//! Redis is spawned, never awaited on the response path, and bounded by the
//! store timeout.
//!
//! The layer's service is [`Guarded<S, Slot>`](crate::guarded::Guarded),
//! shared with the load shedder: its response future is
//! [`ResponseFuture<S, ReqBody, Slot>`](crate::guarded::ResponseFuture), and
//! its response body [`GuardedBody<ResBody, Slot>`](crate::body::GuardedBody)
//! — the inner service's body holding the slot until it has been sent, or
//! the limiter's own 429.
//!
//! # Fleet-wide, through Redis
//!
//! With a `RedisStore` (feature `redis`) each key's slots are one sorted set of
//! slot ids scored by lease expiry, under a key that carries the client's
//! `{hash tag}`. Acquiring is one `EVALSHA` of `lua/concurrency_acquire.lua`:
//! drop expired members, count, add this id if below the limit, set the key's
//! expiry to its latest lease — with `now` from the application's clock, like
//! the rate limiter. Releasing is one call of `lua/concurrency_release.lua`.
//! A slot that was never released — its instance crashed, or Redis was down
//! at release time — stops counting when its **lease** ends
//! ([`DEFAULT_LEASE`](crate::store::DEFAULT_LEASE), 30 s), and the key itself expires one second later. A
//! release that overtakes its own acquire (a timed-out or abandoned acquire on
//! another connection) leaves a tombstone that makes the late acquire fail.
//!
//! Leases are not renewed: see [`ConcurrencyLimitLayerBuilder::lease`](crate::ConcurrencyLimitLayerBuilder::lease) for the
//! trade-off.
//!
//! # Stacking with the other limiters
//!
//! Put the load shedder ([`crate::shed`]) outermost, then the rate limit, then
//! this limit (in axum, `.layer()` calls wrap what came before, so the last
//! call is the outermost):
//!
//! - shedding first costs nothing (in memory) and protects this instance
//!   before any store round trip;
//! - a rate-limited request costs one store call and never takes a slot;
//! - this limit is often per route (`route_layer`) on expensive endpoints.
//!
//! A 429 from this limiter passing out through the rate limiter keeps its own
//! numbers: GitHub-style headers report the most restrictive limit, and IETF
//! `RateLimit-Policy`/`RateLimit` list both policies. The rate limiter charged
//! the request; give it back with
//! [`Settlement::refund_if`](crate::rate::Settlement::refund_if) if you prefer.
//!
//! # Metrics
//!
//! As [`crate::metrics`], every series labelled `limiter`:
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `concurrency_decisions_total` | counter | `outcome` = `allowed`, `rejected`, `exempt`, `key_error` | requests by outcome |
//! | `concurrency_shadow_rejections_total` | counter | | would-be rejections admitted in shadow mode |
//! | `concurrency_in_flight` | gauge | | requests this process admitted that are still running |
//! | `concurrency_limit` | gauge | | where an adaptive limit stands, in this process |
//! | `concurrency_store_duration_seconds` | histogram | `op` = `acquire`, `release` | store call latency (network stores) |
//! | `concurrency_store_errors_total` | counter | `kind` | store failures |
//! | `concurrency_store_failure_decisions_total` | counter | `action` = `open`, `closed`, `local` | requests decided by the failure policy |
//! | `concurrency_breaker_state` | gauge | | 0 closed, 1 open, 2 half-open |
//! | `concurrency_releases_total` | counter | `result` = `ok`, `failed` | slots given back to the store |

pub(crate) mod layer;
mod limiter;
mod response;

pub use layer::Settings;
pub use limiter::Slot;
pub use response::{default_rejection, ConcurrencyRejection};
