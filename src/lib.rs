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
//!     .build()
//!     .expect("valid configuration")
//!     .inner_body(); // answer in axum's own body type: no second box per response
//! let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(limit);
//! ```
//!
//! Beside the request rate limit: a concurrent-requests limit per key
//! ([`concurrency::ConcurrencyLimitLayer`]) and load shedding by priority
//! ([`shed::LoadShedLayer`]), configured the same way.
//!
//! See the README for the store choice (memory per process, Redis per fleet),
//! header semantics, the four limiters side by side and the pitfalls of keying
//! by client IP.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod algorithm;
mod body;
mod breaker;
pub mod clock;
pub mod concurrency;
#[cfg(feature = "redis")]
mod coordinated;
mod decision;
mod deny_cache;
mod error;
mod future;
pub mod grpc;
mod guarded_body;
pub mod headers;
pub mod key;
mod layer;
mod limiter;
pub mod metrics;
pub mod quota;
mod response;
mod service;
pub mod shed;
pub mod store;

pub use body::{BodyMode, InnerBody, ResponseBody, WrapBody};
pub use breaker::CircuitBreaker;
pub use concurrency::ConcurrencyLimitLayer;
#[cfg(feature = "redis")]
pub use coordinated::Coordinated;
pub use decision::{Decision, QuotaStatus, RejectReason};
pub use deny_cache::DenyCache;
pub use error::{ConfigError, StoreError};
pub use future::ResponseFuture;
pub use guarded_body::GuardedBody;
pub use headers::HeaderStyle;
pub use layer::{
    RateLimitLayer, RateLimitLayerBuilder, Status, StatusError, DEFAULT_STORE_TIMEOUT,
};
pub use limiter::OnStoreError;
pub use quota::{Algorithm, Policy, Quota};
pub use response::{default_key_error, default_rejection, Rejection};
pub use service::RateLimit;
pub use shed::LoadShedLayer;

// The README's examples are compiled and run as doc tests, so it stays true to the code.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
