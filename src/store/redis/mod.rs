//! The Redis store: limits shared by every instance that talks to the same Redis.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::num::NonZeroU32;
//! use tower_ratelimit::{store::RedisStore, Quota, RateLimitLayer};
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .replica("redis://127.0.0.1:6380")
//!     .build()?;
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
//!     .store(store)
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! Every call goes through redis-rs: plain TCP (`redis://`), TLS
//! (`rediss://`, feature `tls`), Unix sockets (`unix://`, `redis+unix://`),
//! a primary found through Sentinel (feature `sentinel`) or a Redis Cluster
//! (feature `cluster`). `AUTH`, `SELECT` and the protocol (`?protocol=resp3`)
//! come from the URL.
//!
//! Concurrent charges travel together: each connection sends one `EVALSHA`
//! of `lua/charge.lua` for every charge waiting while its previous batch was
//! in flight (an idle service sends each charge alone, at once; see
//! [`RedisStoreBuilder::connections`]). For each request in order, the script
//! (assembled from one Lua file per algorithm) reads, decides and writes every
//! quota of its policy atomically and returns the state the decision was made
//! on; the headers are built from that reply only, by the same math the
//! memory store runs. A settlement (a refund, or debt) is one more script call, run in the background.
//! All of a client's state is one hash under one key (plus, for a
//! sliding-log quota, a sorted set sharing its hash tag), so every call
//! touches one hash slot.
//!
//! With the `cluster` feature, [`RedisStore::cluster`] runs the same scripts on
//! a Redis Cluster: each call goes to the node serving its key's slot, follows
//! `MOVED`/`ASK` and keeps working after a failover, and is never sent twice
//! after an error that may have let it run (see [`RedisStore::cluster_builder`]).
//!
//! Passwords never appear in this store's `Debug` output, its errors or its
//! log lines: URLs are shown as `redis://user:***@host:6379`.
//!
//! # Batching
//!
//! Each connection ([`RedisStoreBuilder::connections`], default 1) has a
//! runner task that sends everything queued as one script call, up to 64
//! charges, with up to 4 calls in flight; when all 4 are out, charges queue
//! and leave together with the next. Requests in a row for one key and
//! policy (a hot client, a global limit) form a run: the key is sent and
//! read once, and each request is decided on the state the one before it
//! left, with the same replies as one by one. Replies come back by position
//! into each request's own channel; a request whose caller gave up before
//! its batch left is never charged; `NOSCRIPT` (nothing ran) loads the
//! script and re-sends the batch once; one request failing inside the script
//! fails alone.
//!
//! # Connections and time
//!
//! One long-lived redis-rs multiplexed connection per lane carries charges,
//! refunds, status reads, concurrency slots and the eviction check (no
//! per-request checkout from a pool). Each stage has its timeout: connect
//! (TLS handshake and `AUTH` included), the layer's store timeout around each
//! call, and the response timeout after which a connection that answers
//! nothing is replaced. A connection that failed or answered `READONLY` is
//! replaced, and one idle for a second is checked before it carries a call.
//! [`Store::connect`](crate::store::Store::connect) opens them before
//! serving.
//!
//! Every connection, batch sent and store timeout runs on one thread of
//! the crate's own (`tower-ratelimit-redis`, a small tokio runtime shared by
//! every Redis store in the process), not on the application's runtime. An
//! instance whose runtime is saturated still has its replies read as they
//! arrive and its timeouts measured against Redis alone: its decisions get
//! slower, never fail open because the instance is busy. A request waits
//! for its answer on a channel, from any runtime. The application owns time: `now` comes from the layer's clock
//! (or Redis `TIME`, see [`TimeSource`]); TTLs only clean up.
//!
//! # Keys
//!
//! One key per client, `trl:<limiter>:{<128-bit hash of the key>}`: a hash
//! holding every quota's state, plus a sorted set `…}:sl<window>` per
//! sliding-log quota, sharing the hash tag. Client input cannot inject
//! braces, newlines or length.
//!
//! # Capacity
//!
//! Redis runs each script on one core, so the budget is its CPU per decision:
//! `primaries = requests/s × Redis CPU per decision ÷ the share of a core you
//! allow`. An allowed or rejected request costs at most one command (far
//! fewer under load), a refunded one one more. A charge that shares a batch
//! costs Redis several times less CPU than one sent alone; the sliding log
//! costs the most of the algorithms. Measure on your own Redis: the
//! repository's `docs/performance.md` shows how, and what it measured.
//! Replicas add no charge capacity. Under a Redis store, requests wait in
//! batches and their memory is freed in bursts, which glibc's malloc serves
//! from slower paths: `GLIBC_TUNABLES=glibc.malloc.tcache_count=256` (or
//! jemalloc or mimalloc) helps.

#[cfg(feature = "advisor")]
mod advice;
mod batch;
mod builder;
#[cfg(feature = "cluster")]
mod cluster;
mod concurrency;
#[cfg(feature = "coordinated")]
mod counters;
mod error;
mod eviction;
#[cfg(fuzzing)]
pub mod fuzzing;
mod io;
mod keys;
mod lane;
mod node;
mod reply;
mod scripts;
mod store;
#[cfg(feature = "runtime-limits")]
mod table;
mod url;

#[cfg(feature = "advisor")]
pub(crate) use advice::{FleetAdvice, Window as AdviceWindow};
pub use builder::RedisStoreBuilder;
#[cfg(feature = "coordinated")]
pub(crate) use counters::{CounterSync, Report as CounterReport};
pub use eviction::EvictionCheck;
#[cfg(all(feature = "cluster", feature = "coordinated"))]
pub(crate) use store::failed_all;
pub use store::{RedisStore, TimeSource};
#[cfg(feature = "runtime-limits")]
pub(crate) use table::{Read as TableRead, Table as SharedTable, Write as TableWrite};
