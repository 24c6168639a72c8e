//! Where limiter state lives: the [`Store`] seam, with [`MemoryStore`] (embedded,
//! per process), with the `redis` feature `RedisStore` (shared by the fleet; a
//! Redis Cluster with the `cluster` feature), and [`ShardedStore`] (keys spread
//! over several stores, e.g. Redis primaries).
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

#[cfg(feature = "redis")]
pub use self::redis::{EvictionCheck, RedisStore, RedisStoreBuilder, TimeSource};
pub use memory::{MemoryStore, MemoryStoreBuilder, Overflow};
pub use sharded::{ShardedStore, ShardedStoreBuilder};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::quota::Policy;
use pin_project_lite::pin_project;
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
    /// Units to charge.
    pub cost: u64,
    /// The application's time, Unix ms.
    pub now_ms: u64,
    /// The latency budget for the whole call (pool wait, connect, script).
    pub timeout: Duration,
}

/// One refund: give `cost` back to the state `decision` charged, if it is still current.
#[derive(Debug)]
pub struct Refund<'a> {
    /// The original charge's fields.
    pub charge: Charge<'a>,
    /// The decision the charge returned (it identifies the windows charged).
    pub decision: &'a Decision,
}

pin_project! {
    /// A store future: ready at once for the memory store (no allocation),
    /// boxed for network stores ([`StoreFuture::pending`]).
    pub struct StoreFuture<T> {
        #[pin]
        pub(crate) inner: Inner<T>,
    }
}

pin_project! {
    /// What a [`StoreFuture`] holds.
    #[project = InnerProj]
    pub(crate) enum Inner<T> {
        /// Already computed (`None` once taken).
        Ready { value: Option<T> },
        /// Still running.
        Waiting { #[pin] wait: Wait<T> },
    }
}

pin_project! {
    /// A store call still running: what a request keeps while it waits
    /// (without room for a ready value, so the request's future stays small).
    #[project = WaitProj]
    pub(crate) enum Wait<T> {
        /// A boxed future (network stores).
        Boxed { fut: Pin<Box<dyn Future<Output = T> + Send + 'static>> },
    }
}

impl<T> StoreFuture<T> {
    /// A future that is already complete.
    pub fn ready(value: T) -> Self {
        StoreFuture {
            inner: Inner::Ready { value: Some(value) },
        }
    }

    /// Boxes a pending future.
    pub fn pending(fut: impl Future<Output = T> + Send + 'static) -> Self {
        StoreFuture {
            inner: Inner::Waiting {
                wait: Wait::Boxed { fut: Box::pin(fut) },
            },
        }
    }

    /// The value, if the future completed without awaiting.
    pub fn now_or_never(&mut self) -> Option<T> {
        match &mut self.inner {
            Inner::Ready { value } => value.take(),
            Inner::Waiting { .. } => None,
        }
    }

    /// The value it was made ready with, to be written in place.
    pub(crate) fn ready_mut(&mut self) -> Option<&mut T> {
        match &mut self.inner {
            Inner::Ready { value } => value.as_mut(),
            Inner::Waiting { .. } => None,
        }
    }
}

impl<T> Future for StoreFuture<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.project().inner.project() {
            InnerProj::Ready { value } => {
                Poll::Ready(value.take().expect("StoreFuture polled after completion"))
            }
            InnerProj::Waiting { wait } => wait.poll(cx),
        }
    }
}

impl<T> Future for Wait<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.project() {
            WaitProj::Boxed { fut } => fut.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for StoreFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match &self.inner {
            Inner::Ready { .. } => "StoreFuture::Ready",
            Inner::Waiting { .. } => "StoreFuture::Pending",
        })
    }
}

/// Where limiter state lives. One call per decision; each call is atomic.
///
/// Implementations must treat any state whose stored reset has passed as absent,
/// charge nothing on a rejection, and answer within `timeout` or with
/// [`StoreError::Timeout`].
pub trait Store: Send + Sync + 'static {
    /// Charges `call.cost` against every quota of the policy if all admit it, and
    /// returns every quota's state from that same atomic step.
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>>;

    /// Gives a charge back to the windows it was charged to (never to newer ones).
    fn refund(&self, call: &Refund<'_>) -> StoreFuture<Result<(), StoreError>>;

    /// Reads the state without charging (e.g. for a `GET /rate_limit` endpoint).
    /// The decision is marked allowed; statuses report what is left.
    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>>;

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
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        (**self).charge(call)
    }
    fn refund(&self, call: &Refund<'_>) -> StoreFuture<Result<(), StoreError>> {
        (**self).refund(call)
    }
    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        (**self).status(call)
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
