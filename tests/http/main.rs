//! The layers over HTTP: through real servers and clients over TCP, through
//! `oneshot`, and through tonic: headers, settlement, keys, gRPC, the
//! concurrency limiter, the load shedder and adaptive limits, waiting and
//! the penalty box, and the
//! `limiter` label on every series each layer registers.

#[path = "../support/mod.rs"]
mod support;

mod adaptive_capacity;
#[cfg(feature = "redis")]
mod concurrency;
#[cfg(all(feature = "redis", feature = "grpc"))]
mod grpc;
mod layer_http;
mod load_shed;
mod metric_labels;
#[cfg(all(feature = "wait", feature = "penalty"))]
mod refusals;
#[cfg(feature = "axum")]
mod settlement;
#[cfg(feature = "redis")]
mod several_quotas;
