//! Leased slots in a store, with the failure handling around them: what the
//! concurrency limiter (a slot per request, per key) and the fleet load
//! shedder (a slot per request, one key for the fleet) share.
//!
//! [`Slots::take`] asks the store for a slot under a key, bounded by the
//! store timeout and behind the breaker, and applies the failure policy when
//! the store fails. The slot is a [`Held`] guard: dropped, it gives the slot
//! back (to the store off the response path; to the in-process fallback at
//! once), whatever way the request ended.

use crate::builder::Common;
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use crate::failure::{self, Guard, Log, OnStoreError, Permit};
use crate::key::Key;
use crate::later::Later;
use crate::metrics::{Series, StoreMetrics};
use crate::store::{Acquire, MemoryStore, Namespace, Occupancy, Release, SlotId, Store};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// One limiter's slots: where they live, how long they are leased, and what
/// happens when the store fails.
pub(crate) struct Slots {
    pub(crate) namespace: Namespace,
    store: Arc<dyn Store>,
    clock: Arc<dyn crate::clock::Clock>,
    pub(crate) lease: Duration,
    store_timeout: Duration,
    /// The layer's own bound on a store call ([`failure::backstop`]).
    backstop: Option<Duration>,
    pub(crate) guard: Guard,
    /// The in-process slots used by [`OnStoreError::Local`], and the share
    /// of each limit they allow.
    fallback: Option<(MemoryStore, f64)>,
    /// What the limiter calls itself in log lines.
    what: &'static str,
    series: &'static Series,
    metrics: OnceLock<StoreMetrics>,
    /// The limiter's hold on its name in its store.
    _name: crate::names::Claim,
}

/// What [`Slots::take`] found.
pub(crate) enum Taken {
    /// The store gave the request a slot.
    Held(Held),
    /// The store failed and the failure policy lets the request run: with
    /// no slot (fail open) or one of the in-process fallback's.
    Open(Held),
    /// The key already has `in_flight` slots of `limit` (the fallback's
    /// limit when the store had failed). The guard still gives back what the
    /// store may hold for an acquire whose outcome was unknown; keep it to
    /// let the request run anyway (shadow mode).
    Full {
        held: Held,
        in_flight: u64,
        limit: u64,
    },
    /// The store failed and the failure policy refuses the request.
    Unavailable,
}

/// A request's slot: given back when dropped.
///
/// A release to a network store is spawned (bounded by the store timeout),
/// never awaited on the response path; a release that fails leaves the slot
/// to expire with its lease.
pub(crate) struct Held {
    slots: Arc<Slots>,
    key: Key,
    id: SlotId,
    /// The store may hold this slot: it was acquired, or the acquire's outcome is unknown.
    in_store: bool,
    /// The local fallback ([`OnStoreError::Local`]) holds it.
    in_fallback: bool,
    /// Counted in the limiter's in-flight gauge.
    counted: bool,
    /// The slots the store counted for the key when it gave this one,
    /// itself included (unknown when the store failed open).
    in_flight: Option<u64>,
}

impl Slots {
    /// The slots of the limiter `common` configures, leased for `lease`;
    /// `config` describes its limit (and whether it equals no other's: see
    /// [`crate::names`]). Refuses a lease no longer than the store timeout,
    /// a store that keeps no slots, and a name another limiter holds on the
    /// store.
    pub(crate) fn new(
        common: &Common,
        what: &'static str,
        series: &'static Series,
        lease: Duration,
        config: (String, bool),
    ) -> Result<Self, ConfigError> {
        if lease <= common.store_timeout {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                format!(
                    "the lease ({lease:?}) must be longer than the store timeout ({:?}), and \
                 should be longer than the slowest request",
                    common.store_timeout
                ),
            ));
        }
        let store = common.store();
        if !store.keeps_slots() {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                format!(
                    "this store keeps no slots (Store::keeps_slots), which the {what} needs: give \
                 it a MemoryStore, a RedisStore or a ShardedStore of them"
                ),
            ));
        }
        let fallback = match common.on_store_error {
            OnStoreError::Local { fraction } => Some((MemoryStore::new(), fraction)),
            _ => None,
        };
        let name = crate::names::claim(
            &*store,
            &common.name,
            format!("{what}, {}", config.0),
            config.1,
        )?;
        Ok(Self {
            namespace: Namespace::new(&common.name),
            backstop: failure::backstop(&*store, common.store_timeout),
            store,
            clock: common.clock.clone(),
            lease,
            store_timeout: common.store_timeout,
            guard: Guard::new(
                &common.name,
                what,
                common.on_store_error,
                common.breaker,
                1,
                common.clock.clone(),
            ),
            fallback,
            what,
            series,
            metrics: OnceLock::new(),
            _name: name,
        })
    }

    pub(crate) fn metrics(&self) -> &StoreMetrics {
        self.metrics
            .get_or_init(|| StoreMetrics::new(self.series, self.namespace.name()))
    }

    fn acquire_call<'a>(&'a self, held: &'a Held, limit: u64) -> Acquire<'a> {
        Acquire {
            namespace: &self.namespace,
            key: &held.key,
            id: held.id,
            limit,
            now_ms: self.clock.now_ms(),
            lease: self.lease,
            timeout: self.store_timeout,
        }
    }

    /// Asks for one of `limit` slots under `key`: one acquire, bounded by
    /// the store timeout, behind the breaker.
    pub(crate) fn take(self: &Arc<Self>, key: Key, limit: u64) -> Later<Taken> {
        let mut held = Held {
            slots: self.clone(),
            key,
            id: SlotId::next(),
            in_store: false,
            in_fallback: false,
            counted: false,
            in_flight: None,
        };
        let permit = match self.guard.admit(0, self.metrics()) {
            Ok(permit) => permit,
            Err(open) => return Later::Now(self.failed(held, limit, open)),
        };
        let fut = self.store.acquire(&self.acquire_call(&held, limit));
        // Armed before the answer: a request dropped while the call is in
        // flight still gives back what it may have taken.
        held.in_store = true;
        let fut = match fut.into_ready() {
            Ok(result) => return Later::Now(self.taken(held, permit, limit, None, result)),
            Err(fut) => fut,
        };
        let this = self.clone();
        Later::pending(async move {
            let started = Instant::now();
            let result = failure::within(this.backstop, fut).await;
            this.taken(held, permit, limit, Some(started), result)
        })
    }

    /// Acts on the store's answer.
    fn taken(
        &self,
        mut held: Held,
        permit: Permit,
        limit: u64,
        started: Option<Instant>,
        result: Result<Occupancy, StoreError>,
    ) -> Taken {
        let m = self.metrics();
        if let Some(t) = started {
            m.decide_duration.record(t.elapsed().as_secs_f64());
        }
        self.guard.record(permit, &result, m);
        match result {
            Ok(o) if o.acquired => {
                held.in_flight = Some(o.in_flight);
                Taken::Held(held)
            }
            Ok(o) => {
                held.in_store = false;
                Taken::Full {
                    held,
                    in_flight: o.in_flight,
                    limit,
                }
            }
            Err(err) => self.failed(held, limit, err),
        }
    }

    /// The failure policy's answer. `held.in_store` stays set when the call
    /// was made: the acquire may have run, so the slot is released (best
    /// effort) when the request ends.
    fn failed(&self, mut held: Held, limit: u64, err: StoreError) -> Taken {
        match self.guard.failed(&err, self.metrics()) {
            OnStoreError::FailOpen => Taken::Open(held),
            OnStoreError::Local { .. } if self.fallback.is_some() => {
                let (local, fraction) = self.fallback.as_ref().expect("checked");
                let limit = ((limit as f64 * fraction).floor() as u64).max(1);
                match local
                    .acquire(&self.acquire_call(&held, limit))
                    .now_or_never()
                {
                    Some(Ok(o)) if o.acquired => {
                        held.in_fallback = true;
                        held.in_flight = Some(o.in_flight);
                        Taken::Open(held)
                    }
                    Some(Ok(o)) => Taken::Full {
                        held,
                        in_flight: o.in_flight,
                        limit,
                    },
                    _ => Taken::Unavailable,
                }
            }
            _ => Taken::Unavailable,
        }
    }

    fn release(self: &Arc<Self>, held: &Held) {
        if held.counted {
            self.metrics().in_flight.decrement(1);
        }
        let call = Release {
            namespace: &self.namespace,
            key: &held.key,
            id: held.id,
            now_ms: self.clock.now_ms(),
            lease: self.lease,
            timeout: self.store_timeout,
        };
        if held.in_fallback {
            if let Some((local, _)) = &self.fallback {
                let _ = local.release(&call).now_or_never();
            }
        }
        if !held.in_store {
            return;
        }
        let this = self.clone();
        let fut = self.store.release(&call);
        let done = move |result, started| {
            if let Err(err) = this.metrics().off_path_done(result, started) {
                this.guard.log.event(Log::StoreError, || {
                    tracing::warn!(limiter = this.namespace.name(), error = %err, kind = err.kind(), "{} slot release failed; the slot expires with its lease", this.what);
                });
            }
        };
        if !failure::off_path(fut, self.backstop, done) {
            self.metrics().off_path_failed.increment(1);
            tracing::warn!(
                limiter = self.namespace.name(),
                "no tokio runtime to release a {} slot on; it expires with its lease",
                self.what
            );
        }
    }
}

impl Slots {
    /// Opens the store's connections now.
    pub(crate) async fn connect(&self) -> Result<(), StoreError> {
        self.store.connect().await
    }
}

impl Held {
    /// Counts the request in the limiter's in-flight gauge until it ends.
    pub(crate) fn count(&mut self) {
        if !self.counted {
            self.counted = true;
            self.slots.metrics().in_flight.increment(1);
        }
    }

    /// The limiter's name.
    pub(crate) fn name(&self) -> &str {
        self.slots.namespace.name()
    }

    /// The slot's id.
    pub(crate) fn id(&self) -> SlotId {
        self.id
    }

    /// The slots the store counted for the key when it gave this one,
    /// itself included; `None` when the store failed open.
    pub(crate) fn in_flight(&self) -> Option<u64> {
        self.in_flight
    }

    /// The limiter's metrics.
    pub(crate) fn metrics(&self) -> &StoreMetrics {
        self.slots.metrics()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let slots = self.slots.clone();
        slots.release(self);
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("limiter", &self.name())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
