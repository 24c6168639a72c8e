//! Limits across a fleet: coordinated mode, the fleet load shedder, runtime
//! and shared limits, the advisor, waiting and the penalty box, and the built examples (the demo server,
//! the LLM gateway) run as black boxes; the `limiter` label on the series
//! the extras count off the request path.

#[path = "../support/mod.rs"]
mod support;

// The simulated fleet `tools/src/bin/simulate.rs` runs too.
#[cfg(feature = "redis")]
#[path = "../support/fleet.rs"]
mod fleet;

mod advisor;
#[cfg(feature = "redis")]
mod coordinated;
#[cfg(feature = "redis")]
mod coordinated_scaled;
#[cfg(feature = "redis")]
mod coordinated_surge;
mod demo;
mod demo_algorithms;
#[cfg(feature = "cluster")]
mod demo_redis;
#[cfg(feature = "redis")]
mod fleet_shed;
#[cfg(feature = "axum")]
mod llm_gateway;
#[cfg(feature = "redis")]
mod metric_labels;
#[cfg(feature = "redis")]
mod refusals;
#[cfg(feature = "redis")]
mod runtime_limits;
