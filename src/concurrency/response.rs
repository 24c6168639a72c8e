//! The concurrency limiter's 429 and the headers that tell the in-flight limit.

use crate::headers::{self, HeaderStyle, Member};
use crate::problem::Problem;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};

/// What a concurrency rejection knows, for a custom rejection response.
#[derive(Debug)]
#[non_exhaustive]
pub struct ConcurrencyRejection<'a> {
    /// The limiter's name (the policy name in IETF headers).
    pub name: &'a str,
    /// Requests a key may have in flight.
    pub limit: u64,
    /// Requests the key had in flight when this one was rejected.
    pub in_flight: u64,
    /// Seconds the client is told to wait (`Retry-After`).
    pub retry_after_secs: u64,
}

impl ConcurrencyRejection<'_> {
    /// A one-line explanation for bodies and `grpc-message`.
    ///
    /// ```
    /// # use tower_ratelimit::ConcurrencyLimitLayer;
    /// let layer = ConcurrencyLimitLayer::builder()
    ///     .limit(2)
    ///     .on_rejection(|r| http::Response::new(bytes::Bytes::from(r.detail())))
    ///     .build();
    /// ```
    pub fn detail(&self) -> String {
        format!(
            "too many concurrent requests: at most {} may be in flight; retry in {} s",
            self.limit, self.retry_after_secs
        )
    }
}

/// The default 429: an `application/problem+json` document (RFC 9457).
///
/// ```
/// use tower_ratelimit::concurrency::default_rejection;
/// # use tower_ratelimit::ConcurrencyLimitLayer;
/// let layer = ConcurrencyLimitLayer::builder().limit(2).on_rejection(default_rejection).build();
/// ```
pub fn default_rejection(r: &ConcurrencyRejection<'_>) -> Response<Bytes> {
    Problem {
        retry_after: Some(r.retry_after_secs),
        ..Problem::new(StatusCode::TOO_MANY_REQUESTS, &r.detail())
    }
    .response()
}

/// Writes the in-flight limit on a rejection (as metadata for gRPC):
/// `Retry-After` always, then per `style` `X-RateLimit-Limit`/`-Remaining`
/// and IETF `RateLimit-Policy`/`RateLimit` with `qu="concurrent-requests"`.
pub(crate) fn apply(style: HeaderStyle, r: &ConcurrencyRejection<'_>, h: &mut HeaderMap) {
    headers::retry_after(h, r.retry_after_secs);
    if style.github() {
        headers::github(h, HeaderValue::from(r.limit), 0, None);
    }
    if style.ietf() {
        headers::ietf(
            h,
            &[Member {
                name: r.name,
                quota: r.limit,
                window_secs: None,
                unit: Some("concurrent-requests"),
                remaining: 0,
                reset_secs: None,
            }],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_tells_the_in_flight_limit_in_both_header_styles() {
        let r = ConcurrencyRejection {
            name: "concurrency",
            limit: 5,
            in_flight: 5,
            retry_after_secs: 1,
        };
        let mut res = default_rejection(&r);
        apply(HeaderStyle::Both, &r, res.headers_mut());
        let h = res.headers();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(h["content-type"], "application/problem+json");
        assert_eq!(
            h[&headers::RATELIMIT_POLICY],
            r#""concurrency";q=5;qu="concurrent-requests""#
        );
        assert_eq!(h[&headers::RATELIMIT], r#""concurrency";r=0"#);
        assert_eq!(h[&headers::X_RATELIMIT_LIMIT], "5");
        assert_eq!(h[&headers::X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[http::header::RETRY_AFTER], "1");
        let mut h = HeaderMap::new();
        apply(HeaderStyle::None, &r, &mut h);
        assert_eq!(h.len(), 1, "Retry-After only: {h:?}");
    }
}
