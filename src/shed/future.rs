//! [`ResponseFuture`]: a request the shedder admitted, or its 503.

use super::shedder::Admission;
use super::ResponseBody;
use crate::body::GuardedBody;
use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

pin_project! {
    /// The response future of [`LoadShed`](super::LoadShed). An admitted
    /// request counts in flight until this future is dropped, or — once it
    /// resolves — until its response body is done.
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Inner { #[pin] fut: F, admission: Option<Admission> },
        Shed { res: Option<Response<Bytes>> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn inner(fut: F, admission: Admission) -> Self {
        Self {
            kind: Kind::Inner {
                fut,
                admission: Some(admission),
            },
        }
    }

    pub(crate) fn shed(res: Response<Bytes>) -> Self {
        Self {
            kind: Kind::Shed { res: Some(res) },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { fut, admission } => {
                let result = ready!(fut.poll(cx));
                // On an error the admission is dropped here: the request is over.
                let admission = admission.take();
                Poll::Ready(result.map(|res| res.map(|body| GuardedBody::inner(body, admission))))
            }
            KindProj::Shed { res } => {
                let res = res.take().expect("ResponseFuture polled after completion");
                Poll::Ready(Ok(res.map(GuardedBody::answer)))
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
