//! The limiter every clone of a layer shares: configuration, store, clock,
//! breaker, deny cache and metrics behind one `Arc`.

use crate::breaker::{Admit, BreakerState, Breakers};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::deny_cache::Denials;
use crate::error::StoreError;
use crate::grpc;
use crate::headers::{self, HeaderStyle};
use crate::key::{Key, KeyError, KeyExtractor};
use crate::metrics::Metrics;
use crate::quota::Policy;
use crate::response::{self, Rejection};
use crate::store::{Charge, Inner, MemoryStore, Namespace, Refund, Store, StoreFuture, Wait};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
pub(crate) type AsyncKeyFn =
    dyn Fn(&Parts) -> BoxFuture<Result<Option<Key>, KeyError>> + Send + Sync;
pub(crate) type PolicyFn = dyn Fn(&Parts, &Key) -> Policy + Send + Sync;
pub(crate) type AsyncPolicyFn =
    dyn Fn(&Parts, Key) -> BoxFuture<Result<Policy, KeyError>> + Send + Sync;
pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
pub(crate) type RefundFn = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;
pub(crate) type RejectionFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type KeyErrorFn = dyn Fn(&KeyError) -> Response<Bytes> + Send + Sync;

/// What the layer does when the store cannot answer (error, timeout, open breaker).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admit the request, without rate-limit headers (the default: the limiter
    /// is never less available than what it protects).
    #[default]
    FailOpen,
    /// Answer 503 with `Retry-After` without calling the inner service.
    FailClosed,
    /// Limit locally, in this process's memory, to `fraction` of each quota
    /// (e.g. `1.0 / expected_instances`) until the store answers again.
    Local {
        /// Share of each quota's limit this instance admits on its own (0 < fraction ≤ 1).
        fraction: f64,
    },
}

impl OnStoreError {
    pub(crate) fn label(self) -> &'static str {
        match self {
            OnStoreError::FailOpen => "open",
            OnStoreError::FailClosed => "closed",
            OnStoreError::Local { .. } => "local",
        }
    }
}

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
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) key: KeySource,
    pub(crate) policy: PolicySource,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) headers: HeaderStyle,
    pub(crate) refund: Arc<RefundFn>,
    pub(crate) on_rejection: Arc<RejectionFn>,
    pub(crate) on_key_error: Arc<KeyErrorFn>,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) store_timeout: Duration,
    pub(crate) shadow: bool,
    pub(crate) breakers: Breakers,
    pub(crate) denials: Option<Denials>,
    /// The in-process store used by [`OnStoreError::Local`].
    pub(crate) fallback: Option<MemoryStore>,
    pub(crate) log: LogThrottle,
    pub(crate) metrics: OnceLock<Metrics>,
    /// The coordinated mode, when configured: decisions without store calls.
    #[cfg(feature = "redis")]
    pub(crate) coordinator: Option<Arc<crate::coordinated::Coordinator>>,
}

/// The policy a request is charged under. The layer's static policy is
/// named, not cloned: no per-request reference count on a policy that every
/// request (on every core) shares.
#[derive(Debug)]
pub(crate) enum RequestPolicy {
    /// The layer's [`PolicySource::Static`] policy.
    Layer,
    /// One resolved for this request (a policy function, the deny cache, the
    /// local fallback's scaled copy).
    Own(Policy),
}

/// Where a charge's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The store; `started` is set when the call had to wait (network stores).
    Store { started: Option<Instant> },
    /// The local deny cache.
    DenyCache,
    /// The open circuit breaker (the store was not called).
    Breaker,
    /// The coordinated mode's local drop ratio (no store call).
    Coordinated,
}

/// A charge in flight, with what is needed to act on its answer.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) key: Key,
    pub(crate) policy: RequestPolicy,
    pub(crate) cost: u64,
    pub(crate) now_ms: u64,
    pub(crate) source: Source,
    /// The store's failure domain for the key (which breaker the answer counts for).
    pub(crate) domain: usize,
}

/// What the request was charged: enough to add headers and to refund.
#[derive(Debug)]
pub(crate) struct Charged {
    key: Key,
    policy: RequestPolicy,
    cost: u64,
    now_ms: u64,
    decision: Decision,
    /// Where the charge went, so a refund goes to the same place.
    to: ChargedTo,
}

/// Where a request was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChargedTo {
    /// The configured store.
    Store,
    /// The in-process fallback store ([`OnStoreError::Local`]).
    Local,
    /// Nowhere that takes refunds (the coordinated mode counts offered load).
    Nowhere,
}

/// Where a request stands after [`Limiter::charge`].
pub(crate) enum Charging {
    /// The answer was there at once and is decided.
    Decided(Verdict),
    /// The store call is in flight; [`Limiter::verdict`] takes its answer.
    /// Only the running call is kept: the request's future holds it while it
    /// waits, and a [`StoreFuture`] (room for a `Decision`) would make that
    /// future larger for every request. (The Redis store's reply and its
    /// deadline do make it larger, by about a tokio `Sleep`: that costs less
    /// than the boxed future around them did.)
    InFlight(Wait<Result<Decision, StoreError>>, Pending),
}

/// What to do with a request once its key and policy are known and charged.
pub(crate) enum Verdict {
    /// Call the inner service; add headers from the `Charged` written to the
    /// caller's slot (if any) to its response.
    Forward,
    /// Answer with this response; the inner service is not called.
    Answer(Response<Bytes>),
}

impl Limiter {
    pub(crate) fn metrics(&self) -> &Metrics {
        self.metrics
            .get_or_init(|| Metrics::new(self.namespace.name()))
    }

    /// The policy `p` names.
    pub(crate) fn policy_of<'a>(&'a self, p: &'a RequestPolicy) -> &'a Policy {
        match (p, &self.policy) {
            (RequestPolicy::Own(p), _) => p,
            (RequestPolicy::Layer, PolicySource::Static(p)) => p,
            (RequestPolicy::Layer, _) => {
                unreachable!("RequestPolicy::Layer is made only for a static policy")
            }
        }
    }

    pub(crate) fn cost(&self, parts: &Parts) -> u64 {
        self.cost.as_ref().map_or(1, |f| f(parts))
    }

    fn call<'a>(&'a self, key: &'a Key, policy: &'a Policy, cost: u64, now_ms: u64) -> Charge<'a> {
        Charge {
            namespace: &self.namespace,
            key,
            policy,
            cost,
            now_ms,
            timeout: self.store_timeout,
        }
    }

    /// Makes the one store call of a request (or answers from the deny cache,
    /// or from the open breaker, without calling the store). An answer that is
    /// there at once (the memory store's) is decided here, with no future to
    /// poll: what an admitted request was charged goes to `charged`.
    pub(crate) fn charge(
        &self,
        key: Key,
        policy: RequestPolicy,
        cost: u64,
        now_ms: u64,
        parts: &Parts,
        charged: &mut Option<Charged>,
    ) -> Charging {
        let pending = |policy, source, domain| Pending {
            key,
            policy,
            cost,
            now_ms,
            source,
            domain,
        };
        #[cfg(feature = "redis")]
        if let Some(c) = &self.coordinator {
            let decision = c.decide(&key, self.policy_of(&policy), cost, now_ms);
            let p = pending(policy, Source::Coordinated, 0);
            return Charging::Decided(self.verdict(parts, p, Ok(decision), charged));
        }
        if let Some(denials) = &self.denials {
            if let Some((decision, policy)) = denials.check(&key, cost, now_ms) {
                let p = Pending {
                    key,
                    policy: RequestPolicy::Own(policy),
                    cost,
                    now_ms,
                    source: Source::DenyCache,
                    domain: 0,
                };
                return Charging::Decided(self.verdict(parts, p, Ok(decision), charged));
            }
        }
        let domain = (*self.store).failure_domain(&self.namespace, &key);
        match self.breakers.get(domain).admit(now_ms) {
            Admit::Call => {}
            Admit::Probe => self
                .metrics()
                .breaker_state
                .set(BreakerState::HalfOpen as u8 as f64),
            Admit::Reject => {
                let p = pending(policy, Source::Breaker, domain);
                let err = Err(StoreError::CircuitOpen);
                return Charging::Decided(self.verdict(parts, p, err, charged));
            }
        }
        // Called on the `dyn Store` itself, not through `Arc`'s forwarding
        // impl, so the answer is written straight into `fut`.
        let store: &dyn Store = &*self.store;
        let fut = store.charge(&self.call(&key, self.policy_of(&policy), cost, now_ms));
        match fut.inner {
            // Moved out by value: the answer is not copied out of an Option first.
            Inner::Ready {
                value: Some(result),
            } => {
                let p = pending(policy, Source::Store { started: None }, domain);
                Charging::Decided(self.verdict(parts, p, result, charged))
            }
            // A store that hands back a spent future is answered like one that
            // failed, not with a panic.
            Inner::Ready { value: None } => {
                let p = pending(policy, Source::Store { started: None }, domain);
                let err =
                    StoreError::Protocol("the store returned an already completed future".into());
                Charging::Decided(self.verdict(parts, p, Err(err), charged))
            }
            // Only a call that has to wait is timed.
            Inner::Waiting { wait } => {
                let started = Some(Instant::now());
                Charging::InFlight(wait, pending(policy, Source::Store { started }, domain))
            }
        }
    }

    /// Turns a store answer into what happens next; the rejection is built from
    /// this one answer only. What an admitted request was charged goes to
    /// `charged` (written in place: it is large, and this is the hot path).
    /// `parts`, the request's head, says how to answer (gRPC or HTTP): only
    /// looked at when answering, not on every admitted request.
    pub(crate) fn verdict(
        &self,
        parts: &Parts,
        p: Pending,
        result: Result<Decision, StoreError>,
        charged: &mut Option<Charged>,
    ) -> Verdict {
        let m = self.metrics();
        if let Source::Store { started } = p.source {
            if let Some(t) = started {
                m.decide_duration.record(t.elapsed().as_secs_f64());
            }
            match &result {
                Ok(_) => {
                    if self.breakers.get(p.domain).success() {
                        if !self.breakers.any_open() {
                            m.breaker_state.set(BreakerState::Closed as u8 as f64);
                        }
                        tracing::info!(
                            limiter = self.namespace.name(),
                            domain = p.domain,
                            "rate limit store answers again; circuit closed"
                        );
                    }
                }
                Err(StoreError::Full { .. }) => {}
                Err(_) => {
                    if self.breakers.get(p.domain).failure(p.now_ms) {
                        m.breaker_state.set(BreakerState::Open as u8 as f64);
                        tracing::warn!(
                            limiter = self.namespace.name(),
                            domain = p.domain,
                            "rate limit store keeps failing; circuit opened"
                        );
                    }
                }
            }
        }
        match result {
            Ok(decision) if decision.is_allowed() => {
                m.allowed.increment(1);
                *charged = Some(Charged {
                    key: p.key,
                    policy: p.policy,
                    cost: p.cost,
                    now_ms: p.now_ms,
                    decision,
                    to: if p.source == Source::Coordinated {
                        ChargedTo::Nowhere
                    } else {
                        ChargedTo::Store
                    },
                });
                Verdict::Forward
            }
            Ok(decision) => self.reject(parts, p, decision),
            Err(StoreError::Full { retry_at_ms, .. }) => {
                self.log.event(&self.log.store_error, || {
                    tracing::warn!(
                        limiter = self.namespace.name(),
                        "memory store is at its key cap; new keys are refused (503)"
                    );
                });
                m.store_error("full");
                let wait = headers::ceil_secs(retry_at_ms.saturating_sub(p.now_ms));
                Verdict::Answer(response::unavailable(
                    grpc::is_grpc(parts),
                    wait,
                    "the rate limiter is tracking its maximum number of clients",
                ))
            }
            Err(err) => self.store_failed(parts, p, err, charged),
        }
    }

    fn reject(&self, parts: &Parts, p: Pending, decision: Decision) -> Verdict {
        let m = self.metrics();
        let policy = self.policy_of(&p.policy);
        let name = policy
            .quotas()
            .get(decision.binding())
            .map(|q| q.name())
            .unwrap_or_default();
        if self.shadow {
            m.shadow_rejected.increment(1);
            self.log.event(&self.log.rejected, || {
                tracing::info!(limiter = self.namespace.name(), policy = %name, "rate limit would reject (shadow mode: admitted)");
            });
            return Verdict::Forward;
        }
        m.rejected.increment(1);
        match p.source {
            Source::DenyCache => m.deny_cache_hits.increment(1),
            // A random drop: the next request may pass, nothing to cache.
            Source::Coordinated => {}
            _ => {
                if let Some(d) = &self.denials {
                    d.insert(p.key, p.cost, p.now_ms, &decision, policy);
                }
            }
        }
        self.log.event(&self.log.rejected, || {
            tracing::info!(limiter = self.namespace.name(), policy = %name, "rate limit exceeded");
        });
        let rejection = Rejection {
            decision: &decision,
            policy_name: &name,
        };
        let mut res = if grpc::is_grpc(parts) {
            let retry = rejection
                .retry_after_secs()
                .map(|_| decision.retry_after_ms().max(1));
            grpc::error(grpc::RESOURCE_EXHAUSTED, &rejection.detail(), retry)
        } else {
            (self.on_rejection)(&rejection)
        };
        headers::apply(self.headers, policy, &decision, p.now_ms, res.headers_mut());
        Verdict::Answer(res)
    }

    fn store_failed(
        &self,
        parts: &Parts,
        p: Pending,
        err: StoreError,
        charged: &mut Option<Charged>,
    ) -> Verdict {
        let m = self.metrics();
        m.store_error(err.kind());
        let policy = self.on_store_error;
        self.log.event(&self.log.store_error, || {
            tracing::error!(limiter = self.namespace.name(), error = %err, kind = err.kind(), on_store_error = policy.label(), "rate limit store failed");
        });
        match policy {
            OnStoreError::FailOpen => {
                m.fail_open.increment(1);
                Verdict::Forward
            }
            OnStoreError::FailClosed => {
                m.fail_closed.increment(1);
                Verdict::Answer(response::unavailable(
                    grpc::is_grpc(parts),
                    1,
                    "the rate limiter cannot reach its store",
                ))
            }
            OnStoreError::Local { fraction } => {
                m.fail_local.increment(1);
                let local = self
                    .fallback
                    .as_ref()
                    .expect("a local fallback store is built with OnStoreError::Local");
                let policy = self.policy_of(&p.policy).scaled(fraction);
                let result = local
                    .charge(&self.call(&p.key, &policy, p.cost, p.now_ms))
                    .now_or_never()
                    .expect("the memory store answers at once");
                let p = Pending {
                    policy: RequestPolicy::Own(policy),
                    source: Source::Breaker,
                    ..p
                };
                match result {
                    Ok(decision) if decision.is_allowed() => {
                        *charged = Some(Charged {
                            key: p.key,
                            policy: p.policy,
                            cost: p.cost,
                            now_ms: p.now_ms,
                            decision,
                            to: ChargedTo::Local,
                        });
                        Verdict::Forward
                    }
                    Ok(decision) => self.reject(parts, p, decision),
                    Err(_) => Verdict::Answer(response::unavailable(
                        grpc::is_grpc(parts),
                        1,
                        "the rate limiter cannot reach its store",
                    )),
                }
            }
        }
    }

    pub(crate) fn exempt(&self) {
        self.metrics().exempt.increment(1);
    }

    pub(crate) fn key_error(&self, err: &KeyError, grpc: bool) -> Response<Bytes> {
        self.metrics().key_error.increment(1);
        self.log.event(&self.log.key_error, || {
            tracing::error!(limiter = self.namespace.name(), error = %err, "rate limit key extraction failed");
        });
        if grpc {
            return grpc::error(grpc::INTERNAL, &err.to_string(), None);
        }
        (self.on_key_error)(err)
    }

    /// After the inner service answered: refund if the response is free, then
    /// write the headers (showing the refunded remaining).
    pub(crate) fn finish(
        self: &Arc<Self>,
        mut charged: Charged,
        status: StatusCode,
        headers: &mut HeaderMap,
    ) {
        // A zero cost spent nothing: there is nothing to give back.
        if charged.cost > 0 && (self.refund)(status, headers) {
            self.spawn_refund(&charged);
            for s in charged.decision.statuses_mut() {
                *s = crate::algorithm::refunded_status(*s, charged.cost);
            }
        }
        headers::apply(
            self.headers,
            self.policy_of(&charged.policy),
            &charged.decision,
            charged.now_ms,
            headers,
        );
    }

    fn spawn_refund(self: &Arc<Self>, c: &Charged) {
        let store: &dyn Store = match (&self.fallback, c.to) {
            (_, ChargedTo::Nowhere) => return,
            (Some(local), ChargedTo::Local) => local,
            _ => &*self.store,
        };
        let this = self.clone();
        if !run_off_path(
            store.refund(&Refund {
                charge: self.call(&c.key, self.policy_of(&c.policy), c.cost, c.now_ms),
                decision: &c.decision,
            }),
            move |result, started| this.refunded(result, started),
        ) {
            tracing::warn!("no tokio runtime to run a refund on; the charge stands");
        }
    }

    fn refunded(&self, result: Result<(), StoreError>, started: Option<Instant>) {
        if let Err(err) = self.metrics().off_path_done(result, started) {
            self.log.event(&self.log.store_error, || {
                tracing::warn!(limiter = self.namespace.name(), error = %err, kind = err.kind(), "rate limit refund failed; the charge stands");
            });
        }
    }
}

/// Runs a store call no request waits for (a refund, a slot release): at once
/// when the store answered synchronously, else spawned on the tokio runtime,
/// off the response path (and safe while unwinding from a panic). `done` gets
/// the result and, when the call had to wait, when it started. Returns `false`
/// (and drops `done` uncalled) when there is no runtime to run it on.
pub(crate) fn run_off_path(
    mut fut: StoreFuture<Result<(), StoreError>>,
    done: impl FnOnce(Result<(), StoreError>, Option<Instant>) + Send + 'static,
) -> bool {
    if let Some(result) = fut.now_or_never() {
        done(result, None);
        return true;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    let started = Instant::now();
    rt.spawn(async move { done(fut.await, Some(started)) });
    true
}

/// Limits log lines to one per second per kind, so a flood is one line, not millions.
#[derive(Default)]
pub(crate) struct LogThrottle {
    pub(crate) rejected: AtomicU64,
    pub(crate) key_error: AtomicU64,
    pub(crate) store_error: AtomicU64,
}

impl LogThrottle {
    pub(crate) fn event(&self, last: &AtomicU64, log: impl FnOnce()) {
        let now = crate::clock::SystemClock.now_ms_coarse();
        let prev = last.load(Ordering::Relaxed);
        if now >= prev + 1_000
            && last
                .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log();
        }
    }
}
