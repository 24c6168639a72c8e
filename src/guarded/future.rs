//! [`ResponseFuture`]: drives one request through its layer's decision
//! ([`Gate::decide`]: at once, or after the store answers), then through
//! the inner service.

use super::gate::Gate;
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
    /// The response future of [`Guarded`](super::Guarded).
    ///
    /// It holds the request's guard from the moment it is decided: if it is
    /// dropped (the client went away) or the inner service fails or panics,
    /// the guard is released (a slot given back, an admission ended);
    /// otherwise the guard moves into the response body.
    pub struct ResponseFuture<S, B, G>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        serve: Serve<S, B, Option<G>>,
        answered: fn(&mut G),
    }
}

impl<S, B, G, ResBody> ResponseFuture<S, B, G>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    pub(super) fn start(
        service: &mut S,
        gate: &Arc<dyn Gate<Guard = G>>,
        answered: fn(&mut G),
        req: Request<B>,
    ) -> Self {
        let (parts, body) = req.into_parts();
        let verdict = gate.clone().decide(&parts);
        let serve = Serve::start(service, verdict, Request::from_parts(parts, body), None);
        ResponseFuture { serve, answered }
    }
}

impl<S, B, G, ResBody> Future for ResponseFuture<S, B, G>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<GuardedBody<ResBody, G>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answered = *this.answered;
        // On an error the guard is dropped with this future: released.
        this.serve.poll_served(
            cx,
            |res, guard| {
                let mut guard = guard.take().flatten();
                if let Some(g) = &mut guard {
                    answered(g);
                }
                res.map(|body| GuardedBody::inner(body, guard))
            },
            |res| res.map(GuardedBody::answer),
        )
    }
}

impl<S, B, G> fmt::Debug for ResponseFuture<S, B, G>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
