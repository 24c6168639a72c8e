//! [`ResponseFuture`]: one request's path through the concurrency limiter.

use super::body::ResponseBody;
use super::limiter::{Begin, Limiter, Slot};
use super::store::Occupancy;
use crate::error::StoreError;
use crate::guarded_body::GuardedBody;
use crate::store::StoreFuture;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use tower_service::Service;

/// A request waiting for its slot, with the ready inner service that will serve it.
struct Waiting<S, B> {
    service: S,
    parts: Parts,
    body: B,
}

pin_project! {
    /// The response future of [`ConcurrencyLimit`](super::ConcurrencyLimit).
    ///
    /// It holds the request's slot from the moment the acquire is sent: if it
    /// is dropped (the client went away) or the inner service fails or panics,
    /// the slot is given back; otherwise the slot moves into the response body.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S::Future>,
        waiting: Option<Waiting<S, B>>,
        slot: Option<Slot>,
        started: Option<Instant>,
        limiter: Arc<Limiter>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The store call is in flight.
        Acquiring { #[pin] fut: StoreFuture<Result<Occupancy, StoreError>> },
        // The inner service is answering.
        Inner { #[pin] fut: F },
        // The limiter answered; the inner service was not called.
        Answered { res: Option<Response<Bytes>> },
    }
}

impl<S, B, ResBody> ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    pub(crate) fn start(service: &mut S, limiter: &Arc<Limiter>, req: Request<B>) -> Self {
        let mut this = ResponseFuture {
            state: State::Answered { res: None },
            waiting: None,
            slot: None,
            started: None,
            limiter: limiter.clone(),
        };
        // Built in place, like the rate limiter's future: never moved between steps.
        this.begin(service, limiter, req);
        this
    }

    fn begin(&mut self, service: &mut S, limiter: &Arc<Limiter>, req: Request<B>) {
        let (parts, body) = req.into_parts();
        match limiter.begin(&parts) {
            Begin::Forward(slot) => {
                self.slot = slot;
                self.forward_now(service, parts, body);
            }
            Begin::Answer(res) => self.answer(res),
            Begin::Acquire {
                mut fut,
                mut slot,
                started,
            } => match fut.now_or_never() {
                // The memory store answers at once: decide without another poll.
                Some(result) => match limiter.verdict(&mut slot, started, result) {
                    None => {
                        self.slot = Some(slot);
                        self.forward_now(service, parts, body);
                    }
                    Some(res) => self.answer(res),
                },
                None => {
                    self.slot = Some(slot);
                    self.started = started;
                    self.state = State::Acquiring { fut };
                    // The ready service goes with this request; `service` gets a fresh clone.
                    let clone = service.clone();
                    self.waiting = Some(Waiting {
                        service: std::mem::replace(service, clone),
                        parts,
                        body,
                    });
                }
            },
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

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring { fut } => {
                    let result = ready!(fut.poll(cx));
                    let slot = this.slot.as_mut().expect("slot kept while acquiring");
                    match this.limiter.verdict(slot, this.started.take(), result) {
                        None => {
                            let Waiting {
                                mut service,
                                parts,
                                body,
                            } = this.waiting.take().expect("request kept while acquiring");
                            let fut = service.call(Request::from_parts(parts, body));
                            this.state.set(State::Inner { fut });
                        }
                        Some(res) => {
                            *this.waiting = None;
                            // Given back now if the acquire may have run (an error under fail-closed).
                            *this.slot = None;
                            this.state.set(State::Answered { res: Some(res) });
                        }
                    }
                }
                StateProj::Inner { fut } => {
                    let res = match ready!(fut.poll(cx)) {
                        Ok(res) => res,
                        Err(err) => {
                            *this.slot = None;
                            return Poll::Ready(Err(err));
                        }
                    };
                    let (head, body) = res.into_parts();
                    let body = GuardedBody::inner(body, this.slot.take());
                    return Poll::Ready(Ok(Response::from_parts(head, body)));
                }
                StateProj::Answered { res } => {
                    let res = res.take().expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(res.map(GuardedBody::answer)));
                }
            }
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}
