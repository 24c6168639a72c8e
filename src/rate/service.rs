//! [`RateLimit`]: the service the layer produces.

use super::body::{BodyMode, WrapBody};
use super::future::ResponseFuture;
use super::limiter::Limiter;
use http::{Request, Response};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Rate-limits the requests of an inner service `S`.
///
/// Rejections are responses (429, or the configured answers), never errors: the
/// inner service's error type passes through unchanged. `M` says which body
/// type the responses carry ([`WrapBody`] unless the layer chose
/// [`inner_body`](crate::RateLimitLayer::inner_body)).
pub struct RateLimit<S, M = WrapBody> {
    inner: S,
    limiter: Arc<Limiter>,
    body: PhantomData<fn() -> M>,
}

impl<S, M> RateLimit<S, M> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter>) -> Self {
        Self {
            inner,
            limiter,
            body: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, M> Clone for RateLimit<S, M> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), self.limiter.clone())
    }
}

impl<S, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    M: BodyMode<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Limiting is per key and decided in `call`; readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        ResponseFuture::start(&mut self.inner, &self.limiter, req)
    }
}

impl<S: fmt::Debug, M> fmt::Debug for RateLimit<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter.namespace.name())
            .field("body", &std::any::type_name::<M>())
            .finish()
    }
}
