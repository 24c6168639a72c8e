//! [`Gate`]: what decides whether a request passes a
//! [`Guarded`](super::Guarded) service, and what it holds if it does.

use crate::later::{Later, Verdict};
use http::request::Parts;
use std::sync::Arc;

/// A layer's decision for each request: the concurrency limiter's
/// `Limiter` (its guard a `Slot`) or the load shedder's `Shedder` (an
/// `Admission`).
pub(crate) trait Gate: Send + Sync {
    /// What an admitted request holds until its response body has been sent.
    type Guard;

    /// The whole path of one request to its verdict: forward it holding a
    /// guard (none when it is exempt), or answer in its place.
    fn decide(self: Arc<Self>, parts: &Parts) -> Later<Verdict<Option<Self::Guard>>>;

    /// Tells a forwarded request's guard that the inner service answered
    /// (its response head is here): an adaptive limit learns the service's
    /// latency now, not when the client has read the body, so slow readers
    /// cannot move it. The guard itself is held until the body ends.
    fn answered(guard: &mut Self::Guard)
    where
        Self: Sized;

    /// The layer's name, for `Debug`.
    fn name(&self) -> &str;

    /// Which middleware decides (its module's name), for `Debug`.
    fn middleware(&self) -> &'static str;
}
