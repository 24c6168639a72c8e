//! What a concurrency limit asks of a store: slots, one per request in
//! flight, each leased so that a crashed instance's slots stop counting.

use super::call::Namespace;
use crate::key::Key;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// One request's slot id: unique across instances and requests.
///
/// A random 64-bit instance id (drawn once per process) and a per-process counter.
///
/// ```
/// use tower_ratelimit::store::SlotId;
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
        static INSTANCE: OnceLock<u64> = OnceLock::new();
        static SEQ: AtomicU64 = AtomicU64::new(0);
        Self {
            instance: *INSTANCE.get_or_init(|| fastrand::u64(..)),
            seq: SEQ.fetch_add(1, Ordering::Relaxed),
        }
    }
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

/// The default lease: how long a slot counts when its instance dies without
/// releasing it. Above the request timeouts of most APIs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// One attempt to take a slot: at most `limit` slots per key, each leased until
/// `now_ms + lease`.
#[derive(Debug)]
#[non_exhaustive]
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
    /// How long the store may take to answer.
    pub timeout: Duration,
}

impl<'a> Acquire<'a> {
    /// An attempt to take slot `id` of at most `limit` for `key` at
    /// `now_ms`, with the default lease ([`DEFAULT_LEASE`])
    /// and store timeout ([`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT)).
    pub fn new(
        namespace: &'a Namespace,
        key: &'a Key,
        id: SlotId,
        limit: u64,
        now_ms: u64,
    ) -> Self {
        Self {
            namespace,
            key,
            id,
            limit,
            now_ms,
            lease: DEFAULT_LEASE,
            timeout: super::call::DEFAULT_TIMEOUT,
        }
    }

    /// This attempt with the lease `lease`.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// This attempt with the store timeout `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The release of this attempt's slot at `now_ms`, with its lease and
    /// timeout.
    pub fn release(&self, now_ms: u64) -> Release<'a> {
        Release {
            namespace: self.namespace,
            key: self.key,
            id: self.id,
            now_ms,
            lease: self.lease,
            timeout: self.timeout,
        }
    }
}

/// Gives a slot back.
#[derive(Debug)]
#[non_exhaustive]
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
    /// How long the store may take to answer.
    pub timeout: Duration,
}

/// What an acquire found, from the same atomic step that decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Occupancy {
    /// Whether the slot was taken.
    pub acquired: bool,
    /// Slots held for the key (unexpired), including this one if it was taken.
    pub in_flight: u64,
}

impl Occupancy {
    /// An answer: whether the slot was taken, and the slots the key holds.
    pub fn new(acquired: bool, in_flight: u64) -> Self {
        Self {
            acquired,
            in_flight,
        }
    }
}
