//! [`ConcurrencyLimit`]: the service the layer produces.

use super::future::ResponseFuture;
use super::limiter::Limiter;
use super::ResponseBody;
use http::{Request, Response};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Limits the requests in flight per key of an inner service `S`.
///
/// Rejections are responses (429, or the configured answers), never errors:
/// the inner service's error type passes through unchanged.
#[derive(Clone)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
}

impl<S> ConcurrencyLimit<S> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter>) -> Self {
        Self { inner, limiter }
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Limiting is per key and decided in `call`; readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        ResponseFuture::start(&mut self.inner, &self.limiter, req)
    }
}

impl<S: fmt::Debug> fmt::Debug for ConcurrencyLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter.slots.namespace.name())
            .finish()
    }
}
