//! The rate limiter's own answer: a 429 built from the decision's one read.

use crate::decision::{Decision, RejectReason};
use crate::headers::ceil_secs;
use crate::problem::Problem;
use bytes::Bytes;
use http::{Response, StatusCode};

/// What a rejection knows, for a custom rejection response.
#[derive(Debug)]
pub struct Rejection<'a> {
    /// The decision, from the same store read as the headers.
    pub decision: &'a Decision,
    /// The name of the binding quota.
    pub policy_name: &'a str,
}

impl Rejection<'_> {
    /// Whole seconds until the request would be admitted (at least 1), or `None`
    /// when it can never be (its cost exceeds the limit).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.decision.reject_reason() {
            Some(RejectReason::CostExceedsLimit) => None,
            _ => Some(ceil_secs(self.decision.retry_after_ms()).max(1)),
        }
    }

    /// A one-line explanation for bodies and `grpc-message`.
    pub fn detail(&self) -> String {
        match self.retry_after_secs() {
            Some(s) => format!("rate limit \"{}\" exceeded; retry in {s} s", self.policy_name),
            None => format!(
                "the request's cost exceeds the limit of rate limit \"{}\"; it can never be admitted",
                self.policy_name
            ),
        }
    }
}

/// The default 429: an `application/problem+json` document (RFC 9457).
///
/// ```
/// # use std::num::NonZeroU32;
/// use tower_ratelimit::{default_rejection, Quota, RateLimitLayer};
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
///     .on_rejection(default_rejection)
///     .build()
///     .unwrap();
/// ```
pub fn default_rejection(r: &Rejection<'_>) -> Response<Bytes> {
    Problem {
        retry_after: r.retry_after_secs(),
        ..Problem::new(StatusCode::TOO_MANY_REQUESTS, &r.detail())
    }
    .response()
}
