//! The decision math and the stores' agreement: property tests, the shared
//! decision table through every store, the sliding window counter's error,
//! the fleet counting model, and the memory store on its own.

#[path = "../support/mod.rs"]
mod support;

mod fleet_counting_model;
mod memory_store;
#[cfg(feature = "redis")]
mod properties;
#[cfg(feature = "redis")]
mod shared_vectors;
mod sliding_window_error;
