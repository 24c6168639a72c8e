//! The Redis store against real `redis-server` processes: the store and its
//! batching, faults and overload, TLS, Sentinel, Cluster, the sharded store,
//! secrets in output, the seams where parts meet, the chaos soak, and the
//! `limiter` label on every series of a limiter on Redis.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "sentinel")]
mod chaos;
#[cfg(feature = "redis")]
mod metric_labels;
#[cfg(feature = "redis")]
mod redis_batching;
#[cfg(feature = "cluster")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_faults;
#[cfg(feature = "redis")]
mod redis_overload;
#[cfg(feature = "sentinel")]
mod redis_sentinel;
#[cfg(feature = "redis")]
mod redis_sharded;
#[cfg(feature = "redis")]
mod redis_store;
#[cfg(feature = "tls")]
mod redis_tls;
#[cfg(all(feature = "redis", feature = "wait", feature = "penalty"))]
mod refusals;
#[cfg(feature = "redis")]
mod seams;
#[cfg(feature = "redis")]
mod secrets;
