//! The rate limiter every clone of a layer shares, and its one decision
//! pipeline: resolve the request's key and policy (at once, or through the
//! application's async lookups), charge the store (bounded by the store
//! timeout, behind the circuit breaker and the deny cache), and turn the
//! answer into forwarding the request or answering it. The response future
//! only drives it; [`Limiter::status`] uses the same resolution.

use super::deny_cache::Denials;
use super::hooks::{Observe, Overrides};
use super::response::Rejection;
use super::settle::{CostFn, Deferred, Dropped, Known, RefundFn, SettleFn, TrailersFn, Usage};
use crate::clock::Clock;
use crate::decision::{Decision, RejectReason};
use crate::error::StoreError;
use crate::failure::{self, Guard, Log, OnStoreError};
use crate::grpc;
use crate::headers::{self, HeaderStyle};
use crate::key::{Key, KeyError, KeyExtractor};
use crate::later::{BoxFuture, Later};
use crate::metrics::{StoreMetrics as Metrics, RATE_LIMIT};
use crate::problem;
use crate::store::{Charge, MemoryStore, Namespace, Settle, Store};
use crate::Policy;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) type AsyncKeyFn =
    dyn Fn(&Parts) -> BoxFuture<Result<Option<Key>, KeyError>> + Send + Sync;
pub(crate) type PolicyFn = dyn Fn(&Parts, &Key) -> Policy + Send + Sync;
pub(crate) type AsyncPolicyFn =
    dyn Fn(&Parts, Key) -> BoxFuture<Result<Policy, KeyError>> + Send + Sync;
pub(crate) type RejectionFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type KeyErrorFn = crate::builder::KeyErrorFn;

pub(crate) enum KeySource {
    Sync(Arc<dyn KeyExtractor>),
    Async(Arc<AsyncKeyFn>),
}

pub(crate) enum PolicySource {
    Static(Policy),
    Sync(Arc<PolicyFn>),
    Async(Arc<AsyncPolicyFn>),
}

pub(crate) struct Limiter {
    pub(crate) namespace: Namespace,
    /// Where a policy running in shadow keeps its state.
    pub(crate) shadow_namespace: Namespace,
    pub(crate) store: Arc<dyn Store>,
    /// Whether the store is in this process ([`Store::is_local`]).
    pub(crate) local_store: bool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) key: KeySource,
    pub(crate) policy: PolicySource,
    /// Policies changed at runtime, read before `policy`.
    pub(crate) overrides: Option<Arc<dyn Overrides>>,
    /// Told of every charge (offered load), when something listens.
    pub(crate) observer: Option<Arc<dyn Observe>>,
    pub(crate) cost: Option<Arc<CostFn>>,
    /// The reservation in quotas of other units (default: the cost).
    pub(crate) reserve: Option<Arc<CostFn>>,
    /// What a request really cost those quotas, from the response head.
    pub(crate) settle: Option<Arc<SettleFn>>,
    /// What it really cost them, from the response trailers.
    pub(crate) settle_trailers: Option<Arc<TrailersFn>>,
    /// Whether quotas in `content-bytes` settle to the response body's bytes.
    pub(crate) body_bytes: bool,
    /// Whether a charged request carries a [`Usage`] to the inner service.
    pub(crate) usage_extension: bool,
    /// What a response that never finished is settled to.
    pub(crate) dropped: Dropped,
    pub(crate) headers: HeaderStyle,
    /// Whether a charged request carries its [`Status`] to the inner service.
    pub(crate) status_extension: bool,
    pub(crate) refund: Arc<RefundFn>,
    /// How many free responses each key has had this window.
    pub(crate) free: super::free::FreeResponses,
    pub(crate) on_rejection: Arc<RejectionFn>,
    pub(crate) on_key_error: Arc<KeyErrorFn>,
    pub(crate) store_timeout: Duration,
    /// The layer's own bound on a store call ([`failure::backstop`]).
    pub(crate) backstop: Option<Duration>,
    pub(crate) shadow: bool,
    pub(crate) guard: Guard,
    pub(crate) denials: Option<Denials>,
    /// The in-process store used by [`OnStoreError::Local`].
    pub(crate) fallback: Option<MemoryStore>,
    pub(crate) metrics: OnceLock<Metrics>,
    /// The offset between the clock and a network store's (none for a
    /// store in this process).
    pub(crate) skew: Option<Arc<crate::skew::Skew>>,
    /// The requests held for a turn the store booked (a policy that waits).
    pub(crate) waiters: Arc<super::wait::Waiters>,
    pub(crate) refusal_metrics: OnceLock<RefusalMetrics>,
    /// This limiter's hold on its name in its store.
    pub(crate) _name: crate::names::Claim,
}

/// The series of waiting and of the penalty box.
pub(crate) struct RefusalMetrics {
    /// How long admitted requests waited for their turn.
    pub(crate) waited: metrics::Histogram,
    /// Requests whose client went away before their turn.
    pub(crate) cancelled: metrics::Counter,
    /// Requests waiting now.
    pub(crate) waiting: metrics::Gauge,
    /// Keys this instance saw put in a penalty box.
    pub(crate) blocks: metrics::Counter,
    /// Requests refused because their key was in a penalty box.
    pub(crate) blocked: metrics::Counter,
}

/// What a request is limited under.
pub(crate) enum Resolution {
    /// Not limited at all.
    Exempt,
    /// Its key and policy.
    Found(Key, Policy),
    /// Its key could not be found.
    Failed(KeyError),
}

/// What happens to a request: forwarded with what it was charged, if it
/// was (its headers and refund come from it), or answered.
pub(crate) type Verdict = crate::later::Verdict<Option<Charged>>;

/// What an admitted request was charged: enough to add headers and to refund.
#[derive(Debug)]
pub(crate) struct Charged {
    key: Key,
    policy: Policy,
    cost: u64,
    units: u64,
    now_ms: u64,
    decision: Decision,
    /// Where the charge went, so a refund goes to the same place.
    to: ChargedTo,
    /// Whether the inner service sees the charge's [`Status`].
    expose_status: bool,
    /// The handler's report of what the request cost, when it gets one.
    usage: Option<Usage>,
}

impl Charged {
    /// It went on `wait` after it was decided, at its booked turn: its
    /// headers describe the state at that turn.
    pub(crate) fn went_on_after(&mut self, wait: std::time::Duration) {
        self.now_ms = self
            .now_ms
            .saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
    }

    /// Puts the charge's [`Status`] in the extensions of the request the
    /// inner service gets (a request that was not charged gets none).
    pub(crate) fn expose<B>(charged: &Option<Charged>, req: &mut http::Request<B>) {
        if let Some(c) = charged {
            if c.expose_status {
                req.extensions_mut().insert(Status {
                    policy: c.policy.clone(),
                    decision: c.decision.clone(),
                    now_ms: c.now_ms,
                });
            }
            if let Some(u) = &c.usage {
                req.extensions_mut().insert(u.clone());
            }
        }
    }
}

/// Where a request was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChargedTo {
    /// The configured store.
    Store,
    /// The in-process fallback store ([`OnStoreError::Local`]).
    Local,
}

/// A request's verdict: there at once (the memory store's answer, the deny
/// cache, an open breaker), or still to come (a network store, an async
/// key or policy lookup).
pub(crate) type Deciding = Later<Verdict>;

/// A charge's inputs, kept while its answer comes.
struct Asked {
    key: Key,
    policy: Policy,
    /// What it costs each quota counting requests.
    cost: u64,
    /// What it reserves in each quota of another unit.
    units: u64,
    now_ms: u64,
    grpc: bool,
    /// How far ahead its charge may be booked (0: not at all).
    wait_ms: u64,
}

/// What the request head says of its charge, before its key is known.
#[derive(Clone, Copy)]
struct Call {
    grpc: bool,
    /// A gRPC call's deadline, ms from now (`grpc-timeout`).
    deadline: Option<u64>,
    /// What it costs each quota counting requests.
    weight: u64,
    /// What it reserves in each quota of another unit.
    units: u64,
}

/// Where a charge's answer came from.
#[derive(Clone, Copy)]
enum Source {
    /// The store, the call the breaker let through (none guards a store in
    /// this process); `started` when it had to wait.
    Store(Option<failure::Permit>, Option<Instant>),
    /// The local deny cache, or the open breaker: nothing to record.
    Local,
}

impl Limiter {
    /// The series of waiting and of the penalty box.
    pub(crate) fn metrics_wait(&self) -> &RefusalMetrics {
        self.refusal_metrics.get_or_init(|| {
            let name = self.namespace.name().to_owned();
            RefusalMetrics {
                waited: metrics::histogram!("ratelimit_wait_seconds", "limiter" => name.clone()),
                cancelled: metrics::counter!("ratelimit_wait_cancelled_total", "limiter" => name.clone()),
                waiting: metrics::gauge!("ratelimit_waiting", "limiter" => name.clone()),
                blocks: metrics::counter!("ratelimit_penalty_blocks_total", "limiter" => name.clone()),
                blocked: metrics::counter!("ratelimit_penalty_blocked_total", "limiter" => name),
            }
        })
    }

    /// Gives back everything `charged` took: its client went away before
    /// its turn.
    pub(crate) fn give_back(self: &Arc<Self>, charged: &mut Charged) {
        let zeros = vec![0; charged.policy.quotas().len()];
        self.settle_charge(charged, zeros);
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        self.metrics
            .get_or_init(|| Metrics::new(&RATE_LIMIT, self.namespace.name()))
    }

    fn call<'a>(
        &'a self,
        key: &'a Key,
        policy: &'a Policy,
        (cost, units): (u64, u64),
        now_ms: u64,
    ) -> Charge<'a> {
        Charge {
            namespace: &self.namespace,
            key,
            policy,
            cost,
            units,
            now_ms,
            wait_ms: 0,
            timeout: self.store_timeout,
        }
    }

    /// Charges the policy running in shadow (a runtime limit), in state of
    /// its own, off the response path, and counts its would-be rejection.
    fn charge_shadow(&self, key: Key, candidate: Policy, cost: (u64, u64), now_ms: u64) {
        let call = Charge {
            namespace: &self.shadow_namespace,
            ..self.call(&key, &candidate, cost, now_ms)
        };
        let mut fut = self.store.charge_shadow(&call);
        let name = self.namespace.name().to_owned();
        let done = move |result: Result<Decision, StoreError>| match result {
            Ok(d) if !d.is_allowed() => {
                metrics::counter!("ratelimit_shadow_policy_rejections_total", "limiter" => name, "policy" => candidate.to_string()).increment(1);
            }
            Ok(_) => {}
            Err(_) => {
                metrics::counter!("ratelimit_shadow_policy_errors_total", "limiter" => name)
                    .increment(1);
            }
        };
        if let Some(result) = fut.now_or_never() {
            return done(result);
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let backstop = self.backstop;
            rt.spawn(async move { done(failure::within(backstop, fut).await) });
        }
    }

    /// The request's key and policy, at once when both are synchronous.
    fn resolve(&self, parts: &Parts) -> Result<Resolution, BoxFuture<Resolution>> {
        let key = match &self.key {
            KeySource::Sync(k) => k.extract(parts),
            KeySource::Async(f) => {
                let key = f(parts);
                let policy = self.policy_later(parts);
                return Err(Box::pin(async move {
                    match key.await {
                        Ok(Some(key)) => match policy(key).await {
                            Ok(p) => Resolution::Found(key, p),
                            Err(e) => Resolution::Failed(e),
                        },
                        Ok(None) => Resolution::Exempt,
                        Err(e) => Resolution::Failed(e),
                    }
                }));
            }
        };
        let key = match key {
            Ok(Some(key)) => key,
            Ok(None) => return Ok(Resolution::Exempt),
            Err(e) => return Ok(Resolution::Failed(e)),
        };
        if let Some(p) = self.overrides.as_ref().and_then(|o| o.policy(&key)) {
            return Ok(Resolution::Found(key, p));
        }
        match &self.policy {
            PolicySource::Static(p) => Ok(Resolution::Found(key, p.clone())),
            PolicySource::Sync(f) => Ok(Resolution::Found(key, f(parts, &key))),
            PolicySource::Async(f) => {
                let policy = f(parts, key);
                Err(Box::pin(async move {
                    match policy.await {
                        Ok(p) => Resolution::Found(key, p),
                        Err(e) => Resolution::Failed(e),
                    }
                }))
            }
        }
    }

    /// For an async key: how its policy is found once it is known.
    fn policy_later(
        &self,
        parts: &Parts,
    ) -> Box<dyn FnOnce(Key) -> BoxFuture<Result<Policy, KeyError>> + Send> {
        let configured = self.configured_policy_later(parts);
        let overrides = self.overrides.clone();
        Box::new(
            move |k| match overrides.as_ref().and_then(|o| o.policy(&k)) {
                Some(p) => Box::pin(std::future::ready(Ok(p))),
                None => configured(k),
            },
        )
    }

    /// For an async key: how the configured policy is found once it is known.
    fn configured_policy_later(
        &self,
        parts: &Parts,
    ) -> Box<dyn FnOnce(Key) -> BoxFuture<Result<Policy, KeyError>> + Send> {
        match &self.policy {
            PolicySource::Static(p) => {
                let p = p.clone();
                Box::new(move |_| Box::pin(std::future::ready(Ok(p))))
            }
            PolicySource::Sync(f) => {
                let (f, head) = (f.clone(), clone_head(parts));
                Box::new(move |k| Box::pin(std::future::ready(Ok(f(&head, &k)))))
            }
            PolicySource::Async(f) => {
                let (f, head) = (f.clone(), clone_head(parts));
                Box::new(move |k| f(&head, k))
            }
        }
    }

    /// The whole path of one request to its verdict.
    pub(crate) fn decide(self: &Arc<Self>, parts: &Parts) -> Deciding {
        if let Some(o) = &self.overrides {
            o.start();
        }
        if let Some(skew) = &self.skew {
            skew.start();
        }
        let grpc = grpc::is_grpc(parts);
        // A gRPC call waits for its turn at most until its deadline.
        let deadline = if grpc { grpc::timeout_ms(parts) } else { None };
        let call = Call {
            grpc,
            deadline,
            weight: self.cost.as_ref().map_or(1, |f| f(parts)),
            units: 0,
        };
        let call = Call {
            units: self.reserve.as_ref().map_or(call.weight, |f| f(parts)),
            ..call
        };
        match self.resolve(parts) {
            Ok(resolution) => self.charge(resolution, call),
            Err(later) => {
                let this = self.clone();
                Later::pending(async move {
                    let resolution = later.await;
                    this.charge(resolution, call).value().await
                })
            }
        }
    }

    /// Makes the one store call of a request (or answers from the
    /// deny cache or the open breaker without one).
    fn charge(self: &Arc<Self>, resolution: Resolution, call: Call) -> Deciding {
        let (cost, grpc) = ((call.weight, call.units), call.grpc);
        let (key, policy) = match resolution {
            Resolution::Found(key, policy) => (key, policy),
            Resolution::Exempt => {
                self.metrics().exempt.increment(1);
                return Later::Now(Verdict::Forward(None));
            }
            Resolution::Failed(e) => {
                return Later::Now(Verdict::Answer(self.key_error(&e, grpc)));
            }
        };
        let now_ms = self.clock.now_ms();
        if let Some(observer) = &self.observer {
            observer.record(key, &policy, cost.0, now_ms);
        }
        if let Some(candidate) = self.overrides.as_ref().and_then(|o| o.shadow(&key)) {
            self.charge_shadow(key, candidate, cost, now_ms);
        }
        // A policy that waits may book a turn while this instance has room
        // among its waiters (never in shadow mode, which changes nothing
        // for the request); the seat is taken once the store has booked one
        // (see `turn`), so a request admitted at once holds none.
        let wait_ms = match policy.waits() {
            Some(w) if !self.shadow && self.waiters.has_room(w.max_waiting) => {
                call.deadline.map_or(w.max_ms(), |d| d.min(w.max_ms()))
            }
            _ => 0,
        };
        let asked = Asked {
            key,
            policy,
            cost: cost.0,
            units: cost.1,
            now_ms,
            grpc,
            wait_ms,
        };
        if let Some(denials) = &self.denials {
            if let Some(decision) =
                denials.check(&asked.key, &asked.policy, cost, self.clock.monotonic())
            {
                self.metrics().deny_cache_hits.increment(1);
                return self.verdict(asked, Source::Local, Ok(decision));
            }
        }
        // A store in this process cannot fail the way a network store
        // does: no breaker guards it.
        let permit = if self.local_store {
            None
        } else {
            let domain = self.store.failure_domain(&self.namespace, &asked.key);
            match self.guard.admit(domain, self.metrics()) {
                Ok(permit) => Some(permit),
                Err(open) => return self.verdict(asked, Source::Local, Err(open)),
            }
        };
        let charge = Charge {
            wait_ms: asked.wait_ms,
            ..self.call(&asked.key, &asked.policy, cost, now_ms)
        };
        let fut = match self.store.charge(&charge).into_ready() {
            Ok(result) => {
                return self.verdict(asked, Source::Store(permit, None), result);
            }
            Err(fut) => fut,
        };
        let this = self.clone();
        Later::pending(async move {
            let started = Instant::now();
            let result = failure::within(this.backstop, fut).await;
            // Not `.value().await`: a future of its own around the verdict
            // would copy it twice more (the instruction budget's Redis case).
            match this.verdict(asked, Source::Store(permit, Some(started)), result) {
                Later::Now(verdict) => verdict,
                Later::Pending(wait) => wait.await,
            }
        })
    }

    /// A request the store booked for a later turn takes a seat among the
    /// waiters and waits for it. Booked while
    /// the last seats went to others (charges answered together), it gives
    /// its turn back and is refused at once: a second store call, only when
    /// the waiters are full.
    fn wait_turn(self: &Arc<Self>, c: Charged, grpc: bool) -> Deciding {
        let max = c.policy.waits().map_or(0, |w| w.max_waiting);
        let Some(seat) = self.waiters.seat(max) else {
            return Later::Now(self.unseated(c, grpc));
        };
        self.metrics().allowed.increment(1);
        let wait = std::time::Duration::from_millis(c.decision.wait_ms());
        let waiting = self.metrics_wait();
        waiting.waiting.set(self.waiters.len() as f64);
        let this = self.clone();
        Later::pending(async move {
            let started = tokio::time::Instant::now();
            let limiter = this.clone();
            let give_back = move |mut c: Charged| {
                limiter.metrics_wait().cancelled.increment(1);
                limiter.give_back(&mut c);
            };
            match super::wait::hold(c, seat, wait, give_back).await {
                Some(mut c) => {
                    this.metrics_wait()
                        .waited
                        .record(started.elapsed().as_secs_f64());
                    c.went_on_after(wait);
                    Verdict::Forward(Some(c))
                }
                None => Verdict::Answer(problem::unavailable(
                    grpc,
                    1,
                    "the service is shutting down: this request's turn was given back",
                )),
            }
        })
    }

    /// A request booked for a turn with no seat left to wait in: its turn
    /// goes back, and it is refused as the booking's answer says.
    fn unseated(self: &Arc<Self>, mut c: Charged, grpc: bool) -> Verdict {
        let refused = c.decision.clone().into_unseated(c.cost);
        self.give_back(&mut c);
        let asked = Asked {
            key: c.key,
            policy: c.policy,
            cost: c.cost,
            units: c.units,
            now_ms: c.now_ms,
            grpc,
            wait_ms: 0,
        };
        // Not cached: the store would book the key's next request.
        self.reject(asked, refused, false)
    }

    /// Turns a charge's answer into what happens to the request. A rejection
    /// is built from this one answer only.
    #[inline]
    fn verdict(
        self: &Arc<Self>,
        asked: Asked,
        source: Source,
        result: Result<Decision, StoreError>,
    ) -> Deciding {
        let m = self.metrics();
        if let Source::Store(permit, started) = source {
            if let Some(t) = started {
                m.decide_duration.record(t.elapsed().as_secs_f64());
            }
            if let Some(permit) = permit {
                self.guard.record(permit, &result, m);
            }
        }
        match result {
            Ok(decision) if decision.is_allowed() && decision.wait_ms() > 0 => {
                // A booked turn counts once it has a seat.
                let grpc = asked.grpc;
                self.wait_turn(self.charged(asked, decision, ChargedTo::Store), grpc)
            }
            Ok(decision) if decision.is_allowed() => {
                m.allowed.increment(1);
                Later::Now(Verdict::Forward(Some(self.charged(
                    asked,
                    decision,
                    ChargedTo::Store,
                ))))
            }
            Ok(decision) => {
                // Only the store's own rejections are cached, not the deny
                // cache's (already there).
                let cache = matches!(source, Source::Store(..));
                Later::Now(self.reject(asked, decision, cache))
            }
            Err(err) => Later::Now(self.store_failed(asked, err)),
        }
    }

    fn charged(&self, asked: Asked, decision: Decision, to: ChargedTo) -> Charged {
        Charged {
            key: asked.key,
            policy: asked.policy,
            cost: asked.cost,
            units: asked.units,
            now_ms: asked.now_ms,
            decision,
            to,
            expose_status: self.status_extension,
            usage: self.usage_extension.then(Usage::default),
        }
    }

    fn reject(&self, asked: Asked, decision: Decision, cache: bool) -> Verdict {
        let m = self.metrics();
        let name = asked
            .policy
            .quotas()
            .get(decision.binding())
            .map(|q| q.name())
            .unwrap_or_default();
        if self.shadow {
            m.shadow_rejected.increment(1);
            self.guard.log.event(Log::Rejected, || {
                tracing::info!(limiter = %self.namespace.name(), policy = %name, "rate limit would reject (shadow mode: admitted)");
            });
            return Verdict::Forward(None);
        }
        m.rejected.increment(1);
        if let Some(until) = decision.blocked_until_ms() {
            let penalty = self.metrics_wait();
            if decision.reject_reason() == Some(RejectReason::Blocked) {
                penalty.blocked.increment(1);
            } else {
                penalty.blocks.increment(1);
                self.guard.log.event(Log::Blocked, || {
                    tracing::warn!(limiter = %self.namespace.name(), policy = %name, block_ms = until.saturating_sub(asked.now_ms), "a client refused too often was put in the penalty box");
                });
            }
        }
        if cache {
            if let Some(d) = &self.denials {
                d.insert(
                    asked.key,
                    (asked.cost, asked.units),
                    &decision,
                    &asked.policy,
                    asked.wait_ms,
                    self.clock.monotonic(),
                );
            }
        }
        self.guard.log.event(Log::Rejected, || {
            tracing::info!(limiter = %self.namespace.name(), policy = %name, "rate limit exceeded");
        });
        let rejection = Rejection {
            decision: &decision,
            policy_name: &name,
            policy: &asked.policy,
        };
        let mut res = if asked.grpc {
            let retry = rejection
                .retry_after_secs()
                .map(|_| decision.retry_after_ms().max(1));
            grpc::error(grpc::RESOURCE_EXHAUSTED, &rejection.detail(), retry)
        } else {
            (self.on_rejection)(&rejection)
        };
        headers::apply(
            self.headers,
            &asked.policy,
            &decision,
            asked.now_ms,
            res.headers_mut(),
        );
        Verdict::Answer(res)
    }

    fn store_failed(&self, asked: Asked, err: StoreError) -> Verdict {
        if let StoreError::Backlog { queued } = err {
            // This instance asks more of its store than it answers: its own
            // overload, never a reason to admit without limit.
            self.metrics().overloaded.increment(1);
            self.guard.log.event(Log::StoreError, || {
                tracing::warn!(limiter = %self.namespace.name(), queued, "rate limit charges queue faster than the store answers: refusing with 503 (add store connections, or shed load before the limiter)");
            });
            return Verdict::Answer(problem::unavailable_as(
                problem::TEMPORARY_REDUCED_CAPACITY,
                asked.grpc,
                1,
                "the rate limiter is overloaded: this instance has more charges waiting for its store than the store answers",
            ));
        }
        let unavailable = || {
            Verdict::Answer(problem::unavailable(
                asked.grpc,
                1,
                "the rate limiter cannot reach its store",
            ))
        };
        match self.guard.failed(&err, self.metrics()) {
            OnStoreError::FailOpen => Verdict::Forward(None),
            OnStoreError::FailClosed => unavailable(),
            OnStoreError::Local { fraction } => {
                let Some(local) = &self.fallback else {
                    return unavailable();
                };
                let policy = asked.policy.scaled(fraction);
                let decision = local
                    .charge(&self.call(
                        &asked.key,
                        &policy,
                        (asked.cost, asked.units),
                        asked.now_ms,
                    ))
                    .now_or_never();
                let asked = Asked { policy, ..asked };
                match decision {
                    Some(Ok(d)) if d.is_allowed() => {
                        Verdict::Forward(Some(self.charged(asked, d, ChargedTo::Local)))
                    }
                    // Decided without the store: never cached.
                    Some(Ok(d)) => self.reject(asked, d, false),
                    _ => unavailable(),
                }
            }
        }
    }

    fn key_error(&self, err: &KeyError, grpc: bool) -> Response<Bytes> {
        self.guard
            .key_error(err, grpc, &*self.on_key_error, self.metrics())
    }

    /// After the inner service answered: settle the charge now (everything
    /// back for a free response; quotas of other units to what the head
    /// says they cost), or hand back the settlement for the body to carry
    /// to its end when a later source may still say more (the trailers, the
    /// body's bytes, the handler's [`Usage`]): then the caller hands the
    /// charge to a `Settling` (`body.rs`). Writes the headers, showing the state
    /// settled so far.
    pub(crate) fn finish(
        self: &Arc<Self>,
        charged: &mut Charged,
        status: StatusCode,
        headers: &mut HeaderMap,
    ) -> Option<Deferred> {
        let free = (self.refund)(status, headers)
            && self
                .free
                .take(&charged.key, &charged.policy, charged.now_ms);
        let head = if free {
            None
        } else {
            self.settle.as_ref().and_then(|f| f(status, headers))
        };
        let later =
            !free && (self.settle_trailers.is_some() || self.body_bytes || charged.usage.is_some());
        if free {
            let zeros = vec![0; charged.policy.quotas().len()];
            self.settle_charge(charged, zeros);
        } else if !later && head.is_some() {
            // Settled now, to what the head says (without its word, the
            // reservation stands as charged: nothing to do).
            let owed = owed(
                charged,
                charged.usage.as_ref(),
                Known {
                    head,
                    ..Known::default()
                },
            );
            self.settle_charge(charged, owed);
        }
        // An admitted request's headers are the style's alone.
        if self.headers != HeaderStyle::None {
            headers::apply(
                self.headers,
                &charged.policy,
                &charged.decision,
                charged.now_ms,
                headers,
            );
        }
        later.then_some(Deferred { head })
    }

    /// Settles a charge when its response body ended (`complete`) or
    /// before that, as [`Dropped`] says.
    pub(crate) fn settle_end(self: &Arc<Self>, mut c: Charged, known: Known, complete: bool) {
        let owed = match (complete, self.dropped) {
            (true, _) | (false, Dropped::SoFar) => owed(&c, c.usage.as_ref(), known),
            // The configured cost is the only word: every unit quota pays it.
            (false, Dropped::Cost(n)) => owed(&c, None, Known::head(n)),
            (false, _) => return,
        };
        self.settle_charge(&mut c, owed);
    }

    /// Settles a charge to what it owes each quota, off the response path,
    /// and shows the settled state in its statuses.
    fn settle_charge(self: &Arc<Self>, c: &mut Charged, actual: Vec<u64>) {
        let store: &dyn Store = match (&self.fallback, c.to) {
            (Some(local), ChargedTo::Local) => local,
            _ => &*self.store,
        };
        let settle = Settle {
            charge: self.call(&c.key, &c.policy, (c.cost, c.units), c.now_ms),
            decision: &c.decision,
            actual,
            now_ms: self.clock.now_ms(),
        };
        if !settle.changes_anything() {
            return;
        }
        let settled: Vec<_> = settle
            .each()
            .zip(c.decision.statuses())
            .map(|((q, s), st)| crate::algorithm::settled_status(q, *st, s.reserved, s.actual))
            .collect();
        let fut = store.settle(&settle);
        for (s, new) in c.decision.statuses_mut().iter_mut().zip(settled) {
            *s = new;
        }
        let this = self.clone();
        if !failure::off_path(fut, self.backstop, move |result, started| {
            if let Err(err) = this.metrics().off_path_done(result, started) {
                this.guard.log.event(Log::StoreError, || {
                    tracing::warn!(limiter = %this.namespace.name(), error = %err, kind = err.kind(), "rate limit settlement failed; the charge stands");
                });
            }
        }) {
            tracing::warn!("no tokio runtime to run a settlement on; the charge stands");
        }
    }

    /// The caller's state without charging: the same key and policy the
    /// request path resolves, read from the store.
    pub(crate) async fn status(
        self: Arc<Self>,
        parts: Parts,
    ) -> Result<Option<Status>, StatusError> {
        if let Some(o) = &self.overrides {
            o.start();
        }
        let resolution = match self.resolve(&parts) {
            Ok(r) => r,
            Err(later) => later.await,
        };
        let (key, policy) = match resolution {
            Resolution::Found(key, policy) => (key, policy),
            Resolution::Exempt => return Ok(None),
            Resolution::Failed(e) => return Err(StatusError::Key(e)),
        };
        let now_ms = self.clock.now_ms();
        let decision = failure::within(
            self.backstop,
            self.store.status(&self.call(&key, &policy, (0, 0), now_ms)),
        )
        .await
        .map_err(StatusError::Store)?;
        Ok(Some(Status {
            policy,
            decision,
            now_ms,
        }))
    }
}

/// What a charge owes each quota given what is known: a quota counting
/// requests its cost; a quota of another unit the first that is known of
/// the handler's word for that unit, the body's bytes (`content-bytes`,
/// when counted), the trailers, the head, the handler's word for every
/// unit; else its reservation.
fn owed(c: &Charged, usage: Option<&Usage>, known: Known) -> Vec<u64> {
    c.policy
        .quotas()
        .iter()
        .map(|q| {
            if q.counts_requests() {
                return c.cost;
            }
            let (own, every) = usage.map_or((None, None), |u| u.said(q));
            let bytes = known.bytes.filter(|_| q.unit() == "content-bytes");
            own.or(bytes)
                .or(known.trailers)
                .or(known.head)
                .or(every)
                .unwrap_or(c.units)
        })
        .collect()
}

/// Copies a request head (without extensions that cannot be cloned) for an async policy lookup.
pub(crate) fn clone_head(parts: &Parts) -> Parts {
    let mut b = http::Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version);
    if let Some(h) = b.headers_mut() {
        *h = parts.headers.clone();
    }
    let (mut p, ()) = b
        .body(())
        .map(|r| r.into_parts())
        .unwrap_or_else(|_| http::Request::new(()).into_parts());
    p.extensions = parts.extensions.clone();
    p
}

/// A caller's rate-limit state: read without charging
/// ([`RateLimitLayer::status`](crate::RateLimitLayer::status)), or as its
/// request was charged, in the request's extensions
/// ([`status_extension`](crate::RateLimitLayerBuilder::status_extension)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Status {
    /// The policy that applies to the caller.
    pub policy: Policy,
    /// Every quota's state.
    pub decision: Decision,
    /// The time the state was read at (Unix ms).
    pub now_ms: u64,
}

/// Why [`RateLimitLayer::status`](crate::RateLimitLayer::status) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The caller's key could not be extracted.
    #[error(transparent)]
    Key(KeyError),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}
