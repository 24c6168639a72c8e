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
    Now(T),
    Pending(BoxFuture<T>),
}

impl<T> Later<T> {
    /// A value still to come.
    pub(crate) fn pending(fut: impl Future<Output = T> + Send + 'static) -> Self {
        Later::Pending(Box::pin(fut))
    }

    /// The value, waiting for it if it is still to come.
    pub(crate) async fn value(self) -> T {
        match self {
            Later::Now(v) => v,
            Later::Pending(fut) => fut.await,
        }
    }
}

/// What happens to a request.
pub(crate) enum Verdict<T> {
    /// Call the inner service, keeping `T` (what was charged, the slot held)
    /// until it answers.
    Forward(T),
    /// Answer with this response; the inner service is not called.
    Answer(Response<Bytes>),
}

pin_project! {
    /// Waits for a request's verdict, then serves it. If the inner service
    /// fails, or this future is dropped, what was kept for the request
    /// (`T`) is dropped with it.
    ///
    /// What a request keeps (`T`) lives beside the state, so that moving
    /// from one state to the next does not copy it.
    pub(crate) struct Serve<S, B, T>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, S::Future, T>,
        kept: Option<T>,
        // Adds what the inner service should see of `T` to its request.
        prepare: Option<Prepare<T, B>>,
    }
}

/// Writes what the inner service should see of what was kept (the
/// decision, for handlers that read it) into the request it gets.
pub(crate) type Prepare<T, B> = fn(&T, &mut Request<B>);

pin_project! {
    #[project = StateProj]
    enum State<S, B, F, T> {
        // The verdict is still to come; the request waits with the ready
        // inner service that will serve it.
        Deciding { verdict: BoxFuture<Verdict<T>>, waiting: Option<(S, Request<B>)> },
        // The inner service is answering.
        Inner { #[pin] fut: F },
        // The limiter answered; the inner service was not called.
        Answered { res: Option<Response<Bytes>> },
    }
}

impl<S, B, T> Serve<S, B, T>
where
    S: Service<Request<B>> + Clone,
{
    /// Starts serving `req` with `service` (which must be ready) once
    /// `verdict` is known: at once when it already is. A forwarded request
    /// goes through `prepare` first.
    pub(crate) fn start(
        service: &mut S,
        verdict: Later<Verdict<T>>,
        mut req: Request<B>,
        prepare: Option<Prepare<T, B>>,
    ) -> Self {
        match verdict {
            Later::Now(Verdict::Forward(kept)) => {
                if let Some(p) = prepare {
                    p(&kept, &mut req);
                }
                Serve {
                    state: State::Inner {
                        fut: service.call(req),
                    },
                    kept: Some(kept),
                    prepare,
                }
            }
            Later::Now(Verdict::Answer(res)) => Serve {
                state: State::Answered { res: Some(res) },
                kept: None,
                prepare,
            },
            Later::Pending(verdict) => {
                // The ready service goes with this request; the layer's
                // service gets a fresh clone.
                let clone = service.clone();
                Serve {
                    state: State::Deciding {
                        verdict,
                        waiting: Some((std::mem::replace(service, clone), req)),
                    },
                    kept: None,
                    prepare,
                }
            }
        }
    }
}

impl<S, B, T> Serve<S, B, T>
where
    S: Service<Request<B>>,
{
    /// Drives the request to its end: the inner service's response, with
    /// what was kept for it, goes through `inner`; the limiter's own answer
    /// through `answered`. `inner` takes what was kept only if it needs it
    /// past the response head; otherwise it is dropped with this future.
    pub(crate) fn poll_served<O>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        inner: impl FnOnce(S::Response, &mut Option<T>) -> O,
        answered: impl FnOnce(Response<Bytes>) -> O,
    ) -> Poll<Result<O, S::Error>> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Deciding { verdict, waiting } => {
                    match ready!(verdict.as_mut().poll(cx)) {
                        Verdict::Forward(kept) => {
                            let (mut service, mut req) =
                                waiting.take().expect("request kept while deciding");
                            if let Some(p) = this.prepare {
                                p(&kept, &mut req);
                            }
                            *this.kept = Some(kept);
                            let fut = service.call(req);
                            this.state.set(State::Inner { fut });
                        }
                        Verdict::Answer(res) => {
                            this.state.set(State::Answered { res: Some(res) });
                        }
                    }
                }
                StateProj::Inner { fut } => {
                    let res = ready!(fut.poll(cx))?;
                    return Poll::Ready(Ok(inner(res, this.kept)));
                }
                StateProj::Answered { res } => {
                    let mut res = res.take().expect("polled after completion");
                    // A limiter's answer describes this moment, never content:
                    // no cache may keep it (a custom answer may say otherwise).
                    res.headers_mut()
                        .entry(http::header::CACHE_CONTROL)
                        .or_insert(http::HeaderValue::from_static("no-store"));
                    return Poll::Ready(Ok(answered(res)));
                }
            }
        }
    }
}
