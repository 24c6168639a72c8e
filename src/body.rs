//! The response body: the inner service's, or one the limiter wrote.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    /// Either the inner service's body or a body the limiter wrote (a rejection).
    #[project = BodyProj]
    #[derive(Debug)]
    pub enum ResponseBody<B> {
        /// The inner service's body, untouched.
        Inner {
            /// The inner body.
            #[pin]
            body: B,
        },
        /// A body written by the limiter.
        Limiter {
            /// What is left to send.
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody::Inner { body }
    }

    pub(crate) fn limiter(data: Bytes) -> Self {
        ResponseBody::Limiter {
            data: if data.is_empty() { None } else { Some(data) },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            BodyProj::Inner { body } => body.poll_frame(cx),
            BodyProj::Limiter { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Inner { body } => body.is_end_stream(),
            ResponseBody::Limiter { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Inner { body } => body.size_hint(),
            ResponseBody::Limiter { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}
