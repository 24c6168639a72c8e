//! The shedder every clone of a layer shares, and the [`Admission`] guard
//! that counts a request in flight until its response is done.

use super::metrics::Metrics;
use super::priority::Priority;
use crate::adaptive::{Adaptive, AdaptiveLimit};
use crate::failure::{Log, LogThrottle};
use crate::guarded::Gate;
use crate::key::Key;
use crate::later::Later;
use crate::slots::{Held, Slots, Taken};
use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::request::Parts;
use http::{HeaderValue, Response};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::time::Instant;

pub(crate) type ClassifyFn = dyn Fn(&Parts) -> Priority + Send + Sync;
pub(crate) type UtilisationFn = dyn Fn() -> f64 + Send + Sync;
pub(crate) type ShedFn = dyn Fn(&Overloaded) -> Response<Bytes> + Send + Sync;

/// What the shedder knew when it shed a request, for a custom 503.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Overloaded {
    /// The request's class.
    pub priority: Priority,
    /// Requests in flight when it decided: through this process's shedder,
    /// or across the fleet when [`fleet`](Self::fleet) is set.
    pub in_flight: u64,
    /// Whether the fleet's count (a [`fleet_capacity`](crate::LoadShedLayerBuilder::fleet_capacity)),
    /// not this process's, shed the request.
    pub fleet: bool,
    /// The utilisation signal's reading (0 to 1), if one is configured.
    pub utilisation: Option<f64>,
    /// Seconds the client is told to wait (`Retry-After`).
    pub retry_after_secs: u64,
}

/// The default answer to a shed request: 503 with `Retry-After` and an
/// `application/problem+json` body of the IETF RateLimit draft's
/// `temporary-reduced-capacity` type.
///
/// ```
/// use tower_ratelimit::{shed::default_response, LoadShedLayer};
/// let layer = LoadShedLayer::builder().capacity(100).on_shed(default_response).build();
/// ```
pub fn default_response(o: &Overloaded) -> Response<Bytes> {
    crate::problem::unavailable_as(
        crate::problem::TEMPORARY_REDUCED_CAPACITY,
        false,
        o.retry_after_secs,
        &o.detail(),
    )
}

impl Overloaded {
    /// A one-line explanation for bodies and `grpc-message`.
    ///
    /// ```
    /// use tower_ratelimit::LoadShedLayer;
    /// let layer = LoadShedLayer::builder()
    ///     .capacity(100)
    ///     .on_shed(|o| http::Response::new(bytes::Bytes::from(o.detail())))
    ///     .build();
    /// ```
    pub fn detail(&self) -> String {
        format!(
            "the service is overloaded and sheds {} requests; retry in {} s",
            self.priority, self.retry_after_secs
        )
    }
}

pub(crate) struct Shedder {
    pub(crate) name: String,
    pub(crate) classify: Arc<ClassifyFn>,
    /// The capacity in requests in flight, if one is configured.
    pub(crate) capacity: Option<Capacity>,
    /// The share of capacity or utilisation each class may use.
    pub(crate) shares: [f64; 4],
    pub(crate) utilisation: Option<Arc<UtilisationFn>>,
    /// The fleet's capacity, counted in leased slots in a store.
    pub(crate) fleet: Option<Fleet>,
    pub(crate) in_flight: AtomicU64,
    pub(crate) retry_after_secs: u64,
    pub(crate) on_shed: Arc<ShedFn>,
    pub(crate) shadow: bool,
    pub(crate) log: LogThrottle,
    pub(crate) metrics: OnceLock<Metrics>,
}

/// A capacity for the whole fleet: requests in flight are leased slots under
/// one key in the shedder's store, and a class of share `s` is admitted
/// while fewer than `floor(s × capacity)` are held.
pub(crate) struct Fleet {
    pub(crate) slots: Arc<Slots>,
    /// The one key of the fleet's slots, in the shedder's namespace.
    pub(crate) key: Key,
    pub(crate) capacity: u64,
    /// The slots each class may see held (by [`Priority::index`]).
    pub(crate) limits: [u64; 4],
}

/// The one key of the fleet's slots, in the shedder's namespace.
pub(crate) const FLEET_KEY: &str = "fleet";

/// The capacity: fixed, or found from latency.
pub(crate) enum Capacity {
    /// The capacity, and the requests each class may have in flight (by
    /// [`Priority::index`]).
    Fixed(u64, [u64; 4]),
    /// Moved by each admitted request's latency.
    Adaptive(AdaptiveLimit),
}

impl Capacity {
    pub(crate) fn adaptive(cfg: Adaptive) -> Self {
        Capacity::Adaptive(AdaptiveLimit::new(cfg))
    }

    /// The requests in flight a class of `share` may have now (with an
    /// adaptive capacity, at least one, so every class keeps measuring).
    fn limit(&self, class: usize, share: f64) -> u64 {
        match self {
            Capacity::Fixed(_, limits) => limits[class],
            Capacity::Adaptive(a) => share_of(share, a.now()).max(1),
        }
    }

    /// The whole capacity now.
    pub(crate) fn now(&self) -> u64 {
        match self {
            Capacity::Fixed(capacity, _) => *capacity,
            Capacity::Adaptive(a) => a.now(),
        }
    }
}

/// A class's room in `capacity`: `floor(share × capacity)`. The epsilon
/// keeps 0.29 × 100 at 29, not 28.999….
pub(crate) fn share_of(share: f64, capacity: u64) -> u64 {
    (share * capacity as f64 + 1e-9).floor() as u64
}

/// A request counted in flight by the load shedder until dropped — at the end
/// of the response body, or when the request is dropped, fails or panics first.
pub struct Admission {
    shedder: Arc<Shedder>,
    /// When it started, for an adaptive capacity (`None` once it is known
    /// the request does not run).
    started: Option<Instant>,
    /// Its slot in the fleet's count.
    fleet: Option<Held>,
}

impl Admission {
    /// The inner service answered (its response head is here): an adaptive
    /// capacity learns the service's latency now, not when the client has
    /// read the body, so slow readers cannot move it. The request counts in
    /// flight until its body ends.
    fn answered(&mut self) {
        if let (Some(started), Some(Capacity::Adaptive(a))) =
            (self.started.take(), &self.shedder.capacity)
        {
            let in_flight = self.shedder.in_flight.load(Ordering::Acquire);
            let limit = a.sample(started.elapsed(), in_flight);
            self.shedder.metrics().capacity.set(limit as f64);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        drop(self.fleet.take());
        // No head (the service failed, or the request was dropped first):
        // what it took until then.
        self.answered();
        self.shedder.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.shedder.metrics().in_flight.decrement(1);
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("shedder", &self.shedder.name)
            .finish()
    }
}

/// What the shedder decided for one request: run it, holding the admission
/// (always there) until the response is done, or answer with a 503.
pub(crate) type Verdict = crate::later::Verdict<Option<Admission>>;

/// Whether a class may start another request: below its share of the
/// utilisation signal (if any) and, with a capacity, below its limit of
/// requests in flight.
pub(crate) fn admits(
    share: f64,
    utilisation: Option<f64>,
    limit: Option<u64>,
    in_flight: u64,
) -> bool {
    utilisation.is_none_or(|u| u <= share) && limit.is_none_or(|l| in_flight < l)
}

impl Gate for Shedder {
    type Guard = Admission;

    /// Classifies and decides: this process's capacity and utilisation
    /// first (no store call for a request shed here), then the fleet's.
    fn decide(self: Arc<Self>, parts: &Parts) -> Later<Verdict> {
        let class = (self.classify)(parts);
        let grpc = crate::grpc::is_grpc(parts);
        let (admission, would_shed) = match self.admit_here(class) {
            Ok(admission) => (admission, false),
            Err(refused) if self.shadow => (self.shadow_admit(class, &refused), true),
            Err(refused) => return Later::Now(Verdict::Answer(self.shed(class, grpc, refused))),
        };
        let Some(fleet) = &self.fleet else {
            return Later::Now(self.admitted(class, admission));
        };
        let limit = fleet.limits[class.index()];
        match fleet.slots.take(fleet.key, limit) {
            Later::Now(taken) => {
                Later::Now(self.fleet_verdict(class, grpc, admission, would_shed, taken))
            }
            Later::Pending(taken) => Later::pending(async move {
                self.fleet_verdict(class, grpc, admission, would_shed, taken.await)
            }),
        }
    }

    fn answered(admission: &mut Admission) {
        admission.answered();
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn middleware(&self) -> &'static str {
        "shed"
    }
}

impl Shedder {
    pub(crate) fn metrics(&self) -> &Metrics {
        self.metrics.get_or_init(|| Metrics::new(&self.name))
    }

    fn read_utilisation(&self) -> Option<f64> {
        let f = self.utilisation.as_ref()?;
        let u = f();
        if u.is_nan() {
            // A broken signal must not take the service down: it reads as idle.
            self.log.event(Log::StoreError, || {
                tracing::error!(shedder = %self.name, "the utilisation signal returned NaN; treated as 0");
            });
            return Some(0.0);
        }
        let u = u.clamp(0.0, 1.0);
        self.metrics().utilisation.set(u);
        Some(u)
    }

    /// Takes a place in this process's count if the class is below its
    /// share of the capacity and of the utilisation signal.
    fn admit_here(self: &Arc<Self>, class: Priority) -> Result<Admission, Refused> {
        let i = class.index();
        let share = self.shares[i];
        let limit = self.capacity.as_ref().map(|c| c.limit(i, share));
        let utilisation = self.read_utilisation();
        // Check and count in one step, so concurrent requests never overshoot a class's limit.
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                admits(share, utilisation, limit, n).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(self.admission()),
            Err(in_flight) => Err(Refused {
                in_flight,
                utilisation,
                fleet: false,
            }),
        }
    }

    /// Counts in a request this process would have shed (shadow mode).
    fn shadow_admit(self: &Arc<Self>, class: Priority, refused: &Refused) -> Admission {
        self.shadow_shed(class, refused);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.admission()
    }

    fn shadow_shed(&self, class: Priority, refused: &Refused) {
        self.metrics().shadow_shed[class.index()].increment(1);
        let (in_flight, fleet) = (refused.in_flight, refused.fleet);
        self.log.event(Log::Rejected, || {
            tracing::info!(shedder = %self.name, class = class.as_str(), in_flight, fleet, "load shedder would shed (shadow mode: admitted)");
        });
    }

    fn admission(self: &Arc<Self>) -> Admission {
        let adaptive = matches!(self.capacity, Some(Capacity::Adaptive(_)));
        self.metrics().in_flight.increment(1);
        Admission {
            shedder: self.clone(),
            started: adaptive.then(Instant::now),
            fleet: None,
        }
    }

    fn admitted(&self, class: Priority, admission: Admission) -> Verdict {
        self.metrics().admitted[class.index()].increment(1);
        Verdict::Forward(Some(admission))
    }

    /// Acts on the fleet's answer for a request this process admitted.
    fn fleet_verdict(
        &self,
        class: Priority,
        grpc: bool,
        mut admission: Admission,
        would_shed: bool,
        taken: Taken,
    ) -> Verdict {
        match taken {
            Taken::Held(held) | Taken::Open(held) => {
                admission.fleet = Some(held);
                self.admitted(class, admission)
            }
            Taken::Full {
                held, in_flight, ..
            } => {
                let refused = Refused {
                    in_flight,
                    utilisation: None,
                    fleet: true,
                };
                if self.shadow {
                    if !would_shed {
                        self.shadow_shed(class, &refused);
                    }
                    admission.fleet = Some(held);
                    return self.admitted(class, admission);
                }
                // It never ran: no latency sample.
                admission.started = None;
                Verdict::Answer(self.shed(class, grpc, refused))
            }
            Taken::Unavailable => {
                admission.started = None;
                Verdict::Answer(crate::problem::unavailable(
                    grpc,
                    self.retry_after_secs,
                    "the load shedder cannot reach its store",
                ))
            }
        }
    }

    /// Counts, logs and answers a shed request.
    fn shed(&self, class: Priority, grpc: bool, refused: Refused) -> Response<Bytes> {
        self.metrics().shed[class.index()].increment(1);
        let Refused {
            in_flight,
            utilisation,
            fleet,
        } = refused;
        self.log.event(Log::Rejected, || {
            tracing::warn!(shedder = %self.name, class = class.as_str(), in_flight, ?utilisation, fleet, "overloaded: shedding requests");
        });
        let o = Overloaded {
            priority: class,
            in_flight,
            fleet,
            utilisation,
            retry_after_secs: self.retry_after_secs,
        };
        if grpc {
            // `UNAVAILABLE` with a retry pushback: gRPC clients retry it.
            return crate::problem::unavailable(true, self.retry_after_secs, &o.detail());
        }
        let mut res = (self.on_shed)(&o);
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(self.retry_after_secs));
        res
    }
}

/// Why a request was refused: the count that was full, and the signal.
struct Refused {
    in_flight: u64,
    utilisation: Option<f64>,
    fleet: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_is_admitted_only_below_its_share() {
        // Capacity 10 with the default shares: test 5, low 7, normal 9, critical 10.
        let limits = [10, 9, 7, 5];
        for n in 0..12u64 {
            let admitted: Vec<bool> = Priority::ALL
                .iter()
                .map(|p| admits(1.0, None, Some(limits[p.index()]), n))
                .collect();
            assert_eq!(
                admitted,
                [n < 10, n < 9, n < 7, n < 5],
                "with {n} in flight"
            );
        }
        let shares = [1.0, 0.9, 0.7, 0.5];
        for (u, expected) in [
            (0.5, [true, true, true, true]),
            (0.6, [true, true, true, false]),
            (0.8, [true, true, false, false]),
            (0.95, [true, false, false, false]),
            (1.0, [true, false, false, false]),
        ] {
            let admitted: Vec<bool> = shares
                .iter()
                .map(|s| admits(*s, Some(u), None, 0))
                .collect();
            assert_eq!(admitted, expected, "at utilisation {u}");
        }
        assert!(
            !admits(1.0, Some(0.1), Some(3), 3),
            "both signals must admit"
        );
    }
}
