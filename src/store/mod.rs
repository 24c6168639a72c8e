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
use std::task::{ready, Context, Poll};
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
    /// boxed for network stores ([`StoreFuture::pending`]). The Redis store's
    /// batched charges wait on their batch's reply in place, within their
    /// budget, without a boxed future around it.
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
        /// A reply to come on a channel (the Redis store's batched charges).
        Reply { #[pin] reply: Reply<T> },
    }
}

pin_project! {
    /// A reply sent on a channel, awaited for at most `budget` from the
    /// first poll.
    pub(crate) struct Reply<T> {
        rx: tokio::sync::oneshot::Receiver<T>,
        #[pin]
        deadline: Deadline,
        budget: Duration,
        // The answer when the budget runs out, or the sender is dropped unanswered.
        fail: fn(StoreError) -> T,
    }
}

pin_project! {
    /// A [`Reply`]'s timer, made on its first poll: by the runtime that polls
    /// it, which may not be the one the call was made on.
    #[project = DeadlineProj]
    enum Deadline {
        Unarmed,
        Armed { #[pin] sleep: tokio::time::Sleep },
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

    /// The reply `rx` will carry, within `budget` from the first poll: past it, `fail` of
    /// [`StoreError::Timeout`]; if the sender is dropped unanswered (its
    /// runtime shut down), `fail` of [`StoreError::Unavailable`].
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn reply(
        rx: tokio::sync::oneshot::Receiver<T>,
        budget: Duration,
        fail: fn(StoreError) -> T,
    ) -> Self {
        StoreFuture {
            inner: Inner::Waiting {
                wait: Wait::Reply {
                    reply: Reply {
                        rx,
                        deadline: Deadline::Unarmed,
                        budget,
                        fail,
                    },
                },
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
            WaitProj::Reply { reply } => reply.poll(cx),
        }
    }
}

/// Why a call whose reply never came fails: what was to send it was dropped.
const REPLY_DROPPED: &str =
    "the redis batch carrying this charge was dropped (runtime shutting down)";

impl<T> Future for Reply<T> {
    type Output = T;

    // As `tokio::time::timeout` does: the reply first, then the deadline.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut this = self.project();
        if let Poll::Ready(reply) = Pin::new(this.rx).poll(cx) {
            return Poll::Ready(
                reply
                    .unwrap_or_else(|_| (this.fail)(StoreError::Unavailable(REPLY_DROPPED.into()))),
            );
        }
        if let DeadlineProj::Unarmed = this.deadline.as_mut().project() {
            this.deadline.set(Deadline::Armed {
                sleep: tokio::time::sleep(*this.budget),
            });
        }
        if let DeadlineProj::Armed { sleep } = this.deadline.project() {
            ready!(sleep.poll(cx));
        }
        Poll::Ready((this.fail)(StoreError::Timeout(*this.budget)))
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
    use std::future::poll_fn;
    use tokio::sync::oneshot;
    use tokio::time::Instant;

    type Answer = Result<u32, StoreError>;

    /// Polls `fut` once.
    async fn poll_once(fut: Pin<&mut StoreFuture<Answer>>) -> Poll<Answer> {
        let mut fut = Some(fut);
        poll_fn(|cx| Poll::Ready(fut.take().expect("polled once").poll(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_that_comes_within_its_budget_is_the_answer() {
        let (tx, rx) = oneshot::channel();
        let mut fut = std::pin::pin!(StoreFuture::reply(rx, Duration::from_millis(50), Err));
        assert!(poll_once(fut.as_mut()).await.is_pending());
        tokio::time::advance(Duration::from_millis(49)).await;
        assert!(poll_once(fut.as_mut()).await.is_pending());
        tx.send(Ok(7)).unwrap();
        assert!(matches!(poll_once(fut.as_mut()).await, Poll::Ready(Ok(7))));
    }

    #[tokio::test(start_paused = true)]
    async fn no_reply_within_the_budget_is_a_timeout_naming_the_budget_when_it_runs_out() {
        let (_tx, rx) = oneshot::channel::<Answer>();
        let started = Instant::now();
        // Paused time jumps to the deadline once nothing else can run.
        let answer = StoreFuture::reply(rx, Duration::from_millis(50), Err).await;
        assert!(
            matches!(answer, Err(StoreError::Timeout(d)) if d == Duration::from_millis(50)),
            "{answer:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_already_there_wins_over_a_deadline_already_past() {
        let (tx, rx) = oneshot::channel();
        let mut fut = std::pin::pin!(StoreFuture::reply(rx, Duration::from_millis(50), Err));
        assert!(poll_once(fut.as_mut()).await.is_pending());
        tokio::time::advance(Duration::from_millis(80)).await;
        tx.send(Ok(7)).unwrap();
        assert!(matches!(poll_once(fut.as_mut()).await, Poll::Ready(Ok(7))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_dropped_unanswered_is_unavailable_at_once() {
        let (tx, rx) = oneshot::channel::<Answer>();
        let fut = StoreFuture::reply(rx, Duration::from_secs(5), Err);
        drop(tx);
        let started = Instant::now();
        let answer = fut.await;
        assert!(
            matches!(&answer, Err(StoreError::Unavailable(m)) if m == REPLY_DROPPED),
            "{answer:?}"
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    /// The call may be made on one runtime (or none) and polled on another:
    /// the timer belongs to the one that polls.
    #[test]
    fn the_deadline_is_made_by_the_runtime_that_polls() {
        let (_tx, rx) = oneshot::channel::<Answer>();
        let fut = StoreFuture::reply(rx, Duration::from_millis(50), Err);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let answer = rt.block_on(fut);
        assert!(
            matches!(answer, Err(StoreError::Timeout(d)) if d == Duration::from_millis(50)),
            "{answer:?}"
        );
    }

    #[tokio::test]
    async fn only_a_ready_future_answers_without_awaiting_and_only_once() {
        let mut ready = StoreFuture::<Answer>::ready(Ok(3));
        assert!(matches!(ready.now_or_never(), Some(Ok(3))));
        assert!(ready.now_or_never().is_none());
        let mut boxed = StoreFuture::<Answer>::pending(async { Ok(4) });
        assert!(boxed.now_or_never().is_none());
        assert!(matches!(boxed.await, Ok(4)));
        let (_tx, rx) = oneshot::channel::<Answer>();
        assert!(StoreFuture::reply(rx, Duration::from_secs(1), Err)
            .now_or_never()
            .is_none());
    }
}
