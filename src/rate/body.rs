//! Which body type the rate limiter's responses carry ([`BodyMode`]), and
//! the settlement a charged request's body carries to its end.

use super::limiter::{Charged, Limiter};
use super::settle::Known;
use crate::body::{ResponseBody, Watch};
use bytes::Bytes;
use http_body::Frame;
use std::fmt;
use std::sync::Arc;

/// Which body type a [`RateLimit`](crate::rate::RateLimit) service answers with,
/// and how the inner service's body and the limiter's own answers become it.
///
/// Sealed. [`WrapBody`] (the default) suits every inner service;
/// [`InnerBody`] suits those whose body type can be made from [`Bytes`], such
/// as axum's, and saves a box per response there. Choose with
/// [`RateLimitLayer::inner_body`](crate::RateLimitLayer::inner_body).
pub trait BodyMode<B>: sealed::Sealed {
    /// The body type of the service's responses.
    type Body;

    /// The inner service's body, carrying the request's settlement to its
    /// end when one is still to be made.
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn inner(body: B, settling: Option<Settling>) -> Self::Body;

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
/// on every response.
///
/// The body passes through unwatched, so a request is settled when its
/// response head is ready, to what is known then: the trailers and the
/// body's bytes are not seen, and a [`Usage`](crate::rate::Usage) counts what the
/// handler said before it answered.
///
/// Some answers have no body (a gRPC answer is headers only): they are made
/// with `B::from(Bytes::new())`, which must be an empty body that has ended
/// (`is_end_stream`), as it is for axum's `Body` and for `Full`.
#[derive(Clone, Copy, Debug, Default)]
pub struct InnerBody;

impl<B: http_body::Body> BodyMode<B> for WrapBody {
    type Body = ResponseBody<B>;

    #[allow(private_interfaces)]
    fn inner(body: B, settling: Option<Settling>) -> Self::Body {
        ResponseBody::watched(body, settling.map(|s| Box::new(s) as _))
    }

    fn limiter(data: Bytes) -> Self::Body {
        ResponseBody::limiter(data)
    }
}

impl<B: From<Bytes>> BodyMode<B> for InnerBody {
    type Body = B;

    #[allow(private_interfaces)]
    fn inner(body: B, settling: Option<Settling>) -> B {
        if let Some(s) = settling {
            s.at_head();
        }
        body
    }

    fn limiter(data: Bytes) -> B {
        B::from(data)
    }
}

/// A charged request's settlement, carried by its response body until the
/// body ends (settled to what is known then) or is dropped first (settled
/// as [`Dropped`] says). Made once per request and spent once.
pub(crate) struct Settling {
    limiter: Arc<Limiter>,
    charged: Option<Charged>,
    known: Known,
}

impl Settling {
    pub(crate) fn new(limiter: Arc<Limiter>, charged: Charged, head: Option<u64>) -> Self {
        let bytes = limiter.body_bytes.then_some(0);
        Self {
            limiter,
            charged: Some(charged),
            known: Known {
                head,
                trailers: None,
                bytes,
            },
        }
    }

    /// Settles now, at the response head, to what is known: the body is
    /// not watched, so its bytes are not known.
    pub(crate) fn at_head(mut self) {
        self.known.bytes = None;
        self.complete();
    }

    fn complete(&mut self) {
        if let Some(c) = self.charged.take() {
            self.limiter.settle_end(c, self.known, true);
        }
    }
}

impl Watch for Settling {
    /// Counts the bytes sent, and reads the trailers.
    fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            if let Some(b) = &mut self.known.bytes {
                *b = b.saturating_add(data.len() as u64);
            }
        } else if let (Some(trailers), Some(f)) =
            (frame.trailers_ref(), &self.limiter.settle_trailers)
        {
            self.known.trailers = f(trailers);
        }
    }

    /// The body ended: settles to what is known.
    fn ended(mut self: Box<Self>) {
        self.complete();
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        if let Some(c) = self.charged.take() {
            self.limiter.settle_end(c, self.known, false);
        }
    }
}

impl fmt::Debug for Settling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settling")
            .field("limiter", &self.limiter.namespace.name())
            .field("known", &self.known)
            .finish_non_exhaustive()
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
