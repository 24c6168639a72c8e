//! [`StoreFuture`]: a store's answer, there at once or still to come.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A store's answer: ready at once (the memory store: no allocation) or
/// still to come (network stores, boxed). Polled again after it completed,
/// it stays pending, as a fused future does; the layer's store timeout then
/// makes that a store failure.
#[must_use = "futures do nothing unless polled"]
pub struct StoreFuture<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    Ready(Option<T>),
    Pending(Pin<Box<dyn Future<Output = T> + Send + 'static>>),
}

impl<T> StoreFuture<T> {
    /// A future that is already complete.
    pub fn ready(value: T) -> Self {
        StoreFuture {
            inner: Inner::Ready(Some(value)),
        }
    }

    /// A future still to run.
    pub fn pending(fut: impl Future<Output = T> + Send + 'static) -> Self {
        StoreFuture {
            inner: Inner::Pending(Box::pin(fut)),
        }
    }

    /// The value if it is there at once, else the future to wait for.
    pub(crate) fn into_ready(self) -> Result<T, Pin<Box<dyn Future<Output = T> + Send + 'static>>>
    where
        T: Send + 'static,
    {
        match self.inner {
            Inner::Ready(Some(v)) => Ok(v),
            // Spent: pending for ever, as when polled.
            Inner::Ready(None) => Err(Box::pin(std::future::pending())),
            Inner::Pending(fut) => Err(fut),
        }
    }

    /// The value, if the future completed without awaiting (taken: a
    /// second call returns `None`).
    pub fn now_or_never(&mut self) -> Option<T> {
        match &mut self.inner {
            Inner::Ready(value) => value.take(),
            Inner::Pending(_) => None,
        }
    }
}

impl<T> Future for StoreFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.inner {
            // Spent: pending for ever, as a fused future is. The layer's
            // store timeout turns that into a store failure.
            Inner::Ready(value) => value.take().map_or(Poll::Pending, Poll::Ready),
            Inner::Pending(fut) => fut.as_mut().poll(cx),
        }
    }
}

// The value is moved out, never pinned in place; the future is boxed.
impl<T> Unpin for StoreFuture<T> {}

impl<T> fmt::Debug for StoreFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match &self.inner {
            Inner::Ready(_) => "StoreFuture::Ready",
            Inner::Pending(_) => "StoreFuture::Pending",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_ready_future_answers_without_awaiting_and_only_once() {
        let mut ready = StoreFuture::<u32>::ready(3);
        assert_eq!(ready.now_or_never(), Some(3));
        assert!(ready.now_or_never().is_none());
        let mut boxed = StoreFuture::<u32>::pending(async { 4 });
        assert!(boxed.now_or_never().is_none());
        assert_eq!(boxed.await, 4);
    }
}
