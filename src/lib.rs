//! Fleet-wide rate limiting for tower, axum and tonic services.
//!
//! ```
//! use std::num::NonZeroU32;
//! use axum::{routing::get, Router};
//! use tower_ratelimit::{key::PeerIp, Quota, RateLimitLayer};
//!
//! let limit = RateLimitLayer::builder()
//!     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
//!     .key(PeerIp::new())
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(limit);
//! # Ok::<(), tower_ratelimit::ConfigError>(())
//! ```
//!
//! Three middlewares, one folder each, over shared building blocks:
//!
//! | middleware | module | limits |
//! |---|---|---|
//! | [`RateLimitLayer`] | [`rate`] | requests (or units of cost) per window, per key |
//! | [`ConcurrencyLimitLayer`] | [`concurrency`] | requests in flight per key |
//! | [`LoadShedLayer`] | [`shed`] | requests in flight per process, by priority |
//!
//! The shared modules: [`key`] (which client a request counts against),
//! [`Quota`] and [`Policy`] (how much), [`store`] (where state lives: [`MemoryStore`](store::MemoryStore)
//! per process, `RedisStore` for the fleet), [`headers`] (what responses
//! say), [`clock`], [`failure`] (what a store failure does), [`metrics`],
//! [`grpc`], [`decision`] (what a store answers), [`adaptive`] (limits found
//! from latency), [`body`] (the response bodies) and [`guarded`] (the service
//! and future of the concurrency limiter and the shedder). The builders
//! share their common options: [`builder::Builder`].
//!
//! Cargo features:
//!
//! | feature | adds |
//! |---|---|
//! | `axum` (default) | key extractors for axum's `ConnectInfo` and `MatchedPath` |
//! | `redis` | the Redis store, `store::RedisStore` (redis-rs, Lua scripts) |
//! | `tls` | `rediss://` URLs (rustls with ring) |
//! | `sentinel` | a primary found through Redis Sentinel |
//! | `cluster` | Redis Cluster |
//! | `grpc` | key extractors for tonic's `TcpConnectInfo` |
//! | `coordinated` | `store::Coordinated`: decides in the process, syncs with the fleet in the background |
//! | `runtime-limits` | `RateLimitLayer::limits`: policies changed while serving (`rate::SharedLimits` with `redis`) |
//! | `advisor` | `rate::Advisor`: usage per key and window, and suggested limits |
//!
//! See the README for the store choice, header semantics and the pitfalls
//! of keying by client IP.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adaptive;
mod algorithm;
pub mod body;
mod bounded;
pub mod builder;
pub mod clock;
pub mod concurrency;
pub mod decision;
mod error;
pub mod failure;
pub mod grpc;
pub mod guarded;
pub mod headers;
pub mod key;
mod later;
pub mod metrics;
mod names;
mod periodic;
mod problem;
mod quota;
pub mod rate;
pub mod shed;
mod skew;
mod slots;
pub mod store;

pub use concurrency::layer::{ConcurrencyLimitLayer, ConcurrencyLimitLayerBuilder};
pub use error::{ConfigError, ConfigErrorKind, StoreError};
pub use quota::{Algorithm, Policy, Quota};
pub use rate::layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use shed::layer::{LoadShedLayer, LoadShedLayerBuilder};

// The README's examples are compiled and run as doc tests, so it stays true to the code.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
