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

mod memory;
#[cfg(feature = "redis")]
mod redis;
mod sharded;
mod slots;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{EvictionCheck, RedisStore, RedisStoreBuilder, TimeSource};
// The reply parsers, for the fuzz targets in `fuzz/` only.
#[cfg(all(fuzzing, feature = "redis"))]
#[doc(hidden)]
pub use self::redis::fuzzing;
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use sharded::{ShardedStore, ShardedStoreBuilder};
pub use slots::{Acquire, Occupancy, Release, SlotId};

use crate::algorithm::{self, Settled};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::quota::{Policy, Quota};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The limiter a call belongs to: one store can serve several layers, each in
/// its own namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    name: String,
    id: u64,
}

impl Namespace {
    /// A namespace; `name` is validated by the layer builder (`[A-Za-z0-9_.-]`, 1..=64 bytes).
    pub fn new(name: &str) -> Self {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(name.as_bytes());
        let mut id = [0u8; 8];
        id.copy_from_slice(&d[..8]);
        Self {
            name: name.to_owned(),
            id: u64::from_le_bytes(id),
        }
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A stable 64-bit id derived from the name.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// One charge: apply `policy` to `key` at `now_ms` with `cost`, all quotas or none.
#[derive(Debug)]
pub struct Charge<'a> {
    /// The limiter.
    pub namespace: &'a Namespace,
    /// The client.
    pub key: &'a Key,
    /// The quotas to charge, all or nothing.
    pub policy: &'a Policy,
    /// What the request costs each quota that counts requests.
    pub cost: u64,
    /// What it reserves in each quota of another unit (see
    /// [`Quota::counts_requests`]): charged whole, and admitted while that
    /// quota has anything left (or, when it says so, while the reservation
    /// fits).
    pub units: u64,
    /// The application's time, Unix ms.
    pub now_ms: u64,
    /// How long the store may take to answer. Network stores count the time
    /// the call waits for the store (queued behind calls the store fails to
    /// answer, connecting, and the call itself), never the time it waits for
    /// the application's own runtime or behind calls the store answers; the
    /// layer bounds the whole wait too (see [`Store`]).
    pub timeout: Duration,
}

impl Charge<'_> {
    /// What this charge asks of `quota`: the units that must be left for it
    /// to be admitted, and the units it is charged when it is.
    pub fn ask(&self, quota: &Quota) -> (u64, u64) {
        let a = algorithm::ask(quota, self.cost, self.units);
        (a.fit, a.charge)
    }
}

/// One settlement: what an admitted request really cost, given to the
/// states its charge went to. Below what was charged the rest comes back;
/// above it the excess is charged to the same window or bucket (debt). It
/// never reaches a newer window, nor a state that is gone.
#[derive(Debug)]
pub struct Settle<'a> {
    /// The original charge's fields, as charged.
    pub charge: Charge<'a>,
    /// The decision the charge returned (it identifies the states charged).
    pub decision: &'a Decision,
    /// What the request really cost each quota, in policy order. A quota
    /// without an entry keeps its charge.
    pub actual: Vec<u64>,
    /// When it is settled (Unix ms).
    pub now_ms: u64,
}

impl<'a> Settle<'a> {
    /// Everything `charge` took given back (a free response), settled at
    /// the charge's own time.
    pub fn free(charge: Charge<'a>, decision: &'a Decision) -> Self {
        let now_ms = charge.now_ms;
        let actual = vec![0; charge.policy.quotas().len()];
        Self {
            charge,
            decision,
            actual,
            now_ms,
        }
    }

    /// Quotas counting requests keep the charge's cost; every quota of
    /// another unit is settled to `units`, at `now_ms`.
    pub fn units(charge: Charge<'a>, decision: &'a Decision, units: u64, now_ms: u64) -> Self {
        let actual = charge
            .policy
            .quotas()
            .iter()
            .map(|q| {
                if q.counts_requests() {
                    charge.cost
                } else {
                    units
                }
            })
            .collect();
        Self {
            charge,
            decision,
            actual,
            now_ms,
        }
    }

    /// Each quota with its settlement, in policy order.
    pub(crate) fn each(&self) -> impl Iterator<Item = (&Quota, Settled)> + '_ {
        let quotas = self.charge.policy.quotas();
        quotas
            .iter()
            .zip(self.decision.statuses())
            .enumerate()
            .map(|(i, (q, st))| {
                let reserved = self.charge.ask(q).1;
                let settled = Settled {
                    window_id: st.window_id,
                    charged_at: self.charge.now_ms,
                    reserved,
                    actual: self.actual.get(i).copied().unwrap_or(reserved),
                };
                (q, settled)
            })
    }

    /// Whether it changes anything: some quota is owed other than it was charged.
    pub fn changes_anything(&self) -> bool {
        self.each().any(|(_, s)| s.reserved != s.actual)
    }
}

/// A store's answer: ready at once (the memory store: no allocation) or
/// still to come (network stores, boxed). Polled again after it completed,
/// it stays pending, as a fused future does; the layer's store timeout then
/// makes that a store failure.
#[must_use = "futures do nothing unless polled"]
pub struct StoreFuture<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    Ready(Option<T>),
    Pending(Pin<Box<dyn Future<Output = T> + Send + 'static>>),
}

impl<T> StoreFuture<T> {
    /// A future that is already complete.
    pub fn ready(value: T) -> Self {
        StoreFuture {
            inner: Inner::Ready(Some(value)),
        }
    }

    /// A future still to run.
    pub fn pending(fut: impl Future<Output = T> + Send + 'static) -> Self {
        StoreFuture {
            inner: Inner::Pending(Box::pin(fut)),
        }
    }

    /// The value it was made ready with, to be written in place.
    pub(crate) fn ready_mut(&mut self) -> Option<&mut T> {
        match &mut self.inner {
            Inner::Ready(value) => value.as_mut(),
            Inner::Pending(_) => None,
        }
    }

    /// The value if it is there at once, else the future to wait for.
    pub(crate) fn into_ready(self) -> Result<T, Pin<Box<dyn Future<Output = T> + Send + 'static>>>
    where
        T: Send + 'static,
    {
        match self.inner {
            Inner::Ready(Some(v)) => Ok(v),
            // Spent: pending for ever, as when polled.
            Inner::Ready(None) => Err(Box::pin(std::future::pending())),
            Inner::Pending(fut) => Err(fut),
        }
    }

    /// The value, if the future completed without awaiting (taken: a
    /// second call returns `None`).
    pub fn now_or_never(&mut self) -> Option<T> {
        match &mut self.inner {
            Inner::Ready(value) => value.take(),
            Inner::Pending(_) => None,
        }
    }
}

impl<T> Future for StoreFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.inner {
            // Spent: pending for ever, as a fused future is. The layer's
            // store timeout turns that into a store failure.
            Inner::Ready(value) => value.take().map_or(Poll::Pending, Poll::Ready),
            Inner::Pending(fut) => fut.as_mut().poll(cx),
        }
    }
}

// The value is moved out, never pinned in place; the future is boxed.
impl<T> Unpin for StoreFuture<T> {}

impl<T> fmt::Debug for StoreFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match &self.inner {
            Inner::Ready(_) => "StoreFuture::Ready",
            Inner::Pending(_) => "StoreFuture::Pending",
        })
    }
}

/// Where limiter state lives. One call per decision; each call is atomic.
///
/// Implementations must treat any state whose stored reset has passed as
/// absent, charge nothing on a rejection, and answer within the call's
/// `timeout` or with [`StoreError::Timeout`]. The layers also bound every
/// call themselves, so a store that never answers cannot hang a request.
///
/// A store that keeps concurrency slots ([`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer))
/// implements [`acquire`](Store::acquire) and [`release`](Store::release)
/// and says so with [`keeps_slots`](Store::keeps_slots); the built-in
/// stores all do.
pub trait Store: Send + Sync + 'static {
    /// Charges every quota of the policy what the call asks of it
    /// ([`Charge::ask`]) if all admit it, and returns every quota's state
    /// from that same atomic step.
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>>;

    /// A charge no request waits for (a policy running in shadow, whose
    /// would-be rejections are counted beside the enforced one): the same
    /// as [`charge`](Store::charge), but a store may refuse it at once
    /// while it is busy, so that it never crowds out the charges requests
    /// wait for. The default charges it like any other.
    fn charge_shadow(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.charge(call)
    }

    /// Settles a charge, in one atomic step: gives back what it charged
    /// beyond the request's real cost, or charges the excess, to the states
    /// it was charged to (never to newer ones).
    fn settle(&self, call: &Settle<'_>) -> StoreFuture<Result<(), StoreError>>;

    /// Reads the state without charging (e.g. for a `GET /rate_limit` endpoint).
    /// The decision is marked allowed; statuses report what is left.
    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>>;

    /// Takes a slot for `call.key` if fewer than `call.limit` are held
    /// (slots whose lease has passed do not count). The default keeps none.
    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>> {
        let _ = call;
        StoreFuture::ready(Err(no_slots()))
    }

    /// Gives `call.id`'s slot back (idempotent). A release may reach the
    /// store before its own acquire (the acquire timed out, or its request
    /// was dropped, and the two took different connections): that late
    /// acquire must then fail. The default keeps none.
    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        let _ = call;
        StoreFuture::ready(Err(no_slots()))
    }

    /// Whether the store keeps concurrency slots (implements
    /// [`acquire`](Store::acquire) and [`release`](Store::release)).
    /// Defaults to `false`; a concurrency layer refuses such a store when it
    /// is built.
    fn keeps_slots(&self) -> bool {
        false
    }

    /// Whether the store answers in-process at no network cost (then the layer's
    /// local deny cache is not consulted). Defaults to `false`.
    fn is_local(&self) -> bool {
        false
    }

    /// The failure domain `key` belongs to, in `0..failure_domains()`: keys in
    /// different domains fail independently (e.g. the shards of a
    /// [`ShardedStore`]), so the layer keeps one circuit breaker per domain and
    /// a dead shard opens only its own. Defaults to `0`.
    fn failure_domain(&self, namespace: &Namespace, key: &Key) -> usize {
        let _ = (namespace, key);
        0
    }

    /// How many failure domains the store has (at least 1). Defaults to `1`:
    /// the whole store fails together.
    fn failure_domains(&self) -> usize {
        1
    }

    /// Whether the store itself answers every call within the call's
    /// `timeout`, counted from when it sends the call (connecting included),
    /// as the built-in stores do. The layers then add no timer of their own,
    /// and the time a request waits for a busy runtime to poll it is not
    /// counted against the store. Defaults to `false`: the layer bounds each
    /// call by its store timeout from when it starts waiting, whatever the
    /// store does.
    fn bounds_calls(&self) -> bool {
        false
    }

    /// Where the store keeps its state, for telling whether two limiters
    /// would share it: two stores with the same identity do (clones of one
    /// store, or two Redis stores of one database and key prefix). A layer
    /// refuses to be built when a different limiter of the same name lives
    /// on the same identity in this process (see
    /// [`Builder::name`](crate::Builder::name)). Defaults to `None`: no check.
    fn identity(&self) -> Option<String> {
        None
    }

    /// The store's own clock, Unix ms, when it has one (Redis `TIME`). The
    /// rate limiter compares it with its [`Clock`](crate::clock::Clock) when
    /// it connects and every minute after, exports the difference as the
    /// gauge `ratelimit_store_clock_offset_seconds` and warns past 500 ms.
    /// Defaults to `None`: no clock of its own.
    fn time(&self) -> StoreFuture<Result<Option<u64>, StoreError>> {
        StoreFuture::ready(Ok(None))
    }

    /// Opens the store's connections ahead of the first request, so that no
    /// request waits for a connection (or a TLS handshake) to be made. The
    /// layers never call it: the application may, before it starts serving
    /// (see [`RateLimitLayer::connect`](crate::RateLimitLayer::connect)). A
    /// store stays usable when it fails: connections are made again on use.
    /// The default has nothing to open.
    fn connect(&self) -> StoreFuture<Result<(), StoreError>> {
        StoreFuture::ready(Ok(()))
    }
}

fn no_slots() -> StoreError {
    StoreError::Unavailable("this store keeps no concurrency slots".into())
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        (**self).charge(call)
    }
    fn charge_shadow(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        (**self).charge_shadow(call)
    }
    fn settle(&self, call: &Settle<'_>) -> StoreFuture<Result<(), StoreError>> {
        (**self).settle(call)
    }
    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        (**self).status(call)
    }
    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>> {
        (**self).acquire(call)
    }
    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        (**self).release(call)
    }
    fn keeps_slots(&self) -> bool {
        (**self).keeps_slots()
    }
    fn is_local(&self) -> bool {
        (**self).is_local()
    }
    fn failure_domain(&self, namespace: &Namespace, key: &Key) -> usize {
        (**self).failure_domain(namespace, key)
    }
    fn failure_domains(&self) -> usize {
        (**self).failure_domains()
    }
    fn bounds_calls(&self) -> bool {
        (**self).bounds_calls()
    }
    fn identity(&self) -> Option<String> {
        (**self).identity()
    }
    fn time(&self) -> StoreFuture<Result<Option<u64>, StoreError>> {
        (**self).time()
    }
    fn connect(&self) -> StoreFuture<Result<(), StoreError>> {
        (**self).connect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_ready_future_answers_without_awaiting_and_only_once() {
        let mut ready = StoreFuture::<u32>::ready(3);
        assert_eq!(ready.now_or_never(), Some(3));
        assert!(ready.now_or_never().is_none());
        let mut boxed = StoreFuture::<u32>::pending(async { 4 });
        assert!(boxed.now_or_never().is_none());
        assert_eq!(boxed.await, 4);
    }
}
