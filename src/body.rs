//! The body of a response that passed through a limiter: the inner
//! service's, untouched, or one the limiter wrote (a rejection); and the same
//! holding a guard until the response is done (a concurrency slot, a load
//! shedder's admission).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// What watches a body to its end: told of each frame, then that the body
/// ended; dropped unended when the body failed or was dropped first.
pub(crate) trait Watch: fmt::Debug + Send + Sync + 'static {
    /// The body sent `frame`.
    fn frame(&mut self, frame: &Frame<Bytes>);
    /// The body has ended: nothing more will be sent.
    fn ended(self: Box<Self>);
}

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
        // Watched to its end, when something must know it (a settlement).
        Inner { #[pin] body: B, watch: Option<Box<dyn Watch>> },
        Limiter { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body, watch: None },
        }
    }

    /// The inner service's body, watched by `watch` to its end.
    pub(crate) fn watched(body: B, watch: Option<Box<dyn Watch>>) -> Self
    where
        B: Body,
    {
        // Nothing more will be sent (a server may never poll it): ended now.
        let watch = match watch {
            Some(w) if body.is_end_stream() => {
                w.ended();
                None
            }
            other => other,
        };
        Self {
            kind: Kind::Inner { body, watch },
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
            KindProj::Inner { mut body, watch } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                if let Some(w) = watch.as_mut() {
                    let ended = match &frame {
                        // Trailers end a body (a server may stop polling at them).
                        Some(Ok(f)) => {
                            w.frame(f);
                            f.is_trailers() || body.is_end_stream()
                        }
                        // Failed before its end: the watch is dropped unended.
                        Some(Err(_)) => {
                            watch.take();
                            false
                        }
                        None => true,
                    };
                    if let Some(w) = watch.take_if(|_| ended) {
                        w.ended();
                    }
                }
                Poll::Ready(frame)
            }
            KindProj::Limiter { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Limiter { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Limiter { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

pin_project! {
    /// The inner service's body (or the layer's own answer) holding a guard
    /// `G` until the body has produced its last frame, failed, or been dropped
    /// (a client that disconnects mid-response), whichever comes first.
    ///
    /// The body of [`Guarded`](crate::guarded::Guarded) responses: `G` is the
    /// concurrency limiter's [`Slot`](crate::concurrency::Slot) or the load
    /// shedder's [`Admission`](crate::shed::Admission).
    #[derive(Debug)]
    pub struct GuardedBody<B, G> {
        #[pin]
        body: ResponseBody<B>,
        guard: Option<G>,
    }
}

impl<B, G> GuardedBody<B, G> {
    /// The inner service's body, holding `guard` (if any) until it ends.
    pub(crate) fn inner(body: B, guard: Option<G>) -> Self {
        Self {
            body: ResponseBody::inner(body),
            guard,
        }
    }

    /// A body the layer wrote (a rejection); nothing is held.
    pub(crate) fn answer(data: Bytes) -> Self {
        Self {
            body: ResponseBody::limiter(data),
            guard: None,
        }
    }
}

impl<B, G> Body for GuardedBody<B, G>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        // Release as soon as the body is done: a server may keep a finished
        // body around (keep-alive) before dropping it.
        let done = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.body.is_end_stream(),
        };
        if done {
            this.guard.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Guard(Arc<AtomicUsize>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn the_guard_is_released_once_at_the_end_of_the_body_or_when_it_is_dropped() {
        let released = Arc::new(AtomicUsize::new(0));
        let body = http_body_util::Full::new(Bytes::from_static(b"hello"));
        let mut b = GuardedBody::inner(body, Some(Guard(released.clone())));
        let frame = b.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
        assert_eq!(
            released.load(Ordering::SeqCst),
            1,
            "released at the last frame"
        );
        assert!(b.frame().await.is_none());
        drop(b);
        assert_eq!(released.load(Ordering::SeqCst), 1, "exactly once");

        let released = Arc::new(AtomicUsize::new(0));
        let body = http_body_util::Full::new(Bytes::from_static(b"unread"));
        drop(GuardedBody::inner(body, Some(Guard(released.clone()))));
        assert_eq!(released.load(Ordering::SeqCst), 1, "released on drop");
    }
}
