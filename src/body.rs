//! The response body: the inner service's, or one the limiter wrote.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    /// Either the inner service's body, untouched, or a body the limiter wrote (a rejection).
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Limiter { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn limiter(data: Bytes) -> Self {
        Self {
            kind: Kind::Limiter {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Limiter { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Limiter { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Limiter { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// Which body type a [`RateLimit`](crate::RateLimit) service answers with,
/// and how the inner service's body and the limiter's own answers become it.
///
/// Sealed. [`WrapBody`] (the default) suits every inner service;
/// [`InnerBody`] suits those whose body type can be made from [`Bytes`], such
/// as axum's, and saves a box per response there. Choose with
/// [`RateLimitLayer::inner_body`](crate::RateLimitLayer::inner_body).
pub trait BodyMode<B>: sealed::Sealed {
    /// The body type of the service's responses.
    type Body;

    /// The inner service's body, passed on as it is.
    fn inner(body: B) -> Self::Body;

    /// A body the limiter wrote: a rejection or a store-failure answer.
    fn limiter(data: Bytes) -> Self::Body;
}

/// The default [`BodyMode`]: responses carry a [`ResponseBody`], either the
/// inner service's body, untouched, or one the limiter wrote.
///
/// Works with any inner service. axum (and tonic) box a body type they do
/// not know once more per response; [`InnerBody`] avoids that for axum.
#[derive(Clone, Copy, Debug, Default)]
pub struct WrapBody;

/// A [`BodyMode`] in which responses carry the inner service's own body type
/// `B`; the limiter's answers are made with `B::from(Bytes)`.
///
/// For inner services whose body is `From<Bytes>`: axum's `Body`,
/// `http_body_util::Full<Bytes>`. axum passes its own `Body` through
/// without boxing it again, which [`WrapBody`]'s `ResponseBody<Body>` costs
/// on every response. Choose it with
/// [`RateLimitLayer::inner_body`](crate::RateLimitLayer::inner_body).
///
/// Some answers have no body (a gRPC answer is headers only): they are made
/// with `B::from(Bytes::new())`, which must be an empty body that has ended
/// (`is_end_stream`), as it is for axum's `Body` and for `Full`.
#[derive(Clone, Copy, Debug, Default)]
pub struct InnerBody;

impl<B> BodyMode<B> for WrapBody {
    type Body = ResponseBody<B>;

    fn inner(body: B) -> Self::Body {
        ResponseBody::inner(body)
    }

    fn limiter(data: Bytes) -> Self::Body {
        ResponseBody::limiter(data)
    }
}

impl<B: From<Bytes>> BodyMode<B> for InnerBody {
    type Body = B;

    fn inner(body: B) -> B {
        body
    }

    fn limiter(data: Bytes) -> B {
        B::from(data)
    }
}

mod sealed {
    // Public in a private module: `BodyMode` names it as a supertrait, and no
    // one outside this crate can implement it, so the two modes stay the only ones.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
    impl Sealed for super::WrapBody {}
    impl Sealed for super::InnerBody {}
}
