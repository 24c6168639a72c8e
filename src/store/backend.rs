//! The [`Store`] seam every store implements.

use super::call::{Charge, Namespace, Settle};
use super::future::StoreFuture;
use super::slots::{Acquire, Occupancy, Release};
use crate::decision::Decision;
use crate::error::{ConfigError, ConfigErrorKind, StoreError};
use crate::key::Key;
use crate::Policy;

/// Where limiter state lives. One call per decision; each call is atomic.
///
/// Implementations must treat any state whose stored reset has passed as
/// absent, charge nothing on a rejection, and answer within the call's
/// `timeout` or with [`StoreError::Timeout`]. The layers also bound every
/// call themselves, so a store that never answers cannot hang a request.
///
/// A store that keeps concurrency slots ([`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer))
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
    /// [`ShardedStore`](super::ShardedStore)), so the layer keeps one circuit breaker per domain and
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

    /// Why the store cannot enforce `policy`, if it cannot: a layer with a
    /// fixed policy asks when it is built, and runtime limits on every
    /// change (a store that counts requests only refuses a quota in tokens,
    /// say). The default refuses a policy that waits for a request's turn
    /// or keeps a penalty box, which the store itself must book and count
    /// ([`Charge::wait_ms`], [`Decision::blocked`](crate::decision::Decision::blocked)):
    /// the stores of this crate but the coordinated one do.
    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        plain_only(policy, "this store")
    }

    /// Where the store keeps its state, for telling whether two limiters
    /// would share it: two stores with the same identity do (clones of one
    /// store, or two Redis stores of one database and key prefix). A layer
    /// refuses to be built when a different limiter of the same name lives
    /// on the same identity in this process (see
    /// [`Builder::name`](crate::builder::Builder::name)). Defaults to `None`: no check.
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

/// `Ok` unless `policy` waits or keeps a penalty box, which `what` cannot.
pub(crate) fn plain_only(policy: &Policy, what: &str) -> Result<(), ConfigError> {
    let feature = match (policy.waits(), policy.penalty_box()) {
        (Some(_), _) => "waits for a request's turn",
        (None, Some(_)) => "keeps a penalty box",
        (None, None) => return Ok(()),
    };
    Err(ConfigError::new(
        ConfigErrorKind::Conflict,
        format!(
            "the policy {feature}, which {what} cannot do: use a MemoryStore, a RedisStore or a \
             ShardedStore of them"
        ),
    ))
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
    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        (**self).check_policy(policy)
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
