//! [`ResponseFuture`]: drives one request through the limiter's pipeline
//! ([`Limiter::decide`]), then through the inner service.

use super::body::Settling;
use super::body::{BodyMode, WrapBody};
use super::limiter::{Charged, Limiter};
use crate::later::Serve;
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

pin_project! {
    /// The response future of [`RateLimit`](crate::rate::RateLimit); `M` is its
    /// [`BodyMode`].
    pub struct ResponseFuture<S, B, M = WrapBody>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        serve: Serve<S, B, Option<Charged>>,
        limiter: Arc<Limiter>,
        body: PhantomData<fn() -> M>,
    }
}

impl<S, B, M, ResBody> ResponseFuture<S, B, M>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    pub(crate) fn start(service: &mut S, limiter: &Arc<Limiter>, req: Request<B>) -> Self {
        let (parts, body) = req.into_parts();
        let verdict = limiter.decide(&parts);
        ResponseFuture {
            serve: Serve::start(
                service,
                verdict,
                Request::from_parts(parts, body),
                (limiter.status_extension || limiter.usage_extension)
                    .then_some(Charged::expose::<B>),
            ),
            limiter: limiter.clone(),
            body: PhantomData,
        }
    }
}

impl<S, B, M, ResBody> Future for ResponseFuture<S, B, M>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    M: BodyMode<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let limiter = &*this.limiter;
        this.serve.poll_served(
            cx,
            |res, kept| {
                let (mut head, body) = res.into_parts();
                let settling =
                    match kept {
                        Some(Some(c)) => limiter
                            .finish(c, head.status, &mut head.headers)
                            .and_then(|later| {
                                let c = kept.take().flatten()?;
                                Some(Settling::new(limiter.clone(), c, later.head))
                            }),
                        _ => None,
                    };
                Response::from_parts(head, M::inner(body, settling))
            },
            |res| res.map(M::limiter),
        )
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
