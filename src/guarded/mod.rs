//! The service and response future the concurrency limiter and the load
//! shedder share. Each request either is answered by the layer (429, 503)
//! or goes to the inner service holding a guard `G` until its response body
//! has been sent: a concurrency [`Slot`](crate::concurrency::Slot) or a
//! load shedder's [`Admission`](crate::shed::Admission).
//!
//! ```
//! use axum::Router;
//! use tower::Layer;
//! use tower_ratelimit::concurrency::Slot;
//! use tower_ratelimit::guarded::Guarded;
//! use tower_ratelimit::shed::Admission;
//! use tower_ratelimit::{ConcurrencyLimitLayer, LoadShedLayer};
//!
//! let limit = ConcurrencyLimitLayer::builder().limit(5).build().unwrap();
//! let shed = LoadShedLayer::builder().capacity(200).build().unwrap();
//! let service: Guarded<Guarded<Router, Slot>, Admission> =
//!     shed.layer(limit.layer(Router::new()));
//! ```
//!
//! | layer | service | response future | response body |
//! |---|---|---|---|
//! | [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) | `Guarded<S, Slot>` | `ResponseFuture<S, ReqBody, Slot>` | [`GuardedBody<ResBody, Slot>`](crate::body::GuardedBody) |
//! | [`LoadShedLayer`](crate::LoadShedLayer) | `Guarded<S, Admission>` | `ResponseFuture<S, ReqBody, Admission>` | [`GuardedBody<ResBody, Admission>`](crate::body::GuardedBody) |

mod future;
mod gate;
mod service;

pub use future::ResponseFuture;
pub(crate) use gate::Gate;
pub use service::Guarded;
