//! The concurrency limiter every clone of a layer shares, its decision
//! pipeline (key, one acquire, verdict), and the [`Slot`] guard that gives a
//! request's slot back whatever way the request ends.

use super::response::{self, ConcurrencyRejection};
use crate::builder::KeyErrorFn;
use crate::clock::Clock;
use crate::error::StoreError;
use crate::failure::{self, Guard, Log, OnStoreError, Permit};
use crate::grpc;
use crate::headers::HeaderStyle;
use crate::key::{Key, KeyExtractor};
use crate::later::Later;
use crate::metrics::{StoreMetrics as Metrics, CONCURRENCY};
use crate::problem;
use crate::store::{Acquire, MemoryStore, Namespace, Occupancy, Release, SlotId, Store};
use bytes::Bytes;
use http::request::Parts;
use http::Response;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) type RejectionFn = dyn Fn(&ConcurrencyRejection<'_>) -> Response<Bytes> + Send + Sync;

pub(crate) struct Limiter {
    pub(crate) namespace: Namespace,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) limit: u64,
    pub(crate) lease: Duration,
    pub(crate) headers: HeaderStyle,
    pub(crate) retry_after_secs: u64,
    pub(crate) on_rejection: Arc<RejectionFn>,
    pub(crate) on_key_error: Arc<KeyErrorFn>,
    pub(crate) store_timeout: Duration,
    /// The layer's own bound on a store call ([`failure::backstop`](crate::failure::backstop)).
    pub(crate) backstop: Option<Duration>,
    pub(crate) shadow: bool,
    pub(crate) guard: Guard,
    /// The in-process slots used by [`OnStoreError::Local`], and their per-key limit.
    pub(crate) fallback: Option<(MemoryStore, u64)>,
    pub(crate) metrics: OnceLock<Metrics>,
}

/// What happens to a request: forwarded holding its slot (none when
/// exempt), or answered.
pub(crate) type Verdict = crate::later::Verdict<Option<Slot>>;

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
            .get_or_init(|| Metrics::new(&CONCURRENCY, self.namespace.name()))
    }

    fn acquire_call<'a>(&'a self, slot: &'a Slot, limit: u64) -> Acquire<'a> {
        Acquire {
            namespace: &self.namespace,
            key: &slot.key,
            id: slot.id,
            limit,
            now_ms: self.clock.now_ms(),
            lease: self.lease,
            timeout: self.store_timeout,
        }
    }

    /// The whole path of one request to its verdict: its key, then one
    /// acquire (bounded by the store timeout, behind the breaker).
    pub(crate) fn decide(self: &Arc<Self>, parts: &Parts) -> Later<Verdict> {
        let grpc = grpc::is_grpc(parts);
        let key = match self.key.extract(parts) {
            Ok(Some(key)) => key,
            Ok(None) => {
                self.metrics().exempt.increment(1);
                return Later::Now(Verdict::Forward(None));
            }
            Err(err) => {
                let res = self
                    .guard
                    .key_error(&err, grpc, &*self.on_key_error, self.metrics());
                return Later::Now(Verdict::Answer(res));
            }
        };
        let mut slot = Slot {
            limiter: self.clone(),
            key,
            id: SlotId::next(),
            in_store: false,
            in_fallback: false,
            counted: false,
            grpc,
        };
        let permit = match self.guard.admit(0, self.metrics()) {
            Ok(permit) => permit,
            Err(open) => return Later::Now(self.store_failed(slot, open)),
        };
        let fut = self.store.acquire(&self.acquire_call(&slot, self.limit));
        // Armed before the answer: a request dropped while the call is in
        // flight still gives back what it may have taken.
        slot.in_store = true;
        let fut = match fut.into_ready() {
            Ok(result) => return Later::Now(self.verdict(slot, permit, None, result)),
            Err(fut) => fut,
        };
        let this = self.clone();
        Later::pending(async move {
            let started = Instant::now();
            let result = failure::within(this.backstop, fut).await;
            this.verdict(slot, permit, Some(started), result)
        })
    }

    /// Acts on the store's answer.
    fn verdict(
        &self,
        mut slot: Slot,
        permit: Permit,
        started: Option<Instant>,
        result: Result<Occupancy, StoreError>,
    ) -> Verdict {
        let m = self.metrics();
        if let Some(t) = started {
            m.decide_duration.record(t.elapsed().as_secs_f64());
        }
        self.guard.record(permit, &result, m);
        match result {
            Ok(o) if o.acquired => {
                m.allowed.increment(1);
                self.admitted(&mut slot);
                Verdict::Forward(Some(slot))
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

    fn reject(&self, mut slot: Slot, in_flight: u64, limit: u64) -> Verdict {
        let m = self.metrics();
        if self.shadow {
            // Would-be rejections hold no slot: the store keeps counting only
            // the requests the limit would have admitted.
            m.shadow_rejected.increment(1);
            self.guard.log.event(Log::Rejected, || {
                tracing::info!(
                    limiter = self.namespace.name(),
                    limit,
                    "concurrency limit would reject (shadow mode: admitted)"
                );
            });
            self.admitted(&mut slot);
            return Verdict::Forward(Some(slot));
        }
        m.rejected.increment(1);
        self.guard.log.event(Log::Rejected, || {
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
        Verdict::Answer(res)
    }

    fn store_failed(&self, mut slot: Slot, err: StoreError) -> Verdict {
        // `slot.in_store` stays set when the call was made: the acquire may
        // have run, so the slot is released (best effort) when the request ends.
        match self.guard.failed(&err, self.metrics()) {
            OnStoreError::FailOpen => {
                self.admitted(&mut slot);
                Verdict::Forward(Some(slot))
            }
            OnStoreError::Local { .. } if self.fallback.is_some() => {
                let (local, limit) = self.fallback.as_ref().expect("checked");
                let o = local
                    .acquire(&self.acquire_call(&slot, *limit))
                    .now_or_never();
                match o {
                    Some(Ok(o)) if o.acquired => {
                        slot.in_fallback = true;
                        self.admitted(&mut slot);
                        Verdict::Forward(Some(slot))
                    }
                    Some(Ok(o)) => self.reject(slot, o.in_flight, *limit),
                    _ => self.unavailable(&slot),
                }
            }
            _ => self.unavailable(&slot),
        }
    }

    fn unavailable(&self, slot: &Slot) -> Verdict {
        Verdict::Answer(problem::unavailable(
            slot.grpc,
            1,
            "the concurrency limiter cannot reach its store",
        ))
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
                let _ = local.release(&call).now_or_never();
            }
        }
        if !slot.in_store {
            return;
        }
        let this = self.clone();
        let fut = self.store.release(&call);
        let done = move |result, started| {
            if let Err(err) = this.metrics().off_path_done(result, started) {
                this.guard.log.event(Log::StoreError, || {
                    tracing::warn!(limiter = this.namespace.name(), error = %err, kind = err.kind(), "concurrency slot release failed; the slot expires with its lease");
                });
            }
        };
        if !failure::off_path(fut, self.backstop, done) {
            self.metrics().off_path_failed.increment(1);
            tracing::warn!(
                limiter = self.namespace.name(),
                "no tokio runtime to release a concurrency slot on; it expires with its lease"
            );
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
