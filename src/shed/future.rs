//! [`ResponseFuture`]: drives one request through the shedder's decision
//! (at once, or after the fleet's count answers), then through the inner
//! service.

use super::shedder::{Admission, Shedder};
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
    /// The response future of [`LoadShed`](super::LoadShed). An admitted
    /// request counts in flight until this future is dropped, or — once it
    /// resolves — until its response body is done.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        serve: Serve<S, B, Admission>,
    }
}

impl<S, B, ResBody> ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    pub(crate) fn start(service: &mut S, shedder: &Arc<Shedder>, req: Request<B>) -> Self {
        let (parts, body) = req.into_parts();
        let verdict = shedder.admit(&parts);
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
        // On an error the admission is dropped with the future: the request is over.
        self.project().serve.poll_served(
            cx,
            |res, admission| {
                let mut admission = admission.take();
                if let Some(a) = &mut admission {
                    a.answered();
                }
                res.map(|body| GuardedBody::inner(body, admission))
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
