//! [`ResponseFuture`]: one request's path through the limiter.

use crate::body::{BodyMode, WrapBody};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::{Key, KeyError};
use crate::limiter::{
    BoxFuture, Charged, Charging, KeySource, Limiter, Pending, PolicySource, RequestPolicy, Verdict,
};
use crate::quota::Policy;
use crate::store::Wait;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_service::Service;

/// A request waiting for its decision, with the ready inner service that will serve it.
struct Waiting<S, B> {
    service: S,
    parts: Parts,
    body: B,
}

impl<S, B> Waiting<S, B>
where
    S: Service<Request<B>>,
{
    /// Keeps the request and the ready inner service until the decision
    /// arrives: the ready service goes with this request, and the layer's
    /// `service` gets a fresh clone.
    fn keep(service: &mut S, parts: Parts, body: B) -> Self
    where
        S: Clone,
    {
        let clone = service.clone();
        Waiting {
            service: std::mem::replace(service, clone),
            parts,
            body,
        }
    }

    /// Hands the request to the inner service.
    fn forward(self) -> S::Future {
        let Waiting {
            mut service,
            parts,
            body,
        } = self;
        service.call(Request::from_parts(parts, body))
    }
}

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit); `M` is its
    /// [`BodyMode`].
    pub struct ResponseFuture<S, B, M = WrapBody>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, S::Future>,
        charged: Option<Charged>,
        limiter: Arc<Limiter>,
        body: PhantomData<fn() -> M>,
    }
}

pin_project! {
    // What only waiting needs (the request, the ready service, the charge's
    // inputs) lives in the waiting states, where the inner service's future
    // would be: the two never exist at once, so the future, which is moved
    // and boxed on every request, is as large as the larger of them, not
    // their sum.
    #[project = StateProj]
    enum State<S, B, F> {
        // Async key or policy lookup (only for users of `key_async`/`policy_async`).
        Resolving {
            fut: BoxFuture<Result<Option<(Key, Policy)>, KeyError>>,
            waiting: Option<Waiting<S, B>>,
        },
        // The store call is in flight.
        Charging {
            #[pin]
            fut: Wait<Result<Decision, StoreError>>,
            waiting: Option<Waiting<S, B>>,
            pending: Option<Pending>,
        },
        // The inner service is answering.
        Inner { #[pin] fut: F },
        // The limiter answered; the inner service was not called.
        Answered { res: Option<Response<Bytes>> },
    }
}

impl<S, B, M, ResBody> ResponseFuture<S, B, M>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    pub(crate) fn start(service: &mut S, limiter: &Arc<Limiter>, req: Request<B>) -> Self {
        let mut this = ResponseFuture {
            state: State::Answered { res: None },
            charged: None,
            limiter: limiter.clone(),
            body: PhantomData,
        };
        // Built in place: every step below writes into `this` through `&mut`,
        // so the (large) future is never moved between steps.
        this.begin(service, limiter, req);
        this
    }

    fn begin(&mut self, service: &mut S, limiter: &Limiter, req: Request<B>) {
        let (parts, body) = req.into_parts();
        let key = match &limiter.key {
            KeySource::Sync(k) => k.extract(&parts),
            KeySource::Async(f) => {
                let fut = f(&parts);
                let policy = resolve_later(&self.limiter, &parts);
                self.state = State::Resolving {
                    fut: Box::pin(async move {
                        match fut.await? {
                            Some(key) => Ok(Some((key, policy(key).await?))),
                            None => Ok(None),
                        }
                    }),
                    waiting: Some(Waiting::keep(service, parts, body)),
                };
                return;
            }
        };
        let key = match key {
            Ok(Some(key)) => key,
            Ok(None) => {
                limiter.exempt();
                return self.forward_now(service, parts, body);
            }
            Err(e) => {
                let res = limiter.key_error(&e, crate::grpc::is_grpc(&parts));
                return self.answer(res);
            }
        };
        match &limiter.policy {
            PolicySource::Static(_) => {
                self.charge(service, limiter, parts, body, key, RequestPolicy::Layer)
            }
            PolicySource::Sync(f) => {
                let p = RequestPolicy::Own(f(&parts, &key));
                self.charge(service, limiter, parts, body, key, p)
            }
            PolicySource::Async(f) => {
                let fut = f(&parts, key);
                self.state = State::Resolving {
                    fut: Box::pin(async move { Ok(Some((key, fut.await?))) }),
                    waiting: Some(Waiting::keep(service, parts, body)),
                };
            }
        }
    }

    fn charge(
        &mut self,
        service: &mut S,
        limiter: &Limiter,
        parts: Parts,
        body: B,
        key: Key,
        policy: RequestPolicy,
    ) {
        let cost = limiter.cost(&parts);
        let now = limiter.clock.now_ms();
        match limiter.charge(key, policy, cost, now, &parts, &mut self.charged) {
            // The memory store (or the deny cache) answers at once: decided without another poll.
            Charging::Decided(Verdict::Forward) => self.forward_now(service, parts, body),
            Charging::Decided(Verdict::Answer(res)) => self.answer(res),
            Charging::InFlight(fut, pending) => {
                self.state = State::Charging {
                    fut,
                    waiting: Some(Waiting::keep(service, parts, body)),
                    pending: Some(pending),
                };
            }
        }
    }

    fn forward_now(&mut self, service: &mut S, parts: Parts, body: B) {
        self.state = State::Inner {
            fut: service.call(Request::from_parts(parts, body)),
        };
    }

    fn answer(&mut self, res: Response<Bytes>) {
        self.state = State::Answered { res: Some(res) };
    }
}

/// For `key_async`: resolves the policy once the key is known.
fn resolve_later(
    limiter: &Arc<Limiter>,
    parts: &Parts,
) -> impl FnOnce(Key) -> BoxFuture<Result<Policy, KeyError>> {
    let ready =
        |p: Policy| -> BoxFuture<Result<Policy, KeyError>> { Box::pin(std::future::ready(Ok(p))) };
    let source: Box<dyn FnOnce(Key) -> BoxFuture<Result<Policy, KeyError>> + Send> =
        match &limiter.policy {
            PolicySource::Static(p) => {
                let p = p.clone();
                Box::new(move |_| ready(p))
            }
            PolicySource::Sync(f) => {
                let f = f.clone();
                let head = crate::layer::clone_head(parts);
                Box::new(move |k| ready(f(&head, &k)))
            }
            PolicySource::Async(f) => {
                let f = f.clone();
                let head = crate::layer::clone_head(parts);
                Box::new(move |k| f(&head, k))
            }
        };
    source
}

impl<S, B, M, ResBody> Future for ResponseFuture<S, B, M>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    M: BodyMode<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Resolving { fut, waiting } => {
                    let resolved = ready!(fut.as_mut().poll(cx));
                    let waiting = waiting.take().expect("request kept while resolving");
                    match resolved {
                        Ok(Some((key, policy))) => {
                            let cost = this.limiter.cost(&waiting.parts);
                            let now = this.limiter.clock.now_ms();
                            let policy = RequestPolicy::Own(policy);
                            match this.limiter.charge(
                                key,
                                policy,
                                cost,
                                now,
                                &waiting.parts,
                                this.charged,
                            ) {
                                Charging::Decided(Verdict::Forward) => {
                                    this.state.set(State::Inner {
                                        fut: waiting.forward(),
                                    });
                                }
                                Charging::Decided(Verdict::Answer(res)) => {
                                    this.state.set(State::Answered { res: Some(res) });
                                }
                                Charging::InFlight(fut, pending) => {
                                    this.state.set(State::Charging {
                                        fut,
                                        waiting: Some(waiting),
                                        pending: Some(pending),
                                    });
                                }
                            }
                        }
                        Ok(None) => {
                            this.limiter.exempt();
                            this.state.set(State::Inner {
                                fut: waiting.forward(),
                            });
                        }
                        Err(e) => {
                            let res = this
                                .limiter
                                .key_error(&e, crate::grpc::is_grpc(&waiting.parts));
                            this.state.set(State::Answered { res: Some(res) });
                        }
                    }
                }
                StateProj::Charging {
                    fut,
                    waiting,
                    pending,
                } => {
                    let result = ready!(fut.poll(cx));
                    let pending = pending.take().expect("charge inputs kept");
                    let parts = &waiting.as_ref().expect("request kept while charging").parts;
                    match this.limiter.verdict(parts, pending, result, this.charged) {
                        Verdict::Forward => {
                            let waiting = waiting.take().expect("request kept while charging");
                            this.state.set(State::Inner {
                                fut: waiting.forward(),
                            });
                        }
                        Verdict::Answer(res) => this.state.set(State::Answered { res: Some(res) }),
                    }
                }
                StateProj::Inner { fut } => {
                    let res = ready!(fut.poll(cx))?;
                    let (mut head, body) = res.into_parts();
                    if let Some(charged) = this.charged.take() {
                        this.limiter.finish(charged, head.status, &mut head.headers);
                    }
                    return Poll::Ready(Ok(Response::from_parts(head, M::inner(body))));
                }
                StateProj::Answered { res } => {
                    let res = res.take().expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(res.map(M::limiter)));
                }
            }
        }
    }
}

impl<S, B, M> fmt::Debug for ResponseFuture<S, B, M>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
