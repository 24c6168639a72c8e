//! What settling a request when its response is done knows: [`Usage`], the
//! handle a handler reports what its request really cost on, [`Dropped`],
//! what a response that never finished is settled to, and what is known of
//! the cost when it is settled. (The response body carries the settlement
//! to its end: `body.rs`.)

use crate::Quota;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// What a request really cost, as its handler reports it: put in the
/// extensions of each charged request by
/// [`usage_extension`](crate::RateLimitLayerBuilder::usage_extension), and an
/// axum extractor (feature `axum`).
///
/// The request is settled once, when its response body has ended, to what
/// the handle says then. A streamed response can count as it goes
/// ([`add`](Self::add)); calls after the settlement change nothing. A
/// request that was not charged (exempt, admitted in shadow mode or while the
/// store is down) extracts a detached handle that settles nothing, so
/// handlers need not tell the cases apart.
///
/// ```
/// use tower_ratelimit::rate::Usage;
/// async fn complete(usage: Usage) -> &'static str {
///     usage.settle_unit("input-tokens", 12);
///     usage.add_unit("output-tokens", 30);
///     usage.add_unit("output-tokens", 8);
///     "done"
/// }
/// ```
#[derive(Clone, Default)]
pub struct Usage {
    amounts: Arc<Mutex<Amounts>>,
}

#[derive(Debug, Default, Clone)]
struct Amounts {
    /// What every quota of another unit than requests cost.
    all: Option<u64>,
    /// What the quotas in one unit cost, over `all`.
    by_unit: Vec<(Box<str>, u64)>,
}

impl Amounts {
    /// The amount for `unit`, 0 until something is said of it.
    fn unit(&mut self, unit: &str) -> &mut u64 {
        let i = match self.by_unit.iter().position(|(u, _)| &**u == unit) {
            Some(i) => i,
            None => {
                self.by_unit.push((unit.into(), 0));
                self.by_unit.len() - 1
            }
        };
        &mut self.by_unit[i].1
    }

    fn of(&self, unit: &str) -> Option<u64> {
        self.by_unit
            .iter()
            .find(|(u, _)| &**u == unit)
            .map(|&(_, n)| n)
    }
}

impl Usage {
    /// The request cost `n` in every quota of another unit than requests
    /// (that no [`settle_unit`](Self::settle_unit) names).
    pub fn settle(&self, n: u64) {
        self.with(|a| a.all = Some(n));
    }

    /// Adds `n` to what [`settle`](Self::settle) says (0 before any call).
    pub fn add(&self, n: u64) {
        self.with(|a| a.all = Some(a.all.unwrap_or(0).saturating_add(n)));
    }

    /// The request cost `n` in the quotas counting `unit` (e.g.
    /// `"output-tokens"`).
    pub fn settle_unit(&self, unit: &str, n: u64) {
        self.with(|a| *a.unit(unit) = n);
    }

    /// Adds `n` to what the quotas counting `unit` are settled to (0 before
    /// any call).
    pub fn add_unit(&self, unit: &str, n: u64) {
        self.with(|a| {
            let v = a.unit(unit);
            *v = v.saturating_add(n);
        });
    }

    /// What the handle says the request cost `quota`: in its own unit, and
    /// in every unit.
    pub(crate) fn said(&self, quota: &Quota) -> (Option<u64>, Option<u64>) {
        self.with(|a| (a.of(quota.unit()), a.all))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Amounts) -> T) -> T {
        // The lock is never held across anything that can panic.
        f(&mut self.amounts.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.with(|a| a.clone());
        f.debug_struct("Usage")
            .field("all", &a.all)
            .field("by_unit", &a.by_unit)
            .finish()
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Usage {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Usage>().cloned().unwrap_or_default())
    }
}

/// What a request whose response never finished is settled to: the client
/// went away, or the body failed or was dropped before its end. Set with
/// [`settle_dropped`](crate::RateLimitLayerBuilder::settle_dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dropped {
    /// The reservation stands (the default).
    #[default]
    Reservation,
    /// What was known when it was dropped: the bytes sent, the handler's
    /// [`Usage`] so far. Quotas nothing was known for keep the reservation.
    SoFar,
    /// This cost, in every quota of another unit than requests.
    Cost(u64),
}

/// What is known of a request's real cost when it is settled.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Known {
    /// From the response head ([`settle`](crate::RateLimitLayerBuilder::settle)).
    pub(crate) head: Option<u64>,
    /// From the trailers.
    pub(crate) trailers: Option<u64>,
    /// The body's data bytes, when they were counted.
    pub(crate) bytes: Option<u64>,
}

impl Known {
    /// Only the head's word.
    pub(crate) fn head(n: u64) -> Self {
        Known {
            head: Some(n),
            ..Known::default()
        }
    }
}

/// A settlement the response body is to make at its end: what the head
/// said, with what the body will tell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deferred {
    pub(crate) head: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_handle_keeps_each_unit_apart_from_every_unit_and_adds_start_from_zero() {
        let tokens = Quota::new(10, Duration::from_secs(1))
            .unwrap()
            .with_unit("output-tokens")
            .unwrap();
        let bytes = tokens.clone().with_unit("content-bytes").unwrap();
        let u = Usage::default();
        assert_eq!(u.said(&tokens), (None, None), "nothing said yet");
        u.add(5);
        u.add(7);
        assert_eq!(u.said(&tokens), (None, Some(12)));
        u.add_unit("output-tokens", 3);
        u.add_unit("output-tokens", 4);
        assert_eq!(u.said(&tokens), (Some(7), Some(12)), "its own unit");
        assert_eq!(u.said(&bytes), (None, Some(12)), "only every unit");
        u.settle_unit("output-tokens", 1);
        u.settle(2);
        assert_eq!(u.said(&tokens), (Some(1), Some(2)));
        u.add(u64::MAX);
        assert_eq!(u.said(&bytes).1, Some(u64::MAX), "saturates");
        let clone = u.clone();
        clone.settle(9);
        assert_eq!(u.said(&bytes).1, Some(9), "clones share one handle");
        assert!(format!("{u:?}").contains("output-tokens"));
    }
}
