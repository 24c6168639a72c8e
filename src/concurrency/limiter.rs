//! The concurrency limiter every clone of a layer shares, and the [`Slot`]
//! guard that gives a request's slot back whatever way the request ends.

use super::memory::MemorySlots;
use super::metrics::Metrics;
use super::response::{self, ConcurrencyRejection};
use super::store::{Acquire, Occupancy, Release, SlotId, SlotStore};
use crate::breaker::{Admit, Breaker, BreakerState};
use crate::clock::Clock;
use crate::error::StoreError;
use crate::grpc;
use crate::headers::HeaderStyle;
use crate::key::{Key, KeyExtractor};
use crate::limiter::{KeyErrorFn, LogThrottle, OnStoreError};
use crate::store::{Namespace, StoreFuture};
use bytes::Bytes;
use http::request::Parts;
use http::Response;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) type RejectionFn = dyn Fn(&ConcurrencyRejection<'_>) -> Response<Bytes> + Send + Sync;

pub(crate) struct Limiter {
    pub(crate) namespace: Namespace,
    pub(crate) store: Arc<dyn SlotStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) limit: u64,
    pub(crate) lease: Duration,
    pub(crate) headers: HeaderStyle,
    pub(crate) retry_after_secs: u64,
    pub(crate) on_rejection: Arc<RejectionFn>,
    pub(crate) on_key_error: Arc<KeyErrorFn>,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) store_timeout: Duration,
    pub(crate) shadow: bool,
    pub(crate) breaker: Breaker,
    /// The in-process slots used by [`OnStoreError::Local`], and their per-key limit.
    pub(crate) fallback: Option<(MemorySlots, u64)>,
    pub(crate) log: LogThrottle,
    pub(crate) metrics: OnceLock<Metrics>,
}

/// How a request starts.
pub(crate) enum Begin {
    /// Call the inner service now: exempt (no slot), or admitted without a
    /// store call by the failure policy while the breaker is open.
    Forward(Option<Slot>),
    /// The limiter answers (a key error, or a rejection without a store call).
    Answer(Response<Bytes>),
    /// The store call is made; `slot` is armed before it is sent, so a request
    /// dropped while the call is in flight still gives back what it may have taken.
    Acquire {
        fut: StoreFuture<Result<Occupancy, StoreError>>,
        slot: Slot,
        started: Option<Instant>,
    },
}

/// A request's slot: given back when dropped — at the end of the response
/// body, or when the request is dropped, fails or panics first.
///
/// A release to a network store is spawned (bounded by the store timeout),
/// never awaited on the response path; a release that fails leaves the slot
/// to expire with its lease.
pub struct Slot {
    limiter: Arc<Limiter>,
    key: Key,
    id: SlotId,
    /// The store may hold this slot: it was acquired, or the acquire's outcome is unknown.
    in_store: bool,
    /// The local fallback ([`OnStoreError::Local`]) holds it.
    in_fallback: bool,
    /// Counted in the in-flight gauge.
    counted: bool,
    /// The request is a gRPC call: answer with gRPC statuses.
    grpc: bool,
}

impl Limiter {
    pub(crate) fn metrics(&self) -> &Metrics {
        self.metrics
            .get_or_init(|| Metrics::new(self.namespace.name()))
    }

    fn acquire_call<'a>(
        &'a self,
        key: &'a Key,
        id: SlotId,
        limit: u64,
        now_ms: u64,
    ) -> Acquire<'a> {
        Acquire {
            namespace: &self.namespace,
            key,
            id,
            limit,
            now_ms,
            lease: self.lease,
            timeout: self.store_timeout,
        }
    }

    /// Extracts the key and starts the one store call of a request.
    pub(crate) fn begin(self: &Arc<Self>, parts: &Parts) -> Begin {
        let grpc = grpc::is_grpc(parts);
        let key = match self.key.extract(parts) {
            Ok(Some(key)) => key,
            Ok(None) => {
                self.metrics().exempt.increment(1);
                return Begin::Forward(None);
            }
            Err(err) => {
                self.metrics().key_error.increment(1);
                self.log.event(&self.log.key_error, || {
                    tracing::error!(limiter = self.namespace.name(), error = %err, "concurrency limit key extraction failed");
                });
                return Begin::Answer(if grpc {
                    grpc::error(grpc::INTERNAL, &err.to_string(), None)
                } else {
                    (self.on_key_error)(&err)
                });
            }
        };
        let now_ms = self.clock.now_ms();
        let mut slot = Slot {
            limiter: self.clone(),
            key,
            id: SlotId::next(),
            in_store: false,
            in_fallback: false,
            counted: false,
            grpc,
        };
        match self.breaker.admit(now_ms) {
            Admit::Call => {}
            Admit::Probe => self
                .metrics()
                .breaker_state
                .set(BreakerState::HalfOpen as u8 as f64),
            Admit::Reject => {
                return match self.store_failed(&mut slot, StoreError::CircuitOpen) {
                    Some(res) => Begin::Answer(res),
                    None => Begin::Forward(Some(slot)),
                };
            }
        }
        let mut fut = self
            .store
            .acquire(&self.acquire_call(&slot.key, slot.id, self.limit, now_ms));
        slot.in_store = true;
        let started = match fut.now_or_never() {
            Some(result) => {
                fut = StoreFuture::ready(result);
                None
            }
            None => Some(Instant::now()),
        };
        Begin::Acquire { fut, slot, started }
    }

    /// Acts on the store's answer: `None` forwards the request (holding
    /// `slot`), `Some` answers it (the slot is given back when dropped).
    pub(crate) fn verdict(
        &self,
        slot: &mut Slot,
        started: Option<Instant>,
        result: Result<Occupancy, StoreError>,
    ) -> Option<Response<Bytes>> {
        let m = self.metrics();
        if let Some(t) = started {
            m.decide_duration.record(t.elapsed().as_secs_f64());
        }
        match &result {
            Ok(_) => {
                if self.breaker.success() {
                    m.breaker_state.set(BreakerState::Closed as u8 as f64);
                    tracing::info!(
                        limiter = self.namespace.name(),
                        "concurrency store answers again; circuit closed"
                    );
                }
            }
            Err(_) => {
                if self.breaker.failure(self.clock.now_ms()) {
                    m.breaker_state.set(BreakerState::Open as u8 as f64);
                    tracing::warn!(
                        limiter = self.namespace.name(),
                        "concurrency store keeps failing; circuit opened"
                    );
                }
            }
        }
        match result {
            Ok(o) if o.acquired => {
                m.allowed.increment(1);
                self.admitted(slot);
                None
            }
            Ok(o) => {
                slot.in_store = false;
                self.reject(slot, o.in_flight, self.limit)
            }
            Err(err) => self.store_failed(slot, err),
        }
    }

    fn admitted(&self, slot: &mut Slot) {
        slot.counted = true;
        self.metrics().in_flight.increment(1);
    }

    fn reject(&self, slot: &mut Slot, in_flight: u64, limit: u64) -> Option<Response<Bytes>> {
        let m = self.metrics();
        if self.shadow {
            // Would-be rejections hold no slot: the store keeps counting only
            // the requests the limit would have admitted.
            m.shadow_rejected.increment(1);
            self.log.event(&self.log.rejected, || {
                tracing::info!(
                    limiter = self.namespace.name(),
                    limit,
                    "concurrency limit would reject (shadow mode: admitted)"
                );
            });
            self.admitted(slot);
            return None;
        }
        m.rejected.increment(1);
        self.log.event(&self.log.rejected, || {
            tracing::info!(
                limiter = self.namespace.name(),
                limit,
                "concurrency limit exceeded"
            );
        });
        let r = ConcurrencyRejection {
            name: self.namespace.name(),
            limit,
            in_flight,
            retry_after_secs: self.retry_after_secs,
        };
        let mut res = if slot.grpc {
            let retry_ms = r.retry_after_secs * 1000;
            grpc::error(grpc::RESOURCE_EXHAUSTED, &r.detail(), Some(retry_ms))
        } else {
            (self.on_rejection)(&r)
        };
        response::apply(self.headers, &r, res.headers_mut());
        Some(res)
    }

    fn store_failed(&self, slot: &mut Slot, err: StoreError) -> Option<Response<Bytes>> {
        let m = self.metrics();
        m.store_error(err.kind());
        let policy = self.on_store_error;
        self.log.event(&self.log.store_error, || {
            tracing::error!(limiter = self.namespace.name(), error = %err, kind = err.kind(), on_store_error = policy.label(), "concurrency store failed");
        });
        // `slot.in_store` stays set when the call was made: the acquire may
        // have run, so the slot is released (best effort) when the request ends.
        match policy {
            OnStoreError::FailOpen => {
                m.fail_open.increment(1);
                self.admitted(slot);
                None
            }
            OnStoreError::FailClosed => {
                m.fail_closed.increment(1);
                Some(crate::response::unavailable(
                    slot.grpc,
                    1,
                    "the concurrency limiter cannot reach its store",
                ))
            }
            OnStoreError::Local { .. } => {
                m.fail_local.increment(1);
                let (local, limit) = self
                    .fallback
                    .as_ref()
                    .expect("a local fallback is built with OnStoreError::Local");
                let o = local.acquire_now(&self.acquire_call(
                    &slot.key,
                    slot.id,
                    *limit,
                    self.clock.now_ms(),
                ));
                if o.acquired {
                    slot.in_fallback = true;
                    self.admitted(slot);
                    None
                } else {
                    self.reject(slot, o.in_flight, *limit)
                }
            }
        }
    }

    fn release(self: &Arc<Self>, slot: &Slot) {
        if slot.counted {
            self.metrics().in_flight.decrement(1);
        }
        let call = Release {
            namespace: &self.namespace,
            key: &slot.key,
            id: slot.id,
            now_ms: self.clock.now_ms(),
            lease: self.lease,
            timeout: self.store_timeout,
        };
        if slot.in_fallback {
            if let Some((local, _)) = &self.fallback {
                local.release_now(&call);
            }
        }
        if !slot.in_store {
            return;
        }
        let this = self.clone();
        let fut = self.store.release(&call);
        if !crate::limiter::run_off_path(fut, move |result, started| this.released(result, started))
        {
            self.metrics().off_path_failed.increment(1);
            tracing::warn!(
                limiter = self.namespace.name(),
                "no tokio runtime to release a concurrency slot on; it expires with its lease"
            );
        }
    }

    fn released(&self, result: Result<(), StoreError>, started: Option<Instant>) {
        if let Err(err) = self.metrics().off_path_done(result, started) {
            self.log.event(&self.log.store_error, || {
                tracing::warn!(limiter = self.namespace.name(), error = %err, kind = err.kind(), "concurrency slot release failed; the slot expires with its lease");
            });
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let limiter = self.limiter.clone();
        limiter.release(self);
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("limiter", &self.limiter.namespace.name())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
