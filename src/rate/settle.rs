//! Settling a request when its response is done: [`Settlement`], how, and
//! which responses are free; [`Usage`], the
//! handle a handler reports what its request really cost on, [`Dropped`],
//! what a response that never finished is settled to, and what is known of
//! the cost when it is settled. (The response body carries the settlement
//! to its end: `body.rs`.)

use crate::Quota;
use http::request::Parts;
use http::{HeaderMap, StatusCode};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// What a request costs (or reserves), from its head.
pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
/// Whether a response is free.
pub(crate) type RefundFn = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;
/// What a request really cost, from its response head.
pub(crate) type SettleFn = dyn Fn(StatusCode, &HeaderMap) -> Option<u64> + Send + Sync;
/// What a request really cost, from its response's trailers.
pub(crate) type TrailersFn = dyn Fn(&HeaderMap) -> Option<u64> + Send + Sync;

/// What a request really cost, as its handler reports it: put in the
/// extensions of each charged request by
/// [`Settlement::from_usage`], and an
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
/// [`Settlement::on_dropped`].
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
    /// From the response head ([`Settlement::from_head`]).
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

/// How a [`RateLimitLayer`](crate::RateLimitLayer) settles a request once
/// its real cost is known, and which responses are free; given to the
/// builder's [`settlement`](crate::RateLimitLayerBuilder::settlement).
///
/// A quota of another unit than requests (tokens, bytes, query cost; see
/// [`Quota::with_unit`]) is charged a reservation when the request starts
/// ([`reserve`](Self::reserve)) and settled to what the request really
/// cost, in one atomic store call off the response path, against the same
/// windows and buckets the reservation was charged to: below the
/// reservation the rest comes back, above it the excess is charged there
/// too (remaining shows 0 until the window resets or the bucket refills
/// from below zero). A settlement after its window ended changes nothing.
/// The headers show the settled state. Quotas counting requests are
/// charged the cost and never settled, but a free response
/// ([`refund_if`](Self::refund_if)) gives everything back.
///
/// Where the real cost comes from, the first that is known winning for
/// each quota:
/// 1. the handler's word for the quota's own unit
///    ([`Usage::settle_unit`], with [`from_usage`](Self::from_usage));
/// 2. the body's bytes, for `content-bytes` quotas
///    ([`from_body_bytes`](Self::from_body_bytes));
/// 3. the trailers ([`from_trailers`](Self::from_trailers));
/// 4. the head ([`from_head`](Self::from_head));
/// 5. the handler's word for every unit ([`Usage::settle`]).
///
/// Else the reservation stands. A request is settled exactly once,
/// whichever sources speak; sources read at the body's end (trailers,
/// bytes, usage) settle it then, else it is settled at its response head.
///
/// ```
/// # use std::time::Duration;
/// use tower_ratelimit::rate::{Dropped, Settlement};
/// use tower_ratelimit::{Policy, Quota, RateLimitLayer};
/// let policy = Policy::new(Quota::new(60, Duration::from_secs(60))?)
///     .and(Quota::new(100_000, Duration::from_secs(60))?.named("tokens")?.with_unit("tokens")?)?;
/// let layer = RateLimitLayer::builder()
///     .quota(policy)
///     .settlement(
///         Settlement::new()
///             // An estimate from the prompt's size; the real count comes later.
///             .reserve(|parts| parts.headers.get("content-length")
///                 .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
///                 .map_or(0, |bytes| bytes / 4))
///             .from_head(|_status, headers| headers.get("x-tokens-used")?.to_str().ok()?.parse().ok())
///             .on_dropped(Dropped::SoFar),
///     )
///     .build()?;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct Settlement {
    pub(crate) reserve: Option<Arc<CostFn>>,
    pub(crate) head: Option<Arc<SettleFn>>,
    pub(crate) trailers: Option<Arc<TrailersFn>>,
    pub(crate) body_bytes: bool,
    pub(crate) usage: bool,
    pub(crate) dropped: Dropped,
    pub(crate) refund: Arc<RefundFn>,
}

impl Default for Settlement {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("reserve", &self.reserve.is_some())
            .field("from_head", &self.head.is_some())
            .field("from_trailers", &self.trailers.is_some())
            .field("from_body_bytes", &self.body_bytes)
            .field("from_usage", &self.usage)
            .field("on_dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

impl Settlement {
    /// The default: the reservation is the request's
    /// [`cost`](crate::RateLimitLayerBuilder::cost), nothing settles it, and
    /// a `304 Not Modified` is free.
    pub fn new() -> Self {
        Self {
            reserve: None,
            head: None,
            trailers: None,
            body_bytes: false,
            usage: false,
            dropped: Dropped::Reservation,
            refund: Arc::new(|status, _| status == StatusCode::NOT_MODIFIED),
        }
    }

    /// What a request reserves in each quota of another unit than
    /// requests, charged at its start (default: its cost).
    ///
    /// A reservation only has to be an estimate: a unit quota admits while
    /// it has anything left, charges the whole reservation, and takes what
    /// the settlement adds beyond it as debt, paid back before it admits
    /// again. What the fleet admits beyond such a quota is bounded by the
    /// settlements in flight when it ran out. Precisely, for a quota of
    /// limit `L` in one window: the last request admitted saw at most
    /// `L - 1` spent (settled costs, and the reservations of requests not
    /// yet settled), so the window is charged at most `L - 1` plus, over
    /// the requests in flight then (that one included), what each really
    /// cost beyond its reservation. With reservations of 0 that is `L - 1`
    /// plus their whole real costs; with
    /// [`only_while_the_reservation_fits`](crate::Quota::only_while_the_reservation_fits)
    /// and reservations no smaller than the real costs, at most `L`.
    pub fn reserve<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.reserve = Some(Arc::new(f));
        self
    }

    /// What the request really cost, read from the response head (e.g. a
    /// header the handler set), or `None` to keep what is known otherwise.
    /// A header is written before the body: for a count known only once a
    /// streamed body ends, use [`from_trailers`](Self::from_trailers) or
    /// [`from_usage`](Self::from_usage).
    pub fn from_head<F>(mut self, f: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> Option<u64> + Send + Sync + 'static,
    {
        self.head = Some(Arc::new(f));
        self
    }

    /// What the request really cost, read from the response's trailers
    /// (gRPC, HTTP/2), or `None` to keep what is known otherwise: e.g. a
    /// usage trailer after a streamed completion. The request is then
    /// settled when its body ends. Needs the default body mode
    /// ([`WrapBody`](super::WrapBody)): with
    /// [`inner_body`](crate::RateLimitLayer::inner_body) the body is not
    /// watched.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::rate::Settlement;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let tokens = Quota::new(100_000, Duration::from_secs(60))?.named("tokens")?.with_unit("tokens")?;
    /// let layer = RateLimitLayer::builder()
    ///     .quota(tokens)
    ///     .settlement(
    ///         Settlement::new()
    ///             .reserve(|_| 500)
    ///             .from_trailers(|trailers| trailers.get("x-tokens-used")?.to_str().ok()?.parse().ok()),
    ///     )
    ///     .build()?;
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn from_trailers<F>(mut self, f: F) -> Self
    where
        F: Fn(&HeaderMap) -> Option<u64> + Send + Sync + 'static,
    {
        self.trailers = Some(Arc::new(f));
        self
    }

    /// Settles each quota in `content-bytes` to the data bytes the response
    /// body really sent, when the body ends: a download or an export
    /// reserves an estimate and pays what it sent. Needs the default body
    /// mode, as [`from_trailers`](Self::from_trailers) does.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::rate::{Dropped, Settlement};
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let egress = Quota::new(100_000_000, Duration::from_secs(3600))?.with_unit("content-bytes")?;
    /// let layer = RateLimitLayer::builder()
    ///     .quota(egress)
    ///     // A download cut short pays for the bytes it got.
    ///     .settlement(Settlement::new().reserve(|_| 1_000_000).from_body_bytes().on_dropped(Dropped::SoFar))
    ///     .build()?;
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn from_body_bytes(mut self) -> Self {
        self.body_bytes = true;
        self
    }

    /// Gives each charged request a [`Usage`] in its extensions (with axum,
    /// an extractor) on which the handler reports what the request really
    /// cost, as it goes: `.settle(n)`, `.add(n)`, or per unit. The request
    /// is settled when its response body ends.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::rate::Settlement;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let tokens = Quota::new(100_000, Duration::from_secs(60))?.with_unit("tokens")?;
    /// let layer = RateLimitLayer::builder()
    ///     .quota(tokens)
    ///     .settlement(Settlement::new().reserve(|_| 500).from_usage())
    ///     .build()?;
    /// // In an axum handler: `async fn complete(usage: tower_ratelimit::rate::Usage)`,
    /// // then `usage.add(n)` for each chunk of n tokens streamed.
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn from_usage(mut self) -> Self {
        self.usage = true;
        self
    }

    /// What a request whose response never finished is settled to (the
    /// client went away, the body failed or was dropped): by default its
    /// reservation stands. Applies to requests settled at their body's end
    /// ([`from_trailers`](Self::from_trailers),
    /// [`from_body_bytes`](Self::from_body_bytes),
    /// [`from_usage`](Self::from_usage)).
    pub fn on_dropped(mut self, dropped: Dropped) -> Self {
        self.dropped = dropped;
        self
    }

    /// Which responses are free: everything they were charged is given back
    /// (default: `304 Not Modified`).
    ///
    /// A client can make many responses free (a `304` answers any request
    /// with `If-None-Match: *` on an endpoint that computes ETags), and the
    /// handler still runs for each. So free responses are bounded: per key
    /// and policy, at most the binding quota's limit of them per window (of
    /// its length), counted in this process; past that they are charged
    /// like any other response.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use http::StatusCode;
    /// use tower_ratelimit::rate::Settlement;
    /// use tower_ratelimit::{Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
    ///     .settlement(Settlement::new().refund_if(|status, _headers| {
    ///         status == StatusCode::NOT_MODIFIED || status.is_server_error()
    ///     }))
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn refund_if<F>(mut self, f: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        self.refund = Arc::new(f);
        self
    }
}
