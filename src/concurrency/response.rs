//! The concurrency limiter's 429 and the headers that tell the in-flight limit.

use crate::headers::{
    append_list, write_sf_string, HeaderStyle, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING,
};
use crate::response::{problem, write_json_string};
use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use std::fmt::Write as _;

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
    /// # use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
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
/// # use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
/// let layer = ConcurrencyLimitLayer::builder().limit(2).on_rejection(default_rejection).build();
/// ```
pub fn default_rejection(r: &ConcurrencyRejection<'_>) -> Response<Bytes> {
    let detail = r.detail();
    let mut body = String::with_capacity(160);
    body.push_str(r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"#);
    write_json_string(&mut body, &detail);
    let _ = write!(body, r#","retry_after":{}}}"#, r.retry_after_secs);
    problem(StatusCode::TOO_MANY_REQUESTS, body)
}

/// Writes the in-flight limit on a rejection (as metadata for gRPC): `Retry-After` always, then per `style`
/// `X-RateLimit-Limit`/`-Remaining` and IETF `RateLimit-Policy`/`RateLimit`
/// with `qu="concurrent-requests"`.
pub(crate) fn apply(style: HeaderStyle, r: &ConcurrencyRejection<'_>, headers: &mut HeaderMap) {
    headers.insert(RETRY_AFTER, HeaderValue::from(r.retry_after_secs));
    if matches!(style, HeaderStyle::GitHub | HeaderStyle::Both) {
        headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(r.limit));
        headers.insert(X_RATELIMIT_REMAINING.clone(), HeaderValue::from(0u64));
    }
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        let mut policy = String::new();
        write_sf_string(&mut policy, r.name);
        let mut state = policy.clone();
        let _ = write!(policy, ";q={};qu=\"concurrent-requests\"", r.limit);
        state.push_str(";r=0");
        append_list(headers, &RATELIMIT_POLICY, policy);
        append_list(headers, &RATELIMIT, state);
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
            h[&RATELIMIT_POLICY],
            r#""concurrency";q=5;qu="concurrent-requests""#
        );
        assert_eq!(h[&RATELIMIT], r#""concurrency";r=0"#);
        assert_eq!(h[&X_RATELIMIT_LIMIT], "5");
        assert_eq!(h[&X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[RETRY_AFTER], "1");
        let mut h = HeaderMap::new();
        apply(HeaderStyle::None, &r, &mut h);
        assert_eq!(h.len(), 1, "Retry-After only: {h:?}");
    }
}
