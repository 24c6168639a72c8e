//! [`LoadShed`]: the service the layer produces.

use super::future::ResponseFuture;
use super::shedder::Shedder;
use super::ResponseBody;
use http::{Request, Response};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Sheds the requests of an inner service `S` by priority under load.
///
/// A shed request is a response (503), never an error: the inner service's
/// error type passes through unchanged.
#[derive(Clone)]
pub struct LoadShed<S> {
    inner: S,
    shedder: Arc<Shedder>,
}

impl<S> LoadShed<S> {
    pub(crate) fn new(inner: S, shedder: Arc<Shedder>) -> Self {
        Self { inner, shedder }
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LoadShed<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Shedding is decided per request, by class, in `call`.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        ResponseFuture::start(&mut self.inner, &self.shedder, req)
    }
}

impl<S: fmt::Debug> fmt::Debug for LoadShed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShed")
            .field("inner", &self.inner)
            .field("shedder", &self.shedder.name)
            .finish()
    }
}
