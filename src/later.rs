//! What the store-backed limiters share between their pipeline and their
//! response future: a [`Verdict`] there at once or still to come
//! ([`Later`]), and [`Serve`], which waits for it and then calls the inner
//! service or answers in its place.

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_service::Service;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// `T` now (an in-process store's answer, an open breaker), or a future of
/// it (a network store, an async lookup): only the latter is boxed.
pub(crate) enum Later<T> {
    Now(Option<T>),
    Pending(BoxFuture<T>),
}

impl<T> Later<T> {
    /// The value, if it was there at once (taken).
    pub(crate) fn now(&mut self) -> Option<T> {
        match self {
            Later::Now(v) => v.take(),
            Later::Pending(_) => None,
        }
    }

    /// A value still to come.
    pub(crate) fn pending(fut: impl Future<Output = T> + Send + 'static) -> Self {
        Later::Pending(Box::pin(fut))
    }
}

impl<T> Future for Later<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut *self {
            Later::Now(v) => match v.take() {
                Some(v) => Poll::Ready(v),
                None => panic!("polled after completion"),
            },
            Later::Pending(fut) => fut.as_mut().poll(cx),
        }
    }
}

// Never pinned in place: the boxed future already is.
impl<T> Unpin for Later<T> {}

/// What happens to a request.
pub(crate) enum Verdict<T> {
    /// Call the inner service, keeping `T` (what was charged, the slot held)
    /// until it answers.
    Forward(T),
    /// Answer with this response; the inner service is not called.
    Answer(Response<Bytes>),
}

/// How a request ended: the inner service's response with what was kept
/// for it, or the limiter's own answer.
pub(crate) enum Served<R, T> {
    Inner(R, T),
    Answered(Response<Bytes>),
}

pin_project! {
    /// Waits for a request's verdict, then serves it. If the inner service
    /// fails, or this future is dropped, what was kept for the request
    /// (`T`) is dropped with it.
    pub(crate) struct Serve<S, B, T>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, S::Future, T>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, F, T> {
        // The verdict is still to come; the request waits with the ready
        // inner service that will serve it.
        Deciding {
            #[pin]
            verdict: Later<Verdict<T>>,
            waiting: Option<(S, Request<B>)>,
        },
        // The inner service is answering.
        Inner { #[pin] fut: F, kept: Option<T> },
        // The limiter answered; the inner service was not called.
        Answered { res: Option<Response<Bytes>> },
    }
}

impl<S, B, T> Serve<S, B, T>
where
    S: Service<Request<B>> + Clone,
{
    /// Starts serving `req` with `service` (which must be ready) once
    /// `verdict` is known: at once when it already is.
    pub(crate) fn start(service: &mut S, mut verdict: Later<Verdict<T>>, req: Request<B>) -> Self {
        let state = match verdict.now() {
            Some(v) => State::serve(v, service, req),
            None => {
                // The ready service goes with this request; the layer's
                // service gets a fresh clone.
                let clone = service.clone();
                State::Deciding {
                    verdict,
                    waiting: Some((std::mem::replace(service, clone), req)),
                }
            }
        };
        Serve { state }
    }
}

impl<S, B, T> State<S, B, S::Future, T>
where
    S: Service<Request<B>>,
{
    fn serve(verdict: Verdict<T>, service: &mut S, req: Request<B>) -> Self {
        match verdict {
            Verdict::Forward(kept) => State::Inner {
                fut: service.call(req),
                kept: Some(kept),
            },
            Verdict::Answer(res) => State::Answered { res: Some(res) },
        }
    }
}

impl<S, B, T> Future for Serve<S, B, T>
where
    S: Service<Request<B>>,
{
    type Output = Result<Served<S::Response, T>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Deciding { verdict, waiting } => {
                    let v = ready!(verdict.poll(cx));
                    let (mut service, req) = waiting.take().expect("request kept while deciding");
                    let next = State::serve(v, &mut service, req);
                    state.set(next);
                }
                StateProj::Inner { fut, kept } => {
                    let res = ready!(fut.poll(cx))?;
                    let kept = kept.take().expect("polled after completion");
                    return Poll::Ready(Ok(Served::Inner(res, kept)));
                }
                StateProj::Answered { res } => {
                    let res = res.take().expect("polled after completion");
                    return Poll::Ready(Ok(Served::Answered(res)));
                }
            }
        }
    }
}
