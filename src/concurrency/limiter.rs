//! The concurrency limiter every clone of a layer shares, its decision
//! pipeline (key, one acquire from the shared [`Slots`], verdict), and the
//! [`Slot`] a request holds until it ends.

use super::response::{self, ConcurrencyRejection};
use crate::builder::KeyErrorFn;
use crate::failure::Log;
use crate::grpc;
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

pub(crate) type RejectionFn = dyn Fn(&ConcurrencyRejection<'_>) -> Response<Bytes> + Send + Sync;

pub(crate) struct Limiter {
    /// The slots, their store and its failure handling.
    pub(crate) slots: Arc<Slots>,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) limit: u64,
    pub(crate) headers: HeaderStyle,
    pub(crate) retry_after_secs: u64,
    pub(crate) on_rejection: Arc<RejectionFn>,
    pub(crate) on_key_error: Arc<KeyErrorFn>,
    pub(crate) shadow: bool,
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
}

impl Limiter {
    pub(crate) fn metrics(&self) -> &Metrics {
        self.slots.metrics()
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
                let res =
                    self.slots
                        .guard
                        .key_error(&err, grpc, &*self.on_key_error, self.metrics());
                return Later::Now(Verdict::Answer(res));
            }
        };
        match self.slots.take(key, self.limit) {
            Later::Now(taken) => Later::Now(self.verdict(taken, grpc)),
            Later::Pending(taken) => {
                let this = self.clone();
                Later::pending(async move { this.verdict(taken.await, grpc) })
            }
        }
    }

    /// Acts on what the store (or the failure policy) said.
    fn verdict(&self, taken: Taken, grpc: bool) -> Verdict {
        match taken {
            Taken::Held(mut held) => {
                self.metrics().allowed.increment(1);
                held.count();
                Verdict::Forward(Some(Slot { held }))
            }
            Taken::Open(mut held) => {
                held.count();
                Verdict::Forward(Some(Slot { held }))
            }
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

    fn reject(&self, mut held: Held, grpc: bool, in_flight: u64, limit: u64) -> Verdict {
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
            held.count();
            return Verdict::Forward(Some(Slot { held }));
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
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("limiter", &self.held.name())
            .field("id", &self.held.id())
            .finish_non_exhaustive()
    }
}
