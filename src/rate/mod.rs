//! The request rate limit: [`RateLimitLayer`](crate::RateLimitLayer) charges each request against
//! its client's quotas, in this process's memory or in a store the whole
//! fleet shares, and answers `429 Too Many Requests` past them.
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
//! One request's path: [`RateLimit`] (the service) starts a
//! [`ResponseFuture`], which drives the limiter's one decision pipeline
//! (`limiter.rs`: key, policy, one store call, verdict) and then the inner
//! service; the response gets the headers of that same store read. The
//! request is settled once (`settle.rs`): at its response head (a free `304`
//! gives everything back), or, when a later source may still speak (the
//! trailers, the bytes sent, the handler's [`Usage`]), when the body ends.

#[cfg(feature = "advisor")]
mod advisor;
mod body;
mod deny_cache;
mod free;
mod future;
mod hooks;
pub(crate) mod layer;
mod limiter;
#[cfg(feature = "runtime-limits")]
mod limits;
mod response;
mod service;
mod settle;
mod wait;

#[cfg(feature = "penalty")]
#[cfg_attr(docsrs, doc(cfg(feature = "penalty")))]
pub use crate::quota::Penalty;
#[cfg(feature = "wait")]
#[cfg_attr(docsrs, doc(cfg(feature = "wait")))]
pub use crate::quota::Wait;
#[cfg(feature = "advisor")]
#[cfg_attr(docsrs, doc(cfg(feature = "advisor")))]
pub use advisor::{current_limit, Advice, Advisor, KeyAdvice, TierAdvice, MAX_TIERS};
pub use body::{BodyMode, InnerBody, WrapBody};
pub use deny_cache::DenyCache;
pub use future::ResponseFuture;
pub use layer::Settings;
pub use limiter::{Status, StatusError};
#[cfg(all(feature = "runtime-limits", feature = "redis"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "runtime-limits", feature = "redis"))))]
pub use limits::SharedLimits;
#[cfg(feature = "runtime-limits")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime-limits")))]
pub use limits::{Limits, LimitsError, MAX_OVERRIDES, MAX_OVERRIDE_KEY_LEN};
pub use response::{default_rejection, Rejection};
pub use service::RateLimit;
pub use settle::{Dropped, Settlement, Usage};
