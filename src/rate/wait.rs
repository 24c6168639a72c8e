//! Holding a request the store booked for a later turn (a policy that
//! waits, [`Wait`](crate::quota::Wait)): at most the policy's number of
//! requests per instance wait at once ([`Waiters`]); a waiting request goes
//! on at its turn, gives its turn back when its client goes away first
//! ([`hold`]), and is answered at once when the layer closes its waiters.
//! What a turn is, and how it is given back, is the limiter's.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::sync::Notify;

/// The requests one layer holds waiting, and whether it still lets them wait.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    count: AtomicUsize,
    closed: AtomicBool,
    /// Wakes every waiter when the layer closes its waiters.
    closing: Notify,
}

/// A place among the waiters, taken when the store has booked a turn and
/// held until the request goes on or is answered.
#[derive(Debug)]
pub(crate) struct Seat(Arc<Waiters>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Waiters {
    /// A seat, unless `max` requests already wait or the waiters are closed.
    pub(crate) fn seat(self: &Arc<Self>, max: usize) -> Option<Seat> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let taken = self.count.fetch_add(1, Ordering::AcqRel);
        let seat = Seat(self.clone());
        (taken < max).then_some(seat)
    }

    /// Whether a request may still be booked a turn: the waiters are open
    /// and fewer than `max` wait.
    pub(crate) fn has_room(&self, max: usize) -> bool {
        !self.closed.load(Ordering::Acquire) && self.count.load(Ordering::Acquire) < max
    }

    /// Requests waiting now.
    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Answers every waiting request at once (and gives its turn back), and
    /// lets no request wait any more.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closing.notify_waiters();
    }
}

/// A turn booked for a request, given back unless the request goes on.
struct Booking<T, F: FnOnce(T)> {
    booked: Option<T>,
    give_back: Option<F>,
}

impl<T, F: FnOnce(T)> Drop for Booking<T, F> {
    fn drop(&mut self) {
        if let (Some(booked), Some(give_back)) = (self.booked.take(), self.give_back.take()) {
            // The client went away (or the layer closed) before its turn:
            // the turn goes back, off the response path, once.
            give_back(booked);
        }
    }
}

/// Holds `booked` until its turn, `wait` ahead, then hands it back to go
/// on (`Some`). Closed first (see [`Waiters::close`]), it is given to
/// `give_back` and the answer is `None`; so it is when this future is
/// dropped before the turn (the client went away).
pub(crate) async fn hold<T, F: FnOnce(T)>(
    booked: T,
    seat: Seat,
    wait: Duration,
    give_back: F,
) -> Option<T> {
    let waiters = seat.0.clone();
    let mut booking = Booking {
        booked: Some(booked),
        give_back: Some(give_back),
    };
    let mut closing = std::pin::pin!(waiters.closing.notified());
    closing.as_mut().enable();
    if waiters.closed.load(Ordering::Acquire) {
        return None;
    }
    let mut turn = std::pin::pin!(tokio::time::sleep(wait));
    let closed_first = std::future::poll_fn(|cx| {
        if closing.as_mut().poll(cx).is_ready() {
            Poll::Ready(true)
        } else {
            turn.as_mut().poll(cx).map(|()| false)
        }
    })
    .await;
    if closed_first {
        drop(booking);
        drop(seat);
        return None;
    }
    let booked = booking.booked.take();
    drop(seat);
    booked
}
