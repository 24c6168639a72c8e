//! The limiter every clone of a layer shares: configuration, store and clock behind one `Arc`.

use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::headers::{self, HeaderStyle};
use crate::key::{Key, KeyError, KeyExtractor};
use crate::quota::Policy;
use crate::response::{self, Rejection};
use crate::store::{Charge, Namespace, Refund, Store, StoreFuture};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// What the layer does when the store cannot answer (error, timeout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admit the request, without rate-limit headers (the default: the limiter is
    /// never less available than what it protects).
    #[default]
    FailOpen,
    /// Answer 503 with `Retry-After` without calling the inner service.
    FailClosed,
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
    pub(crate) log: LogThrottle,
}

/// What the request was charged: enough to add headers and to refund.
#[derive(Debug)]
pub(crate) struct Charged {
    pub(crate) key: Key,
    pub(crate) policy: Policy,
    pub(crate) cost: u64,
    pub(crate) now_ms: u64,
    pub(crate) decision: Decision,
}

/// What to do with a request once its key and policy are known and charged.
pub(crate) enum Verdict {
    /// Call the inner service; add headers from `Charged` (if any) to its response.
    Forward(Option<Charged>),
    /// Answer with this response; the inner service is not called.
    Answer(Response<Bytes>),
}

impl Limiter {
    pub(crate) fn cost(&self, parts: &Parts) -> u64 {
        self.cost.as_ref().map_or(1, |f| f(parts))
    }

    pub(crate) fn charge(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
        now_ms: u64,
    ) -> StoreFuture<Result<Decision, StoreError>> {
        self.store.charge(&Charge {
            namespace: &self.namespace,
            key,
            policy,
            cost,
            now_ms,
            timeout: self.store_timeout,
        })
    }

    /// Turns a store answer into what happens next; the rejection is built from
    /// this one answer only.
    pub(crate) fn verdict(
        &self,
        key: Key,
        policy: Policy,
        cost: u64,
        now_ms: u64,
        result: Result<Decision, StoreError>,
    ) -> Verdict {
        match result {
            Ok(decision) if decision.is_allowed() => Verdict::Forward(Some(Charged {
                key,
                policy,
                cost,
                now_ms,
                decision,
            })),
            Ok(decision) => {
                let binding = decision.binding();
                let name = policy
                    .quotas()
                    .get(binding)
                    .map(|q| q.name())
                    .unwrap_or_default();
                self.log.event(&self.log.rejected, || {
                    tracing::info!(limiter = self.namespace.name(), policy = %name, "rate limit exceeded");
                });
                let mut res = (self.on_rejection)(&Rejection {
                    decision: &decision,
                    policy_name: &name,
                });
                headers::apply(self.headers, &policy, &decision, now_ms, res.headers_mut());
                Verdict::Answer(res)
            }
            Err(StoreError::Full { retry_at_ms, .. }) => {
                self.log.event(&self.log.store_error, || {
                    tracing::warn!(
                        limiter = self.namespace.name(),
                        "memory store is at its key cap; new keys are refused (503)"
                    );
                });
                let wait = headers::ceil_secs(retry_at_ms.saturating_sub(now_ms));
                Verdict::Answer(response::unavailable(
                    wait,
                    "the rate limiter is tracking its maximum number of clients",
                ))
            }
            Err(err) => {
                self.log.event(&self.log.store_error, || {
                    tracing::error!(limiter = self.namespace.name(), error = %err, kind = err.kind(), policy = ?self.on_store_error, "rate limit store failed");
                });
                match self.on_store_error {
                    OnStoreError::FailOpen => Verdict::Forward(None),
                    OnStoreError::FailClosed => Verdict::Answer(response::unavailable(
                        1,
                        "the rate limiter cannot reach its store",
                    )),
                }
            }
        }
    }

    pub(crate) fn key_error(&self, err: &KeyError) -> Response<Bytes> {
        self.log.event(&self.log.key_error, || {
            tracing::error!(limiter = self.namespace.name(), error = %err, "rate limit key extraction failed");
        });
        (self.on_key_error)(err)
    }

    /// After the inner service answered: refund if the response is free, then
    /// write the headers (showing the refunded remaining).
    pub(crate) fn finish(&self, mut charged: Charged, status: StatusCode, headers: &mut HeaderMap) {
        if (self.refund)(status, headers) {
            self.spawn_refund(&charged);
            for s in charged.decision.statuses_mut() {
                *s = crate::algorithm::refunded_status(*s, charged.cost);
            }
        }
        headers::apply(
            self.headers,
            &charged.policy,
            &charged.decision,
            charged.now_ms,
            headers,
        );
    }

    fn spawn_refund(&self, c: &Charged) {
        let mut fut = self.store.refund(&Refund {
            charge: Charge {
                namespace: &self.namespace,
                key: &c.key,
                policy: &c.policy,
                cost: c.cost,
                now_ms: c.now_ms,
                timeout: self.store_timeout,
            },
            decision: &c.decision,
        });
        let failed = |err: StoreError| {
            tracing::warn!(error = %err, kind = err.kind(), "rate limit refund failed; the charge stands");
        };
        match fut.now_or_never() {
            Some(Ok(())) => {}
            Some(Err(e)) => failed(e),
            None => match tokio::runtime::Handle::try_current() {
                // Off the response path: the client never waits for a refund.
                Ok(rt) => {
                    rt.spawn(async move {
                        if let Err(e) = fut.await {
                            failed(e);
                        }
                    });
                }
                Err(_) => tracing::warn!("no tokio runtime to run a refund on; the charge stands"),
            },
        }
    }
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
