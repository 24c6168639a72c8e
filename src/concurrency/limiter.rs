//! The concurrency limiter every clone of a layer shares, its decision
//! pipeline (key, one acquire from the shared [`Slots`], verdict), and the
//! [`Slot`] a request holds until it ends.

use super::response::{self, ConcurrencyRejection};
use crate::adaptive::AdaptiveLimit;
use crate::builder::KeyErrorFn;
use crate::failure::Log;
use crate::grpc;
use crate::guarded::Gate;
use crate::headers::HeaderStyle;
use crate::key::KeyExtractor;
use crate::later::Later;
use crate::metrics::StoreMetrics as Metrics;
use crate::problem;
use crate::slots::{Held, Slots, Taken};
use bytes::Bytes;
use http::request::Parts;
use http::Response;
use std::fmt;
use std::sync::Arc;
use tokio::time::Instant;

pub(crate) type RejectionFn = dyn Fn(&ConcurrencyRejection<'_>) -> Response<Bytes> + Send + Sync;

pub(crate) struct Limiter {
    /// The slots, their store and its failure handling.
    pub(crate) slots: Arc<Slots>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) limit: Limit,
    pub(crate) headers: HeaderStyle,
    pub(crate) retry_after_secs: u64,
    pub(crate) on_rejection: Arc<RejectionFn>,
    pub(crate) on_key_error: Arc<KeyErrorFn>,
    pub(crate) shadow: bool,
}

/// The slots a key may hold: fixed, or found from latency.
#[derive(Debug)]
pub(crate) enum Limit {
    Fixed(u64),
    Adaptive(Arc<AdaptiveLimit>),
}

impl Limit {
    /// The limit now.
    pub(crate) fn now(&self) -> u64 {
        match self {
            Limit::Fixed(n) => *n,
            Limit::Adaptive(a) => a.now(),
        }
    }
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
    held: Held,
    /// What an adaptive limit learns from this request when it ends.
    sample: Option<Sample>,
}

/// An admitted request's part in an adaptive limit: when it started, and
/// how many of its key's slots were held then.
struct Sample {
    limit: Arc<AdaptiveLimit>,
    started: Instant,
    in_flight: u64,
}

impl Slot {
    /// The inner service answered (its response head is here): an adaptive
    /// limit learns the service's latency now, not when the client has read
    /// the body, so slow readers cannot move it. The slot itself is held on
    /// until the body ends.
    fn answered(&mut self) {
        if let Some(s) = self.sample.take() {
            let limit = s.limit.sample(s.started.elapsed(), s.in_flight);
            self.held.metrics().limit.set(limit as f64);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // No head (the service failed, or the request was dropped first):
        // what it took until then.
        self.answered();
    }
}

impl Gate for Limiter {
    type Guard = Slot;

    /// The whole path of one request to its verdict: its key, then one
    /// acquire (bounded by the store timeout, behind the breaker).
    fn decide(self: Arc<Self>, parts: &Parts) -> Later<Verdict> {
        let grpc = grpc::is_grpc(parts);
        let key = match self.key.extract(parts) {
            Ok(Some(key)) => key,
            Ok(None) => {
                self.metrics().exempt.increment(1);
                return Later::Now(Verdict::Forward(None));
            }
            Err(err) => {
                let res =
                    self.slots
                        .guard
                        .key_error(&err, grpc, &*self.on_key_error, self.metrics());
                return Later::Now(Verdict::Answer(res));
            }
        };
        match self.slots.take(key, self.limit.now()) {
            Later::Now(taken) => Later::Now(self.verdict(taken, grpc)),
            Later::Pending(taken) => Later::pending(async move { self.verdict(taken.await, grpc) }),
        }
    }

    fn answered(slot: &mut Slot) {
        slot.answered();
    }

    fn name(&self) -> &str {
        self.slots.namespace.name()
    }

    fn middleware(&self) -> &'static str {
        "concurrency"
    }
}

impl Limiter {
    pub(crate) fn metrics(&self) -> &Metrics {
        self.slots.metrics()
    }

    /// Acts on what the store (or the failure policy) said.
    fn verdict(&self, taken: Taken, grpc: bool) -> Verdict {
        match taken {
            Taken::Held(held) => {
                self.metrics().allowed.increment(1);
                Verdict::Forward(Some(self.slot(held)))
            }
            Taken::Open(held) => Verdict::Forward(Some(self.slot(held))),
            Taken::Full {
                held,
                in_flight,
                limit,
            } => self.reject(held, grpc, in_flight, limit),
            Taken::Unavailable => Verdict::Answer(problem::unavailable(
                grpc,
                1,
                "the concurrency limiter cannot reach its store",
            )),
        }
    }

    fn reject(&self, held: Held, grpc: bool, in_flight: u64, limit: u64) -> Verdict {
        let m = self.metrics();
        let name = self.slots.namespace.name();
        if self.shadow {
            // Would-be rejections hold no slot: the store keeps counting only
            // the requests the limit would have admitted.
            m.shadow_rejected.increment(1);
            self.slots.guard.log.event(Log::Rejected, || {
                tracing::info!(
                    limiter = name,
                    limit,
                    "concurrency limit would reject (shadow mode: admitted)"
                );
            });
            return Verdict::Forward(Some(self.slot(held)));
        }
        m.rejected.increment(1);
        self.slots.guard.log.event(Log::Rejected, || {
            tracing::info!(limiter = name, limit, "concurrency limit exceeded");
        });
        let r = ConcurrencyRejection {
            name,
            limit,
            in_flight,
            retry_after_secs: self.retry_after_secs,
        };
        let mut res = if grpc {
            let retry_ms = r.retry_after_secs * 1000;
            grpc::error(grpc::RESOURCE_EXHAUSTED, &r.detail(), Some(retry_ms))
        } else {
            (self.on_rejection)(&r)
        };
        response::apply(self.headers, &r, res.headers_mut());
        Verdict::Answer(res)
    }

    /// The slot of a request that runs, counted in flight, and timed for
    /// an adaptive limit when the store said how many ran beside it.
    fn slot(&self, mut held: Held) -> Slot {
        held.count();
        let sample = match (&self.limit, held.in_flight()) {
            (Limit::Adaptive(limit), Some(in_flight)) => Some(Sample {
                limit: limit.clone(),
                started: Instant::now(),
                in_flight,
            }),
            _ => None,
        };
        Slot { held, sample }
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("limiter", &self.held.name())
            .field("id", &self.held.id())
            .finish_non_exhaustive()
    }
}
