//! [`Guarded`]: the service the concurrency limiter's and the load
//! shedder's layers produce.

use super::future::ResponseFuture;
use super::gate::Gate;
use crate::body::GuardedBody;
use http::{Request, Response};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// An inner service `S` behind the concurrency limiter (`G` is
/// [`Slot`](crate::concurrency::Slot)) or the load shedder (`G` is
/// [`Admission`](crate::shed::Admission)): each request it forwards holds a
/// `G` until its response has been sent.
///
/// The layer's answers (429, 503) are responses, never errors: the inner
/// service's error type passes through unchanged. Clones share one limiter.
pub struct Guarded<S, G> {
    inner: S,
    gate: Arc<dyn Gate<Guard = G>>,
    // `Gate::answered` for `G`: a function, so that no public impl needs a
    // bound on `G` naming the crate's own trait.
    answered: fn(&mut G),
}

impl<S, G> Guarded<S, G> {
    pub(crate) fn new<D>(inner: S, gate: Arc<D>) -> Self
    where
        D: Gate<Guard = G> + 'static,
    {
        Self {
            inner,
            gate,
            answered: D::answered,
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

impl<S: Clone, G> Clone for Guarded<S, G> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            gate: self.gate.clone(),
            answered: self.answered,
        }
    }
}

impl<S, G, ReqBody, ResBody> Service<Request<ReqBody>> for Guarded<S, G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<GuardedBody<ResBody, G>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, G>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The decision is per request (per key, per class), made in `call`;
        // readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        ResponseFuture::start(&mut self.inner, &self.gate, self.answered, req)
    }
}

impl<S: fmt::Debug, G> fmt::Debug for Guarded<S, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("inner", &self.inner)
            .field("middleware", &self.gate.middleware())
            .field("limiter", &self.gate.name())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use crate::{ConcurrencyLimitLayer, LoadShedLayer};
    use tower_layer::Layer;

    #[tokio::test]
    async fn debug_names_each_middleware_and_its_limiter() {
        let limit = ConcurrencyLimitLayer::builder()
            .name("reports")
            .limit(5)
            .build()
            .unwrap();
        let shed = LoadShedLayer::builder()
            .name("api")
            .capacity(10)
            .build()
            .unwrap();
        let service = shed.layer(limit.layer("inner"));
        assert_eq!(
            format!("{service:?}"),
            r#"Guarded { inner: Guarded { inner: "inner", middleware: "concurrency", limiter: "reports" }, middleware: "shed", limiter: "api" }"#
        );
    }
}
