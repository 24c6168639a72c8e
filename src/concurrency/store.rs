//! The [`SlotStore`] seam: where in-flight slots live — [`MemorySlots`](super::MemorySlots)
//! (this process) or, with the `redis` feature, `RedisStore` (the fleet).

use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Namespace, StoreFuture};
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One request's slot id: unique across instances and requests.
///
/// A random 64-bit instance id (drawn once per process from std's randomly
/// seeded hasher, mixed with the pid and the time) and a per-process counter.
///
/// ```
/// use tower_ratelimit::concurrency::SlotId;
/// assert_ne!(SlotId::next(), SlotId::next());
/// assert_eq!(SlotId::next().to_string().len(), 33);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId {
    instance: u64,
    seq: u64,
}

impl SlotId {
    /// A fresh id.
    pub fn next() -> Self {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        Self {
            instance: instance_id(),
            seq: SEQ.fetch_add(1, Ordering::Relaxed),
        }
    }
}

fn instance_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        // `RandomState` keys come from the OS's randomness: no extra dependency.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    })
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{:016x}", self.instance, self.seq)
    }
}

impl fmt::Debug for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlotId({self})")
    }
}

/// One attempt to take a slot: at most `limit` slots per key, each leased until
/// `now_ms + lease`.
#[derive(Debug)]
pub struct Acquire<'a> {
    /// The limiter.
    pub namespace: &'a Namespace,
    /// The client.
    pub key: &'a Key,
    /// This request's slot.
    pub id: SlotId,
    /// Slots a key may hold at once.
    pub limit: u64,
    /// The application's time, Unix ms.
    pub now_ms: u64,
    /// How long the slot counts if it is never released (a crashed instance).
    pub lease: Duration,
    /// The latency budget for the whole call.
    pub timeout: Duration,
}

/// Gives a slot back.
///
/// A release may reach the store before its own acquire (the acquire timed
/// out, or the request was dropped while it was in flight, and the two took
/// different connections): the store must then make that late acquire fail,
/// so the slot is never taken by a request that is already gone.
#[derive(Debug)]
pub struct Release<'a> {
    /// The limiter.
    pub namespace: &'a Namespace,
    /// The client.
    pub key: &'a Key,
    /// The slot acquired (or perhaps acquired) for the request.
    pub id: SlotId,
    /// The application's time, Unix ms.
    pub now_ms: u64,
    /// The lease of the acquire (how long a late acquire must be refused).
    pub lease: Duration,
    /// The latency budget for the whole call.
    pub timeout: Duration,
}

/// What an acquire found, from the same atomic step that decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Whether the slot was taken.
    pub acquired: bool,
    /// Slots held for the key (unexpired), including this one if it was taken.
    pub in_flight: u64,
}

/// Where in-flight slots live. Each call is atomic and one round trip at most.
///
/// Implementations must never count more than `limit` slots per key, must
/// treat a slot whose lease has passed as free, and must answer within
/// `timeout` or with [`StoreError::Timeout`].
pub trait SlotStore: Send + Sync + 'static {
    /// Takes a slot for `call.key` if fewer than `call.limit` are held.
    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>>;

    /// Gives `call.id`'s slot back (idempotent).
    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>>;

    /// Whether the store answers in-process at no network cost. Defaults to `false`.
    fn is_local(&self) -> bool {
        false
    }
}

impl<S: SlotStore + ?Sized> SlotStore for Arc<S> {
    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>> {
        (**self).acquire(call)
    }
    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        (**self).release(call)
    }
    fn is_local(&self) -> bool {
        (**self).is_local()
    }
}
