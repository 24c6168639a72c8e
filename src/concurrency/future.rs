//! [`ResponseFuture`]: drives one request through the concurrency limiter's
//! pipeline ([`Limiter::decide`]), then through the inner service.

use super::limiter::{Limiter, Slot};
use super::ResponseBody;
use crate::body::GuardedBody;
use crate::later::Serve;
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

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
        serve: Serve<S, B, Option<Slot>>,
    }
}

impl<S, B, ResBody> ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    pub(crate) fn start(service: &mut S, limiter: &Arc<Limiter>, req: Request<B>) -> Self {
        let (parts, body) = req.into_parts();
        let verdict = limiter.decide(&parts);
        let serve = Serve::start(service, verdict, Request::from_parts(parts, body), None);
        ResponseFuture { serve }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // An error drops the slot with the future: it is given back.
        self.project().serve.poll_served(
            cx,
            |res, slot| {
                let mut slot = slot.take().flatten();
                if let Some(s) = &mut slot {
                    s.answered();
                }
                res.map(|body| GuardedBody::inner(body, slot))
            },
            |res| res.map(GuardedBody::answer),
        )
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
