//! Where limiter state lives: the [`Store`] seam, with [`MemoryStore`] (embedded,
//! per process), with the `redis` feature `RedisStore` (shared by the fleet; a
//! Redis Cluster with the `cluster` feature, a Sentinel-managed primary with
//! `sentinel`), and [`ShardedStore`] (keys spread over several stores, e.g.
//! Redis primaries). One store serves every limiter: rate limits (charges,
//! settlements, status reads) and concurrency limits (in-flight slots).
//!
//! ```
//! use tower_ratelimit::store::MemoryStore;
//! let store = MemoryStore::builder().max_keys(10_000).build();
//! // Clones share one state: hand the same store to every layer that should share limits.
//! let _shared = store.clone();
//! ```

mod backend;
mod call;
#[cfg(feature = "coordinated")]
mod coordinated;
mod future;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod sharded;
mod slots;

#[cfg(all(feature = "advisor", feature = "redis"))]
pub(crate) use self::redis::{AdviceWindow, FleetAdvice};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{EvictionCheck, RedisStore, RedisStoreBuilder, TimeSource};
#[cfg(all(feature = "runtime-limits", feature = "redis"))]
pub(crate) use self::redis::{SharedTable, TableRead, TableWrite};
// The reply parsers, for the fuzz targets in `fuzz/` only.
#[cfg(all(fuzzing, feature = "redis"))]
#[doc(hidden)]
pub use self::redis::fuzzing;
pub use backend::Store;
pub use call::{Charge, Namespace, Settle, DEFAULT_TIMEOUT};
#[cfg(feature = "coordinated")]
#[cfg_attr(docsrs, doc(cfg(feature = "coordinated")))]
pub use coordinated::{Coordinated, CoordinatedBuilder};
pub use future::StoreFuture;
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use sharded::{ShardedStore, ShardedStoreBuilder};
pub use slots::{Acquire, Occupancy, Release, SlotId, DEFAULT_LEASE};
